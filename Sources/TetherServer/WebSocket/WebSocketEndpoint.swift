import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdCore
import HummingbirdWebSocket
import Logging
import NIOCore
import NIOHTTP1
import ServiceLifecycle
@_spi(Benchmarks) import TetherProtocol
import TetherServerCore

/// `GET /v2/ws`: decides each WebSocket upgrade on the REST port (path, sub-protocol, the
/// connection bound) and hands an accepted socket to a ``WebSocketConnection``.
struct WebSocketEndpoint: Sendable {
    let sessions: WebSocketSessions
    let responder: TetherResponder
    let maxFrameBytes: Int

    /// The frame-size limit: room for the largest message of any keyset, JSON-escaped.
    static func maxFrameBytes(keysets: KeysetRegistry) -> Int {
        let largest = keysets.all.map { keysets.limits(for: $0).maxMessageBytes }.max() ?? Limits().maxMessageBytes
        return max(64 * 1024, 2 * largest + 4096)
    }

    /// The channel configuration: no library auto-ping (the session protocol pings with ids and
    /// counts missed pongs itself), a short close handshake.
    func configuration(http1: HTTP1Channel.Configuration) -> HTTP1WebSocketUpgradeChannel.Configuration {
        .init(http1: http1, ws: .init(maxFrameSize: maxFrameBytes, autoPing: .disabled, closeTimeout: .seconds(2)))
    }

    func shouldUpgrade(_ request: HTTPRequest, _ channel: any Channel, _ logger: Logger)
        -> ShouldUpgradeResult<WebSocketDataHandler<HTTP1WebSocketUpgradeChannel.Context>>
    {
        // An upgrade attempt: the connection's task runs what follows (``TetherUpgradeChannel``).
        HummingbirdGate.open(channel.pipeline)
        let path = request.path.map { $0.split(separator: "?", maxSplits: 1).first.map(String.init) ?? $0 } ?? ""
        guard sessions.settings.enabled, path == WebSocketProtocol.path else { return .dontUpgrade }
        let offered = request.headerFields[values: .secWebSocketProtocol]
            .flatMap { $0.split(separator: ",") }
            .map { $0.trimmingCharacters(in: .whitespaces) }
        var headers: HTTPFields = [:]
        if !offered.isEmpty {
            guard offered.contains(WebSocketProtocol.jsonSubprotocol) else { return .dontUpgrade }
            headers[.secWebSocketProtocol] = WebSocketProtocol.jsonSubprotocol
        }
        let queue = OutboundQueue(maxFrames: sessions.settings.outboundBufferFrames, maxBytes: sessions.settings.outboundBufferBytes)
        guard let id = sessions.connect(channel: channel, queue: queue) else {
            // Overload (or draining): 503 with Retry-After, written before the library's own
            // refusal of the upgrade, which the client never reads (the connection closes).
            logger.debug("WebSocket upgrade refused: connection limit or draining")
            var head = HTTPResponseHead(version: .http1_1, status: .serviceUnavailable)
            head.headers.add(name: "Retry-After", value: "5")
            head.headers.add(name: "Content-Length", value: "0")
            head.headers.add(name: "Connection", value: "close")
            channel.write(HTTPServerResponsePart.head(head), promise: nil)
            channel.writeAndFlush(HTTPServerResponsePart.end(nil), promise: nil)
            return .dontUpgrade
        }
        let connection = WebSocketConnection(id: id, channel: channel, queue: queue, sessions: sessions, responder: responder,
                                             maxFrameBytes: maxFrameBytes)
        channel.closeFuture.whenComplete { _ in connection.releaseIfNeverRun() }
        // The socket stops speaking HTTP: the hot path after the HTTP decoder goes with it.
        if let context = try? channel.pipeline.syncOperations.context(handlerType: HotPathHandler.self) {
            channel.pipeline.syncOperations.removeHandler(context: context, promise: nil)
        }
        return .upgrade(headers) { inbound, outbound, _ in
            await connection.run(inbound: inbound, outbound: outbound)
        }
    }
}

/// Runs the WebSocket sessions' timers; on graceful shutdown it drains every session (notice,
/// then close `1012`) and waits up to 3 s for the sockets to close. Listed last in the service
/// group, so it hears of shutdown first — before long-polls are answered and the HTTP server
/// stops.
struct WebSocketSessionsService: Service {
    let sessions: WebSocketSessions

    func run() async throws {
        await cancelWhenGracefulShutdown { await sessions.run() }
        sessions.drain()
        let deadline = ContinuousClock.now + .seconds(3)
        while sessions.connectionCount > 0, ContinuousClock.now < deadline {
            do { try await Task.sleep(for: .milliseconds(20)) } catch { return }
        }
    }
}

/// The HTTP/1 child channel of a server with the WebSocket endpoint: Hummingbird's upgrade
/// channel, with the hot path (``HotPathHandler``) in front of its upgrade handler. A first
/// request the hot path answers never reaches the upgrade handler, so a connection that only
/// sends hot requests never gets Hummingbird's HTTP/1 handlers or its `NIOAsyncChannel`; the
/// hot path also gives a request the HTTP parser rejects the protocol's JSON 400 and closes a
/// connection that sends nothing within the idle timeout.
struct TetherUpgradeChannel: ServerChildChannel {
    typealias Value = HTTP1WebSocketUpgradeChannel.Value
    /// Hummingbird's channel, shared by every connection's waiting loop (``SharedChannel``).
    private let boxed: SharedChannel<HTTP1WebSocketUpgradeChannel>
    private var inner: HTTP1WebSocketUpgradeChannel { boxed.channel }
    /// Counts the loops started after the connection's task returned.
    let tasks: HotPathTasks
    /// Makes the connection's ``HotPathHandler``.
    let hotPath: @Sendable () -> HotPathHandler

    init(inner: HTTP1WebSocketUpgradeChannel, tasks: HotPathTasks, hotPath: @escaping @Sendable () -> HotPathHandler) {
        self.boxed = SharedChannel(inner)
        self.tasks = tasks
        self.hotPath = hotPath
    }

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        inner.setup(channel: channel, logger: logger).flatMapThrowing { value in
            try HummingbirdGate.install(on: channel, tasks: tasks, hotPath: hotPath())
            return value
        }
    }

    func handle(value: Value, logger: Logger) async {
        // The library logs every connection whose upgrade negotiation fails (a failed TLS
        // handshake, a peer gone before its first request) at `error`; none of them is the
        // operator's to act on, so its logger only speaks at `critical`. Tether's own handlers
        // log through the server's logger.
        // The request loop (or the WebSocket session) starts once needed: a request the hot
        // path passes on, an upgrade attempt (``WebSocketEndpoint/shouldUpgrade``) or the end.
        // (The quiet logger is made then too: an idle connection keeps no copy of it.)
        let boxed = boxed
        await HummingbirdGate.whenOpen(value.channel, tasks: tasks) {
            var quiet = logger
            quiet.logLevel = max(logger.logLevel, .critical)
            await boxed.channel.handle(value: value, logger: quiet)
        }
    }
}
