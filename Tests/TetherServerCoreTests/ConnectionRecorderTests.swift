import Testing
import TetherProtocol
import TetherServerCore

/// The console's flight recorder: each client's story told from the hooks' calls, with the
/// clock passed in (milliseconds), and its bounds.
@Suite struct ConnectionRecorderTests {
    typealias Recorder = ConnectionRecorder

    /// Event types of a uuid's timeline, oldest first.
    static func types(_ recorder: Recorder, _ uuid: String) -> [String] {
        (recorder.client(uuid)?.timeline ?? []).map { entry in
            switch entry.event {
            case .connected(let transport, _): "connected(\(transport.rawValue))"
            case .reconnectAttempt: "reconnect"
            case .dropped(let transport, _): "dropped(\(transport.rawValue))"
            case .sessionOpened: "opened"
            case .resumed(_, let away): "resumed(\(away))"
            case .expired(_, let reason): "expired(\(reason))"
            case .accessDenied(let channels): "denied(\(channels.joined(separator: ",")))"
            case .rateLimited(let route): "limited(\(route))"
            case .catchUp(let messages, let away, let gaps): "catchUp(\(messages),\(away),\(gaps))"
            case .kicked: "kicked"
            }
        }
    }

    @Test func longPollConnectDropAndCatchUpAreInferred() {
        var r = Recorder(configuration: .init(longPollGraceMilliseconds: 5_000))
        let tt = Timetoken(17_000_000_000_000_000)
        r.longPollBegan(uuid: "ann", subscribeKey: "demo", address: "10.0.0.1", channels: ["chat"], groups: [], cursor: .zero, now: 0)
        r.longPollEnded(uuid: "ann", delivered: 0, gaps: 0, cursor: nil, now: 0)
        r.longPollBegan(uuid: "ann", subscribeKey: "demo", address: "10.0.0.1", channels: ["chat"], groups: [], cursor: tt, now: 10)
        #expect(Self.types(r, "ann") == ["connected(long-poll)"])
        #expect(r.connectedCounts.longPoll == 1)
        // A long-poll in flight is never a drop, however long it waits.
        r.tick(now: 60_000)
        #expect(r.client("ann")?.isConnected == true)
        r.longPollEnded(uuid: "ann", delivered: 2, gaps: 0, cursor: tt.successor, now: 61_000)
        r.tick(now: 65_000)  // within the grace
        #expect(r.client("ann")?.isConnected == true)
        r.tick(now: 66_001)  // no new cycle for more than the grace: dropped
        #expect(Self.types(r, "ann") == ["connected(long-poll)", "dropped(long-poll)"])
        #expect(r.client("ann")?.isConnected == false)
        r.tick(now: 70_000)  // recorded once
        #expect(Self.types(r, "ann").count == 2)
        // Back with its old cursor: connected, and the answer is its catch-up (away since the last answer).
        r.longPollBegan(uuid: "ann", subscribeKey: "demo", address: "10.0.0.2", channels: ["chat"], groups: [], cursor: tt, now: 91_000)
        r.longPollEnded(uuid: "ann", delivered: 7, gaps: 1, cursor: tt.successor, now: 91_050)
        #expect(Self.types(r, "ann") == ["connected(long-poll)", "dropped(long-poll)", "connected(long-poll)", "catchUp(7,30050,1)"])
        #expect(r.client("ann")?.address == "10.0.0.2")
        #expect(r.client("ann")?.delivered == 9)
    }

    @Test func aHandshakeFromAKnownClientIsAReconnectAttempt() {
        var r = Recorder()
        r.longPollBegan(uuid: "bo", subscribeKey: "demo", address: "a", channels: ["c"], groups: [], cursor: .zero, now: 0)
        r.longPollEnded(uuid: "bo", delivered: 0, gaps: 0, cursor: nil, now: 0)
        r.longPollBegan(uuid: "bo", subscribeKey: "demo", address: "a", channels: ["c"], groups: [], cursor: .zero, now: 100)
        #expect(Self.types(r, "bo") == ["connected(long-poll)", "reconnect"])
    }

    @Test func webSocketSessionDropResumeCatchUpAndExpiry() {
        var r = Recorder()
        r.sessionOpened(uuid: "cy", subscribeKey: "demo", session: "s-1", address: "10.0.0.3", now: 1_000)
        r.sessionSubscribed(uuid: "cy", channels: ["chat"], groups: [], cursor: Timetoken(5), now: 1_001)
        r.socketClosed(uuid: "cy", reason: "socket closed; session kept", now: 2_000)
        #expect(r.client("cy")?.isConnected == false)
        r.sessionResumed(uuid: "cy", session: "s-1", address: "10.0.0.3", now: 4_500)
        r.sessionDelivered(uuid: "cy", delivered: 3, gaps: 0, cursor: Timetoken(9), now: 4_510)
        r.sessionDelivered(uuid: "cy", delivered: 1, gaps: 0, cursor: Timetoken(10), now: 4_600)  // live, not a catch-up
        r.socketClosed(uuid: "cy", reason: "socket closed; session kept", now: 5_000)
        r.sessionExpired(uuid: "cy", session: "s-1", reason: "keep-alive lapsed", now: 305_000)
        #expect(Self.types(r, "cy") == [
            "connected(websocket)", "opened", "dropped(websocket)", "connected(websocket)", "resumed(2500)", "catchUp(3,2510,0)",
            "dropped(websocket)", "expired(keep-alive lapsed)",
        ])
        #expect(r.client("cy")?.channels == ["chat"])
        #expect(r.client("cy")?.cursor == Timetoken(10))
        #expect(r.client("cy")?.session == nil)
        #expect(r.client("cy")?.delivered == 4)
    }

    @Test func refusalsAndKicksAreRecorded() {
        var r = Recorder()
        r.accessDenied(uuid: "dee", channels: ["secret"], now: 1)
        r.rateLimited(uuid: "dee", route: "publish", now: 2)
        r.kicked(uuid: "dee", now: 3)
        r.kicked(uuid: "nobody", now: 3)  // an unknown uuid is not created by a kick
        #expect(Self.types(r, "dee") == ["denied(secret)", "limited(publish)", "kicked"])
        #expect(r.client("nobody") == nil)
    }

    @Test func eventsPerClientAreBoundedKeepingTheNewest() {
        var r = Recorder(configuration: .init(eventsPerClient: 3))
        for i in 0..<10 { r.rateLimited(uuid: "e", route: "r\(i)", now: Int64(i)) }
        #expect(Self.types(r, "e") == ["limited(r7)", "limited(r8)", "limited(r9)"])
    }

    @Test func clientsAreBoundedForgettingTheLeastRecentlyActive() {
        var r = Recorder(configuration: .init(maxClients: 3))
        for uuid in ["a", "b", "c"] { r.rateLimited(uuid: uuid, route: "x", now: 0) }
        r.rateLimited(uuid: "a", route: "x", now: 1)  // a is active again; b is now the oldest
        r.rateLimited(uuid: "d", route: "x", now: 2)
        #expect(r.count == 3)
        #expect(r.client("b") == nil)
        #expect(r.clients().map(\.uuid) == ["d", "a", "c"])
    }

    /// More active uuids than the bound: the least recently active eighth is forgotten at once,
    /// so the scan for them is not paid on every new uuid.
    @Test func atTheBoundAnEighthIsForgottenAtOnce() {
        var r = Recorder(configuration: .init(maxClients: 16))
        for index in 0..<16 { r.rateLimited(uuid: "u\(index)", route: "x", now: Int64(index)) }
        r.rateLimited(uuid: "u0", route: "x", now: 16)  // u0 is active again; u1 and u2 are the oldest
        r.rateLimited(uuid: "new", route: "x", now: 17)
        #expect(r.count == 15)
        #expect(r.client("u1") == nil && r.client("u2") == nil)
        #expect(r.client("u0") != nil && r.client("u3") != nil && r.client("new") != nil)
        // Cycling through 1,000 uuids never holds more than the bound.
        for index in 0..<1_000 {
            r.rateLimited(uuid: "cycle-\(index)", route: "x", now: 100 + Int64(index))
            #expect(r.count <= 16)
        }
        #expect(r.clients().first?.uuid == "cycle-999")
    }
}

/// The console's sign-in sessions and the secret comparison.
@Suite struct AdminSessionsTests {
    @Test func sessionsExpireAndAreBounded() {
        var s = AdminSessions(maximumCount: 2, lifetimeMilliseconds: 1_000)
        s.open(id: "a", csrfToken: "ta", now: 0)
        s.open(id: "b", csrfToken: "tb", now: 10)
        #expect(s.session("a", now: 500)?.csrfToken == "ta")
        s.open(id: "c", csrfToken: "tc", now: 20)  // over the bound: the one closest to expiry goes
        #expect(s.count == 2)
        #expect(s.session("a", now: 30) == nil)
        #expect(s.session("b", now: 1_009)?.csrfToken == "tb")
        #expect(s.session("b", now: 1_010) == nil)  // expired
        s.close("c")
        #expect(s.session("c", now: 30) == nil)
    }

    @Test(arguments: [("secret", "secret", true), ("secret", "secreT", false), ("secret", "secret1", false), ("", "", true),
                      ("a", "", false), (String(repeating: "x", count: 256), "", false)])
    func constantTimeEquals(_ a: String, _ b: String, _ equal: Bool) {
        #expect(AdminSessions.constantTimeEquals(a, b) == equal)
    }
}

/// The ping round trip the console shows: the first frame after the server's ping.
@Suite struct SessionPingRoundTripTests {
    @Test func theFirstFrameAfterAPingGivesTheRoundTrip() throws {
        var table = SessionTable<String>(configuration: .init(pingInterval: .seconds(25)))
        guard case .accepted(let connection) = table.connect(now: .zero) else { Issue.record("refused"); return }
        _ = table.open(connection, token: "t", payload: "p", bytes: 1, now: .zero)
        #expect(table.received(connection, now: .seconds(1)) == nil)  // no ping outstanding
        let actions = table.tick(now: .seconds(26))
        #expect(actions.contains { if case .ping = $0 { true } else { false } })
        #expect(table.received(connection, now: .seconds(26) + .milliseconds(40)) == .milliseconds(40))
        #expect(table.received(connection, now: .seconds(27)) == nil)
    }

    @Test func theRecorderKeepsTheLastRoundTripOfAKnownClient() {
        var r = ConnectionRecorder()
        r.pingAnswered(uuid: "ghost", milliseconds: 5, now: 0)
        #expect(r.client("ghost") == nil)
        r.sessionOpened(uuid: "u", subscribeKey: "demo", session: "s-1", address: "a", now: 0)
        r.pingAnswered(uuid: "u", milliseconds: 42, now: 1)
        #expect(r.client("u")?.pingMilliseconds == 42)
    }
}
