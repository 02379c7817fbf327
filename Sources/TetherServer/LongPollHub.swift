import Foundation
public import Logging
package import NIOCore
import Synchronization
@_spi(Benchmarks) public import TetherProtocol
@_spi(Benchmarks) public import TetherServerCore

/// One page of a subscribe response.
public struct SubscribePage: Sendable {
    /// The cursor for the client's next request.
    public var cursor: Timetoken
    /// Encoded envelopes, oldest first.
    public var envelopes: [[UInt8]]
    /// Retention gaps the client's cursor fell into (Tether extension, see docs/protocol.md).
    public var gaps: [RetentionGap]
}

/// The shell around ``DeliveryHub``: a mutex-protected core and the lifecycle of its waiters
/// (``DeliveryWaiters``), plus the continuations and timers of waiting long-polls. Every
/// transition runs under the lock; continuations are resumed and timers cancelled after it is
/// released.
public final class LongPollHub: Sendable {
    /// What a parked long-poll leaves with the waiter machine: what resumes it.
    private struct Parked {
        /// A task awaiting the wake-up, or (a long-poll parked without a task, see
        /// ``LongPollParking``) the function that answers it.
        enum Resume {
            case task(CheckedContinuation<WakeReason, Never>)
            case callback(@Sendable (WakeReason) -> Void)
        }

        var resume: Resume

        func wake(_ reason: WakeReason) {
            switch resume {
            case .task(let continuation): continuation.resume(returning: reason)
            case .callback(let callback): callback(reason)
            }
        }
    }

    /// Someone awaiting a number of parked long-polls (``waitUntilWaiting(_:)``).
    private struct CountWatcher {
        var id: UInt64
        var count: Int
        var continuation: CheckedContinuation<Void, Never>
    }

    private struct State {
        var core: DeliveryHub
        /// Cluster mode: requests waiting for the visible cursor to reach a timetoken.
        var visibilityWaiters: [(UInt64, Timetoken, CheckedContinuation<Void, Never>)] = []
        var waiters = DeliveryWaiters<Parked, ObjectIdentifier, NIODeadline>()
        /// The hub's one deadline timer (``armingDeadlineTimer()``): when it fires, and its
        /// generation — a timer that was replaced finds another and does nothing.
        var deadlineTimerAt: NIODeadline?
        var deadlineTimerGeneration: UInt64 = 0
        var deadlineTimer: Scheduled<Void>?
        var countWatchers: [CountWatcher] = []
        var nextWatcherID: UInt64 = 0

        /// What arming the deadline timer takes (``LongPollHub/armDeadlineTimer(_:on:)``).
        struct Arming {
            var deadline: NIODeadline
            var generation: UInt64
            /// The timer armed for a later deadline, to cancel.
            var replaced: Scheduled<Void>?
        }

        /// Whether the deadline timer must be armed (again) for the earliest parked deadline:
        /// `nil` when it is armed that early already or nobody waits. Called after a park.
        mutating func armingDeadlineTimer() -> Arming? {
            guard let next = waiters.nextDeadline() else { return nil }
            if let armed = deadlineTimerAt, armed <= next { return nil }
            deadlineTimerAt = next
            deadlineTimerGeneration &+= 1
            defer { deadlineTimer = nil }
            return Arming(deadline: next, generation: deadlineTimerGeneration, replaced: deadlineTimer)
        }

        /// Removes and returns the watchers whose count the waiters now hold, to be resumed once
        /// the lock is released. Called after every transition that parks or wakes a waiter.
        mutating func reachedCounts() -> [CheckedContinuation<Void, Never>] {
            guard !countWatchers.isEmpty else { return [] }
            let count = waiters.waitingCount
            let reached = countWatchers.filter { $0.count == count }.map(\.continuation)
            countWatchers.removeAll { $0.count == count }
            return reached
        }
    }

    /// How a publish waiting for an earlier one with the same request id is resumed.
    private enum DedupWake: Sendable {
        /// The earlier one was stored: answer with its timetoken.
        case repeated(Timetoken)
        /// The key was free: this publish now holds it.
        case claimed
        /// The earlier one failed: claim again.
        case released
    }

    private let state: Mutex<State>
    /// Recent publishes with a request id (issue #15); a separate lock from delivery's.
    private let dedup: Mutex<PublishDedupIndex<CheckedContinuation<DedupWake, Never>>>
    private let store: MessageStore
    /// A cluster's shared log: when set, every event is numbered and committed there, and this
    /// hub delivers what the log's reader feeds it (``ingest(_:through:)``), from every node.
    package let shared: SharedLog?
    /// Where stored messages are read back: the shared log in a cluster, else the store.
    package let messages: any MessageReading
    private let metrics: ServerMetrics
    private let logger: Logger
    private let clock: @Sendable () -> Timetoken
    /// The deduplication window's clock (the server's injectable clock, as a wall time).
    private let dedupClock: @Sendable () -> Timetoken
    /// How long and how many publishes are remembered.
    package let deduplication: PublishDedupConfiguration
    /// Embedded store: the `highest_timetoken` the store durably holds from the cursor lease
    /// (``renewCursorLease()``). Nothing this hub numbers or hands out as a cursor follows the
    /// clock past it, so a restarted server, whose sequencer starts above it, never numbers an
    /// event at or below a cursor a subscriber already holds, even if its clock went back.
    /// `Int64.max` in a cluster (the shared log's sequencer row is the lease there).
    private let leaseCeiling: Atomic<Int64>

    /// How far ahead of the clock the embedded store's `highest_timetoken` is kept (the cursor
    /// lease): 10 s of timetokens. A server that crashed and restarted sooner than that issues
    /// timetokens up to this far ahead of its clock until the clock passes them (a graceful stop
    /// settles the lease to the last cursor, ``settleCursorLease()``).
    package static let cursorLease: Int64 = 100_000_000
    /// How much of the lease is used before it is renewed: 2.5 s. Checked every second, so the
    /// store writes the row about every 3 s, and the lease runs out only when no renewal lands
    /// for 7.5 s.
    package static let cursorLeaseRenewal: Int64 = 25_000_000

    /// Creates a hub whose timetokens start above the store's highest timetoken.
    public convenience init(store: MessageStore, metrics: ServerMetrics, logger: Logger,
                            configuration: DeliveryHubConfiguration = .init(),
                            clock: @escaping @Sendable () -> Timetoken = LongPollHub.systemNow) throws {
        try self.init(store: store, metrics: metrics, logger: logger, configuration: configuration, clock: clock,
                      deduplication: .init(), dedupClock: LongPollHub.systemNow)
    }

    /// Creates a hub that also remembers publishes with a request id for
    /// `deduplication.windowSeconds` of `dedupClock`, restoring those the store remembers.
    package init(store: MessageStore, metrics: ServerMetrics, logger: Logger,
                 configuration: DeliveryHubConfiguration = .init(),
                 clock: @escaping @Sendable () -> Timetoken = LongPollHub.systemNow,
                 deduplication: PublishDedupConfiguration, dedupClock: @escaping @Sendable () -> Timetoken,
                 shared: SharedLog? = nil) throws {
        self.store = store
        self.shared = shared
        self.messages = shared ?? store
        self.metrics = metrics
        self.logger = logger
        self.clock = clock
        self.dedupClock = dedupClock
        self.deduplication = deduplication
        // In a cluster the cursor starts at the log's horizon and only follows the log.
        let core: DeliveryHub
        if let shared {
            core = DeliveryHub(floor: shared.startHorizon, now: .zero, configuration: configuration)
            leaseCeiling = Atomic(Int64.max)
        } else {
            // The previous run's lease is in `highest_timetoken`: start above it, and take a
            // lease of this run's own before the first cursor goes out. A store that cannot take
            // it cannot store anything either: the server does not start (``StoreOpenError``).
            let start = max(try store.highestTimetoken(), clock())
            let ceiling = Self.leaseEnd(from: start)
            try store.reserveTimetokens(through: ceiling)
            core = DeliveryHub(floor: start, now: start, configuration: configuration)
            leaseCeiling = Atomic(ceiling.storageValue)
        }
        self.state = Mutex(State(core: core))
        var index = PublishDedupIndex<CheckedContinuation<DedupWake, Never>>(configuration: deduplication)
        // In a cluster the log remembers request ids (answered in the writing transaction).
        if deduplication.isEnabled, shared == nil {
            let now = dedupClock()
            for record in try store.publishRecords(since: Self.horizon(now, deduplication), limit: deduplication.maximumEntries) {
                index.restore(record.key, timetoken: record.timetoken, at: record.createdAt, now: now)
            }
            _ = index.takeEvictionCount()
            if index.rememberedCount > 0 {
                logger.debug("restored remembered publishes", metadata: ["count": "\(index.rememberedCount)"])
            }
        }
        self.dedup = Mutex(index)
    }

    /// The end of a cursor lease taken at `now`.
    private static func leaseEnd(from now: Timetoken) -> Timetoken {
        Timetoken(UInt64(now.storageValue.addingReportingOverflow(cursorLease).overflow ? Int64.max : now.storageValue + cursorLease))
    }

    /// The clock for numbering events and moving the idle cursor: the clock, but never past the
    /// lease the store holds (``leaseCeiling``). The lease is renewed well before the clock
    /// reaches it; only a store that cannot write for 7.5 s holds the idle cursor back (events
    /// are then numbered one above the other, as with a clock that stands still).
    private func sequencingNow() -> Timetoken {
        let now = clock()
        let ceiling = leaseCeiling.load(ordering: .acquiring)
        return now.storageValue <= ceiling ? now : Timetoken(UInt64(ceiling))
    }

    /// Embedded store: once ``cursorLeaseRenewal`` of the cursor lease is used, writes a new one
    /// — `highest_timetoken` raised to the clock plus ``cursorLease`` — and lets the cursor follow
    /// the clock up to it. The server calls it every second (``CursorLeaseService``); a cluster
    /// has nothing to renew. Returns whether it wrote.
    @discardableResult
    package func renewCursorLease() async throws -> Bool {
        guard shared == nil else { return false }
        // From the clock, or from the last timetoken numbered when that is ahead of it (a
        // restart whose clock went back starts above the previous lease, and events numbered one
        // above the other there must stay under the lease too).
        let now = max(clock(), state.withLock { $0.core.lastNumbered })
        let ceiling = leaseCeiling.load(ordering: .acquiring)
        guard now.storageValue > ceiling - (Self.cursorLease - Self.cursorLeaseRenewal) else { return false }
        let end = Self.leaseEnd(from: now)
        try await store.reserveTimetokens(through: end)
        // One renewer at a time (the server's lease service); the max guards a test's extra call.
        var current = leaseCeiling.load(ordering: .relaxed)
        while current < end.storageValue {
            let (exchanged, found) = leaseCeiling.compareExchange(expected: current, desired: end.storageValue,
                                                                  ordering: .acquiringAndReleasing)
            if exchanged { break }
            current = found
        }
        return true
    }

    /// Embedded store, at a graceful stop, once nothing can number an event any more: lowers
    /// `highest_timetoken` from the lease to the visible cursor — at or above every timetoken
    /// and cursor this run handed out, and every stored one — so a server restarted at once
    /// starts at its clock, not up to a lease ahead of it. Does nothing while a reservation is
    /// still being written (it could commit above the visible cursor). Returns whether it wrote.
    @discardableResult
    package func settleCursorLease() throws -> Bool {
        guard shared == nil else { return false }
        // Held from here, settled or not: the idle cursor no longer follows the clock (nothing
        // numbers events any more: every service that could has stopped). Not settled, the lease
        // stays in the store, which is safe.
        leaseCeiling.store(0, ordering: .releasing)
        let visible: Timetoken? = state.withLock { $0.core.hasReservationInFlight ? nil : $0.core.visibleThrough }
        guard let visible else { return false }
        try store.settleTimetokens(at: visible)
        return true
    }

    private static func horizon(_ now: Timetoken, _ configuration: PublishDedupConfiguration) -> Timetoken {
        Timetoken(now.rawValue - min(now.rawValue, configuration.windowUnits))
    }

    /// The wall clock as a timetoken.
    public static let systemNow: @Sendable () -> Timetoken = {
        Timetoken(unixSeconds: Date().timeIntervalSince1970)
    }

    /// The current visible cursor (what `/time/0` and handshakes return).
    public var currentCursor: Timetoken {
        if shared != nil { return state.withLock { $0.core.visibleThrough } }
        let now = sequencingNow()
        return state.withLock { $0.core.advance(now: now) }
    }

    /// Where a continuation from a client's `cursor` reads from: the cursor itself, unless it is
    /// above every timetoken handed out. On one node that is the hub's cursor, and a cursor from
    /// the future is treated as current rather than waited for. In a cluster another node may
    /// have handed it out before this node's reader got there: a cursor at or below the shared
    /// sequencer is kept (the read waits for this node to reach it; lowering it would deliver the
    /// events in between a second time), and only one above the sequencer is lowered to it. If
    /// the sequencer cannot be read, the cursor is lowered to this node's, as on one node.
    package func readPoint(for cursor: Timetoken) async -> Timetoken {
        let current = currentCursor
        guard cursor > current, let shared else { return min(cursor, current) }
        do {
            return min(cursor, max(try await shared.sequencerValue(), current))
        } catch {
            logger.warning("the shared sequencer could not be read; a cursor ahead of this node is treated as current",
                           metadata: ["error": "\(error)"])
            return current
        }
    }

    /// Number of long-polls currently waiting.
    public var waitingCount: Int { state.withLock { $0.waiters.waitingCount } }

    /// Returns once exactly `count` long-polls are waiting (at once if they already are), or when
    /// the calling task is cancelled. Resumed from the transition that parks or wakes the waiter
    /// that makes the count, so a test awaits the hub's state instead of polling it.
    package func waitUntilWaiting(_ count: Int) async {
        let id = state.withLock { s in
            defer { s.nextWatcherID += 1 }
            return s.nextWatcherID
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let resumeNow = state.withLock { s in
                    if s.waiters.waitingCount == count || Task.isCancelled { return true }
                    s.countWatchers.append(CountWatcher(id: id, count: count, continuation: continuation))
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        } onCancel: {
            let watcher = state.withLock { s -> CountWatcher? in
                guard let index = s.countWatchers.firstIndex(where: { $0.id == id }) else { return nil }
                return s.countWatchers.remove(at: index)
            }
            watcher?.continuation.resume()
        }
    }

    /// Publishes an event: reserves its timetoken, makes it durable when `store` is set, then
    /// commits it and wakes matching long-polls. Returns the event's timetoken once durable.
    package func publish(
        _ makeEnvelope: (Timetoken) -> SubscribeEnvelope, store stored: ((Timetoken) -> StoredMessage)?
    ) async throws -> Timetoken {
        try await publish(makeEnvelope, store: stored, dedupKey: nil).timetoken
    }

    /// Publishes an event as ``publish(_:store:)`` does; with a `dedupKey` (and deduplication
    /// on), a key published within the window is answered with its original timetoken and
    /// nothing is stored or delivered again. A repeat that arrives while the original is still
    /// being stored waits for its outcome. The key is remembered durably in the same
    /// transaction as the message — or, for an event that is not stored, in a transaction of
    /// its own that the publish then waits for.
    package nonisolated(nonsending) func publish(
        _ makeEnvelope: (Timetoken) -> SubscribeEnvelope, store stored: ((Timetoken) -> StoredMessage)?, dedupKey: DedupKey?
    ) async throws -> HubPublishResult {
        let key = deduplication.isEnabled ? dedupKey : nil
        if let key, let original = await claim(key) {
            metrics.recordDedupHit()
            return HubPublishResult(timetoken: original, isRepeat: true)
        }
        if let shared { return try await publish(through: shared, makeEnvelope, stored: stored, key: key) }
        let now = sequencingNow()
        let probe = makeEnvelope(.zero)
        let channelKey = ChannelKey(subscribeKey: probe.subscribeKey, channel: probe.channel)
        let timetoken = state.withLock { $0.core.reserve(channelKey, now: now) }
        let envelope = makeEnvelope(timetoken)
        let message = stored?(timetoken)
        let rememberedAt = key == nil ? Timetoken.zero : dedupClock()
        let record = key.map { PublishRecord(key: $0, timetoken: timetoken, channel: probe.channel, createdAt: rememberedAt) }
        let event = BufferedEvent(envelope: envelope, isStored: message != nil)
        if message != nil || record != nil {
            // Delivered as soon as its transaction commits, on the store's writer; the publisher
            // is answered once the commit is durable (``MessageStore``).
            let write = StoreWrite(message: message, record: record, onCommitted: { [self] in commit(event) })
            do {
                try await store.append(write) { [self] committed in
                    // The publisher was told "outcome unknown"; the reservation was kept in
                    // flight, so a message that did commit was delivered at its timetoken, never
                    // skipped by a cursor that moved on. A repeat waits for this outcome too.
                    if committed {
                        if let key { settle(key, timetoken: timetoken, at: rememberedAt) }
                    } else {
                        wake(state.withLock { $0.core.abandon(timetoken) }, reason: .event)
                        if let key { release(key) }
                    }
                }
            } catch let error as StoreError where error.code == .outcomeUnknown {
                throw error  // settled by the closure above once the transaction ends
            } catch {
                let woken = state.withLock { $0.core.abandon(timetoken) }
                wake(woken, reason: .event)
                if let key { release(key) }
                throw error
            }
        } else {
            commit(event)
        }
        if let key { settle(key, timetoken: timetoken, at: rememberedAt) }
        return HubPublishResult(timetoken: timetoken, isRepeat: false)
    }

    /// The cluster's publish: the shared log numbers and commits the event (answering a repeat
    /// remembered by any node), and the log's reader delivers it on every node, this one too.
    private nonisolated(nonsending) func publish(
        through shared: SharedLog, _ makeEnvelope: (Timetoken) -> SubscribeEnvelope, stored: ((Timetoken) -> StoredMessage)?,
        key: DedupKey?
    ) async throws -> HubPublishResult {
        let envelope = makeEnvelope(.zero)
        // The message's retention, read back from the expiry it would get at timetoken zero.
        let retentionHours: Double? = stored.flatMap { make in
            let probe = make(.zero)
            return probe.expiresAt.map { Double($0.rawValue) / 36_000_000_000 }
        }
        let outcome: SharedAppendOutcome
        do {
            outcome = try await shared.append(SharedEvent(envelope: envelope, isStored: stored != nil,
                                                          retentionHours: retentionHours, dedupKey: key))
        } catch {
            // Not written — or, for `outcomeUnknown`, not known here: either way a repeat of the
            // request id asks the log, which answers with the original if it committed.
            if let key { release(key) }
            throw error
        }
        if let key { settle(key, timetoken: outcome.timetoken, at: dedupClock()) }
        guard case .repeated = outcome else { return HubPublishResult(timetoken: outcome.timetoken, isRepeat: false) }
        metrics.recordDedupHit()
        return HubPublishResult(timetoken: outcome.timetoken, isRepeat: true)
    }

    /// Cluster mode: delivers events the shared log committed (every node's), in timetoken
    /// order, and moves the visible cursor up to the log's horizon.
    package func ingest(_ events: [BufferedEvent], through horizon: Timetoken) {
        let now = clock()
        let (woken, reached) = state.withLock { s in
            let woken = s.core.ingest(events, through: horizon, now: now)
            let visible = s.core.visibleThrough
            let reached = s.visibilityWaiters.filter { $0.1 <= visible }.map(\.2)
            s.visibilityWaiters.removeAll { $0.1 <= visible }
            return (woken, reached)
        }
        wake(woken, reason: .event)
        for continuation in reached { continuation.resume() }
    }

    /// Cluster mode: returns once this node's visible cursor has reached `timetoken` (its
    /// reader has taken everything up to it), or after `limit` — a reader held up by an
    /// unreachable database does not hold the request forever.
    package func waitUntilVisible(_ timetoken: Timetoken, limit: Duration = .seconds(5)) async {
        guard shared != nil else { return }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let id: UInt64? = state.withLock { s in
                if s.core.visibleThrough >= timetoken { return nil }
                s.nextWatcherID += 1
                s.visibilityWaiters.append((s.nextWatcherID, timetoken, continuation))
                return s.nextWatcherID
            }
            guard let id else { return continuation.resume() }
            Task { [weak self] in
                try? await Task.sleep(for: limit)
                let late = self?.state.withLock { s -> CheckedContinuation<Void, Never>? in
                    guard let index = s.visibilityWaiters.firstIndex(where: { $0.0 == id }) else { return nil }
                    return s.visibilityWaiters.remove(at: index).2
                }
                late?.resume()
            }
        }
    }

    /// Takes `key` for a new publish (`nil`), or returns the timetoken of the publish that holds
    /// it, waiting for that publish's outcome when it is still in flight.
    private func claim(_ key: DedupKey) async -> Timetoken? {
        switch dedup.withLock({ $0.claim(key, now: dedupClock()) }) {
        case .fresh: return nil
        case .repeated(let timetoken): return timetoken
        case .inFlight: break
        }
        while true {
            let wake = await withCheckedContinuation { (continuation: CheckedContinuation<DedupWake, Never>) in
                let now = dedupClock()
                switch dedup.withLock({ $0.wait(key, continuation, now: now) }) {
                case .inFlight: break  // resumed by `settle` or `release`
                case .fresh: continuation.resume(returning: .claimed)
                case .repeated(let timetoken): continuation.resume(returning: .repeated(timetoken))
                }
            }
            switch wake {
            case .repeated(let timetoken): return timetoken
            case .claimed: return nil
            case .released: continue
            }
        }
    }

    private func settle(_ key: DedupKey, timetoken: Timetoken, at: Timetoken) {
        let waiters = dedup.withLock { $0.settle(key, timetoken: timetoken, now: at) }
        for waiter in waiters { waiter.resume(returning: .repeated(timetoken)) }
    }

    private func release(_ key: DedupKey) {
        let waiters = dedup.withLock { $0.release(key) }
        for waiter in waiters { waiter.resume(returning: .released) }
    }

    /// Forgets remembered publishes whose window has passed; returns how many are remembered
    /// and how many the bound forgot early since the last sweep.
    package func sweepDeduplication() -> (entries: Int, evicted: Int) {
        let now = dedupClock()
        return dedup.withLock { index in
            index.expire(now: now)
            return (index.rememberedCount, index.takeEvictionCount())
        }
    }

    /// Publishes remembered, keys in flight and repeats waiting for them (for tests and tools).
    package var deduplicationCounts: (remembered: Int, inFlight: Int, waiting: Int) {
        dedup.withLock { ($0.rememberedCount, $0.inFlightCount, $0.waiterCount) }
    }

    /// Records of remembered publishes created at or before this are past the window and may be
    /// deleted from the store (everything, when deduplication is off).
    package var publishRecordHorizon: Timetoken { Self.horizon(dedupClock(), deduplication) }

    /// Commits a reserved event into its window and wakes the long-polls it reaches.
    private func commit(_ event: BufferedEvent) {
        let now = sequencingNow()  // the clock events are numbered by also ages the windows
        let woken = state.withLock { $0.core.commit(event, now: now) }
        wake(woken, reason: .event)
    }

    /// Publishes an event that follows a write of its own (a message action): reserves the
    /// event's timetoken, runs `write` with it and the action store to write in, then delivers
    /// the event — never stored as a message — when `write` says so; otherwise, or when `write`
    /// throws, the reservation is abandoned and nothing is delivered. Returns the timetoken and
    /// what `write` returned. In a cluster the shared log numbers the event and `write` runs in
    /// the same transaction (``SharedLog/appendAfterWrite(_:write:)``): the action's timetoken
    /// is its event's, unique across nodes, and both commit or neither.
    package func publishAfterWrite<Outcome: Sendable>(
        _ makeEnvelope: (Timetoken) -> SubscribeEnvelope,
        write: (Timetoken, any MessageActionStoring) async throws -> (deliver: Bool, outcome: Outcome)
    ) async throws -> (timetoken: Timetoken, outcome: Outcome) {
        if let shared { return try await shared.appendAfterWrite(makeEnvelope, write: write) }
        let now = sequencingNow()
        let probe = makeEnvelope(.zero)
        let key = ChannelKey(subscribeKey: probe.subscribeKey, channel: probe.channel)
        let timetoken = state.withLock { $0.core.reserve(key, now: now) }
        let result: (deliver: Bool, outcome: Outcome)
        do {
            result = try await write(timetoken, store)
        } catch {
            wake(state.withLock { $0.core.abandon(timetoken) }, reason: .event)
            throw error
        }
        if result.deliver {
            commit(BufferedEvent(envelope: makeEnvelope(timetoken), isStored: false))
        } else {
            wake(state.withLock { $0.core.abandon(timetoken) }, reason: .event)
        }
        return (timetoken, result.outcome)
    }

    /// Publishes an event that is never stored (presence events): reserved, committed and
    /// delivered at once.
    @discardableResult
    package func publishEphemeral(_ makeEnvelope: (Timetoken) -> SubscribeEnvelope) -> Timetoken {
        if let shared {
            // Through the log, so every node's subscribers get it; not awaited (presence and
            // App Context events are never acknowledged to anyone).
            let envelope = makeEnvelope(.zero)
            let logger = logger
            Task {
                do {
                    _ = try await shared.append(SharedEvent(envelope: envelope, isStored: false, retentionHours: nil, dedupKey: nil))
                } catch {
                    logger.warning("event not written to the shared log", metadata: ["channel": "\(envelope.channel)", "error": "\(error)"])
                }
            }
            return currentCursor
        }
        let now = sequencingNow()
        let probe = makeEnvelope(.zero)
        let key = ChannelKey(subscribeKey: probe.subscribeKey, channel: probe.channel)
        let timetoken = state.withLock { $0.core.reserve(key, now: now) }
        let event = BufferedEvent(envelope: makeEnvelope(timetoken), isStored: false)
        let woken = state.withLock { $0.core.commit(event, now: now) }
        wake(woken, reason: .event)
        return timetoken
    }

    /// Replaces the channels of a channel group in the delivery index.
    public func setGroup(subscribeKey: String, group: String, channels: Set<String>) {
        state.withLock { $0.core.setGroup(subscribeKey: subscribeKey, group: group, channels: channels) }
    }

    /// The channels of a channel group.
    public func channels(subscribeKey: String, group: String) -> Set<String> {
        state.withLock { $0.core.channels(subscribeKey: subscribeKey, group: group) }
    }

    /// Number of channel groups in a keyset (as this node has them).
    public func groupCount(subscribeKey: String) -> Int {
        state.withLock { $0.core.groupCount(subscribeKey: subscribeKey) }
    }

    /// Serves a subscribe continuation from cursor `after`: returns at once when events are
    /// available (from memory or the store, at most `limit`), otherwise waits until one
    /// arrives, `timeout` passes, the server shuts down, or the client disconnects (throws
    /// `CancellationError`). With `parking`, it does not wait: it parks the long-poll with
    /// `parking`'s callback and throws ``LongPollParked``, and the callback is called once
    /// with why the wait ended (the caller then serves the request again).
    package nonisolated(nonsending) func receive(
        _ spec: SubscriptionSpec, after: Timetoken, limit: Int, timeout: TimeAmount, channel: any Channel,
        access: AccessManager.Check? = nil, recheck: (@Sendable () -> AccessManager.Check)? = nil,
        filter: FilterExpression? = nil, parking: LongPollParking? = nil
    ) async throws -> SubscribePage {
        // The subscriber's filter: meta and payload parsed per event (a missing or unparsable
        // field makes its comparisons false, pubnub-wire §10).
        let include: ((JSONValue?, JSONValue?) -> Bool)? = filter.map { expression in
            { meta, data in expression.matches(meta: meta, data: data) }
        }
        let responseDeadline = NIODeadline.now() + timeout
        var validUntil = access?.validUntil
        func waitDeadline() -> NIODeadline {
            guard let validUntil else { return responseDeadline }
            // Both are non-negative, so the difference cannot overflow; the product is clamped.
            let remaining = min(max(0, validUntil.storageValue - clock().storageValue), Int64.max / 200)
            return min(responseDeadline, NIODeadline.now() + .nanoseconds(remaining * 100))
        }
        let deadline = responseDeadline
        var after = after
        var gaps: [RetentionGap] = []
        // Set when the long-poll must answer now (timeout, shutdown): one last read, whose plan
        // gives a cursor consistent with what it read. (Answering with the hub's current cursor
        // instead could step over an event committed between the wake-up and the answer.)
        var finishing = false
        while true {
            enum Step { case read(ReadPlan), wait(WaiterID) }
            let step: Step = state.withLock { s in
                let plan = s.core.plan(spec, after: after, now: clock())
                if !plan.isEmpty || s.waiters.isShuttingDown || finishing { return .read(plan) }
                let id = s.core.register(spec)
                s.waiters.registered(id)
                return .wait(id)
            }
            switch step {
            case .read(let plan):
                var results: [StoreRangeResult] = []
                for range in plan.storeRanges {
                    results.append(try await messages.read(range, limit: limit))
                }
                // On every pass that read the store or met a window's loss (presence channels
                // never read the store), and after the reads: a prune that committed before a
                // read is seen, whichever pass it fell in.
                if !plan.storeRanges.isEmpty || !plan.windowGaps.isEmpty {
                    gaps = try await addingGaps(to: gaps, spec: spec, plan: plan, after: after)
                }
                let (cursor, envelopes) = plan.merge(storeResults: results, limit: limit, include: include)
                let shuttingDown = state.withLock { $0.waiters.isShuttingDown }
                if envelopes.isEmpty, !shuttingDown, !finishing, NIODeadline.now() < deadline {
                    after = cursor  // the store had nothing newer: wait from here
                    continue
                }
                metrics.recordDeliveries(envelopes.count)
                return SubscribePage(cursor: envelopes.isEmpty ? max(after, cursor) : cursor, envelopes: envelopes, gaps: gaps)
            case .wait(let id):
                // (Retention gaps found on the way are only reported by this run: it waits.)
                if let parking, gaps.isEmpty {
                    // Parked without a task: the caller's task ends here, and `parking`
                    // answers the request again when the wait ends, from this cursor.
                    parking.parked(ParkedWait(id: id), after)
                    park(id, deadline: waitDeadline(), channel: channel, parking: parking)
                    throw LongPollParked()
                }
                let reason = await wait(id, deadline: waitDeadline(), channel: channel)
                if reason == .accessChanged || (reason == .timeout && NIODeadline.now() < responseDeadline), let recheck {
                    let check = recheck()
                    if case .denied = check.decision { throw AccessDeniedError(check: check) }
                    validUntil = check.validUntil
                    continue
                }
                switch reason {
                case .event, .accessChanged:
                    continue
                case .timeout, .shutdown:
                    finishing = true
                    continue
                case .clientGone:
                    throw CancellationError()
                }
            }
        }
    }

    /// `gaps` with the retention gaps a read of `plan` from `after` met and the plan's window
    /// gaps: on the subscription's channels, the channels the plan read from the store (a
    /// group's members among them) and its wildcards' prefixes. One gap per channel, reaching
    /// the furthest `through` any source reported.
    private func addingGaps(to gaps: [RetentionGap], spec: SubscriptionSpec, plan: ReadPlan, after: Timetoken) async throws
        -> [RetentionGap]
    {
        // A set beside the list: a group can bring thousands of channels, each looked up once.
        var channels = spec.channels
        var seen = Set(channels)
        for range in plan.storeRanges {
            if case .channel(let channel) = range.selector, seen.insert(channel).inserted { channels.append(channel) }
        }
        let prefixes = spec.wildcards.map(WildcardPattern.prefix(of:))
        var found = try await messages.retentionGaps(subscribeKey: spec.subscribeKey, channels: channels, prefixes: prefixes,
                                                     after: after)
        if let shared {
            found = shared.addingUnseenEventGaps(to: found, channels: channels, prefixes: prefixes, after: after)
        }
        found += plan.windowGaps.map { RetentionGap(channel: $0.channel, from: after, through: $0.through) }
        var merged = gaps
        var index: [String: Int] = [:]
        for (position, gap) in merged.enumerated() where index[gap.channel] == nil { index[gap.channel] = position }
        for gap in found {
            if let position = index[gap.channel] {
                let known = merged[position]
                merged[position] = RetentionGap(channel: gap.channel, from: min(known.from, gap.from),
                                                through: max(known.through, gap.through))
            } else {
                index[gap.channel] = merged.count
                merged.append(gap)
            }
        }
        return merged
    }

    /// Watches `channel`'s closing (once per connection): a waiter parked on it is woken as
    /// `clientGone` when it closes.
    private func watchClose(_ channel: any Channel) {
        let connection = ObjectIdentifier(channel)
        switch state.withLock({ $0.waiters.watch(connection) }) {
        case .observeClose:
            channel.closeFuture.whenComplete { [weak self] _ in
                guard let self else { return }
                if let id = self.state.withLock({ $0.waiters.connectionClosed(connection) }) {
                    self.wake([id], reason: .clientGone)
                }
            }
        case .none:
            break
        }
    }

    /// Parks a registered waiter with a callback instead of a task's continuation: what it
    /// holds while it waits is this small record, its timer and its registration.
    private func park(_ id: WaiterID, deadline: NIODeadline, channel: any Channel, parking: LongPollParking) {
        watchClose(channel)
        metrics.longPollStarted()
        let metrics = metrics
        let wake: @Sendable (WakeReason) -> Void = { reason in
            metrics.longPollEnded()
            parking.wake(reason)
        }
        let (action, reached, arming) = state.withLock { s in
            let action = s.waiters.park(id, Parked(resume: .callback(wake)), connection: ObjectIdentifier(channel),
                                        connectionIsOpen: channel.isActive, deadline: deadline, now: .now())
            if case .resume(_, unregister: true) = action { s.core.unregister(id) }
            return (action, s.reachedCounts(), s.armingDeadlineTimer())
        }
        for watcher in reached { watcher.resume() }
        if let arming { armDeadlineTimer(arming, on: channel.eventLoop) }
        if case .resume(let reason, _) = action { wake(reason) }
    }

    /// Ends a parked wait (or one about to park) as if its client had gone: its `wake` is
    /// called with `.clientGone` (at once, or when it parks), and it leaves the hub's index.
    /// Nothing happens for a wait already woken.
    package func cancelParked(_ wait: ParkedWait) {
        wake([wait.id], reason: .clientGone)
    }

    private func wait(_ id: WaiterID, deadline: NIODeadline, channel: any Channel) async -> WakeReason {
        let connection = ObjectIdentifier(channel)
        watchClose(channel)
        metrics.longPollStarted()
        defer { metrics.longPollEnded() }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<WakeReason, Never>) in
                let parked = Parked(resume: .task(continuation))
                let (action, reached, arming) = state.withLock { s in
                    let action = s.waiters.park(id, parked, connection: connection, connectionIsOpen: channel.isActive,
                                                deadline: deadline, now: .now())
                    if case .resume(_, unregister: true) = action { s.core.unregister(id) }
                    return (action, s.reachedCounts(), s.armingDeadlineTimer())
                }
                for watcher in reached { watcher.resume() }
                if let arming { armDeadlineTimer(arming, on: channel.eventLoop) }
                if case .resume(let reason, _) = action { continuation.resume(returning: reason) }
            }
        } onCancel: {
            self.wake([id], reason: .clientGone)
        }
    }

    private func wake(_ ids: [WaiterID], reason: WakeReason) {
        guard !ids.isEmpty else { return }
        let (resumed, reached) = state.withLock { s in
            for id in ids { s.core.unregister(id) }
            let resumed = s.waiters.wake(ids, reason: reason)
            return (resumed, s.reachedCounts())
        }
        for parked in resumed { parked.wake(reason) }
        for watcher in reached { watcher.resume() }
    }

    /// Arms the hub's one deadline timer as ``State/armingDeadlineTimer()`` decided (with the
    /// lock released): one scheduled task for every waiter, instead of one per waiter that each
    /// wake-up had to cancel (a search of the loop's whole timer heap).
    private func armDeadlineTimer(_ arming: State.Arming, on loop: any EventLoop) {
        arming.replaced?.cancel()
        let generation = arming.generation
        let timer = loop.scheduleTask(deadline: arming.deadline) { [weak self] () -> Void in
            guard let self else { return }
            self.deadlineTimerFired(generation, loop: loop)
        }
        let superseded = state.withLock { s -> Bool in
            guard s.deadlineTimerGeneration == generation else { return true }
            s.deadlineTimer = timer
            return false
        }
        if superseded { timer.cancel() }
    }

    /// The deadline timer fired: the waiters due are answered (`.timeout`), and the timer is
    /// armed for the next deadline.
    private func deadlineTimerFired(_ generation: UInt64, loop: any EventLoop) {
        let due = state.withLock { s -> [WaiterID]? in
            guard s.deadlineTimerGeneration == generation else { return nil }
            s.deadlineTimerAt = nil
            s.deadlineTimer = nil
            return s.waiters.expired(now: .now())
        }
        guard let due else { return }
        wake(due, reason: .timeout)
        if let arming = state.withLock({ $0.armingDeadlineTimer() }) { armDeadlineTimer(arming, on: loop) }
    }

    /// Wakes every waiting long-poll to re-check its access (a grant changed or a token was
    /// revoked); those still allowed wait again.
    public func recheckAccess() {
        let ids = state.withLock { $0.waiters.parkedWaiters }
        wake(ids, reason: .accessChanged)
    }

    /// Whether graceful shutdown started (responses then close their connection).
    package var isShuttingDown: Bool { shuttingDown.load(ordering: .acquiring) }
    /// Read by every response (an atomic load, not a lock).
    private let shuttingDown = Atomic<Bool>(false)

    /// Answers every waiting long-poll (empty page, current cursor) and makes new ones answer
    /// at once. Called when graceful shutdown starts.
    public func shutdown() {
        let ids = state.withLock { $0.waiters.shutdown() }
        shuttingDown.store(true, ordering: .releasing)
        logger.info("answering waiting long-polls for shutdown", metadata: ["count": "\(ids.count)"])
        wake(ids, reason: .shutdown)
    }

    /// The console's view of the in-memory windows (``DeliveryHub/windowSummaries(matching:since:last:)``).
    package func windowSummaries(matching matches: (String, String) -> Bool, since: Timetoken, last: Int)
        -> [(subscribeKey: String, channel: String, held: Int, recent: Int, newest: [SubscribeEnvelope])] {
        state.withLock { $0.core.windowSummaries(matching: matches, since: since, last: last) }
    }

    /// Drops expired in-memory events and empty windows; returns what the windows hold after it.
    @discardableResult
    public func sweep() -> (bytes: Int, windows: Int) {
        let now = sequencingNow()
        return state.withLock { s in
            s.core.sweep(now: now)
            return (s.core.bufferedBytes, s.core.bufferedChannelCount)
        }
    }
}

/// What a publish through ``LongPollHub/publish(_:store:dedupKey:)`` came to.
/// How a long-poll waits without a task (the hot path's subscribe, a WebSocket session's
/// deliveries): `wake` is called once, on any thread, with why its wait ended.
package struct LongPollParking: Sendable {
    /// Told, just before it parks, the handle that ends the wait early
    /// (``LongPollHub/cancelParked(_:)``) and the cursor the long-poll has read up to (the next
    /// read goes on after it).
    let parked: @Sendable (ParkedWait, Timetoken) -> Void
    let wake: @Sendable (WakeReason) -> Void

    package init(parked: @escaping @Sendable (ParkedWait, Timetoken) -> Void, wake: @escaping @Sendable (WakeReason) -> Void) {
        self.parked = parked
        self.wake = wake
    }
}

/// A wait parked with a ``LongPollParking``, to end it early (``LongPollHub/cancelParked(_:)``).
package struct ParkedWait: Sendable {
    let id: WaiterID
}

/// Thrown by ``LongPollHub/receive(_:after:limit:timeout:channel:access:recheck:filter:parking:)``
/// when it parked the long-poll with its `parking` callback instead of waiting.
package struct LongPollParked: Error {}

package struct HubPublishResult: Sendable, Equatable {
    /// The event's timetoken (the original one for a repeat).
    package var timetoken: Timetoken
    /// The request id was published before, within the window: nothing was stored or
    /// delivered this time.
    package var isRepeat: Bool
}

/// A waiting long-poll lost its access (grant expired or revoked, token revoked).
public struct AccessDeniedError: Error {
    /// The failed check.
    public var check: AccessManager.Check
}
