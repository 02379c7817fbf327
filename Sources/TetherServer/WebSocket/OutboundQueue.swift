import NIOCore
import NIOWebSocket
import Synchronization
import TetherProtocol
import TetherServerCore

/// The frames one WebSocket session sends, written to its channel on the channel's event loop
/// in the order they were sent: at once while the channel is writable and nothing waits before
/// them, otherwise held in an ``OutboundBuffer`` (bounded; overflowing it marks a slow consumer)
/// and written when the channel is writable again (``pump()``, from
/// ``WebSocketSessionHandler``'s writability change). The one close frame goes after everything
/// sent before it; the connection closes when the client answers it, or 2 s after it went out.
/// No task waits here: an idle session's queue is this object and its empty buffer.
final class OutboundQueue: Sendable {
    /// A frame held for the channel, and for a delivery (`messages`) frame the cursor its
    /// messages follow.
    private struct Held: Sendable {
        var text: String
        var after: Timetoken?
    }

    private struct State: Sendable {
        var buffer: OutboundBuffer<Held>
        /// The cursor after which the oldest delivery frame that never reached the socket
        /// starts (dropped: the buffer overflowed, the connection was closing, or the queue
        /// finished with it held; or its write failed, the channel closing before it was
        /// written); `nil` while every delivery frame did.
        var undeliveredAfter: Timetoken?

        /// A delivery frame (`after` non-nil) did not reach the socket.
        mutating func missed(_ after: Timetoken?) {
            guard let after else { return }
            undeliveredAfter = min(undeliveredAfter ?? after, after)
        }
        var close: (code: UInt16, reason: String)?
        /// The close frame answers the client's: the connection closes once it is written.
        var closeAnswers = false
        /// Nothing more is written: the close frame went out, or the socket ended.
        var finished = false
        /// The session's handler is in the pipeline (``attach()``): until then the channel's
        /// pipeline is still HTTP's (an upgrade accepted at the request's head completes at its
        /// end), and everything sent is held.
        var attached = false
        /// A ``pump()`` is writing (on the loop), or one is scheduled there: it looks at the
        /// channel's writability and the buffer before each frame, so nothing needs to start
        /// another meanwhile.
        var pumping = false
    }

    private let state: Mutex<State>
    private let channel: any Channel
    /// How long the connection waits for the client's close frame after the server's.
    static let closeTimeout: TimeAmount = .seconds(2)

    init(channel: any Channel, maxFrames: Int, maxBytes: Int) {
        self.channel = channel
        state = Mutex(State(buffer: OutboundBuffer(maxFrames: maxFrames, maxBytes: maxBytes)))
    }

    /// Sends a text frame; `false` when the buffer overflowed (the connection must be closed as a
    /// slow consumer). Frames after a close or finish are dropped (`true`). Written at once when
    /// called on the connection's event loop with the channel writable and nothing held;
    /// otherwise held and written by a pump on the loop.
    ///
    /// `after`: for a delivery frame, the cursor its messages follow. A delivery frame that never
    /// reaches the socket is remembered (``undeliveredAfter``), so the session's cursor can be
    /// set back to before it when the connection ends.
    @discardableResult
    func send(_ text: String, after: Timetoken? = nil) -> Bool {
        let onLoop = channel.eventLoop.inEventLoop
        enum Next { case write, pump, schedule, none, overflow }
        let next = state.withLock { s -> Next in
            guard !s.finished, s.close == nil else {
                s.missed(after)
                return .none
            }
            if onLoop, s.attached, !s.pumping, s.buffer.isEmpty, channel.isWritable { return .write }
            guard s.buffer.push(Held(text: text, after: after), bytes: text.utf8.count) == .queued else {
                s.missed(after)
                return .overflow
            }
            if s.pumping || !s.attached { return .none }
            s.pumping = true
            return onLoop ? .pump : .schedule
        }
        switch next {
        case .write:
            channel.writeAndFlush(Self.textFrame(text), promise: watch(after))
        case .pump:
            writePending()
        case .schedule:
            channel.eventLoop.execute { self.writePending() }
        case .none:
            break
        case .overflow:
            return false
        }
        return true
    }

    /// Sends the close frame (the first one wins) after the frames sent before it. `answering`:
    /// it answers the client's close frame, and the connection closes once it is written (not
    /// when the client answers it).
    func close(code: UInt16, reason: String, answering: Bool = false) {
        let next = state.withLock { s -> Bool in
            guard !s.finished, s.close == nil else { return false }
            s.close = (code, reason)
            s.closeAnswers = answering
            if s.pumping || !s.attached { return false }
            s.pumping = true
            return true
        }
        guard next else { return }
        if channel.eventLoop.inEventLoop {
            writePending()
        } else {
            channel.eventLoop.execute { self.writePending() }
        }
    }

    /// The channel became writable again: writes what is held. On the connection's event loop.
    func pump() {
        let start = state.withLock { s -> Bool in
            guard !s.pumping, s.attached, !s.finished, !s.buffer.isEmpty || s.close != nil else { return false }
            s.pumping = true
            return true
        }
        if start { writePending() }
    }

    /// The session's handler is in the pipeline: what was sent before is written now. On the
    /// connection's event loop.
    func attach() {
        state.withLock { $0.attached = true }
        pump()
    }

    /// Whether the session's handler is in the pipeline (``attach()``): frames written straight
    /// to the channel before that would reach HTTP's handlers.
    var isAttached: Bool { state.withLock { $0.attached } }

    /// Ends the queue: nothing more is written (the socket closed, or the session dropped it).
    func finish() {
        state.withLock { s in
            s.finished = true
            while let held = s.buffer.pop() { s.missed(held.after) }
        }
    }

    /// The cursor after which the oldest delivery frame that never reached the socket starts, if
    /// one did not: a client that resumes without a cursor of its own is sent everything after it
    /// again (``WebSocketConnection/socketClosed(then:)``).
    var undeliveredAfter: Timetoken? { state.withLock { $0.undeliveredAfter } }

    /// Whether the close frame was sent (or the queue finished): the client's close then ends
    /// the connection.
    var isClosing: Bool { state.withLock { $0.finished || $0.close != nil } }

    /// Frames held for the channel (tests).
    var held: Int { state.withLock { $0.buffer.count } }

    /// Writes what is held while the channel is writable, then the close frame once nothing is
    /// held before it. Runs on the loop, with `pumping` taken by its caller.
    private func writePending() {
        var wrote = false
        var closing = false
        var answered: EventLoopPromise<Void>?
        while true {
            enum Step { case text(String, after: Timetoken?), close(UInt16, String, answers: Bool), stop }
            let step = state.withLock { s -> Step in
                if s.finished || !channel.isWritable {
                    s.pumping = false
                    return .stop
                }
                if let held = s.buffer.pop() { return .text(held.text, after: held.after) }
                if let close = s.close {
                    s.finished = true
                    s.pumping = false
                    return .close(close.code, close.reason, answers: s.closeAnswers)
                }
                s.pumping = false
                return .stop
            }
            switch step {
            case .text(let text, let after):
                channel.write(Self.textFrame(text), promise: watch(after))
                wrote = true
                continue
            case .close(let code, let reason, let answers):
                var data = channel.allocator.buffer(capacity: 2 + reason.utf8.count)
                data.writeInteger(code)
                data.writeString(reason)
                answered = answers ? channel.eventLoop.makePromise() : nil
                channel.write(WebSocketFrame(fin: true, opcode: .connectionClose, data: data), promise: answered)
                wrote = true
                closing = true
            case .stop:
                break
            }
            break
        }
        if wrote { channel.flush() }
        if closing {
            // The client answers with its own close frame (``WebSocketSessionHandler``), or it
            // is cut off; a close frame that answers the client's ends the connection once
            // written (or at the same timeout, if the client reads nothing).
            let channel = channel
            answered?.futureResult.whenComplete { _ in channel.close(promise: nil) }
            channel.eventLoop.scheduleTask(in: Self.closeTimeout) { channel.close(promise: nil) }
        }
    }

    /// For a delivery frame, a promise that remembers it (``State/missed(_:)``) if its write fails:
    /// the channel closed before the frame reached the socket (NIO fails the writes it still
    /// held). `nil` for other frames.
    private func watch(_ after: Timetoken?) -> EventLoopPromise<Void>? {
        guard let after else { return nil }
        let promise = channel.eventLoop.makePromise(of: Void.self)
        promise.futureResult.whenFailure { _ in self.state.withLock { $0.missed(after) } }
        return promise
    }

    private static func textFrame(_ text: String) -> WebSocketFrame {
        WebSocketFrame(fin: true, opcode: .text, data: ByteBuffer(string: text))
    }
}
