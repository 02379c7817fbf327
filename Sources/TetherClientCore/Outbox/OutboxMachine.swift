package import TetherProtocol

/// The send side of the client as a pure state machine: publishes and signals wait here until the
/// server has them (ARCHITECTURE.md, "Send side mirrors receive side"; issue #15, item 3).
///
/// Every input is a `mutating func` returning the ``Action``s the shell must perform: send a
/// message, schedule or cancel a retry timer by ``TimerID``, report a state change to the app.
/// Time (`now`, a duration since the shell's origin) and randomness come in as arguments; the
/// machine does no I/O and reads no clock.
///
/// What it guarantees:
/// - **Order per channel.** Only the oldest unsettled message of a channel (its *head*) is ever
///   sent or waiting to retry; a later message to the same channel goes out only once the
///   earlier one is settled (sent, failed or cancelled). Different channels proceed
///   independently, at most ``Configuration/maximumConcurrentSends`` at a time, oldest head first.
///   A failed message that the app resends joins the back of its channel's queue.
/// - **Retry by category.** Network failures, timeouts, TLS transport failures, 5xx, 429 and
///   unclassified transport errors are retried with ``RetryConfiguration``'s back-off (the
///   subscribe loop's math); a server's `Retry-After` is followed as given, with a 1 s floor and
///   up to 1 s of jitter, without using up the policy's retries. Access denied (403), bad request
///   (400, 413, 414), malformed responses and other 4xx fail at once. When the policy gives up the
///   message fails with the last category.
/// - **Pause while offline.** Nothing is sent while the link is ``Link/offline``; a retryable
///   failure while offline waits for the link without using up retries. On reconnect back-off
///   waits end at once (the outage they were waiting out is over); a server's `Retry-After` still
///   holds.
/// - **Bounds.** At most ``Configuration/maximumMessages`` messages and
///   ``Configuration/maximumBytes`` bytes (``OutboxMessage/byteCount``) are held, counting
///   pending, sending and failed ones. At the limit a new message is refused with
///   ``OutboxError/Code/full``; an accepted message is never dropped to make room.
package struct OutboxMachine: Sendable {
    // MARK: Vocabulary

    /// Settings the machine reads (the shell builds them from the client's configuration).
    package struct Configuration: Sendable, Hashable {
        /// Most messages held at once (pending, sending and failed). Default 1,000.
        package var maximumMessages: Int
        /// Most bytes held at once (sum of ``OutboxMessage/byteCount``). Default 4 MiB.
        package var maximumBytes: Int
        /// Most sends in flight at once, one per channel at most. Default 4.
        package var maximumConcurrentSends: Int
        /// The back-off between retries of a failed send (its `excludedEndpoints` are not read:
        /// putting a message in the outbox is asking for it to be retried). Default: PubNub's
        /// exponential curve, 2 s → 150 s, 6 retries, with jitter.
        package var retry: RetryConfiguration

        /// Creates a configuration with the documented defaults.
        package init(maximumMessages: Int = 1_000, maximumBytes: Int = 4 << 20, maximumConcurrentSends: Int = 4,
                     retry: RetryConfiguration = RetryConfiguration()) {
            self.maximumMessages = maximumMessages
            self.maximumBytes = maximumBytes
            self.maximumConcurrentSends = maximumConcurrentSends
            self.retry = retry
        }
    }

    /// Whether the shell believes the server can be reached (network path and connection).
    package enum Link: Sendable, Hashable {
        /// Sends may start.
        case online
        /// No send starts; failures wait for ``online``.
        case offline
    }

    /// Timers the shell runs for the machine; scheduling one that exists replaces it.
    package enum TimerID: Sendable, Hashable {
        /// The next attempt of a message whose send failed with a retryable error.
        case retry(OutboxMessage.ID)
    }

    /// What the shell must do, in order, outside its lock.
    package enum Action: Sendable, Hashable {
        /// Send the message (publish or signal, with its `requestid`); report the outcome with
        /// ``OutboxMachine/sendSucceeded(_:timetoken:now:)`` or
        /// ``OutboxMachine/sendFailed(_:_:now:randomness:)``. `attempt` counts from 1.
        case send(OutboxMessage, attempt: Int)
        /// Call ``OutboxMachine/timerFired(_:now:)`` after this long.
        case schedule(TimerID, after: Duration)
        /// Forget the timer.
        case cancelTimer(TimerID)
        /// Tell the app (and the journal) that a message changed state.
        case changed(OutboxMessage.ID, OutboxMessageState)
    }

    /// The answer to a command the app gives (publish, resend, cancel).
    package enum Outcome: Sendable, Hashable {
        /// Done: perform the actions.
        case accepted([Action])
        /// Refused; nothing changed.
        case refused(OutboxError)
    }

    /// A message recovered from the durable journal at launch, with the state it was left in.
    package struct Restored: Sendable, Hashable {
        /// Where the journal left a message.
        package enum State: Sendable, Hashable {
            /// Not yet sent as far as the journal knows (it may have been in flight: the request
            /// id lets the server answer a repeat with the original timetoken).
            case pending
            /// It had failed; it stays failed until the app resends or cancels it.
            case failed(StatusCategory)
        }

        /// The message.
        package var message: OutboxMessage
        /// Its state.
        package var state: State

        /// Creates the value.
        package init(_ message: OutboxMessage, _ state: State) {
            self.message = message
            self.state = state
        }
    }

    /// One message as the app lists it.
    package struct Entry: Sendable, Hashable {
        /// The message.
        package var message: OutboxMessage
        /// Its visible state (``OutboxMessageState/pending``, ``OutboxMessageState/sending(attempt:)``
        /// or ``OutboxMessageState/failed(_:)``: sent and cancelled messages leave the outbox).
        package var state: OutboxMessageState
    }

    /// What to do with a failed send.
    package enum FailureDisposition: Sendable, Hashable {
        /// Try again (after a back-off, a `Retry-After`, or the link's return).
        case retry
        /// Fail the message at once: sending it again unchanged cannot succeed.
        case fail
    }

    // MARK: State

    /// Where one message is.
    ///
    /// Each case carries the retry bookkeeping of the message's current outage (`nil` before its
    /// first retryable failure, and again after a reconnect or a resend).
    ///
    /// Can transition to: `ready → sending | (removed by cancel)`; `sending → (removed: sent) |
    /// backingOff | ready (failed while offline) | failed`; `backingOff → ready | (removed by
    /// cancel)`; `failed → ready (resend) | (removed by cancel)`.
    private enum Phase: Sendable, Hashable {
        /// Sent as soon as it is its channel's head, a send slot is free and the link is up.
        case ready(Outage?)
        /// A request is in flight.
        case sending(Outage?)
        /// Waiting for its retry timer (only a channel's head).
        case backingOff(Wait, Outage?)
        /// Settled by failure; off its channel's queue, still held and counted.
        case failed(StatusCategory)
    }

    /// Why a message waits for its retry timer.
    private enum Wait: Sendable, Hashable {
        /// The retry policy's back-off: ends early when the link comes back.
        case policy
        /// The server's `Retry-After`: always waited out.
        case serverRetryAfter
    }

    /// Retry bookkeeping since the first failure of the current outage of one message.
    private struct Outage: Sendable, Hashable {
        /// When the first failure happened.
        var start: Duration
        /// Retries the policy has counted.
        var retries: Int
    }

    private struct Record: Sendable, Hashable {
        var message: OutboxMessage
        var phase: Phase
        /// Sends made so far (the next one is `attempts + 1`).
        var attempts: Int
        /// Position in the outbox: acceptance order, renewed on resend.
        var sequence: UInt64
    }

    private let configuration: Configuration
    private var link: Link
    private var records: [OutboxMessage.ID: Record] = [:]
    /// Per channel, the unsettled, unfailed messages in order; the first is the head.
    private var queues: [String: [OutboxMessage.ID]] = [:]
    private var nextSequence: UInt64 = 0
    private var heldBytes = 0

    /// Creates an empty outbox.
    package init(configuration: Configuration = Configuration(), link: Link = .online) {
        self.configuration = configuration
        self.link = link
    }

    // MARK: Queries

    /// Every held message (pending, sending, failed) in outbox order.
    package var entries: [Entry] {
        records.values.sorted { $0.sequence < $1.sequence }.map { Entry(message: $0.message, state: Self.visibleState($0)) }
    }

    /// One held message, or `nil` when it is not (or no longer) in the outbox.
    package func entry(_ id: OutboxMessage.ID) -> Entry? {
        records[id].map { Entry(message: $0.message, state: Self.visibleState($0)) }
    }

    /// How many messages are held.
    package var count: Int { records.count }

    /// How many bytes are held.
    package var byteCount: Int { heldBytes }

    /// Whether a message of `byteCount` bytes would be accepted now; `nil` when it would, the
    /// refusal otherwise. A durable shell asks before appending to its journal, so that it never
    /// persists a message the outbox then refuses.
    package func admission(byteCount: Int) -> OutboxError? {
        if byteCount > configuration.maximumBytes {
            return OutboxError(.tooLarge,
                               "the message takes \(byteCount) bytes, more than the outbox's bound of \(configuration.maximumBytes)")
        }
        if records.count >= configuration.maximumMessages {
            return OutboxError(.full, "the outbox holds its maximum of \(configuration.maximumMessages) messages")
        }
        if heldBytes + byteCount > configuration.maximumBytes {
            return OutboxError(.full,
                               "the outbox holds \(heldBytes) bytes; \(byteCount) more would exceed \(configuration.maximumBytes)")
        }
        return nil
    }

    // MARK: Inputs

    /// The app published: accept the message (and send it when its turn comes), or refuse it
    /// when the outbox is full. Nothing already accepted is ever dropped.
    package mutating func enqueue(_ message: OutboxMessage, now: Duration) -> Outcome {
        guard records[message.id] == nil else {
            return .refused(OutboxError(.duplicateMessage, "message \(message.id) is already in the outbox"))
        }
        if let refusal = admission(byteCount: message.byteCount) { return .refused(refusal) }
        insert(message, phase: .ready(nil))
        return .accepted([.changed(message.id, .pending)] + pump())
    }

    /// Messages recovered from the journal at launch, in outbox order (the journal's
    /// `OutboxJournal.restored`: acceptance order, a resent message after those it was resent
    /// behind); each channel's messages are sent in that order. They are taken whatever the
    /// bounds say: they were accepted once, and are never dropped (a smaller bound only refuses
    /// new messages until the outbox drains). Ids already held are ignored. No state-change
    /// events: the app lists the outbox after a restore.
    package mutating func restore(_ restored: [Restored], now: Duration) -> [Action] {
        for item in restored where records[item.message.id] == nil {
            switch item.state {
            case .pending: insert(item.message, phase: .ready(nil))
            case .failed(let category): insert(item.message, phase: .failed(category))
            }
        }
        return pump()
    }

    /// The server took the message at `timetoken` (for a repeat, the original one).
    package mutating func sendSucceeded(_ id: OutboxMessage.ID, timetoken: Timetoken, now: Duration) -> [Action] {
        guard let record = records[id] else { return [] }
        switch record.phase {
        case .sending:
            remove(id)
            return [.changed(id, .sent(timetoken))] + pump()
        case .ready, .backingOff, .failed:
            return []  // not in flight: a stale report
        }
    }

    /// The send failed. Retryable failures wait (back-off, `Retry-After`, or the link); others
    /// fail the message at once. `randomness` in `0...1` picks the jitter.
    package mutating func sendFailed(_ id: OutboxMessage.ID, _ failure: OutboxSendFailure, now: Duration, randomness: Double) -> [Action] {
        guard var record = records[id] else { return [] }
        let current: Outage?
        switch record.phase {
        case .sending(let outage):
            current = outage
        case .ready, .backingOff, .failed:
            return []  // not in flight: a stale report
        }
        switch Self.disposition(of: failure) {
        case .fail:
            return fail(id, failure.category)
        case .retry:
            switch link {
            case .offline:
                // The link is down: the failure says nothing about this message. Wait for the
                // link without using up retries.
                record.phase = .ready(current)
                records[id] = record
                return [.changed(id, .pending)] + pump()
            case .online:
                break
            }
            let delay: Duration
            let wait: Wait
            var outage = current
            if let retryAfter = failure.retryAfter {
                // The server says when to come back: exactly then, plus up to 1 s of jitter so its
                // clients do not return together; at least 1 s (a `Retry-After: 0` is no loop).
                delay = max(retryAfter, .seconds(1)) + .milliseconds(Int64(Self.unit(randomness) * 1000))
                wait = .serverRetryAfter
            } else {
                var counted = current ?? Outage(start: now, retries: 0)
                guard let next = configuration.retry.delay(beforeRetry: counted.retries + 1, elapsed: now - counted.start,
                                                           randomness: randomness)
                else { return fail(id, failure.category) }
                counted.retries += 1
                outage = counted
                delay = next
                wait = .policy
            }
            record.phase = .backingOff(wait, outage)
            records[id] = record
            return [.changed(id, .pending), .schedule(.retry(id), after: delay)] + pump()
        }
    }

    /// A timer the machine scheduled fired.
    package mutating func timerFired(_ timer: TimerID, now: Duration) -> [Action] {
        switch timer {
        case .retry(let id):
            guard var record = records[id] else { return [] }
            switch record.phase {
            case .backingOff(_, let outage):
                record.phase = .ready(outage)
                records[id] = record
                return pump()
            case .ready, .sending, .failed:
                return []  // a stale timer
            }
        }
    }

    /// The link went up or down. Going offline starts no new send (those in flight finish);
    /// coming back ends back-off waits at once and sends every channel's head.
    package mutating func linkChanged(_ newLink: Link, now: Duration) -> [Action] {
        guard newLink != link else { return [] }
        link = newLink
        switch newLink {
        case .offline:
            return []
        case .online:
            // The outage the waits sat out is over: the policy's count starts again.
            return endBackOffs(keepingCounts: false)
        }
    }

    /// Something reached the server after sends had failed at the transport level (another
    /// channel's send, the subscribe loop): the link works, so the back-off waits end at once —
    /// but, unlike the link coming back, each message keeps its count. A message whose own sends
    /// keep failing while others get through (a request a middlebox always cuts) still runs out
    /// of retries and fails, instead of starting over every time another channel succeeds.
    package mutating func linkConfirmed(now: Duration) -> [Action] {
        guard link == .online else { return [] }
        return endBackOffs(keepingCounts: true)
    }

    /// Ends each channel head's policy back-off at once (a server's `Retry-After` still holds),
    /// keeping or resetting its count, and sends what may go.
    private mutating func endBackOffs(keepingCounts: Bool) -> [Action] {
        var actions: [Action] = []
        for id in queues.values.compactMap(\.first).sorted() {
            guard var record = records[id] else { continue }
            switch record.phase {
            case .backingOff(.policy, let outage):
                record.phase = .ready(keepingCounts ? outage : nil)
                records[id] = record
                actions.append(.cancelTimer(.retry(id)))
            case .backingOff(.serverRetryAfter, _), .ready, .sending, .failed:
                break
            }
        }
        return actions + pump()
    }

    /// The app resends a failed message: it joins the back of its channel's queue, with a fresh
    /// retry budget and the same request id.
    package mutating func resend(_ id: OutboxMessage.ID, now: Duration) -> Outcome {
        guard var record = records[id] else {
            return .refused(OutboxError(.unknownMessage, "message \(id) is not in the outbox"))
        }
        switch record.phase {
        case .failed:
            record.phase = .ready(nil)
            record.attempts = 0
            record.sequence = takeSequence()
            records[id] = record
            queues[record.message.channel, default: []].append(id)
            return .accepted([.changed(id, .pending)] + pump())
        case .ready, .sending, .backingOff:
            return .refused(OutboxError(.notFailed, "message \(id) has not failed; only a failed message can be resent"))
        }
    }

    /// The app cancels a pending or failed message: it leaves the outbox unsent. A message being
    /// sent cannot be cancelled (the server may already have it).
    package mutating func cancel(_ id: OutboxMessage.ID, now: Duration) -> Outcome {
        guard let record = records[id] else {
            return .refused(OutboxError(.unknownMessage, "message \(id) is not in the outbox"))
        }
        var actions: [Action] = []
        switch record.phase {
        case .sending:
            return .refused(OutboxError(.inFlight, "message \(id) is being sent and may already be stored; it cannot be cancelled"))
        case .backingOff:
            actions.append(.cancelTimer(.retry(id)))
        case .ready, .failed:
            break
        }
        remove(id)
        actions.append(.changed(id, .cancelled))
        return .accepted(actions + pump())
    }

    // MARK: Decisions

    /// Whether a failed send is worth repeating unchanged.
    package static func disposition(of failure: OutboxSendFailure) -> FailureDisposition {
        switch failure.category {
        case .networkIssues, .timeout, .tlsConnectionFailed, .cancelled:
            // Transport failures: the request may not have arrived (or its answer was lost); the
            // request id makes a repeat safe. `cancelled` is a send the shell abandoned (shutdown,
            // transport switch): the message is still owed.
            return .retry
        case .unknown:
            // 429 and 5xx: the server is shedding load or failing; no code at all: an
            // unclassified transport failure. Any other status (404, 401...) will not change.
            guard let code = failure.statusCode else { return .retry }
            return code == 429 || (500..<600).contains(code) ? .retry : .fail
        case .accessDenied, .badRequest, .malformedResponse, .malformedFilterExpression, .tlsUntrustedCertificate,
            .decryptionError:
            // 403, 400/413/414, an answer that is not the protocol's, a certificate that is not
            // trusted: the same request gets the same answer (issue #15: fail at once).
            return .fail
        case .acknowledgment, .connected, .reconnected, .disconnected, .unexpectedDisconnect, .connectionError,
            .disconnectedUnexpectedly, .subscriptionChanged, .networkUp, .networkDown, .requestMessageCountExceeded:
            // Subscribe-loop events are never the outcome of a send; failing keeps the message
            // visible instead of looping on a report that makes no sense.
            return .fail
        }
    }

    // MARK: Internals

    private static func visibleState(_ record: Record) -> OutboxMessageState {
        switch record.phase {
        case .ready, .backingOff: return .pending
        case .sending: return .sending(attempt: record.attempts)
        case .failed(let category): return .failed(category)
        }
    }

    private static func unit(_ randomness: Double) -> Double { min(max(randomness, 0), 1) }

    private mutating func takeSequence() -> UInt64 {
        defer { nextSequence += 1 }
        return nextSequence
    }

    private mutating func insert(_ message: OutboxMessage, phase: Phase) {
        records[message.id] = Record(message: message, phase: phase, attempts: 0, sequence: takeSequence())
        heldBytes += message.byteCount
        switch phase {
        case .ready, .sending, .backingOff: queues[message.channel, default: []].append(message.id)
        case .failed: break
        }
    }

    /// Takes a message out of the outbox (sent or cancelled).
    private mutating func remove(_ id: OutboxMessage.ID) {
        guard let record = records.removeValue(forKey: id) else { return }
        heldBytes -= record.message.byteCount
        dequeue(id, channel: record.message.channel)
    }

    private mutating func dequeue(_ id: OutboxMessage.ID, channel: String) {
        guard var queue = queues[channel] else { return }
        queue.removeAll { $0 == id }
        queues[channel] = queue.isEmpty ? nil : queue
    }

    private mutating func fail(_ id: OutboxMessage.ID, _ category: StatusCategory) -> [Action] {
        guard var record = records[id] else { return [] }
        record.phase = .failed(category)
        records[id] = record
        dequeue(id, channel: record.message.channel)
        return [.changed(id, .failed(category))] + pump()
    }

    /// Starts sends while the link is up and slots are free: the ready channel heads, oldest first.
    private mutating func pump() -> [Action] {
        switch link {
        case .offline: return []
        case .online: break
        }
        var heads: [(record: Record, outage: Outage?)] = []
        var inFlight = 0
        for queue in queues.values {
            guard let head = queue.first, let record = records[head] else { continue }
            switch record.phase {
            case .sending: inFlight += 1
            case .ready(let outage): heads.append((record, outage))
            case .backingOff, .failed: break
            }
        }
        heads.sort { $0.record.sequence < $1.record.sequence }
        var actions: [Action] = []
        for head in heads.prefix(max(configuration.maximumConcurrentSends - inFlight, 0)) {
            var record = head.record
            record.phase = .sending(head.outage)
            record.attempts += 1
            records[record.message.id] = record
            actions.append(.changed(record.message.id, .sending(attempt: record.attempts)))
            actions.append(.send(record.message, attempt: record.attempts))
        }
        return actions
    }
}
