/// Why a waiter of the delivery hub stopped waiting.
public enum WakeReason: Sendable, Hashable {
    /// A visible event matches it.
    case event
    /// Its deadline (the long-poll's expiry, 280 s by default, or its access expiry) passed.
    case timeout
    /// The server is shutting down gracefully.
    case shutdown
    /// Grants or tokens changed: re-check access before waiting again.
    case accessChanged
    /// Its client closed the connection.
    case clientGone
}

/// The lifecycle of the subscribers waiting on a ``DeliveryHub``: a long-poll today, a
/// WebSocket session's delivery next.
///
/// A waiter is registered in the hub under the shell's lock when its read found nothing, and
/// parks a moment later (the shell installs a continuation outside the lock, then comes back). Anything can wake it in between — an event, a closed connection,
/// shutdown — so the machine remembers that wake-up and answers the park at once with it; no
/// wake-up is lost and none is delivered twice.
///
/// Pure: `Parked` is whatever the shell must resume (a continuation or a callback), handed back
/// in the actions exactly once; `Connection` identifies a client connection; `Deadline` is any
/// instant, compared with the `now` the shell passes in. Each waiter is in one of:
///
/// - `registered` — in the hub's index, not parked yet. Can transition to: `wokenEarly`,
///   `parked`, gone (parked at once for shutdown, a closed connection or a passed deadline).
/// - `wokenEarly(reason)` — woken before it parked. Can transition to: gone (its park resumes at
///   once with `reason`).
/// - `parked(parked, connection)` — waiting. Can transition to: gone (resumed by a wake-up).
public struct DeliveryWaiters<Parked, Connection: Hashable, Deadline: Comparable> {
    @usableFromInline enum State {
        case registered
        case wokenEarly(WakeReason)
        case parked(Parked, connection: Connection)
    }

    /// Whether new waiters are accepted. Can transition to: `shuttingDown` (for good).
    @usableFromInline enum Phase: Sendable {
        case running
        case shuttingDown
    }

    /// When a parked waiter is due (its `.timeout`).
    @usableFromInline struct Due: DeadlineEntry {
        @usableFromInline var at: Deadline
        @usableFromInline var id: WaiterID

        @inlinable init(at: Deadline, id: WaiterID) {
            self.at = at
            self.id = id
        }
    }

    @usableFromInline var waiters: [WaiterID: State] = [:]
    /// The parked waiters' deadlines, earliest first: one ordering for all of them, so the shell
    /// keeps one timer (at ``nextDeadline()``) instead of one per waiter. An entry whose waiter
    /// was woken stays until it reaches the top or the heap is compacted.
    @usableFromInline var due = DeadlineHeap<Due>()
    /// The parked waiter of each connection (a connection has at most one request in flight).
    @usableFromInline var parkedByConnection: [Connection: WaiterID] = [:]
    /// Connections whose close the shell already observes.
    @usableFromInline var watched: Set<Connection> = []
    @usableFromInline var phase = Phase.running
    @usableFromInline var parkedCount = 0

    /// Creates an empty set of waiters.
    @inlinable public init() {}

    /// Whether the server is shutting down: a long-poll then answers instead of waiting.
    @inlinable public var isShuttingDown: Bool {
        switch phase {
        case .running: false
        case .shuttingDown: true
        }
    }

    /// Waiters parked right now.
    @inlinable public var waitingCount: Int { parkedCount }

    /// A waiter was registered in the hub and is about to park.
    @inlinable public mutating func registered(_ id: WaiterID) {
        waiters[id] = .registered
    }

    /// What the shell does about a waiter's connection.
    public enum WatchAction: Sendable, Equatable {
        /// Observe its close (the first waiter of this connection) and report it with
        /// ``connectionClosed(_:)``.
        case observeClose
        /// Already observed.
        case none
    }

    /// A waiter of `connection` is about to park.
    @inlinable public mutating func watch(_ connection: Connection) -> WatchAction {
        watched.insert(connection).inserted ? .observeClose : .none
    }

    /// What the shell does with a waiter that tried to park.
    public enum ParkAction: Sendable {
        /// It waits; the machine holds `Parked` until a wake-up hands it back.
        case wait
        /// Resume it at once with this reason (the machine did not keep `Parked`). When
        /// `unregister` is set, the shell also removes it from the hub's index.
        case resume(WakeReason, unregister: Bool)
    }

    /// Parks a registered waiter until `deadline` (reported by ``expired(now:)``).
    /// `connectionIsOpen` is the connection's state as the shell sees it now.
    @inlinable public mutating func park(
        _ id: WaiterID, _ parked: Parked, connection: Connection, connectionIsOpen: Bool, deadline: Deadline, now: Deadline
    ) -> ParkAction {
        guard let state = waiters[id] else {
            // Never registered (or already answered): nothing can wake it, so it must not wait.
            return .resume(.clientGone, unregister: true)
        }
        switch state {
        case .wokenEarly(let reason):
            waiters[id] = nil
            return .resume(reason, unregister: false)
        case .parked:
            // Parking twice is a shell bug; the first park keeps its continuation.
            return .resume(.clientGone, unregister: false)
        case .registered:
            switch phase {
            case .shuttingDown:
                waiters[id] = nil
                return .resume(.shutdown, unregister: true)
            case .running:
                break
            }
            if !connectionIsOpen {
                waiters[id] = nil
                return .resume(.clientGone, unregister: true)
            }
            if deadline <= now {
                waiters[id] = nil
                return .resume(.timeout, unregister: true)
            }
            waiters[id] = .parked(parked, connection: connection)
            parkedByConnection[connection] = id
            parkedCount += 1
            due.push(Due(at: deadline, id: id))
            if due.count > 2 * parkedCount + 64 {
                // Mostly woken waiters' entries: dropped, amortised O(1) per park.
                let waiters = self.waiters
                due.rebuild { entry in Self.isParked(waiters[entry.id]) }
            }
            return .wait
        }
    }

    /// Wakes waiters for `reason`: parked ones are handed back to be resumed (the shell
    /// unregisters every id from the hub); ones not parked yet
    /// remember the first reason and take it when they park.
    @inlinable public mutating func wake(_ ids: [WaiterID], reason: WakeReason) -> [Parked] {
        var resumed: [Parked] = []
        for id in ids {
            guard let state = waiters[id] else { continue }
            switch state {
            case .registered:
                waiters[id] = .wokenEarly(reason)
            case .wokenEarly:
                break  // the first wake-up wins
            case .parked(let parked, let connection):
                waiters[id] = nil
                parkedCount -= 1
                if parkedByConnection[connection] == id { parkedByConnection[connection] = nil }
                resumed.append(parked)
            }
        }
        return resumed
    }

    /// A watched connection closed: the waiter parked on it, if any, to wake as `.clientGone`.
    @inlinable public mutating func connectionClosed(_ connection: Connection) -> WaiterID? {
        watched.remove(connection)
        return parkedByConnection.removeValue(forKey: connection)
    }

    /// The earliest deadline of a parked waiter, for the shell's one timer; `nil` when none
    /// waits. Drops the entries of woken waiters it finds on top.
    @inlinable public mutating func nextDeadline() -> Deadline? {
        while let top = due.first {
            if Self.isParked(waiters[top.id]) { return top.at }
            due.popMin()
        }
        return nil
    }

    /// The parked waiters whose deadline is at or before `now`, to wake as `.timeout` with
    /// ``wake(_:reason:)``; earliest first.
    @inlinable public mutating func expired(now: Deadline) -> [WaiterID] {
        var ids: [WaiterID] = []
        while let top = due.first, top.at <= now {
            due.popMin()
            if Self.isParked(waiters[top.id]) { ids.append(top.id) }
        }
        return ids
    }

    /// Entries in the deadline order, live or stale (tests: it stays bounded).
    @inlinable public var deadlineEntries: Int { due.count }

    @inlinable static func isParked(_ state: State?) -> Bool {
        if case .parked = state { true } else { false }
    }

    /// Every parked waiter (to re-check access after a grant or revoke).
    @inlinable public var parkedWaiters: [WaiterID] {
        waiters.compactMap { id, state in
            switch state {
            case .parked: id
            case .registered, .wokenEarly: nil
            }
        }
    }

    /// Graceful shutdown starts: returns the parked waiters to wake as `.shutdown`; waiters
    /// that park from now on are answered at once.
    @inlinable public mutating func shutdown() -> [WaiterID] {
        phase = .shuttingDown
        return parkedWaiters
    }
}

extension DeliveryWaiters: Sendable where Parked: Sendable, Connection: Sendable, Deadline: Sendable {}

extension DeliveryWaiters.State: Sendable where Parked: Sendable, Connection: Sendable {}

extension DeliveryWaiters.Due: Sendable where Deadline: Sendable {}
