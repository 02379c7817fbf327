import Foundation
import Logging
import NIOCore
import NIOHTTP1
import PostgresNIO
import TetherTesting
import TetherTestingServer
import Synchronization
import Testing
@_spi(Benchmarks) import TetherProtocol
@_spi(Benchmarks) import TetherServerCore
@testable import TetherServer

/// The database URL as the operator writes it: parsed with errors that say what is missing,
/// the password never shown.
@Suite struct DatabaseURLTests {
    @Test func parsesEveryPart() throws {
        let url = try DatabaseURL("postgres://tether:s3cr%40t@db.example:6543/chat?sslmode=require")
        #expect(url.host == "db.example")
        #expect(url.port == 6543)
        #expect(url.username == "tether")
        #expect(url.password == "s3cr@t")
        #expect(url.database == "chat")
        #expect(url.tls == .require)
        #expect(url.description == "postgres://tether:***@db.example:6543/chat")
        #expect(!"\(url)".contains("s3cr"))
    }

    @Test func defaultsPortAndTLS() throws {
        let url = try DatabaseURL("postgresql://me@127.0.0.1/tether")
        #expect(url.port == 5432)
        #expect(url.tls == .prefer)
        #expect(url.password == nil)
    }

    @Test(arguments: [
        ("mysql://u@h/db", "postgres://"),
        ("postgres://h/db", "no user name"),
        ("postgres://u@h", "no database name"),
        ("postgres://u@h/", "no database name"),
        ("postgres://u@h:0/db", "port"),
        ("postgres://u@h/db?sslmode=verify-full", "sslmode"),
        ("postgres://u@h/db?application_name=x", "not supported"),
        ("not a url", "postgres://"),
    ])
    func refusesWhatCannotWork(text: String, says: String) {
        #expect {
            _ = try DatabaseURL(text)
        } throws: { error in
            "\(error)".contains(says)
        }
    }
}

/// The shared log on a real PostgreSQL: migrations, the global cursor across writers on two
/// "nodes" (two logs on one database), request-id memory across nodes, and clear failures.
@Suite(.enabled(if: TestPostgres.available, "TETHER_TEST_DATABASE_URL is not set (scripts/test starts a PostgreSQL and sets it)"),
       .serialized)
struct SharedLogTests {
    private static func envelope(_ channel: String, _ payload: String, publisher: String = "p") -> SubscribeEnvelope {
        SubscribeEnvelope(timetoken: .zero, subscribeKey: "k", channel: channel, payload: payload, publisher: publisher)
    }

    @Test func nodesStartingTogetherMigrateOnce() async throws {
        try await TestPostgres.withDatabase { url in
            let logs = try await withThrowingTaskGroup(of: SharedLog.self) { group in
                for _ in 0..<3 { group.addTask { try await TestPostgres.open(url) } }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            for log in logs {
                #expect(try await log.appliedSchemaVersions() == SharedLogSchema.migrations.map(\.version))
                log.close()
            }
        }
    }

    @Test func aDatabaseMigratedByANewerTetherIsRefused() async throws {
        try await TestPostgres.withDatabase { url in
            try await TestPostgres.open(url).close()
            try await DatabaseAdmin.run(on: url, "INSERT INTO tether_schema_migrations (version, name) VALUES (9999, 'from the future')")
            do {
                _ = try await TestPostgres.open(url)
                Issue.record("opened a database at schema 9999")
            } catch let error as SharedLogError {
                #expect("\(error)".contains("version 9999"))
                #expect("\(error)".contains("up to \(SharedLogSchema.latestVersion)"))
            }
        }
    }

    @Test func aMigrationMissingBelowTheNewestIsApplied() async throws {
        try await TestPostgres.withDatabase { url in
            try await TestPostgres.open(url).close()
            // As if a release had skipped version 3 while recording 4.
            try await DatabaseAdmin.run(on: url, "DROP TABLE tether_presence_interval")
            try await DatabaseAdmin.run(on: url, "DROP TABLE tether_presence")
            try await DatabaseAdmin.run(on: url, "DELETE FROM tether_schema_migrations WHERE version = 3")
            let log = try await TestPostgres.open(url)
            #expect(try await log.appliedSchemaVersions() == SharedLogSchema.migrations.map(\.version))
            try await DatabaseAdmin.run(on: url, "SELECT count(*) FROM tether_presence")
            log.close()
        }
    }

    @Test func anUnreachableDatabaseIsNamedWithoutItsPassword() async throws {
        let url = try DatabaseURL("postgres://tether:hunter22@127.0.0.1:1/tether?sslmode=disable")
        do {
            _ = try await TestPostgres.open(url)
            Issue.record("opened a database on port 1")
        } catch let error as SharedLogError {
            #expect("\(error)".contains("127.0.0.1:1/tether"))
            #expect(!"\(error)".contains("hunter22"))
        }
    }

    /// Two nodes publish concurrently; each node's reader receives every event exactly once, in
    /// strictly increasing timetoken order, and never an event at or below a horizon it was
    /// already given: the cursor rule across nodes.
    @Test func concurrentWritersOnTwoNodesGiveEveryReaderOneOrder() async throws {
        try await TestPostgres.withDatabase { url in
            let a = RunningLog(try await TestPostgres.open(url))
            let b = RunningLog(try await TestPostgres.open(url))
            let perNode = 150
            let acknowledged = try await withThrowingTaskGroup(of: Timetoken.self) { group in
                for i in 0..<perNode {
                    group.addTask {
                        try await a.log.append(SharedEvent(envelope: Self.envelope("c\(i % 3)", "\"a\(i)\""), isStored: i % 2 == 0,
                                                           retentionHours: nil, dedupKey: nil)).timetoken
                    }
                    group.addTask {
                        try await b.log.append(SharedEvent(envelope: Self.envelope("c\(i % 5)", "\"b\(i)\""), isStored: true,
                                                           retentionHours: 1, dedupKey: nil)).timetoken
                    }
                }
                return try await group.reduce(into: Set<Timetoken>()) { $0.insert($1) }
            }
            #expect(acknowledged.count == 2 * perNode)
            for node in [a, b] {
                #expect(await node.waitForDeliveries(2 * perNode))
                let delivered = node.delivered.withLock { $0 }
                let timetokens = delivered.map(\.event.timetoken)
                #expect(Set(timetokens) == acknowledged)
                #expect(zip(timetokens, timetokens.dropFirst()).allSatisfy { $0 < $1 }, "delivered out of order")
                // Every event arrived above the horizon of every earlier delivery.
                var previousHorizon = Timetoken.zero
                var index = 0
                for horizon in node.horizons.withLock({ $0 }) {
                    while index < delivered.count, delivered[index].horizon == horizon {
                        #expect(delivered[index].event.timetoken > previousHorizon)
                        #expect(delivered[index].event.timetoken <= horizon)
                        index += 1
                    }
                    #expect(horizon >= previousHorizon)
                    previousHorizon = horizon
                }
            }
            await a.stop()
            await b.stop()
        }
    }

    /// A control entry this node cannot read (one a newer node wrote) inside a full page of the
    /// log is skipped, and the page still counts as full: the next read starts after it, and the
    /// events behind it are delivered rather than stepped over.
    @Test func anUnreadableEntryInAFullPageDoesNotSkipTheEventsAfterIt() async throws {
        try await TestPostgres.withDatabase { url in
            let log = try await TestPostgres.open(url)
            let base = log.startHorizon.storageValue + 1_000
            try await log.client.query("""
                INSERT INTO tether_event (tt, sub_key, channel, kind, publisher, payload, meta, custom_type, seqn, stored, expires_at)
                SELECT \(base) + g, 'k', 'c', 0, 'p', '"m' || g || '"', NULL, NULL, NULL, true, NULL FROM generate_series(1, 1001) g
                """, logger: TestPostgres.logger)
            try await log.client.query("""
                UPDATE tether_event SET kind = \(SharedControlCoding.kind), payload = '{"op":"from-a-newer-node"}' WHERE tt = \(base + 500)
                """, logger: TestPostgres.logger)
            try await log.client.query("UPDATE tether_sequencer SET last_tt = GREATEST(last_tt, \(base + 1001)) WHERE id = 1",
                                       logger: TestPostgres.logger)
            let node = RunningLog(log)
            #expect(await node.waitForDeliveries(1_000))
            let timetokens = node.timetokens.map(\.rawValue)
            #expect(timetokens.count == 1_000)
            #expect(timetokens.last == UInt64(base + 1001), "the event after the full page was delivered")
            #expect(!timetokens.contains(UInt64(base + 500)))
            await node.stop()
        }
    }

    /// A cursor another node handed out, above this node's own because this node's reader has
    /// not got there yet, is kept: lowering it to this node's cursor would deliver the events in
    /// between a second time. Only a cursor above the shared sequencer is lowered, to it.
    @Test func aCursorAnotherNodeHandedOutIsKeptByANodeThatIsBehind() async throws {
        try await TestPostgres.withDatabase { url in
            let a = RunningLog(try await TestPostgres.open(url))
            let behind = try await TestPostgres.open(url)  // its reader never runs: it stays behind
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-behind-\(UUID().uuidString)").path
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let store = try MessageStore(directory: directory, logger: TestPostgres.logger, metrics: ServerMetrics())
            let hub = try LongPollHub(store: store, metrics: ServerMetrics(), logger: TestPostgres.logger, deduplication: .init(),
                                      dedupClock: LongPollHub.systemNow, shared: behind)
            let published = try await a.log.append(SharedEvent(envelope: Self.envelope("c", "\"m\""), isStored: true,
                                                               retentionHours: nil, dedupKey: nil)).timetoken
            #expect(await a.waitForDeliveries(1))
            let own = hub.currentCursor
            #expect(own < published)
            #expect(await hub.readPoint(for: published) == published)
            #expect(await hub.readPoint(for: own) == own)
            let sequencer = try await behind.sequencerValue()
            #expect(sequencer >= published)
            #expect(await hub.readPoint(for: Timetoken(sequencer.rawValue + 10_000_000_000)) == sequencer)
            try store.close()
            behind.close()
            await a.stop()
        }
    }

    @Test func aRepeatedRequestIDOnAnotherNodeGetsTheOriginal() async throws {
        try await TestPostgres.withDatabase { url in
            let a = RunningLog(try await TestPostgres.open(url))
            let b = RunningLog(try await TestPostgres.open(url))
            let key = DedupKey(subscribeKey: "k", publisher: "p", requestID: "r-1")
            let first = try await a.log.append(SharedEvent(envelope: Self.envelope("c", "\"once\""), isStored: true,
                                                           retentionHours: nil, dedupKey: key))
            let again = try await b.log.append(SharedEvent(envelope: Self.envelope("c", "\"once\""), isStored: true,
                                                           retentionHours: nil, dedupKey: key))
            guard case .appended(let timetoken) = first else {
                Issue.record("the first publish was not appended: \(first)")
                return
            }
            #expect(again == .repeated(timetoken))
            let history = try await b.log.history(subscribeKey: "k", channel: "c", start: nil, end: nil, count: 10, reverse: false)
            #expect(history.map(\.timetoken) == [timetoken])
            #expect(try await a.log.publishRecordCount() == 1)
            await a.stop()
            await b.stop()
        }
    }

    /// An insert PostgreSQL refuses (here a trigger; a full disk or a constraint does the same)
    /// fails the publish. Its statement returns rows, so PostgreSQL's error arrives with them:
    /// unread, it was lost, the transaction's `COMMIT` quietly rolled back, and the publisher
    /// was told "sent" with a timetoken no reader would ever see.
    @Test func anInsertPostgreSQLRefusesFailsThePublishInsteadOfLosingIt() async throws {
        try await TestPostgres.withDatabase { url in
            let node = RunningLog(try await TestPostgres.open(url))
            try await node.log.client.query("""
                CREATE FUNCTION tether_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                  IF NEW.payload = '"refused"' THEN RAISE EXCEPTION 'refused by the test'; END IF;
                  RETURN NEW;
                END $$
                """, logger: TestPostgres.logger)
            try await node.log.client.query("""
                CREATE TRIGGER tether_test_refuse BEFORE INSERT ON tether_event FOR EACH ROW EXECUTE FUNCTION tether_test_refuse()
                """, logger: TestPostgres.logger)
            await #expect(throws: StoreError.self) {
                let outcome = try await node.log.append(SharedEvent(envelope: Self.envelope("c", "\"refused\""), isStored: true,
                                                                    retentionHours: nil, dedupKey: nil))
                Issue.record("a refused insert was answered \(outcome)")
            }
            let kept = try await node.log.append(SharedEvent(envelope: Self.envelope("c", "\"kept\""), isStored: true,
                                                             retentionHours: nil, dedupKey: nil))
            let history = try await node.log.history(subscribeKey: "k", channel: "c", start: nil, end: nil, count: 10, reverse: false)
            #expect(history.map(\.payload) == ["\"kept\""])
            #expect(history.map(\.timetoken) == [kept.timetoken])
            await node.stop()
        }
    }

    /// One write PostgreSQL refuses fails alone: the writer writes a refused batch again in
    /// halves, so the publishes batched with it are stored and answered as usual. The writer is
    /// held on the sequencer's lock while the batch gathers, so the refused write and five
    /// others are written together.
    @Test func aWritePostgreSQLRefusesFailsAloneNotWithItsBatch() async throws {
        try await TestPostgres.withDatabase { url in
            var options = SharedLogOptions()
            options.writeTimeout = .seconds(60)  // no deadline passes while the writer is held
            let node = RunningLog(try await TestPostgres.open(url, options: options))
            let holder = try await TestPostgres.open(url)
            try await holder.client.query("""
                CREATE FUNCTION tether_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                  IF NEW.payload = '"refused"' THEN RAISE EXCEPTION 'refused by the test'; END IF;
                  RETURN NEW;
                END $$
                """, logger: TestPostgres.logger)
            try await holder.client.query("""
                CREATE TRIGGER tether_test_refuse BEFORE INSERT ON tether_event FOR EACH ROW EXECUTE FUNCTION tether_test_refuse()
                """, logger: TestPostgres.logger)
            func publish(_ payload: String) -> Task<SharedAppendOutcome, any Error> {
                Task {
                    try await node.log.append(SharedEvent(envelope: Self.envelope("c", "\"\(payload)\""), isStored: true,
                                                          retentionHours: nil, dedupKey: nil))
                }
            }
            var batch: [(String, Task<SharedAppendOutcome, any Error>)] = []
            let first = try await holder.client.transaction(logger: TestPostgres.logger) { connection in
                try await connection.statement("SELECT last_tt FROM tether_sequencer WHERE id = 1 FOR UPDATE", logger: TestPostgres.logger)
                let first = publish("first")
                // The writer's statement (the reader raises the sequencer with another), seen
                // from another connection: within a transaction pg_stat_activity is a snapshot.
                let held = try await eventually(within: 30) {
                    try await holder.client.query("""
                        SELECT count(*)::int FROM pg_stat_activity WHERE datname = current_database()
                          AND query LIKE 'UPDATE tether_sequencer SET last_tt = GREATEST(last_tt + 1%' AND wait_event_type = 'Lock'
                        """, logger: TestPostgres.logger).decode(Int.self).first(where: { _ in true }) == 1
                }
                #expect(held, "the writer never waited on the sequencer")
                for payload in ["a", "b", "refused", "c", "d", "e"] { batch.append((payload, publish(payload))) }
                #expect(await eventually(within: 30) { node.log.queuedWrites == 6 })
                return first
            }
            _ = try await first.value
            var stored: [String] = []
            for (payload, task) in batch {
                do {
                    _ = try await task.value
                    stored.append(payload)
                } catch {
                    #expect(payload == "refused", "\(payload) failed with its batch: \(error)")
                }
            }
            #expect(stored == ["a", "b", "c", "d", "e"])
            // In the order they were queued, which the tasks decide: compared as a set.
            let history = try await node.log.history(subscribeKey: "k", channel: "c", start: nil, end: nil, count: 10, reverse: true)
            #expect(history.first?.payload == "\"first\"")
            #expect(Set(history.dropFirst().map(\.payload)) == ["\"a\"", "\"b\"", "\"c\"", "\"d\"", "\"e\""])
            #expect(history.count == 6)
            await node.stop()
            holder.close()
        }
    }

    /// A running log whose connections go through a fault proxy in front of `url`'s server, with
    /// a write timeout of a minute (the queue's own deadline never answers first).
    private static func nodeBehindAProxy(_ url: DatabaseURL) async throws -> (FaultProxy, RunningLog) {
        let proxy = try await FaultProxy.start(upstreamHost: url.host, upstreamPort: url.port)
        var proxied = url
        proxied.host = proxy.host
        proxied.port = proxy.port
        var options = SharedLogOptions()
        options.writeTimeout = .seconds(60)
        return (proxy, RunningLog(try await TestPostgres.open(proxied, options: options)))
    }

    /// Every connection of a node is reset at once (a network blip, a proxy restarting): the
    /// node writes again at once, its first writes failing as "unavailable" (503, retry), never
    /// held until the write timeout. PostgresNIO's pool can lease a connection whose socket has
    /// just failed, and a statement sent on it is never answered; `BEGIN` is given two seconds
    /// (``PostgresConnection/beginLimit``). Before, the writer waited for its watchdog, and each
    /// publish of the node failed meanwhile. The race is hit in about a third of the rounds.
    @Test(arguments: 0..<6) func aNodeWritesAgainRightAfterItsConnectionsAreReset(_ round: Int) async throws {
        try await TestPostgres.withDatabase { url in
            // A write held by a dead connection would show as timedOut.
            let (proxy, node) = try await Self.nodeBehindAProxy(url)
            func append(_ payload: String) async throws -> SharedAppendOutcome {
                try await node.log.append(SharedEvent(envelope: Self.envelope("c", payload), isStored: true, retentionHours: nil,
                                                      dedupKey: nil))
            }
            for i in 0..<3 { _ = try await append("\(i)") }
            await proxy.resetOpenConnections()
            var failures: [StoreError] = []
            var written = false
            while !written, failures.count < 20 {
                do {
                    _ = try await append("\"after\"")
                    written = true
                } catch let error as StoreError {
                    failures.append(error)
                }
            }
            #expect(written, "no write succeeded after the reset: \(failures)")
            #expect(failures.allSatisfy { $0.code == .unavailable }, "round \(round): \(failures)")
            await node.stop()
            await proxy.stop()
        }
    }

    /// A `COMMIT` whose answer never arrives (the connection to PostgreSQL is cut while it
    /// commits) may have committed: the publisher hears "outcome unknown" (504, "may be
    /// stored"), never "unavailable" (503, "not stored", which invites a retry that stores it
    /// twice). Here the commit is held by a deferred trigger waiting on a lock the test holds,
    /// the connection is reset through a fault proxy, and the lock released: PostgreSQL commits
    /// it, so the message is in history and a repeat of its request id gets its timetoken.
    @Test func aCommitWhoseAnswerIsLostIsOutcomeUnknown() async throws {
        try await TestPostgres.withDatabase { url in
            let (proxy, node) = try await Self.nodeBehindAProxy(url)
            let direct = try await TestPostgres.open(url)
            try await direct.client.query("""
                CREATE FUNCTION tether_test_hold() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                  IF NEW.payload = '"held"' THEN PERFORM pg_advisory_xact_lock_shared(4242); END IF;
                  RETURN NULL;
                END $$
                """, logger: TestPostgres.logger)
            try await direct.client.query("""
                CREATE CONSTRAINT TRIGGER tether_test_hold AFTER INSERT ON tether_event DEFERRABLE INITIALLY DEFERRED
                FOR EACH ROW EXECUTE FUNCTION tether_test_hold()
                """, logger: TestPostgres.logger)
            let key = DedupKey(subscribeKey: "k", publisher: "p", requestID: "r-held")
            let event = SharedEvent(envelope: Self.envelope("c", "\"held\""), isStored: true, retentionHours: nil, dedupKey: key)
            try await direct.client.withConnection { holder in
                try await holder.statement("SELECT pg_advisory_lock(4242)", logger: TestPostgres.logger)
                let publish = Task { try await node.log.append(event) }
                let committing = try await eventually(within: 30) {
                    let waiting = try await holder.query("""
                        SELECT count(*)::int FROM pg_stat_activity WHERE datname = current_database()
                          AND query LIKE 'COMMIT%' AND wait_event_type = 'Lock'
                        """, logger: TestPostgres.logger).decode(Int.self).first(where: { _ in true }) ?? 0
                    return waiting == 1
                }
                #expect(committing, "the publish's COMMIT never waited on the trigger's lock")
                await proxy.resetOpenConnections()
                try await holder.statement("SELECT pg_advisory_unlock(4242)", logger: TestPostgres.logger)
                do {
                    let outcome = try await publish.value
                    Issue.record("a commit whose answer was lost was answered \(outcome)")
                } catch let error as StoreError {
                    #expect(error.code == .outcomeUnknown, "\(error)")
                }
            }
            // PostgreSQL did commit it (once its backend, released from the lock, finishes the
            // commit): in history once, and its request id is remembered.
            var history: [StoredMessage] = []
            _ = try await eventually(within: 30) {
                history = try await direct.history(subscribeKey: "k", channel: "c", start: nil, end: nil, count: 10, reverse: false)
                return !history.isEmpty
            }
            #expect(history.map(\.payload) == ["\"held\""])
            // Repeated on another node (the proxied one's pool is still replacing the
            // connections the proxy reset, which is not what this test is about).
            let other = RunningLog(try await TestPostgres.open(url))
            let repeated = try await other.log.append(event)
            #expect(repeated == .repeated(history.first?.timetoken ?? Timetoken(0)))
            await other.stop()
            await node.stop()
            direct.close()
            await proxy.stop()
        }
    }

    /// A transaction whose body left an error unread (a statement with rows, its error after
    /// them) is aborted, and PostgreSQL answers its `COMMIT` with `ROLLBACK`: the shared log's
    /// transaction reads that answer and fails, and nothing is kept.
    @Test func aCommitAnsweredRollbackFailsTheTransaction() async throws {
        try await TestPostgres.withDatabase { url in
            let log = try await TestPostgres.open(url)
            try await log.client.query("CREATE TABLE tether_test_kept (v int)", logger: TestPostgres.logger)
            do {
                try await log.client.transaction(logger: TestPostgres.logger) { connection in
                    try await connection.query("INSERT INTO tether_test_kept VALUES (1)", logger: TestPostgres.logger)
                    _ = try await connection.query("SELECT 1 / (v - 1) FROM tether_test_kept", logger: TestPostgres.logger)
                }
                Issue.record("a COMMIT answered ROLLBACK passed for a commit")
            } catch let error as SharedTransactionError {
                #expect(error.step == .commit)
                #expect(error.cause is RolledBackAtCommit, "\(error)")
                #expect(!error.mayHaveCommitted)
                #expect(SharedLog.classify(error).code == .failed)
            }
            let count = try await log.client.query("SELECT count(*)::int FROM tether_test_kept", logger: TestPostgres.logger)
                .decode(Int.self).first(where: { _ in true })
            #expect(count == 0)
            log.close()
        }
    }

    /// The log's history, catch-up reads, counts, deletes and retention answer as the embedded
    /// store's do (the same expectations as the SQLite store tests).
    @Test func readsAnswerAsTheEmbeddedStoreDoes() async throws {
        try await TestPostgres.withDatabase { url in
            let node = RunningLog(try await TestPostgres.open(url))
            var timetokens: [Timetoken] = []
            for i in 0..<6 {
                let channel = i < 4 ? "room.a" : "room.b"
                timetokens.append(try await node.log.append(SharedEvent(
                    envelope: Self.envelope(channel, "\(i)"), isStored: true, retentionHours: i == 0 ? 0.0001 : nil,
                    dedupKey: nil)).timetoken)
            }
            // Not stored: delivered, never in history.
            _ = try await node.log.append(SharedEvent(envelope: Self.envelope("room.a", "\"signal\""), isStored: false,
                                                      retentionHours: nil, dedupKey: nil))
            let all = try await node.log.history(subscribeKey: "k", channel: "room.a", start: nil, end: nil, count: 100, reverse: false)
            #expect(all.map(\.payload) == ["0", "1", "2", "3"])
            let newestTwo = try await node.log.history(subscribeKey: "k", channel: "room.a", start: nil, end: nil, count: 2, reverse: false)
            #expect(newestTwo.map(\.payload) == ["2", "3"])
            let oldestTwo = try await node.log.history(subscribeKey: "k", channel: "room.a", start: nil, end: nil, count: 2, reverse: true)
            #expect(oldestTwo.map(\.payload) == ["0", "1"])
            let between = try await node.log.history(subscribeKey: "k", channel: "room.a", start: timetokens[0], end: timetokens[2],
                                                     count: 100, reverse: false)
            #expect(between.map(\.payload) == ["1", "2"])
            let counts = try await node.log.messageCounts(subscribeKey: "k", channels: [("room.a", timetokens[1]), ("room.b", .zero)],
                                                          through: nil)
            #expect(counts == ["room.a": 2, "room.b": 2])
            let wildcard = try await node.log.read(StoreRange(subscribeKey: "k", selector: .prefix("room."), after: timetokens[2],
                                                              through: .maximumStorable, match: "room.*"), limit: 10)
            #expect(wildcard.envelopes.map(\.payload) == ["3", "4", "5"])
            #expect(try await node.log.delete(subscribeKey: "k", channel: "room.b", start: nil, end: nil) == 2)
            #expect(try await node.log.messageCount() == 4)
            // Retention: the first message expires 0.36 s after its timetoken.
            let pruned = try await node.log.pruneExpired(now: timetokens[0].adding(seconds: 1))
            #expect(pruned == 1)
            let gaps = try await node.log.retentionGaps(subscribeKey: "k", channels: ["room.a"], prefixes: [], after: .zero)
            #expect(gaps == [RetentionGap(channel: "room.a", from: .zero, through: timetokens[0])])
            await node.stop()
        }
    }
}

/// Changes to shared state (groups, grants, revocations) through the log: applied to the
/// tables under the sequencer lock, seen by every node in one order, read back at start-up.
@Suite(.enabled(if: TestPostgres.available, "TETHER_TEST_DATABASE_URL is not set (scripts/test starts a PostgreSQL and sets it)"),
       .serialized)
struct SharedChangeTests {
    @Test func groupChangesFromTwoNodesReachBothInOneOrder() async throws {
        try await TestPostgres.withDatabase { url in
            let a = RunningLog(try await TestPostgres.open(url))
            let b = RunningLog(try await TestPostgres.open(url))
            async let first = a.log.change(.group(subscribeKey: "k", group: "g", add: ["x", "y"], remove: [], delete: false, maximum: 3))
            async let second = b.log.change(.group(subscribeKey: "k", group: "g", add: ["z"], remove: [], delete: false, maximum: 3))
            let results = try await [first, second]
            // Whichever committed second saw the first's channels.
            let last = results.max { $0.timetoken < $1.timetoken }!
            #expect(last.control == .group(subscribeKey: "k", group: "g", channels: ["x", "y", "z"], refused: false))
            // Over the maximum: refused, nothing changed.
            let refused = try await a.log.change(.group(subscribeKey: "k", group: "g", add: ["w"], remove: [], delete: false, maximum: 3))
            #expect(refused.control == .group(subscribeKey: "k", group: "g", channels: ["x", "y", "z"], refused: true))
            let removed = try await b.log.change(.group(subscribeKey: "k", group: "g", add: [], remove: ["x"], delete: false, maximum: 3))
            #expect(removed.control == .group(subscribeKey: "k", group: "g", channels: ["y", "z"], refused: false))
            for node in [a, b] {
                let deadline = ContinuousClock.now + .seconds(20)
                while node.controls.withLock({ $0.count }) < 4, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(20)) }
            }
            let seenByA = a.controls.withLock { $0.map(\.at) }
            #expect(seenByA.count == 4)
            #expect(seenByA == b.controls.withLock { $0.map(\.at) })
            #expect(seenByA == seenByA.sorted())
            // A node starting now reads the tables as they are.
            let later = try await TestPostgres.open(url)
            #expect(Set(later.startState.groups.map(\.2)) == ["y", "z"])
            #expect(try await later.groupNames(subscribeKey: "k") == ["g"])
            later.close()
            await a.stop()
            await b.stop()
        }
    }

    @Test func grantsAndRevocationsAreKeptAndReadBack() async throws {
        try await TestPostgres.withDatabase { url in
            let node = RunningLog(try await TestPostgres.open(url))
            let grant = Grant(subscribeKey: "k", target: .channel("room"), authKey: "auth-1", permissions: [.read, .write], ttlMinutes: 60,
                              expiresAt: Timetoken(unixSeconds: 4_000_000_000))
            let keysetGrant = Grant(subscribeKey: "k", target: .keyset, authKey: nil, permissions: [.read], ttlMinutes: 0, expiresAt: nil)
            _ = try await node.log.change(.grants([grant, keysetGrant]))
            _ = try await node.log.change(.revocation(signature: "abc123", expiresAt: Timetoken(unixSeconds: 4_000_000_000)))
            var revoked = grant
            revoked.permissions = []
            let reopened = try await TestPostgres.open(url)
            #expect(Set(reopened.startState.grants) == [grant, keysetGrant])
            #expect(reopened.startState.revocations == ["abc123": Timetoken(unixSeconds: 4_000_000_000)])
            reopened.close()
            // A grant with no permissions removes its row.
            _ = try await node.log.change(.grants([revoked]))
            let again = try await TestPostgres.open(url)
            #expect(again.startState.grants == [keysetGrant])
            again.close()
            await node.stop()
        }
    }
}

/// Two Tether servers on one database are two nodes of a cluster: whatever is published on
/// either reaches subscribers on both, one cursor works on both, groups and grants are shared.
@Suite(.enabled(if: TestPostgres.available, "TETHER_TEST_DATABASE_URL is not set (scripts/test starts a PostgreSQL and sets it)"),
       .serialized)
struct ClusterServerTests {
    private static func withNodes(_ count: Int = 2, file: ConfigurationFile = .init(subscribeTimeoutSeconds: 30),
                                  _ body: ([TestServer]) async throws -> Void) async throws {
        try await TestPostgres.withDatabase { url in
            var nodes: [TestServer] = []
            for _ in 0..<count { nodes.append(try await TestServer.start(file: file, databaseURL: "\(url.unredacted)")) }
            do {
                try await body(nodes)
            } catch {
                for node in nodes { await node.inProcess.stop() }
                throw error
            }
            for node in nodes { await node.inProcess.stop() }
        }
    }

    @Test func aMessagePublishedOnOneNodeReachesSubscribersOnTheOther() async throws {
        try await Self.withNodes { nodes in
            let (a, b) = (nodes[0], nodes[1])
            let cursor = try await b.handshake("news")
            async let received = b.subscribe("news", tt: cursor)
            #expect(await b.longPollsWaiting(1))
            let timetoken = try await a.publish("news", "\"from A\"")
            let (next, messages, _) = try await received
            #expect(messages.map { $0["d"] as? String } == ["from A"])
            // The cursor is the log's horizon when B read it: the message's timetoken, or later
            // when the sequencer was raised since (a slow machine); never before it.
            #expect(next >= timetoken)
            // History on either node.
            let history = try await b.get("/v2/history/sub-key/demo/channel/news")
            #expect(history.body.contains("from A"))
            // The cursor B handed out works on A: a message published on B after it arrives there.
            async let onA = a.subscribe("news", tt: next)
            let second = try await b.publish("news", "\"from B\"")
            let (cursorOnA, messagesOnA, _) = try await onA
            #expect(messagesOnA.map { $0["d"] as? String } == ["from B"])
            #expect(cursorOnA >= second)
        }
    }

    /// A node started after a signal and a `store=0` publish never had them in memory: a
    /// subscriber arriving with a cursor from before it started gets them from the log (which
    /// keeps them ten minutes), in order with the stored message between them, and no gap.
    @Test func aNodeStartedLaterDeliversEventsHistoryDoesNotKeepFromBeforeItStarted() async throws {
        try await TestPostgres.withDatabase { url in
            let a = try await TestServer.start(file: .init(subscribeTimeoutSeconds: 30), databaseURL: "\(url.unredacted)")
            var cursor = try await a.handshake("news")
            while cursor == .zero {  // a new database's sequencer starts at 0 and follows the clock once idle
                try await Task.sleep(for: .milliseconds(50))
                cursor = try await a.handshake("news")
            }
            let signal = try await a.get("/signal/demo/demo/0/news/0/%22signal%22?uuid=tester")
            #expect(signal.status == 200, "\(signal.body)")
            try await a.publish("news", "\"stored\"")
            try await a.publish("news", "\"live only\"", query: "&store=0")
            let b = try await TestServer.start(file: .init(subscribeTimeoutSeconds: 30), databaseURL: "\(url.unredacted)")
            let (_, messages, headers) = try await b.subscribe("news", tt: cursor)
            #expect(messages.map { $0["d"] as? String } == ["signal", "stored", "live only"])
            #expect(headers["X-Tether-Gap"].isEmpty, "\(headers["X-Tether-Gap"])")
            await b.inProcess.stop()
            await a.inProcess.stop()
        }
    }

    /// Below the horizon a node started at, events history does not keep come from the log,
    /// which prunes them: a cursor older than the log keeps them is told of a gap on every name
    /// it subscribes to; a recent one is not.
    @Test func aCursorOlderThanTheLogKeepsLiveEventsIsAGapOnANodeStartedSince() async throws {
        try await TestPostgres.withDatabase { url in
            var options = SharedLogOptions()
            options.ephemeralSeconds = 120
            let log = try await TestPostgres.open(url, options: options)
            let now = log.clock()
            let old = Timetoken(UInt64(now.storageValue - 180 * 10_000_000))
            let gaps = log.addingUnseenEventGaps(to: [], channels: ["a", "a-pnpres"], prefixes: ["b."], after: old)
            #expect(Set(gaps.map(\.channel)) == ["a", "b.*"])
            #expect(gaps.allSatisfy { $0.from == old && $0.through > old && $0.through <= log.startHorizon })
            // Merged with a retention gap on the same name: one gap, through the later of the two.
            let merged = log.addingUnseenEventGaps(to: [RetentionGap(channel: "a", from: old, through: Timetoken(old.rawValue + 1))],
                                                   channels: ["a"], prefixes: [], after: old)
            #expect(merged.count == 1 && merged.first.map { $0.through > Timetoken(old.rawValue + 1) } == true)
            let recent = Timetoken(UInt64(now.storageValue - 30 * 10_000_000))
            #expect(log.addingUnseenEventGaps(to: [], channels: ["a"], prefixes: ["b."], after: recent).isEmpty)
            log.close()
        }
    }

    @Test func burstsFromBothNodesArriveOnceInOrderOnBoth() async throws {
        try await Self.withNodes { nodes in
            let start = try await nodes[0].handshake("burst")
            let published = try await withThrowingTaskGroup(of: Timetoken.self) { group in
                for i in 0..<40 { group.addTask { try await nodes[i % 2].publish("burst", "\(i)") } }
                return try await group.reduce(into: [Timetoken]()) { $0.append($1) }
            }
            for node in nodes {
                var cursor = start
                var seen: [Timetoken] = []
                while seen.count < published.count {
                    let (next, messages, _) = try await node.subscribe("burst", tt: cursor, timeout: .seconds(20))
                    seen += messages.compactMap { $0.publishTimetoken.flatMap(Timetoken.init(parsing:)) }
                    cursor = next
                }
                #expect(seen == published.sorted())
            }
        }
    }

    @Test func aChannelGroupMadeOnOneNodeWorksOnTheOther() async throws {
        try await Self.withNodes { nodes in
            let (a, b) = (nodes[0], nodes[1])
            let added = try await a.get("/v1/channel-registration/sub-key/demo/channel-group/team?add=alpha,beta")
            #expect(added.status == 200)
            // B learns of the group through the log.
            await b.server.state.hub.waitUntilVisible(a.server.state.hub.currentCursor)
            let listed = try await b.object("/v1/channel-registration/sub-key/demo/channel-group/team")
            #expect(((listed["payload"] as? [String: Any])?["channels"] as? [String]) == ["alpha", "beta"])
            let cursor = try await b.subscribe(",", tt: .zero, groups: "team").cursor
            async let received = b.subscribe(",", tt: cursor, groups: "team")
            #expect(await b.longPollsWaiting(1))
            try await a.publish("beta", "\"to the team\"")
            #expect(try await received.messages.map { $0["d"] as? String } == ["to the team"])
        }
    }

    @Test func grantsMadeOnOneNodeDecideOnTheOther() async throws {
        try await Self.withNodes { nodes in
            let (a, b) = (nodes[0], nodes[1])
            let keyset = Keyset(publishKey: "pub", subscribeKey: "sub", secretKey: "secret")
            let grant = Grant(subscribeKey: "sub", target: .channel("vault"), authKey: "key-1", permissions: [.read], ttlMinutes: 0,
                              expiresAt: nil)
            let request = AccessRequest(channels: ["vault"], groups: [], permission: .read, uuid: nil)
            #expect(b.server.state.access.check(request, keyset: keyset, auth: "key-1", signature: .absent).decision != .allowed)
            try await a.server.state.access.apply([grant])
            // B applies it when its reader reaches the change.
            let deadline = ContinuousClock.now + .seconds(20)
            while b.server.state.access.check(request, keyset: keyset, auth: "key-1", signature: .absent).decision != .allowed,
                  ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(20))
            }
            #expect(b.server.state.access.check(request, keyset: keyset, auth: "key-1", signature: .absent).decision == .allowed)
        }
    }
}
