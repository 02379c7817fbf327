import Foundation
import Synchronization

/// Makes an SQLite database's committed WAL frames durable from outside SQLite: the store's
/// message batches commit with `synchronous=NORMAL` (written to the WAL, not synced), are
/// delivered, and then made durable by ``sync()``: one `fdatasync` of the WAL.
///
/// The WAL is synced through a descriptor of its own: `fdatasync` flushes the file, whichever
/// descriptor wrote it. The descriptor is checked against the path before every sync (two
/// `stat`s), so a WAL that SQLite removed and created again is opened again; the directory is
/// synced whenever a WAL file is first opened, so its entry is durable too. With no WAL file
/// at all — everything checkpointed into the database — the database file is synced.
final class WALSync: Sendable {
    private let walPath: String
    private let databasePath: String
    private let directory: String
    /// The open WAL (-1 when none is open). Used by the store's writer and ``release()`` only.
    private let descriptor = Mutex<Int32>(-1)

    init(databasePath: String, directory: String) {
        self.databasePath = databasePath
        self.walPath = databasePath + "-wal"
        self.directory = directory
    }

    /// Makes everything committed so far durable.
    func sync() throws(StoreError) {
        try descriptor.withLock { (fd: inout Int32) throws(StoreError) in
            if fd < 0 || !Self.names(fd, walPath) {
                if fd >= 0 { _ = close(fd) }
                fd = open(walPath, O_RDWR | O_CLOEXEC)
                if fd < 0 {
                    guard errno == ENOENT else { throw Self.failure("open", walPath) }
                    try Self.syncFile(at: databasePath)
                    return
                }
                try Self.syncFile(at: directory)
            }
            guard Self.dataSync(fd) == 0 else { throw Self.failure("fdatasync", walPath) }
        }
    }

    /// Closes the descriptor (the store closes).
    func release() {
        descriptor.withLock { fd in
            if fd >= 0 { _ = close(fd) }
            fd = -1
        }
    }

    /// Whether `fd` is the file now at `path`.
    private static func names(_ fd: Int32, _ path: String) -> Bool {
        var opened = stat()
        var named = stat()
        guard fstat(fd, &opened) == 0, stat(path, &named) == 0 else { return false }
        return opened.st_ino == named.st_ino && opened.st_dev == named.st_dev
    }

    private static func syncFile(at path: String) throws(StoreError) {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw failure("open", path) }
        defer { _ = close(fd) }
        guard fsync(fd) == 0 else { throw failure("fsync", path) }
    }

    private static func dataSync(_ fd: Int32) -> Int32 {
        #if os(Linux)
        fdatasync(fd)
        #else
        fsync(fd)
        #endif
    }

    private static func failure(_ call: String, _ path: String) -> StoreError {
        let code = errno
        return StoreError(.failed, "\(call) of \(path) failed: \(String(cString: strerror(code))) (errno \(code))")
    }
}
