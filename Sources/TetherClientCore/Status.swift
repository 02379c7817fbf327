public import TetherProtocol

/// A message the configured cryptor could not decrypt, delivered as received (never dropped).
public struct UndecryptableMessage: Sendable, Hashable {
    /// The channel it was published on.
    public var channel: String
    /// Its timetoken.
    public var timetoken: Timetoken
    /// The payload exactly as received (usually the base64 string).
    public var rawPayload: JSONValue
    /// The publisher, when known.
    public var publisher: String?

    /// Creates the value.
    public init(channel: String, timetoken: Timetoken, rawPayload: JSONValue, publisher: String? = nil) {
        self.channel = channel
        self.timetoken = timetoken
        self.rawPayload = rawPayload
        self.publisher = publisher
    }
}

/// A way to re-run the request a failed status came from.
package struct RetryAction: Sendable {
    let run: @Sendable () async throws -> any Sendable

    /// Wraps a closure that re-sends the request and returns its decoded result.
    package init(_ run: @escaping @Sendable () async throws -> any Sendable) { self.run = run }
}

/// A handle that stops an automatic retry the client has scheduled (subscribe statuses).
package struct AutomaticRetryCancellation: Sendable {
    let cancel: @Sendable () -> Void

    /// Wraps the closure that cancels the scheduled retry.
    package init(_ cancel: @escaping @Sendable () -> Void) { self.cancel = cancel }
}

/// Everything the SDK knows about one outcome: a failed REST call, a subscribe-loop event, a
/// message that failed to decrypt.
///
/// Statuses are values: they are produced by classification and transitions, never mutated
/// afterwards. See `docs/status-reference.md` for each ``category``.
public struct Status: Sendable, CustomStringConvertible {
    /// What happened.
    public var category: StatusCategory
    /// The API call it belongs to.
    public var operation: TetherOperation
    /// The HTTP status code, when a response arrived.
    public var statusCode: Int?
    /// The underlying error (a ``TransportFailure``, ``RequestBuildError``, a decoding or crypto error...).
    public var error: (any Error)?
    /// What the server said in its error body, when it said anything.
    public var serverMessage: String?
    /// Channels this status is about (the request's channels).
    public var affectedChannels: [String]
    /// Channel groups this status is about.
    public var affectedGroups: [String]
    /// Every channel the client is subscribed to when the status is emitted (subscribe statuses).
    public var subscribedChannels: [String]
    /// Every group the client is subscribed to when the status is emitted (subscribe statuses).
    public var subscribedGroups: [String]
    /// The cursor before the event (subscribe statuses).
    public var lastTimetoken: Timetoken?
    /// The cursor after the event (subscribe statuses).
    public var currentTimetoken: Timetoken?
    /// Channels Access Manager denied (``StatusCategory/accessDenied``).
    public var deniedChannels: [String]
    /// Channel groups Access Manager denied (``StatusCategory/accessDenied``).
    public var deniedGroups: [String]
    /// The message that could not be decrypted (``StatusCategory/decryptionError``).
    public var undecryptableMessage: UndecryptableMessage?
    /// Whether the client will retry this on its own (subscribe only); see ``cancelAutomaticRetry()``.
    public var willAutomaticallyRetry: Bool
    /// How long the server asked the client to wait before trying again (`Retry-After` on a 429
    /// or 503), when it said. The subscribe engine never retries sooner than this.
    public var retryAfter: Duration?
    /// The request id of the publish or signal that failed or was cancelled (the one set in
    /// `PublishOptions.requestId`, or the one the outbox made), `nil` for other operations.
    /// A failed send may still have been stored (its answer was lost, or the server answered
    /// 504 "may be stored"): to send the message again, publish it with this request id, and
    /// the server answers with the original timetoken instead of storing it twice.
    public var requestId: String?
    /// The origin (node) the failed request went to, when it got that far: the failover
    /// decisions compare it with the origin in use (``OriginSelector``).
    package var origin: String?
    let automaticRetryCancellation: AutomaticRetryCancellation?
    let retryAction: RetryAction?

    /// Creates a status.
    package init(category: StatusCategory, operation: TetherOperation, statusCode: Int? = nil, error: (any Error)? = nil,
                serverMessage: String? = nil, affectedChannels: [String] = [], affectedGroups: [String] = [],
                subscribedChannels: [String] = [], subscribedGroups: [String] = [], lastTimetoken: Timetoken? = nil,
                currentTimetoken: Timetoken? = nil, deniedChannels: [String] = [], deniedGroups: [String] = [],
                undecryptableMessage: UndecryptableMessage? = nil, automaticRetry: AutomaticRetryCancellation? = nil,
                retry: RetryAction? = nil) {
        self.category = category
        self.operation = operation
        self.statusCode = statusCode
        self.error = error
        self.serverMessage = serverMessage
        self.affectedChannels = affectedChannels
        self.affectedGroups = affectedGroups
        self.subscribedChannels = subscribedChannels
        self.subscribedGroups = subscribedGroups
        self.lastTimetoken = lastTimetoken
        self.currentTimetoken = currentTimetoken
        self.deniedChannels = deniedChannels
        self.deniedGroups = deniedGroups
        self.undecryptableMessage = undecryptableMessage
        self.willAutomaticallyRetry = automaticRetry != nil
        self.automaticRetryCancellation = automaticRetry
        self.retryAction = retry
    }

    /// A copy that the app can cancel with ``cancelAutomaticRetry()`` (the subscribe shell attaches
    /// the handle to statuses its machine marked ``willAutomaticallyRetry``).
    package func withAutomaticRetry(_ cancellation: AutomaticRetryCancellation) -> Status {
        var copy = Status(category: category, operation: operation, statusCode: statusCode, error: error, serverMessage: serverMessage,
                          affectedChannels: affectedChannels, affectedGroups: affectedGroups, subscribedChannels: subscribedChannels,
                          subscribedGroups: subscribedGroups, lastTimetoken: lastTimetoken, currentTimetoken: currentTimetoken,
                          deniedChannels: deniedChannels, deniedGroups: deniedGroups, undecryptableMessage: undecryptableMessage,
                          automaticRetry: cancellation, retry: retryAction)
        copy.retryAfter = retryAfter
        return copy
    }

    /// Whether ``retry()`` can re-run the failed call (REST failures).
    public var canRetry: Bool { retryAction != nil }

    /// Whether the category reports a failure.
    public var isError: Bool { category.isError }

    /// Stops the automatic retry the client scheduled for this failure (no effect when
    /// ``willAutomaticallyRetry`` is false or the retry already ran).
    public func cancelAutomaticRetry() { automaticRetryCancellation?.cancel() }

    /// Re-sends the failed REST call, discarding its result. Throws ``TetherError`` again on failure;
    /// throws a ``StatusCategory/badRequest`` error when this status has nothing to retry.
    public func retry() async throws(TetherError) {
        _ = try await retryAny()
    }

    /// Re-sends the failed REST call and returns its result as the original call's result type
    /// (for example `try await status.retry(returning: PublishResult.self)`).
    public func retry<Result: Sendable>(returning type: Result.Type) async throws(TetherError) -> Result {
        let value = try await retryAny()
        guard let typed = value as? Result else {
            throw TetherError(Status(category: .unknown, operation: operation,
                                     serverMessage: "retry returned \(Swift.type(of: value)), not \(Result.self)"))
        }
        return typed
    }

    private func retryAny() async throws(TetherError) -> any Sendable {
        guard let retryAction else {
            throw TetherError(Status(category: .badRequest, operation: operation, serverMessage: "this status has no request to retry"))
        }
        do { return try await retryAction.run() } catch let error as TetherError { throw error } catch {
            throw TetherError(Status(category: .unknown, operation: operation, error: error))
        }
    }

    /// A one-line summary for logs.
    public var description: String {
        var parts = ["\(category)", "operation=\(operation)"]
        if let statusCode { parts.append("http=\(statusCode)") }
        if let serverMessage { parts.append("message=\(String(reflecting: serverMessage))") }
        if let error { parts.append("error=\(error)") }
        if !deniedChannels.isEmpty { parts.append("deniedChannels=\(deniedChannels)") }
        if !deniedGroups.isEmpty { parts.append("deniedGroups=\(deniedGroups)") }
        if willAutomaticallyRetry { parts.append("willAutomaticallyRetry") }
        return parts.joined(separator: " ")
    }
}

/// The error every failed SDK call throws: it carries the full ``Status``.
public struct TetherError: Error, Sendable, CustomStringConvertible {
    /// The status describing the failure (category, HTTP code, denied channels, `retry()`...).
    public var status: Status

    /// Wraps a status.
    package init(_ status: Status) { self.status = status }

    /// The failure's category (shortcut for `status.category`).
    public var category: StatusCategory { status.category }

    /// A message for humans, suitable for a CLI.
    public var description: String {
        var text = "\(status.operation) failed: \(status.category)"
        if let code = status.statusCode { text += " (HTTP \(code))" }
        if let message = status.serverMessage { text += ": \(message)" } else if let error = status.error { text += ": \(error)" }
        if !status.deniedChannels.isEmpty { text += "; denied channels: \(status.deniedChannels.joined(separator: ", "))" }
        if !status.deniedGroups.isEmpty { text += "; denied groups: \(status.deniedGroups.joined(separator: ", "))" }
        return text
    }
}
