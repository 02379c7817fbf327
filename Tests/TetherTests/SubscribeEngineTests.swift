import Clocks
import Foundation
import Logging
import Synchronization
import Testing
@testable import Tether
import TetherServer
import TetherTesting
import TetherTestingServer

/// Collects everything a client reports, in order.
final class Recorder: Sendable {
    let statuses = Mutex<[Status]>([])
    let changes = Mutex<[ConnectionChange]>([])
    let events = Mutex<[ReceivedEvent]>([])
    let outcomes = Mutex<[ChannelContinuity]>([])

    init(_ client: TetherClient) {
        client.addStatusListener { [self] status in self.statuses.withLock { $0.append(status) } }
        client.addConnectionListener { [self] change in self.changes.withLock { $0.append(change) } }
        client.addContinuityListener { [self] outcome in self.outcomes.withLock { $0.append(outcome) } }
    }

    func listen(_ subscription: Subscription) {
        subscription.onEvent { [self] event in self.events.withLock { $0.append(event) } }
    }

    var categories: [StatusCategory] { statuses.withLock { $0.map(\.category) } }
    var payloads: [JSONValue] { events.withLock { $0.map(\.payload) } }
}

/// A Tether server that can be stopped and started again on the same port and data directory.
final class RestartableServer: Sendable {
    let directory: String
    let file: ConfigurationFile
    private let state = Mutex<(port: Int, task: Task<Void, any Error>?)>((0, nil))

    init(file: ConfigurationFile = ConfigurationFile(subscribeTimeoutSeconds: 5)) {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-engine-\(UUID().uuidString)").path
        self.file = file
    }

    var origin: String { "127.0.0.1:\(state.withLock { $0.port })" }

    func start() async throws {
        var logger = Logger(label: "tether.test.server")
        logger.logLevel = .critical
        let port = state.withLock { $0.port }
        let server = try TetherServer(configuration: ServerConfiguration(host: "127.0.0.1", port: port, dataDirectory: directory, file: file),
                                      logger: logger)
        let (urls, continuation) = AsyncStream.makeStream(of: String.self)
        let task = Task {
            defer { continuation.finish() }
            try await server.run(handleSignals: false) { url in continuation.yield(url) }
        }
        var iterator = urls.makeAsyncIterator()
        guard let url = await iterator.next(), let bound = Int(url.split(separator: ":").last ?? "") else {
            throw InProcessServerError.didNotStart
        }
        state.withLock { $0 = (bound, task) }
    }

    func stop() async {
        let task = state.withLock { $0.task }
        task?.cancel()
        _ = await task?.result
    }

    func remove() { try? FileManager.default.removeItem(atPath: directory) }
}

func makeEngineClient(origin: String, clock: TestClock<Duration>, monitor: (any NetworkMonitor)? = nil,
                      configure: (inout TetherConfiguration) -> Void = { _ in }) throws -> TetherClient {
    var logger = Logger(label: "tether.test.engine")
    logger.logLevel = .warning
    var configuration = try TetherConfiguration(subscribeKey: "demo", publishKey: "demo", userId: "engine-\(UUID().uuidString.prefix(6))",
                                                origin: origin, useTLS: false, logger: logger)
    configuration.nonSubscribeTimeout = .seconds(10)
    configuration.deadLinkDetection = nil
    configuration.retry = RetryConfiguration(jitter: .zero ... .zero)
    configure(&configuration)
    return TetherClient(configuration: configuration, transport: try HTTPClientTransport(connectTimeout: .seconds(5), logger: logger),
                        clock: clock, networkMonitor: monitor)
}

/// Advances the test clock step by step until `condition` holds (timers registered late still fire).
func advance(_ clock: TestClock<Duration>, by step: Duration = .seconds(1), within seconds: Double = 20,
             until condition: () -> Bool) async -> Bool {
    await eventually(within: seconds) {
        if condition() { return true }
        await clock.advance(by: step)
        return condition()
    }
}

@Suite("Subscribe engine against the real server", .serialized)
struct SubscribeEngineTests {
    @Test func receivesInOrderAndAnnouncesConnected() async throws {
        let server = try await InProcessServer.start(file: ConfigurationFile(subscribeTimeoutSeconds: 5))
        let clock = TestClock()
        let client = try makeEngineClient(origin: server.origin, clock: clock)
        let recorder = Recorder(client)
        let channel = unique()
        let subscription = client.subscribe(to: [channel])[0]
        recorder.listen(subscription)
        #expect(await eventually { recorder.categories == [.connected] })
        let connected = try #require(recorder.statuses.withLock { $0.first })
        #expect(connected.affectedChannels == [channel] && connected.subscribedChannels == [channel])
        #expect(connected.lastTimetoken == .zero && connected.currentTimetoken != nil)
        #expect(client.connectionState == .connected)
        for index in 0..<5 { _ = try await client.publish(channel: channel, message: .string("m\(index)")) }
        #expect(await eventually { recorder.payloads.count == 5 })
        #expect(recorder.payloads == (0..<5).map { .string("m\($0)") })

        // The messages stream carries the same events.
        var iterator = subscription.messages.makeAsyncIterator()
        #expect(await iterator.next()?.payload == .string("m0"))
        await client.shutdown()
        await server.stop()
    }

    @Test func channelChangesDuringALongPoll() async throws {
        let server = try await InProcessServer.start(file: ConfigurationFile(subscribeTimeoutSeconds: 30))
        let clock = TestClock()
        let client = try makeEngineClient(origin: server.origin, clock: clock)
        let recorder = Recorder(client)
        let (a, b) = (unique("a"), unique("b"))
        recorder.listen(client.subscribe(to: [a])[0])
        #expect(await eventually { recorder.categories == [.connected] })
        try await Task.sleep(for: .milliseconds(100))   // the long-poll is waiting (30 s server timeout)
        recorder.listen(client.subscribe(to: [b])[0])
        #expect(await eventually { recorder.categories == [.connected, .subscriptionChanged] })
        _ = try await client.publish(channel: b, message: "on b")
        _ = try await client.publish(channel: a, message: "on a")
        #expect(await eventually(within: 5) { recorder.payloads == ["on b", "on a"] })
        client.unsubscribe(from: [a])
        _ = try await client.publish(channel: a, message: "gone")
        _ = try await client.publish(channel: b, message: "still")
        #expect(await eventually(within: 5) { recorder.payloads == ["on b", "on a", "still"] })
        client.unsubscribeAll()
        #expect(await eventually { recorder.categories == [.connected, .subscriptionChanged, .subscriptionChanged, .disconnected] })
        #expect(client.connectionState == .idle)
        await client.shutdown()
        await server.stop()
    }

    /// Server restart mid-stream, 1,000 messages published while the client is away: every one is
    /// received once, in order, and the continuity outcome says so.
    @Test func serverRestartAndAThousandMessagesDuringTheOutage() async throws {
        // 1,000 publishes at once from one uuid: more than the default rate limits allow.
        let server = RestartableServer(file: ConfigurationFile(subscribeTimeoutSeconds: 5, rateLimiting: false))
        try await server.start()
        let clock = TestClock()
        let client = try makeEngineClient(origin: server.origin, clock: clock)
        let recorder = Recorder(client)
        let channel = unique()
        recorder.listen(client.subscribe(to: [channel])[0])
        #expect(await eventually { recorder.categories == [.connected] })
        _ = try await client.publish(channel: channel, message: "before")
        #expect(await eventually { recorder.payloads == ["before"] })

        await server.stop()
        #expect(await eventually { recorder.categories == [.connected, .unexpectedDisconnect] })
        #expect(recorder.statuses.withLock { $0.last?.willAutomaticallyRetry } == true)
        #expect(client.connectionState == .reconnecting(attempt: 1))
        try await server.start()
        let publisher = try makeClient(origin: server.origin)
        for index in 0..<1000 { _ = try await publisher.publish(channel: channel, message: .string("m\(index)")) }

        #expect(await advance(clock) { recorder.categories.count >= 3 })
        #expect(await eventually(within: 20) { recorder.payloads.count == 1001 })
        #expect(recorder.payloads == ["before"] + (0..<1000).map { .string("m\($0)") })
        let timetokens = recorder.events.withLock { $0.map(\.timetoken) }
        #expect(timetokens == timetokens.sorted() && Set(timetokens).count == timetokens.count)
        #expect(await eventually { recorder.outcomes.withLock { $0.count } == 1 })
        #expect(recorder.outcomes.withLock { $0.first?.outcome } == .recovered(count: 1000))
        #expect(recorder.categories == [.connected, .unexpectedDisconnect, .reconnected, .requestMessageCountExceeded])
        #expect(recorder.changes.withLock { $0.compactMap(\.reconnectEvent) } == [.started, .succeeded])
        await publisher.shutdown()
        await client.shutdown()
        await server.stop()
        server.remove()
    }

    /// Unreachable for longer than the policy allows: gives up, probes Time every 10 s, restores.
    @Test func unreachableForAWhileThenRestoredByTimeProbes() async throws {
        let server = RestartableServer()
        try await server.start()
        let clock = TestClock()
        let client = try makeEngineClient(origin: server.origin, clock: clock) {
            $0.retry = RetryConfiguration(policy: .linear(delay: .seconds(2), maximumRetries: 2), jitter: .zero ... .zero)
        }
        let recorder = Recorder(client)
        let channel = unique()
        recorder.listen(client.subscribe(to: [channel])[0])
        #expect(await eventually { recorder.categories == [.connected] })
        await server.stop()
        #expect(await advance(clock) { recorder.categories.count == 3 })
        #expect(recorder.categories == [.connected, .unexpectedDisconnect, .disconnectedUnexpectedly])
        #expect(client.connectionState == .failed(.disconnectedUnexpectedly))
        // Probes keep failing while the server is away.
        for _ in 0..<3 { await clock.advance(by: .seconds(10)); try await Task.sleep(for: .milliseconds(50)) }
        #expect(recorder.categories.count == 3)
        try await server.start()
        let publisher = try makeClient(origin: server.origin)
        _ = try await publisher.publish(channel: channel, message: "while away")
        #expect(await advance(clock, by: .seconds(10)) { recorder.categories.count == 4 })
        #expect(recorder.categories == [.connected, .unexpectedDisconnect, .disconnectedUnexpectedly, .reconnected])
        #expect(await eventually { recorder.payloads == ["while away"] })
        #expect(recorder.changes.withLock { $0.compactMap(\.reconnectEvent) } == [.started, .failed, .succeeded])
        await publisher.shutdown()
        await client.shutdown()
        await server.stop()
        server.remove()
    }

    @Test func disconnectAndReconnectKeepTheCursor() async throws {
        let server = try await InProcessServer.start(file: ConfigurationFile(subscribeTimeoutSeconds: 5))
        let clock = TestClock()
        let client = try makeEngineClient(origin: server.origin, clock: clock)
        let recorder = Recorder(client)
        let channel = unique()
        recorder.listen(client.subscribe(to: [channel])[0])
        #expect(await eventually { recorder.categories == [.connected] })
        client.disconnect()
        #expect(await eventually { recorder.categories == [.connected, .disconnected] })
        _ = try await client.publish(channel: channel, message: "missed?")
        client.subscribe(to: [channel])          // seed 000: does not reconnect
        try await Task.sleep(for: .milliseconds(200))
        #expect(recorder.payloads.isEmpty)
        client.reconnect()
        #expect(await eventually { recorder.payloads == ["missed?"] })
        #expect(recorder.categories == [.connected, .disconnected, .reconnected])
        await client.shutdown()
        await server.stop()
    }

    /// A scripted network monitor: network down stops retries, network up reconnects at once.
    @Test func networkDownAndUpFromAMonitor() async throws {
        let server = RestartableServer()
        try await server.start()
        let clock = TestClock()
        let monitor = ScriptedNetworkMonitor()
        let client = try makeEngineClient(origin: server.origin, clock: clock, monitor: monitor)
        let recorder = Recorder(client)
        let channel = unique()
        recorder.listen(client.subscribe(to: [channel])[0])
        #expect(await eventually { recorder.categories == [.connected] })
        monitor.send(.down)
        #expect(await eventually { recorder.categories == [.connected, .networkDown] })
        #expect(client.connectionState == .waitingForNetwork)
        let publisher = try makeClient(origin: server.origin)
        _ = try await publisher.publish(channel: channel, message: "offline")
        monitor.send(.up)
        #expect(await eventually { recorder.categories == [.connected, .networkDown, .networkUp, .reconnected] })
        #expect(await eventually { recorder.payloads == ["offline"] })
        await publisher.shutdown()
        await client.shutdown()
        await server.stop()
        server.remove()
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
        let clock = TestClock()
        let client = try makeEngineClient(origin: scripted.origin, clock: clock) {
            $0.deadLinkDetection = DeadLinkDetection(probeInterval: .seconds(25), probeTimeout: .seconds(10))
        }
        let recorder = Recorder(client)
        client.subscribe(to: ["a"])
        #expect(await eventually { recorder.categories == [.connected] })
        let start = clock.now
        broken.withLock { $0 = true }
        #expect(await advance(clock, by: .seconds(5)) { recorder.categories.count >= 2 })
        #expect(recorder.categories.prefix(2) == [.connected, .unexpectedDisconnect])
        #expect(start.duration(to: clock.now) <= .seconds(35))
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
