/// The injected clock of the client's subscribe engine and the server's presence timeouts,
/// type-erased: `now` as the time elapsed since the clock was wrapped, and a cancellable sleep
/// on the same clock.
///
/// Production code wraps `ContinuousClock`; tests wrap a manual clock (`ManualClock` in
/// TetherTesting, or swift-clocks' `TestClock`) to drive hours of retry and timeout schedules
/// step by step without wall time.
package struct ElapsedClock: Sendable {
    /// Time elapsed since the clock was wrapped.
    package let now: @Sendable () -> Duration
    /// Suspends for a duration of this clock's time; throws `CancellationError` when cancelled.
    package let sleep: @Sendable (Duration) async throws -> Void

    /// Wraps a clock.
    package init<C: Clock>(_ clock: C) where C.Duration == Duration {
        let origin = clock.now
        now = { origin.duration(to: clock.now) }
        sleep = { duration in try await clock.sleep(until: clock.now.advanced(by: duration), tolerance: nil) }
    }

    /// The system's continuous clock.
    package static var continuous: ElapsedClock { ElapsedClock(ContinuousClock()) }
}
