import NIOCore
import NIOHTTP1
import NIOHTTP2
import NIOPosix
import NIOSSL
import Synchronization
import Tether

/// A local HTTPS server standing in for a push gateway (APNs, FCM and its token endpoint), for
/// tests of the server's push providers: TLS with the test certificates
/// (`TestCertificates.server`), HTTP/2 negotiated with ALPN (HTTP/1.1 only when a client does
/// not offer `h2`, and then recorded as such), every request recorded exactly as received and
/// answered by the test's handler — which may wait, so a test can hold a request open.
public final class PushGatewayServer: Sendable {
    /// One request as the gateway received it.
    public struct Request: Sendable {
        /// `POST`, `GET`, …
        public var method: String
        /// The path with its query.
        public var path: String
        /// Header fields in order, names lowercased (HTTP/2 sends them so).
        public var headers: [(name: String, value: String)]
        /// The body.
        public var body: [UInt8]
        /// Whether the request came over HTTP/2.
        public var isHTTP2: Bool

        /// The first value of header `name` (case-insensitive).
        public func header(_ name: String) -> String? {
            let lowered = name.lowercased()
            return headers.first { $0.name.lowercased() == lowered }?.value
        }
    }

    /// The handler's answer.
    public struct Reply: Sendable {
        public var status: Int
        public var headers: [(String, String)]
        public var body: [UInt8]

        /// An answer with a JSON (or empty) body.
        public init(status: Int, headers: [(String, String)] = [], body: String = "") {
            self.status = status
            self.headers = headers
            self.body = Array(body.utf8)
        }
    }

    private let channel: any Channel
    private let group: MultiThreadedEventLoopGroup
    private let recorded: RecordedRequests
    /// The listening port.
    public let port: Int

    /// `https://localhost:<port>` (the test certificate names `localhost`).
    public var baseURL: String { "https://localhost:\(port)" }

    /// Every request received so far, in arrival order.
    public var requests: [Request] { recorded.requests.withLock { $0 } }

    private init(channel: any Channel, group: MultiThreadedEventLoopGroup, recorded: RecordedRequests, port: Int) {
        self.channel = channel
        self.group = group
        self.recorded = recorded
        self.port = port
    }

    /// Starts the server; `handler` answers each request (after it is recorded).
    public static func start(handler: @escaping @Sendable (Request) async -> Reply) async throws -> PushGatewayServer {
        _ = HTTPDecoderTypes.ready  // before the first connection (``HTTPDecoderTypes``)
        let identity = TestCertificates.server
        let chain = try NIOSSLCertificate.fromPEMFile(identity.certificatePath).map { NIOSSLCertificateSource.certificate($0) }
        let key = try NIOSSLPrivateKey(file: identity.privateKeyPath, format: .pem)
        var tls = TLSConfiguration.makeServerConfiguration(certificateChain: chain, privateKey: .privateKey(key))
        tls.applicationProtocols = ["h2", "http/1.1"]
        let context = try NIOSSLContext(configuration: tls)
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let recorded = RecordedRequests()
        let channel = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: context))
                }.flatMap {
                    channel.configureHTTP2SecureUpgrade(h2ChannelConfigurator: { channel in
                        channel.configureHTTP2Pipeline(mode: .server, inboundStreamInitializer: { stream in
                            stream.eventLoop.makeCompletedFuture {
                                try stream.pipeline.syncOperations.addHandlers([
                                    HTTP2FramePayloadToHTTP1ServerCodec(),
                                    GatewayRequestHandler(isHTTP2: true, recorded: recorded, handler: handler),
                                ])
                            }
                        }).map { _ in }
                    }, http1ChannelConfigurator: { channel in
                        channel.pipeline.configureHTTPServerPipeline().flatMapThrowing {
                            try channel.pipeline.syncOperations.addHandler(
                                GatewayRequestHandler(isHTTP2: false, recorded: recorded, handler: handler))
                        }
                    })
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        return PushGatewayServer(channel: channel, group: group, recorded: recorded, port: channel.localAddress?.port ?? 0)
    }

    /// Stops listening and the event loop.
    public func stop() async {
        try? await channel.close()
        try? await group.shutdownGracefully()
    }
}

/// The shared record, referenced by every connection's handlers.
final class RecordedRequests: Sendable {
    let requests = Mutex<[PushGatewayServer.Request]>([])
}

/// Collects one request (head, body, end), records it, awaits the handler, writes the answer.
final class GatewayRequestHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    let isHTTP2: Bool
    let recorded: RecordedRequests
    let handler: @Sendable (PushGatewayServer.Request) async -> PushGatewayServer.Reply
    // Event-loop confined (the handler's own channel).
    private var head: HTTPRequestHead?
    private var body: [UInt8] = []

    init(isHTTP2: Bool, recorded: RecordedRequests, handler: @escaping @Sendable (PushGatewayServer.Request) async -> PushGatewayServer.Reply) {
        self.isHTTP2 = isHTTP2
        self.recorded = recorded
        self.handler = handler
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            self.head = head
            body = []
        case .body(var buffer):
            body += buffer.readBytes(length: buffer.readableBytes) ?? []
        case .end:
            guard let head else { return }
            let request = PushGatewayServer.Request(method: head.method.rawValue, path: head.uri,
                                                    headers: head.headers.map { (name: $0.name.lowercased(), value: $0.value) },
                                                    body: body, isHTTP2: isHTTP2)
            recorded.requests.withLock { $0.append(request) }
            let handler = self.handler
            let keepAlive = head.isKeepAlive
            let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            context.eventLoop.makeFutureWithTask { await handler(request) }.whenSuccess { reply in
                let (this, context) = bound.value
                this.write(reply, context: context, keepAlive: keepAlive)
            }
        }
    }

    private func write(_ reply: PushGatewayServer.Reply, context: ChannelHandlerContext, keepAlive: Bool) {
        var headers = HTTPHeaders(reply.headers)
        headers.replaceOrAdd(name: "content-length", value: String(reply.body.count))
        let head = HTTPResponseHead(version: .http1_1, status: HTTPResponseStatus(statusCode: reply.status), headers: headers)
        context.write(wrapOutboundOut(.head(head)), promise: nil)
        if !reply.body.isEmpty {
            context.write(wrapOutboundOut(.body(.byteBuffer(context.channel.allocator.buffer(bytes: reply.body)))), promise: nil)
        }
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
    }
}
