import Foundation
import Synchronization
import Testing
import Tether
import TetherClientCore
import TetherServer
import TetherTesting
import TetherTestingServer

/// Failover between two real servers on loopback. Each node has its own SQLite file today (the
/// shared store of issue 19 does not exist yet), so these tests show what the client does — it
/// moves, carries its cursor, resubscribes, and receives what is published on the node it moved
/// to — not that messages published on the dead node before it died reach the other node.
@Suite("Failover between two real servers", .timeLimit(.minutes(1)))
struct FailoverLoopbackTests {
    /// What an app sees: statuses, connection events and continuity outcomes, in order.
    final class AppLog: Sendable {
        private let state = Mutex<(statuses: [StatusCategory], continuity: [ChannelContinuity])>(([], []))
        var statuses: [StatusCategory] { state.withLock { $0.statuses } }
        var continuity: [ChannelContinuity] { state.withLock { $0.continuity } }

        func add(_ status: Status) { state.withLock { $0.statuses.append(status.category) } }
        func add(_ outcome: ChannelContinuity) { state.withLock { $0.continuity.append(outcome) } }

        static func following(_ client: TetherClient) -> AppLog {
            let log = AppLog()
            client.addStatusListener { log.add($0) }
            client.addContinuityListener { log.add($0) }
            return log
        }
    }

    /// ``sessionClient(origin:channel:userId:configure:)`` with the app's log attached before it subscribes.
    static func client(origin: String, fallback: String, channel: String, wire: TransportPreference) async throws
        -> (TetherClient, SessionLog, AppLog)
    {
        let client = try makeClient(origin: origin) {
            $0.transport = wire
            $0.retry = RetryConfiguration(policy: .linear(delay: .milliseconds(200), maximumRetries: 1_000), minimumInterval: .zero,
                                          jitter: .zero ... .zero)
            try? $0.setFallbackOrigins([fallback])
        }
        let log = SessionLog()
        let app = AppLog.following(client)
        client.addConnectionEventListener { log.add($0) }
        let subscription = client.subscribe(to: [channel])[0]
        subscription.onEvent { log.add($0.payload) }
        #expect(await eventually { app.statuses == [.connected] }, "connected")
        return (client, log, app)
    }

    static func nodes(drainAfterMilliseconds: Int = 30_000) async throws -> (InProcessServer, InProcessServer) {
        var settings = WebSocketSettings()
        // A node restarting asks its clients to come back after 30 s: a client with somewhere
        // else to go does not wait for it.
        settings.drainReconnectAfterMilliseconds = drainAfterMilliseconds
        settings.drainJitterMilliseconds = 0
        return (try await InProcessServer.start(webSocket: settings), try await InProcessServer.start(webSocket: settings))
    }

    @Test(arguments: [TransportPreference.webSocket, .longPoll])
    func aGracefullyStoppedPrimarySendsItsClientToTheFallback(wire: TransportPreference) async throws {
        let (primary, fallback) = try await Self.nodes()
        let channel = unique("drain-\(wire)")
        let (client, log, app) = try await Self.client(origin: primary.origin, fallback: fallback.origin, channel: channel, wire: wire)
        let publisherA = try makeClient(origin: primary.origin)
        try await publish(publisherA, channel, 0..<3)
        #expect(await log.waitForMessages(3))
        await publisherA.shutdown()
        let cursor = try #require(client.currentTimetoken)

        let stopped = ContinuousClock.now
        await primary.stop()
        #expect(await log.waitForEvent(.originChanged(from: primary.origin, to: fallback.origin)))
        #expect(client.currentOrigin == fallback.origin)
        let moved = await eventually { client.connectionState == .connected && client.currentTimetoken.map { $0 >= cursor } == true }
        #expect(moved)
        // The drain asked for 30 s; the client went to the other node at once.
        #expect(ContinuousClock.now - stopped < .seconds(10))

        let publisherB = try makeClient(origin: fallback.origin)
        try await publish(publisherB, channel, 3..<6)
        #expect(await log.waitForMessages(6))
        #expect(log.payloads == (0..<6).map { JSONValue.int($0) }, "everything once, in order")

        switch wire {
        case .webSocket:
            // The socket closed with the drain (an outage of well under a second), the new node
            // did not hold the session (`sessionExpired`), so the client subscribed there again
            // from its cursor: reconnected, and a continuity outcome with nothing missed.
            #expect(log.events.contains { if case .sessionExpired = $0 { true } else { false } })
            #expect(app.statuses == [.connected, .unexpectedDisconnect, .reconnected], "\(app.statuses)")
            // Nothing was published between the drain and the move: continuous, from the cursor
            // the client had on the old node.
            #expect(app.continuity == [ChannelContinuity(channel: channel, outcome: .continuous, resumedFrom: cursor)], "\(app.continuity)")
        case .longPoll, .automatic:
            // The node answered the waiting long-poll with `Tether-Draining`: the next poll went
            // to the fallback with the same cursor, and the app saw no outage at all.
            #expect(app.statuses == [.connected], "\(app.statuses)")
        }

        await client.shutdown()
        await publisherB.shutdown()
        await fallback.stop()
    }

    @Test(arguments: [TransportPreference.webSocket, .longPoll])
    func aPrimaryThatDiesMidStreamIsLeftForTheFallback(wire: TransportPreference) async throws {
        let (primary, fallback) = try await Self.nodes()
        // The client reaches the primary through the fault proxy, which plays the dying node:
        // every open connection reset, the port closed (connection refused).
        let proxy = try await FaultProxy.start(upstream: primary.origin)
        let channel = unique("kill-\(wire)")
        let (client, log, app) = try await Self.client(origin: proxy.origin, fallback: fallback.origin, channel: channel, wire: wire)
        let publisherA = try makeClient(origin: primary.origin)
        try await publish(publisherA, channel, 0..<3)
        #expect(await log.waitForMessages(3))
        let cursor = try #require(client.currentTimetoken)

        try await proxy.apply(.refuse)
        await proxy.resetOpenConnections()
        #expect(await log.waitForEvent(.originChanged(from: proxy.origin, to: fallback.origin)))
        let moved = await eventually { client.connectionState == .connected && client.currentOrigin == fallback.origin }
        #expect(moved)
        #expect(await log.waitForEvent(.reconnectSucceeded))  // the event arrives through the event stream, maybe after the state

        let publisherB = try makeClient(origin: fallback.origin)
        try await publish(publisherB, channel, 3..<6)
        #expect(await log.waitForMessages(6))
        #expect(log.payloads == (0..<6).map { JSONValue.int($0) }, "everything once, in order")
        // The reset dropped the connection (an outage), the primary refused the quick attempt
        // (the move), and the fallback answered, continuing from the cursor.
        #expect(app.statuses == [.connected, .unexpectedDisconnect, .reconnected], "\(app.statuses)")
        #expect(app.continuity == [ChannelContinuity(channel: channel, outcome: .continuous, resumedFrom: cursor)], "\(app.continuity)")

        await client.shutdown()
        await publisherA.shutdown()
        await publisherB.shutdown()
        await proxy.stop()
        await primary.stop()
        await fallback.stop()
    }

    @Test func aRESTCallToADeadPrimaryIsAnsweredByTheFallbackInTheSameCall() async throws {
        let (primary, fallback) = try await Self.nodes()
        let proxy = try await FaultProxy.start(upstream: primary.origin)
        try await proxy.apply(.refuse)
        let client = try makeClient(origin: proxy.origin) { try? $0.setFallbackOrigins([fallback.origin]) }
        let channel = unique("rest")
        // Both the outbox's send and the history call fail over within the call: the refused
        // primary, then the fallback at once.
        let published = try await client.publish(channel: channel, message: .string("hello"))
        #expect(client.currentOrigin == fallback.origin)
        let history = try await client.history(channel: channel)
        #expect(history.map(\.timetoken) == [published.timetoken])
        await client.shutdown()
        await proxy.stop()
        await primary.stop()
        await fallback.stop()
    }
}
