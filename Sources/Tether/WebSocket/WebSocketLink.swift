import TetherClientCore

/// Opens WebSocket connections for the client's session transport. ``NIOWebSocketConnector`` is
/// the real one; tests use TetherTesting's `InMemoryWebSocket`, which hands every attempt to the
/// test to accept, refuse or fail.
package protocol WebSocketConnector: Sendable {
    /// Performs the HTTP upgrade of `url` (`ws://` or `wss://`) offering `subprotocol`.
    func connect(url: String, subprotocol: String, timeout: Duration) async throws(WebSocketConnectFailure) -> any WebSocketLink

    /// Closes every socket and stops every thread the connector started.
    func shutdown() async
}

/// Why a WebSocket could not be opened.
package enum WebSocketConnectFailure: Error, Sendable, Hashable {
    /// The server answered the upgrade with a plain HTTP response (`503` + `Retry-After` under
    /// load; a proxy that strips `Upgrade` gets `200`/`404`/`426`…).
    case notUpgraded(statusCode: Int, headers: [String: String])
    /// No answer: the connection failed as a request would.
    case transport(TransportFailure)
}

/// One open WebSocket carrying text frames.
package protocol WebSocketLink: Sendable {
    /// Sends one text message; fails once the socket is closed.
    func send(_ text: String) async throws(TransportFailure)
    /// The messages received, in order; the stream ends with ``WebSocketInbound/closed(code:reason:)``.
    var inbound: AsyncStream<WebSocketInbound> { get }
    /// Closes the socket with `code` (does not wait for the peer), sending `text` first when
    /// given. Neither frame's write is awaited: behind a write the peer never reads, it would
    /// never complete, and the socket would never close.
    func close(code: UInt16, sendingFirst text: String?) async
}

extension WebSocketLink {
    /// Closes the socket with `code` (does not wait for the peer).
    func close(code: UInt16) async { await close(code: code, sendingFirst: nil) }
}

/// What a ``WebSocketLink`` receives.
package enum WebSocketInbound: Sendable, Hashable {
    /// A text message.
    case text(String)
    /// The socket closed: the peer's close code when it sent one (nil: the TCP connection ended).
    case closed(code: UInt16?, reason: String)
}

/// The connector of a client without a WebSocket wire: every attempt fails with a clear message.
struct UnavailableWebSocketConnector: WebSocketConnector {
    func connect(url: String, subprotocol: String, timeout: Duration) async throws(WebSocketConnectFailure) -> any WebSocketLink {
        throw .transport(.other("this client has no WebSocket wire (it was built on a custom Transport): use .longPoll or .automatic"))
    }

    func shutdown() async {}
}
