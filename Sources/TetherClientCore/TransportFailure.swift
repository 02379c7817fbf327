/// Why a request got no HTTP response, classified by the transport.
///
/// The transport maps its own errors (NIO, AsyncHTTPClient, TLS) onto these cases; the
/// ``ResponseClassifier`` maps them onto a ``StatusCategory``.
public enum TransportFailure: Error, Sendable, Hashable, CustomStringConvertible {
    /// No complete response before the deadline (connect or read).
    case timedOut
    /// The TCP connection was refused: nothing listening at the origin.
    case connectionRefused
    /// The host could not be resolved or reached.
    case unreachable(String)
    /// The connection was closed or reset before a complete response arrived.
    case connectionClosed(String)
    /// The TLS handshake failed for a reason other than trust (protocol error, garbage, reset).
    case tlsHandshakeFailed(String)
    /// The server's certificate was rejected.
    case tlsUntrustedCertificate(String)
    /// The request was cancelled (task cancellation, client shutdown).
    case cancelled
    /// The response body exceeded the transport's limit.
    case responseTooLarge
    /// The response could not be read as HTTP, or ended before its declared length (a body cut
    /// short by a server that stopped mid-answer, or by a middlebox).
    case incompleteResponse(String)
    /// Anything else.
    case other(String)

    /// A message for humans.
    public var description: String {
        switch self {
        case .timedOut: return "the request timed out"
        case .connectionRefused: return "connection refused: nothing is listening at the origin"
        case .unreachable(let why): return "the origin is unreachable: \(why)"
        case .connectionClosed(let why): return "the connection closed before a complete response: \(why)"
        case .tlsHandshakeFailed(let why): return "the TLS handshake failed: \(why)"
        case .tlsUntrustedCertificate(let why): return "the server's TLS certificate is not trusted: \(why)"
        case .cancelled: return "the request was cancelled"
        case .responseTooLarge: return "the response body is too large"
        case .incompleteResponse(let why): return "the response was incomplete: \(why)"
        case .other(let why): return why
        }
    }

    /// The status category this failure is reported with.
    package var category: StatusCategory {
        switch self {
        case .timedOut: return .timeout
        case .connectionRefused, .unreachable, .connectionClosed: return .networkIssues
        case .tlsHandshakeFailed: return .tlsConnectionFailed
        case .tlsUntrustedCertificate: return .tlsUntrustedCertificate
        case .cancelled: return .cancelled
        case .responseTooLarge, .incompleteResponse: return .malformedResponse
        case .other: return .unknown
        }
    }
}
