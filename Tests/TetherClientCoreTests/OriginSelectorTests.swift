import Testing
import TetherClientCore
@_spi(Benchmarks) import TetherProtocol

@Suite("OriginSelector: which node the next request goes to")
struct OriginSelectorTests {
    static let refused = Status(category: .networkIssues, operation: .subscribe, error: TransportFailure.connectionRefused)
    static let timedOut = Status(category: .timeout, operation: .subscribe, error: TransportFailure.timedOut)

    func selector(_ fallbacks: [String] = ["b:1", "c:1", "d:1"], timeout: Duration = .seconds(600)) -> OriginSelector {
        OriginSelector(primary: "a:1", fallbacks: fallbacks, fallbackRetryTimeout: timeout)
    }

    @Test func thePrimaryIsPreferredUntilItFails() {
        var origins = selector()
        #expect(origins.origin(now: .zero).origin == "a:1")
        origins.answered(at: "a:1", now: .seconds(1))
        #expect(origins.origin(now: .seconds(3600)).origin == "a:1")
        #expect(origins.current == "a:1")
    }

    @Test func aCycleVisitsEveryFallbackOnceInARandomOrderThenTheNextFailureRestartsOnThePrimary() {
        var origins = selector()
        var visited: [String] = []
        var change = origins.failed(at: "a:1", status: Self.refused, now: .zero, randomness: 42)
        while case .failedOver(let from, let to)? = change {
            #expect(from == (visited.last ?? "a:1"))
            visited.append(to)
            #expect(origins.origin(now: .zero).origin == to)
            change = origins.failed(at: to, status: Self.timedOut, now: .zero, randomness: 42)
        }
        #expect(Set(visited) == ["b:1", "c:1", "d:1"] && visited.count == 3)
        #expect(change == .cycleRestarted(from: visited[2], to: "a:1"))
        #expect(origins.current == "a:1")
        // The order is drawn from the randomness: some seed gives another order than this one.
        let orders = Set((0..<16).map { seed -> String in
            var other = selector()
            return other.failed(at: "a:1", status: Self.refused, now: .zero, randomness: UInt64(seed))?.to ?? ""
        })
        #expect(orders.count > 1)
    }

    @Test func aFallbackThatAnswersIsKeptForTheRetryTimeoutThenThePrimaryIsTriedAgain() throws {
        var origins = selector(timeout: .seconds(600))
        let movedChange = origins.failed(at: "a:1", status: Self.refused, now: .seconds(10), randomness: 7)
        let moved = try #require(movedChange)
        origins.answered(at: moved.to, now: .seconds(11))
        #expect(origins.origin(now: .seconds(610)).origin == moved.to)
        #expect(origins.origin(now: .seconds(610)).change == nil)
        let back = origins.origin(now: .seconds(611))
        #expect(back.origin == "a:1")
        #expect(back.change == .primaryRetried(from: moved.to, to: "a:1"))
        #expect(origins.origin(now: .seconds(612)).change == nil)
    }

    @Test func aKeptFallbackThatFailsMovesToTheNextOneOfTheCycle() throws {
        var origins = selector()
        let firstChange = origins.failed(at: "a:1", status: Self.refused, now: .zero, randomness: 3)
        let first = try #require(firstChange)
        origins.answered(at: first.to, now: .seconds(1))
        let secondChange = origins.failed(at: first.to, status: Self.refused, now: .seconds(2), randomness: 3)
        let second = try #require(secondChange)
        guard case .failedOver(first.to, let next) = second else { Issue.record("\(second)"); return }
        #expect(next != first.to && next != "a:1")
    }

    static let applicationErrors: [Status] = [
        Status(category: .badRequest, operation: .publish, statusCode: 400),
        Status(category: .accessDenied, operation: .subscribe, statusCode: 403),
        Status(category: .unknown, operation: .history, statusCode: 404),
        Status(category: .badRequest, operation: .publish, statusCode: 413),
        Status(category: .badRequest, operation: .subscribe, statusCode: 414),
        Status(category: .unknown, operation: .publish, statusCode: 429),
        Status(category: .malformedFilterExpression, operation: .subscribe, statusCode: 481),
        Status(category: .unknown, operation: .publish, statusCode: 507),
        Status(category: .malformedResponse, operation: .subscribe, statusCode: 200),  // a captive portal's page
        Status(category: .networkIssues, operation: .subscribe, error: TransportFailure.connectionClosed("reset")),
        Status(category: .cancelled, operation: .subscribe, error: TransportFailure.cancelled),
    ]

    @Test(arguments: applicationErrors)
    func aRefusalOfTheRequestNeverMovesTheClient(_ status: Status) {
        var origins = selector()
        #expect(!OriginSelector.qualifiesForFailover(status))
        #expect(origins.failed(at: "a:1", status: status, now: .zero, randomness: 1) == nil)
        #expect(origins.current == "a:1")
    }

    static let nodeFailures: [Status] = [
        Status(category: .networkIssues, operation: .subscribe, error: TransportFailure.connectionRefused),
        Status(category: .networkIssues, operation: .time, error: TransportFailure.unreachable("no route")),
        Status(category: .timeout, operation: .subscribe, error: TransportFailure.timedOut),
        Status(category: .tlsConnectionFailed, operation: .publish, error: TransportFailure.tlsHandshakeFailed("alert")),
        Status(category: .tlsUntrustedCertificate, operation: .publish, error: TransportFailure.tlsUntrustedCertificate("self-signed")),
        Status(category: .unknown, operation: .history, statusCode: 500),
        Status(category: .malformedResponse, operation: .subscribe, statusCode: 502),  // a proxy's HTML page
        Status(category: .networkIssues, operation: .subscribe, statusCode: 503),    // a refused WebSocket upgrade while draining
        Status(category: .unknown, operation: .publish, statusCode: 504),
    ]

    @Test(arguments: nodeFailures)
    func aConnectionLevelFailureMovesTheClient(_ status: Status) {
        var origins = selector()
        #expect(OriginSelector.qualifiesForFailover(status))
        #expect(origins.failed(at: "a:1", status: status, now: .zero, randomness: 1)?.from == "a:1")
        #expect(origins.current != "a:1")
    }

    @Test func failuresOfAnOriginNoLongerInUseAreIgnored() throws {
        var origins = selector()
        let movedChange = origins.failed(at: "a:1", status: Self.refused, now: .zero, randomness: 5)
        let moved = try #require(movedChange)
        // Ten more requests that were in flight to the dead primary: one step, not eleven.
        for _ in 0..<10 { #expect(origins.failed(at: "a:1", status: Self.refused, now: .zero, randomness: 5) == nil) }
        #expect(origins.current == moved.to)
        origins.answered(at: "a:1", now: .zero)  // a late answer from the primary changes nothing either
        #expect(origins.current == moved.to)
    }

    @Test func aDrainMovesOnWhateverTheAnswer() {
        var origins = selector(["b:1"])
        #expect(origins.drained(at: "a:1", now: .zero, randomness: 0) == .failedOver(from: "a:1", to: "b:1"))
        #expect(origins.drained(at: "b:1", now: .zero, randomness: 0) == .cycleRestarted(from: "b:1", to: "a:1"))
    }

    @Test func withoutFallbacksNothingEverMoves() {
        var origins = selector([])
        #expect(origins.failed(at: "a:1", status: Self.refused, now: .zero, randomness: 0) == nil)
        #expect(origins.drained(at: "a:1", now: .zero, randomness: 0) == nil)
        #expect(origins.origin(now: .seconds(100_000)).origin == "a:1")
    }

    @Test func aNetworkThatCameBackSendsTheClientToThePrimary() {
        var origins = selector()
        #expect(origins.networkChanged() == nil)
        let moved = origins.failed(at: "a:1", status: Self.refused, now: .zero, randomness: 9)
        #expect(origins.networkChanged() == .primaryRetried(from: moved?.to ?? "", to: "a:1"))
        #expect(origins.current == "a:1")
    }

    @Test func thePrimaryAndRepeatsAreDroppedFromTheFallbacks() {
        #expect(OriginSelector(primary: "a:1", fallbacks: ["a:1", "b:1", "b:1"], fallbackRetryTimeout: .zero).fallbacks == ["b:1"])
    }
}

@Suite("RetryMachine: a failover goes at once")
struct RetryMachineFailoverTests {
    @Test func aFailureThatMovedToAnotherOriginIsRetriedQuicklyAndIgnoresTheLeftNodesRetryAfter() {
        var status = Status(category: .networkIssues, operation: .subscribe, statusCode: 503)
        status.retryAfter = .seconds(30)
        let retry = RetryConfiguration(jitter: .zero ... .zero)
        var same = RetryMachine(episode: 1, start: .zero)
        #expect(same.failed(status, retry: retry, now: .zero, randomness: 0, recoveredAt: nil) == .retry(after: .seconds(30)))
        var moved = RetryMachine(episode: 1, start: .zero)
        #expect(moved.failed(status, retry: retry, now: .zero, randomness: 0, recoveredAt: nil, destination: .anotherOrigin)
            == .retry(after: .milliseconds(500)))
        // A timeout follows the back-off on the same origin, and goes at once to another one.
        let timeout = Status(category: .timeout, operation: .subscribe, error: TransportFailure.timedOut)
        var slow = RetryMachine(episode: 1, start: .zero)
        #expect(slow.failed(timeout, retry: retry, now: .zero, randomness: 0, recoveredAt: nil) == .retry(after: .seconds(2)))
        var fast = RetryMachine(episode: 1, start: .zero)
        #expect(fast.failed(timeout, retry: retry, now: .zero, randomness: 0, recoveredAt: .zero, destination: .anotherOrigin)
            == .retry(after: .milliseconds(500)))
    }
}
