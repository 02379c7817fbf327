import Foundation
import HTTPTypes
import HummingbirdWSClient
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import NIOWebSocket
import Synchronization
import TetherProtocol

/// A scripted client of the WebSocket session protocol over a real socket (HummingbirdWSClient):
/// frames to send go in, frames received come out as parsed JSON objects, and the close code the
/// server sent is kept.
final class WebSocketTestClient: Sendable {
    enum Command: Sendable {
        case send(String)
        case sendBinary
        /// Ends the socket without a `bye` (the client closes with 1001, as an app going away).
        case drop
    }

    enum Event: Sendable {
        case frame([String: JSONValue])
        case closed(code: Int?)
    }

    private let commands: AsyncStream<Command>.Continuation
    /// Events received and not yet taken (a buffer, so a timed-out wait loses nothing).
    private let inbox = EventBuffer()
    private let task: Task<Void, Never>
    /// Holds the reader before each message while paused (``pauseReading()``).
    private let gate = ReadGate()

    /// Connects to `server`'s `/v2/ws`. `reads: false` makes a client that never reads (a slow
    /// consumer).
    init(baseURL: String, reads: Bool = true, maxFrameSize: Int = 1 << 20, subprotocol: String? = WebSocketProtocol.jsonSubprotocol,
         tls: TLSConfiguration? = nil) {
        let (commands, commandContinuation) = AsyncStream.makeStream(of: Command.self)
        self.commands = commandContinuation
        let inbox = self.inbox
        let gate = self.gate
        let eventContinuation = Inbox(push: { event in inbox.events.withLock { $0.append(event) } })
        let url = baseURL.replacingOccurrences(of: "https://", with: "wss://").replacingOccurrences(of: "http://", with: "ws://")
            + WebSocketProtocol.path
        var headers: HTTPFields = [:]
        if let subprotocol { headers[.secWebSocketProtocol] = subprotocol }
        var logger = Logger(label: "ws-test-client")
        logger.logLevel = .critical
        let configuration = WebSocketClientConfiguration(maxFrameSize: maxFrameSize, additionalHeaders: headers, autoPing: .disabled)
        task = Task {
            struct Dropped: Error {}
            let close = try? await WebSocketClient.connect(url: url, configuration: configuration, tlsConfiguration: tls,
                                                           logger: logger) { inbound, outbound, _ in
                try await withThrowingTaskGroup(of: Void.self) { group in
                    if reads {
                        group.addTask {
                            for try await message in inbound.messages(maxSize: 1 << 24) {
                                await gate.pass()
                                guard case .text(let text) = message, case .object(let object)? = try? JSONValue(parsing: text) else { continue }
                                eventContinuation.yield(.frame(object))
                            }
                        }
                    }
                    group.addTask {
                        for await command in commands {
                            switch command {
                            case .send(let text): try await outbound.write(.text(text))
                            case .sendBinary: try await outbound.write(.binary(ByteBuffer(bytes: [1, 2, 3])))
                            case .drop: throw Dropped()
                            }
                        }
                    }
                    try await group.next()
                    group.cancelAll()
                }
            }
            eventContinuation.yield(.closed(code: close.map { Self.code($0.closeCode) } ?? nil))
        }
    }

    static func code(_ code: WebSocketErrorCode) -> Int {
        switch code {
        case .normalClosure: 1000
        case .goingAway: 1001
        case .protocolError: 1002
        case .unacceptableData: 1003
        case .dataInconsistentWithMessage: 1007
        case .policyViolation: 1008
        case .messageTooLarge: 1009
        case .missingExtension: 1010
        case .unexpectedServerError: 1011
        case .unknown(let value): Int(value)
        }
    }

    /// Stops reading: what the server sends stays in the socket's buffers (a slow consumer from
    /// now on), until ``resumeReading()``.
    func pauseReading() { gate.pause() }
    /// Reads again, starting with what the socket kept meanwhile.
    func resumeReading() { gate.resume() }

    func send(_ text: String) { commands.yield(.send(text)) }
    func send(_ object: JSONValue) { commands.yield(.send(object.jsonText)) }
    func sendBinary() { commands.yield(.sendBinary) }
    func drop() { commands.yield(.drop) }

    /// The next event, within `seconds`.
    func next(within seconds: Double = 10) async -> Event? {
        let deadline = ContinuousClock.now + .milliseconds(Int(seconds * 1000))
        while true {
            let event = inbox.events.withLock { $0.isEmpty ? nil : $0.removeFirst() }
            if let event { return event }
            if ContinuousClock.now >= deadline { return nil }
            try? await Task.sleep(for: .milliseconds(5))
        }
    }

    /// The next frame (skipping server pings unless `pings`), or nil on close or timeout.
    func frame(within seconds: Double = 10, pings: Bool = false) async -> [String: JSONValue]? {
        while let event = await next(within: seconds) {
            guard case .frame(let frame) = event else { return nil }
            if !pings, frame["type"]?.stringValue == "ping" { continue }
            return frame
        }
        return nil
    }

    /// The next frame of `type`, skipping others (collected in `skipped`).
    func frame(ofType type: String, within seconds: Double = 10) async -> [String: JSONValue]? {
        while let event = await next(within: seconds) {
            guard case .frame(let frame) = event else { return nil }
            if frame["type"]?.stringValue == type { return frame }
        }
        return nil
    }

    /// Waits for the close; returns the close code (nil: none received, or timeout).
    func closeCode(within seconds: Double = 10) async -> Int? {
        while let event = await next(within: seconds) {
            if case .closed(let code) = event { return code }
        }
        return nil
    }

    /// Frames until the socket closes or `seconds` pass with nothing new.
    func drain(within seconds: Double = 1) async -> [[String: JSONValue]] {
        var frames: [[String: JSONValue]] = []
        while let event = await next(within: seconds), case .frame(let frame) = event { frames.append(frame) }
        return frames
    }

    func close() async {
        gate.resume()  // a paused reader would otherwise hold the connection's task
        commands.finish()
        task.cancel()
        _ = await task.value
    }
}


/// Pauses a reader between messages.
private final class ReadGate: Sendable {
    private let state = Mutex<(paused: Bool, waiting: [CheckedContinuation<Void, Never>])>((false, []))

    func pause() { state.withLock { $0.paused = true } }

    func resume() {
        let waiting = state.withLock { s in
            s.paused = false
            defer { s.waiting = [] }
            return s.waiting
        }
        for waiter in waiting { waiter.resume() }
    }

    /// Returns at once unless paused; otherwise when resumed.
    func pass() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let paused = state.withLock { s in
                if s.paused { s.waiting.append(continuation) }
                return s.paused
            }
            if !paused { continuation.resume() }
        }
    }
}

/// Events received and not yet taken.
private final class EventBuffer: Sendable {
    let events = Mutex<[WebSocketTestClient.Event]>([])
}

/// Where the connection's task puts what it receives.
private struct Inbox: Sendable {
    let push: @Sendable (WebSocketTestClient.Event) -> Void
    func yield(_ event: WebSocketTestClient.Event) { push(event) }
}

extension [String: JSONValue] {
    var type: String? { self["type"]?.stringValue }
}

/// One raw HTTP/1.1 request over a plain socket; returns everything the server sent until it
/// closed (for upgrade refusals, which HTTP clients hide).
func rawHTTP(port: Int, _ request: String) async throws -> String {
    final class Collector: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        var bytes = ByteBuffer()
        let done: EventLoopPromise<String>
        init(done: EventLoopPromise<String>) { self.done = done }
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            var buffer = unwrapInboundIn(data)
            bytes.writeBuffer(&buffer)
        }
        func channelInactive(context: ChannelHandlerContext) { done.succeed(String(buffer: bytes)) }
        func errorCaught(context: ChannelHandlerContext, error: any Error) { context.close(promise: nil) }
    }
    let group = MultiThreadedEventLoopGroup.singleton
    let done = group.next().makePromise(of: String.self)
    let channel = try await ClientBootstrap(group: group)
        .channelInitializer { channel in channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(Collector(done: done)) } }
        .connect(host: "127.0.0.1", port: port).get()
    try await channel.writeAndFlush(ByteBuffer(string: request)).get()
    channel.eventLoop.scheduleTask(in: .seconds(5)) { channel.close(promise: nil) }
    return try await done.futureResult.get()
}

/// Connects to `port` on loopback, sends `request`, and resets the connection at once
/// (`SO_LINGER` 0: an RST, not a FIN), as a client that vanishes mid-handshake does.
func sendAndReset(port: Int, _ request: String) throws {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw POSIXError(.EIO) }
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = in_port_t(UInt16(port).bigEndian)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    let connected = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard connected == 0 else { throw POSIXError(.ECONNREFUSED) }
    let bytes = Array(request.utf8)
    guard send(fd, bytes, bytes.count, 0) == bytes.count else { throw POSIXError(.EIO) }
    var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
}
