import Logging
import Testing
@testable import Tether
import TetherProtocol
import TetherTesting

/// Failover to ``TetherConfiguration/fallbackOrigins``, driven step by step: the real client on
/// an ``InMemoryTransport`` (every request says which origin it went to) and a ``ManualClock``.
@Suite("Failover step by step (in-memory transport, manual clock)", .timeLimit(.minutes(1)))
struct FailoverStepTests {
    static let primary = "primary.invalid"
    static let fallback = "fallback.invalid"

    func makeClient(configure: (inout TetherConfiguration) -> Void = { _ in }) throws -> (TetherClient, InMemoryTransport, ManualClock) {
        try makeStepClient { configuration in
            try? configuration.setOrigin(Self.primary)
            try? configuration.setFallbackOrigins([Self.fallback])
            configure(&configuration)
        }
    }

    @Test func aRefusedConnectionMovesTheSubscribeLoopToTheFallbackWithItsCursor() async throws {
        let (client, transport, clock) = try makeClient()
        var statuses = client.statuses().makeAsyncIterator()
        var events = client.connectionEvents().makeAsyncIterator()
        let subscription = client.subscribe(to: ["a"])[0]
        var messages = subscription.messages.makeAsyncIterator()
        let handshake = try #require(await transport.next(path: "/v2/subscribe"))
        #expect(handshake.request.url.hasPrefix("http://\(Self.primary)/"))
        handshake.respond(json: subscribeBody(timetoken: 100))
        #expect(await statuses.next()?.category == .connected)
        let poll = try #require(await transport.next(path: "/v2/subscribe"))
        poll.respond(json: subscribeBody(timetoken: 102, envelopes: [envelope("a", 101, #""one""#), envelope("a", 102, #""two""#)]))
        #expect(await messages.next()?.payload == "one")
        #expect(await messages.next()?.payload == "two")
        #expect(client.currentOrigin == Self.primary)

        // The primary goes away: nothing listens any more.
        let held = try #require(await transport.next(path: "/v2/subscribe"))
        #expect(held.request.url.hasPrefix("http://\(Self.primary)/") && held.query["tt"] == "102")
        held.fail(.connectionRefused)
        let lost = try #require(await statuses.next())
        #expect(lost.category == .unexpectedDisconnect && lost.willAutomaticallyRetry && lost.lastTimetoken == Timetoken(102))
        #expect(await nextOriginChange(&events) == .originChanged(from: Self.primary, to: Self.fallback))
        #expect(client.currentOrigin == Self.fallback)

        // The next attempt goes to the fallback within the quick-attempt interval, from the cursor.
        let delay = await clock.advanceToSleeper(within: .milliseconds(500) ... .seconds(1))
        #expect(delay <= .seconds(1))
        let restore = try #require(await transport.next(path: "/v2/subscribe"))
        #expect(restore.request.url.hasPrefix("http://\(Self.fallback)/"))
        restore.respond(json: subscribeBody(timetoken: 150))
        let back = try #require(await statuses.next())
        #expect(back.category == .reconnected && back.currentTimetoken == Timetoken(102))
        let resumed = try #require(await transport.next(path: "/v2/subscribe"))
        #expect(resumed.request.url.hasPrefix("http://\(Self.fallback)/"))
        #expect(resumed.query["tt"] == "102")
        resumed.respond(json: subscribeBody(timetoken: 103, envelopes: [envelope("a", 103, #""three""#)]))
        #expect(await messages.next()?.payload == "three")

        // REST calls follow: a history request goes to the fallback too.
        async let history = client.time()
        let time = try #require(await transport.next(path: "/time/0"))
        #expect(time.request.url.hasPrefix("http://\(Self.fallback)/"))
        time.respond(json: "[17953281264739664]")
        _ = try await history
        await client.shutdown()
    }

    @Test func aFallbackIsKeptForTheRetryTimeoutThenThePrimaryIsTriedAgain() async throws {
        let (client, transport, clock) = try makeClient { $0.fallbackRetryTimeout = .seconds(600) }
        var events = client.connectionEvents().makeAsyncIterator()
        async let first = client.time()
        try #require(await transport.next(path: "/time/0")).fail(.timedOut)
        // The call itself is sent again at once to the fallback (Ably's RSC15), and answered.
        let again = try #require(await transport.next(path: "/time/0"))
        #expect(again.request.url.hasPrefix("http://\(Self.fallback)/"))
        again.respond(json: "[17953281264739664]")
        _ = try await first
        #expect(await nextOriginChange(&events) == .originChanged(from: Self.primary, to: Self.fallback))

        clock.advance(by: .seconds(599))
        async let second = client.time()
        let kept = try #require(await transport.next(path: "/time/0"))
        #expect(kept.request.url.hasPrefix("http://\(Self.fallback)/"))
        kept.respond(json: "[17953281264739664]")
        _ = try await second

        clock.advance(by: .seconds(2))
        async let third = client.time()
        let primary = try #require(await transport.next(path: "/time/0"))
        #expect(primary.request.url.hasPrefix("http://\(Self.primary)/"))
        primary.respond(json: "[17953281264739664]")
        _ = try await third
        #expect(await nextOriginChange(&events) == .originChanged(from: Self.fallback, to: Self.primary))
        #expect(client.currentOrigin == Self.primary)
        await client.shutdown()
    }

    @Test func anOutboxSendGoesToTheFallbackAtOnceWithTheSameRequestId() async throws {
        let (client, transport, _) = try makeClient()
        let publish = Task { try await client.publish(channel: "a", message: .string("hi")) }
        let first = try #require(await transport.next(path: "/publish"))
        #expect(first.request.url.hasPrefix("http://\(Self.primary)/"))
        first.fail(.connectionRefused)
        let second = try #require(await transport.next(path: "/publish"))
        #expect(second.request.url.hasPrefix("http://\(Self.fallback)/"))
        #expect(second.query["requestid"] != nil && second.query["requestid"] == first.query["requestid"])
        second.respond(json: #"[1,"Sent","17953281264739664"]"#)
        #expect(try await publish.value.timetoken == Timetoken(17953281264739664))
        await client.shutdown()
    }

    @Test func theFallbacksDropRepeatsAndThePrimary() throws {
        var configuration = try TetherConfiguration(subscribeKey: "demo", userId: "u", origin: Self.primary)
        try configuration.setFallbackOrigins([Self.fallback, Self.primary, Self.fallback, "third.invalid"])
        #expect(configuration.fallbackOrigins == [Self.fallback, "third.invalid"])
    }

    /// A message action's add is not idempotent: after a timeout (which may have stored it) it is
    /// not sent again, to the fallback or after a back-off; after a refused connection (it never
    /// arrived) it is, at once, on the fallback.
    @Test func anAddThatMayHaveArrivedIsNotSentAgain() async throws {
        let (client, transport, clock) = try makeClient()
        let tt = Timetoken(17_000_000_000_000_000)
        let timedOut = Task { try await client.addMessageAction(channel: "a", messageTimetoken: tt, type: "reaction", value: "smile") }
        try #require(await transport.next(path: "/v1/message-actions")).fail(.timedOut)
        let status = try #require(await failure { try await timedOut.value })
        #expect(status.category == .timeout)
        clock.advance(by: .seconds(60))
        #expect(transport.requests.count == 1, "neither failed over nor retried")
        await client.shutdown()
    }

    @Test func anAddThatNeverArrivedGoesToTheFallbackAtOnce() async throws {
        let (client, transport, _) = try makeClient()
        let tt = Timetoken(17_000_000_000_000_000)
        let refused = Task { try await client.addMessageAction(channel: "a", messageTimetoken: tt, type: "reaction", value: "smile") }
        let first = try #require(await transport.next(path: "/v1/message-actions"))
        first.fail(.connectionRefused)
        let second = try #require(await transport.next(path: "/v1/message-actions"))
        #expect(second.request.url.hasPrefix("http://\(Self.fallback)/"))
        second.respond(json: #"{"status":200,"data":{"type":"reaction","value":"smile","uuid":"stepper","actionTimetoken":"17000000000000010","messageTimetoken":"17000000000000000"}}"#)
        _ = try await refused.value
        await client.shutdown()
    }

    @Test(arguments: [400, 403, 404, 414])
    func anApplicationErrorDoesNotFailOver(code: Int) async throws {
        let (client, transport, _) = try makeClient()
        let call = Task { try await client.time() }
        let refused = try #require(await transport.next(path: "/time/0"))
        refused.respond(status: code, json: #"{"status":\#(code),"error":true,"message":"no","service":"Time"}"#)
        await #expect(throws: TetherError.self) { _ = try await call.value }
        #expect(client.currentOrigin == Self.primary)
        #expect(transport.requests.count == 1)
        await client.shutdown()
    }

    @Test func aLongPollAnsweredByADrainingNodeContinuesOnTheFallbackWithNoOutage() async throws {
        let (client, transport, _) = try makeClient()
        var statuses = client.statuses().makeAsyncIterator()
        var changes = client.connectionChanges().makeAsyncIterator()
        let (held, subscription) = try await connect(client, transport, &statuses, channels: ["a"])
        var messages = subscription.messages.makeAsyncIterator()
        while let change = await changes.next(), change.current != .connected {}
        // Graceful shutdown answers the long-poll at once, with the drain hint.
        held.respond(json: subscribeBody(timetoken: 120), headers: ["tether-draining": "1", "connection": "close"])
        let next = try #require(await transport.next(path: "/v2/subscribe"))
        #expect(next.request.url.hasPrefix("http://\(Self.fallback)/"))
        #expect(next.query["tt"] == "120")
        next.respond(json: subscribeBody(timetoken: 121, envelopes: [envelope("a", 121, #""after""#)]))
        #expect(await messages.next()?.payload == "after")
        #expect(client.connectionState == .connected)
        await client.shutdown()
        // No outage was reported: the move happened between two polls.
        var seen: [StatusCategory] = []
        while let status = await statuses.next() { seen.append(status.category) }
        #expect(!seen.contains(.unexpectedDisconnect))
    }

    @Test func failuresWhileTheDeviceHadNoNetworkAreForgottenWhenItComesBack() async throws {
        let monitor = ScriptedNetworkMonitor()
        let (client, transport, _) = try makeStepClient(monitor: monitor) { configuration in
            try? configuration.setOrigin(Self.primary)
            try? configuration.setFallbackOrigins([Self.fallback])
        }
        var statuses = client.statuses().makeAsyncIterator()
        var events = client.connectionEvents().makeAsyncIterator()
        let (poll, _) = try await connect(client, transport, &statuses, channels: ["a"])
        // The tunnel: the request fails before the monitor notices, and moves the client…
        poll.fail(.unreachable("no route to host"))
        #expect(await nextOriginChange(&events) == .originChanged(from: Self.primary, to: Self.fallback))
        monitor.send(.down)
        monitor.send(.up)
        // …and the network's return sends it back to the primary, from its cursor.
        #expect(await nextOriginChange(&events) == .originChanged(from: Self.fallback, to: Self.primary))
        let again = try #require(await transport.next(path: "/v2/subscribe"))
        #expect(again.request.url.hasPrefix("http://\(Self.primary)/"))
        await client.shutdown()
    }

    @Test func whenEveryOriginFailsTheCycleEndsOnThePrimaryAndTheBackOffApplies() async throws {
        let (client, transport, clock) = try makeClient()
        var statuses = client.statuses().makeAsyncIterator()
        let (held, _) = try await connect(client, transport, &statuses, channels: ["a"])
        held.fail(.connectionRefused)
        #expect(await statuses.next()?.category == .unexpectedDisconnect)
        await clock.advanceToSleeper(within: .milliseconds(500) ... .seconds(1))
        let onFallback = try #require(await transport.next(path: "/v2/subscribe"))
        #expect(onFallback.request.url.hasPrefix("http://\(Self.fallback)/"))
        onFallback.fail(.timedOut)
        // Back on the primary, which was just tried: the policy's first delay (2 s), no quick attempt.
        await clock.advanceToSleeper(after: .seconds(2))
        let onPrimary = try #require(await transport.next(path: "/v2/subscribe"))
        #expect(onPrimary.request.url.hasPrefix("http://\(Self.primary)/"))
        await client.shutdown()
    }
}

/// The WebSocket wire's failover, step by step: ``InMemoryWebSocket`` plays both nodes.
@Suite("Failover of a WebSocket session step by step (in-memory socket, manual clock)", .timeLimit(.minutes(1)))
struct WebSocketFailoverStepTests {
    @Test func aDrainWithAFallbackReconnectsThereAtOnceAndResubscribesFromTheCursor() async throws {
        let (client, socket, clock) = try makeSocketClient { configuration in
            try? configuration.setFallbackOrigins(["fallback.invalid"])
            configuration.retry.fastReconnect = RetryConfiguration.FastReconnect()
        }
        var events = client.connectionEvents().makeAsyncIterator()
        let subscription = client.subscribe(to: ["a"])[0]
        var messages = subscription.messages.makeAsyncIterator()
        let peer = try await openSession(socket, token: "tok-a", cursor: 100)
        peer.send(server: messagesFrame(cursor: 101, envelopes: [envelope("a", 101, #""one""#)]))
        #expect(await messages.next()?.payload == "one")

        // The node drains and asks its clients to come back in 8 s.
        peer.send(server: #"{"type":"notice","notice":"drain","reconnectAfterMs":8000,"jitterMs":0}"#)
        peer.close(server: 1012, reason: "drain")
        #expect(await nextOriginChange(&events) == .originChanged(from: "tether.invalid", to: "fallback.invalid"))
        // Not after 8 s: within the quick-attempt interval, at the fallback.
        let waited = await clock.advanceToSleeper(within: .milliseconds(500) ... .seconds(1))
        #expect(waited <= .seconds(1))
        let attempt = try #require(await socket.nextAttempt())
        #expect(attempt.url == "ws://fallback.invalid/v2/ws")
        let second = attempt.accept()
        // The session is resumed if the new node holds it; this one does not.
        let hello = try frame(await second.receive())
        #expect(hello["resume"]?["token"] == "tok-a" && hello["resume"]?["cursor"] == "101")
        second.send(server: #"{"type":"notice","notice":"sessionExpired","message":"unknown session"}"#)
        second.send(server: welcome(token: "tok-b", resumed: false, cursor: 200))
        let subscribe = try frame(await second.receive())
        #expect(subscribe["type"] == "subscribe" && subscribe["cursor"] == "101")
        second.send(server: #"{"type":"subscribed","channels":["a"],"groups":[],"cursor":"101"}"#)
        second.send(server: messagesFrame(cursor: 102, envelopes: [envelope("a", 102, #""two""#)]))
        #expect(await messages.next()?.payload == "two")
        #expect(client.currentOrigin == "fallback.invalid")
        await client.shutdown()
    }

    @Test func aRefusedUpgradeMovesTheNextOpeningToTheFallback() async throws {
        let (client, socket, clock) = try makeSocketClient { configuration in
            try? configuration.setFallbackOrigins(["fallback.invalid"])
        }
        client.subscribe(to: ["a"])
        // The primary is draining: it refuses upgrades with 503 and a Retry-After for itself.
        try #require(await socket.nextAttempt()).refuse(status: 503, headers: ["retry-after": "30"])
        // With quick attempts off (this client's policy), the policy's delay (2 s), not the 30 s.
        let waited = await clock.advanceToSleeper(within: .seconds(2) ... .seconds(2))
        #expect(waited == .seconds(2))
        #expect(try #require(await socket.nextAttempt()).url == "ws://fallback.invalid/v2/ws")
        await client.shutdown()
    }
}

/// The next ``ConnectionEvent/originChanged(from:to:)``, skipping the other events.
func nextOriginChange(_ events: inout AsyncStream<ConnectionEvent>.Iterator) async -> ConnectionEvent? {
    while let event = await events.next() {
        if case .originChanged = event { return event }
    }
    return nil
}
