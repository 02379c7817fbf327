/// What the network monitor last said: the child of ``SubscribeMachine`` that turns the monitor's
/// reports into changes the loop acts on, and keeps a flapping interface from turning back-off
/// into a tight loop.
package struct NetworkWatch: Sendable, Hashable {
    /// A report that changes something.
    package enum Change: Sendable, Hashable {
        /// Nothing to do (the same report again, or the first report of a usable network).
        case unchanged
        /// The network went away: stop pointless retries.
        case wentDown
        /// The network came back after being down: one immediate attempt.
        case cameBack
        /// The path changed while staying usable (Wi-Fi → cellular): requests in flight may sit on
        /// a dead path.
        case pathChanged
    }

    /// Whether a path change may cut a retry's wait short.
    package enum EarlyAttempt: Sendable, Hashable {
        /// Yes (now recorded as the last one).
        case allowed
        /// The last one was less than a second ago.
        case tooSoon
    }

    /// Can transition to: unknown → up, down. up → down. down → up.
    private enum State: Sendable, Hashable {
        /// No report yet.
        case unknown
        /// Usable.
        case up
        /// No usable network.
        case down
    }

    private var state = State.unknown
    /// When a path change last cut a retry's wait short.
    private var lastEarlyAttempt: Duration?

    /// Creates a watch that has heard nothing yet.
    package init() {}

    /// Whether the monitor last reported no usable network.
    package var isDown: Bool {
        switch state {
        case .down: return true
        case .unknown, .up: return false
        }
    }

    /// The monitor reports no usable network.
    package mutating func down() -> Change {
        switch state {
        case .down: return .unchanged
        case .unknown, .up:
            state = .down
            return .wentDown
        }
    }

    /// The monitor reports a usable network.
    package mutating func up() -> Change {
        switch state {
        case .up: return .unchanged
        case .unknown:
            state = .up
            return .unchanged
        case .down:
            state = .up
            return .cameBack
        }
    }

    /// The monitor reports a path change; from down or unknown this is ``up()``.
    package mutating func changed() -> Change {
        switch state {
        case .up: return .pathChanged
        case .unknown, .down: return up()
        }
    }

    /// A path change wants to run a scheduled retry now: at most once a second.
    package mutating func claimEarlyAttempt(now: Duration) -> EarlyAttempt {
        if let last = lastEarlyAttempt, now - last < .seconds(1) { return .tooSoon }
        lastEarlyAttempt = now
        return .allowed
    }
}
