/// The subscribe loop's connection, in the shape a UI binds to.
///
/// Mapping to other systems (`docs/connection-lifecycle.md`): SendBird `OPEN` = ``connected``;
/// `CONNECTING` = ``connecting`` and ``reconnecting(attempt:)``; `CLOSED` = everything else.
/// Diffusion `CONNECTING` = ``connecting``; `CONNECTED_ACTIVE` = ``connected``;
/// `RECOVERING_RECONNECT` = ``reconnecting(attempt:)`` and ``waitingForNetwork``;
/// `CLOSED_BY_CLIENT` = ``disconnected``, ``background`` and ``idle``; `CLOSED_FAILED` = ``failed(_:)``.
public enum ConnectionState: Sendable, Hashable, CustomStringConvertible {
    /// Nothing is subscribed; no request runs.
    case idle
    /// The first handshake is running.
    case connecting
    /// Real-time data flows.
    case connected
    /// The loop lost its connection and is retrying; `attempt` retries have been scheduled so far
    /// in this outage (0 while the immediate attempt after a network change or probe runs).
    case reconnecting(attempt: Int)
    /// The device has no network: retries are paused until the network monitor reports it back.
    case waitingForNetwork
    /// The app called `disconnect()`; `reconnect()` resumes.
    case disconnected
    /// The app is in the background and the client let go of its connection
    /// (``BackgroundPolicy/disconnect`` or ``BackgroundPolicy/suspend(keepAlive:keepPresence:)``); the cursor
    /// is kept and `enterForeground()` resumes (or `reconnect()`).
    case background
    /// The loop gave up (the category says why: connection error, disconnected unexpectedly,
    /// access denied, malformed filter expression, bad request). `reconnect()` starts again; after
    /// an unexpected disconnect the client also probes the Time API and restores on its own.
    case failed(StatusCategory)

    /// A short name for logs and CLIs.
    public var description: String {
        switch self {
        case .idle: return "idle"
        case .connecting: return "connecting"
        case .connected: return "connected"
        case .reconnecting(let attempt): return "reconnecting(attempt: \(attempt))"
        case .waitingForNetwork: return "waitingForNetwork"
        case .disconnected: return "disconnected"
        case .background: return "background"
        case .failed(let category): return "failed(\(category))"
        }
    }

    /// SendBird's three-valued connection state (seed 003).
    public var sendBirdState: String {
        switch self {
        case .connected: return "OPEN"
        case .connecting, .reconnecting: return "CONNECTING"
        case .idle, .waitingForNetwork, .disconnected, .background, .failed: return "CLOSED"
        }
    }
}

/// SendBird's reconnect events (seed 003): one `started` per outage, then exactly one of
/// `succeeded` or `failed` — never unpaired, never repeated per attempt.
public enum ReconnectEvent: String, Sendable, Hashable, CustomStringConvertible {
    /// The connection was lost and automatic reconnection began.
    case started
    /// The loop is receiving again.
    case succeeded
    /// The loop gave up; the app should offer a manual `reconnect()`.
    case failed

    /// The case name.
    public var description: String { rawValue }
}

/// One change of ``ConnectionState``, with the reconnect event it completes, if any.
public struct ConnectionChange: Sendable, Hashable, CustomStringConvertible {
    /// The state before.
    public var previous: ConnectionState
    /// The state now.
    public var current: ConnectionState
    /// The reconnect event this change carries.
    public var reconnectEvent: ReconnectEvent?

    /// Creates a change.
    public init(previous: ConnectionState, current: ConnectionState, reconnectEvent: ReconnectEvent? = nil) {
        self.previous = previous
        self.current = current
        self.reconnectEvent = reconnectEvent
    }

    /// `previous -> current [event]`.
    public var description: String {
        "\(previous) -> \(current)" + (reconnectEvent.map { " [reconnect \($0)]" } ?? "")
    }
}
