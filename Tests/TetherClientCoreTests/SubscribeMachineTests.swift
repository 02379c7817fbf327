import Testing
import TetherClientCore
@_spi(Benchmarks) import TetherProtocol

/// Drives a ``SubscribeMachine`` with explicit time, remembering the last request it started.
struct Harness {
    var machine: SubscribeMachine
    var now: Duration = .zero
    var lastRequest: SubscribeMachine.RequestID?
    var lastBackfill: SubscribeMachine.RequestID?
    var statuses: [Status] = []
    var changes: [ConnectionChange] = []
    var delivered: [ReceivedEvent] = []
    var continuity: [ChannelContinuity] = []
    var timers: [SubscribeMachine.TimerID: Duration] = [:]
    var episodes: [Int] = []
    var probes = 0
    var liveness = 0
    var leaves: [[String]] = []
    var released: [BackgroundPolicy] = []
    var foregroundProbes: [(id: SubscribeMachine.RequestID, counting: [String: Timetoken])] = []

    init(_ configuration: SubscribeMachine.Configuration = .init(retry: RetryConfiguration(jitter: .zero ... .zero))) {
        machine = SubscribeMachine(configuration: configuration)
    }

    @discardableResult
    mutating func record(_ actions: [SubscribeMachine.Action]) -> [SubscribeMachine.Action] {
        for action in actions {
            switch action {
            case .startSubscribe(let id, _, _, _): lastRequest = id
            case .cancelSubscribe: break
            case .schedule(let timer, let after): timers[timer] = now + after
            case .cancelTimer(let timer): timers[timer] = nil
            case .report(let report):
                statuses.append(Status(report))
                if let episode = report.retryEpisode { episodes.append(episode) }
            case .connectionChanged(let change): changes.append(change)
            case .deliver(let events): delivered += events
            case .leave(let channels, _): leaves.append(channels)
            case .probeTime: probes += 1
            case .probeLiveness: liveness += 1
            case .backfill(let id, _): lastBackfill = id
            case .continuity(let outcomes): continuity += outcomes
            case .releaseConnection(let policy, _, _): released.append(policy)
            case .probeForeground(let id, let counting, _): foregroundProbes.append((id, counting))
            }
        }
        return actions
    }

    var categories: [StatusCategory] { statuses.map(\.category) }

    mutating func subscribe(_ channels: [String], groups: [String] = [], timetoken: Timetoken? = nil) {
        record(machine.subscriptionChanged(channels: channels, groups: groups, timetoken: timetoken, now: now))
    }

    mutating func succeed(_ tt: UInt64, events: [ReceivedEvent] = [], gaps: [RetentionGap] = []) {
        guard let id = lastRequest else { return }
        record(machine.subscribeSucceeded(id, response: SubscribeResponse(timetoken: Timetoken(tt), region: 1, events: events), gaps: gaps,
                                          now: now))
    }

    mutating func fail(_ category: StatusCategory, statusCode: Int? = nil, denied: [String] = [], retryAfter: Duration? = nil,
                       error: (any Error)? = nil) {
        guard let id = lastRequest else { return }
        var status = Status(category: category, operation: .subscribe, statusCode: statusCode, error: error, deniedChannels: denied)
        status.retryAfter = retryAfter
        record(machine.subscribeFailed(id, status: status, now: now, randomness: 0))
    }

    /// Advances time to the earliest pending timer and fires it.
    @discardableResult
    mutating func fireNextTimer() -> SubscribeMachine.TimerID? {
        guard let (timer, at) = timers.min(by: { $0.value < $1.value }) else { return nil }
        timers[timer] = nil
        now = max(now, at)
        record(machine.timerFired(timer, now: now, randomness: 0))
        return timer
    }

    mutating func fire(_ timer: SubscribeMachine.TimerID) {
        if let at = timers[timer] { now = max(now, at) }
        timers[timer] = nil
        record(machine.timerFired(timer, now: now, randomness: 0))
    }
}

func event(_ channel: String, _ tt: UInt64, kind: EventKind = .message, subscription: String? = nil) -> ReceivedEvent {
    ReceivedEvent(timetoken: Timetoken(tt), channel: channel, subscription: subscription, payload: .string("m\(tt)"), publisher: "p",
                  meta: nil, kind: kind, customMessageType: nil)
}

@Suite("SubscribeMachine: transition table (every state × every event)")
struct SubscribeMachineTableTests {
    enum Start: String, CaseIterable, Sendable {
        case idle, handshaking, receiving, retrying, waitingForNetwork, stopped, disconnected
    }

    enum Event: String, CaseIterable, Sendable {
        case subscribeNew, subscribeSame, unsubscribeAll, disconnect, reconnect, subscribeSucceeded, failedTransient, failed403,
             failed481, timerRetry, timerTimeProbe, timerLiveness, timerWatchdog, timeProbeSucceeded, timeProbeFailed,
             livenessFailed, networkDown, networkUp, cancelAutomaticRetry
    }

    static func harness(in start: Start) -> Harness {
        var h = Harness(.init(retry: start == .stopped ? .disabled : RetryConfiguration(jitter: .zero ... .zero)))
        switch start {
        case .idle: break
        case .handshaking: h.subscribe(["a"])
        case .receiving:
            h.subscribe(["a"]); h.succeed(100)
        case .retrying:
            h.subscribe(["a"]); h.succeed(100); h.fail(.networkIssues)
        case .waitingForNetwork:
            h.subscribe(["a"]); h.succeed(100); h.record(h.machine.networkDown(now: h.now))
        case .stopped:
            h.subscribe(["a"]); h.succeed(100); h.fail(.networkIssues)
        case .disconnected:
            h.subscribe(["a"]); h.succeed(100); h.record(h.machine.disconnect(now: h.now))
        }
        #expect(h.machine.stateName == start.rawValue)
        return h
    }

    static func apply(_ event: Event, to h: inout Harness) {
        let now = h.now
        switch event {
        case .subscribeNew: h.subscribe(h.machine.subscribedChannels + ["b"])
        case .subscribeSame: h.subscribe(h.machine.subscribedChannels)
        case .unsubscribeAll: h.subscribe([])
        case .disconnect: h.record(h.machine.disconnect(now: now))
        case .reconnect: h.record(h.machine.reconnect(timetoken: nil, now: now))
        case .subscribeSucceeded: h.succeed(200)
        case .failedTransient: h.fail(.timeout)
        case .failed403: h.fail(.accessDenied, statusCode: 403, denied: ["a"])
        case .failed481: h.fail(.malformedFilterExpression, statusCode: 481)
        case .timerRetry: h.record(h.machine.timerFired(.retry, now: now, randomness: 0))
        case .timerTimeProbe: h.record(h.machine.timerFired(.timeProbe, now: now, randomness: 0))
        case .timerLiveness: h.record(h.machine.timerFired(.liveness, now: now, randomness: 0))
        case .timerWatchdog: h.record(h.machine.timerFired(.longPollWatchdog, now: now, randomness: 0))
        case .timeProbeSucceeded: h.record(h.machine.timeProbeSucceeded(now: now))
        case .timeProbeFailed: h.record(h.machine.timeProbeFailed(now: now))
        case .livenessFailed:
            h.record(h.machine.livenessProbeFailed(status: Status(category: .timeout, operation: .time), now: now, randomness: 0))
        case .networkDown: h.record(h.machine.networkDown(now: now))
        case .networkUp: h.record(h.machine.networkUp(now: now))
        case .cancelAutomaticRetry: h.record(h.machine.cancelAutomaticRetry(episode: 1, now: now))
        }
    }

    /// Expected state after each event, in `Event.allCases` order.
    static let table: [Start: [String]] = [
        .idle: ["handshaking", "idle", "idle", "idle", "idle", "idle", "idle", "idle", "idle", "idle", "idle", "idle", "idle", "idle",
                "idle", "idle", "idle", "idle", "idle"],
        .handshaking: ["handshaking", "handshaking", "idle", "disconnected", "handshaking", "receiving", "retrying", "retrying",
                       "stopped", "handshaking", "handshaking", "handshaking", "retrying", "handshaking", "handshaking",
                       "handshaking", "waitingForNetwork", "handshaking", "handshaking"],
        .receiving: ["receiving", "receiving", "idle", "disconnected", "receiving", "receiving", "retrying", "retrying", "stopped",
                     "receiving", "receiving", "receiving", "retrying", "receiving", "receiving", "handshaking", "waitingForNetwork",
                     "receiving", "receiving"],
        .retrying: ["handshaking", "handshaking", "idle", "disconnected", "handshaking", "retrying", "retrying", "retrying",
                    "retrying", "handshaking", "retrying", "retrying", "retrying", "retrying", "retrying", "retrying",
                    "waitingForNetwork", "retrying", "stopped"],
        .waitingForNetwork: ["waitingForNetwork", "waitingForNetwork", "idle", "disconnected", "handshaking", "waitingForNetwork",
                             "waitingForNetwork", "waitingForNetwork", "waitingForNetwork", "waitingForNetwork",
                             "waitingForNetwork", "waitingForNetwork", "waitingForNetwork", "waitingForNetwork",
                             "waitingForNetwork", "waitingForNetwork", "waitingForNetwork", "handshaking", "waitingForNetwork"],
        .stopped: ["handshaking", "handshaking", "idle", "disconnected", "handshaking", "stopped", "stopped", "stopped", "stopped",
                   "stopped", "stopped", "stopped", "stopped", "handshaking", "stopped", "stopped", "waitingForNetwork", "stopped",
                   "stopped"],
        .disconnected: ["disconnected", "disconnected", "disconnected", "disconnected", "handshaking", "disconnected",
                        "disconnected", "disconnected", "disconnected", "disconnected", "disconnected", "disconnected",
                        "disconnected", "disconnected", "disconnected", "disconnected", "disconnected", "disconnected",
                        "disconnected"],
    ]

    @Test(arguments: Start.allCases)
    func everyEventFrom(_ start: Start) {
        let expected = Self.table[start] ?? []
        #expect(expected.count == Event.allCases.count)
        for (index, event) in Event.allCases.enumerated() {
            var h = Self.harness(in: start)
            // Network up is only a change after a network down.
            if event == .networkUp && start != .waitingForNetwork { h.record(h.machine.networkDown(now: h.now)); h = Self.harness(in: start) }
            Self.apply(event, to: &h)
            #expect(h.machine.stateName == expected[index], "\(start) + \(event)")
        }
    }
}

@Suite("SubscribeMachine: statuses, retry, restore, continuity")
struct SubscribeMachineBehaviourTests {
    @Test func connectedCarriesSeed000Payload() {
        var h = Harness()
        h.subscribe(["ch1", "ch2"])
        #expect(h.machine.connectionState == .connecting)
        h.succeed(15856996387695942)
        let connected = h.statuses.last
        #expect(connected?.category == .connected)
        #expect(connected?.affectedChannels == ["ch1", "ch2"])
        #expect(connected?.subscribedChannels == ["ch1", "ch2"])
        #expect(connected?.lastTimetoken == .zero)
        #expect(connected?.currentTimetoken == Timetoken(15856996387695942))
        h.subscribe(["ch1", "ch2", "ch3", "ch4"])
        let changed = h.statuses.last
        #expect(changed?.category == .subscriptionChanged)
        #expect(changed?.affectedChannels == ["ch3", "ch4"])
        #expect(changed?.subscribedChannels == ["ch1", "ch2", "ch3", "ch4"])
        #expect(changed?.lastTimetoken == Timetoken(15856996387695942))
        h.subscribe(["ch3", "ch4"])
        #expect(h.leaves.last == ["ch1", "ch2"])
        h.subscribe([])
        #expect(h.categories == [.connected, .subscriptionChanged, .subscriptionChanged, .disconnected])
        #expect(h.machine.connectionState == .idle)
    }

    /// A catch-up that another outage cuts short is continued by the next reconnect's: the gap
    /// the server reported on its first page (and will not report again: the next catch-up
    /// starts past it) and what it recovered are reported once the client is current, with the
    /// cursor the client first resumed from.
    @Test func aCatchUpCutShortByAnotherOutageKeepsItsGapAndCount() {
        var h = Harness(.init(retry: RetryConfiguration(jitter: .zero ... .zero), backfill: .never, catchUpPageSize: 2))
        h.subscribe(["a"]); h.succeed(100)
        h.fail(.networkIssues)
        h.fire(.retry)
        h.succeed(500)                                         // the handshake: catch up 100 → 500
        h.succeed(250, events: [event("a", 200), event("a", 250)],
                  gaps: [RetentionGap(channel: "a", from: Timetoken(100), through: Timetoken(150))])
        #expect(h.continuity.isEmpty, "a full page: the catch-up goes on")
        h.fail(.networkIssues)                                 // cut short
        h.fire(.retry)
        h.succeed(600)                                         // catch up 250 → 600
        h.succeed(600, events: [event("a", 300)])
        #expect(h.delivered.map(\.timetoken.rawValue) == [200, 250, 300])
        #expect(h.continuity == [ChannelContinuity(channel: "a", outcome: .gap(from: Timetoken(100), through: Timetoken(150), recovered: 3),
                                                   resumedFrom: Timetoken(100))])
    }

    /// Cut short on its last page: the reconnect finds nothing more, and what the catch-up had
    /// found is still reported (not "continuous").
    @Test func aCatchUpCutShortWithNothingLeftStillReportsItsGap() {
        var h = Harness(.init(retry: RetryConfiguration(jitter: .zero ... .zero), backfill: .never, catchUpPageSize: 2))
        h.subscribe(["a"]); h.succeed(100)
        h.fail(.networkIssues)
        h.fire(.retry)
        h.succeed(500)
        h.succeed(250, events: [event("a", 200), event("a", 250)],
                  gaps: [RetentionGap(channel: "a", from: Timetoken(100), through: Timetoken(150))])
        h.fail(.networkIssues)
        h.fire(.retry)
        h.succeed(250)                                         // the server is where the client is
        #expect(h.continuity == [ChannelContinuity(channel: "a", outcome: .gap(from: Timetoken(100), through: Timetoken(150), recovered: 2),
                                                   resumedFrom: Timetoken(100))])
    }

    @Test func outageRetriesThenReconnectsFromTheLastCursor() {
        var h = Harness()
        h.subscribe(["a"])
        h.succeed(100)
        h.succeed(150, events: [event("a", 150)])
        h.fail(.networkIssues)
        #expect(h.statuses.last?.willAutomaticallyRetry == true)
        #expect(h.machine.connectionState == .reconnecting(attempt: 1))
        #expect(h.timers[.retry] == .seconds(2))
        h.fire(.retry)
        h.fail(.networkIssues)           // no second status for the same outage
        #expect(h.timers[.retry] == .seconds(6))
        h.fire(.retry)
        h.succeed(300)                   // handshake answers
        #expect(h.categories == [.connected, .unexpectedDisconnect, .reconnected])
        #expect(h.statuses.last?.lastTimetoken == Timetoken(150))
        #expect(h.machine.cursor?.timetoken == Timetoken(150))   // continues from the last cursor
        h.succeed(301, events: [event("a", 150), event("a", 200)])
        #expect(h.delivered.map(\.timetoken.rawValue) == [150, 200])   // 150 not delivered twice
        #expect(h.continuity == [ChannelContinuity(channel: "a", outcome: .recovered(count: 1), resumedFrom: Timetoken(150))])
        #expect(h.changes.compactMap(\.reconnectEvent) == [.started, .succeeded])
    }

    /// In the background (the `keep` policy) nothing connects on its own: a path change runs no
    /// early retry and restarts no given-up subscription; the foreground does.
    @Test func aPathChangeInTheBackgroundConnectsNothing() throws {
        var configuration = SubscribeMachine.Configuration(retry: RetryConfiguration(jitter: .zero ... .zero))
        configuration.lifecycle = LifecycleOptions(backgroundPolicy: .keep)
        var h = Harness(configuration)
        h.subscribe(["a"]); h.succeed(100)
        h.record(h.machine.networkUp(now: h.now))
        h.fail(.networkIssues)
        h.record(h.machine.enterBackground(now: h.now))
        let before = h.lastRequest
        h.record(h.machine.networkChanged(now: h.now))
        #expect(h.lastRequest == before, "no early retry in the background")
        h.now += .seconds(5)
        h.record(h.machine.networkChanged(now: h.now))
        #expect(h.lastRequest == before)
        h.record(h.machine.enterForeground(now: h.now))
        let probe = try #require(h.foregroundProbes.last, "the foreground probes first")
        h.record(h.machine.foregroundProbeSucceeded(probe.id, counts: nil, now: h.now))
        #expect(h.lastRequest != before, "then reconnects")
    }

    @Test func networkPathChangeRestartsTheLongPollQuietly() {
        var h = Harness()
        h.subscribe(["a"])
        h.succeed(100)
        h.succeed(150, events: [event("a", 150)])
        var actions = h.machine.networkUp(now: h.now)          // the monitor's first report
        h.record(actions)
        let stale = h.lastRequest
        actions = h.machine.networkChanged(now: h.now)         // Wi-Fi gone, cellular remains
        h.record(actions)
        #expect(actions.contains { if case .cancelSubscribe = $0 { true } else { false } })
        #expect(h.lastRequest != stale)
        #expect(actions.contains { if case .startSubscribe(_, _, _, let cursor) = $0 { cursor?.timetoken == Timetoken(150) } else { false } })
        #expect(h.categories == [.connected])                  // nothing was lost: no status
        #expect(h.machine.connectionState == .connected)
        // During an outage the change runs the scheduled retry now.
        h.fail(.networkIssues)
        #expect(h.timers[.retry] == .seconds(2))
        actions = h.machine.networkChanged(now: h.now)
        h.record(actions)
        #expect(h.timers[.retry] == nil)
        h.succeed(200)
        #expect(h.categories == [.connected, .unexpectedDisconnect, .reconnected])
        #expect(h.machine.cursor?.timetoken == Timetoken(150))
    }

    @Test func failuresThatNeverReachAServerAreRetriedWithinASecond() {
        var h = Harness()
        h.subscribe(["a"])
        h.succeed(100)
        // A restarting server refuses connections: attempts every 0.5–1 s (randomness 0 → 0.5 s).
        for attempt in 1...20 {
            h.fail(.networkIssues, error: TransportFailure.connectionRefused)
            #expect(h.timers[.retry] == h.now + .milliseconds(500), "attempt \(attempt)")
            h.fire(.retry)
        }
        #expect(h.categories == [.connected, .unexpectedDisconnect])     // one status for the outage
        // The policy's retries were not used: another kind of failure gets its first delay.
        h.fail(.timeout)
        #expect(h.timers[.retry] == h.now + .seconds(2))
        h.fire(.retry)
        h.succeed(200)
        #expect(h.categories == [.connected, .unexpectedDisconnect, .reconnected])

        // After the window (5 minutes into an outage) the policy alone decides.
        h.now += .seconds(60)
        h.fail(.networkIssues, error: TransportFailure.connectionRefused)
        let start = h.now
        while h.now - start < .seconds(300) {
            h.fire(.retry)
            h.fail(.networkIssues, error: TransportFailure.connectionRefused)
        }
        #expect(h.timers[.retry] == h.now + .seconds(2))

        // A connection cut before its answer and a captive portal's 200 page are quick too; a
        // server's own error is not. (The outage starts long after the last recovery.)
        h.fire(.retry)
        h.succeed(300)
        h.now += .seconds(60)
        h.fail(.networkIssues, error: TransportFailure.connectionClosed("reset"))
        #expect(h.timers[.retry] == h.now + .milliseconds(500))
        h.fire(.retry)
        h.fail(.malformedResponse, statusCode: 200)
        #expect(h.timers[.retry] == h.now + .milliseconds(500))
        h.fire(.retry)
        h.fail(.unknown, statusCode: 502)
        #expect(h.timers[.retry] == h.now + .seconds(2))           // the policy's first retry
        // A relapse soon after recovering (the same page cut again) waits the policy's delay, so
        // a request that fails after every reconnect cannot loop every second.
        h.fire(.retry)
        h.succeed(400)
        h.fail(.networkIssues, error: TransportFailure.connectionClosed("reset"))
        #expect(h.timers[.retry] == h.now + .seconds(2))
        h.fire(.retry)
        h.fail(.networkIssues, error: TransportFailure.connectionClosed("reset"))   // then quick again
        #expect(h.timers[.retry] == h.now + .milliseconds(500))

        // A custom strategy decides alone.
        var custom = Harness(.init(retry: RetryConfiguration(policy: .custom(CustomReconnectionStrategy(id: "i3", Immediate3())))))
        custom.subscribe(["a"])
        custom.succeed(100)
        custom.fail(.networkIssues, error: TransportFailure.connectionRefused)
        #expect(custom.timers[.retry] == custom.now + .milliseconds(100))
        custom.fire(.retry)
        custom.fail(.networkIssues, error: TransportFailure.connectionRefused)
        #expect(custom.timers[.retry] == custom.now + .milliseconds(200))

        // Presets that reproduce other systems keep their exact schedules.
        var sendBird = Harness(.init(retry: .sendBird))
        sendBird.subscribe(["a"])
        sendBird.succeed(100)
        sendBird.fail(.networkIssues, error: TransportFailure.connectionRefused)
        sendBird.fire(.retry)
        sendBird.fail(.networkIssues, error: TransportFailure.connectionRefused)
        #expect(sendBird.timers[.retry] == sendBird.now + .seconds(3))
    }

    @Test func accessReChecksStayQuietWhateverEndsTheRetries() {
        // The policy runs out before the access-denied limit: still one final status, then quiet.
        var h = Harness(.init(retry: RetryConfiguration(policy: .linear(delay: .seconds(2), maximumRetries: 1), jitter: .zero ... .zero)))
        h.subscribe(["a"]); h.succeed(100)
        h.fail(.accessDenied, statusCode: 403, denied: ["a"])
        h.fireNextTimer(); h.fail(.accessDenied, statusCode: 403, denied: ["a"])
        #expect(h.categories == [.connected, .accessDenied, .accessDenied])
        #expect(h.machine.connectionState == .failed(.accessDenied))
        for _ in 0..<3 {
            #expect(h.fireNextTimer() == .timeProbe)
            let actions = h.machine.timeProbeSucceeded(now: h.now)
            h.record(actions)
            h.fail(.accessDenied, statusCode: 403, denied: ["a"])
        }
        #expect(h.categories == [.connected, .accessDenied, .accessDenied])
        #expect(h.changes.compactMap(\.reconnectEvent) == [.started, .failed])
        // Network down and up in the middle: the re-check goes on, just as quietly.
        var actions = h.machine.networkUp(now: h.now)
        h.record(actions)
        actions = h.machine.networkDown(now: h.now)
        h.record(actions)
        actions = h.machine.networkUp(now: h.now)
        h.record(actions)
        h.fail(.accessDenied, statusCode: 403, denied: ["a"])
        #expect(h.categories == [.connected, .accessDenied, .accessDenied, .networkDown, .networkUp])
        #expect(h.machine.connectionState == .failed(.accessDenied))
        // The grant comes back: `reconnected`, from the cursor.
        #expect(h.fireNextTimer() == .timeProbe)
        actions = h.machine.timeProbeSucceeded(now: h.now)
        h.record(actions)
        h.succeed(200)
        #expect(h.categories.last == .reconnected)
        #expect(h.machine.cursor?.timetoken == Timetoken(100))

        // Never connected: the re-check that succeeds says `connected`.
        var fresh = Harness()
        fresh.subscribe(["a"])
        for _ in 0...3 { fresh.fail(.accessDenied, statusCode: 403, denied: ["a"]); fresh.fireNextTimer() }
        #expect(fresh.categories == [.accessDenied, .accessDenied, .accessDenied, .accessDenied])
        let probed = fresh.machine.timeProbeSucceeded(now: fresh.now)
        fresh.record(probed)
        fresh.succeed(300)
        #expect(fresh.categories.last == .connected)
    }

    @Test func retryAfterZeroIsFlooredAndAPathChangeKeepsIt() {
        var h = Harness()
        h.subscribe(["a"]); h.succeed(100)
        h.fail(.unknown, statusCode: 503, retryAfter: .zero)
        #expect(h.timers[.retry] == h.now + .seconds(1))
        var actions = h.machine.networkUp(now: h.now)
        h.record(actions)
        actions = h.machine.networkChanged(now: h.now)               // the server's wait still holds
        h.record(actions)
        #expect(h.timers[.retry] == h.now + .seconds(1))
        h.fire(.retry)
        h.fail(.networkIssues)                                         // an ordinary back-off...
        actions = h.machine.networkChanged(now: h.now)                 // ...is cut short by a path change
        h.record(actions)
        #expect(h.timers[.retry] == nil)
        h.fail(.networkIssues)
        actions = h.machine.networkChanged(now: h.now)                 // but at most once a second
        h.record(actions)
        #expect(h.timers[.retry] != nil)
    }

    @Test func retryAfterDecidesTheNextAttempt() {
        var h = Harness()
        h.subscribe(["a"])
        h.succeed(100)
        h.fail(.unknown, statusCode: 429, retryAfter: .seconds(30))   // the policy alone would say 2 s
        #expect(h.timers[.retry] == .seconds(30))
        h.fire(.retry)
        h.fail(.unknown, statusCode: 429, retryAfter: .seconds(5))    // not the policy's growing back-off either
        #expect(h.timers[.retry] == .seconds(35))
        for _ in 0..<20 {                                              // the server is alive: never given up on
            h.fire(.retry)
            h.fail(.unknown, statusCode: 503, retryAfter: .seconds(5))
        }
        #expect(h.timers[.retry] == h.now + .seconds(5))
        h.fire(.retry)
        h.fail(.unknown, statusCode: 500)                              // no Retry-After: the policy, from its first delay
        #expect(h.timers[.retry] == h.now + .seconds(2))
        h.fire(.retry)
        h.succeed(200)
        #expect(h.categories == [.connected, .unexpectedDisconnect, .reconnected])
    }

    @Test func givesUpAfterConnectingThenProbesTimeAndRestores() {
        var h = Harness(.init(retry: RetryConfiguration(policy: .linear(delay: .seconds(2), maximumRetries: 2), jitter: .zero ... .zero)))
        h.subscribe(["a"]); h.succeed(100)
        h.fail(.timeout)
        h.fireNextTimer(); h.fail(.timeout)
        h.fireNextTimer(); h.fail(.timeout)
        #expect(h.categories == [.connected, .unexpectedDisconnect, .disconnectedUnexpectedly])
        #expect(h.machine.connectionState == .failed(.disconnectedUnexpectedly))
        #expect(h.timers[.timeProbe] == h.now + .seconds(10))
        h.fire(.timeProbe)
        #expect(h.probes == 1)
        h.record(h.machine.timeProbeFailed(now: h.now))
        h.fire(.timeProbe)
        h.record(h.machine.timeProbeSucceeded(now: h.now))
        h.succeed(500)
        #expect(h.categories.last == .reconnected)
        #expect(h.machine.cursor?.timetoken == Timetoken(100))
        // Strictly paired: the give-up ends the first cycle, the probe's restore starts a second.
        #expect(h.changes.compactMap(\.reconnectEvent) == [.started, .failed, .started, .succeeded])
    }

    @Test func connectionErrorWhenNeverConnected() {
        var h = Harness(.init(retry: RetryConfiguration(policy: .linear(delay: .seconds(2), maximumRetries: 1), jitter: .zero ... .zero)))
        h.subscribe(["a"])
        h.fail(.networkIssues)
        h.fireNextTimer(); h.fail(.networkIssues)
        #expect(h.categories == [.networkIssues, .connectionError])
        #expect(h.timers[.timeProbe] == nil)
    }

    @Test func accessDeniedIsRetriedABoundedNumberOfTimesAndCanBeCancelled() {
        var h = Harness()
        h.subscribe(["a"]); h.succeed(100)
        h.fail(.accessDenied, statusCode: 403, denied: ["a"])
        #expect(h.statuses.last?.deniedChannels == ["a"])
        #expect(h.statuses.last?.willAutomaticallyRetry == true)
        for _ in 0..<3 { h.fireNextTimer(); h.fail(.accessDenied, statusCode: 403, denied: ["a"]) }
        #expect(h.categories == [.connected, .accessDenied, .accessDenied, .accessDenied, .accessDenied])
        #expect(h.statuses.last?.willAutomaticallyRetry == false)
        #expect(h.machine.connectionState == .failed(.accessDenied))

        // Then quiet re-checks every timeProbeInterval (10 s): still denied says nothing new...
        for _ in 0..<3 {
            let probesBefore = h.probes
            #expect(h.fireNextTimer() == .timeProbe)
            #expect(h.probes == probesBefore + 1)
            let actions = h.machine.timeProbeSucceeded(now: h.now)
            h.record(actions)
            h.fail(.accessDenied, statusCode: 403, denied: ["a"])
            #expect(h.categories == [.connected, .accessDenied, .accessDenied, .accessDenied, .accessDenied])
            #expect(h.machine.connectionState == .failed(.accessDenied))
        }
        // ...and the restored grant resumes the subscription from its cursor.
        #expect(h.fireNextTimer() == .timeProbe)
        let actions = h.machine.timeProbeSucceeded(now: h.now)
        h.record(actions)
        h.succeed(300)
        #expect(h.categories.last == .reconnected)
        #expect(h.machine.connectionState == .connected)
        #expect(h.machine.cursor?.timetoken == Timetoken(100))

        var c = Harness()
        c.subscribe(["a"]); c.succeed(100)
        c.fail(.accessDenied, statusCode: 403)
        c.record(c.machine.cancelAutomaticRetry(episode: c.episodes[0], now: c.now))
        #expect(c.timers[.retry] == nil)
        #expect(c.machine.stateName == "stopped")
    }

    /// `cancelAutomaticRetry()` on an outage's status stops that outage wherever it is: waiting
    /// for the network (which coming back must not restart it), or already given up on its own
    /// and probing (whose Time probes and network-up restart must stop).
    @Test func cancellingRetriesWhileWaitingForTheNetworkOrAfterAGiveUpStaysStopped() {
        var h = Harness()
        h.subscribe(["a"]); h.succeed(100)
        h.fail(.networkIssues)
        h.record(h.machine.networkDown(now: h.now))
        #expect(h.machine.stateName == "waitingForNetwork")
        let requestBefore = h.lastRequest
        h.record(h.machine.cancelAutomaticRetry(episode: h.episodes[0], now: h.now))
        #expect(h.machine.stateName == "stopped")
        #expect(h.machine.connectionState == .failed(.disconnectedUnexpectedly))
        h.record(h.machine.networkUp(now: h.now))
        #expect(h.lastRequest == requestBefore, "no handshake on network up")
        #expect(h.timers[.timeProbe] == nil)

        // Retries that ran out on their own: Time probes and the network coming back would
        // restart; the outage's cancel stops both.
        var g = Harness(.init(retry: RetryConfiguration(policy: .linear(delay: .seconds(2), maximumRetries: 1), jitter: .zero ... .zero, fastReconnect: nil)))
        g.subscribe(["a"]); g.succeed(100)
        g.fail(.networkIssues)
        #expect(g.fireNextTimer() == .retry)
        g.fail(.networkIssues)
        #expect(g.machine.stateName == "stopped")
        #expect(g.timers[.timeProbe] != nil)
        let gaveUp = g.lastRequest
        g.record(g.machine.cancelAutomaticRetry(episode: g.episodes[0], now: g.now))
        #expect(g.timers[.timeProbe] == nil, "no more Time probes")
        g.record(g.machine.networkDown(now: g.now))
        g.record(g.machine.networkUp(now: g.now))
        #expect(g.lastRequest == gaveUp, "no handshake on network up")
        #expect(g.machine.connectionState == .failed(.disconnectedUnexpectedly))
        // `reconnect()` still restarts it.
        g.record(g.machine.reconnect(timetoken: nil, now: g.now))
        #expect(g.lastRequest != gaveUp)
    }

    @Test func malformedFilterExpressionDisablesRetry() {
        var h = Harness()
        h.subscribe(["a"])
        h.fail(.malformedFilterExpression, statusCode: 481)
        #expect(h.categories == [.malformedFilterExpression])
        #expect(h.statuses[0].willAutomaticallyRetry == false)
        #expect(h.timers[.retry] == nil && h.timers[.timeProbe] == nil)
    }

    @Test func disconnectThenSubscribeDoesNotReconnectButReconnectDoes() {
        var h = Harness()
        h.subscribe(["a"]); h.succeed(100); h.succeed(120)
        h.record(h.machine.disconnect(now: h.now))
        h.subscribe(["a", "b"])
        #expect(h.machine.stateName == "disconnected")
        h.record(h.machine.reconnect(timetoken: nil, now: h.now))
        h.succeed(400)
        #expect(h.categories == [.connected, .disconnected, .reconnected])
        #expect(h.machine.cursor?.timetoken == Timetoken(120))
    }

    @Test func sameSetRestartsTheLongPollWithTheSameCursor() {
        var h = Harness()
        h.subscribe(["a"]); h.succeed(100)
        let before = h.lastRequest
        h.subscribe(["a"])
        #expect(h.lastRequest != before)
        #expect(h.machine.cursor?.timetoken == Timetoken(100))
        #expect(h.categories == [.connected])
    }

    @Test func keepTimetokenOffTakesAFreshCursor() {
        var h = Harness(.init(retry: .default, keepTimetokenOnListChange: false))
        h.subscribe(["a"]); h.succeed(100)
        h.subscribe(["a", "b"])
        #expect(h.machine.stateName == "handshaking")
        h.succeed(900)
        #expect(h.machine.cursor?.timetoken == Timetoken(900))
        #expect(h.categories == [.connected, .subscriptionChanged])
    }

    @Test func networkDownPausesRetriesAndNetworkUpTriesAtOnce() {
        var h = Harness()
        h.subscribe(["a"]); h.succeed(100)
        h.fail(.networkIssues)
        h.record(h.machine.networkDown(now: h.now))
        #expect(h.timers[.retry] == nil)
        #expect(h.machine.connectionState == .waitingForNetwork)
        h.now += .seconds(600)
        h.record(h.machine.networkUp(now: h.now))
        #expect(h.machine.stateName == "handshaking")
        h.succeed(700)
        #expect(h.categories == [.connected, .unexpectedDisconnect, .networkDown, .networkUp, .reconnected])
    }

    @Test func deadLinkRestartsTheLoopAtOnce() {
        var h = Harness()
        h.subscribe(["a"]); h.succeed(100)
        #expect(h.timers[.liveness] == .seconds(25))
        h.fire(.liveness)
        #expect(h.liveness == 1)
        h.record(h.machine.livenessProbeFailed(status: Status(category: .timeout, operation: .time), now: h.now, randomness: 0))
        #expect(h.machine.stateName == "handshaking")
        h.succeed(200)
        #expect(h.categories == [.connected, .unexpectedDisconnect, .reconnected])
        #expect(HeartbeatTracker(interval: .seconds(25), timeout: .seconds(10)).detectionBound <= .seconds(35))
    }

    @Test func watchdogDeclaresAHungLongPollDead() {
        var h = Harness()
        h.subscribe(["a"]); h.succeed(100)
        #expect(h.timers[.longPollWatchdog] == .seconds(320))
        h.fire(.longPollWatchdog)
        #expect(h.categories == [.connected, .unexpectedDisconnect])
        #expect(h.statuses.last?.serverMessage == "the long-poll outlived its deadline")
    }

    @Test func gapIsBackfilledBeforeLiveDeliveryAndReportedWithBounds() {
        var h = Harness()
        h.subscribe(["a"]); h.succeed(100); h.succeed(110, events: [event("a", 110)])
        h.fail(.networkIssues); h.fireNextTimer(); h.succeed(1000)
        h.succeed(600, events: [event("a", 500), event("a", 600)], gaps: [RetentionGap(channel: "a", from: Timetoken(110), through: Timetoken(400))])
        #expect(h.machine.stateName == "backfilling")
        #expect(h.delivered.count == 1)
        let id = h.lastBackfill!
        h.record(h.machine.backfillCompleted(id, events: [event("a", 300), event("a", 500)], now: h.now))
        #expect(h.delivered.map(\.timetoken.rawValue) == [110, 300, 500, 600])
        #expect(h.continuity == [ChannelContinuity(channel: "a", outcome: .gap(from: Timetoken(300), through: Timetoken(400), recovered: 3),
                                                   resumedFrom: Timetoken(110))])
    }

    @Test func requestMessageCountExceededOncePerBurst() {
        var h = Harness(.init(retry: .default, requestMessageCountThreshold: 2))
        h.subscribe(["a"]); h.succeed(100)
        h.succeed(3, events: [event("a", 101), event("a", 102)])
        h.succeed(4, events: [event("a", 103), event("a", 104)])
        h.succeed(5, events: [event("a", 105)])
        h.succeed(6, events: [event("a", 106), event("a", 107)])
        #expect(h.categories == [.connected, .requestMessageCountExceeded, .requestMessageCountExceeded])
    }

    @Test func restoreOffForgetsTheChannels() {
        var h = Harness(.init(retry: .disabled, restoreSubscription: false))
        h.subscribe(["a"]); h.succeed(100)
        h.fail(.networkIssues)
        #expect(h.machine.subscribedChannels.isEmpty)
        #expect(h.machine.stateName == "idle")
    }

    @Test func gapHeaderParsing() {
        let gaps = RetentionGap.parse(header: "a%2Cb;from=1;through=5, c;from=2;through=9, junk")
        #expect(gaps == [RetentionGap(channel: "a,b", from: Timetoken(1), through: Timetoken(5)),
                         RetentionGap(channel: "c", from: Timetoken(2), through: Timetoken(9))])
    }
}
