import Logging
import Synchronization
@_spi(Benchmarks) import TetherProtocol
public import TetherServerCore

/// The presence shell: a mutex around ``PresenceTracker``, group resolution, event publishing
/// through the ``LongPollHub`` (so presence events follow the same cursor rule as messages), the
/// timeout loop on an injected `ElapsedClock`, and the presence journal that keeps the store's
/// membership records in step with the tracker.
///
/// **Durability.** A join, leave, timeout-change or state-change made by a request is written to
/// the store (group-committed with other presence changes) before the request is answered, so
/// an occupant a client was told about survives a crash and one that left does not come back.
/// Timeouts found by the timeout loop are written at once but not waited for. Heartbeats that
/// only move a deadline write nothing.
public final class PresenceService: Sendable {
    /// What the tracker lock guards: the tracker and the requests waiting for their changes to
    /// be durable.
    private struct Locked: Sendable {
        var tracker: PresenceTracker
        var flushWaiters: [FlushWaiter] = []
        var nextWaiterID: UInt64 = 0
        /// Refused joins already reported, and when the last warning was logged.
        var refusedJoinsReported = 0
        var lastRefusalWarning: ContinuousClock.Instant?
        var journal: JournalState = .notStarted
        /// Whether the journal is writing changes it took from the tracker.
        var saving = false
        /// Whether a task answers the waiters whose deadline passes (``expireFlushWaiters()``).
        var expiring = false
    }

    /// A request waiting for its presence changes to be durable.
    private struct FlushWaiter: Sendable {
        var id: UInt64
        /// When the request stops waiting (the store's write timeout after its change).
        var deadline: ContinuousClock.Instant
        var continuation: CheckedContinuation<Void, Never>
    }

    /// Can transition to: `.running` from `.notStarted`; `.finished` from either.
    private enum JournalState: Sendable {
        /// Changes queue up (the doorbell keeps one ring) until the journal starts.
        case notStarted
        case running
        /// Requests no longer wait for durability (the server is stopping).
        case finished
    }

    private let locked: Mutex<Locked>
    private let hub: LongPollHub
    private let store: MessageStore
    private let clock: ElapsedClock
    private let logger: Logger
    private let doorbell: AsyncStream<Void>
    private let doorbellContinuation: AsyncStream<Void>.Continuation
    /// A cluster's presence (PostgreSQL is the truth; the tracker stays empty), or `nil`.
    let shared: SharedPresence?

    /// Creates the service and restores the memberships stored before the last stop or crash:
    /// each keeps its presence, silently, until `clock.now()` plus its timeout.
    ///
    /// In a cluster (`shared` set) memberships live in PostgreSQL (``SharedPresence``), with
    /// deadlines on `wallNow` (Unix milliseconds), and nothing is restored from the store.
    init(hub: LongPollHub, store: MessageStore, clock: ElapsedClock, logger: Logger,
                configurationBySubscribeKey: [String: PresenceConfiguration],
                maximumMemberships: Int = PresenceTracker.defaultMaximumMemberships,
                shared: SharedLog? = nil, wallNow: (@Sendable () -> Int64)? = nil) throws {
        var tracker = PresenceTracker(configurationBySubscribeKey: configurationBySubscribeKey, maximumMemberships: maximumMemberships)
        self.shared = shared.map { log in
            SharedPresence(log: log, now: wallNow ?? { Int64(LongPollHub.systemNow().storageValue / 10_000) },
                           configurations: configurationBySubscribeKey, cacheLimit: maximumMemberships)
        }
        let records = self.shared == nil ? try store.presenceRecords() : []
        tracker.restore(records, now: clock.now())
        if !records.isEmpty {
            logger.info("presence restored; occupants keep their presence if they heartbeat within their timeout",
                        metadata: ["memberships": "\(records.count)"])
        }
        self.locked = Mutex(Locked(tracker: tracker))
        self.hub = hub
        self.store = store
        self.clock = clock
        self.logger = logger
        (doorbell, doorbellContinuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        if tracker.hasUnsavedChanges { doorbellContinuation.yield() }
    }

    /// The presence configuration of a keyset.
    public func configuration(for subscribeKey: String) -> PresenceConfiguration {
        locked.withLock { $0.tracker.configuration(for: subscribeKey) }
    }

    /// Resolves channels and groups into the concrete channels presence applies to: presence
    /// names (`-pnpres`) and wildcards are ignored; groups expand to their channels.
    public func concreteChannels(subscribeKey: String, channels: [String], groups: [String]) -> [String] {
        // One channel and no group (most subscribes): the request's own array, without the set
        // and the sorted copy (three allocations per subscribe).
        if groups.isEmpty, channels.count == 1 {
            return NameRules.isPresence(channels[0]) || NameRules.isWildcard(channels[0]) ? [] : channels
        }
        var result = Set(channels.filter { !NameRules.isPresence($0) && !NameRules.isWildcard($0) })
        for group in groups where !NameRules.isPresence(group) {
            result.formUnion(hub.channels(subscribeKey: subscribeKey, group: group))
        }
        return result.sorted()
    }

    /// What a heartbeat joined again right after `uuid` left explicitly, until `deadline`
    /// (``withdraw(_:)`` takes it back if the request turns out abandoned).
    public struct Joined: Sendable {
        let subscribeKey: String
        let uuid: String
        let channels: [String]
        let deadline: Duration
    }

    /// A heartbeat (or subscribe) of `uuid`; returns once a join or new timeout or state it
    /// caused is durable, with what it joined (nil when it joined nothing, or in a cluster).
    @discardableResult
    public nonisolated(nonsending) func heartbeat(subscribeKey: String, uuid: String, channels: [String], groups: [String], timeoutSeconds: Int?,
                          states: [String: String] = [:]) async -> Joined? {
        let concrete = concreteChannels(subscribeKey: subscribeKey, channels: channels, groups: groups)
        guard !concrete.isEmpty else { return nil }
        let states = statesByChannel(states, subscribeKey: subscribeKey, groups: groups)
        if let shared {
            let timeout = configuration(for: subscribeKey).timeout(requestedSeconds: timeoutSeconds)
            await report("heartbeat") {
                try await shared.heartbeat(subscribeKey: subscribeKey, uuid: uuid, channels: concrete, timeout: timeout, states: states)
            }
            return nil
        }
        let now = clock.now()
        var joined: Joined?
        await durableTransition { tracker in
            let timeout = tracker.configuration(for: subscribeKey).timeout(requestedSeconds: timeoutSeconds)
            var channels: [String] = []
            let events = tracker.heartbeat(subscribeKey: subscribeKey, uuid: uuid, channels: concrete, timeout: timeout, states: states,
                                           now: now, rejoined: &channels)
            if !channels.isEmpty {
                joined = Joined(subscribeKey: subscribeKey, uuid: uuid, channels: channels, deadline: now + timeout)
            }
            return events
        }
        warnIfJoinsWereRefused()
        return joined
    }

    /// State keyed by a group of the request applies to each of the group's channels (a
    /// channel's own key wins).
    private func statesByChannel(_ states: [String: String], subscribeKey: String, groups: [String]) -> [String: String] {
        guard !states.isEmpty, !groups.isEmpty else { return states }
        var result = states
        for group in groups {
            guard let state = states[group] else { continue }
            for channel in hub.channels(subscribeKey: subscribeKey, group: group) where states[channel] == nil {
                result[channel] = state
            }
        }
        return result
    }

    /// Takes back what a subscribe's heartbeat joined when its client abandoned it before it was
    /// served (its connection already closed): an SDK cancels its long-poll and sends the leave
    /// on another connection, and a long-poll that reached the server after that leave joined the
    /// uuid again until the presence timeout. Only joins nothing has extended since are taken
    /// back (a `leave` each), and returns once that is durable.
    public func withdraw(_ joined: Joined) async {
        let now = clock.now()
        await durableTransition {
            $0.withdraw(subscribeKey: joined.subscribeKey, uuid: joined.uuid, channels: joined.channels, joinedUntil: joined.deadline,
                        now: now)
        }
    }

    /// At most once a minute: a warning that `maxPresenceMemberships` is reached (an operator
    /// should raise it or find who creates so many memberships).
    private func warnIfJoinsWereRefused() {
        let report: (refused: Int, held: Int, limit: Int)? = locked.withLock { locked in
            let refused = locked.tracker.refusedJoins
            guard refused > locked.refusedJoinsReported else { return nil }
            if let last = locked.lastRefusalWarning, ContinuousClock.now - last < .seconds(60) { return nil }
            defer {
                locked.refusedJoinsReported = refused
                locked.lastRefusalWarning = .now
            }
            return (refused - locked.refusedJoinsReported, locked.tracker.membershipCount, locked.tracker.maximumMemberships)
        }
        guard let report else { return }
        logger.warning("presence memberships at their limit; new joins are not recorded (raise maxPresenceMemberships?)",
                       metadata: ["refused": "\(report.refused)", "memberships": "\(report.held)", "limit": "\(report.limit)"])
    }

    /// The presence clock's reading, for ``refresh(subscribeKey:uuid:channels:groups:timeoutSeconds:heartbeatAt:)``.
    public func now() -> Duration { clock.now() }

    /// How long after its own heartbeat a long-poll's end extends nothing: a refresh sooner would
    /// move the timeouts the heartbeat set by less than this (a twentieth of the shortest timeout
    /// a keyset may set, one second).
    static let refreshAfterHeartbeat = Duration.milliseconds(50)

    /// Extends `uuid`'s presence where it still is (the end of a long-poll); never joins.
    ///
    /// - Parameter heartbeatAt: when the same long-poll heartbeated (``now()`` before its
    ///   ``heartbeat(subscribeKey:uuid:channels:groups:timeoutSeconds:states:)``), if it did. Less
    ///   than ``refreshAfterHeartbeat`` later the refresh does nothing: a long-poll answered at
    ///   once would otherwise take the tracker's lock (in a cluster, a round trip to the database)
    ///   a second time for the same timeouts.
    public nonisolated(nonsending) func refresh(subscribeKey: String, uuid: String, channels: [String], groups: [String], timeoutSeconds: Int?,
                        heartbeatAt: Duration? = nil) async {
        if let heartbeatAt, clock.now() - heartbeatAt < Self.refreshAfterHeartbeat { return }
        let concrete = concreteChannels(subscribeKey: subscribeKey, channels: channels, groups: groups)
        guard !concrete.isEmpty else { return }
        if let shared {
            let timeout = configuration(for: subscribeKey).timeout(requestedSeconds: timeoutSeconds)
            await report("refresh") { try await shared.refresh(subscribeKey: subscribeKey, uuid: uuid, channels: concrete, timeout: timeout) }
            return
        }
        let now = clock.now()
        await durableTransition { tracker in
            let timeout = tracker.configuration(for: subscribeKey).timeout(requestedSeconds: timeoutSeconds)
            tracker.refresh(subscribeKey: subscribeKey, uuid: uuid, channels: concrete, timeout: timeout, now: now)
            return []
        }
    }

    /// An explicit leave; returns once it is durable (a restart never brings the uuid back).
    public func leave(subscribeKey: String, uuid: String, channels: [String], groups: [String]) async {
        let concrete = concreteChannels(subscribeKey: subscribeKey, channels: channels, groups: groups)
        if let shared {
            await report("leave") { try await shared.leave(subscribeKey: subscribeKey, uuid: uuid, channels: concrete) }
            return
        }
        let now = clock.now()
        await durableTransition { $0.leave(subscribeKey: subscribeKey, uuid: uuid, channels: concrete, now: now) }
    }

    /// Sets state; returns the channels it applied to, once the state is durable.
    ///
    /// - Throws: ``StoreError`` in a cluster when PostgreSQL does not take the state (unreachable,
    ///   or refusing the write). Unlike a heartbeat, setting state is a write the client asked
    ///   for and is answered with: its request must not be told OK for state that was not kept.
    @discardableResult
    public func setState(subscribeKey: String, uuid: String, channels: [String], groups: [String], state: String) async throws
        -> [String]
    {
        let concrete = concreteChannels(subscribeKey: subscribeKey, channels: channels, groups: groups)
        if let shared {
            try await shared.setState(subscribeKey: subscribeKey, uuid: uuid, channels: concrete, state: state)
            return concrete
        }
        await durableTransition { $0.setState(subscribeKey: subscribeKey, uuid: uuid, channels: concrete, state: state) }
        return concrete
    }

    /// Reads the tracker (this node's presence; empty in a cluster, where the reads below
    /// answer from PostgreSQL).
    public func read<T>(_ body: (borrowing PresenceTracker) -> T) -> T {
        locked.withLock { body($0.tracker) }
    }

    /// Here-now's data: the occupancy of each of `channels` that has occupants, with the sorted
    /// occupants and their states when `includeUUIDs`.
    ///
    /// - Throws: ``StoreError`` in a cluster when PostgreSQL cannot answer.
    package func hereNow(subscribeKey: String, channels: [String], includeUUIDs: Bool) async throws
        -> [String: (occupancy: Int, occupants: [(uuid: String, state: String?)])]
    {
        var result: [String: (occupancy: Int, occupants: [(uuid: String, state: String?)])] = [:]
        if let shared {
            if includeUUIDs {
                for (channel, occupants) in try await shared.occupants(subscribeKey: subscribeKey, channels: channels) {
                    result[channel] = (occupants.count, occupants)
                }
            } else {
                for (channel, count) in try await shared.occupancies(subscribeKey: subscribeKey, channels: channels) {
                    result[channel] = (count, [])
                }
            }
            return result
        }
        locked.withLock { locked in
            for channel in channels {
                if includeUUIDs {
                    let occupants = locked.tracker.occupants(subscribeKey: subscribeKey, channel: channel)
                    if !occupants.isEmpty { result[channel] = (occupants.count, occupants) }
                } else {
                    let count = locked.tracker.occupancy(subscribeKey: subscribeKey, channel: channel)
                    if count > 0 { result[channel] = (count, []) }
                }
            }
        }
        return result
    }

    /// Every channel of a keyset with at least one occupant, sorted (every node's, in a cluster).
    package func occupiedChannels(subscribeKey: String) async throws -> [String] {
        if let shared { return try await shared.occupiedChannels(subscribeKey: subscribeKey) }
        return read { $0.occupiedChannels(subscribeKey: subscribeKey) }
    }

    /// The channels `uuid` is present on, sorted (where-now; on any node, in a cluster).
    package func whereNow(subscribeKey: String, uuid: String) async throws -> [String] {
        if let shared { return try await shared.channels(subscribeKey: subscribeKey, uuid: uuid) }
        return read { $0.channels(subscribeKey: subscribeKey, uuid: uuid) }
    }

    /// `uuid`'s state on each of `channels` where it has one.
    package func states(subscribeKey: String, uuid: String, channels: [String]) async throws -> [String: String] {
        if let shared { return try await shared.states(subscribeKey: subscribeKey, uuid: uuid, channels: channels) }
        return read { tracker in
            var result: [String: String] = [:]
            for channel in channels {
                if let state = tracker.state(subscribeKey: subscribeKey, uuid: uuid, channel: channel) { result[channel] = state }
            }
            return result
        }
    }

    /// Cluster mode: notes presence events delivered from the log (a leave or timeout on any
    /// node), so this node's next heartbeat of that membership writes again.
    package func observe(_ events: [BufferedEvent]) {
        shared?.observe(events)
    }

    /// Runs a cluster heartbeat, refresh or leave; a failure is logged, not thrown: presence is
    /// realtime traffic, the request it rides on is still answered, and what is lost mends
    /// itself (the next heartbeat joins again, a membership not left times out). PostgreSQL
    /// unreachable is a `warning` (`/health` says so too); PostgreSQL refusing the write is an
    /// `error`, since it will not mend by waiting.
    private func report(_ what: String, _ body: () async throws -> Void) async {
        do {
            try await body()
        } catch {
            let classified = SharedLog.classify(error)
            let metadata: Logger.Metadata = ["change": "\(what)", "error": "\(classified)", "code": "\(classified.code)"]
            if classified.code == .unavailable {
                logger.warning("presence change not written to the shared database", metadata: metadata)
            } else {
                logger.error("presence change not written to the shared database", metadata: metadata)
            }
        }
    }

    /// Runs the timeout loop and the presence journal until cancelled, then writes the changes
    /// still unsaved.
    public func run() async {
        if let shared {
            await runSweeps(shared)
            return
        }
        locked.withLock { locked in
            if case .notStarted = locked.journal { locked.journal = .running }
        }
        await withDiscardingTaskGroup { group in
            group.addTask { await self.runJournal() }
            await self.runTimeouts()
            group.cancelAll()
        }
        let (changes, waiters) = locked.withLock { locked in
            locked.journal = .finished
            let waiters = locked.flushWaiters
            locked.flushWaiters = []
            return (locked.tracker.takeUnsavedChanges(), waiters)
        }
        if !changes.isEmpty {
            do {
                try store.savePresenceNow(changes)
            } catch {
                logger.error("presence changes not saved at shutdown", metadata: ["error": "\(error)", "changes": "\(changes.count)"])
            }
        }
        for waiter in waiters { waiter.continuation.resume() }
    }

    /// Cluster mode: sweeps expired memberships once a second of the server's clock (every node
    /// does; each expired row is taken by one of them), at once again while a sweep was full.
    private func runSweeps(_ shared: SharedPresence) async {
        while !Task.isCancelled {
            do {
                try await clock.sleep(.seconds(1))
            } catch {
                return
            }
            do {
                while try await shared.sweep(limit: 1000) == 1000, !Task.isCancelled {}
            } catch {
                logger.warning("presence timeouts not swept; retrying", metadata: ["error": "\(error)"])
            }
        }
    }

    /// Cluster mode: one sweep now, at the clock's current time (tests drive it after moving a
    /// manual clock, whose intermediate wake-ups the loop may have taken); the memberships it
    /// timed out.
    package func sweepNow() async throws -> Int {
        guard let shared else { return 0 }
        return try await shared.sweep(limit: 1000)
    }

    /// Sleeps until the next deadline, at most one second at a time, so a timeout fires at its
    /// deadline and an idle server wakes once a second.
    private func runTimeouts() async {
        while !Task.isCancelled {
            let now = clock.now()
            let next = locked.withLock { $0.tracker.nextWakeUp }
            var wait = Duration.seconds(1)
            if let next { wait = max(.zero, min(wait, next - now)) }
            do {
                try await clock.sleep(wait)
            } catch {
                return
            }
            let tickTime = clock.now()
            let ring = locked.withLock { locked in
                // In slices: a mass timeout (thousands of uuids gone at once) releases the lock
                // between slices, so subscribes and heartbeats are not held up behind it.
                publish(locked.tracker.tick(now: tickTime, limit: 1_000))
                return locked.tracker.hasUnsavedChanges
            }
            if ring { doorbellContinuation.yield() }
        }
    }

    /// Writes unsaved changes in one transaction per ring, then answers the requests that waited
    /// for them.
    private func runJournal() async {
        for await _ in doorbell {
            // Waiters stay listed while the save runs, so one whose wait runs out (a stalled
            // store) can take itself out and be answered; whoever removes a waiter resumes it.
            let (changes, covered) = locked.withLock { locked in
                let changes = locked.tracker.takeUnsavedChanges()
                locked.saving = !changes.isEmpty
                return (changes, Set(locked.flushWaiters.map(\.id)))
            }
            defer {
                let waiters = locked.withLock { locked in
                    locked.saving = false
                    let done = locked.flushWaiters.filter { covered.contains($0.id) }
                    locked.flushWaiters.removeAll { covered.contains($0.id) }
                    return done
                }
                for waiter in waiters { waiter.continuation.resume() }
            }
            if !changes.isEmpty {
                do {
                    try await store.savePresence(changes)
                    logger.trace("presence saved", metadata: ["changes": "\(changes.count)"])
                } catch {
                    // Kept in memory and retried with the next change; requests are not failed
                    // for it, the tracker stays the truth while the server runs.
                    logger.error("presence changes not saved", metadata: ["error": "\(error)", "changes": "\(changes.count)"])
                    locked.withLock { $0.tracker.markUnsaved(changes) }
                }
            }
        }
    }

    /// Applies a tracker transition and publishes its events, then waits until the membership
    /// changes it made (if any) are durable — at most the store's write timeout: presence is
    /// realtime traffic and keeps flowing while the store is stalled or full (the change stays
    /// in memory and is saved when the store can write again).
    private nonisolated(nonsending) func durableTransition(_ body: (inout PresenceTracker) -> [PresenceEvent]) async {
        // Most transitions (a heartbeat that only moves a deadline) leave nothing to save: they
        // return here, without a waiter.
        let id: UInt64? = locked.withLock { locked in
            publish(body(&locked.tracker))
            guard locked.tracker.hasUnsavedChanges || locked.saving else { return nil }
            locked.nextWaiterID += 1
            return locked.nextWaiterID
        }
        guard let id else { return }
        // Wall time on purpose: this bounds an I/O wait, it is not presence logic.
        let deadline = ContinuousClock.now + store.options.writeTimeout
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            // Still unsaved, or taken by a save in progress: wait for the journal's next round
            // (rung below), which answers every waiter listed when it starts, or for the
            // deadline (``expireFlushWaiters()``).
            let (waits, startExpiry) = locked.withLock { locked in
                guard locked.tracker.hasUnsavedChanges || locked.saving else { return (false, false) }
                switch locked.journal {
                case .notStarted, .running:
                    locked.flushWaiters.append(FlushWaiter(id: id, deadline: deadline, continuation: continuation))
                    let start = !locked.expiring
                    locked.expiring = true
                    return (true, start)
                case .finished:
                    return (false, false)
                }
            }
            guard waits else { return continuation.resume() }
            doorbellContinuation.yield()
            if startExpiry { Task { await self.expireFlushWaiters() } }
        }
    }

    /// Answers the requests whose wait for durability ran out (a stalled store), while any
    /// wait: one task sleeping until the earliest deadline, instead of a timer per request
    /// (each join used to hold a sleeping task and its timer for the write timeout even when
    /// its change was saved a millisecond later).
    private func expireFlushWaiters() async {
        while true {
            let now = ContinuousClock.now
            let (expired, next) = locked.withLock { locked -> ([FlushWaiter], ContinuousClock.Instant?) in
                var expired: [FlushWaiter] = []
                var next: ContinuousClock.Instant?
                locked.flushWaiters.removeAll { waiter in
                    if waiter.deadline <= now {
                        expired.append(waiter)
                        return true
                    }
                    next = min(next ?? waiter.deadline, waiter.deadline)
                    return false
                }
                if next == nil { locked.expiring = false }
                return (expired, next)
            }
            for waiter in expired { waiter.continuation.resume() }
            guard let next else { return }
            try? await Task.sleep(until: next, clock: .continuous)
        }
    }

    /// Publishes events while the caller holds the tracker lock, so the events of one channel
    /// get timetokens in the order they happened.
    private func publish(_ events: [PresenceEvent]) {
        for event in events {
            let channel = event.channel.channel + NameRules.presenceSuffix
            hub.publishEphemeral { tt in
                SubscribeEnvelope(timetoken: tt, subscribeKey: event.channel.subscribeKey, channel: channel,
                                  payload: event.payload(timestamp: tt.unixSeconds))
            }
            logger.trace("presence event", metadata: ["channel": "\(event.channel)", "action": "\(event.action.name)",
                                                      "uuid": "\(event.uuid ?? "-")", "occupancy": "\(event.occupancy)"])
        }
    }
}
