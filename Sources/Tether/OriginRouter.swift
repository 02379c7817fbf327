import Logging
import Synchronization
import TetherClientCore

/// The shell around ``OriginSelector``: every request asks it where to go and tells it how that
/// went (lock, transition, unlock, then announce). One per client, shared by the request
/// pipeline (REST, the outbox, the long-poll, probes) and the WebSocket session.
final class OriginRouter: Sendable {
    private struct State {
        var selector: OriginSelector
        /// The last move (the subscribe engine asks whether a failure moved the client).
        var last: OriginSelector.Change?

        mutating func record(_ change: OriginSelector.Change) {
            last = change
        }
    }

    private let state: Mutex<State>
    private let clock: ElapsedClock
    private let logger: Logger
    private let announce: @Sendable (OriginSelector.Change) -> Void

    init(configuration: TetherConfiguration, clock: ElapsedClock, announce: @escaping @Sendable (OriginSelector.Change) -> Void) {
        state = Mutex(State(selector: OriginSelector(primary: configuration.origin, fallbacks: configuration.fallbackOrigins,
                                                     fallbackRetryTimeout: configuration.fallbackRetryTimeout)))
        self.clock = clock
        self.logger = configuration.logger
        self.announce = announce
    }

    /// Whether there is anywhere to fail over to.
    var hasFallbacks: Bool { state.withLock { !$0.selector.fallbacks.isEmpty } }

    /// The origin in use, without moving.
    var current: String { state.withLock { $0.selector.current } }

    /// The origin the next request goes to (back to the primary once a fallback's time is up).
    func next() -> String {
        let now = clock.now()
        let (origin, change) = state.withLock { state -> (String, OriginSelector.Change?) in
            let (origin, change) = state.selector.origin(now: now)
            if let change { state.record(change) }
            return (origin, change)
        }
        if let change { moved(change) }
        return origin
    }

    /// A request to `origin` was answered by its node.
    func answered(at origin: String) {
        let now = clock.now()
        state.withLock { $0.selector.answered(at: origin, now: now) }
    }

    /// A request to `origin` failed; the selector decides whether the client moves.
    func failed(at origin: String, status: Status) {
        let now = clock.now()
        let change = state.withLock { state -> OriginSelector.Change? in
            let change = state.selector.failed(at: origin, status: status, now: now, randomness: UInt64.random(in: .min ... .max))
            if let change { state.record(change) }
            return change
        }
        if let change { moved(change) }
    }

    /// The node at `origin` announced its graceful shutdown.
    func drained(at origin: String) {
        let now = clock.now()
        let change = state.withLock { state -> OriginSelector.Change? in
            let change = state.selector.drained(at: origin, now: now, randomness: UInt64.random(in: .min ... .max))
            if let change { state.record(change) }
            return change
        }
        if let change { moved(change) }
    }

    /// The network monitor reported the network back, or a new path.
    func networkChanged() {
        let change = state.withLock { state -> OriginSelector.Change? in
            let change = state.selector.networkChanged()
            if let change { state.record(change) }
            return change
        }
        if let change { moved(change) }
    }

    /// Whether a request that went to `origin` and failed is followed by one to a fallback not
    /// yet tried in this cycle (the client has left `origin` by a failover, not by the end of a
    /// cycle): that attempt goes at once instead of after the retry policy's back-off.
    func failedOver(from origin: String?) -> Bool {
        guard let origin else { return false }
        return state.withLock { state in
            guard state.selector.current != origin, case .failedOver? = state.last else { return false }
            return true
        }
    }

    private func moved(_ change: OriginSelector.Change) {
        logger.debug("origin changed", metadata: ["from": "\(change.from)", "to": "\(change.to)", "change": "\(change)"])
        announce(change)
    }
}
