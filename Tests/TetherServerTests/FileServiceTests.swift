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
        let upload = try storage.put(key: "demo/one")
        try upload.write(Array("hello ".utf8))
        #expect(try storage.get(key: "demo/one") == nil)
        #expect(try storage.list() == [])
        try upload.write(Array("world".utf8))
        try upload.commit()
        #expect(try storage.get(key: "demo/one") == Array("hello world".utf8))
        #expect(try storage.list() == ["demo/one"])
        #expect(try storage.size(key: "demo/one") == 11 && storage.size(key: "demo/none") == nil)
        #expect(try storage.read(key: "demo/one", offset: 6, count: 100) == Array("world".utf8))

        let aborted = try storage.put(key: "demo/two")
        try aborted.write([1, 2, 3])
        aborted.abort()
        do {
            let dropped = try storage.put(key: "demo/three")
            try dropped.write([4])
        }
        #expect(try storage.list() == ["demo/one"])
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir + "/.incoming") == [])

        try storage.delete(key: "demo/one")
        try storage.delete(key: "demo/one")
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
}
