/// Whether the device has a usable network, as a ``NetworkMonitor`` reports it.
public enum NetworkPathStatus: String, Sendable, Hashable, CustomStringConvertible {
    /// At least one usable interface is up.
    case up
    /// No usable interface.
    case down
    /// Still usable, but over a different path: an interface went away while another remains
    /// (Wi-Fi → cellular) or a new one took over. Connections made over the old path may be
    /// dead without an error, so the subscribe engine restarts its long-poll at once.
    case changed

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
            let previous = PreviousInterfaces()
            monitor.pathUpdateHandler = { path in
                guard path.status == .satisfied else {
                    previous.swap(nil)
                    continuation.yield(.down)
                    return
                }
                let names = path.availableInterfaces.map(\.name)
                let old = previous.swap(names)
                continuation.yield(old == nil || old == names ? .up : .changed)
            }
            continuation.onTermination = { _ in monitor.cancel() }
            monitor.start(queue: DispatchQueue(label: "tether.network-monitor"))
        }
    }
}

/// The interfaces of the last satisfied path (`NWPathMonitor` calls back on one queue).
private final class PreviousInterfaces: @unchecked Sendable {
    private var names: [String]?

    /// Stores `new`, returns what was there.
    @discardableResult
    func swap(_ new: [String]?) -> [String]? {
        defer { names = new }
        return names
    }
}
#endif
