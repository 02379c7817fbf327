import AsyncHTTPClient
import Clocks
import Foundation
import NIOCore
import NIOPosix
import Synchronization
import Testing
import Tether
import TetherTesting
import TetherTestingServer

/// The fault proxy, observed from the client side over real loopback sockets. Socket-level
/// behaviour (latency, bandwidth, blackhole) runs in real time and is kept to a few hundred
/// milliseconds per test; schedules run on a `TestClock`.
@Suite("Fault proxy", .timeLimit(.minutes(1)))
struct FaultProxyTests {
    // MARK: Forwarding and connection faults

    @Test func passForwardsToATetherServerAndCounts() async throws {
        try await withServerAndProxy { _, proxy in
            let response = try await get(proxy.origin, "/time/0")
            #expect(response.status == 200)
            #expect(response.body.hasPrefix("[1"))
            let counters = proxy.counters
            #expect(counters.accepted >= 1)
            #expect(counters.forwarded >= 1)
            #expect(counters.bytesToUpstream > 0)
            #expect(counters.bytesToClient >= response.byteCount)
        }
    }

    @Test func refuseStopsListeningAndPassListensAgainOnTheSamePort() async throws {
        try await withServerAndProxy { _, proxy in
            try await proxy.apply(.refuse)
            let error = await #expect(throws: (any Error).self) { try await RawConnection.open(port: proxy.port) }
            #expect("\(String(describing: error))".lowercased().contains("refused"))
            try await proxy.apply(.pass)
            #expect(try await get(proxy.origin, "/time/0").status == 200)
        }
    }

    @Test func resetResetsOpenConnectionsAndNewOnes() async throws {
        let echo = try await EchoServer.start()
        let proxy = try await FaultProxy.start(upstream: echo.origin)
        let open = try await RawConnection.open(port: proxy.port)
        try await open.send(Array("hello".utf8))
        #expect(try await open.receive(atLeast: 5) == Array("hello".utf8))
        try await proxy.apply(.reset)
        let ended = try await open.waitUntilClosed()
        #expect(ended.contains("reset") || ended.contains("ECONNRESET") || ended.contains("104"), "\(ended)")
        // A new connection is accepted, then reset (the RST may even beat the connect's completion).
        do {
            let fresh = try await RawConnection.open(port: proxy.port)
            let freshEnd = try await fresh.waitUntilClosed()
            #expect(freshEnd != "eof", "a reset, not a clean close: \(freshEnd)")
        } catch {
            #expect("\(error)".contains("reset"), "\(error)")
        }
        #expect(proxy.counters.reset >= 2)
        await proxy.stop()
        await echo.stop()
    }

    @Test func blackholeHoldsARequestUntilPass() async throws {
        try await withServerAndProxy { _, proxy in
            try await proxy.apply(.blackhole)
            let request = Task { try await get(proxy.origin, "/time/0") }
            // Connected first (awaited, not assumed: on a loaded machine the connect alone can
            // take longer than the window below).
            #expect(await eventually { proxy.counters.open == 1 }, "the client never connected")
            // The observation window of a socket-level fault: nothing may reach the upstream
            // within it. Real time is the thing under test here (see the suite's note).
            try await Task.sleep(for: .milliseconds(400))
            #expect(proxy.counters.bytesToUpstream == 0)
            #expect(proxy.counters.open == 1, "the socket stays open")
            try await proxy.apply(.pass)
            let response = try await request.value
            #expect(response.status == 200)
        }
    }

    @Test func latencyIsAddedInEachDirection() async throws {
        let echo = try await EchoServer.start()
        let proxy = try await FaultProxy.start(upstream: echo.origin)
        let connection = try await RawConnection.open(port: proxy.port)
        _ = try await roundTrip(connection, bytes: 10)
        try await proxy.apply(.latency(base: .milliseconds(100), jitter: .milliseconds(20)))
        let delayed = try await roundTrip(connection, bytes: 10)
        // 2 × (100 ± 20) ms: at least 160 ms whatever the jitter or the machine's load. Only the
        // lower bound is asserted — wall-clock comparisons flake on a shared machine.
        #expect(delayed >= .milliseconds(160), "\(delayed)")
        await connection.close()
        await proxy.stop()
        await echo.stop()
    }

    @Test func bandwidthCapSlowsATransfer() async throws {
        let echo = try await EchoServer.start()
        let proxy = try await FaultProxy.start(upstream: echo.origin)
        let connection = try await RawConnection.open(port: proxy.port)
        _ = try await roundTrip(connection, bytes: 20_000)  // warm the connection up
        try await proxy.apply(.bandwidth(bytesPerSecond: 40_000))
        let capped = try await roundTrip(connection, bytes: 20_000)
        // 20 kB at 40 kB/s is ≥ 0.45 s in each direction (they overlap): a lower bound by construction.
        #expect(capped >= .milliseconds(400), "\(capped)")
        await connection.close()
        await proxy.stop()
        await echo.stop()
    }

    @Test func dropMidResponseDeliversExactlyTheBudgetThenEndOfStream() async throws {
        let echo = try await EchoServer.start()
        let proxy = try await FaultProxy.start(upstream: echo.origin, fault: .dropMidResponse(afterBytes: 100))
        let connection = try await RawConnection.open(port: proxy.port)
        try await connection.send(Array(repeating: 7, count: 1000))
        let ended = try await connection.waitUntilClosed()
        #expect(ended == "eof")
        #expect(connection.received.count == 100)
        #expect(proxy.counters.dropped == 1)
        await proxy.stop()
        await echo.stop()
    }

    // MARK: Answering faults

    @Test func captivePortalAnswersWithHTML() async throws {
        try await withServerAndProxy { _, proxy in
            try await proxy.apply(.captivePortal)
            let response = try await get(proxy.origin, "/time/0")
            #expect(response.status == 200)
            #expect(response.contentType?.hasPrefix("text/html") == true)
            #expect(response.body.contains("<html>"))
            #expect(proxy.counters.answered == 1)
            #expect(proxy.counters.bytesToUpstream == 0)
        }
    }

    @Test func overloadedAnswers429WithRetryAfterAndTheSDKReportsIt() async throws {
        try await withServerAndProxy { _, proxy in
            try await proxy.apply(.overloaded(retryAfterSeconds: 7))
            let response = try await get(proxy.origin, "/time/0")
            #expect(response.status == 429)
            #expect(response.contentType == "application/json")
            #expect(response.body.contains("\"status\":429"))
            #expect(proxy.counters.bytesToUpstream == 0)
            // The SDK turns it into a status carrying the server's Retry-After.
            let configuration = try TetherConfiguration(subscribeKey: "demo", publishKey: "demo", userId: "overloaded",
                                                        origin: proxy.origin, useTLS: false)
            let client = try TetherClient(configuration: configuration)
            do {
                _ = try await client.time()
                Issue.record("expected a 429")
            } catch let error as TetherError {
                #expect(error.status.statusCode == 429)
                #expect(error.status.retryAfter == .seconds(7))
                #expect(error.status.category == .unknown)
            } catch {
                Issue.record("unexpected \(error)")
            }
            try await proxy.apply(.pass)
            #expect(try await client.time().rawValue > 0)
            await client.shutdown()
        }
    }

    @Test func resetOpenConnectionsResetsWhatIsOpenAndNothingElse() async throws {
        let echo = try await EchoServer.start()
        let proxy = try await FaultProxy.start(upstream: echo.origin)
        let open = try await RawConnection.open(port: proxy.port)
        try await open.send(Array("hello".utf8))
        #expect(try await open.receive(atLeast: 5) == Array("hello".utf8))
        await proxy.resetOpenConnections()
        let ended = try await open.waitUntilClosed()
        #expect(ended != "eof", "a reset, not a clean close: \(ended)")
        #expect(proxy.fault == .pass)
        let fresh = try await RawConnection.open(port: proxy.port)     // new connections work at once
        try await fresh.send(Array("again".utf8))
        #expect(try await fresh.receive(atLeast: 5) == Array("again".utf8))
        await fresh.close()
        await proxy.stop()
        await echo.stop()
    }

    @Test func truncatedJSONIsWellFramedButNotJSON() async throws {
        try await withServerAndProxy { _, proxy in
            try await proxy.apply(.truncatedJSON)
            let response = try await get(proxy.origin, "/time/0")
            #expect(response.status == 200)
            #expect(response.contentType == "application/json")
            #expect(response.body.hasPrefix("{\"t\":"))
            #expect((try? JSONSerialization.jsonObject(with: Data(response.body.utf8))) == nil)
        }
    }

    @Test func failTLSHandshakeFailsHTTPSButPassesPlainHTTP() async throws {
        try await withServerAndProxy { _, proxy in
            try await proxy.apply(.failTLSHandshake)
            let http = HTTPClient(eventLoopGroupProvider: .singleton)
            await #expect(throws: (any Error).self) {
                _ = try await http.execute(HTTPClientRequest(url: "https://\(proxy.origin)/time/0"), timeout: .seconds(1))
            }
            try await http.shutdown()
            #expect(proxy.counters.answered >= 1, "AsyncHTTPClient retries the handshake until the deadline")
            #expect(try await get(proxy.origin, "/time/0").status == 200)
        }
    }

    // MARK: Scripting

    @Test func scheduleRunsOnTheInjectedClock() async throws {
        let echo = try await EchoServer.start()
        let clock = TestClock()
        let proxy = try await FaultProxy.start(upstream: echo.origin, clock: clock)
        let schedule = proxy.schedule([
            FaultStep(after: .seconds(2), fault: .blackhole, lasting: .seconds(30)),
            FaultStep(after: .seconds(5), fault: .latency(base: .milliseconds(50))),
        ])
        await clock.advance(by: .seconds(1))
        #expect(proxy.fault == .pass)
        await clock.advance(by: .seconds(1))
        #expect(await finishes { await proxy.waitUntilFault(.blackhole) })
        await clock.advance(by: .seconds(30))
        #expect(await finishes { await proxy.waitUntilFault(.pass) })
        await clock.advance(by: .seconds(5))
        await schedule.finished()
        #expect(proxy.fault == .latency(base: .milliseconds(50)))
        // `apply` cancels a running schedule.
        let second = proxy.schedule([FaultStep(after: .seconds(1), fault: .refuse)])
        try await proxy.apply(.pass)
        #expect(second.isCancelled)
        await clock.advance(by: .seconds(2))
        await second.finished()
        #expect(proxy.fault == .pass)
        await proxy.stop()
        await echo.stop()
    }

    @Test func commandsParseAndPrintBack() throws {
        let step = try FaultStep(parsing: "blackhole after 5s for 30s")
        #expect(step == FaultStep(after: .seconds(5), fault: .blackhole, lasting: .seconds(30)))
        #expect(try FaultStep(parsing: "blackhole 30s") == FaultStep(fault: .blackhole, lasting: .seconds(30)))
        #expect(try FaultProxy.Fault(parsing: "latency 200ms 50ms") == .latency(base: .milliseconds(200), jitter: .milliseconds(50)))
        #expect(try FaultProxy.Fault(parsing: "bandwidth 20k") == .bandwidth(bytesPerSecond: 20_000))
        #expect(try FaultProxy.Fault(parsing: "drop 512") == .dropMidResponse(afterBytes: 512))
        #expect(try FaultProxy.Fault(parsing: "captive-portal") == .captivePortal)
        #expect(try FaultProxy.Fault(parsing: "overloaded") == .overloaded(retryAfterSeconds: 5))
        #expect(try FaultStep(parsing: "overloaded 7 20s") == FaultStep(fault: .overloaded(retryAfterSeconds: 7), lasting: .seconds(20)))
        let all: [FaultProxy.Fault] = [.pass, .refuse, .reset, .blackhole, .latency(base: .milliseconds(1500), jitter: .zero),
                                       .bandwidth(bytesPerSecond: 10), .dropMidResponse(afterBytes: 3), .captivePortal,
                                       .truncatedJSON, .overloaded(retryAfterSeconds: 9), .failTLSHandshake]
        for fault in all { #expect(try FaultProxy.Fault(parsing: fault.description) == fault) }
        let schedule = try FaultStep.parseSchedule("reset; captive-portal for 20s\n# comment\npass after 1m")
        #expect(schedule.map(\.description) == ["reset", "captive-portal for 20s", "pass after 60s"])
        #expect(throws: FaultProxyError.self) { try FaultStep(parsing: "teleport") }
        #expect(throws: FaultProxyError.self) { try FaultStep(parsing: "latency") }
        #expect(throws: FaultProxyError.self) { try FaultStep(parsing: "blackhole for soon") }
    }

    @Test func httpControlEndpointChangesTheFault() async throws {
        let echo = try await EchoServer.start()
        let proxy = try await FaultProxy.start(upstream: echo.origin)
        let controlServer = try await FaultProxyControlServer.start(proxy: proxy)
        let control = "127.0.0.1:\(controlServer.port)"
        let answer = try await get(control, "/", method: "POST", body: "blackhole")
        #expect(answer.status == 200)
        #expect(answer.body == "ok: blackhole\n")
        #expect(proxy.fault == .blackhole)
        #expect(try await get(control, "/fault", method: "POST", body: "warp 9").status == 400)
        let status = try await get(control, "/")
        #expect(status.body.contains("\"fault\":\"blackhole\""))
        #expect(status.contentType == "application/json")
        await controlServer.stop()
        await proxy.stop()
        await echo.stop()
    }
}

// MARK: - Helpers

private struct Fetched {
    var status: Int
    var contentType: String?
    var body: String
    var byteCount: Int
}

/// One HTTP/1.1 exchange on a new connection (`Connection: close`), read until the server closes.
private func get(_ origin: String, _ path: String, method: String = "GET", body: String = "") async throws -> Fetched {
    let port = Int(origin.split(separator: ":").last ?? "") ?? 0
    let connection = try await RawConnection.open(port: port)
    try await connection.send(Array("""
        \(method) \(path) HTTP/1.1\r
        Host: \(origin)\r
        Content-Length: \(body.utf8.count)\r
        Connection: close\r
        \r
        \(body)
        """.utf8))
    _ = try await connection.waitUntilClosed()
    let text = String(decoding: connection.received, as: UTF8.self)
    guard let split = text.range(of: "\r\n\r\n") else { throw FaultProxyError("no HTTP response: \(text)") }
    let head = text[..<split.lowerBound].components(separatedBy: "\r\n")
    let status = Int(head.first?.split(separator: " ").dropFirst().first ?? "") ?? 0
    var contentType: String?
    for line in head.dropFirst() {
        let parts = line.split(separator: ":", maxSplits: 1)
        if parts.count == 2, parts[0].lowercased() == "content-type" { contentType = parts[1].trimmingCharacters(in: .whitespaces) }
    }
    let responseBody = String(text[split.upperBound...])
    return Fetched(status: status, contentType: contentType, body: responseBody, byteCount: connection.received.count)
}

/// A Tether server and a proxy in front of it.
private func withServerAndProxy(_ body: (InProcessServer, FaultProxy) async throws -> Void) async throws {
    let server = try await InProcessServer.start()
    let proxy = try await FaultProxy.start(upstream: server.origin)
    do {
        try await body(server, proxy)
    } catch {
        await proxy.stop()
        await server.stop()
        throw error
    }
    await proxy.stop()
    await server.stop()
}

/// Sends `bytes` bytes on an echo connection and waits for all of them back.
private func roundTrip(_ connection: RawConnection, bytes: Int) async throws -> Duration {
    let clock = ContinuousClock()
    let before = connection.received.count
    let start = clock.now
    try await connection.send(Array(repeating: 42, count: bytes))
    _ = try await connection.receive(atLeast: before + bytes)
    return clock.now - start
}

/// An echo server on loopback.
private final class EchoServer: Sendable {
    let channel: any Channel
    var origin: String { "127.0.0.1:\(channel.localAddress?.port ?? 0)" }

    init(channel: any Channel) { self.channel = channel }

    static func start() async throws -> EchoServer {
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(Echo()) }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        return EchoServer(channel: channel)
    }

    func stop() async { try? await channel.close() }

    private final class Echo: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            context.writeAndFlush(data, promise: nil)
        }
        func errorCaught(context: ChannelHandlerContext, error: any Error) { context.close(promise: nil) }
    }
}

/// A raw TCP client recording what it receives and how the connection ended.
private final class RawConnection: Sendable {
    private struct State {
        var received: [UInt8] = []
        var ended: String?
        /// Tasks awaiting a count of bytes or the end, checked on each arrival.
        var arrivals = ConditionWatchers<(received: Int, ended: Bool)>()

        var progress: (received: Int, ended: Bool) { (received.count, ended != nil) }
    }

    private let state: Mutex<State>
    let channel: any Channel

    private init(channel: any Channel) {
        self.channel = channel
        self.state = Mutex(State())
    }

    var received: [UInt8] { state.withLock { $0.received } }

    static func open(port: Int) async throws -> RawConnection {
        let recorder = Recorder()
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(recorder) }
            }
            .connect(host: "127.0.0.1", port: port).get()
        let connection = RawConnection(channel: channel)
        recorder.attach(connection)
        return connection
    }

    func send(_ bytes: [UInt8]) async throws {
        try await channel.writeAndFlush(channel.allocator.buffer(bytes: bytes))
    }

    /// Waits until at least `count` bytes have arrived in total; returns them all.
    func receive(atLeast count: Int, within seconds: Double = 5) async throws -> [UInt8] {
        let ok = await finishes(within: seconds) { await self.waitUntil { $0.received >= count } }
        try #require(ok, "received \(received.count) of \(count) bytes")
        return received
    }

    /// Waits until the connection ends: `"eof"` for a clean close, otherwise the error.
    func waitUntilClosed(within seconds: Double = 5) async throws -> String {
        let ok = await finishes(within: seconds) { await self.waitUntil { $0.ended } }
        try #require(ok, "the connection did not end")
        return state.withLock { $0.ended } ?? ""
    }

    func close() async { try? await channel.close() }

    /// Returns once what has arrived meets `condition` (at once if it does), or when the calling
    /// task is cancelled: each arrival re-checks it.
    private func waitUntil(_ condition: @escaping @Sendable ((received: Int, ended: Bool)) -> Bool) async {
        await ConditionWatchers.wait(until: condition) { body in
            state.withLock { state in
                let progress = state.progress
                return body(&state.arrivals, progress)
            }
        }
    }

    fileprivate func record(_ bytes: ByteBuffer) {
        let met = state.withLock { state in
            state.received.append(contentsOf: bytes.readableBytesView)
            let progress = state.progress
            return state.arrivals.satisfied(by: progress)
        }
        for waiter in met { waiter.resume() }
    }

    fileprivate func end(_ how: String) {
        let met = state.withLock { state in
            if state.ended == nil { state.ended = how }
            let progress = state.progress
            return state.arrivals.satisfied(by: progress)
        }
        for waiter in met { waiter.resume() }
    }

    private final class Recorder: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        private let connection = Mutex<RawConnection?>(nil)
        private let pending = Mutex<(data: [ByteBuffer], ended: String?)>(([], nil))

        func attach(_ connection: RawConnection) {
            let (data, ended) = self.connection.withLock { slot in
                slot = connection
                return pending.withLock { ($0.data, $0.ended) }
            }
            for buffer in data { connection.record(buffer) }
            if let ended { connection.end(ended) }
        }

        private func deliver(_ buffer: ByteBuffer? = nil, ended: String? = nil) {
            connection.withLock { slot in
                if let target = slot {
                    if let buffer { target.record(buffer) }
                    if let ended { target.end(ended) }
                } else {
                    pending.withLock { pending in
                        if let buffer { pending.data.append(buffer) }
                        if let ended, pending.ended == nil { pending.ended = ended }
                    }
                }
            }
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) { deliver(unwrapInboundIn(data)) }
        func channelInactive(context: ChannelHandlerContext) { deliver(ended: "eof") }
        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            deliver(ended: "\(error)")
            context.close(promise: nil)
        }
    }
}
