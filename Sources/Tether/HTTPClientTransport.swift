import AsyncHTTPClient
public import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import Synchronization
public import TetherClientCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The default ``Transport``: AsyncHTTPClient over SwiftNIO.
///
/// - Nothing is created until the first request: no threads, no sockets (a client that is
///   never used costs nothing).
/// - Two connection pools on one event-loop thread: one for non-subscribe calls (HTTP/1.1
///   keep-alive, reused across calls) and one for the subscribe long-poll, so the long-poll
///   always has its own connection.
/// - Connection establishment is not retried inside the pool: a refused connection or a failed
///   TLS handshake fails the request at once, with its real cause.
/// - ``shutdown()`` closes both pools and stops the thread.
public final class HTTPClientTransport: Transport {
    private enum State {
        case idle
        case running(group: MultiThreadedEventLoopGroup, rest: HTTPClient, longPoll: HTTPClient)
        case shutDown
    }

    private let state = Mutex<State>(.idle)
    private let tlsConfiguration: TLSConfiguration
    private let connectTimeout: Duration
    private let logger: Logger
    private let maximumBodySize: Int

    /// Creates a transport (no I/O, no threads).
    /// - Parameters:
    ///   - trustedCertificateAuthoritiesPEM: PEM roots to trust instead of the system's.
    ///   - connectTimeout: TCP + TLS establishment timeout.
    ///   - maximumBodySize: larger responses fail as malformed.
    public init(trustedCertificateAuthoritiesPEM: [UInt8]? = nil, connectTimeout: Duration = .seconds(10),
                maximumBodySize: Int = 32 * 1024 * 1024, logger: Logger = Logger(label: "tether.transport")) throws {
        var tls = TLSConfiguration.makeClientConfiguration()
        if let pem = trustedCertificateAuthoritiesPEM {
            tls.trustRoots = .certificates(try NIOSSLCertificate.fromPEMBytes(pem))
        }
        self.tlsConfiguration = tls
        self.connectTimeout = connectTimeout
        self.logger = logger
        self.maximumBodySize = maximumBodySize
    }

    /// Whether the transport has started its thread and pools (true after the first request,
    /// false again after ``shutdown()``).
    public var isRunning: Bool {
        state.withLock { if case .running = $0 { return true } else { return false } }
    }

    private func clients() throws(TransportFailure) -> (rest: HTTPClient, longPoll: HTTPClient) {
        let result: (HTTPClient, HTTPClient)? = state.withLock { state in
            switch state {
            case .running(_, let rest, let longPoll): return (rest, longPoll)
            case .shutDown: return nil
            case .idle:
                _ = HTTPDecoderTypes.ready  // before the first connection (``HTTPDecoderTypes``)
                let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
                let rest = HTTPClient(eventLoopGroupProvider: .shared(group), configuration: makeConfiguration(connections: 16))
                let longPoll = HTTPClient(eventLoopGroupProvider: .shared(group), configuration: makeConfiguration(connections: 2))
                state = .running(group: group, rest: rest, longPoll: longPoll)
                return (rest, longPoll)
            }
        }
        guard let result else { throw .cancelled }
        return result
    }

    private func makeConfiguration(connections: Int) -> HTTPClient.Configuration {
        var configuration = HTTPClient.Configuration(
            tlsConfiguration: tlsConfiguration,
            redirectConfiguration: .disallow,
            timeout: .init(connect: .nanoseconds(Int64(connectTimeout.components.seconds) * 1_000_000_000
                + connectTimeout.components.attoseconds / 1_000_000_000)),
            connectionPool: .init(idleTimeout: .seconds(55), concurrentHTTP1ConnectionsPerHostSoftLimit: connections),
            proxy: nil,
            ignoreUncleanSSLShutdown: false,
            decompression: .disabled
        )
        configuration.httpVersion = .http1Only
        configuration.connectionPool.retryConnectionEstablishment = false
        return configuration
    }

    /// Performs one exchange on the right pool.
    public func send(_ request: TransportRequest) async throws(TransportFailure) -> TransportResponse {
        try await send(request, sent: nil, received: nil)
    }

    /// Performs one exchange, reporting progress: `sent` with the bytes of the request body
    /// handed to the connection so far (the body goes in 64 KiB pieces, as the connection takes
    /// them), `received` with the response body bytes read so far and the expected total when
    /// the server gave a `Content-Length` (file uploads and downloads).
    func send(_ request: TransportRequest, sent: (@Sendable (Int) -> Void)?, received: (@Sendable (Int, Int?) -> Void)?)
        async throws(TransportFailure) -> TransportResponse
    {
        let (rest, longPoll) = try clients()
        let client = request.isLongPoll ? longPoll : rest
        var http = HTTPClientRequest(url: request.url)
        http.method = HTTPMethod(rawValue: request.method.rawValue)
        for (name, value) in request.headers { http.headers.add(name: name, value: value) }
        if let body = request.body {
            if let sent {
                http.body = .stream(ProgressChunks(bytes: body, report: sent), length: .known(Int64(body.count)))
            } else {
                http.body = .bytes(ByteBuffer(bytes: body))
            }
        }
        let nanoseconds = request.timeout.components.seconds * 1_000_000_000 + request.timeout.components.attoseconds / 1_000_000_000
        do {
            let response = try await client.execute(http, deadline: .now() + .nanoseconds(nanoseconds), logger: logger)
            var headers: [String: String] = [:]
            for (name, value) in response.headers {
                let key = name.lowercased()
                headers[key] = headers[key].map { $0 + ", " + value } ?? value
            }
            var bytes: [UInt8]
            if let received {
                let expected = headers["content-length"].flatMap { Int($0) }
                bytes = []
                bytes.reserveCapacity(min(expected ?? 0, maximumBodySize))
                for try await piece in response.body {
                    guard bytes.count + piece.readableBytes <= maximumBodySize else { throw NIOTooManyBytesError(maxBytes: maximumBodySize) }
                    bytes += piece.readableBytesView
                    received(bytes.count, expected)
                }
            } else {
                var body = try await response.body.collect(upTo: maximumBodySize)
                bytes = body.readBytes(length: body.readableBytes) ?? []
            }
            return TransportResponse(statusCode: Int(response.status.code), headers: headers, body: bytes)
        } catch {
            throw Self.classify(error)
        }
    }

    /// Shuts both pools down and stops the event-loop thread.
    public func shutdown() async {
        let previous = state.withLock { state -> State in
            let previous = state
            state = .shutDown
            return previous
        }
        guard case .running(let group, let rest, let longPoll) = previous else { return }
        try? await longPoll.shutdown()
        try? await rest.shutdown()
        try? await group.shutdownGracefully()
    }

    deinit {
        // A client dropped without `shutdown()` must not leak (or trip AsyncHTTPClient's
        // "not shut down" check): release everything in the background, without blocking.
        guard case .running(let group, let rest, let longPoll) = state.withLock({ $0 }) else { return }
        rest.shutdown().and(longPoll.shutdown()).whenComplete { _ in
            group.shutdownGracefully { _ in }
        }
    }

    /// Maps NIO / AsyncHTTPClient / NIOSSL errors onto ``TransportFailure``.
    static func classify(_ error: any Error) -> TransportFailure {
        if let failure = error as? TransportFailure { return failure }
        if error is CancellationError { return .cancelled }
        if let error = error as? HTTPClientError {
            switch error {
            case .deadlineExceeded, .readTimeout, .writeTimeout, .connectTimeout, .tlsHandshakeTimeout, .getConnectionFromPoolTimeout:
                return .timedOut
            case .cancelled, .alreadyShutdown: return .cancelled
            case .remoteConnectionClosed: return .connectionClosed("the server closed the connection")
            case .uncleanShutdown: return .connectionClosed("the TLS connection was not closed cleanly")
            default: return .other(String(describing: error))
            }
        }
        if let error = error as? NIOConnectionError {
            for failure in error.connectionErrors {
                if let io = failure.error as? IOError {
                    switch io.errnoCode {
                    case ECONNREFUSED: return .connectionRefused
                    case ETIMEDOUT: return .timedOut
                    // Accepted, then reset (a proxy or load balancer cutting connections as they open).
                    case ECONNRESET, EPIPE: return .connectionClosed(String(describing: io))
                    default: return .unreachable(String(describing: io))
                    }
                }
                if case ChannelError.connectTimeout = failure.error { return .timedOut }
            }
            if let dns = error.dnsAError ?? error.dnsAAAAError { return .unreachable("DNS: \(dns)") }
            return .unreachable(String(describing: error))
        }
        if let io = error as? IOError {
            switch io.errnoCode {
            case ECONNREFUSED: return .connectionRefused
            case ETIMEDOUT: return .timedOut
            case ECONNRESET, EPIPE: return .connectionClosed(String(describing: io))
            case ENETUNREACH, EHOSTUNREACH, ENETDOWN: return .unreachable(String(describing: io))
            default: return .other(String(describing: io))
            }
        }
        if let channelError = error as? ChannelError {
            switch channelError {
            case .connectTimeout: return .timedOut
            case .ioOnClosedChannel, .eof, .alreadyClosed, .outputClosed, .inputClosed:
                return .connectionClosed(String(describing: channelError))
            default: return .other(String(describing: channelError))
            }
        }
        if let ssl = error as? NIOSSLError {
            switch ssl {
            case .handshakeFailed(let inner):
                let text = String(describing: inner)
                if text.contains("CERTIFICATE_VERIFY_FAILED") || text.contains("certificate verify failed") {
                    return .tlsUntrustedCertificate(text)
                }
                return .tlsHandshakeFailed(text)
            case .unableToValidateCertificate, .noCertificateToValidate, .cannotMatchULabel:
                return .tlsUntrustedCertificate(String(describing: ssl))
            case .uncleanShutdown:
                return .tlsHandshakeFailed("the connection closed during the TLS exchange")
            default:
                return .tlsHandshakeFailed(String(describing: ssl))
            }
        }
        if let extra = error as? NIOSSLExtraError {
            if extra == .failedToValidateHostname { return .tlsUntrustedCertificate(String(describing: extra)) }
            return .tlsHandshakeFailed(String(describing: extra))
        }
        if error is NIOTooManyBytesError { return .responseTooLarge }
        // AsyncHTTPClient reports a body cut short of its `Content-Length` (or a chunked body
        // that ends without its last chunk) as the parser's `invalidEOFState`.
        if let parser = error as? HTTPParserError { return .incompleteResponse(String(describing: parser)) }
        return .other(String(describing: error))
    }
}

/// A request body handed out in 64 KiB pieces, reporting how much has been taken.
private struct ProgressChunks: AsyncSequence, Sendable {
    typealias Element = ByteBuffer
    let bytes: [UInt8]
    let report: @Sendable (Int) -> Void

    struct AsyncIterator: AsyncIteratorProtocol {
        let bytes: [UInt8]
        let report: @Sendable (Int) -> Void
        var offset = 0

        mutating func next() async -> ByteBuffer? {
            guard offset < bytes.count else { return nil }
            let end = Swift.min(offset + 64 * 1024, bytes.count)
            let piece = ByteBuffer(bytes: bytes[offset..<end])
            offset = end
            report(offset)
            return piece
        }
    }

    func makeAsyncIterator() -> AsyncIterator { AsyncIterator(bytes: bytes, report: report) }
}
