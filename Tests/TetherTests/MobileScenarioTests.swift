import Foundation
import Synchronization
import Testing
import Tether
import TetherClientCore
import TetherServer
import TetherTesting
import TetherTestingServer

/// PubNub's three mobile scenarios (seed 000) and the background policies, run against a real
/// server over loopback with the app's lifecycle calls (issue 18, points 2–4). Each waits for
/// what the client delivers, never for time to pass.
@Suite("Mobile lifecycle: policies and the three scenarios against a real server", .timeLimit(.minutes(1)))
struct MobileScenarioTests {
    enum Wire: String, CaseIterable, Sendable {
        case webSocket, longPoll
        var preference: TransportPreference { self == .webSocket ? .webSocket : .longPoll }
    }

    @Test("Scenario 1 with unsubscribe: the user leaves in the background; on foreground every missed message arrives once, in order",
          arguments: Wire.allCases)
    func catchUpEverythingWithUnsubscribe(wire: Wire) async throws {
        let server = try await InProcessServer.start()
        let channel = unique("s1")
        let user = unique("u")
        let app = try await MobileApp.start(origin: server.origin, channel: channel, userId: user, wire: wire,
                                            lifecycle: .catchUpEverything(unsubscribeInBackground: true))
        let publisher = try makeClient(origin: server.origin)
        try await publish(publisher, channel, 0..<3)
        #expect(await app.waitForMessages(3))

        app.client.enterBackground()
        #expect(await eventually { app.client.connectionState == .background })
        // Others see the user leave (PubNub's unsubscribe; SendBird's disconnect).
        #expect(await eventually { await occupants(publisher, channel).contains(user) == false })
        try await publish(publisher, channel, 3..<8)

        app.client.enterForeground()
        #expect(await app.waitForMessages(8))
        try await publish(publisher, channel, 8..<10)
        #expect(await app.waitForMessages(10))
        #expect(app.payloads == (0..<10).map { JSONValue.int($0) }, "every message once, in order")
        #expect(app.reconnectEvents == [.started, .succeeded])
        #expect(await eventually { await occupants(publisher, channel).contains(user) })

        await app.client.shutdown()
        await publisher.shutdown()
        await server.stop()
    }

    @Test("Scenario 1 without unsubscribe: the subscription is kept; the foreground probes and nothing is lost or doubled",
          arguments: Wire.allCases)
    func catchUpEverythingKeepingTheSubscription(wire: Wire) async throws {
        let server = try await InProcessServer.start()
        let channel = unique("s1k")
        let user = unique("u")
        let app = try await MobileApp.start(origin: server.origin, channel: channel, userId: user, wire: wire,
                                            lifecycle: .catchUpEverything(unsubscribeInBackground: false))
        let publisher = try makeClient(origin: server.origin)
        try await publish(publisher, channel, 0..<3)
        #expect(await app.waitForMessages(3))

        app.client.enterBackground()
        #expect(app.client.isInBackground)
        #expect(app.client.connectionState == .connected)
        try await publish(publisher, channel, 3..<8)
        app.client.enterForeground()
        try await publish(publisher, channel, 8..<10)
        #expect(await app.waitForMessages(10))
        #expect(app.payloads == (0..<10).map { JSONValue.int($0) }, "every message once, in order")
        #expect(app.client.connectionState == .connected)
        #expect(app.reconnectEvents.isEmpty, "a kept link that answers the probe is not a reconnection")

        await app.client.shutdown()
        await publisher.shutdown()
        await server.stop()
    }

    @Test("Suspend: the server keeps the WebSocket session and the user's presence; the foreground resumes it and replays the missed")
    func suspendKeepsTheSessionAndPresence() async throws {
        let server = try await InProcessServer.start()
        let channel = unique("sus")
        let user = unique("u")
        let app = try await MobileApp.start(origin: server.origin, channel: channel, userId: user, wire: .webSocket,
                                            lifecycle: LifecycleOptions(backgroundPolicy: .suspend(keepAlive: .seconds(600))))
        let publisher = try makeClient(origin: server.origin)
        try await publish(publisher, channel, 0..<3)
        #expect(await app.waitForMessages(3))
        #expect(await eventually { await occupants(publisher, channel).contains(user) })

        app.client.enterBackground()
        #expect(await eventually { app.client.connectionState == .background && !app.client.isSessionOpen })
        try await publish(publisher, channel, 3..<8)
        // Still present: the session is kept (no leave, no timeout while suspended).
        #expect(await occupants(publisher, channel).contains(user))

        app.client.enterForeground()
        #expect(await app.waitForMessages(8))
        #expect(app.payloads == (0..<8).map { JSONValue.int($0) })
        #expect(app.events.contains { if case .sessionResumed = $0 { true } else { false } }, "the kept session was resumed")
        #expect(!app.events.contains { if case .sessionExpired = $0 { true } else { false } })
        // The replay ends with a frame at the server's cursor: the outcome counts what it recovered.
        #expect(await eventually { app.continuity.contains { $0.channel == channel && $0.outcome == .recovered(count: 5) } },
                "\(app.continuity)")

        await app.client.shutdown()
        await publisher.shutdown()
        await server.stop()
    }

    @Test("Suspend with latest only: the kept session resumes at the server's cursor, nothing replayed, the skip reported")
    func suspendWithLatestOnly() async throws {
        let server = try await InProcessServer.start()
        let channel = unique("susl")
        let user = unique("u")
        let app = try await MobileApp.start(origin: server.origin, channel: channel, userId: user, wire: .webSocket,
                                            lifecycle: LifecycleOptions(backgroundPolicy: .suspend(keepAlive: .seconds(600)),
                                                                        foregroundCatchUp: .latestOnly))
        let publisher = try makeClient(origin: server.origin)
        try await publish(publisher, channel, 0..<2)
        #expect(await app.waitForMessages(2))
        app.client.enterBackground()
        #expect(await eventually { app.client.connectionState == .background && !app.client.isSessionOpen })
        try await publish(publisher, channel, 2..<6)
        #expect(await occupants(publisher, channel).contains(user), "presence kept while suspended")
        app.client.enterForeground()
        #expect(await eventually { app.continuity.contains { if case .skipped = $0.outcome { true } else { false } } })
        try await publish(publisher, channel, 6..<7)
        #expect(await app.waitForMessages(3))
        #expect(app.payloads == [.int(0), .int(1), .int(6)], "nothing of the time away replayed")
        await app.client.shutdown()
        await publisher.shutdown()
        await server.stop()
    }

    @Test("Suspend without presence: the user leaves at once, the session is kept, and on resume the user joins again")
    func suspendWithoutPresence() async throws {
        let server = try await InProcessServer.start()
        let channel = unique("susp")
        let user = unique("u")
        let app = try await MobileApp.start(origin: server.origin, channel: channel, userId: user, wire: .webSocket,
                                            lifecycle: LifecycleOptions(backgroundPolicy: .suspend(keepAlive: .seconds(600),
                                                                                                   keepPresence: false)))
        let publisher = try makeClient(origin: server.origin)
        try await publish(publisher, channel, 0..<2)
        #expect(await app.waitForMessages(2))
        #expect(await eventually { await occupants(publisher, channel).contains(user) })

        app.client.enterBackground()
        #expect(await eventually { await occupants(publisher, channel).contains(user) == false }, "left at suspend")
        try await publish(publisher, channel, 2..<5)
        app.client.enterForeground()
        #expect(await app.waitForMessages(5))
        #expect(app.payloads == (0..<5).map { JSONValue.int($0) })
        #expect(app.events.contains { if case .sessionResumed = $0 { true } else { false } }, "the session itself was kept")
        #expect(await eventually { await occupants(publisher, channel).contains(user) }, "joined again on resume")

        await app.client.shutdown()
        await publisher.shutdown()
        await server.stop()
    }

    @Test("Scenario 2 with push: while away, messages to the user's channels reach the device through the server's push provider")
    func scenario2PushesWhileAway() async throws {
        let (gateway, server) = try await Self.serverWithPushWebhook()
        let inbox = unique("inbox")
        let app = try await MobileApp.start(origin: server.origin, channels: [inbox], userId: unique("u"), wire: .webSocket,
                                            lifecycle: .unreadCountsWithPush)
        try await app.client.addPushChannels([inbox], device: "fcm-token-1", pushType: .fcm)
        let publisher = try makeClient(origin: server.origin)
        app.client.enterBackground()
        #expect(await eventually { app.client.connectionState == .background })
        _ = try await publisher.publish(channel: inbox, message: ["text": "hi", "pn_fcm": ["notification": ["title": "Bob", "body": "hi"]]])
        #expect(await eventually { gateway.requests.count == 1 }, "the registered device got the push")
        let first = try #require(gateway.requests.first, "a push request")
        let pushed = try #require(try? JSONValue(parsing: String(decoding: first.body, as: UTF8.self)))
        #expect(pushed["device"]?["token"] == "fcm-token-1" && pushed["channel"] == .string(inbox))
        app.client.enterForeground()
        #expect(await eventually { app.continuity.contains { outcome in
            if case .skipped(_, 1?) = outcome.outcome { true } else { false }
        } }, "the unread count")
        await app.client.shutdown()
        await publisher.shutdown()
        await server.stop()
        await gateway.stop()
    }

    @Test("Suspend with a background push device: plain messages are pushed while suspended, replayed on return, not pushed after")
    func suspendPushesWhatArrives() async throws {
        let (gateway, server) = try await Self.serverWithPushWebhook()
        let channel = unique("dm")
        let app = try await MobileApp.start(origin: server.origin, channel: channel, userId: unique("u"), wire: .webSocket,
                                            lifecycle: LifecycleOptions(backgroundPolicy: .suspend(keepAlive: .seconds(600))))
        app.client.setBackgroundPushDevice("fcm-token-2", pushType: .fcm)
        let publisher = try makeClient(origin: server.origin)
        try await publish(publisher, channel, 0..<1)
        #expect(await app.waitForMessages(1))
        #expect(gateway.requests.isEmpty, "nothing is pushed while connected")

        app.client.enterBackground()
        #expect(await eventually { app.client.connectionState == .background && !app.client.isSessionOpen })
        // The client closes its socket right after sending `suspend`: the device is held once the
        // server has read that frame, which is before it keeps the session.
        #expect(await eventually { server.server.webSocketCounts.kept == 1 }, "the server keeps the suspended session")
        _ = try await publisher.publish(channel: channel, message: ["text": "ping me"])
        #expect(await eventually { gateway.requests.count == 1 })
        let first = try #require(gateway.requests.first, "a push request")
        let pushed = try #require(try? JSONValue(parsing: String(decoding: first.body, as: UTF8.self)))
        #expect(pushed["device"]?["token"] == "fcm-token-2")
        #expect(pushed["payload"]?["notification"]?["body"] == "ping me")

        app.client.enterForeground()
        #expect(await app.waitForMessages(2))
        try await publish(publisher, channel, 2..<3)
        #expect(await app.waitForMessages(3))
        #expect(gateway.requests.count == 1, "back in the foreground: delivered on the socket, not pushed")
        await app.client.shutdown()
        await publisher.shutdown()
        await server.stop()
        await gateway.stop()
    }

    /// A server whose push provider is a signed webhook to a local HTTPS gateway.
    static func serverWithPushWebhook() async throws -> (PushGatewayServer, InProcessServer) {
        let gateway = try await PushGatewayServer.start { _ in .init(status: 204) }
        let ca = FileManager.default.temporaryDirectory.appendingPathComponent("tether-ca-\(UUID().uuidString).pem")
        try Data(TestCertificates.certificateAuthorityPEM).write(to: ca)
        // The push client reads the file when the server starts, so it is removed right after.
        defer { try? FileManager.default.removeItem(at: ca) }
        var file = ConfigurationFile(subscribeTimeoutSeconds: 30)
        file.push = ConfigurationFile.Push(webhook: .init(url: gateway.baseURL + "/hook", secret: "s", caCertificatePath: ca.path))
        return (gateway, try await InProcessServer.start(file: file))
    }

    @Test("Scenario 2: on return, unread counts per channel from message counts, and no replay", arguments: Wire.allCases)
    func unreadCountsOnReturn(wire: Wire) async throws {
        let server = try await InProcessServer.start()
        let a = unique("s2a")
        let b = unique("s2b")
        let app = try await MobileApp.start(origin: server.origin, channels: [a, b], userId: unique("u"), wire: wire,
                                            lifecycle: .unreadCountsWithPush)
        let publisher = try makeClient(origin: server.origin)
        try await publish(publisher, a, 0..<1)
        #expect(await app.waitForMessages(1))

        app.client.enterBackground()
        #expect(await eventually { app.client.connectionState == .background })
        try await publish(publisher, a, 1..<4)
        try await publish(publisher, b, 4..<5)
        app.client.enterForeground()
        #expect(await eventually { app.continuity.count >= 2 })
        let outcomes = Dictionary(app.continuity.map { ($0.channel, $0.outcome) }, uniquingKeysWith: { first, _ in first })
        guard case .skipped(_, let countA)? = outcomes[a], case .skipped(_, let countB)? = outcomes[b] else {
            Issue.record("expected skipped outcomes, got \(app.continuity)")
            return
        }
        #expect(countA == 3)
        #expect(countB == 1)
        try await publish(publisher, b, 5..<6)
        #expect(await app.waitForMessages(2))
        #expect(app.payloads == [.int(0), .int(5)], "what was published while away is counted, not replayed")

        await app.client.shutdown()
        await publisher.shutdown()
        await server.stop()
    }

    @Test("Scenario 3: latest only — nothing replayed, the skipped range reported, live messages flow", arguments: Wire.allCases)
    func latestOnly(wire: Wire) async throws {
        let server = try await InProcessServer.start()
        let channel = unique("s3")
        let app = try await MobileApp.start(origin: server.origin, channel: channel, userId: unique("u"), wire: wire,
                                            lifecycle: .latestOnly)
        let publisher = try makeClient(origin: server.origin)
        try await publish(publisher, channel, 0..<2)
        #expect(await app.waitForMessages(2))

        app.client.enterBackground()
        #expect(await eventually { app.client.connectionState == .background })
        try await publish(publisher, channel, 2..<7)
        app.client.enterForeground()
        #expect(await eventually { !app.continuity.isEmpty })
        let outcome = try #require(app.continuity.first)
        guard case .skipped(let through, let count) = outcome.outcome else {
            Issue.record("expected a skipped outcome, got \(outcome)")
            return
        }
        #expect(count == nil)
        #expect(through > outcome.resumedFrom)
        try await publish(publisher, channel, 7..<9)
        #expect(await app.waitForMessages(4))
        #expect(app.payloads == [.int(0), .int(1), .int(7), .int(8)])

        await app.client.shutdown()
        await publisher.shutdown()
        await server.stop()
    }
}

// MARK: - Support

/// An app's client subscribed to its channels, recording what it delivered.
final class MobileApp: Sendable {
    private struct State {
        var payloads: [JSONValue] = []
        var events: [ConnectionEvent] = []
        var changes: [ConnectionChange] = []
        var continuity: [ChannelContinuity] = []
    }

    let client: TetherClient
    private let state = Mutex(State())

    private init(client: TetherClient) { self.client = client }

    static func start(origin: String, channel: String, userId: String, wire: MobileScenarioTests.Wire,
                      lifecycle: LifecycleOptions) async throws -> MobileApp {
        try await start(origin: origin, channels: [channel], userId: userId, wire: wire, lifecycle: lifecycle)
    }

    static func start(origin: String, channels: [String], userId: String, wire: MobileScenarioTests.Wire,
                      lifecycle: LifecycleOptions) async throws -> MobileApp {
        let client = try makeClient(origin: origin, userId: userId) {
            $0.transport = wire.preference
            $0.lifecycle = lifecycle
            $0.lifecycle.observesApplicationState = false
            // Generous, so a loaded CI machine's slow answer is not taken for a dead link.
            $0.lifecycle.foregroundProbeTimeout = .seconds(30)
            $0.retry = RetryConfiguration(policy: .linear(delay: .milliseconds(200), maximumRetries: 1_000), minimumInterval: .zero,
                                          jitter: .zero ... .zero)
        }
        let app = MobileApp(client: client)
        client.addConnectionEventListener { event in app.state.withLock { $0.events.append(event) } }
        client.addConnectionListener { change in app.state.withLock { $0.changes.append(change) } }
        client.addContinuityListener { outcome in app.state.withLock { $0.continuity.append(outcome) } }
        for subscription in client.subscribe(to: channels) {
            subscription.onEvent { event in app.state.withLock { $0.payloads.append(event.payload) } }
        }
        #expect(await eventually { client.connectionState == .connected }, "the app connected")
        return app
    }

    var payloads: [JSONValue] { state.withLock { $0.payloads } }
    var events: [ConnectionEvent] { state.withLock { $0.events } }
    var continuity: [ChannelContinuity] { state.withLock { $0.continuity } }
    var reconnectEvents: [ReconnectEvent] { state.withLock { $0.changes.compactMap(\.reconnectEvent) } }

    func waitForMessages(_ count: Int, within seconds: Double = 15) async -> Bool {
        await eventually(within: seconds) { self.payloads.count >= count }
    }
}

/// The uuids here-now lists on `channel`.
func occupants(_ client: TetherClient, _ channel: String) async -> [String] {
    guard let result = try? await client.hereNow(channels: [channel]) else { return [] }
    return result.channels[channel]?.occupants.map(\.userId) ?? []
}
