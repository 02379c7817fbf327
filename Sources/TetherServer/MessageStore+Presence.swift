import Foundation
import GRDB
public import TetherServerCore

/// Presence memberships in the store, so presence survives a restart (docs/presence.md).
///
/// One row per (keyset, channel, uuid) present, with the member's timeout and state. Deadlines
/// are not stored: a restart gives every restored member the restart time plus its timeout.
extension MessageStore {
    /// The SQLite file of the store in `directory`.
    public static func databasePath(in directory: String) -> String {
        (directory as NSString).appendingPathComponent("tether.sqlite")
    }

    static func registerPresenceMigration(in migrator: inout DatabaseMigrator) {
        migrator.registerMigration("v4-presence") { db in
            try db.execute(sql: """
                CREATE TABLE presence_member (
                    sub_key TEXT NOT NULL,
                    channel TEXT NOT NULL,
                    uuid TEXT NOT NULL,
                    timeout_ms INTEGER NOT NULL,
                    state TEXT,
                    PRIMARY KEY (sub_key, channel, uuid)
                ) WITHOUT ROWID;
                """)
        }
    }

    /// Every stored presence membership.
    public func presenceRecords() throws -> [PresenceRecord] {
        try pool.read { db in
            try Row.fetchAll(db, sql: "SELECT sub_key, channel, uuid, timeout_ms, state FROM presence_member").map { row in
                PresenceRecord(subscribeKey: row["sub_key"], channel: row["channel"], uuid: row["uuid"],
                               timeout: .milliseconds(row["timeout_ms"] as Int64), state: row["state"])
            }
        }
    }

    /// Applies presence changes in one transaction; returns once it is durable.
    public func savePresence(_ changes: [PresenceRecordChange]) async throws {
        try await pool.write { db in try Self.apply(changes, to: db) }
    }

    /// Applies presence changes in one transaction, blocking (the last write at shutdown, when the
    /// task may already be cancelled).
    public func savePresenceNow(_ changes: [PresenceRecordChange]) throws {
        try pool.write { db in try Self.apply(changes, to: db) }
    }

    private static func apply(_ changes: [PresenceRecordChange], to db: Database) throws {
        let save = try db.cachedStatement(sql: """
            INSERT OR REPLACE INTO presence_member (sub_key, channel, uuid, timeout_ms, state) VALUES (?, ?, ?, ?, ?)
            """)
        let remove = try db.cachedStatement(sql: "DELETE FROM presence_member WHERE sub_key = ? AND channel = ? AND uuid = ?")
        for change in changes {
            switch change {
            case .save(let record):
                let (seconds, attoseconds) = record.timeout.components
                let milliseconds = seconds * 1000 + attoseconds / 1_000_000_000_000_000
                try save.execute(arguments: [record.subscribeKey, record.channel, record.uuid, milliseconds, record.state])
            case .remove(let subscribeKey, let channel, let uuid):
                try remove.execute(arguments: [subscribeKey, channel, uuid])
            }
        }
    }
}
