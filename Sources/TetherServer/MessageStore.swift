import Foundation
import GRDB
public import Logging
import Synchronization
@_spi(Benchmarks) public import TetherProtocol
@_spi(Benchmarks) public import TetherServerCore

/// A stored message: everything history and catch-up need to rebuild its envelope.
public struct StoredMessage: Sendable, Hashable {
    /// The keyset.
    public var subscribeKey: String
    /// The channel.
    public var channel: String
    /// Unique publish timetoken.
    public var timetoken: Timetoken
    /// Message kind (message or file).
    public var kind: EventKind
    /// Publisher uuid.
    public var publisher: String?
    /// Payload JSON text.
    public var payload: String
    /// Meta JSON object text.
    public var meta: String?
    /// Custom message type.
    public var customMessageType: String?
    /// Publisher sequence number.
    public var sequence: Int?
    /// When the message leaves history (timetoken units), or `nil` to keep it forever.
    public var expiresAt: Timetoken?

    /// Creates a stored message.
    public init(
        subscribeKey: String, channel: String, timetoken: Timetoken, kind: EventKind = .message, publisher: String?,
        payload: String, meta: String?, customMessageType: String?, sequence: Int?, expiresAt: Timetoken?
    ) {
        self.subscribeKey = subscribeKey
        self.channel = channel
        self.timetoken = timetoken
        self.kind = kind
        self.publisher = publisher
        self.payload = payload
        self.meta = meta
        self.customMessageType = customMessageType
        self.sequence = sequence
        self.expiresAt = expiresAt
    }

    /// The subscribe envelope for this message.
    package var envelope: SubscribeEnvelope {
        SubscribeEnvelope(timetoken: timetoken, subscribeKey: subscribeKey, channel: channel, payload: payload,
                          publisher: publisher, meta: meta, kind: kind, customMessageType: customMessageType,
                          sequence: sequence)
    }

    init(row: Row) {
        subscribeKey = row["sub_key"]
        channel = row["channel"]
        timetoken = Timetoken(UInt64(row["timetoken"] as Int64))
        kind = EventKind(rawValue: row["kind"]) ?? .message
        publisher = row["publisher"]
        payload = row["payload"]
        meta = row["meta"]
        customMessageType = row["custom_type"]
        sequence = row["seqn"]
        expiresAt = (row["expires_at"] as Int64?).map { Timetoken(UInt64($0)) }
    }
}

/// Bounds of messages a subscriber can no longer receive because retention removed them.
public struct RetentionGap: Sendable, Hashable {
    /// The channel.
    public var channel: String
    /// The subscriber's cursor (exclusive lower bound of the gap).
    public var from: Timetoken
    /// The newest timetoken removed by retention (inclusive upper bound of the gap).
    public var through: Timetoken
}

/// The embedded durable store: one SQLite file in WAL mode through GRDB.
///
/// Writes go through a bounded group-commit queue: concurrent publishes are written in one
/// transaction and each is acknowledged only after that transaction is durable. A write that
/// waits longer than ``StoreOptions/writeTimeout`` is answered with an error (see
/// ``StoreWriteQueue`` for what is then certain). Reads run concurrently on WAL readers.
///
/// With ``StoreOptions/durability`` `full` (the default) a batch commits without SQLite's own
/// fsync, its messages are delivered at once, and the writer then `fdatasync`s the WAL itself
/// (``WALSync``) before the batch's publishers are answered. A message can thus reach
/// subscribers before it would survive a power loss (never before it would survive the server
/// process being killed); its publisher is only ever told "stored" after both. Every other
/// write (grants, groups, App Context, ...) stays `synchronous=FULL`. With `normal`, nothing is
/// synced: a commit survives the process being killed, not the machine losing power.
public final class MessageStore: Sendable {
    private typealias Waiter = CheckedContinuation<Void, any Error>
    private struct Observation {
        var condition: StoreCondition
        var at: ContinuousClock.Instant
        /// When the health probe in flight started, if one is.
        var probing: ContinuousClock.Instant?
    }

    let pool: DatabasePool
    /// A second connection, used only by the health probe (so a probe never queues behind a
    /// stalled writer: it waits at most a second for SQLite's write lock).
    private let probeQueue: DatabaseQueue
    private let logger: Logger
    private let queue: Mutex<StoreWriteQueue<CheckedContinuation<Void, any Error>>>
    /// Who settles writes answered "outcome unknown", by write id (see ``append(_:settledLate:)``).
    private let lateSettlers = Mutex<[UInt64: @Sendable (Bool) -> Void]>([:])
    private let observation = Mutex(Observation(condition: .writable, at: .now, probing: nil))
    /// Rung by every queued write; the writer thread waits on it.
    private let doorbell = DispatchSemaphore(value: 0)
    /// Set by ``finish()``: the writer writes what is queued and stops.
    private let finishing = Atomic<Bool>(false)
    /// Whether the writer syncs each batch's commit itself, after delivering it (`durability full`).
    private let syncsSeparately: Bool
    private let wal: WALSync
    /// The `highest_timetoken` the store holds, as far as message batches know: a batch writes it
    /// only when one of its timetokens passes it, and then ``timetokenReservation`` ahead
    /// (``reservation(above:stored:)``). Written by the writer thread only, after its commit.
    private let reservedHighest = Atomic<Int64>(0)
    /// Tests: runs on the writer before each sync; throwing stands for a failed `fdatasync`,
    /// blocking for a slow disk.
    let syncProbe = Mutex<(@Sendable () throws -> Void)?>(nil)
    private let metrics: ServerMetrics

    /// The SQLite file path.
    public let path: String
    /// How the store writes.
    public let options: StoreOptions

    /// Opens (creating if needed) the store in `directory`.
    public init(directory: String, options: StoreOptions = .init(), logger: Logger, metrics: ServerMetrics) throws {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        self.path = Self.databasePath(in: directory)
        self.options = options
        self.syncsSeparately = options.durability == .full
        self.wal = WALSync(databasePath: path)
        var configuration = Configuration()
        configuration.busyMode = .timeout(10)
        let pool = try DatabasePool(path: path, configuration: configuration)
        // Not in `prepareDatabase`: GRDB's WAL setup runs after it and sets the writer to
        // `synchronous = NORMAL`. The writer connection lives as long as the pool, so setting
        // it once here holds.
        let synchronous = options.durability == .full ? "FULL" : "NORMAL"
        // After a failed sync no connection of the store commits anything (``WALCommitGuard``).
        let commitGuard = WALCommitGuard(wal)
        try pool.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA synchronous = \(synchronous)")
            db.add(transactionObserver: commitGuard, extent: .databaseLifetime)
        }
        self.pool = pool
        var probeConfiguration = Configuration()
        probeConfiguration.busyMode = .timeout(1)
        probeConfiguration.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = \(synchronous)")
            db.add(transactionObserver: commitGuard, extent: .databaseLifetime)
        }
        self.probeQueue = try DatabaseQueue(path: path, configuration: probeConfiguration)
        self.logger = logger
        self.metrics = metrics
        self.queue = Mutex(StoreWriteQueue(limit: options.writeQueueLimit))
        try migrator.migrate(pool)
        if let maximumBytes = options.maximumBytes { try setMaximumSize(maximumBytes) }
    }

    /// The writer connection's `PRAGMA synchronous`: 2 (FULL) or 1 (NORMAL).
    public func writerSynchronousSetting() throws -> Int {
        try pool.writeWithoutTransaction { db in try Int.fetchOne(db, sql: "PRAGMA synchronous") ?? -1 }
    }

    /// Caps the database file at `bytes` (whole pages, `PRAGMA max_page_count`), or lifts the
    /// cap (`nil`). A cap below the file's current size holds it at its current size.
    public func setMaximumSize(_ bytes: Int?) throws {
        func apply(_ db: Database) throws {
            let pageSize = try Int.fetchOne(db, sql: "PRAGMA page_size") ?? 4096
            // Without a cap: SQLite's default limit (1,073,741,823 pages before 3.45).
            let pages = bytes.map { max(1, $0 / pageSize) } ?? 1_073_741_823
            try db.execute(sql: "PRAGMA max_page_count = \(pages)")
        }
        try pool.writeWithoutTransaction(apply)
        try probeQueue.writeWithoutTransaction(apply)
    }

    private var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(sql: """
                CREATE TABLE message (
                    sub_key TEXT NOT NULL,
                    channel TEXT NOT NULL,
                    timetoken INTEGER NOT NULL,
                    kind INTEGER NOT NULL DEFAULT 0,
                    publisher TEXT,
                    payload TEXT NOT NULL,
                    meta TEXT,
                    custom_type TEXT,
                    seqn INTEGER,
                    expires_at INTEGER,
                    PRIMARY KEY (sub_key, channel, timetoken)
                ) WITHOUT ROWID;
                CREATE INDEX message_expiry ON message(expires_at) WHERE expires_at IS NOT NULL;
                CREATE TABLE retention_floor (
                    sub_key TEXT NOT NULL,
                    channel TEXT NOT NULL,
                    pruned_through INTEGER NOT NULL,
                    PRIMARY KEY (sub_key, channel)
                ) WITHOUT ROWID;
                CREATE TABLE server_state (
                    key TEXT PRIMARY KEY NOT NULL,
                    value INTEGER NOT NULL
                );
                """)
        }
        migrator.registerMigration("v2-channel-groups") { db in
            try db.execute(sql: """
                CREATE TABLE channel_group (
                    sub_key TEXT NOT NULL,
                    grp TEXT NOT NULL,
                    channel TEXT NOT NULL,
                    PRIMARY KEY (sub_key, grp, channel)
                ) WITHOUT ROWID;
                """)
        }
        migrator.registerMigration("v3-access-manager") { db in
            try db.execute(sql: """
                CREATE TABLE pam_grant (
                    sub_key TEXT NOT NULL,
                    target_kind TEXT NOT NULL,
                    target TEXT NOT NULL,
                    auth_key TEXT NOT NULL,
                    permissions INTEGER NOT NULL,
                    ttl INTEGER NOT NULL,
                    expires_at INTEGER,
                    PRIMARY KEY (sub_key, target_kind, target, auth_key)
                ) WITHOUT ROWID;
                CREATE TABLE pam_revoked (
                    signature TEXT PRIMARY KEY NOT NULL,
                    expires_at INTEGER NOT NULL
                );
                """)
        }
        Self.registerPresenceMigration(in: &migrator)
        Self.registerPublishRecordMigration(in: &migrator)
        Self.registerActionMigration(in: &migrator)
        Self.registerAppContextMigration(in: &migrator)
        Self.registerPushMigration(in: &migrator)
        Self.registerFileMigration(in: &migrator)
        return migrator
    }

    /// Every stored v2 grant.
    public func allGrants() throws -> [Grant] {
        try pool.read { db in
            try Row.fetchAll(db, sql: "SELECT * FROM pam_grant").compactMap { row -> Grant? in
                let name: String = row["target"]
                let target: GrantTarget
                switch row["target_kind"] as String {
                case "keyset": target = .keyset
                case "channel": target = .channel(name)
                case "group": target = .group(name)
                case "uuid": target = .uuid(name)
                default: return nil
                }
                let auth: String = row["auth_key"]
                return Grant(subscribeKey: row["sub_key"], target: target, authKey: auth.isEmpty ? nil : auth,
                             permissions: Permissions(rawValue: row["permissions"]), ttlMinutes: row["ttl"],
                             expiresAt: (row["expires_at"] as Int64?).map { Timetoken(UInt64($0)) })
            }
        }
    }

    /// Stores grants (a grant with no permissions deletes its row).
    public func saveGrants(_ grants: [Grant]) async throws {
        try await pool.write { db in
            for grant in grants {
                let (kind, name): (String, String) = switch grant.target {
                case .keyset: ("keyset", "")
                case .channel(let n): ("channel", n)
                case .group(let n): ("group", n)
                case .uuid(let n): ("uuid", n)
                }
                if grant.permissions.isEmpty {
                    try db.execute(sql: "DELETE FROM pam_grant WHERE sub_key = ? AND target_kind = ? AND target = ? AND auth_key = ?",
                                   arguments: [grant.subscribeKey, kind, name, grant.authKey ?? ""])
                } else {
                    try db.execute(sql: """
                        INSERT OR REPLACE INTO pam_grant (sub_key, target_kind, target, auth_key, permissions, ttl, expires_at)
                        VALUES (?, ?, ?, ?, ?, ?, ?)
                        """, arguments: [grant.subscribeKey, kind, name, grant.authKey ?? "", grant.permissions.rawValue, grant.ttlMinutes,
                                         grant.expiresAt.map { $0.storageValue }])
                }
            }
        }
    }

    /// Every stored token revocation: signature → expiry.
    public func allRevocations() throws -> [String: Timetoken] {
        try pool.read { db in
            var result: [String: Timetoken] = [:]
            for row in try Row.fetchAll(db, sql: "SELECT signature, expires_at FROM pam_revoked") {
                result[row["signature"]] = Timetoken(UInt64(row["expires_at"] as Int64))
            }
            return result
        }
    }

    /// Stores a token revocation.
    public func saveRevocation(signature: String, expiresAt: Timetoken) async throws {
        try await pool.write { db in
            try db.execute(sql: "INSERT OR REPLACE INTO pam_revoked (signature, expires_at) VALUES (?, ?)",
                           arguments: [signature, expiresAt.storageValue])
        }
    }

    /// Every channel group membership: `(subscribeKey, group, channel)`.
    public func allGroupMemberships() throws -> [(String, String, String)] {
        try pool.read { db in
            try Row.fetchAll(db, sql: "SELECT sub_key, grp, channel FROM channel_group").map { ($0["sub_key"], $0["grp"], $0["channel"]) }
        }
    }

    /// Adds and removes channels of a group durably; returns the group's channels afterwards.
    public func updateGroup(subscribeKey: String, group: String, add: [String], remove: [String]) async throws -> Set<String> {
        try await updateGroup(subscribeKey: subscribeKey, group: group, add: add, remove: remove, committed: { _ in })
    }

    /// ``updateGroup(subscribeKey:group:add:remove:)``, handing the group's channels to
    /// `committed` once the change is durable and before the next write starts: concurrent
    /// changes reach `committed` in the order they were committed, so an index kept from it (the
    /// delivery hub's) never ends with an older membership than the store's.
    public func updateGroup(subscribeKey: String, group: String, add: [String], remove: [String],
                            committed: @escaping @Sendable (Set<String>) -> Void) async throws -> Set<String> {
        try await pool.writeWithoutTransaction { db in
            var channels: Set<String> = []
            try db.inTransaction {
                for channel in add {
                    try db.execute(sql: "INSERT OR IGNORE INTO channel_group (sub_key, grp, channel) VALUES (?, ?, ?)",
                                   arguments: [subscribeKey, group, channel])
                }
                for channel in remove {
                    try db.execute(sql: "DELETE FROM channel_group WHERE sub_key = ? AND grp = ? AND channel = ?",
                                   arguments: [subscribeKey, group, channel])
                }
                channels = Set(try String.fetchAll(db, sql: "SELECT channel FROM channel_group WHERE sub_key = ? AND grp = ?",
                                                   arguments: [subscribeKey, group]))
                return .commit
            }
            committed(channels)
            return channels
        }
    }

    /// The names of a keyset's groups, sorted.
    public func groupNames(subscribeKey: String) async throws -> [String] {
        try await pool.read { db in
            try String.fetchAll(db, sql: "SELECT DISTINCT grp FROM channel_group WHERE sub_key = ? ORDER BY grp", arguments: [subscribeKey])
        }
    }

    /// Deletes a group durably.
    public func deleteGroup(subscribeKey: String, group: String) async throws {
        try await deleteGroup(subscribeKey: subscribeKey, group: group, committed: {})
    }

    /// Deletes a group durably; `committed` runs once that is durable and before the next write
    /// starts (in commit order, as ``updateGroup(subscribeKey:group:add:remove:committed:)``'s).
    public func deleteGroup(subscribeKey: String, group: String, committed: @escaping @Sendable () -> Void) async throws {
        try await pool.writeWithoutTransaction { db in
            try db.inTransaction {
                try db.execute(sql: "DELETE FROM channel_group WHERE sub_key = ? AND grp = ?", arguments: [subscribeKey, group])
                return .commit
            }
            committed()
        }
    }

    /// The highest timetoken ever issued and stored; the sequencer starts above it.
    public func highestTimetoken() throws -> Timetoken {
        try pool.read { db in
            let stored = try Int64.fetchOne(db, sql: "SELECT value FROM server_state WHERE key = 'highest_timetoken'") ?? 0
            return Timetoken(UInt64(stored))
        }
    }

    /// Raises the stored `highest_timetoken` to at least `timetoken`, in a transaction of its own
    /// (durable as every record write: `synchronous=FULL` with `durability full`). A restarted
    /// server's sequencer starts above it: the cursor lease of ``LongPollHub``.
    public func reserveTimetokens(through timetoken: Timetoken) throws {
        try pool.write { db in try Self.raiseHighestTimetoken(db, to: timetoken) }
    }

    /// ``reserveTimetokens(through:)`` without blocking the caller's thread.
    public func reserveTimetokens(through timetoken: Timetoken) async throws {
        try await pool.write { db in try Self.raiseHighestTimetoken(db, to: timetoken) }
    }

    /// Lowers the stored `highest_timetoken` to `timetoken` if it is above it: a graceful stop
    /// settling the cursor lease to the last cursor (``LongPollHub/settleCursorLease()``). The
    /// caller vouches that nothing was numbered or stored above `timetoken`.
    public func settleTimetokens(at timetoken: Timetoken) throws {
        try pool.write { db in
            try db.execute(sql: "UPDATE server_state SET value = ? WHERE key = 'highest_timetoken' AND value > ?",
                           arguments: [timetoken.storageValue, timetoken.storageValue])
        }
        reservedHighest.store(0, ordering: .relaxed)  // the next batch writes its reservation again
    }

    private static func raiseHighestTimetoken(_ db: Database, to timetoken: Timetoken) throws {
        try db.execute(sql: """
            INSERT INTO server_state (key, value) VALUES ('highest_timetoken', ?)
            ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)
            """, arguments: [timetoken.storageValue])
    }

    /// Appends a message and returns once it is durable.
    ///
    /// - Throws: ``StoreError`` with code `queueFull` (nothing queued), `timedOut` (withdrawn
    ///   before it started: not stored), `outcomeUnknown` (its transaction was running at the
    ///   deadline), or the classified failure of its transaction (`full`, `busy`, ...).
    ///
    /// - Parameter settledLate: called once, from the writer, when a write whose publisher was
    ///   answered `outcomeUnknown` settles: `true` if it committed, `false` if not. Never called
    ///   for a write answered with its outcome.
    public func append(_ message: StoredMessage, settledLate: (@Sendable (Bool) -> Void)? = nil) async throws {
        try await append(StoreWrite(message: message, record: nil), settledLate: settledLate)
    }

    /// Writes a publish's rows — the message, its request-id record, or both — in one group
    /// commit transaction, with the guarantees and errors of ``append(_:settledLate:)``.
    func append(_ write: StoreWrite, settledLate: (@Sendable (Bool) -> Void)? = nil) async throws {
        let id = queue.withLock { $0.makeID() }
        let timeout = options.writeTimeout
        if let settledLate { lateSettlers.withLock { $0[id] = settledLate } }
        do {
            try await waitForWrite(id: id, write, timeout: timeout)
        } catch let error as StoreError where error.code == .outcomeUnknown {
            throw error  // the settler stays until the writer knows the outcome
        } catch {
            lateSettlers.withLock { _ = $0.removeValue(forKey: id) }
            throw error
        }
        lateSettlers.withLock { _ = $0.removeValue(forKey: id) }
    }

    private func waitForWrite(id: UInt64, _ write: StoreWrite, timeout: Duration) async throws {
        // The deadline is kept with the write and enforced by the writer's sweeper
        // (``runDeadlines()``): one timer for all writes, not a sleeping task per publish.
        let deadline = ContinuousClock.now + timeout
        try await withCheckedThrowingContinuation { (continuation: Waiter) in
            let accepted = queue.withLock { $0.enqueue(id: id, write, waiter: continuation, deadline: deadline) }
            if accepted {
                doorbell.signal()
            } else {
                continuation.resume(throwing: StoreError(.queueFull, "store write queue is full"))
            }
        }
    }

    /// Answers writes whose deadline passed, checking every tenth of the write timeout (at
    /// most every 100 ms, at least every millisecond) while the writer runs.
    private func runDeadlines() async {
        let tick = min(max(options.writeTimeout / 10, .milliseconds(1)), .milliseconds(100))
        while !Task.isCancelled {
            do { try await Task.sleep(for: tick) } catch { return }
            let expired = queue.withLock { queue in queue.hasDeadlines ? queue.expireDue(now: .now) : [] }
            for expiry in expired { answer(expiry) }
        }
    }

    /// The deadline of write `id` passed: answers its publisher unless it was already answered.
    private func answer(_ expiry: StoreWriteQueue<Waiter>.Expiry) {
        switch expiry {
        case .withdrawn(let waiter):
            observe(.stalled)
            logger.warning("store write timed out before it started; withdrawn")
            waiter.resume(throwing: StoreError(.timedOut, "store write timed out; not stored"))
        case .outcomeUnknown(let waiter):
            observe(.stalled)
            logger.warning("store write timed out while committing; outcome unknown")
            waiter.resume(throwing: StoreError(.outcomeUnknown, "store write timed out; outcome unknown"))
        case .alreadyDone:
            break
        }
    }

    /// Runs the group-commit writer until ``finish()`` (or until the calling task is
    /// cancelled), then returns once everything queued is written.
    ///
    /// The writer is a thread of its own that writes each batch synchronously: a publish's
    /// write then costs one wake-up of this thread and one of the publisher's event loop,
    /// instead of also hopping through the concurrency pool and GRDB's queue
    /// (docs/benchmarks.md, "Where a request's CPU and memory go").
    public func runWriter() async {
        await withDiscardingTaskGroup { group in
            group.addTask { await self.runDeadlines() }
            await withTaskCancellationHandler {
                await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
                    let thread = Thread {
                        self.runBatches()
                        done.resume()
                    }
                    thread.name = "tether-store-writer"
                    thread.start()
                }
            } onCancel: {
                self.finish()
            }
            group.cancelAll()
        }
    }

    /// How far ahead of a batch's highest timetoken the store's `highest_timetoken` is written:
    /// one second of timetokens. The sequencer starts above it after a restart, so a server
    /// restarted within a second of its last publish issues timetokens up to this far ahead of its
    /// clock until the clock passes them; in exchange a busy store writes that row (and its page
    /// in the WAL) about once a second instead of in every batch.
    static let timetokenReservation: Int64 = 10_000_000

    /// The `highest_timetoken` a batch whose highest timetoken is `highest` writes, or `nil`
    /// when the store's value (`stored`) already covers it.
    static func reservation(above highest: Int64, stored: Int64) -> Int64? {
        guard highest > stored else { return nil }
        let (ahead, overflow) = highest.addingReportingOverflow(timetokenReservation)
        return overflow ? highest : ahead
    }

    /// The writer thread: every ring of the doorbell writes what is queued, in batches.
    private func runBatches() {
        while true {
            doorbell.wait()
            writeQueued()
            if finishing.load(ordering: .acquiring) {
                writeQueued()
                return
            }
        }
    }

    private func writeQueued() {
        while true {
            let batch = queue.withLock { $0.takeBatch() }
            if batch.isEmpty { break }
            let ids = batch.map(\.id)
            let started = ContinuousClock.now
            var delivered: [@Sendable () -> Void] = []
            if syncsSeparately, let failure = wal.failure {
                // A sync failed earlier: the file system may have dropped what it had accepted,
                // so nothing more is written until the server restarts (as PostgreSQL does).
                answer(ids, started: started, outcome: .failure(failure), committed: false)
                continue
            }
            let written: Int
            do {
                written = try pool.writeWithoutTransaction { db in
                    // With `durability full` this commit skips SQLite's fsync: the writer syncs
                    // once the batch is delivered. Set back at once, so every other write on
                    // this connection stays fully synchronous.
                    defer {
                        if syncsSeparately {
                            do {
                                try db.cachedStatement(sql: "PRAGMA synchronous = FULL").execute()
                            } catch {
                                logger.critical("store could not restore synchronous=FULL; refusing writes", metadata: ["error": "\(error)"])
                                wal.fail(StoreError(.failed, "the store could not restore synchronous=FULL", cause: error))
                            }
                        }
                    }
                    if syncsSeparately { try db.cachedStatement(sql: "PRAGMA synchronous = NORMAL").execute() }
                    var count = 0
                    var reserved: Int64?
                    try Self.inCachedTransaction(db) {
                        // Claimed inside the transaction: a write withdrawn while the writer
                        // waited for the lock is never inserted.
                        let claimed = self.queue.withLock { $0.claim(ids) }
                        if claimed.isEmpty { return }
                        var highest: Int64 = 0
                        for (id, write) in batch where claimed.contains(id) {
                            if let record = write.record { highest = max(highest, record.timetoken.storageValue) }
                            if let m = write.message { highest = max(highest, m.timetoken.storageValue) }
                        }
                        // The sequencer's floor after a restart stays above every stored
                        // timetoken. Written ahead, so most batches leave its page alone; and
                        // first, so whatever fails after it in this batch rolls it back too.
                        if let reservation = Self.reservation(above: highest, stored: self.reservedHighest.load(ordering: .relaxed)) {
                            // A cached statement: parsed (and authorised by GRDB) once, not every batch.
                            try db.cachedStatement(sql: """
                                INSERT INTO server_state (key, value) VALUES ('highest_timetoken', ?)
                                ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)
                                """).execute(arguments: [reservation])
                            reserved = reservation
                        }
                        let statement = try db.cachedStatement(sql: """
                            INSERT INTO message (sub_key, channel, timetoken, kind, publisher, payload, meta, custom_type, seqn, expires_at)
                            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                            """)
                        var records: [PublishRecord] = []
                        for (id, write) in batch where claimed.contains(id) {
                            if let onCommitted = write.onCommitted { delivered.append(onCommitted) }
                            if let record = write.record { records.append(record) }
                            guard let m = write.message else { continue }
                            try statement.execute(arguments: [
                                m.subscribeKey, m.channel, m.timetoken.storageValue, m.kind.rawValue, m.publisher, m.payload, m.meta,
                                m.customMessageType, m.sequence, m.expiresAt.map { $0.storageValue },
                            ])
                        }
                        // In the same transaction as the messages: a publish is remembered
                        // exactly when it is stored (issue #15).
                        if !records.isEmpty { try Self.insert(records, into: db) }
                        count = claimed.count
                    }
                    // Committed: later batches below it need not write it again.
                    if let reserved { self.reservedHighest.store(reserved, ordering: .relaxed) }
                    return count
                }
            } catch {
                delivered.removeAll()
                answer(ids, started: started, outcome: .failure(StoreError.classify(error)), committed: false)
                continue
            }
            // Committed: delivered now, answered once durable.
            queue.withLock { $0.committed(ids) }
            for deliver in delivered { deliver() }
            guard syncsSeparately else {
                answer(ids, started: started, outcome: .success(written), committed: true)
                continue
            }
            let synced: Result<Int, StoreError>
            do {
                do {
                    try syncProbe.withLock { $0 }?()
                } catch {
                    wal.fail(StoreError.classify(error))  // a failed sync is final (``WALSync``)
                    throw error
                }
                try wal.sync()
                synced = .success(written)
            } catch {
                synced = .failure(StoreError.classify(error))
            }
            answer(ids, started: started, outcome: synced, committed: true)
        }
    }

    /// A transaction like GRDB's `inTransaction` (immediate; rolled back when `body` or the
    /// commit throws), with its `BEGIN` and `COMMIT` as cached statements: GRDB runs them as SQL
    /// text, parsed again for every transaction — the writer's batches pay it every time.
    static func inCachedTransaction(_ db: Database, _ body: () throws -> Void) throws {
        try db.cachedStatement(sql: "BEGIN IMMEDIATE TRANSACTION").execute()
        do {
            try body()
            try db.cachedStatement(sql: "COMMIT TRANSACTION").execute()
        } catch {
            // SQLite may already have rolled back (a full disk, an I/O error, a refused commit).
            if db.isInsideTransaction { try? db.rollback() }
            throw error
        }
    }

    /// Answers the writes of batch `ids`: written (`outcome` success), never written (its
    /// transaction failed), or — `committed` with a failure — committed and delivered, but the
    /// sync that makes it durable failed.
    private func answer(_ ids: [UInt64], started: ContinuousClock.Instant, outcome: Result<Int, StoreError>, committed: Bool) {
        let completion = queue.withLock { $0.finish(ids) }
        let settlers = lateSettlers.withLock { all in completion.late.compactMap { all.removeValue(forKey: $0) } }
        switch outcome {
        case .success(let written):
            if written > 0 {
                metrics.recordStoreWrite(duration: ContinuousClock.now - started, batchSize: written)
                observe(.writable)
            }
            if !completion.late.isEmpty {
                logger.warning("stored messages whose publishers were answered 'outcome unknown'; delivered at their timetokens",
                               metadata: ["count": "\(completion.late.count)"])
            }
            for waiter in completion.waiters { waiter.resume() }
            for settle in settlers { settle(true) }
        case .failure(let error) where committed:
            // Committed, visible and delivered, but the file system did not confirm it durable:
            // the publishers hear "outcome unknown", and their publishes count as stored.
            observe(.failing)
            logger.critical("store sync failed: committed messages may not survive a power loss", metadata: [
                "error": "\(error)", "batch": "\(completion.waiters.count + completion.late.count)",
            ])
            let unknown = StoreError(.outcomeUnknown, "store write may not be durable: the sync failed", cause: error)
            for waiter in completion.waiters { waiter.resume(throwing: unknown) }
            let answered = lateSettlers.withLock { all in completion.ids.compactMap { all.removeValue(forKey: $0) } }
            for settle in settlers + answered { settle(true) }
        case .failure(let error):
            observe(StoreCondition(error))
            logger.error("store write failed", metadata: [
                "error": "\(error)", "code": "\(error.code)", "batch": "\(ids.count)", "late": "\(completion.late.count)",
            ])
            for waiter in completion.waiters { waiter.resume(throwing: error) }
            for settle in settlers { settle(false) }
        }
    }

    /// Records what a write or probe found (for ``condition()``).
    private func observe(_ condition: StoreCondition) {
        let now = ContinuousClock.now
        observation.withLock {
            $0.condition = condition
            $0.at = now
        }
    }

    /// Whether the store can write, cheaply: `failing` for good once a sync has failed, the last
    /// write's outcome when under a second old, otherwise a tiny write probe (two pages inserted and deleted in one transaction on a
    /// separate connection). A probe that waits over a second for the write lock reports
    /// `stalled`; only one probe runs at a time.
    public func condition() async -> StoreCondition {
        // A failed sync is final: no probe can show the store writable again.
        if wal.failure != nil { return .failing }
        let now = ContinuousClock.now
        let cached: StoreCondition? = observation.withLock { o in
            if now - o.at < .seconds(1) { return o.condition }
            if let since = o.probing { return now - since > .seconds(1) ? .stalled : o.condition }
            o.probing = now
            return nil
        }
        if let cached { return cached }
        let result: StoreCondition
        do {
            try await probeQueue.write { db in
                try db.execute(sql: "INSERT OR REPLACE INTO server_state (key, value) VALUES ('health_probe', zeroblob(8192))")
                try db.execute(sql: "DELETE FROM server_state WHERE key = 'health_probe'")
            }
            result = .writable
        } catch {
            result = StoreCondition(StoreError.classify(error))
        }
        let finished = ContinuousClock.now
        observation.withLock { o in
            o.probing = nil
            o.condition = result
            o.at = finished
        }
        return result
    }

    /// Stops the writer after it has written everything queued.
    public func finish() {
        finishing.store(true, ordering: .releasing)
        doorbell.signal()
    }

    /// Checkpoints the WAL into the database file and closes it.
    public func close() throws {
        try pool.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA wal_checkpoint(TRUNCATE)")
        }
        try pool.close()
        try probeQueue.close()
        wal.release()
    }

    /// Reads stored messages for a subscribe catch-up range, oldest first, at most `limit`.
    public func read(_ range: StoreRange, limit: Int) async throws -> StoreRangeResult {
        let started = ContinuousClock.now
        let rows: [StoredMessage] = try await pool.read { db in
            let after = range.after.storageValue
            let through = range.through.storageValue
            switch range.selector {
            case .channel(let channel):
                // Cached statements (per reader connection): a catch-up reads page after page.
                return try Row.fetchAll(db.cachedStatement(sql: """
                    SELECT * FROM message WHERE sub_key = ? AND channel = ? AND timetoken > ? AND timetoken <= ?
                    ORDER BY timetoken LIMIT ?
                    """), arguments: [range.subscribeKey, channel, after, through, limit]).map(StoredMessage.init(row:))
            case .prefix(let prefix):
                // Range scan on the primary key: every channel that starts with `prefix`.
                let upper = String(prefix.dropLast()) + "/"
                return try Row.fetchAll(db.cachedStatement(sql: """
                    SELECT * FROM message WHERE sub_key = ? AND channel > ? AND channel < ?
                    AND channel NOT LIKE '%-pnpres' AND timetoken > ? AND timetoken <= ?
                    ORDER BY timetoken LIMIT ?
                    """), arguments: [range.subscribeKey, prefix, upper, after, through, limit]).map(StoredMessage.init(row:))
            }
        }
        metrics.recordStoreRead(duration: ContinuousClock.now - started)
        return StoreRangeResult(range: range, envelopes: rows.map(\.envelope), reachedLimit: rows.count >= limit)
    }

    /// Retention gaps a subscriber at cursor `after` has on `channels` (messages removed by
    /// retention after its cursor).
    public func retentionGaps(subscribeKey: String, channels: [String], prefixes: [String], after: Timetoken) async throws
        -> [RetentionGap]
    {
        try await pool.read { db in
            var gaps: [RetentionGap] = []
            let afterValue = after.storageValue
            // Prepared once per connection, not once per channel: a group brings many.
            let floor = try db.cachedStatement(sql: """
                SELECT pruned_through FROM retention_floor WHERE sub_key = ? AND channel = ? AND pruned_through > ?
                """)
            for channel in channels {
                if let through = try Int64.fetchOne(floor, arguments: [subscribeKey, channel, afterValue])
                {
                    gaps.append(RetentionGap(channel: channel, from: after, through: Timetoken(UInt64(through))))
                }
            }
            let named = prefixes.isEmpty ? [] : Set(channels)
            for prefix in prefixes {
                let upper = String(prefix.dropLast()) + "/"
                let rows = try Row.fetchAll(db.cachedStatement(sql: """
                    SELECT channel, pruned_through FROM retention_floor WHERE sub_key = ? AND channel > ? AND channel < ?
                    AND pruned_through > ?
                    """), arguments: [subscribeKey, prefix, upper, afterValue])
                for row in rows where !named.contains(row["channel"] as String) {
                    gaps.append(RetentionGap(channel: row["channel"], from: after, through: Timetoken(UInt64(row["pruned_through"] as Int64))))
                }
            }
            return gaps
        }
    }

    /// Removes messages whose retention has ended and records how far each channel was pruned.
    ///
    /// Deletes at most `batchSize` messages per transaction, oldest expiry first, and yields
    /// between transactions, so publishes queued meanwhile are written between batches rather
    /// than after the whole prune. `afterBatch` receives the running total after each batch.
    /// - Returns: the number of messages removed.
    @discardableResult
    public func pruneExpired(
        now: Timetoken, batchSize: Int = 1000, afterBatch: (@Sendable (Int) async -> Void)? = nil
    ) async throws -> Int {
        struct ChannelKey: Hashable { var subscribeKey: String, channel: String }
        let nowValue = now.storageValue
        var total = 0
        while true {
            let removed = try await pool.write { db -> Int in
                let rows = try Row.fetchAll(db, sql: """
                    SELECT sub_key, channel, timetoken FROM message
                    WHERE expires_at IS NOT NULL AND expires_at <= ? ORDER BY expires_at LIMIT ?
                    """, arguments: [nowValue, batchSize])
                let delete = try db.cachedStatement(sql: "DELETE FROM message WHERE sub_key = ? AND channel = ? AND timetoken = ?")
                var floors: [ChannelKey: Int64] = [:]
                for row in rows {
                    let key = ChannelKey(subscribeKey: row["sub_key"], channel: row["channel"])
                    let timetoken: Int64 = row["timetoken"]
                    floors[key] = max(floors[key] ?? timetoken, timetoken)
                    try delete.execute(arguments: [key.subscribeKey, key.channel, timetoken])
                }
                let floor = try db.cachedStatement(sql: """
                    INSERT INTO retention_floor (sub_key, channel, pruned_through) VALUES (?, ?, ?)
                    ON CONFLICT(sub_key, channel) DO UPDATE SET pruned_through = max(pruned_through, excluded.pruned_through)
                    """)
                for (key, through) in floors {
                    try floor.execute(arguments: [key.subscribeKey, key.channel, through])
                }
                return rows.count
            }
            total += removed
            if removed < batchSize { return total }
            await afterBatch?(total)
            await Task.yield()
        }
    }

    /// History query for one channel (pubnub-wire §9): `start` exclusive, `end` inclusive;
    /// the newest `count` in range, or the oldest with `reverse` (ignored when both bounds are
    /// given, as PubNub ignores it). Returned oldest first.
    public func history(
        subscribeKey: String, channel: String, start: Timetoken?, end: Timetoken?, count: Int, reverse: Bool
    ) async throws -> [StoredMessage] {
        try await pool.read { db in
            var conditions = ["sub_key = ?", "channel = ?"]
            var arguments: [any DatabaseValueConvertible] = [subscribeKey, channel]
            switch (start, end) {
            case (let s?, let e?):
                if s >= e {
                    conditions.append("timetoken < ?")
                    conditions.append("timetoken >= ?")
                } else {
                    conditions.append("timetoken > ?")
                    conditions.append("timetoken <= ?")
                }
                arguments.append(s.storageValue)
                arguments.append(e.storageValue)
            case (let s?, nil):
                conditions.append("timetoken < ?")
                arguments.append(s.storageValue)
            case (nil, let e?):
                conditions.append("timetoken >= ?")
                arguments.append(e.storageValue)
            case (nil, nil):
                break
            }
            arguments.append(count)
            // With both bounds PubNub ignores `reverse`: the newest `count` of the range.
            let oldestFirst = reverse && (start == nil || end == nil)
            let rows = try Row.fetchAll(db, sql: """
                SELECT * FROM message WHERE \(conditions.joined(separator: " AND ")) ORDER BY timetoken \(oldestFirst ? "ASC" : "DESC") LIMIT ?
                """, arguments: StatementArguments(arguments))
            let messages = rows.map(StoredMessage.init(row:))
            return oldestFirst ? messages : messages.reversed()
        }
    }

    /// Counts stored messages newer than the given timetoken per channel (and at or before
    /// `through`, when given), capped at 10,000.
    public func messageCounts(subscribeKey: String, channels: [(String, Timetoken)], through: Timetoken? = nil) async throws -> [String: Int] {
        try await pool.read { db in
            var counts: [String: Int] = [:]
            let upper = (through ?? Timetoken(UInt64(Int64.max))).storageValue
            for (channel, after) in channels {
                counts[channel] = try Int.fetchOne(db, sql: """
                    SELECT COUNT(*) FROM (SELECT 1 FROM message WHERE sub_key = ? AND channel = ? AND timetoken > ? AND timetoken <= ?
                                          LIMIT 10000)
                    """, arguments: [subscribeKey, channel, after.storageValue, upper]) ?? 0
            }
            return counts
        }
    }

    /// Deletes messages of a channel with `start < timetoken <= end` (either bound optional).
    /// - Returns: the number of messages deleted.
    @discardableResult
    public func delete(subscribeKey: String, channel: String, start: Timetoken?, end: Timetoken?) async throws -> Int {
        try await pool.write { db in
            // `start` is exclusive and `end` inclusive. With both, in either order, as history
            // reads them (start < end: start < tt <= end; start > end: end <= tt < start). With
            // one: only `start` deletes everything after it, only `end` everything up to it.
            var sql = "DELETE FROM message WHERE sub_key = ? AND channel = ?"
            var arguments: [any DatabaseValueConvertible] = [subscribeKey, channel]
            switch (start, end) {
            case (let s?, let e?) where s > e:
                sql += " AND timetoken < ? AND timetoken >= ?"
                arguments += [s.storageValue, e.storageValue]
            case (let s?, let e?):
                sql += " AND timetoken > ? AND timetoken <= ?"
                arguments += [s.storageValue, e.storageValue]
            case (let s?, nil):
                sql += " AND timetoken > ?"
                arguments.append(s.storageValue)
            case (nil, let e?):
                sql += " AND timetoken <= ?"
                arguments.append(e.storageValue)
            case (nil, nil):
                break
            }
            try db.execute(sql: sql, arguments: StatementArguments(arguments))
            return db.changesCount
        }
    }

    /// Number of stored messages (a full scan: for tests and tools, not for health).
    public func messageCount() async throws -> Int {
        try await pool.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM message") ?? 0 }
    }

    /// Runs SQLite's integrity check; returns `true` when the file is consistent.
    public func integrityCheck() async throws -> Bool {
        try await pool.read { db in try String.fetchOne(db, sql: "PRAGMA quick_check") == "ok" }
    }
}
