public import TetherProtocol

/// One event held in memory for live and catching-up subscribers.
public struct BufferedEvent: Sendable {
    /// The event's envelope (fields).
    public var envelope: SubscribeEnvelope
    /// The envelope encoded once, without `b`.
    public var encoded: [UInt8]
    /// Whether the event is also in the durable store (stored publishes). Events that are not
    /// (store=0 publishes, signals, presence events) live only in this window.
    public var isStored: Bool

    /// The event's timetoken.
    public var timetoken: Timetoken { envelope.timetoken }

    /// Creates a buffered event, encoding the envelope.
    public init(envelope: SubscribeEnvelope, isStored: Bool) {
        self.envelope = envelope
        self.encoded = envelope.encoded()
        self.isStored = isStored
    }
}

/// The in-memory window of one channel: PubNub's 100 events / 20 minutes (configurable), plus
/// the *coverage* bound that makes catch-up exact.
///
/// Invariant: every event of this channel with a timetoken above ``coverage`` is in ``events``.
/// Anything at or below it that still exists is in the durable store (stored messages); other
/// events at or below it have left the window.
public struct ChannelBuffer: Sendable {
    /// Events in timetoken order.
    public private(set) var events: [BufferedEvent] = []
    /// All events of the channel above this timetoken are in ``events``.
    public private(set) var coverage: Timetoken
    /// The newest *non-stored* event that left the window: a subscriber behind it missed
    /// events that exist nowhere else (reported as a gap, never skipped silently).
    public private(set) var unstoredEvictedThrough: Timetoken?

    /// Creates an empty buffer covering everything after `coverage`.
    public init(coverage: Timetoken) { self.coverage = coverage }

    /// Inserts an event in timetoken order (commits may arrive slightly out of order).
    public mutating func insert(_ event: BufferedEvent) {
        if let last = events.last, last.timetoken > event.timetoken {
            let index = events.firstIndex { $0.timetoken > event.timetoken } ?? events.endIndex
            events.insert(event, at: index)
        } else {
            events.append(event)
        }
    }

    /// Evicts events beyond `capacity` or older than `maximumAge` relative to `now`, raising
    /// ``coverage`` to the newest evicted timetoken.
    ///
    /// Events above `visibleThrough` are never evicted: no subscriber has been allowed to see
    /// them yet (they wait behind an earlier publish still being made durable), so dropping them
    /// would lose them for everyone.
    public mutating func evict(capacity: Int, maximumAge: UInt64, now: Timetoken, visibleThrough: Timetoken) {
        var drop = max(0, events.count - capacity)
        let oldest = now.rawValue > maximumAge ? now.rawValue - maximumAge : 0
        while drop < events.count, events[drop].timetoken.rawValue < oldest { drop += 1 }
        while drop > 0, events[drop - 1].timetoken > visibleThrough { drop -= 1 }
        guard drop > 0 else { return }
        coverage = max(coverage, events[drop - 1].timetoken)
        if let newestUnstored = events[..<drop].last(where: { !$0.isStored })?.timetoken {
            unstoredEvictedThrough = max(unstoredEvictedThrough ?? newestUnstored, newestUnstored)
        }
        events.removeFirst(drop)
    }

    /// Events with `after < timetoken <= through`, oldest first.
    public func events(after: Timetoken, through: Timetoken) -> ArraySlice<BufferedEvent> {
        guard let start = events.firstIndex(where: { $0.timetoken > after }) else { return [] }
        var end = events.endIndex
        while end > start, events[end - 1].timetoken > through { end -= 1 }
        return events[start..<end]
    }
}
