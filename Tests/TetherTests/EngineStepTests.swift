import Logging
import Testing
@testable import Tether
import TetherProtocol
import TetherTesting

/// The subscribe engine driven step by step: the real ``TetherClient`` (machine, shell, request
/// pipeline, decryption) on an ``InMemoryTransport`` and a ``ManualClock``. Every request is
/// answered when the test decides, every timer fires when the test moves the clock to it: no
/// socket, no wall time, no sleep.
@Suite("Subscribe engine step by step (in-memory transport, manual clock)", .timeLimit(.minutes(1)))
struct EngineStepTests {
    // MARK: Connecting and receiving

    @Test func handshakeConnectsAndTheLoopContinuesFromTheCursor() async throws {
        let (client, transport, _) = try makeStepClient()
        var statuses = client.statuses().makeAsyncIterator()
        let subscription = client.subscribe(to: ["a"])[0]
        var messages = subscription.messages.makeAsyncIterator()

        let handshake = try #require(await transport.next(path: "/v2/subscribe"))
        #expect(handshake.path == "/v2/subscribe/demo/a/0")
        #expect(handshake.query["tt"] == "0")
        #expect(handshake.request.isLongPoll)
        handshake.respond(json: subscribeBody(timetoken: 100, region: 3))
        let connected = try #require(await statuses.next())
        #expect(connected.category == .connected)
        #expect(connected.affectedChannels == ["a"] && connected.subscribedChannels == ["a"])
        #expect(connected.lastTimetoken == .zero && connected.currentTimetoken == Timetoken(100))
        #expect(client.connectionState == .connected)

        let poll = try #require(await transport.next(path: "/v2/subscribe"))
        #expect(poll.query["tt"] == "100" && poll.query["tr"] == "3")
        poll.respond(json: subscribeBody(timetoken: 102, envelopes: [envelope("a", 101, #""one""#), envelope("a", 102, #""two""#)]))
        #expect(await messages.next()?.payload == "one")
        #expect(await messages.next()?.payload == "two")
        let next = try #require(await transport.next(path: "/v2/subscribe"))
        #expect(next.query["tt"] == "102")
        #expect(client.currentTimetoken == Timetoken(102))
        await client.shutdown()
        #expect(next.isAbandoned)
    }

    /// Streams and subscriptions made after ``TetherClient/shutdown()`` end at once: the
    /// registries remember that they finished (a stream made as the client shut down used to
    /// miss the finish and wait for good).
    @Test func streamsMadeAfterTheShutdownEndAtOnce() async throws {
        let (client, _, _) = try makeStepClient()
        await client.shutdown()
        var statuses = client.statuses().makeAsyncIterator()
        #expect(await statuses.next() == nil)
        var events = client.connectionEvents().makeAsyncIterator()
        #expect(await events.next() == nil)
        var continuity = client.continuityOutcomes().makeAsyncIterator()
        #expect(await continuity.next() == nil)
        var changes = client.outbox.changes().makeAsyncIterator()
        #expect(await changes.next() == nil)
        for subscription in client.subscribe(to: ["a"]) {
            var messages = subscription.messages.makeAsyncIterator()
            #expect(await messages.next() == nil)
        }
    }

    @Test func aChannelChangeRestartsTheHeldLongPollFromTheSameCursor() async throws {
        let (client, transport, _) = try makeStepClient()
        var statuses = client.statuses().makeAsyncIterator()
        let (held, _) = try await connect(client, transport, &statuses, channels: ["a"])

        client.subscribe(to: ["b"])
        #expect(await held.abandoned())
        let restarted = try #require(await transport.next(path: "/v2/subscribe"))
        #expect(restarted.path == "/v2/subscribe/demo/a,b/0")
        #expect(restarted.query["tt"] == "100")
        #expect(await statuses.next()?.category == .subscriptionChanged)

        client.unsubscribeAll()
        #expect(await restarted.abandoned())
        let leave = try #require(await transport.next(path: "/v2/presence"))
        #expect(leave.path.hasSuffix("/channel/a,b/leave"))
        leave.respond(json: #"{"status":200,"message":"OK","action":"leave","service":"Presence"}"#)
        #expect(await statuses.next()?.category == .disconnected)
        #expect(client.connectionState == .idle)
        await client.shutdown()
    }

    @Test func disconnectAndReconnectKeepTheCursor() async throws {
        let (client, transport, _) = try makeStepClient()
        var statuses = client.statuses().makeAsyncIterator()
        let subscription = client.subscribe(to: ["a"])[0]
        var messages = subscription.messages.makeAsyncIterator()
        try #require(await transport.next(path: "/v2/subscribe")).respond(json: subscribeBody(timetoken: 100))
        #expect(await statuses.next()?.category == .connected)
        let held = try #require(await transport.next(path: "/v2/subscribe"))

        client.disconnect()
        #expect(await held.abandoned())
        #expect(await statuses.next()?.category == .disconnected)
        client.subscribe(to: ["a"])          // seed 000: subscribing again does not reconnect
        client.reconnect()
        // A handshake, then the loop continues from the saved cursor.
        let handshake = try #require(await transport.next(path: "/v2/subscribe"))
        #expect(handshake.query["tt"] == "0")
        handshake.respond(json: subscribeBody(timetoken: 150))
        let reconnected = try #require(await statuses.next())
        #expect(reconnected.category == .reconnected && reconnected.currentTimetoken == Timetoken(100))
        let resumed = try #require(await transport.next(path: "/v2/subscribe"))
        #expect(resumed.query["tt"] == "100")
        resumed.respond(json: subscribeBody(timetoken: 101, envelopes: [envelope("a", 101, #""missed?""#)]))
        #expect(await messages.next()?.payload == "missed?")
        // Handshake, held poll, handshake, resumed poll: the second subscribe() sent nothing.
        #expect(transport.requests.filter { $0.isLongPoll }.count == 4)
        await client.shutdown()
    }

    // MARK: Retry, back-off, give-up and Time probes

    /// Exponential back-off 2, 4, 5, 5 s (capped), give-up, a Time probe every 10 s, restore.
    @Test func backOffGiveUpAndTimeProbesRestore() async throws {
        let (client, transport, clock) = try makeStepClient {
            $0.retry = RetryConfiguration(policy: .exponential(minimumDelay: .seconds(2), maximumDelay: .seconds(5), maximumRetries: 4),
                                          jitter: .zero ... .zero, fastReconnect: nil)
        }
        var statuses = client.statuses().makeAsyncIterator()
        var changes = client.connectionChanges().makeAsyncIterator()
        let (poll, _) = try await connect(client, transport, &statuses, channels: ["a"])
        while let change = await changes.next(), change.current != .connected {}

        poll.fail(.timedOut)
        let lost = try #require(await statuses.next())
        #expect(lost.category == .unexpectedDisconnect && lost.willAutomaticallyRetry)
        #expect(lost.lastTimetoken == Timetoken(100))
        let started = try #require(await changes.next())
        #expect(started.current == .reconnecting(attempt: 1) && started.reconnectEvent == .started)

        for delay in [2, 4, 5, 5] {
            await clock.advanceToSleeper(after: .seconds(delay))
            try #require(await transport.next(path: "/v2/subscribe")).fail(.timedOut)
        }
        let gaveUp = try #require(await statuses.next())
        #expect(gaveUp.category == .disconnectedUnexpectedly && !gaveUp.willAutomaticallyRetry)
        #expect(client.connectionState == .failed(.disconnectedUnexpectedly))
        #expect(clock.now.offset == .seconds(16))

        // Probes keep failing while the origin is away, then one answers.
        await clock.advanceToSleeper(after: .seconds(10))
        try #require(await transport.next(path: "/time/0")).fail(.connectionRefused)
        await clock.advanceToSleeper(after: .seconds(10))
        try #require(await transport.next(path: "/time/0")).respond(json: "[17953281264739664]")
        let restore = try #require(await transport.next(path: "/v2/subscribe"))
        restore.respond(json: subscribeBody(timetoken: 200))
        let back = try #require(await statuses.next())
        #expect(back.category == .reconnected)
        #expect(clock.now.offset == .seconds(36))
        var events: [ReconnectEvent] = [.started]
        while events.count < 4, let change = await changes.next() {
            if let event = change.reconnectEvent { events.append(event) }
        }
        // Strictly paired: the give-up ends the first cycle, the probe's restore starts a second.
        #expect(events == [.started, .failed, .started, .succeeded])
        #expect(client.connectionState == .connected)
        await client.shutdown()
    }

    @Test func aFirstHandshakeThatNeverSucceedsEndsInConnectionErrorWithoutProbes() async throws {
        let (client, transport, clock) = try makeStepClient {
            $0.retry = RetryConfiguration(policy: .linear(delay: .seconds(3), maximumRetries: 1), jitter: .zero ... .zero, fastReconnect: nil)
        }
        var statuses = client.statuses().makeAsyncIterator()
        client.subscribe(to: ["a"])
        try #require(await transport.next(path: "/v2/subscribe")).fail(.timedOut)
        let first = try #require(await statuses.next())
        #expect(first.category == .timeout && first.willAutomaticallyRetry)
        await clock.advanceToSleeper(after: .seconds(3))
        try #require(await transport.next(path: "/v2/subscribe")).fail(.timedOut)
        let failed = try #require(await statuses.next())
        #expect(failed.category == .connectionError && !failed.willAutomaticallyRetry)
        #expect(client.connectionState == .failed(.connectionError))
        // Never connected: nothing to restore, so no Time probe is scheduled.
        #expect(!clock.sleepers.contains(clock.now.advanced(by: .seconds(10))))
        await client.shutdown()
    }

    @Test func aServerThatSaysRetryAfterIsTakenAtItsWord() async throws {
        let (client, transport, clock) = try makeStepClient()
        var statuses = client.statuses().makeAsyncIterator()
        let (poll, _) = try await connect(client, transport, &statuses, channels: ["a"])
        poll.respond(status: 503, json: #"{"status":503,"error":true,"message":"Service Unavailable"}"#, headers: ["retry-after": "7"])
        let lost = try #require(await statuses.next())
        #expect(lost.category == .unexpectedDisconnect && lost.willAutomaticallyRetry)
        // Exactly its Retry-After plus up to 1 s of jitter.
        let delay = await clock.advanceToSleeper(within: .seconds(7) ... .seconds(8))
        #expect(delay >= .seconds(7) && delay <= .seconds(8))
        try #require(await transport.next(path: "/v2/subscribe")).respond(json: subscribeBody(timetoken: 150))
        #expect(await statuses.next()?.category == .reconnected)
        await client.shutdown()
    }

    @Test func nothingListeningIsRetriedWithinASecond() async throws {
        let (client, transport, clock) = try makeStepClient { $0.retry = RetryConfiguration(jitter: .zero ... .zero) }
        var statuses = client.statuses().makeAsyncIterator()
        let (poll, _) = try await connect(client, transport, &statuses, channels: ["a"])
        poll.fail(.connectionRefused)
        #expect(await statuses.next()?.category == .unexpectedDisconnect)
        let delay = await clock.advanceToSleeper(within: .milliseconds(500) ... .seconds(1))
        #expect(delay <= .seconds(1))
        try #require(await transport.next(path: "/v2/subscribe")).respond(json: subscribeBody(timetoken: 150))
        #expect(await statuses.next()?.category == .reconnected)
        await client.shutdown()
    }

    @Test func accessDeniedIsRetriedThenConnects() async throws {
        let (client, transport, clock) = try makeStepClient {
            $0.retry = RetryConfiguration(jitter: .zero ... .zero, accessDeniedRetryLimit: 5, fastReconnect: nil)
        }
        var statuses = client.statuses().makeAsyncIterator()
        client.subscribe(to: ["guarded"])
        try #require(await transport.next(path: "/v2/subscribe")).respond(
            status: 403, json: #"{"message":"Forbidden","payload":{"channels":["guarded"]},"error":true,"service":"Access Manager","status":403}"#)
        let denied = try #require(await statuses.next())
        #expect(denied.category == .accessDenied && denied.deniedChannels == ["guarded"] && denied.statusCode == 403)
        #expect(denied.willAutomaticallyRetry)
        await clock.advanceToSleeper(after: .seconds(2))
        try #require(await transport.next(path: "/v2/subscribe")).respond(json: subscribeBody(timetoken: 100))
        #expect(await statuses.next()?.category == .connected)
        await client.shutdown()
    }

    @Test func aBadFilterExpressionStopsWithoutRetrying() async throws {
        let (client, transport, _) = try makeStepClient { $0.filterExpression = "meta.k == 'unterminated" }
        var statuses = client.statuses().makeAsyncIterator()
        client.subscribe(to: ["a"])
        let handshake = try #require(await transport.next(path: "/v2/subscribe"))
        #expect(handshake.query["filter-expr"] != nil)
        handshake.respond(status: 481, json: #"{"status":481,"error":true,"service":"Subscribe","message":"Invalid filter expression"}"#)
        let status = try #require(await statuses.next())
        #expect(status.category == .malformedFilterExpression && status.operation == .subscribe && !status.willAutomaticallyRetry)
        #expect(client.connectionState == .failed(.malformedFilterExpression))
        await client.shutdown()
    }

    // MARK: Liveness: watchdog, dead-link probe, presence heartbeat

    @Test func aLongPollThatOutlivesItsDeadlineIsRestarted() async throws {
        let (client, transport, clock) = try makeStepClient {
            $0.subscribeTimeout = .seconds(30)
            $0.retry = RetryConfiguration(jitter: .zero ... .zero, fastReconnect: nil)
        }
        var statuses = client.statuses().makeAsyncIterator()
        let (poll, _) = try await connect(client, transport, &statuses, channels: ["a"])
        await clock.advanceToSleeper(after: .seconds(40))   // subscribeTimeout + 10 s
        #expect(await poll.abandoned())
        let lost = try #require(await statuses.next())
        #expect(lost.category == .unexpectedDisconnect && lost.willAutomaticallyRetry)
        await clock.advanceToSleeper(after: .seconds(2))
        try #require(await transport.next(path: "/v2/subscribe")).respond(json: subscribeBody(timetoken: 150))
        #expect(await statuses.next()?.category == .reconnected)
        await client.shutdown()
    }

    /// The long-poll hangs and the liveness probe (Time) fails: a dead link, noticed at the first
    /// probe, 25 s after connecting.
    @Test func aDeadLinkIsNoticedByTheLivenessProbe() async throws {
        let (client, transport, clock) = try makeStepClient {
            $0.deadLinkDetection = DeadLinkDetection(probeInterval: .seconds(25), probeTimeout: .seconds(10))
            $0.retry = RetryConfiguration(jitter: .zero ... .zero, fastReconnect: nil)
        }
        var statuses = client.statuses().makeAsyncIterator()
        let (poll, _) = try await connect(client, transport, &statuses, channels: ["a"])
        await clock.advanceToSleeper(after: .seconds(25))
        let probe = try #require(await transport.next(path: "/time/0"))
        #expect(probe.request.timeout == .seconds(10))
        probe.fail(.timedOut)
        #expect(await poll.abandoned())
        #expect(await statuses.next()?.category == .unexpectedDisconnect)
        #expect(clock.now.offset == .seconds(25))
        await client.shutdown()
    }

    /// A reported gap is backfilled from history for that range only: paged down from the gap's
    /// end, not from now (on a busy channel, everything newer was fetched and thrown away). A
    /// backfill that fails is told — its history request's status (what it would have recovered
    /// is missing; the gap stays in the continuity outcome) — and the loop goes on.
    @Test(arguments: [false, true])
    func aGapIsBackfilledForItsRangeOnly(historyFails: Bool) async throws {
        let (client, transport, _) = try makeStepClient()
        var statuses = client.statuses().makeAsyncIterator()
        let (poll, subscription) = try await connect(client, transport, &statuses, channels: ["a"])
        var messages = subscription.messages.makeAsyncIterator()
        poll.respond(json: subscribeBody(timetoken: 400, envelopes: [envelope("a", 350, #""live""#)]),
                     headers: ["x-tether-gap": "a;from=100;through=300"])
        let history = try #require(await transport.next(path: "/v3/history"))
        #expect(history.query["end"] == "101", "after the gap's start")
        #expect(history.query["start"] == "301", "and not past its end")
        if historyFails {
            history.fail(.timedOut)
            let failed = try #require(await statuses.next())
            #expect(failed.category == .timeout, "\(failed)")
        } else {
            history.respond(json: #"{"status":200,"error":false,"error_message":"","channels":{"a":[{"message":"kept","timetoken":"200"}]}}"#)
            #expect(await messages.next()?.timetoken == Timetoken(200))
        }
        #expect(await messages.next()?.timetoken == Timetoken(350))
        #expect(try #require(await transport.next(path: "/v2/subscribe")).query["tt"] == "400")
        await client.shutdown()
    }

    /// A probe still out when its connection fails belongs to that connection: when it times out
    /// after the client has reconnected, the new connection is not declared dead (it was, with a
    /// second `unexpectedDisconnect` and its long-poll cut off).
    @Test func aProbeOfAnEarlierConnectionDoesNotDeclareTheNextOneDead() async throws {
        let (client, transport, clock) = try makeStepClient {
            $0.deadLinkDetection = DeadLinkDetection(probeInterval: .seconds(25), probeTimeout: .seconds(10))
            $0.retry = RetryConfiguration(jitter: .zero ... .zero, fastReconnect: nil)
        }
        var statuses = client.statuses().makeAsyncIterator()
        let (poll, _) = try await connect(client, transport, &statuses, channels: ["a"])
        await clock.advanceToSleeper(after: .seconds(25))
        let probe = try #require(await transport.next(path: "/time/0"))
        poll.fail(.connectionClosed("reset by peer"))
        #expect(await statuses.next()?.category == .unexpectedDisconnect)
        await clock.advanceToSleeper(after: .seconds(2))
        try #require(await transport.next(path: "/v2/subscribe")).respond(json: subscribeBody(timetoken: 150))
        #expect(await statuses.next()?.category == .reconnected)
        let next = try #require(await transport.next(path: "/v2/subscribe"))
        // The old probe's answer comes late, as a failure.
        probe.fail(.timedOut)
        // The new connection's own probe, 25 s after it connected, is the next thing to happen.
        await clock.advanceToSleeper(after: .seconds(25))
        try #require(await transport.next(path: "/time/0")).respond(json: "[17953281264739664]")
        #expect(!next.isAbandoned, "the new long-poll is kept")
        #expect(client.connectionState == .connected)
        await client.shutdown()
        while let status = await statuses.next() {
            #expect(status.category != .unexpectedDisconnect, "no second disconnect: \(status)")
        }
    }

    @Test func aLivenessProbeThatAnswersKeepsTheLongPollAndTheSecondRestartsItFromItsCursor() async throws {
        let (client, transport, clock) = try makeStepClient {
            $0.deadLinkDetection = DeadLinkDetection(probeInterval: .seconds(25), probeTimeout: .seconds(10))
        }
        var statuses = client.statuses().makeAsyncIterator()
        let (poll, _) = try await connect(client, transport, &statuses, channels: ["a"])
        await clock.advanceToSleeper(after: .seconds(25))
        try #require(await transport.next(path: "/time/0")).respond(json: "[17953281264739664]")
        await clock.waitForSleeper(until: clock.now.advanced(by: .seconds(25)))
        #expect(!poll.isAbandoned)
        #expect(transport.pending.map(\.path) == ["/v2/subscribe/demo/a/0"])
        // A REST probe proves the path, not the long-poll's socket (a NAT may have dropped it):
        // after the second, the waiting long-poll is replaced by a fresh one from the same cursor.
        await clock.advanceToSleeper(after: .seconds(25))
        try #require(await transport.next(path: "/time/0")).respond(json: "[17953281264739664]")
        #expect(await poll.abandoned())
        let fresh = try #require(await transport.next(path: "/v2/subscribe/demo/a/0"))
        #expect(fresh.query["tt"] == poll.query["tt"])
        await client.shutdown()
    }

    @Test func presenceHeartbeatsRunOnTheClockAndReportTheirOutcome() async throws {
        let (client, transport, clock) = try makeStepClient {
            $0.heartbeatInterval = 60
            $0.heartbeatReporting = .all
            $0.retry = RetryConfiguration(jitter: .zero ... .zero, fastReconnect: nil)
        }
        var statuses = client.statuses().makeAsyncIterator()
        let (poll, _) = try await connect(client, transport, &statuses, channels: ["a"])
        for _ in 0..<2 {
            await clock.advanceToSleeper(after: .seconds(60))
            let heartbeat = try #require(await transport.next(path: "/v2/presence"))
            #expect(heartbeat.path == "/v2/presence/sub-key/demo/channel/a/heartbeat")
            heartbeat.respond(json: #"{"status":200,"message":"OK","service":"Presence"}"#)
            let acknowledged = try #require(await statuses.next())
            #expect(acknowledged.category == .acknowledgment && acknowledged.operation == .heartbeat)
        }
        // A failed heartbeat is reported, and (one failure is the limit) restarts the loop.
        await clock.advanceToSleeper(after: .seconds(60))
        try #require(await transport.next(path: "/v2/presence")).fail(.timedOut)
        let failed = try #require(await statuses.next())
        #expect(failed.category == .timeout && failed.operation == .heartbeat)
        #expect(await poll.abandoned())
        #expect(await statuses.next()?.category == .unexpectedDisconnect)
        #expect(clock.now.offset == .seconds(180))
        await client.shutdown()
    }

    // MARK: Network monitor

    @Test func networkDownStopsAndNetworkUpReconnectsAtOnce() async throws {
        let monitor = ScriptedNetworkMonitor()
        let (client, transport, _) = try makeStepClient(monitor: monitor)
        var statuses = client.statuses().makeAsyncIterator()
        let (poll, subscription) = try await connect(client, transport, &statuses, channels: ["a"])
        monitor.send(.down)
        #expect(await statuses.next()?.category == .networkDown)
        #expect(await poll.abandoned())
        #expect(client.connectionState == .waitingForNetwork)
        monitor.send(.up)
        #expect(await statuses.next()?.category == .networkUp)
        try #require(await transport.next(path: "/v2/subscribe")).respond(json: subscribeBody(timetoken: 150))
        #expect(await statuses.next()?.category == .reconnected)
        var messages = subscription.messages.makeAsyncIterator()
        let resumed = try #require(await transport.next(path: "/v2/subscribe"))
        #expect(resumed.query["tt"] == "100")
        resumed.respond(json: subscribeBody(timetoken: 101, envelopes: [envelope("a", 101, #""offline""#)]))
        #expect(await messages.next()?.payload == "offline")
        await client.shutdown()
    }

    // MARK: What the engine reports about the messages themselves

    @Test func undecryptableMessagesAreDeliveredWithTheirRawPayloadAndAStatus() async throws {
        let (client, transport, _) = try makeStepClient { $0.cryptoModule = .aesCBC(cipherKey: "right key") }
        var statuses = client.statuses().makeAsyncIterator()
        let subscription = client.subscribe(to: ["a"])[0]
        var messages = subscription.messages.makeAsyncIterator()
        try #require(await transport.next(path: "/v2/subscribe")).respond(json: subscribeBody(timetoken: 100))
        #expect(await statuses.next()?.category == .connected)

        let good = try CryptoModule.aesCBC(cipherKey: "right key").encrypt(message: ["secret": 1]).jsonText
        let bad = try CryptoModule.aesCBC(cipherKey: "wrong key").encrypt(message: "live").jsonText
        try #require(await transport.next(path: "/v2/subscribe")).respond(
            json: subscribeBody(timetoken: 102, envelopes: [envelope("a", 101, good), envelope("a", 102, bad)]))
        let first = try #require(await messages.next())
        #expect(first.payload == ["secret": 1] && first.decryptionError == nil)
        let second = try #require(await messages.next())
        let status = try #require(second.decryptionError)
        #expect(status.category == .decryptionError)
        #expect(status.undecryptableMessage?.channel == "a" && status.undecryptableMessage?.timetoken == Timetoken(102))
        #expect(status.undecryptableMessage?.rawPayload == second.payload && second.payload.stringValue != nil)
        let reported = try #require(await statuses.next())
        #expect(reported.category == .decryptionError && reported.undecryptableMessage?.timetoken == Timetoken(102))
        await client.shutdown()
    }

    @Test func aFullResponseSaysTheAppMayBeBehind() async throws {
        let (client, transport, _) = try makeStepClient()
        var statuses = client.statuses().makeAsyncIterator()
        let (full, subscription) = try await connect(client, transport, &statuses, channels: ["a"])
        var messages = subscription.messages.makeAsyncIterator()
        full.respond(json: subscribeBody(timetoken: 300, envelopes: (1...100).map { envelope("a", UInt64(100 + $0), "\($0)") }))
        let exceeded = try #require(await statuses.next())
        #expect(exceeded.category == .requestMessageCountExceeded)
        #expect(exceeded.lastTimetoken == Timetoken(100) && exceeded.currentTimetoken == Timetoken(300))
        // Below the threshold: no status (the next one is the disconnect).
        try #require(await transport.next(path: "/v2/subscribe"))
            .respond(json: subscribeBody(timetoken: 320, envelopes: (1...20).map { envelope("a", UInt64(300 + $0), "\($0)") }))
        for _ in 0..<120 { _ = await messages.next() }
        client.disconnect()
        #expect(await statuses.next()?.category == .disconnected)
        await client.shutdown()
    }

    // MARK: Shutdown

    @Test func shutdownAbandonsEveryRequestAndFinishesTheStreams() async throws {
        let (client, transport, _) = try makeStepClient()
        var statuses = client.statuses().makeAsyncIterator()
        let (poll, _) = try await connect(client, transport, &statuses, channels: ["a"])
        await client.shutdown()
        #expect(poll.isAbandoned)
        #expect(transport.isShutDown)
        #expect(await statuses.next() == nil)
        let after = await failure { try await client.time() }
        #expect(after?.category == .cancelled, "\(String(describing: after))")
    }
}

// MARK: - Support

/// A client on an in-memory transport and a manual clock: no jitter, no dead-link probe unless
/// the test asks for one.
func makeStepClient(monitor: (any NetworkMonitor)? = nil, configure: (inout TetherConfiguration) -> Void = { _ in })
    throws -> (TetherClient, InMemoryTransport, ManualClock)
{
    var logger = Logger(label: "tether.test.step")
    logger.logLevel = .warning
    var configuration = try TetherConfiguration(subscribeKey: "demo", publishKey: "demo", userId: "stepper", origin: "tether.invalid",
                                                useTLS: false, logger: logger)
    configuration.deadLinkDetection = nil
    configuration.retry = RetryConfiguration(jitter: .zero ... .zero)
    configure(&configuration)
    let transport = InMemoryTransport()
    let clock = ManualClock()
    return (TetherClient(configuration: configuration, transport: transport, clock: clock, networkMonitor: monitor), transport, clock)
}

/// Subscribes, answers the handshake at timetoken 100 and returns the first long-poll, held.
func connect(_ client: TetherClient, _ transport: InMemoryTransport, _ statuses: inout AsyncStream<Status>.Iterator,
             channels: [String]) async throws -> (InMemoryTransport.Exchange, Subscription) {
    let subscription = client.subscribe(to: channels)[0]
    try #require(await transport.next(path: "/v2/subscribe")).respond(json: subscribeBody(timetoken: 100))
    let connected = try #require(await statuses.next())
    #expect(connected.category == .connected)
    return (try #require(await transport.next(path: "/v2/subscribe")), subscription)
}

/// A subscribe response body.
func subscribeBody(timetoken: UInt64, region: Int = 1, envelopes: [String] = []) -> String {
    #"{"t":{"t":"\#(timetoken)","r":\#(region)},"m":[\#(envelopes.joined(separator: ","))]}"#
}

/// One message envelope; `payload` is JSON text.
func envelope(_ channel: String, _ timetoken: UInt64, _ payload: String, publisher: String = "someone") -> String {
    #"{"a":"1","f":0,"i":"\#(publisher)","p":{"t":"\#(timetoken)","r":1},"k":"demo","c":"\#(channel)","d":\#(payload)}"#
}
