import Foundation
import GRDB
import Synchronization

/// Makes an SQLite database's committed WAL frames durable from outside SQLite: the store's
/// message batches commit with `synchronous=NORMAL` (written to the WAL, not synced), are
/// delivered, and then made durable by ``sync()``: one `fdatasync` of the WAL.
///
/// The WAL is synced through a descriptor of its own: `fdatasync` flushes the file, whichever
/// descriptor wrote it. Its path is the database path with symbolic links resolved (SQLite puts
/// the WAL beside the file a link points to). The descriptor is checked against the path before
/// every sync (device and inode of both, read without asking for times: ``FileIdentity``), so a
/// WAL that SQLite removed and created again is opened again; the
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

    /// The identity of the WAL the last sync went to, if one is open (tests).
    package var syncedFile: FileIdentity? {
        state.withLock { $0.descriptor >= 0 ? FileIdentity(descriptor: $0.descriptor) : nil }
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
        guard let opened = FileIdentity(descriptor: fd), let named = FileIdentity(path: path) else { return false }
        return opened == named
    }

    private static func syncDirectory(_ path: String) throws(StoreError) {
        if let (call, code) = fsyncDirectory(atPath: path) {
            throw StoreError(.failed, "\(call) of \(path) failed: \(String(cString: strerror(code))) (errno \(code))")
        }
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

/// Syncs the directory at `path`, so a file created or renamed in it keeps its name after a power
/// loss. `nil` when done, otherwise the call that failed and its `errno`.
func fsyncDirectory(atPath path: String) -> (call: String, errno: Int32)? {
    let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    guard fd >= 0 else { return ("open", errno) }
    defer { _ = close(fd) }
    guard fsync(fd) == 0 else { return ("fsync", errno) }
    return nil
}

/// A file's device and inode, read without asking for its times where the system allows it.
///
/// On Linux 6.13 and later, reading a file's change time (any `stat`) makes the kernel give
/// the file's next modification a fine-grained timestamp ("multigrain timestamps"), so the
/// inode is dirtied by every write instead of once per clock tick, and on ext4 without a journal
/// `fdatasync` then writes the inode too: a second I/O in every sync. ``WALSync`` checks the
/// WAL's identity before every sync, so it asks `statx` for the inode number only (measured
/// here: a write and `fdatasync` of 4 KiB took 145 µs with two `stat`s before it, 100 µs
/// without; docs/benchmarks.md, seventh pass). Where `statx` is missing it uses `stat`.
package struct FileIdentity: Equatable, Sendable {
    package var device: UInt64
    package var inode: UInt64

    /// The identity of the open file `descriptor`; `nil` if it cannot be read.
    package init?(descriptor: Int32) {
        #if os(Linux)
        if let identity = Self.read(directory: descriptor, path: "", flags: Self.emptyPath) {
            self = identity
            return
        }
        #endif
        var info = stat()
        guard fstat(descriptor, &info) == 0 else { return nil }
        self.init(device: UInt64(info.st_dev), inode: UInt64(info.st_ino))
    }

    /// The identity of the file at `path` (links followed); `nil` if there is none.
    package init?(path: String) {
        #if os(Linux)
        if let identity = Self.read(directory: AT_FDCWD, path: path, flags: 0) {
            self = identity
            return
        }
        #endif
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        self.init(device: UInt64(info.st_dev), inode: UInt64(info.st_ino))
    }

    /// Whether identities are read without asking for times (`statx` found).
    package static var avoidsTimes: Bool {
        #if os(Linux)
        statx != nil
        #else
        false
        #endif
    }

    package init(device: UInt64, inode: UInt64) {
        self.device = device
        self.inode = inode
    }

    #if os(Linux)
    /// glibc's `statx` (2.28 and later), which Swift's Glibc module does not declare.
    private typealias Statx = @convention(c) (Int32, UnsafePointer<CChar>, Int32, UInt32, UnsafeMutableRawPointer) -> Int32
    private static let statx: Statx? = dlsym(nil, "statx").map { unsafeBitCast($0, to: Statx.self) }
    /// `AT_EMPTY_PATH` and `STATX_INO` from the kernel's headers (stable ABI).
    private static let emptyPath: Int32 = 0x1000
    private static let inodeOnly: UInt32 = 0x100

    /// Reads device and inode through `statx`, asking for the inode number only: `struct statx`
    /// is 256 bytes, with `stx_mask` at 0, `stx_ino` at 32, `stx_dev_major` and `stx_dev_minor`
    /// (always filled) at 136 and 140. `nil` when `statx` is missing, fails (a seccomp filter
    /// may refuse it with `EPERM`) or does not report the inode: the caller then uses `stat`,
    /// which reports a missing file the same way.
    private static func read(directory: Int32, path: String, flags: Int32) -> FileIdentity? {
        guard let statx else { return nil }
        return withUnsafeTemporaryAllocation(byteCount: 256, alignment: 8) { buffer -> FileIdentity? in
            guard let base = buffer.baseAddress else { return nil }
            buffer.initializeMemory(as: UInt8.self, repeating: 0)
            guard statx(directory, path, flags, inodeOnly, base) == 0,
                  base.load(fromByteOffset: 0, as: UInt32.self) & inodeOnly != 0
            else { return nil }
            let major = UInt64(base.load(fromByteOffset: 136, as: UInt32.self))
            let minor = UInt64(base.load(fromByteOffset: 140, as: UInt32.self))
            return FileIdentity(device: makeDevice(major: major, minor: minor), inode: base.load(fromByteOffset: 32, as: UInt64.self))
        }
    }

    /// glibc's `makedev`, so a device read by `statx` matches `stat`'s `st_dev`.
    package static func makeDevice(major: UInt64, minor: UInt64) -> UInt64 {
        (major & 0xFFF) << 8 | (major & ~0xFFF) << 32 | (minor & 0xFF) | (minor & ~0xFF) << 12
    }
    #endif
}

/// Refuses every commit on a store connection once the WAL's sync has failed (``WALSync``):
/// installed on the writer and on the health probe's connection, so a grant, a group change, an
/// action or any other record write is refused like a publish instead of being acknowledged
/// after frames the kernel may have dropped (recovery after a crash stops at such a hole and
/// discards what follows it). The check runs in SQLite's commit hook, so it covers every
/// transaction on those connections, whichever code opened it.
final class WALCommitGuard: TransactionObserver, Sendable {
    private let wal: WALSync

    init(_ wal: WALSync) { self.wal = wal }

    func databaseWillCommit() throws {
        if let failure = wal.failure { throw failure }
    }

    func observes(eventsOfKind eventKind: DatabaseEventKind) -> Bool { false }
    func databaseDidChange(with event: DatabaseEvent) {}
    func databaseDidCommit(_ db: Database) {}
    func databaseDidRollback(_ db: Database) {}
}
