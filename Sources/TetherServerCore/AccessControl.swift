public import TetherProtocol

/// Access Manager permission bits (pubnub-wire §11.2): read 1, write 2, manage 4, delete 8,
/// create 16, get 32, update 64, join 128.
public struct Permissions: OptionSet, Sendable, Hashable, CustomStringConvertible {
    /// The raw bits.
    public var rawValue: Int
    /// Creates permissions from raw bits.
    public init(rawValue: Int) { self.rawValue = rawValue }

    /// Subscribe, history, presence reads.
    public static let read = Permissions(rawValue: 1)
    /// Publish, signal.
    public static let write = Permissions(rawValue: 2)
    /// Channel-group management.
    public static let manage = Permissions(rawValue: 4)
    /// Delete messages.
    public static let delete = Permissions(rawValue: 8)
    /// App Context create.
    public static let create = Permissions(rawValue: 16)
    /// App Context get.
    public static let get = Permissions(rawValue: 32)
    /// App Context update.
    public static let update = Permissions(rawValue: 64)
    /// App Context join.
    public static let join = Permissions(rawValue: 128)

    /// Builds permissions from the v2 grant flags `r`, `w`, `m`, `d`, `g`, `u`, `j`.
    public init(r: Bool, w: Bool, m: Bool, d: Bool, g: Bool = false, u: Bool = false, j: Bool = false) {
        var bits = 0
        if r { bits |= 1 }
        if w { bits |= 2 }
        if m { bits |= 4 }
        if d { bits |= 8 }
        if g { bits |= 32 }
        if u { bits |= 64 }
        if j { bits |= 128 }
        self.rawValue = bits
    }

    /// `r/w/m/d` for logs.
    public var description: String {
        [("r", Permissions.read), ("w", .write), ("m", .manage), ("d", .delete), ("g", .get), ("u", .update), ("j", .join)]
            .filter { contains($0.1) }.map(\.0).joined()
    }
}

/// What a v2 grant applies to.
public enum GrantTarget: Sendable, Hashable {
    /// The whole keyset.
    case keyset
    /// One channel (a wildcard pattern like `a.*` is a channel name here).
    case channel(String)
    /// One channel group.
    case group(String)
    /// One user id (App Context).
    case uuid(String)
}

/// One v2 grant row: permissions on a target, optionally only for one auth key.
public struct Grant: Sendable, Hashable {
    /// The keyset.
    public var subscribeKey: String
    /// What it applies to.
    public var target: GrantTarget
    /// The auth key it is limited to, or `nil` for every client.
    public var authKey: String?
    /// Granted permissions.
    public var permissions: Permissions
    /// TTL in minutes as granted (0 = no expiry).
    public var ttlMinutes: Int
    /// When it expires, or `nil` for never.
    public var expiresAt: Timetoken?

    /// Creates a grant.
    public init(subscribeKey: String, target: GrantTarget, authKey: String?, permissions: Permissions, ttlMinutes: Int,
                expiresAt: Timetoken?) {
        self.subscribeKey = subscribeKey
        self.target = target
        self.authKey = authKey
        self.permissions = permissions
        self.ttlMinutes = ttlMinutes
        self.expiresAt = expiresAt
    }
}

/// The permissions a verified v3 token carries (pubnub-wire §11.4): what the server decides
/// requests against. (The client's `TokenGrant` in TetherClientCore is the other side: a request
/// asking the server to issue such a token.)
public struct VerifiedTokenGrant: Sendable, Hashable {
    /// Exact channel names → permissions.
    public var channels: [String: Permissions]
    /// Exact group names → permissions.
    public var groups: [String: Permissions]
    /// Channel name patterns (regular expressions) → permissions.
    public var channelPatterns: [String: Permissions]
    /// Group name patterns → permissions.
    public var groupPatterns: [String: Permissions]
    /// The user id the token is restricted to.
    public var authorizedUUID: String?
    /// When it expires.
    public var expiresAt: Timetoken

    /// Creates a verified token grant.
    public init(channels: [String: Permissions], groups: [String: Permissions], channelPatterns: [String: Permissions],
                groupPatterns: [String: Permissions], authorizedUUID: String?, expiresAt: Timetoken) {
        self.channels = channels
        self.groups = groups
        self.channelPatterns = channelPatterns
        self.groupPatterns = groupPatterns
        self.authorizedUUID = authorizedUUID
        self.expiresAt = expiresAt
    }
}

/// The resources a request touches and the permission each needs (pubnub-wire §11.5).
public struct AccessRequest: Sendable, Hashable {
    /// Channels and the permission needed on each.
    public var channels: [String]
    /// Groups and the permission needed on each.
    public var groups: [String]
    /// The permission needed on every listed resource.
    public var permission: Permissions
    /// The request's `uuid`.
    public var uuid: String?

    /// Creates an access request.
    public init(channels: [String], groups: [String], permission: Permissions, uuid: String?) {
        self.channels = channels
        self.groups = groups
        self.permission = permission
        self.uuid = uuid
    }
}

/// Outcome of an access check.
public enum AccessDecision: Sendable, Hashable {
    /// Allowed.
    case allowed
    /// Denied on these resources (only the denied ones are listed).
    case denied(channels: [String], groups: [String], message: String)
}

/// The v2 grant table: hierarchical grants whose permissions OR together — keyset level, then
/// channel or group level, each for every client or for one auth key (pubnub-wire §11.1).
/// Pure: expiry is checked against the `now` passed in.
public struct GrantTable: Sendable {
    private struct Key: Hashable, Sendable {
        var subscribeKey: String
        var target: GrantTarget
        var authKey: String?
    }

    private var grants: [Key: Grant] = [:]

    /// Creates an empty table.
    public init() {}

    /// All grants (for persistence and audit).
    public var all: [Grant] { Array(grants.values) }

    /// Applies a grant; a grant with no permissions removes the row (a revoke).
    public mutating func apply(_ grant: Grant) {
        let key = Key(subscribeKey: grant.subscribeKey, target: grant.target, authKey: grant.authKey)
        grants[key] = grant.permissions.isEmpty ? nil : grant
    }

    /// Drops expired grants; returns how many were dropped.
    @discardableResult
    public mutating func removeExpired(now: Timetoken) -> Int {
        let before = grants.count
        grants = grants.filter { $0.value.expiresAt.map { $0 > now } ?? true }
        return before - grants.count
    }

    /// The earliest expiry after `now` among the grants, if any expire later. (Grants already
    /// expired but not yet dropped by ``removeExpired(now:)`` are left out: counted, they made
    /// every waiting subscriber's access deadline `now`, so each wait timed out at once until
    /// the next sweep.)
    public func nextExpiry(after now: Timetoken) -> Timetoken? {
        grants.values.compactMap { $0.expiresAt.flatMap { $0 > now ? $0 : nil } }.min()
    }

    /// Effective permissions on `target` for a client presenting `authKey`.
    public func permissions(subscribeKey: String, target: GrantTarget, authKey: String?, now: Timetoken) -> Permissions {
        var result: Permissions = []
        let candidates: [Key] = [
            Key(subscribeKey: subscribeKey, target: .keyset, authKey: nil),
            Key(subscribeKey: subscribeKey, target: target, authKey: nil),
        ] + (authKey.map {
            [Key(subscribeKey: subscribeKey, target: .keyset, authKey: $0), Key(subscribeKey: subscribeKey, target: target, authKey: $0)]
        } ?? [])
        for key in candidates {
            guard let grant = grants[key] else { continue }
            if let expiresAt = grant.expiresAt, expiresAt <= now { continue }
            result.formUnion(grant.permissions)
        }
        return result
    }

    /// Grants matching an audit query (`nil` filters match everything).
    public func audit(subscribeKey: String, channel: String?, group: String?, authKey: String?, now: Timetoken) -> [Grant] {
        grants.values.filter { grant in
            guard grant.subscribeKey == subscribeKey, grant.expiresAt.map({ $0 > now }) ?? true else { return false }
            if let authKey, grant.authKey != authKey { return false }
            switch grant.target {
            case .channel(let name): return group == nil && (channel == nil || channel == name)
            case .group(let name): return channel == nil && (group == nil || group == name)
            case .keyset: return channel == nil && group == nil
            case .uuid: return channel == nil && group == nil
            }
        }.sorted { "\($0.target)\($0.authKey ?? "")" < "\($1.target)\($1.authKey ?? "")" }
    }

    /// Decides a request made with a v2 auth key (or none).
    public func decide(_ request: AccessRequest, subscribeKey: String, authKey: String?, now: Timetoken) -> AccessDecision {
        let deniedChannels = request.channels.filter {
            !permissions(subscribeKey: subscribeKey, target: .channel($0), authKey: authKey, now: now).isSuperset(of: request.permission)
        }
        let deniedGroups = request.groups.filter {
            !permissions(subscribeKey: subscribeKey, target: .group($0), authKey: authKey, now: now).isSuperset(of: request.permission)
        }
        if deniedChannels.isEmpty && deniedGroups.isEmpty { return .allowed }
        return .denied(channels: deniedChannels, groups: deniedGroups, message: "Forbidden")
    }
}

extension VerifiedTokenGrant {
    /// Decides a request made with this (verified, unexpired, unrevoked) token. `matches` tests a
    /// resource name against a pattern (regular expressions are evaluated by the shell).
    public func decide(_ request: AccessRequest, now: Timetoken, matches: (String, String) -> Bool) -> AccessDecision {
        if expiresAt <= now { return .denied(channels: request.channels, groups: request.groups, message: "Token is expired") }
        if let authorizedUUID, request.uuid != authorizedUUID {
            return .denied(channels: request.channels, groups: request.groups, message: "Token is for another uuid")
        }
        func allowed(_ name: String, _ exact: [String: Permissions], _ patterns: [String: Permissions]) -> Bool {
            var permissions = exact[name] ?? []
            for (pattern, bits) in patterns where !permissions.isSuperset(of: request.permission) && matches(pattern, name) {
                permissions.formUnion(bits)
            }
            return permissions.isSuperset(of: request.permission)
        }
        let deniedChannels = request.channels.filter { !allowed($0, channels, channelPatterns) }
        let deniedGroups = request.groups.filter { !allowed($0, groups, groupPatterns) }
        if deniedChannels.isEmpty && deniedGroups.isEmpty { return .allowed }
        return .denied(channels: deniedChannels, groups: deniedGroups, message: "Forbidden")
    }
}
