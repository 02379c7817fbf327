import Synchronization

/// Runs a piece of code alone until one run of it has finished, then lets every later run
/// through at once (one atomic load).
///
/// For code that builds a connection's generic NIO types on the connection's own event loop:
/// Swift's runtime (seen with 6.3.1 on Linux) can crash when one thread checks a protocol
/// conformance of a generic class whose type metadata another thread is still completing (see
/// `HTTPDecoderTypes`). The first connection of a process builds them alone; once they are
/// complete, concurrent builds are safe. One gate per piece of code, shared by the process (type
/// metadata is process-wide): a `static let`.
package final class FirstUseGate: Sendable {
    private let finished = Atomic<Bool>(false)
    private let lock = Mutex<Void>(())

    package init() {}

    /// Runs `body`: alone (other callers wait) until a run has returned without throwing, then
    /// concurrently.
    package func run<T: Sendable, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        if finished.load(ordering: .acquiring) { return try body() }
        return try lock.withLock { _ throws(E) -> T in
            let value = try body()
            finished.store(true, ordering: .releasing)
            return value
        }
    }
}
