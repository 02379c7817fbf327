import HTTPTypes
import NIOCore
import NIOHTTP1

/// Reads a connection's requests from its bytes, in front of NIO's HTTP/1 decoder and encoder,
/// for as long as they are the plain HTTP/1.1 that SDKs send (``HotRequestHead``): a hot request
/// then never goes through NIO's parser, its request head and header list, the conversion to
/// HTTPTypes, or the encoder's three writes per answer (~2.5 µs of a ~19 µs subscribe cycle:
/// docs/benchmarks.md, thirteenth pass of issue #16).
///
/// - A hot request goes to the connection's ``HotPathHandler`` (``HotPathHandler/readHot(_:body:)``),
///   which answers it exactly as it answers one from NIO's decoder and hands the answer back here
///   to write as bytes (``writeAnswer(_:body:promise:)``).
/// - A plain `GET` or `DELETE` without a body to another route goes to the hot path as the head
///   NIO's decoder would have made (``HotPathHandler/readPassedOn(_:)``), and on to Hummingbird;
///   its answer goes through NIO's encoder, and the reader reads on after its end.
/// - Requests that arrive while one is answered wait here, and reading stops once one is waiting.
/// - The first request it does not take (``HotRequestHead/Parse/handOver``: a body elsewhere,
///   another method or version, an upgrade, anything irregular) goes, with every byte after it,
///   to NIO's decoder, which reads the connection from then on as it did before this reader
///   existed; the reader leaves the pipeline. It hands over only between requests, with no
///   answer outstanding, so the answers stay in request order.
final class HotRequestReader: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// What the reader is doing. Can transition from `reading` to `answering` (a whole hot
    /// request went to the hot path), `handedOver` or `closing`; from `answering` back to
    /// `reading` (``answered()``) or to `closing`.
    private enum State {
        /// Reading requests; `buffer` holds the start of the next one.
        case reading
        /// A request is being answered; `buffer` holds what came after it.
        case answering
        /// NIO's decoder reads the connection; the reader passes everything on until it is out
        /// of the pipeline.
        case handedOver
        /// The last answer closes the connection: nothing more is read.
        case closing
    }

    /// Read bytes at the buffer's start beyond which they are dropped when more arrive.
    static let discardThreshold = 4096

    private var state = State.reading
    /// Requests wait in the buffer while the socket takes no more (the answers already written
    /// are what the client has not read): set when one waited, read on when it is writable.
    private var waitingForWritable = false
    /// Set while ``readRequests(context:)`` runs.
    private var inReadRequests = false
    private var buffer: ByteBuffer?
    /// The length of the request at the buffer's start when its body has not all arrived, so
    /// that its head is not read again at every read of the body (only once more when it has:
    /// a parsed head kept here would be ~0.3 KiB of every idle connection).
    private var pendingBytes: Int?
    private var readPending = false
    /// Inside `channelRead` (a hand-over then needs no read completion of its own).
    private var inRead = false
    /// A request was passed on to Hummingbird since the last read completion went on: its side
    /// takes what it was given at the completion.
    private var passedOn = false
    /// The connection's hot path (it refers back to this reader until either leaves the
    /// pipeline); a hot `POST` may declare a body up to its bound.
    private let hotPath: HotPathHandler
    private var context: ChannelHandlerContext?

    /// - Parameter hotPath: the connection's hot path, after NIO's decoder in the same pipeline.
    init(hotPath: HotPathHandler) {
        self.hotPath = hotPath
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        hotPath.reader = self
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        if hotPath.reader === self { hotPath.reader = nil }
    }

    // MARK: Inbound

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch state {
        case .handedOver:
            context.fireChannelRead(data)
        case .closing:
            break
        case .reading, .answering:
            var bytes = unwrapInboundIn(data)
            if buffer == nil || buffer!.readableBytes == 0 {
                buffer = bytes
            } else {
                // What was read is dropped before more is added: a client whose every read ends
                // inside its next request would otherwise grow the buffer by all it ever sent.
                if buffer!.readerIndex >= Self.discardThreshold { buffer!.discardReadBytes() }
                buffer!.writeBuffer(&bytes)
            }
            // Body bytes of a head already read count as activity for the idle timeout; the
            // bytes of a head do once it is whole (``readRequests(context:)``), as they did when
            // NIO's decoder passed on only whole heads.
            if pendingBytes != nil { hotPath.noteActivity() }
            inRead = true
            readRequests(context: context)
            inRead = false
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if case .handedOver = state {
            context.fireChannelReadComplete()
        } else if passedOn {
            passedOn = false
            context.fireChannelReadComplete()
        }
    }

    /// Takes whole requests from the buffer until one is being answered, more bytes are needed,
    /// or a request is not one to take here.
    private func readRequests(context: ChannelHandlerContext) {
        inReadRequests = true
        defer { inReadRequests = false }
        while case .reading = state, let readable = buffer?.readableBytes, readable > 0 {
            if let pendingBytes, readable < pendingBytes { return }
            // A client that sends requests and does not read their answers fills the socket,
            // then NIO's write queue, which has no bound of its own: the next request waits
            // until the answers before it are taken.
            guard context.channel.isWritable else {
                waitingForWritable = true
                return
            }
            switch buffer!.withUnsafeReadableBytes({ HotRequestHead.parse($0, maxBodyBytes: hotPath.maxBodyBytes) }) {
            case .incomplete:
                return
            case .handOver:
                handOver(context: context)
                return
            case .request(let head, let headBytes, let bodyBytes):
                guard readable >= headBytes + bodyBytes else {
                    if pendingBytes == nil { hotPath.noteActivity() }
                    pendingBytes = headBytes + bodyBytes
                    return
                }
                pendingBytes = nil
                buffer!.moveReaderIndex(forwardBy: headBytes)
                let body = bodyBytes > 0 ? buffer!.readSlice(length: bodyBytes) : nil
                if buffer!.readableBytes == 0 { buffer = nil }
                state = .answering
                hotPath.noteActivity()
                guard hotPath.readHot(head, body: body) else {
                    // Nothing more is read on this connection (its input is done).
                    closeAfterAnswer()
                    return
                }
            case .passOn(let head, let headBytes):
                buffer!.moveReaderIndex(forwardBy: headBytes)
                if buffer!.readableBytes == 0 { buffer = nil }
                state = .answering
                passedOn = true
                // Nothing after a request that ends the connection is read (Hummingbird answers
                // it and closes).
                guard hotPath.readPassedOn(head), head.isKeepAlive else {
                    closeAfterAnswer()
                    return
                }
            }
        }
    }

    /// NIO's decoder reads the connection from the request at the buffer's start on.
    private func handOver(context: ChannelHandlerContext) {
        state = .handedOver
        if hotPath.reader === self { hotPath.reader = nil }
        if let rest = buffer.take(), rest.readableBytes > 0 {
            context.fireChannelRead(wrapInboundOut(rest))
            // Within a read its completion follows; otherwise (after an answer) the decoder's
            // parts reach Hummingbird's request stream at this completion.
            if !inRead { context.fireChannelReadComplete() }
        }
        if readPending {
            readPending = false
            context.read()
        }
        context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
    }

    // MARK: From the hot path

    /// Writes a hot request's answer: its head with its framing fields (`Content-Length`,
    /// `Date`) and its body in one buffer (a large body as a second), flushed.
    func writeAnswer(_ head: HTTPResponse, body: ByteBuffer, promise: EventLoopPromise<Void>?) {
        guard let context else {
            promise?.fail(ChannelError.ioOnClosedChannel)
            return
        }
        var body = body
        let out = HotRequestHead.encode(head, body: &body, date: HTTPDate.now(), allocator: context.channel.allocator)
        if body.readableBytes > 0 {
            context.write(wrapOutboundOut(out), promise: nil)
            context.writeAndFlush(wrapOutboundOut(body), promise: promise)
        } else {
            context.writeAndFlush(wrapOutboundOut(out), promise: promise)
        }
    }

    /// The answer is written: the requests waiting are read, and reading goes on.
    func answered() {
        guard case .answering = state, let context else { return }
        state = .reading
        // Answered within ``readRequests(context:)`` (an answer found without waiting): its
        // loop reads on.
        if inReadRequests { return }
        readRequests(context: context)
        if passedOn, !inRead {
            passedOn = false
            context.fireChannelReadComplete()
        }
        if readPending, case .reading = state {
            readPending = false
            context.read()
        }
    }

    /// The answer closes the connection: nothing after it is read.
    func closeAfterAnswer() {
        state = .closing
        buffer = nil
        pendingBytes = nil
    }

    /// The input buffer's capacity in bytes (tests: what a connection's reads make it hold).
    var bufferCapacity: Int { buffer?.capacity ?? 0 }

    /// Whether part of a request has arrived and not all of it, with no answer in flight (for
    /// the idle timeout, ``HotPathHandler``).
    var isMidRequest: Bool {
        if case .reading = state { return (buffer?.readableBytes ?? 0) > 0 }
        return false
    }

    /// Whether a whole head has arrived and not all of its body (a graceful shutdown answers it
    /// before closing, as it does a request NIO's decoder has begun to pass on).
    var isReadingBody: Bool {
        if case .reading = state { return pendingBytes != nil }
        return false
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable, waitingForWritable, case .reading = state {
            waitingForWritable = false
            readRequests(context: context)
            if passedOn, !inRead {
                passedOn = false
                context.fireChannelReadComplete()
            }
            if readPending, case .reading = state, context.channel.isWritable {
                readPending = false
                context.read()
            }
        }
        context.fireChannelWritabilityChanged()
    }

    // MARK: Outbound

    /// Reading stops while a request waits behind an answer (what a pipelining client can make
    /// the reader hold stays a read or two), and while the socket takes no more of the answers.
    func read(context: ChannelHandlerContext) {
        switch state {
        case .answering where (buffer?.readableBytes ?? 0) > 0:
            readPending = true
        case .reading, .answering:
            if context.channel.isWritable {
                context.read()
            } else {
                readPending = true
                waitingForWritable = true
            }
        case .handedOver, .closing:
            context.read()
        }
    }
}
