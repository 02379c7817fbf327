import NIOCore
import NIOWebSocket
import Synchronization
import TetherServerCore

/// What the writer of one WebSocket sends: a text frame, or the close frame that ends it.
enum OutboundItem: Sendable {
    case text(String)
    case close(code: UInt16, reason: String)
}

/// The frames waiting for one WebSocket's writer: an ``OutboundBuffer`` (bounded; overflowing
/// it marks a slow consumer) behind a lock, plus the one close frame, written after everything
/// queued before it.
final class OutboundQueue: Sendable {
    private struct State: Sendable {
        var buffer: OutboundBuffer<String>
        var close: (code: UInt16, reason: String)?
        var finished = false
        var waiter: CheckedContinuation<OutboundItem?, Never>?
        /// The waiting writer runs on the connection's event loop (``next(onEventLoop:)``).
        var waiterOnEventLoop = false
        var closedWaiters: [CheckedContinuation<Void, Never>] = []

        /// Marks the queue finished; returns who awaited that.
        mutating func markFinished() -> [CheckedContinuation<Void, Never>] {
            finished = true
            defer { closedWaiters = [] }
            return closedWaiters
        }
    }

    private let state: Mutex<State>

    init(maxFrames: Int, maxBytes: Int) {
        state = Mutex(State(buffer: OutboundBuffer(maxFrames: maxFrames, maxBytes: maxBytes)))
    }

    /// Queues a text frame; `false` when the buffer overflowed (the connection must be closed
    /// as a slow consumer). Frames after a close or finish are dropped (`true`).
    @discardableResult
    func send(_ text: String) -> Bool {
        let (accepted, waiter) = state.withLock { s -> (Bool, CheckedContinuation<OutboundItem?, Never>?) in
            guard !s.finished, s.close == nil else { return (true, nil) }
            if let waiter = s.waiter {
                s.waiter = nil
                return (true, waiter)
            }
            return (s.buffer.push(text, bytes: text.utf8.count) == .queued, nil)
        }
        waiter?.resume(returning: .text(text))
        return accepted
    }

    /// Whether a text frame may be written straight to the channel instead of queued, keeping
    /// the order of everything sent: the writer is waiting for a frame (so nothing is queued,
    /// and the queue is neither closed nor finished: both take the waiter), and it runs on the
    /// connection's event loop (so its last frame was handed to the channel before its write
    /// returned: NIO's async writer writes at once on the loop, and queues a job for it anywhere
    /// else). Asked on the connection's event loop by a sender that then writes on that loop
    /// without suspending.
    var writerIsWaiting: Bool {
        state.withLock { s in s.waiter != nil && s.waiterOnEventLoop }
    }

    /// Whether the writer waits for a frame, wherever it runs (tests).
    var writerParked: Bool { state.withLock { $0.waiter != nil } }

    /// Queues the close frame (the first one wins), written after the frames queued before it.
    func close(code: UInt16, reason: String) {
        let (waiter, closed) = state.withLock { s -> (CheckedContinuation<OutboundItem?, Never>?, [CheckedContinuation<Void, Never>]) in
            guard !s.finished, s.close == nil else { return (nil, []) }
            s.close = (code, reason)
            guard let waiter = s.waiter else { return (nil, []) }
            s.waiter = nil
            return (waiter, s.markFinished())
        }
        waiter?.resume(returning: .close(code: code, reason: reason))
        for continuation in closed { continuation.resume() }
    }

    /// Ends the queue: the writer's next `next()` returns `nil`.
    func finish() {
        let (waiter, closed) = state.withLock { s -> (CheckedContinuation<OutboundItem?, Never>?, [CheckedContinuation<Void, Never>]) in
            defer { s.waiter = nil }
            return (s.waiter, s.markFinished())
        }
        waiter?.resume(returning: nil)
        for continuation in closed { continuation.resume() }
    }

    /// Returns once the queue is finished (its close frame taken by the writer, or ended), or
    /// when the calling task is cancelled (which finishes it).
    func closed() async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let now = state.withLock { s -> Bool in
                    if s.finished || Task.isCancelled { return true }
                    s.closedWaiters.append(continuation)
                    return false
                }
                if now { continuation.resume() }
            }
        } onCancel: {
            finish()
        }
    }

    /// The next frame to write; `nil` once finished or after the close frame was taken.
    /// `onEventLoop`: the writer runs on the connection's event loop (``writerIsWaiting``).
    func next(onEventLoop: Bool = false) async -> OutboundItem? {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<OutboundItem?, Never>) in
                let (ready, closed) = state.withLock { s -> (OutboundItem??, [CheckedContinuation<Void, Never>]) in
                    if s.finished || Task.isCancelled { return (.some(nil), []) }
                    if let text = s.buffer.pop() { return (.some(.text(text)), []) }
                    if let close = s.close {
                        return (.some(.close(code: close.code, reason: close.reason)), s.markFinished())
                    }
                    s.waiter = continuation
                    s.waiterOnEventLoop = onEventLoop
                    return (.none, [])
                }
                if let ready { continuation.resume(returning: ready) }
                for waiter in closed { waiter.resume() }
            }
        } onCancel: {
            finish()
        }
    }
}

/// Nothing after a close frame: drops (and fails) every frame written after the connection's
/// close frame went out (RFC 6455 §5.5.1). Hummingbird's WebSocket handler answers a client's
/// close, or closes after a protocol error, through its own writer, and NIO's protocol error
/// handler answers a malformed frame with a close frame of its own; the session's direct frame
/// writes (``WebSocketConnection``) go through neither, so a delivery written in the moment
/// before the session learns of the close could otherwise follow the close frame. It sits before
/// NIO's protocol error handler, so it sees every frame written to the connection.
final class WebSocketCloseGuard: ChannelOutboundHandler, RemovableChannelHandler {
    typealias OutboundIn = WebSocketFrame
    typealias OutboundOut = WebSocketFrame

    /// Raised for a frame written after the close frame.
    struct AfterClose: Error {}

    private var closeSent = false

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        guard !closeSent else {
            promise?.fail(AfterClose())
            return
        }
        if unwrapOutboundIn(data).opcode == .connectionClose { closeSent = true }
        context.write(data, promise: promise)
    }
}
