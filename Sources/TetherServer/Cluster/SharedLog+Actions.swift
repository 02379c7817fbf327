import Logging
import PostgresNIO
@_spi(Benchmarks) package import TetherProtocol

/// Message actions in the cluster's PostgreSQL (`tether_message_action`): the same answers,
/// order and pages as the embedded store's `message_action`, seen by every node. Each action
/// references its message's event (`message_tt` → `tether_event(tt)`, `ON DELETE CASCADE`;
/// timetokens are unique in the log), so a history delete or retention removes it with its
/// message, in the same transaction, as the embedded store's foreign key does.
extension SharedLog: MessageActionStoring {
    package func addAction(_ action: StoredAction) async throws -> ActionAddOutcome {
        try await recordTransaction { connection in
            try await SharedLogActions(connection: connection, logger: self.logger).addAction(action)
        }
    }

    package func removeAction(subscribeKey: String, channel: String, messageTimetoken: Timetoken, actionTimetoken: Timetoken,
                              uuid: String?) async throws -> ActionRemoveOutcome {
        try await recordTransaction { connection in
            try await SharedLogActions(connection: connection, logger: self.logger).removeAction(
                subscribeKey: subscribeKey, channel: channel, messageTimetoken: messageTimetoken, actionTimetoken: actionTimetoken,
                uuid: uuid)
        }
    }

    package func actions(subscribeKey: String, channel: String, start: Timetoken?, end: Timetoken?, limit: Int) async throws
        -> (actions: [StoredAction], more: Bool)
    {
        let page = try await recordQuery { connection in
            try await SharedLogActions(connection: connection, logger: self.logger).actions(
                subscribeKey: subscribeKey, channel: channel, start: start, end: end, limit: limit)
        }
        return (page.actions, page.more)
    }

    package func actions(subscribeKey: String, channel: String, messagesFrom from: Timetoken, through: Timetoken, limit: Int)
        async throws -> [Timetoken: [StoredAction]]
    {
        try await recordQuery { connection in
            try await SharedLogActions(connection: connection, logger: self.logger).actions(
                subscribeKey: subscribeKey, channel: channel, messagesFrom: from, through: through, limit: limit)
        }
    }

    package func actionCount() async throws -> Int {
        try await recordQuery { connection in
            try await SharedLogActions(connection: connection, logger: self.logger).actionCount()
        }
    }

    /// Writes a message action and its event in ONE transaction: locks the sequencer, numbers
    /// the event above it, runs `write` with that timetoken (the action's own) on the same
    /// transaction, and — when `write` says so — inserts the event, raises the sequencer and
    /// wakes every node. The action's timetoken is its event's, unique in the cluster (a
    /// per-node numbering could collide), and the action and its event commit together or not
    /// at all. The sequencer row lock is held to the commit, as for publishes, so commit order
    /// and timetoken order still agree.
    ///
    /// - Throws: ``StoreError`` (`unavailable` when PostgreSQL cannot be reached): nothing was written.
    package func appendAfterWrite<Outcome: Sendable>(
        _ makeEnvelope: (Timetoken) -> SubscribeEnvelope,
        write: (Timetoken, any MessageActionStoring) async throws -> (deliver: Bool, outcome: Outcome)
    ) async throws -> (timetoken: Timetoken, outcome: Outcome) {
        let now = clock().storageValue
        let started = ContinuousClock.now
        let result: (Timetoken, Outcome, Bool) = try await recordTransaction { connection in
            let last = try await connection.query("SELECT last_tt FROM tether_sequencer WHERE id = 1 FOR UPDATE", logger: self.logger)
                .decode(Int64.self).first(where: { _ in true }) ?? 0
            let tt = max(last + 1, now)
            let timetoken = Timetoken(UInt64(tt))
            let written = try await write(timetoken, SharedLogActions(connection: connection, logger: self.logger))
            guard written.deliver else { return (timetoken, written.outcome, false) }
            let event = SharedEvent(envelope: makeEnvelope(timetoken), isStored: false, retentionHours: nil, dedupKey: nil)
            try await Self.insert([(tt, event)][...], now: now, ephemeralSeconds: self.options.ephemeralSeconds,
                                  connection: connection, logger: self.logger)
            try await connection.query("UPDATE tether_sequencer SET last_tt = \(tt) WHERE id = 1", logger: self.logger)
            try await connection.statement("SELECT pg_notify('tether_events', '')", logger: self.logger)
            return (timetoken, written.outcome, true)
        }
        if result.2 {
            metrics.recordStoreWrite(duration: ContinuousClock.now - started, batchSize: 1)
            readerBellContinuation.yield()
        }
        return (result.0, result.1)
    }
}

/// The message-action queries on one connection: the shared log's own conformance runs them
/// in a transaction of their own; ``SharedLog/appendAfterWrite(_:write:)`` hands them to its
/// write inside the transaction that numbers the action's event.
struct SharedLogActions: MessageActionStoring {
    let connection: PostgresConnection
    let logger: Logger

    private typealias Row = (String, String, Int64, Int64, String, String, String)
    private static let columns = "sub_key, channel, message_tt, action_tt, type, value, uuid"

    private func fetch(_ query: PostgresQuery) async throws -> [StoredAction] {
        var actions: [StoredAction] = []
        for try await (subscribeKey, channel, message, action, type, value, uuid) in try await connection.query(query, logger: logger)
            .decode(Row.self)
        {
            actions.append(StoredAction(subscribeKey: subscribeKey, channel: channel, messageTimetoken: Timetoken(UInt64(message)),
                                        actionTimetoken: Timetoken(UInt64(action)), type: type, value: value, uuid: uuid))
        }
        return actions
    }

    func addAction(_ action: StoredAction) async throws -> ActionAddOutcome {
        let message = action.messageTimetoken.storageValue
        // Only a stored message on that channel takes actions; the key-share lock keeps it
        // from being deleted before this transaction ends (a delete then takes the action too).
        let found = try await connection.query("""
            SELECT 1 FROM tether_event WHERE tt = \(message) AND stored AND sub_key = \(action.subscribeKey)
            AND channel = \(action.channel) FOR KEY SHARE
            """, logger: logger).decode(Int.self).first(where: { _ in true })
        guard found != nil else { return .messageNotFound }
        let inserted = try await connection.query("""
            INSERT INTO tether_message_action (sub_key, channel, message_tt, action_tt, type, value, uuid)
            VALUES (\(action.subscribeKey), \(action.channel), \(message), \(action.actionTimetoken.storageValue), \(action.type),
                    \(action.value), \(action.uuid))
            ON CONFLICT (sub_key, channel, message_tt, type, value, uuid) DO NOTHING RETURNING action_tt
            """, logger: logger).decode(Int64.self).first(where: { _ in true })
        return inserted == nil ? .duplicate : .added
    }

    func removeAction(subscribeKey: String, channel: String, messageTimetoken: Timetoken, actionTimetoken: Timetoken,
                      uuid: String?) async throws -> ActionRemoveOutcome {
        guard let action = try await fetch("""
            SELECT \(unescaped: Self.columns) FROM tether_message_action WHERE sub_key = \(subscribeKey) AND channel = \(channel)
            AND action_tt = \(actionTimetoken.storageValue) AND message_tt = \(messageTimetoken.storageValue) FOR UPDATE
            """).first
        else { return .notFound }
        if let uuid, action.uuid != uuid { return .wrongUUID }
        try await connection.query("""
            DELETE FROM tether_message_action WHERE sub_key = \(subscribeKey) AND channel = \(channel)
            AND action_tt = \(actionTimetoken.storageValue)
            """, logger: logger)
        return .removed(action)
    }

    func actions(subscribeKey: String, channel: String, start: Timetoken?, end: Timetoken?, limit: Int) async throws
        -> (actions: [StoredAction], more: Bool)
    {
        let rows = try await fetch("""
            SELECT \(unescaped: Self.columns) FROM tether_message_action WHERE sub_key = \(subscribeKey) AND channel = \(channel)
            AND (\(start?.storageValue)::bigint IS NULL OR action_tt < \(start?.storageValue))
            AND (\(end?.storageValue)::bigint IS NULL OR action_tt >= \(end?.storageValue))
            ORDER BY action_tt DESC LIMIT \(limit + 1)
            """)
        return (Array(rows.prefix(limit).reversed()), rows.count > limit)
    }

    func actions(subscribeKey: String, channel: String, messagesFrom from: Timetoken, through: Timetoken, limit: Int) async throws
        -> [Timetoken: [StoredAction]]
    {
        var result: [Timetoken: [StoredAction]] = [:]
        for action in try await fetch("""
            SELECT \(unescaped: Self.columns) FROM tether_message_action WHERE sub_key = \(subscribeKey) AND channel = \(channel)
            AND message_tt >= \(from.storageValue) AND message_tt <= \(through.storageValue) ORDER BY action_tt LIMIT \(limit)
            """)
        {
            result[action.messageTimetoken, default: []].append(action)
        }
        return result
    }

    func actionCount() async throws -> Int {
        try await connection.query("SELECT COUNT(*) FROM tether_message_action", logger: logger)
            .decode(Int.self).first(where: { _ in true }) ?? 0
    }
}
