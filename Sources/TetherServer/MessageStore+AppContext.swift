import GRDB
@_spi(Benchmarks) package import TetherProtocol

/// Which kind of App Context object: a user (`uuids`) or a channel (`channels`).
package enum AppContextKind: String, Sendable, Hashable {
    case uuid
    case channel
}

/// One user's or channel's metadata as stored: its fields (name, email, externalId,
/// profileUrl or description, status, type, custom) as a JSON object, `updated` and `eTag`.
package struct AppContextRecord: Sendable, Hashable {
    package var id: String
    package var fields: [String: JSONValue]
    package var updated: String
    package var eTag: String
}

/// One membership: a user in a channel, with its own custom, status and type.
package struct AppContextMembership: Sendable, Hashable {
    package var uuid: String
    package var channel: String
    package var fields: [String: JSONValue]
    package var updated: String
    package var eTag: String
}

/// A memberships change refused because it would take a user past its memberships or a channel
/// past its members (PubNub's platform limits); nothing of the change was written.
package struct AppContextMembershipLimitExceeded: Error, Sendable, Equatable {
    /// `"uuid"` or `"channel"`.
    package var kind: String
    package var id: String
    package var limit: Int
}

/// What a set of metadata came to.
package enum AppContextSetOutcome: Sendable, Hashable {
    case set(AppContextRecord)
    /// `If-Match` named an eTag that is not the stored one (or there is none).
    case preconditionFailed
}

/// The App Context tables (docs/compatibility.md, "App Context"): objects keyed by (sub key,
/// kind, id), memberships by (sub key, uuid, channel). Removing a user or a channel removes its
/// memberships in the same transaction.
extension MessageStore {
    static func registerAppContextMigration(in migrator: inout DatabaseMigrator) {
        migrator.registerMigration("v7-app-context") { db in
            try db.execute(sql: """
                CREATE TABLE app_context_object (
                    sub_key TEXT NOT NULL,
                    kind TEXT NOT NULL,
                    id TEXT NOT NULL,
                    fields TEXT NOT NULL,
                    updated TEXT NOT NULL,
                    etag TEXT NOT NULL,
                    PRIMARY KEY (sub_key, kind, id)
                ) WITHOUT ROWID;
                CREATE TABLE app_context_membership (
                    sub_key TEXT NOT NULL,
                    uuid TEXT NOT NULL,
                    channel TEXT NOT NULL,
                    fields TEXT NOT NULL,
                    updated TEXT NOT NULL,
                    etag TEXT NOT NULL,
                    PRIMARY KEY (sub_key, uuid, channel)
                ) WITHOUT ROWID;
                CREATE INDEX app_context_membership_channel ON app_context_membership(sub_key, channel, uuid);
                """)
        }
    }

    /// An eTag: 16 hex digits of FNV-1a over the fields and the update time.
    static func appContextETag(_ fields: [String: JSONValue], updated: String) -> String {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in JSONValue.object(fields).jsonBytes + Array(updated.utf8) {
            hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3
        }
        let text = String(hash, radix: 16)
        return String(repeating: "0", count: 16 - text.count) + text
    }

    private static func fields(_ text: String) -> [String: JSONValue] {
        (try? JSONValue(parsing: text))?.objectValue ?? [:]
    }

    private static func record(_ row: Row) -> AppContextRecord {
        AppContextRecord(id: row["id"], fields: fields(row["fields"]), updated: row["updated"], eTag: row["etag"])
    }

    private static func membership(_ row: Row) -> AppContextMembership {
        AppContextMembership(uuid: row["uuid"], channel: row["channel"], fields: fields(row["fields"]), updated: row["updated"],
                             eTag: row["etag"])
    }

    /// One object, or `nil`.
    package func appContextObject(subscribeKey: String, kind: AppContextKind, id: String) async throws -> AppContextRecord? {
        try await pool.read { db in
            try Row.fetchOne(db, sql: "SELECT * FROM app_context_object WHERE sub_key = ? AND kind = ? AND id = ?",
                             arguments: [subscribeKey, kind.rawValue, id]).map(Self.record)
        }
    }

    /// Objects of one kind whose id is in `ids` (for include=channel / include=uuid).
    package func appContextObjects(subscribeKey: String, kind: AppContextKind, ids: Set<String>) async throws -> [String: AppContextRecord] {
        guard !ids.isEmpty else { return [:] }
        return try await pool.read { db in
            var result: [String: AppContextRecord] = [:]
            for chunk in Array(ids).chunked(400) {
                let marks = Array(repeating: "?", count: chunk.count).joined(separator: ",")
                let arguments: [any DatabaseValueConvertible] = [subscribeKey, kind.rawValue] + chunk
                for row in try Row.fetchAll(db, sql: "SELECT * FROM app_context_object WHERE sub_key = ? AND kind = ? AND id IN (\(marks))",
                                            arguments: StatementArguments(arguments)) {
                    let r = Self.record(row)
                    result[r.id] = r
                }
            }
            return result
        }
    }

    /// Every object of one kind in a keyset, at most `limit` (a bound on one list's scan).
    package func appContextObjects(subscribeKey: String, kind: AppContextKind, limit: Int) async throws -> [AppContextRecord] {
        try await pool.read { db in
            try Row.fetchAll(db, sql: "SELECT * FROM app_context_object WHERE sub_key = ? AND kind = ? ORDER BY id LIMIT ?",
                             arguments: [subscribeKey, kind.rawValue, limit]).map(Self.record)
        }
    }

    package func appContextObjectsPage(subscribeKey: String, kind: AppContextKind, offset: Int, limit: Int) async throws
        -> (records: [AppContextRecord], total: Int)
    {
        try await pool.read { db in
            let total = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM app_context_object WHERE sub_key = ? AND kind = ?",
                                         arguments: [subscribeKey, kind.rawValue]) ?? 0
            let records = try Row.fetchAll(db, sql: """
                SELECT * FROM app_context_object WHERE sub_key = ? AND kind = ? ORDER BY id LIMIT ? OFFSET ?
                """, arguments: [subscribeKey, kind.rawValue, limit, offset]).map(Self.record)
            return (records, total)
        }
    }

    /// Applies a PATCH: members of `patch` replace the stored fields (a `null` clears one);
    /// absent members keep theirs. With `ifMatch`, the stored eTag must be that one.
    package func setAppContextObject(subscribeKey: String, kind: AppContextKind, id: String, patch: [String: JSONValue],
                                     ifMatch: String?, updated: String) async throws -> AppContextSetOutcome {
        try await pool.write { db in
            let existing = try Row.fetchOne(db, sql: "SELECT * FROM app_context_object WHERE sub_key = ? AND kind = ? AND id = ?",
                                            arguments: [subscribeKey, kind.rawValue, id]).map(Self.record)
            if let ifMatch, existing?.eTag != ifMatch { return .preconditionFailed }
            var fields = existing?.fields ?? [:]
            for (key, value) in patch { fields[key] = value }
            let eTag = Self.appContextETag(fields, updated: updated)
            try db.execute(sql: """
                INSERT INTO app_context_object (sub_key, kind, id, fields, updated, etag) VALUES (?, ?, ?, ?, ?, ?)
                ON CONFLICT(sub_key, kind, id) DO UPDATE SET fields = excluded.fields, updated = excluded.updated, etag = excluded.etag
                """, arguments: [subscribeKey, kind.rawValue, id, String(decoding: JSONValue.object(fields).jsonBytes, as: UTF8.self),
                                 updated, eTag])
            return .set(AppContextRecord(id: id, fields: fields, updated: updated, eTag: eTag))
        }
    }

    /// Removes an object and its memberships; whether it existed.
    @discardableResult
    package func removeAppContextObject(subscribeKey: String, kind: AppContextKind, id: String) async throws -> Bool {
        try await pool.write { db in
            try db.execute(sql: "DELETE FROM app_context_object WHERE sub_key = ? AND kind = ? AND id = ?",
                           arguments: [subscribeKey, kind.rawValue, id])
            let existed = db.changesCount > 0
            let column = kind == .uuid ? "uuid" : "channel"
            try db.execute(sql: "DELETE FROM app_context_membership WHERE sub_key = ? AND \(column) = ?", arguments: [subscribeKey, id])
            return existed
        }
    }

    /// The memberships of a user (`kind == .uuid`) or the members of a channel, at most `limit`.
    package func appContextMemberships(subscribeKey: String, of kind: AppContextKind, id: String, limit: Int) async throws
        -> [AppContextMembership]
    {
        try await pool.read { db in
            let column = kind == .uuid ? "uuid" : "channel"
            return try Row.fetchAll(db, sql: "SELECT * FROM app_context_membership WHERE sub_key = ? AND \(column) = ? LIMIT ?",
                                    arguments: [subscribeKey, id, limit]).map(Self.membership)
        }
    }

    /// PubNub's platform limits: memberships of one user, members of one channel.
    package static let membershipsPerUser = 50_000
    package static let membersPerChannel = 5_000

    /// Sets (`set`: upsert with the given fields) and deletes memberships in one transaction,
    /// deletes first. Returns what was set and which of `delete` existed. Throws
    /// ``AppContextMembershipLimitExceeded`` (and writes nothing) when a user would have more
    /// than `perUser` memberships or a channel more than `perChannel` members.
    package func applyAppContextMemberships(subscribeKey: String, set: [AppContextMembership], delete: [(uuid: String, channel: String)],
                                            perUser: Int = membershipsPerUser, perChannel: Int = membersPerChannel)
        async throws -> (set: [AppContextMembership], deleted: [(uuid: String, channel: String)])
    {
        try await pool.write { db in
            var deleted: [(uuid: String, channel: String)] = []
            for pair in delete {
                try db.execute(sql: "DELETE FROM app_context_membership WHERE sub_key = ? AND uuid = ? AND channel = ?",
                               arguments: [subscribeKey, pair.uuid, pair.channel])
                if db.changesCount > 0 { deleted.append(pair) }
            }
            var written: [AppContextMembership] = []
            for var m in set {
                m.eTag = Self.appContextETag(m.fields, updated: m.updated)
                try db.execute(sql: """
                    INSERT INTO app_context_membership (sub_key, uuid, channel, fields, updated, etag) VALUES (?, ?, ?, ?, ?, ?)
                    ON CONFLICT(sub_key, uuid, channel) DO UPDATE SET fields = excluded.fields, updated = excluded.updated, etag = excluded.etag
                    """, arguments: [subscribeKey, m.uuid, m.channel, String(decoding: JSONValue.object(m.fields).jsonBytes, as: UTF8.self),
                                     m.updated, m.eTag])
                written.append(m)
            }
            for uuid in Set(set.map(\.uuid)) {
                let count = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM app_context_membership WHERE sub_key = ? AND uuid = ?",
                                             arguments: [subscribeKey, uuid]) ?? 0
                if count > perUser { throw AppContextMembershipLimitExceeded(kind: "uuid", id: uuid, limit: perUser) }
            }
            for channel in Set(set.map(\.channel)) {
                let count = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM app_context_membership WHERE sub_key = ? AND channel = ?",
                                             arguments: [subscribeKey, channel]) ?? 0
                if count > perChannel { throw AppContextMembershipLimitExceeded(kind: "channel", id: channel, limit: perChannel) }
            }
            return (written, deleted)
        }
    }

    /// Number of stored objects and memberships (for tests and tools).
    package func appContextCounts() async throws -> (objects: Int, memberships: Int) {
        try await pool.read { db in
            (try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM app_context_object") ?? 0,
             try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM app_context_membership") ?? 0)
        }
    }
}

extension Array {
    fileprivate func chunked(_ size: Int) -> [[Element]] {
        stride(from: 0, to: count, by: size).map { Array(self[$0..<Swift.min($0 + size, count)]) }
    }
}
