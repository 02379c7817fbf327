import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// An exclusive advisory lock on `<data-dir>/tether.lock`, held by `tether serve` for its
/// lifetime and by `tether store recover`, so the store is never moved from under a running
/// server and two servers never share one data directory. The lock ends with the process,
/// however it ends (a SIGKILL included).
public final class DataDirectoryLock: Sendable {
    private let descriptor: Int32

    /// Takes the lock, creating the directory if needed.
    /// - Throws: ``StoreError`` when another process holds it.
    public init(directory: String) throws {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let path = (directory as NSString).appendingPathComponent("tether.lock")
        let descriptor = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        guard descriptor >= 0 else {
            throw StoreError(.failed, "cannot open \(path): \(String(cString: strerror(errno)))")
        }
        guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else {
            let reason = errno == EWOULDBLOCK ? "another tether process (a server, or a store recovery) is using \(directory); stop it first"
                : "cannot lock \(path): \(String(cString: strerror(errno)))"
            close(descriptor)
            throw StoreError(.failed, reason)
        }
        self.descriptor = descriptor
    }

    deinit { close(descriptor) }
}
