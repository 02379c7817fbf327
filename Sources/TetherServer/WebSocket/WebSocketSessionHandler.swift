import DequeModule
import NIOCore
import NIOWebSocket
@_spi(Benchmarks) import TetherProtocol

/// The channel handler of an upgraded session socket, after NIO's frame decoder and encoder: it
/// assembles fragmented messages, answers pings, runs the close handshake and answers framing
/// errors (RFC 6455), and hands each message to its ``WebSocketConnection``. Every close frame
/// the server writes comes after the session's ``OutboundQueue`` was closed or finished, so no
/// frame of the session follows it (RFC 6455 §5.5.1). It replaces a task that waited for the
/// next frame: an idle session has none (docs/benchmarks.md, twelfth pass of issue #16).
///
/// A message the connection answers at once (a `ping`, a `pong`, a malformed frame) is handled
/// here; any other runs in a short task on the connection's event loop, and while it runs the
/// messages after it wait in order and the socket is not read, so what a client can queue here
/// is bounded by one read. A close frame, the end of input or the socket's close that comes
/// behind them takes effect once they are handled.
final class WebSocketSessionHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = WebSocketFrame
    typealias OutboundIn = WebSocketFrame
    typealias OutboundOut = WebSocketFrame

    private let connection: WebSocketConnection
    private let maxMessageBytes: Int
    private let executor: EventLoopTaskExecutor
    private let tasks: HotPathTasks
    /// The session's count in ``HotPathTasks`` while its socket is open.
    private var registration: UInt64?
    private var closed = false
    /// The message being assembled from its fragments.
    private var fragments: (opcode: WebSocketOpcode, data: ByteBuffer)?
    /// A message is being handled in a task; the messages after it wait here, in order.
    private var busy = false
    /// Bounded by what one read of the socket decodes to: reading stops while a message is
    /// handled.
    private var waiting: Deque<WebSocketConnection.Inbound> = []
    /// A read asked for while a message was handled: passed on when it is done.
    private var readDeferred = false
    /// The server is closing the socket: what the client sends is read and dropped until its
    /// close frame (or the close timeout) ends the connection.
    private var ignoring = false
    /// What ends the connection once the messages before it are handled: the client's close
    /// frame (answered with this code), its end of input, or the socket's close.
    private enum Ending { case closeFrame(UInt16), inputClosed, inactive }
    private var ending: Ending?
    /// The latest ping's payload, answered when the channel is writable again (RFC 6455 §5.5.3:
    /// only the latest ping needs its pong), so a client that pings and never reads grows nothing.
    private var pendingPong: ByteBuffer?
    private var context: ChannelHandlerContext?
    /// The connection's event loop (kept after the handler leaves the pipeline, for the
    /// messages still handled then).
    private var loop: (any EventLoop)?

    init(connection: WebSocketConnection, maxMessageBytes: Int, executor: EventLoopTaskExecutor, tasks: HotPathTasks) {
        self.connection = connection
        self.maxMessageBytes = maxMessageBytes
        self.executor = executor
        self.tasks = tasks
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        loop = context.eventLoop
        guard connection.start() else {
            // The socket closed before: its slot was given back already.
            closed = true
            ignoring = true
            context.close(promise: nil)
            return
        }
        registration = tasks.startTaskless(channel: context.channel)
        connection.queue.attach()
        if registration == nil || !context.channel.isActive {
            context.close(promise: nil)
            if !context.channel.isActive { socketClosed() }
        }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        // The messages read before the socket closed are still handled (a `bye` behind a
        // publish ends the session), then the session lets go of the socket.
        connection.queue.finish()
        if busy || !waiting.isEmpty {
            ending = .inactive
        } else {
            socketClosed()
        }
        context.fireChannelInactive()
    }

    private func socketClosed() {
        guard !closed else { return }
        closed = true
        stopHandling()
        let (tasks, registration) = (tasks, registration)
        connection.socketClosed { if let registration { tasks.endTaskless(registration) } }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable {
            if let pong = pendingPong {
                pendingPong = nil
                if !connection.queue.isClosing {
                    context.writeAndFlush(wrapOutboundOut(WebSocketFrame(fin: true, opcode: .pong, data: pong)), promise: nil)
                }
            }
            connection.queue.pump()
        }
        context.fireChannelWritabilityChanged()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        // The client closed its side without a close frame: nothing more will come.
        if let event = event as? ChannelEvent, event == .inputClosed {
            if busy || !waiting.isEmpty {
                // After the messages read before it; a close frame before it is still answered.
                if ending == nil { ending = .inputClosed }
            } else {
                context.close(promise: nil)
            }
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    /// A framing error found by NIO's frame decoder (which decodes nothing after it) is
    /// answered with a close frame, 1009 for a frame over the limit and 1002 for a malformed
    /// control frame, and the connection ends once it is written; any other error (a reset)
    /// ends the connection at once.
    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        guard let error = error as? NIOWebSocketError, !connection.queue.isClosing else {
            context.close(promise: nil)
            return
        }
        closeAfter(error == .invalidFrameLength ? WebSocketCloseCode.tooBig : WebSocketCloseCode.protocolError, context: context)
    }

    /// Holds the socket's reads while a message is being handled.
    func read(context: ChannelHandlerContext) {
        if busy {
            readDeferred = true
        } else {
            context.read()
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = unwrapInboundIn(data)
        // A client masks every frame (RFC 6455 §5.1), and no extension is negotiated.
        guard frame.maskKey != nil, frame.reservedBits.isEmpty else { return protocolError() }
        switch frame.opcode {
        case .connectionClose:
            receivedClose(frame, context: context)
        case .ping:
            guard frame.fin, frame.length < 126 else { return protocolError() }
            guard !connection.queue.isClosing, !ignoring else { return }
            guard context.channel.isWritable else {
                pendingPong = frame.unmaskedData
                return
            }
            context.writeAndFlush(wrapOutboundOut(WebSocketFrame(fin: true, opcode: .pong, data: frame.unmaskedData)), promise: nil)
        case .pong:
            guard frame.fin else { return protocolError() }
        case .text, .binary, .continuation:
            assemble(frame)
        default:
            protocolError()
        }
    }

    // MARK: - Messages

    private func assemble(_ frame: WebSocketFrame) {
        if ignoring || ending != nil { return }
        var data = frame.unmaskedData
        if frame.opcode == .continuation {
            guard var message = fragments else { return protocolError() }  // continues nothing
            guard message.data.readableBytes + data.readableBytes <= maxMessageBytes else { return tooBig() }
            message.data.writeBuffer(&data)
            guard frame.fin else {
                fragments = message
                return
            }
            fragments = nil
            received(message.opcode, message.data)
        } else {
            guard fragments == nil else { return protocolError() }  // a new message inside a fragmented one
            guard frame.fin else {
                fragments = (frame.opcode, data)
                return
            }
            received(frame.opcode, data)
        }
    }

    private func received(_ opcode: WebSocketOpcode, _ data: ByteBuffer) {
        let message: WebSocketConnection.Inbound
        if opcode == .text {
            // A text message that is not UTF-8 fails the connection (RFC 6455 §8.1).
            guard let text = String(validating: data.readableBytesView, as: UTF8.self) else {
                connection.queue.close(code: WebSocketCloseCode.invalidText, reason: "text frame is not UTF-8")
                return stopHandling()
            }
            message = .text(text)
        } else {
            message = .binary
        }
        connection.noteReceived()
        if busy {
            waiting.append(message)
        } else {
            handle(message)
        }
    }

    /// Handles `message` at once when the connection can, or starts the task that handles it
    /// and the messages queued behind it.
    private func handle(_ message: WebSocketConnection.Inbound) {
        switch connection.handleAtOnce(message) {
        case .handled:
            return
        case .closing:
            stopHandling()
        case .needsTask(let frame):
            busy = true
            let connection = connection
            let bound = NIOLoopBound(self, eventLoop: loop!)
            Task(executorPreference: executor) {
                let open = await connection.handle(frame)
                bound.value.handled(open: open)
            }
        }
    }

    /// The task handling a message is done (on the loop): the next waiting message, if any.
    private func handled(open: Bool) {
        busy = false
        // Once the server's close frame is queued (or the connection was dropped as a slow
        // consumer), what the client sent after is not handled.
        if !open || connection.queue.isClosing { stopHandling() }
        while !busy, !ignoring, let next = waiting.popFirst() {
            handle(next)
            if !busy, connection.queue.isClosing { stopHandling() }
        }
        if !busy {
            ended()
            resumeReading()
        }
    }

    /// What ended the connection while messages before it were handled, now that they are.
    private func ended() {
        guard let ending, let context else {
            if case .inactive? = ending { socketClosed() }
            return
        }
        self.ending = nil
        switch ending {
        case .closeFrame(let code):
            if connection.queue.isClosing {
                context.close(promise: nil)
            } else {
                // After the answers to the messages before it.
                connection.queue.close(code: code, reason: "", answering: true)
            }
        case .inputClosed:
            context.close(promise: nil)
        case .inactive:
            socketClosed()
        }
    }

    /// The session is closing the socket: the rest is read and dropped.
    private func stopHandling() {
        ignoring = true
        waiting.removeAll()
        fragments = nil
        if !busy { resumeReading() }
    }

    /// Passes on the read held while a message was handled.
    private func resumeReading() {
        guard readDeferred, let context else { return }
        readDeferred = false
        context.read()
    }

    // MARK: - Closing

    private func tooBig() {
        connection.queue.close(code: WebSocketCloseCode.tooBig, reason: "message too big")
        stopHandling()
    }

    private func protocolError() {
        connection.queue.close(code: WebSocketCloseCode.protocolError, reason: "protocol error")
        stopHandling()
    }

    /// The client's close frame: after the server's, it ends the connection; otherwise it is
    /// answered (RFC 6455 §5.5.1: 1000, or 1002 when its code is not one a peer may send) and the
    /// connection ends once the answer is written. Messages read before it are handled first.
    private func receivedClose(_ frame: WebSocketFrame, context: ChannelHandlerContext) {
        var data = frame.unmaskedData
        let code = data.readableBytes == 0 || data.readInteger(as: UInt16.self).map(Self.isValidCloseCode) == true
            ? WebSocketCloseCode.normal : WebSocketCloseCode.protocolError
        if busy || !waiting.isEmpty {
            fragments = nil  // nothing after the close frame counts (``assemble(_:)``)
            ending = .closeFrame(code)
            return
        }
        stopHandling()
        guard !connection.queue.isClosing else {
            context.close(promise: nil)
            return
        }
        connection.queue.close(code: code, reason: "", answering: true)
    }

    /// Writes a close frame with `code` at once (nothing the session sends goes after it: its
    /// queue is finished first) and ends the connection once it is written, or after the close
    /// timeout if the client reads nothing.
    private func closeAfter(_ code: UInt16, context: ChannelHandlerContext) {
        connection.queue.finish()
        stopHandling()
        var data = context.channel.allocator.buffer(capacity: 2)
        data.writeInteger(code)
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(WebSocketFrame(fin: true, opcode: .connectionClose, data: data)))
            .whenComplete { _ in channel.close(promise: nil) }
        channel.eventLoop.scheduleTask(in: OutboundQueue.closeTimeout) { channel.close(promise: nil) }
    }

    /// A close code a peer may send (RFC 6455 §7.4 and IANA's registry): 1000–1003, 1007–1014,
    /// 3000–4999.
    static func isValidCloseCode(_ code: UInt16) -> Bool {
        switch code {
        case 1000...1003, 1007...1014, 3000...4999: true
        default: false
        }
    }
}
