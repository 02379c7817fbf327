public import TetherClientCore
public import TetherProtocol

/// Settings of the client's outbox (``TetherConfiguration/outbox``): how much it may hold, how
/// many channels it sends to at once, how it retries, and where (if anywhere) it keeps its
/// messages across launches. See `docs/outbox.md`.
public struct OutboxConfiguration: Sendable, Hashable {
    /// Most messages held at once, counting pending, sending and failed ones (default 1,000).
    /// A publish beyond it is refused with ``OutboxError/Code/full``.
    public var maximumMessages: Int
    /// Most bytes held at once: payload (as sent, so encrypted when a cryptor is configured),
    /// channel name and `meta` (default 4 MiB). A single message above it is refused with
    /// ``OutboxError/Code/tooLarge``, one that does not fit now with ``OutboxError/Code/full``.
    public var maximumBytes: Int
    /// Most channels sent to at once, one message per channel at a time (default 4).
    public var maximumConcurrentSends: Int
    /// The back-off between attempts of a failed send (default: exponential 2 s → 150 s, 6
    /// retries, with jitter). A server's `Retry-After` is followed as given and uses up no retry;
    /// failures while the network is down use up none either. ``RetryConfiguration/disabled``
    /// makes every retryable failure final at once. `excludedEndpoints` is not read.
    public var retry: RetryConfiguration
    /// A file for the durable journal; `nil` (the default) keeps the outbox in memory only.
    /// With a path, every accepted message is on disk (`fsync`ed) before `publish` or
    /// ``Outbox/enqueue(channel:message:options:)`` accepts it, and what the app was killed with
    /// is sent at the next launch, with its original request ids, once the outbox is first used
    /// (see ``Outbox/open()``). One client at a time may use a journal file: while one holds it
    /// (a lock on `<path>.lock`, released at ``TetherClient/shutdown()`` or when the client is
    /// freed), another client's outbox — in this process or another — fails to open with
    /// ``OutboxError/Code/journal`` and leaves the file alone. On iOS keep it in the app's own
    /// container: a suspended app holding a file lock in an App Group container is terminated.
    public var journalPath: String?

    /// Creates the settings with the documented defaults.
    public init(maximumMessages: Int = 1_000, maximumBytes: Int = 4 << 20, maximumConcurrentSends: Int = 4,
                retry: RetryConfiguration = RetryConfiguration(), journalPath: String? = nil) {
        self.maximumMessages = maximumMessages
        self.maximumBytes = maximumBytes
        self.maximumConcurrentSends = maximumConcurrentSends
        self.retry = retry
        self.journalPath = journalPath
    }

    /// The machine's settings (bounds at least 1, so a zero never wedges the outbox).
    var machineConfiguration: OutboxMachine.Configuration {
        OutboxMachine.Configuration(maximumMessages: max(maximumMessages, 1), maximumBytes: max(maximumBytes, 1),
                                    maximumConcurrentSends: max(maximumConcurrentSends, 1), retry: retry)
    }
}

/// One message held by the outbox, as the app lists it (``Outbox/messages``).
public struct OutboxEntry: Sendable, Hashable {
    /// The outbox's key for the message (``Outbox/resend(_:)``, ``Outbox/cancel(_:)``,
    /// ``Outbox/result(of:)``).
    public var id: OutboxMessageID
    /// The request id every attempt carries (`requestid`).
    public var requestId: String
    /// Publish or signal.
    public var kind: OutboxMessageKind
    /// The channel.
    public var channel: String
    /// ``OutboxMessageState/pending``, ``OutboxMessageState/sending(attempt:)`` or
    /// ``OutboxMessageState/failed(_:)`` (sent and cancelled messages leave the outbox).
    public var state: OutboxMessageState
    /// The category of the last failed attempt, when one failed: why a pending message is
    /// waiting to retry, or why a failed one failed.
    public var lastFailure: StatusCategory?

    /// Creates an entry.
    public init(id: OutboxMessageID, requestId: String, kind: OutboxMessageKind, channel: String, state: OutboxMessageState,
                lastFailure: StatusCategory? = nil) {
        self.id = id
        self.requestId = requestId
        self.kind = kind
        self.channel = channel
        self.state = state
        self.lastFailure = lastFailure
    }
}

/// A message of the outbox changed state (``Outbox/changes()``, ``Outbox/addChangeListener(_:)``).
public struct OutboxChange: Sendable, Hashable, CustomStringConvertible {
    /// The message.
    public var id: OutboxMessageID
    /// Its request id.
    public var requestId: String
    /// Publish or signal.
    public var kind: OutboxMessageKind
    /// Its channel.
    public var channel: String
    /// Its new state.
    public var state: OutboxMessageState
    /// The category of the failure that caused this change, if a failure did (a retry's
    /// `pending`, or `failed`).
    public var failure: StatusCategory?

    /// Creates a change.
    public init(id: OutboxMessageID, requestId: String, kind: OutboxMessageKind, channel: String, state: OutboxMessageState,
                failure: StatusCategory? = nil) {
        self.id = id
        self.requestId = requestId
        self.kind = kind
        self.channel = channel
        self.state = state
        self.failure = failure
    }

    /// `m3 chat pending`.
    public var description: String { "\(id) \(channel) \(state)" }
}

/// The client's outbox: every ``TetherClient/publish(channel:message:options:)`` and
/// ``TetherClient/signal(channel:message:customMessageType:timeout:)`` goes through it, and apps
/// that do not want to await a send use it directly (`client.outbox`).
///
/// A message accepted by the outbox keeps one request id for every attempt; it is sent in order
/// per channel, retried on network failures, timeouts, 5xx and 429 (after `Retry-After`), held
/// while the network is down, and fails at once on 403, 400, 413 and other answers that cannot
/// change. Its states: `pending → sending → sent`, or `failed` (kept until ``resend(_:)`` or
/// ``cancel(_:)``); see `docs/outbox.md`.
///
/// ```swift
/// let entry = try await client.outbox.enqueue(channel: "chat", message: ["text": "hi"])
/// for await change in client.outbox.changes() where change.id == entry.id {
///     print(change.state)   // pending, sending(1), sent(17…)
/// }
/// ```
///
/// With ``OutboxConfiguration/journalPath`` the outbox is durable. Its journal is read on the
/// outbox's first use — any call of this type, or a publish or signal — and not when the client
/// is created (creating a client does no I/O): an app that wants what the last launch left to go
/// out before it publishes again calls ``open()`` at launch.
public struct Outbox: Sendable {
    let client: TetherClient

    /// Opens the outbox now: reads the durable journal (if configured) and starts sending what
    /// the last launch left pending; messages that had failed come back failed. Calling it again
    /// does nothing. Every other call opens the outbox implicitly.
    ///
    /// Throws ``OutboxError/Code/journal`` when the journal cannot be opened, also while another
    /// client holds it (the next call tries again) and ``OutboxError/Code/shutDown`` after ``TetherClient/shutdown()``.
    public func open() async throws(OutboxError) {
        client.startOutboxIfNeeded()
        try await client.outboxDriver.open()
    }

    /// Accepts a message for publishing and returns at once, without waiting for the send: the
    /// outbox owns it from here on. Watch it with ``changes()``, or await it with ``result(of:)``.
    ///
    /// The message is encrypted now when a ``TetherConfiguration/cryptoModule`` is configured.
    /// ``PublishOptions/requestId`` chooses the request id (an idempotency key); otherwise the
    /// outbox makes one (a UUID). ``PublishOptions/timeout`` applies to each attempt.
    ///
    /// - Throws: ``TetherError`` with ``StatusCategory/badRequest`` when the message cannot be sent
    ///   as given (bad channel name, no publish key, bad `meta` or request id, a message above the
    ///   outbox's byte bound); with a ``TetherError/outboxError`` of code ``OutboxError/Code/full``
    ///   (category ``StatusCategory/unknown``) when the outbox holds its maximum — nothing already
    ///   accepted is dropped —, ``OutboxError/Code/journal`` when the journal could not be written,
    ///   or ``OutboxError/Code/shutDown`` (category ``StatusCategory/cancelled``).
    @discardableResult
    public func enqueue(channel: String, message: JSONValue, options: PublishOptions = PublishOptions())
        async throws(TetherError) -> OutboxEntry
    {
        let draft = try client.publishDraft(channel: channel, message: message, options: options)
        client.startOutboxIfNeeded()
        return try await client.outboxDriver.enqueue(draft)
    }

    /// Every message the outbox holds (pending, sending, failed), in outbox order.
    public var messages: [OutboxEntry] {
        get async throws(OutboxError) {
            client.startOutboxIfNeeded()
            return try await client.outboxDriver.entries()
        }
    }

    /// Sends a failed message again, with the same request id: it joins the back of its
    /// channel's queue with a fresh retry budget. Throws ``OutboxError/Code/notFailed`` when the
    /// message has not failed, ``OutboxError/Code/unknownMessage`` when it is not in the outbox.
    public func resend(_ id: OutboxMessageID) async throws(OutboxError) {
        client.startOutboxIfNeeded()
        try await client.outboxDriver.resend(id)
    }

    /// Removes a pending or failed message unsent. Throws ``OutboxError/Code/inFlight`` when it
    /// is being sent (the server may already have it), ``OutboxError/Code/unknownMessage`` when it
    /// is not in the outbox (already sent or cancelled), ``OutboxError/Code/journal`` when a
    /// durable outbox could not write the cancel to its journal (the message then stays, rather
    /// than coming back at the next launch).
    public func cancel(_ id: OutboxMessageID) async throws(OutboxError) {
        client.startOutboxIfNeeded()
        try await client.outboxDriver.cancel(id)
    }

    /// Waits for a message to settle: its ``PublishResult`` when sent; the failure as a
    /// ``TetherError`` (the last attempt's status: category, HTTP code, server message) when it
    /// failed — the message stays in the outbox, failed, for ``resend(_:)`` or ``cancel(_:)`` —;
    /// ``StatusCategory/cancelled`` when it was cancelled or the client shut down.
    ///
    /// Outcomes are remembered for the most recent messages (as many as
    /// ``OutboxConfiguration/maximumMessages``); an id settled longer ago, or never accepted,
    /// throws a ``TetherError/outboxError`` of code ``OutboxError/Code/unknownMessage``.
    /// Cancelling the waiting task stops the wait (``StatusCategory/cancelled``), not the message.
    public func result(of id: OutboxMessageID) async throws(TetherError) -> PublishResult {
        client.startOutboxIfNeeded()
        return try await client.outboxDriver.result(of: id)
    }

    /// Every state change of every message from now on, in order. One consumer per stream; call
    /// again for another. Finishes at ``TetherClient/shutdown()``.
    public func changes() -> AsyncStream<OutboxChange> {
        client.outboxListeners.stream()
    }

    /// Adds a closure called for every state change, in order.
    @discardableResult
    public func addChangeListener(_ handler: @escaping @Sendable (OutboxChange) -> Void) -> ListenerToken {
        client.outboxListeners.add(handler)
    }
}

extension TetherError {
    /// The outbox's refusal behind this error (``OutboxError/Code/full``,
    /// ``OutboxError/Code/tooLarge``, ``OutboxError/Code/journal``…), when the outbox refused
    /// the message rather than the server.
    public var outboxError: OutboxError? { status.error as? OutboxError }
}
