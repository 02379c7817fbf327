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

/// Who is present where: the pure presence model.
///
/// A uuid is present on a channel from its first heartbeat (a subscribe or `/heartbeat`) until its
/// presence timeout passes without another one, or it leaves. Time is a `Duration` since an
/// arbitrary origin passed in by the caller, so tests drive hours of timeouts exactly.
///
/// **Calm by construction.** A heartbeat from a present uuid only extends its deadline: a
/// connection that drops and comes back within the timeout produces no leave and no second join.
/// Each member has one deadline; expiring is `O(log n)` per member through a lazily-cleaned
/// min-heap, so idle bookkeeping does not grow with the number of present uuids.
public struct PresenceTracker: Sendable {
    private struct Member: Sendable {
        var deadline: Duration
        var timeout: Duration
        var generation: UInt64
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
    }

    private let configurationBySubscribeKey: [String: PresenceConfiguration]
    private let defaultConfiguration: PresenceConfiguration
    private var channels: [ChannelKey: Channel] = [:]
    private var channelsByUUID: [String: [String: Set<String>]] = [:]  // subscribeKey → uuid → channels
    private var heap = DeadlineHeap()
    /// Channels in interval mode (the only ones with interval boundaries).
    private var intervalChannels: Set<ChannelKey> = []
    private var generation: UInt64 = 0

    /// Creates a tracker; keysets without an entry use `defaultConfiguration`.
    public init(defaultConfiguration: PresenceConfiguration = .init(),
                configurationBySubscribeKey: [String: PresenceConfiguration] = [:]) {
        self.defaultConfiguration = defaultConfiguration
        self.configurationBySubscribeKey = configurationBySubscribeKey
    }

    /// The configuration of a keyset.
    public func configuration(for subscribeKey: String) -> PresenceConfiguration {
        configurationBySubscribeKey[subscribeKey] ?? defaultConfiguration
    }

    /// Number of (uuid, channel) memberships.
    public var membershipCount: Int { channels.values.reduce(0) { $0 + $1.members.count } }

    /// Records a heartbeat of `uuid` on `channels` (presence names must already be removed).
    /// `state`, when given, is a JSON object keyed by channel name whose values become that
    /// channel's state for the uuid.
    public mutating func heartbeat(
        subscribeKey: String, uuid: String, channels names: [String], timeout: Duration,
        states: [String: String] = [:], now: Duration
    ) -> [PresenceEvent] {
        var events: [PresenceEvent] = []
        for name in Set(names) {
            let key = ChannelKey(subscribeKey: subscribeKey, channel: name)
            var channel = channels[key] ?? Channel()
            generation += 1
            let member = Member(deadline: now + timeout, timeout: timeout, generation: generation)
            let isNew = channel.members.updateValue(member, forKey: uuid) == nil
            heap.push(PresenceDeadline(at: member.deadline, channel: key, uuid: uuid, generation: generation))
            var stateChanged = false
            if let state = states[name], channel.states[uuid] != state {
                channel.states[uuid] = state
                stateChanged = true
            }
            if isNew {
                channelsByUUID[subscribeKey, default: [:]][uuid, default: []].insert(name)
                events += announce(.join, uuid: uuid, in: &channel, key: key, now: now)
            }
            if stateChanged {
                events.append(PresenceEvent(channel: key, action: .stateChange, uuid: uuid, occupancy: channel.members.count,
                                            state: channel.states[uuid]))
            }
            store(channel, at: key)
        }
        return events
    }

    /// Extends the deadline of `uuid` where it is still present; never joins. Used when a
    /// long-poll ends: the connection was alive, but a leave during the poll must stand.
    public mutating func refresh(subscribeKey: String, uuid: String, channels names: [String], timeout: Duration, now: Duration) {
        for name in Set(names) {
            let key = ChannelKey(subscribeKey: subscribeKey, channel: name)
            guard var channel = channels[key], channel.members[uuid] != nil else { continue }
            generation += 1
            channel.members[uuid] = Member(deadline: now + timeout, timeout: timeout, generation: generation)
            heap.push(PresenceDeadline(at: now + timeout, channel: key, uuid: uuid, generation: generation))
            store(channel, at: key)
        }
    }

    /// Removes `uuid` from `channels` at once (an explicit leave).
    public mutating func leave(subscribeKey: String, uuid: String, channels names: [String], now: Duration) -> [PresenceEvent] {
        var events: [PresenceEvent] = []
        for name in Set(names) {
            let key = ChannelKey(subscribeKey: subscribeKey, channel: name)
            events += remove(uuid, from: key, action: .leave, now: now)
        }
        return events
    }

    /// Sets `uuid`'s state on `channels` (state is kept while the uuid is present, and set
    /// ahead of its join otherwise). Emits `state-change` where the uuid is present.
    public mutating func setState(subscribeKey: String, uuid: String, channels names: [String], state: String) -> [PresenceEvent] {
        var events: [PresenceEvent] = []
        for name in Set(names) {
            let key = ChannelKey(subscribeKey: subscribeKey, channel: name)
            var channel = channels[key] ?? Channel()
            let changed = channel.states.updateValue(state, forKey: uuid) != state
            if changed, channel.members[uuid] != nil {
                events.append(PresenceEvent(channel: key, action: .stateChange, uuid: uuid, occupancy: channel.members.count, state: state))
            }
            store(channel, at: key)
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

    /// The next moment ``tick(now:)`` has work: the earliest deadline or interval boundary.
    public var nextWakeUp: Duration? {
        var next = heap.first?.at
        for key in intervalChannels {
            if let at = channels[key]?.nextInterval { next = next.map { min($0, at) } ?? at }
        }
        return next
    }

    /// Expires members whose deadline has passed and emits due interval events.
    public mutating func tick(now: Duration) -> [PresenceEvent] {
        var events: [PresenceEvent] = []
        while let top = heap.first, top.at <= now {
            heap.popMin()
            guard let member = channels[top.channel]?.members[top.uuid], member.generation == top.generation else { continue }
            events += remove(top.uuid, from: top.channel, action: .timeout, now: now)
        }
        for key in intervalChannels {
            guard let due = channels[key]?.nextInterval, due <= now else { continue }
            var channel = channels[key]!
            let total = channel.joined.count + channel.left.count + channel.timedOut.count
            let config = configuration(for: key.subscribeKey)
            if total > 0 || channel.inIntervalMode {
                let refresh = total > config.maximumIntervalDelta
                events.append(PresenceEvent(channel: key, action: .interval(join: channel.joined, leave: channel.left,
                                                                             timeout: channel.timedOut, hereNowRefresh: refresh),
                                            uuid: nil, occupancy: channel.members.count, state: nil))
            }
            channel.joined = []
            channel.left = []
            channel.timedOut = []
            if channel.members.count > config.announceMax {
                channel.nextInterval = now + config.interval
            } else {
                channel.nextInterval = nil
                channel.inIntervalMode = false
            }
            store(channel, at: key)
        }
        return events
    }

    private mutating func remove(_ uuid: String, from key: ChannelKey, action: PresenceEvent.Action, now: Duration) -> [PresenceEvent] {
        guard var channel = channels[key], channel.members.removeValue(forKey: uuid) != nil else { return [] }
        let state = channel.states.removeValue(forKey: uuid)
        channelsByUUID[key.subscribeKey]?[uuid]?.remove(key.channel)
        if channelsByUUID[key.subscribeKey]?[uuid]?.isEmpty == true { channelsByUUID[key.subscribeKey]?[uuid] = nil }
        var events = announce(action, uuid: uuid, in: &channel, key: key, now: now)
        if !channel.inIntervalMode, events.first != nil, state != nil {
            events[0].state = state
        }
        store(channel, at: key)
        return events
    }

    /// Emits `action` directly, or records it as an interval delta when the channel is (or just
    /// went) above announce-max.
    private func announce(_ action: PresenceEvent.Action, uuid: String, in channel: inout Channel, key: ChannelKey, now: Duration)
        -> [PresenceEvent]
    {
        let config = configuration(for: key.subscribeKey)
        if !channel.inIntervalMode, channel.members.count > config.announceMax {
            channel.inIntervalMode = true
            channel.nextInterval = now + config.interval
        }
        guard channel.inIntervalMode else {
            return [PresenceEvent(channel: key, action: action, uuid: uuid, occupancy: channel.members.count, state: nil)]
        }
        switch action {
        case .join: channel.joined.append(uuid)
        case .leave: channel.left.append(uuid)
        case .timeout: channel.timedOut.append(uuid)
        case .stateChange, .interval: break
        }
        return []
    }

    private mutating func store(_ channel: Channel, at key: ChannelKey) {
        if channel.nextInterval != nil { intervalChannels.insert(key) } else { intervalChannels.remove(key) }
        if channel.members.isEmpty && channel.states.isEmpty && channel.nextInterval == nil {
            channels[key] = nil
        } else {
            channels[key] = channel
        }
    }
}

/// A presence deadline: `uuid` on `channel` expires at `at` unless a newer generation replaced it.
struct PresenceDeadline: Sendable {
    var at: Duration
    var channel: ChannelKey
    var uuid: String
    var generation: UInt64
}

/// A binary min-heap of deadlines ordered by `at`. Stale entries (superseded by a later heartbeat)
/// are skipped when popped, so a heartbeat costs `O(log n)` and nothing is ever searched.
struct DeadlineHeap: Sendable {
    private var items: [PresenceDeadline] = []

    var first: PresenceDeadline? { items.first }
    var count: Int { items.count }

    mutating func push(_ element: PresenceDeadline) {
        items.append(element)
        var child = items.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard items[child].at < items[parent].at else { break }
            items.swapAt(child, parent)
            child = parent
        }
    }

    mutating func popMin() {
        guard !items.isEmpty else { return }
        items.swapAt(0, items.count - 1)
        items.removeLast()
        var parent = 0
        while true {
            let left = 2 * parent + 1
            let right = left + 1
            var smallest = parent
            if left < items.count, items[left].at < items[smallest].at { smallest = left }
            if right < items.count, items[right].at < items[smallest].at { smallest = right }
            if smallest == parent { return }
            items.swapAt(parent, smallest)
            parent = smallest
        }
    }
}
