import Foundation
import Synchronization
import Testing
import Tether
import TetherServer
import TetherTesting
import TetherClientCore
import TetherTestingServer

/// The SDK's WebSocket wire against a real server over loopback, through the fault proxy:
/// drops, blackholes and throttling resume the kept session with nothing lost, repeated or
/// reordered; a restarted server says "expired" and the store fills the gap; `.automatic` moves
/// between the wires mid-stream; a drain is honoured.
@Suite("WebSocket sessions over a real server and the fault proxy", .timeLimit(.minutes(1)))
struct WebSocketSessionTests {
    @Test func aDroppedSocketResumesTheKeptSessionWithNothingLostRepeatedOrReordered() async throws {
        let server = try await InProcessServer.start()
        let proxy = try await FaultProxy.start(upstream: server.origin)
        let channel = unique("drop")
        let (client, log) = try await sessionClient(origin: proxy.origin, channel: channel)
        let publisher = try makeClient(origin: server.origin)

        try await publish(publisher, channel, 0..<10)
        #expect(await log.waitForMessages(10))
        // Every socket is reset, and new ones too, while the fault lasts; messages keep coming.
        try await proxy.apply(.reset)
        #expect(await log.waitForEvent(.reconnectStarted))
        try await publish(publisher, channel, 10..<20)
        try await proxy.apply(.pass)
        #expect(await log.waitForEvent { if case .sessionResumed = $0 { true } else { false } })
        try await publish(publisher, channel, 20..<30)
        #expect(await log.waitForMessages(30))
        #expect(log.payloads == (0..<30).map { JSONValue.int($0) }, "every message once, in order")
        #expect(!log.events.contains { if case .sessionExpired = $0 { true } else { false } })
        #expect(log.events.contains(.reconnectSucceeded))

        await client.shutdown()
        await publisher.shutdown()
        await proxy.stop()
        await server.stop()
    }

    @Test func aBlackholedLinkIsDeclaredDeadByThePingsAndTheSessionResumes() async throws {
        let server = try await InProcessServer.start()
        let proxy = try await FaultProxy.start(upstream: server.origin)
        let channel = unique("blackhole")
        // Short pings so the test takes seconds (the defaults notice a dead link within 15 s).
        let (client, log) = try await sessionClient(origin: proxy.origin, channel: channel) {
            $0.webSocket.inactivityPing = .milliseconds(500)
            $0.webSocket.pongTimeout = .milliseconds(500)
        }
        let publisher = try makeClient(origin: server.origin)
        try await publish(publisher, channel, 0..<5)
        #expect(await log.waitForMessages(5))

        try await proxy.apply(.blackhole)
        try await publish(publisher, channel, 5..<15)
        // Nothing flows and nothing closes: only the SDK's unanswered ping can tell.
        #expect(await log.waitForEvent(.reconnectStarted))
        try await proxy.apply(.pass)
        #expect(await log.waitForEvent { if case .sessionResumed = $0 { true } else { false } })
        #expect(await log.waitForMessages(15))
        #expect(log.payloads == (0..<15).map { JSONValue.int($0) }, "every message once, in order")

        await client.shutdown()
        await publisher.shutdown()
        await proxy.stop()
        await server.stop()
    }

    @Test func aThrottledLinkDeliversEverythingInOrder() async throws {
        let server = try await InProcessServer.start()
        let proxy = try await FaultProxy.start(upstream: server.origin)
        let channel = unique("throttle")
        let (client, log) = try await sessionClient(origin: proxy.origin, channel: channel)
        let publisher = try makeClient(origin: server.origin)
        try await proxy.apply(.bandwidth(bytesPerSecond: 4_000))
        try await publish(publisher, channel, 0..<40)
        #expect(await log.waitForMessages(40, within: 30))
        #expect(log.payloads == (0..<40).map { JSONValue.int($0) })
        #expect(log.events.isEmpty, "a slow link is not a lost one: \(log.events)")

        await client.shutdown()
        await publisher.shutdown()
        await proxy.stop()
        await server.stop()
    }

    @Test func aRestartedServerSaysExpiredAndTheStoreFillsTheGap() async throws {
        let server = try await InProcessServer.start()
        let proxy = try await FaultProxy.start(upstream: server.origin)
        let channel = unique("restart")
        let (client, log) = try await sessionClient(origin: proxy.origin, channel: channel)
        let before = try makeClient(origin: server.origin)
        try await publish(before, channel, 0..<5)
        #expect(await log.waitForMessages(5))
        await before.shutdown()

        // Nothing gets through the proxy while the server restarts on its own store, and the
        // messages published meanwhile are only in the store.
        try await proxy.apply(.reset)
        await server.stop(removingData: false)
        let restarted = try await InProcessServer.start(port: server.port, directory: server.directory)
        let after = try makeClient(origin: restarted.origin)
        try await publish(after, channel, 5..<12)
        try await proxy.apply(.pass)

        #expect(await log.waitForEvent { if case .sessionExpired = $0 { true } else { false } })
        try await publish(after, channel, 12..<15)
        #expect(await log.waitForMessages(15))
        #expect(log.payloads == (0..<15).map { JSONValue.int($0) }, "the gap came from the store, once, in order")
        #expect(!log.events.contains { if case .sessionResumed = $0 { true } else { false } })

        await client.shutdown()
        await after.shutdown()
        await proxy.stop()
        await restarted.stop()
    }

    @Test func automaticFallsBackToLongPollAndReturnsToWebSocketMidStream() async throws {
        // The first server has no WebSocket endpoint: the upgrade gets a plain HTTP answer.
        let first = try await InProcessServer.start(webSocket: WebSocketSettings(enabled: false))
        let channel = unique("switch")
        let (client, log) = try await sessionClient(origin: first.origin, channel: channel) {
            $0.transport = .automatic
            $0.webSocket.fallbackRetryInterval = .milliseconds(300)
        }
        #expect(await log.waitForEvent(.transportChanged(.longPoll)))
        let publisher = try makeClient(origin: first.origin)
        try await publish(publisher, channel, 0..<10)
        #expect(await log.waitForMessages(10))
        await publisher.shutdown()

        // The same store comes back with the endpoint on: the client moves to WebSocket and
        // continues from the long-poll's cursor.
        await first.stop(removingData: false)
        let second = try await InProcessServer.start(port: first.port, directory: first.directory)
        let publisher2 = try makeClient(origin: second.origin)
        try await publish(publisher2, channel, 10..<15)
        #expect(await log.waitForEvent(.transportChanged(.webSocket), within: 20))
        try await publish(publisher2, channel, 15..<25)
        #expect(await log.waitForMessages(25))
        await publisher2.shutdown()

        // And back: the endpoint goes away again, the client returns to long-poll from the
        // session's cursor.
        await second.stop(removingData: false)
        let third = try await InProcessServer.start(port: first.port, directory: first.directory,
                                                    webSocket: WebSocketSettings(enabled: false))
        let publisher3 = try makeClient(origin: third.origin)
        try await publish(publisher3, channel, 25..<30)
        #expect(await log.waitForEvent(within: 20) { event in
            log.events.filter { $0 == .transportChanged(.longPoll) }.count >= 2
        })
        try await publish(publisher3, channel, 30..<35)
        #expect(await log.waitForMessages(35))
        #expect(log.payloads == (0..<35).map { JSONValue.int($0) }, "no loss and no duplicate across either switch")

        await client.shutdown()
        await publisher3.shutdown()
        await third.stop()
    }

    @Test func disconnectEndsTheSessionAndItsPresenceAndReconnectCatchesUp() async throws {
        let server = try await InProcessServer.start()
        let channel = unique("bye")
        let (client, log) = try await sessionClient(origin: server.origin, channel: channel, userId: "occupant")
        let observer = try makeClient(origin: server.origin, userId: "observer")
        #expect(await eventually { (try? await observer.hereNow(channels: [channel]).totalOccupancy) == 1 }, "joined at the first subscribe")
        try await publish(observer, channel, 0..<3)
        #expect(await log.waitForMessages(3))

        // disconnect() sends `bye`: the session ends, and its occupant leaves at once (no presence timeout).
        client.disconnect()
        #expect(await eventually { client.connectionPhase == .closed && !client.isSessionOpen })
        #expect(await eventually { (try? await observer.hereNow(channels: [channel]).totalOccupancy) == 0 }, "left on bye")
        try await publish(observer, channel, 3..<6)

        // reconnect() starts a new session from the kept cursor: what was published meanwhile arrives.
        client.reconnect()
        #expect(await log.waitForMessages(6))
        #expect(log.payloads == (0..<6).map { JSONValue.int($0) })
        #expect(await eventually { (try? await observer.hereNow(channels: [channel]).totalOccupancy) == 1 })

        await client.shutdown()
        await observer.shutdown()
        await server.stop()
    }

    @Test func aDrainIsHonouredAndTheClientComesBackToTheNextServer() async throws {
        var settings = WebSocketSettings()
        settings.drainReconnectAfterMilliseconds = 1_500
        settings.drainJitterMilliseconds = 0
        let server = try await InProcessServer.start(webSocket: settings)
        let channel = unique("drain")
        let (client, log) = try await sessionClient(origin: server.origin, channel: channel)
        let publisher = try makeClient(origin: server.origin)
        try await publish(publisher, channel, 0..<3)
        #expect(await log.waitForMessages(3))
        await publisher.shutdown()

        let drained = ContinuousClock.now
        await server.stop(removingData: false)
        let next = try await InProcessServer.start(port: server.port, directory: server.directory, webSocket: settings)
        #expect(await log.waitForEvent { if case .sessionExpired = $0 { true } else { false } })
        // The server asked for 1.5 s; the client did not come back sooner.
        #expect(ContinuousClock.now - drained >= .milliseconds(1_500))
        let publisher2 = try makeClient(origin: next.origin)
        try await publish(publisher2, channel, 3..<6)
        #expect(await log.waitForMessages(6))
        #expect(log.payloads == (0..<6).map { JSONValue.int($0) })

        await client.shutdown()
        await publisher2.shutdown()
        await next.stop()
    }

    @Test func anIdleSessionAnswersTheServersPingsAndStaysOpen() async throws {
        var settings = WebSocketSettings()
        settings.pingIntervalSeconds = 1
        let server = try await InProcessServer.start(webSocket: settings)
        let channel = unique("idle")
        // The SDK's own pings are off: only the server pings, and two unanswered ones would close.
        let (client, log) = try await sessionClient(origin: server.origin, channel: channel) {
            $0.webSocket.inactivityPing = .zero
        }
        let rtt = try await client.ping(timeout: .seconds(5))
        #expect(rtt > .zero && rtt < .seconds(5))
        try await Task.sleep(for: .seconds(3.5))
        #expect(log.events.isEmpty, "no reconnect across three server pings: \(log.events)")
        #expect(client.connectionPhase == .open)
        let publisher = try makeClient(origin: server.origin)
        try await publish(publisher, channel, 0..<1)
        #expect(await log.waitForMessages(1))

        await client.shutdown()
        await publisher.shutdown()
        await server.stop()
    }

    @Test func aRevokedGrantEndsOnlyItsChannelAndTheOthersKeepFlowing() async throws {
        let keyset = Keyset(name: "secure", publishKey: "pub-s", subscribeKey: "sub-s", secretKey: "s3cret")
        let server = try await InProcessServer.start(file: ConfigurationFile(keysets: [keyset], subscribeTimeoutSeconds: 30))
        let admin = try TetherClient(configuration: TetherConfiguration(subscribeKey: "sub-s", publishKey: "pub-s", secretKey: "s3cret",
                                                                        userId: "admin", origin: server.origin, useTLS: false))
        let (kept, revoked) = (unique("kept"), unique("revoked"))
        for channel in [kept, revoked] {
            try await admin.grant(AuthKeyGrant(channels: [channel], authKeys: ["ak"], read: true, write: true, ttlMinutes: 5))
        }
        let statuses = Mutex<[Status]>([])
        var configuration = try TetherConfiguration(subscribeKey: "sub-s", publishKey: "pub-s", userId: "reader", authKey: "ak",
                                                    origin: server.origin, useTLS: false)
        configuration.transport = .webSocket
        let client = try TetherClient(configuration: configuration)
        client.addStatusListener { status in statuses.withLock { $0.append(status) } }
        let log = SessionLog()
        client.addConnectionEventListener { log.add($0) }
        for subscription in client.subscribe(to: [kept, revoked]) {
            subscription.onEvent { log.add(.string("\($0.channel):\($0.payload.jsonText)")) }
        }
        #expect(await eventually { client.connectionPhase == .open })
        _ = try await admin.publish(channel: kept, message: .int(1))
        _ = try await admin.publish(channel: revoked, message: .int(2))
        #expect(await log.waitForMessages(2))

        try await admin.grant(AuthKeyGrant(channels: [revoked], authKeys: ["ak"], read: false, write: false, ttlMinutes: 5))
        #expect(await eventually { statuses.withLock { $0.contains { $0.category == .accessDenied } } })
        let denied = try #require(statuses.withLock { $0.first { $0.category == .accessDenied } })
        #expect(denied.deniedChannels == [revoked])
        _ = try await admin.publish(channel: kept, message: .int(3))
        #expect(await log.waitForMessages(3))
        #expect(log.payloads.last == .string("\(kept):3"), "the other channel keeps flowing: \(log.payloads)")
        #expect(client.connectionPhase == .open)
        #expect(!log.events.contains(.reconnectStarted))

        await client.shutdown()
        await admin.shutdown()
        await server.stop()
    }

    /// A proxy that resets the connection before the upgrade is answered never reached a server:
    /// the failure says "connection closed", so the policy's quick reconnection applies as it does
    /// for the long-poll (chaos suite: the WebSocket column used to wait out the back-off here).
    @Test func aConnectionClosedBeforeTheUpgradeAnswersNeverReachedAServer() async throws {
        let raw = try await RawServer.start(replyingWith: [])
        let client = try makeClient(origin: raw.origin) { $0.transport = .webSocket }
        let statuses = client.statuses()
        client.subscribe(to: [unique("raw")])
        var iterator = statuses.makeAsyncIterator()
        let first = try #require(await iterator.next())
        #expect(first.category == .networkIssues)
        guard case .connectionClosed? = first.error as? TransportFailure else {
            Issue.record("expected connectionClosed, got \(String(describing: first.error))")
            return
        }
        #expect(RetryMachine.neverReachedAServer(first))
        await client.shutdown()
        try await raw.stop()
    }

    /// Every name revoked: the retries report access denied and never `reconnected` while the
    /// grant is gone (chaos suite: the handshake used to succeed on the open socket before the
    /// server answered, so each retry said `reconnected` then failed); a restored grant resumes.
    @Test func aFullyRevokedSubscriptionIsDeniedWithoutFalseReconnects() async throws {
        let keyset = Keyset(name: "secure", publishKey: "pub-s", subscribeKey: "sub-s", secretKey: "s3cret")
        let server = try await InProcessServer.start(file: ConfigurationFile(keysets: [keyset], subscribeTimeoutSeconds: 30))
        let admin = try TetherClient(configuration: TetherConfiguration(subscribeKey: "sub-s", publishKey: "pub-s", secretKey: "s3cret",
                                                                        userId: "admin", origin: server.origin, useTLS: false))
        let channel = unique("revoked")
        try await admin.grant(AuthKeyGrant(channels: [channel], authKeys: ["ak"], read: true, write: true, ttlMinutes: 5))
        var configuration = try TetherConfiguration(subscribeKey: "sub-s", publishKey: "pub-s", userId: "reader", authKey: "ak",
                                                    origin: server.origin, useTLS: false)
        configuration.transport = .webSocket
        configuration.retry = RetryConfiguration(policy: .linear(delay: .milliseconds(100), maximumRetries: 100), minimumInterval: .zero,
                                                 jitter: .zero ... .zero)
        configuration.timeProbeInterval = .milliseconds(300)
        let client = try TetherClient(configuration: configuration)
        let statuses = Mutex<[StatusCategory]>([])
        client.addStatusListener { status in statuses.withLock { $0.append(status.category) } }
        let log = SessionLog()
        client.subscribe(to: [channel])[0].onEvent { log.add($0.payload) }
        #expect(await eventually { client.connectionPhase == .open })
        _ = try await admin.publish(channel: channel, message: .int(1))
        #expect(await log.waitForMessages(1))

        try await admin.grant(AuthKeyGrant(channels: [channel], authKeys: ["ak"], read: false, write: false, ttlMinutes: 5))
        #expect(await eventually { client.connectionState == .failed(.accessDenied) })
        // Let a few quiet re-checks run while still denied.
        try await Task.sleep(for: .seconds(1))
        let whileDenied = statuses.withLock { $0 }
        #expect(whileDenied.filter { $0 == .accessDenied }.count == 4, "one per denial until the retries run out: \(whileDenied)")
        #expect(whileDenied.filter { $0 == .reconnected }.isEmpty, "never reconnected while denied: \(whileDenied)")

        try await admin.grant(AuthKeyGrant(channels: [channel], authKeys: ["ak"], read: true, write: true, ttlMinutes: 5))
        #expect(await eventually { statuses.withLock { $0.last == .reconnected } })
        _ = try await admin.publish(channel: channel, message: .int(2))
        #expect(await log.waitForMessages(2))
        #expect(log.payloads == [.int(1), .int(2)])

        await client.shutdown()
        await admin.shutdown()
        await server.stop()
    }

    /// A proxy resetting every connection as it opens is a server never reached: the session
    /// knocks again within about a second (the quick reconnection), not after the policy's
    /// back-off — here 10 s, so only quick attempts can reach four resets in the time allowed
    /// (chaos suite: the 60 s outage with 5,000 messages took 13–19 s to catch up on WebSocket
    /// because a reset during the TCP connect counted as "unreachable").
    @Test func connectionsResetAsTheyOpenAreRetriedQuicklyAndTheBacklogArrives() async throws {
        let server = try await InProcessServer.start()
        let proxy = try await FaultProxy.start(upstream: server.origin)
        let channel = unique("reset")
        let (client, log) = try await sessionClient(origin: proxy.origin, channel: channel) {
            $0.retry = RetryConfiguration(policy: .linear(delay: .seconds(10), maximumRetries: 10), jitter: .zero ... .zero)
            // The subject is the reset's classification: the machine's own link changes (other
            // tests' network namespaces) stay out of it. Seen in the full run with the monitor on:
            // the backlog arrives but `session resumed` sometimes does not (an open item, #14).
            $0.watchesNetwork = false
        }
        try await proxy.apply(.reset)
        let publisher = try makeClient(origin: server.origin)
        try await publish(publisher, channel, 0..<300)
        let before = proxy.counters.reset
        #expect(await eventually(within: 15) { proxy.counters.reset >= before + 4 }, "quick attempts while the link resets")
        try await proxy.apply(.pass)
        // The backlog arrives whole. (Whether a session event comes depends on whether the
        // socket the client had was lost: in full parallel runs the reconnect sometimes went on
        // the same socket, with no resume and so no event. The events are asserted elsewhere.)
        #expect(await log.waitForMessages(300, within: 25))
        #expect(log.payloads == (0..<300).map { JSONValue.int($0) })
        await client.shutdown()
        await publisher.shutdown()
        await proxy.stop()
        await server.stop()
    }

    /// A subscription made after `open()` starts when it is made, as over long-poll: what was
    /// published between `open()` and `subscribe` is history, not a delivery. Before, the
    /// subscription started at the welcome's cursor and replayed it.
    @Test func aSubscriptionAfterOpenDeliversOnlyWhatIsPublishedAfterIt() async throws {
        let server = try await InProcessServer.start()
        let channel = unique("after-open")
        let client = try makeClient(origin: server.origin) { $0.transport = .webSocket }
        let publisher = try makeClient(origin: server.origin)
        try await client.open()
        _ = try await publisher.publish(channel: channel, message: "before")
        let log = SessionLog()
        let connected = Mutex(false)
        let token = client.addStatusListener { if $0.category == .connected { connected.withLock { $0 = true } } }
        let subscription = client.subscribe(to: [channel])[0]
        subscription.onEvent { log.add($0.payload) }
        // `connected` comes once the server took the subscription.
        #expect(await eventually { connected.withLock { $0 } })
        _ = try await publisher.publish(channel: channel, message: "after")
        #expect(await log.waitForMessages(1))
        #expect(log.payloads == ["after"])
        token.cancel()
        await client.shutdown()
        await publisher.shutdown()
        await server.stop()
    }

    @Test func openWaitsForTheWelcomeAndPingMeasuresTheSocket() async throws {
        let server = try await InProcessServer.start()
        let client = try makeClient(origin: server.origin) { $0.transport = .webSocket }
        #expect(!client.isSessionOpen)
        try await client.open()
        #expect(client.isSessionOpen)
        let rtt = try await client.ping()
        #expect(rtt > .zero)
        await client.shutdown()

        let longPoll = try makeClient(origin: server.origin) { $0.transport = .longPoll }
        let status = await failure { try await longPoll.open() }
        #expect(status?.category == .badRequest)
        #expect(try await longPoll.ping() > .zero, "over long-poll, ping is a /time request")
        await longPoll.shutdown()
        await server.stop()
    }
}

// MARK: - Support

/// What one subscriber saw: the payloads in arrival order and the connection events.
final class SessionLog: Sendable {
    private struct State {
        var payloads: [JSONValue] = []
        var events: [ConnectionEvent] = []
    }

    private let state = Mutex(State())

    var payloads: [JSONValue] { state.withLock { $0.payloads } }
    var events: [ConnectionEvent] { state.withLock { $0.events } }

    func add(_ payload: JSONValue) { state.withLock { $0.payloads.append(payload) } }
    func add(_ event: ConnectionEvent) { state.withLock { $0.events.append(event) } }

    /// Waits until `count` payloads arrived (more would be duplicates, which the caller's
    /// comparison catches).
    func waitForMessages(_ count: Int, within seconds: Double = 15) async -> Bool {
        await eventually(within: seconds) { self.payloads.count >= count }
    }

    func waitForEvent(_ event: ConnectionEvent, within seconds: Double = 15) async -> Bool {
        await waitForEvent(within: seconds) { $0 == event }
    }

    func waitForEvent(within seconds: Double = 15, _ matches: @escaping @Sendable (ConnectionEvent) -> Bool) async -> Bool {
        await eventually(within: seconds) { self.events.contains(where: matches) }
    }
}

/// A client on the WebSocket wire, subscribed to `channel` and connected, with quick linear retries.
func sessionClient(origin: String, channel: String, userId: String = "tester", configure: (inout TetherConfiguration) -> Void = { _ in })
    async throws -> (TetherClient, SessionLog)
{
    let client = try makeClient(origin: origin, userId: userId) {
        $0.transport = .webSocket
        $0.retry = RetryConfiguration(policy: .linear(delay: .milliseconds(200), maximumRetries: 1_000), minimumInterval: .zero,
                                      jitter: .zero ... .zero)
        configure(&$0)
    }
    let log = SessionLog()
    client.addConnectionEventListener { log.add($0) }
    let subscription = client.subscribe(to: [channel])[0]
    subscription.onEvent { log.add($0.payload) }
    let connected = await eventually { client.connectionPhase == .open }
    #expect(connected, "the session opened")
    return (client, log)
}

func publish(_ client: TetherClient, _ channel: String, _ range: Range<Int>) async throws {
    for i in range { _ = try await client.publish(channel: channel, message: .int(i)) }
}
