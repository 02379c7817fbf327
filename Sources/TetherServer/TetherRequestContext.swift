public import Hummingbird
public import NIOCore

/// The per-request context: Hummingbird's core storage plus the connection, which long-polls
/// watch so they stop waiting as soon as their client goes away.
public struct TetherRequestContext: RequestContext {
    /// Hummingbird's storage.
    public var coreContext: CoreRequestContextStorage
    /// The client connection.
    public let channel: any Channel

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
