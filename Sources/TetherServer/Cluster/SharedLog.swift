import Foundation
package import Logging
import NIOCore
import PostgresNIO
import Synchronization
@_spi(Benchmarks) package import TetherProtocol
@_spi(Benchmarks) package import TetherServerCore

/// One event for the shared log: everything but its timetoken, which the log assigns when it
/// commits (docs/operations.md, "One global cursor").
package struct SharedEvent: Sendable {
    /// The envelope; its timetoken is ignored.
    package var envelope: SubscribeEnvelope
    /// Whether history keeps it (stored publishes); other events stay in the log only long
    /// enough for every node to deliver them.
    package var isStored: Bool
    /// History retention in hours (stored events; `nil` or 0 keeps them forever).
    package var retentionHours: Double?
    /// The publish's request id, remembered so that a repeat — on any node — is answered with
    /// the original timetoken.
    package var dedupKey: DedupKey?
    /// A change to shared state: applied in the writing transaction, recorded as a control
    /// entry (the envelope is not delivered).
    package var change: SharedChange?

    package init(envelope: SubscribeEnvelope, isStored: Bool, retentionHours: Double?, dedupKey: DedupKey?) {
        self.envelope = envelope
        self.isStored = isStored
        self.retentionHours = retentionHours
        self.dedupKey = dedupKey
    }

    /// A change to shared state (``SharedLog/change(_:)``).
    init(change: SharedChange) {
        self.envelope = SubscribeEnvelope(timetoken: .zero, subscribeKey: "", channel: "", payload: "{}", publisher: nil)
        self.isStored = false
        self.change = change
    }
}

/// What the writer answers one write with.
struct SharedWriteResult: Sendable {
    var outcome: SharedAppendOutcome
    /// For a change: the control entry it recorded.
    var control: SharedControl?
}

/// What the shared log did with an event.
package enum SharedAppendOutcome: Sendable, Equatable {
    /// Committed at this timetoken.
    case appended(Timetoken)
    /// Its request id was already remembered (by any node): nothing new was written; this is
    /// the original's timetoken.
    case repeated(Timetoken)

    package var timetoken: Timetoken {
        switch self {
        case .appended(let timetoken), .repeated(let timetoken): timetoken
        }
    }
}

/// How the shared log behaves (`tether serve --database-url`, docs/operations.md).
package struct SharedLogOptions: Sendable {
    /// A publish not committed within this is answered with an error (as the embedded store's
    /// ``StoreOptions/writeTimeout``).
    package var writeTimeout: Duration = .seconds(5)
    /// Publishes waiting for the writer at most; beyond it they are refused at once.
    package var writeQueueLimit: Int = 4096
    /// How long events that history does not keep (store=0 publishes, signals, presence
    /// events) stay in the log for nodes to deliver.
    package var ephemeralSeconds: Double = 600
    /// The fallback read when no wake-up arrives: every node reads the log at least this often.
    package var pollInterval: Duration = .milliseconds(500)

    package init() {}
}

/// The log of every event of a cluster, in PostgreSQL: several `tether serve` nodes write
/// their publishes here and each reads every node's events back, in timetoken order, into its
/// own delivery hub.
///
/// **One global cursor.** Each writing transaction first locks the single sequencer row and
/// numbers its events above the row's value, then raises it and commits; the row lock is held
/// to the commit, so transactions commit in the order of their timetokens. A reader takes the
/// sequencer value `H` and the events up to `H` from one snapshot: every event at or below `H`
/// is then committed and visible, and no later commit can carry a timetoken at or below `H`.
/// A node's visible cursor never passes the `H` it read, so a subscriber that has seen `T`
/// never later misses an event at or below `T` committed on another node. (The argument in
/// full: docs/operations.md.)
///
/// **Wake-ups, not payloads.** A committing writer sends `NOTIFY tether_events` with an empty
/// payload; nodes `LISTEN` and read by cursor, and read every ``SharedLogOptions/pollInterval``
/// anyway, so a lost notification delays delivery by at most that.
package final class SharedLog: Sendable {
    private typealias Waiter = CheckedContinuation<SharedWriteResult, any Error>

    /// The notification channel of the wake-ups.
    static let wakeChannel = "tether_events"

    package let url: DatabaseURL
    package let options: SharedLogOptions
    let client: PostgresClient
    private let clientTask: Task<Void, Never>
    let logger: Logger
    let metrics: ServerMetrics
    let clock: @Sendable () -> Timetoken
    private let queue: Mutex<StoreWriteQueue<Waiter>>
    /// Writes queued and not yet taken by the writer (tests).
    var queuedWrites: Int { queue.withLock { $0.queuedCount } }
    private let doorbell: AsyncStream<Void>
    private let doorbellContinuation: AsyncStream<Void>.Continuation
    /// Wakes the reader: a notification, the poll timer, or a local commit.
    private let readerBell: AsyncStream<Void>
    let readerBellContinuation: AsyncStream<Void>.Continuation
    private let lastError = Mutex<(message: String, at: ContinuousClock.Instant)?>(nil)
    /// The sequencer value when the log was opened: this node's hub starts its cursor there.
    package let startHorizon: Timetoken
    /// Groups, grants and revocations as the tables held them just after ``startHorizon``
    /// was read; later changes arrive through the reader.
    package let startState: SharedState

    private init(url: DatabaseURL, options: SharedLogOptions, client: PostgresClient, clientTask: Task<Void, Never>,
                 logger: Logger, metrics: ServerMetrics, clock: @escaping @Sendable () -> Timetoken, startHorizon: Timetoken,
                 startState: SharedState) {
        self.startState = startState
        self.url = url
        self.options = options
        self.client = client
        self.clientTask = clientTask
        self.logger = logger
        self.metrics = metrics
        self.clock = clock
        self.startHorizon = startHorizon
        self.queue = Mutex(StoreWriteQueue(limit: options.writeQueueLimit))
        (doorbell, doorbellContinuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        (readerBell, readerBellContinuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    }

    /// Connects, creates or migrates the schema (safe from several nodes at once: one
    /// transaction under an advisory lock), and reads the starting horizon.
    ///
    /// - Throws: ``SharedLogError`` saying what failed: unreachable, refused, or a schema
    ///   newer than this build.
    package static func open(_ url: DatabaseURL, options: SharedLogOptions = .init(), logger: Logger, metrics: ServerMetrics,
                             clock: @escaping @Sendable () -> Timetoken = LongPollHub.systemNow) async throws -> SharedLog {
        var quiet = logger
        quiet.logLevel = max(logger.logLevel, .error)
        // One connection first: the pool retries a refused connection for as long as a lease
        // waits, where this fails at once with PostgreSQL's own reason (refused, no such
        // database, authentication failed).
        do {
            let probe = try await PostgresConnection.connect(configuration: url.connectionConfiguration(), id: 0, logger: quiet)
            try await probe.close()
        } catch {
            throw SharedLogError.unreachable(url, error)
        }
        let client = PostgresClient(configuration: url.clientConfiguration, backgroundLogger: quiet)
        let task = Task { await client.run() }
        do {
            try await SharedLogSchema.migrate(client, logger: logger, url: url)
            // Raised to the clock first (never lowered), so the first cursor this node hands out
            // is the time, not the last event's timetoken — or 0 on a new database.
            let horizon = try await client.query("""
                UPDATE tether_sequencer SET last_tt = GREATEST(last_tt, \(clock().storageValue)) WHERE id = 1 RETURNING last_tt
                """, logger: quiet).decode(Int64.self).first(where: { _ in true }) ?? 0
            // After the horizon: every change at or below it is in these tables.
            let state = try await loadSharedState(client: client, logger: quiet)
            return SharedLog(url: url, options: options, client: client, clientTask: task, logger: logger, metrics: metrics,
                             clock: clock, startHorizon: Timetoken(UInt64(max(0, horizon))), startState: state)
        } catch {
            task.cancel()
            if let error = error as? SharedLogError { throw error }
            throw SharedLogError.unreachable(url, error)
        }
    }

    /// Closes the connections (after ``finish()`` and the writer have drained).
    package func close() {
        clientTask.cancel()
    }

    // MARK: Writing

    /// Appends an event and returns once it is committed, with its timetoken — or, when its
    /// request id is already remembered, the original's.
    ///
    /// - Throws: ``StoreError``: `queueFull`, `timedOut` (not written), `outcomeUnknown` (its
    ///   transaction was running at the deadline: if it committed, every node delivers it),
    ///   `unavailable` (PostgreSQL could not be reached; not written).
    package func append(_ event: SharedEvent) async throws -> SharedAppendOutcome {
        try await write(event).outcome
    }

    /// Applies a change to shared state (groups, grants, revocations) and records the result in
    /// the log for every node; returns the control entry and its timetoken once committed. The
    /// errors are ``append(_:)``'s.
    package func change(_ change: SharedChange) async throws -> (control: SharedControl, timetoken: Timetoken) {
        let result = try await write(SharedEvent(change: change))
        guard let control = result.control else { throw StoreError(.failed, "shared change was not recorded") }
        return (control, result.outcome.timetoken)
    }

    private func write(_ event: SharedEvent) async throws -> SharedWriteResult {
        let id = queue.withLock { $0.makeID() }
        let deadline = ContinuousClock.now + options.writeTimeout
        let write = StoreWrite(message: nil, record: nil, shared: event)
        return try await withCheckedThrowingContinuation { (continuation: Waiter) in
            let accepted = queue.withLock { $0.enqueue(id: id, write, waiter: continuation, deadline: deadline) }
            if accepted {
                doorbellContinuation.yield()
            } else {
                continuation.resume(throwing: StoreError(.queueFull, "store write queue is full"))
            }
        }
    }

    /// Stops the writer after it has written everything queued.
    package func finish() {
        doorbellContinuation.finish()
    }

    /// Runs the group-commit writer (and its deadline sweeper) until ``finish()``.
    package func runWriter() async {
        await withDiscardingTaskGroup { group in
            group.addTask { await self.runDeadlines() }
            for await _ in doorbell {
                while true {
                    let batch = queue.withLock { $0.takeBatch() }
                    if batch.isEmpty { break }
                    await write(batch)
                }
            }
            group.cancelAll()
        }
    }

    private func runDeadlines() async {
        let tick = min(max(options.writeTimeout / 10, .milliseconds(1)), .milliseconds(100))
        while !Task.isCancelled {
            do { try await Task.sleep(for: tick) } catch { return }
            let expired = queue.withLock { queue in queue.hasDeadlines ? queue.expireDue(now: .now) : [] }
            for expiry in expired {
                switch expiry {
                case .withdrawn(let waiter):
                    logger.warning("shared log write timed out before it started; withdrawn")
                    waiter.resume(throwing: StoreError(.timedOut, "store write timed out; not stored"))
                case .outcomeUnknown(let waiter):
                    logger.warning("shared log write timed out while committing; outcome unknown")
                    waiter.resume(throwing: StoreError(.outcomeUnknown, "store write timed out; outcome unknown"))
                case .alreadyDone:
                    break
                }
            }
        }
    }

    /// Writes one batch in one transaction: lock the sequencer, answer repeats, number the new
    /// events, insert them and their request ids, raise the sequencer, wake every node.
    private func write(_ batch: [(id: UInt64, write: StoreWrite)]) async {
        let ids = batch.map(\.id)
        let started = ContinuousClock.now
        let now = clock().storageValue
        let result: Result<[UInt64: SharedWriteResult], StoreError>
        do {
            // A watchdog: a transaction whose connection died under it can wait forever for an
            // answer that never comes; the writer gives up on it and carries on.
            result = .success(try await watchdog(options.writeTimeout * 2, "shared log write") { [self] in
              try await client.transaction(logger: logger) { connection in
                let claimed = self.queue.withLock { $0.claim(ids) }
                if claimed.isEmpty { return [:] }
                let events = batch.filter { claimed.contains($0.id) }.compactMap { entry in entry.write.shared.map { (entry.id, $0) } }
                // Locks the sequencer (to the commit) and takes one timetoken per event in one
                // round trip; a repeat leaves its timetoken unused (timetokens need not be dense).
                let count = Int64(events.count)
                let last = try await connection.query("""
                    UPDATE tether_sequencer SET last_tt = GREATEST(last_tt + 1, \(now)) + \(count) - 1 WHERE id = 1 RETURNING last_tt
                    """, logger: self.logger).decode(Int64.self).first(where: { _ in true }) ?? 0
                let known = try await Self.remembered(events.compactMap(\.1.dedupKey), connection: connection, logger: self.logger)
                var outcomes: [UInt64: SharedWriteResult] = [:]
                var fresh: [DedupKey: Int64] = [:]
                var rows: [(Int64, SharedEvent)] = []
                var next = last - count + 1
                for (id, event) in events {
                    if let key = event.dedupKey, let original = known[key] ?? fresh[key] {
                        outcomes[id] = SharedWriteResult(outcome: .repeated(Timetoken(UInt64(original))))
                        continue
                    }
                    let tt = next
                    next += 1
                    if let key = event.dedupKey { fresh[key] = tt }
                    var event = event
                    var control: SharedControl?
                    if let change = event.change {
                        // Under the sequencer lock: the tables change in the order of the log.
                        let applied = try await Self.apply(change, connection: connection, logger: self.logger)
                        event.envelope.payload = SharedControlCoding.encode(applied)
                        control = applied
                    }
                    rows.append((tt, event))
                    outcomes[id] = SharedWriteResult(outcome: .appended(Timetoken(UInt64(tt))), control: control)
                }
                guard !rows.isEmpty else { return outcomes }
                for chunk in stride(from: 0, to: rows.count, by: 1000) {
                    try await Self.insert(rows[chunk..<min(chunk + 1000, rows.count)], now: now,
                                          ephemeralSeconds: self.options.ephemeralSeconds, connection: connection, logger: self.logger)
                }
                return outcomes
              }
            })
        } catch {
            if batch.count > 1, Self.refusesAWrite(error) {
                // PostgreSQL refused something one write brought (a value it cannot store, a
                // constraint, a trigger): the whole transaction rolled back. The batch is written
                // again in halves, and a refused half halved again, so only the write it refuses
                // fails — not every write batched with it — in about 2 × log2(batch) transactions.
                logger.warning("the shared database refused a write; writing its batch again in halves",
                               metadata: ["error": "\(Self.classify(error))", "batch": "\(batch.count)"])
                queue.withLock { $0.unclaim(ids) }
                let middle = batch.count / 2
                await write(Array(batch[..<middle]))
                await write(Array(batch[middle...]))
                return
            }
            result = .failure(Self.classify(error))
        }
        let completion = queue.withLock { $0.finish(ids) }
        switch result {
        case .success(let outcomes):
            if !outcomes.isEmpty {
                metrics.recordStoreWrite(duration: ContinuousClock.now - started, batchSize: outcomes.count)
                lastError.withLock { $0 = nil }
            }
            for (id, waiter) in zip(completion.ids, completion.waiters) {
                if let outcome = outcomes[id] {
                    waiter.resume(returning: outcome)
                } else {
                    waiter.resume(throwing: StoreError(.failed, "store write was not claimed"))
                }
            }
            // Events whose publishers were told "outcome unknown" are in the log now; every
            // node delivers them at their timetokens.
            readerBellContinuation.yield()
        case .failure(let error):
            note(error)
            metrics.recordSharedLogError("write")
            logger.error("shared log write failed", metadata: ["error": "\(error)", "batch": "\(batch.count)"])
            for waiter in completion.waiters { waiter.resume(throwing: error) }
        }
    }

    private static func remembered(_ keys: [DedupKey], connection: PostgresConnection, logger: Logger) async throws
        -> [DedupKey: Int64]
    {
        var found: [DedupKey: Int64] = [:]
        // In chunks, as the events are inserted: a statement takes at most 65,535 parameters,
        // and a batch can hold more request ids than a third of that.
        for start in stride(from: 0, to: keys.count, by: 1000) {
            let chunk = keys[start..<min(start + 1000, keys.count)]
            var binds = PostgresBindings(capacity: chunk.count * 3)
            var tuples: [String] = []
            for (index, key) in chunk.enumerated() {
                binds.append(key.subscribeKey)
                binds.append(key.publisher)
                binds.append(key.requestID)
                tuples.append("($\(index * 3 + 1), $\(index * 3 + 2), $\(index * 3 + 3))")
            }
            let query = PostgresQuery(unsafeSQL: """
                SELECT sub_key, publisher, request_id, tt FROM tether_publish_record
                WHERE (sub_key, publisher, request_id) IN (\(tuples.joined(separator: ", ")))
                """, binds: binds)
            for try await (subscribeKey, publisher, requestID, tt) in try await connection.query(query, logger: logger)
                .decode((String, String, String, Int64).self)
            {
                found[DedupKey(subscribeKey: subscribeKey, publisher: publisher, requestID: requestID)] = tt
            }
        }
        return found
    }

    /// Inserts `rows` with their request ids and rings every node, in one statement. The
    /// statement returns rows, which are read to the end (``PostgresConnection/statement(_:logger:)``):
    /// a refused insert then fails the write instead of aborting its transaction unseen.
    static func insert(_ rows: ArraySlice<(Int64, SharedEvent)>, now: Int64, ephemeralSeconds: Double,
                               connection: PostgresConnection, logger: Logger) async throws {
        var binds = PostgresBindings(capacity: rows.count * 11)
        var tuples: [String] = []
        var records: [String] = []
        for (tt, event) in rows {
            let e = event.envelope
            let base = binds.count
            binds.append(tt)
            binds.append(e.subscribeKey)
            binds.append(e.channel)
            binds.append(event.change == nil ? e.kind.rawValue : SharedControlCoding.kind)
            binds.append(e.publisher)
            binds.append(e.payload)
            binds.append(e.meta)
            binds.append(e.customMessageType)
            binds.append(e.sequence)
            binds.append(event.isStored)
            let timetoken = Timetoken(UInt64(tt))
            let expires: Int64?
            if event.isStored {
                expires = event.retentionHours.flatMap { $0 > 0 ? timetoken.adding(seconds: $0 * 3600).storageValue : nil }
            } else {
                expires = timetoken.adding(seconds: ephemeralSeconds).storageValue
            }
            binds.append(expires)
            tuples.append("(" + (1...11).map { "$\(base + $0)" }.joined(separator: ", ") + ")")
            if let key = event.dedupKey {
                let r = binds.count
                binds.append(key.subscribeKey)
                binds.append(key.publisher)
                binds.append(key.requestID)
                binds.append(tt)
                binds.append(e.channel)
                binds.append(now)
                records.append("(" + (1...6).map { "$\(r + $0)" }.joined(separator: ", ") + ")")
            }
        }
        // One statement: the events, their request ids, and the wake-up (delivered at commit,
        // once per transaction however many statements ask; it carries nothing else).
        var sql = """
            WITH events AS (
              INSERT INTO tether_event (tt, sub_key, channel, kind, publisher, payload, meta, custom_type, seqn, stored, expires_at)
              VALUES \(tuples.joined(separator: ", ")) RETURNING 1)
            """
        if !records.isEmpty {
            sql += """
                , records AS (
                  INSERT INTO tether_publish_record (sub_key, publisher, request_id, tt, channel, created_at)
                  VALUES \(records.joined(separator: ", ")) ON CONFLICT DO NOTHING RETURNING 1)
                """
        }
        sql += " SELECT pg_notify('tether_events', '')"
        try await connection.statement(PostgresQuery(unsafeSQL: sql, binds: binds), logger: logger)
    }

    // MARK: Reading every node's events

    /// Feeds `deliver` with every event committed after ``startHorizon``, in timetoken order,
    /// with the horizon each read reached, until cancelled. Reads on every wake-up (NOTIFY, a
    /// local commit) and at least every ``SharedLogOptions/pollInterval``; when the log is
    /// idle it raises the sequencer to the clock, so idle cursors follow the time. Reconnects
    /// with backoff while PostgreSQL is unreachable.
    package func runReader(deliver: @escaping @Sendable ([SharedLogEntry], Timetoken) async -> Void) async {
        await withDiscardingTaskGroup { group in
            group.addTask { await self.listenForWakeUps() }
            group.addTask {
                while !Task.isCancelled {
                    do { try await Task.sleep(for: self.options.pollInterval) } catch { return }
                    self.readerBellContinuation.yield()
                }
            }
            group.addTask {
                var cursor = self.startHorizon.storageValue
                var lastEvent = ContinuousClock.now
                /// Reads and delivers everything up to the current horizon, page by page.
                func drain() async throws {
                    while true {
                        let (events, horizon, full) = try await self.read(after: cursor, limit: 1000)
                        if horizon > cursor || !events.isEmpty {
                            cursor = max(horizon, events.last?.timetoken.storageValue ?? cursor)
                            await deliver(events, Timetoken(UInt64(cursor)))
                        }
                        if !events.isEmpty { lastEvent = .now }
                        self.metrics.recordSharedLogRead(
                            events: events.count, lagSeconds: Double(self.clock().storageValue - cursor) / 10_000_000)
                        if !full { return }
                    }
                }
                for await _ in self.readerBell {
                    do {
                        try await drain()
                        if ContinuousClock.now - lastEvent >= .seconds(1) {
                            lastEvent = .now
                            // Idle for a second: move the sequencer up to the clock (never down),
                            // so the cursor handed to new subscribers and `/time/0` follows the time.
                            if try await self.raiseSequencer(to: self.clock().storageValue) > cursor { try await drain() }
                        }
                        self.lastError.withLock { $0 = nil }
                    } catch {
                        if Task.isCancelled { return }
                        self.metrics.recordSharedLogError("read")
                        self.note(Self.classify(error))
                        self.logger.warning("reading the shared log failed; retrying",
                                            metadata: ["error": "\(String(reflecting: error))"])
                        do { try await Task.sleep(for: .milliseconds(500)) } catch { return }
                    }
                }
            }
        }
    }

    /// Holds a `LISTEN` on its own connection and rings the reader's bell on every
    /// notification; re-listens with backoff when the connection drops.
    private func listenForWakeUps() async {
        var backoff = Duration.milliseconds(100)
        while !Task.isCancelled {
            do {
                try await client.withConnection { connection in
                    try await connection.listen(on: Self.wakeChannel) { notifications in
                        // A wake-up may have been missed while not listening.
                        self.readerBellContinuation.yield()
                        backoff = .milliseconds(100)
                        for try await _ in notifications {
                            self.logger.trace("shared log wake-up")
                            self.readerBellContinuation.yield()
                        }
                    }
                }
            } catch {
                if Task.isCancelled { return }
                logger.debug("shared log wake-up connection lost; reconnecting", metadata: ["error": "\(error)"])
            }
            do { try await Task.sleep(for: backoff) } catch { return }
            backoff = min(backoff * 2, .seconds(5))
        }
    }

    /// Reads the sequencer value and the events above `after` up to it from one snapshot: the
    /// entries, the horizon they reach, and whether the page was full (`limit` rows, counting
    /// rows that did not decode: the next page starts after the last row, never past rows unread).
    private func read(after: Int64, limit: Int) async throws -> ([SharedLogEntry], Int64, Bool) {
        try await watchdog(.seconds(10), "shared log read") { [self] in try await readPage(after: after, limit: limit) }
    }

    private func readPage(after: Int64, limit: Int) async throws -> ([SharedLogEntry], Int64, Bool) {
        let rows = try await client.query("""
            SELECT s.last_tt, e.tt, e.sub_key, e.channel, e.kind, e.publisher, e.payload, e.meta, e.custom_type, e.seqn, e.stored
            FROM tether_sequencer s LEFT JOIN LATERAL (
              SELECT * FROM tether_event WHERE tt > \(after) AND tt <= s.last_tt ORDER BY tt LIMIT \(limit)
            ) e ON true WHERE s.id = 1 ORDER BY e.tt
            """, logger: logger)
        var horizon = after
        var events: [SharedLogEntry] = []
        var rowsRead = 0
        var lastRow: Int64?
        for try await (last, tt, subscribeKey, channel, kind, publisher, payload, meta, customType, sequence, stored)
            in rows.decode((Int64, Int64?, String?, String?, Int?, String?, String?, String?, String?, Int?, Bool?).self)
        {
            horizon = max(horizon, last)
            guard let tt else { continue }  // the LEFT JOIN's row for an empty page
            rowsRead += 1
            lastRow = max(lastRow ?? tt, tt)
            guard let subscribeKey, let channel, let payload else { continue }
            if kind == SharedControlCoding.kind {
                if let control = SharedControlCoding.decode(payload) {
                    events.append(.control(control, at: Timetoken(UInt64(tt))))
                } else {
                    logger.error("unreadable control entry in the shared log; skipped", metadata: ["timetoken": "\(tt)"])
                }
                continue
            }
            let envelope = SubscribeEnvelope(timetoken: Timetoken(UInt64(tt)), subscribeKey: subscribeKey, channel: channel,
                                             payload: payload, publisher: publisher, meta: meta,
                                             kind: kind.flatMap(EventKind.init(rawValue:)) ?? .message,
                                             customMessageType: customType, sequence: sequence)
            events.append(.event(BufferedEvent(envelope: envelope, isStored: stored ?? false)))
        }
        // A full page: the horizon is the last row read, not the sequencer. Counted in rows, not
        // in entries: a row that did not decode (a control entry from a newer node) must not
        // make a full page look like the last one, which would move the horizon past rows unread.
        let full = rowsRead >= limit
        if full, let lastRow { horizon = lastRow }
        return (events, horizon, full)
    }

    /// The shared sequencer: no node has numbered an event or handed out a cursor above it.
    package func sequencerValue() async throws -> Timetoken {
        try await watchdog(.seconds(2), "reading the sequencer") { [self] in
            let value = try await client.query("SELECT last_tt FROM tether_sequencer WHERE id = 1", logger: logger)
                .decode(Int64.self).first(where: { _ in true }) ?? 0
            return Timetoken(UInt64(max(value, 0)))
        }
    }

    private func raiseSequencer(to now: Int64) async throws -> Int64 {
        try await watchdog(.seconds(10), "raising the sequencer") { [self] in
          try await client.query("UPDATE tether_sequencer SET last_tt = GREATEST(last_tt, \(now)) WHERE id = 1 RETURNING last_tt",
                               logger: logger).decode(Int64.self).first(where: { _ in true }) ?? 0
        }
    }

    /// Runs `operation`, but answers after `limit` at the latest: with its result, or — when
    /// it is still waiting (a connection that died without failing its query) — with
    /// `outcomeUnknown`, leaving the operation to end on its own, cancelled.
    private func watchdog<T: Sendable>(_ limit: Duration, _ what: String, _ operation: @escaping @Sendable () async throws -> T)
        async throws -> T
    {
        let once = AnswerOnce()
        let logger = logger
        return try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            let timer = Task {
                do { try await Task.sleep(for: limit) } catch { return }
                guard once.claim() else { return }
                logger.error("\(what) did not finish; gave up on it", metadata: ["limit": "\(limit)"])
                continuation.resume(throwing: StoreError(.outcomeUnknown, "\(what) did not finish within \(limit)"))
            }
            Task {
                let result: Result<T, any Error>
                do { result = .success(try await operation()) } catch { result = .failure(error) }
                timer.cancel()
                if once.claim() { continuation.resume(with: result) }
            }
        }
    }

    // MARK: Health

    /// `writable` when the last write or read succeeded, `failing` while PostgreSQL cannot be
    /// reached (for `/health`).
    package func condition() async -> StoreCondition {
        if lastError.withLock({ $0 }) == nil { return .writable }
        do {
            _ = try await client.query("SELECT 1", logger: logger).decode(Int.self).first(where: { _ in true })
            lastError.withLock { $0 = nil }
            return .writable
        } catch {
            return .failing
        }
    }

    private func note(_ error: StoreError) {
        lastError.withLock { $0 = (error.description, .now) }
    }

    /// Whether PostgreSQL refused what a write in the batch brought, rather than failing the
    /// transaction as a whole: an error in its body of class 22 (data exception: a NUL in text,
    /// a value out of range), 23 (integrity constraint), 54 (a program limit, as a row too large
    /// to index) or P0 (raised by a trigger or function).
    static func refusesAWrite(_ error: any Error) -> Bool {
        guard let error = error as? SharedTransactionError, error.step == .body,
              let cause = error.cause as? PSQLError, cause.code == .server,
              let state = cause.serverInfo?[.sqlState]
        else { return false }
        return ["22", "23", "54", "P0"].contains(String(state.prefix(2)))
    }

    /// Maps a PostgresNIO error to the store's codes: a connection that cannot be made or was
    /// lost is `unavailable`; a full disk is `full`; anything else `failed`.
    static func classify(_ error: any Error) -> StoreError {
        if let error = error as? StoreError { return error }
        // A failure inside a transaction arrives wrapped: classify what actually failed. A
        // `COMMIT` whose answer was lost may have committed: the publisher must hear "may be
        // stored" (504), never "not stored" (503), or its retry without a request id doubles it.
        if let error = error as? SharedTransactionError {
            if error.mayHaveCommitted {
                return StoreError(.outcomeUnknown, "the connection to the shared database was lost while committing", cause: error.cause)
            }
            if error.cause is RolledBackAtCommit { return StoreError(.failed, "store write failed", cause: error.cause) }
            return classify(error.cause)
        }
        if let error = error as? PSQLError {
            switch error.code {
            case .server:
                let state = error.serverInfo?[.sqlState] ?? ""
                if state == "53100" { return StoreError(.full, "store is full", cause: error) }  // disk_full
                if state.hasPrefix("08") || state.hasPrefix("57") {  // connection exception, operator intervention
                    return StoreError(.unavailable, "the shared database is unavailable", cause: error)
                }
                return StoreError(.failed, "store write failed", cause: error)
            default:
                return StoreError(.unavailable, "the shared database is unavailable", cause: error)
            }
        }
        return StoreError(.unavailable, "the shared database is unavailable", cause: error)
    }
}

/// Lets exactly one of two racers answer a continuation.
final class AnswerOnce: Sendable {
    private let answered = Mutex(false)

    /// `true` for the first caller only.
    func claim() -> Bool {
        answered.withLock { answered in
            defer { answered = true }
            return !answered
        }
    }
}

/// Why the shared log could not be opened.
package enum SharedLogError: Error, CustomStringConvertible {
    /// PostgreSQL could not be reached or refused the connection.
    case unreachable(DatabaseURL, any Error)
    /// The database was migrated by a newer Tether.
    case newerSchema(found: Int, supported: Int)

    package var description: String {
        switch self {
        case .unreachable(let url, let error):
            let detail = (error as? PSQLError).map { String(reflecting: $0) } ?? "\(error)"
            return "cannot use the database at \(url): \(detail)"
        case .newerSchema(let found, let supported):
            return "the database schema is at version \(found), newer than this Tether (which knows versions up to \(supported)); "
                + "upgrade this node to the release the other nodes run, or point it at another database"
        }
    }
}

extension SharedLog {
    /// The schema versions recorded in the database, ascending (for tests and `/health`-style tools).
    package func appliedSchemaVersions() async throws -> [Int] {
        var versions: [Int] = []
        for try await version in try await client.query("SELECT version FROM tether_schema_migrations ORDER BY version", logger: logger)
            .decode(Int.self)
        {
            versions.append(version)
        }
        return versions
    }
}

extension SharedLog {
    /// Numbers and inserts events inside the caller's transaction, which must commit right
    /// after (the sequencer row stays locked until it does, as in the group-commit writer): the
    /// events then exist exactly when the caller's other writes do, and in the order those
    /// writes committed. `makeEnvelope` gets each event's timetoken. Wakes every node.
    func appendWithin(_ connection: PostgresConnection, count: Int, _ makeEnvelope: (Int, Timetoken) -> SubscribeEnvelope)
        async throws
    {
        guard count > 0 else { return }
        let now = clock().storageValue
        let last = try await connection.query("SELECT last_tt FROM tether_sequencer WHERE id = 1 FOR UPDATE", logger: logger)
            .decode(Int64.self).first(where: { _ in true }) ?? 0
        let first = max(last + 1, now)
        var rows: [(Int64, SharedEvent)] = []
        for index in 0..<count {
            let tt = first + Int64(index)
            rows.append((tt, SharedEvent(envelope: makeEnvelope(index, Timetoken(UInt64(tt))), isStored: false,
                                         retentionHours: nil, dedupKey: nil)))
        }
        for chunk in stride(from: 0, to: rows.count, by: 1000) {
            try await Self.insert(rows[chunk..<min(chunk + 1000, rows.count)], now: now, ephemeralSeconds: options.ephemeralSeconds,
                                  connection: connection, logger: logger)
        }
        try await connection.query("UPDATE tether_sequencer SET last_tt = \(first + Int64(count) - 1) WHERE id = 1", logger: logger)
        try await connection.statement("SELECT pg_notify('tether_events', '')", logger: logger)
    }

    /// Rings this node's reader (after a commit made outside the writer).
    func wakeReader() {
        readerBellContinuation.yield()
    }
}
