/// Decides, from the results it is given, when the next liveness probe (a presence heartbeat, or
/// a Time request when presence heartbeats are off) is due and when the link is dead.
///
/// A long-poll on a broken pipe looks exactly like a quiet channel (seed 001), so while receiving
/// the engine probes every ``interval``; a probe gets ``timeout`` to answer. Detection is bounded
/// by `interval + timeout` (25 s + 10 s = 35 s by default).
package struct HeartbeatTracker: Sendable, Hashable {
    /// What the shell does next.
    package enum Decision: Sendable, Hashable {
        /// Probe again after this delay.
        case probeAfter(Duration)
        /// The link is dead: restart the subscribe loop.
        case declareDead
    }

    /// Time between probes.
    package let interval: Duration
    /// How long a probe may take.
    package let timeout: Duration
    /// Consecutive failures that declare the link dead (1: the first failure does).
    package let failureLimit: Int
    /// Failures since the last success.
    package private(set) var consecutiveFailures: Int

    /// Creates a tracker.
    package init(interval: Duration, timeout: Duration, failureLimit: Int = 1) {
        self.interval = interval
        self.timeout = timeout
        self.failureLimit = max(1, failureLimit)
        self.consecutiveFailures = 0
    }

    /// The longest a dead link can go unnoticed.
    package var detectionBound: Duration { interval * failureLimit + timeout * failureLimit }

    /// A probe answered.
    package mutating func probeSucceeded() -> Decision {
        consecutiveFailures = 0
        return .probeAfter(interval)
    }

    /// A probe failed or timed out.
    package mutating func probeFailed() -> Decision {
        consecutiveFailures += 1
        return consecutiveFailures >= failureLimit ? .declareDead : .probeAfter(interval)
    }
}
