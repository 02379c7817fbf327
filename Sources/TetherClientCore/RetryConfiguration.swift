/// How failed requests are retried automatically. A plain value the subscribe engine (and, for
/// the endpoints not excluded, other calls) reads; the policy itself is applied by the client
/// shell.
///
/// Defaults follow the PubNub SDKs (pubnub-wire §13.3): exponential back-off from 2 s to 150 s,
/// at most 6 retries, 0.001–0.999 s of randomness added to each delay, a 2 s minimum interval,
/// and every non-subscribe endpoint excluded (REST calls return their failure to the caller, who
/// can use `Status.retry()`).
public struct RetryConfiguration: Sendable, Hashable {
    /// The shape of the delay curve.
    public enum Policy: Sendable, Hashable {
        /// Never retry automatically.
        case none
        /// The same delay before every attempt, at most `maximumRetries` times (PubNub: 2 s, 10).
        case linear(delay: Duration, maximumRetries: Int)
        /// `minimumDelay × 2^(attempt-1)` capped at `maximumDelay`, at most `maximumRetries` times
        /// (PubNub: 2 s, 150 s, 6).
        case exponential(minimumDelay: Duration, maximumDelay: Duration, maximumRetries: Int)
    }

    /// Groups of endpoints that can be excluded from automatic retry.
    public enum Endpoint: String, Sendable, Hashable, CaseIterable {
        /// Subscribe long-poll.
        case subscribe
        /// Publish, signal, fire.
        case messageSend
        /// Heartbeat, leave, here-now, where-now, state.
        case presence
        /// History, fetch, message counts, delete.
        case messageStorage
        /// Channel-group management.
        case channelGroups
        /// Access Manager.
        case accessManager
        /// Time.
        case time
    }

    /// The delay curve.
    public var policy: Policy
    /// The smallest delay between two attempts, whatever the policy says.
    public var minimumInterval: Duration
    /// Bounds of the random jitter added to each delay.
    public var jitter: ClosedRange<Duration>
    /// Endpoints never retried automatically.
    public var excludedEndpoints: Set<Endpoint>

    /// Creates a configuration.
    public init(policy: Policy = .exponential(minimumDelay: .seconds(2), maximumDelay: .seconds(150), maximumRetries: 6),
                minimumInterval: Duration = .seconds(2),
                jitter: ClosedRange<Duration> = .milliseconds(1) ... .milliseconds(999),
                excludedEndpoints: Set<Endpoint> = Set(Endpoint.allCases).subtracting([.subscribe])) {
        self.policy = policy
        self.minimumInterval = minimumInterval
        self.jitter = jitter
        self.excludedEndpoints = excludedEndpoints
    }

    /// PubNub's default: exponential 2 s → 150 s, 6 retries, only subscribe retried.
    public static let `default` = RetryConfiguration()

    /// No automatic retry at all.
    public static let disabled = RetryConfiguration(policy: .none)
}
