/// Whether the device has a usable network, as a ``NetworkMonitor`` reports it.
public enum NetworkPathStatus: String, Sendable, Hashable, CustomStringConvertible {
    /// At least one usable interface is up.
    case up
    /// No usable interface.
    case down

    /// The case name.
    public var description: String { rawValue }
}

/// Reports network up / network down to the subscribe engine: network up triggers one immediate
/// reconnect attempt; network down stops pointless retries until the network is back.
///
/// ``RTNetlinkNetworkMonitor`` implements it on Linux, ``PathNetworkMonitor`` (NWPathMonitor) on
/// Apple platforms; tests and apps with better knowledge can supply their own.
public protocol NetworkMonitor: Sendable {
    /// A stream of path changes, starting with the current status. It ends when the monitor stops
    /// or the iterating task is cancelled.
    func pathUpdates() -> AsyncStream<NetworkPathStatus>
}

#if canImport(Network)
import Dispatch
import Network

/// ``NetworkMonitor`` on Apple platforms: `NWPathMonitor`'s `satisfied` is up, anything else down.
public struct PathNetworkMonitor: NetworkMonitor {
    /// Creates a monitor (no work until ``pathUpdates()`` is iterated).
    public init() {}

    /// Path changes, starting with the current one.
    public func pathUpdates() -> AsyncStream<NetworkPathStatus> {
        AsyncStream { continuation in
            let monitor = NWPathMonitor()
            monitor.pathUpdateHandler = { path in continuation.yield(path.status == .satisfied ? .up : .down) }
            continuation.onTermination = { _ in monitor.cancel() }
            monitor.start(queue: DispatchQueue(label: "tether.network-monitor"))
        }
    }
}
#endif
