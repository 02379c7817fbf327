/// How failed requests are retried automatically. A plain value the subscribe engine (and, for
/// the endpoints not excluded, other calls) reads; the schedule itself is computed by
/// ``delay(beforeRetry:elapsed:randomness:)`` from values passed in (no clock, no randomness
/// inside), and applied by the client shell.
///
/// Defaults follow the PubNub SDKs (pubnub-wire §13.3, seed 000): exponential back-off from 2 s to
/// 150 s, at most 6 retries, 0.001–0.999 s of randomness added to each delay, a 2 s minimum
/// interval, and every non-subscribe endpoint excluded (REST calls return their failure to the
/// caller, who can use `Status.retry()`).
///
/// Presets reproduce other systems exactly: ``sendBird`` (0, 3, 6, 12, 24 s, failed after 45 s),
/// ``diffusion`` (every 5 s for 60 s) and ``diffusionBackOff`` (0, 1, 2, 3, 4, 5, 5… s). Every
/// policy restarts from its first attempt after a success — the reset Diffusion's blog (seed 004)
/// has to implement by hand.
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
        /// An explicit list of delays, one per retry; gives up when the list is exhausted or when
        /// `giveUpAfter` has elapsed since the failure (SendBird: 0, 3, 6, 12, 24 s; 45 s).
        case delays([Duration], giveUpAfter: Duration?)
        /// The same delay before every retry until `giveUpAfter` has elapsed since the failure
        /// (Diffusion's default: every 5 s for 60 s).
        case interval(Duration, giveUpAfter: Duration)
        /// `(attempt-1) × increment` capped at `maximumDelay`: the first retry is immediate
        /// (Diffusion's back-off strategy, seed 004); gives up after `giveUpAfter` when set.
        case backOff(increment: Duration, maximumDelay: Duration, giveUpAfter: Duration?)
        /// The app decides (see ``ReconnectionStrategy``).
        case custom(CustomReconnectionStrategy)

        /// Whether the app's strategy decides (``custom(_:)``): then nothing overrides it.
        package var isCustom: Bool {
            if case .custom = self { return true }
            return false
        }
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
        /// Message actions: add, remove, get.
        case messageActions
        /// App Context: user and channel metadata, memberships, members.
        case appContext
        /// Mobile push device registrations: add, remove, list.
        case devicePushNotifications
        /// Files: send, list, download, delete, publish file message.
        case files
        /// Time.
        case time
    }

    /// The delay curve.
    public var policy: Policy
    /// The smallest delay between two attempts, whatever the policy says (not applied to
    /// ``Policy/custom(_:)``, to ``fastReconnect``'s quick attempts, nor to a server's
    /// `Retry-After`, which is followed as given with a 1 s floor).
    public var minimumInterval: Duration
    /// Bounds of the random jitter added to each delay (not applied to ``Policy/custom(_:)``).
    public var jitter: ClosedRange<Duration>
    /// Endpoints never retried automatically.
    public var excludedEndpoints: Set<Endpoint>
    /// Quick attempts while failures never reach a working server — connection refused (a
    /// server restarting or down), a connection cut before any answer, a captive portal's page:
    /// knocking again costs the server nothing, so the subscribe loop tries again within
    /// ``FastReconnect/interval`` instead of waiting out the policy's back-off, and is back
    /// within about a second of the path. Answers from a server (5xx, 403, timeouts) follow the
    /// policy, and so does a ``Policy/custom(_:)`` strategy (the app decides). `nil` (every preset
    /// reproducing another system) follows the policy alone. Quick attempts start once an outage
    /// is under way (or at once for "connection refused"), and never outlast a policy's give-up.
    public var fastReconnect: FastReconnect?
    /// How many times the subscribe loop retries after Access Manager denied it (seed 002: grants
    /// can take a moment to propagate, but a revoked grant never comes back). Default 3.
    public var accessDeniedRetryLimit: Int

    /// Quick reconnection attempts while failures never reach a server (see ``fastReconnect``).
    public struct FastReconnect: Sendable, Hashable {
        /// The longest wait between two attempts; each wait is drawn between half of it and all
        /// of it, so clients of a restarting server spread out instead of arriving together.
        public var interval: Duration
        /// How long into an outage the quick attempts go on; afterwards the policy alone
        /// decides (a server down for good is not knocked on every second forever).
        public var window: Duration

        /// Creates the setting (default: within 1 s, for the first 5 minutes of an outage).
        public init(interval: Duration = .seconds(1), window: Duration = .seconds(300)) {
            self.interval = interval
            self.window = window
        }

        /// The wait before the next quick attempt, for a `randomness` in `0...1`.
        package func delay(randomness: Double) -> Duration {
            interval * (0.5 + 0.5 * min(max(randomness, 0), 1))
        }
    }

    /// Creates a configuration.
    public init(policy: Policy = .exponential(minimumDelay: .seconds(2), maximumDelay: .seconds(150), maximumRetries: 6),
                minimumInterval: Duration = .seconds(2),
                jitter: ClosedRange<Duration> = .milliseconds(1) ... .milliseconds(999),
                excludedEndpoints: Set<Endpoint> = Set(Endpoint.allCases).subtracting([.subscribe]),
                accessDeniedRetryLimit: Int = 3, fastReconnect: FastReconnect? = FastReconnect()) {
        self.policy = policy
        self.minimumInterval = minimumInterval
        self.jitter = jitter
        self.excludedEndpoints = excludedEndpoints
        self.accessDeniedRetryLimit = accessDeniedRetryLimit
        self.fastReconnect = fastReconnect
    }

    /// PubNub's default (exponential 2 s → 150 s, 6 retries, only subscribe retried), plus
    /// Tether's ``fastReconnect`` while nothing listens at the origin.
    public static let `default` = RetryConfiguration()

    /// No automatic retry at all.
    public static let disabled = RetryConfiguration(policy: .none)

    /// PubNub's linear policy: 2 s (+ jitter) between attempts, at most 10 retries.
    public static let linear = RetryConfiguration(policy: .linear(delay: .seconds(2), maximumRetries: 10))

    /// SendBird's reconnection (seed 003): attempts 0, 3, 6, 12 and 24 s apart, reconnect failed
    /// 45 s after the drop. No jitter, no minimum interval.
    public static let sendBird = RetryConfiguration(
        policy: .delays([.zero, .seconds(3), .seconds(6), .seconds(12), .seconds(24)], giveUpAfter: .seconds(45)),
        minimumInterval: .zero, jitter: .zero ... .zero, fastReconnect: nil)

    /// Diffusion's default reconnection (seed 004): every 5 s for 60 s. No jitter.
    public static let diffusion = RetryConfiguration(policy: .interval(.seconds(5), giveUpAfter: .seconds(60)),
                                                     minimumInterval: .zero, jitter: .zero ... .zero, fastReconnect: nil)

    /// Diffusion's back-off strategy (seed 004): immediately, then 1 s more per attempt up to 5 s,
    /// for at most 5 minutes; the attempt counter restarts after every success. No jitter.
    public static let diffusionBackOff = RetryConfiguration(
        policy: .backOff(increment: .seconds(1), maximumDelay: .seconds(5), giveUpAfter: .seconds(300)),
        minimumInterval: .zero, jitter: .zero ... .zero, fastReconnect: nil)

    /// Whether `endpoint` is retried automatically at all.
    package func retries(_ endpoint: Endpoint) -> Bool {
        if case .none = policy { return false }
        return !excludedEndpoints.contains(endpoint)
    }

    /// The delay before retry number `attempt` (1 for the first retry after a failure), or `nil`
    /// when the policy gives up.
    ///
    /// - Parameters:
    ///   - attempt: the retry about to be scheduled, starting at 1.
    ///   - elapsed: time since the failure that started this outage.
    ///   - randomness: a value in `0...1` choosing the jitter within ``jitter`` (the shell passes
    ///     a random number; tests pass fixed ones).
    package func delay(beforeRetry attempt: Int, elapsed: Duration, randomness: Double) -> Duration? {
        let base: Duration
        switch policy {
        case .none:
            return nil
        case .linear(let delay, let maximumRetries):
            guard attempt <= maximumRetries else { return nil }
            base = delay
        case .exponential(let minimumDelay, let maximumDelay, let maximumRetries):
            guard attempt <= maximumRetries else { return nil }
            let exponent = min(max(attempt - 1, 0), 30)
            base = min(minimumDelay * (1 << exponent), maximumDelay)
        case .delays(let delays, let giveUpAfter):
            guard attempt >= 1, attempt <= delays.count else { return nil }
            base = delays[attempt - 1]
            if let giveUpAfter, elapsed + base > giveUpAfter { return nil }
        case .interval(let interval, let giveUpAfter):
            guard elapsed + interval <= giveUpAfter else { return nil }
            base = interval
        case .backOff(let increment, let maximumDelay, let giveUpAfter):
            base = min(increment * max(attempt - 1, 0), maximumDelay)
            if let giveUpAfter, elapsed + base > giveUpAfter { return nil }
        case .custom(let strategy):
            switch strategy.strategy.decide(ReconnectionContext(attempt: attempt, elapsed: elapsed, randomness: randomness)) {
            case .retry(let after): return max(after, .zero)
            case .giveUp: return nil
            }
        }
        let unit = min(max(randomness, 0), 1)
        let spread = jitter.upperBound - jitter.lowerBound
        return max(base, minimumInterval) + jitter.lowerBound + spread * unit
    }
}

/// What a custom ``ReconnectionStrategy`` is told before each retry.
public struct ReconnectionContext: Sendable, Hashable {
    /// The retry about to be scheduled: 1 for the first one after a failure (the counter restarts
    /// after every success).
    public var attempt: Int
    /// Time since the failure that started this outage.
    public var elapsed: Duration
    /// A random value in `0...1` the strategy may use for jitter.
    public var randomness: Double

    /// Creates a context.
    public init(attempt: Int, elapsed: Duration, randomness: Double) {
        self.attempt = attempt
        self.elapsed = elapsed
        self.randomness = randomness
    }
}

/// A custom strategy's answer: when the next attempt starts, or stop.
public enum ReconnectionDecision: Sendable, Hashable {
    /// Start the next attempt after this delay (zero: at once).
    case retry(after: Duration)
    /// Stop retrying: the loop reports that it gave up.
    case giveUp
}

/// An app-defined reconnection strategy (Diffusion's `PTDiffusionSessionReconnectionStrategy`,
/// made a pure function): the app decides when each attempt starts or that the client stops.
///
/// ```swift
/// struct Immediate3: ReconnectionStrategy {
///     func decide(_ context: ReconnectionContext) -> ReconnectionDecision {
///         context.attempt <= 3 ? .retry(after: .zero) : .giveUp
///     }
/// }
/// configuration.retry.policy = .custom(CustomReconnectionStrategy(id: "immediate-3", Immediate3()))
/// ```
public protocol ReconnectionStrategy: Sendable {
    /// Decides the next attempt. Called once per retry, with the attempt counter restarted after
    /// every success.
    func decide(_ context: ReconnectionContext) -> ReconnectionDecision
}

/// A ``ReconnectionStrategy`` wrapped as a value: two are equal when their `id`s are.
public struct CustomReconnectionStrategy: Sendable, Hashable {
    /// Identifies the strategy (equality and hashing).
    public let id: String
    /// The strategy.
    public let strategy: any ReconnectionStrategy

    /// Wraps `strategy` under `id`.
    public init(id: String, _ strategy: any ReconnectionStrategy) {
        self.id = id
        self.strategy = strategy
    }

    /// Equal when the ids are.
    public static func == (lhs: Self, rhs: Self) -> Bool { lhs.id == rhs.id }
    /// Hashes the id.
    public func hash(into hasher: inout Hasher) { hasher.combine(id) }
}

extension RetryConfiguration.Endpoint {
    /// The group `operation` belongs to.
    package init(_ operation: TetherOperation) {
        switch operation {
        case .subscribe: self = .subscribe
        case .publish, .fire, .signal: self = .messageSend
        case .history, .fetchMessages, .messageCounts, .deleteMessages: self = .messageStorage
        case .unsubscribe, .hereNow, .whereNow, .heartbeat, .leave, .getState, .setState: self = .presence
        case .addChannelsToGroup, .removeChannelsFromGroup, .listChannelsInGroup, .listGroups, .deleteGroup: self = .channelGroups
        case .grant, .grantToken, .revokeToken: self = .accessManager
        case .time: self = .time
        case .addMessageAction, .removeMessageAction, .fetchMessageActions: self = .messageActions
        case .fetchUserMetadata, .setUserMetadata, .removeUserMetadata, .fetchAllUserMetadata, .fetchChannelMetadata, .setChannelMetadata,
             .removeChannelMetadata, .fetchAllChannelMetadata, .fetchMemberships, .setMemberships, .fetchChannelMembers, .setChannelMembers:
            self = .appContext
        case .addPushChannels, .removePushChannels, .listPushChannels, .removeAllPushChannels: self = .devicePushNotifications
        case .sendFile, .listFiles, .downloadFile, .deleteFile, .publishFileMessage: self = .files
        }
    }
}

extension RetryConfiguration {
    /// Whether a failed call may be sent again (retried or failed over) without risking that it
    /// takes effect twice: any idempotent call, and a call that is not only when the failure
    /// shows the request never reached the server (nothing listening, no route, no TLS session)
    /// or was refused unprocessed (429). After a timeout, a cut connection or a 5xx, a message
    /// action or a file message may already be stored: sending it again would answer 409 for an
    /// action that exists, or announce the file twice.
    package static func maySendAgain(_ status: Status, _ spec: RequestSpec) -> Bool {
        // A publish with its request id (the outbox's) is stored once however often it is sent.
        guard !spec.operation.isIdempotent, spec.queryValue("requestid") == nil else { return true }
        if status.statusCode == 429 { return true }
        switch status.error as? TransportFailure {
        case .connectionRefused?, .unreachable?, .tlsHandshakeFailed?, .tlsUntrustedCertificate?: return true
        default: return false
        }
    }

    /// Whether a failed REST call may succeed if sent again unchanged: the request did not get
    /// an answer (network, timeout), an intermediary answered instead of the server (a proxy's
    /// page), or the server was overloaded or failing (429, 5xx). Refusals (400, 403, 404…) do not.
    package static func isTransient(_ status: Status) -> Bool {
        switch status.category {
        case .networkIssues, .timeout, .malformedResponse, .tlsConnectionFailed: return true
        default:
            guard let code = status.statusCode else { return false }
            return code == 429 || (500...599).contains(code)
        }
    }
}

