/// The injected clock, type-erased: `now` as a duration since the engine's origin, and a
/// cancellable sleep. Tests pass a `TestClock` to drive hours of retry schedules in microseconds.
struct EngineClock: Sendable {
    let now: @Sendable () -> Duration
    let sleep: @Sendable (Duration) async throws -> Void

    init<C: Clock>(_ clock: C) where C.Duration == Duration {
        let origin = clock.now
        now = { origin.duration(to: clock.now) }
        sleep = { duration in try await clock.sleep(until: clock.now.advanced(by: duration), tolerance: nil) }
    }
}
