import Testing
import TetherClientCore
import TetherProtocol

/// Runs an outage in which every attempt fails at once; returns when each retry started
/// (seconds since the drop) and when the loop gave up.
func schedule(_ retry: RetryConfiguration, randomness: Double = 0) -> (attempts: [Double], gaveUpAt: Double?) {
    var h = Harness(.init(retry: retry, liveness: nil))
    h.subscribe(["a"]); h.succeed(100)
    h.fail(.networkIssues)
    var attempts: [Double] = []
    while h.timers[.retry] != nil {
        h.fire(.retry)
        attempts.append(Double(h.now.components.seconds) + Double(h.now.components.attoseconds) / 1e18)
        guard let id = h.lastRequest else { break }
        h.record(h.machine.subscribeFailed(id, status: Status(category: .networkIssues, operation: .subscribe), now: h.now,
                                           randomness: randomness))
    }
    let gaveUp = h.categories.contains(.disconnectedUnexpectedly)
    return (attempts, gaveUp ? Double(h.now.components.seconds) : nil)
}

struct Immediate3: ReconnectionStrategy {
    func decide(_ context: ReconnectionContext) -> ReconnectionDecision {
        context.attempt <= 3 ? .retry(after: .milliseconds(context.attempt * 100)) : .giveUp
    }
}

@Suite("Reconnection policies: exact schedules")
struct ReconnectionPolicyTests {
    @Test func pubNubExponentialDefault() {
        let retry = RetryConfiguration.default
        let delays = (1...7).map { retry.delay(beforeRetry: $0, elapsed: .zero, randomness: 0) }
        #expect(delays == [2, 4, 8, 16, 32, 64].map { Duration.seconds($0) + .milliseconds(1) } + [nil])
        #expect(retry.delay(beforeRetry: 1, elapsed: .zero, randomness: 1) == .milliseconds(2999))
        let capped = RetryConfiguration(policy: .exponential(minimumDelay: .seconds(2), maximumDelay: .seconds(10), maximumRetries: 6))
        #expect(capped.delay(beforeRetry: 6, elapsed: .zero, randomness: 0) == .milliseconds(10001))
    }

    @Test func pubNubLinearAndMinimumInterval() {
        let linear = RetryConfiguration.linear
        #expect((1...11).map { linear.delay(beforeRetry: $0, elapsed: .zero, randomness: 0.5) }
                == Array(repeating: Duration.milliseconds(2500), count: 10) + [nil])
        let tooFast = RetryConfiguration(policy: .linear(delay: .milliseconds(100), maximumRetries: 3))
        #expect(tooFast.delay(beforeRetry: 1, elapsed: .zero, randomness: 0) == .milliseconds(2001))
        #expect(RetryConfiguration.disabled.delay(beforeRetry: 1, elapsed: .zero, randomness: 0) == nil)
    }

    @Test func pubNubExponentialOutage() {
        let run = schedule(.default)
        #expect(run.attempts == [2.001, 6.002, 14.003, 30.004, 62.005, 126.006])
        #expect(run.gaveUpAt == 126)
    }

    @Test func sendBirdPreset() {
        let run = schedule(.sendBird)
        #expect(run.attempts == [0, 3, 9, 21, 45])
        #expect(run.gaveUpAt == 45)
    }

    @Test func diffusionPreset() {
        let run = schedule(.diffusion)
        #expect(run.attempts == Array(stride(from: 5.0, through: 60.0, by: 5.0)))
        #expect(run.gaveUpAt == 60)
    }

    @Test func diffusionBackOffResetsAfterSuccess() {
        var h = Harness(.init(retry: .diffusionBackOff, liveness: nil))
        h.subscribe(["a"]); h.succeed(100)
        for outage in 0..<2 {
            h.fail(.networkIssues)
            var delays: [Duration] = []
            for _ in 0..<7 {
                let start = h.now
                h.fire(.retry)
                delays.append(h.now - start)
                h.fail(.networkIssues)
            }
            #expect(delays == [0, 1, 2, 3, 4, 5, 5].map { Duration.seconds($0) }, "outage \(outage)")
            h.fire(.retry)
            h.succeed(200)        // handshake: connected again
            h.succeed(201)
        }
    }

    @Test func customStrategyDecides() {
        let retry = RetryConfiguration(policy: .custom(CustomReconnectionStrategy(id: "i3", Immediate3())))
        let run = schedule(retry)
        #expect(run.attempts == [0.1, 0.3, 0.6])
        #expect(run.gaveUpAt == 0)
        #expect(retry == RetryConfiguration(policy: .custom(CustomReconnectionStrategy(id: "i3", Immediate3()))))
    }

    @Test func subscribeIsTheOnlyEndpointRetriedByDefault() {
        #expect(RetryConfiguration.default.retries(.subscribe))
        #expect(!RetryConfiguration.default.retries(.messageSend))
        #expect(!RetryConfiguration.disabled.retries(.subscribe))
    }
}
