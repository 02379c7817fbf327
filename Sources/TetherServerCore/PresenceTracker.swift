import TetherProtocol

/// Presence policy of a keyset.
public struct PresenceConfiguration: Sendable, Equatable {
    /// Presence timeout used when a request does not send `heartbeat` (PubNub: 300 s).
    public var defaultTimeout: Duration
    /// The smallest timeout accepted; lower `heartbeat` values are raised to it (PubNub: 20 s).
    public var minimumTimeout: Duration
    /// The largest timeout accepted.
    public var maximumTimeout: Duration
    /// Above this occupancy a channel switches to interval mode (PubNub's announce-max, 20).
    public var announceMax: Int
    /// How often interval events are sent in interval mode.
    public var interval: Duration
    /// Interval events whose delta lists would hold more uuids than this send
    /// `here_now_refresh: true` and no lists instead.
    public var maximumIntervalDelta: Int

    /// Creates a configuration with PubNub's defaults.
    public init(defaultTimeout: Duration = .seconds(300), minimumTimeout: Duration = .seconds(20),
                maximumTimeout: Duration = .seconds(3600), announceMax: Int = 20, interval: Duration = .seconds(10),
                maximumIntervalDelta: Int = 100) {
        self.defaultTimeout = defaultTimeout
        self.minimumTimeout = minimumTimeout
        self.maximumTimeout = maximumTimeout
        self.announceMax = announceMax
        self.interval = interval
        self.maximumIntervalDelta = maximumIntervalDelta
    }

    /// Clamps a requested `heartbeat` (seconds) into the accepted range.
    public func timeout(requestedSeconds: Int?) -> Duration {
        guard let requestedSeconds, requestedSeconds > 0 else { return defaultTimeout }
        return min(max(.seconds(requestedSeconds), minimumTimeout), maximumTimeout)
    }
}

/// One presence event to publish on `{channel}-pnpres` (pubnub-wire §8).
public struct PresenceEvent: Sendable, Hashable {
    /// What happened.
    public enum Action: Sendable, Hashable {
        /// A uuid became present.
        case join
        /// A uuid left explicitly.
        case leave
        /// A uuid stopped heartbeating.
        case timeout
        /// A uuid's state changed.
        case stateChange
        /// Interval-mode summary.
        case interval(join: [String], leave: [String], timeout: [String], hereNowRefresh: Bool)

        /// The wire name of the action.
        public var name: String {
            switch self {
            case .join: return "join"
            case .leave: return "leave"
            case .timeout: return "timeout"
            case .stateChange: return "state-change"
            case .interval: return "interval"
            }
        }
    }

    /// The channel (without `-pnpres`).
    public var channel: ChannelKey
    /// What happened.
    public var action: Action
    /// The uuid concerned (nil for interval events).
    public var uuid: String?
    /// The channel's occupancy after the change.
    public var occupancy: Int
    /// The uuid's state (JSON object text) where relevant.
    public var state: String?

    /// The `d` payload: `{"action":…,"uuid":…,"timestamp":…,"occupancy":…}` (+ `data`, interval lists).
    public func payload(timestamp: Int64) -> String {
        var w = JSONWriter(capacity: 128)
        w.raw("{\"action\":")
        w.string(action.name)
        if let uuid {
            w.raw(",\"uuid\":")
            w.string(uuid)
        }
        w.raw(",\"timestamp\":")
        w.number(timestamp)
        w.raw(",\"occupancy\":")
        w.number(occupancy)
        if let state {
            w.raw(",\"data\":")
            w.raw(state.utf8)
        }
        if case .interval(let join, let leave, let timeout, let refresh) = action {
            if refresh {
                w.raw(",\"here_now_refresh\":true")
            } else {
                if !join.isEmpty { w.raw(",\"join\":"); w.stringArray(join) }
                if !leave.isEmpty { w.raw(",\"leave\":"); w.stringArray(leave) }
                if !timeout.isEmpty { w.raw(",\"timeout\":"); w.stringArray(timeout) }
                w.raw(",\"here_now_refresh\":false")
            }
        }
        w.raw("}")
        return String(decoding: w.bytes, as: UTF8.self)
    }
}

extension PresenceEvent {
    /// An event made outside the tracker (a cluster's presence, where PostgreSQL decides).
    package init(_ channel: ChannelKey, _ action: Action, uuid: String?, occupancy: Int, state: String?) {
        self.init(channel: channel, action: action, uuid: uuid, occupancy: occupancy, state: state)
    }
}

/// A presence membership as the store keeps it, so presence survives a restart: who is present
/// where, with which timeout and state. The deadline is not kept: after a restart every restored
/// member gets a fresh one, the restart time plus its timeout (docs/presence.md).
public struct PresenceRecord: Sendable, Hashable {
    /// The keyset.
    public var subscribeKey: String
    /// The channel (without `-pnpres`).
    public var channel: String
    /// The present uuid.
    public var uuid: String
    /// The member's presence timeout (its last heartbeat's).
    public var timeout: Duration
    /// The member's state on the channel (JSON object text), if any.
    public var state: String?

    /// Creates a record.
    public init(subscribeKey: String, channel: String, uuid: String, timeout: Duration, state: String?) {
        self.subscribeKey = subscribeKey
        self.channel = channel
        self.uuid = uuid
        self.timeout = timeout
        self.state = state
    }
}

/// A change the store must make so its presence records match the tracker.
public enum PresenceRecordChange: Sendable, Hashable {
    /// Insert or replace the record of a member (a join, or a new timeout or state).
    case save(PresenceRecord)
    /// Delete the record of a member that is gone (leave or timeout).
    case remove(subscribeKey: String, channel: String, uuid: String)
}

/// Who is present where: the pure presence model.
///
/// A uuid is present on a channel from its first heartbeat (a subscribe or `/heartbeat`) until its
/// presence timeout passes without another one, or it leaves. Time is a `Duration` since an
/// arbitrary origin passed in by the caller, so tests drive hours of timeouts exactly.
///
/// **Calm by construction.** A heartbeat from a present uuid only extends its deadline: a
/// connection that drops and comes back within the timeout produces no leave and no second join.
///
/// **Cheap per request.** Channels and members are mutated in place, so a heartbeat of a present
/// uuid costs a few hash lookups whatever the channel's occupancy. Each member keeps its true
/// deadline and has one entry in a min-heap of deadlines; a heartbeat that moves the deadline
/// later only updates the member, and when the old entry comes due it is queued again at the true
/// deadline. So the heap holds about one entry per member however often members heartbeat, and
/// idle bookkeeping does not grow with the number of present uuids.
///
/// **Durable membership.** Every membership whose stored record is out of date (a join, a
/// leave or timeout, a new timeout or state) is remembered until the shell takes it with
/// ``takeUnsavedChanges()`` and writes it; a heartbeat that only moves a deadline changes nothing
/// to store. After a restart ``restore(_:now:)`` brings the stored members back silently.
public struct PresenceTracker: Sendable {
    /// One uuid on one channel. Its times are kept as nanoseconds (a `Duration` is 16 bytes):
    /// there is one of these per membership, and a channel's member table is most of what an
    /// occupant costs (docs/benchmarks.md).
    private struct Member: Sendable {
        private var deadlineNanoseconds: Int64
        private var timeoutNanoseconds: Int64
        private var queuedAtNanoseconds: Int64
        /// The generation of this member's heap entry; entries with another one are stale.
        var queuedGeneration: UInt64

        init(deadline: Duration, timeout: Duration, queuedAt: Duration, queuedGeneration: UInt64) {
            deadlineNanoseconds = Self.nanoseconds(deadline)
            timeoutNanoseconds = Self.nanoseconds(timeout)
            queuedAtNanoseconds = Self.nanoseconds(queuedAt)
            self.queuedGeneration = queuedGeneration
        }

        /// When the member times out unless it heartbeats again.
        var deadline: Duration {
            get { .nanoseconds(deadlineNanoseconds) }
            set { deadlineNanoseconds = Self.nanoseconds(newValue) }
        }
        /// The timeout of its last heartbeat (stored, so a restart can give it a fresh deadline).
        var timeout: Duration {
            get { .nanoseconds(timeoutNanoseconds) }
            set { timeoutNanoseconds = Self.nanoseconds(newValue) }
        }
        /// When this member's heap entry comes due (never after ``deadline``).
        var queuedAt: Duration {
            get { .nanoseconds(queuedAtNanoseconds) }
            set { queuedAtNanoseconds = Self.nanoseconds(newValue) }
        }

        /// `duration` in whole nanoseconds, saturating at ±292 years.
        static func nanoseconds(_ duration: Duration) -> Int64 {
            let (seconds, attoseconds) = duration.components
            let (whole, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
            guard !overflow else { return seconds < 0 ? .min : .max }
            let (total, overflowAdding) = whole.addingReportingOverflow(attoseconds / 1_000_000_000)
            return overflowAdding ? (seconds < 0 ? .min : .max) : total
        }

        /// Moves the deadline to `newDeadline`; returns whether a heap entry must be queued for it
        /// (only when it is earlier than the queued one), recording it under `generation`.
        mutating func extend(to newDeadline: Duration, generation: UInt64) -> Bool {
            deadline = newDeadline
            guard newDeadline < queuedAt else { return false }
            queuedAt = newDeadline
            queuedGeneration = generation
            return true
        }
    }

    private struct Channel: Sendable {
        var members: [String: Member] = [:]
        var states: [String: String] = [:]
        /// Interval-mode deltas since the last interval event.
        var joined: [String] = []
        var left: [String] = []
        var timedOut: [String] = []
        var nextInterval: Duration?
        var inIntervalMode = false

        var isUnused: Bool { members.isEmpty && states.isEmpty && nextInterval == nil }

        /// Emits `action` directly, or records it as an interval delta when the channel is (or
        /// just went) above announce-max.
        mutating func announce(_ action: PresenceEvent.Action, uuid: String, key: ChannelKey, config: PresenceConfiguration,
                               now: Duration) -> [PresenceEvent] {
            if !inIntervalMode, members.count > config.announceMax {
                inIntervalMode = true
                nextInterval = now + config.interval
            }
            guard inIntervalMode else {
                return [PresenceEvent(channel: key, action: action, uuid: uuid, occupancy: members.count, state: nil)]
            }
            switch action {
            case .join: joined.append(uuid)
            case .leave: left.append(uuid)
            case .timeout: timedOut.append(uuid)
            case .stateChange, .interval: break
            }
            return []
        }

        /// Removes `uuid`; `nil` when it was not present.
        mutating func remove(_ uuid: String, action: PresenceEvent.Action, key: ChannelKey, config: PresenceConfiguration,
                             now: Duration) -> [PresenceEvent]? {
            guard members.removeValue(forKey: uuid) != nil else { return nil }
            let state = states.removeValue(forKey: uuid)
            var events = announce(action, uuid: uuid, key: key, config: config, now: now)
            if !inIntervalMode, !events.isEmpty, state != nil {
                events[0].state = state
            }
            return events
        }

        /// Ends the current interval: its event (if it has one to send) and the next boundary.
        mutating func endInterval(key: ChannelKey, config: PresenceConfiguration, now: Duration) -> PresenceEvent? {
            let total = joined.count + left.count + timedOut.count
            var event: PresenceEvent?
            if total > 0 || inIntervalMode {
                let refresh = total > config.maximumIntervalDelta
                event = PresenceEvent(channel: key, action: .interval(join: joined, leave: left, timeout: timedOut, hereNowRefresh: refresh),
                                      uuid: nil, occupancy: members.count, state: nil)
            }
            joined = []
            left = []
            timedOut = []
            if members.count > config.announceMax {
                nextInterval = now + config.interval
            } else {
                nextInterval = nil
                inIntervalMode = false
            }
            return event
        }
    }

    /// Above this many stale heap entries (beyond one per member) the heap is rebuilt, so leave
    /// and rejoin churn cannot grow it either.
    private static let staleEntrySlack = 1024

    private let configurationBySubscribeKey: [String: PresenceConfiguration]
    private let defaultConfiguration: PresenceConfiguration
    private var channels: [ChannelKey: Channel] = [:]
    private var channelsByUUID: [String: [String: CompactSet<String>]] = [:]  // subscribeKey → uuid → channels
    private var heap = DeadlineHeap<PresenceDeadline>()
    /// Channels in interval mode (the only ones with interval boundaries).
    private var intervalChannels: Set<ChannelKey> = []
    private var generation: UInt64 = 0
    private var memberTotal = 0
    /// The most (uuid, channel) memberships held across every keyset: presence memory is
    /// bounded by configuration, not by how many fresh uuids and channels clients invent.
    public let maximumMemberships: Int
    /// The default cap: 250,000 memberships, about 330 MiB at ~1.3 KiB each (docs/benchmarks.md).
    public static let defaultMaximumMemberships = 250_000
    /// Joins not recorded because ``maximumMemberships`` was reached (for metrics and logs).
    public private(set) var refusedJoins = 0
    /// State set ahead of a join (for a uuid not present on the channel): bounded with the
    /// memberships, as a client can set it for any number of fresh uuids and channels.
    private var stateOnlyTotal = 0
    /// State not kept because memberships and state set ahead of joins reached
    /// ``maximumMemberships``.
    public private(set) var refusedStates = 0
    /// Memberships whose stored record is out of date.
    private var unsaved: Set<MemberID> = []
    /// Explicit leaves of the last ``recentLeaveWindow`` (at least), by membership: when.
    private var recentLeaves: [MemberID: Duration] = [:]

    private struct MemberID: Hashable, Sendable {
        var channel: ChannelKey
        var uuid: String
    }

    /// Creates a tracker; keysets without an entry use `defaultConfiguration`.
    public init(defaultConfiguration: PresenceConfiguration = .init(),
                configurationBySubscribeKey: [String: PresenceConfiguration] = [:], maximumMemberships: Int = PresenceTracker.defaultMaximumMemberships) {
        self.defaultConfiguration = defaultConfiguration
        self.configurationBySubscribeKey = configurationBySubscribeKey
        self.maximumMemberships = max(1, maximumMemberships)
    }

    /// The configuration of a keyset.
    public func configuration(for subscribeKey: String) -> PresenceConfiguration {
        configurationBySubscribeKey[subscribeKey] ?? defaultConfiguration
    }

    /// Number of (uuid, channel) memberships.
    public var membershipCount: Int { memberTotal }

    /// Entries in the deadline heap, stale ones included: about one per membership however often
    /// members heartbeat, and never more than twice the memberships plus a fixed slack.
    package var pendingDeadlineCount: Int { heap.count }

    /// `names` without repeats: itself when it has one name (a subscribe's usual case, without
    /// allocating a set for it).
    private static func unique(_ names: [String]) -> [String] {
        names.count < 2 ? names : Array(Set(names))
    }

    /// Records a heartbeat of `uuid` on `channels` (presence names must already be removed).
    /// `state`, when given, is a JSON object keyed by channel name whose values become that
    /// channel's state for the uuid.
    public mutating func heartbeat(
        subscribeKey: String, uuid: String, channels names: [String], timeout: Duration,
        states: [String: String] = [:], now: Duration
    ) -> [PresenceEvent] {
        var rejoined: [String] = []
        return heartbeat(subscribeKey: subscribeKey, uuid: uuid, channels: names, timeout: timeout, states: states, now: now,
                         rejoined: &rejoined)
    }

    /// ``heartbeat(subscribeKey:uuid:channels:timeout:states:now:)``, adding to `rejoined` the
    /// channels the uuid joins again within ``recentLeaveWindow`` of leaving them explicitly:
    /// the joins a stale subscribe, read after its client's leave, would make.
    public mutating func heartbeat(
        subscribeKey: String, uuid: String, channels names: [String], timeout: Duration,
        states: [String: String] = [:], now: Duration, rejoined: inout [String]
    ) -> [PresenceEvent] {
        var events: [PresenceEvent] = []
        let config = configuration(for: subscribeKey)
        let deadline = now + timeout
        for name in Self.unique(names) {
            let key = ChannelKey(subscribeKey: subscribeKey, channel: name)
            let candidate = generation + 1
            // In place: no copy of the channel's member dictionary.
            let pushed = channels[key]?.members[uuid]?.extend(to: deadline, generation: candidate)
            let isNew = pushed == nil
            if isNew && memberTotal >= maximumMemberships {
                // Full: the request is still served, but this uuid is not present here (no
                // join event, not in here-now) until memberships time out or leave.
                refusedJoins += 1
                continue
            }
            if isNew {
                // State set ahead of this join is now a member's.
                if channels[key]?.states[uuid] != nil { stateOnlyTotal -= 1 }
                channels[key, default: Channel()].members[uuid] = Member(deadline: deadline, timeout: timeout, queuedAt: deadline,
                                                                         queuedGeneration: candidate)
                memberTotal += 1
                unsaved.insert(MemberID(channel: key, uuid: uuid))
            } else {
                updateTimeout(of: uuid, in: key, to: timeout)
            }
            if isNew || pushed == true {
                generation = candidate
                heap.push(PresenceDeadline(at: deadline, channel: key, uuid: uuid, generation: candidate))
            }
            var stateChanged = false
            if let state = states[name], channels[key]?.states[uuid] != state {
                channels[key, default: Channel()].states[uuid] = state
                stateChanged = true
                unsaved.insert(MemberID(channel: key, uuid: uuid))
            }
            if isNew {
                if let left = recentLeaves.removeValue(forKey: MemberID(channel: key, uuid: uuid)), now - left < Self.recentLeaveWindow {
                    rejoined.append(name)
                }
                channelsByUUID[subscribeKey, default: [:]][uuid, default: []].insert(name)
                events += channels[key, default: Channel()].announce(.join, uuid: uuid, key: key, config: config, now: now)
                settle(key)
            }
            if stateChanged, let channel = channels[key] {
                events.append(PresenceEvent(channel: key, action: .stateChange, uuid: uuid, occupancy: channel.members.count,
                                            state: channel.states[uuid]))
            }
        }
        compactIfNeeded()
        return events
    }

    /// Extends the deadline of `uuid` where it is still present; never joins. Used when a
    /// long-poll ends: the connection was alive, but a leave during the poll must stand.
    public mutating func refresh(subscribeKey: String, uuid: String, channels names: [String], timeout: Duration, now: Duration) {
        let deadline = now + timeout
        for name in Self.unique(names) {
            let key = ChannelKey(subscribeKey: subscribeKey, channel: name)
            let candidate = generation + 1
            guard let pushed = channels[key]?.members[uuid]?.extend(to: deadline, generation: candidate) else { continue }
            updateTimeout(of: uuid, in: key, to: timeout)
            guard pushed else { continue }
            generation = candidate
            heap.push(PresenceDeadline(at: deadline, channel: key, uuid: uuid, generation: candidate))
        }
        compactIfNeeded()
    }

    /// Takes back joins a heartbeat made at `deadline` (its `now` plus timeout) on `channels`,
    /// where nothing has extended them since: the subscribe that made them was abandoned by its
    /// client before it was served (its connection closed), so the uuid never came back.
    /// Emits `leave` for each.
    public mutating func withdraw(subscribeKey: String, uuid: String, channels names: [String], joinedUntil deadline: Duration,
                                  now: Duration) -> [PresenceEvent] {
        var events: [PresenceEvent] = []
        for name in Self.unique(names) {
            let key = ChannelKey(subscribeKey: subscribeKey, channel: name)
            guard channels[key]?.members[uuid]?.deadline == deadline else { continue }
            events += remove(uuid, from: key, action: .leave, now: now)
        }
        return events
    }

    /// Removes `uuid` from `channels` at once (an explicit leave).
    public mutating func leave(subscribeKey: String, uuid: String, channels names: [String], now: Duration) -> [PresenceEvent] {
        var events: [PresenceEvent] = []
        if recentLeaves.count >= Self.recentLeavesPruneAt {
            recentLeaves = recentLeaves.filter { now - $0.value < Self.recentLeaveWindow }
            // Still full: a flood of leaves; the oldest knowledge goes (it only narrows ghosts).
            if recentLeaves.count >= Self.recentLeavesPruneAt { recentLeaves.removeAll(keepingCapacity: true) }
        }
        for name in Self.unique(names) {
            let key = ChannelKey(subscribeKey: subscribeKey, channel: name)
            events += remove(uuid, from: key, action: .leave, now: now)
            recentLeaves[MemberID(channel: key, uuid: uuid)] = now
        }
        return events
    }

    /// How long after an explicit leave a join of the same uuid and channel counts as a rejoin
    /// (``heartbeat(subscribeKey:uuid:channels:timeout:states:now:rejoined:)``).
    public static let recentLeaveWindow = Duration.seconds(5)
    /// Leaves remembered before the old ones are dropped.
    private static let recentLeavesPruneAt = 65_536

    /// Sets `uuid`'s state on `channels` (state is kept while the uuid is present, and set
    /// ahead of its join otherwise). Emits `state-change` where the uuid is present.
    public mutating func setState(subscribeKey: String, uuid: String, channels names: [String], state: String) -> [PresenceEvent] {
        var events: [PresenceEvent] = []
        for name in Self.unique(names) {
            let key = ChannelKey(subscribeKey: subscribeKey, channel: name)
            if channels[key]?.members[uuid] == nil, channels[key]?.states[uuid] == nil {
                // Ahead of a join: counted with the memberships, refused when they are full.
                guard memberTotal + stateOnlyTotal < maximumMemberships else {
                    refusedStates += 1
                    continue
                }
                stateOnlyTotal += 1
            }
            let changed = channels[key, default: Channel()].states.updateValue(state, forKey: uuid) != state
            if changed, let occupancy = channels[key]?.members.count, channels[key]?.members[uuid] != nil {
                unsaved.insert(MemberID(channel: key, uuid: uuid))
                events.append(PresenceEvent(channel: key, action: .stateChange, uuid: uuid, occupancy: occupancy, state: state))
            }
        }
        return events
    }

    /// The state of `uuid` on a channel, if any.
    public func state(subscribeKey: String, uuid: String, channel: String) -> String? {
        channels[ChannelKey(subscribeKey: subscribeKey, channel: channel)]?.states[uuid]
    }

    /// Occupants of a channel, sorted, with their states.
    public func occupants(subscribeKey: String, channel: String) -> [(uuid: String, state: String?)] {
        guard let c = channels[ChannelKey(subscribeKey: subscribeKey, channel: channel)] else { return [] }
        return c.members.keys.sorted().map { ($0, c.states[$0]) }
    }

    /// How many uuids are present on a channel (here-now with `disable_uuids=1`: no list built).
    public func occupancy(subscribeKey: String, channel: String) -> Int {
        channels[ChannelKey(subscribeKey: subscribeKey, channel: channel)]?.members.count ?? 0
    }

    /// Every channel of a keyset with at least one occupant, sorted.
    public func occupiedChannels(subscribeKey: String) -> [String] {
        channels.compactMap { key, channel in
            key.subscribeKey == subscribeKey && !channel.members.isEmpty ? key.channel : nil
        }.sorted()
    }

    /// The channels `uuid` is present on, sorted.
    public func channels(subscribeKey: String, uuid: String) -> [String] {
        (channelsByUUID[subscribeKey]?[uuid] ?? []).sorted()
    }

    /// The next moment ``tick(now:)`` has work: the earliest queued deadline or interval boundary.
    /// A queued deadline may be earlier than the member's true one (it then only requeues it).
    public var nextWakeUp: Duration? {
        var next = heap.first?.at
        for key in intervalChannels {
            if let at = channels[key]?.nextInterval { next = next.map { min($0, at) } ?? at }
        }
        return next
    }

    /// Expires members whose deadline has passed and emits due interval events.
    ///
    /// - Parameter limit: the most timeouts handled in this call; the rest stay due (the shell
    ///   calls again), so a mass timeout never holds the caller's lock for long.
    public mutating func tick(now: Duration, limit: Int = .max) -> [PresenceEvent] {
        var events: [PresenceEvent] = []
        var timedOut = 0
        while timedOut < limit, let top = heap.first, top.at <= now {
            heap.popMin()
            guard let member = channels[top.channel]?.members[top.uuid], member.queuedGeneration == top.generation else { continue }
            if member.deadline > top.at {
                // Heartbeats moved the deadline later since this entry was queued: queue the true one.
                generation += 1
                channels[top.channel]?.members[top.uuid]?.queuedAt = member.deadline
                channels[top.channel]?.members[top.uuid]?.queuedGeneration = generation
                heap.push(PresenceDeadline(at: member.deadline, channel: top.channel, uuid: top.uuid, generation: generation))
                continue
            }
            events += remove(top.uuid, from: top.channel, action: .timeout, now: now)
            timedOut += 1
        }
        let due = intervalChannels.filter { key in channels[key]?.nextInterval.map { $0 <= now } ?? false }
        for key in due {
            let config = configuration(for: key.subscribeKey)
            if let event = channels[key]?.endInterval(key: key, config: config, now: now) {
                events.append(event)
            }
            settle(key)
        }
        return events
    }

    /// Whether some memberships changed since the last ``takeUnsavedChanges()``.
    public var hasUnsavedChanges: Bool { !unsaved.isEmpty }

    /// The changes that bring the stored records up to date, one per membership however often it
    /// changed; they count as saved from now on (``markUnsaved(_:)`` puts back a failed write).
    public mutating func takeUnsavedChanges() -> [PresenceRecordChange] {
        guard !unsaved.isEmpty else { return [] }
        let changes = unsaved.map { id -> PresenceRecordChange in
            guard let channel = channels[id.channel], let member = channel.members[id.uuid] else {
                return .remove(subscribeKey: id.channel.subscribeKey, channel: id.channel.channel, uuid: id.uuid)
            }
            return .save(PresenceRecord(subscribeKey: id.channel.subscribeKey, channel: id.channel.channel, uuid: id.uuid,
                                        timeout: member.timeout, state: channel.states[id.uuid]))
        }
        unsaved.removeAll()
        return changes
    }

    /// Marks the memberships of `changes` unsaved again (their write failed); the next
    /// ``takeUnsavedChanges()`` describes them as they are then.
    public mutating func markUnsaved(_ changes: [PresenceRecordChange]) {
        for change in changes {
            switch change {
            case .save(let record):
                unsaved.insert(MemberID(channel: ChannelKey(subscribeKey: record.subscribeKey, channel: record.channel), uuid: record.uuid))
            case .remove(let subscribeKey, let channel, let uuid):
                unsaved.insert(MemberID(channel: ChannelKey(subscribeKey: subscribeKey, channel: channel), uuid: uuid))
            }
        }
    }

    /// Brings back the members stored before a restart, silently: no join is announced (they
    /// were announced before), each gets the deadline `now` plus its timeout (clamped to the
    /// keyset's current range), so it stays present if it heartbeats again in time and times out
    /// once otherwise. Members already present are left as they are.
    public mutating func restore(_ records: [PresenceRecord], now: Duration) {
        var touched: Set<ChannelKey> = []
        for record in records {
            let key = ChannelKey(subscribeKey: record.subscribeKey, channel: record.channel)
            guard channels[key]?.members[record.uuid] == nil else { continue }
            let config = configuration(for: record.subscribeKey)
            let timeout = min(max(record.timeout, config.minimumTimeout), config.maximumTimeout)
            let deadline = now + timeout
            generation += 1
            channels[key, default: Channel()].members[record.uuid] = Member(deadline: deadline, timeout: timeout, queuedAt: deadline,
                                                                            queuedGeneration: generation)
            if let state = record.state { channels[key]?.states[record.uuid] = state }
            heap.push(PresenceDeadline(at: deadline, channel: key, uuid: record.uuid, generation: generation))
            channelsByUUID[record.subscribeKey, default: [:]][record.uuid, default: []].insert(record.channel)
            memberTotal += 1
            if timeout != record.timeout { unsaved.insert(MemberID(channel: key, uuid: record.uuid)) }
            touched.insert(key)
        }
        // A crowded channel resumes in interval mode, as it was before the restart.
        for key in touched {
            let config = configuration(for: key.subscribeKey)
            if let channel = channels[key], !channel.inIntervalMode, channel.members.count > config.announceMax {
                channels[key]?.inIntervalMode = true
                channels[key]?.nextInterval = now + config.interval
            }
            settle(key)
        }
    }

    /// Records a member's new timeout (its stored record is then out of date).
    private mutating func updateTimeout(of uuid: String, in key: ChannelKey, to timeout: Duration) {
        // Compared as kept (in whole nanoseconds), so a timeout finer than that is no change.
        guard let current = channels[key]?.members[uuid]?.timeout, current != .nanoseconds(Member.nanoseconds(timeout)) else { return }
        channels[key]?.members[uuid]?.timeout = timeout
        unsaved.insert(MemberID(channel: key, uuid: uuid))
    }

    private mutating func remove(_ uuid: String, from key: ChannelKey, action: PresenceEvent.Action, now: Duration) -> [PresenceEvent] {
        let config = configuration(for: key.subscribeKey)
        guard let events = channels[key]?.remove(uuid, action: action, key: key, config: config, now: now) else { return [] }
        memberTotal -= 1
        unsaved.insert(MemberID(channel: key, uuid: uuid))
        channelsByUUID[key.subscribeKey]?[uuid]?.remove(key.channel)
        if channelsByUUID[key.subscribeKey]?[uuid]?.isEmpty == true { channelsByUUID[key.subscribeKey]?[uuid] = nil }
        settle(key)
        return events
    }

    /// Keeps `intervalChannels` in step with a channel's interval boundary and drops the channel
    /// once nothing is left in it.
    private mutating func settle(_ key: ChannelKey) {
        guard let channel = channels[key] else {
            intervalChannels.remove(key)
            return
        }
        if channel.nextInterval != nil { intervalChannels.insert(key) } else { intervalChannels.remove(key) }
        if channel.isUnused { channels[key] = nil }
    }

    /// Drops stale heap entries (of members that left, or superseded by an earlier deadline)
    /// once they outnumber the members by more than ``staleEntrySlack``. Amortised O(1) per push.
    private mutating func compactIfNeeded() {
        guard heap.count > 2 * memberTotal + Self.staleEntrySlack else { return }
        let channels = self.channels
        heap.rebuild { entry in channels[entry.channel]?.members[entry.uuid]?.queuedGeneration == entry.generation }
    }
}

/// A presence deadline: `uuid` on `channel` comes due at `at`, unless the member's entry has
/// another generation (the entry is then stale and skipped).
struct PresenceDeadline: DeadlineEntry, Sendable {
    var at: Duration
    var channel: ChannelKey
    var uuid: String
    var generation: UInt64
}
