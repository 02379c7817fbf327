#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import HTTPTypes
import Hummingbird
import HummingbirdCore
import Logging
import NIOCore
import NIOHTTP1
import NIOHTTPTypes
import NIOHTTPTypesHTTP1
import Synchronization
import TetherProtocol
import TetherServerCore

/// Answers the hot routes of the wire — publish and signal, subscribe, time — from the
/// connection's channel pipeline instead of through Hummingbird's per-connection request loop
/// (an async stream of request parts, a streamed request body, and an async response writer
/// that hops to the event loop for every part). The answer is still ``TetherResponder``'s:
/// the same routing, checks, handlers and error bodies; only the transport around it is
/// lighter (docs/benchmarks.md, "Where a request's CPU and memory go").
///
/// Everything else (uploads, App Context, history, the console, the admin API) is passed on
/// to Hummingbird unchanged. Responses stay in request order: a hot request that arrives while
/// a passed-on request is being answered is passed on too, and requests that arrive while a
/// hot one is being answered wait here (reading from the socket stops meanwhile).
///
/// The handler also owns the connection's idle timeout (Hummingbird's never sees the hot
/// requests, so it would take a busy connection for an idle one), a graceful shutdown's
/// quiesce (a connection in the middle of a hot answer closes after it), the client's
/// half-close (Hummingbird allows half-closure, so a client that hangs up would otherwise only
/// be noticed when a response is written — minutes later for a long-poll), and requests the
/// HTTP parser refuses: those get the protocol's JSON 400 after every request before them is
/// answered, and the connection closes.
///
/// It sits right after NIO's HTTP/1 decoder and speaks NIO's HTTP/1 parts; while the
/// connection's ``HotRequestReader`` reads the connection (before it hands it to the decoder),
/// requests come from the reader instead (``readHot(_:body:)``, ``readPassedOn(_:)``) and hot
/// answers go back through it as bytes. Hummingbird's handlers
/// — the upgrade handler, or its HTTP/1 handlers, `NIOAsyncChannel` and request loop — are added
/// after it only when it first passes a request on (its ``HummingbirdOpener``,
/// ``TetherHTTPChannel``), so a connection that only ever sends hot requests never gets them: that
/// machinery was most of an idle long-poll's memory (docs/benchmarks.md, "Idle connections
/// without a task" and "Hummingbird's side only when a request needs it").
///
/// While it is in the pipeline it also counts its connection as open in ``HotPathTasks``, for a
/// graceful shutdown to wait for (a connection upgraded to WebSocket, which it leaves, is counted
/// by the task running the session instead).
final class HotPathHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    /// What answers a hot request: ``TetherResponder/respondCollected(to:context:)``; `nil`
    /// when a subscribe parked in the hub instead (its slot's wake-up runs it again).
    /// It runs on the caller's executor (the connection's event loop) without an executor switch.
    typealias Answer = nonisolated(nonsending) @Sendable (Request, any Channel, LongPollSlot?) async -> (HTTPResponse, ByteBuffer)?

    private let answerRequest: Answer
    /// The largest body a hot `POST` may declare; a larger or unsized one is passed on.
    let maxBodyBytes: Int
    private let idleTimeout: TimeAmount

    private enum Reading {
        case idle
        case forwarding
        case collecting(HTTPRequest, ByteBuffer?)
    }

    private var reading = Reading.idle
    /// Requests passed on whose response has not ended.
    private var forwardedInFlight = 0
    /// Parts that arrived while a hot request was being answered, replayed after its answer.
    /// (An array: empty, it allocates nothing, and nearly every connection never holds a part.)
    private var held: [HTTPServerRequestPart] = []
    // The flags are declared together: every idle connection keeps this object, and flags
    // between wider fields each take a field's width.
    /// A hot request is being answered.
    private var answering = false
    private var readPending = false
    private var closeAfterAnswer = false
    /// A request passed on asked for `Connection: close` (Hummingbird answers it and closes) or
    /// for an upgrade, or the parser failed: nothing after it is read.
    private var inputDone = false
    /// The request being passed on ends the connection's input at its end (``inputDone``).
    private var lastForwardedEndsInput = false
    /// The handler is replaying held parts (``write(_:_:context:)``).
    private var replaying = false
    /// The ``reader`` passed a request on and waits for the end of its answer to read on.
    private var readerAwaitsForwarded = false
    /// A request was passed on: the connection's Hummingbird side is built (``opener``).
    private var hummingbirdOpened = false
    /// The HTTP parser refused what followed the requests read so far: the JSON 400 goes out
    /// once they are answered (``answerParseFailureIfDue(context:)``).
    private var parseFailed = false
    private var parseFailureAnswered = false
    /// Set when the pipeline asked this handler to leave (an accepted WebSocket upgrade) while
    /// it was replaying parts held behind a hot answer: it passes everything on untouched and
    /// leaves once the replay is done.
    private var leaving: ChannelHandlerContext.RemovalToken?
    private var lastActivity = NIODeadline.now()
    /// The connection's ``HotRequestReader`` while it reads the connection's requests (before it
    /// hands them over to NIO's decoder): hot requests come from it (``readHot(_:body:)``) and
    /// their answers go back through it, as bytes, instead of through NIO's encoder.
    var reader: HotRequestReader?
    /// What this connection shares with the others on its event loop: the executor its
    /// answers' tasks run on, and the sweep that checks its idle timeout.
    private var loopShare: HotPathLoop!
    /// The connection, while the handler is in its pipeline (for the idle sweep).
    private var context: ChannelHandlerContext?
    /// This handler's place in its loop's idle sweep (``HotPathLoop``); -1 when not in it.
    fileprivate var sweepIndex = -1
    /// The server's count of answers in flight and open connections (graceful shutdown waits
    /// for them), and where the connection's ``HotPathLoop`` comes from.
    private let inFlight: HotPathTasks
    /// Builds the connection's Hummingbird side when the first request is passed on; `nil`
    /// passes requests on to whatever follows this handler.
    private let opener: (any HummingbirdOpener)?

    init(maxBodyBytes: Int, idleTimeout: TimeAmount, tasks: HotPathTasks = HotPathTasks(), opener: (any HummingbirdOpener)? = nil,
         answer: @escaping Answer) {
        self.answerRequest = answer
        self.inFlight = tasks
        self.opener = opener
        self.maxBodyBytes = maxBodyBytes
        self.idleTimeout = idleTimeout
    }

    // MARK: Inbound

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        // Leaving for a WebSocket upgrade (``removeHandler(context:removalToken:)``): what
        // follows is the upgrade's, and may not be HTTP at all.
        if leaving != nil { return context.fireChannelRead(data) }
        let part = unwrapInboundIn(data)
        if answering || !held.isEmpty {
            held.append(part)
            return
        }
        process(part, context: context)
    }

    private func process(_ part: HTTPServerRequestPart, context: ChannelHandlerContext) {
        guard !inputDone else { return }
        lastActivity = context.eventLoop.now
        switch reading {
        case .idle:
            guard case .head(var head) = part else {
                context.fireChannelRead(wrapInboundOut(part))
                return
            }
            Self.markNonPersistent(&head)
            let part = HTTPServerRequestPart.head(head)
            if forwardedInFlight == 0, isHot(head), let request = Self.hotRequest(head) {
                reading = .collecting(request, nil)
            } else {
                reading = .forwarding
                forwardedInFlight += 1
                // Nothing after a request that closes the connection, or after an upgrade
                // attempt (the parser stops there: what follows is the upgrade's), is read as a
                // request — from the end of that request on: its own body goes to Hummingbird.
                lastForwardedEndsInput = !head.isKeepAlive || Self.asksForUpgrade(head)
                passOn(part, context: context)
            }
        case .forwarding:
            if case .end = part {
                reading = .idle
                if lastForwardedEndsInput { inputDone = true }
            }
            context.fireChannelRead(wrapInboundOut(part))
        case .collecting(let head, var body):
            switch part {
            case .head(var head):
                // The decoder never starts a request inside another; pass it on if it did.
                Self.markNonPersistent(&head)
                let part = HTTPServerRequestPart.head(head)
                reading = .forwarding
                forwardedInFlight += 1
                lastForwardedEndsInput = !head.isKeepAlive || Self.asksForUpgrade(head)
                passOn(part, context: context)
            case .body(var buffer):
                reading = .idle  // let `body` be uniquely referenced while appending
                if body == nil { body = buffer } else { body!.writeBuffer(&buffer) }
                guard body!.readableBytes <= maxBodyBytes else {
                    // Never reached (a hot request declares a body that fits): a bound anyway.
                    context.close(promise: nil)
                    return
                }
                reading = .collecting(head, body)
            case .end:
                reading = .idle
                answer(head, body: body, context: context)
            }
        }
    }

    /// A hot request the connection's ``HotRequestReader`` read whole from its bytes; `false`
    /// when nothing more is answered on the connection (its answer then never comes).
    func readHot(_ request: HTTPRequest, body: ByteBuffer?) -> Bool {
        guard let context, !inputDone else { return false }
        answer(request, body: body, context: context)
        return true
    }

    /// A plain request to a route that is not hot, read whole by the connection's
    /// ``HotRequestReader``: passed on to Hummingbird as NIO's decoder would have passed it.
    /// `false` when nothing more is answered on the connection.
    func readPassedOn(_ head: HTTPRequestHead) -> Bool {
        guard let context, !inputDone else { return false }
        readerAwaitsForwarded = true
        process(.head(head), context: context)
        process(.end(nil), context: context)
        return true
    }

    /// Something was read (``HotRequestReader``): the idle timeout starts again.
    func noteActivity() {
        if let context { lastActivity = context.eventLoop.now }
    }

    /// Passes a request's head on to Hummingbird, building the connection's Hummingbird side
    /// after this handler first if this is its first request that is not hot (``opener``).
    private func passOn(_ head: HTTPServerRequestPart, context: ChannelHandlerContext) {
        if !hummingbirdOpened {
            hummingbirdOpened = true
            opener?.openHummingbird(on: context.channel)
        }
        context.fireChannelRead(wrapInboundOut(head))
    }

    /// Marks a request that does not keep its connection open `Connection: close`, so that the
    /// hot path and Hummingbird — which both close after answering a request carrying exactly
    /// that header — close after answering it too: an HTTP/1.0 request without
    /// `Connection: keep-alive` (RFC 9112 §9.3), or a `close` token in another spelling
    /// (`Close`, `close, te`). NIO's `isKeepAlive` reads the version and the header's tokens.
    static func markNonPersistent(_ head: inout HTTPRequestHead) {
        guard !head.isKeepAlive, head.headers["connection"] != ["close"] else { return }
        head.headers.replaceOrAdd(name: "connection", value: "close")
    }

    /// Whether the request asks to switch protocols as NIO's parser reads it (`Upgrade` with an
    /// `upgrade` token in `Connection`): the parser reads nothing after such a request as HTTP.
    /// (`Upgrade` alone is an ordinary request: Hummingbird answers it and keeps the connection.)
    static func asksForUpgrade(_ head: HTTPRequestHead) -> Bool {
        head.headers.contains(name: "upgrade")
            && head.headers[canonicalForm: "connection"].contains { $0.lowercased() == "upgrade" }
    }

    /// A hot request's head as HTTPTypes' `HTTPRequest`, as NIO's conversion
    /// (`HTTPRequest(_:secure:splitCookie:)`) makes it, without what that conversion spends on a
    /// request target in origin form (`/path?query`, what every client sends a server): it
    /// parses every target with Foundation's `URLComponents` to turn an absolute-form target into
    /// a path, 2 % of a subscribe cycle's CPU, and returns an origin-form target as it is. Any
    /// other form goes through the conversion. `nil` for a method HTTPTypes refuses.
    static func hotRequest(_ head: HTTPRequestHead) -> HTTPRequest? {
        guard head.uri.utf8.first == UInt8(ascii: "/") else { return try? HTTPRequest(head, secure: false, splitCookie: false) }
        guard let method = try? HTTPRequest.Method(head.method) else { return nil }
        return HTTPRequest(method: method, scheme: "http", authority: head.headers["Host"].first, path: head.uri,
                           headerFields: HTTPFields(head.headers, splitCookie: false))
    }

    /// Whether the request goes the hot way: a `GET` publish, signal, subscribe or time without
    /// a body, or a `POST` publish whose declared body fits.
    private func isHot(_ head: HTTPRequestHead) -> Bool {
        // A request asking for a protocol upgrade is Hummingbird's: after a failed WebSocket
        // upgrade it answers 400 itself, and a hot answer would be a second response.
        let path = head.uri
        let headers = head.headers
        guard !headers.contains(name: "upgrade"), !headers.contains(name: "transfer-encoding") else { return false }
        let lengths = headers["content-length"]
        switch head.method {
        case .GET:
            // A GET with a body (which nothing reads) goes to Hummingbird, which discards it
            // as it streams instead of collecting it.
            guard lengths.isEmpty || lengths == ["0"] else { return false }
            return HotRequestHead.isHotRoute(post: false, path: path)
        case .POST:
            guard HotRequestHead.isHotRoute(post: true, path: path), lengths.count == 1, let length = Int(lengths[0]), length >= 0, length <= maxBodyBytes
            else { return false }
            return !headers.contains(name: "expect")
        default:
            return false
        }
    }

    private func answer(_ head: HTTPRequest, body: ByteBuffer?, context: ChannelHandlerContext) {
        answering = true
        if head.headerFields[.connection] == "close" { closeAfterAnswer = true }
        let request = Request(head: head, body: RequestBody(buffer: body ?? ByteBuffer()))
        var slot: LongPollSlot?
        if head.method == .get, let path = head.path, path.hasPrefix("/v2/subscribe/") {
            // A long-poll with nothing to deliver parks in the hub without a task; its wake-up
            // runs the request again on this loop (a client gone needs no answer). While it is
            // parked only its path is kept, not the request: a subscribe reads nothing else of
            // it (no header, no body), and the request with its parsed URI and header fields is
            // ~0.5 KiB of every idle long-poll (docs/benchmarks.md, seventh pass).
            let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            let loop = context.eventLoop
            slot = LongPollSlot { slot, reason in
                loop.execute {
                    let (handler, context) = bound.value
                    guard reason != .clientGone else {
                        // Gone: nothing to answer; the connection is closed (it is, or the
                        // waiter machine found it so).
                        context.close(promise: nil)
                        return
                    }
                    handler.run(Self.subscribeRequest(path: path), slot, context: context)
                }
            }
        }
        run(request, slot, context: context)
    }

    /// A parked subscribe's request, made again for the run after its wake-up from the only
    /// part of it a subscribe reads: the path with its query.
    static func subscribeRequest(path: String) -> Request {
        Request(head: HTTPRequest(method: .get, scheme: nil, authority: nil, path: path), body: RequestBody(buffer: ByteBuffer()))
    }

    private func run(_ request: Request, _ slot: LongPollSlot?, context: ChannelHandlerContext) {
        let channel = context.channel
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        let answerRequest = answerRequest
        let inFlight = inFlight
        inFlight.started()
        // The answer runs on this connection's event loop: no hop to the concurrency pool
        // and back (docs/benchmarks.md). It starts at once, in this call: an answer found
        // without waiting (a subscribe with its messages in memory, a `store=0` publish, `time`)
        // is written before the call returns, without a trip through the loop's task queue;
        // one that waits resumes on the loop.
        let operation: @Sendable () async -> Void = {
            defer { inFlight.ended() }
            guard let (head, body) = await answerRequest(request, channel, slot) else { return }
            if channel.eventLoop.inEventLoop {
                let (handler, context) = bound.value
                handler.write(head, body, context: context)
            } else {
                channel.eventLoop.execute {
                    let (handler, context) = bound.value
                    handler.write(head, body, context: context)
                }
            }
        }
        if #available(macOS 26.0, iOS 26.0, tvOS 26.0, watchOS 26.0, visionOS 26.0, *) {
            Task.immediate(executorPreference: loopShare.executor, operation: operation)
        } else {
            Task(executorPreference: loopShare.executor, operation: operation)
        }
    }

    private func write(_ head: HTTPResponse, _ body: ByteBuffer, context: ChannelHandlerContext) {
        answering = false
        lastActivity = context.eventLoop.now
        let reader = reader
        if closeAfterAnswer || head.headerFields[.connection] == "close" {
            held.removeAll()
            // The connection ends with this answer: nothing read after it is run, answered or
            // refused with a 400, and nothing more is read — also when the answer was written
            // within the read that brought its request (``run(_:_:context:)``), with the
            // decoder still passing on what followed it in that read.
            inputDone = true
            parseFailureAnswered = true
            readPending = false
            let promise = context.eventLoop.makePromise(of: Void.self)
            if let reader {
                reader.closeAfterAnswer()
                reader.writeAnswer(head, body: body, promise: promise)
            } else {
                context.write(wrapOutboundOut(.head(HotRequestHead.framed(head, bodyLength: body.readableBytes, date: HTTPDate.now()))), promise: nil)
                if body.readableBytes > 0 { context.write(wrapOutboundOut(.body(.byteBuffer(body))), promise: nil) }
                context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: promise)
            }
            // Output only, as Hummingbird does: the peer reads the answer, then closes (a full
            // close with unread input would reset the connection and could lose the answer).
            // A peer that never closes its side (a pooled client that has not looked at the
            // socket yet) would hold the connection, and a graceful shutdown, open: it is
            // closed fully a second later.
            let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
            promise.futureResult.whenComplete { _ in
                bound.value.close(mode: .output, promise: nil)
                bound.value.eventLoop.scheduleTask(in: .seconds(1)) { bound.value.close(promise: nil) }
            }
            return
        }
        if let reader {
            // The request came as bytes: its answer goes as bytes, and the reader reads on.
            reader.writeAnswer(head, body: body, promise: nil)
            reader.answered()
            return
        }
        context.write(wrapOutboundOut(.head(HotRequestHead.framed(head, bodyLength: body.readableBytes, date: HTTPDate.now()))), promise: nil)
        if body.readableBytes > 0 { context.write(wrapOutboundOut(.body(.byteBuffer(body))), promise: nil) }
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
        // Answered within the replay below (an answer found without waiting, ``run(_:_:context:)``):
        // that replay goes on with the parts after it, in its loop rather than in a new one.
        if replaying { return }
        var replayed = false
        replaying = true
        while !answering, !held.isEmpty {
            let part = held.removeFirst()
            if leaving != nil {
                // The upgrade took the connection: the rest goes on as it came.
                context.fireChannelRead(wrapInboundOut(part))
            } else {
                process(part, context: context)
            }
            replayed = true
        }
        replaying = false
        // Parts passed on reach Hummingbird's request stream at the read's completion.
        if replayed { context.fireChannelReadComplete() }
        answerParseFailureIfDue(context: context)
        if !answering, readPending {
            readPending = false
            context.read()
        }
        if let token = leaving.take() { context.leavePipeline(removalToken: token) }
    }

    /// Asked to leave (a WebSocket upgrade was accepted: ``TetherHTTPChannel``). In the middle
    /// of replaying held parts, it stays until the replay has passed the rest of the upgrade
    /// request on; otherwise it leaves at once.
    func removeHandler(context: ChannelHandlerContext, removalToken: ChannelHandlerContext.RemovalToken) {
        if replaying {
            leaving = removalToken
        } else {
            context.leavePipeline(removalToken: removalToken)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        guard leaving == nil, error is HTTPParserError, !parseFailed else {
            context.fireErrorCaught(error)
            return
        }
        // The parser stops at its first error (NIO's decoder reads nothing after it). What it
        // refused is answered with the protocol's JSON 400 — after every request before it, hot
        // or passed on, so no answer is lost or reordered — and the connection closes.
        if !held.isEmpty {
            // Behind a hot answer: a request cut short among the parts waiting is dropped whole.
            if let head = held.lastIndex(where: { if case .head = $0 { true } else { false } }),
               !held[head...].contains(where: { if case .end = $0 { true } else { false } }) {
                held.removeSubrange(head...)
            }
        } else {
            switch reading {
            case .idle:
                break
            case .collecting:
                // A hot request cut short mid-body: nothing of it is answered or stored.
                reading = .idle
            case .forwarding:
                // Hummingbird is reading this request's body: its stream fails, so nothing of
                // it is stored, and Hummingbird answers and closes.
                context.fireErrorCaught(error)
                return
            }
        }
        parseFailed = true
        answerParseFailureIfDue(context: context)
    }

    /// Writes the JSON 400 for what the parser refused once nothing before it awaits an
    /// answer, then closes.
    private func answerParseFailureIfDue(context: ChannelHandlerContext) {
        guard parseFailed, !parseFailureAnswered, !answering, held.isEmpty, forwardedInFlight == 0 else { return }
        parseFailureAnswered = true
        inputDone = true
        let body = ErrorBody.service(status: 400, service: "Balancer", message: "Could Not Parse Request")
        var head = HTTPResponseHead(version: .http1_1, status: .badRequest)
        head.headers.add(name: "Content-Type", value: "text/javascript; charset=\"UTF-8\"")
        head.headers.add(name: "Content-Length", value: String(body.count))
        head.headers.add(name: "Date", value: HTTPDate.now())
        head.headers.add(name: "Connection", value: "close")
        context.write(wrapOutboundOut(.head(head)), promise: nil)
        context.write(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(bytes: body)))), promise: nil)
        let promise = context.eventLoop.makePromise(of: Void.self)
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: promise)
        let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
        promise.futureResult.whenComplete { _ in bound.value.close(promise: nil) }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        // The client closed its side: nothing more will be asked, and a parked long-poll's
        // answer would go nowhere.
        if let event = event as? ChannelEvent, event == .inputClosed {
            context.close(promise: nil)
        }
        // Shutting down: a connection in the middle of a hot request closes after its answer
        // (Hummingbird's handler never saw the request and would close it at once).
        if event is ChannelShouldQuiesceEvent, answering || isCollecting || reader?.isReadingBody == true {
            closeAfterAnswer = true
            return
        }
        // Idle, and Hummingbird's handlers never saw a request (they are not even in the
        // pipeline of a connection that only sent hot requests): nothing else would close it.
        if event is ChannelShouldQuiesceEvent, !hummingbirdOpened {
            context.close(promise: nil)
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    // MARK: Outbound

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        guard leaving == nil, case .end = unwrapOutboundIn(data) else { return context.write(data, promise: promise) }
        forwardedInFlight = max(0, forwardedInFlight - 1)
        lastActivity = context.eventLoop.now
        context.write(data, promise: promise)
        answerParseFailureIfDue(context: context)
        if forwardedInFlight == 0, readerAwaitsForwarded, let reader {
            // The reader reads on after Hummingbird's answer to what it passed on — once
            // Hummingbird's write is done, not inside it.
            readerAwaitsForwarded = false
            let bound = NIOLoopBound(reader, eventLoop: context.eventLoop)
            context.eventLoop.execute { bound.value.answered() }
        }
    }

    /// Hummingbird's side closes the connection (after its answer to a request that asked
    /// for it, at a graceful shutdown, or on an error): nothing read after that is answered,
    /// so nothing more is read — a hot request the reader holds behind Hummingbird's answer
    /// would otherwise run with its answer going nowhere.
    func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        inputDone = true
        readerAwaitsForwarded = false
        reader?.closeAfterAnswer()
        context.close(mode: mode, promise: promise)
    }

    /// Reading goes on while a hot request is answered, and stops only once a request is held
    /// behind the answer: a keep-alive client sends nothing more before its answer, so there is
    /// nothing to hold back, and stopping a socket's reading costs two `epoll_ctl` calls per
    /// request (unregistering its read interest, then registering it again after the answer:
    /// ~5 % of the server's CPU for `GET /time/0`, docs/benchmarks.md). What a pipelining client
    /// can make this handler hold stays a read or two: the read asked for after the first held
    /// part waits for the answer. After a parse error nothing more is read either (the decoder
    /// would only report every later read as data after its error).
    func read(context: ChannelHandlerContext) {
        if answering && (!held.isEmpty || parseFailed) {
            readPending = true
        } else {
            context.read()
        }
    }

    // MARK: Idle timeout

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        lastActivity = context.eventLoop.now
        loopShare = inFlight.loopShare(for: context.eventLoop, idleTimeout: idleTimeout)
        loopShare.add(self)
        // Counted while in the pipeline; a connection accepted after the server stopped
        // (``HotPathTasks/stopAll()``) is closed at once.
        if !inFlight.connectionOpened() { context.close(promise: nil) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        reader = nil
        loopShare.remove(self)
        inFlight.connectionClosed()
        self.context = nil
    }

    /// Whether a hot request's head has arrived and its end not yet.
    private var isCollecting: Bool {
        if case .collecting = reading { return true }
        return false
    }

    /// Whether a request's head has arrived and its end not yet (or, with the
    /// ``HotRequestReader``, any part of a request).
    private var isReadingRequest: Bool {
        if reader?.isMidRequest == true { return true }
        if case .idle = reading { return false }
        return true
    }

    /// The task executor of the connection's event loop (the one its hot answers run on), for
    /// what else serves the connection: a WebSocket session's tasks (``TetherHTTPChannel``).
    /// Valid once the handler is in a pipeline.
    var loopExecutor: EventLoopTaskExecutor { loopShare.executor }

    /// Closes the connection (the server stopped: ``HotPathTasks/stopAll()``).
    fileprivate func closeConnection() { context?.close(promise: nil) }

    /// Hummingbird's rule: a connection is closed after `idleTimeout` without reading anything,
    /// unless a request it sent whole is being answered (a long-poll). A request whose body
    /// stops arriving does not hold the connection open. Run by the loop's sweep
    /// (``HotPathLoop``), so a connection is closed up to one sweep period after its timeout.
    fileprivate func idleCheck(now: NIODeadline) {
        guard let context, context.channel.isActive else { return }
        if !isReadingRequest, answering || forwardedInFlight > 0 { return }
        if now - lastActivity >= idleTimeout { context.close(promise: nil) }
    }
}

extension TetherResponder {
    /// ``answer(_:context:)`` for the hot path: the response head and its body in one buffer.
    /// The head is the route's as it is: its `Content-Length` and `Date`, if any, are not what
    /// goes out — the writer writes the answer's own as it writes
    /// (``HotRequestHead/encode(_:body:date:allocator:inlineBody:)``,
    /// ``HotRequestHead/framed(_:bodyLength:date:)``).
    /// `nil` when the request is a long-poll that parked in the hub (``LongPollSlot``).
    nonisolated(nonsending) func respondCollected(to request: Request, context: TetherRequestContext) async -> (HTTPResponse, ByteBuffer)? {
        let response = await answer(request, context: context)
        if let slot = context.longPollSlot, slot.parked.exchange(false, ordering: .acquiringAndReleasing) { return nil }
        let sink = CollectedBody()
        do {
            try await response.body.write(CollectingBodyWriter(sink: sink))
        } catch {
            state.logger.error("response body failed", metadata: ["error": "\(error)"])
        }
        return (response.head, sink.buffer.withLock { $0 })
    }
}

/// A hot subscribe's state across the waits it parks in the hub without a task: when it must
/// answer and the cursor it reads after (set by its first run, kept by the runs after a
/// wake-up), its signature verdict, whether its last run parked, and what runs it again.
final class LongPollSlot: Sendable {
    /// The long-poll's answer deadline and the cursor it reads after; `nil` until its first
    /// run sets them.
    let resumePoint = Mutex<(deadline: NIODeadline, after: Timetoken)?>(nil)
    /// Set when a run parked (its answer is not written).
    let parked = Atomic<Bool>(false)
    /// The first run's verdict on the request's signature (its timestamp is only fresh then).
    let signature = Mutex<AccessManager.SignatureVerdict?>(nil)
    /// What ends a parked long-poll whose client went away (set by the run that parked it:
    /// the console's record of it, the 499 it counts as).
    let onGone = Mutex<(@Sendable () -> Void)?>(nil)
    private let onWake: @Sendable (LongPollSlot, WakeReason) -> Void

    init(onWake: @escaping @Sendable (LongPollSlot, WakeReason) -> Void) { self.onWake = onWake }

    /// The parked wait ended: run the request again (or end it, for a client gone).
    func wake(_ reason: WakeReason) {
        if reason == .clientGone, let gone = onGone.withLock({ $0.take() }) { gone() }
        onWake(self, reason)
    }

    /// How the hub parks this long-poll: it reports the cursor the run had read up to (the next
    /// run reads after it), then wakes it once.
    var parking: LongPollParking {
        LongPollParking(parked: { [self] _, after in
            resumePoint.withLock { point in point = point.map { ($0.deadline, after) } }
        }, wake: { [self] reason in wake(reason) })
    }
}

/// Where ``CollectingBodyWriter`` puts a response body.
final class CollectedBody: Sendable {
    let buffer = Mutex(ByteBuffer())
}

/// A response body writer that keeps what it is given.
struct CollectingBodyWriter: ResponseBodyWriter {
    let sink: CollectedBody

    mutating func write(_ buffer: ByteBuffer) async throws {
        var buffer = buffer
        sink.buffer.withLock { collected in
            // A body written at once (every hot answer's) is kept as it is, not copied.
            if collected.readableBytes == 0 {
                collected = buffer
            } else {
                collected.writeBuffer(&buffer)
            }
        }
    }

    consuming func finish(_ trailingHeaders: HTTPFields?) async throws {}
}

/// The `Date` header's value (RFC 9110 IMF-fixdate), made at most once a second per thread.
enum HTTPDate {
    private static let cache = Mutex<(Int, String)>((0, ""))

    static func now() -> String {
        let seconds = time(nil)
        if let cached = cache.withLock({ $0.0 == seconds ? $0.1 : nil }) as String? { return cached }
        let text = format(seconds)
        cache.withLock { $0 = (seconds, text) } as Void
        return text
    }

    static func format(_ seconds: Int) -> String {
        var t = time_t(seconds)
        var parts = tm()
        gmtime_r(&t, &parts)
        let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        func two(_ n: Int32) -> String { n < 10 ? "0\(n)" : "\(n)" }
        return "\(days[Int(parts.tm_wday)]), \(two(parts.tm_mday)) \(months[Int(parts.tm_mon)]) \(parts.tm_year + 1900) "
            + "\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)) GMT"
    }
}

/// A task executor that runs jobs on one NIO event loop, so a request's task runs where its
/// connection's I/O does.
final class EventLoopTaskExecutor: TaskExecutor {
    let loop: any EventLoop

    init(_ loop: any EventLoop) { self.loop = loop }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        loop.execute { job.runSynchronously(on: executor) }
    }
}

/// What the hot paths of one event loop's connections share, instead of each keeping its own:
/// the task executor their answers run on, and one repeating sweep that checks their idle
/// timeouts every tenth of the timeout, instead of a timer per connection (a NIO timer, its
/// promise and closure were ~0.3 KiB of every idle connection). The sweep runs only while the
/// loop has connections. Used on its event loop only.
final class HotPathLoop: @unchecked Sendable {
    let loop: any EventLoop
    let executor: EventLoopTaskExecutor
    private let period: TimeAmount
    private var members: [HotPathHandler] = []
    private var sweep: Scheduled<Void>?

    init(loop: any EventLoop, idleTimeout: TimeAmount) {
        self.loop = loop
        self.executor = EventLoopTaskExecutor(loop)
        self.period = max(.milliseconds(100), .nanoseconds(idleTimeout.nanoseconds / 10))
    }

    /// Connections in the sweep (tests).
    var count: Int { members.count }

    fileprivate func add(_ handler: HotPathHandler) {
        handler.sweepIndex = members.count
        members.append(handler)
        if sweep == nil { schedule() }
    }

    fileprivate func remove(_ handler: HotPathHandler) {
        let index = handler.sweepIndex
        guard index >= 0, index < members.count, members[index] === handler else { return }
        let last = members.removeLast()
        if index < members.count {
            members[index] = last
            last.sweepIndex = index
        }
        handler.sweepIndex = -1
        if members.isEmpty {
            sweep?.cancel()
            sweep = nil
        }
    }

    /// Closes every connection in the sweep (``HotPathTasks/stopAll()``).
    fileprivate func closeAll() {
        // A copy: closing a connection takes its handler out.
        for handler in members { handler.closeConnection() }
    }

    private func schedule() {
        sweep = loop.scheduleTask(in: period) { [self] in
            sweep = nil
            let now = loop.now
            // A copy: closing a connection can take its handler out while the sweep runs.
            for handler in members { handler.idleCheck(now: now) }
            if !members.isEmpty, sweep == nil { schedule() }
        }
    }
}

/// What a graceful shutdown waits for (``HotPathDrainService``) before presence and the store
/// stop, server-wide: the hot path's answers in flight, the tasks running the Hummingbird side of
/// connections that needed one (``TetherHTTPChannel``), and the open connections — none of them
/// is one of Hummingbird's per-connection tasks, which its server would have waited for.
/// ``stopAll()`` ends them when the server's run is cancelled or the wait runs out. It also holds
/// what each event loop's hot paths share (``HotPathLoop``: the answers' executor and the idle
/// sweep).
final class HotPathTasks: Sendable {
    private let count = Atomic<Int>(0)
    /// Connections whose hot path is in their pipeline (``HotPathHandler``).
    private let open = Atomic<Int>(0)
    /// Set by ``stopAll()``: connections opened later are closed at once.
    private let stopped = Atomic<Bool>(false)

    private struct Registry {
        var nextLoop: UInt64 = 0
        /// Connections' request loops (Hummingbird's, or the wait for a WebSocket upgrade),
        /// started when their hot path first passed a request on, with their connections; and
        /// WebSocket sessions, which have no task (`nil`: ``startTaskless(channel:)``).
        var loops: [UInt64: (task: Task<Void, Never>?, channel: (any Channel)?)] = [:]
        /// Set when the server's run was cancelled: what starts later is cancelled at once.
        var stopped = false
    }

    private let registry = Mutex(Registry())
    /// What each event loop's hot paths share (``HotPathLoop``), by loop.
    private let loops = Mutex<[ObjectIdentifier: HotPathLoop]>([:])

    /// The share of the hot paths on `loop` (made at its first connection).
    func loopShare(for loop: any EventLoop, idleTimeout: TimeAmount) -> HotPathLoop {
        loops.withLock { loops in
            let key = ObjectIdentifier(loop)
            if let share = loops[key], share.loop === loop { return share }
            let share = HotPathLoop(loop: loop, idleTimeout: idleTimeout)
            loops[key] = share
            return share
        }
    }

    func started() { count.add(1, ordering: .relaxed) }
    func ended() { count.subtract(1, ordering: .releasing) }
    var running: Int { count.load(ordering: .acquiring) }

    /// Counts a connection as open; `false` when the server has stopped (the caller closes it).
    /// Called from its hot path's `handlerAdded`, on its event loop, after it joined its loop's
    /// sweep: ``stopAll()`` either finds it there or is seen here.
    func connectionOpened() -> Bool {
        open.add(1, ordering: .relaxed)
        return !stopped.load(ordering: .acquiring)
    }

    func connectionClosed() { open.subtract(1, ordering: .releasing) }

    /// Connections still open: a graceful shutdown waits for them too, as Hummingbird's server
    /// waited for each connection's task when that task lived as long as its connection.
    var openConnections: Int { open.load(ordering: .acquiring) }

    /// Runs a connection's request loop in a task of its own, counted and cancellable; a stop
    /// (``stopAll()``) cancels it and closes `channel`.
    func startLoop(executor: (any TaskExecutor)?, channel: (any Channel)? = nil, _ loop: @escaping @Sendable () async -> Void) {
        started()
        registry.withLock { r in
            let id = r.nextLoop
            r.nextLoop += 1
            let task = Task(executorPreference: executor) {
                await loop()
                self.registry.withLock { _ = $0.loops.removeValue(forKey: id) }
                self.ended()
            }
            if r.stopped {
                task.cancel()
                channel?.close(promise: nil)
            } else {
                r.loops[id] = (task, channel)
            }
        }
    }

    /// Counts a connection served without a task (a WebSocket session, ``WebSocketSessionHandler``)
    /// as a running loop until ``endTaskless(_:)``: a graceful shutdown waits for it, and a stop
    /// closes it. `nil` when the server has stopped (the caller closes the connection).
    func startTaskless(channel: any Channel) -> UInt64? {
        registry.withLock { r -> UInt64? in
            guard !r.stopped else { return nil }
            let id = r.nextLoop
            r.nextLoop += 1
            r.loops[id] = (nil, channel)
            started()
            return id
        }
    }

    /// The connection of ``startTaskless(channel:)`` is done with.
    func endTaskless(_ id: UInt64) {
        registry.withLock { _ = $0.loops.removeValue(forKey: id) }
        ended()
    }

    /// The server's run was cancelled (or its graceful shutdown ran out of time): cancels the
    /// request loops running and closes their connections (a WebSocket session's hot path has
    /// left its pipeline), and closes every connection still open with its hot path (on its event
    /// loop), as Hummingbird's server cancels the tasks it owns; loops and connections that start
    /// later are stopped at once. Returns how many loops and hot-path connections it stopped.
    @discardableResult
    func stopAll() -> (loops: Int, connections: Int) {
        stopped.store(true, ordering: .releasing)
        let loopsRunning = registry.withLock { r in
            r.stopped = true
            return Array(r.loops.values)
        }
        let connections = openConnections
        for (task, channel) in loopsRunning {
            task?.cancel()
            channel?.close(promise: nil)
        }
        for share in loops.withLock({ Array($0.values) }) {
            share.loop.execute { share.closeAll() }
        }
        return (loopsRunning.count, connections)
    }
}

/// What a connection needs beyond the hot path, built when the hot path first passes a request
/// on (``TetherHTTPChannel``).
protocol HummingbirdOpener: AnyObject, Sendable {
    /// Adds Hummingbird's handlers after the hot path of `channel` and starts what runs them.
    /// Called on the connection's event loop, before the request is passed on.
    func openHummingbird(on channel: any Channel)
}
