public import TetherClientCore

/// One HTTP exchange the client asks a ``Transport`` to perform.
public struct TransportRequest: Sendable, Hashable {
    /// The absolute URL (`http(s)://origin/path?query`).
    public var url: String
    /// The method.
    public var method: HTTPVerb
    /// Header fields.
    public var headers: [String: String]
    /// The body, if any.
    public var body: [UInt8]?
    /// The deadline for the whole exchange, from when it is sent.
    public var timeout: Duration
    /// Whether this is the subscribe long-poll, which must run on its own connection so it
    /// never delays (or is delayed by) other calls.
    public var isLongPoll: Bool

    /// Creates a request.
    public init(url: String, method: HTTPVerb, headers: [String: String] = [:], body: [UInt8]? = nil, timeout: Duration,
                isLongPoll: Bool = false) {
        self.url = url
        self.method = method
        self.headers = headers
        self.body = body
        self.timeout = timeout
        self.isLongPoll = isLongPoll
    }
}

/// The HTTP response a ``Transport`` received.
public struct TransportResponse: Sendable, Hashable {
    /// The status code.
    public var statusCode: Int
    /// Header fields (names lower-cased; repeated fields joined with `, `).
    public var headers: [String: String]
    /// The complete body.
    public var body: [UInt8]

    /// Creates a response.
    public init(statusCode: Int, headers: [String: String] = [:], body: [UInt8]) {
        self.statusCode = statusCode
        self.headers = headers
        self.body = body
    }
}

/// Sends HTTP requests for a ``TetherClient``. The default is ``HTTPClientTransport``
/// (AsyncHTTPClient); tests and other platforms can supply their own.
///
/// Implementations must map every failure to a ``TransportFailure`` (timeouts, refused
/// connections, TLS problems...) so the client can classify it, and must release every
/// connection, task and thread in ``shutdown()``.
public protocol Transport: Sendable {
    /// Performs one exchange. A cancelled task fails with ``TransportFailure/cancelled``.
    func send(_ request: TransportRequest) async throws(TransportFailure) -> TransportResponse

    /// Closes every connection and stops every thread the transport started. Requests after
    /// shutdown fail with ``TransportFailure/cancelled``. Calling it twice is harmless.
    func shutdown() async
}
