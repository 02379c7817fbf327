import ArgumentParser
import Foundation
import Logging
import Prometheus
import TetherServer
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// `tether serve`: run the server until SIGINT/SIGTERM.
struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run the Tether server.",
        discussion: """
            Every option can also be set through the environment variable shown; a flag wins over \
            the environment. The server prints one line with its URL when it is ready, and on \
            SIGINT/SIGTERM answers waiting long-polls, finishes in-flight requests, flushes the \
            store and exits 0.

            At start the store gets SQLite's quick check. A damaged or foreign file stops the \
            server with a message naming it: see `tether store check` and `tether store recover`.

            Without --config the server accepts only the demo/demo keyset (no access control). \
            A config file is JSON; see docs/configuration.md.
            """
    )

    @Option(help: "Address to listen on. [env: TETHER_HOST] (default: 127.0.0.1)")
    var host: String?

    @Option(help: "Port to listen on; 0 picks a free one. [env: TETHER_PORT] (default: 8090)")
    var port: Int?

    @Option(name: .customLong("data-dir"), help: "Directory for the SQLite store. [env: TETHER_DATA_DIR] (default: ./.tether-data)")
    var dataDir: String?

    @Option(help: "JSON file with keysets and limits. [env: TETHER_CONFIG]")
    var config: String?

    @Option(name: .customLong("log-level"), help: "trace, debug, info, notice, warning, error or critical. [env: TETHER_LOG_LEVEL] (default: info)")
    var logLevel: String?

    @Option(name: .customLong("tls-cert"), help: "PEM certificate chain: serve HTTPS. Needs --tls-key. [env: TETHER_TLS_CERT]")
    var tlsCert: String?

    @Option(name: .customLong("tls-key"), help: "PEM private key for --tls-cert. [env: TETHER_TLS_KEY]")
    var tlsKey: String?

    @Option(name: .customLong("subscribe-timeout"), help: "Seconds a subscribe long-poll waits before answering empty. [env: TETHER_SUBSCRIBE_TIMEOUT] (default: 280)")
    var subscribeTimeout: Double?

    @Option(name: .customLong("rate-limits"), help: """
        on or off: per-client and per-address request rate limits (docs/operations.md, "Bounds"). \
        Off is for load tests and trusted networks. [env: TETHER_RATE_LIMITS] (default: on)
        """)
    var rateLimits: String?

    @Option(help: "full (every acknowledged publish fsynced) or normal (fewer fsyncs; may lose the last commits on power loss). [env: TETHER_DURABILITY] (default: full)")
    var durability: String?

    @Option(name: .customLong("dedup-window"), help: """
        Seconds a publish with a request id is remembered, so a repeat is answered with the original timetoken \
        (0-86400; 0 turns deduplication off). [env: TETHER_DEDUP_WINDOW] (default: 600)
        """)
    var dedupWindow: Int?

    @Option(name: .customLong("dedup-max-entries"), help: """
        Publishes remembered for deduplication at most; beyond it the oldest are forgotten early \
        (1-10000000). [env: TETHER_DEDUP_MAX_ENTRIES] (default: 100000)
        """)
    var dedupMaxEntries: Int?

    @Flag(inversion: .prefixedNo, help: """
        Run SQLite's quick check on the store before serving (reads the whole file once, about 7 s per GB).         [env: TETHER_STORE_CHECK=0 turns it off] (default: on)
        """)
    var storeCheck: Bool?

    @Option(name: .customLong("ws"), help: """
        on or off: the WebSocket session endpoint GET /v2/ws on the same port (docs/websocket-protocol.md). \
        [env: TETHER_WS] (default: on)
        """)
    var webSocket: String?

    @Option(name: .customLong("ws-keepalive"), help: """
        Seconds a WebSocket session is kept after its socket drops, for the client to resume it. \
        [env: TETHER_WS_KEEPALIVE] (default: 300)
        """)
    var wsKeepAlive: Int?

    @Option(name: .customLong("ws-max-suspend"), help: """
        The longest a client in the background may ask (with a suspend frame) to keep its WebSocket session, cursor \
        and presence, in seconds. [env: TETHER_WS_MAX_SUSPEND] (default: 3600)
        """)
    var wsMaxSuspend: Int?

    @Option(name: .customLong("ws-ping-interval"), help: """
        Idle seconds before the server pings a WebSocket; two missed pings close it. [env: TETHER_WS_PING_INTERVAL] (default: 25)
        """)
    var wsPingInterval: Int?

    @Option(name: .customLong("ws-max-connections"), help: """
        Open WebSocket connections at most; over it the upgrade gets 503 with Retry-After. \
        [env: TETHER_WS_MAX_CONNECTIONS] (default: 10000)
        """)
    var wsMaxConnections: Int?

    @Option(name: .customLong("ws-max-kept-sessions"), help: """
        Disconnected WebSocket sessions kept at most; over it the oldest expires (logged). \
        [env: TETHER_WS_MAX_KEPT_SESSIONS] (default: 10000)
        """)
    var wsMaxKeptSessions: Int?

    @Option(name: .customLong("ws-outbound-buffer"), help: """
        Frames waiting for one WebSocket at most; over it the client is disconnected as a slow consumer \
        (its session is kept). [env: TETHER_WS_OUTBOUND_BUFFER] (default: 256)
        """)
    var wsOutboundBuffer: Int?

    @OptionGroup(title: "Mobile push (docs/push.md)") var push: ServePushOptions
    @Option(name: .customLong("files-dir"), help: """
        Directory for uploaded files. [env: TETHER_FILES_DIR] (default: <data-dir>/files)
        """)
    var filesDir: String?

    @Option(name: .customLong("files-max-bytes"), help: """
        Largest file accepted, in bytes (1 to 5368709120). [env: TETHER_FILES_MAX_BYTES] (default: 5242880)
        """)
    var filesMaxBytes: Int?

    @Option(name: .customLong("files-public-url"), help: """
        Origin clients reach this server at, for the upload and download URLs it hands out \
        (e.g. https://chat.example.com). [env: TETHER_FILES_PUBLIC_URL] (default: the request's Host)
        """)
    var filesPublicURL: String?
    @Option(name: .customLong("admin-secret"), help: ArgumentHelp("""
        Turns on the live debug console at /console and the admin API at /admin/v1/, protected by this secret \
        (at least 12 characters; docs/console.md). Off (404) without it. Prefer the environment variable or the \
        config file's adminSecret: a flag shows in the process list. [env: TETHER_ADMIN_SECRET]
        """, valueName: "secret"))
    var adminSecret: String?

    @Option(name: .customLong("database-url"), help: ArgumentHelp("""
        Run as one node of a cluster: share messages with every node on this PostgreSQL database \
        (postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=disable|prefer|require]; created and migrated \
        by Tether; docs/operations.md). Each node still needs its own --data-dir. Prefer the environment variable \
        or the config file's databaseURL when the URL has a password. [env: TETHER_DATABASE_URL] \
        (default: the embedded store only)
        """, valueName: "url"))
    var databaseURL: String?

    func validate() throws {
        if let filesMaxBytes, !(1...5_368_709_120).contains(filesMaxBytes) {
            throw ValidationError("--files-max-bytes must be between 1 and 5368709120")
        }
        if let webSocket, Self.switchValue(webSocket) == nil { throw ValidationError("--ws must be on or off") }
        let bounds: [(String, Int?, ClosedRange<Int>)] = [
            ("--ws-keepalive", wsKeepAlive, 1...86_400), ("--ws-ping-interval", wsPingInterval, 1...3_600),
            ("--ws-max-suspend", wsMaxSuspend, 1...86_400),
            ("--ws-max-connections", wsMaxConnections, 1...10_000_000), ("--ws-max-kept-sessions", wsMaxKeptSessions, 0...10_000_000),
            ("--ws-outbound-buffer", wsOutboundBuffer, 1...1_000_000),
        ]
        for (name, value, range) in bounds {
            if let value, !range.contains(value) {
                throw ValidationError("\(name) must be between \(range.lowerBound) and \(range.upperBound)")
            }
        }
        if let rateLimits, Self.switchValue(rateLimits) == nil { throw ValidationError("--rate-limits must be on or off") }
        if let durability, StoreOptions.Durability(rawValue: durability) == nil {
            throw ValidationError("--durability must be full or normal")
        }
        if let port, !(0...65535).contains(port) { throw ValidationError("--port must be between 0 and 65535") }
        if let dedupWindow, !(0...86_400).contains(dedupWindow) {
            throw ValidationError("--dedup-window must be between 0 (off) and 86400 seconds")
        }
        if let dedupMaxEntries, !(1...10_000_000).contains(dedupMaxEntries) {
            throw ValidationError("--dedup-max-entries must be between 1 and 10000000")
        }
        if let logLevel, Logger.Level(rawValue: logLevel) == nil {
            throw ValidationError("--log-level must be one of trace, debug, info, notice, warning, error, critical")
        }
    }

    /// The `--ws…` options over their environment variables.
    private func webSocketSettings(_ env: [String: String]) throws -> WebSocketSettings {
        func number(_ flag: Int?, _ name: String, _ range: ClosedRange<Int>, default value: Int) throws -> Int {
            if let flag { return flag }
            guard let text = env[name] else { return value }
            guard let parsed = Int(text), range.contains(parsed) else {
                throw ValidationError("\(name) must be a whole number between \(range.lowerBound) and \(range.upperBound)")
            }
            return parsed
        }
        var enabled = true
        if let text = webSocket ?? env["TETHER_WS"] {
            guard let value = Self.switchValue(text) else { throw ValidationError("TETHER_WS must be on or off") }
            enabled = value
        }
        let defaults = WebSocketSettings()
        return WebSocketSettings(
            enabled: enabled,
            keepAliveSeconds: try number(wsKeepAlive, "TETHER_WS_KEEPALIVE", 1...86_400, default: defaults.keepAliveSeconds),
            pingIntervalSeconds: try number(wsPingInterval, "TETHER_WS_PING_INTERVAL", 1...3_600, default: defaults.pingIntervalSeconds),
            maxConnections: try number(wsMaxConnections, "TETHER_WS_MAX_CONNECTIONS", 1...10_000_000, default: defaults.maxConnections),
            maxKeptSessions: try number(wsMaxKeptSessions, "TETHER_WS_MAX_KEPT_SESSIONS", 0...10_000_000, default: defaults.maxKeptSessions),
            outboundBufferFrames: try number(wsOutboundBuffer, "TETHER_WS_OUTBOUND_BUFFER", 1...1_000_000,
                                             default: defaults.outboundBufferFrames),
            maxSuspendSeconds: try number(wsMaxSuspend, "TETHER_WS_MAX_SUSPEND", 1...86_400, default: defaults.maxSuspendSeconds))
    }

    func run() async throws {
        let env = ProcessInfo.processInfo.environment
        let levelText = logLevel ?? env["TETHER_LOG_LEVEL"] ?? "info"
        guard let level = Logger.Level(rawValue: levelText) else {
            throw ValidationError("TETHER_LOG_LEVEL must be one of trace, debug, info, notice, warning, error, critical")
        }
        var logger = Logger(label: "tether") { ServerLogHandler(label: $0) }
        logger.logLevel = level

        var file = ConfigurationFile()
        if let path = config ?? env["TETHER_CONFIG"] {
            file = try ConfigurationFile.load(path: path)
        }
        var environmentTimeout: Double?
        if subscribeTimeout == nil, let text = env["TETHER_SUBSCRIBE_TIMEOUT"] {
            guard let value = Double(text) else { throw ValidationError("TETHER_SUBSCRIBE_TIMEOUT must be a number of seconds") }
            environmentTimeout = value
        }
        if let timeout = subscribeTimeout ?? environmentTimeout {
            file.subscribeTimeoutSeconds = timeout
            try file.validate()
        }
        if let text = rateLimits ?? env["TETHER_RATE_LIMITS"] {
            guard let enabled = Self.switchValue(text) else { throw ValidationError("TETHER_RATE_LIMITS must be on or off") }
            file.rateLimiting = enabled
        }
        if let text = durability ?? env["TETHER_DURABILITY"] {
            guard let value = StoreOptions.Durability(rawValue: text) else {
                throw ValidationError("TETHER_DURABILITY must be full or normal")
            }
            file.store = file.store ?? .init()
            file.store?.durability = value
        }
        if let window = try dedupWindow ?? Self.integer(env, "TETHER_DEDUP_WINDOW") {
            file.dedup = file.dedup ?? .init()
            file.dedup?.windowSeconds = window
        }
        if let entries = try dedupMaxEntries ?? Self.integer(env, "TETHER_DEDUP_MAX_ENTRIES") {
            file.dedup = file.dedup ?? .init()
            file.dedup?.maxEntries = entries
        }
        if file.dedup != nil { try file.validate() }
        try push.apply(to: &file, env: env)
        var resolvedPort = port ?? 8090
        if port == nil, let text = env["TETHER_PORT"] {
            guard let value = Int(text), (0...65535).contains(value) else { throw ValidationError("TETHER_PORT must be a port number") }
            resolvedPort = value
        }
        var tls: (certificatePath: String, privateKeyPath: String)?
        switch (tlsCert ?? env["TETHER_TLS_CERT"], tlsKey ?? env["TETHER_TLS_KEY"]) {
        case (let cert?, let key?): tls = (cert, key)
        case (nil, nil): tls = nil
        default: throw ValidationError("--tls-cert and --tls-key go together")
        }
        var settings = ServerConfiguration(
            host: host ?? env["TETHER_HOST"] ?? "127.0.0.1",
            port: resolvedPort,
            dataDirectory: dataDir ?? env["TETHER_DATA_DIR"] ?? ".tether-data",
            file: file,
            tls: tls,
            checksStoreAtStart: storeCheck ?? !["0", "off", "false", "no"].contains(env["TETHER_STORE_CHECK"]?.lowercased() ?? "")
        )
        settings.webSocket = try webSocketSettings(env)
        settings.files = try fileSettings(env)
        // The flag, then the environment, then the config file's `adminSecret` (ServerConfiguration's default).
        if let secret = adminSecret ?? env["TETHER_ADMIN_SECRET"] ?? file.adminSecret {
            guard secret.utf8.count >= 12 else { throw ValidationError("the admin secret must be at least 12 characters") }
            settings.adminSecret = secret
        }
        // The flag, then the environment, then the config file's `databaseURL`.
        if let url = databaseURL ?? env["TETHER_DATABASE_URL"].flatMap({ $0.isEmpty ? nil : $0 }) ?? file.databaseURL {
            do {
                _ = try DatabaseURL(url)
            } catch {
                throw ValidationError(error.description)
            }
            settings.databaseURL = url
        }
        let configuration = settings
        raiseOpenFileLimit(logger: logger)
        // Held until the process exits: `tether store recover` and a second server wait for it.
        let lock = try DataDirectoryLock(directory: configuration.dataDirectory)
        defer { withExtendedLifetime(lock) {} }
        let registry = PrometheusCollectorRegistry()
        let server = try await TetherServer.open(configuration: configuration, logger: logger, registry: registry)
        let keysets = server.state.keysets.all.map { $0.name ?? $0.subscribeKey }.sorted().joined(separator: ", ")
        let readyLogger = logger
        try await server.run(handleSignals: true) { url in
            readyLogger.info("server ready", metadata: ["url": "\(url)", "data-dir": "\(configuration.dataDirectory)", "keysets": "\(keysets)"])
            // One line on stdout, flushed at once, so scripts can wait for it.
            FileHandle.standardOutput.write(Data("Tether listening on \(url)\n".utf8))
        }
    }
}

extension Serve {
    /// An integer environment variable, or `nil` when unset.
    static func integer(_ env: [String: String], _ name: String) throws -> Int? {
        guard let text = env[name] else { return nil }
        guard let value = Int(text) else { throw ValidationError("\(name) must be an integer") }
        return value
    }

    /// `on`/`off` (also `true`/`false`, `1`/`0`).
    static func switchValue(_ text: String) -> Bool? {
        switch text.lowercased() {
        case "on", "true", "1": true
        case "off", "false", "0": false
        default: nil
        }
    }
}

/// Every waiting long-poll holds a socket: raise the soft open-file limit to the hard limit so a
/// default shell limit (often 1024) does not cap the server far below 10,000 subscribers.
func raiseOpenFileLimit(logger: Logger) {
    var limit = rlimit()
    guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return }
    let previous = limit.rlim_cur
    guard previous < limit.rlim_max else { return }
    limit.rlim_cur = limit.rlim_max
    if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 {
        logger.debug("raised open-file limit", metadata: ["from": "\(previous)", "to": "\(limit.rlim_max)"])
    } else {
        logger.warning("could not raise the open-file limit; long-polls are capped by it", metadata: ["limit": "\(previous)"])
    }
}

extension Serve {
    /// `--files-*` options and their environment variables.
    func fileSettings(_ env: [String: String]) throws -> FileSettings {
        var settings = FileSettings()
        settings.directory = filesDir ?? env["TETHER_FILES_DIR"].flatMap { $0.isEmpty ? nil : $0 }
        if let value = filesMaxBytes ?? env["TETHER_FILES_MAX_BYTES"].flatMap({ Int($0) }) {
            guard (1...5_368_709_120).contains(value) else { throw ValidationError("--files-max-bytes must be between 1 and 5368709120") }
            settings.maxBytes = value
        }
        if let url = filesPublicURL ?? env["TETHER_FILES_PUBLIC_URL"].flatMap({ $0.isEmpty ? nil : $0 }) {
            guard url.hasPrefix("http://") || url.hasPrefix("https://") else {
                throw ValidationError("--files-public-url must start with http:// or https://")
            }
            settings.publicURL = url
        }
        return settings
    }
}
