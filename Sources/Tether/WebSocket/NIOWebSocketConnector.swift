import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import NIOWebSocket
import Synchronization
import TetherClientCore
import TetherProtocol

/// The client's WebSocket connector on SwiftNIO: the HTTP/1.1 upgrade (TLS when the URL is
/// `wss://`), then text frames in and out. A refused upgrade keeps the server's status and
/// header fields (`503` + `Retry-After`, or the plain answer of a proxy that strips `Upgrade`),
/// which hummingbird-websocket's client does not expose.
package final class NIOWebSocketConnector: WebSocketConnector {
    private let group: MultiThreadedEventLoopGroup
    private let tlsConfiguration: TLSConfiguration
    private let maxFrameBytes: Int
    /// Received messages a socket may hold before the session reads them; past it the socket is
    /// closed (the session resumes from its cursor), so a stalled reader cannot grow memory.
    private let inboundLimit: Int
    /// Serializes the process's first connection pipelines: Swift's runtime can crash when two
    /// event loops build the same generic NIO handler types for the first time at once
    /// (``HTTPDecoderTypes``, ``FirstUseGate``).
    static let firstPipeline = FirstUseGate()

    /// Creates a connector with its own event-loop thread.
    package init(trustedCertificateAuthoritiesPEM: [UInt8]?, maxFrameBytes: Int = 4 << 20, inboundLimit: Int = 4096) throws {
        _ = HTTPDecoderTypes.ready  // before the first connection (``HTTPDecoderTypes``)
        group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        var tls = TLSConfiguration.makeClientConfiguration()
        if let pem = trustedCertificateAuthoritiesPEM {
            tls.trustRoots = .certificates(try NIOSSLCertificate.fromPEMBytes(pem))
        }
        tlsConfiguration = tls
        self.maxFrameBytes = maxFrameBytes
        self.inboundLimit = inboundLimit
    }

    package func shutdown() async {
        try? await group.shutdownGracefully()
    }

    private enum Upgrade: Sendable {
        case upgraded(NIOWebSocketLink)
        case notUpgraded(EventLoopFuture<HTTPResponseHead>)
    }

    package func connect(url: String, subprotocol: String, timeout: Duration) async throws(WebSocketConnectFailure) -> any WebSocketLink {
        guard let parsed = URLComponents(string: url), let host = parsed.host, let scheme = parsed.scheme else {
            throw .transport(.other("invalid WebSocket URL \(url)"))
        }
        let secure = scheme == "wss" || scheme == "https"
        let port = parsed.port ?? (secure ? 443 : 80)
        let path = (parsed.percentEncodedPath.isEmpty ? "/" : parsed.percentEncodedPath)
            + (parsed.percentEncodedQuery.map { "?" + $0 } ?? "")
        let sslContext: NIOSSLContext?
        do { sslContext = secure ? try NIOSSLContext(configuration: tlsConfiguration) : nil } catch {
            throw .transport(.tlsHandshakeFailed(String(describing: error)))
        }
        let maxFrameBytes = self.maxFrameBytes
        let inboundLimit = self.inboundLimit
        let hostHeader = parsed.port.map { "\(host):\($0)" } ?? host
        let connectTimeout = TimeAmount.nanoseconds(Int64(timeout.components.seconds) * 1_000_000_000
            + timeout.components.attoseconds / 1_000_000_000)
        do {
            let upgrade = try await ClientBootstrap(group: group)
                .connectTimeout(connectTimeout)
                .connect(host: host, port: port) { channel in
                    channel.eventLoop.makeCompletedFuture { () throws -> EventLoopFuture<Upgrade> in
                        // The process's first pipeline is built alone (``FirstUseGate``).
                        try NIOWebSocketConnector.firstPipeline.run { () throws -> EventLoopFuture<Upgrade> in
                            let upgrader = NIOTypedWebSocketClientUpgrader<Upgrade>(maxFrameSize: maxFrameBytes) { channel, _ in
                                channel.eventLoop.makeCompletedFuture {
                                    let link = NIOWebSocketLink(channel: channel, inboundLimit: inboundLimit)
                                    try channel.pipeline.syncOperations.addHandler(
                                        NIOWebSocketFrameAggregator(minNonFinalFragmentSize: 0, maxAccumulatedFrameCount: 1024,
                                                                    maxAccumulatedFrameSize: maxFrameBytes))
                                    try channel.pipeline.syncOperations.addHandler(link.handler)
                                    return Upgrade.upgraded(link)
                                }
                            }
                            var headers = HTTPHeaders()
                            headers.add(name: "Host", value: hostHeader)
                            headers.add(name: "Sec-WebSocket-Protocol", value: subprotocol)
                            headers.add(name: "User-Agent", value: "Tether-Swift/0.1")
                            let head = HTTPRequestHead(version: .http1_1, method: .GET, uri: path, headers: headers)
                            let configuration = NIOTypedHTTPClientUpgradeConfiguration<Upgrade>(
                                upgradeRequestHead: head, upgraders: [upgrader],
                                notUpgradingCompletionHandler: { channel in
                                    channel.eventLoop.makeCompletedFuture {
                                        // The refused upgrade's response is forwarded down the pipeline next.
                                        let catcher = ResponseHeadCatcher(promise: channel.eventLoop.makePromise())
                                        try channel.pipeline.syncOperations.addHandler(catcher)
                                        return Upgrade.notUpgraded(catcher.promise.futureResult)
                                    }
                                })
                            if let sslContext {
                                try channel.pipeline.syncOperations.addHandler(try NIOSSLClientHandler(context: sslContext, serverHostname: host),
                                                                               position: .first)
                            }
                            return try channel.pipeline.syncOperations.configureUpgradableHTTPClientPipeline(
                                configuration: NIOUpgradableHTTPClientPipelineConfiguration(upgradeConfiguration: configuration))
                        }
                    }
                }
            // Connected: a failure from here on is a connection the far end (or a proxy) closed or
            // reset before answering the upgrade — the server was never reached, as a refused
            // connection, so the retry policy's quick reconnection applies.
            let head: HTTPResponseHead
            do {
                switch try await upgrade.get() {
                case .upgraded(let link):
                    return link
                case .notUpgraded(let response):
                    head = try await response.get()
                }
            } catch {
                throw WebSocketConnectFailure.transport(Self.beforeTheAnswer(HTTPClientTransport.classify(error)))
            }
            var fields: [String: String] = [:]
            for (name, value) in head.headers { fields[name.lowercased()] = value }
            throw WebSocketConnectFailure.notUpgraded(statusCode: Int(head.status.code), headers: fields)
        } catch let failure as WebSocketConnectFailure {
            throw failure
        } catch {
            throw .transport(HTTPClientTransport.classify(error))
        }
    }
}

extension NIOWebSocketConnector {
    /// A failure between the TCP connect and the upgrade's answer: timeouts, cancellation and TLS
    /// failures keep their meaning; anything else (EOF, a reset, a closed channel) is the
    /// connection closing before the answer.
    static func beforeTheAnswer(_ failure: TransportFailure) -> TransportFailure {
        switch failure {
        case .timedOut, .cancelled, .tlsHandshakeFailed, .tlsUntrustedCertificate, .connectionRefused, .connectionClosed:
            return failure
        case .unreachable(let why), .other(let why), .incompleteResponse(let why):
            return .connectionClosed("the connection closed before the WebSocket upgrade was answered: \(why)")
        case .responseTooLarge:
            return .connectionClosed("the WebSocket upgrade's answer was too large")
        }
    }
}

/// Catches the head of a refused upgrade's plain HTTP response, then closes the connection.
private final class ResponseHeadCatcher: ChannelInboundHandler, Sendable {
    typealias InboundIn = HTTPClientResponsePart
    let promise: EventLoopPromise<HTTPResponseHead>

    init(promise: EventLoopPromise<HTTPResponseHead>) { self.promise = promise }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if case .head(let head) = unwrapInboundIn(data) {
            promise.succeed(head)
            context.close(promise: nil)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        promise.fail(ChannelError.eof)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        promise.fail(error)
        context.close(promise: nil)
    }
}

/// An upgraded socket: text messages in through a bounded stream, out through the channel.
final class NIOWebSocketLink: WebSocketLink {
    let handler: FrameHandler
    private let channel: any Channel
    let inbound: AsyncStream<WebSocketInbound>

    init(channel: any Channel, inboundLimit: Int) {
        self.channel = channel
        let (stream, continuation) = AsyncStream.makeStream(of: WebSocketInbound.self, bufferingPolicy: .bufferingOldest(inboundLimit))
        inbound = stream
        handler = FrameHandler(continuation: continuation)
    }

    func send(_ text: String) async throws(TransportFailure) {
        let frame = WebSocketFrame(fin: true, opcode: .text, maskKey: .random(), data: ByteBuffer(string: text))
        do { try await channel.writeAndFlush(frame) } catch {
            throw HTTPClientTransport.classify(error)
        }
    }

    func close(code: UInt16, sendingFirst text: String?) async {
        if let text {
            channel.writeAndFlush(WebSocketFrame(fin: true, opcode: .text, maskKey: .random(), data: ByteBuffer(string: text)),
                                  promise: nil)
        }
        var data = ByteBuffer()
        data.writeInteger(code)
        let frame = WebSocketFrame(fin: true, opcode: .connectionClose, maskKey: .random(), data: data)
        // Not awaited (nor `text`): behind a write the peer never reads (a full send buffer), the
        // write would never complete and the socket would never close, holding every send and
        // flush waiting on it. Queued in order, they are written before the close when they can be.
        channel.writeAndFlush(frame, promise: nil)
        try? await channel.close()
    }

    /// Reads frames on the event loop: text to the stream, pings answered, close echoed.
    final class FrameHandler: ChannelInboundHandler, Sendable {
        typealias InboundIn = WebSocketFrame
        typealias OutboundOut = WebSocketFrame
        private let continuation: AsyncStream<WebSocketInbound>.Continuation
        private let finished = Mutex(false)

        init(continuation: AsyncStream<WebSocketInbound>.Continuation) { self.continuation = continuation }

        private func finish(code: UInt16?, reason: String) {
            let first = finished.withLock { done in
                defer { done = true }
                return !done
            }
            guard first else { return }
            continuation.yield(.closed(code: code, reason: reason))
            continuation.finish()
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let frame = unwrapInboundIn(data)
            switch frame.opcode {
            case .text:
                var data = frame.unmaskedData
                let text = data.readString(length: data.readableBytes) ?? ""
                if case .dropped = continuation.yield(.text(text)) {
                    // The session is not reading: drop the socket (it resumes from its cursor).
                    finish(code: nil, reason: "inbound buffer full")
                    context.close(promise: nil)
                }
            case .ping:
                let pong = WebSocketFrame(fin: true, opcode: .pong, maskKey: .random(), data: frame.unmaskedData)
                context.writeAndFlush(wrapOutboundOut(pong), promise: nil)
            case .connectionClose:
                var payload = frame.unmaskedData
                let code = payload.readInteger(as: UInt16.self)
                let reason = payload.readString(length: payload.readableBytes) ?? ""
                var echo = ByteBuffer()
                if let code { echo.writeInteger(code) }
                let closing = context.channel
                context.writeAndFlush(wrapOutboundOut(WebSocketFrame(fin: true, opcode: .connectionClose, maskKey: .random(), data: echo)))
                    .whenComplete { _ in closing.close(promise: nil) }
                finish(code: code, reason: reason)
            default:
                break
            }
        }

        func channelInactive(context: ChannelHandlerContext) {
            finish(code: nil, reason: "the connection closed")
            context.fireChannelInactive()
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            finish(code: nil, reason: String(describing: error))
            context.close(promise: nil)
        }
    }
}

/// Creates the ``NIOWebSocketConnector`` (and its event-loop thread) on the first connection, so
/// a client that never uses the WebSocket wire starts no thread.
final class LazyWebSocketConnector: WebSocketConnector {
    private let pem: [UInt8]?
    private let connector = Mutex<NIOWebSocketConnector?>(nil)

    init(trustedCertificateAuthoritiesPEM: [UInt8]?) { pem = trustedCertificateAuthoritiesPEM }

    func connect(url: String, subprotocol: String, timeout: Duration) async throws(WebSocketConnectFailure) -> any WebSocketLink {
        let made: NIOWebSocketConnector
        do {
            made = try connector.withLock { existing in
                if let existing { return existing }
                let created = try NIOWebSocketConnector(trustedCertificateAuthoritiesPEM: pem)
                existing = created
                return created
            }
        } catch {
            throw .transport(.tlsHandshakeFailed("the trusted certificate authorities are not valid PEM: \(error)"))
        }
        return try await made.connect(url: url, subprotocol: subprotocol, timeout: timeout)
    }

    func shutdown() async {
        await connector.withLock { $0 }?.shutdown()
    }
}
