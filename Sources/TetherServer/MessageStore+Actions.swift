import GRDB
@_spi(Benchmarks) package import TetherProtocol

/// One message action (a reaction, a receipt, an edit marker): a `type`/`value` pair a user
/// attached to a stored message (docs/protocol.md, "Message actions").
package struct StoredAction: Sendable, Hashable {
    package var subscribeKey: String
    package var channel: String
    /// The message it belongs to.
    package var messageTimetoken: Timetoken
    /// Its own timetoken, unique, from the server's sequencer.
    package var actionTimetoken: Timetoken
    package var type: String
    package var value: String
    /// Who added it.
    package var uuid: String

    package init(subscribeKey: String, channel: String, messageTimetoken: Timetoken, actionTimetoken: Timetoken, type: String,
                 value: String, uuid: String) {
        self.subscribeKey = subscribeKey
        self.channel = channel
        self.messageTimetoken = messageTimetoken
        self.actionTimetoken = actionTimetoken
        self.type = type
        self.value = value
        self.uuid = uuid
    }

    init(row: Row) {
        subscribeKey = row["sub_key"]
        channel = row["channel"]
        messageTimetoken = Timetoken(UInt64(row["message_tt"] as Int64))
        actionTimetoken = Timetoken(UInt64(row["action_tt"] as Int64))
        type = row["type"]
        value = row["value"]
        uuid = row["uuid"]
    }
}

/// What adding an action came to.
package enum ActionAddOutcome: Sendable, Equatable {
    case added
    /// No stored message has that timetoken on that channel.
    case messageNotFound
    /// The same uuid already added the same type and value to that message.
    case duplicate
}

/// What removing an action came to.
package enum ActionRemoveOutcome: Sendable, Equatable {
    case removed(StoredAction)
    /// The action exists but another uuid added it.
    case wrongUUID
    /// No such action on that message.
    case notFound
}

/// The `message_action` table. Each row references its message with `ON DELETE CASCADE`, so
/// an action leaves the store with its message — a history delete or retention — in the same
/// transaction.
extension MessageStore {
    static func registerActionMigration(in migrator: inout DatabaseMigrator) {
        migrator.registerMigration("v6-message-actions") { db in
            try db.execute(sql: """
                CREATE TABLE message_action (
                    sub_key TEXT NOT NULL,
                    channel TEXT NOT NULL,
                    message_tt INTEGER NOT NULL,
                    action_tt INTEGER NOT NULL,
                    type TEXT NOT NULL,
                    value TEXT NOT NULL,
                    uuid TEXT NOT NULL,
                    PRIMARY KEY (sub_key, channel, action_tt),
                    UNIQUE (sub_key, channel, message_tt, type, value, uuid),
                    FOREIGN KEY (sub_key, channel, message_tt) REFERENCES message(sub_key, channel, timetoken) ON DELETE CASCADE
                ) WITHOUT ROWID;
                """)
        }
    }

    /// Stores `action` unless its message is missing or it repeats an action of the same uuid.
    /// Also raises the stored highest timetoken, so the sequencer never reissues the action's.
    package func addAction(_ action: StoredAction) async throws -> ActionAddOutcome {
        try await pool.write { db in
            let key: [any DatabaseValueConvertible] = [action.subscribeKey, action.channel, action.messageTimetoken.storageValue]
            guard try Bool.fetchOne(db, sql: "SELECT 1 FROM message WHERE sub_key = ? AND channel = ? AND timetoken = ?",
                                    arguments: StatementArguments(key)) == true else { return .messageNotFound }
            if try Bool.fetchOne(db, sql: """
                SELECT 1 FROM message_action WHERE sub_key = ? AND channel = ? AND message_tt = ? AND type = ? AND value = ? AND uuid = ?
                """, arguments: StatementArguments(key + [action.type, action.value, action.uuid])) == true {
                return .duplicate
            }
            try db.execute(sql: """
                INSERT INTO message_action (sub_key, channel, message_tt, action_tt, type, value, uuid) VALUES (?, ?, ?, ?, ?, ?, ?)
                """, arguments: StatementArguments(key + [action.actionTimetoken.storageValue, action.type, action.value, action.uuid]))
            try db.execute(sql: """
                INSERT INTO server_state (key, value) VALUES ('highest_timetoken', ?)
                ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)
                """, arguments: [action.actionTimetoken.storageValue])
            return .added
        }
    }

    /// Removes the action `actionTimetoken` of message `messageTimetoken` when `uuid` (or, with
    /// `uuid` nil — an operator — anybody) added it.
    package func removeAction(subscribeKey: String, channel: String, messageTimetoken: Timetoken, actionTimetoken: Timetoken,
                              uuid: String?) async throws -> ActionRemoveOutcome {
        try await pool.write { db in
            guard let row = try Row.fetchOne(db, sql: """
                SELECT * FROM message_action WHERE sub_key = ? AND channel = ? AND action_tt = ? AND message_tt = ?
                """, arguments: [subscribeKey, channel, actionTimetoken.storageValue, messageTimetoken.storageValue])
            else { return .notFound }
            let action = StoredAction(row: row)
            if let uuid, action.uuid != uuid { return .wrongUUID }
            try db.execute(sql: "DELETE FROM message_action WHERE sub_key = ? AND channel = ? AND action_tt = ?",
                           arguments: [subscribeKey, channel, actionTimetoken.storageValue])
            return .removed(action)
        }
    }

    /// A channel's actions with `end <= actionTimetoken < start` (either bound optional): the
    /// newest `limit`, returned oldest first, and whether older ones remain in the range.
    package func actions(subscribeKey: String, channel: String, start: Timetoken?, end: Timetoken?, limit: Int) async throws
        -> (actions: [StoredAction], more: Bool)
    {
        try await pool.read { db in
            var sql = "SELECT * FROM message_action WHERE sub_key = ? AND channel = ?"
            var arguments: [any DatabaseValueConvertible] = [subscribeKey, channel]
            if let start {
                sql += " AND action_tt < ?"
                arguments.append(start.storageValue)
            }
            if let end {
                sql += " AND action_tt >= ?"
                arguments.append(end.storageValue)
            }
            sql += " ORDER BY action_tt DESC LIMIT ?"
            arguments.append(limit + 1)
            let rows = try Row.fetchAll(db, sql: sql, arguments: StatementArguments(arguments)).map(StoredAction.init(row:))
            return (Array(rows.prefix(limit).reversed()), rows.count > limit)
        }
    }

    /// The actions of messages `from...through` of a channel, by message timetoken, each
    /// message's oldest first, at most `limit` in all (for history with actions; the bound
    /// keeps one page's response bounded however many reactions its messages collected).
    package func actions(subscribeKey: String, channel: String, messagesFrom from: Timetoken, through: Timetoken,
                         limit: Int = 5000) async throws -> [Timetoken: [StoredAction]]
    {
        try await pool.read { db in
            var result: [Timetoken: [StoredAction]] = [:]
            let rows = try Row.fetchAll(db, sql: """
                SELECT * FROM message_action WHERE sub_key = ? AND channel = ? AND message_tt >= ? AND message_tt <= ?
                ORDER BY action_tt LIMIT ?
                """, arguments: [subscribeKey, channel, from.storageValue, through.storageValue, limit])
            for row in rows {
                let action = StoredAction(row: row)
                result[action.messageTimetoken, default: []].append(action)
            }
            return result
        }
    }

    /// Number of stored actions (for tests and tools).
    package func actionCount() async throws -> Int {
        try await pool.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM message_action") ?? 0 }
    }
}
