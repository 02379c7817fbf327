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
        /// The `after` of each delivery frame written or held whose write has not succeeded yet,
        /// oldest first from `unconfirmedHead` (writes complete in order, so a success is the
        /// first one's).
        var unconfirmed: [Timetoken] = []
        var unconfirmedHead = 0
        /// The oldest `after` of a delivery frame that was dropped (the buffer overflowed, the
        /// connection was closing) or whose write failed.
        var missed: Timetoken?

        /// A delivery frame (`after` non-nil) will not reach the socket.
        mutating func miss(_ after: Timetoken?) {
            guard let after else { return }
            missed = min(missed ?? after, after)
        }

        /// A delivery frame (`after` non-nil) was written or held.
        mutating func expect(_ after: Timetoken?) {
            guard let after else { return }
            unconfirmed.append(after)
        }

        /// The oldest unconfirmed delivery frame's write succeeded.
        mutating func confirm() {
            guard unconfirmedHead < unconfirmed.count else { return }
            unconfirmedHead += 1
            if unconfirmedHead == unconfirmed.count {
                unconfirmed.removeAll(keepingCapacity: true)
                unconfirmedHead = 0
            } else if unconfirmedHead >= 64, unconfirmedHead * 2 >= unconfirmed.count {
                unconfirmed.removeFirst(unconfirmedHead)
                unconfirmedHead = 0
            }
        }

        /// See ``OutboundQueue/undeliveredAfter``.
        var undeliveredAfter: Timetoken? {
            let oldest = unconfirmedHead < unconfirmed.count ? unconfirmed[unconfirmedHead] : nil
            switch (oldest, missed) {
            case let (a?, b?): return min(a, b)
            case let (a, b): return a ?? b
            }
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
    /// `after`: for a delivery frame, the cursor its messages follow. Until the frame's write to
    /// the socket succeeds it counts in ``undeliveredAfter``, so the session's cursor can be set
    /// back to before it when the connection ends or is taken over.
    @discardableResult
    func send(_ text: String, after: Timetoken? = nil) -> Bool {
        let onLoop = channel.eventLoop.inEventLoop
        enum Next { case write, pump, schedule, none, overflow }
        let next = state.withLock { s -> Next in
            guard !s.finished, s.close == nil else {
                s.miss(after)
                return .none
            }
            if onLoop, s.attached, !s.pumping, s.buffer.isEmpty, channel.isWritable {
                s.expect(after)
                return .write
            }
            guard s.buffer.push(Held(text: text, after: after), bytes: text.utf8.count) == .queued else {
                s.miss(after)
                return .overflow
            }
            s.expect(after)
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
    /// A close frame's payload is at most 125 bytes, 2 of them the code (RFC 6455 §5.5): a
    /// longer reason is cut to 123 bytes of UTF-8, at a character's end.
    static func closeReason(_ reason: String) -> String {
        guard reason.utf8.count > 123 else { return reason }
        var bytes = 0
        var end = reason.startIndex
        for character in reason {
            let size = character.utf8.count
            guard bytes + size <= 123 else { break }
            bytes += size
            end = reason.index(after: end)
        }
        return String(reason[..<end])
    }

    func close(code: UInt16, reason: String, answering: Bool = false) {
        let reason = Self.closeReason(reason)
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
            // Held delivery frames stay unconfirmed: ``undeliveredAfter`` counts them.
            s.buffer = OutboundBuffer(maxFrames: s.buffer.maxFrames, maxBytes: s.buffer.maxBytes)
        }
    }

    /// The cursor after which the oldest delivery frame not known to have reached the socket
    /// starts — held, being written, dropped, or failed — if there is one. A client that resumes
    /// without a cursor of its own is sent everything after it again, whether it resumes after
    /// this socket closed (``WebSocketConnection/socketClosed(then:)``) or takes the session
    /// over while it is open (``WebSocketSessions/resume(_:token:belongs:)``).
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

    /// For a delivery frame, a promise that confirms it once written to the socket, or remembers
    /// it if its write fails (the channel closed before the frame was written: NIO fails the
    /// writes it still held). `nil` for other frames.
    private func watch(_ after: Timetoken?) -> EventLoopPromise<Void>? {
        guard let after else { return nil }
        let promise = channel.eventLoop.makePromise(of: Void.self)
        promise.futureResult.whenComplete { result in
            self.state.withLock { s in
                switch result {
                case .success: s.confirm()
                case .failure: s.miss(after)
                }
            }
        }
        return promise
    }

    private static func textFrame(_ text: String) -> WebSocketFrame {
        WebSocketFrame(fin: true, opcode: .text, data: ByteBuffer(string: text))
    }
}
