package import TetherProtocol

/// What a publish is deduplicated on (issue #15): the keyset, the publisher's uuid (empty when
/// the request names none) and the client's request id.
package struct DedupKey: Hashable, Sendable {
    package var subscribeKey: String
    package var publisher: String
    package var requestID: String

    package init(subscribeKey: String, publisher: String?, requestID: String) {
        self.subscribeKey = subscribeKey
        self.publisher = publisher ?? ""
        self.requestID = requestID
    }
}

/// How long and how many publishes the server remembers.
package struct PublishDedupConfiguration: Sendable, Equatable {
    /// Default window: 10 minutes (Ably, NATS and Centrifugo use 2–5).
    package static let defaultWindowSeconds = 600
    /// Default bound on remembered publishes.
    package static let defaultMaximumEntries = 100_000

    /// Seconds a publish is remembered; 0 turns deduplication off.
    package var windowSeconds: Int
    /// Remembered publishes at most; beyond it the oldest is forgotten early.
    package var maximumEntries: Int

    package init(windowSeconds: Int = Self.defaultWindowSeconds, maximumEntries: Int = Self.defaultMaximumEntries) {
        self.windowSeconds = max(0, windowSeconds)
        self.maximumEntries = max(1, maximumEntries)
    }

    package var isEnabled: Bool { windowSeconds > 0 }

    /// The window in timetoken units (100 ns).
    package var windowUnits: UInt64 { UInt64(windowSeconds) * 10_000_000 }
}

/// The in-memory index of recent publishes that carried a request id. Pure: `now` is passed
/// in (a timetoken-valued clock), and the shell (``LongPollHub``) keeps it under a lock and
/// resumes the waiters it returns after releasing it.
///
/// A key is in one of two phases:
///
/// - **in flight**: its first publish is being stored; repeats wait for its outcome.
///   Can transition to: remembered (``settle(_:timetoken:now:)``), absent (``release(_:)``).
/// - **remembered**: answered with its timetoken until the window passes or the bound forgets
///   it. Can transition to: absent (``expire(now:)``, the bound), in flight (a claim after the
///   window passed).
///
/// Only remembered keys count towards ``PublishDedupConfiguration/maximumEntries``; keys in
/// flight are bounded by the publishes in progress (each one holds a request, and stored ones a
/// place in the store's bounded write queue).
package struct PublishDedupIndex<Waiter> {
    /// What a claim found.
    package enum Claim {
        /// Nobody holds the key: the caller now holds it in flight and must settle or release it.
        case fresh
        /// Published before, within the window: answer with this timetoken.
        case repeated(Timetoken)
        /// Its first publish is still in flight. From ``claim(_:now:)``: call
        /// ``wait(_:_:now:)``; from ``wait(_:_:now:)``: the waiter was registered.
        case inFlight
    }

    private enum Slot {
        case inFlight([Waiter])
        case remembered(Timetoken, at: Timetoken, sequence: UInt64)
    }

    private struct Remembered {
        var key: DedupKey
        var at: Timetoken
        var sequence: UInt64
    }

    package let configuration: PublishDedupConfiguration
    private var slots: [DedupKey: Slot] = [:]
    /// Remembered keys in the order they were remembered (oldest first, from `head`); an entry
    /// whose sequence no longer matches its slot is stale and skipped.
    private var order: [Remembered] = []
    private var head = 0
    private var nextSequence: UInt64 = 0
    /// Keys in the remembered phase.
    package private(set) var rememberedCount = 0
    /// Keys forgotten before their window ended because of the bound, since the last
    /// ``takeEvictionCount()``.
    private var evictedSinceReport = 0

    package init(configuration: PublishDedupConfiguration) {
        self.configuration = configuration
    }

    /// Keys in flight.
    package var inFlightCount: Int { slots.count - rememberedCount }

    /// Publishes waiting for a key in flight (a scan: for tests and tools).
    package var waiterCount: Int {
        slots.values.reduce(0) { count, slot in
            if case .inFlight(let waiters) = slot { return count + waiters.count }
            return count
        }
    }

    private func isLive(_ at: Timetoken, now: Timetoken) -> Bool {
        let (end, overflow) = at.rawValue.addingReportingOverflow(configuration.windowUnits)
        return overflow || now.rawValue < end
    }

    /// Looks `key` up; takes it in flight when nobody holds it.
    package mutating func claim(_ key: DedupKey, now: Timetoken) -> Claim {
        switch slots[key] {
        case .remembered(let timetoken, let at, _) where isLive(at, now: now):
            return .repeated(timetoken)
        case .remembered:
            rememberedCount -= 1  // past its window: forgotten, its `order` entry now stale
            slots[key] = .inFlight([])
            return .fresh
        case .inFlight:
            return .inFlight
        case nil:
            slots[key] = .inFlight([])
            return .fresh
        }
    }

    /// Like ``claim(_:now:)``, but registers `waiter` when the key is still in flight.
    package mutating func wait(_ key: DedupKey, _ waiter: Waiter, now: Timetoken) -> Claim {
        if case .inFlight(var waiters) = slots[key] {
            waiters.append(waiter)
            slots[key] = .inFlight(waiters)
            return .inFlight
        }
        return claim(key, now: now)
    }

    /// The publish holding `key` in flight succeeded at `timetoken`: remembers it and returns
    /// the waiters to answer with it. Forgets the oldest keys beyond the bound.
    package mutating func settle(_ key: DedupKey, timetoken: Timetoken, now: Timetoken) -> [Waiter] {
        var waiters: [Waiter] = []
        switch slots[key] {
        case .inFlight(let w): waiters = w
        case .remembered: rememberedCount -= 1
        case nil: break
        }
        remember(key, timetoken: timetoken, at: now)
        return waiters
    }

    /// The publish holding `key` in flight failed: forgets the key and returns its waiters, who
    /// each claim again (the first becomes a fresh attempt, the others wait for it).
    package mutating func release(_ key: DedupKey) -> [Waiter] {
        guard case .inFlight(let waiters) = slots[key] else { return [] }
        slots[key] = nil
        return waiters
    }

    /// Remembers a publish read back from the store at start-up (call oldest first).
    package mutating func restore(_ key: DedupKey, timetoken: Timetoken, at: Timetoken, now: Timetoken) {
        guard isLive(at, now: now) else { return }
        if case .remembered = slots[key] { rememberedCount -= 1 }
        remember(key, timetoken: timetoken, at: at)
    }

    private mutating func remember(_ key: DedupKey, timetoken: Timetoken, at: Timetoken) {
        nextSequence += 1
        slots[key] = .remembered(timetoken, at: at, sequence: nextSequence)
        order.append(Remembered(key: key, at: at, sequence: nextSequence))
        rememberedCount += 1
        while rememberedCount > configuration.maximumEntries, let oldest = popOldest() {
            if forget(oldest) { evictedSinceReport += 1 }
        }
        compactIfNeeded()
    }

    /// Forgets every key whose window has passed; returns how many.
    @discardableResult
    package mutating func expire(now: Timetoken) -> Int {
        var removed = 0
        while head < order.count, !isLive(order[head].at, now: now) {
            let entry = order[head]
            head += 1
            if forget(entry) { removed += 1 }
        }
        compactIfNeeded()
        return removed
    }

    /// Keys the bound forgot early since the last call.
    package mutating func takeEvictionCount() -> Int {
        defer { evictedSinceReport = 0 }
        return evictedSinceReport
    }

    private mutating func popOldest() -> Remembered? {
        guard head < order.count else { return nil }
        head += 1
        return order[head - 1]
    }

    /// Removes `entry`'s key if the slot is still the one it recorded.
    private mutating func forget(_ entry: Remembered) -> Bool {
        guard case .remembered(_, _, let sequence) = slots[entry.key], sequence == entry.sequence else { return false }
        slots[entry.key] = nil
        rememberedCount -= 1
        return true
    }

    private mutating func compactIfNeeded() {
        if head > 1024 && head * 2 > order.count {
            order.removeFirst(head)
            head = 0
        }
    }
}
