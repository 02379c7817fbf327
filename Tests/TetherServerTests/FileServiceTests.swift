import Foundation
import Testing
@testable import TetherServer

/// Upload forms and download URLs (signed, expiring, time passed in) and the local storage's
/// atomic commit: an aborted or dropped upload leaves nothing, a key cannot climb out of the
/// directory.
@Suite struct FileServiceTests {
    static func directory() -> String {
        FileManager.default.temporaryDirectory.appendingPathComponent("tether-files-\(UUID().uuidString)").path
    }

    @Test func anUploadFormIsValidUntilItExpiresAndOnlyAsSigned() throws {
        let dir = Self.directory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let service = try FileService(settings: .init(), dataDirectory: dir)
        let policy = FileUploadPolicy(subscribeKey: "demo", channel: "room", id: "id-1", name: "a.txt", expires: 1_000)
        let signature = service.sign(policy)
        #expect(try service.verifyUpload(policy: policy.encoded, signature: signature, now: 999) == policy)
        #expect(try service.verifyUpload(policy: policy.encoded, signature: signature, now: 1_000) == policy)
        #expect(throws: FileSignatureFailure.expired) { try service.verifyUpload(policy: policy.encoded, signature: signature, now: 1_001) }
        // Another policy with the first one's signature: refused.
        var other = policy
        other.expires = 9_999
        #expect(throws: FileSignatureFailure.invalid) { try service.verifyUpload(policy: other.encoded, signature: signature, now: 0) }
        #expect(throws: FileSignatureFailure.invalid) { try service.verifyUpload(policy: "%%%", signature: "", now: 0) }

        // The key persists in the data directory: a restarted server accepts its own forms.
        let again = try FileService(settings: .init(), dataDirectory: dir)
        #expect(try again.verifyUpload(policy: policy.encoded, signature: signature, now: 0) == policy)
    }

    @Test func aDownloadURLExpires() throws {
        let dir = Self.directory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let service = try FileService(settings: .init(), dataDirectory: dir)
        let signature = service.downloadSignature(subscribeKey: "demo", id: "f", expires: 50)
        try service.verifyDownload(subscribeKey: "demo", id: "f", expires: 50, signature: signature, now: 50)
        #expect(throws: FileSignatureFailure.expired) {
            try service.verifyDownload(subscribeKey: "demo", id: "f", expires: 50, signature: signature, now: 51)
        }
        #expect(throws: FileSignatureFailure.invalid) {
            try service.verifyDownload(subscribeKey: "demo", id: "g", expires: 50, signature: signature, now: 0)
        }
    }

    @Test func anObjectIsVisibleOnlyOnceCommitted() throws {
        let dir = Self.directory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let storage = try LocalFileStorage(directory: dir)
        let one = "demo/" + UUID().uuidString.lowercased()
        let upload = try storage.put(key: one)
        try upload.write(Array("hello ".utf8))
        #expect(try storage.get(key: one) == nil)
        #expect(try storage.list() == [])
        try upload.write(Array("world".utf8))
        try upload.commit()
        #expect(try storage.get(key: one) == Array("hello world".utf8))
        #expect(try storage.list() == [one])
        #expect(try storage.size(key: one) == 11 && storage.size(key: "demo/none") == nil)
        #expect(try storage.read(key: one, offset: 6, count: 100) == Array("world".utf8))

        let aborted = try storage.put(key: "demo/" + UUID().uuidString.lowercased())
        try aborted.write([1, 2, 3])
        aborted.abort()
        do {
            let dropped = try storage.put(key: "demo/" + UUID().uuidString.lowercased())
            try dropped.write([4])
        }
        #expect(try storage.list() == [one])
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir + "/.incoming") == [])

        try storage.delete(key: one)
        try storage.delete(key: one)
        #expect(try storage.list() == [])
    }

    @Test(arguments: ["../escape", "/abs", ".hidden", "a/../../b", "ü/✓", "%41"])
    func everyKeyMapsToOneFlatNameAndBack(_ key: String) {
        let name = LocalFileStorage.fileName(key)
        #expect(!name.contains("/") && !name.hasPrefix("."))
        #expect(LocalFileStorage.key(fileName: name) == key)
    }

    @Test func aConfiguredStorageReplacesTheLocalOne() throws {
        let dir = Self.directory(), elsewhere = Self.directory()
        defer {
            try? FileManager.default.removeItem(atPath: dir)
            try? FileManager.default.removeItem(atPath: elsewhere)
        }
        var settings = FileSettings()
        settings.storage = try LocalFileStorage(directory: elsewhere)
        let service = try FileService(settings: settings, dataDirectory: dir)
        #expect((service.storage as? LocalFileStorage)?.directory.path == URL(fileURLWithPath: elsewhere).path)
        #expect(!FileManager.default.fileExists(atPath: dir + "/files"))
    }

    /// The files directory may hold other things (an operator's mistake, or a directory shared
    /// with other programs): only the storage's own objects are ever listed, so start-up's
    /// orphan sweep removes nothing else; and a files directory that is or holds the data
    /// directory is refused outright.
    @Test func onlyTheStoragesOwnObjectsAreSweptAndTheDataDirectoryIsNeverTheFilesDirectory() throws {
        let dir = Self.directory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try FileManager.default.createDirectory(atPath: dir + "/data", withIntermediateDirectories: true)
        for name in ["tether.sqlite", "tether.sqlite-wal", "files-signing-key", "notes.txt", "demo%2Fnot-a-uuid"] {
            #expect(FileManager.default.createFile(atPath: dir + "/" + name, contents: Data("keep".utf8)))
        }
        let object = "demo/" + UUID().uuidString.lowercased()
        let orphan = "demo/" + UUID().uuidString.lowercased()
        try FileManager.default.createDirectory(atPath: dir + "/" + LocalFileStorage.fileName("demo/" + UUID().uuidString.lowercased()),
                                                withIntermediateDirectories: true)
        let storage = try LocalFileStorage(directory: dir)
        for key in [object, orphan] {
            let upload = try storage.put(key: key)
            try upload.write([1])
            try upload.commit()
        }
        #expect(Set(try storage.list()) == [object, orphan])
        var settings = FileSettings()
        settings.storage = storage
        let service = try FileService(settings: settings, dataDirectory: dir + "/elsewhere")
        #expect(try service.removeOrphans(keeping: [object]) == 1)
        let left = Set(try FileManager.default.contentsOfDirectory(atPath: dir))
        #expect(left.isSuperset(of: ["data", "tether.sqlite", "tether.sqlite-wal", "files-signing-key", "notes.txt", "demo%2Fnot-a-uuid",
                                     LocalFileStorage.fileName(object)]))
        #expect(!left.contains(LocalFileStorage.fileName(orphan)))

        // The files directory may not be the data directory, nor hold it.
        for (files, data) in [(dir, dir), (dir, dir + "/data"), (dir + "/", dir + "/data/../data")] {
            var local = FileSettings()
            local.directory = files
            #expect(throws: ServerConfigurationError.self, "\(files) for \(data)") { try FileService(settings: local, dataDirectory: data) }
        }
        var inside = FileSettings()
        inside.directory = dir + "/data/files"
        _ = try FileService(settings: inside, dataDirectory: dir + "/data")
    }
}
