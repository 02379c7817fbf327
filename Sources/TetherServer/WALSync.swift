import Foundation
import Synchronization

/// Makes an SQLite database's committed WAL frames durable from outside SQLite: the store's
/// message batches commit with `synchronous=NORMAL` (written to the WAL, not synced), are
/// delivered, and then made durable by ``sync()``: one `fdatasync` of the WAL.
///
/// The WAL is synced through a descriptor of its own: `fdatasync` flushes the file, whichever
/// descriptor wrote it. Its path is the database path with symbolic links resolved (SQLite puts
/// the WAL beside the file a link points to). The descriptor is checked against the path before
/// every sync (two `stat`s), so a WAL that SQLite removed and created again is opened again; the
/// directory is synced whenever a WAL file is first opened, so its entry is durable too. The
/// database file itself is never opened here: closing a descriptor of it would drop SQLite's
/// POSIX locks.
///
/// A failed sync is final: Linux marks the pages it could not write clean, so a later
/// `fdatasync` would report success for data that never reached the disk. Every sync after a
/// failure fails, and the store refuses writes until the server restarts.
final class WALSync: Sendable {
    private let walPath: String
    private let directory: String
    private struct State {
        /// The open WAL (-1 when none is open).
        var descriptor: Int32 = -1
        /// The first failure; once set, every sync fails with it.
        var failure: StoreError?
    }

    private let state = Mutex(State())

    init(databasePath: String) {
        let resolved = URL(fileURLWithPath: databasePath).resolvingSymlinksInPath().path
        self.walPath = resolved + "-wal"
        self.directory = (resolved as NSString).deletingLastPathComponent
    }

    /// The failure that stopped syncing, if one did.
    var failure: StoreError? { state.withLock { $0.failure } }

    /// Stops syncing for good (a failure the store cannot recover from).
    func fail(_ error: StoreError) {
        state.withLock { if $0.failure == nil { $0.failure = error } }
    }

    /// Makes everything committed so far durable.
    func sync() throws(StoreError) {
        try state.withLock { (state: inout State) throws(StoreError) in
            if let failure = state.failure { throw failure }
            do throws(StoreError) {
                try Self.sync(&state.descriptor, walPath: walPath, directory: directory)
            } catch {
                state.failure = StoreError(.failed, "an earlier sync of the store failed; restart the server after checking the disk",
                                           cause: error)
                throw error
            }
        }
    }

    private static func sync(_ fd: inout Int32, walPath: String, directory: String) throws(StoreError) {
        if fd < 0 || !names(fd, walPath) {
            if fd >= 0 { _ = close(fd) }
            fd = -1
            // After a commit in WAL mode the WAL exists: not finding it is a failure, never a
            // reason to sync something else.
            let opened = open(walPath, O_RDWR | O_CLOEXEC)
            guard opened >= 0 else { throw failure("open", walPath) }
            do throws(StoreError) {
                try syncDirectory(directory)
            } catch {
                _ = close(opened)
                throw error
            }
            fd = opened
        }
        guard dataSync(fd) == 0 else { throw failure("fdatasync", walPath) }
    }

    /// Closes the descriptor (the store closes).
    func release() {
        state.withLock { state in
            if state.descriptor >= 0 { _ = close(state.descriptor) }
            state.descriptor = -1
        }
    }

    /// Whether `fd` is the file now at `path`.
    private static func names(_ fd: Int32, _ path: String) -> Bool {
        var opened = stat()
        var named = stat()
        guard fstat(fd, &opened) == 0, stat(path, &named) == 0 else { return false }
        return opened.st_ino == named.st_ino && opened.st_dev == named.st_dev
    }

    private static func syncDirectory(_ path: String) throws(StoreError) {
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
