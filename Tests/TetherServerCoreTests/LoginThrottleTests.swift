import Testing
import TetherServerCore

/// The console's sign-in throttle: wrong secrets per address within a window, with the clock
/// passed in (milliseconds), and the bound on tracked addresses.
@Suite struct LoginThrottleTests {
    @Test func fiveWrongSecretsInAMinuteThrottleTheAddressUntilTheWindowEnds() {
        var throttle = LoginThrottle(configuration: .init(maxFailures: 5, windowMilliseconds: 60_000))
        for attempt in 0..<5 {
            #expect(throttle.verdict(for: "10.0.0.1", now: Int64(attempt) * 1_000) == .allowed)
            throttle.failed("10.0.0.1", now: Int64(attempt) * 1_000)
        }
        // The window started at the first failure (t = 0) and ends at 60 s.
        #expect(throttle.verdict(for: "10.0.0.1", now: 4_000) == .throttled(retryAfterSeconds: 56))
        #expect(throttle.verdict(for: "10.0.0.1", now: 59_001) == .throttled(retryAfterSeconds: 1))
        // Other addresses are not affected.
        #expect(throttle.verdict(for: "10.0.0.2", now: 4_000) == .allowed)
        // Once it has passed, attempts are checked again, and a new failure starts a new window.
        #expect(throttle.verdict(for: "10.0.0.1", now: 60_000) == .allowed)
        throttle.failed("10.0.0.1", now: 60_000)
        #expect(throttle.verdict(for: "10.0.0.1", now: 60_001) == .allowed)
    }

    @Test func failuresSpreadOverMoreThanAWindowNeverThrottle() {
        var throttle = LoginThrottle(configuration: .init(maxFailures: 5, windowMilliseconds: 60_000))
        for attempt in 0..<20 {
            let now = Int64(attempt) * 15_000
            #expect(throttle.verdict(for: "10.0.0.1", now: now) == .allowed)
            throttle.failed("10.0.0.1", now: now)
        }
    }

    @Test func aSuccessfulSignInForgetsTheFailures() {
        var throttle = LoginThrottle(configuration: .init(maxFailures: 3, windowMilliseconds: 60_000))
        throttle.failed("10.0.0.1", now: 0)
        throttle.failed("10.0.0.1", now: 1)
        throttle.succeeded("10.0.0.1")
        #expect(throttle.count == 0)
        throttle.failed("10.0.0.1", now: 2)
        throttle.failed("10.0.0.1", now: 3)
        #expect(throttle.verdict(for: "10.0.0.1", now: 4) == .allowed)
    }

    @Test func rotatingAddressesCannotGrowTheTableBeyondItsBound() {
        var throttle = LoginThrottle(configuration: .init(maxFailures: 2, windowMilliseconds: 60_000, maxAddresses: 100))
        // A throttled address, then 10,000 others inside the same window.
        throttle.failed("victim-watch", now: 0)
        throttle.failed("victim-watch", now: 0)
        #expect(throttle.verdict(for: "victim-watch", now: 1) == .throttled(retryAfterSeconds: 60))
        for index in 0..<10_000 {
            throttle.failed("203.0.113.\(index)", now: 1 + Int64(index))
            #expect(throttle.count <= 100)
        }
        #expect(throttle.count == 100)
        // The earliest window was evicted first; the latest addresses are still counted.
        #expect(throttle.verdict(for: "victim-watch", now: 10_002) == .allowed)
        throttle.failed("203.0.113.9999", now: 10_002)
        #expect(throttle.verdict(for: "203.0.113.9999", now: 10_003) == .throttled(retryAfterSeconds: 60))
    }

    @Test func finishedWindowsAreDroppedBeforeLiveOnesAtTheBound() {
        var throttle = LoginThrottle(configuration: .init(maxFailures: 2, windowMilliseconds: 1_000, maxAddresses: 3))
        throttle.failed("old-1", now: 0)
        throttle.failed("old-2", now: 0)
        throttle.failed("live", now: 5_000)
        throttle.failed("live", now: 5_000)
        throttle.failed("new", now: 5_100)
        #expect(throttle.count == 2)
        #expect(throttle.verdict(for: "live", now: 5_200) == .throttled(retryAfterSeconds: 1))
    }
}
