import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import Synchronization
import Tether

/// A small HTTP/1.1 server whose every answer is scripted by the test: the misbehaving servers
/// the SDK's status categories are produced against (a server that never answers, an HTML
/// captive portal, truncated JSON, 400/403/481 bodies, too many envelopes, a self-signed TLS
/// certificate...), and a recorder proving when the client first connects.
///
/// ```swift
/// let server = try await ScriptedServer.start { request in .html(status: 200, "<html>Sign in</html>") }
/// // point a client at server.origin, then:
/// try await server.stop()
/// ```
public final class ScriptedServer: Sendable {
    /// A request as received.
    public struct Request: Sendable, Hashable {
        /// The method (`GET`, `POST`...).
        public var method: String
        /// The raw request target (path and query).
        public var uri: String
        /// Header fields.
        public var headers: [String: String]
        /// The body.
        public var body: [UInt8]

        /// The path without the query.
        public var path: String { String(uri.split(separator: "?", maxSplits: 1).first ?? "") }

        /// The query parameters (raw, undecoded values).
        public var query: [String: String] {
            guard let q = uri.split(separator: "?", maxSplits: 1).dropFirst().first else { return [:] }
            var out: [String: String] = [:]
            for pair in q.split(separator: "&") {
                let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                out[String(parts[0])] = parts.count > 1 ? String(parts[1]) : ""
            }
            return out
        }
    }

    /// What the server does with a request.
    public enum Reply: Sendable {
        /// Answers with a status, headers and body (a correct `Content-Length` is added).
        case respond(status: Int, headers: [String: String], body: [UInt8])
        /// Writes these exact bytes on the socket (a hand-made, possibly broken response), then
        /// closes the connection when `close` is true.
        case raw([UInt8], close: Bool)
        /// Never answers; keeps the connection open.
        case hang
        /// Closes the connection without answering.
        case close

        /// A JSON answer with PubNub's content type.
        public static func json(status: Int = 200, _ text: String) -> Reply {
            .respond(status: status, headers: ["Content-Type": "text/javascript; charset=\"UTF-8\""], body: Array(text.utf8))
        }

        /// An HTML answer (a captive portal or proxy page).
        public static func html(status: Int = 200, _ text: String) -> Reply {
            .respond(status: status, headers: ["Content-Type": "text/html"], body: Array(text.utf8))
        }
    }

    /// TLS on the listening socket.
    public enum TLS: Sendable {
        /// Plain HTTP.
        case none
        /// HTTPS with the given identity.
        case identity(TestCertificates.Identity)
    }

    private struct State {
        var requests: [Request] = []
        var accepted = 0
        var open = 0
        var openWatchers = ConditionWatchers<Int>()
    }

    private let state = Mutex(State())
    private let channel: any Channel
    private let group: MultiThreadedEventLoopGroup

    /// The listening port.
    public let port: Int

    /// `127.0.0.1:<port>`.
    public var origin: String { "127.0.0.1:\(port)" }

    /// Every request received so far.
    public var requests: [Request] { state.withLock { $0.requests } }

    /// How many TCP connections were accepted so far.
    public var connectionsAccepted: Int { state.withLock { $0.accepted } }

    /// How many TCP connections are open now.
    public var openConnections: Int { state.withLock { $0.open } }

    /// Returns once exactly `count` TCP connections are open (at once if they are), or when the
    /// calling task is cancelled: resumed by the accept or close that makes the count.
    package func waitUntilOpenConnections(_ count: Int) async {
        await ConditionWatchers.wait(until: { $0 == count }) { body in state.withLock { body(&$0.openWatchers, $0.open) } }
    }

    private init(channel: any Channel, group: MultiThreadedEventLoopGroup, port: Int) {
        self.channel = channel
        self.group = group
        self.port = port
    }

    /// Starts a server on `127.0.0.1` (a free port) answering each request with `handler`.
    public static func start(tls: TLS = .none, handler: @escaping @Sendable (Request) -> Reply) async throws -> ScriptedServer {
        _ = HTTPDecoderTypes.ready  // before the first connection (``HTTPDecoderTypes``)
        let sslContext: NIOSSLContext?
        switch tls {
        case .none: sslContext = nil
        case .identity(let identity):
            let configuration = TLSConfiguration.makeServerConfiguration(
                certificateChain: try NIOSSLCertificate.fromPEMFile(identity.certificatePath).map { .certificate($0) },
                privateKey: .privateKey(try NIOSSLPrivateKey(file: identity.privateKeyPath, format: .pem)))
            sslContext = try NIOSSLContext(configuration: configuration)
        }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let box = ServerBox()
        let channel = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let sync = channel.pipeline.syncOperations
                    try sync.addHandler(ConnectionCounter(box: box))
                    if let sslContext { try sync.addHandler(NIOSSLServerHandler(context: sslContext)) }
                    try sync.configureHTTPServerPipeline(withErrorHandling: false)
                    try sync.addHandler(ScriptedHandler(box: box, handler: handler))
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        let server = ScriptedServer(channel: channel, group: group, port: channel.localAddress?.port ?? 0)
        box.server.withLock { $0 = server }
        return server
    }

    /// Stops listening, closes every connection and the event loop.
    public func stop() async throws {
        try? await channel.close()
        try await group.shutdownGracefully()
    }

    fileprivate func record(_ request: Request) { state.withLock { $0.requests.append(request) } }
    fileprivate func connectionOpened() {
        let reached = state.withLock { state in
            state.accepted += 1
            state.open += 1
            let open = state.open
            return state.openWatchers.satisfied(by: open)
        }
        for watcher in reached { watcher.resume() }
    }

    fileprivate func connectionClosed() {
        let reached = state.withLock { state in
            state.open -= 1
            let open = state.open
            return state.openWatchers.satisfied(by: open)
        }
        for watcher in reached { watcher.resume() }
    }
}

/// Lets handlers reach the server once it exists (handlers are created before `start` returns).
final class ServerBox: Sendable {
    let server = Mutex<ScriptedServer?>(nil)
    func with(_ body: (ScriptedServer) -> Void) {
        if let server = server.withLock({ $0 }) { body(server) }
    }
}

final class ConnectionCounter: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    let box: ServerBox
    init(box: ServerBox) { self.box = box }
    func channelActive(context: ChannelHandlerContext) {
        box.with { $0.connectionOpened() }
        context.fireChannelActive()
    }
    func channelInactive(context: ChannelHandlerContext) {
        box.with { $0.connectionClosed() }
        context.fireChannelInactive()
    }
}

final class ScriptedHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    let box: ServerBox
    let handler: @Sendable (ScriptedServer.Request) -> ScriptedServer.Reply
    private var head: HTTPRequestHead?
    private var body: [UInt8] = []

    init(box: ServerBox, handler: @escaping @Sendable (ScriptedServer.Request) -> ScriptedServer.Reply) {
        self.box = box
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
            var headers: [String: String] = [:]
            for (name, value) in head.headers { headers[name.lowercased()] = value }
            let request = ScriptedServer.Request(method: head.method.rawValue, uri: head.uri, headers: headers, body: body)
            box.with { $0.record(request) }
            respond(handler(request), context: context)
        }
    }

    private func respond(_ reply: ScriptedServer.Reply, context: ChannelHandlerContext) {
        switch reply {
        case .respond(let status, let headers, let body):
            var fields = HTTPHeaders()
            for (name, value) in headers { fields.add(name: name, value: value) }
            fields.replaceOrAdd(name: "Content-Length", value: String(body.count))
            let head = HTTPResponseHead(version: .http1_1, status: HTTPResponseStatus(statusCode: status), headers: fields)
            context.write(wrapOutboundOut(.head(head)), promise: nil)
            context.write(wrapOutboundOut(.body(.byteBuffer(context.channel.allocator.buffer(bytes: body)))), promise: nil)
            context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
        case .raw(let bytes, let close):
            // Bypass the HTTP encoder: write straight to the socket (or TLS) layer.
            let buffer = context.channel.allocator.buffer(bytes: bytes)
            let future = context.channel.writeAndFlush(buffer)
            if close {
                let channel = context.channel
                future.whenComplete { _ in channel.close(promise: nil) }
            }
        case .hang:
            break
        case .close:
            context.close(promise: nil)
        }
    }
}
