import Foundation
import Logging
import Synchronization
import TetherClientCore
import TetherProtocol

/// A message the app asked to send, checked and ready for the outbox (encrypted when a cryptor
/// is configured), before it has an id.
struct OutboxDraft: Sendable {
    var kind: OutboxMessageKind
    var channel: String
    var payload: [UInt8]
    var options: PublishOptions
    /// The app's own request id (``PublishOptions/requestId``), already validated.
    var requestID: String?
}

/// The shell around ``OutboxMachine`` (issue #15, item 3): an actor owning the machine, the
/// optional ``OutboxJournal`` and the bookkeeping of who waits for what.
///
/// Each input (an app command, a send's outcome, a timer, a network change) transitions the
/// machine on the actor; the journal records what must survive a crash in the same turn, and the
/// waiting callers are resumed. Everything else the machine asks for — sends, timers, the app's
/// listeners — goes, in order, onto one stream that ``run(client:)`` performs outside the actor,
/// as cancellable child tasks of one task group (the subscribe engine's pattern).
actor OutboxDriver {
    /// Work for ``run(client:)``.
    enum Work: Sendable {
        case send(OutboxMessage)
        case schedule(OutboxMachine.TimerID, after: Duration)
        case cancelTimer(OutboxMachine.TimerID)
        case notify(OutboxChange)
    }

    private enum Phase {
        /// Not used yet: the journal is not read.
        case idle
        /// Accepting messages.
        case open
        /// The client shut down.
        case shutDown
    }

    /// What the app sees of a message while it is held (the machine keeps the message itself).
    private struct Header {
        var requestID: String
        var kind: OutboxMessageKind
        var channel: String
    }

    private let configuration: OutboxConfiguration
    private let clock: ElapsedClock
    private let logger: Logger
    private let listeners: OutboxListeners
    private var machine: OutboxMachine
    private var journal: OutboxJournal?
    private var phase = Phase.idle
    private var nextID: UInt64 = 1
    private var headers: [OutboxMessageID: Header] = [:]
    /// The status of each held message's last failed attempt.
    private var lastStatus: [OutboxMessageID: Status] = [:]
    /// Whether the server said the last successful attempt was a repeat.
    private var repeats: Set<OutboxMessageID> = []
    /// Outcomes of recently settled messages, for ``result(of:)`` calls that come late.
    private var settled: [OutboxMessageID: Result<PublishResult, TetherError>] = [:]
    private var settledOrder: [OutboxMessageID] = []
    private let waiters = OutboxWaiters()
    /// What the network monitor said last.
    private var networkLink = OutboxMachine.Link.online
    /// A send failed at the transport level since the link was last confirmed.
    private var linkSuspect = false

    nonisolated let work: AsyncStream<[Work]>
    private nonisolated let workSink: AsyncStream<[Work]>.Continuation

    init(configuration: OutboxConfiguration, clock: ElapsedClock, listeners: OutboxListeners, logger: Logger) {
        self.configuration = configuration
        self.clock = clock
        self.listeners = listeners
        self.logger = logger
        machine = OutboxMachine(configuration: configuration.machineConfiguration)
        (work, workSink) = AsyncStream.makeStream(of: [Work].self)
    }

    // MARK: Opening and closing

    /// Reads the journal and restores its messages, once.
    func open() throws(OutboxError) {
        switch phase {
        case .open: return
        case .shutDown: throw OutboxError(.shutDown, "the client was shut down")
        case .idle: break
        }
        if let path = configuration.journalPath {
            let opened: OutboxJournal
            do { opened = try OutboxJournal(path: path) } catch {
                throw OutboxError(.journal, "cannot open the outbox journal: \(error)")
            }
            if opened.recovery.discardedBytes > 0 {
                logger.warning("outbox journal had a damaged tail", metadata: ["path": "\(path)",
                                                                                 "discardedBytes": "\(opened.recovery.discardedBytes)"])
            }
            if opened.recovery.unreadableRecords > 0 {
                logger.error("outbox journal had records this version cannot read; they were skipped",
                             metadata: ["path": "\(path)", "records": "\(opened.recovery.unreadableRecords)"])
            }
            journal = opened
            nextID = opened.nextID.rawValue
            let restored = opened.restored
            for item in restored {
                headers[item.message.id] = Header(requestID: item.message.requestID, kind: item.message.kind, channel: item.message.channel)
            }
            phase = .open
            // What the network monitor reported before the outbox opened: nothing is sent, and
            // no retry used, while the link is down.
            if networkLink != .online { perform(machine.linkChanged(networkLink, now: clock.now())) }
            perform(machine.restore(restored, now: clock.now()))
            logger.debug("outbox restored", metadata: ["messages": "\(restored.count)"])
        } else {
            phase = .open
            if networkLink != .online { perform(machine.linkChanged(networkLink, now: clock.now())) }
        }
    }

    /// Stops: waiting callers get ``StatusCategory/cancelled``, the journal is closed (what is
    /// pending in it goes at the next launch), ``run(client:)`` ends.
    func shutdown() {
        phase = .shutDown
        // A last chance for what the journal could not write while the app ran (a disk that was
        // full): otherwise the next launch sees those messages as they were before.
        do { try journal?.catchUp() } catch {
            logger.warning("outbox journal is behind and could not be rewritten; the next launch sees the messages as last written",
                           metadata: ["error": "\(error)"])
        }
        let durable = journal != nil
        journal = nil
        // Each with its request id: without a journal the message is gone, and an app that
        // publishes it again with that id is not stored twice (within the dedup window).
        waiters.failAll { id in
            let header = headers[id]
            var status = Status(category: .cancelled, operation: header?.kind == .signal ? .signal : .publish,
                                serverMessage: durable ? "the client was shut down; the message stays in the outbox"
                                    : "the client was shut down before the message was confirmed; send it again with its request id",
                                affectedChannels: header.map { [$0.channel] } ?? [])
            status.requestId = header?.requestID
            return TetherError(status)
        }
        workSink.finish()
    }

    // MARK: App commands

    /// Accepts a message: admission, journal append, then the machine.
    func enqueue(_ draft: OutboxDraft) throws(TetherError) -> OutboxEntry {
        let operation: TetherOperation = draft.kind == .signal ? .signal : .publish
        func refused(_ error: OutboxError) -> TetherError {
            let category: StatusCategory
            switch error.code {
            case .tooLarge: category = .badRequest
            case .shutDown: category = .cancelled
            default: category = .unknown
            }
            return TetherError(Status(category: category, operation: operation, error: error, serverMessage: error.message,
                                      affectedChannels: [draft.channel]))
        }
        do { try open() } catch { throw refused(error) }
        let message = OutboxMessage(id: OutboxMessageID(nextID), requestID: draft.requestID ?? UUID().uuidString, kind: draft.kind,
                                    channel: draft.channel, payload: draft.payload, options: draft.options)
        if let refusal = machine.admission(byteCount: message.byteCount) { throw refused(refusal) }
        if let journal {
            do { try journal.append(.accepted(message)) } catch {
                throw refused(OutboxError(.journal, "the message could not be written to the outbox journal: \(error)"))
            }
        }
        nextID += 1
        headers[message.id] = Header(requestID: message.requestID, kind: message.kind, channel: message.channel)
        switch machine.enqueue(message, now: clock.now()) {
        case .accepted(let actions):
            perform(actions)
        case .refused(let error):
            // Not reached: admission was asked first. Keep the journal consistent anyway.
            headers[message.id] = nil
            try? journal?.append(.removed(message.id))
            throw refused(error)
        }
        return entry(message.id) ?? OutboxEntry(id: message.id, requestId: message.requestID, kind: message.kind,
                                                 channel: message.channel, state: .pending)
    }

    /// Accepts a message and waits for its outcome (``TetherClient/publish(channel:message:options:)``).
    /// A failed message is removed once its failure is returned: the caller owns it now.
    func send(_ draft: OutboxDraft) async throws(TetherError) -> PublishResult {
        let id = try enqueue(draft).id
        let outcome = await wait(for: id)
        if !Task.isCancelled, case .failure = outcome, case .failed? = machine.entry(id)?.state {
            // Removed even if the journal cannot record it now: the journal writes the removal
            // with its next record (at worst the message comes back failed, never sent), and the
            // caller owns the failure now.
            _ = try? cancel(id, unjournalledIfFailed: true)
            settled[id] = outcome  // a late `result(of:)` sees the failure, not the removal
        }
        return try outcome.get()
    }

    func entries() throws(OutboxError) -> [OutboxEntry] {
        try open()
        return machine.entries.compactMap { entry($0.message.id) }
    }

    func resend(_ id: OutboxMessageID) throws(OutboxError) {
        try open()
        switch machine.resend(id, now: clock.now()) {
        case .accepted(let actions):
            lastStatus[id] = nil
            perform(actions)
        case .refused(let error): throw error
        }
    }

    /// `unjournalledIfFailed`: a failed message is removed even when the journal cannot record
    /// it now (the journal writes it with its next record; at worst the message comes back failed
    /// at the next launch, never sent); otherwise such a cancel is refused.
    func cancel(_ id: OutboxMessageID, unjournalledIfFailed: Bool = false) throws(OutboxError) {
        try open()
        var next = machine
        let wasFailed: Bool
        if case .failed? = machine.entry(id)?.state { wasFailed = true } else { wasFailed = false }
        switch next.cancel(id, now: clock.now()) {
        case .accepted(let actions):
            // Journalled before it takes effect: a cancel the journal did not keep would be undone
            // at the next launch, which would send the message the app cancelled.
            let regardless = unjournalledIfFailed && wasFailed
            do { try journal?.record(id, changedTo: .cancelled, ifUnwritten: regardless ? .kept : .dropped) } catch {
                guard regardless else {
                    throw OutboxError(.journal, "the cancel could not be written to the outbox journal (\(error)); the message stays in the outbox")
                }
                logger.warning("outbox journal write failed; the removal of the failed message is written with the next record",
                               metadata: ["message": "\(id)", "error": "\(error)"])
            }
            machine = next
            perform(actions)
        case .refused(let error): throw error
        }
    }

    /// Tests: while `errno` is set, every write to the journal fails with it (a full disk).
    func failJournalWrites(_ errno: Int32?) {
        journal?.writeFailure = errno
    }

    func result(of id: OutboxMessageID) async throws(TetherError) -> PublishResult {
        do { try open() } catch {
            throw TetherError(Status(category: .unknown, operation: .publish, error: error, serverMessage: error.message))
        }
        if let outcome = settled[id] { return try outcome.get() }
        guard machine.entry(id) != nil else {
            let error = OutboxError(.unknownMessage, "message \(id) is not in the outbox, and its outcome is no longer remembered")
            throw TetherError(Status(category: .unknown, operation: .publish, error: error, serverMessage: error.message))
        }
        if case .failed? = machine.entry(id)?.state { return try outcome(id).get() }
        return try await wait(for: id).get()
    }

    private func wait(for id: OutboxMessageID) async -> Result<PublishResult, TetherError> {
        let token = waiters.reserve()
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                waiters.register(token, for: id, continuation)
            }
        } onCancel: {
            waiters.cancel(token, TetherError(Status(category: .cancelled, operation: .publish,
                                                     serverMessage: "the wait was cancelled; the message stays in the outbox")))
        }
    }

    // MARK: Machine inputs from run(client:)

    /// A send finished.
    func sendCompleted(_ message: OutboxMessage, _ outcome: Result<PublishResult, TetherError>) {
        guard case .open = phase else { return }
        let now = clock.now()
        switch outcome {
        case .success(let result):
            if result.isRepeat { repeats.insert(message.id) }
            perform(machine.sendSucceeded(message.id, timetoken: result.timetoken, now: now))
            confirmLink()
        case .failure(let error):
            lastStatus[message.id] = error.status
            var failure = OutboxSendFailure(error.status)
            if failure.category == .malformedResponse, let code = failure.statusCode, code == 429 || (500..<600).contains(code) {
                // A proxy's HTML error page for an overloaded or failing server: a server-side failure.
                failure.category = .unknown
            }
            switch failure.category {
            case .networkIssues, .timeout, .tlsConnectionFailed: linkSuspect = true
            default: break
            }
            perform(machine.sendFailed(message.id, failure, now: now, randomness: Double.random(in: 0...1)))
        }
    }

    func timerFired(_ timer: OutboxMachine.TimerID) {
        guard case .open = phase else { return }
        perform(machine.timerFired(timer, now: clock.now()))
    }

    /// The network monitor's report.
    func networkChanged(_ path: NetworkPathStatus) {
        let link: OutboxMachine.Link
        switch path {
        case .down: link = .offline
        case .up, .changed: link = .online
        }
        networkLink = link
        if link == .online { linkSuspect = false }
        guard case .open = phase else { return }
        perform(machine.linkChanged(link, now: clock.now()))
    }

    /// Something reached the server (a send, or the subscribe loop reconnecting) after sends had
    /// failed at the transport level: the outage those failures were waiting out is over, so the
    /// machine ends its back-off waits at once (what it does when the link comes back).
    func confirmLink() {
        guard linkSuspect, networkLink == .online, case .open = phase else { return }
        linkSuspect = false
        perform(machine.linkConfirmed(now: clock.now()))
    }

    // MARK: Acting

    private func perform(_ actions: [OutboxMachine.Action]) {
        var work: [Work] = []
        for action in actions {
            logger.trace("outbox action", metadata: ["tether.action": "\(action)"])
            switch action {
            case .send(let message, _):
                work.append(.send(message))
            case .schedule(let timer, let delay):
                work.append(.schedule(timer, after: delay))
            case .cancelTimer(let timer):
                work.append(.cancelTimer(timer))
            case .changed(let id, let state):
                if let change = changed(id, state) { work.append(.notify(change)) }
            }
        }
        if !work.isEmpty { workSink.yield(work) }
    }

    /// Journals a change, settles waiters, and describes it for the app.
    private func changed(_ id: OutboxMessageID, _ state: OutboxMessageState) -> OutboxChange? {
        do { try journal?.record(id, changedTo: state, ifUnwritten: .kept) } catch {
            // The change has happened: the journal keeps it and writes it with its next record.
            // If nothing can be written before the app ends, the next launch sees the message as
            // it was (a sent one goes again with its request id, which the server's dedup window
            // answers with the original timetoken).
            logger.warning("outbox journal write failed; the change is written with the next record",
                           metadata: ["message": "\(id)", "error": "\(error)"])
        }
        guard let header = headers[id] else { return nil }
        let failure: StatusCategory?
        switch state {
        case .failed(let category): failure = category
        case .pending: failure = lastStatus[id]?.category
        case .sending, .sent, .cancelled: failure = nil
        }
        let change = OutboxChange(id: id, requestId: header.requestID, kind: header.kind, channel: header.channel, state: state,
                                  failure: failure)
        switch state {
        case .sent, .cancelled, .failed:
            let result = outcome(id, state: state)
            if state.isFinal { remember(id, result) }
            waiters.resolve(id, result)
            if state.isFinal {
                headers[id] = nil
                lastStatus[id] = nil
                repeats.remove(id)
            }
        case .pending, .sending:
            break
        }
        return change
    }

    private func outcome(_ id: OutboxMessageID, state: OutboxMessageState? = nil) -> Result<PublishResult, TetherError> {
        let header = headers[id]
        let operation: TetherOperation = header?.kind == .signal ? .signal : .publish
        switch state ?? machine.entry(id)?.state ?? .cancelled {
        case .sent(let timetoken):
            return .success(PublishResult(timetoken: timetoken, requestId: header?.requestID, isRepeat: repeats.contains(id)))
        case .failed(let category):
            var status = lastStatus[id] ?? Status(category: category, operation: operation, serverMessage: "the message failed: \(category)",
                                                  affectedChannels: header.map { [$0.channel] } ?? [])
            status.requestId = header?.requestID  // to send it again without storing it twice
            return .failure(TetherError(status))
        case .cancelled, .pending, .sending:
            var status = Status(category: .cancelled, operation: operation, serverMessage: "the message was cancelled",
                                affectedChannels: header.map { [$0.channel] } ?? [])
            status.requestId = header?.requestID
            return .failure(TetherError(status))
        }
    }

    private func remember(_ id: OutboxMessageID, _ result: Result<PublishResult, TetherError>) {
        settled[id] = result
        settledOrder.append(id)
        let limit = max(configuration.maximumMessages, 1)
        if settledOrder.count > limit {
            let drop = settledOrder.count - limit
            for old in settledOrder.prefix(drop) { settled[old] = nil }
            settledOrder.removeFirst(drop)
        }
    }

    private func entry(_ id: OutboxMessageID) -> OutboxEntry? {
        guard let entry = machine.entry(id) else { return nil }
        let lastFailure: StatusCategory?
        switch entry.state {
        case .failed(let category): lastFailure = category
        case .pending, .sending, .sent, .cancelled: lastFailure = lastStatus[id]?.category
        }
        return OutboxEntry(id: id, requestId: entry.message.requestID, kind: entry.message.kind, channel: entry.message.channel,
                           state: entry.state, lastFailure: lastFailure)
    }

    // MARK: The loop

    /// Performs the work until ``shutdown()`` or cancellation: sends and retry timers as
    /// cancellable child tasks, the network monitor's reports, the app's listeners in order.
    /// The loop holds its client weakly (`owner`): a send holds it only while it runs, so an app
    /// that drops the client without ``TetherClient/shutdown()`` does not keep it alive.
    nonisolated func run(owner: WeakClient, connectionChanges: AsyncStream<ConnectionChange>, monitor: (any NetworkMonitor)?) async {
        let slots = CancellationSlots<OutboxMachine.TimerID>()
        await withDiscardingTaskGroup { group in
            if let monitor {
                group.addTask { [self] in
                    for await path in monitor.pathUpdates() { await networkChanged(path) }
                }
            }
            group.addTask { [self] in
                // The subscribe loop reaching the server again also ends the outbox's back-offs.
                for await change in connectionChanges where change.current == .connected { await confirmLink() }
            }
            for await batch in work {
                for item in batch {
                    switch item {
                    case .send(let message):
                        group.addTask { [self] in
                            guard let outcome = await owner.client?.sendOutboxMessage(message) else { return }
                            await sendCompleted(message, outcome)
                        }
                    case .schedule(let timer, let delay):
                        let token = slots.replace(timer)
                        group.addTask { [self] in
                            await slots.race(timer, token: token) { [self] in
                                do { try await clock.sleep(delay) } catch { return }
                                guard slots.complete(timer, token: token) else { return }
                                await timerFired(timer)
                            }
                        }
                    case .cancelTimer(let timer):
                        slots.cancel(timer)
                    case .notify(let change):
                        listeners.emit(change)
                    }
                }
            }
            group.cancelAll()
        }
        slots.cancelAll()
    }
}

/// Callers waiting for a message's outcome. A `Mutex`, not the actor's state, so that a
/// cancelled wait is resumed from the cancellation handler at once.
final class OutboxWaiters: Sendable {
    private typealias Continuation = CheckedContinuation<Result<PublishResult, TetherError>, Never>

    private struct State {
        var next = 0
        var cancelled: Set<Int> = []
        var waiting: [Int: (id: OutboxMessageID, continuation: Continuation)] = [:]
    }

    private let state = Mutex(State())

    func reserve() -> Int {
        state.withLock { state in
            state.next += 1
            return state.next
        }
    }

    func register(_ token: Int, for id: OutboxMessageID, _ continuation: CheckedContinuation<Result<PublishResult, TetherError>, Never>) {
        let cancelledEarly = state.withLock { state -> Bool in
            if state.cancelled.remove(token) != nil { return true }
            state.waiting[token] = (id, continuation)
            return false
        }
        if cancelledEarly {
            continuation.resume(returning: .failure(TetherError(Status(category: .cancelled, operation: .publish,
                                                                      serverMessage: "the wait was cancelled")))
            )
        }
    }

    func cancel(_ token: Int, _ error: TetherError) {
        let waiter = state.withLock { state -> Continuation? in
            guard let waiter = state.waiting.removeValue(forKey: token) else {
                state.cancelled.insert(token)
                return nil
            }
            return waiter.continuation
        }
        waiter?.resume(returning: .failure(error))
    }

    func resolve(_ id: OutboxMessageID, _ result: Result<PublishResult, TetherError>) {
        let matched = state.withLock { state -> [Continuation] in
            let tokens = state.waiting.filter { $0.value.id == id }.map(\.key)
            return tokens.compactMap { state.waiting.removeValue(forKey: $0)?.continuation }
        }
        for continuation in matched { continuation.resume(returning: result) }
    }

    /// Fails every waiter, each with the error `error` makes for its message.
    func failAll(_ error: (OutboxMessageID) -> TetherError) {
        let all = state.withLock { state -> [(id: OutboxMessageID, continuation: Continuation)] in
            defer { state.waiting = [:] }
            return Array(state.waiting.values)
        }
        for (id, continuation) in all { continuation.resume(returning: .failure(error(id))) }
    }
}

/// The app's outbox listeners: closures and streams, called in order by the outbox loop.
final class OutboxListeners: Sendable {
    private struct State {
        var next = 0
        var handlers: [Int: @Sendable (OutboxChange) -> Void] = [:]
        var finishers: [Int: @Sendable () -> Void] = [:]
        var finished = false
    }

    private let state = Mutex(State())

    func add(_ handler: @escaping @Sendable (OutboxChange) -> Void) -> ListenerToken {
        let id = state.withLock { state in
            state.next += 1
            state.handlers[state.next] = handler
            return state.next
        }
        return ListenerToken(id: id, registry: ObjectIdentifier(self)) { [weak self] in
            self?.state.withLock { state in
                state.handlers[id] = nil
                state.finishers[id] = nil
            }
        }
    }

    func stream() -> AsyncStream<OutboxChange> {
        let (stream, continuation) = AsyncStream.makeStream(of: OutboxChange.self)
        let token = add { continuation.yield($0) }
        // Checked and registered in one step: a stream made as the client shuts down is either
        // finished by ``finishAll()`` or here, never left open.
        let registered = state.withLock { state -> Bool in
            guard !state.finished else { return false }
            state.finishers[token.id] = { continuation.finish() }
            return true
        }
        guard registered else {
            token.cancel()
            continuation.finish()
            return stream
        }
        continuation.onTermination = { _ in token.cancel() }
        return stream
    }

    func emit(_ change: OutboxChange) {
        for handler in state.withLock({ $0.handlers.sorted { $0.key < $1.key }.map(\.value) }) { handler(change) }
    }

    func finishAll() {
        let finishers = state.withLock { state in
            defer {
                state.handlers = [:]
                state.finishers = [:]
                state.finished = true
            }
            return Array(state.finishers.values)
        }
        for finish in finishers { finish() }
    }
}
