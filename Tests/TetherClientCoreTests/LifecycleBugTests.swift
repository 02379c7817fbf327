import Testing
import TetherClientCore
@_spi(Benchmarks) import TetherProtocol

/// The subscribe machine's lifecycle bugs found in review (issue #18, point 7), each pinned by a
/// test that failed before its fix.
@Suite("SubscribeMachine: lifecycle bugs found in review")
struct LifecycleBugTests {
    static func linear(retries: Int) -> SubscribeMachine.Configuration {
        var retry = RetryConfiguration(policy: .linear(delay: .seconds(2), maximumRetries: retries), jitter: .zero ... .zero)
        retry.fastReconnect = nil
        return SubscribeMachine.Configuration(retry: retry)
    }

    @Test func reconnectEventsPairStrictlyAcrossANetworkOutageAndAFailedAttempt() {
        var h = Harness(Self.linear(retries: 5))
        h.subscribe(["a"]); h.succeed(100)
        h.record(h.machine.networkDown(now: h.now))
        h.record(h.machine.networkUp(now: h.now))
        // The first attempt after the network came back fails: still the same reconnection.
        h.fail(.networkIssues)
        #expect(h.fireNextTimer() == .retry)
        h.succeed(120)
        #expect(h.changes.compactMap(\.reconnectEvent) == [.started, .succeeded])
    }

    @Test func aDisconnectDuringAReconnectionEndsItAndAStartBeforeAnyConnectSaysNothing() {
        var h = Harness(Self.linear(retries: 5))
        h.subscribe(["a"]); h.succeed(100)
        h.fail(.networkIssues)
        h.record(h.machine.disconnect(now: h.now))
        h.record(h.machine.reconnect(timetoken: nil, now: h.now))
        h.succeed(130)
        #expect(h.changes.compactMap(\.reconnectEvent) == [.started, .failed, .started, .succeeded])

        // Never connected: disconnect() changes the state, with no `disconnected` status and no
        // reconnect event (nothing was connected to be disconnected from).
        var fresh = Harness(Self.linear(retries: 5))
        fresh.subscribe(["a"])
        fresh.record(fresh.machine.disconnect(now: fresh.now))
        #expect(!fresh.categories.contains(.disconnected))
        #expect(fresh.machine.connectionState == .disconnected)
        #expect(fresh.changes.compactMap(\.reconnectEvent).isEmpty)
    }

    @Test func cancelAutomaticRetryIsNotUndoneByTheTimeProbe() {
        var h = Harness(Self.linear(retries: 5))
        h.subscribe(["a"]); h.succeed(100)
        h.fail(.networkIssues)
        let episode = try! #require(h.episodes.last)
        h.record(h.machine.cancelAutomaticRetry(episode: episode, now: h.now))
        #expect(h.machine.connectionState == .failed(.disconnectedUnexpectedly))
        // Nothing is scheduled: no Time probe comes 10 s later to restore what the app stopped.
        #expect(h.fireNextTimer() == nil)
        #expect(h.probes == 0)
        // Not a network that comes back either.
        h.record(h.machine.networkDown(now: h.now))
        h.record(h.machine.networkUp(now: h.now))
        #expect(h.machine.connectionState == .failed(.disconnectedUnexpectedly))
        // reconnect() does.
        h.record(h.machine.reconnect(timetoken: nil, now: h.now))
        h.succeed(150)
        #expect(h.machine.connectionState == .connected)
    }

    @Test func aClientThatNeverConnectedAndGaveUpRestartsWhenTheNetworkComesBack() {
        var h = Harness(Self.linear(retries: 1))
        h.subscribe(["a"])
        h.fail(.networkIssues)
        #expect(h.fireNextTimer() == .retry)
        h.fail(.networkIssues)
        #expect(h.machine.connectionState == .failed(.connectionError))
        let gaveUpRequest = h.lastRequest
        h.record(h.machine.networkDown(now: h.now))
        h.record(h.machine.networkUp(now: h.now))
        #expect(h.lastRequest != gaveUpRequest, "the network coming back starts an attempt")
        #expect(h.machine.connectionState == .connecting)
        h.succeed(100)
        #expect(h.categories.last == .connected)
    }

    @Test func restoreSubscriptionOffForgetsTheChannelsWhenTheNetworkGoesDown() {
        var configuration = Self.linear(retries: 5)
        configuration.restoreSubscription = false
        var h = Harness(configuration)
        h.subscribe(["a", "b"]); h.succeed(100)
        let connectedRequest = h.lastRequest
        h.record(h.machine.networkDown(now: h.now))
        #expect(h.machine.subscribedChannels.isEmpty, "seed 001: the channel list is cleaned up")
        #expect(h.machine.connectionState == .idle)
        h.record(h.machine.networkUp(now: h.now))
        #expect(h.lastRequest == connectedRequest, "and the network coming back does nothing")
        #expect(h.categories.suffix(2) == [.networkDown, .networkUp])
        #expect(h.changes.compactMap(\.reconnectEvent) == [])
    }
}

extension LifecycleBugTests {
    @Test func aPartialUnsubscribeIsReportedAsAnUnsubscribe() {
        var h = Harness(Self.linear(retries: 5))
        h.subscribe(["a", "b"]); h.succeed(100)
        h.subscribe(["a"])
        let status = h.statuses.last
        #expect(status?.category == .subscriptionChanged)
        #expect(status?.operation == .unsubscribe)
        #expect(status?.affectedChannels == ["b"])
        // Adding (or swapping) names is still a subscribe.
        h.subscribe(["a", "c"])
        #expect(h.statuses.last?.operation == .subscribe)
    }
}
