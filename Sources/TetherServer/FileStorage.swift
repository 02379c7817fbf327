public import Foundation

/// Where the bytes of uploaded files live (docs/files.md). The metadata (name, size, content
/// type, channel) is in the message store; a storage only keeps bytes under keys that the
/// server chooses (`<subscribe key>/<file id>`, one object per upload).
///
/// ``LocalFileStorage`` (a directory on local disk) is the default; an S3-compatible store is
/// another conformance. An object becomes visible only when its upload commits: a failed,
/// oversize or aborted upload leaves nothing behind.
public protocol FileStorage: Sendable {
    /// Starts writing the object `key`. Nothing is visible under `key` until the returned
    /// upload is committed.
    func put(key: String) throws -> any FileStorageUpload
    /// The object's bytes, or `nil` when there is no such object.
    func get(key: String) throws -> [UInt8]?
    /// The object's size in bytes, or `nil` when there is no such object.
    func size(key: String) throws -> Int?
    /// Up to `count` bytes of the object from `offset` (fewer at its end), for serving it in
    /// pieces; throws when the object is gone.
    func read(key: String, offset: Int, count: Int) throws -> [UInt8]
    /// Removes the object; removing a missing object is not an error.
    func delete(key: String) throws
    /// Every stored object's key (for reconciling with the metadata at start-up).
    func list() throws -> [String]
}

/// An object being written. Exactly one of ``commit()`` or ``abort()`` ends it; an upload that
/// is dropped without either is aborted.
public protocol FileStorageUpload: AnyObject {
    /// Appends bytes.
    func write(_ bytes: [UInt8]) throws
    /// Makes the object visible under its key, atomically (all of it or nothing).
    func commit() throws
    /// Discards what was written.
    func abort()
}

/// Files in a directory: each object is a file whose name encodes its key; an upload writes a
/// temporary file under `.incoming/` and renames it into place on commit (atomic on one file
/// system), so a reader never sees a partial object. Temporaries left by a crash are removed
/// when the storage is opened.
public struct LocalFileStorage: FileStorage {
    /// The directory.
    public let directory: URL
    private var incoming: URL { directory.appendingPathComponent(".incoming", isDirectory: true) }

    /// Opens (creating if needed) the directory and removes temporaries of interrupted uploads.
    public init(directory: String) throws {
        self.directory = URL(fileURLWithPath: directory, isDirectory: true)
        let manager = FileManager.default
        try manager.createDirectory(at: self.directory, withIntermediateDirectories: true)
        if manager.fileExists(atPath: incoming.path) { try manager.removeItem(at: incoming) }
        try manager.createDirectory(at: incoming, withIntermediateDirectories: true)
    }

    /// The file name of a key: bytes outside `A-Z a-z 0-9 - _ .` (and `.` first) are `%XX`,
    /// so every key maps to one flat name and no key can climb out of the directory.
    static func fileName(_ key: String) -> String {
        var name = ""
        for (i, byte) in key.utf8.enumerated() {
            let plain = (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
                || byte == 0x2D || byte == 0x5F || (byte == 0x2E && i > 0)
            if plain { name.unicodeScalars.append(Unicode.Scalar(byte)) } else { name += "%" + hex(byte) }
        }
        return name
    }

    private static func hex(_ byte: UInt8) -> String {
        let digits = Array("0123456789ABCDEF")
        return String([digits[Int(byte >> 4)], digits[Int(byte & 15)]])
    }

    /// The key of a file name (the inverse of ``fileName(_:)``), `nil` for other files.
    static func key(fileName: String) -> String? {
        var bytes: [UInt8] = []
        var utf8 = Array(fileName.utf8)[...]
        while let byte = utf8.popFirst() {
            if byte == 0x25 {
                guard utf8.count >= 2, let value = UInt8(String(decoding: utf8.prefix(2), as: UTF8.self), radix: 16) else { return nil }
                bytes.append(value)
                utf8 = utf8.dropFirst(2)
            } else {
                bytes.append(byte)
            }
        }
        return String(validating: bytes, as: UTF8.self)
    }

    public func put(key: String) throws -> any FileStorageUpload {
        let temporary = incoming.appendingPathComponent(UUID().uuidString)
        guard FileManager.default.createFile(atPath: temporary.path, contents: nil) else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: temporary.path])
        }
        let handle = try FileHandle(forWritingTo: temporary)
        return LocalUpload(handle: handle, temporary: temporary, destination: directory.appendingPathComponent(Self.fileName(key)))
    }

    public func get(key: String) throws -> [UInt8]? {
        let url = directory.appendingPathComponent(Self.fileName(key))
        guard FileManager.default.fileExists(atPath: url.path) else { return nil }
        return Array(try Data(contentsOf: url))
    }

    public func size(key: String) throws -> Int? {
        let url = directory.appendingPathComponent(Self.fileName(key))
        guard let attributes = try? FileManager.default.attributesOfItem(atPath: url.path) else { return nil }
        return (attributes[.size] as? NSNumber)?.intValue
    }

    public func read(key: String, offset: Int, count: Int) throws -> [UInt8] {
        let handle = try FileHandle(forReadingFrom: directory.appendingPathComponent(Self.fileName(key)))
        defer { try? handle.close() }
        try handle.seek(toOffset: UInt64(offset))
        return Array(try handle.read(upToCount: count) ?? Data())
    }

    public func delete(key: String) throws {
        let url = directory.appendingPathComponent(Self.fileName(key))
        do {
            try FileManager.default.removeItem(at: url)
        } catch CocoaError.fileNoSuchFile {
            return
        }
    }

    /// The objects this storage wrote: regular files whose names decode to a key of the server's
    /// form (`<subscribe key>/<file id>`, the id a UUID). Anything else in the directory — another
    /// program's files, a directory — is not an object, and is never listed for removal.
    public func list() throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: directory.path).compactMap { name in
            guard !name.hasPrefix("."), let key = Self.key(fileName: name), Self.isObjectKey(key) else { return nil }
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: directory.appendingPathComponent(name).path, isDirectory: &isDirectory),
                  !isDirectory.boolValue else { return nil }
            return key
        }
    }

    /// Whether `key` has the form the server gives objects: `<subscribe key>/<file id>`.
    static func isObjectKey(_ key: String) -> Bool {
        let parts = key.split(separator: "/", omittingEmptySubsequences: false)
        return parts.count == 2 && !parts[0].isEmpty && UUID(uuidString: String(parts[1])) != nil
    }
}

/// One upload to a ``LocalFileStorage``: a temporary file renamed into place on commit.
private final class LocalUpload: FileStorageUpload {
    private var handle: FileHandle?
    private let temporary: URL
    private let destination: URL

    init(handle: FileHandle, temporary: URL, destination: URL) {
        self.handle = handle
        self.temporary = temporary
        self.destination = destination
    }

    deinit { abort() }

    func write(_ bytes: [UInt8]) throws {
        guard let handle else { throw CocoaError(.fileWriteUnknown) }
        try handle.write(contentsOf: bytes)
    }

    func commit() throws {
        guard let handle else { throw CocoaError(.fileWriteUnknown) }
        self.handle = nil
        do {
            try handle.synchronize()
            try handle.close()
            // rename(2) replaces atomically; the destination directory is the same file system.
            guard rename(temporary.path, destination.path) == 0 else { throw CocoaError(.fileWriteUnknown) }
        } catch {
            try? FileManager.default.removeItem(at: temporary)
            throw error
        }
        // The new name is durable only once its directory is synced: without it a power loss
        // can leave the file's data on disk and no name for it, after the upload was answered.
        if let (_, code) = fsyncDirectory(atPath: destination.deletingLastPathComponent().path) {
            try? FileManager.default.removeItem(at: destination)
            throw POSIXError(POSIXErrorCode(rawValue: code) ?? .EIO)
        }
    }

    func abort() {
        guard let handle else { return }
        self.handle = nil
        try? handle.close()
        try? FileManager.default.removeItem(at: temporary)
    }
}
