public import DequeModule
@_spi(Benchmarks) public import TetherProtocol
import Synchronization

/// One event held in memory for live and catching-up subscribers.
public struct BufferedEvent: Sendable {
    /// The event's envelope (fields).
    package var envelope: SubscribeEnvelope
    /// The envelope encoded once, without `b`.
    public var encoded: [UInt8]
    /// Whether the event is also in the durable store (stored publishes). Events that are not
    /// (store=0 publishes, signals, presence events) live only in this window.
    public var isStored: Bool
    /// Bytes this event holds in memory (payload, meta, the encoded copy and bookkeeping), for
    /// the windows' memory budget.
    public var cost: Int
    /// Where the event's meta and payload are kept once parsed for filter expressions: once per
    /// event (not once per subscriber), on first use (``filterValues``).
    let filterInputs: FilterInputs

    /// The event's timetoken.
    public var timetoken: Timetoken { envelope.timetoken }

    /// Creates a buffered event, encoding the envelope.
    @_spi(Benchmarks) public init(envelope: SubscribeEnvelope, isStored: Bool) {
        self.envelope = envelope
        self.encoded = envelope.encoded()
        self.isStored = isStored
        self.cost = Self.overhead + encoded.count + envelope.payload.utf8.count + (envelope.meta?.utf8.count ?? 0)
            + envelope.channel.utf8.count + (envelope.publisher?.utf8.count ?? 0)
        self.filterInputs = FilterInputs()
    }

    /// The event's meta and payload parsed for filter expressions (`nil` where missing or not
    /// JSON), parsed by the first subscriber that needs them and shared with the others.
    public var filterValues: (meta: JSONValue?, data: JSONValue?) {
        filterInputs.values(meta: envelope.meta, payload: envelope.payload)
    }

    /// Fixed per-event bookkeeping, estimated (array slot, strings' headers, the inputs box).
    static let overhead = 256
}

/// The in-memory window of one channel: PubNub's 100 events / 20 minutes (configurable), plus
/// the *coverage* bound that makes catch-up exact.
///
/// Invariant: every event of this channel with a timetoken above ``coverage`` is in ``events``.
/// Anything at or below it that still exists is in the durable store (stored messages); other
/// events at or below it have left the window.
public struct ChannelBuffer: Sendable {
    /// Events in timetoken order. A ring buffer: a full window evicts its oldest event on every
    /// publish, and an array's `removeFirst` moved every other event of the window for it (~3 %
    /// of a publish's CPU with 100 events in the window).
    public private(set) var events = Deque<BufferedEvent>()
    /// All events of the channel above this timetoken are in ``events``.
    public private(set) var coverage: Timetoken
    /// The newest *non-stored* event that left the window: a subscriber behind it missed
    /// events that exist nowhere else (reported as a gap, never skipped silently).
    public private(set) var unstoredEvictedThrough: Timetoken?

    /// Bytes held by ``events`` (the sum of their costs).
    public private(set) var bytes = 0
    /// The newest timetoken reserved on this channel: the window may be dropped only once no
    /// reservation at or below it is still in flight.
    public var lastReserved: Timetoken

    /// Creates an empty buffer covering everything after `coverage`; `unstoredEvictedThrough`
    /// carries the loss record of an earlier window of the same channel.
    public init(coverage: Timetoken, unstoredEvictedThrough: Timetoken? = nil) {
        self.coverage = coverage
        self.unstoredEvictedThrough = unstoredEvictedThrough
        self.lastReserved = coverage
    }

    /// Inserts an event in timetoken order (commits may arrive slightly out of order).
    public mutating func insert(_ event: BufferedEvent) {
        bytes += event.cost
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
    /// - Returns: the bytes freed.
    @discardableResult
    public mutating func evict(capacity: Int, maximumAge: UInt64, now: Timetoken, visibleThrough: Timetoken) -> Int {
        var drop = max(0, events.count - capacity)
        let oldest = now.rawValue > maximumAge ? now.rawValue - maximumAge : 0
        while drop < events.count, events[drop].timetoken.rawValue < oldest { drop += 1 }
        return evictFirst(drop, visibleThrough: visibleThrough)
    }

    /// Evicts every event at or below `through` (and never one above `visibleThrough`).
    /// - Returns: the bytes freed.
    @discardableResult
    public mutating func evict(through: Timetoken, visibleThrough: Timetoken) -> Int {
        var drop = 0
        while drop < events.count, events[drop].timetoken <= through { drop += 1 }
        return evictFirst(drop, visibleThrough: visibleThrough)
    }

    private mutating func evictFirst(_ count: Int, visibleThrough: Timetoken) -> Int {
        var drop = count
        while drop > 0, events[drop - 1].timetoken > visibleThrough { drop -= 1 }
        guard drop > 0 else { return 0 }
        coverage = max(coverage, events[drop - 1].timetoken)
        if let newestUnstored = events[..<drop].last(where: { !$0.isStored })?.timetoken {
            unstoredEvictedThrough = max(unstoredEvictedThrough ?? newestUnstored, newestUnstored)
        }
        let freed = events[..<drop].reduce(0) { $0 + $1.cost }
        bytes -= freed
        events.removeFirst(drop)
        return freed
    }

    /// Events with `after < timetoken <= through`, oldest first.
    public func events(after: Timetoken, through: Timetoken) -> Slice<Deque<BufferedEvent>> {
        guard let start = events.firstIndex(where: { $0.timetoken > after }) else { return events[events.endIndex...] }
        var end = events.endIndex
        while end > start, events[end - 1].timetoken > through { end -= 1 }
        return events[start..<end]
    }
}

/// An event's meta and payload parsed for filter evaluation, computed on first use and shared
/// by every subscriber that evaluates a filter against the event. It keeps only the parsed
/// values: the texts are the event's own (every buffered event has one of these).
final class FilterInputs: Sendable {
    private let parsed = Mutex<(meta: JSONValue?, data: JSONValue?)?>(nil)

    /// The parsed `meta` and `payload` of the event this belongs to (`nil` where missing or not
    /// JSON); the same texts every time.
    func values(meta: String?, payload: String) -> (meta: JSONValue?, data: JSONValue?) {
        if let done = parsed.withLock({ $0 }) { return done }
        // Parsed outside the lock; two first users may both parse, and either result is equal.
        let value = (meta: meta.flatMap { try? JSONValue(parsing: $0) }, data: try? JSONValue(parsing: payload))
        parsed.withLock { $0 = value }
        return value
    }
}
