/// Liveness while receiving: the child of ``SubscribeMachine`` that probes the link on a timer
/// and declares it dead when the probes say so.
///
/// A long-poll on a broken pipe looks exactly like a quiet channel (seed 001), so while the loop
/// receives it sends a probe every interval: a presence heartbeat when presence heartbeats are
/// configured, a Time request otherwise. ``HeartbeatTracker`` holds the arithmetic; this machine
/// adds the timer and which results the app hears about (`heartbeatReporting`).
package struct HeartbeatMachine: Sendable, Hashable {
    /// Which request probes the link.
    package enum Probe: Sendable, Hashable {
        /// A presence heartbeat on the subscription.
        case presenceHeartbeat
        /// A Time API request.
        case time
    }

    /// What the parent does.
    package enum Action: Sendable, Hashable {
        /// Start (or restart) the liveness timer.
        case schedule(after: Duration)
        /// Send one probe, which must answer within `timeout`.
        case probe(Probe, timeout: Duration)
        /// Tell the app a heartbeat answered.
        case reportSuccess
        /// Tell the app a heartbeat failed (the status the request produced).
        case reportFailure
        /// The link is dead: restart the subscribe loop.
        case declareDead
    }

    /// Can transition to: off → off. watching → watching (every probe result), dead (a failure
    /// at the tracker's limit). dead → dead (the parent replaces the machine on the next connection).
    private enum State: Sendable, Hashable {
        /// Liveness probing is off.
        case off
        /// Probing, with the tracker's count of failures.
        case watching(HeartbeatTracker, Probe)
        /// The link was declared dead.
        case dead
    }

    private var state: State
    /// Which results are reported (`.none` unless presence heartbeats are the probe).
    private let reporting: HeartbeatReporting

    /// The machine for a loop that just connected, and the actions that start it.
    package static func start(_ configuration: SubscribeMachine.Configuration) -> (HeartbeatMachine, [Action]) {
        if let heartbeat = configuration.presenceHeartbeat {
            let timeout = configuration.liveness?.timeout ?? .seconds(10)
            let tracker = HeartbeatTracker(interval: heartbeat.interval, timeout: timeout)
            return (HeartbeatMachine(state: .watching(tracker, .presenceHeartbeat), reporting: heartbeat.reporting),
                    [.schedule(after: heartbeat.interval)])
        }
        guard let liveness = configuration.liveness else { return (HeartbeatMachine(state: .off, reporting: .none), []) }
        let tracker = HeartbeatTracker(interval: liveness.interval, timeout: liveness.timeout)
        return (HeartbeatMachine(state: .watching(tracker, .time), reporting: .none), [.schedule(after: liveness.interval)])
    }

    private init(state: State, reporting: HeartbeatReporting) {
        self.state = state
        self.reporting = reporting
    }

    /// The liveness timer fired: probe.
    package func timerFired() -> [Action] {
        switch state {
        case .watching(let tracker, let probe): return [.probe(probe, timeout: tracker.timeout)]
        case .off, .dead: return []
        }
    }

    /// A probe answered.
    package mutating func probeSucceeded() -> [Action] {
        switch state {
        case .watching(var tracker, let probe):
            var actions: [Action] = []
            if case .probeAfter(let delay) = tracker.probeSucceeded() { actions.append(.schedule(after: delay)) }
            state = .watching(tracker, probe)
            switch reporting {
            case .all: actions.append(.reportSuccess)
            case .none, .failures: break
            }
            return actions
        case .off, .dead:
            return []
        }
    }

    /// A probe failed or timed out.
    package mutating func probeFailed() -> [Action] {
        switch state {
        case .watching(var tracker, let probe):
            var actions: [Action] = []
            switch reporting {
            case .failures, .all: actions.append(.reportFailure)
            case .none: break
            }
            switch tracker.probeFailed() {
            case .probeAfter(let delay):
                state = .watching(tracker, probe)
                actions.append(.schedule(after: delay))
            case .declareDead:
                state = .dead
                actions.append(.declareDead)
            }
            return actions
        case .off, .dead:
            return []
        }
    }
}
