import Foundation
import Testing
import NIOHTTP1
import NIOSSL
import TetherProtocol
import TetherServer
import TetherTesting
import TetherTestingServer

/// The WebSocket session endpoint over a real socket on loopback, against a real server and
/// SQLite file (docs/websocket-protocol.md). Timing (pings, keep-alive) runs on a manual clock.
@Suite(.serialized) struct WebSocketTests {
    static func start(clock: ManualClock? = nil, webSocket: WebSocketSettings = .init(),
                      file: ConfigurationFile = .init(subscribeTimeoutSeconds: 30)) async throws -> InProcessServer {
        if let clock { return try await InProcessServer.start(file: file, clock: clock, webSocket: webSocket) }
        return try await InProcessServer.start(file: file, webSocket: webSocket)
    }

    static func hello(_ uuid: String = "alice", resume: (token: String, cursor: String?)? = nil) -> JSONValue {
        var object: [String: JSONValue] = ["type": "hello", "v": 1, "subscribeKey": "demo", "publishKey": "demo", "uuid": .string(uuid)]
        if let resume {
            var r: [String: JSONValue] = ["token": .string(resume.token)]
            if let cursor = resume.cursor { r["cursor"] = .string(cursor) }
            object["resume"] = .object(r)
        }
        return .object(object)
    }

    static func subscribe(_ channels: [String], cursor: String? = nil) -> JSONValue {
        var object: [String: JSONValue] = ["type": "subscribe", "channels": .array(channels.map { .string($0) })]
        if let cursor { object["cursor"] = .string(cursor) }
        return .object(object)
    }

    /// Connects, says hello, subscribes; returns the client, the welcome and the subscribe cursor.
    static func session(_ server: InProcessServer, uuid: String = "alice", channels: [String] = ["chat"], cursor: String? = nil)
        async throws -> (WebSocketTestClient, welcome: [String: JSONValue], cursor: String)
    {
        let client = WebSocketTestClient(baseURL: server.baseURL)
        client.send(hello(uuid))
        let welcome = try #require(await client.frame())
        #expect(welcome.type == "welcome")
        client.send(subscribe(channels, cursor: cursor))
        let subscribed = try #require(await client.frame(ofType: "subscribed"))
        return (client, welcome, try #require(subscribed["cursor"]?.stringValue))
    }

    /// Messages of `messages` frames until `count` envelopes arrived: (timetoken, payload text, frame cursor).
    static func envelopes(_ client: WebSocketTestClient, count: Int) async -> [(tt: String, payload: String, cursor: String)] {
        var result: [(String, String, String)] = []
        while result.count < count, let frame = await client.frame(ofType: "messages") {
            let cursor = frame["t"]?["t"]?.stringValue ?? ""
            for envelope in frame["m"]?.arrayValue ?? [] {
                result.append((envelope["p"]?["t"]?.stringValue ?? "", envelope["d"]?.jsonText ?? "", cursor))
            }
        }
        return result
    }

    /// A publish's `ack` and the envelopes of `count` messages, read in whatever order they come
    /// (a stored message is delivered at its commit, before the sync that its ack waits for).
    static func ackAndEnvelopes(_ client: WebSocketTestClient, count: Int) async
        -> (ack: [String: JSONValue]?, envelopes: [(tt: String, payload: String, cursor: String)])
    {
        var ack: [String: JSONValue]?
        var result: [(String, String, String)] = []
        while ack == nil || result.count < count, let frame = await client.frame() {
            switch frame["type"]?.stringValue {
            case "ack": ack = frame
            case "messages":
                let cursor = frame["t"]?["t"]?.stringValue ?? ""
                for envelope in frame["m"]?.arrayValue ?? [] {
                    result.append((envelope["p"]?["t"]?.stringValue ?? "", envelope["d"]?.jsonText ?? "", cursor))
                }
            default: continue
            }
        }
        return (ack, result)
    }

    @Test func helloSubscribePublishAck() async throws {
        let server = try await Self.start()
        let (client, welcome, _) = try await Self.session(server)
        #expect(welcome["resumed"] == .bool(false))
        #expect(welcome["keepAliveSeconds"] == 300)
        #expect(welcome["pingIntervalSeconds"] == 25)
        #expect(welcome["resumeToken"]?.stringValue?.count == 32)
        client.send(.object(["type": "publish", "requestId": "r1", "channel": "chat", "message": ["text": "hi"]]))
        let (answer, delivered) = await Self.ackAndEnvelopes(client, count: 1)
        let ack = try #require(answer)
        #expect(ack["requestId"] == "r1")
        let timetoken = try #require(ack["timetoken"]?.stringValue)
        #expect(delivered.map(\.tt) == [timetoken])
        #expect(delivered.first?.payload == #"{"text":"hi"}"#)
        // A refused publish is an ack with PubNub's error, not a closed socket.
        client.send(.object(["type": "publish", "requestId": "r2", "channel": "bad,channel", "message": 1]))
        let refused = try #require(await client.frame(ofType: "ack"))
        #expect(refused["requestId"] == "r2")
        #expect(refused["error"]?["status"] == 400)
        client.send(.object(["type": "ping", "id": "p1"]))
        let pong = try #require(await client.frame(ofType: "pong"))
        #expect(pong["id"] == "p1")
        await client.close()
        await server.stop()
    }

    @Test func aRepeatedRequestIdIsAckedWithTheOriginalTimetokenAndDeliveredOnce() async throws {
        let server = try await Self.start()
        let (client, _, _) = try await Self.session(server)
        client.send(.object(["type": "publish", "requestId": "same-id", "channel": "chat", "message": ["n": 1]]))
        let first = try #require(await client.frame(ofType: "ack"))
        #expect(first["repeat"] == nil)
        client.send(.object(["type": "publish", "requestId": "same-id", "channel": "chat", "message": ["n": 1]]))
        let second = try #require(await client.frame(ofType: "ack"))
        #expect(second["timetoken"] == first["timetoken"])
        #expect(second["repeat"] == .bool(true))
        let rest = TestServer(inProcess: server)
        let history = try await rest.object("/v3/history/sub-key/demo/channel/chat")
        #expect((history["channels"] as? [String: Any])?["chat"].flatMap { $0 as? [Any] }?.count == 1, "stored once")
        await client.close()
        await server.stop()
    }

    @Test func restPublishArrivesWithTheLongPollsTimetokenAndCursor() async throws {
        let server = try await Self.start()
        let rest = TestServer(inProcess: server)
        let (client, _, _) = try await Self.session(server, channels: ["news"])
        let handshake = try await rest.handshake("news")
        async let longPoll = rest.subscribe("news", tt: handshake)
        #expect(await rest.longPollsWaiting(2))  // the long-poll and the session's delivery loop
        let timetoken = try await rest.publish("news", #"{"n":1}"#)
        let (cursor, messages, _) = try await longPoll
        let delivered = await Self.envelopes(client, count: 1)
        #expect(delivered.map(\.tt) == [String(timetoken.rawValue)])
        #expect((messages.first?["p"] as? [String: Any])?["t"] as? String == String(timetoken.rawValue))
        // Both cursors are the visible horizon when each read: the session's frame at least the
        // message's timetoken, and the long-poll's (read when its parked wait ended, possibly a
        // moment later) at least the frame's.
        let frameCursor = delivered.first.flatMap { Timetoken(parsing: $0.cursor) }
        #expect(frameCursor.map { $0 >= timetoken && $0 <= cursor } == true, "frame \(String(describing: frameCursor)), long-poll \(cursor)")
        await client.close()
        await server.stop()
    }

    /// An idle subscribed session's delivery wait is parked in the hub without a task; a
    /// subscription change ends that wait and parks one for the new names, so the hub never
    /// holds a stale wait, and nothing on a name left is delivered.
    @Test func aSubscriptionChangeReplacesTheParkedDeliveryWait() async throws {
        let server = try await Self.start()
        let rest = TestServer(inProcess: server)
        let hub = server.server.state.hub
        let (client, _, _) = try await Self.session(server, channels: ["a"])
        #expect(await eventually { hub.waitingCount == 1 })
        client.send(Self.subscribe(["b"]))
        #expect(await client.frame(ofType: "subscribed")?["channels"] == .array([.string("a"), .string("b")]))
        client.send(.object(["type": "unsubscribe", "channels": .array([.string("a")])]))
        #expect(await client.frame(ofType: "unsubscribed")?["channels"] == .array([.string("b")]))
        // One wait, for "b" only: the two waits replaced were ended, not left to time out.
        #expect(await eventually { hub.waitingCount == 1 })
        _ = try await rest.publish("a", "\"left\"")
        let kept = try await rest.publish("b", "\"kept\"")
        let delivered = await Self.envelopes(client, count: 1)
        #expect(delivered.map(\.tt) == [String(kept.rawValue)])
        #expect(delivered.map(\.payload) == ["\"kept\""])
        // Parked again after the delivery.
        #expect(await eventually { hub.waitingCount == 1 })
        await client.close()
        #expect(await eventually { hub.waitingCount == 0 })
        await server.stop()
    }

    /// A parked delivery wait keeps the deadline it was parked with across wake-ups that send
    /// nothing (here every event is filtered out), as one long-poll does: at that deadline the
    /// session's cursor moves past what it skipped, however often it was woken meanwhile.
    @Test func aDeliveryWaitKeepsItsDeadlineAcrossWakeUpsThatSendNothing() async throws {
        let server = try await Self.start(file: .init(subscribeTimeoutSeconds: 1))
        let rest = TestServer(inProcess: server)
        let client = WebSocketTestClient(baseURL: server.baseURL)
        client.send(Self.hello())
        let token = try #require(await client.frame()?["resumeToken"]?.stringValue)
        client.send(.object(["type": "subscribe", "channels": ["f"], "filter": "priority == 'high'"]))
        #expect(await client.frame()?.type == "subscribed")
        #expect(await eventually { server.server.state.hub.waitingCount == 1 })
        func cursor() -> Timetoken? { server.server.webSocketSessionCursor(token: token).map(Timetoken.init(rawValue:)) }
        let low = "&meta=" + PercentCoding.encode(#"{"priority":"low"}"#)
        let first = try await rest.publish("f", "0", query: low)
        // Filtered-out events wake the wait ten times a second, more often than its deadline.
        var moved = false
        let limit = ContinuousClock.now + .seconds(8)
        while !moved, ContinuousClock.now < limit {
            _ = try await rest.publish("f", "0", query: low)
            moved = cursor().map { $0 >= first } ?? false
            try await Task.sleep(for: .milliseconds(100))
        }
        #expect(moved, "the session's cursor stayed at \(String(describing: cursor())), below \(first)")
        await client.close()
        await server.stop()
    }

    /// A resumed session with a filter: its replay ends with a frame at (or past) the cursor the
    /// welcome named, however few messages of each page the filter keeps. (A page the filter
    /// made short ended the replay: the rest, filtered out, sent no frame, and a client waited
    /// for the end of its catch-up until a message or the quiet answer came.)
    @Test func aFilteredReplayEndsAtTheWelcomesCursor() async throws {
        let server = try await Self.start()
        let rest = TestServer(inProcess: server)
        let client = WebSocketTestClient(baseURL: server.baseURL)
        client.send(Self.hello())
        let token = try #require(await client.frame()?["resumeToken"]?.stringValue)
        client.send(.object(["type": "subscribe", "channels": ["f"], "filter": "priority == 'high'"]))
        let start = try #require(await client.frame(ofType: "subscribed")?["cursor"]?.stringValue)
        client.drop()
        _ = await client.closeCode()
        #expect(await eventually { server.server.webSocketCounts.kept == 1 })
        let high = "&meta=" + PercentCoding.encode(#"{"priority":"high"}"#)
        let low = "&meta=" + PercentCoding.encode(#"{"priority":"low"}"#)
        var kept: [String] = []
        for index in 0..<250 {
            let timetoken = try await rest.publish("f", "\(index)", query: index < 5 ? high : low)
            if index < 5 { kept.append(String(timetoken.rawValue)) }
        }
        let again = WebSocketTestClient(baseURL: server.baseURL)
        again.send(Self.hello(resume: (token, start)))
        let welcome = try #require(await again.frame(ofType: "welcome"))
        #expect(welcome["resumed"] == .bool(true))
        let end = try #require(welcome["cursor"]?.stringValue.flatMap { UInt64($0) })
        var received: [String] = []
        var reached: UInt64 = 0
        while reached < end, let frame = await again.frame(ofType: "messages") {
            received += (frame["m"]?.arrayValue ?? []).compactMap { $0["p"]?["t"]?.stringValue }
            reached = frame["t"]?["t"]?.stringValue.flatMap { UInt64($0) } ?? 0
        }
        #expect(reached >= end, "a frame reached the welcome's cursor \(end): \(reached)")
        #expect(received == kept)
        await again.close()
        await server.stop()
    }

    @Test func resumeWithinTheWindowLosesNothingAndDuplicatesNothing() async throws {
        let server = try await Self.start()
        let rest = TestServer(inProcess: server)
        let (client, welcome, _) = try await Self.session(server)
        let token = try #require(welcome["resumeToken"]?.stringValue)
        var published: [String] = []
        for i in 0..<3 { published.append(String(try await rest.publish("chat", "\(i)").rawValue)) }
        let first = await Self.envelopes(client, count: 3)
        #expect(first.map(\.tt) == published)
        let cursor = try #require(first.last?.cursor)
        client.drop()
        _ = await client.closeCode()
        #expect(await eventually { server.server.webSocketCounts.kept == 1 })
        for i in 3..<8 { published.append(String(try await rest.publish("chat", "\(i)").rawValue)) }

        let again = WebSocketTestClient(baseURL: server.baseURL)
        again.send(Self.hello(resume: (token, cursor)))
        let resumed = try #require(await again.frame())
        #expect(resumed.type == "welcome")
        #expect(resumed["resumed"] == .bool(true))
        #expect(resumed["subscription"]?["channels"] == ["chat"])
        let replay = await Self.envelopes(again, count: 5)
        #expect(replay.map(\.tt) == Array(published[3...]))
        published.append(String(try await rest.publish("chat", "8").rawValue))
        let live = await Self.envelopes(again, count: 1)
        #expect(live.map(\.tt) == [published[8]])
        #expect(await again.drain(within: 0.3).filter { $0.type == "messages" }.isEmpty)
        await again.close()
        await client.close()
        await server.stop()
    }

    /// A session whose socket dropped before its first `subscribe` reached the server (or whose
    /// subscribe was refused) is resumed with the cursor the client held: the first `subscribe`
    /// after the resume starts there even without a cursor of its own, so what was published
    /// in between is delivered, not skipped.
    @Test func aResumeBeforeTheFirstSubscribeKeepsItsCursor() async throws {
        let server = try await Self.start()
        let rest = TestServer(inProcess: server)
        let client = WebSocketTestClient(baseURL: server.baseURL)
        client.send(Self.hello())
        let welcome = try #require(await client.frame())
        let token = try #require(welcome["resumeToken"]?.stringValue)
        let cursor = try #require(welcome["cursor"]?.stringValue)
        client.drop()
        _ = await client.closeCode()
        #expect(await eventually { server.server.webSocketCounts.kept == 1 })
        var published: [String] = []
        for i in 0..<3 { published.append(String(try await rest.publish("chat", "\(i)").rawValue)) }

        let again = WebSocketTestClient(baseURL: server.baseURL)
        again.send(Self.hello(resume: (token, cursor)))
        let resumed = try #require(await again.frame())
        #expect(resumed["resumed"] == .bool(true))
        again.send(.object(["type": "subscribe", "channels": ["chat"]]))
        #expect(await Self.envelopes(again, count: 3).map(\.tt) == published)
        await again.close()
        await client.close()
        await server.stop()
    }

    /// Presence state sent on a WebSocket subscribe nests at most as deep as any kept value
    /// (`JSONText.maximumValueDepth`), as on REST: here-now and presence events carry it inside
    /// levels of their own and must stay readable.
    @Test func aSubscribeStateNestedTooDeepIsRefused() async throws {
        let server = try await Self.start()
        let client = WebSocketTestClient(baseURL: server.baseURL)
        client.send(Self.hello())
        _ = try #require(await client.frame())
        let depth = JSONText.maximumValueDepth
        let tooDeep = "{\"s\":" + String(repeating: "[", count: depth) + String(repeating: "]", count: depth) + "}"
        client.send(#"{"type":"subscribe","channels":["chat"],"state":{"chat":\#(tooDeep)}}"#)
        let refused = try #require(await client.frame(ofType: "error"))
        #expect(refused["code"] == "invalidState", "\(refused)")
        let fine = "{\"s\":" + String(repeating: "[", count: depth - 1) + String(repeating: "]", count: depth - 1) + "}"
        client.send(#"{"type":"subscribe","channels":["chat"],"state":{"chat":\#(fine)}}"#)
        #expect(try #require(await client.frame(ofType: "subscribed"))["channels"] == ["chat"])
        await client.close()
        await server.stop()
    }

    @Test func aResumeTakesTheSessionOverAndAForeignTokenIsUnknown() async throws {
        let server = try await Self.start()
        let (first, welcome, _) = try await Self.session(server)
        let token = try #require(welcome["resumeToken"]?.stringValue)
        // Another uuid with alice's token: not alice's session; hers is untouched.
        let mallory = WebSocketTestClient(baseURL: server.baseURL)
        mallory.send(Self.hello("mallory", resume: (token, nil)))
        #expect(await mallory.frame()?["notice"] == "sessionExpired")
        #expect(await mallory.frame()?["resumed"] == .bool(false))
        #expect(server.server.webSocketCounts.connections == 2)
        // Alice on a second socket while the first is open: the first is closed with 4409.
        let second = WebSocketTestClient(baseURL: server.baseURL)
        second.send(Self.hello(resume: (token, nil)))
        #expect(await second.frame()?["resumed"] == .bool(true))
        #expect(await first.closeCode() == 4409)
        let timetoken = try await TestServer(inProcess: server).publish("chat", "1")
        #expect(await Self.envelopes(second, count: 1).map(\.tt) == [String(timetoken.rawValue)])
        await mallory.close()
        await second.close()
        await first.close()
        await server.stop()
    }

    @Test func resumeAfterTheWindowSaysExpiredAndCatchUpWorksFromTheCursor() async throws {
        let clock = ManualClock()
        let server = try await Self.start(clock: clock)
        let rest = TestServer(inProcess: server)
        let (client, welcome, _) = try await Self.session(server)
        let token = try #require(welcome["resumeToken"]?.stringValue)
        let before = try await rest.publish("chat", "1")
        let cursor = try #require(await Self.envelopes(client, count: 1).last?.cursor)
        #expect(cursor == String(before.rawValue))
        client.drop()
        _ = await client.closeCode()
        #expect(await eventually { server.server.webSocketCounts.kept == 1 })
        let missed = try await rest.publish("chat", "2")
        clock.advance(by: .seconds(301))
        await server.server.tickWebSocketSessions()
        #expect(server.server.webSocketCounts.sessions == 0)

        let again = WebSocketTestClient(baseURL: server.baseURL)
        again.send(Self.hello(resume: (token, cursor)))
        let notice = try #require(await again.frame())
        #expect(notice.type == "notice")
        #expect(notice["notice"] == "sessionExpired")
        let fresh = try #require(await again.frame())
        #expect(fresh.type == "welcome")
        #expect(fresh["resumed"] == .bool(false))
        again.send(Self.subscribe(["chat"], cursor: cursor))
        #expect(await Self.envelopes(again, count: 1).map(\.tt) == [String(missed.rawValue)])
        await again.close()
        await client.close()
        await server.stop()
    }

    @Test func presenceJoinsOnceAcrossAReconnectAndLeavesOnBye() async throws {
        let server = try await Self.start()
        let (watcher, _, _) = try await Self.session(server, uuid: "watcher", channels: ["room-pnpres"])
        let (client, welcome, _) = try await Self.session(server, uuid: "alice", channels: ["room"])
        let token = try #require(welcome["resumeToken"]?.stringValue)
        func actions(_ frames: [[String: JSONValue]]) -> [String] {
            frames.filter { $0.type == "messages" }.flatMap { $0["m"]?.arrayValue ?? [] }
                .compactMap { envelope in envelope["d"]?["action"]?.stringValue.map { "\($0) \(envelope["d"]?["uuid"]?.stringValue ?? "")" } }
        }
        #expect(actions(await watcher.drain(within: 1)) == ["join alice"])
        client.drop()
        _ = await client.closeCode()
        #expect(await eventually { server.server.webSocketCounts.kept == 1 })
        let again = WebSocketTestClient(baseURL: server.baseURL, maxFrameSize: 16 << 20)  // replay pages of 30 KB messages
        again.send(Self.hello(resume: (token, nil)))
        #expect(await again.frame()?["resumed"] == .bool(true))
        #expect(actions(await watcher.drain(within: 0.5)) == [])
        again.send(.object(["type": "bye"]))
        #expect(await again.closeCode() == 1000)
        #expect(actions(await watcher.drain(within: 1)) == ["leave alice"])
        #expect(server.server.webSocketCounts.sessions == 1)  // the watcher's
        await watcher.close()
        await again.close()
        await client.close()
        await server.stop()
    }

    @Test func keptSessionTimesOutOfPresenceWhenItsWindowLapses() async throws {
        let clock = ManualClock()
        let server = try await Self.start(clock: clock)
        let (watcher, _, _) = try await Self.session(server, uuid: "watcher", channels: ["room-pnpres"])
        let (client, _, _) = try await Self.session(server, uuid: "alice", channels: ["room"])
        #expect(await watcher.frame(ofType: "messages")?["m"]?[0]?["d"]?["action"] == "join")
        client.drop()
        _ = await client.closeCode()
        #expect(await eventually { server.server.webSocketCounts.kept == 1 })
        clock.advance(by: .seconds(299))
        await server.server.tickWebSocketSessions()
        #expect(await watcher.drain(within: 0.5).filter { $0.type == "messages" }.isEmpty)
        // The presence loop sleeps on the manual clock a second at a time: step until it ticks.
        var timeout: [String: JSONValue]?
        for _ in 0..<10 where timeout == nil {
            clock.advance(by: .seconds(1))
            await server.server.tickWebSocketSessions()
            timeout = await watcher.frame(ofType: "messages", within: 0.5)
        }
        #expect(timeout?["m"]?[0]?["d"]?["action"] == "timeout")
        #expect(server.server.webSocketCounts.sessions == 1)  // the watcher's; alice's expired
        await watcher.close()
        await client.close()
        await server.stop()
    }

    @Test func twoMissedPongsCloseTheConnectionAndKeepTheSession() async throws {
        let clock = ManualClock()
        let server = try await Self.start(clock: clock)
        let client = WebSocketTestClient(baseURL: server.baseURL)
        client.send(Self.hello())
        #expect(await client.frame()?.type == "welcome")
        clock.advance(by: .seconds(25))
        await server.server.tickWebSocketSessions()
        #expect(await client.frame(pings: true)?.type == "ping")
        clock.advance(by: .seconds(25))
        await server.server.tickWebSocketSessions()
        #expect(await client.frame(pings: true)?.type == "ping")
        clock.advance(by: .seconds(25))
        await server.server.tickWebSocketSessions()
        #expect(await client.closeCode() == 4001)
        #expect(await eventually { server.server.webSocketCounts.kept == 1 })
        await client.close()
        await server.stop()
    }

    @Test func aSocketWithoutHelloIsClosedAtItsDeadline() async throws {
        let clock = ManualClock()
        let server = try await Self.start(clock: clock)
        let client = WebSocketTestClient(baseURL: server.baseURL)
        #expect(await eventually { server.server.webSocketCounts.connections == 1 })
        clock.advance(by: .seconds(10))
        await server.server.tickWebSocketSessions()
        #expect(await client.closeCode() == 4002)
        #expect(await eventually { server.server.webSocketCounts.connections == 0 })
        await client.close()
        await server.stop()
    }

    @Test func theFilterExpressionAndPresenceStateApply() async throws {
        let server = try await Self.start()
        let client = WebSocketTestClient(baseURL: server.baseURL)
        client.send(Self.hello())
        #expect(await client.frame()?.type == "welcome")
        client.send(.object(["type": "subscribe", "channels": ["f"], "filter": "priority == 'high'", "state": ["f": ["mood": "busy"]]]))
        #expect(await client.frame()?.type == "subscribed")
        let rest = TestServer(inProcess: server)
        _ = try await rest.publish("f", "1", query: "&meta=" + PercentCoding.encode(#"{"priority":"low"}"#))
        let high = try await rest.publish("f", "2", query: "&meta=" + PercentCoding.encode(#"{"priority":"high"}"#))
        #expect(await Self.envelopes(client, count: 1).map(\.tt) == [String(high.rawValue)])
        let state = try await rest.get("/v2/presence/sub-key/demo/channel/f/uuid/alice")
        #expect(state.body.contains(#""mood":"busy""#), "\(state.body)")
        client.send(.object(["type": "subscribe", "channels": ["g"], "filter": "(("]))
        #expect(await client.frame()?["code"] == "invalidFilter")
        await client.close()
        await server.stop()
    }

    @Test func answeredPingsKeepTheConnection() async throws {
        let clock = ManualClock()
        let server = try await Self.start(clock: clock)
        let client = WebSocketTestClient(baseURL: server.baseURL)
        client.send(Self.hello())
        #expect(await client.frame()?.type == "welcome")
        for _ in 0..<4 {
            clock.advance(by: .seconds(25))
            await server.server.tickWebSocketSessions()
            let ping = try #require(await client.frame(pings: true))
            #expect(ping.type == "ping")
            client.send(.object(["type": "pong", "id": ping["id"] ?? .null]))
            client.send(.object(["type": "ping", "id": 7]))
            #expect(await client.frame()?["id"] == 7)  // the pong, so the server has read ours
        }
        #expect(server.server.webSocketCounts.connections == 1)
        await client.close()
        await server.stop()
    }

    @Test(arguments: [
        ("not json", 4400, "malformed"),
        (#"{"no":"type"}"#, 4400, "malformed"),
        (#"{"type":"teleport"}"#, 4404, "unknownType"),
        (#"{"type":"subscribe","channels":["a"]}"#, 4400, "malformed"),  // before hello
        (#"{"type":"suspend","keepAliveSeconds":0}"#, 4400, "malformed"),
        (#"{"type":"suspend","keepAliveSeconds":1.5}"#, 4400, "malformed"),
        (#"{"type":"suspend","keepAliveSeconds":"600"}"#, 4400, "malformed"),
        (#"{"type":"suspend","keepAliveSeconds":86401}"#, 4400, "malformed"),
    ])
    func hostileFramesGetTheirCloseCodes(_ text: String, _ code: Int, _ error: String) async throws {
        let server = try await Self.start()
        let client = WebSocketTestClient(baseURL: server.baseURL)
        if !text.contains("subscribe") {
            client.send(Self.hello())
            #expect(await client.frame()?.type == "welcome")
        }
        client.send(text)
        let frame = try #require(await client.frame())
        #expect(frame.type == "error")
        #expect(frame["code"]?.stringValue == error)
        #expect(await client.closeCode() == code)
        await client.close()
        await server.stop()
    }

    @Test func suspendIsAnsweredWithTheWindowGrantedBoundedByTheServersMaximum() async throws {
        let server = try await Self.start()
        let client = WebSocketTestClient(baseURL: server.baseURL)
        client.send(Self.hello())
        #expect(await client.frame()?.type == "welcome")
        client.send(#"{"type":"suspend","keepAliveSeconds":7200}"#)
        let granted = try #require(await client.frame())
        #expect(granted.type == "suspended")
        #expect(granted["keepAliveSeconds"] == 3_600, "the default --ws-max-suspend")
        client.send(#"{"type":"suspend","keepAliveSeconds":120}"#)
        #expect(await client.frame()?["keepAliveSeconds"] == 120)
        client.send(#"{"type":"suspend"}"#)
        #expect(await client.frame()?["keepAliveSeconds"] == 3_600, "no window asked: the maximum")
        await client.close()
        await server.stop()
    }

    @Test func oversizedBinaryAndTooManyChannels() async throws {
        let server = try await Self.start()
        let big = WebSocketTestClient(baseURL: server.baseURL, maxFrameSize: 1 << 22)
        big.send(String(repeating: "x", count: 200_000))
        #expect(await big.closeCode() == 1009)
        await big.close()

        let binary = WebSocketTestClient(baseURL: server.baseURL)
        binary.send(Self.hello())
        #expect(await binary.frame()?.type == "welcome")
        binary.sendBinary()
        #expect(await binary.frame()?["code"] == "malformed")
        #expect(await binary.closeCode() == 4400)
        await binary.close()

        let many = WebSocketTestClient(baseURL: server.baseURL)
        many.send(Self.hello())
        #expect(await many.frame()?.type == "welcome")
        many.send(Self.subscribe((0..<201).map { "c\($0)" }))
        #expect(await many.frame()?["code"] == "tooManyChannels")
        #expect(await many.closeCode() == 4413)
        await many.close()
        await server.stop()
    }

    @Test func slowConsumerIsDisconnectedAndItsSessionKept() async throws {
        let server = try await Self.start(webSocket: .init(outboundBufferFrames: 4, outboundBufferBytes: 64 * 1024))
        let rest = TestServer(inProcess: server)
        let client = WebSocketTestClient(baseURL: server.baseURL, reads: false)
        client.send(Self.hello())
        client.send(Self.subscribe(["flood"]))
        #expect(await eventually { server.server.state.hub.waitingCount == 1 })
        let payload = "\"" + String(repeating: "y", count: 30_000) + "\""
        var sent = 0
        // Until the socket's buffers fill and the outbound buffer overflows (store=0: no fsync).
        while server.server.webSocketCounts.kept == 0, sent < 2_000 {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for _ in 0..<20 { group.addTask { _ = try await rest.publish("flood", payload, query: "&store=0") } }
                try await group.waitForAll()
            }
            sent += 20
        }
        #expect(server.server.webSocketCounts.kept == 1)
        #expect(server.server.webSocketCounts.connections == 0)
        await client.close()
        await server.stop()
    }

    /// A session on `channel` whose client has stopped reading, and its resume token.
    static func pausedSession(_ server: InProcessServer, channel: String) async throws -> (WebSocketTestClient, token: String) {
        let client = WebSocketTestClient(baseURL: server.baseURL)
        client.send(hello())
        let token = try #require(await client.frame()?["resumeToken"]?.stringValue)
        client.send(subscribe([channel]))
        #expect(await client.frame(ofType: "subscribed") != nil)
        client.pauseReading()
        #expect(await eventually { server.server.state.hub.waitingCount == 1 })
        return (client, token)
    }

    /// Stored publishes of ~30 KB to `channel`, 20 at a time, until `done` (at most 100 rounds);
    /// their timetokens, in no particular order.
    static func flood(_ rest: TestServer, channel: String, until done: () -> Bool) async throws -> [UInt64] {
        let filler = String(repeating: "y", count: 30_000)
        var published: [UInt64] = []
        var round = 0
        while !done(), round < 100 {
            let prefix = "\(round)-"
            published += try await withThrowingTaskGroup(of: UInt64.self) { group in
                for index in 0..<20 {
                    group.addTask { try await rest.publish(channel, "\"\(prefix)\(index)-\(filler)\"").rawValue }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            round += 1
        }
        return published
    }

    /// A frame dropped for a slow consumer (the one that overflowed the buffer, and those held
    /// when the socket closed) is not skipped by a client that resumes without a cursor of its
    /// own: the session's cursor is set back to the last frame that reached the socket, so what
    /// the first socket received and what the resume replays make up everything published.
    @Test func aResumeWithoutACursorAfterASlowConsumerSkipsNothing() async throws {
        let server = try await Self.start(webSocket: .init(outboundBufferFrames: 4, outboundBufferBytes: 64 * 1024))
        let rest = TestServer(inProcess: server)
        let (client, token) = try await Self.pausedSession(server, channel: "flood")
        // Until the socket's buffers fill and the outbound buffer overflows.
        let published = Set(try await Self.flood(rest, channel: "flood") { server.server.webSocketCounts.kept > 0 }.map(String.init))
        #expect(server.server.webSocketCounts.kept == 1)
        // What reached the first socket, read now.
        client.resumeReading()
        var received: [String] = []
        while let event = await client.next(), case .frame(let frame) = event {
            guard frame.type == "messages" else { continue }
            received += (frame["m"]?.arrayValue ?? []).compactMap { $0["p"]?["t"]?.stringValue }
        }
        #expect(received.count < published.count, "the slow consumer missed messages")
        // A resume without a cursor replays the rest.
        let again = WebSocketTestClient(baseURL: server.baseURL, maxFrameSize: 16 << 20)  // replay pages of 30 KB messages
        again.send(Self.hello(resume: (token, nil)))
        #expect(await again.frame()?["resumed"] == .bool(true))
        let replay = await Self.envelopes(again, count: published.count - received.count).map(\.tt)
        #expect(Set(received).isDisjoint(with: replay))
        let all = published.sorted { UInt64($0)! < UInt64($1)! }
        let missing = all.enumerated().filter { !Set(received).union(replay).contains($0.element) }.map(\.offset)
        #expect(Set(received).union(replay) == published,
                "received \(received.count), replayed \(replay.count) of \(all.count); missing at \(missing); replay starts at \(replay.first.flatMap { all.firstIndex(of: $0) } ?? -1)")
        #expect(received + replay == (received + replay).sorted { UInt64($0)! < UInt64($1)! })
        await again.close()
        await client.close()
        await server.stop()
    }

    /// A resume without a cursor that takes the session over from a socket that is still open
    /// but not reading (half-dead) starts before the frames that socket has not written, held
    /// or being written, instead of after them.
    @Test func aResumeWithoutACursorThatTakesOverAStuckSocketSkipsNothingItHeld() async throws {
        let server = try await Self.start(webSocket: .init(outboundBufferFrames: 100_000, outboundBufferBytes: 512 << 20))
        let rest = TestServer(inProcess: server)
        let (client, token) = try await Self.pausedSession(server, channel: "stuck")
        // Until the socket's buffers are full and the server holds frames for it.
        var published = try await Self.flood(rest, channel: "stuck") { (server.server.webSocketOutbound(token: token)?.held ?? 0) > 0 }
        published.sort()
        let last = try #require(published.last)
        // Every publish reached the session's deliveries: its cursor is the last one's. (Up to a
        // few MB of 30 KB frames: on a loaded 2-core machine this took more than 10 s once.)
        #expect(await eventually(within: 30) { server.server.webSocketSessionCursor(token: token) == last })
        let outbound = try #require(server.server.webSocketOutbound(token: token))
        #expect(outbound.held > 0)
        let undelivered = try #require(outbound.undelivered)
        #expect(undelivered < last, "the session's cursor is past frames its socket never wrote")

        let again = WebSocketTestClient(baseURL: server.baseURL, maxFrameSize: 16 << 20)
        again.send(Self.hello(resume: (token, nil)))
        #expect(await again.frame()?["resumed"] == .bool(true))
        let expected = published.filter { $0 > undelivered }
        let replay = await Self.envelopes(again, count: expected.count).compactMap { UInt64($0.tt) }
        #expect(replay == expected, "replayed \(replay.count) of the \(expected.count) not written to the first socket")
        await again.close()
        await client.close()
        await server.stop()
    }

    @Test func shutdownDrainsEverySession() async throws {
        let server = try await Self.start(webSocket: .init(drainReconnectAfterMilliseconds: 2_000, drainJitterMilliseconds: 3_000))
        let (client, _, _) = try await Self.session(server)
        async let stopped: Void = server.stop()
        let notice = try #require(await client.frame(ofType: "notice"))
        #expect(notice["notice"] == "drain")
        #expect(notice["reconnectAfterMs"] == 2_000)
        #expect(notice["jitterMs"] == 3_000)
        #expect(await client.closeCode() == 1012)
        await stopped
        await client.close()
    }

    @Test func accessIsCheckedAtSubscribeAndPublishAndARevokedGrantEndsOnlyItsChannels() async throws {
        let keyset = Keyset(name: "secure", publishKey: "pub-s", subscribeKey: "sub-s", secretKey: "s3cret")
        let server = try await Self.start(file: .init(keysets: [keyset], subscribeTimeoutSeconds: 30))
        let rest = TestServer(inProcess: server)
        for channel in ["open", "also"] {
            let grant = try await rest.get(signedPath("/v2/auth/grant/sub-key/sub-s",
                                                      ["channel": channel, "auth": "ak", "r": "1", "w": "1", "ttl": "5", "uuid": "admin"],
                                                      keyset: keyset))
            #expect(grant.status == 200, "\(grant.body)")
        }
        let client = WebSocketTestClient(baseURL: server.baseURL)
        client.send(.object(["type": "hello", "v": 1, "subscribeKey": "sub-s", "publishKey": "pub-s", "uuid": "u", "auth": "ak"]))
        #expect(await client.frame()?.type == "welcome")
        client.send(Self.subscribe(["open", "also", "closed"]))
        let subscribed = try #require(await client.frame())
        #expect(subscribed["channels"] == ["open", "also"])
        let denied = try #require(await client.frame())
        #expect(denied["notice"] == "accessDenied")
        #expect(denied["channels"] == ["closed"])
        client.send(.object(["type": "publish", "requestId": "w1", "channel": "closed", "message": 1]))
        #expect(await client.frame(ofType: "ack")?["error"]?["status"] == 403)
        client.send(.object(["type": "publish", "requestId": "w2", "channel": "open", "message": 2]))
        let (ack, delivered) = await Self.ackAndEnvelopes(client, count: 1)
        #expect(ack?["timetoken"] != nil)
        #expect(delivered.count == 1)
        // Revoking read on one channel ends that channel only.
        let revoke = try await rest.get(signedPath("/v2/auth/grant/sub-key/sub-s",
                                                   ["channel": "open", "auth": "ak", "r": "0", "w": "0", "ttl": "5", "uuid": "admin"],
                                                   keyset: keyset))
        #expect(revoke.status == 200)
        let ended = try #require(await client.frame(ofType: "notice"))
        #expect(ended["notice"] == "accessDenied")
        #expect(ended["channels"] == ["open"])
        let published = try await rest.get(signedPath("/publish/pub-s/sub-s/0/also/0/3", ["uuid": "admin"], keyset: keyset))
        #expect(published.status == 200, "\(published.body)")
        #expect(await Self.envelopes(client, count: 1).map(\.payload) == ["3"])
        await client.close()
        await server.stop()
    }

    /// `hello` names a uuid nobody proves: with a token bound to no uuid (or another), the session
    /// may subscribe but not set the uuid's state or send its leave, as REST refuses both.
    @Test func aSessionActsForItsUUIDOnlyWithATokenBoundToIt() async throws {
        let keyset = Keyset(name: "secure", publishKey: "pub-s", subscribeKey: "sub-s", secretKey: "s3cret")
        let server = try await Self.start(file: .init(keysets: [keyset], subscribeTimeoutSeconds: 30))
        let rest = TestServer(inProcess: server)
        func token(_ uuid: String?) async throws -> String {
            let bound = uuid.map { #","uuid":"\#($0)""# } ?? ""
            let body = #"{"ttl":5,"permissions":{"resources":{"channels":{"room":3}}\#(bound)}}"#
            let response = try await rest.send(signedPath("/v3/pam/sub-s/grant", ["uuid": "admin"], method: "POST", body: body, keyset: keyset),
                                               method: .POST, body: Array(body.utf8), headers: [("Content-Type", "application/json")])
            let object = (try? JSONSerialization.jsonObject(with: Data(response.body.utf8))) as? [String: Any]
            return try #require((object?["data"] as? [String: Any])?["token"] as? String, "\(response.body)")
        }
        func occupants() async throws -> String {
            try await rest.get(signedPath("/v2/presence/sub-key/sub-s/channel/room", ["uuid": "admin", "state": "1"], keyset: keyset)).body
        }
        for (uuid, bound) in [("bob", nil), ("carol", "carol")] as [(String, String?)] {
            let client = WebSocketTestClient(baseURL: server.baseURL)
            client.send(.object(["type": "hello", "v": 1, "subscribeKey": "sub-s", "publishKey": "pub-s", "uuid": .string(uuid),
                                 "auth": .string(try await token(bound))]))
            #expect(await client.frame()?.type == "welcome")
            client.send(.object(["type": "subscribe", "channels": ["room"], "groups": [], "state": ["room": ["x": 1]]]))
            let answer = try #require(await client.frame())
            if bound == nil {
                #expect(answer["code"] == "invalidState", "\(answer)")
                client.send(Self.subscribe(["room"]))
                #expect(await client.frame(ofType: "subscribed") != nil)
            } else {
                #expect(answer.type == "subscribed", "\(answer)")
            }
            #expect(try await occupants().contains(#""\#(uuid)""#))
            client.send(.object(["type": "unsubscribe", "channels": ["room"], "groups": []]))
            #expect(await client.frame(ofType: "unsubscribed") != nil)
            let after = try await occupants()
            // Bound: the leave is sent. Unbound: no leave for the uuid (it times out there).
            #expect(after.contains(#""\#(uuid)""#) == (bound == nil), "\(after)")
            #expect(!after.contains(#""x":1"#) || bound != nil, "the unbound session set no state: \(after)")
            await client.close()
        }
        // Nor by `bye` or a suspend without presence: the unbound session's uuid stays present.
        for (uuid, frame) in [("dave", ["type": "bye"]), ("erin", ["type": "suspend", "keepAliveSeconds": 60, "presence": false])]
            as [(String, JSONValue)] {
            let client = WebSocketTestClient(baseURL: server.baseURL)
            client.send(.object(["type": "hello", "v": 1, "subscribeKey": "sub-s", "publishKey": "pub-s", "uuid": .string(uuid),
                                 "auth": .string(try await token(nil))]))
            #expect(await client.frame()?.type == "welcome")
            client.send(Self.subscribe(["room"]))
            #expect(await client.frame(ofType: "subscribed") != nil)
            client.send(frame)
            if frame["type"] == "suspend" { #expect(await client.frame(ofType: "suspended") != nil) }
            await client.close()
            #expect(try await occupants().contains(#""\#(uuid)""#), "\(uuid) after \(frame)")
        }
        await server.stop()
    }

    @Test func aCursorMovesBetweenLongPollAndWebSocketWithNoLossAndNoDuplicate() async throws {
        let server = try await Self.start()
        let rest = TestServer(inProcess: server)
        var published: [String] = []
        // Long-poll first.
        let start = try await rest.handshake("move")
        for i in 0..<3 { published.append(String(try await rest.publish("move", "\(i)").rawValue)) }
        let (longPollCursor, first, _) = try await rest.subscribe("move", tt: start)
        #expect(first.compactMap { ($0["p"] as? [String: Any])?["t"] as? String } == Array(published[0..<3]))
        for i in 3..<6 { published.append(String(try await rest.publish("move", "\(i)").rawValue)) }
        // Then the WebSocket from the long-poll's cursor.
        let (client, _, _) = try await Self.session(server, channels: ["move"], cursor: String(longPollCursor.rawValue))
        let second = await Self.envelopes(client, count: 3)
        #expect(second.map(\.tt) == Array(published[3..<6]))
        await client.close()
        for i in 6..<8 { published.append(String(try await rest.publish("move", "\(i)").rawValue)) }
        // And back to long-poll from the session's cursor.
        let (_, third, _) = try await rest.subscribe("move", tt: try #require(Timetoken(parsing: second.last?.cursor ?? "")))
        #expect(third.compactMap { ($0["p"] as? [String: Any])?["t"] as? String } == Array(published[6..<8]))
        await server.stop()
    }

    @Test func aPublishFloodGetsRateLimitedAcks() async throws {
        var limits = Limits()
        limits.publishRatePerSecond = 1
        limits.publishBurst = 2
        let keyset = Keyset(name: "tight", publishKey: "pub-t", subscribeKey: "sub-t", limits: limits)
        let server = try await Self.start(file: .init(keysets: [keyset], subscribeTimeoutSeconds: 30))
        let client = WebSocketTestClient(baseURL: server.baseURL)
        client.send(.object(["type": "hello", "v": 1, "subscribeKey": "sub-t", "publishKey": "pub-t", "uuid": "flooder"]))
        #expect(await client.frame()?.type == "welcome")
        for i in 0..<4 { client.send(.object(["type": "publish", "requestId": .string("r\(i)"), "channel": "c", "message": 1])) }
        var statuses: [String: Int] = [:]
        var notices = 0
        while statuses.count < 4, let frame = await client.frame() {
            if frame.type == "ack", let id = frame["requestId"]?.stringValue {
                statuses[id] = frame["timetoken"] != nil ? 200 : Int(frame["error"]?["status"]?.numberValue?.exactInteger ?? 0)
            }
            if frame["notice"] == "rateLimited" { notices += 1 }
        }
        #expect(statuses == ["r0": 200, "r1": 200, "r2": 429, "r3": 429])
        #expect(notices >= 1)
        #expect(server.server.webSocketCounts.connections == 1)  // limited, not disconnected
        await client.close()
        await server.stop()
    }

    @Test func sessionsWorkOverTLS() async throws {
        let certificates = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("Sources/TetherTesting/Certificates")
        let server = try await InProcessServer.start(tls: (certificates.appendingPathComponent("server.pem").path,
                                                           certificates.appendingPathComponent("server-key.pem").path))
        var trusting = TLSConfiguration.makeClientConfiguration()
        trusting.trustRoots = .file(certificates.appendingPathComponent("ca.pem").path)
        // The certificate names localhost (an IP address cannot be a TLS server name).
        let client = WebSocketTestClient(baseURL: server.baseURL.replacingOccurrences(of: "127.0.0.1", with: "localhost"), tls: trusting)
        client.send(Self.hello())
        #expect(await client.frame()?.type == "welcome")
        client.send(Self.subscribe(["secure"]))
        #expect(await client.frame(ofType: "subscribed") != nil)
        client.send(.object(["type": "publish", "requestId": "t1", "channel": "secure", "message": "s"]))
        let (ack, delivered) = await Self.ackAndEnvelopes(client, count: 1)
        #expect(delivered.map(\.tt) == [ack?["timetoken"]?.stringValue ?? "no ack"])
        await client.close()
        await server.stop()
    }

    @Test func upgradesWhoseSocketResetsBeforeTheSessionRunsGiveTheirSlotsBack() async throws {
        // The sessions' clock stands still, so the hello timeout (which would end a connection
        // that never sent `hello` 10 s later, slot and all) cannot be what gives a slot back.
        let server = try await Self.start(clock: ManualClock(), webSocket: .init(maxConnections: 1))
        // Each sends the upgrade request and resets its socket at once: the endpoint accepts the
        // upgrade (taking the slot), and the socket can be gone before the session runs.
        for _ in 0..<30 { try sendAndReset(port: server.port, Self.upgradeRequest) }
        #expect(await eventually { server.server.webSocketUpgradesAccepted >= 1 })
        // The slot comes back as the server sees the resets; a leaked one never would, and every
        // later upgrade would be refused with 503.
        let welcomed = await eventually {
            let client = WebSocketTestClient(baseURL: server.baseURL)
            client.send(Self.hello())
            let frame = await client.frame()
            await client.close()
            return frame?.type == "welcome"
        }
        #expect(welcomed, "a session connects: the reset upgrades gave their slots back")
        #expect(await eventually { server.server.webSocketCounts.connections == 0 })
        await server.stop()
    }

    /// A connection gets Hummingbird's side (its HTTP/1 handlers and request loop, or the upgrade
    /// handler) only once it sends a request the hot path passes on; the hot routes are answered
    /// without it, and upgrades and passed-on requests still work, with the endpoint on or off.
    @Test(arguments: [true, false])
    func hummingbirdsSideIsBuiltOnlyForConnectionsThatNeedIt(webSocketEnabled: Bool) async throws {
        let server = try await Self.start(webSocket: .init(enabled: webSocketEnabled))
        func get(_ path: String, close: Bool = false) -> String {
            "GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\n" + (close ? "Connection: close\r\n" : "") + "\r\n"
        }
        let hot = try await rawHTTP(port: server.port, get("/time/0") + get("/publish/demo/demo/0/ch/0/%22hi%22")
                                        + get("/v2/subscribe/demo/ch/0?tt=0") + get("/time/0", close: true))
        #expect(hot.components(separatedBy: "HTTP/1.1 200 OK").count - 1 == 4, "\(hot)")
        #expect(server.server.hummingbirdConnections == 0, "hot requests alone build nothing of Hummingbird's")
        let mixed = try await rawHTTP(port: server.port, get("/time/0") + get("/v2/history/sub-key/demo/channel/ch", close: true))
        #expect(mixed.components(separatedBy: "HTTP/1.1 200 OK").count - 1 == 2, "\(mixed)")
        #expect(mixed.contains("\"hi\""), "the history request was answered by Hummingbird's side: \(mixed)")
        #expect(server.server.hummingbirdConnections == 1)
        if webSocketEnabled {
            let client = WebSocketTestClient(baseURL: server.baseURL)
            client.send(Self.hello())
            #expect(await client.frame()?.type == "welcome")
            await client.close()
            #expect(server.server.hummingbirdConnections == 2, "an upgrade builds the upgrade handler")
        } else {
            let refused = try await rawHTTP(port: server.port, Self.upgradeRequest)
            #expect(refused.hasPrefix("HTTP/1.1 4"), "no upgrade: the request is answered as any other: \(refused)")
        }
        await server.stop()
    }

    static let upgradeRequest = """
        GET /v2/ws HTTP/1.1\r
        Host: 127.0.0.1\r
        Upgrade: websocket\r
        Connection: Upgrade\r
        Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r
        Sec-WebSocket-Version: 13\r
        Sec-WebSocket-Protocol: tether.v1.json\r
        \r

        """

    @Test func overloadRefusesTheUpgradeWith503() async throws {
        let server = try await Self.start(webSocket: .init(maxConnections: 1))
        let first = WebSocketTestClient(baseURL: server.baseURL)
        first.send(Self.hello())
        #expect(await first.frame()?.type == "welcome")
        let response = try await rawHTTP(port: server.port, Self.upgradeRequest)
        #expect(response.hasPrefix("HTTP/1.1 503"))
        #expect(response.contains("Retry-After: 5"))
        // REST is not limited by it.
        #expect(try await TestServer(inProcess: server).get("/time/0").status == 200)
        await first.close()
        await server.stop()
    }
}
