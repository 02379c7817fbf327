import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing
import TetherProtocol
import TetherServer
import TetherTesting
import TetherTestingServer

/// The session socket's framing (RFC 6455), which the server runs itself
/// (`WebSocketSessionHandler`): control frames, fragmented messages, the close handshake and
/// framing errors, each sent byte for byte by a raw client over a real socket on loopback.
@Suite(.serialized) struct WebSocketFramingTests {
    @Test func aPingIsAnsweredWithItsPayloadAndAFragmentedMessageIsAssembled() async throws {
        let server = try await InProcessServer.start(file: .init(subscribeTimeoutSeconds: 30))
        defer { Task { await server.stop() } }
        let socket = try await RawWebSocket.connect(port: server.port)
        socket.send(.ping, Array("are you there".utf8))
        let pong = try #require(await socket.next())
        #expect(pong.opcode == 0xA)
        #expect(pong.text == "are you there")

        // `hello` in three fragments, with a ping between two of them (RFC 6455 §5.4).
        let hello = #"{"type":"hello","v":1,"subscribeKey":"demo","publishKey":"demo","uuid":"framed"}"#.utf8
        let parts = [Array(hello.prefix(10)), Array(hello.dropFirst(10).prefix(20)), Array(hello.dropFirst(30))]
        socket.send(.text, parts[0], fin: false)
        socket.send(.continuation, parts[1], fin: false)
        socket.send(.ping, [1, 2, 3])
        socket.send(.continuation, parts[2], fin: true)
        let between = try #require(await socket.next())
        #expect(between.opcode == 0xA && between.payload == [1, 2, 3], "a control frame may come between fragments")
        let welcome = try #require(await socket.next())
        #expect(welcome.opcode == 0x1)
        #expect(welcome.text.contains(#""type":"welcome""#))
        socket.close()
    }

    struct ClientClose: Sendable, CustomTestStringConvertible {
        var sent: [UInt8]
        var answer: UInt16
        var testDescription: String { "close \(sent) answered \(answer)" }
    }

    @Test(arguments: [
        ClientClose(sent: [], answer: 1000),
        ClientClose(sent: [0x03, 0xE8, 0x62, 0x79, 0x65], answer: 1000),  // 1000 "bye"
        ClientClose(sent: [0x0F, 0xA0], answer: 1000),  // 4000: an application's code
        ClientClose(sent: [0x03, 0xED], answer: 1002),  // 1005 must not be sent
        ClientClose(sent: [0x03], answer: 1002),  // half a code
    ])
    func theClientsCloseIsAnsweredAndTheConnectionEnds(_ close: ClientClose) async throws {
        let (sent, answer) = (close.sent, close.answer)
        let server = try await InProcessServer.start(file: .init(subscribeTimeoutSeconds: 30))
        defer { Task { await server.stop() } }
        let socket = try await RawWebSocket.connect(port: server.port)
        socket.send(.close, sent)
        let close = try #require(await socket.next())
        #expect(close.opcode == 0x8)
        #expect(close.closeCode == answer)
        #expect(await socket.closedByServer())
    }

    @Test func theServersCloseEndsTheConnectionWhenTheClientAnswersIt() async throws {
        let server = try await InProcessServer.start(file: .init(subscribeTimeoutSeconds: 30))
        defer { Task { await server.stop() } }
        let socket = try await RawWebSocket.connect(port: server.port)
        socket.send(.binary, [1, 2, 3])
        var close: RawWebSocket.Frame?
        while close == nil, let frame = await socket.next() {
            if frame.opcode == 0x8 { close = frame }
        }
        #expect(close?.closeCode == WebSocketCloseCode.malformed)
        // What the client sends before its close is dropped; its close ends the connection.
        socket.send(.text, Array(#"{"type":"ping","id":1}"#.utf8))
        socket.send(.close, [0x03, 0xE8])
        #expect(await socket.next() == nil, "nothing after the server's close frame")
        #expect(await socket.closedByServer())
    }

    @Test(arguments: [
        (name: "a data frame with a reserved bit", code: UInt16(1002)),
        (name: "a continuation that continues nothing", code: 1002),
        (name: "a new message inside a fragmented one", code: 1002),
        (name: "fragments over the frame limit", code: 1009),
        (name: "a reserved opcode", code: 1002),
        (name: "a fragmented ping", code: 1002),
        (name: "a ping over 125 bytes", code: 1002),
        (name: "a frame over the frame limit", code: 1009),
        (name: "an unmasked frame", code: 1002),
        (name: "a text message that is not UTF-8", code: 1007),
    ])
    func framingErrorsCloseTheSocket(name: String, code: UInt16) async throws {
        let server = try await InProcessServer.start(file: .init(subscribeTimeoutSeconds: 30))
        defer { Task { await server.stop() } }
        let socket = try await RawWebSocket.connect(port: server.port)
        switch name {
        case "a data frame with a reserved bit":
            socket.send(.text, Array("{}".utf8), rsv1: true)
        case "a continuation that continues nothing":
            socket.send(.continuation, Array("{}".utf8))
        case "a new message inside a fragmented one":
            socket.send(.text, Array("{".utf8), fin: false)
            socket.send(.text, Array("}".utf8))
        case "fragments over the frame limit":
            // Each fragment is within the frame limit (68 KiB here); together they are over it.
            let part = [UInt8](repeating: 0x20, count: 40 * 1024)
            socket.send(.text, part, fin: false)
            socket.send(.continuation, part, fin: true)
        case "a fragmented ping":
            socket.send(.ping, [1], fin: false)
        case "a ping over 125 bytes":
            socket.send(.ping, [UInt8](repeating: 1, count: 126))
        case "a text message that is not UTF-8":
            // Valid UTF-8 in each fragment but one: the second ends inside a two-byte sequence.
            socket.send(.text, Array(#"{"type":"ping","id":"é"#.utf8), fin: false)
            socket.send(.continuation, [0xC3], fin: false)
            socket.send(.continuation, Array(#""}"#.utf8), fin: true)
        case "an unmasked frame":
            socket.send(.text, Array(#"{"type":"ping","id":1}"#.utf8), masked: false)
        case "a frame over the frame limit":
            socket.send(.text, [UInt8](repeating: 0x20, count: 128 * 1024))
        default:
            socket.send(.reserved3, [])
        }
        var close: RawWebSocket.Frame?
        while close == nil, let frame = await socket.next() {
            if frame.opcode == 0x8 { close = frame }
        }
        #expect(close?.closeCode == code, "\(name)")
        socket.send(.close, [0x03, 0xE8])
        #expect(await socket.closedByServer(), "\(name)")
    }
}

extension WebSocketFramingTests {
    /// NIO accepts an upgrade at the request's head and changes the pipeline at its end: a
    /// request whose body never comes leaves HTTP's handlers in place under an accepted session.
    /// Its hello timeout must close it without writing a WebSocket frame into them.
    @Test func anUpgradeWhoseRequestNeverEndsIsClosedAtTheHelloDeadline() async throws {
        let clock = ManualClock()
        let server = try await InProcessServer.start(file: .init(subscribeTimeoutSeconds: 30), clock: clock)
        let socket = try await RawWebSocket.connect(port: server.port, extraHeaders: "Content-Length: 1\r\n")
        #expect(await eventually { server.server.webSocketCounts.connections == 1 })
        clock.advance(by: .seconds(10))
        await server.server.tickWebSocketSessions()
        #expect(await socket.closedByServer(), "closed at the hello deadline")
        #expect(await eventually { server.server.webSocketCounts.connections == 0 })
        // The server is still up.
        let another = try await RawWebSocket.connect(port: server.port)
        another.send(.ping, [7])
        #expect(await another.next()?.payload == [7])
        another.close()
        await server.stop()
    }

    /// Messages read before the client's close frame are all handled, in order, even while an
    /// earlier one is still being handled: a `bye` behind a publish ends the session.
    @Test func messagesBeforeTheClientsCloseAreHandled() async throws {
        let server = try await InProcessServer.start(file: .init(subscribeTimeoutSeconds: 30))
        let socket = try await RawWebSocket.connect(port: server.port)
        socket.send(.text, Array(#"{"type":"hello","v":1,"subscribeKey":"demo","publishKey":"demo","uuid":"closing"}"#.utf8))
        #expect(try #require(await socket.next()).text.contains("welcome"))
        #expect(server.server.webSocketCounts.sessions == 1)
        socket.send([
            (.text, Array(#"{"type":"publish","requestId":"p1","channel":"c","message":"hi"}"#.utf8)),
            (.text, Array(#"{"type":"bye"}"#.utf8)),
            (.close, [0x03, 0xE8]),
        ])
        var texts: [String] = []
        while let frame = await socket.next() {
            if frame.opcode == 0x1 { texts.append(frame.text) }
        }
        #expect(texts.contains { $0.contains(#""type":"ack""#) && $0.contains("p1") }, "the publish was answered: \(texts)")
        #expect(await eventually { server.server.webSocketCounts.sessions == 0 }, "the bye ended the session")
        await server.stop()
    }
}

/// A WebSocket client that writes frames byte for byte (masked, as a client must) and parses
/// what the server sends: for the framing cases an ordinary client library never produces.
final class RawWebSocket: Sendable {
    enum Opcode: UInt8 {
        case continuation = 0x0, text = 0x1, binary = 0x2, reserved3 = 0x3, close = 0x8, ping = 0x9, pong = 0xA
    }

    struct Frame: Equatable, Sendable {
        var opcode: UInt8
        var payload: [UInt8]
        var text: String { String(decoding: payload, as: UTF8.self) }
        var closeCode: UInt16? { payload.count >= 2 ? UInt16(payload[0]) << 8 | UInt16(payload[1]) : nil }
    }

    private final class Reader: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        var buffer = ByteBuffer()
        var upgraded = false
        let received: NIOLockedValueBox<(frames: [Frame], closed: Bool)>
        init(received: NIOLockedValueBox<(frames: [Frame], closed: Bool)>) { self.received = received }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            var bytes = unwrapInboundIn(data)
            buffer.writeBuffer(&bytes)
            if !upgraded {
                guard let end = buffer.readableBytesView.firstRange(of: Array("\r\n\r\n".utf8)) else { return }
                buffer.moveReaderIndex(to: end.upperBound)
                upgraded = true
            }
            while let frame = parse() { received.withLockedValue { $0.frames.append(frame) } }
        }

        func parse() -> Frame? {
            let view = Array(buffer.readableBytesView)
            guard view.count >= 2 else { return nil }
            var length = Int(view[1] & 0x7F), offset = 2
            if length == 126 {
                guard view.count >= 4 else { return nil }
                length = Int(view[2]) << 8 | Int(view[3])
                offset = 4
            } else if length == 127 {
                guard view.count >= 10 else { return nil }
                length = view[2..<10].reduce(0) { $0 << 8 | Int($1) }
                offset = 10
            }
            guard view.count >= offset + length else { return nil }
            buffer.moveReaderIndex(forwardBy: offset + length)
            return Frame(opcode: view[0] & 0x0F, payload: Array(view[offset..<offset + length]))
        }

        func channelInactive(context: ChannelHandlerContext) {
            received.withLockedValue { $0.closed = true }
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) { context.close(promise: nil) }
    }

    private let channel: any Channel
    /// What the server sent, parsed, and whether it closed the connection.
    private let received: NIOLockedValueBox<(frames: [Frame], closed: Bool)>

    private init(channel: any Channel, received: NIOLockedValueBox<(frames: [Frame], closed: Bool)>) {
        self.channel = channel
        self.received = received
    }

    static func connect(port: Int, extraHeaders: String = "") async throws -> RawWebSocket {
        let received = NIOLockedValueBox<(frames: [Frame], closed: Bool)>(([], false))
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(Reader(received: received)) }
            }
            .connect(host: "127.0.0.1", port: port).get()
        let request = "GET /v2/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\(extraHeaders)\r\n"
        try await channel.writeAndFlush(ByteBuffer(string: request)).get()
        return RawWebSocket(channel: channel, received: received)
    }

    /// Sends frames in one write (one TCP segment on loopback), masked.
    func send(_ frames: [(Opcode, [UInt8])]) {
        channel.writeAndFlush(ByteBuffer(bytes: frames.flatMap { Self.encode($0.0, $0.1, fin: true, rsv1: false) }), promise: nil)
    }

    /// Sends one frame, masked.
    func send(_ opcode: Opcode, _ payload: [UInt8], fin: Bool = true, rsv1: Bool = false, masked: Bool = true) {
        channel.writeAndFlush(ByteBuffer(bytes: Self.encode(opcode, payload, fin: fin, rsv1: rsv1, masked: masked)), promise: nil)
    }

    private static func encode(_ opcode: Opcode, _ payload: [UInt8], fin: Bool, rsv1: Bool, masked: Bool = true) -> [UInt8] {
        var frame: [UInt8] = [(fin ? 0x80 : 0) | (rsv1 ? 0x40 : 0) | opcode.rawValue]
        let maskBit: UInt8 = masked ? 0x80 : 0
        if payload.count < 126 {
            frame.append(maskBit | UInt8(payload.count))
        } else if payload.count <= 0xFFFF {
            frame += [maskBit | 126, UInt8(payload.count >> 8), UInt8(payload.count & 0xFF)]
        } else {
            frame.append(maskBit | 127)
            frame += (0..<8).reversed().map { UInt8((payload.count >> ($0 * 8)) & 0xFF) }
        }
        guard masked else { return frame + payload }
        let mask: [UInt8] = [0x37, 0xFA, 0x21, 0x3D]
        frame += mask
        frame += payload.enumerated().map { $0.element ^ mask[$0.offset % 4] }
        return frame
    }

    /// The next frame from the server; `nil` once the connection closed with nothing more
    /// (or when nothing came within `seconds`: the test fails then, not hangs).
    func next(within seconds: Double = 10) async -> Frame? {
        _ = await eventually(within: seconds) { received.withLockedValue { !$0.frames.isEmpty || $0.closed } }
        return received.withLockedValue { $0.frames.isEmpty ? nil : $0.frames.removeFirst() }
    }

    /// Whether the server closed the connection (what it sent before is dropped).
    func closedByServer(within seconds: Double = 10) async -> Bool {
        await eventually(within: seconds) { received.withLockedValue { $0.closed } }
    }

    func close() { channel.close(promise: nil) }
}
