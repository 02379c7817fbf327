import Testing
import TetherClientCore
@_spi(Benchmarks) import TetherProtocol

@Suite("RetryMachine: one outage's decisions, failure by failure")
struct RetryMachineTests {
    /// One failure fed to the machine.
    struct Failure: Sendable, CustomStringConvertible {
        var category: StatusCategory
        var statusCode: Int?
        var transport: TransportFailure?
        var retryAfter: Duration?
        /// Time since the outage started.
        var at: Duration = .zero

        static let network = Failure(category: .networkIssues)
        static let timeout = Failure(category: .timeout)
        static let refused = Failure(category: .networkIssues, transport: .connectionRefused)
        static let denied = Failure(category: .accessDenied, statusCode: 403)
        static func shed(_ code: Int, retryAfter: Duration?) -> Failure {
            Failure(category: .unknown, statusCode: code, retryAfter: retryAfter)
        }

        var status: Status {
            var status = Status(category: category, operation: .subscribe, statusCode: statusCode, error: transport)
            status.retryAfter = retryAfter
            return status
        }

        var description: String { "\(category)\(statusCode.map { " \($0)" } ?? "")\(transport.map { " \($0)" } ?? "")" }
    }

    struct Row: Sendable, CustomStringConvertible {
        var name: String
        var retry: RetryConfiguration
        var failures: [Failure]
        var expected: [RetryMachine.Decision]
        /// When the loop last recovered, relative to the outage's start (relapse rule).
        var recoveredAt: Duration? = nil
        var description: String { name }
    }

    static let noJitter = RetryConfiguration(jitter: .zero ... .zero)

    static let rows: [Row] = [
        Row(name: "a malformed filter or bad request stops at once", retry: noJitter,
            failures: [Failure(category: .malformedFilterExpression, statusCode: 481)], expected: [.stop]),
        Row(name: "bad request", retry: noJitter, failures: [Failure(category: .badRequest, statusCode: 400)], expected: [.stop]),
        Row(name: "the policy's back-off", retry: noJitter, failures: [.network, .network],
            expected: [.retry(after: .seconds(2)), .retry(after: .seconds(4))]),
        Row(name: "failures that never reach a server retry within a second, without using the policy's retries",
            retry: noJitter, failures: [.refused, .refused, .refused, .timeout],
            expected: [.retry(after: .milliseconds(500)), .retry(after: .milliseconds(500)), .retry(after: .milliseconds(500)),
                       .retry(after: .seconds(2))]),
        Row(name: "an outage within 30 s of the last recovery waits the policy's first delay", retry: noJitter,
            failures: [.refused], expected: [.retry(after: .seconds(2))], recoveredAt: .seconds(-10)),
        Row(name: "a recovery longer ago does not count", retry: noJitter,
            failures: [.refused], expected: [.retry(after: .milliseconds(500))], recoveredAt: .seconds(-31)),
        Row(name: "Retry-After is followed as given, then the policy from its first delay", retry: noJitter,
            failures: [.shed(429, retryAfter: .seconds(30)), .shed(503, retryAfter: .seconds(5)), .shed(500, retryAfter: nil)],
            expected: [.retry(after: .seconds(30)), .retry(after: .seconds(5)), .retry(after: .seconds(2))]),
        Row(name: "Retry-After: 0 is floored at 1 s", retry: noJitter, failures: [.shed(503, retryAfter: .zero)],
            expected: [.retry(after: .seconds(1))]),
        Row(name: "access denied: three retries, one report, then quiet re-checks", retry: noJitter,
            failures: [.denied, .denied, .denied, .denied, .denied],
            expected: [.retry(after: .seconds(2)), .retry(after: .seconds(4)), .retry(after: .seconds(8)),
                       .accessDeniedExhausted(.report, recheck: .everyProbeInterval),
                       .accessDeniedExhausted(.quiet, recheck: .everyProbeInterval)]),
        Row(name: "no retries: give up, access denied is reported and never re-checked", retry: .disabled,
            failures: [.network], expected: [.giveUp]),
        Row(name: "no retries and denied", retry: .disabled, failures: [.denied],
            expected: [.accessDeniedExhausted(.report, recheck: .never)]),
        Row(name: "a linear policy runs out", retry: RetryConfiguration(policy: .linear(delay: .seconds(2), maximumRetries: 1),
                                                                       jitter: .zero ... .zero),
            failures: [.timeout, .timeout], expected: [.retry(after: .seconds(2)), .giveUp]),
    ]

    @Test(arguments: rows)
    func decisions(_ row: Row) {
        var machine = RetryMachine(episode: 7, start: .seconds(100))
        var decisions: [RetryMachine.Decision] = []
        for (index, failure) in row.failures.enumerated() {
            let now = .seconds(100) + failure.at
            decisions.append(machine.failed(failure.status, retry: row.retry, now: now, randomness: 0,
                                            recoveredAt: index == 0 ? row.recoveredAt.map { .seconds(100) + $0 } : nil))
        }
        #expect(decisions == row.expected)
        #expect(machine.episode == 7)
    }

    @Test func attemptsCountEveryScheduledRetryAndRetryAfterIsRemembered() {
        var machine = RetryMachine(episode: 1, start: .zero)
        #expect(machine.attempts == 0)
        _ = machine.failed(Failure.refused.status, retry: Self.noJitter, now: .zero, randomness: 0, recoveredAt: nil)
        _ = machine.failed(Failure.shed(503, retryAfter: .seconds(5)).status, retry: Self.noJitter, now: .seconds(1), randomness: 0,
                           recoveredAt: nil)
        #expect(machine.attempts == 2)
        #expect(machine.honorsRetryAfter)
        _ = machine.failed(Failure.network.status, retry: Self.noJitter, now: .seconds(6), randomness: 0, recoveredAt: nil)
        #expect(!machine.honorsRetryAfter)
        #expect(machine.attempts == 3)
    }

    @Test(arguments: [
        (Status(category: .networkIssues, operation: .subscribe, error: TransportFailure.connectionRefused), true),
        (Status(category: .networkIssues, operation: .subscribe, error: TransportFailure.connectionClosed("reset")), true),
        (Status(category: .malformedResponse, operation: .subscribe, statusCode: 200), true),
        (Status(category: .malformedResponse, operation: .subscribe, statusCode: 502), false),
        (Status(category: .timeout, operation: .subscribe), false),
    ])
    func neverReachedAServer(_ status: Status, _ expected: Bool) {
        #expect(RetryMachine.neverReachedAServer(status) == expected)
    }
}
