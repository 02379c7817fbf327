import NIOCore
import NIOHTTP1
import NIOPosix
import Tether

/// A tiny HTTP endpoint that changes a ``FaultProxy``'s behaviour at runtime, for scripts:
///
/// ```sh
/// curl -s 127.0.0.1:9091                                  # status: fault and counters (JSON)
/// curl -s 127.0.0.1:9091 -d 'blackhole for 30s'           # any command of FaultProxy.run(command:)
/// curl -s 127.0.0.1:9091 -d 'reset; captive-portal for 20s'
/// ```
///
/// `GET` (any path) answers ``FaultProxy/statusJSON``; `POST` (any path) runs its body with
/// ``FaultProxy/run(command:)`` and answers `ok: ...` (200) or the error (400).
public final class FaultProxyControlServer: Sendable {
    private let channel: any Channel
    private let group: MultiThreadedEventLoopGroup

    /// The listening port.
    public let port: Int

    private init(channel: any Channel, group: MultiThreadedEventLoopGroup, port: Int) {
        self.channel = channel
        self.group = group
        self.port = port
    }

    /// Starts the endpoint for `proxy` on `host:port` (port 0: a free port).
    public static func start(proxy: FaultProxy, host: String = "127.0.0.1", port: Int = 0) async throws -> FaultProxyControlServer {
        _ = HTTPDecoderTypes.ready  // before the first connection (``HTTPDecoderTypes``)
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        do {
            let channel = try await ServerBootstrap(group: group)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                .childChannelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
                        try channel.pipeline.syncOperations.addHandler(ControlHandler(proxy: proxy))
                    }
                }
                .bind(host: host, port: port).get()
            return FaultProxyControlServer(channel: channel, group: group, port: channel.localAddress?.port ?? port)
        } catch {
            try? await group.shutdownGracefully()
            throw error
        }
    }

    /// Stops listening and the event loop.
    public func stop() async {
        try? await channel.close()
        try? await group.shutdownGracefully()
    }
}

private final class ControlHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    let proxy: FaultProxy
    var method: HTTPMethod = .GET
    var keepAlive = true
    var body: [UInt8] = []

    init(proxy: FaultProxy) { self.proxy = proxy }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            method = head.method
            keepAlive = head.isKeepAlive
            body = []
        case .body(let buffer):
            body.append(contentsOf: buffer.readableBytesView)
        case .end:
            guard method == .POST || method == .PUT else {
                respond(context: context, status: .ok, text: proxy.statusJSON + "\n", json: true)
                return
            }
            let command = String(decoding: body, as: UTF8.self)
            let proxy = proxy
            let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            Task {
                let status: HTTPResponseStatus
                let text: String
                do {
                    text = try await proxy.run(command: command)
                    status = .ok
                } catch {
                    text = "error: \(error)"
                    status = .badRequest
                }
                bound.eventLoop.execute {
                    let (handler, context) = bound.value
                    handler.respond(context: context, status: status, text: text + "\n", json: false)
                }
            }
        }
    }

    func respond(context: ChannelHandlerContext, status: HTTPResponseStatus, text: String, json: Bool) {
        let bytes = context.channel.allocator.buffer(string: text)
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: json ? "application/json" : "text/plain; charset=utf-8")
        headers.add(name: "Content-Length", value: "\(bytes.readableBytes)")
        if !keepAlive { headers.add(name: "Connection", value: "close") }
        context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: status, headers: headers))), promise: nil)
        context.write(wrapOutboundOut(.body(.byteBuffer(bytes))), promise: nil)
        let keepAlive = keepAlive
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in
            if !keepAlive { channel.close(promise: nil) }
        }
    }
}
