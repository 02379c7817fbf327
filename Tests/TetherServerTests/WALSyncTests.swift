import Foundation
import Testing

@testable import TetherServer

/// `WALSync` and the file identity it checks before every sync, on real files in a temporary
/// directory.
@Suite struct WALSyncTests {
    func directory() throws -> URL {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("tether-walsync-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        return url
    }

    @Test func identityOfADescriptorAndOfItsPathAgreeWithStat() throws {
        let dir = try directory()
        defer { try? FileManager.default.removeItem(at: dir) }
        let path = dir.appendingPathComponent("a").path
        #expect(FileManager.default.createFile(atPath: path, contents: Data("x".utf8)))
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        #expect(fd >= 0)
        defer { _ = close(fd) }
        #if os(Linux)
        #expect(FileIdentity.avoidsTimes, "glibc's statx is found")
        #endif
        let byDescriptor = try #require(FileIdentity(descriptor: fd))
        #expect(FileIdentity(path: path) == byDescriptor)
        var info = stat()
        #expect(stat(path, &info) == 0)
        #expect(byDescriptor == FileIdentity(device: UInt64(info.st_dev), inode: UInt64(info.st_ino)), "the same numbers as stat")
        // Replaced: the path names another file; the descriptor still the old one.
        try FileManager.default.removeItem(atPath: path)
        #expect(FileIdentity(path: path) == nil)
        #expect(FileManager.default.createFile(atPath: path, contents: Data("y".utf8)))
        let replaced = try #require(FileIdentity(path: path))
        #expect(replaced != byDescriptor)
        #expect(FileIdentity(descriptor: fd) == byDescriptor)
        #expect(FileIdentity(descriptor: -1) == nil)
        // glibc's makedev, high bits included (the value Python's os.makedev gives).
        #expect(FileIdentity.makeDevice(major: 0x1234_5678, minor: 0x1ABC_DEF0) == 0x1234_51AB_CDE6_78F0, "as os.makedev gives")
    }

    @Test func syncFollowsAReplacedWALAndAMissingOneIsAFinalFailure() throws {
        let dir = try directory()
        defer { try? FileManager.default.removeItem(at: dir) }
        let database = dir.appendingPathComponent("store.sqlite").path
        let walPath = database + "-wal"
        #expect(FileManager.default.createFile(atPath: walPath, contents: Data("frames".utf8)))
        let sync = WALSync(databasePath: database)
        defer { sync.release() }
        try sync.sync()
        try sync.sync()
        #expect(sync.syncedFile == FileIdentity(path: walPath))
        // Another WAL took the path (renamed over it, so it cannot reuse the old inode, which the
        // sync's descriptor keeps): the new one is opened and synced.
        let first = try #require(sync.syncedFile)
        let next = dir.appendingPathComponent("next-wal").path
        #expect(FileManager.default.createFile(atPath: next, contents: Data("new".utf8)))
        #expect(rename(next, walPath) == 0)
        try sync.sync()
        let replaced = try #require(FileIdentity(path: walPath))
        #expect(replaced != first)
        #expect(sync.syncedFile == replaced)
        // While the WAL stays, the same descriptor is kept.
        try sync.sync()
        #expect(sync.syncedFile == replaced)
        // No WAL after a commit: a failure, and every sync after it fails too.
        try FileManager.default.removeItem(atPath: walPath)
        #expect(throws: StoreError.self) { try sync.sync() }
        #expect(FileManager.default.createFile(atPath: walPath, contents: Data("again".utf8)))
        #expect(throws: StoreError.self) { try sync.sync() }
        #expect(sync.failure != nil)
    }
}
