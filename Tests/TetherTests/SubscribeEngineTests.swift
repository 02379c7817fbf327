import Foundation
import Logging
import Synchronization
import Testing
@testable import Tether
import TetherServer
import TetherTesting
import TetherTestingServer

/// A Tether server that can be stopped and started again on the same port and data directory:
/// TetherTestingServer's ``InProcessServer`` restarted where its clients expect it.
final class RestartableServer: Sendable {
    let directory: String
    let file: ConfigurationFile
    private let state = Mutex<(port: Int, server: InProcessServer?)>((0, nil))

    init(file: ConfigurationFile = ConfigurationFile(subscribeTimeoutSeconds: 5)) {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-engine-\(UUID().uuidString)").path
        self.file = file
    }

    var origin: String { "127.0.0.1:\(state.withLock { $0.port })" }

    func start() async throws {
        let port = state.withLock { $0.port }
        let server = try await InProcessServer.start(port: port, file: file, directory: directory, logLevel: .critical)
        state.withLock { $0 = (server.port, server) }
    }

    func stop() async {
        await state.withLock { $0.server }?.stop(removingData: false)
    }

    func remove() { try? FileManager.default.removeItem(atPath: directory) }
}

/// The engine over real loopback sockets against the real server (or a scripted one): what
/// needs the wire. Timers run on a ``ManualClock`` moved by the test; every wait is for an event
/// (a status, a message, a request sent or finished), never for wall time.
@Suite("Subscribe engine against the real server", .serialized, .timeLimit(.minutes(2)))
struct SubscribeEngineTests {
    @Test func receivesInOrderAndAnnouncesConnected() async throws {
        let server = try await InProcessServer.start(file: ConfigurationFile(subscribeTimeoutSeconds: 5))
        let (client, _, _) = try makeObservedClient(origin: server.origin)
        var statuses = client.statuses().makeAsyncIterator()
        let channel = unique()
        let subscription = client.subscribe(to: [channel])[0]
        // The closure listener and the messages stream carry the same events.
        let (listened, sink) = AsyncStream.makeStream(of: ReceivedEvent.self)
        subscription.onEvent { sink.yield($0) }
        var heard = listened.makeAsyncIterator()
        var messages = subscription.messages.makeAsyncIterator()
        let connected = try #require(await statuses.next())
        #expect(connected.category == .connected)
        #expect(connected.affectedChannels == [channel] && connected.subscribedChannels == [channel])
        #expect(connected.lastTimetoken == .zero && connected.currentTimetoken != nil)
        #expect(client.connectionState == .connected)
        for index in 0..<5 { _ = try await client.publish(channel: channel, message: .string("m\(index)")) }
        var received: [JSONValue] = []
        var streamed: [JSONValue] = []
        for _ in 0..<5 {
            if let event = await heard.next() { received.append(event.payload) }
            if let event = await messages.next() { streamed.append(event.payload) }
        }
        #expect(received == (0..<5).map { .string("m\($0)") })
        #expect(streamed == received)
        await client.shutdown()
        await server.stop()
    }

    @Test func channelChangesDuringALongPoll() async throws {
        let server = try await InProcessServer.start(file: ConfigurationFile(subscribeTimeoutSeconds: 30))
        let (client, observed, _) = try makeObservedClient(origin: server.origin)
        var events = observed.events.makeAsyncIterator()
        var statuses = client.statuses().makeAsyncIterator()
        let (a, b) = (unique("a"), unique("b"))
        let first = client.subscribe(to: [a])[0]
        #expect(await statuses.next()?.category == .connected)
        _ = await events.nextLongPollSent()          // the long-poll is waiting (30 s server timeout)
        let second = client.subscribe(to: [b])[0]
        #expect(await statuses.next()?.category == .subscriptionChanged)
        var onA = first.messages.makeAsyncIterator()
        var onB = second.messages.makeAsyncIterator()
        _ = try await client.publish(channel: b, message: "on b")
        _ = try await client.publish(channel: a, message: "on a")
        #expect(await onB.next()?.payload == "on b")
        #expect(await onA.next()?.payload == "on a")
        client.unsubscribe(from: [a])
        #expect(await statuses.next()?.category == .subscriptionChanged)
        #expect(await onA.next() == nil)            // the subscription object finished
        _ = try await client.publish(channel: a, message: "gone")
        _ = try await client.publish(channel: b, message: "still")
        #expect(await onB.next()?.payload == "still")
        client.unsubscribeAll()
        #expect(await statuses.next()?.category == .disconnected)
        #expect(client.connectionState == .idle)
        await client.shutdown()
        await server.stop()
    }

    /// A filtered subscription's catch-up: the server leaves out what the filter excludes, so
    /// its pages are short while more remains. The continuity outcome comes once the catch-up
    /// reached the server's cursor and counts every page. Before, it came after the first page,
    /// counting its 34 of the 100 kept messages.
    @Test func aFilteredCatchUpCountsEveryPage() async throws {
        let server = RestartableServer(file: ConfigurationFile(subscribeTimeoutSeconds: 5, rateLimiting: false))
        try await server.start()
        let (client, _, clock) = try makeObservedClient(origin: server.origin) { $0.filterExpression = "tag == 'keep'" }
        var statuses = client.statuses().makeAsyncIterator()
        var outcomes = client.continuityOutcomes().makeAsyncIterator()
        let channel = unique()
        let subscription = client.subscribe(to: [channel])[0]
        var messages = subscription.messages.makeAsyncIterator()
        #expect(await statuses.next()?.category == .connected)
        let publisher = try makeClient(origin: server.origin)
        _ = try await publisher.publish(channel: channel, message: "before", options: PublishOptions(meta: ["tag": "keep"]))
        #expect(await messages.next()?.payload == "before")

        await server.stop()
        #expect(await statuses.next()?.category == .unexpectedDisconnect)
        try await server.start()
        for index in 0..<300 {
            let tag: JSONValue = index % 3 == 0 ? "keep" : "drop"
            _ = try await publisher.publish(channel: channel, message: .int(index), options: PublishOptions(meta: ["tag": tag]))
        }
        _ = await clock.advanceToSleeper(within: .zero ... .seconds(2))
        #expect(await statuses.next()?.category == .reconnected)
        var received: [JSONValue] = []
        for _ in 0..<100 { if let event = await messages.next() { received.append(event.payload) } }
        #expect(received == stride(from: 0, to: 300, by: 3).map { JSONValue.int($0) })
        #expect(await outcomes.next()?.outcome == .recovered(count: 100))
        await publisher.shutdown()
        await client.shutdown()
        await server.stop()
        server.remove()
    }

    /// Server restart mid-stream, 1,000 messages published while the client is away: every one is
    /// received once, in order, and the continuity outcome says so.
    @Test func serverRestartAndAThousandMessagesDuringTheOutage() async throws {
        // 1,000 publishes at once from one uuid: more than the default rate limits allow.
        let server = RestartableServer(file: ConfigurationFile(subscribeTimeoutSeconds: 5, rateLimiting: false))
        try await server.start()
        let (client, _, clock) = try makeObservedClient(origin: server.origin)
        var statuses = client.statuses().makeAsyncIterator()
        var changes = client.connectionChanges().makeAsyncIterator()
        var outcomes = client.continuityOutcomes().makeAsyncIterator()
        let channel = unique()
        let subscription = client.subscribe(to: [channel])[0]
        var messages = subscription.messages.makeAsyncIterator()
        #expect(await statuses.next()?.category == .connected)
        _ = try await client.publish(channel: channel, message: "before")
        #expect(await messages.next()?.payload == "before")

        await server.stop()
        let lost = try #require(await statuses.next())
        #expect(lost.category == .unexpectedDisconnect && lost.willAutomaticallyRetry)
        #expect(client.connectionState == .reconnecting(attempt: 1))
        try await server.start()
        let publisher = try makeClient(origin: server.origin)
        for index in 0..<1000 { _ = try await publisher.publish(channel: channel, message: .string("m\(index)")) }

        // Nothing listened at the origin: the retry comes within about a second (fast reconnect).
        let delay = await clock.advanceToSleeper(within: .zero ... .seconds(2))
        #expect(delay <= .seconds(1))
        #expect(await statuses.next()?.category == .reconnected)
        #expect(await statuses.next()?.category == .requestMessageCountExceeded)
        var received: [ReceivedEvent] = []
        for _ in 0..<1000 { if let event = await messages.next() { received.append(event) } }
        #expect(received.map(\.payload) == (0..<1000).map { .string("m\($0)") })
        let timetokens = received.map(\.timetoken)
        #expect(timetokens == timetokens.sorted() && Set(timetokens).count == timetokens.count)
        #expect(await outcomes.next()?.outcome == .recovered(count: 1000))
        var reconnectEvents: [ReconnectEvent] = []
        while reconnectEvents.count < 2, let change = await changes.next() {
            if let event = change.reconnectEvent { reconnectEvents.append(event) }
        }
        #expect(reconnectEvents == [.started, .succeeded])
        await publisher.shutdown()
        await client.shutdown()
        await server.stop()
        server.remove()
    }

    /// Unreachable for longer than the policy allows: gives up, probes Time every 10 s, restores.
    @Test func unreachableForAWhileThenRestoredByTimeProbes() async throws {
        let server = RestartableServer()
        try await server.start()
        let (client, _, clock) = try makeObservedClient(origin: server.origin) {
            $0.retry = RetryConfiguration(policy: .linear(delay: .seconds(2), maximumRetries: 2), jitter: .zero ... .zero, fastReconnect: nil)
        }
        var statuses = client.statuses().makeAsyncIterator()
        let channel = unique()
        var messages = client.subscribe(to: [channel])[0].messages.makeAsyncIterator()
        #expect(await statuses.next()?.category == .connected)
        await server.stop()
        #expect(await statuses.next()?.category == .unexpectedDisconnect)
        // Each retry is scheduled only once the one before has failed.
        await clock.advanceToSleeper(after: .seconds(2))
        await clock.advanceToSleeper(after: .seconds(2))
        #expect(await statuses.next()?.category == .disconnectedUnexpectedly)
        #expect(client.connectionState == .failed(.disconnectedUnexpectedly))
        // Probes keep failing while the server is away: three of them, each failure scheduling the next.
        for _ in 0..<3 { await clock.advanceToSleeper(after: .seconds(10)) }
        await clock.waitForSleeper(until: clock.now.advanced(by: .seconds(10)))
        try await server.start()
        let publisher = try makeClient(origin: server.origin)
        _ = try await publisher.publish(channel: channel, message: "while away")
        await clock.advanceToSleeper(after: .seconds(10))
        #expect(await statuses.next()?.category == .reconnected)
        #expect(await messages.next()?.payload == "while away")
        await publisher.shutdown()
        await client.shutdown()
        await server.stop()
        server.remove()
    }

    @Test func disconnectAndReconnectKeepTheCursor() async throws {
        let server = try await InProcessServer.start(file: ConfigurationFile(subscribeTimeoutSeconds: 5))
        let (client, observed, _) = try makeObservedClient(origin: server.origin)
        var events = observed.events.makeAsyncIterator()
        var statuses = client.statuses().makeAsyncIterator()
        let channel = unique()
        var messages = client.subscribe(to: [channel])[0].messages.makeAsyncIterator()
        #expect(await statuses.next()?.category == .connected)
        let held = try #require(await events.nextLongPollSent())
        client.disconnect()
        #expect(await events.outcome(of: held)?.isFailure == true)
        #expect(await statuses.next()?.category == .disconnected)
        let cursor = try #require(client.currentTimetoken)
        _ = try await client.publish(channel: channel, message: "missed?")
        client.subscribe(to: [channel])          // seed 000: does not reconnect
        client.reconnect()
        let resumed = try #require(await events.nextLongPollSent())
        #expect(resumed.url.contains("tt=\(cursor)"))
        #expect(await messages.next()?.payload == "missed?")
        #expect(await statuses.next()?.category == .reconnected)
        await client.shutdown()
        await server.stop()
    }

    /// A scripted network monitor: network down stops retries, network up reconnects at once.
    @Test func networkDownAndUpFromAMonitor() async throws {
        let server = try await InProcessServer.start(file: ConfigurationFile(subscribeTimeoutSeconds: 5))
        let monitor = ScriptedNetworkMonitor()
        let (client, _, _) = try makeObservedClient(origin: server.origin, monitor: monitor)
        var statuses = client.statuses().makeAsyncIterator()
        let channel = unique()
        var messages = client.subscribe(to: [channel])[0].messages.makeAsyncIterator()
        #expect(await statuses.next()?.category == .connected)
        monitor.send(.down)
        #expect(await statuses.next()?.category == .networkDown)
        #expect(client.connectionState == .waitingForNetwork)
        let publisher = try makeClient(origin: server.origin)
        _ = try await publisher.publish(channel: channel, message: "offline")
        monitor.send(.up)
        #expect(await statuses.next()?.category == .networkUp)
        #expect(await statuses.next()?.category == .reconnected)
        #expect(await messages.next()?.payload == "offline")
        await publisher.shutdown()
        await client.shutdown()
        await server.stop()
    }

    @Test func deadLinkIsNoticedByTheLivenessProbe() async throws {
        // The long-poll hangs forever and Time fails: a dead link noticed at the first probe.
        let broken = Mutex(false)
        let scripted = try await ScriptedServer.start { request in
            if request.path.hasPrefix("/v2/subscribe") {
                if request.query["tt"] == "0" { return .json(#"{"t":{"t":"100","r":1},"m":[]}"#) }
                return .hang
            }
            return broken.withLock { $0 } ? .close : .json("[100]")
        }
        let (client, observed, clock) = try makeObservedClient(origin: scripted.origin) {
            $0.deadLinkDetection = DeadLinkDetection(probeInterval: .seconds(25), probeTimeout: .seconds(10))
        }
        var events = observed.events.makeAsyncIterator()
        var statuses = client.statuses().makeAsyncIterator()
        client.subscribe(to: ["a"])
        #expect(await statuses.next()?.category == .connected)
        _ = await events.nextLongPollSent()
        broken.withLock { $0 = true }
        await clock.advanceToSleeper(after: .seconds(25))
        #expect(await statuses.next()?.category == .unexpectedDisconnect)
        #expect(clock.now.offset <= .seconds(35))
        await client.shutdown()
        try await scripted.stop()
    }
}

/// A ``NetworkMonitor`` the test drives.
final class ScriptedNetworkMonitor: NetworkMonitor {
    private let stream: AsyncStream<NetworkPathStatus>
    private let continuation: AsyncStream<NetworkPathStatus>.Continuation

    init() { (stream, continuation) = AsyncStream.makeStream(of: NetworkPathStatus.self) }
    func send(_ status: NetworkPathStatus) { continuation.yield(status) }
    func pathUpdates() -> AsyncStream<NetworkPathStatus> { stream }
}
