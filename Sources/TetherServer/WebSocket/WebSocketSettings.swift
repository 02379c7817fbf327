/// The WebSocket session endpoint's settings (docs/websocket-protocol.md, "Bounds"), set by
/// `tether serve --ws-…` options.
public struct WebSocketSettings: Sendable, Hashable {
    /// Whether `GET /v2/ws` upgrades (default `true`).
    public var enabled: Bool
    /// How long a session is kept after its socket drops, in seconds (default 300).
    public var keepAliveSeconds: Int
    /// The longest a `suspend` frame may keep a session after its socket closes, in seconds
    /// (default 3,600): an app in the background keeps its session, cursor and presence this long.
    public var maxSuspendSeconds: Int
    /// Idle seconds before the server pings a connection (default 25); two missed pings close it.
    public var pingIntervalSeconds: Int
    /// Open WebSocket connections at most; over it the upgrade gets 503 (default 10,000).
    public var maxConnections: Int
    /// Disconnected sessions kept at most; over it the oldest expires (default 10,000).
    public var maxKeptSessions: Int
    /// Frames waiting to be written to one connection at most; over it the connection is closed
    /// as a slow consumer (default 256).
    public var outboundBufferFrames: Int
    /// Bytes waiting to be written to one connection at most (default 4 MiB).
    public var outboundBufferBytes: Int
    /// The reconnect delay a `drain` notice gives, in milliseconds (default 1,000).
    public var drainReconnectAfterMilliseconds: Int
    /// The jitter window a `drain` notice gives, in milliseconds (default 5,000).
    public var drainJitterMilliseconds: Int

    /// Creates settings; every number is clamped to at least 1 (0 for the drain delays).
    public init(enabled: Bool = true, keepAliveSeconds: Int = 300, pingIntervalSeconds: Int = 25, maxConnections: Int = 10_000,
                maxKeptSessions: Int = 10_000, outboundBufferFrames: Int = 256, outboundBufferBytes: Int = 4 << 20,
                drainReconnectAfterMilliseconds: Int = 1_000, drainJitterMilliseconds: Int = 5_000, maxSuspendSeconds: Int = 3_600) {
        self.enabled = enabled
        self.keepAliveSeconds = min(max(1, keepAliveSeconds), 86_400)
        self.maxSuspendSeconds = min(max(1, maxSuspendSeconds), 86_400)
        self.pingIntervalSeconds = min(max(1, pingIntervalSeconds), 3_600)
        self.maxConnections = max(1, maxConnections)
        self.maxKeptSessions = max(0, maxKeptSessions)
        self.outboundBufferFrames = max(1, outboundBufferFrames)
        self.outboundBufferBytes = max(1024, outboundBufferBytes)
        self.drainReconnectAfterMilliseconds = min(max(0, drainReconnectAfterMilliseconds), 3_600_000)
        self.drainJitterMilliseconds = min(max(0, drainJitterMilliseconds), 3_600_000)
    }

    /// Bytes of kept sessions' subscription data at most (64 MiB).
    static let maxKeptBytes = 64 << 20
}
