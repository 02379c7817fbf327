public import TetherProtocol

/// A parsed Access Manager v3 token (pubnub-wire §11.4): base64 of a CBOR map.
///
/// Clients never verify the signature; parsing is for showing what a token allows and when it
/// expires. Set a token on the client with `TetherClient.setToken(_:)`.
public struct AccessToken: Sendable, Hashable {
    /// Permissions on resources of one kind.
    public struct Resources: Sendable, Hashable {
        /// Per channel name (or pattern).
        public var channels: [String: TokenPermissions]
        /// Per channel group name (or pattern).
        public var groups: [String: TokenPermissions]
        /// Per user id (or pattern).
        public var userIds: [String: TokenPermissions]
    }

    /// Token format version (`v`, 2 today).
    public var version: Int
    /// When the token was issued, in Unix seconds (`t`).
    public var issuedAt: Int64
    /// Validity in minutes from ``issuedAt`` (`ttl`).
    public var ttlMinutes: Int
    /// The user id the token is restricted to (`uuid`), if any.
    public var authorizedUserId: String?
    /// Permissions on named resources (`res`).
    public var resources: Resources
    /// Permissions on regular-expression patterns (`pat`).
    public var patterns: Resources
    /// Free-form metadata (`meta`).
    public var meta: JSONValue
    /// The server's signature (`sig`), not verified by clients.
    public var signature: [UInt8]

    /// When the token expires, in Unix seconds.
    public var expiresAt: Int64 { issuedAt + Int64(ttlMinutes) * 60 }

    /// Parses a token string (standard or URL-safe base64, padding optional).
    package init(parsing token: String) throws(DecodingFailure) {
        guard let bytes = Base64.decode(token) else { throw DecodingFailure("token: not base64") }
        let root: CBORValue
        do { root = try CBORValue(decoding: bytes) } catch { throw DecodingFailure("token: \(error.reason)") }
        guard case .map = root else { throw DecodingFailure("token: not a CBOR map") }
        func field(_ name: String) -> CBORValue? { root[name] }
        guard let version = field("v")?.int, let issued = field("t")?.int, let ttl = field("ttl")?.int else {
            throw DecodingFailure("token: missing v, t or ttl")
        }
        self.version = Int(version)
        self.issuedAt = issued
        self.ttlMinutes = Int(ttl)
        self.authorizedUserId = field("uuid")?.string
        self.resources = Self.resources(field("res"))
        self.patterns = Self.resources(field("pat"))
        self.meta = field("meta")?.json ?? .object([:])
        if case .bytes(let sig)? = field("sig") { self.signature = sig } else { self.signature = [] }
    }

    private static func resources(_ value: CBORValue?) -> Resources {
        guard let value, case .map = value else { return Resources(channels: [:], groups: [:], userIds: [:]) }
        func permissions(_ name: String) -> [String: TokenPermissions] {
            guard case .map(let entries)? = value[name] else { return [:] }
            var out: [String: TokenPermissions] = [:]
            for (key, value) in entries {
                if let k = key.string, let bits = value.int { out[k] = TokenPermissions(rawValue: Int(bits)) }
            }
            return out
        }
        return Resources(channels: permissions("chan"), groups: permissions("grp"), userIds: permissions("uuid"))
    }
}

extension CBORValue {
    /// The value as JSON (byte strings as base64; map keys as strings).
    var json: JSONValue {
        switch self {
        case .unsigned(let v): return JSONValue.Number(text: String(v)).map(JSONValue.number) ?? .null
        case .negative(let v): return JSONValue.Number(text: "-" + String(v &+ 1)).map(JSONValue.number) ?? .null
        case .bytes(let b): return .string(Base64.encode(b))
        case .text(let s): return .string(s)
        case .array(let items): return .array(items.map(\.json))
        case .map(let entries):
            var object: [String: JSONValue] = [:]
            for (k, v) in entries { object[k.string ?? k.json.jsonText] = v.json }
            return .object(object)
        case .bool(let b): return .bool(b)
        case .null: return .null
        case .float(let d): return .double(d)
        }
    }
}

/// An Access Manager v2 grant: permissions for auth keys (or everyone) on channels, groups or the
/// whole keyset. Granting with every flag `false` revokes. See `docs/security.md`.
public struct AuthKeyGrant: Sendable, Hashable {
    /// Channels the grant applies to; empty with empty ``groups`` means the whole keyset.
    public var channels: [String]
    /// Channel groups the grant applies to.
    public var groups: [String]
    /// Auth keys the grant applies to; empty means every client.
    public var authKeys: [String]
    /// Subscribe, history, presence reads.
    public var read: Bool
    /// Publish and state writes.
    public var write: Bool
    /// Channel-group management.
    public var manage: Bool
    /// Deleting history.
    public var delete: Bool
    /// Minutes until the grant expires; `0` never expires (at most 525,600).
    public var ttlMinutes: Int

    /// Creates a grant (default: read and write for a day).
    public init(channels: [String] = [], groups: [String] = [], authKeys: [String] = [], read: Bool = true, write: Bool = true,
                manage: Bool = false, delete: Bool = false, ttlMinutes: Int = 1440) {
        self.channels = channels
        self.groups = groups
        self.authKeys = authKeys
        self.read = read
        self.write = write
        self.manage = manage
        self.delete = delete
        self.ttlMinutes = ttlMinutes
    }
}
