import Crypto
import Foundation
import Synchronization
@_spi(Benchmarks) import TetherProtocol

/// The file-sharing settings (docs/files.md).
public struct FileSettings: Sendable {
    /// Directory of the default local storage; `<data directory>/files` when `nil`.
    public var directory: String?
    /// The largest file accepted, in bytes (default 5 MiB, PubNub's limit).
    public var maxBytes: Int
    /// How long an upload form is valid, in seconds (default 60, as PubNub's).
    public var uploadLifetimeSeconds: Int
    /// How long a download URL is valid, in seconds (default 3,900, as PubNub's).
    public var downloadLifetimeSeconds: Int
    /// The origin clients reach this server at (`https://chat.example.com`), used in the upload
    /// and download URLs the server hands out; when `nil`, the scheme the server serves and the
    /// request's `Host` header.
    public var publicURL: String?
    /// Where the bytes are kept; a ``LocalFileStorage`` under ``directory`` when `nil` (pass an
    /// S3-compatible conformance of ``FileStorage`` here).
    public var storage: (any FileStorage)?

    /// Creates settings.
    public init(directory: String? = nil, maxBytes: Int = 5 * 1024 * 1024, uploadLifetimeSeconds: Int = 60,
                downloadLifetimeSeconds: Int = 3900, publicURL: String? = nil) {
        self.directory = directory
        self.maxBytes = maxBytes
        self.uploadLifetimeSeconds = uploadLifetimeSeconds
        self.downloadLifetimeSeconds = downloadLifetimeSeconds
        self.publicURL = publicURL
    }
}

/// What a signed upload form grants: one upload of one file id, until it expires.
struct FileUploadPolicy: Equatable {
    var subscribeKey: String
    var channel: String
    var id: String
    var name: String
    /// Seconds since the Unix epoch.
    var expires: Int64

    /// The policy as the form's `Policy` field: base64url of a JSON object.
    var encoded: String {
        var w = JSONWriter()
        w.raw("{\"sub\":")
        w.string(subscribeKey)
        w.raw(",\"channel\":")
        w.string(channel)
        w.raw(",\"id\":")
        w.string(id)
        w.raw(",\"name\":")
        w.string(name)
        w.raw(",\"expires\":")
        w.number(Int(expires))
        w.raw("}")
        return Base64.encode(w.bytes, urlSafe: true, padding: false)
    }

    /// Reads a `Policy` field; `nil` when it is not one this server wrote.
    init?(encoded: String) {
        guard let bytes = Base64.decode(encoded), case .object(let object)? = try? JSONValue(parsing: bytes),
              case .string(let sub)? = object["sub"], case .string(let channel)? = object["channel"],
              case .string(let id)? = object["id"], case .string(let name)? = object["name"],
              case .number(let expires)? = object["expires"], let seconds = Int64(expires.text)
        else { return nil }
        self.init(subscribeKey: sub, channel: channel, id: id, name: name, expires: seconds)
    }

    init(subscribeKey: String, channel: String, id: String, name: String, expires: Int64) {
        self.subscribeKey = subscribeKey
        self.channel = channel
        self.id = id
        self.name = name
        self.expires = expires
    }
}

/// Why an upload form or download URL is refused.
enum FileSignatureFailure: Error, Equatable {
    /// Not signed by this server, or altered.
    case invalid
    /// Signed, but past its expiry.
    case expired
}

/// The server's file sharing: the storage, the settings, the key that signs upload forms and
/// download URLs, and the ids with an upload in progress (one upload per id).
public final class FileService: Sendable {
    /// Where the bytes are.
    public let storage: any FileStorage
    /// The settings.
    public let settings: FileSettings
    /// The scheme the server serves (`http` or `https`), for the URLs it hands out.
    public let scheme: String
    private let signingKey: SymmetricKey
    private let uploading = Mutex<Set<String>>([])

    /// Opens the file service: the storage (local under `settings.directory` unless one is
    /// given) and the signing key kept in the data directory (`files-signing-key`, created on
    /// first use, so URLs stay valid across restarts).
    public init(settings: FileSettings, dataDirectory: String, scheme: String = "http", storage: (any FileStorage)? = nil) throws {
        self.settings = settings
        self.scheme = scheme
        if storage == nil, settings.storage == nil, let directory = settings.directory {
            try Self.checkSeparate(files: directory, data: dataDirectory)
        }
        self.storage = try storage ?? settings.storage ?? LocalFileStorage(directory: settings.directory ?? (dataDirectory as NSString).appendingPathComponent("files"))
        let keyPath = (dataDirectory as NSString).appendingPathComponent("files-signing-key")
        if let existing = FileManager.default.contents(atPath: keyPath), existing.count == 32 {
            signingKey = SymmetricKey(data: existing)
        } else {
            let key = SymmetricKey(size: .bits256)
            let data = key.withUnsafeBytes { Data($0) }
            try FileManager.default.createDirectory(atPath: dataDirectory, withIntermediateDirectories: true)
            guard FileManager.default.createFile(atPath: keyPath, contents: data, attributes: [.posixPermissions: 0o600]) else {
                throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: keyPath])
            }
            signingKey = key
        }
    }

    /// Refuses a files directory that is the data directory or holds it: the server removes
    /// what it finds there that is not an upload's object, and the store, its lock and the
    /// signing key must not share a directory with that.
    static func checkSeparate(files: String, data: String) throws {
        func resolved(_ path: String) -> String {
            URL(fileURLWithPath: path).standardizedFileURL.resolvingSymlinksInPath().path
        }
        let filesPath = resolved(files), dataPath = resolved(data)
        if filesPath == dataPath || dataPath.hasPrefix(filesPath.hasSuffix("/") ? filesPath : filesPath + "/") {
            throw ServerConfigurationError("the files directory \(files) is the data directory \(data) or holds it: "
                                           + "give uploaded files a directory of their own (the default is <data-dir>/files)")
        }
    }

    /// Removes stored objects that have no metadata row (an upload whose bytes were committed
    /// but whose row was not, when the server stopped between the two); returns how many.
    @discardableResult
    func removeOrphans(keeping known: Set<String>) throws -> Int {
        var removed = 0
        for key in try storage.list() where !known.contains(key) {
            try storage.delete(key: key)
            removed += 1
        }
        return removed
    }

    // MARK: - Signatures

    func signature(_ text: String) -> String {
        Base64.encode(Array(HMAC<SHA256>.authenticationCode(for: Array(text.utf8), using: signingKey)), urlSafe: true, padding: false)
    }

    private func matches(_ text: String, _ signature: String) -> Bool {
        guard let given = Base64.decode(signature) else { return false }
        return HMAC<SHA256>.isValidAuthenticationCode(given, authenticating: Array(text.utf8), using: signingKey)
    }

    /// The signature of an upload policy (the form's `X-Tether-Signature`).
    func sign(_ policy: FileUploadPolicy) -> String { signature("upload\n" + policy.encoded) }

    /// Verifies an upload form's `Policy` and signature at `now` (seconds since the epoch).
    func verifyUpload(policy encoded: String, signature: String, now: Int64) throws(FileSignatureFailure) -> FileUploadPolicy {
        guard matches("upload\n" + encoded, signature), let policy = FileUploadPolicy(encoded: encoded) else { throw .invalid }
        guard now <= policy.expires else { throw .expired }
        return policy
    }

    /// The signature of a download URL for file `id` of `subscribeKey`, valid until `expires`.
    func downloadSignature(subscribeKey: String, id: String, expires: Int64) -> String {
        signature("download\n\(subscribeKey)\n\(id)\n\(expires)")
    }

    /// Verifies a download URL's `expires` and `signature` at `now`.
    func verifyDownload(subscribeKey: String, id: String, expires: Int64, signature: String, now: Int64) throws(FileSignatureFailure) {
        guard matches("download\n\(subscribeKey)\n\(id)\n\(expires)", signature) else { throw .invalid }
        guard now <= expires else { throw .expired }
    }

    // MARK: - One upload per id

    /// Claims `key` for an upload; `false` when another upload of it is in progress.
    func claim(_ key: String) -> Bool { uploading.withLock { $0.insert(key).inserted } }

    /// Ends the claim.
    func release(_ key: String) { _ = uploading.withLock { $0.remove(key) } }

    /// The current wall-clock time in whole seconds since the epoch.
    static func now() -> Int64 { Int64(Date().timeIntervalSince1970) }

    /// A content type for a file name, from its extension (what the upload form proposes;
    /// the form's `Content-Type` field decides).
    static func contentType(forName name: String) -> String {
        let ext = name.split(separator: ".").last.map { $0.lowercased() } ?? ""
        switch ext {
        case "txt": return "text/plain; charset=utf-8"
        case "json": return "application/json"
        case "html", "htm": return "text/html; charset=utf-8"
        case "css": return "text/css"
        case "csv": return "text/csv"
        case "png": return "image/png"
        case "jpg", "jpeg": return "image/jpeg"
        case "gif": return "image/gif"
        case "webp": return "image/webp"
        case "svg": return "image/svg+xml"
        case "pdf": return "application/pdf"
        case "mp3": return "audio/mpeg"
        case "mp4": return "video/mp4"
        case "zip": return "application/zip"
        default: return "application/octet-stream"
        }
    }
}
