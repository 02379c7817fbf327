import HTTPTypes
import Hummingbird
import HummingbirdCore
import Logging
import NIOCore
import NIOHTTP1
import NIOHTTPTypes
import NIOHTTPTypesHTTP1
import NIOWebSocket
import Synchronization
import TetherProtocol

/// The server's HTTP/1 connections (and, with the WebSocket endpoint on, their upgrades to a
/// session). A new connection gets the request reader (``HotRequestReader``), NIO's HTTP/1
/// decoder and encoder behind it, and the hot path (``HotPathHandler``) — nothing else. Hummingbird's part of a connection — its HTTP/1
/// handlers, `NIOAsyncChannel` and request loop, or the upgrade handler with the WebSocket
/// upgrader — is built only when the hot path passes a request on (``openHummingbird(on:)``), so a
/// connection that only sends publishes, subscribes and time requests never builds it
/// (docs/benchmarks.md, "Hummingbird's side only when a request needs it").
///
/// One instance serves every connection of the server.
final class TetherHTTPChannel: ServerChildChannel, HTTPChannelHandler, HummingbirdOpener {
    struct Value: ServerChildChannelValue {
        let channel: any Channel
    }

    /// What a connection's upgrade negotiation ended with.
    enum UpgradeResult: Sendable {
        /// The session's handler is in the pipeline (``WebSocketSessionHandler``).
        case webSocket
        case notUpgraded(NIOAsyncChannel<HTTPRequestPart, HTTPResponsePart>)
        /// The request asked for an upgrade the endpoint refused: `400`, and the connection closes.
        case failedUpgrade(NIOAsyncChannel<HTTPRequestPart, HTTPResponsePart>)
    }

    /// Hummingbird's responder (with the WebSocket endpoint on, one that redirects an upgrade
    /// request arriving after others on the same connection to a new connection, `307`).
    let responder: Responder
    /// `nil` with `--ws off`: no connection upgrades.
    private let webSocket: WebSocketEndpoint?
    private let decoderLimits: NIOHTTPDecoderLimitConfiguration
    private let tasks: HotPathTasks
    private let hotPath: @Sendable (any HummingbirdOpener) -> HotPathHandler
    /// The logger of Hummingbird's part of each connection.
    private let logger: Logger
    /// The server's logger, for the WebSocket endpoint's upgrade decisions.
    private let serverLogger: Logger
    /// Counts the connections whose Hummingbird side was built.
    private let sides: HummingbirdSides

    /// - Parameters:
    ///   - responder: Hummingbird's responder for the requests the hot path passes on.
    ///   - webSocket: the WebSocket endpoint, or `nil` when upgrades are off.
    ///   - decoderLimits: the HTTP/1 decoder's limits (header sizes and count).
    ///   - tasks: where request loops, answers and open connections are counted.
    ///   - hotPath: makes a connection's ``HotPathHandler``, given what builds the rest of the
    ///     connection when it passes a request on (this channel).
    ///   - sides: counts the connections whose Hummingbird side was built.
    ///   - logger: the server's logger. Hummingbird's part of a connection gets a copy that
    ///     speaks at `critical` only: Hummingbird logs every connection whose request loop or
    ///     upgrade fails (a peer gone mid-request, a failed TLS handshake) at `error`, none of
    ///     which is the operator's to act on. The WebSocket endpoint's decisions use it as is.
    init(responder: @escaping Responder, webSocket: WebSocketEndpoint?, decoderLimits: NIOHTTPDecoderLimitConfiguration,
         tasks: HotPathTasks, hotPath: @escaping @Sendable (any HummingbirdOpener) -> HotPathHandler, sides: HummingbirdSides,
         logger: Logger) {
        self.responder = webSocket == nil ? responder : Self.redirectingUpgrades(responder)
        self.webSocket = webSocket
        self.decoderLimits = decoderLimits
        self.tasks = tasks
        self.hotPath = hotPath
        self.sides = sides
        self.serverLogger = logger
        var quiet = logger
        quiet.logLevel = max(logger.logLevel, .critical)
        self.logger = quiet
        // Made before the server listens, so before any connection (``HTTPDecoderTypes``).
        _ = HTTPDecoderTypes.ready
    }

    /// Prepares a new connection, before its first read: the request reader, NIO's HTTP/1
    /// encoder and decoder, and the hot path, in that order. Its first receive buffer is sized for a request
    /// line and its headers (512 bytes, growing as reads fill it) instead of NIO's 2 KiB: the
    /// last receive buffer is kept for the next read, so every idle connection holds one.
    ///
    /// The process's first connection is prepared alone (``FirstUseGate``): Swift's runtime can
    /// crash when two event loops build the same generic NIO handler types for the first time at
    /// once (``HTTPDecoderTypes``).
    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        channel.eventLoop.makeCompletedFuture {
            try Self.firstSetup.run { try prepare(channel) }
        }
    }

    /// Serializes the process's first connection setups (``setup(channel:logger:)``).
    private static let firstSetup = FirstUseGate()
    /// Serializes the process's first builds of Hummingbird's side (``openHummingbird(on:)``).
    private static let firstOpening = FirstUseGate()

    /// The body of ``setup(channel:logger:)``, on the connection's event loop.
    private func prepare(_ channel: any Channel) throws -> Value {
        try channel.syncOptions?.setOption(ChannelOptions.recvAllocator,
                                           value: AdaptiveRecvByteBufferAllocator(minimum: 64, initial: 512, maximum: 65536))
        let pipeline = channel.pipeline.syncOperations
        // NIO's upgradable pipeline gives a decoder that passes on what follows an upgrade
        // request and an encoder that knows which responses answer `HEAD`. Its upgrade
        // handler — here one with no upgraders — goes at once: with the WebSocket endpoint
        // on, the real one is added when a request reaches it (``openHummingbird(on:)``).
        var configuration = NIOUpgradableHTTPServerPipelineConfiguration<Void>(
            upgradeConfiguration: .init(upgraders: [], notUpgradingCompletionHandler: { $0.eventLoop.makeSucceededVoidFuture() }))
        configuration.enablePipelining = false
        configuration.enableErrorHandling = false
        configuration.enableResponseHeaderValidation = false  // HTTPTypes validates them
        configuration.decoderConfiguration = decoderLimits
        _ = try pipeline.configureUpgradableHTTPServerPipeline(configuration: configuration)
        try pipeline.removeHandler(context: pipeline.context(handlerType: NIOTypedHTTPServerUpgradeHandler<Void>.self), promise: nil)
        let hot = hotPath(self)
        try pipeline.addHandler(hot)
        // In front of NIO's encoder and decoder (after TLS, if any), the reader takes plain
        // hot requests from the bytes until the first request it does not take, which it
        // hands to the decoder with the rest; it writes their answers as bytes.
        let encoder = try pipeline.handler(type: HTTPResponseEncoder.self)
        try pipeline.addHandler(HotRequestReader(hotPath: hot), position: .before(encoder))
        return Value(channel: channel)
    }

    /// Nothing: a connection has no task of its own. What it needs beyond the hot path starts
    /// when a request needs it (``openHummingbird(on:)``), counted in ``HotPathTasks``, which a
    /// graceful shutdown waits for.
    func handle(value: Value, logger: Logger) async {}

    /// Builds Hummingbird's side of `channel` after its hot path and starts what runs it: the
    /// upgrade handler (which either upgrades to a WebSocket session or adds the HTTP/1 handlers
    /// and hands over), or with upgrades off the HTTP/1 handlers and the request loop. Called on
    /// the connection's event loop, before the first request passed on goes on.
    func openHummingbird(on channel: any Channel) {
        do {
            // The process's first one alone, as ``setup(channel:logger:)``.
            try Self.firstOpening.run { () throws -> Void in
                if let webSocket {
                    try openUpgrade(on: channel, endpoint: webSocket)
                } else {
                    let http1 = try addHTTP1Handlers(to: channel)
                    tasks.startLoop(executor: nil, channel: channel) { [self] in await handleHTTP(asyncChannel: http1, logger: logger) }
                }
            }
            sides.opened()
        } catch {
            serverLogger.error("could not build a connection's HTTP handlers; closing it", metadata: ["error": "\(error)"])
            channel.close(promise: nil)
        }
    }

    /// Hummingbird's HTTP/1 handlers and the `NIOAsyncChannel` its request loop reads.
    private func addHTTP1Handlers(to channel: any Channel) throws -> NIOAsyncChannel<HTTPRequestPart, HTTPResponsePart> {
        let pipeline = channel.pipeline.syncOperations
        try pipeline.addHandler(HTTP1ToHTTPServerCodec(secure: false))
        try pipeline.addHandler(HTTPConnectionStateHandler(idleTimeout: nil, logger: logger))
        return try NIOAsyncChannel(wrappingChannelSynchronously: channel, configuration: .init(isOutboundHalfClosureEnabled: true))
    }

    /// The upgrade handler with the WebSocket upgrader, deciding on the first request passed on.
    private func openUpgrade(on channel: any Channel, endpoint: WebSocketEndpoint) throws {
        let pipeline = channel.pipeline.syncOperations
        let encoder = try pipeline.handler(type: HTTPResponseEncoder.self)
        let decoder = try pipeline.handler(type: ByteToMessageHandler<HTTPRequestDecoder>.self)
        let hotPath = try pipeline.handler(type: HotPathHandler.self)
        let executor = hotPath.loopExecutor
        let attempted = NIOLoopBoundBox(false, eventLoop: channel.eventLoop)
        let accepted = NIOLoopBoundBox<WebSocketConnection?>(nil, eventLoop: channel.eventLoop)
        let logger = logger, serverLogger = serverLogger, tasks = tasks
        let upgrader = NIOTypedWebSocketServerUpgrader<UpgradeResult>(
            maxFrameSize: endpoint.maxFrameBytes,
            // The session's handler answers framing errors itself (``WebSocketSessionHandler``).
            enableAutomaticErrorHandling: false,
            shouldUpgrade: { channel, head in
                attempted.value = true
                let request: HTTPRequest
                do {
                    request = try HTTPRequest(head, secure: false, splitCookie: false)
                } catch {
                    return channel.eventLoop.makeFailedFuture(error)
                }
                switch endpoint.shouldUpgrade(request, channel, serverLogger, executor: executor) {
                case .dontUpgrade:
                    return channel.eventLoop.makeSucceededFuture(nil)
                case .upgrade(let headers, let connection):
                    accepted.value = connection
                    return channel.eventLoop.makeSucceededFuture(HTTPHeaders(headers))
                }
            },
            upgradePipelineHandler: { channel, _ in
                channel.eventLoop.makeCompletedFuture {
                    guard let connection = accepted.value else { throw ChannelError.inappropriateOperationForState }
                    let pipeline = channel.pipeline.syncOperations
                    // The session runs in its handler and short tasks on this loop, with no task
                    // of its own: counted as one, so a graceful shutdown waits for it and a stop
                    // closes it (``HotPathTasks/startTaskless(channel:)``).
                    try pipeline.addHandler(WebSocketSessionHandler(connection: connection, maxMessageBytes: endpoint.maxFrameBytes,
                                                                    executor: executor, tasks: tasks))
                    return .webSocket
                }
            })
        let upgrade = NIOTypedHTTPServerUpgradeHandler<UpgradeResult>(
            // An accepted upgrade takes the HTTP handlers out: the hot path first (it passes on
            // untouched what the decoder hands over as it goes), then the decoder.
            httpEncoder: encoder, extraHTTPHandlers: [hotPath, decoder],
            upgradeConfiguration: .init(upgraders: [upgrader], notUpgradingCompletionHandler: { [self] channel in
                channel.eventLoop.makeCompletedFuture {
                    let http1 = try addHTTP1Handlers(to: channel)
                    return attempted.value ? .failedUpgrade(http1) : .notUpgraded(http1)
                }
            }))
        try pipeline.addHandler(upgrade)
        let result = upgrade.upgradeResultFuture
        tasks.startLoop(executor: nil, channel: channel) { [self] in
            let outcome: UpgradeResult
            do {
                outcome = try await result.get()
            } catch {
                // The connection ended before the first request passed on was read whole, or
                // the upgrade failed after the pipeline changed: nothing more can be served.
                channel.close(promise: nil)
                return
            }
            switch outcome {
            case .notUpgraded(let http1):
                await handleHTTP(asyncChannel: http1, logger: logger)
            case .failedUpgrade(let http1):
                await Self.refuseUpgrade(http1)
            case .webSocket:
                break  // the session runs in its handler
            }
        }
    }

    /// A WebSocket upgrade the endpoint refused: `400`, and the connection closes.
    private static func refuseUpgrade(_ http1: NIOAsyncChannel<HTTPRequestPart, HTTPResponsePart>) async {
        try? await http1.executeThenClose { _, outbound in
            let head = HTTPResponse(status: .badRequest, headerFields: [.connection: "close", .contentLength: "0"])
            try await outbound.write(contentsOf: [.head(head), .end(nil)])
        }
    }

    /// A WebSocket upgrade request after other requests on a connection Hummingbird answers can
    /// no longer upgrade it: it is sent to a new connection (`307` to the same path, and this one
    /// closes), as Hummingbird does.
    private static func redirectingUpgrades(_ responder: @escaping Responder) -> Responder {
        struct RedirectClose: Error {}
        return { request, responseWriter, channel in
            guard request.headers[.upgrade] == "websocket" else {
                return try await responder(request, responseWriter, channel)
            }
            let location = request.uri.query.map { "\(request.uri.path)?\($0)" } ?? request.uri.path
            try await responseWriter.writeResponse(HTTPResponse(status: .temporaryRedirect,
                                                                headerFields: [.connection: "close", .location: location]))
            throw RedirectClose()
        }
    }
}

/// Counts the connections whose Hummingbird side was built (``TetherHTTPChannel``), for tests.
final class HummingbirdSides: Sendable {
    private let count = Atomic<Int>(0)

    func opened() { count.add(1, ordering: .relaxed) }

    /// Connections whose Hummingbird side was built since the server started.
    var total: Int { count.load(ordering: .relaxed) }
}
