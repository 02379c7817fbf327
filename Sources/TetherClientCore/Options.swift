public import TetherProtocol

/// Options for ``Endpoints/publish(channel:message:options:)``.
public struct PublishOptions: Sendable, Hashable {
    /// Metadata delivered to subscribers as `u` and usable by filters; never encrypted.
    public var meta: JSONValue?
    /// Store in history (`store=1`), don't (`store=0`), or the keyset default (`nil`).
    public var store: Bool?
    /// Per-message retention in hours (`ttl`); ignored when not stored.
    public var ttl: Int?
    /// `false` sends `norep=true`: do not replicate to other regions.
    public var replicate: Bool
    /// Send the message in a POST body instead of the URL (large messages).
    public var usePOST: Bool
    /// A custom message type (3–50 characters of `[A-Za-z0-9_-]`).
    public var customMessageType: String?
    /// A timeout for each attempt, overriding the configuration's non-subscribe timeout.
    public var timeout: Duration?
    /// The request id sent as `requestid` with every attempt of this message, chosen by the app:
    /// an idempotency key such as the app's own message id (1–64 printable ASCII characters, no
    /// spaces). `nil` (the default) lets the outbox make one (a UUID) when it accepts the message.
    /// Within the server's dedup window, a second message with the same id is answered with the
    /// first one's timetoken and not stored again (``PublishResult/isRepeat``).
    public var requestId: String?

    /// Creates options.
    public init(meta: JSONValue? = nil, store: Bool? = nil, ttl: Int? = nil, replicate: Bool = true, usePOST: Bool = false,
                customMessageType: String? = nil, timeout: Duration? = nil, requestId: String? = nil) {
        self.meta = meta
        self.store = store
        self.ttl = ttl
        self.replicate = replicate
        self.usePOST = usePOST
        self.customMessageType = customMessageType
        self.timeout = timeout
        self.requestId = requestId
    }

    /// The longest request id, in bytes.
    package static let maximumRequestIdBytes = 64

    /// Why `id` cannot be a request id (`nil` when it can): 1–64 bytes of printable ASCII
    /// (`!`…`~`), no spaces or control characters, so it travels unchanged in a query string and
    /// a journal, and fits the server's dedup index.
    package static func requestIdProblem(_ id: String) -> String? {
        if id.isEmpty { return "the request id is empty" }
        if id.utf8.count > maximumRequestIdBytes {
            return "the request id is \(id.utf8.count) bytes long; at most \(maximumRequestIdBytes) are allowed"
        }
        if !id.utf8.allSatisfy({ (0x21...0x7E).contains($0) }) {
            return "the request id must be printable ASCII without spaces (characters ! to ~)"
        }
        return nil
    }
}

/// Options for fetching history (v3 fetch).
public struct FetchOptions: Sendable, Hashable {
    /// Exclusive upper bound: only messages older than this.
    public var start: Timetoken?
    /// Inclusive lower bound: only messages at or after this.
    public var end: Timetoken?
    /// Messages per channel per page (≤ 100 for one channel, ≤ 25 for several); `nil` = the maximum.
    public var maximumPerChannel: Int?
    /// Include each message's `meta`.
    public var includeMeta: Bool
    /// Include each message's publisher (`uuid`).
    public var includePublisher: Bool
    /// Include the message type and custom message type.
    public var includeMessageType: Bool
    /// Include each message's actions (``HistoryMessage/actions``): one channel per request,
    /// at most 25 messages per page (history with actions).
    public var includeActions: Bool = false
    /// A timeout for each request, overriding the configuration's non-subscribe timeout.
    public var timeout: Duration?

    /// Creates options.
    public init(start: Timetoken? = nil, end: Timetoken? = nil, maximumPerChannel: Int? = nil, includeMeta: Bool = true,
                includePublisher: Bool = true, includeMessageType: Bool = true, includeActions: Bool = false,
                timeout: Duration? = nil) {
        self.includeActions = includeActions
        self.start = start
        self.end = end
        self.maximumPerChannel = maximumPerChannel
        self.includeMeta = includeMeta
        self.includePublisher = includePublisher
        self.includeMessageType = includeMessageType
        self.timeout = timeout
    }
}

/// Options for history v2 (one channel).
public struct HistoryOptions: Sendable, Hashable {
    /// Exclusive bound (older than this, or newer with `reverse` and an `end`).
    public var start: Timetoken?
    /// Inclusive bound.
    public var end: Timetoken?
    /// At most this many messages (1–100).
    public var count: Int
    /// Traverse oldest → newest instead of newest → oldest.
    public var reverse: Bool
    /// Include each message's `meta`.
    public var includeMeta: Bool
    /// A timeout for this call.
    public var timeout: Duration?

    /// Creates options.
    public init(start: Timetoken? = nil, end: Timetoken? = nil, count: Int = 100, reverse: Bool = false, includeMeta: Bool = false,
                timeout: Duration? = nil) {
        self.start = start
        self.end = end
        self.count = count
        self.reverse = reverse
        self.includeMeta = includeMeta
        self.timeout = timeout
    }
}

/// Options for here-now.
public struct HereNowOptions: Sendable, Hashable {
    /// Include each occupant's presence state.
    public var includeState: Bool
    /// Include occupant lists (`false` sends `disable_uuids=1`: occupancy only).
    public var includeUserIds: Bool
    /// A timeout for this call.
    public var timeout: Duration?

    /// Creates options.
    public init(includeState: Bool = false, includeUserIds: Bool = true, timeout: Duration? = nil) {
        self.includeState = includeState
        self.includeUserIds = includeUserIds
        self.timeout = timeout
    }
}

/// An Access Manager v3 grant request (pubnub-wire §11.2).
public struct TokenGrant: Sendable, Hashable {
    /// Minutes the token is valid (1–43200).
    public var ttlMinutes: Int
    /// The user id the token is restricted to (`uuid`), if any.
    public var authorizedUserId: String?
    /// Permissions on named channels.
    public var channels: [String: TokenPermissions]
    /// Permissions on named channel groups.
    public var groups: [String: TokenPermissions]
    /// Permissions on named user ids.
    public var userIds: [String: TokenPermissions]
    /// Permissions on channels matching regular expressions.
    public var channelPatterns: [String: TokenPermissions]
    /// Permissions on groups matching regular expressions.
    public var groupPatterns: [String: TokenPermissions]
    /// Permissions on user ids matching regular expressions.
    public var userIdPatterns: [String: TokenPermissions]
    /// Free-form metadata embedded in the token.
    public var meta: [String: JSONValue]

    /// Creates a grant.
    public init(ttlMinutes: Int, authorizedUserId: String? = nil, channels: [String: TokenPermissions] = [:],
                groups: [String: TokenPermissions] = [:], userIds: [String: TokenPermissions] = [:],
                channelPatterns: [String: TokenPermissions] = [:], groupPatterns: [String: TokenPermissions] = [:],
                userIdPatterns: [String: TokenPermissions] = [:], meta: [String: JSONValue] = [:]) {
        self.ttlMinutes = ttlMinutes
        self.authorizedUserId = authorizedUserId
        self.channels = channels
        self.groups = groups
        self.userIds = userIds
        self.channelPatterns = channelPatterns
        self.groupPatterns = groupPatterns
        self.userIdPatterns = userIdPatterns
        self.meta = meta
    }

    /// The JSON body of `POST /v3/pam/{sub}/grant`.
    package var body: JSONValue {
        func map(_ d: [String: TokenPermissions]) -> JSONValue { .object(d.mapValues { .int($0.rawValue) }) }
        var permissions: [String: JSONValue] = [
            "resources": ["channels": map(channels), "groups": map(groups), "uuids": map(userIds), "users": [:], "spaces": [:]],
            "patterns": ["channels": map(channelPatterns), "groups": map(groupPatterns), "uuids": map(userIdPatterns),
                         "users": [:], "spaces": [:]],
            "meta": .object(meta),
        ]
        if let authorizedUserId { permissions["uuid"] = .string(authorizedUserId) }
        return ["ttl": .int(ttlMinutes), "permissions": .object(permissions)]
    }
}

/// Access Manager permission bits (pubnub-wire §11.2).
public struct TokenPermissions: OptionSet, Sendable, Hashable {
    /// The raw bit mask.
    public var rawValue: Int
    /// Creates permissions from a bit mask.
    public init(rawValue: Int) { self.rawValue = rawValue }
    /// Read (subscribe, history, here-now).
    public static let read = TokenPermissions(rawValue: 1)
    /// Write (publish, signal).
    public static let write = TokenPermissions(rawValue: 2)
    /// Manage (channel groups).
    public static let manage = TokenPermissions(rawValue: 4)
    /// Delete (history deletion).
    public static let delete = TokenPermissions(rawValue: 8)
    /// Create.
    public static let create = TokenPermissions(rawValue: 16)
    /// Get (App Context).
    public static let get = TokenPermissions(rawValue: 32)
    /// Update (App Context).
    public static let update = TokenPermissions(rawValue: 64)
    /// Join.
    public static let join = TokenPermissions(rawValue: 128)
}
