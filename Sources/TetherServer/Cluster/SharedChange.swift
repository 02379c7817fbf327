import Foundation
import Logging
import PostgresNIO
@_spi(Benchmarks) package import TetherProtocol
package import TetherServerCore

/// A change to state every node keeps in memory — channel groups, v2 grants, token
/// revocations — made in a cluster. The log's writer applies it to its table *inside* the
/// transaction that holds the sequencer lock and records the resulting state as a control
/// entry in the log, so every node applies the changes in one order, the order of the tables.
package enum SharedChange: Sendable, Equatable {
    /// Adds and removes channels of a group (`delete` removes the whole group). A change that
    /// would leave more than `maximum` channels is refused, and changes nothing.
    case group(subscribeKey: String, group: String, add: [String], remove: [String], delete: Bool, maximum: Int)
    /// v2 grants (a grant with no permissions removes its row).
    case grants([Grant])
    /// A revoked token signature, remembered until the token would have expired.
    case revocation(signature: String, expiresAt: Timetoken)
}

/// A control entry as it travels through the log: the state a change left, applied by every
/// node's reader in log order (``SharedLogService``).
package enum SharedControl: Sendable, Equatable {
    /// A group's channels after a change (empty: the group is gone); `refused` when the change
    /// would have exceeded the group's maximum and nothing changed.
    case group(subscribeKey: String, group: String, channels: Set<String>, refused: Bool)
    case grants([Grant])
    case revocation(signature: String, expiresAt: Timetoken)
}

/// One entry read from the log: an event to deliver, or a control entry to apply.
package enum SharedLogEntry: Sendable {
    case event(BufferedEvent)
    case control(SharedControl, at: Timetoken)

    package var timetoken: Timetoken {
        switch self {
        case .event(let event): event.timetoken
        case .control(_, let at): at
        }
    }
}

/// The JSON of control entries (the `payload` column of rows of ``SharedControlCoding/kind``).
enum SharedControlCoding {
    /// The `kind` column of control entries: outside every ``EventKind`` value, so a control
    /// entry can never be mistaken for something to deliver.
    static let kind = 100

    private struct GrantRow: Codable {
        var subscribeKey: String
        var kind: String
        var target: String
        var authKey: String?
        var permissions: Int
        var ttl: Int
        var expiresAt: UInt64?
    }

    private struct Body: Codable {
        var op: String
        var subscribeKey: String?
        var group: String?
        var channels: [String]?
        var refused: Bool?
        var grants: [GrantRow]?
        var signature: String?
        var expiresAt: UInt64?
    }

    static func grantParts(_ target: GrantTarget) -> (kind: String, name: String) {
        switch target {
        case .keyset: ("keyset", "")
        case .channel(let name): ("channel", name)
        case .group(let name): ("group", name)
        case .uuid(let name): ("uuid", name)
        }
    }

    static func grantTarget(kind: String, name: String) -> GrantTarget? {
        switch kind {
        case "keyset": .keyset
        case "channel": .channel(name)
        case "group": .group(name)
        case "uuid": .uuid(name)
        default: nil
        }
    }

    static func encode(_ control: SharedControl) -> String {
        let body: Body
        switch control {
        case .group(let subscribeKey, let group, let channels, let refused):
            body = Body(op: "group", subscribeKey: subscribeKey, group: group, channels: channels.sorted(), refused: refused)
        case .grants(let grants):
            body = Body(op: "grants", grants: grants.map { grant in
                let (kind, name) = grantParts(grant.target)
                return GrantRow(subscribeKey: grant.subscribeKey, kind: kind, target: name, authKey: grant.authKey,
                                permissions: grant.permissions.rawValue, ttl: grant.ttlMinutes, expiresAt: grant.expiresAt?.rawValue)
            })
        case .revocation(let signature, let expiresAt):
            body = Body(op: "revocation", signature: signature, expiresAt: expiresAt.rawValue)
        }
        return String(decoding: (try? JSONEncoder().encode(body)) ?? Data("{}".utf8), as: UTF8.self)
    }

    static func decode(_ text: String) -> SharedControl? {
        guard let body = try? JSONDecoder().decode(Body.self, from: Data(text.utf8)) else { return nil }
        switch body.op {
        case "group":
            guard let subscribeKey = body.subscribeKey, let group = body.group else { return nil }
            return .group(subscribeKey: subscribeKey, group: group, channels: Set(body.channels ?? []), refused: body.refused ?? false)
        case "grants":
            var grants: [Grant] = []
            for row in body.grants ?? [] {
                guard let target = grantTarget(kind: row.kind, name: row.target) else { continue }
                let expiresAt: Timetoken? = row.expiresAt.map { Timetoken($0) }
                grants.append(Grant(subscribeKey: row.subscribeKey, target: target, authKey: row.authKey,
                                    permissions: Permissions(rawValue: row.permissions), ttlMinutes: row.ttl, expiresAt: expiresAt))
            }
            return .grants(grants)
        case "revocation":
            guard let signature = body.signature, let expiresAt = body.expiresAt else { return nil }
            return .revocation(signature: signature, expiresAt: Timetoken(expiresAt))
        default:
            return nil
        }
    }
}

extension SharedLog {
    /// Applies `change` in the writer's transaction (under the sequencer lock) and returns the
    /// control entry it wrote, once committed.
    static func apply(_ change: SharedChange, connection: PostgresConnection, logger: Logger) async throws -> SharedControl {
        switch change {
        case .group(let subscribeKey, let group, let add, let remove, let delete, let maximum):
            if delete {
                try await connection.query("DELETE FROM tether_channel_group WHERE sub_key = \(subscribeKey) AND grp = \(group)",
                                           logger: logger)
                return .group(subscribeKey: subscribeKey, group: group, channels: [], refused: false)
            }
            var current = Set<String>()
            for try await channel in try await connection.query("""
                SELECT channel FROM tether_channel_group WHERE sub_key = \(subscribeKey) AND grp = \(group)
                """, logger: logger).decode(String.self)
            {
                current.insert(channel)
            }
            let next = current.union(add).subtracting(remove)
            if next.count > maximum {
                return .group(subscribeKey: subscribeKey, group: group, channels: current, refused: true)
            }
            for channel in next.subtracting(current) {
                try await connection.query("""
                    INSERT INTO tether_channel_group (sub_key, grp, channel) VALUES (\(subscribeKey), \(group), \(channel))
                    ON CONFLICT DO NOTHING
                    """, logger: logger)
            }
            for channel in current.subtracting(next) {
                try await connection.query("""
                    DELETE FROM tether_channel_group WHERE sub_key = \(subscribeKey) AND grp = \(group) AND channel = \(channel)
                    """, logger: logger)
            }
            return .group(subscribeKey: subscribeKey, group: group, channels: next, refused: false)
        case .grants(let grants):
            for grant in grants {
                let (kind, name) = SharedControlCoding.grantParts(grant.target)
                let auth = grant.authKey ?? ""
                if grant.permissions.isEmpty {
                    try await connection.query("""
                        DELETE FROM tether_grant WHERE sub_key = \(grant.subscribeKey) AND target_kind = \(kind) AND target = \(name)
                        AND auth_key = \(auth)
                        """, logger: logger)
                } else {
                    try await connection.query("""
                        INSERT INTO tether_grant (sub_key, target_kind, target, auth_key, permissions, ttl, expires_at)
                        VALUES (\(grant.subscribeKey), \(kind), \(name), \(auth), \(grant.permissions.rawValue), \(grant.ttlMinutes),
                                \(grant.expiresAt?.storageValue))
                        ON CONFLICT (sub_key, target_kind, target, auth_key) DO UPDATE
                        SET permissions = excluded.permissions, ttl = excluded.ttl, expires_at = excluded.expires_at
                        """, logger: logger)
                }
            }
            return .grants(grants)
        case .revocation(let signature, let expiresAt):
            try await connection.query("""
                INSERT INTO tether_revocation (signature, expires_at) VALUES (\(signature), \(expiresAt.storageValue))
                ON CONFLICT (signature) DO UPDATE SET expires_at = GREATEST(tether_revocation.expires_at, excluded.expires_at)
                """, logger: logger)
            return .revocation(signature: signature, expiresAt: expiresAt)
        }
    }

    /// What every node keeps in memory, as the tables hold it now: read at start-up, *after*
    /// the starting horizon, so every change at or below the horizon is in it and every later
    /// one arrives through the reader (applying one twice is harmless: each carries its result).
    static func loadSharedState(client: PostgresClient, logger: Logger) async throws -> SharedState {
        var state = SharedState()
        do {
            for try await (subscribeKey, group, channel) in try await client.query(
                "SELECT sub_key, grp, channel FROM tether_channel_group", logger: logger).decode((String, String, String).self)
            {
                state.groups.append((subscribeKey, group, channel))
            }
            for try await (subscribeKey, kind, target, auth, permissions, ttl, expires) in try await client.query(
                "SELECT sub_key, target_kind, target, auth_key, permissions, ttl, expires_at FROM tether_grant", logger: logger)
                .decode((String, String, String, String, Int, Int, Int64?).self)
            {
                guard let target = SharedControlCoding.grantTarget(kind: kind, name: target) else { continue }
                state.grants.append(Grant(subscribeKey: subscribeKey, target: target, authKey: auth.isEmpty ? nil : auth,
                                          permissions: Permissions(rawValue: permissions), ttlMinutes: ttl,
                                          expiresAt: expires.map { Timetoken(UInt64($0)) }))
            }
            for try await (signature, expires) in try await client.query(
                "SELECT signature, expires_at FROM tether_revocation", logger: logger).decode((String, Int64).self)
            {
                state.revocations[signature] = Timetoken(UInt64(expires))
            }
        } catch {
            throw Self.classify(error)
        }
        return state
    }

    /// The group names of a keyset, sorted (the channel registry's listing).
    package func groupNames(subscribeKey: String) async throws -> [String] {
        var names: [String] = []
        do {
            for try await name in try await client.query("""
                SELECT DISTINCT grp FROM tether_channel_group WHERE sub_key = \(subscribeKey) ORDER BY grp
                """, logger: logger).decode(String.self)
            {
                names.append(name)
            }
        } catch {
            throw Self.classify(error)
        }
        return names
    }

    /// Forgets revocations of tokens that have expired anyway.
    package func pruneRevocations(now: Timetoken) async throws {
        do {
            try await client.query("DELETE FROM tether_revocation WHERE expires_at <= \(now.storageValue)", logger: logger)
        } catch {
            throw Self.classify(error)
        }
    }
}

/// The in-memory state of a cluster node as the tables held it at start-up.
package struct SharedState: Sendable {
    package var groups: [(String, String, String)] = []
    package var grants: [Grant] = []
    package var revocations: [String: Timetoken] = [:]
}
