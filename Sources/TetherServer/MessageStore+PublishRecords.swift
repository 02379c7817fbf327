import GRDB
@_spi(Benchmarks) package import TetherProtocol
package import TetherServerCore

/// A publish that carried a request id, remembered so a repeat is answered with its original
/// timetoken (issue #15, docs/protocol.md "Repeated publishes").
package struct PublishRecord: Sendable, Hashable {
    package var key: DedupKey
    /// The original publish's timetoken.
    package var timetoken: Timetoken
    /// The channel it went to (for operators reading the table).
    package var channel: String
    /// When it was remembered, on the deduplication clock.
    package var createdAt: Timetoken

    package init(key: DedupKey, timetoken: Timetoken, channel: String, createdAt: Timetoken) {
        self.key = key
        self.timetoken = timetoken
        self.channel = channel
        self.createdAt = createdAt
    }
}

/// The `publish_request` table: one row per remembered (sub key, publisher, request id),
/// written in the same transaction as the message it belongs to, read back at start-up and
/// pruned with retention.
extension MessageStore {
    static func registerPublishRecordMigration(in migrator: inout DatabaseMigrator) {
        migrator.registerMigration("v5-publish-request") { db in
            try db.execute(sql: """
                CREATE TABLE publish_request (
                    sub_key TEXT NOT NULL,
                    publisher TEXT NOT NULL,
                    request_id TEXT NOT NULL,
                    timetoken INTEGER NOT NULL,
                    channel TEXT NOT NULL,
                    created_at INTEGER NOT NULL,
                    PRIMARY KEY (sub_key, publisher, request_id)
                ) WITHOUT ROWID;
                CREATE INDEX publish_request_age ON publish_request(created_at);
                """)
        }
    }

    /// Inserts records inside the writer's transaction. A key remembered again after its
    /// window replaces the old row.
    static func insert(_ records: [PublishRecord], into db: Database) throws {
        let statement = try db.cachedStatement(sql: """
            INSERT OR REPLACE INTO publish_request (sub_key, publisher, request_id, timetoken, channel, created_at)
            VALUES (?, ?, ?, ?, ?, ?)
            """)
        for r in records {
            try statement.execute(arguments: [
                r.key.subscribeKey, r.key.publisher, r.key.requestID, r.timetoken.storageValue, r.channel, r.createdAt.storageValue,
            ])
        }
    }

    /// The newest `limit` records created after `since`, oldest first (for the index at start-up).
    package func publishRecords(since: Timetoken, limit: Int) throws -> [PublishRecord] {
        try pool.read { db in
            try Row.fetchAll(db, sql: """
                SELECT * FROM publish_request WHERE created_at > ? ORDER BY created_at DESC LIMIT ?
                """, arguments: [since.storageValue, limit]).reversed().map { row in
                PublishRecord(key: DedupKey(subscribeKey: row["sub_key"], publisher: row["publisher"], requestID: row["request_id"]),
                              timetoken: Timetoken(UInt64(row["timetoken"] as Int64)), channel: row["channel"],
                              createdAt: Timetoken(UInt64(row["created_at"] as Int64)))
            }
        }
    }

    /// Deletes records created at or before `through`, at most `batchSize` per transaction,
    /// yielding between transactions (as ``pruneExpired(now:batchSize:afterBatch:)`` does).
    /// - Returns: the number of records removed.
    @discardableResult
    package func prunePublishRecords(through: Timetoken, batchSize: Int = 1000) async throws -> Int {
        var total = 0
        while true {
            let removed = try await pool.write { db -> Int in
                try db.execute(sql: """
                    DELETE FROM publish_request WHERE (sub_key, publisher, request_id) IN (
                        SELECT sub_key, publisher, request_id FROM publish_request WHERE created_at <= ? LIMIT ?)
                    """, arguments: [through.storageValue, batchSize])
                return db.changesCount
            }
            total += removed
            if removed < batchSize { return total }
            await Task.yield()
        }
    }

    /// Number of rows in `publish_request` (for tests and tools).
    package func publishRecordCount() async throws -> Int {
        try await pool.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM publish_request") ?? 0 }
    }
}
