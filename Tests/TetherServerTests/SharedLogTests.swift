import Foundation
import Logging
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
