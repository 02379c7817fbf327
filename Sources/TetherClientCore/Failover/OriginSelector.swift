import TetherProtocol

/// Which origin (node) the client's next request goes to: the primary, or one of the fallback
/// origins after the primary stopped answering. Pure: time and randomness come in as arguments,
/// the changes go out as return values; the client shell holds it under a lock and every
/// request (the subscribe loop, REST calls, the outbox, the WebSocket session's opening) asks it
/// for the origin and reports back.
///
/// The policy is Ably's host fallback (features spec RSC15, RTN17), applied to one configured list:
///
/// - The primary is preferred. Requests go to it until one fails **at the connection level**
///   (``qualifiesForFailover(_:)``: connection refused, host unreachable, a timeout, a TLS
///   failure, a 500–504 from the node) or the node says it is draining (``drained(at:now:randomness:)``).
///   A refusal of the request itself (400, 403, 404, 413, 414, 429, 481…) never moves the client:
///   another node would refuse it the same way.
/// - A failure on the primary starts a **cycle** through the fallbacks in a random order (drawn
///   once per cycle from the `randomness` passed in, so clients of a dead node spread over the
///   others). Each failure moves to the next one; after the last one fails the cycle ends on the
///   primary again (``Change/cycleRestarted(from:to:)``), and the next failure starts a new cycle.
/// - A fallback that answers is **kept** for ``fallbackRetryTimeout`` (Ably's default: 10
///   minutes), then requests go to the primary again (``Change/primaryRetried(from:to:)``); a
///   connection-level failure on it before then moves on to the next fallback of the cycle.
/// - A failure reported for an origin that is no longer the current one changes nothing: many
///   requests in flight to a dead node move the client one step, not one step each.
/// - When the device's network comes back or changes (``networkChanged()``), the failures seen
///   before say nothing about the nodes: requests go to the primary again.
///
/// With no fallback origins every input is a no-op and ``current`` is always the primary.
package struct OriginSelector: Sendable, Hashable {
    /// A move from one origin to another, for the shell to announce
    /// (`ConnectionEvent.originChanged`) and for the subscribe engine to decide how soon it tries again.
    package enum Change: Sendable, Hashable {
        /// A connection-level failure or a drain moved the client to the next origin of the cycle,
        /// not yet tried in it: the next attempt can go at once.
        case failedOver(from: String, to: String)
        /// Every fallback of the cycle failed too: back to the primary, and the retry policy's
        /// back-off applies (every node was just tried).
        case cycleRestarted(from: String, to: String)
        /// A fallback was used for ``OriginSelector/fallbackRetryTimeout``, or the device's network
        /// came back or changed: the primary is tried again.
        case primaryRetried(from: String, to: String)

        /// The origin left.
        package var from: String {
            switch self {
            case .failedOver(let from, _), .cycleRestarted(let from, _), .primaryRetried(let from, _): return from
            }
        }

        /// The origin requests go to from now on.
        package var to: String {
            switch self {
            case .failedOver(_, let to), .cycleRestarted(_, let to), .primaryRetried(_, let to): return to
            }
        }
    }

    /// Where requests go. Can transition to: primary → trying (a failure or drain on the
    /// primary); trying → kept (it answered), trying (it failed: the next fallback), primary (it
    /// was the cycle's last); kept → primary (``fallbackRetryTimeout`` passed), trying (it failed).
    private enum State: Sendable, Hashable {
        /// The primary origin.
        case primary
        /// `order[index]`, a fallback not yet known to answer.
        case trying(order: [String], index: Int)
        /// `order[index]` answered: it is used until `until`.
        case kept(order: [String], index: Int, until: Duration)
    }

    /// The configured origin, preferred whenever it works.
    package let primary: String
    /// The fallback origins (the primary and repeats removed), in configuration order.
    package let fallbacks: [String]
    /// How long a fallback that answered is kept before the primary is tried again.
    package let fallbackRetryTimeout: Duration
    private var state = State.primary

    /// Creates a selector on `primary`.
    package init(primary: String, fallbacks: [String], fallbackRetryTimeout: Duration) {
        self.primary = primary
        var seen: Set<String> = [primary]
        self.fallbacks = fallbacks.filter { seen.insert($0).inserted }
        self.fallbackRetryTimeout = max(fallbackRetryTimeout, .zero)
    }

    /// The origin in use (without moving back to the primary: see ``origin(now:)``).
    package var current: String {
        switch state {
        case .primary: return primary
        case .trying(let order, let index), .kept(let order, let index, _): return order[index]
        }
    }

    /// The origin the next request goes to. A fallback kept for ``fallbackRetryTimeout`` is
    /// given up for the primary here (the returned change says so).
    package mutating func origin(now: Duration) -> (origin: String, change: Change?) {
        guard case .kept(let order, let index, let until) = state, now >= until else { return (current, nil) }
        state = .primary
        return (primary, .primaryRetried(from: order[index], to: primary))
    }

    /// A request to `origin` was answered by the node (any answer that is not a connection-level
    /// failure): a fallback being tried is kept from now for ``fallbackRetryTimeout``.
    package mutating func answered(at origin: String, now: Duration) {
        guard case .trying(let order, let index) = state, order[index] == origin else { return }
        state = .kept(order: order, index: index, until: now + fallbackRetryTimeout)
    }

    /// The device's network came back or changed (the client's network monitor): failures seen
    /// before said nothing about the nodes (a tunnel, a Wi-Fi switch), so requests go to the
    /// primary again and a new cycle starts from it if it fails.
    package mutating func networkChanged() -> Change? {
        guard case .primary = state else {
            let left = current
            state = .primary
            return .primaryRetried(from: left, to: primary)
        }
        return nil
    }

    /// A request to `origin` failed with `status`. Moves on when the failure is connection-level
    /// (``qualifiesForFailover(_:)``) and `origin` is the one in use.
    ///
    /// - Parameter randomness: any value; it orders the fallbacks when a new cycle starts (the
    ///   shell passes a random number, tests fixed ones).
    package mutating func failed(at origin: String, status: Status, now: Duration, randomness: UInt64) -> Change? {
        guard Self.qualifiesForFailover(status) else { return nil }
        return leave(origin, randomness: randomness)
    }

    /// The node at `origin` announced a graceful shutdown (the WebSocket `drain` notice, or the
    /// `Tether-Draining` header of a long-poll answered while it shuts down): the next request
    /// goes to the next origin. With no fallbacks nothing changes (the client comes back to the
    /// same origin, after the drain's delay).
    package mutating func drained(at origin: String, now: Duration, randomness: UInt64) -> Change? {
        leave(origin, randomness: randomness)
    }

    private mutating func leave(_ origin: String, randomness: UInt64) -> Change? {
        guard !fallbacks.isEmpty, origin == current else { return nil }
        switch state {
        case .primary:
            var generator = SplitMix64(seed: randomness)
            let order = fallbacks.shuffled(using: &generator)
            state = .trying(order: order, index: 0)
            return .failedOver(from: origin, to: order[0])
        case .trying(let order, let index), .kept(let order, let index, _):
            guard index + 1 < order.count else {
                state = .primary
                return .cycleRestarted(from: origin, to: primary)
            }
            state = .trying(order: order, index: index + 1)
            return .failedOver(from: origin, to: order[index + 1])
        }
    }

    /// Whether a failure says the node (not the request) is the problem, so another node may
    /// answer: no connection (refused, unreachable), no answer in time (a connect or request
    /// timeout), a TLS failure, or a 500–504 from the node or a proxy in front of it (Ably's
    /// RSC15l). Refusals of the request (4xx), a `200` that is not JSON (a captive portal: every
    /// node would look the same), a cancelled request and a connection cut after it was
    /// established (the network, most likely: the same node is tried again first, where a
    /// WebSocket session can still be resumed) do not.
    package static func qualifiesForFailover(_ status: Status) -> Bool {
        if let failure = status.error as? TransportFailure {
            switch failure {
            case .timedOut, .connectionRefused, .unreachable, .tlsHandshakeFailed, .tlsUntrustedCertificate: return true
            case .connectionClosed, .cancelled, .responseTooLarge, .incompleteResponse, .other: return false
            }
        }
        if let code = status.statusCode, (500...504).contains(code) { return true }
        switch status.category {
        case .timeout, .tlsConnectionFailed, .tlsUntrustedCertificate: return status.statusCode == nil
        case .acknowledgment, .accessDenied, .badRequest, .malformedFilterExpression, .connected, .reconnected, .disconnected,
             .unexpectedDisconnect, .connectionError, .disconnectedUnexpectedly, .subscriptionChanged, .networkIssues, .networkUp,
             .networkDown, .malformedResponse, .decryptionError, .requestMessageCountExceeded, .unknown, .cancelled:
            return false
        }
    }
}

