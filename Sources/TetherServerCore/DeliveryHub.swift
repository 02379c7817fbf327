public import TetherProtocol

/// Identifies one waiting long-poll in a ``DeliveryHub``.
public struct WaiterID: Hashable, Sendable, CustomStringConvertible {
    /// The raw identifier.
    public var rawValue: UInt64
    /// Creates an identifier.
    public init(_ rawValue: UInt64) { self.rawValue = rawValue }
    /// The raw identifier as text.
    public var description: String { "w\(rawValue)" }
}

/// A range of stored messages a subscribe response may need from the durable store.
public struct StoreRange: Sendable, Hashable {
    /// Which channels of the keyset.
    public enum Selector: Sendable, Hashable {
        /// One channel.
        case channel(String)
        /// Every channel starting with the prefix (a wildcard subscription), presence excluded.
        case prefix(String)
    }

    /// The keyset.
    public var subscribeKey: String
    /// The channels.
    public var selector: Selector
    /// Exclusive lower bound.
    public var after: Timetoken
    /// Inclusive upper bound.
    public var through: Timetoken
    /// The `b` value for envelopes read through this range.
    public var match: String?

    /// Creates a range.
    public init(subscribeKey: String, selector: Selector, after: Timetoken, through: Timetoken, match: String?) {
        self.subscribeKey = subscribeKey
        self.selector = selector
        self.after = after
        self.through = through
        self.match = match
    }
}

/// The result of reading one ``StoreRange`` (at most `limit` envelopes, oldest first).
public struct StoreRangeResult: Sendable {
    /// The range that was read.
    public var range: StoreRange
    /// The envelopes found, oldest first.
    public var envelopes: [SubscribeEnvelope]
    /// Whether the read stopped at its limit (more may exist after the last envelope).
    public var reachedLimit: Bool

    /// Creates a result.
    public init(range: StoreRange, envelopes: [SubscribeEnvelope], reachedLimit: Bool) {
        self.range = range
        self.envelopes = envelopes
        self.reachedLimit = reachedLimit
    }
}

/// What a subscribe read needs: events already in memory plus ranges to read from the store.
public struct ReadPlan: Sendable {
    /// The cursor the response may claim if nothing is truncated: every event at or below it is
    /// already visible.
    public var visibleThrough: Timetoken
    /// In-memory events with their `b` value.
    public var bufferEvents: [(event: BufferedEvent, match: String?)]
    /// Ranges to read from the durable store before answering.
    public var storeRanges: [StoreRange]
    /// Channels on which non-stored events after the cursor have left the in-memory window:
    /// `(channel, through)` — events in `(cursor, through]` that were not stored are gone.
    public var windowGaps: [(channel: String, through: Timetoken)] = []

    /// Creates a plan.
    public init(visibleThrough: Timetoken, bufferEvents: [(event: BufferedEvent, match: String?)], storeRanges: [StoreRange]) {
        self.visibleThrough = visibleThrough
        self.bufferEvents = bufferEvents
        self.storeRanges = storeRanges
    }

    /// Whether the plan delivers nothing without the store.
    public var isEmpty: Bool { bufferEvents.isEmpty && storeRanges.isEmpty }

    /// Merges the store results into one response page of at most `limit` envelopes, applying
    /// the cursor rule: the returned cursor is such that no event at or below it can be missing.
    ///
    /// `include` is the subscriber's filter: events it rejects are skipped but still covered by
    /// the cursor (they are never delivered to this subscriber).
    public func merge(storeResults: [StoreRangeResult], limit: Int,
                      include: ((SubscribeEnvelope) -> Bool)? = nil) -> (cursor: Timetoken, envelopes: [[UInt8]]) {
        var cap = visibleThrough
        var limited = false
        for result in storeResults where result.reachedLimit {
            if let last = result.envelopes.last?.timetoken {
                cap = min(cap, last)
                limited = true
            }
        }
        var candidates: [(Timetoken, [UInt8])] = []
        candidates.reserveCapacity(bufferEvents.count + storeResults.reduce(0) { $0 + $1.envelopes.count })
        for (event, match) in bufferEvents where event.timetoken <= cap {
            if let include, !include(event.envelope) { continue }
            candidates.append((event.timetoken, SubscribeEnvelope.encodedWithMatch(event.encoded, match: match)))
        }
        for result in storeResults {
            for envelope in result.envelopes where envelope.timetoken <= cap {
                if let include, !include(envelope) { continue }
                candidates.append((envelope.timetoken, SubscribeEnvelope.encodedWithMatch(envelope.encoded(), match: result.range.match)))
            }
        }
        candidates.sort { $0.0 < $1.0 }
        var page: [[UInt8]] = []
        page.reserveCapacity(min(limit, candidates.count))
        var lastTimetoken: Timetoken?
        var truncated = false
        for (timetoken, bytes) in candidates {
            if timetoken == lastTimetoken { continue }  // one event reached through two subscriptions
            if page.count == limit {
                truncated = true
                break
            }
            page.append(bytes)
            lastTimetoken = timetoken
        }
        if truncated, let lastTimetoken { return (lastTimetoken, page) }
        return (limited ? cap : visibleThrough, page)
    }
}

/// Tunables of a ``DeliveryHub``.
public struct DeliveryHubConfiguration: Sendable {
    /// Events kept per channel (PubNub: 100).
    public var bufferCapacity: Int
    /// How long an event stays in the in-memory window, in timetoken units (PubNub: 20 minutes).
    public var bufferMaximumAge: UInt64

    /// Creates a configuration.
    public init(bufferCapacity: Int = 100, bufferMaximumAgeSeconds: UInt64 = 20 * 60) {
        self.bufferCapacity = bufferCapacity
        self.bufferMaximumAge = bufferMaximumAgeSeconds * 10_000_000
    }
}

/// The pure heart of delivery: assigns timetokens, tracks which are visible, keeps the
/// per-channel windows and the registry of waiting long-polls.
///
/// **The cursor rule.** A timetoken is *reserved* before its event is made durable and
/// *committed* after. ``visibleThrough`` is one below the oldest reservation still in flight,
/// so a response's cursor never passes an event that could still appear; delivering never
/// removes anything, so an abandoned long-poll loses nothing.
///
/// No I/O, no clock reads, no tasks: the shell passes `now` in and performs the wake-ups this
/// type returns.
public struct DeliveryHub: Sendable {
    private let configuration: DeliveryHubConfiguration
    private var sequencer: TimetokenSequencer
    /// Timetokens of this process start: everything stored before it is only in the store.
    public let startCursor: Timetoken
    /// Reserved timetokens whose events are not yet committed, ascending.
    private var inFlight: [Timetoken] = []
    /// Committed events above ``visibleThrough``, ascending, waiting for earlier reservations.
    private var invisible: [(Timetoken, ChannelKey)] = []
    /// Per-keyset, per-channel windows.
    private var buffers: [String: [String: ChannelBuffer]] = [:]
    /// Waiting long-polls.
    private var waiters: [WaiterID: SubscriptionSpec] = [:]
    private var waitersByChannel: [ChannelKey: Set<WaiterID>] = [:]
    private var waitersByPrefix: [ChannelKey: Set<WaiterID>] = [:]
    private var waitersByGroup: [ChannelKey: Set<WaiterID>] = [:]
    /// Channel group membership: keyset → group → channels.
    private var groupMembers: [String: [String: Set<String>]] = [:]
    /// Reverse index: channel → groups containing it.
    private var groupsByChannel: [ChannelKey: Set<String>] = [:]
    private var nextWaiter: UInt64 = 0

    /// Creates a hub whose timetokens start above `floor` (the store's highest timetoken).
    public init(floor: Timetoken, now: Timetoken, configuration: DeliveryHubConfiguration = .init()) {
        self.configuration = configuration
        self.startCursor = max(floor, now)
        self.sequencer = TimetokenSequencer(floor: startCursor)
    }

    /// The highest timetoken such that every event at or below it is visible.
    public var visibleThrough: Timetoken {
        if let first = inFlight.first { return Timetoken(first.rawValue - 1) }
        return sequencer.last
    }

    /// Moves the sequencer up to `now` when nothing is in flight, so an idle server's cursor
    /// (handshakes, `/time/0`) follows the clock. Every later reservation is above it.
    public mutating func advance(now: Timetoken) -> Timetoken {
        if inFlight.isEmpty, now > sequencer.last { sequencer = TimetokenSequencer(floor: now) }
        return visibleThrough
    }

    /// The number of waiting long-polls.
    public var waiterCount: Int { waiters.count }

    /// The number of channels with an in-memory window.
    public var bufferedChannelCount: Int { buffers.values.reduce(0) { $0 + $1.count } }

    /// Replaces the channels of a group (an empty set deletes the group). A long-poll waiting on
    /// the group receives events of newly added channels without a new handshake.
    public mutating func setGroup(subscribeKey: String, group: String, channels: Set<String>) {
        let old = groupMembers[subscribeKey]?[group] ?? []
        for channel in old.subtracting(channels) {
            let key = ChannelKey(subscribeKey: subscribeKey, channel: channel)
            groupsByChannel[key]?.remove(group)
            if groupsByChannel[key]?.isEmpty == true { groupsByChannel[key] = nil }
        }
        for channel in channels.subtracting(old) {
            groupsByChannel[ChannelKey(subscribeKey: subscribeKey, channel: channel), default: []].insert(group)
        }
        groupMembers[subscribeKey, default: [:]][group] = channels.isEmpty ? nil : channels
    }

    /// The channels of a group.
    public func channels(subscribeKey: String, group: String) -> Set<String> {
        groupMembers[subscribeKey]?[group] ?? []
    }

    /// Reserves the timetoken of a new event on `channel`. Call ``commit(_:now:)`` when the
    /// event is durable (or at once for events that are not stored), ``abandon(_:)`` if it
    /// failed. The channel's window is created here so its coverage is below the reservation.
    public mutating func reserve(_ channel: ChannelKey, now: Timetoken) -> Timetoken {
        if buffers[channel.subscribeKey]?[channel.channel] == nil {
            buffers[channel.subscribeKey, default: [:]][channel.channel] = ChannelBuffer(coverage: sequencer.last)
        }
        let timetoken = sequencer.next(now: now)
        inFlight.append(timetoken)
        return timetoken
    }

    /// Gives up a reservation whose event was not made durable. Returns waiters to wake (the
    /// visible cursor may have advanced).
    public mutating func abandon(_ timetoken: Timetoken) -> [WaiterID] {
        removeInFlight(timetoken)
        return advanceVisibility()
    }

    /// Commits an event: it enters its channel's window and becomes visible once every earlier
    /// reservation has committed. Returns the waiting long-polls to wake.
    public mutating func commit(_ event: BufferedEvent, now: Timetoken) -> [WaiterID] {
        let key = ChannelKey(subscribeKey: event.envelope.subscribeKey, channel: event.envelope.channel)
        var buffer = buffers[key.subscribeKey]?[key.channel] ?? ChannelBuffer(coverage: startCursor)
        buffer.insert(event)
        buffer.evict(capacity: configuration.bufferCapacity, maximumAge: configuration.bufferMaximumAge, now: now,
                         visibleThrough: visibleThrough)
        buffers[key.subscribeKey, default: [:]][key.channel] = buffer
        removeInFlight(event.timetoken)
        let index = invisible.firstIndex { $0.0 > event.timetoken } ?? invisible.endIndex
        invisible.insert((event.timetoken, key), at: index)
        return advanceVisibility()
    }

    /// Plans the response to a subscribe continuation from cursor `after`.
    ///
    /// An `after` above ``visibleThrough`` (a cursor from the future) is treated as current.
    public mutating func plan(_ spec: SubscriptionSpec, after: Timetoken, now: Timetoken) -> ReadPlan {
        let visible = visibleThrough
        var plan = ReadPlan(visibleThrough: visible, bufferEvents: [], storeRanges: [])
        guard after < visible else { return plan }
        let keyBuffers = buffers[spec.subscribeKey] ?? [:]

        func addChannel(_ channel: String, match: String?, storeFloor: Timetoken) {
            guard let buffer = keyBuffers[channel] else {
                if storeFloor < startCursor, !NameRules.isPresence(channel) {
                    plan.storeRanges.append(StoreRange(subscribeKey: spec.subscribeKey, selector: .channel(channel),
                                                       after: storeFloor, through: startCursor, match: match))
                }
                return
            }
            if let lost = buffer.unstoredEvictedThrough, after < lost {
                plan.windowGaps.append((channel, lost))
            }
            if storeFloor < buffer.coverage, !NameRules.isPresence(channel) {
                plan.storeRanges.append(StoreRange(subscribeKey: spec.subscribeKey, selector: .channel(channel),
                                                   after: storeFloor, through: buffer.coverage, match: match))
            }
            for event in buffer.events(after: max(after, buffer.coverage), through: visible) {
                plan.bufferEvents.append((event, match))
            }
        }

        for channel in spec.channels {
            addChannel(channel, match: NameRules.isPresence(channel) ? channel : nil, storeFloor: after)
        }
        for group in spec.groups {
            let isPresence = NameRules.isPresence(group)
            let base = isPresence ? String(group.dropLast(NameRules.presenceSuffix.count)) : group
            for member in (groupMembers[spec.subscribeKey]?[base] ?? []).sorted() {
                let channel = isPresence ? member + NameRules.presenceSuffix : member
                if spec.channels.contains(channel) { continue }
                addChannel(channel, match: group, storeFloor: after)
            }
        }
        for pattern in spec.wildcards {
            let prefix = WildcardPattern.prefix(of: pattern)
            if after < startCursor {
                plan.storeRanges.append(StoreRange(subscribeKey: spec.subscribeKey, selector: .prefix(prefix),
                                                   after: after, through: startCursor, match: pattern))
            }
            for channel in keyBuffers.keys where WildcardPattern.matches(pattern: pattern, channel: channel) {
                if spec.channels.contains(channel) { continue }
                addChannel(channel, match: pattern, storeFloor: max(after, startCursor))
            }
        }
        return plan
    }

    /// Registers a long-poll that found nothing to deliver; it is woken by the next visible
    /// event on any channel it matches.
    public mutating func register(_ spec: SubscriptionSpec) -> WaiterID {
        nextWaiter += 1
        let id = WaiterID(nextWaiter)
        waiters[id] = spec
        for channel in spec.channels {
            waitersByChannel[ChannelKey(subscribeKey: spec.subscribeKey, channel: channel), default: []].insert(id)
        }
        for pattern in spec.wildcards {
            let key = ChannelKey(subscribeKey: spec.subscribeKey, channel: WildcardPattern.prefix(of: pattern))
            waitersByPrefix[key, default: []].insert(id)
        }
        for group in spec.groups {
            waitersByGroup[ChannelKey(subscribeKey: spec.subscribeKey, channel: group), default: []].insert(id)
        }
        return id
    }

    /// Removes a waiter (woken, timed out, or its client went away). Returns whether it was
    /// still registered.
    @discardableResult
    public mutating func unregister(_ id: WaiterID) -> Bool {
        guard let spec = waiters.removeValue(forKey: id) else { return false }
        for channel in spec.channels {
            let key = ChannelKey(subscribeKey: spec.subscribeKey, channel: channel)
            waitersByChannel[key]?.remove(id)
            if waitersByChannel[key]?.isEmpty == true { waitersByChannel[key] = nil }
        }
        for pattern in spec.wildcards {
            let key = ChannelKey(subscribeKey: spec.subscribeKey, channel: WildcardPattern.prefix(of: pattern))
            waitersByPrefix[key]?.remove(id)
            if waitersByPrefix[key]?.isEmpty == true { waitersByPrefix[key] = nil }
        }
        for group in spec.groups {
            let key = ChannelKey(subscribeKey: spec.subscribeKey, channel: group)
            waitersByGroup[key]?.remove(id)
            if waitersByGroup[key]?.isEmpty == true { waitersByGroup[key] = nil }
        }
        return true
    }

    /// Every registered waiter (for shutdown).
    public var allWaiters: [WaiterID] { Array(waiters.keys) }

    /// Drops events that left the window by age. Call periodically.
    ///
    /// An emptied window is kept (a few bytes): its coverage records that stored messages up to
    /// it live in the store, so a subscriber behind it is served from there. Dropping it would
    /// make the channel look covered from ``startCursor`` and skip those messages.
    public mutating func sweep(now: Timetoken) {
        for (subscribeKey, channels) in buffers {
            for (channel, var buffer) in channels {
                buffer.evict(capacity: configuration.bufferCapacity, maximumAge: configuration.bufferMaximumAge, now: now,
                         visibleThrough: visibleThrough)
                buffers[subscribeKey]?[channel] = buffer
            }
        }
    }

    private mutating func removeInFlight(_ timetoken: Timetoken) {
        if inFlight.first == timetoken {
            inFlight.removeFirst()
        } else if let index = inFlight.firstIndex(of: timetoken) {
            inFlight.remove(at: index)
        }
    }

    /// Moves committed events at or below the visible cursor out of ``invisible`` and collects
    /// the waiters they wake.
    private mutating func advanceVisibility() -> [WaiterID] {
        let visible = visibleThrough
        var count = 0
        while count < invisible.count, invisible[count].0 <= visible { count += 1 }
        guard count > 0 else { return [] }
        var woken: [WaiterID] = []
        for (_, key) in invisible[..<count] {
            if let ids = waitersByChannel[key] { woken.append(contentsOf: ids) }
            let isPresence = NameRules.isPresence(key.channel)
            let base = isPresence ? String(key.channel.dropLast(NameRules.presenceSuffix.count)) : key.channel
            for group in groupsByChannel[ChannelKey(subscribeKey: key.subscribeKey, channel: base)] ?? [] {
                let name = isPresence ? group + NameRules.presenceSuffix : group
                if let ids = waitersByGroup[ChannelKey(subscribeKey: key.subscribeKey, channel: name)] { woken.append(contentsOf: ids) }
            }
            if !isPresence {
                for prefix in WildcardPattern.candidatePrefixes(of: key.channel) {
                    if let ids = waitersByPrefix[ChannelKey(subscribeKey: key.subscribeKey, channel: prefix)] {
                        woken.append(contentsOf: ids)
                    }
                }
            }
        }
        invisible.removeFirst(count)
        var unique: [WaiterID] = []
        for id in woken where unregister(id) { unique.append(id) }
        return unique
    }
}
