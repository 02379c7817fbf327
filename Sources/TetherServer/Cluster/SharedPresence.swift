import Foundation
import Logging
import PostgresNIO
import Synchronization
@_spi(Benchmarks) import TetherProtocol
import TetherServerCore

/// Presence of a cluster, kept in PostgreSQL (docs/operations.md, "Presence across nodes").
///
/// **PostgreSQL is the truth.** Each membership is a row of `tether_presence` with its deadline
/// (Unix milliseconds on the node clock that took the heartbeat), timeout and state, written by
/// whichever node got the request. Here-now, where-now and get-state read the table, so every
/// node's occupants count once.
///
/// **Each event once.** A change and its events commit in one transaction: the membership rows
/// are locked (or inserted) first, then the events are numbered and inserted into the shared log
/// (``SharedLog/appendWithin(_:count:_:)``). So an event exists exactly when its change does,
/// every node delivers it once, and two changes of one membership are delivered in the order
/// they committed. A join is a heartbeat whose `INSERT … ON CONFLICT DO NOTHING` inserted the
/// row (or found only state set ahead of a join); a leave is a `DELETE` that deleted one.
///
/// **Timeouts once.** Every node sweeps once a second: `DELETE` of rows past their deadline,
/// picked with `FOR UPDATE SKIP LOCKED`, so each expired row is deleted — and its timeout
/// announced — by exactly one node; a node that dies leaves its rows to the others' sweeps.
///
/// **Interval mode.** A channel above announce-max collects its joins, leaves and timeouts in a
/// row of `tether_presence_interval`; the node whose sweep takes the row when the interval ends
/// announces the interval event, as the tracker does on one node.
///
/// **Lock order.** Rows are locked in channel order (membership rows, then interval rows, then
/// the log's sequencer), and sweeps skip locked rows, so requests do not deadlock one another.
///
/// **Few writes.** A heartbeat that would only move a deadline this node wrote itself, with more
/// than half the timeout left, writes nothing (a per-node cache of what it wrote, forgotten on
/// a leave or timeout seen in the log).
final class SharedPresence: Sendable {
    let log: SharedLog
    /// The node's clock in Unix milliseconds (the server's injectable clock, anchored to the wall
    /// clock at start): nodes are assumed to have roughly synchronised wall clocks.
    private let now: @Sendable () -> Int64
    private let written: Mutex<[MembershipKey: Written]>
    /// The most entries the write cache holds (beyond it heartbeats simply write).
    private let cacheLimit: Int
    private let configurations: [String: PresenceConfiguration]
    private var logger: Logger { log.logger }

    private struct MembershipKey: Hashable, Sendable {
        var subscribeKey: String
        var channel: String
        var uuid: String
    }

    /// What this node last wrote for a membership.
    private struct Written: Sendable {
        var deadline: Int64
        var timeout: Int64
    }

    init(log: SharedLog, now: @escaping @Sendable () -> Int64, configurations: [String: PresenceConfiguration] = [:],
         cacheLimit: Int = PresenceTracker.defaultMaximumMemberships) {
        self.log = log
        self.configurations = configurations
        self.now = now
        self.cacheLimit = cacheLimit
        self.written = Mutex([:])
    }

    static func milliseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return seconds * 1000 + attoseconds / 1_000_000_000_000_000
    }

    // MARK: Changes

    /// A heartbeat on concrete channels: joins where the uuid was absent, moves the deadline,
    /// sets the given states; announces joins and state changes.
    func heartbeat(subscribeKey: String, uuid: String, channels: [String], timeout: Duration, states: [String: String]) async throws {
        let nowMs = now()
        let timeoutMs = Self.milliseconds(timeout)
        let deadline = nowMs + timeoutMs
        let due = written.withLock { cache in
            channels.filter { channel in
                guard states[channel] == nil,
                      let entry = cache[MembershipKey(subscribeKey: subscribeKey, channel: channel, uuid: uuid)] else { return true }
                return entry.timeout != timeoutMs || (entry.deadline - nowMs) * 2 < timeoutMs
            }
        }
        guard !due.isEmpty else { return }
        let hasState = due.map { states[$0] != nil }
        let stateValues = due.map { states[$0] ?? "" }
        try await transaction { connection in
            var joined: [String] = []
            var changedState: [String] = []
            var pending = due
            var attempts = 0
            // A row deleted (leave, timeout) between the insert and the lock is inserted again.
            while !pending.isEmpty, attempts < 3 {
                attempts += 1
                let pendingState = pending.map { states[$0] ?? "" }
                let pendingHasState = pending.map { states[$0] != nil }
                let inserted = try await Self.strings(connection.query("""
                    INSERT INTO tether_presence (sub_key, channel, uuid, deadline_ms, timeout_ms, state)
                    SELECT \(subscribeKey), t.c, \(uuid), \(deadline), \(timeoutMs), CASE WHEN t.h THEN t.s END
                    FROM unnest(\(pending)::text[], \(pendingState)::text[], \(pendingHasState)::bool[]) AS t(c, s, h)
                    ON CONFLICT DO NOTHING RETURNING channel
                    """, logger: logger))
                joined += inserted
                changedState += inserted.filter { states[$0] != nil }
                let rest = pending.filter { !inserted.contains($0) }
                pending = []
                guard !rest.isEmpty else { break }
                var found: Set<String> = []
                for try await (channel, oldDeadline, oldState) in try await connection.query("""
                    SELECT channel, deadline_ms, state FROM tether_presence
                    WHERE sub_key = \(subscribeKey) AND uuid = \(uuid) AND channel = ANY(\(rest)::text[])
                    ORDER BY channel FOR UPDATE
                    """, logger: logger).decode((String, Int64?, String?).self)
                {
                    found.insert(channel)
                    if oldDeadline == nil { joined.append(channel) }
                    if let state = states[channel], state != oldState { changedState.append(channel) }
                }
                pending = rest.filter { !found.contains($0) }
            }
            try await connection.query("""
                UPDATE tether_presence p SET deadline_ms = \(deadline), timeout_ms = \(timeoutMs),
                  state = CASE WHEN t.h THEN t.s ELSE p.state END
                FROM unnest(\(due)::text[], \(stateValues)::text[], \(hasState)::bool[]) AS t(c, s, h)
                WHERE p.sub_key = \(subscribeKey) AND p.uuid = \(uuid) AND p.channel = t.c
                """, logger: logger)
            var events: [PresenceEvent] = []
            let eventChannels = Array(Set(joined).union(changedState)).sorted()
            let counts = try await Self.occupancies(subscribeKey: subscribeKey, channels: eventChannels, connection, logger)
            for channel in eventChannels {
                let key = ChannelKey(subscribeKey: subscribeKey, channel: channel)
                let occupancy = counts[channel] ?? 0
                if joined.contains(channel) {
                    events.append(PresenceEvent(key, .join, uuid: uuid, occupancy: occupancy, state: nil))
                }
                if let state = states[channel], changedState.contains(channel) {
                    events.append(PresenceEvent(key, .stateChange, uuid: uuid, occupancy: occupancy, state: state))
                }
            }
            try await self.announce(events, connection)
        }
        written.withLock { cache in
            for channel in due {
                let key = MembershipKey(subscribeKey: subscribeKey, channel: channel, uuid: uuid)
                if cache[key] != nil || cache.count < cacheLimit { cache[key] = Written(deadline: deadline, timeout: timeoutMs) }
            }
        }
    }

    /// Moves the deadline where the uuid is still present (the end of a long-poll); never joins.
    func refresh(subscribeKey: String, uuid: String, channels: [String], timeout: Duration) async throws {
        let nowMs = now()
        let timeoutMs = Self.milliseconds(timeout)
        let deadline = nowMs + timeoutMs
        let due = written.withLock { cache in
            channels.filter { channel in
                guard let entry = cache[MembershipKey(subscribeKey: subscribeKey, channel: channel, uuid: uuid)] else { return true }
                return entry.timeout != timeoutMs || (entry.deadline - nowMs) * 2 < timeoutMs
            }
        }
        guard !due.isEmpty else { return }
        let moved: [String]
        do {
            moved = try await Self.strings(log.client.query("""
                UPDATE tether_presence SET deadline_ms = \(deadline), timeout_ms = \(timeoutMs)
                WHERE sub_key = \(subscribeKey) AND uuid = \(uuid) AND channel = ANY(\(due)::text[]) AND deadline_ms IS NOT NULL
                RETURNING channel
                """, logger: logger))
        } catch {
            throw SharedLog.classify(error)
        }
        written.withLock { cache in
            for channel in moved {
                let key = MembershipKey(subscribeKey: subscribeKey, channel: channel, uuid: uuid)
                if cache[key] != nil || cache.count < cacheLimit { cache[key] = Written(deadline: deadline, timeout: timeoutMs) }
            }
        }
    }

    /// An explicit leave: deletes the memberships and announces each one deleted.
    func leave(subscribeKey: String, uuid: String, channels: [String]) async throws {
        guard !channels.isEmpty else { return }
        forget(subscribeKey: subscribeKey, uuid: uuid, channels: channels)
        try await transaction { connection in
            var removed: [(channel: String, state: String?)] = []
            for try await (channel, state) in try await connection.query("""
                DELETE FROM tether_presence
                WHERE sub_key = \(subscribeKey) AND uuid = \(uuid) AND channel = ANY(\(channels)::text[]) AND deadline_ms IS NOT NULL
                RETURNING channel, state
                """, logger: logger).decode((String, String?).self)
            {
                removed.append((channel, state))
            }
            removed.sort { $0.channel < $1.channel }
            let counts = try await Self.occupancies(subscribeKey: subscribeKey, channels: removed.map(\.channel), connection, logger)
            try await self.announce(removed.map { entry in
                PresenceEvent(ChannelKey(subscribeKey: subscribeKey, channel: entry.channel), .leave, uuid: uuid,
                              occupancy: counts[entry.channel] ?? 0, state: entry.state)
            }, connection)
        }
    }

    /// Sets state on concrete channels (kept ahead of a join where the uuid is absent);
    /// announces a state change where it is present and the state differs.
    func setState(subscribeKey: String, uuid: String, channels: [String], state: String) async throws {
        guard !channels.isEmpty else { return }
        try await transaction { connection in
            let inserted = try await Self.strings(connection.query("""
                INSERT INTO tether_presence (sub_key, channel, uuid, deadline_ms, timeout_ms, state)
                SELECT \(subscribeKey), c, \(uuid), NULL, 0, \(state) FROM unnest(\(channels)::text[]) AS t(c)
                ON CONFLICT DO NOTHING RETURNING channel
                """, logger: logger))
            let rest = channels.filter { !inserted.contains($0) }
            guard !rest.isEmpty else { return }
            var changed: [String] = []
            for try await (channel, deadline, oldState) in try await connection.query("""
                SELECT channel, deadline_ms, state FROM tether_presence
                WHERE sub_key = \(subscribeKey) AND uuid = \(uuid) AND channel = ANY(\(rest)::text[])
                    ORDER BY channel FOR UPDATE
                """, logger: logger).decode((String, Int64?, String?).self)
            where deadline != nil && oldState != state {
                changed.append(channel)
            }
            try await connection.query("""
                UPDATE tether_presence SET state = \(state)
                WHERE sub_key = \(subscribeKey) AND uuid = \(uuid) AND channel = ANY(\(rest)::text[])
                """, logger: logger)
            changed.sort()
            let counts = try await Self.occupancies(subscribeKey: subscribeKey, channels: changed, connection, logger)
            try await self.announce(changed.map { channel in
                PresenceEvent(ChannelKey(subscribeKey: subscribeKey, channel: channel), .stateChange, uuid: uuid,
                              occupancy: counts[channel] ?? 0, state: state)
            }, connection)
        }
    }

    /// Deletes memberships past their deadline, at most `limit` per call, and announces their
    /// timeouts; rows another node is sweeping (or a request is changing) are skipped. Returns
    /// how many it removed.
    @discardableResult
    func sweep(limit: Int = 1000) async throws -> Int {
        let nowMs = now()
        written.withLock { cache in cache = cache.filter { $0.value.deadline > nowMs } }
        var count = 0
        try await transaction { connection in
            var removed: [(subscribeKey: String, channel: String, uuid: String, state: String?, deadline: Int64)] = []
            for try await row in try await connection.query("""
                DELETE FROM tether_presence p USING (
                  SELECT sub_key, channel, uuid FROM tether_presence
                  WHERE deadline_ms IS NOT NULL AND deadline_ms <= \(nowMs)
                  ORDER BY deadline_ms LIMIT \(limit) FOR UPDATE SKIP LOCKED
                ) due
                WHERE p.sub_key = due.sub_key AND p.channel = due.channel AND p.uuid = due.uuid
                RETURNING p.sub_key, p.channel, p.uuid, p.state, p.deadline_ms
                """, logger: logger).decode((String, String, String, String?, Int64).self)
            {
                removed.append(row)
            }
            count = removed.count
            guard !removed.isEmpty else { return }
            // The order they came due; each event's occupancy counts the members still left.
            removed.sort { ($0.deadline, $0.subscribeKey, $0.channel, $0.uuid) < ($1.deadline, $1.subscribeKey, $1.channel, $1.uuid) }
            var remaining: [ChannelKey: Int] = [:]
            for (subscribeKey, group) in Dictionary(grouping: removed, by: \.subscribeKey) {
                let counts = try await Self.occupancies(subscribeKey: subscribeKey, channels: Array(Set(group.map(\.channel))),
                                                        connection, logger)
                for entry in group {
                    remaining[ChannelKey(subscribeKey: subscribeKey, channel: entry.channel), default: counts[entry.channel] ?? 0] += 1
                }
            }
            var events: [PresenceEvent] = []
            for entry in removed {
                let key = ChannelKey(subscribeKey: entry.subscribeKey, channel: entry.channel)
                remaining[key, default: 1] -= 1
                events.append(PresenceEvent(key, .timeout, uuid: entry.uuid, occupancy: remaining[key] ?? 0,
                                            state: entry.state))
            }
            try await self.announce(events, connection)
        }
        try await transaction { connection in try await self.endIntervals(now: nowMs, limit: limit, connection) }
        return count
    }

    private func configuration(for subscribeKey: String) -> PresenceConfiguration {
        configurations[subscribeKey] ?? PresenceConfiguration()
    }

    /// Ends the due intervals of crowded channels (as the tracker's `endInterval`): one interval
    /// event each, with the interval's deltas; the channel stays in interval mode while above
    /// announce-max. Rows another node is ending are skipped.
    private func endIntervals(now nowMs: Int64, limit: Int, _ connection: PostgresConnection) async throws {
        var due: [(subscribeKey: String, channel: String, joined: [String], left: [String], timedOut: [String])] = []
        for try await row in try await connection.query("""
            SELECT sub_key, channel, joined, left_, timed_out FROM tether_presence_interval
            WHERE next_ms <= \(nowMs) ORDER BY next_ms LIMIT \(limit) FOR UPDATE SKIP LOCKED
            """, logger: logger).decode((String, String, [String], [String], [String]).self)
        {
            due.append(row)
        }
        guard !due.isEmpty else { return }
        var events: [PresenceEvent] = []
        for (subscribeKey, group) in Dictionary(grouping: due, by: \.subscribeKey) {
            let config = configuration(for: subscribeKey)
            let counts = try await Self.occupancies(subscribeKey: subscribeKey, channels: group.map(\.channel), connection, logger)
            for entry in group.sorted(by: { $0.channel < $1.channel }) {
                let occupancy = counts[entry.channel] ?? 0
                let refresh = entry.joined.count + entry.left.count + entry.timedOut.count > config.maximumIntervalDelta
                events.append(PresenceEvent(ChannelKey(subscribeKey: subscribeKey, channel: entry.channel),
                                            .interval(join: entry.joined, leave: entry.left, timeout: entry.timedOut, hereNowRefresh: refresh),
                                            uuid: nil, occupancy: occupancy, state: nil))
                if occupancy > config.announceMax {
                    try await connection.query("""
                        UPDATE tether_presence_interval SET next_ms = \(nowMs + Self.milliseconds(config.interval)),
                          joined = '{}', left_ = '{}', timed_out = '{}'
                        WHERE sub_key = \(subscribeKey) AND channel = \(entry.channel)
                        """, logger: logger)
                } else {
                    try await connection.query("""
                        DELETE FROM tether_presence_interval WHERE sub_key = \(subscribeKey) AND channel = \(entry.channel)
                        """, logger: logger)
                }
            }
        }
        try await announce(events, connection)
    }

    /// Forgets what this node wrote for memberships that ended (so the next heartbeat writes
    /// and joins again).
    func forget(subscribeKey: String, uuid: String, channels: [String]) {
        written.withLock { cache in
            for channel in channels { cache[MembershipKey(subscribeKey: subscribeKey, channel: channel, uuid: uuid)] = nil }
        }
    }

    /// Forgets every membership this node wrote on `channel`.
    private func forgetChannel(subscribeKey: String, channel: String) {
        written.withLock { cache in
            cache = cache.filter { $0.key.subscribeKey != subscribeKey || $0.key.channel != channel }
        }
    }

    /// Forgets the memberships a delivered presence event ended: a leave or timeout (from any
    /// node), or every membership of a channel named by an event this node cannot read.
    func observe(_ events: [BufferedEvent]) {
        for event in events {
            let envelope = event.envelope
            guard envelope.kind == .message, envelope.channel.hasSuffix(NameRules.presenceSuffix) else { continue }
            let channel = String(envelope.channel.dropLast(NameRules.presenceSuffix.count))
            let payload = envelope.payload
            if payload.hasPrefix(#"{"action":"interval""#) {
                // A crowded channel announces leaves and timeouts in its interval events; one
                // that says here-now must be asked again names nobody, so every membership this
                // node wrote on the channel is forgotten.
                guard let data = payload.data(using: .utf8),
                      let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else {
                    forgetChannel(subscribeKey: envelope.subscribeKey, channel: channel)
                    continue
                }
                if object["here_now_refresh"] as? Bool == true {
                    forgetChannel(subscribeKey: envelope.subscribeKey, channel: channel)
                    continue
                }
                let ended = ((object["leave"] as? [String]) ?? []) + ((object["timeout"] as? [String]) ?? [])
                for uuid in ended { forget(subscribeKey: envelope.subscribeKey, uuid: uuid, channels: [channel]) }
                continue
            }
            guard payload.hasPrefix(#"{"action":"leave""#) || payload.hasPrefix(#"{"action":"timeout""#) else { continue }
            guard let uuid = Self.uuid(in: payload) else { continue }
            forget(subscribeKey: envelope.subscribeKey, uuid: uuid, channels: [channel])
        }
    }

    /// The `uuid` of a presence payload written by ``PresenceEvent/payload(timestamp:)``.
    private static func uuid(in payload: String) -> String? {
        guard let data = payload.data(using: .utf8),
              let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else { return nil }
        return object["uuid"] as? String
    }

    // MARK: Reads

    /// Occupants (sorted, with their states) of each channel that has any.
    func occupants(subscribeKey: String, channels: [String]) async throws -> [String: [(uuid: String, state: String?)]] {
        guard !channels.isEmpty else { return [:] }
        var result: [String: [(uuid: String, state: String?)]] = [:]
        do {
            for try await (channel, uuid, state) in try await log.client.query("""
                SELECT channel, uuid, state FROM tether_presence
                WHERE sub_key = \(subscribeKey) AND channel = ANY(\(channels)::text[]) AND deadline_ms IS NOT NULL
                """, logger: logger).decode((String, String, String?).self)
            {
                result[channel, default: []].append((uuid, state))
            }
        } catch {
            throw SharedLog.classify(error)
        }
        for channel in result.keys { result[channel]?.sort { $0.uuid < $1.uuid } }
        return result
    }

    /// The occupancy of each channel that has occupants.
    func occupancies(subscribeKey: String, channels: [String]) async throws -> [String: Int] {
        do {
            return try await log.client.withConnection { connection in
                try await Self.occupancies(subscribeKey: subscribeKey, channels: channels, connection, self.logger)
            }
        } catch {
            throw SharedLog.classify(error)
        }
    }

    /// Every channel of a keyset with at least one occupant, sorted.
    func occupiedChannels(subscribeKey: String) async throws -> [String] {
        do {
            return try await Self.strings(log.client.query("""
                SELECT DISTINCT channel FROM tether_presence WHERE sub_key = \(subscribeKey) AND deadline_ms IS NOT NULL
                """, logger: logger)).sorted()
        } catch {
            throw SharedLog.classify(error)
        }
    }

    /// The channels `uuid` is present on, sorted.
    func channels(subscribeKey: String, uuid: String) async throws -> [String] {
        do {
            return try await Self.strings(log.client.query("""
                SELECT channel FROM tether_presence WHERE sub_key = \(subscribeKey) AND uuid = \(uuid) AND deadline_ms IS NOT NULL
                """, logger: logger)).sorted()
        } catch {
            throw SharedLog.classify(error)
        }
    }

    /// `uuid`'s state on each of `channels` where it has one (present or set ahead of a join).
    func states(subscribeKey: String, uuid: String, channels: [String]) async throws -> [String: String] {
        guard !channels.isEmpty else { return [:] }
        var result: [String: String] = [:]
        do {
            for try await (channel, state) in try await log.client.query("""
                SELECT channel, state FROM tether_presence
                WHERE sub_key = \(subscribeKey) AND uuid = \(uuid) AND channel = ANY(\(channels)::text[]) AND state IS NOT NULL
                """, logger: logger).decode((String, String).self)
            {
                result[channel] = state
            }
        } catch {
            throw SharedLog.classify(error)
        }
        return result
    }

    /// Memberships held across the cluster (for metrics).
    func membershipCount() async throws -> Int {
        do {
            return try await log.client.query("SELECT count(*) FROM tether_presence WHERE deadline_ms IS NOT NULL", logger: logger)
                .decode(Int.self).first(where: { _ in true }) ?? 0
        } catch {
            throw SharedLog.classify(error)
        }
    }

    // MARK: Helpers

    private func transaction(_ body: (PostgresConnection) async throws -> Void) async throws {
        do {
            try await log.client.transaction(logger: logger) { connection in try await body(connection) }
        } catch {
            throw SharedLog.classify(error)
        }
        log.wakeReader()
    }

    /// Inserts the events into the shared log inside the caller's transaction. Joins, leaves and
    /// timeouts on a channel above announce-max (or already in interval mode) become deltas of
    /// its interval instead, as in the tracker.
    private func announce(_ events: [PresenceEvent], _ connection: PostgresConnection) async throws {
        var direct: [PresenceEvent] = []
        var inInterval: Set<ChannelKey> = []
        var deltas: [ChannelKey: (joined: [String], left: [String], timedOut: [String])] = [:]
        let membershipEvents = events.filter { event in
            switch event.action {
            case .join, .leave, .timeout: true
            case .stateChange, .interval: false
            }
        }
        for (subscribeKey, group) in Dictionary(grouping: membershipEvents, by: \.channel.subscribeKey) {
            let channels = Array(Set(group.map(\.channel.channel)))
            for try await channel in try await connection.query("""
                SELECT channel FROM tether_presence_interval WHERE sub_key = \(subscribeKey) AND channel = ANY(\(channels)::text[])
                ORDER BY channel FOR UPDATE
                """, logger: logger).decode(String.self)
            {
                inInterval.insert(ChannelKey(subscribeKey: subscribeKey, channel: channel))
            }
        }
        for event in events {
            guard let uuid = event.uuid else {
                direct.append(event)
                continue
            }
            switch event.action {
            case .join, .leave, .timeout:
                if !inInterval.contains(event.channel), event.occupancy > configuration(for: event.channel.subscribeKey).announceMax {
                    inInterval.insert(event.channel)
                }
                guard inInterval.contains(event.channel) else {
                    direct.append(event)
                    continue
                }
                var delta = deltas[event.channel] ?? ([], [], [])
                switch event.action {
                case .join: delta.joined.append(uuid)
                case .leave: delta.left.append(uuid)
                default: delta.timedOut.append(uuid)
                }
                deltas[event.channel] = delta
            case .stateChange, .interval:
                direct.append(event)
            }
        }
        let nowMs = now()
        for (key, delta) in deltas {
            let next = nowMs + Self.milliseconds(configuration(for: key.subscribeKey).interval)
            try await connection.query("""
                INSERT INTO tether_presence_interval (sub_key, channel, next_ms, joined, left_, timed_out)
                VALUES (\(key.subscribeKey), \(key.channel), \(next), \(delta.joined)::text[], \(delta.left)::text[], \(delta.timedOut)::text[])
                ON CONFLICT (sub_key, channel) DO UPDATE SET joined = tether_presence_interval.joined || EXCLUDED.joined,
                  left_ = tether_presence_interval.left_ || EXCLUDED.left_, timed_out = tether_presence_interval.timed_out || EXCLUDED.timed_out
                """, logger: logger)
        }
        let events = direct
        try await log.appendWithin(connection, count: events.count) { index, tt in
            let event = events[index]
            return SubscribeEnvelope(timetoken: tt, subscribeKey: event.channel.subscribeKey,
                                     channel: event.channel.channel + NameRules.presenceSuffix,
                                     payload: event.payload(timestamp: tt.unixSeconds))
        }
    }

    private static func occupancies(subscribeKey: String, channels: [String], _ connection: PostgresConnection, _ logger: Logger)
        async throws -> [String: Int]
    {
        guard !channels.isEmpty else { return [:] }
        var result: [String: Int] = [:]
        for try await (channel, count) in try await connection.query("""
            SELECT channel, count(*) FROM tether_presence
            WHERE sub_key = \(subscribeKey) AND channel = ANY(\(channels)::text[]) AND deadline_ms IS NOT NULL GROUP BY channel
            """, logger: logger).decode((String, Int).self)
        {
            result[channel] = count
        }
        return result
    }

    private static func strings(_ rows: PostgresRowSequence) async throws -> [String] {
        var result: [String] = []
        for try await value in rows.decode(String.self) { result.append(value) }
        return result
    }
}
