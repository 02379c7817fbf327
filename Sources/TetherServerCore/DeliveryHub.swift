import DequeModule
@_spi(Benchmarks) public import TetherProtocol

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
    package var envelopes: [SubscribeEnvelope]
    /// Whether the read stopped at its limit (more may exist after the last envelope).
    public var reachedLimit: Bool

    /// Creates a result.
    @_spi(Benchmarks) public init(range: StoreRange, envelopes: [SubscribeEnvelope], reachedLimit: Bool) {
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
    /// `include` is the subscriber's filter, given an event's parsed meta and payload: events
    /// it rejects are skipped but still covered by the cursor (they are never delivered to this
    /// subscriber). In-memory events are parsed once for every subscriber.
    public func merge(storeResults: [StoreRangeResult], limit: Int,
                      include: ((_ meta: JSONValue?, _ data: JSONValue?) -> Bool)? = nil) -> (cursor: Timetoken, envelopes: [[UInt8]]) {
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
            if let include {
                let inputs = event.filterValues
                if !include(inputs.meta, inputs.data) { continue }
            }
            candidates.append((event.timetoken, SubscribeEnvelope.encodedWithMatch(event.encoded, match: match)))
        }
        for result in storeResults {
            for envelope in result.envelopes where envelope.timetoken <= cap {
                if let include,
                   !include(envelope.meta.flatMap { try? JSONValue(parsing: $0) }, try? JSONValue(parsing: envelope.payload)) { continue }
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
    /// Bytes all windows together may hold. Over it, the oldest events leave their windows
    /// early (down to 90 % of the budget): stored ones remain in the store, the others are
    /// reported as a gap to subscribers behind them.
    public var memoryBudgetBytes: Int
    /// Channels with a window. Over it, empty windows are dropped, then the least recently
    /// used ones.
    public var maxChannels: Int
    /// Loss records kept for dropped windows (channels whose non-stored events left memory);
    /// beyond it they fold into one conservative floor per keyset.
    public var maxLossRecords: Int

    /// Creates a configuration.
    public init(bufferCapacity: Int = 100, bufferMaximumAgeSeconds: UInt64 = 20 * 60, memoryBudgetBytes: Int = 256 << 20,
                maxChannels: Int = 100_000, maxLossRecords: Int = 100_000) {
        self.bufferCapacity = bufferCapacity
        self.bufferMaximumAge = min(bufferMaximumAgeSeconds, 365 * 86_400) * 10_000_000
        self.memoryBudgetBytes = memoryBudgetBytes
        self.maxChannels = max(1, maxChannels)
        self.maxLossRecords = max(1, maxLossRecords)
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
    /// Number of windows (channels in ``buffers``).
    private var windowCount = 0
    /// Window count at which the next shed runs: the channel cap, or — when a shed could not
    /// get under it (windows holding events no subscriber may see yet) — a tenth above where it
    /// stopped, so a full scan runs at most once per tenth of growth, never once per publish.
    private var shedAt: Int?
    /// Buffered bytes at which the budget is next enforced, by the same reasoning.
    private var enforceBudgetAt: Int?
    /// Bytes held by every window together.
    public private(set) var bufferedBytes = 0
    /// Wildcard index: `(keyset, "a.")` → windowed channels starting with `a.`, so a wildcard
    /// subscribe visits its matches only, never every window.
    private var channelsByPrefix: [ChannelKey: Set<String>] = [:]
    /// Per keyset: the highest coverage of a dropped window. A channel without a window has no
    /// event above it, so its stored messages are read from the store up to here.
    private var droppedCoverage: [String: Timetoken] = [:]
    /// Dropped windows' loss records: non-stored events up to the timetoken left memory.
    private var lossRecords: [ChannelKey: Timetoken] = [:]
    /// Per keyset: loss records folded when ``lossRecords`` overflowed (a conservative bound
    /// reported for any channel without a window or a record).
    private var foldedLoss: [String: Timetoken] = [:]
    /// Per keyset: the highest timetoken any of its loss records was ever written with, so a
    /// wildcard subscriber ahead of every loss skips looking through them.
    private var lossRecordsThrough: [String: Timetoken] = [:]
    /// Waiting long-polls.
    private var waiters: [WaiterID: SubscriptionSpec] = [:]
    private var waitersByChannel: [ChannelKey: CompactSet<WaiterID>] = [:]
    private var waitersByPrefix: [ChannelKey: CompactSet<WaiterID>] = [:]
    private var waitersByGroup: [ChannelKey: CompactSet<WaiterID>] = [:]
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

    /// The last timetoken numbered (reserved, or reached by the idle cursor).
    public var lastNumbered: Timetoken { sequencer.last }

    /// Whether an event's timetoken is reserved and neither committed nor abandoned yet.
    public var hasReservationInFlight: Bool { !inFlight.isEmpty }

    /// Moves the sequencer up to `now` when nothing is in flight, so an idle server's cursor
    /// (handshakes, `/time/0`) follows the clock. Every later reservation is above it.
    public mutating func advance(now: Timetoken) -> Timetoken {
        if inFlight.isEmpty, now > sequencer.last { sequencer = TimetokenSequencer(floor: now) }
        return visibleThrough
    }

    /// The number of waiting long-polls.
    public var waiterCount: Int { waiters.count }

    /// The number of channels with an in-memory window.
    public var bufferedChannelCount: Int { windowCount }

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
    /// Number of channel groups (with at least one channel) in a keyset.
    public func groupCount(subscribeKey: String) -> Int { groupMembers[subscribeKey]?.count ?? 0 }

    public func channels(subscribeKey: String, group: String) -> Set<String> {
        groupMembers[subscribeKey]?[group] ?? []
    }

    /// Reserves the timetoken of a new event on `channel`. Call ``commit(_:now:)`` when the
    /// event is durable (or at once for events that are not stored), ``abandon(_:)`` if it
    /// failed. The channel's window is created here so its coverage is below the reservation.
    public mutating func reserve(_ channel: ChannelKey, now: Timetoken) -> Timetoken {
        ensureWindow(channel, now: now)
        let timetoken = sequencer.next(now: now)
        buffers[channel.subscribeKey]?[channel.channel]?.lastReserved = timetoken
        inFlight.append(timetoken)
        return timetoken
    }

    /// Cluster mode (several nodes on one shared log): takes events another part of the system
    /// committed and numbered — the shared store, read in timetoken order — and makes them
    /// visible, then moves the visible cursor up to `horizon`, below which the log promises no
    /// further commit. Events at or below the visible cursor were already taken and are
    /// skipped. A hub fed this way never reserves: its cursor only follows the log.
    public mutating func ingest(_ events: [BufferedEvent], through horizon: Timetoken, now: Timetoken) -> [WaiterID] {
        // A hub fed by a log never reserves; a reservation here would be a mixed-up caller, and
        // skipping the log's events because of it would lose them.
        assert(inFlight.isEmpty, "a hub fed by ingest(_:through:now:) must not reserve")
        var woken: [WaiterID] = []
        for event in events where event.timetoken > sequencer.last {
            let key = ChannelKey(subscribeKey: event.envelope.subscribeKey, channel: event.envelope.channel)
            // The window's coverage is the cursor before this event: every later event of the
            // channel arrives through here, in order.
            ensureWindow(key, now: now)
            sequencer = TimetokenSequencer(floor: event.timetoken)
            buffers[key.subscribeKey]?[key.channel]?.lastReserved = event.timetoken
            inFlight.append(event.timetoken)
            woken.append(contentsOf: commit(event, now: now))
        }
        if inFlight.isEmpty, horizon > sequencer.last { sequencer = TimetokenSequencer(floor: horizon) }
        return woken
    }

    /// Creates `channel`'s window if it has none (shedding windows first at the channel cap).
    private mutating func ensureWindow(_ channel: ChannelKey, now: Timetoken) {
        if buffers[channel.subscribeKey]?[channel.channel] == nil {
            if shedAt != nil, windowCount < configuration.maxChannels { shedAt = nil }
            if windowCount >= (shedAt ?? configuration.maxChannels) {
                shedWindows(now: now)
                shedAt = windowCount < configuration.maxChannels ? nil : windowCount + max(1, configuration.maxChannels / 10)
            }
            // The channel's loss record, or its keyset's folded floor when records overflowed:
            // a subscriber behind it is still told of the gap once the channel has a window again.
            let lost = lossRecords.removeValue(forKey: channel) ?? foldedLoss[channel.subscribeKey]
            let buffer = ChannelBuffer(coverage: sequencer.last, unstoredEvictedThrough: lost)
            buffers[channel.subscribeKey, default: [:]][channel.channel] = buffer
            windowCount += 1
            for prefix in WildcardPattern.candidatePrefixes(of: channel.channel) {
                channelsByPrefix[ChannelKey(subscribeKey: channel.subscribeKey, channel: prefix), default: []].insert(channel.channel)
            }
        }
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
        // The window exists: it was created by the reservation and is never dropped while one
        // of its reservations is in flight.
        if var buffer = buffers[key.subscribeKey]?.removeValue(forKey: key.channel) {
            buffer.insert(event)
            bufferedBytes += event.cost
            bufferedBytes -= buffer.evict(capacity: configuration.bufferCapacity, maximumAge: configuration.bufferMaximumAge,
                                          now: now, visibleThrough: visibleThrough)
            buffers[key.subscribeKey]?[key.channel] = buffer
        }
        removeInFlight(event.timetoken)
        if enforceBudgetAt != nil, bufferedBytes <= configuration.memoryBudgetBytes { enforceBudgetAt = nil }
        if bufferedBytes > (enforceBudgetAt ?? configuration.memoryBudgetBytes) {
            enforceBudget()
            enforceBudgetAt = bufferedBytes <= configuration.memoryBudgetBytes
                ? nil : bufferedBytes + max(1, configuration.memoryBudgetBytes / 10)
        }
        // Commits arrive almost in timetoken order: search from the end, so a long invisible
        // run (events waiting behind a slow stored write) costs O(1) per commit, not O(n).
        var index = invisible.endIndex
        while index > invisible.startIndex, invisible[index - 1].0 > event.timetoken { index -= 1 }
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
        let unwindowedThrough = max(startCursor, droppedCoverage[spec.subscribeKey] ?? .zero)

        func addChannel(_ channel: String, match: String?, storeFloor: Timetoken) {
            guard let buffer = keyBuffers[channel] else {
                if storeFloor < unwindowedThrough, !NameRules.isPresence(channel) {
                    plan.storeRanges.append(StoreRange(subscribeKey: spec.subscribeKey, selector: .channel(channel),
                                                       after: storeFloor, through: unwindowedThrough, match: match))
                }
                let key = ChannelKey(subscribeKey: spec.subscribeKey, channel: channel)
                if let lost = lossRecords[key] ?? foldedLoss[spec.subscribeKey], after < lost {
                    plan.windowGaps.append((channel, lost))
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
            // The matching channels without a window (none since the start, or dropped since)
            // have no event above `unwindowedThrough` and cannot be listed: their stored
            // messages are read by prefix up to there. A windowed channel's events in the same
            // range come from both sources; `merge` keeps one of each timetoken.
            if after < unwindowedThrough {
                plan.storeRanges.append(StoreRange(subscribeKey: spec.subscribeKey, selector: .prefix(prefix),
                                                   after: after, through: unwindowedThrough, match: pattern))
            }
            let indexed = channelsByPrefix[ChannelKey(subscribeKey: spec.subscribeKey, channel: prefix)] ?? []
            for channel in indexed.sorted() where WildcardPattern.matches(pattern: pattern, channel: channel) {
                if spec.channels.contains(channel) { continue }
                addChannel(channel, match: pattern, storeFloor: max(after, unwindowedThrough))
            }
            // Their non-stored events that left memory with a dropped window are a gap, as for
            // a named channel: each matching loss record, or the keyset's folded floor.
            if after < (lossRecordsThrough[spec.subscribeKey] ?? .zero) {
                var lostChannels: [(channel: String, through: Timetoken)] = []
                for (key, lost) in lossRecords where key.subscribeKey == spec.subscribeKey && after < lost
                    && keyBuffers[key.channel] == nil && !spec.channels.contains(key.channel)
                    && WildcardPattern.matches(pattern: pattern, channel: key.channel) {
                    lostChannels.append((key.channel, lost))
                }
                plan.windowGaps += lostChannels.sorted { $0.channel < $1.channel }
            }
            if let folded = foldedLoss[spec.subscribeKey], after < folded {
                plan.windowGaps.append((pattern, folded))
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

    /// The windows whose channel names `matches` accepts, for the console (docs/console.md):
    /// each with its visible events (the newest `last` of them) and how many arrived after `since`.
    package func windowSummaries(matching matches: (String, String) -> Bool, since: Timetoken, last: Int)
        -> [(subscribeKey: String, channel: String, held: Int, recent: Int, newest: [SubscribeEnvelope])] {
        let visible = visibleThrough
        var result: [(subscribeKey: String, channel: String, held: Int, recent: Int, newest: [SubscribeEnvelope])] = []
        for (subscribeKey, channels) in buffers {
            for (channel, buffer) in channels where matches(subscribeKey, channel) {
                let events = buffer.events.filter { $0.timetoken <= visible }
                let recent = events.reduce(0) { $0 + ($1.timetoken > since ? 1 : 0) }
                result.append((subscribeKey, channel, events.count, recent, events.suffix(last).map(\.envelope)))
            }
        }
        return result
    }

    /// Drops events that left the window by age. Call periodically.
    ///
    /// An emptied window is kept (a few bytes): its coverage records that stored messages up to
    /// it live in the store, so a subscriber behind it is served from there. Dropping it would
    /// make the channel look covered from ``startCursor`` and skip those messages.
    /// Windows left empty are dropped once none of their reservations is in flight; the
    /// keyset's ``droppedCoverage`` and the channel's loss record keep catch-up exact.
    public mutating func sweep(now: Timetoken) {
        let visible = visibleThrough
        var empty: [ChannelKey] = []
        // Each keyset's windows are taken out and changed in place: iterating `buffers` while
        // writing into it copied a keyset's whole table every sweep.
        for subscribeKey in Array(buffers.keys) {
            guard var channels = buffers.removeValue(forKey: subscribeKey) else { continue }
            var index = channels.values.startIndex
            while index != channels.values.endIndex {
                bufferedBytes -= channels.values[index].evict(capacity: configuration.bufferCapacity,
                                                              maximumAge: configuration.bufferMaximumAge, now: now, visibleThrough: visible)
                if channels.values[index].events.isEmpty {
                    empty.append(ChannelKey(subscribeKey: subscribeKey, channel: channels.keys[index]))
                }
                channels.values.formIndex(after: &index)
            }
            buffers[subscribeKey] = channels
        }
        for key in empty { dropWindow(key) }
    }

    /// Drops a window that holds no event and has no reservation in flight. Returns whether
    /// it was dropped.
    @discardableResult
    private mutating func dropWindow(_ key: ChannelKey) -> Bool {
        guard let buffer = buffers[key.subscribeKey]?[key.channel], buffer.events.isEmpty else { return false }
        if let oldest = inFlight.first, oldest <= buffer.lastReserved { return false }
        buffers[key.subscribeKey]?[key.channel] = nil
        if buffers[key.subscribeKey]?.isEmpty == true { buffers[key.subscribeKey] = nil }
        windowCount -= 1
        droppedCoverage[key.subscribeKey] = max(droppedCoverage[key.subscribeKey] ?? .zero, buffer.coverage)
        for prefix in WildcardPattern.candidatePrefixes(of: key.channel) {
            let prefixKey = ChannelKey(subscribeKey: key.subscribeKey, channel: prefix)
            channelsByPrefix[prefixKey]?.remove(key.channel)
            if channelsByPrefix[prefixKey]?.isEmpty == true { channelsByPrefix[prefixKey] = nil }
        }
        if let lost = buffer.unstoredEvictedThrough {
            if lossRecords.count >= configuration.maxLossRecords {
                // Fold every record into its keyset's conservative floor: gaps may then be
                // reported where nothing was lost, never the other way round.
                for (recorded, through) in lossRecords {
                    foldedLoss[recorded.subscribeKey] = max(foldedLoss[recorded.subscribeKey] ?? .zero, through)
                }
                lossRecords.removeAll()
            }
            lossRecords[key] = lost
            lossRecordsThrough[key.subscribeKey] = max(lossRecordsThrough[key.subscribeKey] ?? .zero, lost)
        }
        return true
    }

    /// Over ``DeliveryHubConfiguration/maxChannels``: drops every empty window, then, if still
    /// over, the least recently reserved tenth of the windows (their events leave memory as
    /// they would by age).
    private mutating func shedWindows(now: Timetoken) {
        let visible = visibleThrough
        var byActivity: [(Timetoken, ChannelKey)] = []
        byActivity.reserveCapacity(windowCount)
        for (subscribeKey, channels) in buffers {
            for (channel, buffer) in channels {
                byActivity.append((buffer.lastReserved, ChannelKey(subscribeKey: subscribeKey, channel: channel)))
            }
        }
        for (_, key) in byActivity { dropWindow(key) }
        guard windowCount >= configuration.maxChannels else { return }
        byActivity.sort { $0.0 < $1.0 }
        var toDrop = max(1, configuration.maxChannels / 10)
        for (_, key) in byActivity where toDrop > 0 {
            guard var buffer = buffers[key.subscribeKey]?.removeValue(forKey: key.channel) else { continue }
            bufferedBytes -= buffer.evict(through: visible, visibleThrough: visible)
            buffers[key.subscribeKey]?[key.channel] = buffer
            if dropWindow(key) { toDrop -= 1 }
        }
    }

    /// Over the memory budget: evicts the oldest visible events across all windows until the
    /// windows hold at most 90 % of the budget.
    private mutating func enforceBudget() {
        let visible = visibleThrough
        var events: [(timetoken: Timetoken, cost: Int)] = []
        for channels in buffers.values {
            for buffer in channels.values {
                for event in buffer.events where event.timetoken <= visible { events.append((event.timetoken, event.cost)) }
            }
        }
        events.sort { $0.timetoken < $1.timetoken }
        let target = configuration.memoryBudgetBytes / 10 * 9
        var excess = bufferedBytes - target
        var cutoff: Timetoken?
        for event in events where excess > 0 {
            excess -= event.cost
            cutoff = event.timetoken
        }
        guard let cutoff else { return }
        for (subscribeKey, channels) in buffers {
            for channel in channels.keys {
                guard var buffer = buffers[subscribeKey]?.removeValue(forKey: channel) else { continue }
                bufferedBytes -= buffer.evict(through: cutoff, visibleThrough: visible)
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
            // (No wildcard subscriber at all, the usual case: no prefixes to work out per event.)
            if !isPresence, !waitersByPrefix.isEmpty {
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
