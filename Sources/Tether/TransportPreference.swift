/// Which wire the subscribe engine receives on (``TetherConfiguration/transport``).
///
/// Both wires share one cursor (the timetoken), the same envelopes and the same subscribe
/// machine, so every ``RetryConfiguration`` policy, status and continuity outcome is the same on
/// either, and a client can move between them mid-stream with nothing lost or repeated.
public enum TransportPreference: String, Sendable, Hashable, CaseIterable {
    /// A WebSocket session (docs/websocket-protocol.md): kept through drops and resumed with its
    /// token, pings on inactivity, server-guided reconnects (drain, `503` + `Retry-After`).
    case webSocket
    /// PubNub's HTTP long-poll: works through every HTTP proxy.
    case longPoll
    /// The default: WebSocket, falling back to long-poll when the upgrade is refused with a plain
    /// HTTP answer (a proxy that strips `Upgrade`, a PubNub origin or a server without the
    /// endpoint), and trying WebSocket again after ``WebSocketOptions/fallbackRetryInterval``.
    case automatic
}

/// Settings of the WebSocket wire (``TetherConfiguration/webSocket``).
public struct WebSocketOptions: Sendable, Hashable {
    /// Send a `ping` when the socket has carried no frame for this long (default 10 s).
    public var inactivityPing: Duration
    /// A socket silent this long after such a ping is declared dead and reconnected (default
    /// 5 s): with the defaults a dead link is noticed within 15 s of its last frame.
    public var pongTimeout: Duration
    /// Under ``TransportPreference/automatic``, how long to stay on long-poll after a refused
    /// upgrade before trying WebSocket again (default 5 minutes).
    public var fallbackRetryInterval: Duration

    /// The settings a client uses: a negative `inactivityPing` is `.zero` (the SDK does not ping),
    /// `pongTimeout` is at least 100 ms and at most 5 minutes, `fallbackRetryInterval` at least
    /// 100 ms and at most 24 hours (``TetherClient`` applies this when it is created).
    var bounded: WebSocketOptions {
        WebSocketOptions(inactivityPing: max(.zero, inactivityPing),
                         pongTimeout: min(max(.milliseconds(100), pongTimeout), .seconds(300)),
                         fallbackRetryInterval: min(max(.milliseconds(100), fallbackRetryInterval), .seconds(86_400)))
    }

    /// Creates the settings.
    public init(inactivityPing: Duration = .seconds(10), pongTimeout: Duration = .seconds(5),
                fallbackRetryInterval: Duration = .seconds(300)) {
        self.inactivityPing = inactivityPing
        self.pongTimeout = pongTimeout
        self.fallbackRetryInterval = fallbackRetryInterval
    }
}
