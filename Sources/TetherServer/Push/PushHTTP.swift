import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import NIOSSL
import Synchronization

/// The HTTP client of one push provider: HTTP/2 when the gateway offers it over TLS (ALPN),
/// extra trusted certificate authorities when configured (a private gateway, the test
/// server), bounded timeouts.
///
/// The client is created on the first request (a server that never sends a push opens nothing)
/// and shut down by ``shutdown()``.
struct PushHTTPClient: Sendable {
    private let configuration: HTTPClient.Configuration
    private let state = SharedClient()
    let timeout: TimeAmount

    final class SharedClient: Sendable {
        let client = Mutex<(client: HTTPClient?, closed: Bool)>((nil, false))
    }

    init(caCertificatePath: String?, timeout: TimeAmount = .seconds(30)) throws {
        var configuration = HTTPClient.Configuration()
        configuration.httpVersion = .automatic
        configuration.timeout = .init(connect: .seconds(10), read: timeout)
        configuration.redirectConfiguration = .disallow
        var tls = TLSConfiguration.makeClientConfiguration()
        if let caCertificatePath {
            tls.additionalTrustRoots = [.certificates(try NIOSSLCertificate.fromPEMFile(caCertificatePath))]
        }
        configuration.tlsConfiguration = tls
        self.configuration = configuration
        self.timeout = timeout
        // Before the client's first connection: see ``HTTPDecoderTypes``.
        _ = HTTPDecoderTypes.ready
    }

    private var client: HTTPClient {
        get throws {
            try state.client.withLock { s in
                if s.closed { throw HTTPClientError.alreadyShutdown }
                if let client = s.client { return client }
                let client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
                s.client = client
                return client
            }
        }
    }

    /// A response: status, headers, body (at most 64 KiB read).
    struct Answer: Sendable {
        var status: Int
        var headers: HTTPHeaders
        var body: [UInt8]
    }

    func post(_ url: String, headers: [(String, String)], body: [UInt8]) async throws -> Answer {
        var request = HTTPClientRequest(url: url)
        request.method = .POST
        for (name, value) in headers { request.headers.add(name: name, value: value) }
        request.body = .bytes(ByteBuffer(bytes: body))
        let response = try await client.execute(request, timeout: timeout)
        let bytes = try await response.body.collect(upTo: 64 * 1024)
        return Answer(status: Int(response.status.code), headers: response.headers, body: Array(buffer: bytes))
    }

    func shutdown() async {
        let client = state.client.withLock { s -> HTTPClient? in
            defer { s = (nil, true) }
            return s.client
        }
        try? await client?.shutdown()
    }
}

/// A gateway answer that is neither success nor a refused token, as a result: 429 and 5xx are
/// retried (with the gateway's `Retry-After`), the rest refused for good.
func classifyFailure(_ answer: PushHTTPClient.Answer, reason: String) -> PushSendResult {
    if answer.status == 429 || answer.status >= 500 {
        return .retryable("\(answer.status) \(reason)", retryAfter: retryAfterDuration(answer.headers.first(name: "retry-after")))
    }
    return .failed("\(answer.status) \(reason)")
}

enum Base64URL {
    static func encode<D: DataProtocol>(_ bytes: D) -> String {
        Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }
}
