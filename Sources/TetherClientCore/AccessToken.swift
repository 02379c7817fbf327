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
    public init(parsing token: String) throws(DecodingFailure) {
        guard let bytes = Base64.decode(token) else { throw DecodingFailure("token: not base64") }
        var reader = CBORReader(bytes)
        let root: CBOR
        do { root = try reader.read() } catch { throw DecodingFailure("token: \(error.reason)") }
        guard case .map(let map) = root else { throw DecodingFailure("token: not a CBOR map") }
        func field(_ name: String) -> CBOR? { map.first { $0.key.keyString == name }?.value }
        guard let version = field("v")?.int, let issued = field("t")?.int, let ttl = field("ttl")?.int else {
            throw DecodingFailure("token: missing v, t or ttl")
        }
        self.version = version
        self.issuedAt = Int64(issued)
        self.ttlMinutes = ttl
        self.authorizedUserId = field("uuid")?.keyString
        self.resources = Self.resources(field("res"))
        self.patterns = Self.resources(field("pat"))
        self.meta = field("meta")?.json ?? .object([:])
        if case .bytes(let sig)? = field("sig") { self.signature = sig } else { self.signature = [] }
    }

    private static func resources(_ value: CBOR?) -> Resources {
        guard case .map(let map)? = value else { return Resources(channels: [:], groups: [:], userIds: [:]) }
        func permissions(_ name: String) -> [String: TokenPermissions] {
            guard case .map(let entries)? = map.first(where: { $0.key.keyString == name })?.value else { return [:] }
            var out: [String: TokenPermissions] = [:]
            for (key, value) in entries {
                if let k = key.keyString, let bits = value.int { out[k] = TokenPermissions(rawValue: bits) }
            }
            return out
        }
        return Resources(channels: permissions("chan"), groups: permissions("grp"), userIds: permissions("uuid"))
    }
}

/// The CBOR subset tokens use (RFC 8949).
enum CBOR: Hashable {
    case unsigned(UInt64)
    case negative(UInt64)
    case bytes([UInt8])
    case text(String)
    case array([CBOR])
    case map([(key: CBOR, value: CBOR)])
    case bool(Bool)
    case null
    case double(Double)

    static func == (lhs: CBOR, rhs: CBOR) -> Bool { lhs.json == rhs.json && lhs.keyString == rhs.keyString }
    func hash(into hasher: inout Hasher) { hasher.combine(json) }

    /// Text and byte-string keys both read as strings.
    var keyString: String? {
        switch self {
        case .text(let s): return s
        case .bytes(let b): return String(validating: b, as: UTF8.self)
        default: return nil
        }
    }

    var int: Int? {
        switch self {
        case .unsigned(let v): return Int(exactly: v)
        case .negative(let v): return Int(exactly: v).map { -1 - $0 }
        default: return nil
        }
    }

    var json: JSONValue {
        switch self {
        case .unsigned(let v): return JSONValue.Number(text: String(v)).map(JSONValue.number) ?? .null
        case .negative(let v): return JSONValue.Number(text: "-" + String(v &+ 1)).map(JSONValue.number) ?? .null
        case .bytes(let b): return .string(Base64.encode(b))
        case .text(let s): return .string(s)
        case .array(let items): return .array(items.map(\.json))
        case .map(let entries):
            var object: [String: JSONValue] = [:]
            for (k, v) in entries { object[k.keyString ?? k.json.jsonText] = v.json }
            return .object(object)
        case .bool(let b): return .bool(b)
        case .null: return .null
        case .double(let d): return .double(d)
        }
    }
}

struct CBORReader {
    struct Failure: Error { var reason: String }
    private let bytes: [UInt8]
    private var index = 0
    private var depth = 0

    init(_ bytes: [UInt8]) { self.bytes = bytes }

    private mutating func byte() throws(Failure) -> UInt8 {
        guard index < bytes.count else { throw Failure(reason: "truncated CBOR") }
        defer { index += 1 }
        return bytes[index]
    }

    private mutating func take(_ count: UInt64) throws(Failure) -> [UInt8] {
        guard count <= UInt64(bytes.count - index) else { throw Failure(reason: "truncated CBOR") }
        defer { index += Int(count) }
        return Array(bytes[index..<index + Int(count)])
    }

    private mutating func argument(_ info: UInt8) throws(Failure) -> UInt64 {
        switch info {
        case 0..<24: return UInt64(info)
        case 24: return UInt64(try byte())
        case 25, 26, 27:
            let width = 1 << (info - 24)
            var value: UInt64 = 0
            for b in try take(UInt64(width)) { value = value << 8 | UInt64(b) }
            return value
        default: throw Failure(reason: "unsupported CBOR length encoding")
        }
    }

    mutating func read() throws(Failure) -> CBOR {
        depth += 1
        defer { depth -= 1 }
        guard depth < 64 else { throw Failure(reason: "CBOR nesting too deep") }
        let initial = try byte()
        let major = initial >> 5
        let info = initial & 0x1F
        switch major {
        case 0: return .unsigned(try argument(info))
        case 1: return .negative(try argument(info))
        case 2: return .bytes(try take(try argument(info)))
        case 3:
            guard let s = String(validating: try take(try argument(info)), as: UTF8.self) else { throw Failure(reason: "CBOR text is not UTF-8") }
            return .text(s)
        case 4:
            let count = try argument(info)
            guard count <= UInt64(bytes.count) else { throw Failure(reason: "CBOR array too long") }
            var items: [CBOR] = []
            for _ in 0..<count { items.append(try read()) }
            return .array(items)
        case 5:
            let count = try argument(info)
            guard count <= UInt64(bytes.count) else { throw Failure(reason: "CBOR map too long") }
            var entries: [(key: CBOR, value: CBOR)] = []
            for _ in 0..<count {
                let key = try read()
                entries.append((key, try read()))
            }
            return .map(entries)
        case 6:
            _ = try argument(info)
            return try read()
        default:
            switch info {
            case 20: return .bool(false)
            case 21: return .bool(true)
            case 22, 23: return .null
            case 25:
                let raw = UInt16(try argument(info))
                return .double(Double(Float16(bitPattern: raw)))
            case 26: return .double(Double(Float(bitPattern: UInt32(try argument(info)))))
            case 27: return .double(Double(bitPattern: try argument(info)))
            default: throw Failure(reason: "unsupported CBOR simple value")
            }
        }
    }
}
