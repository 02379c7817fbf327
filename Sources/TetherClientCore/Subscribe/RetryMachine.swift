/// One outage's retry schedule: the child of ``SubscribeMachine`` that decides, for each failed
/// subscribe request, whether and when to try again.
///
/// An outage starts with the first failure after receiving (or a dead link) and lasts until a
/// handshake answers; the parent carries this value through its handshaking, retrying,
/// waiting-for-network and access-denied states and drops it when the outage ends. The curve
/// itself is ``RetryConfiguration``'s; this machine adds the rules around it (seed 001/002):
/// failures that never reached a server retry within a second, a server's `Retry-After` is
/// followed as given, access denied is retried a bounded number of times and then re-checked
/// quietly.
package struct RetryMachine: Sendable, Hashable {
    /// What the parent does with a failure.
    package enum Decision: Sendable, Hashable {
        /// Retrying cannot help (seed 002: a malformed filter expression, a bad request): stop.
        case stop
        /// Try again after `delay`.
        case retry(after: Duration)
        /// The policy has no further attempt: give up.
        case giveUp
        /// Access-denied retries ran out. The app hears about it once (`report`); later denials
        /// are quiet re-checks. `recheck` says whether the grant is re-checked every
        /// `timeProbeInterval` (only when the policy retries subscribe at all).
        case accessDeniedExhausted(Notice, recheck: Recheck)
    }

    /// Whether a decision is reported to the app.
    package enum Notice: Sendable, Hashable {
        /// Tell the app.
        case report
        /// Nothing new to say.
        case quiet
    }

    /// Where the next attempt goes (``TetherConfiguration/fallbackOrigins``).
    package enum Destination: Sendable, Hashable {
        /// The origin that failed (the only one, or the cycle is back on the primary).
        case sameOrigin
        /// A fallback origin not yet tried in this failover cycle: the failure says nothing
        /// about it, so it is tried at once (a quick attempt), and a `Retry-After` of the node
        /// left behind does not apply.
        case anotherOrigin
    }

    /// Whether a stopped loop keeps re-checking on its own.
    package enum Recheck: Sendable, Hashable {
        /// Probe the Time API every `timeProbeInterval`, then try again.
        case everyProbeInterval
        /// Wait for the app.
        case never
    }

    /// What the scheduled attempt waits for. Can transition to: backOff ⇄ retryAfter (each
    /// failure that is not access denied decides anew).
    private enum Wait: Sendable, Hashable {
        /// The policy's delay or a quick attempt.
        case backOff
        /// The server's `Retry-After` (a network path change keeps it).
        case retryAfter
    }

    /// Whether the app was told that access-denied retries ran out. Can transition to:
    /// pending → reported (never back: later denials of this outage are quiet re-checks).
    private enum AccessDeniedNotice: Sendable, Hashable {
        case pending
        case reported
    }

    /// The outage's number; statuses of this outage can cancel its automatic retry with it.
    package let episode: Int
    /// When the outage started.
    private let start: Duration
    /// Retries the policy has counted (quick and `Retry-After` attempts are not).
    private var retries = 0
    /// Access-denied answers in this outage.
    private var accessDenied = 0
    /// Every attempt scheduled in this outage (what `reconnecting(attempt:)` shows).
    package private(set) var attempts = 0
    private var wait = Wait.backOff
    private var deniedNotice = AccessDeniedNotice.pending

    /// The outage's retries ended in access denied and it now only re-checks access quietly.
    package var isRecheckingAccess: Bool { deniedNotice == .reported }

    /// Starts an outage.
    package init(episode: Int, start: Duration) {
        self.episode = episode
        self.start = start
    }

    /// Whether the scheduled attempt waits for the server's `Retry-After`.
    package var honorsRetryAfter: Bool {
        switch wait {
        case .backOff: return false
        case .retryAfter: return true
        }
    }

    /// A subscribe request of this outage failed (already classified; never `cancelled`).
    ///
    /// - Parameters:
    ///   - recoveredAt: for the outage's first failure, when the loop last came back from an
    ///     outage: an outage that starts within 30 s of recovering waits the policy's first delay.
    ///   - randomness: a value in `0...1` choosing the jitter.
    ///   - destination: where the next attempt goes; another origin is tried at once (within the
    ///     quick-attempt interval) while ``RetryConfiguration/fastReconnect`` allows quick attempts.
    package mutating func failed(_ status: Status, retry: RetryConfiguration, now: Duration, randomness: Double,
                                 recoveredAt: Duration?, destination: Destination = .sameOrigin) -> Decision {
        let retriesSubscribe = retry.retries(.subscribe)
        switch status.category {
        case .malformedFilterExpression, .badRequest:
            return .stop
        case .accessDenied:
            accessDenied += 1
            let delay = accessDenied <= retry.accessDeniedRetryLimit && retriesSubscribe
                ? retry.delay(beforeRetry: retries + 1, elapsed: now - start, randomness: randomness) : nil
            guard let delay else {
                // Retries are used up: report it once, then re-check quietly every
                // `timeProbeInterval` so a restored grant resumes the subscription (`reconnected`)
                // without the app having to notice. A re-check still denied says nothing new.
                let notice: Notice
                switch deniedNotice {
                case .pending: notice = .report
                case .reported: notice = .quiet
                }
                deniedNotice = .reported
                return .accessDeniedExhausted(notice, recheck: retriesSubscribe ? .everyProbeInterval : .never)
            }
            retries += 1
            attempts += 1
            return .retry(after: delay)
        case .acknowledgment, .connected, .reconnected, .disconnected, .unexpectedDisconnect, .connectionError,
            .disconnectedUnexpectedly, .subscriptionChanged, .timeout, .networkIssues, .networkUp, .networkDown, .malformedResponse,
            .decryptionError, .tlsConnectionFailed, .tlsUntrustedCertificate, .requestMessageCountExceeded, .unknown, .cancelled:
            let delay = retriesSubscribe ? retry.delay(beforeRetry: retries + 1, elapsed: now - start, randomness: randomness) : nil
            // The failure never reached a working server (nothing listening, a connection cut
            // before any answer, a captive portal's page): knocking again costs the server nothing,
            // so try within about a second instead of waiting out the back-off; these quick
            // attempts do not use up the policy's retries.
            var quick: Duration?
            // An outage that starts within 30 s of recovering from the last one waits the policy's
            // first delay: a request that fails the same way after every reconnect (a middlebox
            // cutting one page) must not loop every second.
            let relapse = recoveredAt.map { now - $0 < .seconds(30) } == true
            if let fast = retry.fastReconnect, retriesSubscribe, !retry.policy.isCustom, now - start < fast.window {
                switch destination {
                case .sameOrigin:
                    if Self.neverReachedAServer(status) && !relapse { quick = fast.delay(randomness: randomness) }
                case .anotherOrigin:
                    // A failover cycle is bounded by the number of origins: after the last one
                    // fails the cycle is back on the primary (`.sameOrigin`) and the back-off applies.
                    quick = fast.delay(randomness: randomness)
                }
            }
            // The `Retry-After` of a node the client is leaving is for clients coming back to it.
            var status = status
            if destination == .anotherOrigin { status.retryAfter = nil }
            // A server shedding load (429/503) that says when to come back is taken at its word:
            // exactly its `Retry-After` plus up to 1 s of jitter (so its clients do not return in
            // the same instant) — never sooner, and not later than it asked either. These waits do
            // not use up the policy's retries: the server is alive and talking.
            if let retryAfter = status.retryAfter, retriesSubscribe {
                // At least 1 s: a `Retry-After: 0` must not turn into a tight loop.
                quick = max(retryAfter, .seconds(1)) + .milliseconds(Int64(min(max(randomness, 0), 1) * 1000))
                wait = .retryAfter
            } else {
                wait = .backOff
            }
            guard let chosen = status.retryAfter != nil ? quick : quick.map({ quick in delay.map { min($0, quick) } }) ?? delay else {
                return .giveUp
            }
            if quick == nil { retries += 1 }
            attempts += 1
            return .retry(after: chosen)
        }
    }

    /// Whether a failure never reached a working server: nothing listening (connection
    /// refused), the connection cut before a complete answer (a server going down, a middlebox's
    /// reset), or a `200` that is not JSON (a captive portal's sign-in page).
    package static func neverReachedAServer(_ status: Status) -> Bool {
        switch status.error as? TransportFailure {
        case .connectionRefused?, .connectionClosed?: return true
        default: return status.category == .malformedResponse && status.statusCode == 200
        }
    }
}
