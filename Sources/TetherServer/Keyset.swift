import Foundation
public import TetherServerCore

/// Limits applied to requests, per keyset or server-wide (PubNub-compatible defaults).
public struct Limits: Sendable, Codable, Equatable {
    /// Largest message (decoded JSON plus channel name), in bytes. Larger → 413.
    public var maxMessageBytes: Int = 32 * 1024
    /// Largest signal payload, in bytes. Larger → 400 `Signal size too large`.
    public var maxSignalBytes: Int = 64
    /// Longest request URI, in bytes. Longer → 414.
    public var maxURIBytes: Int = 32 * 1024
    /// Most channels plus groups in one subscribe request.
    public var maxChannelsPerSubscribe: Int = 200
    /// Envelopes per subscribe response (PubNub: 100).
    public var maxEnvelopesPerResponse: Int = 100
    /// Channels in one channel group (PubNub: 2,000).
    public var maxChannelsPerGroup: Int = 2000
    /// Channel groups in one keyset (each holds up to ``maxChannelsPerGroup`` channels in memory
    /// and in the store). Creating one more → 400 `Maximum channel group count exceeded.`
    public var maxGroupsPerKeyset: Int = 10_000
    /// Publishes and signals per second per client (its `uuid`, else its address); 0 = no
    /// limit. Over it → 429 with `Retry-After`. Default 100 (Ably's default is 50 per connection).
    public var publishRatePerSecond: Double = 100
    /// Publishes a client may send at once before the rate applies (default 500).
    public var publishBurst: Double = 500
    /// Other non-subscribe requests per second per client; 0 = no limit (default 100).
    public var requestRatePerSecond: Double = 100
    /// Non-subscribe requests a client may send at once before the rate applies (default 500).
    public var requestBurst: Double = 500
    /// Publishes and signals per second from one address, whatever uuids it uses; 0 = no limit
    /// (default 1,000).
    public var publishRatePerAddress: Double = 1_000
    /// Publishes one address may send at once (default 5,000).
    public var publishBurstPerAddress: Double = 5_000
    /// Other non-subscribe requests per second from one address; 0 = no limit (default 1,000).
    public var requestRatePerAddress: Double = 1_000
    /// Non-subscribe requests one address may send at once (default 5,000).
    public var requestBurstPerAddress: Double = 5_000
    /// Channel groups in one subscribe, heartbeat or presence request (PubNub: 10).
    public var maxGroupsPerRequest: Int = 10

    /// Creates the default limits.
    public init() {}

    /// Checks every limit against its documented range (docs/configuration.md), so no
    /// configured value can overflow the arithmetic that uses it.
    func validate(_ context: String) throws(ServerConfigurationError) {
        func check(_ name: String, _ value: Int, _ range: ClosedRange<Int>) throws(ServerConfigurationError) {
            guard range.contains(value) else {
                throw ServerConfigurationError("\(context): \(name) must be between \(range.lowerBound) and \(range.upperBound)")
            }
        }
        func check(_ name: String, _ value: Double, _ range: ClosedRange<Double>) throws(ServerConfigurationError) {
            guard value.isFinite, range.contains(value) else {
                throw ServerConfigurationError("\(context): \(name) must be between \(range.lowerBound) and \(range.upperBound)")
            }
        }
        try check("maxMessageBytes", maxMessageBytes, 64...(4 * 1024 * 1024))
        try check("maxSignalBytes", maxSignalBytes, 1...(64 * 1024))
        try check("maxURIBytes", maxURIBytes, 1024...(1024 * 1024))
        try check("maxChannelsPerSubscribe", maxChannelsPerSubscribe, 1...10_000)
        try check("maxEnvelopesPerResponse", maxEnvelopesPerResponse, 1...10_000)
        try check("maxChannelsPerGroup", maxChannelsPerGroup, 1...100_000)
        try check("maxGroupsPerKeyset", maxGroupsPerKeyset, 1...1_000_000)
        try check("publishRatePerSecond", publishRatePerSecond, 0...1_000_000)
        try check("publishBurst", publishBurst, 1...1_000_000)
        try check("requestRatePerSecond", requestRatePerSecond, 0...1_000_000)
        try check("requestBurst", requestBurst, 1...1_000_000)
        try check("publishRatePerAddress", publishRatePerAddress, 0...1_000_000)
        try check("publishBurstPerAddress", publishBurstPerAddress, 1...1_000_000)
        try check("requestRatePerAddress", requestRatePerAddress, 0...1_000_000)
        try check("requestBurstPerAddress", requestBurstPerAddress, 1...1_000_000)
        try check("maxGroupsPerRequest", maxGroupsPerRequest, 1...1_000)
    }

    /// Decodes limits, keeping defaults for absent keys.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let d = Limits.init()
        maxMessageBytes = try c.decodeIfPresent(Int.self, forKey: .maxMessageBytes) ?? d.maxMessageBytes
        maxSignalBytes = try c.decodeIfPresent(Int.self, forKey: .maxSignalBytes) ?? d.maxSignalBytes
        maxURIBytes = try c.decodeIfPresent(Int.self, forKey: .maxURIBytes) ?? d.maxURIBytes
        maxChannelsPerSubscribe = try c.decodeIfPresent(Int.self, forKey: .maxChannelsPerSubscribe) ?? d.maxChannelsPerSubscribe
        maxEnvelopesPerResponse = try c.decodeIfPresent(Int.self, forKey: .maxEnvelopesPerResponse) ?? d.maxEnvelopesPerResponse
        maxChannelsPerGroup = try c.decodeIfPresent(Int.self, forKey: .maxChannelsPerGroup) ?? d.maxChannelsPerGroup
        maxGroupsPerKeyset = try c.decodeIfPresent(Int.self, forKey: .maxGroupsPerKeyset) ?? d.maxGroupsPerKeyset
        publishRatePerSecond = try c.decodeIfPresent(Double.self, forKey: .publishRatePerSecond) ?? d.publishRatePerSecond
        publishBurst = try c.decodeIfPresent(Double.self, forKey: .publishBurst) ?? d.publishBurst
        requestRatePerSecond = try c.decodeIfPresent(Double.self, forKey: .requestRatePerSecond) ?? d.requestRatePerSecond
        requestBurst = try c.decodeIfPresent(Double.self, forKey: .requestBurst) ?? d.requestBurst
        publishRatePerAddress = try c.decodeIfPresent(Double.self, forKey: .publishRatePerAddress) ?? d.publishRatePerAddress
        publishBurstPerAddress = try c.decodeIfPresent(Double.self, forKey: .publishBurstPerAddress) ?? d.publishBurstPerAddress
        requestRatePerAddress = try c.decodeIfPresent(Double.self, forKey: .requestRatePerAddress) ?? d.requestRatePerAddress
        requestBurstPerAddress = try c.decodeIfPresent(Double.self, forKey: .requestBurstPerAddress) ?? d.requestBurstPerAddress
        maxGroupsPerRequest = try c.decodeIfPresent(Int.self, forKey: .maxGroupsPerRequest) ?? d.maxGroupsPerRequest
    }
}

/// A keyset: the publish/subscribe key pair clients are configured with, and its policies.
public struct Keyset: Sendable, Codable, Equatable {
    /// Optional human name, for logs.
    public var name: String?
    /// The publish key (`pub-c-…` in PubNub terms).
    public var publishKey: String
    /// The subscribe key.
    public var subscribeKey: String
    /// The secret key for admin calls and signatures (access manager; optional).
    public var secretKey: String?
    /// How long stored messages stay in history, in hours. `0` keeps them forever.
    public var historyRetentionHours: Double
    /// Limits for this keyset; server-wide limits apply where absent.
    public var limits: Limits?
    /// Presence: above this occupancy a channel sends interval events instead of each join,
    /// leave and timeout (PubNub's announce-max; default 20).
    public var presenceAnnounceMax: Int?
    /// Presence: seconds between interval events (default 10).
    public var presenceIntervalSeconds: Int?
    /// Presence: the smallest `heartbeat` timeout accepted, in seconds (default 20).
    public var presenceMinimumTimeoutSeconds: Int?

    /// Creates a keyset.
    public init(name: String? = nil, publishKey: String, subscribeKey: String, secretKey: String? = nil,
                historyRetentionHours: Double = 24 * 7, limits: Limits? = nil) {
        self.name = name
        self.publishKey = publishKey
        self.subscribeKey = subscribeKey
        self.secretKey = secretKey
        self.historyRetentionHours = historyRetentionHours
        self.limits = limits
    }

    /// The keyset every server has unless the configuration turns it off: `demo`/`demo`, no
    /// access control, seven days of history.
    public static let demo = Keyset(name: "demo", publishKey: "demo", subscribeKey: "demo")

    enum CodingKeys: String, CodingKey {
        case name, publishKey, subscribeKey, secretKey, historyRetentionHours, limits
        case presenceAnnounceMax, presenceIntervalSeconds, presenceMinimumTimeoutSeconds
    }

    /// Decodes a keyset; `historyRetentionHours` defaults to 168.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        name = try c.decodeIfPresent(String.self, forKey: .name)
        publishKey = try c.decode(String.self, forKey: .publishKey)
        subscribeKey = try c.decode(String.self, forKey: .subscribeKey)
        secretKey = try c.decodeIfPresent(String.self, forKey: .secretKey)
        historyRetentionHours = try c.decodeIfPresent(Double.self, forKey: .historyRetentionHours) ?? 24 * 7
        limits = try c.decodeIfPresent(Limits.self, forKey: .limits)
        presenceAnnounceMax = try c.decodeIfPresent(Int.self, forKey: .presenceAnnounceMax)
        presenceIntervalSeconds = try c.decodeIfPresent(Int.self, forKey: .presenceIntervalSeconds)
        presenceMinimumTimeoutSeconds = try c.decodeIfPresent(Int.self, forKey: .presenceMinimumTimeoutSeconds)
    }

    /// The presence configuration this keyset asks for.
    public var presenceConfiguration: PresenceConfiguration {
        var configuration = PresenceConfiguration()
        if let value = presenceAnnounceMax { configuration.announceMax = max(0, value) }
        if let value = presenceIntervalSeconds { configuration.interval = .seconds(max(1, value)) }
        if let value = presenceMinimumTimeoutSeconds { configuration.minimumTimeout = .seconds(max(1, value)) }
        return configuration
    }
}

/// The `--config` file: keysets and server-wide limits, as JSON.
///
/// ```json
/// {
///   "demoKeyset": false,
///   "keysets": [{"name": "prod", "publishKey": "pub-1", "subscribeKey": "sub-1", "historyRetentionHours": 72}],
///   "limits": {"maxMessageBytes": 32768},
///   "subscribeTimeoutSeconds": 280
/// }
/// ```
public struct ConfigurationFile: Sendable, Codable, Equatable {
    /// Whether the built-in `demo`/`demo` keyset stays enabled (default: only when no keysets
    /// are configured).
    public var demoKeyset: Bool?
    /// Configured keysets.
    public var keysets: [Keyset]
    /// Server-wide limits.
    public var limits: Limits?
    /// How long a subscribe long-poll waits before answering empty (default 280 s).
    public var subscribeTimeoutSeconds: Double?
    /// The in-memory window per channel (PubNub's 100 events / 20 minutes by default). Stored
    /// messages are always recoverable from the store; events that are not stored (`store=0`,
    /// signals, presence) live only here, so a larger window lets slower subscribers catch up.
    public var window: Window?
    /// Whether per-client and per-address rate limits apply (default `true`). `false` turns
    /// every rate limit off, for load tests and trusted networks (`tether serve --rate-limits off`).
    public var rateLimiting: Bool?
    /// (uuid, channel) presence memberships the server holds across every keyset (default
    /// 250,000, about 330 MiB at most). Beyond it new joins are not recorded — the request is
    /// still served — until memberships time out or leave.
    public var maxPresenceMemberships: Int?
    /// How the store writes (durability, size cap, write timeout and queue bound).
    public var store: Store?
    /// How long and how many publishes with a request id are remembered, so a repeat is
    /// answered with the original timetoken (docs/protocol.md, "Repeated publishes").
    public var dedup: Dedup?
    /// Mobile push: bounds, retries and providers (docs/push.md).
    public var push: Push?
    /// The admin secret that turns on the live console and the admin API (docs/console.md), at
    /// least 12 characters; `tether serve --admin-secret` and `TETHER_ADMIN_SECRET` win over it.
    /// Read from the file but never written back: encoding a configuration leaves it out.
    public var adminSecret: String?
    /// A `postgres://` URL: run as one node of a cluster sharing this database
    /// (docs/operations.md); `tether serve --database-url` and `TETHER_DATABASE_URL` win over
    /// it. Like the admin secret (it may carry a password), never written back.
    public var databaseURL: String?

    /// Deduplication settings; every key optional.
    public struct Dedup: Sendable, Codable, Equatable {
        /// Seconds a publish with a request id is remembered, 0 – 86,400; `0` turns
        /// deduplication off (default 600).
        public var windowSeconds: Int?
        /// Publishes remembered at most, 1 – 10,000,000 (default 100,000); beyond it the oldest
        /// are forgotten before their window ends.
        public var maxEntries: Int?

        /// Creates deduplication settings.
        public init(windowSeconds: Int? = nil, maxEntries: Int? = nil) {
            self.windowSeconds = windowSeconds
            self.maxEntries = maxEntries
        }
    }

    /// Store settings; every key optional.
    public struct Store: Sendable, Codable, Equatable {
        /// `full` (default): every acknowledged publish is fsynced. `normal`: fewer fsyncs; the
        /// last commits before a power loss may be lost (a process crash loses nothing).
        public var durability: StoreOptions.Durability?
        /// Size cap of the database file in bytes (default none). At the cap, publishes that
        /// must be stored fail with 507 until retention or deletes free space.
        public var maxBytes: Int?
        /// Seconds a publish waits for its write before it is answered with an error (default 5).
        public var writeTimeoutSeconds: Double?
        /// Writes waiting for the writer at most (default 4096); beyond it 503 + Retry-After.
        public var writeQueueLimit: Int?

        /// Creates store settings.
        public init(durability: StoreOptions.Durability? = nil, maxBytes: Int? = nil, writeTimeoutSeconds: Double? = nil,
                    writeQueueLimit: Int? = nil) {
            self.durability = durability
            self.maxBytes = maxBytes
            self.writeTimeoutSeconds = writeTimeoutSeconds
            self.writeQueueLimit = writeQueueLimit
        }

        /// The store options these settings give.
        public var options: StoreOptions {
            let defaults = StoreOptions()
            return StoreOptions(durability: durability ?? defaults.durability, maximumBytes: maxBytes,
                                writeTimeout: writeTimeoutSeconds.map { .milliseconds(Int64($0 * 1000)) } ?? defaults.writeTimeout,
                                writeQueueLimit: writeQueueLimit ?? defaults.writeQueueLimit)
        }
    }

    /// In-memory window settings.
    public struct Window: Sendable, Codable, Equatable {
        /// Events kept per channel.
        public var capacity: Int?
        /// Seconds an event stays in the window.
        public var maximumAgeSeconds: Int?
        /// Bytes all windows together may hold (default 256 MiB). Over it, the oldest events
        /// leave their windows early: stored ones stay recoverable from the store, others are
        /// reported to subscribers behind them as a gap.
        public var memoryBudgetBytes: Int?
        /// Channels with a window (default 100,000). Idle, empty windows are dropped first.
        public var maxChannels: Int?

        /// Creates window settings.
        public init(capacity: Int? = nil, maximumAgeSeconds: Int? = nil) {
            self.capacity = capacity
            self.maximumAgeSeconds = maximumAgeSeconds
        }
    }

    /// Creates an empty configuration.
    public init(demoKeyset: Bool? = nil, keysets: [Keyset] = [], limits: Limits? = nil, subscribeTimeoutSeconds: Double? = nil,
                rateLimiting: Bool? = nil) {
        self.rateLimiting = rateLimiting
        self.demoKeyset = demoKeyset
        self.keysets = keysets
        self.limits = limits
        self.subscribeTimeoutSeconds = subscribeTimeoutSeconds
    }

    enum CodingKeys: String, CodingKey {
        case demoKeyset, keysets, limits, subscribeTimeoutSeconds, window, rateLimiting, maxPresenceMemberships, store, dedup
        case push
    }

    /// Keys that are decoded but never encoded.
    private enum SecretCodingKeys: String, CodingKey {
        case adminSecret, databaseURL
    }

    /// Decodes a configuration; every key is optional (`keysets` defaults to none).
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        demoKeyset = try c.decodeIfPresent(Bool.self, forKey: .demoKeyset)
        keysets = try c.decodeIfPresent([Keyset].self, forKey: .keysets) ?? []
        limits = try c.decodeIfPresent(Limits.self, forKey: .limits)
        subscribeTimeoutSeconds = try c.decodeIfPresent(Double.self, forKey: .subscribeTimeoutSeconds)
        window = try c.decodeIfPresent(Window.self, forKey: .window)
        rateLimiting = try c.decodeIfPresent(Bool.self, forKey: .rateLimiting)
        maxPresenceMemberships = try c.decodeIfPresent(Int.self, forKey: .maxPresenceMemberships)
        store = try c.decodeIfPresent(Store.self, forKey: .store)
        dedup = try c.decodeIfPresent(Dedup.self, forKey: .dedup)
        push = try c.decodeIfPresent(Push.self, forKey: .push)
        let secrets = try decoder.container(keyedBy: SecretCodingKeys.self)
        adminSecret = try secrets.decodeIfPresent(String.self, forKey: .adminSecret)
        databaseURL = try secrets.decodeIfPresent(String.self, forKey: .databaseURL)
    }

    /// Reads and validates a configuration file, with errors that name the problem.
    public static func load(path: String) throws -> ConfigurationFile {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw ServerConfigurationError("cannot read configuration file at \(path)")
        }
        let file: ConfigurationFile
        do {
            file = try JSONDecoder().decode(ConfigurationFile.self, from: data)
        } catch let DecodingError.keyNotFound(key, context) {
            throw ServerConfigurationError("\(path): missing \"\(key.stringValue)\" at \(context.codingPath.map(\.stringValue).joined(separator: "."))")
        } catch {
            throw ServerConfigurationError("\(path): not a valid Tether configuration: \(error)")
        }
        try file.validate()
        return file
    }

    /// Checks keys are well-formed and unique.
    public func validate() throws {
        var seen = Set<String>()
        for keyset in keysets {
            for key in [keyset.publishKey, keyset.subscribeKey] where !TetherProtocolKeys.isValid(key) {
                throw ServerConfigurationError("invalid key \"\(key)\": use 1-100 characters of A-Z a-z 0-9 . _ -")
            }
            if !seen.insert(keyset.subscribeKey).inserted {
                throw ServerConfigurationError("subscribe key \"\(keyset.subscribeKey)\" is configured twice")
            }
            let owner = "keyset \"\(keyset.subscribeKey)\""
            // An empty secret (a templated variable left unset) would leave the keyset open while
            // it looks protected: refused, not taken for "no Access Manager".
            if let secret = keyset.secretKey, secret.isEmpty {
                throw ServerConfigurationError("\(owner): secretKey is empty; leave it out for a keyset without Access Manager, or set a secret")
            }
            if !ParameterBounds.publishTTLHours.contains(keyset.historyRetentionHours) {
                throw ServerConfigurationError("\(owner): historyRetentionHours must be 0 (forever) or up to 876000 (100 years)")
            }
            try keyset.limits?.validate(owner + " limits")
            if let value = keyset.presenceAnnounceMax, !(0...100_000).contains(value) {
                throw ServerConfigurationError("\(owner): presenceAnnounceMax must be between 0 and 100000")
            }
            if let value = keyset.presenceIntervalSeconds, !(1...3_600).contains(value) {
                throw ServerConfigurationError("\(owner): presenceIntervalSeconds must be between 1 and 3600")
            }
            if let value = keyset.presenceMinimumTimeoutSeconds, !(1...3_600).contains(value) {
                throw ServerConfigurationError("\(owner): presenceMinimumTimeoutSeconds must be between 1 and 3600")
            }
        }
        try limits?.validate("limits")
        if let capacity = window?.capacity, !(1...100_000).contains(capacity) {
            throw ServerConfigurationError("window.capacity must be between 1 and 100000 events")
        }
        if let age = window?.maximumAgeSeconds, !(1...86_400).contains(age) {
            throw ServerConfigurationError("window.maximumAgeSeconds must be between 1 and 86400")
        }
        if let budget = window?.memoryBudgetBytes, !((1 << 20)...(1 << 40)).contains(budget) {
            throw ServerConfigurationError("window.memoryBudgetBytes must be between 1048576 (1 MiB) and 1099511627776 (1 TiB)")
        }
        if let channels = window?.maxChannels, !(100...100_000_000).contains(channels) {
            throw ServerConfigurationError("window.maxChannels must be between 100 and 100000000")
        }
        if let memberships = maxPresenceMemberships, !(100...100_000_000).contains(memberships) {
            throw ServerConfigurationError("maxPresenceMemberships must be between 100 and 100000000")
        }
        if let bytes = store?.maxBytes, !((1 << 20)...(1 << 50)).contains(bytes) {
            throw ServerConfigurationError("store.maxBytes must be between 1048576 (1 MiB) and 1125899906842624 (1 PiB)")
        }
        if let timeout = store?.writeTimeoutSeconds, !(0.1...60).contains(timeout) {
            throw ServerConfigurationError("store.writeTimeoutSeconds must be between 0.1 and 60")
        }
        if let limit = store?.writeQueueLimit, !(1...1_000_000).contains(limit) {
            throw ServerConfigurationError("store.writeQueueLimit must be between 1 and 1000000")
        }
        if let window = dedup?.windowSeconds, !(0...86_400).contains(window) {
            throw ServerConfigurationError("dedup.windowSeconds must be between 0 (off) and 86400")
        }
        if let entries = dedup?.maxEntries, !(1...10_000_000).contains(entries) {
            throw ServerConfigurationError("dedup.maxEntries must be between 1 and 10000000")
        }
        // The message never includes the secret.
        if let adminSecret, adminSecret.utf8.count < 12 {
            throw ServerConfigurationError("adminSecret must be at least 12 characters")
        }
        try push?.validate()
        if let timeout = subscribeTimeoutSeconds, !(1...300).contains(timeout) {
            throw ServerConfigurationError("subscribeTimeoutSeconds must be between 1 and 300 (clients give up at 310)")
        }
    }
}

/// A configuration problem, reported to the operator before the server starts.
public struct ServerConfigurationError: Error, CustomStringConvertible, Sendable {
    /// What is wrong.
    public var description: String
    init(_ description: String) { self.description = description }
}

/// The keysets a server accepts, looked up by subscribe or publish key.
public struct KeysetRegistry: Sendable {
    private let bySubscribeKey: [String: Keyset]
    /// Server-wide limits.
    public let defaultLimits: Limits

    /// Builds the registry from a configuration (the demo keyset included unless disabled).
    public init(configuration: ConfigurationFile) {
        var keysets = configuration.keysets
        if configuration.demoKeyset ?? configuration.keysets.isEmpty {
            keysets.append(.demo)
        }
        bySubscribeKey = Dictionary(keysets.map { ($0.subscribeKey, $0) }, uniquingKeysWith: { first, _ in first })
        defaultLimits = configuration.limits ?? Limits()
    }

    /// The keyset with this subscribe key.
    public func keyset(subscribeKey: String) -> Keyset? { bySubscribeKey[subscribeKey] }

    /// The largest URI any keyset accepts (checked before the keyset is known).
    public var largestURILimit: Int {
        bySubscribeKey.values.map { limits(for: $0).maxURIBytes }.max().map { max($0, defaultLimits.maxURIBytes) } ?? defaultLimits.maxURIBytes
    }

    /// The limits that apply to a keyset.
    public func limits(for keyset: Keyset) -> Limits { keyset.limits ?? defaultLimits }

    /// The largest `POST` publish body any keyset reads (the message, compressed or
    /// percent-encoded, at most four times its limit, plus slack).
    var largestPublishBody: Int {
        (bySubscribeKey.values.map { limits(for: $0).maxMessageBytes } + [defaultLimits.maxMessageBytes]).max()! * 4 + 1024
    }

    /// All keysets.
    public var all: [Keyset] { Array(bySubscribeKey.values) }
}

import TetherProtocol

enum TetherProtocolKeys {
    static func isValid(_ key: String) -> Bool { NameRules.validateKey(key) }
}
