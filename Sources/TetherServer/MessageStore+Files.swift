import GRDB
@_spi(Benchmarks) package import TetherProtocol

/// One uploaded file's metadata (docs/files.md). Its bytes are in the ``FileStorage`` under
/// ``storageKey``.
package struct StoredFile: Sendable, Hashable {
    package var subscribeKey: String
    package var channel: String
    /// The id the server gave it when the upload URL was generated (a UUID).
    package var id: String
    package var name: String
    package var size: Int
    package var contentType: String
    /// When its upload completed (a timetoken-scale instant: 100 ns since the Unix epoch).
    package var created: Timetoken

    package init(subscribeKey: String, channel: String, id: String, name: String, size: Int, contentType: String, created: Timetoken) {
        self.subscribeKey = subscribeKey
        self.channel = channel
        self.id = id
        self.name = name
        self.size = size
        self.contentType = contentType
        self.created = created
    }

    init(row: Row) {
        subscribeKey = row["sub_key"]
        channel = row["channel"]
        id = row["id"]
        name = row["name"]
        size = row["size"]
        contentType = row["content_type"]
        created = Timetoken(UInt64(row["created"] as Int64))
    }

    /// The key of its bytes in the storage.
    package var storageKey: String { Self.storageKey(subscribeKey: subscribeKey, id: id) }

    package static func storageKey(subscribeKey: String, id: String) -> String { "\(subscribeKey)/\(id)" }
}

/// The `file` table: one row per completed upload. A file's row and its bytes are removed
/// together by a delete; the message that announced it stays (as PubNub keeps it).
extension MessageStore {
    static func registerFileMigration(in migrator: inout DatabaseMigrator) {
        migrator.registerMigration("v8-files") { db in
            try db.execute(sql: """
                CREATE TABLE file (
                    sub_key TEXT NOT NULL,
                    id TEXT NOT NULL,
                    channel TEXT NOT NULL,
                    name TEXT NOT NULL,
                    size INTEGER NOT NULL,
                    content_type TEXT NOT NULL,
                    created INTEGER NOT NULL,
                    PRIMARY KEY (sub_key, id)
                ) WITHOUT ROWID;
                CREATE INDEX file_by_channel ON file (sub_key, channel, created, id);
                """)
        }
    }

    /// Records a completed upload; `false` when a file with that id already exists.
    package func addFile(_ file: StoredFile) async throws -> Bool {
        try await pool.write { db in
            if try Bool.fetchOne(db, sql: "SELECT 1 FROM file WHERE sub_key = ? AND id = ?", arguments: [file.subscribeKey, file.id]) == true {
                return false
            }
            try db.execute(sql: """
                INSERT INTO file (sub_key, id, channel, name, size, content_type, created) VALUES (?, ?, ?, ?, ?, ?, ?)
                """, arguments: [file.subscribeKey, file.id, file.channel, file.name, file.size, file.contentType, file.created.storageValue])
            return true
        }
    }

    /// The file `id` of a keyset, on any channel.
    package func file(subscribeKey: String, id: String) async throws -> StoredFile? {
        try await pool.read { db in
            try Row.fetchOne(db, sql: "SELECT * FROM file WHERE sub_key = ? AND id = ?", arguments: [subscribeKey, id]).map(StoredFile.init(row:))
        }
    }

    /// Removes the file's row; returns it, or `nil` when there was none.
    package func removeFile(subscribeKey: String, id: String) async throws -> StoredFile? {
        try await pool.write { db in
            guard let row = try Row.fetchOne(db, sql: "SELECT * FROM file WHERE sub_key = ? AND id = ?", arguments: [subscribeKey, id])
            else { return nil }
            try db.execute(sql: "DELETE FROM file WHERE sub_key = ? AND id = ?", arguments: [subscribeKey, id])
            return StoredFile(row: row)
        }
    }

    /// A channel's files, oldest first, after the position `after` (created, id) when given:
    /// at most `limit`, and whether more follow.
    package func files(subscribeKey: String, channel: String, after: (created: Timetoken, id: String)?, limit: Int) async throws
        -> (files: [StoredFile], more: Bool)
    {
        try await pool.read { db in
            var sql = "SELECT * FROM file WHERE sub_key = ? AND channel = ?"
            var arguments: [any DatabaseValueConvertible] = [subscribeKey, channel]
            if let after {
                sql += " AND (created > ? OR (created = ? AND id > ?))"
                arguments += [after.created.storageValue, after.created.storageValue, after.id]
            }
            sql += " ORDER BY created, id LIMIT ?"
            arguments.append(limit + 1)
            let rows = try Row.fetchAll(db, sql: sql, arguments: StatementArguments(arguments)).map(StoredFile.init(row:))
            return (Array(rows.prefix(limit)), rows.count > limit)
        }
    }

    /// Every file's storage key (for reconciling the storage at start-up).
    package func allFileKeys() throws -> Set<String> {
        try pool.read { db in
            Set(try Row.fetchAll(db, sql: "SELECT sub_key, id FROM file").map { row in
                StoredFile.storageKey(subscribeKey: row["sub_key"], id: row["id"])
            })
        }
    }
}
