/// What kind of thing happened, for every status the SDK reports.
///
/// One enum covers both the subscribe loop's connection events (delivered on the client's status
/// stream) and the failures of individual REST calls (carried by ``TetherError``-style errors).
/// Names follow PubNub's `PN…Category` so apps ported from PubNub find their cases;
/// `docs/status-reference.md` says when each one happens and how to handle it.
public enum StatusCategory: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    /// A request succeeded (PubNub's acknowledgment category).
    case acknowledgment
    /// The subscribe loop completed its handshake: real-time data is flowing.
    case connected
    /// The subscribe loop is receiving again after an unexpected disconnect.
    case reconnected
    /// The app disconnected or unsubscribed from everything on purpose.
    case disconnected
    /// The subscribe loop lost its connection unexpectedly and is retrying.
    case unexpectedDisconnect
    /// The subscribe loop gave up before it ever connected.
    case connectionError
    /// The subscribe loop gave up after having been connected.
    case disconnectedUnexpectedly
    /// The subscription set changed (channels or groups added or removed).
    case subscriptionChanged
    /// Access Manager refused the request (HTTP 403); the denied channels and groups are listed.
    case accessDenied
    /// No response arrived before the request's timeout.
    case timeout
    /// The request could not reach the server: nothing listening, no route, DNS failure, reset.
    case networkIssues
    /// The device's network came back (reported by the network monitor).
    case networkUp
    /// The device's network went away (reported by the network monitor).
    case networkDown
    /// The server rejected the request as malformed (HTTP 400, 413, 414).
    case badRequest
    /// The subscribe filter expression was rejected (HTTP 481).
    case malformedFilterExpression
    /// The response was not the JSON expected: an HTML captive portal, a truncated body, a proxy page.
    case malformedResponse
    /// A received message could not be decrypted with the configured cryptor; the raw payload is kept.
    case decryptionError
    /// The TLS handshake failed (not a certificate problem: protocol or transport failure during it).
    case tlsConnectionFailed
    /// The server's certificate is not trusted (self-signed, unknown CA, wrong host, expired).
    case tlsUntrustedCertificate
    /// One subscribe response carried at least `requestMessageCountThreshold` messages: use history to catch up.
    case requestMessageCountExceeded
    /// Anything else: unexpected HTTP status (429, 5xx...) or an unclassified failure.
    case unknown
    /// The request was cancelled by the app (task cancellation or client shutdown).
    case cancelled

    /// The case name.
    public var description: String { rawValue }

    /// Whether this category reports a failure (as opposed to a connection event or success).
    public var isError: Bool {
        switch self {
        case .acknowledgment, .connected, .reconnected, .disconnected, .subscriptionChanged, .networkUp:
            return false
        case .unexpectedDisconnect, .connectionError, .disconnectedUnexpectedly, .accessDenied, .timeout, .networkIssues,
            .networkDown, .badRequest, .malformedFilterExpression, .malformedResponse, .decryptionError, .tlsConnectionFailed,
            .tlsUntrustedCertificate, .requestMessageCountExceeded, .unknown, .cancelled:
            return true
        }
    }
}
