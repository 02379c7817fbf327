/// The monotonic clock that drives timeouts (presence), injectable so tests can control it.
///
/// `now` is the time elapsed since the clock was created; `sleep` waits on the same clock. Build
/// one from any `Clock` whose duration is `Duration`, e.g. a `TestClock` in tests.
public struct ServerClock: Sendable {
    /// Time elapsed since the clock was created.
    public let now: @Sendable () -> Duration
    /// Suspends for a duration of this clock's time.
    public let sleep: @Sendable (Duration) async throws -> Void

    /// Wraps a clock.
    public init<C: Clock>(_ clock: C) where C.Duration == Duration {
        let origin = clock.now
        now = { origin.duration(to: clock.now) }
        sleep = { try await clock.sleep(for: $0) }
    }

    /// The system's continuous clock.
    public static var continuous: ServerClock { ServerClock(ContinuousClock()) }
}
