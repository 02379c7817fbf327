public import Hummingbird
public import NIOCore
import HTTPTypes
import NIOHTTP1
import NIOHTTPTypes
import TetherProtocol

/// The per-request context: Hummingbird's core storage plus the connection, which long-polls
/// watch so they stop waiting as soon as their client goes away.
public struct TetherRequestContext: RequestContext {
    /// Hummingbird's storage.
    public var coreContext: CoreRequestContextStorage
    /// The client connection.
    public let channel: any Channel
    /// A hot-path subscribe's parking state (`HotPathHandler`): with it, a long-poll with
    /// nothing to deliver parks in the hub without holding a task.
    var longPollSlot: LongPollSlot?

    /// Creates the context for a request on `source.channel`.
    public init(source: ApplicationRequestContextSource) {
        self.coreContext = .init(source: source)
        self.channel = source.channel
    }
}

/// Closes a connection when the client half-closes it. Hummingbird enables remote
/// half-closure, so without this a client that hangs up is only noticed when a response is
/// written — 280 s later for a long-poll.
final class InputClosedCloser: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = NIOAny

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed {
            context.close(promise: nil)
        }
        context.fireUserInboundEventTriggered(event)
    }
}

/// Answers requests the HTTP parser itself refuses (garbage bytes, over-long headers, invalid
/// framing such as Content-Length with Transfer-Encoding) with the protocol's JSON error body and
/// closes the connection, instead of the framework's bare, bodiless 400.
///
/// Only errors *between* requests are answered here. An error in the middle of a request (a
/// body cut short) is passed on, so the request's body fails and nothing partial is ever stored.
final class ParserErrorResponder: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias OutboundOut = HTTPResponsePart

    private var answered = false
    private var inRequest = false

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head: inRequest = true
        case .body: break
        case .end: inRequest = false
        }
        context.fireChannelRead(data)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        guard error is HTTPParserError, !inRequest else {
            context.fireErrorCaught(error)
            return
        }
        guard !answered else { return }
        answered = true
        let body = ErrorBody.service(status: 400, service: "Balancer", message: "Could Not Parse Request")
        var head = HTTPResponse(status: .badRequest)
        head.headerFields[.contentType] = "text/javascript; charset=\"UTF-8\""
        head.headerFields[.contentLength] = String(body.count)
        head.headerFields[.connection] = "close"
        context.write(wrapOutboundOut(.head(head)), promise: nil)
        context.write(wrapOutboundOut(.body(ByteBuffer(bytes: body))), promise: nil)
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
        context.close(promise: nil)
    }
}
