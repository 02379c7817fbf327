import Clocks
import Foundation
import NIOCore
import NIOPosix
import Testing
import TetherProtocol
@testable import TetherServer
import TetherTesting

@Suite(.serialized) struct PresenceTests {
    private func presenceEvents(_ messages: [[String: Any]]) -> [String] {
        messages.compactMap { envelope in
            guard let d = envelope["d"] as? [String: Any], let action = d["action"] as? String else { return nil }
            let uuid = d["uuid"] as? String ?? "-"
            let occupancy = (d["occupancy"] as? NSNumber)?.intValue ?? -1
            #expect(d["timestamp"] is NSNumber)
            return "\(action):\(uuid)=\(occupancy)"
        }
    }

    /// Reads presence events from `cursor` until `count` arrived (or fails after a deadline).
    private func events(_ server: TestServer, _ channels: String, from cursor: inout Timetoken, count: Int) async throws -> [String] {
        var collected: [String] = []
        let deadline = ContinuousClock.now + .seconds(10)
        while collected.count < count, ContinuousClock.now < deadline {
            let page = try await server.subscribe(channels, tt: cursor, timeout: .seconds(10))
            collected += presenceEvents(page.messages)
            cursor = page.cursor
        }
        return collected
    }

    /// An SDK leaving a channel cancels its long-poll (closing that connection) and sends the
    /// leave on another; a long-poll that reaches the server after the leave joins the uuid again.
    /// Its client is gone, so the join is taken back at once — not left standing until the
    /// presence timeout.
    @Test func aSubscribeItsClientAbandonedAfterALeaveDoesNotJoinAgain() async throws {
        // The presence clock stands still: "within a second of the heartbeat" holds however
        // slowly the machine runs.
        let server = try await TestServer.start(clock: TestClock())
        var cursor = try await server.handshake("room-pnpres")
        _ = try await server.get("/v2/presence/sub-key/demo/channel/room/heartbeat?heartbeat=60&uuid=ann")
        _ = try await server.get("/v2/presence/sub-key/demo/channel/room/leave?uuid=ann")
        #expect(try await events(server, "room-pnpres", from: &cursor, count: 2) == ["join:ann=1", "leave:ann=0"])
        let long = cursor  // any recent cursor (a handshake on `room` would join its own uuid)

        let port = Int(server.baseURL.split(separator: ":").last!)!
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton).connect(host: "127.0.0.1", port: port).get()
        let request = "GET /v2/subscribe/demo/room/0?tt=\(long.rawValue)&tr=1&heartbeat=60&uuid=ann HTTP/1.1\r\nHost: t\r\n\r\n"
        try await channel.writeAndFlush(ByteBuffer(string: request))
        try await channel.close()
        #expect(try await events(server, "room-pnpres", from: &cursor, count: 2) == ["join:ann=1", "leave:ann=0"])
        let whereNow = try await server.object("/v2/presence/sub-key/demo/uuid/ann?uuid=ann")
        #expect((whereNow["payload"] as? [String: Any])?["channels"] as? [String] == [])

        // The close seen only once the long-poll waits: the same.
        _ = try await server.get("/v2/presence/sub-key/demo/channel/room/heartbeat?heartbeat=60&uuid=cy")
        _ = try await server.get("/v2/presence/sub-key/demo/channel/room/leave?uuid=cy")
        #expect(try await events(server, "room-pnpres", from: &cursor, count: 2) == ["join:cy=1", "leave:cy=0"])
        let waiting = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton).connect(host: "127.0.0.1", port: port).get()
        try await waiting.writeAndFlush(ByteBuffer(string: request.replacingOccurrences(of: "uuid=ann", with: "uuid=cy")))
        #expect(await server.longPollsWaiting(1))
        try await waiting.close()
        #expect(try await events(server, "room-pnpres", from: &cursor, count: 2) == ["join:cy=1", "leave:cy=0"])

        // A first subscribe that its client drops at once (an app changing its subscription
        // right after subscribing) is no rejoin: its join stands, as any heartbeat's, so a
        // subscription change does not make presence flap.
        let first = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton).connect(host: "127.0.0.1", port: port).get()
        try await first.writeAndFlush(ByteBuffer(string: request.replacingOccurrences(of: "uuid=ann", with: "uuid=dee")))
        try await first.close()
        #expect(try await events(server, "room-pnpres", from: &cursor, count: 1) == ["join:dee=1"])
        #expect(await server.longPollsWaiting(0))
        let present = try await server.object("/v2/presence/sub-key/demo/channel/room?uuid=x")
        #expect(present["uuids"] as? [String] == ["dee"])

        await server.stop()
    }

    /// Nothing heartbeats a uuid while its long-poll waits: a long-poll with a uuid answers
    /// before its presence timeout (the longer of half of it and it less 10 s), so a client with a
    /// short timeout and no explicit heartbeats does not time out and join again every hold.
    @Test func aLongPollNeverWaitsPastItsUUIDsPresenceTimeout() async throws {
        let server = try await TestServer.start(file: .init(subscribeTimeoutSeconds: 280))
        let responder = TetherResponder(state: server.server.state)
        let keyset = try #require(server.server.state.keysets.keyset(subscribeKey: "demo"))
        #expect(responder.holdTime(keyset: keyset, uuid: "u", heartbeat: nil) == .seconds(280), "the default timeout is 300 s")
        #expect(responder.holdTime(keyset: keyset, uuid: "u", heartbeat: 300) == .seconds(280))
        #expect(responder.holdTime(keyset: keyset, uuid: "u", heartbeat: 120) == .seconds(110))
        #expect(responder.holdTime(keyset: keyset, uuid: "u", heartbeat: 60) == .seconds(50))
        #expect(responder.holdTime(keyset: keyset, uuid: "u", heartbeat: 20) == .seconds(10))
        #expect(responder.holdTime(keyset: keyset, uuid: "u", heartbeat: 5) == .seconds(10), "raised to the 20 s minimum first")
        #expect(responder.holdTime(keyset: keyset, uuid: nil, heartbeat: 20) == .seconds(280), "no uuid, no presence")
        await server.stop()
    }

    /// The JavaScript SDK sends state keyed by channel *and* by channel group
    /// (`{"a":{…},"g":{…}}`): each channel gets its state, and the group's channels the group's —
    /// not one flat object holding both keys.
    @Test func stateKeyedByAGroupAppliesToItsChannels() async throws {
        let server = try await TestServer.start()
        #expect(try await server.get("/v1/channel-registration/sub-key/demo/channel-group/g?add=b,c").status == 200)
        let state = PercentCoding.encode(#"{"a":{"mood":"x"},"g":{"mood":"y"}}"#)
        let beat = try await server.get("/v2/presence/sub-key/demo/channel/a/heartbeat?channel-group=g&state=\(state)&uuid=u1")
        #expect(beat.status == 200, "\(beat.body)")
        func stateOf(_ channel: String) async throws -> Any? {
            (try await server.object("/v2/presence/sub-key/demo/channel/\(channel)/uuid/u1?uuid=u1"))["payload"]
        }
        #expect(try await stateOf("a") as? [String: String] == ["mood": "x"])
        #expect(try await stateOf("b") as? [String: String] == ["mood": "y"])
        #expect(try await stateOf("c") as? [String: String] == ["mood": "y"])
        await server.stop()
    }

    @Test func joinThenExactlyOneTimeoutAtTheDeadline() async throws {
        let clock = TestClock()
        let server = try await TestServer.start(clock: clock)
        var cursor = try await server.handshake("room-pnpres")
        _ = try await server.get("/v2/presence/sub-key/demo/channel/room/heartbeat?heartbeat=20&uuid=alice")
        #expect(try await events(server, "room-pnpres", from: &cursor, count: 1) == ["join:alice=1"])

        await clock.advance(by: .seconds(19))
        let present = try await server.object("/v2/presence/sub-key/demo/channel/room?uuid=x")
        #expect(present["occupancy"] as? Int == 1)
        #expect(present["uuids"] as? [String] == ["alice"])

        await clock.advance(by: .seconds(1))
        #expect(try await events(server, "room-pnpres", from: &cursor, count: 1) == ["timeout:alice=0"])
        let empty = try await server.object("/v2/presence/sub-key/demo/channel/room?uuid=x")
        #expect(empty["occupancy"] as? Int == 0)
        await server.stop()
    }

    @Test func aLongerHeartbeatMovesTheTimeoutAndAShorterOneBringsItForward() async throws {
        let clock = TestClock()
        let server = try await TestServer.start(clock: clock)
        var cursor = try await server.handshake("desk-pnpres")
        _ = try await server.get("/v2/presence/sub-key/demo/channel/desk/heartbeat?heartbeat=20&uuid=carol")
        #expect(try await events(server, "desk-pnpres", from: &cursor, count: 1) == ["join:carol=1"])
        await clock.advance(by: .seconds(10))
        _ = try await server.get("/v2/presence/sub-key/demo/channel/desk/heartbeat?heartbeat=60&uuid=carol")  // until 70 s
        await clock.advance(by: .seconds(59))
        let present = try await server.object("/v2/presence/sub-key/demo/channel/desk?uuid=x")
        #expect(present["uuids"] as? [String] == ["carol"])
        await clock.advance(by: .seconds(1))
        #expect(try await events(server, "desk-pnpres", from: &cursor, count: 1) == ["timeout:carol=0"])

        // An hour-long timeout, then a 20 s one: the uuid times out 20 s after the second.
        _ = try await server.get("/v2/presence/sub-key/demo/channel/desk/heartbeat?heartbeat=3600&uuid=dave")
        await clock.advance(by: .seconds(5))
        _ = try await server.get("/v2/presence/sub-key/demo/channel/desk/heartbeat?heartbeat=20&uuid=dave")
        await clock.advance(by: .seconds(20))
        #expect(try await events(server, "desk-pnpres", from: &cursor, count: 2) == ["join:dave=1", "timeout:dave=0"])
        let empty = try await server.object("/v2/presence/sub-key/demo/channel/desk?uuid=x")
        #expect(empty["occupancy"] as? Int == 0)
        await server.stop()
    }

    /// The end of a long-poll extends its uuid's presence — except within 50 ms of the same
    /// long-poll's own heartbeat (a long-poll answered at once), which set those timeouts.
    @Test func aLongPollsEndExtendsPresenceUnlessItFollowsItsOwnHeartbeat() async throws {
        let clock = TestClock()
        let server = try await TestServer.start(clock: clock)
        let presence = server.server.state.presence
        var cursor = try await server.handshake("den-pnpres")

        // Erin: refreshed 40 ms after her heartbeat — nothing moves; she times out at 20 s.
        let erinAt = presence.now()
        await presence.heartbeat(subscribeKey: "demo", uuid: "erin", channels: ["den"], groups: [], timeoutSeconds: 20)
        #expect(try await events(server, "den-pnpres", from: &cursor, count: 1) == ["join:erin=1"])
        await clock.advance(by: .milliseconds(40))
        await presence.refresh(subscribeKey: "demo", uuid: "erin", channels: ["den"], groups: [], timeoutSeconds: 20, heartbeatAt: erinAt)
        await clock.advance(by: .milliseconds(19_960))
        #expect(try await events(server, "den-pnpres", from: &cursor, count: 1) == ["timeout:erin=0"])

        // Finn: refreshed 50 ms after his heartbeat — extended to 20.05 s after it.
        let finnAt = presence.now()
        await presence.heartbeat(subscribeKey: "demo", uuid: "finn", channels: ["den"], groups: [], timeoutSeconds: 20)
        #expect(try await events(server, "den-pnpres", from: &cursor, count: 1) == ["join:finn=1"])
        await clock.advance(by: .milliseconds(50))
        await presence.refresh(subscribeKey: "demo", uuid: "finn", channels: ["den"], groups: [], timeoutSeconds: 20, heartbeatAt: finnAt)
        await clock.advance(by: .milliseconds(19_950))
        let present = try await server.object("/v2/presence/sub-key/demo/channel/den?uuid=x")
        #expect(present["uuids"] as? [String] == ["finn"])
        await clock.advance(by: .milliseconds(50))
        #expect(try await events(server, "den-pnpres", from: &cursor, count: 1) == ["timeout:finn=0"])
        await server.stop()
    }

    /// Through the server: a subscribe's long-poll that waited (parked in the hub, then woken by
    /// a publish 15 s later) extends its uuid's presence from its end — 20 s after it, not after
    /// the subscribe's own heartbeat.
    @Test func aLongPollThatWaitedExtendsPresenceFromItsEnd() async throws {
        let clock = TestClock()
        let server = try await TestServer.start(clock: clock)
        var cursor = try await server.handshake("nook-pnpres")
        let start = cursor  // (a handshake on `nook` itself would make its uuid present there)
        async let waited = server.get("/v2/subscribe/demo/nook/0?tt=\(start.rawValue)&tr=1&heartbeat=20&uuid=hana")
        #expect(try await events(server, "nook-pnpres", from: &cursor, count: 1) == ["join:hana=1"])
        #expect(await server.longPollsWaiting(1))
        await clock.advance(by: .seconds(15))
        _ = try await server.publish("nook", "1")
        #expect(try await waited.status == 200)
        await clock.advance(by: .seconds(19))  // 34 s: the heartbeat's 20 s are long past
        let present = try await server.object("/v2/presence/sub-key/demo/channel/nook?uuid=x")
        #expect(present["uuids"] as? [String] == ["hana"])
        await clock.advance(by: .seconds(1))  // 35 s: 20 s after the long-poll's end
        #expect(try await events(server, "nook-pnpres", from: &cursor, count: 1) == ["timeout:hana=0"])
        await server.stop()
    }

    @Test func subscribeCountsAsAHeartbeatAndComingBackDoesNotFlap() async throws {
        let clock = TestClock()
        let server = try await TestServer.start(file: .init(subscribeTimeoutSeconds: 1), clock: clock)
        var cursor = try await server.handshake("lobby-pnpres")
        // Bob subscribes (a heartbeat with timeout 20), his long-poll drops, he returns at 15 s.
        _ = try await server.get("/v2/subscribe/demo/lobby/0?tt=0&heartbeat=20&uuid=bob")
        await clock.advance(by: .seconds(15))
        _ = try await server.get("/v2/subscribe/demo/lobby/0?tt=0&heartbeat=20&uuid=bob")
        await clock.advance(by: .seconds(15))
        // 30 s after his first subscribe, he is still present: one join, nothing else.
        let where_ = try await server.object("/v2/presence/sub-key/demo/uuid/bob?uuid=bob")
        #expect((where_["payload"] as? [String: Any])?["channels"] as? [String] == ["lobby"])
        #expect(try await events(server, "lobby-pnpres", from: &cursor, count: 1) == ["join:bob=1"])
        // An explicit leave is immediate.
        _ = try await server.get("/v2/presence/sub-key/demo/channel/lobby/leave?uuid=bob")
        #expect(try await events(server, "lobby-pnpres", from: &cursor, count: 1) == ["leave:bob=0"])
        await server.stop()
    }

    @Test func aSubscribeJoinsOnlyTheConcreteChannelsItNamesOnce() async throws {
        // One channel alone (the server's path without a set), a presence channel or a wildcard
        // alone (nothing to join), and a channel named twice (joined once).
        let server = try await TestServer.start(file: .init(subscribeTimeoutSeconds: 1))
        func channels(of uuid: String) async throws -> [String]? {
            let body = try await server.object("/v2/presence/sub-key/demo/uuid/\(uuid)?uuid=\(uuid)")
            return ((body["payload"] as? [String: Any])?["channels"] as? [String])?.sorted()
        }
        _ = try await server.get("/v2/subscribe/demo/room-pnpres/0?tt=0&heartbeat=60&uuid=carol")
        _ = try await server.get("/v2/subscribe/demo/sports.*/0?tt=0&heartbeat=60&uuid=carol")
        #expect(try await channels(of: "carol") == [])
        _ = try await server.get("/v2/subscribe/demo/room/0?tt=0&heartbeat=60&uuid=carol")
        #expect(try await channels(of: "carol") == ["room"])
        _ = try await server.get("/v2/subscribe/demo/hall,hall/0?tt=0&heartbeat=60&uuid=dave")
        #expect(try await channels(of: "dave") == ["hall"])
        let hall = try await server.object("/v2/presence/sub-key/demo/channel/hall?uuid=x")
        #expect(hall["occupancy"] as? Int == 1)
        await server.stop()
    }

    @Test func hereNowShapesAndStateRoundTrips() async throws {
        let server = try await TestServer.start()
        _ = try await server.get("/v2/presence/sub-key/demo/channel/a,b/heartbeat?uuid=u1")
        _ = try await server.get("/v2/presence/sub-key/demo/channel/b,b-pnpres/heartbeat?uuid=u2")
        let set = try await server.object("/v2/presence/sub-key/demo/channel/a/uuid/u1/data?state=%7B%22mood%22%3A%22happy%22%7D&uuid=u1")
        #expect((set["payload"] as? [String: String]) == ["mood": "happy"])

        let one = try await server.object("/v2/presence/sub-key/demo/channel/a?state=1&uuid=x")
        #expect(one["occupancy"] as? Int == 1)
        #expect((one["uuids"] as? [[String: Any]])?.first?["uuid"] as? String == "u1")
        #expect(((one["uuids"] as? [[String: Any]])?.first?["state"] as? [String: String]) == ["mood": "happy"])

        let several = try await server.object("/v2/presence/sub-key/demo/channel/a,b?uuid=x")
        let payload = several["payload"] as? [String: Any]
        #expect(payload?["total_channels"] as? Int == 2)
        #expect(payload?["total_occupancy"] as? Int == 3)
        #expect(((payload?["channels"] as? [String: Any])?["b"] as? [String: Any])?["uuids"] as? [String] == ["u1", "u2"])

        let global = try await server.object("/v2/presence/sub-key/demo?disable_uuids=1&uuid=x")
        let globalChannels = (global["payload"] as? [String: Any])?["channels"] as? [String: [String: Any]]
        #expect(globalChannels?.keys.sorted() == ["a", "b"])
        #expect(globalChannels?["a"]?["uuids"] == nil)

        let state = try await server.object("/v2/presence/sub-key/demo/channel/a/uuid/u1?uuid=u1")
        #expect(state["channel"] as? String == "a")
        #expect((state["payload"] as? [String: String]) == ["mood": "happy"])
        let states = try await server.object("/v2/presence/sub-key/demo/channel/a,b/uuid/u1?uuid=u1")
        #expect(((states["payload"] as? [String: Any])?["channels"] as? [String: [String: String]]) == ["a": ["mood": "happy"]])

        let missing = try await server.get("/v2/presence/sub-key/demo/channel/a/uuid/u1/data?uuid=u1")
        #expect(missing.status == 400)
        #expect(missing.body.contains("No state specified."))
        let noUUID = try await server.get("/v2/presence/sub-key/demo/channel/a/heartbeat")
        #expect(noUUID.status == 400)
        await server.stop()
    }

    @Test func channelGroupsAreDurableAndDeliverThroughTheGroup() async throws {
        let server = try await TestServer.start()
        let base = "/v1/channel-registration/sub-key/demo/channel-group"
        #expect(try await server.get("\(base)/news?add=sport,weather&uuid=x").status == 200)
        let listed = try await server.object("\(base)/news?uuid=x")
        #expect((listed["payload"] as? [String: Any])?["channels"] as? [String] == ["sport", "weather"])
        #expect((listed["payload"] as? [String: Any])?["group"] as? String == "news")

        // A subscriber waits on the group; a channel added meanwhile reaches it without a new handshake.
        let handshake = try await server.object("/v2/subscribe/demo/,/0?channel-group=news&tt=0&uuid=reader")
        let cursor = Timetoken(parsing: (handshake["t"] as? [String: Any])?["t"] as? String ?? "")!
        async let waiting = server.get("/v2/subscribe/demo/,/0?channel-group=news&tt=\(cursor.rawValue)&tr=1&uuid=reader")
        #expect(await server.longPollsWaiting(1))
        #expect(try await server.get("\(base)/news?add=politics&uuid=x").status == 200)
        let tt = try await server.publish("politics", #""vote""#)
        let (status, body, _) = try await waiting
        #expect(status == 200)
        let object = try JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any]
        let envelope = (object?["m"] as? [[String: Any]])?.first
        #expect(envelope?["b"] as? String == "news")
        #expect(envelope?["c"] as? String == "politics")
        #expect(envelope?.publishTimetoken == String(tt.rawValue))

        // The reader joined the group's channels when it subscribed; the channel added during
        // its long-poll counts from its next subscribe (the end of a poll never joins).
        let here = try await server.object("/v2/presence/sub-key/demo/channel/,?channel-group=news&uuid=x")
        #expect(((here["payload"] as? [String: Any])?["total_occupancy"] as? Int) == 2)

        #expect(try await server.get("\(base)/news?remove=weather&uuid=x").status == 200)
        await server.stop()

        let restarted = try await TestServer.start(directory: server.directory)
        let afterRestart = try await restarted.object("\(base)/news?uuid=x")
        #expect((afterRestart["payload"] as? [String: Any])?["channels"] as? [String] == ["politics", "sport"])
        let groups = try await restarted.object("\(base)?uuid=x")
        #expect((groups["payload"] as? [String: Any])?["groups"] as? [String] == ["news"])
        #expect(try await restarted.get("\(base)/news/remove?uuid=x").status == 200)
        let gone = try await restarted.object("\(base)?uuid=x")
        #expect((gone["payload"] as? [String: Any])?["groups"] as? [String] == [])
        let bad = try await restarted.get("\(base)/news?add=a%2Ab&uuid=x")
        #expect(bad.status == 400)
        await restarted.stop()
    }

    /// Before the restart: alice (heartbeat) and bob (subscribe, with state) join, carol joins and
    /// leaves. Returns the `-pnpres` cursor after those events.
    private func occupyBeforeRestart(_ server: TestServer) async throws -> Timetoken {
        var cursor = try await server.handshake("room-pnpres")
        _ = try await server.get("/v2/presence/sub-key/demo/channel/room/heartbeat?heartbeat=20&uuid=alice")
        _ = try await server.get("/v2/subscribe/demo/room/0?tt=0&heartbeat=20&uuid=bob&state=%7B%22room%22%3A%7B%22mood%22%3A%22calm%22%7D%7D")
        _ = try await server.get("/v2/presence/sub-key/demo/channel/room/heartbeat?heartbeat=20&uuid=carol")
        _ = try await server.get("/v2/presence/sub-key/demo/channel/room/leave?uuid=carol")
        #expect(try await events(server, "room-pnpres", from: &cursor, count: 5)
            == ["join:alice=1", "join:bob=2", "state-change:bob=2", "join:carol=3", "leave:carol=2"])
        return cursor
    }

    /// After the restart (on a fresh test clock): alice and bob are present, carol is not; bob
    /// heartbeats again, alice does not. Alice gets exactly one timeout, at restart + 20 s; bob
    /// and carol get nothing, and nobody is announced as joining again.
    private func expectTruthfulPresenceAfterRestart(directory: String, cursor before: Timetoken) async throws {
        let clock = TestClock()
        let server = try await TestServer.start(directory: directory, clock: clock)
        let here = try await server.object("/v2/presence/sub-key/demo/channel/room?state=1&uuid=x")
        #expect(here["occupancy"] as? Int == 2)
        let occupants = (here["uuids"] as? [[String: Any]]) ?? []
        #expect(occupants.map { $0["uuid"] as? String } == ["alice", "bob"])
        #expect(occupants.last?["state"] as? [String: String] == ["mood": "calm"])

        await clock.advance(by: .seconds(10))
        _ = try await server.get("/v2/presence/sub-key/demo/channel/room/heartbeat?heartbeat=20&uuid=bob")  // until 30 s
        await clock.advance(by: .seconds(9))
        #expect(try await server.object("/v2/presence/sub-key/demo/channel/room?uuid=x")["occupancy"] as? Int == 2)
        await clock.advance(by: .seconds(1))
        // From the cursor of before the restart: a re-announced join would come first.
        var cursor = before
        #expect(try await events(server, "room-pnpres", from: &cursor, count: 1) == ["timeout:alice=1"])
        await clock.advance(by: .seconds(9))  // 29 s: bob is still inside his timeout
        _ = try await server.get("/v2/presence/sub-key/demo/channel/room/leave?uuid=bob")
        // The next event is bob's leave: nothing else came between (no second timeout, no join).
        #expect(try await events(server, "room-pnpres", from: &cursor, count: 1) == ["leave:bob=0"])
        let empty = try await server.object("/v2/presence/sub-key/demo/channel/room?uuid=x")
        #expect(empty["occupancy"] as? Int == 0)
        await server.stop()

        // And a second restart brings back nobody: the timeout and the leave were stored too.
        let again = try await TestServer.start(directory: directory)
        let global = try await again.object("/v2/presence/sub-key/demo?uuid=x")
        #expect((global["payload"] as? [String: Any])?["total_occupancy"] as? Int == 0)
        await again.stop()
    }

    @Test func occupantsSurviveAStopAndTimeOutOnceUnlessTheyHeartbeat() async throws {
        let first = try await TestServer.start()
        let cursor = try await occupyBeforeRestart(first)
        await first.stop()
        try await expectTruthfulPresenceAfterRestart(directory: first.directory, cursor: cursor)
    }

    @Test func occupantsSurviveACrash() async throws {
        let first = try await TestServer.start()
        let cursor = try await occupyBeforeRestart(first)
        // The files as a crash would leave them: copied while the server runs (no checkpoint,
        // no shutdown; what is durable is in the database file and its write-ahead log).
        let crashed = FileManager.default.temporaryDirectory.appendingPathComponent("tether-crash-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: crashed, withIntermediateDirectories: true)
        for suffix in ["", "-wal"] {
            let source = MessageStore.databasePath(in: first.directory) + suffix
            if FileManager.default.fileExists(atPath: source) {
                try FileManager.default.copyItem(atPath: source, toPath: MessageStore.databasePath(in: crashed) + suffix)
            }
        }
        #expect(FileManager.default.fileExists(atPath: MessageStore.databasePath(in: crashed) + "-wal"))
        try await expectTruthfulPresenceAfterRestart(directory: crashed, cursor: cursor)
        await first.stop()
    }
}
