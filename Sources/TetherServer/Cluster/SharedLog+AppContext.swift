import Logging
import PostgresNIO
@_spi(Benchmarks) package import TetherProtocol

/// App Context in the cluster's PostgreSQL (`tether_app_context_object`,
/// `tether_app_context_membership`): the same PATCH semantics, eTags, order and limits as the
/// embedded store's, seen by every node.
extension SharedLog: AppContextStoring {
    private typealias ObjectRow = (String, String, String, String)
    private typealias MembershipRow = (String, String, String, String, String)

    private static func fields(_ text: String) -> [String: JSONValue] {
        (try? JSONValue(parsing: text))?.objectValue ?? [:]
    }

    private static func text(_ fields: [String: JSONValue]) -> String {
        String(decoding: JSONValue.object(fields).jsonBytes, as: UTF8.self)
    }

    private static func record(_ row: ObjectRow) -> AppContextRecord {
        AppContextRecord(id: row.0, fields: fields(row.1), updated: row.2, eTag: row.3)
    }

    private func objects(_ query: PostgresQuery, on connection: PostgresConnection) async throws -> [AppContextRecord] {
        var records: [AppContextRecord] = []
        for try await row in try await connection.query(query, logger: logger).decode(ObjectRow.self) {
            records.append(Self.record(row))
        }
        return records
    }

    package func appContextObject(subscribeKey: String, kind: AppContextKind, id: String) async throws -> AppContextRecord? {
        try await recordQuery { connection in
            try await self.objects("""
                SELECT id, fields, updated, etag FROM tether_app_context_object
                WHERE sub_key = \(subscribeKey) AND kind = \(kind.rawValue) AND id = \(id)
                """, on: connection).first
        }
    }

    package func appContextObjects(subscribeKey: String, kind: AppContextKind, ids: Set<String>) async throws
        -> [String: AppContextRecord]
    {
        guard !ids.isEmpty else { return [:] }
        return try await recordQuery { connection in
            var result: [String: AppContextRecord] = [:]
            for record in try await self.objects("""
                SELECT id, fields, updated, etag FROM tether_app_context_object
                WHERE sub_key = \(subscribeKey) AND kind = \(kind.rawValue) AND id = ANY(\(Array(ids)))
                """, on: connection)
            {
                result[record.id] = record
            }
            return result
        }
    }

    package func appContextObjects(subscribeKey: String, kind: AppContextKind, limit: Int) async throws -> [AppContextRecord] {
        try await recordQuery { connection in
            try await self.objects("""
                SELECT id, fields, updated, etag FROM tether_app_context_object
                WHERE sub_key = \(subscribeKey) AND kind = \(kind.rawValue) ORDER BY id LIMIT \(limit)
                """, on: connection)
        }
    }

    package func appContextObjectsPage(subscribeKey: String, kind: AppContextKind, offset: Int, limit: Int) async throws
        -> (records: [AppContextRecord], total: Int)
    {
        try await recordQuery { connection in
            let total = try await connection.query("""
                SELECT COUNT(*) FROM tether_app_context_object WHERE sub_key = \(subscribeKey) AND kind = \(kind.rawValue)
                """, logger: self.logger).decode(Int.self).first(where: { _ in true }) ?? 0
            let records = try await self.objects("""
                SELECT id, fields, updated, etag FROM tether_app_context_object
                WHERE sub_key = \(subscribeKey) AND kind = \(kind.rawValue) ORDER BY id LIMIT \(limit) OFFSET \(offset)
                """, on: connection)
            return (records, total)
        }
    }

    package func setAppContextObject(subscribeKey: String, kind: AppContextKind, id: String, patch: [String: JSONValue],
                                     ifMatch: String?, updated: String) async throws -> AppContextSetOutcome {
        try await recordTransaction { connection in
            // Read, merge, write: two PATCHes of one object (on any nodes) take turns.
            try await Self.lockRecords(["app-context-object\u{0}\(subscribeKey)\u{0}\(kind.rawValue)\u{0}\(id)"],
                                       connection: connection, logger: self.logger)
            let existing = try await self.objects("""
                SELECT id, fields, updated, etag FROM tether_app_context_object
                WHERE sub_key = \(subscribeKey) AND kind = \(kind.rawValue) AND id = \(id)
                """, on: connection).first
            if let ifMatch, existing?.eTag != ifMatch { return AppContextSetOutcome.preconditionFailed }
            var fields = existing?.fields ?? [:]
            for (key, value) in patch { fields[key] = value }
            let eTag = MessageStore.appContextETag(fields, updated: updated)
            try await connection.query("""
                INSERT INTO tether_app_context_object (sub_key, kind, id, fields, updated, etag)
                VALUES (\(subscribeKey), \(kind.rawValue), \(id), \(Self.text(fields)), \(updated), \(eTag))
                ON CONFLICT (sub_key, kind, id) DO UPDATE SET fields = excluded.fields, updated = excluded.updated, etag = excluded.etag
                """, logger: self.logger)
            return .set(AppContextRecord(id: id, fields: fields, updated: updated, eTag: eTag))
        }
    }

    @discardableResult
    package func removeAppContextObject(subscribeKey: String, kind: AppContextKind, id: String) async throws -> Bool {
        try await recordTransaction { connection in
            var existed = false
            for try await _ in try await connection.query("""
                DELETE FROM tether_app_context_object WHERE sub_key = \(subscribeKey) AND kind = \(kind.rawValue) AND id = \(id)
                RETURNING id
                """, logger: self.logger).decode(String.self)
            {
                existed = true
            }
            let column = kind == .uuid ? "uuid" : "channel"
            try await connection.query("""
                DELETE FROM tether_app_context_membership WHERE sub_key = \(subscribeKey) AND \(unescaped: column) = \(id)
                """, logger: self.logger)
            return existed
        }
    }

    package func appContextMemberships(subscribeKey: String, of kind: AppContextKind, id: String, limit: Int) async throws
        -> [AppContextMembership]
    {
        // Ordered as the embedded store's indexes return them: a user's by channel, a channel's by uuid.
        let (column, order) = kind == .uuid ? ("uuid", "channel") : ("channel", "uuid")
        return try await recordQuery { connection in
            var memberships: [AppContextMembership] = []
            for try await (uuid, channel, fields, updated, eTag) in try await connection.query("""
                SELECT uuid, channel, fields, updated, etag FROM tether_app_context_membership
                WHERE sub_key = \(subscribeKey) AND \(unescaped: column) = \(id) ORDER BY \(unescaped: order) LIMIT \(limit)
                """, logger: self.logger).decode(MembershipRow.self)
            {
                memberships.append(AppContextMembership(uuid: uuid, channel: channel, fields: Self.fields(fields), updated: updated,
                                                        eTag: eTag))
            }
            return memberships
        }
    }

    package func applyAppContextMemberships(subscribeKey: String, set: [AppContextMembership],
                                            delete: [(uuid: String, channel: String)], perUser: Int, perChannel: Int) async throws
        -> (set: [AppContextMembership], deleted: [(uuid: String, channel: String)])
    {
        let uuids = Array(Swift.Set(set.map(\.uuid))), channels = Array(Swift.Set(set.map(\.channel)))
        let result: Written = try await recordTransaction { connection in
            // Counted after writing, then kept or rolled back: changes that add to the same
            // user or channel (on any nodes) take turns, so neither passes the limit unseen.
            try await Self.lockRecords(uuids.map { "app-context-user\u{0}\(subscribeKey)\u{0}\($0)" }
                                       + channels.map { "app-context-channel\u{0}\(subscribeKey)\u{0}\($0)" },
                                       connection: connection, logger: self.logger)
            var written = Written()
            for pair in delete {
                for try await _ in try await connection.query("""
                    DELETE FROM tether_app_context_membership
                    WHERE sub_key = \(subscribeKey) AND uuid = \(pair.uuid) AND channel = \(pair.channel) RETURNING uuid
                    """, logger: self.logger).decode(String.self)
                {
                    written.deleted.append(Pair(uuid: pair.uuid, channel: pair.channel))
                }
            }
            for var m in set {
                m.eTag = MessageStore.appContextETag(m.fields, updated: m.updated)
                try await connection.query("""
                    INSERT INTO tether_app_context_membership (sub_key, uuid, channel, fields, updated, etag)
                    VALUES (\(subscribeKey), \(m.uuid), \(m.channel), \(Self.text(m.fields)), \(m.updated), \(m.eTag))
                    ON CONFLICT (sub_key, uuid, channel) DO UPDATE
                    SET fields = excluded.fields, updated = excluded.updated, etag = excluded.etag
                    """, logger: self.logger)
                written.set.append(m)
            }
            for uuid in uuids {
                let count = try await connection.query("""
                    SELECT COUNT(*) FROM tether_app_context_membership WHERE sub_key = \(subscribeKey) AND uuid = \(uuid)
                    """, logger: self.logger).decode(Int.self).first(where: { _ in true }) ?? 0
                if count > perUser { throw AppContextMembershipLimitExceeded(kind: "uuid", id: uuid, limit: perUser) }
            }
            for channel in channels {
                let count = try await connection.query("""
                    SELECT COUNT(*) FROM tether_app_context_membership WHERE sub_key = \(subscribeKey) AND channel = \(channel)
                    """, logger: self.logger).decode(Int.self).first(where: { _ in true }) ?? 0
                if count > perChannel { throw AppContextMembershipLimitExceeded(kind: "channel", id: channel, limit: perChannel) }
            }
            return written
        }
        return (result.set, result.deleted.map { (uuid: $0.uuid, channel: $0.channel) })
    }

    /// What a memberships change wrote (Sendable, to leave its transaction).
    private struct Written: Sendable {
        var set: [AppContextMembership] = []
        var deleted: [Pair] = []
    }

    private struct Pair: Sendable {
        var uuid: String
        var channel: String
    }

    package func appContextCounts() async throws -> (objects: Int, memberships: Int) {
        let counts = try await recordQuery { connection in
            try await connection.query("""
                SELECT (SELECT COUNT(*) FROM tether_app_context_object), (SELECT COUNT(*) FROM tether_app_context_membership)
                """, logger: self.logger).decode((Int, Int).self).first(where: { _ in true }) ?? (0, 0)
        }
        return (counts.0, counts.1)
    }
}
