import Synchronization

/// A clock that moves only when the test moves it, and that shows who is sleeping on it.
///
/// Pass it to ``TetherClient`` (or `TetherServer`) as the clock of its timers. Unlike a clock
/// that is only advanced, it lets a test wait for the moment a timer is *scheduled* — so
/// "the engine retries 2 s after the failure" is checked exactly, without wall time and without
/// racing the task that starts the timer:
///
/// ```swift
/// exchange.fail(.connectionClosed("reset"))
/// await clock.advanceToSleeper(after: .seconds(2))   // waits for the 2 s retry timer, then fires it
/// ```
public final class ManualClock: Clock, Sendable {
    /// A point on a ``ManualClock``: the time elapsed since the clock was created.
    public struct Instant: InstantProtocol, Sendable, Hashable, Comparable, CustomStringConvertible {
        /// The time since the clock was created.
        public var offset: Swift.Duration

        /// Creates an instant `offset` after the clock's start.
        public init(offset: Swift.Duration) { self.offset = offset }

        /// The instant `duration` later.
        public func advanced(by duration: Swift.Duration) -> Instant { Instant(offset: offset + duration) }
        /// The duration from this instant to `other`.
        public func duration(to other: Instant) -> Swift.Duration { other.offset - offset }
        /// Whether `lhs` comes first.
        public static func < (lhs: Instant, rhs: Instant) -> Bool { lhs.offset < rhs.offset }
        /// `offset`, e.g. `12.0 seconds`.
        public var description: String { "\(offset)" }
    }

    private struct Sleeper {
        var id: Int
        var deadline: Instant
        var continuation: CheckedContinuation<Void, any Error>
    }

    private struct Watcher {
        var id: Int
        var matches: @Sendable (Instant) -> Bool
        var continuation: CheckedContinuation<Instant?, Never>
    }

    private struct State {
        var now = Instant(offset: .zero)
        var nextID = 0
        var sleepers: [Sleeper] = []
        var watchers: [Watcher] = []
    }

    private let state = Mutex(State())

    /// Creates a clock at offset zero with nobody sleeping.
    public init() {}

    /// The current instant; it changes only in ``advance(by:)`` and ``advance(to:)``.
    public var now: Instant { state.withLock { $0.now } }

    /// Zero: the clock is exact.
    public var minimumResolution: Swift.Duration { .zero }

    /// The deadlines of the tasks sleeping on the clock, earliest first.
    public var sleepers: [Instant] { state.withLock { $0.sleepers.map(\.deadline).sorted() } }

    /// Suspends until the clock is advanced to `deadline` (returns at once when it is not in the
    /// future). Throws `CancellationError` when the task is cancelled first.
    public func sleep(until deadline: Instant, tolerance: Swift.Duration? = nil) async throws {
        let id = state.withLock { state -> Int in
            state.nextID += 1
            return state.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                enum Start { case due, cancelled, sleeping([CheckedContinuation<Instant?, Never>]) }
                let start = state.withLock { state -> Start in
                    if Task.isCancelled { return .cancelled }
                    if deadline <= state.now { return .due }
                    state.sleepers.append(Sleeper(id: id, deadline: deadline, continuation: continuation))
                    let matched = state.watchers.filter { $0.matches(deadline) }
                    state.watchers.removeAll { $0.matches(deadline) }
                    return .sleeping(matched.map(\.continuation))
                }
                switch start {
                case .due: continuation.resume()
                case .cancelled: continuation.resume(throwing: CancellationError())
                case .sleeping(let watchers): for watcher in watchers { watcher.resume(returning: deadline) }
                }
            }
        } onCancel: {
            let sleeper = state.withLock { state -> Sleeper? in
                guard let index = state.sleepers.firstIndex(where: { $0.id == id }) else { return nil }
                return state.sleepers.remove(at: index)
            }
            sleeper?.continuation.resume(throwing: CancellationError())
        }
    }

    /// Moves the clock forward by `duration`, waking every task whose deadline has come (earliest
    /// first).
    public func advance(by duration: Swift.Duration) {
        advance(to: state.withLock { $0.now }.advanced(by: duration))
    }

    /// Moves the clock to `instant` (never backwards), waking every task whose deadline has come
    /// (earliest first).
    public func advance(to instant: Instant) {
        let due = state.withLock { state -> [Sleeper] in
            state.now = max(state.now, instant)
            let now = state.now
            let due = state.sleepers.filter { $0.deadline <= now }.sorted { $0.deadline < $1.deadline }
            state.sleepers.removeAll { $0.deadline <= now }
            return due
        }
        for sleeper in due { sleeper.continuation.resume() }
    }

    /// Waits until some task sleeps until exactly `deadline` (returns at once if one already
    /// does). Returns early, without a sleeper, only when the waiting task is cancelled.
    public func waitForSleeper(until deadline: Instant) async {
        _ = await waitForSleeper { $0 == deadline }
    }

    /// Waits until some task sleeps until a deadline that `matches` (returns at once if one
    /// already does) and returns that deadline; `nil` only when the waiting task is cancelled.
    @discardableResult
    public func waitForSleeper(where matches: @escaping @Sendable (Instant) -> Bool) async -> Instant? {
        let id = state.withLock { state -> Int in
            state.nextID += 1
            return state.nextID
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Instant?, Never>) in
                let ready = state.withLock { state -> Instant?? in
                    if let sleeper = state.sleepers.filter({ matches($0.deadline) }).min(by: { $0.deadline < $1.deadline }) {
                        return .some(sleeper.deadline)
                    }
                    if Task.isCancelled { return .some(nil) }
                    state.watchers.append(Watcher(id: id, matches: matches, continuation: continuation))
                    return .none
                }
                if let ready { continuation.resume(returning: ready) }
            }
        } onCancel: {
            let watcher = state.withLock { state -> Watcher? in
                guard let index = state.watchers.firstIndex(where: { $0.id == id }) else { return nil }
                return state.watchers.remove(at: index)
            }
            watcher?.continuation.resume(returning: nil)
        }
    }

    /// Waits until a task sleeps until `now + delay` — a timer scheduled `delay` from now — then
    /// advances the clock by `delay`, waking it (and anything due before it).
    public func advanceToSleeper(after delay: Swift.Duration) async {
        let deadline = now.advanced(by: delay)
        await waitForSleeper(until: deadline)
        advance(to: deadline)
    }

    /// Waits until a task sleeps until a deadline between `now + delays.lowerBound` and
    /// `now + delays.upperBound` (a timer with jitter), advances the clock to it, and returns its
    /// delay from the instant the wait began.
    @discardableResult
    public func advanceToSleeper(within delays: ClosedRange<Swift.Duration>) async -> Swift.Duration {
        let start = now
        guard let deadline = await waitForSleeper(where: { delays.contains(start.duration(to: $0)) }) else { return .zero }
        advance(to: deadline)
        return start.duration(to: deadline)
    }
}
