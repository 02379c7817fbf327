import Foundation
import Logging
import PostgresNIO
@_spi(Benchmarks) package import TetherProtocol
@_spi(Benchmarks) package import TetherServerCore

/// History, catch-up, counts, deletion and retention on the shared log: the same queries and
/// the same answers as the embedded store's (both pass the store tests of `MessageReadingTests`).
extension SharedLog: MessageReading {
    private typealias Row = (Int64, String, String, Int, String?, String, String?, String?, Int?, Int64?)
    private static let columns = "tt, sub_key, channel, kind, publisher, payload, meta, custom_type, seqn, expires_at"

    private func messages(_ query: PostgresQuery) async throws -> [StoredMessage] {
        var result: [StoredMessage] = []
        do {
            for try await (tt, subscribeKey, channel, kind, publisher, payload, meta, customType, sequence, expires)
                in try await client.query(query, logger: logger).decode(Row.self)
            {
                result.append(StoredMessage(subscribeKey: subscribeKey, channel: channel, timetoken: Timetoken(UInt64(tt)),
                                            kind: EventKind(rawValue: kind) ?? .message, publisher: publisher, payload: payload,
                                            meta: meta, customMessageType: customType, sequence: sequence,
                                            expiresAt: expires.map { Timetoken(UInt64($0)) }))
            }
        } catch {
            throw Self.classify(error)
        }
        return result
    }

    /// Catch-up reads stored messages, and also, at or below ``startHorizon``, the events history
    /// does not keep (signals, `store=0` publishes) that the log still holds
    /// (``SharedLogOptions/ephemeralSeconds``): this node never had those in memory, so a
    /// subscriber arriving with a cursor from before it started would miss them.
    /// ``addingUnseenEventGaps(to:channels:prefixes:after:)`` reports the part the log may have
    /// pruned already.
    package func read(_ range: StoreRange, limit: Int) async throws -> StoreRangeResult {
        let started = ContinuousClock.now
        let after = range.after.storageValue
        let through = range.through.storageValue
        let unseen = startHorizon.storageValue
        let rows: [StoredMessage]
        switch range.selector {
        case .channel(let channel):
            rows = try await messages("""
                SELECT \(unescaped: Self.columns) FROM tether_event
                WHERE (stored OR (tt <= \(unseen) AND kind <> \(SharedControlCoding.kind)))
                AND sub_key = \(range.subscribeKey) AND channel = \(channel) AND tt > \(after) AND tt <= \(through)
                ORDER BY tt LIMIT \(limit)
                """)
        case .prefix(let prefix):
            let upper = String(prefix.dropLast()) + "/"
            rows = try await messages("""
                SELECT \(unescaped: Self.columns) FROM tether_event
                WHERE (stored OR (tt <= \(unseen) AND kind <> \(SharedControlCoding.kind)))
                AND sub_key = \(range.subscribeKey) AND channel > \(prefix) AND channel < \(upper)
                AND channel NOT LIKE '%-pnpres' AND tt > \(after) AND tt <= \(through)
                ORDER BY tt LIMIT \(limit)
                """)
        }
        metrics.recordStoreRead(duration: ContinuousClock.now - started)
        return StoreRangeResult(range: range, envelopes: rows.map(\.envelope), reachedLimit: rows.count >= limit)
    }

    package func retentionGaps(subscribeKey: String, channels: [String], prefixes: [String], after: Timetoken) async throws
        -> [RetentionGap]
    {
        let afterValue = after.storageValue
        var gaps: [RetentionGap] = []
        do {
            for channel in channels {
                for try await through in try await client.query("""
                    SELECT pruned_through FROM tether_retention_floor
                    WHERE sub_key = \(subscribeKey) AND channel = \(channel) AND pruned_through > \(afterValue)
                    """, logger: logger).decode(Int64.self)
                {
                    gaps.append(RetentionGap(channel: channel, from: after, through: Timetoken(UInt64(through))))
                }
            }
            for prefix in prefixes {
                let upper = String(prefix.dropLast()) + "/"
                for try await (channel, through) in try await client.query("""
                    SELECT channel, pruned_through FROM tether_retention_floor
                    WHERE sub_key = \(subscribeKey) AND channel > \(prefix) AND channel < \(upper) AND pruned_through > \(afterValue)
                    """, logger: logger).decode((String, Int64).self) where !channels.contains(channel)
                {
                    gaps.append(RetentionGap(channel: channel, from: after, through: Timetoken(UInt64(through))))
                }
            }
        } catch {
            throw Self.classify(error)
        }
        return gaps
    }

    /// Gaps in the events history does not keep (signals, `store=0` publishes), for a
    /// subscription read from `after`, added to ``retentionGaps(subscribeKey:channels:prefixes:after:)``'s
    /// (merged per name): below the horizon this node started at, such events were never in its
    /// memory and come from the log (``read(_:limit:)``), which prunes them
    /// ``SharedLogOptions/ephemeralSeconds`` after their timetoken. A cursor older than that (a
    /// minute of clock skew between nodes allowed) may have missed some: a gap through the part
    /// that may be gone, on every name of the subscription.
    package func addingUnseenEventGaps(to gaps: [RetentionGap], channels: [String], prefixes: [String], after: Timetoken)
        -> [RetentionGap]
    {
        let kept = clock().storageValue - Int64((options.ephemeralSeconds - 60) * 10_000_000)
        let mayBeGone = Timetoken(UInt64(max(0, min(startHorizon.storageValue, kept))))
        guard after < mayBeGone else { return gaps }
        var gaps = gaps
        for name in channels.filter({ !NameRules.isPresence($0) }) + prefixes.map({ $0 + "*" }) {
            if let index = gaps.firstIndex(where: { $0.channel == name }) {
                gaps[index].through = max(gaps[index].through, mayBeGone)
            } else {
                gaps.append(RetentionGap(channel: name, from: after, through: mayBeGone))
            }
        }
        return gaps
    }

    package func history(subscribeKey: String, channel: String, start: Timetoken?, end: Timetoken?, count: Int, reverse: Bool)
        async throws -> [StoredMessage]
    {
        var query: PostgresQuery = """
            SELECT \(unescaped: Self.columns) FROM tether_event WHERE stored AND sub_key = \(subscribeKey) AND channel = \(channel)
            """
        var binds = query.binds
        var sql = query.sql
        func bound(_ value: Timetoken) -> String {
            binds.append(value.storageValue)
            return "$\(binds.count)"
        }
        switch (start, end) {
        case (let s?, let e?):
            sql += s >= e ? " AND tt < \(bound(s)) AND tt >= \(bound(e))" : " AND tt > \(bound(s)) AND tt <= \(bound(e))"
        case (let s?, nil):
            sql += " AND tt < \(bound(s))"
        case (nil, let e?):
            sql += " AND tt >= \(bound(e))"
        case (nil, nil):
            break
        }
        binds.append(count)
        // With both bounds PubNub ignores `reverse`: the newest `count` of the range.
        let oldestFirst = reverse && (start == nil || end == nil)
        sql += " ORDER BY tt \(oldestFirst ? "ASC" : "DESC") LIMIT $\(binds.count)"
        query = PostgresQuery(unsafeSQL: sql, binds: binds)
        let rows = try await messages(query)
        return oldestFirst ? rows : rows.reversed()
    }

    package func messageCounts(subscribeKey: String, channels: [(String, Timetoken)], through: Timetoken?) async throws
        -> [String: Int]
    {
        var counts: [String: Int] = [:]
        let upper = (through ?? Timetoken.maximumStorable).storageValue
        do {
            for (channel, after) in channels {
                counts[channel] = try await client.query("""
                    SELECT COUNT(*) FROM (SELECT 1 FROM tether_event WHERE stored AND sub_key = \(subscribeKey)
                    AND channel = \(channel) AND tt > \(after.storageValue) AND tt <= \(upper) LIMIT 10000) counted
                    """, logger: logger).decode(Int.self).first(where: { _ in true }) ?? 0
            }
        } catch {
            throw Self.classify(error)
        }
        return counts
    }

    @discardableResult
    package func delete(subscribeKey: String, channel: String, start: Timetoken?, end: Timetoken?) async throws -> Int {
        let base: PostgresQuery = """
            DELETE FROM tether_event WHERE stored AND sub_key = \(subscribeKey) AND channel = \(channel)
            """
        var binds = base.binds
        var sql = base.sql
        func bound(_ value: Timetoken) -> String {
            binds.append(value.storageValue)
            return "$\(binds.count)"
        }
        switch (start, end) {
        case (let s?, let e?) where s > e: sql += " AND tt < \(bound(s)) AND tt >= \(bound(e))"
        case (let s?, let e?): sql += " AND tt > \(bound(s)) AND tt <= \(bound(e))"
        case (let s?, nil): sql += " AND tt > \(bound(s))"
        case (nil, let e?): sql += " AND tt <= \(bound(e))"
        case (nil, nil): break
        }
        sql += " RETURNING tt"
        do {
            var deleted = 0
            for try await _ in try await client.query(PostgresQuery(unsafeSQL: sql, binds: binds), logger: logger).decode(Int64.self) {
                deleted += 1
            }
            return deleted
        } catch {
            throw Self.classify(error)
        }
    }

    package func messageCount() async throws -> Int {
        do {
            return try await client.query("SELECT COUNT(*) FROM tether_event WHERE stored", logger: logger)
                .decode(Int.self).first(where: { _ in true }) ?? 0
        } catch {
            throw Self.classify(error)
        }
    }

    /// Removes events whose time in the log has ended — stored messages past retention (the
    /// channel's retention floor records how far), other events once every node has had them
    /// for ``SharedLogOptions/ephemeralSeconds`` — at most `batchSize` per transaction. Nodes
    /// may prune at the same time: each skips the rows another is deleting.
    @discardableResult
    package func pruneExpired(now: Timetoken, batchSize: Int = 1000) async throws -> Int {
        var total = 0
        do {
            while true {
                let removed = try await client.transaction(logger: logger) { connection in
                    var floors: [String: (String, String, Int64)] = [:]
                    var count = 0
                    for try await (subscribeKey, channel, tt, stored) in try await connection.query("""
                        DELETE FROM tether_event WHERE tt IN (
                          SELECT tt FROM tether_event WHERE expires_at IS NOT NULL AND expires_at <= \(now.storageValue)
                          ORDER BY expires_at LIMIT \(batchSize) FOR UPDATE SKIP LOCKED)
                        RETURNING sub_key, channel, tt, stored
                        """, logger: self.logger).decode((String, String, Int64, Bool).self)
                    {
                        count += 1
                        guard stored else { continue }
                        let key = subscribeKey + "\u{0}" + channel
                        floors[key] = (subscribeKey, channel, max(floors[key]?.2 ?? tt, tt))
                    }
                    for (subscribeKey, channel, through) in floors.values {
                        try await connection.query("""
                            INSERT INTO tether_retention_floor (sub_key, channel, pruned_through) VALUES (\(subscribeKey), \(channel), \(through))
                            ON CONFLICT (sub_key, channel) DO UPDATE
                            SET pruned_through = GREATEST(tether_retention_floor.pruned_through, excluded.pruned_through)
                            """, logger: self.logger)
                    }
                    return count
                }
                total += removed
                if removed < batchSize { return total }
                await Task.yield()
            }
        } catch {
            throw Self.classify(error)
        }
    }

    /// Forgets request ids remembered at or before `through` (the deduplication window's edge).
    @discardableResult
    package func prunePublishRecords(through: Timetoken) async throws -> Int {
        do {
            var deleted = 0
            for try await _ in try await client.query("""
                DELETE FROM tether_publish_record WHERE created_at <= \(through.storageValue) RETURNING tt
                """, logger: logger).decode(Int64.self)
            {
                deleted += 1
            }
            return deleted
        } catch {
            throw Self.classify(error)
        }
    }

    /// Request ids remembered in the log (for tests and tools).
    package func publishRecordCount() async throws -> Int {
        try await client.query("SELECT COUNT(*) FROM tether_publish_record", logger: logger)
            .decode(Int.self).first(where: { _ in true }) ?? 0
    }
}

/// Where stored messages are read: the embedded SQLite store (``MessageStore``), or a
/// cluster's shared log in PostgreSQL (``SharedLog``). History, catch-up, counts and deletion
/// go through this, so both answer the same way.
package protocol MessageReading: Sendable {
    func read(_ range: StoreRange, limit: Int) async throws -> StoreRangeResult
    func retentionGaps(subscribeKey: String, channels: [String], prefixes: [String], after: Timetoken) async throws -> [RetentionGap]
    func history(subscribeKey: String, channel: String, start: Timetoken?, end: Timetoken?, count: Int, reverse: Bool)
        async throws -> [StoredMessage]
    func messageCounts(subscribeKey: String, channels: [(String, Timetoken)], through: Timetoken?) async throws -> [String: Int]
    @discardableResult
    func delete(subscribeKey: String, channel: String, start: Timetoken?, end: Timetoken?) async throws -> Int
    func messageCount() async throws -> Int
}

extension MessageStore: MessageReading {}
