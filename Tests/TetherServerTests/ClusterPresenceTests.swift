import Clocks
import Foundation
import NIOCore
import PostgresNIO
import Synchronization
import Testing
@_spi(Benchmarks) import TetherProtocol
@_spi(Benchmarks) import TetherServerCore
@testable import TetherServer
import TetherTestingServer

/// Presence across nodes on a real PostgreSQL (issue #19 point 4): the SQL of
/// ``SharedPresence`` on its own, then two servers on one database.
@Suite(.enabled(if: TestPostgres.available, "TETHER_TEST_DATABASE_URL is not set (scripts/test starts a PostgreSQL and sets it)"),
       .serialized)
struct ClusterPresenceTests {
    /// `action:uuid=occupancy` of the presence events a log delivered, in delivery order.
    private static func presenceEvents(_ log: RunningLog) -> [String] {
        log.delivered.withLock { all in
            all.compactMap { entry in
                let envelope = entry.event.envelope
                guard envelope.channel.hasSuffix("-pnpres"),
                      let d = try? JSONSerialization.jsonObject(with: Data(envelope.payload.utf8)) as? [String: Any],
                      let action = d["action"] as? String else { return nil }
                let channel = envelope.channel.dropLast("-pnpres".count)
                return "\(channel) \(action):\(d["uuid"] as? String ?? "-")=\((d["occupancy"] as? NSNumber)?.intValue ?? -1)"
            }
        }
    }

    private static func waitForEvents(_ log: RunningLog, count: Int) async -> [String] {
        let deadline = ContinuousClock.now + .seconds(20)
        while ContinuousClock.now < deadline, presenceEvents(log).count < count {
            try? await Task.sleep(for: .milliseconds(20))
        }
        return presenceEvents(log)
    }

    // MARK: The SQL parts (two SharedPresence "nodes" on one database, a manual clock)

    @Test func joinsLeavesStateAndTimeoutsAreDecidedByTheDatabase() async throws {
        try await TestPostgres.withDatabase { url in
            let reader = RunningLog(try await TestPostgres.open(url))
            let logA = try await TestPostgres.open(url)
            let logB = try await TestPostgres.open(url)
            let now = Mutex<Int64>(1_000_000)
            let a = SharedPresence(log: logA, now: { now.withLock { $0 } })
            let b = SharedPresence(log: logB, now: { now.withLock { $0 } })

            // A join on A; the same uuid on B only moves the deadline; a second uuid joins.
            try await a.heartbeat(subscribeKey: "k", uuid: "alice", channels: ["room", "hall"], timeout: .seconds(20), states: [:])
            try await b.heartbeat(subscribeKey: "k", uuid: "alice", channels: ["room"], timeout: .seconds(30), states: [:])
            try await b.heartbeat(subscribeKey: "k", uuid: "bob", channels: ["room"], timeout: .seconds(20),
                                  states: ["room": #"{"mood":"ok"}"#])
            #expect(try await a.occupancies(subscribeKey: "k", channels: ["room", "hall", "none"]) == ["room": 2, "hall": 1])
            #expect(try await b.channels(subscribeKey: "k", uuid: "alice") == ["hall", "room"])
            #expect(try await a.occupants(subscribeKey: "k", channels: ["room"])["room"]?.map(\.uuid) == ["alice", "bob"])
            #expect(try await a.states(subscribeKey: "k", uuid: "bob", channels: ["room"]) == ["room": #"{"mood":"ok"}"#])
            #expect(try await a.occupiedChannels(subscribeKey: "k") == ["hall", "room"])

            // The same state again is no change; a new one is, on the other node.
            try await a.setState(subscribeKey: "k", uuid: "bob", channels: ["room"], state: #"{"mood":"ok"}"#)
            try await a.setState(subscribeKey: "k", uuid: "bob", channels: ["room"], state: #"{"mood":"away"}"#)
            // State ahead of a join: kept, announced with nothing, not an occupant.
            try await a.setState(subscribeKey: "k", uuid: "carol", channels: ["room"], state: #"{"early":true}"#)
            #expect(try await b.occupancies(subscribeKey: "k", channels: ["room"]) == ["room": 2])
            #expect(try await b.states(subscribeKey: "k", uuid: "carol", channels: ["room"]) == ["room": #"{"early":true}"#])
            try await b.heartbeat(subscribeKey: "k", uuid: "carol", channels: ["room"], timeout: .seconds(20), states: [:])

            // A leave deletes once: the second (other node) finds nothing and says nothing.
            try await b.leave(subscribeKey: "k", uuid: "carol", channels: ["room"])
            try await a.leave(subscribeKey: "k", uuid: "carol", channels: ["room"])

            // Time passes: alice's hall (20 s) and bob's room (20 s) expire, alice's room (30 s)
            // does not; both nodes sweep, each expired row is announced once.
            now.withLock { $0 += 20_000 }
            async let sweptA = a.sweep()
            async let sweptB = b.sweep()
            #expect(try await sweptA + sweptB == 2)
            #expect(try await a.sweep() == 0)
            #expect(try await a.occupancies(subscribeKey: "k", channels: ["room", "hall"]) == ["room": 1])
            now.withLock { $0 += 10_000 }
            #expect(try await b.sweep() + a.sweep() == 1)

            let seen = await Self.waitForEvents(reader, count: 10)
            // Joins on two channels in one request are announced in channel order.
            #expect(Array(seen.prefix(7)) == ["hall join:alice=1", "room join:alice=1", "room join:bob=2", "room state-change:bob=2",
                                               "room state-change:bob=2", "room join:carol=3", "room leave:carol=2"])
            #expect(Set(seen.dropFirst(7).prefix(2)) == ["hall timeout:alice=0", "room timeout:bob=1"])
            #expect(Array(seen.dropFirst(9)) == ["room timeout:alice=0"])
            logA.close()
            logB.close()
            await reader.stop()
        }
    }

    @Test func aHeartbeatAfterALeaveOnAnotherNodeJoinsAgain() async throws {
        try await TestPostgres.withDatabase { url in
            let reader = RunningLog(try await TestPostgres.open(url))
            let logA = try await TestPostgres.open(url)
            let logB = try await TestPostgres.open(url)
            let now = Mutex<Int64>(5_000_000)
            let a = SharedPresence(log: logA, now: { now.withLock { $0 } })
            let b = SharedPresence(log: logB, now: { now.withLock { $0 } })
            try await a.heartbeat(subscribeKey: "k", uuid: "dan", channels: ["room"], timeout: .seconds(60), states: [:])
            try await b.leave(subscribeKey: "k", uuid: "dan", channels: ["room"])
            // A remembers writing dan's membership; the leave reaches it through the log.
            _ = await Self.waitForEvents(reader, count: 2)
            a.observe(reader.delivered.withLock { $0.map(\.event) })
            try await a.heartbeat(subscribeKey: "k", uuid: "dan", channels: ["room"], timeout: .seconds(60), states: [:])
            #expect(await Self.waitForEvents(reader, count: 3) == ["room join:dan=1", "room leave:dan=0", "room join:dan=1"])
            // A heartbeat with most of the timeout left writes nothing (and announces nothing).
            now.withLock { $0 += 1_000 }
            try await a.heartbeat(subscribeKey: "k", uuid: "dan", channels: ["room"], timeout: .seconds(60), states: [:])
            // So the deadline is still the one written with the join: the membership expires there.
            now.withLock { $0 = 5_060_000 }
            #expect(try await b.sweep() == 1)
            logA.close()
            logB.close()
            await reader.stop()
        }
    }

    /// On a crowded channel a leave is announced inside an interval event (`"leave":[…]`), not
    /// as its own event: a node that wrote the membership must forget it from that too, or the
    /// uuid's next heartbeat through it writes nothing and the uuid stays absent.
    @Test func aLeaveAnnouncedInAnIntervalIsForgottenToo() async throws {
        try await TestPostgres.withDatabase { url in
            let reader = RunningLog(try await TestPostgres.open(url))
            let logA = try await TestPostgres.open(url)
            let logB = try await TestPostgres.open(url)
            let now = Mutex<Int64>(5_000_000)
            let a = SharedPresence(log: logA, now: { now.withLock { $0 } })
            let b = SharedPresence(log: logB, now: { now.withLock { $0 } })
            try await a.heartbeat(subscribeKey: "k", uuid: "dan", channels: ["room"], timeout: .seconds(60), states: [:])
            try await b.leave(subscribeKey: "k", uuid: "dan", channels: ["room"])
            _ = await Self.waitForEvents(reader, count: 2)
            // What a crowded channel sends instead of the leave event.
            let interval = SubscribeEnvelope(
                timetoken: Timetoken(1), subscribeKey: "k", channel: "room-pnpres",
                payload: #"{"action":"interval","timestamp":5000,"occupancy":30,"join":[],"leave":["dan"],"timeout":[],"here_now_refresh":false}"#,
                publisher: nil, meta: nil)
            a.observe([BufferedEvent(envelope: interval, isStored: false)])
            try await a.heartbeat(subscribeKey: "k", uuid: "dan", channels: ["room"], timeout: .seconds(60), states: [:])
            #expect(await Self.waitForEvents(reader, count: 3).last == "room join:dan=1", "dan is written and joins again")
            logA.close()
            logB.close()
            await reader.stop()
        }
    }

    @Test func aCrowdedChannelAnnouncesIntervalsFromOneNode() async throws {
        try await TestPostgres.withDatabase { url in
            let reader = RunningLog(try await TestPostgres.open(url))
            let logA = try await TestPostgres.open(url)
            let logB = try await TestPostgres.open(url)
            let now = Mutex<Int64>(9_000_000)
            let config = ["k": PresenceConfiguration(announceMax: 2, interval: .seconds(10))]
            let a = SharedPresence(log: logA, now: { now.withLock { $0 } }, configurations: config)
            let b = SharedPresence(log: logB, now: { now.withLock { $0 } }, configurations: config)
            for (node, uuid) in [(a, "u1"), (b, "u2"), (a, "u3"), (b, "u4")] {
                try await node.heartbeat(subscribeKey: "k", uuid: uuid, channels: ["big"], timeout: .seconds(300), states: [:])
            }
            try await a.leave(subscribeKey: "k", uuid: "u1", channels: ["big"])
            // The interval ends: both nodes sweep, one announces it; still crowded (3 > 2).
            now.withLock { $0 += 10_000 }
            async let sweptA = a.sweep()
            async let sweptB = b.sweep()
            _ = try await (sweptA, sweptB)
            try await b.leave(subscribeKey: "k", uuid: "u2", channels: ["big"])
            now.withLock { $0 += 10_000 }
            _ = try await (a.sweep(), b.sweep())
            // Back at announce-max: single events again.
            try await a.leave(subscribeKey: "k", uuid: "u3", channels: ["big"])
            let seen = await Self.waitForEvents(reader, count: 5)
            #expect(seen == ["big join:u1=1", "big join:u2=2", "big interval:-=3", "big interval:-=2", "big leave:u3=1"])
            let intervals = reader.delivered.withLock { all in
                all.compactMap { entry -> [String: Any]? in
                    guard let d = try? JSONSerialization.jsonObject(with: Data(entry.event.envelope.payload.utf8)) as? [String: Any],
                          d["action"] as? String == "interval" else { return nil }
                    return d
                }
            }
            #expect(intervals.count == 2)
            #expect(intervals.first?["join"] as? [String] == ["u3", "u4"])
            #expect(intervals.first?["leave"] as? [String] == ["u1"])
            #expect(intervals.last?["leave"] as? [String] == ["u2"])
            #expect(intervals.last?["join"] == nil)
            logA.close()
            logB.close()
            await reader.stop()
        }
    }

    // MARK: Two servers on one database

    private static func startNode(_ url: DatabaseURL, clock: TestClock<Duration>) async throws -> TestServer {
        TestServer(inProcess: try await InProcessServer.start(file: .init(subscribeTimeoutSeconds: 30), clock: clock,
                                                               databaseURL: url.description))
    }

    /// A handshake once the node's cursor has left zero (a new database's sequencer starts at 0
    /// and follows the clock once a node's reader has been idle for a second).
    private static func handshake(_ node: TestServer, _ channels: String) async throws -> Timetoken {
        let deadline = ContinuousClock.now + .seconds(10)
        while true {
            let cursor = try await node.handshake(channels)
            if cursor > .zero || ContinuousClock.now > deadline { return cursor }
            try await Task.sleep(for: .milliseconds(50))
        }
    }

    /// `action:uuid=occupancy` of the presence events in subscribe answers.
    private static func presenceEvents(_ messages: [[String: Any]]) -> [String] {
        messages.compactMap { envelope in
            guard let d = envelope["d"] as? [String: Any], let action = d["action"] as? String else { return nil }
            return "\(action):\(d["uuid"] as? String ?? "-")=\((d["occupancy"] as? NSNumber)?.intValue ?? -1)"
        }
    }

    /// Reads presence events from `cursor` until `count` arrived (or a deadline passes).
    private static func events(_ server: TestServer, _ channels: String, from cursor: inout Timetoken, count: Int) async throws
        -> [String]
    {
        var collected: [String] = []
        let deadline = ContinuousClock.now + .seconds(15)
        while collected.count < count, ContinuousClock.now < deadline {
            let page = try await server.subscribe(channels, tt: cursor, timeout: .seconds(10))
            collected += presenceEvents(page.messages)
            cursor = page.cursor
        }
        return collected
    }

    @Test func twoNodesCountEachOccupantOnceAndAnnounceEachChangeOnce() async throws {
        try await TestPostgres.withDatabase { url in
            let clockA = TestClock(), clockB = TestClock()
            let a = try await Self.startNode(url, clock: clockA)
            let b = try await Self.startNode(url, clock: clockB)
            var cursorA = try await Self.handshake(a, "room-pnpres")
            var cursorB = try await Self.handshake(b, "room-pnpres")

            // alice heartbeats on A, then on B (a load balancer moved her): one join.
            #expect(try await a.get("/v2/presence/sub-key/demo/channel/room/heartbeat?heartbeat=60&uuid=alice").status == 200)
            #expect(try await b.get("/v2/presence/sub-key/demo/channel/room/heartbeat?heartbeat=60&uuid=alice").status == 200)
            // bob subscribes on B (a subscribe is a heartbeat).
            _ = try await b.subscribe("room", tt: .zero)

            for node in [a, b] {
                let hereNow = try await node.object("/v2/presence/sub-key/demo/channel/room?uuid=x")
                #expect(hereNow["occupancy"] as? Int == 2)
                #expect(hereNow["uuids"] as? [String] == ["alice", "tester"])
                let global = try await node.object("/v2/presence/sub-key/demo?uuid=x")
                let payload = global["payload"] as? [String: Any]
                #expect(payload?["total_occupancy"] as? Int == 2)
                let whereNow = try await node.object("/v2/presence/sub-key/demo/uuid/alice?uuid=x")
                #expect((whereNow["payload"] as? [String: Any])?["channels"] as? [String] == ["room"])
            }

            // A state set on A is read on B.
            _ = try await a.get("/v2/presence/sub-key/demo/channel/room/uuid/alice/data?uuid=alice&state=%7B%22mood%22%3A1%7D")
            let state = try await b.object("/v2/presence/sub-key/demo/channel/room/uuid/alice?uuid=x")
            #expect((state["payload"] as? [String: Any])?["mood"] as? Int == 1)

            // alice leaves on B: one leave, seen on both nodes, after exactly one join each.
            #expect(try await b.get("/v2/presence/sub-key/demo/channel/room/leave?uuid=alice").status == 200)
            let expected = ["join:alice=1", "join:tester=2", "state-change:alice=2", "leave:alice=1"]
            #expect(try await Self.events(a, "room-pnpres", from: &cursorA, count: 4) == expected)
            #expect(try await Self.events(b, "room-pnpres", from: &cursorB, count: 4) == expected)
            for node in [a, b] {
                let whereNow = try await node.object("/v2/presence/sub-key/demo/uuid/alice?uuid=x")
                #expect((whereNow["payload"] as? [String: Any])?["channels"] as? [String] == [])
            }
            await a.stop()
            await b.stop()
        }
    }

    /// Setting state is a write the client is answered for: state PostgreSQL refuses (here a
    /// trigger; a constraint or a full disk does the same) is answered with the store's error,
    /// not 200 with the state echoed back, and the state before it stays.
    @Test func aStatePostgreSQLRefusesIsNotAnsweredOK() async throws {
        try await TestPostgres.withDatabase { url in
            let node = try await Self.startNode(url, clock: TestClock())
            let admin = try await TestPostgres.open(url)
            try await admin.client.query("""
                CREATE FUNCTION tether_test_refuse_state() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                  IF NEW.state = '{"refused":true}' THEN RAISE EXCEPTION 'refused by the test'; END IF;
                  RETURN NEW;
                END $$
                """, logger: TestPostgres.logger)
            try await admin.client.query("""
                CREATE TRIGGER tether_test_refuse_state BEFORE INSERT OR UPDATE ON tether_presence
                FOR EACH ROW EXECUTE FUNCTION tether_test_refuse_state()
                """, logger: TestPostgres.logger)
            #expect(try await node.get("/v2/presence/sub-key/demo/channel/room/heartbeat?heartbeat=60&uuid=alice").status == 200)
            let base = "/v2/presence/sub-key/demo/channel/room/uuid/alice"
            #expect(try await node.get("\(base)/data?uuid=alice&state=%7B%22mood%22%3A1%7D").status == 200)
            let refused = try await node.get("\(base)/data?uuid=alice&state=%7B%22refused%22%3Atrue%7D")
            #expect(refused.status == 500, "\(refused.body)")
            #expect(!refused.body.contains("refused\":true"), "\(refused.body)")
            let state = try await node.object("\(base)?uuid=alice")
            #expect((state["payload"] as? [String: Any])?["mood"] as? Int == 1)
            #expect((state["payload"] as? [String: Any])?["refused"] == nil)
            await node.stop()
            admin.close()
        }
    }

    @Test func aTimeoutIsAnnouncedOnceByOneNode() async throws {
        try await TestPostgres.withDatabase { url in
            let clockA = TestClock(), clockB = TestClock()
            let a = try await Self.startNode(url, clock: clockA)
            let b = try await Self.startNode(url, clock: clockB)
            var cursorA = try await Self.handshake(a, "desk-pnpres")
            var cursorB = try await Self.handshake(b, "desk-pnpres")
            _ = try await a.get("/v2/presence/sub-key/demo/channel/desk/heartbeat?heartbeat=20&uuid=erin")

            // Both nodes' sweeps run past erin's deadline; only one of them deletes her.
            await clockA.advance(by: .seconds(21))
            await clockB.advance(by: .seconds(21))
            // The loops sweep at each second the clocks pass through; a sweep at the clocks' new
            // time on both nodes at once settles it: exactly one of all those sweeps took erin.
            async let sweptA = a.server.state.presence.sweepNow()
            async let sweptB = b.server.state.presence.sweepNow()
            _ = try await (sweptA, sweptB)
            #expect(try await Self.events(a, "desk-pnpres", from: &cursorA, count: 2) == ["join:erin=1", "timeout:erin=0"])
            // A later event follows directly: no second timeout came in between, on either node.
            _ = try await b.get("/v2/presence/sub-key/demo/channel/desk/heartbeat?heartbeat=20&uuid=finn")
            #expect(try await Self.events(b, "desk-pnpres", from: &cursorB, count: 3) == ["join:erin=1", "timeout:erin=0", "join:finn=1"])
            #expect(try await Self.events(a, "desk-pnpres", from: &cursorA, count: 1) == ["join:finn=1"])
            for node in [a, b] {
                let hereNow = try await node.object("/v2/presence/sub-key/demo/channel/desk?uuid=x")
                #expect(hereNow["uuids"] as? [String] == ["finn"])
            }
            await a.stop()
            await b.stop()
        }
    }
}
