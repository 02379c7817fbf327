import Foundation
import GRDB
import Logging
import NIOCore
import NIOHTTP1
import Synchronization
import Testing
import TetherProtocol
@testable import TetherServer
import TetherTesting

/// The store keeps its promise: durability as documented, clear failures, bounded waits, and
/// realtime traffic that needs no storage unaffected by a store in trouble.
@Suite(.serialized) struct StoreDurabilityTests {
    private static func temporaryDirectory() -> String {
        FileManager.default.temporaryDirectory.appendingPathComponent("tether-store-\(UUID().uuidString)").path
    }

    private static var quietLogger: Logger {
        var logger = Logger(label: "store-test")
        logger.logLevel = .critical
        return logger
    }

    // MARK: - Durability setting

    @Test func theWriterIsFullySynchronousByDefault() throws {
        // GRDB's WAL setup resets the writer to NORMAL after `prepareDatabase`: read it back.
        let store = try MessageStore(directory: Self.temporaryDirectory(), logger: Self.quietLogger, metrics: ServerMetrics())
        #expect(try store.writerSynchronousSetting() == 2)
        try store.close()
        let normal = try MessageStore(directory: Self.temporaryDirectory(), options: .init(durability: .normal),
                                      logger: Self.quietLogger, metrics: ServerMetrics())
        #expect(try normal.writerSynchronousSetting() == 1)
        try normal.close()
    }

    @Test func storeSettingsDecodeAndValidate() throws {
        let file = try JSONDecoder().decode(ConfigurationFile.self, from: Data("""
            {"store": {"durability": "normal", "maxBytes": 10485760, "writeTimeoutSeconds": 2.5, "writeQueueLimit": 100}}
            """.utf8))
        try file.validate()
        let options = try #require(file.store).options
        #expect(options == StoreOptions(durability: .normal, maximumBytes: 10_485_760, writeTimeout: .milliseconds(2500),
                                        writeQueueLimit: 100))
        #expect(ConfigurationFile().store?.options ?? StoreOptions() == StoreOptions(durability: .full, maximumBytes: nil))
        var bad = ConfigurationFile()
        bad.store = .init(writeQueueLimit: 0)
        #expect(throws: ServerConfigurationError.self) { try bad.validate() }
        bad.store = .init(maxBytes: 1000)
        #expect(throws: ServerConfigurationError.self) { try bad.validate() }
    }

    // MARK: - The write queue (pure)

    @Test func theWriteQueueIsBoundedAndAnswersEveryWriteOnce() {
        var queue = StoreWriteQueue<String>(limit: 2)
        let message = StoredMessage(subscribeKey: "k", channel: "c", timetoken: Timetoken(1), publisher: nil, payload: "1",
                                    meta: nil, customMessageType: nil, sequence: nil, expiresAt: nil)
        let a = queue.makeID(), b = queue.makeID(), c = queue.makeID()
        let accepted = [queue.enqueue(id: a, message, waiter: "a"), queue.enqueue(id: b, message, waiter: "b"),
                        queue.enqueue(id: c, message, waiter: "c")]
        #expect(accepted == [true, true, false])  // full: `c` refused, nothing queued
        let batch = queue.takeBatch().map(\.id)
        #expect(batch == [a, b])
        #expect(queue.queuedCount == 0)
        // `a` times out while the writer waits for the lock: withdrawn, and never claimed.
        guard case .withdrawn("a") = queue.expire(a) else { Issue.record("a not withdrawn"); return }
        let claimed = queue.claim([a, b])
        #expect(claimed == [b])
        // `b` times out inside its transaction: its outcome is unknown, and reported late.
        guard case .outcomeUnknown("b") = queue.expire(b) else { Issue.record("b not unknown"); return }
        let completion = queue.finish([a, b])
        #expect(completion.waiters.isEmpty)
        #expect(completion.late.count == 1)
        guard case .alreadyDone = queue.expire(b) else { Issue.record("b answered twice"); return }
        // A queued write that times out leaves the queue.
        let d = queue.makeID()
        let queuedD = queue.enqueue(id: d, message, waiter: "d")
        #expect(queuedD)
        guard case .withdrawn("d") = queue.expire(d) else { Issue.record("d not withdrawn"); return }
        let empty = queue.takeBatch()
        #expect(empty.isEmpty)
        // A write that commits is answered by `finish`, once.
        let e = queue.makeID()
        let queuedE = queue.enqueue(id: e, message, waiter: "e")
        #expect(queuedE)
        _ = queue.takeBatch()
        let claimedE = queue.claim([e])
        #expect(claimedE == [e])
        let done = queue.finish([e])
        #expect(done.waiters == ["e"])
        guard case .alreadyDone = queue.expire(e) else { Issue.record("e answered twice"); return }
    }

    @Test func deadlinesExpireOnlyUnansweredWritesThatAreDue() {
        var queue = StoreWriteQueue<String>(limit: 10)
        let message = StoredMessage(subscribeKey: "k", channel: "c", timetoken: Timetoken(1), publisher: nil, payload: "1",
                                    meta: nil, customMessageType: nil, sequence: nil, expiresAt: nil)
        let start = ContinuousClock.now
        let a = queue.makeID(), b = queue.makeID(), c = queue.makeID()
        let accepted = [queue.enqueue(id: a, StoreWrite(message: message), waiter: "a", deadline: start + .seconds(1)),
                        queue.enqueue(id: b, StoreWrite(message: message), waiter: "b", deadline: start + .seconds(1)),
                        queue.enqueue(id: c, StoreWrite(message: message), waiter: "c", deadline: start + .seconds(5))]
        #expect(accepted == [true, true, true])
        #expect(queue.hasDeadlines)
        // All three are taken; `b` is claimed and commits (answered: its deadline is gone).
        _ = queue.takeBatch()
        let claimedB = queue.claim([b])
        #expect(claimedB == [b])
        let committed = queue.finish([b]).waiters
        #expect(committed == ["b"])
        let early = queue.expireDue(now: start + .milliseconds(999))
        #expect(early.isEmpty)
        // At one second only `a` is due (withdrawn: taken, never claimed); `b` was answered.
        let due = queue.expireDue(now: start + .seconds(1))
        #expect(due.count == 1)
        guard case .withdrawn("a") = due.first else { Issue.record("a not withdrawn: \(due)"); return }
        let again = queue.expireDue(now: start + .seconds(2))
        #expect(again.isEmpty)
        // `c`, taken and claimed, passes its deadline inside its transaction: outcome unknown.
        let claimedC = queue.claim([c])
        #expect(claimedC == [c])
        let late = queue.expireDue(now: start + .seconds(5))
        guard case .outcomeUnknown("c") = late.first else { Issue.record("c not unknown: \(late)"); return }
        #expect(!queue.hasDeadlines)
    }

    @Test func aCommittedWriteKeepsItsDeadlineUntilItIsSynced() {
        var queue = StoreWriteQueue<String>(limit: 10)
        let message = StoredMessage(subscribeKey: "k", channel: "c", timetoken: Timetoken(1), publisher: nil, payload: "1",
                                    meta: nil, customMessageType: nil, sequence: nil, expiresAt: nil)
        let start = ContinuousClock.now
        let a = queue.makeID(), b = queue.makeID()
        let accepted = [queue.enqueue(id: a, StoreWrite(message: message), waiter: "a", deadline: start + .seconds(1)),
                        queue.enqueue(id: b, StoreWrite(message: message), waiter: "b", deadline: start + .seconds(2))]
        #expect(accepted == [true, true])
        _ = queue.takeBatch()
        let claimed = queue.claim([a, b])
        #expect(claimed == [a, b])
        queue.committed([a, b])
        // Committed, not yet synced: still unanswered, so a passed deadline answers it, and
        // "outcome unknown" (it is committed: it will not be withdrawn).
        let due = queue.expireDue(now: start + .seconds(1))
        guard case .outcomeUnknown("a") = due.first, due.count == 1 else { Issue.record("a not unknown: \(due)"); return }
        // The sync ends: `b` is answered now, `a` late (its publisher already heard).
        let synced = queue.finish([a, b])
        #expect(synced.waiters == ["b"])
        #expect(synced.ids == [b])
        #expect(synced.late == [a])
        #expect(!queue.hasDeadlines)
        guard case .alreadyDone = queue.expire(b) else { Issue.record("b answered twice"); return }
    }

    @Test func aStoredPublishIsDeliveredAtCommitAndAcknowledgedOnlyOnceSynced() async throws {
        let server = try await TestServer.start(file: ConfigurationFile(subscribeTimeoutSeconds: 30))
        let store = server.server.state.store
        // The writer is held in its sync (a slow disk): commits are delivered, nothing is acknowledged.
        let held = DispatchSemaphore(value: 0)
        let syncing = Atomic<Int>(0)
        store.syncProbe.withLock { probe in
            probe = {
                syncing.add(1, ordering: .relaxed)
                held.wait()
            }
        }
        let cursor = try await server.handshake("d")
        async let page = server.subscribe("d", tt: cursor, timeout: .seconds(20))
        #expect(await server.longPollsWaiting(1))
        let answered = Atomic<Bool>(false)
        let publish = Task {
            defer { answered.store(true, ordering: .releasing) }
            return try await server.get("/publish/demo/demo/0/d/0/%22first%22?uuid=tester&requestid=r-1")
        }
        let delivered = try await page
        #expect(delivered.messages.map { $0["d"] as? String } == ["first"])
        #expect(await eventually { syncing.load(ordering: .relaxed) == 1 })
        let answeredEarly = answered.load(ordering: .acquiring)
        #expect(!answeredEarly)  // the writer is still held in its sync
        held.signal()
        let first = try await publish.value
        #expect(first.status == 200)
        #expect(try store.writerSynchronousSetting() == 2)  // other writes stay fully synchronous

        // A sync that fails: committed and delivered, so the publisher hears "may be stored"
        // and a repeat of its request id is answered with the same timetoken, not stored twice.
        struct DiskGone: Error {}
        store.syncProbe.withLock { probe in probe = { throw DiskGone() } }
        let next = try await server.handshake("d")
        async let second = server.subscribe("d", tt: next, timeout: .seconds(20))
        #expect(await server.longPollsWaiting(1))
        let failed = try await server.get("/publish/demo/demo/0/d/0/%22second%22?uuid=tester&requestid=r-2")
        #expect(failed.status == 504)
        #expect(failed.body.contains("may be stored"))
        #expect(try await second.messages.map { $0["d"] as? String } == ["second"])
        #expect(try await server.get("/health").body.contains("\"store\":\"failing\""))
        store.syncProbe.withLock { probe in probe = nil }
        let repeated = try await server.get("/publish/demo/demo/0/d/0/%22second%22?uuid=tester&requestid=r-2")
        #expect(repeated.status == 200)
        let history = try await server.object("/v3/history/sub-key/demo/channel/d?max=25")
        let stored = ((history["channels"] as? [String: Any])?["d"] as? [[String: Any]]) ?? []
        #expect(stored.map { $0["message"] as? String } == ["first", "second"])
        // A failed sync is final (the file system may have dropped what it accepted): later
        // stored publishes are refused and never written, realtime ones still flow.
        let refused = try await server.get("/publish/demo/demo/0/d/0/%22third%22?uuid=tester")
        #expect(refused.status == 500)
        #expect(try await server.get("/publish/demo/demo/0/d/0/%22live%22?uuid=tester&store=0").status == 200)
        #expect(try await server.get("/health").body.contains("\"store\":\"failing\""))
        // Every other write is refused too (its WAL frames would follow a hole recovery stops
        // at), whatever route makes it, and the health probe never reports the store writable.
        let group = "/v1/channel-registration/sub-key/demo/channel-group/news"
        let grouped = try await server.get("\(group)?add=sport&uuid=tester")
        #expect(grouped.status == 500, "\(grouped.body)")
        let listed = try await server.object("\(group)?uuid=tester")
        #expect((listed["payload"] as? [String: Any])?["channels"] as? [String] == [])
        let named = try await server.send("/v2/objects/demo/uuids/alice?uuid=alice", method: .PATCH,
                                          body: Array(#"{"name":"Alice"}"#.utf8))
        #expect(named.status == 500, "\(named.body)")
        #expect(try await server.get("/v2/objects/demo/uuids/alice?uuid=alice").status == 404)
        #expect(await store.condition() == .failing)
        let after = try await server.object("/v3/history/sub-key/demo/channel/d?max=25")
        #expect((((after["channels"] as? [String: Any])?["d"] as? [[String: Any]]) ?? []).count == 2)
        await server.stop()
    }

    // MARK: - Channel groups

    /// Concurrent changes of one group reach the delivery hub in the order the store committed
    /// them, so the hub never ends with an older membership than the store's. Before, the route
    /// set the hub after its `await`, in whatever order the requests resumed.
    @Test func concurrentGroupChangesReachTheHubInCommitOrder() async throws {
        let store = try MessageStore(directory: Self.temporaryDirectory(), logger: Self.quietLogger, metrics: ServerMetrics())
        let seen = CommittedSets()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for i in 0..<64 {
                group.addTask {
                    _ = try await store.updateGroup(subscribeKey: "k", group: "g", add: ["c\(i)"], remove: []) { channels in
                        seen.sets.withLock { $0.append(channels) }
                    }
                }
            }
            try await group.waitForAll()
        }
        let sizes = seen.sets.withLock { $0.map(\.count) }
        #expect(sizes == Array(1...64), "each change saw every earlier one: \(sizes)")
        #expect(seen.sets.withLock { $0.last } == Set((0..<64).map { "c\($0)" }))
        try await store.deleteGroup(subscribeKey: "k", group: "g") { seen.sets.withLock { $0.append([]) } }
        #expect(seen.sets.withLock { $0.count } == 65)
        #expect(try store.allGroupMemberships().isEmpty)
        try store.close()
    }

    // MARK: - Disk full

    @Test func aFullStoreFailsStoredPublishesClearlyWhileRealtimeFlowsAndRecovers() async throws {
        let server = try await TestServer.start()
        let store = server.server.state.store
        let big = "\"" + String(repeating: "x", count: 20_000) + "\""
        try await server.publish("full", big)  // the store works
        // Cap the file at its current size (SQLite's max_page_count): no new page fits.
        try store.setMaximumSize(1)
        let cursor = try await server.handshake("full,other,room-pnpres")

        let refused = try await server.get("/publish/demo/demo/0/full/0/\(PercentCoding.encode(big))?uuid=tester")
        #expect(refused.status == 507)
        let body = try #require(try JSONSerialization.jsonObject(with: Data(refused.body.utf8)) as? [Any])
        #expect(body.count == 3 && body[0] as? Int == 0)
        #expect((body[1] as? String)?.contains("full") == true)
        #expect(refused.headers.first(name: "Retry-After") != nil)

        // Realtime that needs no storage keeps flowing: a signal, a store=0 publish, presence.
        #expect(try await server.get("/signal/demo/demo/0/other/0/%22sig%22?uuid=tester").status == 200)
        #expect(try await server.get("/publish/demo/demo/0/full/0/%22live%22?uuid=tester&store=0").status == 200)
        #expect(try await server.get("/v2/presence/sub-key/demo/channel/room/heartbeat?heartbeat=20&uuid=alice").status == 200)
        var seen: [String] = []
        var at = cursor
        let deadline = ContinuousClock.now + .seconds(10)
        while seen.count < 3, ContinuousClock.now < deadline {
            let page = try await server.subscribe("full,other,room-pnpres", tt: at, timeout: .seconds(10))
            at = page.cursor
            seen += page.messages.map { message in
                if let text = message["d"] as? String { return text }
                return ((message["d"] as? [String: Any])?["action"] as? String) ?? "?"
            }
        }
        #expect(seen.sorted() == ["join", "live", "sig"])  // the refused message was never delivered

        let health = try await server.get("/health")
        #expect(health.status == 503)
        #expect((try JSONSerialization.jsonObject(with: Data(health.body.utf8)) as? [String: Any])?["store"] as? String == "full")

        // Space returns (the cap is lifted): stored publishes succeed again, no restart.
        try store.setMaximumSize(nil)
        let stored = try await server.publish("full", big)
        let history = try await server.object("/v3/history/sub-key/demo/channel/full?max=25")
        let messages = try #require((history["channels"] as? [String: Any])?["full"] as? [[String: Any]])
        #expect(messages.count == 2)  // the first and the last; the refused one is not stored
        #expect(messages.last?["timetoken"] as? String == String(stored.rawValue))
        // Polled: /health answers from the store's last outcome while it is under a second old,
        // then from a fresh probe; nothing announces the turn.
        #expect(await eventually { (try? await server.get("/health").status) == 200 })
        await server.stop()
    }

    // MARK: - Outcome unknown

    /// A transaction still committing when its publisher's wait runs out: the publisher is told
    /// 504 "outcome unknown", and the message, which does commit, is then delivered to live
    /// subscribers at its timetoken — never skipped by a cursor that moved on meanwhile.
    @Test func aWriteThatCommitsAfterItsTimeoutIsStillDelivered() async throws {
        var file = ConfigurationFile(subscribeTimeoutSeconds: 30)
        file.store = .init(writeTimeoutSeconds: 0.2)
        let server = try await TestServer.start(file: file)
        // The writer's inserts take a second (a disk stalled inside the commit).
        try await server.server.state.store.pool.writeWithoutTransaction { db in
            db.add(function: DatabaseFunction("tether_test_sleep", argumentCount: 1, pure: false) { arguments in
                usleep(UInt32(Int.fromDatabaseValue(arguments[0]) ?? 0) * 1000)
                return nil
            })
            try db.execute(sql: "CREATE TEMP TRIGGER slow_insert AFTER INSERT ON message BEGIN SELECT tether_test_sleep(1000); END")
        }
        let cursor = try await server.handshake("late,other")
        async let page = server.subscribe("late,other", tt: cursor, timeout: .seconds(20))
        #expect(await server.longPollsWaiting(1))
        let answer = try await server.get("/publish/demo/demo/0/late/0/%22slow%22?uuid=tester")
        #expect(answer.status == 504)
        #expect(answer.body.contains("may be stored"))
        // While the outcome is unknown, later events wait behind it rather than overtake it.
        #expect(try await server.get("/publish/demo/demo/0/other/0/%22after%22?uuid=tester&store=0").status == 200)
        let delivered = try await page
        #expect(delivered.messages.map { $0["d"] as? String } == ["slow", "after"])
        let history = try await server.object("/v3/history/sub-key/demo/channel/late?uuid=tester")
        let stored = ((history["channels"] as? [String: Any])?["late"] as? [[String: Any]]) ?? []
        #expect(stored.map { $0["message"] as? String } == ["slow"])
        await server.stop()
    }

    // MARK: - A stalled write

    @Test func presenceJoinsWhileTheStoreIsStalledAreAnsweredAtTheWriteTimeout() async throws {
        var file = ConfigurationFile(subscribeTimeoutSeconds: 30)
        file.store = .init(writeTimeoutSeconds: 0.3)
        let server = try await TestServer.start(file: file)
        var configuration = Configuration()
        configuration.allowsUnsafeTransactions = true
        let blocker = try DatabaseQueue(path: server.server.state.store.path, configuration: configuration)
        try await blocker.writeWithoutTransaction { try $0.execute(sql: "BEGIN IMMEDIATE") }

        // A join waits for its membership to be saved, at most the write timeout: one after
        // another (the expiry ends between them and starts again), then two at once.
        func join(_ uuid: String) async throws -> Int {
            try await server.get("/v2/presence/sub-key/demo/channel/room/heartbeat?uuid=\(uuid)&heartbeat=60", timeout: .seconds(10)).status
        }
        #expect(try await join("u1") == 200)
        #expect(try await join("u2") == 200)
        async let third = join("u3")
        async let fourth = join("u4")
        #expect(try await [third, fourth] == [200, 200])
        let occupancy = try await server.object("/v2/presence/sub-key/demo/channel/room")
        #expect(occupancy["occupancy"] as? Int == 4)

        try await blocker.writeWithoutTransaction { try $0.execute(sql: "ROLLBACK") }
        try blocker.close()
        await server.stop()
    }

    @Test func aStalledWriteTimesOutReleasesVisibilityAndTheQueueIsBounded() async throws {
        var file = ConfigurationFile(subscribeTimeoutSeconds: 30)
        file.store = .init(writeTimeoutSeconds: 0.3, writeQueueLimit: 2)
        let server = try await TestServer.start(file: file)
        try await server.publish("a", "1")

        // Another connection holds SQLite's write lock (a long transaction, as another process
        // or a stuck tool would): the server's writer waits for it.
        var configuration = Configuration()
        configuration.allowsUnsafeTransactions = true
        let blocker = try DatabaseQueue(path: server.server.state.store.path, configuration: configuration)
        try await blocker.writeWithoutTransaction { try $0.execute(sql: "BEGIN IMMEDIATE") }

        let cursor = try await server.handshake("a,b")
        async let stalled = server.get("/publish/demo/demo/0/a/0/%22lost%22?uuid=tester")
        async let page = server.subscribe("a,b", tt: cursor, timeout: .seconds(8))
        #expect(await server.longPollsWaiting(1))
        // A store=0 publish on another channel is acknowledged at once and delivered once the
        // stalled write's reservation is released at its timeout (not when the lock frees).
        #expect(try await server.get("/publish/demo/demo/0/b/0/%22free%22?uuid=tester&store=0").status == 200)
        let delivered = try await page
        #expect(delivered.messages.map { $0["d"] as? String } == ["free"])
        let timedOut = try await stalled
        #expect(timedOut.status == 503)
        #expect(timedOut.body.contains("not stored"))
        #expect(timedOut.headers.first(name: "Retry-After") == "1")

        // Still stalled: the queue holds two writes; beyond that, 503 at once.
        let results = try await withThrowingTaskGroup(of: (Int, String, String?).self) { group in
            for index in 0..<4 {
                group.addTask {
                    let r = try await server.get("/publish/demo/demo/0/q/0/\(index)?uuid=tester")
                    return (r.status, r.body, r.headers.first(name: "Retry-After"))
                }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(results.allSatisfy { $0.0 == 503 && $0.2 != nil })
        // Two fit in the queue (and time out); the others are refused at once.
        #expect((1...2).contains(results.filter { $0.1.contains("queue is full") }.count))
        let health = try await server.get("/health")
        #expect(health.status == 503)
        #expect(health.body.contains("\"store\":\"stalled\""))

        // The lock frees: stored publishes succeed again; the timed-out one was never written.
        try await blocker.writeWithoutTransaction { try $0.execute(sql: "ROLLBACK") }
        // Polled: the store can write again once the other connection's rollback releases
        // SQLite's write lock, which nothing announces; publishes until then are refused.
        #expect(await eventually { (try? await server.get("/publish/demo/demo/0/a/0/%22after%22?uuid=tester").status) == 200 })
        let history = try await server.object("/v3/history/sub-key/demo/channel/a?max=25")
        let texts = ((history["channels"] as? [String: Any])?["a"] as? [[String: Any]])?.map { "\($0["message"] ?? "")" }
        #expect(texts?.contains("lost") == false)
        #expect(texts?.first == "1" && texts?.last == "after")
        // None of the refused or timed-out writes was stored.
        let queued = try await server.object("/v3/history/sub-key/demo/channel/q?max=25")
        let stored = (queued["channels"] as? [String: Any])?["q"] as? [Any]
        #expect(stored == nil || stored?.isEmpty == true)
        try blocker.close()
        await server.stop()
    }

    // MARK: - Pruning

    @Test func pruningRunsInSmallBatchesThatLetPublishesThrough() async throws {
        let store = try MessageStore(directory: Self.temporaryDirectory(), logger: Self.quietLogger, metrics: ServerMetrics())
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await store.runWriter() }
            let now = LongPollHub.systemNow()
            try await withThrowingTaskGroup(of: Void.self) { appends in
                for index in 0..<250 {
                    appends.addTask {
                        try await store.append(StoredMessage(
                            subscribeKey: "k", channel: "c\(index % 2)", timetoken: Timetoken(UInt64(1_000 + index)), publisher: nil,
                            payload: "\(index)", meta: nil, customMessageType: nil, sequence: nil, expiresAt: Timetoken(UInt64(2_000 + index))))
                    }
                }
                try await appends.waitForAll()
            }
            let progress = Mutex<[Int]>([])
            let removed = try await store.pruneExpired(now: now, batchSize: 100) { total in
                progress.withLock { $0.append(total) }
                if total == 100 {
                    // A publish between two batches commits before the prune ends.
                    try? await store.append(StoredMessage(
                        subscribeKey: "k", channel: "c0", timetoken: Timetoken(5_000), publisher: nil, payload: "kept", meta: nil,
                        customMessageType: nil, sequence: nil, expiresAt: nil))
                }
            }
            #expect(removed == 250)
            #expect(progress.withLock { $0 } == [100, 200])
            #expect(try await store.messageCount() == 1)
            let gaps = try await store.retentionGaps(subscribeKey: "k", channels: ["c0", "c1"], prefixes: [], after: .zero)
            #expect(Set(gaps.map { "\($0.channel)=\($0.through.rawValue)" }) == ["c0=1248", "c1=1249"])
            store.finish()
            try await group.waitForAll()
        }
        try store.close()
    }
}

/// What a store's `committed` callbacks saw, in order.
private final class CommittedSets: Sendable {
    let sets = Mutex<[Set<String>]>([])
}
