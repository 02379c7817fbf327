import Testing
import TetherClientCore
@_spi(Benchmarks) import TetherProtocol

/// The subscribe machine across `enterBackground` / `enterForeground` (issue 18, points 1–4):
/// each policy, each catch-up mode, and the pauses of seed 001.
@Suite("SubscribeMachine: app lifecycle")
struct LifecycleMachineTests {
    static func harness(_ lifecycle: LifecycleOptions) -> Harness {
        Harness(.init(retry: RetryConfiguration(jitter: .zero ... .zero), lifecycle: lifecycle))
    }

    static func receiving(_ lifecycle: LifecycleOptions, channels: [String] = ["a"]) -> Harness {
        var h = harness(lifecycle)
        h.subscribe(channels)
        h.succeed(100)
        h.succeed(150, events: [event("a", 150)])
        #expect(h.machine.connectionState == .connected)
        return h
    }


    @Test("hostile lifecycle values are bounded whether given to init or set later", arguments: [
        Duration.zero, .seconds(-5), .nanoseconds(1), .seconds(Int64.max), .seconds(86_401), .milliseconds(99),
    ])
    func hostileValuesAreBounded(_ value: Duration) {
        func check(_ options: LifecycleOptions) {
            #expect(options.foregroundProbeTimeout >= .milliseconds(100) && options.foregroundProbeTimeout <= .seconds(60))
            guard case .suspend(let keepAlive, _) = options.backgroundPolicy else {
                Issue.record("the policy changed kind: \(options.backgroundPolicy)")
                return
            }
            #expect(keepAlive >= .seconds(1) && keepAlive <= .seconds(86_400))
        }
        check(LifecycleOptions(backgroundPolicy: .suspend(keepAlive: value), foregroundProbeTimeout: value))
        var later = LifecycleOptions()
        later.backgroundPolicy = .suspend(keepAlive: value, keepPresence: false)
        later.foregroundProbeTimeout = value
        check(later)
        guard case .suspend(_, let keepPresence) = later.backgroundPolicy else { return }
        #expect(!keepPresence, "bounding keeps the other settings")
        // The other policies carry nothing to bound.
        later.backgroundPolicy = .keep
        #expect(later.backgroundPolicy == .keep)
    }

    @Test("disconnect policy: the connection is let go with the cursor kept; foreground probes, then resumes from the cursor")
    func disconnectThenCatchUp() throws {
        var h = Self.receiving(.catchUpEverything(unsubscribeInBackground: true))
        h.record(h.machine.enterBackground(now: h.now))
        #expect(h.released == [.disconnect])
        #expect(h.machine.connectionState == .background)
        #expect(h.machine.cursor?.timetoken == Timetoken(150))
        #expect(h.timers.isEmpty, "nothing runs in the background")
        #expect(h.changes.last?.reconnectEvent == nil, "going to the background is not an outage")

        let requestBefore = h.lastRequest
        h.record(h.machine.enterForeground(now: h.now))
        let probe = try #require(h.foregroundProbes.last)
        #expect(probe.counting.isEmpty, "catch-up everything does not count")
        #expect(h.lastRequest == requestBefore, "no subscribe before the probe answers")
        #expect(h.machine.connectionState == .reconnecting(attempt: 0))
        #expect(h.changes.last?.reconnectEvent == .started)

        h.record(h.machine.foregroundProbeSucceeded(probe.id, counts: nil, now: h.now))
        #expect(h.lastRequest != requestBefore, "the handshake starts once the probe answered")
        h.succeed(300)
        #expect(h.categories.last == .reconnected)
        #expect(h.machine.connectionState == .connected)
        #expect(h.changes.last?.reconnectEvent == .succeeded)
        // The loop continues from the saved cursor (150), so the server replays what was missed.
        #expect(h.machine.cursor?.timetoken == Timetoken(150))
    }

    @Test("entering the background twice, or the foreground without a background, does nothing")
    func idempotent() {
        var h = Self.receiving(LifecycleOptions(backgroundPolicy: .disconnect))
        h.record(h.machine.enterForeground(now: h.now))
        #expect(h.foregroundProbes.isEmpty)
        h.record(h.machine.enterBackground(now: h.now))
        h.record(h.machine.enterBackground(now: h.now))
        #expect(h.released.count == 1)
    }

    @Test("suspend policy: the release asks the server to keep the session for the keep-alive")
    func suspendReleases() {
        var h = Self.receiving(LifecycleOptions(backgroundPolicy: .suspend(keepAlive: .seconds(600))))
        h.record(h.machine.enterBackground(now: h.now))
        #expect(h.released == [.suspend(keepAlive: .seconds(600))])
        #expect(h.machine.connectionState == .background)
    }

    @Test("keep policy: the loop goes on, a failure in the background waits for the foreground, which resets the back-off")
    func keepPausesRetries() throws {
        var h = Self.receiving(.catchUpEverything(unsubscribeInBackground: false))
        h.record(h.machine.enterBackground(now: h.now))
        #expect(h.released.isEmpty)
        #expect(h.machine.connectionState == .connected)
        h.fail(.networkIssues)
        #expect(h.machine.stateName == "retrying")
        let request = h.lastRequest
        // The retry timer fires in the background: nothing starts (seed 001).
        h.fire(.retry)
        #expect(h.lastRequest == request)
        h.fail(.networkIssues)  // a stale failure is ignored
        h.now += .seconds(600)
        // Network up in the background starts nothing either.
        h.record(h.machine.networkDown(now: h.now))
        h.record(h.machine.networkUp(now: h.now))
        #expect(h.lastRequest == request)

        h.record(h.machine.enterForeground(now: h.now))
        let probe = try #require(h.foregroundProbes.last)
        h.record(h.machine.foregroundProbeSucceeded(probe.id, counts: nil, now: h.now))
        #expect(h.lastRequest != request)
        // A failure now starts the back-off over: the first retry's delay is the policy's first.
        h.fail(.networkIssues)
        let first = try #require(h.timers[.retry])
        #expect(first - h.now <= .seconds(2))
    }

    @Test("keep policy: a kept connection is probed on foreground and its long-poll restarted; a failed probe is a dead link")
    func keepProbesOnForeground() throws {
        var h = Self.receiving(.catchUpEverything(unsubscribeInBackground: false))
        h.record(h.machine.enterBackground(now: h.now))
        let poll = h.lastRequest
        h.record(h.machine.enterForeground(now: h.now))
        #expect(h.lastRequest != poll, "the long-poll restarts from its cursor")
        #expect(h.machine.cursor?.timetoken == Timetoken(150))
        let probe = try #require(h.foregroundProbes.last)
        h.record(h.machine.foregroundProbeFailed(probe.id, status: Status(category: .timeout, operation: .time), now: h.now,
                                                 randomness: 0))
        #expect(h.categories.last == .unexpectedDisconnect)
        #expect(h.machine.connectionState == .reconnecting(attempt: 0))
        h.succeed(400)
        #expect(h.categories.last == .reconnected)
    }

    @Test("unread counts: the probe counts per channel since the cursor; the resubscription is live and reports what it skipped")
    func unreadCounts() throws {
        var h = Self.receiving(.unreadCountsWithPush, channels: ["a", "b", "a-pnpres", "news.*"])
        h.record(h.machine.enterBackground(now: h.now))
        h.record(h.machine.enterForeground(now: h.now))
        let probe = try #require(h.foregroundProbes.last)
        #expect(probe.counting == ["a": Timetoken(150), "b": Timetoken(150)], "presence and wildcard channels are not counted")
        h.record(h.machine.foregroundProbeSucceeded(probe.id, counts: ["a": 3, "b": 0], now: h.now))
        h.succeed(900)
        #expect(h.machine.cursor?.timetoken == Timetoken(900), "live: nothing is replayed")
        let outcomes = Dictionary(uniqueKeysWithValues: h.continuity.map { ($0.channel, $0) })
        #expect(outcomes["a"]?.outcome == .skipped(through: Timetoken(900), count: 3))
        #expect(outcomes["a"]?.resumedFrom == Timetoken(150))
        #expect(outcomes["b"]?.outcome == .skipped(through: Timetoken(900), count: 0))
        #expect(h.categories.last == .reconnected)
    }

    @Test("unread counts through the server's counted cursor: a message published between the count and the new subscription is delivered, not lost")
    func unreadCountsResumeFromTheCountedCursor() throws {
        var h = Self.receiving(.unreadCountsWithPush, channels: ["a", "b"])
        h.record(h.machine.enterBackground(now: h.now))
        h.record(h.machine.enterForeground(now: h.now))
        let probe = try #require(h.foregroundProbes.last)
        // The server counted (150, 600]; a message at 700 is published after the count.
        h.record(h.machine.foregroundProbeSucceeded(probe.id, counts: ["a": 3, "b": 0], countedThrough: Timetoken(600), now: h.now))
        h.succeed(900)
        let outcomes = Dictionary(uniqueKeysWithValues: h.continuity.map { ($0.channel, $0) })
        #expect(outcomes["a"]?.outcome == .skipped(through: Timetoken(600), count: 3), "skipped exactly what was counted")
        #expect(outcomes["a"]?.resumedFrom == Timetoken(150))
        #expect(outcomes["b"]?.outcome == .skipped(through: Timetoken(600), count: 0))
        #expect(h.machine.cursor?.timetoken == Timetoken(600), "the subscription resumes where the counts end")
        h.succeed(900, events: [event("a", 700)])
        #expect(h.delivered.map(\.timetoken).contains(Timetoken(700)), "the message after the count arrives")
        #expect(h.categories.last == .reconnected)
    }

    @Test("a counted-through cursor below the saved cursor (a hostile or broken server) is ignored: the skip ends at the handshake's cursor")
    func unreadCountsIgnoreACountedCursorBehindTheSavedOne() throws {
        var h = Self.receiving(.unreadCountsWithPush, channels: ["a"])
        h.record(h.machine.enterBackground(now: h.now))
        h.record(h.machine.enterForeground(now: h.now))
        let probe = try #require(h.foregroundProbes.last)
        h.record(h.machine.foregroundProbeSucceeded(probe.id, counts: ["a": 2], countedThrough: Timetoken(10), now: h.now))
        h.succeed(900)
        #expect(h.continuity.map(\.outcome) == [.skipped(through: Timetoken(900), count: 2)])
        #expect(h.machine.cursor?.timetoken == Timetoken(900), "no rewind before the saved cursor")
    }

    @Test("latest only: no count; the range skipped is reported once connected; a failed probe keeps skipping")
    func latestOnly() throws {
        var h = Self.receiving(.latestOnly)
        h.record(h.machine.enterBackground(now: h.now))
        h.record(h.machine.enterForeground(now: h.now))
        let probe = try #require(h.foregroundProbes.last)
        #expect(probe.counting.isEmpty)
        h.record(h.machine.foregroundProbeFailed(probe.id, status: Status(category: .networkIssues, operation: .time), now: h.now,
                                                 randomness: 0))
        #expect(h.machine.stateName == "retrying")
        h.fireNextTimer()
        h.succeed(700)
        #expect(h.machine.cursor?.timetoken == Timetoken(700))
        #expect(h.continuity.map(\.outcome) == [.skipped(through: Timetoken(700), count: nil)])
        #expect(h.continuity.first?.resumedFrom == Timetoken(150))
    }

    @Test("foreground with the network down waits for it, then resumes at once")
    func foregroundWithoutNetwork() {
        var h = Self.receiving(LifecycleOptions(backgroundPolicy: .disconnect))
        h.record(h.machine.enterBackground(now: h.now))
        h.record(h.machine.networkDown(now: h.now))
        #expect(h.machine.connectionState == .background)
        h.record(h.machine.enterForeground(now: h.now))
        #expect(h.machine.connectionState == .waitingForNetwork)
        #expect(h.foregroundProbes.isEmpty)
        let request = h.lastRequest
        h.record(h.machine.networkUp(now: h.now))
        #expect(h.lastRequest != request)
        h.succeed(500)
        #expect(h.machine.connectionState == .connected)
    }

    @Test("subscribing in the background connects nothing; the foreground takes the new set; unsubscribing all goes idle")
    func subscriptionChangesInBackground() throws {
        var h = Self.receiving(LifecycleOptions(backgroundPolicy: .disconnect))
        h.record(h.machine.enterBackground(now: h.now))
        let request = h.lastRequest
        h.subscribe(["a", "b"])
        #expect(h.lastRequest == request)
        #expect(h.machine.connectionState == .background)
        h.record(h.machine.enterForeground(now: h.now))
        let probe = try #require(h.foregroundProbes.last)
        h.record(h.machine.foregroundProbeSucceeded(probe.id, counts: nil, now: h.now))
        #expect(h.machine.subscribedChannels == ["a", "b"])
        h.record(h.machine.enterBackground(now: h.now))
        h.subscribe([])
        #expect(h.machine.connectionState == .idle)
    }

    @Test("a stopped loop the app cancelled stays stopped across background and foreground")
    func cancelledStaysCancelled() throws {
        var h = Self.receiving(LifecycleOptions(backgroundPolicy: .disconnect))
        h.fail(.networkIssues)
        let episode = try #require(h.episodes.last)
        h.record(h.machine.cancelAutomaticRetry(episode: episode, now: h.now))
        #expect(h.machine.stateName == "stopped")
        h.record(h.machine.enterBackground(now: h.now))
        #expect(h.released.isEmpty)
        h.record(h.machine.enterForeground(now: h.now))
        #expect(h.foregroundProbes.isEmpty)
        #expect(h.machine.stateName == "stopped")
    }

    @Test("reconnect events pair strictly across a background taken in the middle of an outage")
    func pairedAcrossBackground() throws {
        var h = Self.receiving(LifecycleOptions(backgroundPolicy: .disconnect))
        h.fail(.networkIssues)
        h.record(h.machine.enterBackground(now: h.now))
        h.record(h.machine.enterForeground(now: h.now))
        let probe = try #require(h.foregroundProbes.last)
        h.record(h.machine.foregroundProbeSucceeded(probe.id, counts: nil, now: h.now))
        h.succeed(300)
        let events = h.changes.compactMap(\.reconnectEvent)
        #expect(events == [.started, .succeeded])
    }
}

/// Issue 18, point 7: "the liveness probe uses the REST connection pool, not the long-poll's
/// socket, so it can report a healthy link while the subscribe socket is dead".
@Suite("SubscribeMachine: liveness on the long-poll's own socket")
struct LongPollLivenessTests {
    @Test("two REST probes answered while one long-poll waits restart it from its cursor; a socket ping does not")
    func restPassedProbesRestartAWaitingLongPoll() throws {
        var h = Harness()
        h.subscribe(["a"])
        h.succeed(100)
        let poll = try #require(h.lastRequest)
        h.record(h.machine.livenessProbeSucceeded(now: h.now, checkedSubscribeConnection: false))
        #expect(h.lastRequest == poll, "one probe: the long-poll may just be waiting")
        h.record(h.machine.livenessProbeSucceeded(now: h.now, checkedSubscribeConnection: false))
        let restarted = try #require(h.lastRequest)
        #expect(restarted != poll, "the second restarts it on a fresh connection")
        #expect(h.machine.cursor?.timetoken == Timetoken(100), "from the same cursor")
        #expect(h.categories == [.connected], "no status of its own: nothing was lost")
        // A poll that answered in between starts the count again.
        h.succeed(120)
        let next = h.lastRequest
        h.record(h.machine.livenessProbeSucceeded(now: h.now, checkedSubscribeConnection: false))
        #expect(h.lastRequest == next)
        // Pings over the subscription's own socket prove it; nothing restarts.
        for _ in 0..<3 { h.record(h.machine.livenessProbeSucceeded(now: h.now, checkedSubscribeConnection: true)) }
        #expect(h.lastRequest == next)
    }
}

extension LifecycleMachineTests {
    @Test("keep policy over a WebSocket session: the ping probes the subscription's socket, so the receive is not restarted")
    func keepOverASessionIsNotRestarted() throws {
        var h = Self.receiving(.catchUpEverything(unsubscribeInBackground: false))
        h.record(h.machine.enterBackground(now: h.now))
        let poll = h.lastRequest
        h.record(h.machine.enterForeground(now: h.now, probeCoversSubscription: true))
        #expect(h.lastRequest == poll)
        #expect(h.foregroundProbes.count == 1)
    }
}
