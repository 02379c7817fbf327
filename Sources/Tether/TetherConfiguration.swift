public import Logging
public import TetherClientCore
@_spi(Benchmarks) import TetherProtocol

/// Everything a ``TetherClient`` needs to know, as a value. Creating one does no I/O.
///
/// ```swift
/// var configuration = try TetherConfiguration(subscribeKey: "demo", publishKey: "demo", userId: "alice")
/// configuration.origin = "127.0.0.1:8080"
/// configuration.useTLS = false
/// let client = TetherClient(configuration: configuration)
/// ```
public struct TetherConfiguration: Sendable {
    /// The subscribe key (required by every call).
    public var subscribeKey: String
    /// The publish key (publish, signal, fire).
    public var publishKey: String?
    /// The secret key: only for trusted server-side clients. When set, every request is signed
    /// (pubnub-wire §12) and Access Manager calls (grant, revoke) become available.
    public var secretKey: String?
    /// This client's identity (`uuid`): 1–92 characters, no commas or control characters.
    public private(set) var userId: String
    /// A legacy auth key or an Access Manager v3 token sent as `auth`.
    public var authKey: String?
    /// The server, as `host` or `host:port` (no scheme), for example `"tether.example.com"` or `"127.0.0.1:8080"`.
    public private(set) var origin: String
    /// Other nodes serving the same keys (Ably's fallback hosts), as `host` or `host:port` like
    /// ``origin``; empty (the default) uses ``origin`` alone. Set with ``setFallbackOrigins(_:)``.
    ///
    /// ``origin`` stays preferred. When a request to the node in use fails at the connection
    /// level (connection refused, host unreachable, a timeout, a TLS failure, a 500–504), or the
    /// node announces a graceful shutdown (the WebSocket `drain` notice, a long-poll's
    /// `Tether-Draining` header), the next request goes to the next fallback, in a random order
    /// drawn once per cycle; a fallback that answers is kept for ``fallbackRetryTimeout``, then
    /// ``origin`` is tried again. Refusals of a request (400, 403, 404, 429…) never move the
    /// client. The subscription carries its cursor to the new node (docs/connection-lifecycle.md,
    /// "Failover"); ``TetherClient/currentOrigin`` is the node in use.
    public private(set) var fallbackOrigins: [String]
    /// How long a fallback origin that answered is used before ``origin`` is tried again
    /// (default 10 minutes, Ably's `fallbackRetryTimeout`).
    public var fallbackRetryTimeout: Duration
    /// Use HTTPS (default) or plain HTTP.
    public var useTLS: Bool
    /// PEM certificates of the certificate authorities to trust instead of the system's (for
    /// self-hosted servers with a private CA). `nil` trusts the system roots.
    public var trustedCertificateAuthoritiesPEM: [UInt8]?
    /// Timeout of every non-subscribe request (default 15 s); each call can override it.
    public var nonSubscribeTimeout: Duration
    /// Timeout of the subscribe long-poll (default 310 s: the server answers within 280 s).
    public var subscribeTimeout: Duration
    /// Timeout for establishing a TCP (and TLS) connection (default 10 s).
    public var connectTimeout: Duration
    /// Seconds the server keeps this user present without a heartbeat (default 300; 20–320 is sensible).
    public var presenceTimeout: Int
    /// Seconds between presence heartbeats; 0 (default) sends none and relies on the subscribe
    /// long-poll as the heartbeat (a Tether server answers a long-poll before its presence
    /// timeout, so a short ``presenceTimeout`` needs no explicit heartbeats).
    public var heartbeatInterval: Int
    /// A subscribe filter expression (pubnub-wire §10); a malformed one yields
    /// ``StatusCategory/malformedFilterExpression``.
    public var filterExpression: String?
    /// End-to-end encryption of message payloads; `nil` sends and receives plaintext.
    public var cryptoModule: CryptoModule?
    /// Automatic-retry settings (used by the subscribe engine).
    public var retry: RetryConfiguration
    /// A subscribe response with at least this many messages raises
    /// ``StatusCategory/requestMessageCountExceeded``; 0 disables the check.
    public var requestMessageCountThreshold: Int
    /// The logger the client writes its transcript to (requests at `trace`, failures at `debug`).
    public var logger: Logger
    /// Continue with the current cursor when channels are added or removed (default true, as
    /// PubNub's `keepTimeTokenOnListChange`); false takes a fresh cursor for the new list.
    public var keepTimetokenOnListChange: Bool
    /// After the subscribe loop gave up following an unexpected disconnect, probe the Time API
    /// every ``timeProbeInterval`` and restore the subscription when it answers (default true);
    /// false forgets the channels (seed 001).
    public var restoreSubscription: Bool
    /// Resume from the last cursor after a reconnect or restore, so nothing is missed (default
    /// true); false continues from "now" (messages published meanwhile are only in history).
    public var catchUpOnSubscriptionRestore: Bool
    /// Time API probing period while unexpectedly disconnected (default 10 s).
    public var timeProbeInterval: Duration
    /// Dead-link detection while receiving: a Time request every `probeInterval`, each allowed
    /// `probeTimeout`; a failure restarts the loop. Default 25 s + 10 s: a dead link is noticed
    /// within 35 s. `nil` disables it. With ``heartbeatInterval`` > 0 the presence heartbeats
    /// are the probes instead, at that interval (a dead link is then noticed within
    /// `heartbeatInterval` + `probeTimeout`), and a failed heartbeat restarts the loop even when
    /// this is `nil`.
    public var deadLinkDetection: DeadLinkDetection?
    /// Whether the client watches the device's network itself (default true): rtnetlink on
    /// Linux (loopback counted when the origin is a loopback address), `NWPathMonitor` on Apple
    /// platforms. While the network is down, retries pause (`networkDown`); when it returns, the
    /// subscription reconnects at once (`networkUp`). Applies to clients created without an
    /// explicit monitor (``TetherClient/init(configuration:)``, ``TetherClient/init(configuration:transport:)``);
    /// ``TetherClient/init(configuration:transport:clock:networkMonitor:)`` uses the one it is given.
    public var watchesNetwork: Bool
    /// Which presence-heartbeat results become statuses (default failures only).
    public var heartbeatReporting: HeartbeatReporting
    /// When the subscribe engine fetches history itself (default: when the server reports a
    /// retention gap).
    public var backfill: BackfillPolicy
    /// The outbox every publish and signal goes through: its bounds, retries and optional
    /// durable journal (default: 1,000 messages, 4 MiB, 4 channels at once, in memory only).
    public var outbox: OutboxConfiguration
    /// The wire the subscribe engine receives on (default ``TransportPreference/automatic``:
    /// a WebSocket session, falling back to long-poll when the upgrade is refused).
    public var transport: TransportPreference
    /// Settings of the WebSocket wire: inactivity pings, dead-link timeout, fallback interval.
    public var webSocket: WebSocketOptions
    /// What the client does when the app goes to the background and comes back
    /// (``TetherClient/enterBackground()``, ``TetherClient/enterForeground()``; docs/mobile.md).
    /// Default: suspend for 5 minutes, catch up on everything, observe the application's
    /// notifications on Apple platforms.
    public var lifecycle: LifecycleOptions

    /// Creates a configuration; throws when the user id or origin is invalid.
    public init(subscribeKey: String, publishKey: String? = nil, secretKey: String? = nil, userId: String,
                authKey: String? = nil, origin: String = "127.0.0.1:8080", useTLS: Bool = true,
                logger: Logger = Logger(label: "tether.client")) throws(ConfigurationError) {
        guard NameRules.validateKey(subscribeKey) else { throw .invalidSubscribeKey(subscribeKey) }
        if let publishKey, !NameRules.validateKey(publishKey) { throw .invalidPublishKey(publishKey) }
        self.subscribeKey = subscribeKey
        self.publishKey = publishKey
        self.secretKey = secretKey
        self.userId = ""
        self.authKey = authKey
        self.origin = ""
        self.fallbackOrigins = []
        self.fallbackRetryTimeout = .seconds(600)
        self.useTLS = useTLS
        self.trustedCertificateAuthoritiesPEM = nil
        self.nonSubscribeTimeout = .seconds(15)
        self.subscribeTimeout = .seconds(310)
        self.connectTimeout = .seconds(10)
        self.presenceTimeout = 300
        self.heartbeatInterval = 0
        self.filterExpression = nil
        self.cryptoModule = nil
        self.retry = .default
        self.requestMessageCountThreshold = 100
        self.logger = logger
        self.keepTimetokenOnListChange = true
        self.restoreSubscription = true
        self.catchUpOnSubscriptionRestore = true
        self.timeProbeInterval = .seconds(10)
        self.watchesNetwork = true
        self.deadLinkDetection = DeadLinkDetection()
        self.heartbeatReporting = .failures
        self.backfill = .onGap
        self.outbox = OutboxConfiguration()
        self.transport = .automatic
        self.webSocket = WebSocketOptions()
        self.lifecycle = LifecycleOptions()
        try setUserId(userId)
        try setOrigin(origin)
    }

    /// Changes the user id, validating it.
    public mutating func setUserId(_ userId: String) throws(ConfigurationError) {
        do { try NameRules.validateUserId(userId) } catch { throw .invalidUserId(userId, error.description) }
        self.userId = userId
    }

    /// Changes the origin (`host` or `host:port`), validating it.
    public mutating func setOrigin(_ origin: String) throws(ConfigurationError) {
        guard let parsed = Self.parseOrigin(origin) else { throw .invalidOrigin(origin) }
        _ = parsed
        self.origin = origin
    }

    /// Changes the fallback origins (each `host` or `host:port`, validated like ``origin``).
    /// Repeats, and the primary ``origin`` itself, are dropped; the order does not matter (a
    /// cycle tries them in a random order).
    public mutating func setFallbackOrigins(_ origins: [String]) throws(ConfigurationError) {
        for origin in origins where Self.parseOrigin(origin) == nil { throw .invalidOrigin(origin) }
        var seen: Set<String> = []
        self.fallbackOrigins = origins.filter { $0 != origin && seen.insert($0).inserted }
    }

    /// The origin's host and optional port.
    package var originHostAndPort: (host: String, port: Int?) {
        Self.parseOrigin(origin) ?? (origin, nil)
    }

    /// The base URL requests go to, for example `https://tether.example.com`.
    package var baseURL: String { baseURL(of: origin) }

    /// The base URL of one origin (the primary or a fallback).
    package func baseURL(of origin: String) -> String { (useTLS ? "https://" : "http://") + origin }

    static func parseOrigin(_ origin: String) -> (host: String, port: Int?)? {
        guard !origin.isEmpty, !origin.contains("/"), !origin.contains("://"), !origin.contains(where: \.isWhitespace) else { return nil }
        if origin.hasPrefix("[") {  // [::1]:8080
            guard let close = origin.firstIndex(of: "]") else { return nil }
            let host = String(origin[origin.index(after: origin.startIndex)..<close])
            let rest = origin[origin.index(after: close)...]
            if rest.isEmpty { return (host, nil) }
            guard rest.hasPrefix(":"), let port = Int(rest.dropFirst()), (1...65535).contains(port) else { return nil }
            return (host, port)
        }
        let parts = origin.split(separator: ":", omittingEmptySubsequences: false)
        switch parts.count {
        case 1: return (origin, nil)
        case 2:
            guard !parts[0].isEmpty, let port = Int(parts[1]), (1...65535).contains(port) else { return nil }
            return (String(parts[0]), port)
        default: return nil
        }
    }
}

/// Why a ``TetherConfiguration`` was refused.
public enum ConfigurationError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The user id is empty, too long or contains forbidden characters.
    case invalidUserId(String, String)
    /// The origin is not `host` or `host:port`.
    case invalidOrigin(String)
    /// The subscribe key is empty or has characters outside `[A-Za-z0-9._-]`.
    case invalidSubscribeKey(String)
    /// The publish key has characters outside `[A-Za-z0-9._-]`.
    case invalidPublishKey(String)
    /// ``TetherConfiguration/trustedCertificateAuthoritiesPEM`` is not valid PEM.
    case invalidCertificateAuthorities(String)

    /// A message for humans.
    public var description: String {
        switch self {
        case .invalidUserId(let id, let why): return "invalid user id \(String(reflecting: id)): \(why)"
        case .invalidOrigin(let origin): return "invalid origin \(String(reflecting: origin)): expected host or host:port without a scheme"
        case .invalidSubscribeKey(let key): return "invalid subscribe key \(String(reflecting: key))"
        case .invalidPublishKey(let key): return "invalid publish key \(String(reflecting: key))"
        case .invalidCertificateAuthorities(let why): return "the trusted certificate authorities are not valid PEM: \(why)"
        }
    }
}

/// Dead-link detection settings (``TetherConfiguration/deadLinkDetection``).
public struct DeadLinkDetection: Sendable, Hashable {
    /// Time between probes while receiving (default 25 s).
    public var probeInterval: Duration
    /// How long one probe may take (default 10 s).
    public var probeTimeout: Duration

    /// Creates the settings; a dead link is noticed within `probeInterval + probeTimeout`.
    public init(probeInterval: Duration = .seconds(25), probeTimeout: Duration = .seconds(10)) {
        self.probeInterval = probeInterval
        self.probeTimeout = probeTimeout
    }
}

extension TetherConfiguration {
    /// Whether the origin's host is a loopback address (the client and server share a machine).
    var originIsLoopback: Bool {
        let host = originHostAndPort.host.lowercased()
        return host == "localhost" || host == "::1" || host.hasPrefix("127.")
    }
}

