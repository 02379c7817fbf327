import Foundation
import Synchronization
import Testing
@testable import Tether
import TetherClientCore
import TetherTesting
import TetherTestingServer

/// The client-level lifecycle bugs found in review (issue #18, point 7), each pinned by a test
/// that failed before its fix. The machine-level ones are in TetherClientCoreTests' LifecycleBugTests.
@Suite("Client: lifecycle bugs found in review", .timeLimit(.minutes(1)))
struct LifecycleClientTests {
    @Test func thePresenceChannelSetShrinksWithTheSubscriptionsThatAskedForIt() async throws {
        let (client, _, _) = try makeStepClient()
        client.subscribe(to: ["a"], withPresence: true)
        #expect(client.subscribedChannels == ["a", "a-pnpres"])
        client.unsubscribe(from: ["a"])
        #expect(client.subscribedChannels == [])
        // Subscribing again without presence does not bring the old presence channel back.
        client.subscribe(to: ["a"])
        #expect(client.subscribedChannels == ["a"])

        // Two subscription objects on one name: presence lasts while the one that asked for it does.
        let withPresence = client.subscription(channel: "b", withPresence: true)
        let plain = client.subscription(channel: "b")
        withPresence.subscribe()
        plain.subscribe()
        #expect(client.subscribedChannels == ["a", "b", "b-pnpres"])
        withPresence.unsubscribe()
        #expect(client.subscribedChannels == ["a", "b"])
        plain.unsubscribe()
        #expect(client.subscribedChannels == ["a"])
        await client.shutdown()
    }

    @Test func anEndpointTakenOutOfExcludedEndpointsIsRetriedAutomatically() async throws {
        let (client, transport, clock) = try makeStepClient {
            $0.retry = RetryConfiguration(policy: .linear(delay: .seconds(2), maximumRetries: 2), jitter: .zero ... .zero,
                                          excludedEndpoints: [.accessManager])
        }
        async let answer = client.hereNow(channels: ["a"])
        try #require(await transport.next(path: "/v2/presence/sub-key/demo/channel/a")).fail(.connectionRefused)
        await clock.advanceToSleeper(after: .seconds(2))
        // A proxy's 502 is transient too.
        try #require(await transport.next(path: "/v2/presence/sub-key/demo/channel/a")).respond(status: 502, json: "{}")
        await clock.advanceToSleeper(after: .seconds(2))
        try #require(await transport.next(path: "/v2/presence/sub-key/demo/channel/a"))
            .respond(json: #"{"status":200,"message":"OK","occupancy":1,"uuids":["x"],"service":"Presence"}"#)
        #expect(try await answer.totalOccupancy == 1)

        // A refusal is not retried.
        async let refused = failure { try await client.hereNow(channels: ["b"]) }
        try #require(await transport.next(path: "/v2/presence/sub-key/demo/channel/b"))
            .respond(status: 400, json: #"{"status":400,"message":"Invalid","error":true,"service":"Presence"}"#)
        #expect(await refused?.category == .badRequest)

        // The policy's two retries run out: the last failure is thrown.
        async let exhausted = failure { try await client.hereNow(channels: ["c"]) }
        try #require(await transport.next(path: "/v2/presence/sub-key/demo/channel/c")).fail(.connectionRefused)
        await clock.advanceToSleeper(after: .seconds(2))
        try #require(await transport.next(path: "/v2/presence/sub-key/demo/channel/c")).fail(.connectionRefused)
        await clock.advanceToSleeper(after: .seconds(2))
        try #require(await transport.next(path: "/v2/presence/sub-key/demo/channel/c")).fail(.connectionRefused)
        #expect(await exhausted?.category == .networkIssues)
        await client.shutdown()
    }

    @Test func excludedEndpointsAreNotRetried() async throws {
        // The default: everything but subscribe is excluded, so a REST failure returns at once.
        let (client, transport, _) = try makeStepClient()
        async let answer = failure { try await client.hereNow(channels: ["a"]) }
        try #require(await transport.next(path: "/v2/presence/sub-key/demo/channel/a")).fail(.connectionRefused)
        #expect(await answer?.category == .networkIssues)
        await client.shutdown()
    }

    @Test func theNetworkMonitorIsOnByDefaultWithASwitchToTurnItOff() throws {
        let loopback = try TetherClient(configuration: TetherConfiguration(subscribeKey: "demo", userId: "u", origin: "127.0.0.1:8090"))
        #if os(Linux)
        let monitor = try #require(loopback.networkMonitor as? RTNetlinkNetworkMonitor)
        #expect(monitor.includeLoopback, "a loopback origin counts the loopback interface as a network")
        let remote = try TetherClient(configuration: TetherConfiguration(subscribeKey: "demo", userId: "u", origin: "tether.example.com"))
        #expect((remote.networkMonitor as? RTNetlinkNetworkMonitor)?.includeLoopback == false)
        #endif
        var off = try TetherConfiguration(subscribeKey: "demo", userId: "u", origin: "127.0.0.1:8090")
        off.watchesNetwork = false
        #expect(try TetherClient(configuration: off).networkMonitor == nil)
        // An explicit monitor (or none) is used as given.
        #expect(TetherClient(configuration: off, transport: InMemoryTransport(), clock: ContinuousClock(), networkMonitor: nil).networkMonitor == nil)
    }

    @Test func hostileWebSocketOptionsAreBoundedAndTheSessionStillWorks() async throws {
        let (client, socket, clock) = try makeSocketClient {
            $0.webSocket = WebSocketOptions(inactivityPing: .seconds(-5), pongTimeout: .seconds(-1),
                                            fallbackRetryInterval: .seconds(Int64.max / 4))
        }
        #expect(client.configuration.webSocket == WebSocketOptions(inactivityPing: .zero, pongTimeout: .milliseconds(100),
                                                                    fallbackRetryInterval: .seconds(86_400)))
        var messages = client.subscribe(to: ["a"])[0].messages.makeAsyncIterator()
        let peer = try await openSession(socket, token: "t", cursor: 100)
        peer.send(server: messagesFrame(cursor: 101, envelopes: [envelope("a", 101, #""fine""#)]))
        #expect(await messages.next()?.payload == "fine")
        // With the SDK's pings off, the only timers are the session's quiet answer (280 s) and the
        // engine's watchdog (subscribe timeout + 10 s): nothing spins on a zero interval.
        #expect(clock.sleepers.allSatisfy { [.seconds(280), .seconds(320)].contains($0.offset) }, "\(clock.sleepers)")
        await client.shutdown()
    }
}

/// Issue 18, point 7: "a client dropped without `shutdown()` is kept alive by its own task". Its
/// background tasks hold it weakly now: released, it is freed and its deinit closes what it opened.
@Suite("A released client is freed", .timeLimit(.minutes(1)))
struct ReleasedClientTests {
    final class WeakBox: Sendable {
        weak let client: TetherClient?
        init(_ client: TetherClient) { self.client = client }
    }

    @Test("a subscribed client the app drops without shutdown() is freed; a WebSocket session ends with bye",
          arguments: [TransportPreference.webSocket, .longPoll])
    func releasedWithoutShutdown(wire: TransportPreference) async throws {
        let server = try await InProcessServer.start()
        let channel = unique("leak")
        let user = unique("u")
        let publisher = try makeClient(origin: server.origin)
        let received = Mutex(0)
        let box: WeakBox
        do {
            let client = try makeClient(origin: server.origin, userId: user) {
                $0.transport = wire
                $0.lifecycle.observesApplicationState = false
            }
            box = WeakBox(client)
            client.subscribe(to: [channel])[0].onEvent { _ in received.withLock { $0 += 1 } }
            #expect(await eventually { client.connectionState == .connected })
            // The outbox's loop runs too.
            _ = try await client.publish(channel: channel, message: "from the client")
            #expect(await eventually { received.withLock { $0 } == 1 })
            #expect(await eventually { await occupants(publisher, channel).contains(user) })
        }
        // A long-poll in flight holds the client until it returns; a message ends it.
        _ = try await publisher.publish(channel: channel, message: "wake")
        #expect(await eventually { box.client == nil }, "the client was freed")
        if wire == .webSocket {
            // Its deinit ended the session with `bye`: the server sent the presence leave.
            #expect(await eventually { await occupants(publisher, channel).contains(user) == false })
        }
        await publisher.shutdown()
        await server.stop()
    }
}
