import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
@_spi(Benchmarks) import TetherProtocol
import TetherServerCore

extension Reply {
    /// The files error object: `{"status":N,"error":{"source":"files","message":"…"}}` (the
    /// shape of PubNub's other v1 services; docs/compatibility.md, "Files").
    static func filesError(_ status: HTTPResponse.Status, _ message: String) -> Response {
        var w = JSONWriter()
        w.raw("{\"status\":")
        w.number(status.code)
        w.raw(",\"error\":{\"source\":\"files\",\"message\":")
        w.string(message)
        w.raw("}}")
        return json(status, w.bytes)
    }
}

/// The files bounds (docs/files.md).
enum FileBounds {
    /// The generate-upload-url body.
    static let generateBodyBytes = 4096
    /// A file name: 1…255 bytes of UTF-8, no control characters.
    static let nameBytes = 1...255
    /// `limit` of a list: at most 100, the default.
    static let listLimit = 100
}

/// A request of the files REST family (`/v1/files/{sub}/channels/{ch}/…`): keyset and channel,
/// checked before access. Every error is the files error object.
struct FileRequest {
    var keyset: Keyset
    var channel: String

    init(_ wire: WireRequest, keysets: KeysetRegistry) throws(RequestError) {
        let s = wire.segments
        guard NameRules.validateKey(s[2]), let keyset = keysets.keyset(subscribeKey: s[2]) else {
            throw RequestError(response: Reply.filesError(.badRequest, "Invalid Subscribe Key"))
        }
        if wire.uriLength > keysets.limits(for: keyset).maxURIBytes { throw RequestError(response: Reply.uriTooLong) }
        do { try NameRules.validateChannel(s[4]) } catch {
            throw RequestError(response: Reply.filesError(.badRequest, "Invalid channel \(String(reflecting: s[4])): \(error)"))
        }
        if NameRules.isPresence(s[4]) {
            throw RequestError(response: Reply.filesError(.badRequest, "Invalid channel: presence channels carry no files"))
        }
        if let uuid = wire.query["uuid"] {
            do { try NameRules.validateUserId(uuid) } catch {
                throw RequestError(response: Reply.filesError(.badRequest, "Invalid uuid: \(error)"))
            }
        }
        self.keyset = keyset
        self.channel = s[4]
    }

    /// Whether `name` is an acceptable file name.
    static func isValidName(_ name: String) -> Bool {
        FileBounds.nameBytes.contains(name.utf8.count) && !name.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F }
    }
}

extension TetherResponder {
    /// Whether decoded path segments have the shape of a files endpoint (for a 405 on a wrong
    /// method rather than a 404).
    static func isFilesPath(_ s: [String]) -> Bool {
        guard s.count >= 5 else { return false }
        return switch (s.count, s[2], s.count > 3 ? s[3] : "", s.count > 5 ? s[5] : "") {
        case (5, "upload", _, _), (7, "download", _, _), (9, "publish-file", _, _): true
        case (6, _, "channels", "generate-upload-url"), (6, _, "channels", "files"), (8, _, "channels", "files"): true
        default: false
        }
    }

    /// The origin clients reach this server at: the configured public URL, else the scheme it
    /// serves and the request's `Host`.
    func publicOrigin(_ request: Request) -> String {
        if let url = state.files.settings.publicURL {
            return url.hasSuffix("/") ? String(url.dropLast()) : url
        }
        return "\(state.files.scheme)://\(request.head.authority ?? "localhost")"
    }

    // MARK: - Generate upload URL

    /// `POST /v1/files/{sub}/channels/{ch}/generate-upload-url` with `{"name":"…"}`: a file id
    /// and a signed form for one upload of it to Tether's own upload endpoint.
    @inline(never) func generateUploadURL(_ request: Request, _ wire: WireRequest) async throws -> Response {
        let target = try FileRequest(wire, keysets: state.keysets)
        guard let body = try? await request.body.collect(upTo: FileBounds.generateBodyBytes) else {
            throw Refusal(response: Reply.filesError(.contentTooLarge, "Request body too large"))
        }
        let bytes = Array(buffer: body)
        try authorize(target.keyset, wire, method: "POST", channels: [target.channel], groups: [], permission: .write, body: bytes)
        guard case .object(let object)? = try? JSONValue(parsing: bytes) else {
            throw Refusal(response: Reply.filesError(.badRequest, "Invalid JSON body: expected {\"name\": \"…\"}"))
        }
        guard let value = object["name"], !value.isNull else { throw Refusal(response: Reply.filesError(.badRequest, "Missing file name")) }
        guard case .string(let name) = value, FileRequest.isValidName(name) else {
            throw Refusal(response: Reply.filesError(.badRequest, "Invalid file name: 1-255 bytes without control characters"))
        }
        let id = UUID().uuidString.lowercased()
        let expires = FileService.now() + Int64(state.files.settings.uploadLifetimeSeconds)
        let policy = FileUploadPolicy(subscribeKey: target.keyset.subscribeKey, channel: target.channel, id: id, name: name, expires: expires)
        let url = "\(publicOrigin(request))/v1/files/upload/\(PercentCoding.encode(target.keyset.subscribeKey))/\(id)"
        let fields: [(String, String)] = [
            ("key", "\(target.keyset.subscribeKey)/\(id)/\(name)"),
            ("Content-Type", FileService.contentType(forName: name)),
            ("Policy", policy.encoded),
            ("X-Tether-Signature", state.files.sign(policy)),
        ]
        var w = JSONWriter(capacity: 512)
        w.raw("{\"status\":200,\"data\":{\"id\":")
        w.string(id)
        w.raw(",\"name\":")
        w.string(name)
        w.raw("},\"file_upload_request\":{\"url\":")
        w.string(url)
        w.raw(",\"method\":\"POST\",\"expiration_date\":")
        w.string(Date(timeIntervalSince1970: TimeInterval(expires)).formatted(.iso8601))
        w.raw(",\"form_fields\":[")
        for (i, (key, value)) in fields.enumerated() {
            if i > 0 { w.raw(",") }
            w.raw("{\"key\":")
            w.string(key)
            w.raw(",\"value\":")
            w.string(value)
            w.raw("}")
        }
        w.raw("]}}")
        return Reply.json(.ok, w.bytes)
    }

    // MARK: - List

    /// `GET /v1/files/{sub}/channels/{ch}/files?limit=&next=`: the channel's files, oldest
    /// first, `next` an opaque cursor (null on the last page).
    @inline(never) func listFiles(_ wire: WireRequest) async throws -> Response {
        let target = try FileRequest(wire, keysets: state.keysets)
        try authorize(target.keyset, wire, channels: [target.channel], groups: [], permission: .read)
        let limit = min(try wire.integer("limit", in: ParameterBounds.actionsLimit) ?? FileBounds.listLimit, FileBounds.listLimit)
        var after: (created: Timetoken, id: String)?
        if let next = wire.query["next"], !next.isEmpty {
            guard let cursor = Self.decodeFileCursor(next) else { throw Refusal(response: Reply.filesError(.badRequest, "Invalid next")) }
            after = cursor
        }
        let page = try await state.store.files(subscribeKey: target.keyset.subscribeKey, channel: target.channel, after: after, limit: limit)
        var w = JSONWriter(capacity: 64 + page.files.count * 160)
        w.raw("{\"status\":200,\"data\":[")
        for (i, file) in page.files.enumerated() {
            if i > 0 { w.raw(",") }
            w.raw("{\"name\":")
            w.string(file.name)
            w.raw(",\"id\":")
            w.string(file.id)
            w.raw(",\"size\":")
            w.number(file.size)
            w.raw(",\"created\":")
            w.string(Self.isoDate(file.created))
            w.raw("}")
        }
        w.raw("],\"next\":")
        if page.more, let last = page.files.last {
            w.string(Self.encodeFileCursor(created: last.created, id: last.id))
        } else {
            w.raw("null")
        }
        w.raw(",\"count\":")
        w.number(page.files.count)
        w.raw("}")
        return Reply.json(.ok, w.bytes)
    }

    static func isoDate(_ timetoken: Timetoken) -> String {
        Date(timeIntervalSince1970: TimeInterval(timetoken.rawValue / 10_000_000)).formatted(.iso8601)
    }

    static func encodeFileCursor(created: Timetoken, id: String) -> String {
        Base64.encode(Array("\(created.rawValue) \(id)".utf8), urlSafe: true, padding: false)
    }

    static func decodeFileCursor(_ text: String) -> (created: Timetoken, id: String)? {
        guard text.utf8.count <= 256, let bytes = Base64.decode(text), let decoded = String(validating: bytes, as: UTF8.self) else { return nil }
        let parts = decoded.split(separator: " ", maxSplits: 1)
        guard parts.count == 2, let created = UInt64(parts[0]) else { return nil }
        return (Timetoken(created), String(parts[1]))
    }

    // MARK: - Get (download URL)

    /// `GET /v1/files/{sub}/channels/{ch}/files/{id}/{name}`: 307 to a signed URL on this
    /// server that serves the bytes (as PubNub redirects to a presigned storage URL).
    @inline(never) func getFile(_ request: Request, _ wire: WireRequest) async throws -> Response {
        let target = try FileRequest(wire, keysets: state.keysets)
        try authorize(target.keyset, wire, channels: [target.channel], groups: [], permission: .read)
        let file = try await existingFile(target, id: wire.segments[6], name: wire.segments[7])
        let expires = FileService.now() + Int64(state.files.settings.downloadLifetimeSeconds)
        let signature = state.files.downloadSignature(subscribeKey: file.subscribeKey, id: file.id, expires: expires)
        let location = "\(publicOrigin(request))/v1/files/download/\(PercentCoding.encode(file.subscribeKey))/"
            + "\(PercentCoding.encode(file.channel))/\(file.id)/\(PercentCoding.encode(file.name))?expires=\(expires)&signature=\(signature)"
        var response = Reply.json(.temporaryRedirect, "")
        response.headers[.location] = location
        return response
    }

    /// The file `id` named `name` on the request's channel, or PubNub's 404.
    private func existingFile(_ target: FileRequest, id: String, name: String) async throws -> StoredFile {
        guard let file = try await state.store.file(subscribeKey: target.keyset.subscribeKey, id: id),
              file.channel == target.channel, file.name == name
        else { throw Refusal(response: Reply.filesError(.notFound, "File not found")) }
        return file
    }

    // MARK: - Delete

    /// `DELETE /v1/files/{sub}/channels/{ch}/files/{id}/{name}`: removes the metadata and the
    /// bytes; the message that announced the file stays in history.
    @inline(never) func deleteFile(_ wire: WireRequest) async throws -> Response {
        let target = try FileRequest(wire, keysets: state.keysets)
        try authorize(target.keyset, wire, method: "DELETE", channels: [target.channel], groups: [], permission: .delete)
        let file = try await existingFile(target, id: wire.segments[6], name: wire.segments[7])
        guard let removed = try await state.store.removeFile(subscribeKey: file.subscribeKey, id: file.id) else {
            throw Refusal(response: Reply.filesError(.notFound, "File not found"))
        }
        do {
            try state.files.storage.delete(key: removed.storageKey)
        } catch {
            // The row is gone, so nobody can reach the bytes; the next start removes them.
            state.logger.error("file bytes not removed", metadata: ["key": "\(removed.storageKey)", "error": "\(error)"])
        }
        state.metrics.recordPublish(kind: "file-delete")
        return Reply.json(.ok, "{\"status\":200}")
    }

    // MARK: - Publish file message

    /// `GET /v1/files/publish-file/{pub}/{sub}/0/{ch}/0/{message}`: a publish of message type 4,
    /// stored in history like a message; the same checks and answers as publish.
    @inline(never) func publishFileMessage(_ request: Request, _ wire: WireRequest) async throws -> Response {
        var publishWire = wire
        publishWire.segments = ["publish"] + wire.segments[3...]
        publishWire.rawSegments = ["publish"] + wire.rawSegments[3...]
        return try await publish(request, publishWire, kind: .file)
    }
}
