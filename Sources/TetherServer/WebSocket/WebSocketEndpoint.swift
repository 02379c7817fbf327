import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdCore
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

    /// What ``shouldUpgrade(_:_:_:executor:)`` decided.
    enum Decision: Sendable {
        case dontUpgrade
        /// Upgrade, answering with `headers`; the session runs on `connection`.
        case upgrade(HTTPFields, WebSocketConnection)
    }

    /// `executor`: the task executor of `channel`'s event loop, where the session's deliveries run.
    func shouldUpgrade(_ request: HTTPRequest, _ channel: any Channel, _ logger: Logger, executor: EventLoopTaskExecutor)
        -> Decision
    {
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
        let queue = OutboundQueue(channel: channel, maxFrames: sessions.settings.outboundBufferFrames,
                                  maxBytes: sessions.settings.outboundBufferBytes)
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
        let connection = WebSocketConnection(id: id, channel: channel, executor: executor, queue: queue, sessions: sessions,
                                             responder: responder, maxFrameBytes: maxFrameBytes)
        channel.closeFuture.whenComplete { _ in connection.releaseIfNeverRun() }
        return .upgrade(headers, connection)
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
