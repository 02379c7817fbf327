import Crypto
import Foundation
public import Logging
import Synchronization
public import TetherProtocol
public import TetherServerCore

/// The Access Manager (pubnub-wire §11, §12): v2 grants, v3 tokens signed by the server,
/// revocations and request signatures. Keysets without a secret key are open.
///
/// Grants and revocations are durable (SQLite) and take effect at once: a change wakes every
/// waiting long-poll so it re-checks its access before waiting again.
public final class AccessManager: Sendable {
    private struct State {
        var grants = GrantTable()
        /// Revoked token signatures (hex) → when the token would have expired anyway.
        var revoked: [String: Timetoken] = [:]
        var patterns: [String: Regex<AnyRegexOutput>] = [:]
    }

    /// The outcome of checking a request.
    public struct Check: Sendable {
        /// Allowed or denied.
        public var decision: AccessDecision
        /// Until when the decision holds at the latest (a grant or token expiry), if it expires.
        public var validUntil: Timetoken?
    }

    /// A request signature's verdict.
    public enum SignatureVerdict: Sendable, Equatable {
        /// No `signature` parameter.
        case absent
        /// Signed with the keyset's secret key, within the time window.
        case valid
        /// Signed, but wrong, expired or for another key.
        case invalid(String)
    }

    private let state: Mutex<State>
    private let store: MessageStore
    private let logger: Logger
    private let clock: @Sendable () -> Timetoken
    /// Signatures are accepted within this many seconds of the server's clock.
    public static let signatureWindowSeconds: Int64 = 60

    /// A cluster's shared log: grants and revocations are changed there and applied by every
    /// node's reader (``applyShared(_:)``).
    private let shared: SharedLog?

    /// Loads grants and revocations from the store.
    public convenience init(store: MessageStore, logger: Logger, clock: @escaping @Sendable () -> Timetoken = LongPollHub.systemNow) throws {
        try self.init(store: store, logger: logger, clock: clock, shared: nil)
    }

    /// Loads grants and revocations from the store, or — in a cluster — from the shared
    /// state read at start-up.
    package init(store: MessageStore, logger: Logger, clock: @escaping @Sendable () -> Timetoken = LongPollHub.systemNow,
                 shared: (log: SharedLog, state: SharedState)?) throws {
        self.store = store
        self.logger = logger
        self.clock = clock
        self.shared = shared?.log
        var initial = State()
        if let shared {
            for grant in shared.state.grants { initial.grants.apply(grant) }
            initial.revoked = shared.state.revocations
        } else {
            for grant in try store.allGrants() { initial.grants.apply(grant) }
            initial.revoked = try store.allRevocations()
        }
        let now = clock()
        initial.grants.removeExpired(now: now)
        initial.revoked = initial.revoked.filter { $0.value > now }
        self.state = Mutex(initial)
    }

    // MARK: - Authorisation

    /// Checks a request against the keyset's grants or the presented token.
    public func check(_ request: AccessRequest, keyset: Keyset, auth: String?, signature: SignatureVerdict) -> Check {
        guard let secret = keyset.secretKey, !secret.isEmpty else { return Check(decision: .allowed, validUntil: nil) }
        if signature == .valid { return Check(decision: .allowed, validUntil: nil) }  // server-side admin client
        if request.channels.isEmpty && request.groups.isEmpty { return Check(decision: .allowed, validUntil: nil) }
        let now = clock()
        if let auth, !auth.isEmpty, let token = try? verifiedToken(auth, keyset: keyset) {
            if state.withLock({ $0.revoked[token.signature] != nil }) {
                return Check(decision: .denied(channels: [], groups: [], message: "Token is revoked"), validUntil: nil)
            }
            let decision = token.grant.decide(request, now: now) { pattern, name in self.matches(pattern: pattern, name: name) }
            return Check(decision: decision, validUntil: token.grant.expiresAt)
        }
        return state.withLock { s in
            Check(decision: s.grants.decide(request, subscribeKey: keyset.subscribeKey, authKey: auth, now: now),
                  validUntil: s.grants.nextExpiry(after: now))
        }
    }

    private func matches(pattern: String, name: String) -> Bool {
        let regex: Regex<AnyRegexOutput>? = state.withLock { s in
            if let cached = s.patterns[pattern] { return cached }
            guard pattern.count <= 256, let compiled = try? Regex(pattern) else { return nil }
            s.patterns[pattern] = compiled
            return compiled
        }
        guard let regex else { return false }
        return (try? regex.wholeMatch(in: name)) != nil
    }

    // MARK: - v2 grants

    /// Applies v2 grants durably. A grant with no permissions removes the row.
    public func apply(_ grants: [Grant]) async throws {
        if let shared {
            _ = try await shared.change(.grants(grants))
        } else {
            try await store.saveGrants(grants)
        }
        state.withLock { s in for grant in grants { s.grants.apply(grant) } }
    }

    /// Cluster mode: a grant or revocation change another node (or this one) recorded in the
    /// shared log, applied in log order.
    package func applyShared(_ control: SharedControl) {
        switch control {
        case .grants(let grants):
            state.withLock { s in for grant in grants { s.grants.apply(grant) } }
        case .revocation(let signature, let expiresAt):
            state.withLock { $0.revoked[signature] = max($0.revoked[signature] ?? .zero, expiresAt) }
        case .group:
            break
        }
    }

    /// Grants matching an audit query.
    public func audit(subscribeKey: String, channel: String?, group: String?, authKey: String?) -> [Grant] {
        let now = clock()
        return state.withLock { $0.grants.audit(subscribeKey: subscribeKey, channel: channel, group: group, authKey: authKey, now: now) }
    }

    /// The earliest moment a grant expires (for re-checking waiting long-polls).
    public var nextExpiry: Timetoken? {
        let now = clock()
        return state.withLock { $0.grants.nextExpiry(after: now) }
    }

    /// Drops expired grants and revocations.
    public func removeExpired() {
        let now = clock()
        state.withLock { s in
            s.grants.removeExpired(now: now)
            s.revoked = s.revoked.filter { $0.value > now }
        }
    }

    // MARK: - v3 tokens

    /// A parsed token whose signature is valid for the keyset.
    public struct VerifiedToken: Sendable {
        /// Its permissions.
        public var grant: VerifiedTokenGrant
        /// Its signature, hex (identifies it for revocation).
        public var signature: String
    }

    /// Why a token was refused.
    public struct TokenError: Error, CustomStringConvertible {
        /// What is wrong.
        public var description: String
    }

    /// The body of `POST /v3/pam/{sub}/grant`.
    public struct GrantTokenRequest: Decodable, Sendable {
        /// Resource maps of one section.
        public struct Section: Decodable, Sendable {
            /// Channel name → permission bits.
            public var channels: [String: Int]?
            /// Group name → permission bits.
            public var groups: [String: Int]?
            /// User id → permission bits.
            public var uuids: [String: Int]?
            /// Users (legacy alias of uuids).
            public var users: [String: Int]?
            /// Spaces (legacy alias of channels).
            public var spaces: [String: Int]?
        }
        /// The permissions object.
        public struct Body: Decodable, Sendable {
            /// Named resources.
            public var resources: Section?
            /// Regular-expression patterns.
            public var patterns: Section?
            /// Free-form metadata.
            public var meta: AnyJSON?
            /// The authorized user id.
            public var uuid: String?
        }
        /// Minutes, 1–43,200.
        public var ttl: Int
        /// What the token allows.
        public var permissions: Body?
    }

    /// Issues a token from a v3 grant body (pubnub-wire §11.2). `ttl` is in minutes, 1–43,200.
    public func issueToken(_ request: GrantTokenRequest, keyset: Keyset) throws(TokenError) -> String {
        guard let secret = keyset.secretKey, !secret.isEmpty else { throw TokenError(description: "keyset has no secret key") }
        let ttl = request.ttl
        guard (1...43_200).contains(ttl) else { throw TokenError(description: "Invalid ttl") }
        let permissions = request.permissions
        func section(_ source: GrantTokenRequest.Section?) -> CBORValue {
            var entries: [(key: CBORValue, value: CBORValue)] = []
            let kinds: [(String, [String: Int]?)] = [("chan", source?.channels), ("grp", source?.groups), ("uuid", source?.uuids),
                                                     ("usr", source?.users), ("spc", source?.spaces)]
            for (tokenName, resources) in kinds {
                let resources = resources ?? [:]
                let items = resources.keys.sorted().compactMap { name -> (key: CBORValue, value: CBORValue)? in
                    guard let bits = resources[name], bits >= 0, bits < 256 else { return nil }
                    return (.text(name), .unsigned(UInt64(bits)))
                }
                entries.append((.bytes(Array(tokenName.utf8)), .map(items)))
            }
            return .map(entries)
        }
        var map: [(key: CBORValue, value: CBORValue)] = [
            (.bytes(Array("v".utf8)), .unsigned(2)),
            (.bytes(Array("t".utf8)), .unsigned(UInt64(clock().unixSeconds))),
            (.bytes(Array("ttl".utf8)), .unsigned(UInt64(ttl))),
            (.bytes(Array("res".utf8)), section(permissions?.resources)),
            (.bytes(Array("pat".utf8)), section(permissions?.patterns)),
            (.bytes(Array("meta".utf8)), permissions?.meta?.cbor ?? .map([])),
        ]
        if let uuid = permissions?.uuid, !uuid.isEmpty {
            map.append((.bytes(Array("uuid".utf8)), .text(uuid)))
        }
        let signature = Self.sign(CBORValue.map(map).encoded(), keyset: keyset, secret: secret)
        map.append((.bytes(Array("sig".utf8)), .bytes(signature)))
        let token = Base64.encode(CBORValue.map(map).encoded())
        // A token is only issued if it can be used: one longer than a request may carry, or
        // nested deeper than tokens are read, would be taken for an unknown auth key everywhere.
        guard token.utf8.count <= Self.maximumTokenCharacters else {
            throw TokenError(description: "the token would be \(token.utf8.count) characters, over the \(Self.maximumTokenCharacters) a request may carry: grant fewer resources or patterns, or less meta")
        }
        guard (try? verifiedToken(token, keyset: keyset)) != nil else {
            throw TokenError(description: "the token could not be read back (meta nested too deep?): grant less meta")
        }
        return token
    }

    /// The longest token read (and so issued), in characters.
    public static let maximumTokenCharacters = 8192

    /// Parses a token and verifies the server's signature for this keyset.
    public func verifiedToken(_ token: String, keyset: Keyset) throws(TokenError) -> VerifiedToken {
        guard let secret = keyset.secretKey, !secret.isEmpty else { throw TokenError(description: "keyset has no secret key") }
        guard token.utf8.count <= Self.maximumTokenCharacters, let bytes = Base64.decode(token) else { throw TokenError(description: "not a token") }
        let root: CBORValue
        do { root = try CBORValue(decoding: bytes) } catch { throw TokenError(description: "not a token") }
        guard case .map(let entries) = root, let signatureIndex = entries.lastIndex(where: { $0.key.string == "sig" }),
              case .bytes(let signature) = entries[signatureIndex].value
        else { throw TokenError(description: "token has no signature") }
        var unsigned = entries
        unsigned.remove(at: signatureIndex)
        let expected = Self.sign(CBORValue.map(unsigned).encoded(), keyset: keyset, secret: secret)
        guard signature.count == expected.count, zip(signature, expected).reduce(0, { $0 | ($1.0 ^ $1.1) }) == 0 else {
            throw TokenError(description: "token signature does not match")
        }
        guard let issued = root["t"]?.int, let ttl = root["ttl"]?.int, ttl > 0 else { throw TokenError(description: "token has no ttl") }
        func permissions(_ section: String, _ kind: String) -> [String: Permissions] {
            guard case .map(let items)? = root[section]?[kind] else { return [:] }
            var result: [String: Permissions] = [:]
            for (key, value) in items {
                if let name = key.string, let bits = value.int { result[name] = Permissions(rawValue: Int(bits)) }
            }
            return result
        }
        // Saturating: the token is signed by this server, but its numbers are still input.
        // Clamped so the arithmetic cannot overflow (at most ~9.6e18, within UInt64).
        let issuedSeconds = UInt64(min(max(issued, 0), 900_000_000_000))
        let ttlMinutes = UInt64(min(max(ttl, 0), 1_000_000_000))
        let expiresAt = Timetoken((issuedSeconds + ttlMinutes * 60) * 10_000_000)
        let grant = VerifiedTokenGrant(channels: permissions("res", "chan"), groups: permissions("res", "grp"),
                               channelPatterns: permissions("pat", "chan"), groupPatterns: permissions("pat", "grp"),
                               authorizedUUID: root["uuid"]?.string, expiresAt: expiresAt)
        return VerifiedToken(grant: grant, signature: signature.map { String(format: "%02x", $0) }.joined())
    }

    /// Revokes a token durably and at once.
    public func revoke(_ token: VerifiedToken) async throws {
        if let shared {
            _ = try await shared.change(.revocation(signature: token.signature, expiresAt: token.grant.expiresAt))
        } else {
            try await store.saveRevocation(signature: token.signature, expiresAt: token.grant.expiresAt)
        }
        state.withLock { $0.revoked[token.signature] = token.grant.expiresAt }
    }

    /// HMAC-SHA256 over the subscribe key and the unsigned CBOR, so a token of one keyset never
    /// verifies on another even if their secrets were equal.
    private static func sign(_ unsigned: [UInt8], keyset: Keyset, secret: String) -> [UInt8] {
        var message = Array(keyset.subscribeKey.utf8)
        message.append(0)
        message += unsigned
        return Array(HMAC<SHA256>.authenticationCode(for: message, using: SymmetricKey(data: Array(secret.utf8))))
    }

    // MARK: - Signatures (§12)

    /// Verifies `signature`/`timestamp` against the keyset's secret key. Accepts the v2 form
    /// (`METHOD\npub\npath\nquery\nbody`), and for a POST publish only, the v1 form Python uses
    /// and the v2-as-GET form JavaScript uses. Neither covers the method or the body, so taken
    /// anywhere else a signed GET (whose signature travels in the URL, into proxy and access logs)
    /// could be sent again as a `DELETE` or `PATCH` of the same path.
    public func verifySignature(keyset: Keyset, method: String, rawPath: String, rawQuery: String?, body: [UInt8]) -> SignatureVerdict {
        // Split on bytes, as routing does (``WireRequest``): split on `Character`s, a raw
        // combining mark after `&` or `=` would glue two parameters together here only.
        let pairs = WireRequest.split((rawQuery ?? "")[...], on: UInt8(ascii: "&"), omittingEmpty: true).map { pair -> (String, String) in
            guard let equals = pair.utf8.firstIndex(of: UInt8(ascii: "=")) else { return (String(pair), "") }
            return (String(pair[..<equals]), String(pair[pair.utf8.index(after: equals)...]))
        }
        guard let signature = pairs.first(where: { $0.0 == "signature" })?.1, !signature.isEmpty else { return .absent }
        guard let secret = keyset.secretKey, !secret.isEmpty else { return .invalid("keyset has no secret key") }
        guard let timestampText = pairs.first(where: { $0.0 == "timestamp" })?.1, let timestamp = Int64(timestampText) else {
            return .invalid("Signature requires a timestamp")
        }
        let now = clock().unixSeconds
        // Overflow-safe: hostile timestamps such as Int64.min must not trap.
        let (difference, overflow) = now.subtractingReportingOverflow(timestamp)
        guard !overflow, difference.magnitude <= UInt64(Self.signatureWindowSeconds) else {
            return .invalid("Signature timestamp is outside the 60 s window")
        }
        let signed = pairs.filter { $0.0 != "signature" }.sorted { $0.0 < $1.0 }
        // Canonical form: decode each value once and re-encode; Python double-encodes a few
        // values (filter-expr, state), so the raw wire value re-encoded is also tried.
        let decodedOnce = signed.map { "\($0.0)=\(PercentCoding.encodeForSignature(PercentCoding.decode($0.1) ?? $0.1))" }
            .joined(separator: "&")
        let rawReencoded = signed.map { "\($0.0)=\(PercentCoding.encodeForSignature($0.1))" }.joined(separator: "&")
        // The Python SDK signs `filter-expr` and `state` already encoded (double-encoded) and
        // everything else once: a per-parameter mix.
        let pythonMix = signed.map { key, value in
            let signedValue = Self.doubleEncodedByPython.contains(key) ? value : (PercentCoding.decode(value) ?? value)
            return "\(key)=\(PercentCoding.encodeForSignature(signedValue))"
        }.joined(separator: "&")
        let key = SymmetricKey(data: Array(secret.utf8))
        let bodyText = String(decoding: body, as: UTF8.self)
        let postPublish = method == "POST" && rawPath.hasPrefix("/publish/")
        let presented = PercentCoding.decode(signature) ?? signature
        for query in Set([decodedOnce, rawReencoded, pythonMix]) {
            let v2 = "\(method)\n\(keyset.publishKey)\n\(rawPath)\n\(query)\n\(bodyText)"
            var candidates = [
                "v2." + Base64.encode(Array(HMAC<SHA256>.authenticationCode(for: Array(v2.utf8), using: key)), urlSafe: true, padding: false),
            ]
            if postPublish {
                let v2Get = "GET\n\(keyset.publishKey)\n\(rawPath)\n\(query)\n"
                let v1 = "\(keyset.subscribeKey)\n\(keyset.publishKey)\n\(rawPath)\n\(query)"
                candidates.append("v2." + Base64.encode(Array(HMAC<SHA256>.authenticationCode(for: Array(v2Get.utf8), using: key)),
                                                        urlSafe: true, padding: false))
                candidates.append(Base64.encode(Array(HMAC<SHA256>.authenticationCode(for: Array(v1.utf8), using: key)),
                                                urlSafe: true, padding: true))
            }
            // Compared in constant time, as tokens and file signatures are.
            if candidates.contains(where: { AdminSessions.constantTimeEquals($0, presented) }) { return .valid }
        }
        return .invalid("Signature does not match")
    }

    /// Signs a request the way PubNub SDKs do (v2, pubnub-wire §12), for admin tools and tests:
    /// adds `timestamp` and returns the full query string including `signature`.
    /// - Parameters:
    ///   - query: decoded query parameters (without `timestamp` and `signature`).
    public static func signedQuery(method: String, publishKey: String, path: String, query: [String: String], body: String = "",
                                   secret: String, timestamp: Int64) -> String {
        var parameters = query
        parameters["timestamp"] = String(timestamp)
        let canonical = parameters.keys.sorted().map { "\($0)=\(PercentCoding.encodeForSignature(parameters[$0]!))" }.joined(separator: "&")
        let message = "\(method)\n\(publishKey)\n\(path)\n\(canonical)\n\(body)"
        let mac = HMAC<SHA256>.authenticationCode(for: Array(message.utf8), using: SymmetricKey(data: Array(secret.utf8)))
        return canonical + "&signature=v2." + Base64.encode(Array(mac), urlSafe: true, padding: false)
    }

    /// Parameters the Python SDK percent-encodes before signing (pubnub-wire §12 quirk).
    static let doubleEncodedByPython: Set<String> = ["filter-expr", "state"]
}

/// Any JSON value, decoded with `JSONDecoder` (booleans kept distinct from numbers).
public indirect enum AnyJSON: Decodable, Sendable {
    /// null
    case null
    /// true/false
    case bool(Bool)
    /// An integer.
    case int(Int64)
    /// Another number.
    case double(Double)
    /// A string.
    case string(String)
    /// An array.
    case array([AnyJSON])
    /// An object.
    case object([String: AnyJSON])

    /// Decodes any JSON value.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.singleValueContainer()
        if c.decodeNil() { self = .null }
        else if let b = try? c.decode(Bool.self) { self = .bool(b) }
        else if let i = try? c.decode(Int64.self) { self = .int(i) }
        else if let d = try? c.decode(Double.self) { self = .double(d) }
        else if let s = try? c.decode(String.self) { self = .string(s) }
        else if let a = try? c.decode([AnyJSON].self) { self = .array(a) }
        else { self = .object(try c.decode([String: AnyJSON].self)) }
    }

    /// The value as CBOR (object keys sorted).
    package var cbor: CBORValue {
        switch self {
        case .null: return .null
        case .bool(let b): return .bool(b)
        case .int(let i): return i >= 0 ? .unsigned(UInt64(i)) : .negative(UInt64(-1 - i))
        case .double(let d): return .float(d)
        case .string(let s): return .text(s)
        case .array(let a): return .array(a.map(\.cbor))
        case .object(let o): return .map(o.keys.sorted().map { (.text($0), o[$0]!.cbor) })
        }
    }
}

// MARK: - App Context: uuid resources

extension AccessManager {
    /// Whether a request may act on user `id`'s App Context data with `permission`: a v3
    /// token's `uuids` resources or patterns (unrevoked, unexpired, for the request's uuid when
    /// the token names one), or else the v2 grants whose target is that uuid (`target-uuid`).
    package func allowsUUID(_ id: String, permission: Permissions, keyset: Keyset, auth: String?, requestUUID: String?) -> Bool {
        let now = clock()
        if let auth, !auth.isEmpty, let token = try? verifiedToken(auth, keyset: keyset) {
            if state.withLock({ $0.revoked[token.signature] != nil }) || token.grant.expiresAt <= now { return false }
            if let authorized = token.grant.authorizedUUID, authorized != requestUUID { return false }
            guard let bytes = Base64.decode(auth), let root = try? CBORValue(decoding: bytes) else { return false }
            var granted: Permissions = []
            if case .map(let items)? = root["res"]?["uuid"] {
                for (key, value) in items where key.string == id { granted.formUnion(Permissions(rawValue: Int(value.int ?? 0))) }
            }
            if case .map(let items)? = root["pat"]?["uuid"] {
                for (key, value) in items {
                    if let pattern = key.string, matches(pattern: pattern, name: id) {
                        granted.formUnion(Permissions(rawValue: Int(value.int ?? 0)))
                    }
                }
            }
            return granted.isSuperset(of: permission)
        }
        return state.withLock { s in
            s.grants.permissions(subscribeKey: keyset.subscribeKey, target: .uuid(id), authKey: auth, now: now).isSuperset(of: permission)
        }
    }
}
