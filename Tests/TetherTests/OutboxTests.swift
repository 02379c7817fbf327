import Foundation
import Logging
import Synchronization
import Testing
@testable import Tether
import TetherClientCore
import TetherProtocol
import TetherTesting
import TetherTestingServer

/// The outbox shell driven step by step: the real ``TetherClient`` (outbox actor, machine,
/// journal, request pipeline) on an ``InMemoryTransport`` and a ``ManualClock``: every send is
/// answered when the test decides, every retry timer fires when the test moves the clock to it.
@Suite("Outbox step by step (in-memory transport, manual clock)", .timeLimit(.minutes(1)))
struct OutboxStepTests {
    // MARK: Request ids and retries

    @Test func retryableFailuresAreRetriedWithTheSameRequestId() async throws {
        let (client, transport, clock) = try makeOutboxClient()
        let publish = Task { try await client.publish(channel: "a", message: "hello") }

        let first = try #require(await transport.next(path: "/publish"))
        let requestID = try #require(first.query["requestid"])
        #expect(!requestID.isEmpty && UUID(uuidString: requestID) != nil)
        first.respond(status: 503, json: #"{"status":503,"message":"busy","error":true}"#)
        await clock.advanceToSleeper(after: .seconds(2))      // first retry: 2 s
        let second = try #require(await transport.next(path: "/publish"))
        #expect(second.query["requestid"] == requestID)
        second.fail(.timedOut)
        await clock.advanceToSleeper(after: .seconds(4))      // second retry: 4 s
        let third = try #require(await transport.next(path: "/publish"))
        #expect(third.query["requestid"] == requestID)
        third.fail(.connectionClosed("reset"))
        await clock.advanceToSleeper(after: .seconds(8))
        let fourth = try #require(await transport.next(path: "/publish"))
        #expect(fourth.query["requestid"] == requestID)
        fourth.respond(json: #"[1,"Sent","17000000000000001"]"#, headers: ["tether-duplicate": "1"])

        let result = try await publish.value
        #expect(result.timetoken == Timetoken(17_000_000_000_000_001))
        #expect(result.requestId == requestID)
        #expect(result.isRepeat)
        #expect(transport.requests.filter { $0.url.contains("/publish/") }.count == 4)
        #expect(try await client.outbox.messages.isEmpty)
        await client.shutdown()
    }

    @Test func theAppCanChooseTheRequestIdAndABadOneIsRefused() async throws {
        let (client, transport, _) = try makeOutboxClient()
        let publish = Task { try await client.publish(channel: "a", message: 1, options: PublishOptions(requestId: "order-42")) }
        let exchange = try #require(await transport.next(path: "/publish"))
        #expect(exchange.query["requestid"] == "order-42")
        exchange.respond(json: #"[1,"Sent","17000000000000001"]"#)
        let result = try await publish.value
        #expect(result.requestId == "order-42" && !result.isRepeat)

        for bad in ["", "has space", String(repeating: "x", count: 65), "caf\u{e9}"] {
            let status = await failure { try await client.publish(channel: "a", message: 1, options: PublishOptions(requestId: bad)) }
            #expect(status?.category == .badRequest, "\(bad)")
        }
        let signal = await failure { try await client.signal(channel: "a", message: 1, requestId: "tab\there") }
        #expect(signal?.category == .badRequest)
        #expect(transport.requests.count == 1)
        await client.shutdown()
    }

    /// `meta` deeper than a server keeps is refused at once, as a bad request: the server would
    /// refuse every attempt, and the outbox journal (which keeps `meta`) must read back whatever
    /// it took.
    @Test func metaNestedTooDeepIsRefusedAtOnce() async throws {
        let (client, transport, _) = try makeOutboxClient()
        func nested(_ depth: Int) -> JSONValue {
            (1..<depth).reduce(JSONValue.object(["x": 1])) { inner, _ in .object(["x": inner]) }
        }
        let status = await failure { try await client.publish(channel: "a", message: 1, options: PublishOptions(meta: nested(49))) }
        #expect(status?.category == .badRequest)
        #expect(transport.requests.isEmpty, "nothing sent")
        let publish = Task { try await client.publish(channel: "a", message: 1, options: PublishOptions(meta: nested(48))) }
        try #require(await transport.next(path: "/publish")).respond(json: #"[1,"Sent","17000000000000001"]"#)
        _ = try await publish.value
        await client.shutdown()
    }

    /// A publish still waiting when the client shuts down fails `cancelled` with its request id
    /// (without a journal the message is gone; publishing it again with that id is not stored
    /// twice), and as the kind it is.
    @Test func aShutdownFailsAWaitingPublishWithItsRequestId() async throws {
        let (client, transport, _) = try makeOutboxClient()
        let publish = Task { try await client.publish(channel: "a", message: 1) }
        let signal = Task { try await client.signal(channel: "b", message: 2) }
        let sent = try #require(await transport.next(path: "/publish"))
        _ = try #require(await transport.next(path: "/signal"))
        await client.shutdown()
        let failed = await failure { try await publish.value }
        #expect(failed?.category == .cancelled)
        #expect(failed?.requestId != nil && failed?.requestId == sent.query["requestid"])
        #expect(failed?.operation == .publish)
        let failedSignal = await failure { try await signal.value }
        #expect(failedSignal?.operation == .signal && failedSignal?.requestId != nil)
    }

    @Test func aSignalCarriesItsRequestIdToo() async throws {
        let (client, transport, _) = try makeOutboxClient()
        let signal = Task { try await client.signal(channel: "a", message: "typing") }
        let exchange = try #require(await transport.next(path: "/signal"))
        let requestID = try #require(exchange.query["requestid"])
        exchange.respond(json: #"[1,"Sent","17000000000000002"]"#)
        #expect(try await signal.value.requestId == requestID)
        await client.shutdown()
    }

    /// A send that gave up after answers that leave its outcome open (504 "may be stored") says
    /// which request id it used: publishing again with it is answered with the original
    /// timetoken if the first was stored, never stored twice.
    @Test func aSendThatGaveUpNamesItsRequestIdToSendAgainSafely() async throws {
        let (client, transport, clock) = try makeOutboxClient {
            $0.outbox.retry = RetryConfiguration(policy: .exponential(minimumDelay: .seconds(2), maximumDelay: .seconds(2), maximumRetries: 1),
                                                 jitter: .zero ... .zero)
        }
        let publish = Task { try await client.publish(channel: "a", message: "x") }
        let first = try #require(await transport.next(path: "/publish"))
        let requestID = try #require(first.query["requestid"])
        let mayBeStored = #"[0,"Gateway Timeout: the store write timed out while committing; the message may be stored","17000000000000000"]"#
        first.respond(status: 504, json: mayBeStored)
        await clock.advanceToSleeper(after: .seconds(2))
        let second = try #require(await transport.next(path: "/publish"))
        #expect(second.query["requestid"] == requestID)
        second.respond(status: 504, json: mayBeStored)
        let status = await failure { try await publish.value }
        #expect(status?.statusCode == 504)
        #expect(status?.requestId == requestID)

        // Sent again with it: the server's answer for a repeat, one message.
        let again = Task { try await client.publish(channel: "a", message: "x", options: PublishOptions(requestId: status?.requestId)) }
        let third = try #require(await transport.next(path: "/publish"))
        #expect(third.query["requestid"] == requestID)
        third.respond(json: #"[1,"Sent","17000000000000001"]"#, headers: ["tether-duplicate": "1"])
        #expect(try await again.value.isRepeat)
        await client.shutdown()
    }

    @Test(arguments: [(403, StatusCategory.accessDenied), (400, .badRequest), (413, .badRequest)])
    func answersThatCannotChangeFailAtOnce(code: Int, category: StatusCategory) async throws {
        let (client, transport, clock) = try makeOutboxClient()
        let publish = Task { try await client.publish(channel: "a", message: "x") }
        let exchange = try #require(await transport.next(path: "/publish"))
        exchange.respond(status: code, json: #"{"status":\#(code),"message":"no","error":true,"service":"Access Manager"}"#)
        let status = await failure { try await publish.value }
        #expect(status?.category == category)
        #expect(status?.statusCode == code)
        #expect(status?.requestId == exchange.query["requestid"])
        #expect(clock.sleepers.isEmpty, "no retry is scheduled")
        #expect(transport.requests.count == 1)
        // `publish` returned the failure: the message has left the outbox.
        #expect(try await client.outbox.messages.isEmpty)

        // Through `enqueue`, the failed message stays, visible, until resent or cancelled.
        let entry = try await client.outbox.enqueue(channel: "a", message: "y")
        try #require(await transport.next(path: "/publish")).respond(status: code, json: #"{"status":\#(code),"error":true}"#)
        let failed = await failure { try await client.outbox.result(of: entry.id) }
        #expect(failed?.category == category)
        let listed = try await client.outbox.messages
        #expect(listed.map(\.id) == [entry.id])
        #expect(listed.first?.state == .failed(category) && listed.first?.lastFailure == category)
        await client.shutdown()
    }

    @Test func retryAfterIsHonoured() async throws {
        let (client, transport, clock) = try makeOutboxClient()
        let publish = Task { try await client.publish(channel: "a", message: "x") }
        let first = try #require(await transport.next(path: "/publish"))
        first.respond(status: 429, json: #"{"status":429,"message":"Too Many Requests","error":true}"#, headers: ["retry-after": "7"])
        // Exactly the server's 7 s plus up to 1 s of jitter; not the policy's 2 s.
        let waited = await clock.advanceToSleeper(within: .seconds(7) ... .seconds(8))
        #expect(waited >= .seconds(7))
        let second = try #require(await transport.next(path: "/publish"))
        #expect(second.query["requestid"] == first.query["requestid"])
        second.respond(json: #"[1,"Sent","17000000000000003"]"#)
        #expect(try await publish.value.timetoken == Timetoken(17_000_000_000_000_003))
        await client.shutdown()
    }

    // MARK: Order and the link

    @Test func aLaterMessageNeverOvertakesARetryOnItsChannel() async throws {
        let (client, transport, clock) = try makeOutboxClient()
        let first = try await client.outbox.enqueue(channel: "a", message: "one")
        let second = try await client.outbox.enqueue(channel: "a", message: "two")
        let other = try await client.outbox.enqueue(channel: "b", message: "other")

        let one = try #require(await transport.next(path: "/publish/demo/demo/0/a"))
        let b = try #require(await transport.next(path: "/publish/demo/demo/0/b"))
        b.respond(json: #"[1,"Sent","17000000000000010"]"#)       // another channel goes its own way
        #expect(try await client.outbox.result(of: other.id).timetoken == Timetoken(17_000_000_000_000_010))
        one.fail(.connectionClosed("reset"))
        await clock.advanceToSleeper(after: .seconds(2))
        let retried = try #require(await transport.next(path: "/publish/demo/demo/0/a"))
        #expect(retried.path.hasSuffix("/%22one%22"))
        #expect(retried.query["requestid"] == first.requestId)
        retried.respond(json: #"[1,"Sent","17000000000000011"]"#)
        let two = try #require(await transport.next(path: "/publish/demo/demo/0/a"))
        #expect(two.path.hasSuffix("/%22two%22"))
        #expect(two.query["requestid"] == second.requestId)
        two.respond(json: #"[1,"Sent","17000000000000012"]"#)
        #expect(try await client.outbox.result(of: second.id).timetoken == Timetoken(17_000_000_000_000_012))
        let aPaths = transport.requests.map(\.url).filter { $0.contains("/0/a/0/") }
        #expect(aPaths.count == 3)
        #expect(aPaths[0].contains("one") && aPaths[1].contains("one") && aPaths[2].contains("two"))
        await client.shutdown()
    }

    @Test func anOfflinePublishWaitsAndGoesWhenTheLinkReturns() async throws {
        let monitor = SteppedNetworkMonitor()
        let (client, transport, clock) = try makeOutboxClient(monitor: monitor)
        try await client.outbox.open()
        await monitor.send(.down)
        var changes = client.outbox.changes().makeAsyncIterator()
        let publish = Task { try await client.publish(channel: "a", message: "offline") }
        #expect(await changes.next()?.state == .pending)
        #expect(transport.requests.isEmpty, "nothing is sent while the network is down")
        #expect(clock.sleepers.isEmpty, "and no retry is counted")
        #expect(try await client.outbox.messages.map(\.state) == [.pending])

        await monitor.send(.up)
        #expect(await changes.next()?.state == .sending(attempt: 1))
        let exchange = try #require(await transport.next(path: "/publish"))
        exchange.respond(json: #"[1,"Sent","17000000000000020"]"#)
        #expect(try await publish.value.timetoken == Timetoken(17_000_000_000_000_020))
        await client.shutdown()
    }

    /// The network went down before the outbox opened (its journal could not be opened yet): the
    /// outbox knows once it opens, and sends nothing until the link returns.
    @Test func aLinkThatWentDownBeforeTheOutboxOpenedHoldsItsSends() async throws {
        let monitor = SteppedNetworkMonitor()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-late-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (client, transport, clock) = try makeOutboxClient(monitor: monitor) { $0.outbox.journalPath = directory + "/outbox.journal" }
        await #expect(throws: OutboxError.self) { try await client.outbox.open() }
        await monitor.send(.down)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try await client.outbox.open()
        var changes = client.outbox.changes().makeAsyncIterator()
        let publish = Task { try await client.publish(channel: "a", message: "offline") }
        #expect(await changes.next()?.state == .pending)
        #expect(try await client.outbox.messages.map(\.state) == [.pending], "not being sent: the link is down")
        #expect(transport.requests.isEmpty, "nothing is sent while the network is down")
        #expect(clock.sleepers.isEmpty, "and no retry is counted")
        await monitor.send(.up)
        try #require(await transport.next(path: "/publish")).respond(json: #"[1,"Sent","17000000000000022"]"#)
        _ = try await publish.value
        await client.shutdown()
    }

    @Test func aFailureWhileTheLinkIsDownWaitsForTheLinkWithoutUsingRetries() async throws {
        let monitor = SteppedNetworkMonitor()
        let (client, transport, clock) = try makeOutboxClient(monitor: monitor)
        var changes = client.outbox.changes().makeAsyncIterator()
        let publish = Task { try await client.publish(channel: "a", message: "x") }
        let first = try #require(await transport.next(path: "/publish"))
        #expect(await changes.next()?.state == .pending)
        #expect(await changes.next()?.state == .sending(attempt: 1))
        await monitor.send(.down)
        first.fail(.connectionClosed("the interface went away"))
        #expect(await changes.next()?.state == .pending)
        #expect(clock.sleepers.isEmpty, "no back-off: the failure waits for the link")
        await monitor.send(.up)
        let second = try #require(await transport.next(path: "/publish"))
        #expect(second.query["requestid"] == first.query["requestid"])
        second.respond(json: #"[1,"Sent","17000000000000021"]"#)
        _ = try await publish.value
        await client.shutdown()
    }

    @Test func aSendThatReachesTheServerEndsTheOtherChannelsBackOff() async throws {
        let (client, transport, clock) = try makeOutboxClient()
        let a = try await client.outbox.enqueue(channel: "a", message: "x")
        let b = try await client.outbox.enqueue(channel: "b", message: "y")
        let first = try #require(await transport.next(path: "/publish/demo/demo/0/a"))
        let other = try #require(await transport.next(path: "/publish/demo/demo/0/b"))
        first.fail(.connectionRefused)
        await clock.waitForSleeper(until: clock.now.advanced(by: .seconds(2)))   // a backs off 2 s
        other.respond(json: #"[1,"Sent","17000000000000060"]"#)                  // …but b got through
        // The outage a was waiting out is over: it goes again at once, without the clock moving.
        let again = try #require(await transport.next(path: "/publish/demo/demo/0/a"))
        #expect(again.query["requestid"] == a.requestId)
        #expect(clock.now == ManualClock.Instant(offset: .zero))
        again.respond(json: #"[1,"Sent","17000000000000061"]"#)
        _ = try await client.outbox.result(of: a.id)
        _ = try await client.outbox.result(of: b.id)
        await client.shutdown()
    }

    @Test func aProxyErrorPageForA5xxIsRetried() async throws {
        let (client, transport, clock) = try makeOutboxClient()
        let publish = Task { try await client.publish(channel: "a", message: "x") }
        let first = try #require(await transport.next(path: "/publish"))
        first.respond(TransportResponse(statusCode: 502, headers: ["content-type": "text/html"],
                                        body: Array("<html><body>Bad Gateway</body></html>".utf8)))
        await clock.advanceToSleeper(after: .seconds(2))
        let second = try #require(await transport.next(path: "/publish"))
        #expect(second.query["requestid"] == first.query["requestid"])
        second.respond(json: #"[1,"Sent","17000000000000062"]"#)
        _ = try await publish.value
        await client.shutdown()
    }

    // MARK: Bounds, cancel, resend, changes

    @Test func aFullOutboxRefusesAndNothingAcceptedIsDropped() async throws {
        let monitor = SteppedNetworkMonitor()
        let (client, _, _) = try makeOutboxClient(monitor: monitor) {
            $0.outbox.maximumMessages = 2
            $0.outbox.maximumBytes = 200
        }
        try await client.outbox.open()
        await monitor.send(.down)
        let a = try await client.outbox.enqueue(channel: "a", message: "1")
        let b = try await client.outbox.enqueue(channel: "a", message: "2")
        do {
            try await client.outbox.enqueue(channel: "a", message: "3")
            Issue.record("a third message was accepted")
        } catch {
            #expect(error.outboxError?.code == .full)
            #expect(error.category == .unknown)
        }
        do {
            try await client.outbox.enqueue(channel: "b", message: .string(String(repeating: "x", count: 300)))
            Issue.record("a message above the byte bound was accepted")
        } catch {
            #expect(error.outboxError?.code == .tooLarge)
            #expect(error.category == .badRequest)
        }
        #expect(try await client.outbox.messages.map(\.id) == [a.id, b.id])
        try await client.outbox.cancel(b.id)
        _ = try await client.outbox.enqueue(channel: "a", message: "3")   // room again
        await client.shutdown()
    }

    @Test func cancelAndResend() async throws {
        let (client, transport, _) = try makeOutboxClient()
        let first = try await client.outbox.enqueue(channel: "a", message: "first")
        let second = try await client.outbox.enqueue(channel: "a", message: "second")
        let inFlight = try #require(await transport.next(path: "/publish"))
        do {
            try await client.outbox.cancel(first.id)
            Issue.record("a message in flight was cancelled")
        } catch {
            #expect(error.code == .inFlight)
        }
        try await client.outbox.cancel(second.id)
        let cancelled = await failure { try await client.outbox.result(of: second.id) }
        #expect(cancelled?.category == .cancelled)

        inFlight.respond(status: 403, json: #"{"status":403,"message":"Forbidden","error":true}"#)
        #expect(await failure { try await client.outbox.result(of: first.id) }?.category == .accessDenied)
        do {
            try await client.outbox.cancel(second.id)
            Issue.record("a cancelled message was cancelled again")
        } catch {
            #expect(error.code == .unknownMessage)
        }

        try await client.outbox.resend(first.id)
        let again = try #require(await transport.next(path: "/publish"))
        #expect(again.query["requestid"] == first.requestId)
        again.respond(json: #"[1,"Sent","17000000000000030"]"#)
        #expect(try await client.outbox.result(of: first.id).timetoken == Timetoken(17_000_000_000_000_030))
        #expect(try await client.outbox.messages.isEmpty)
        #expect(transport.requests.allSatisfy { !$0.url.contains("second") }, "the cancelled message was never sent")
        await client.shutdown()
    }

    @Test func theChangeStreamAndListenersShowEveryState() async throws {
        let (client, transport, clock) = try makeOutboxClient()
        let seen = Mutex<[OutboxMessageState]>([])
        let token = client.outbox.addChangeListener { change in seen.withLock { $0.append(change.state) } }
        var changes = client.outbox.changes().makeAsyncIterator()
        let entry = try await client.outbox.enqueue(channel: "a", message: "x")
        #expect(entry.state == .sending(attempt: 1) || entry.state == .pending)
        let first = try #require(await transport.next(path: "/publish"))
        first.fail(.timedOut)
        await clock.advanceToSleeper(after: .seconds(2))
        try #require(await transport.next(path: "/publish")).respond(json: #"[1,"Sent","17000000000000040"]"#)

        var states: [OutboxMessageState] = []
        var failures: [StatusCategory?] = []
        while let change = await changes.next() {
            #expect(change.id == entry.id && change.channel == "a" && change.requestId == entry.requestId)
            states.append(change.state)
            failures.append(change.failure)
            if change.state.isFinal { break }
        }
        let sent = OutboxMessageState.sent(Timetoken(17_000_000_000_000_040))
        #expect(states == [.pending, .sending(attempt: 1), .pending, .sending(attempt: 2), sent])
        #expect(failures == [nil, nil, .timeout, nil, nil])
        await client.shutdown()
        #expect(seen.withLock { $0 } == states)
        token.cancel()
    }

    @Test func cancellingTheCallerDoesNotCancelTheMessage() async throws {
        let (client, transport, _) = try makeOutboxClient()
        var changes = client.outbox.changes().makeAsyncIterator()
        let publish = Task { try await client.publish(channel: "a", message: "x") }
        let exchange = try #require(await transport.next(path: "/publish"))
        publish.cancel()
        #expect(await failure { try await publish.value }?.category == .cancelled)
        #expect(!exchange.isAbandoned)
        exchange.respond(json: #"[1,"Sent","17000000000000050"]"#)
        while let change = await changes.next(), !change.state.isFinal {}
        #expect(try await client.outbox.messages.isEmpty)
        await client.shutdown()
    }

    // MARK: Durable outbox (a real journal file)

    @Test func messagesAcceptedBeforeTheClientWentAwayAreSentByTheNextOneWithTheirRequestIds() async throws {
        let directory = try OutboxJournalTests.TemporaryDirectory()
        defer { withExtendedLifetime(directory) {} }  // removed when the test ends, not before
        let path = directory.journal

        let monitor = SteppedNetworkMonitor()
        let (first, firstTransport, _) = try makeOutboxClient(monitor: monitor) { $0.outbox.journalPath = path }
        let refused = try await first.outbox.enqueue(channel: "x", message: "refused")
        try #require(await firstTransport.next(path: "/publish")).respond(status: 403, json: #"{"status":403,"error":true}"#)
        _ = await failure { try await first.outbox.result(of: refused.id) }
        await monitor.send(.down)
        var accepted: [OutboxEntry] = []
        for (channel, text) in [("a", "a1"), ("b", "b1"), ("a", "a2")] {
            accepted.append(try await first.outbox.enqueue(channel: channel, message: .string(text)))
        }
        await first.shutdown()          // the app is killed with three messages pending
        #expect(firstTransport.requests.count == 1)

        let (second, transport, _) = try makeOutboxClient { $0.outbox.journalPath = path }
        try await second.outbox.open()
        var sent: [String: String] = [:]   // payload → request id
        for _ in 0..<3 {
            let exchange = try #require(await transport.next(path: "/publish"))
            let text = exchange.path.components(separatedBy: "/").last ?? ""
            sent[text] = exchange.query["requestid"]
            exchange.respond(json: #"[1,"Sent","1700000000000010\#(sent.count)"]"#)
        }
        #expect(sent["%22a1%22"] == accepted[0].requestId)
        #expect(sent["%22b1%22"] == accepted[1].requestId)
        #expect(sent["%22a2%22"] == accepted[2].requestId)
        let aOrder = transport.requests.map(\.url).filter { $0.contains("/0/a/0/") }
        #expect(aOrder.count == 2 && aOrder[0].contains("a1") && aOrder[1].contains("a2"))
        for entry in accepted { _ = try await second.outbox.result(of: entry.id) }
        // The failed message came back failed, and is not sent again by itself.
        let left = try await second.outbox.messages
        #expect(left.map(\.id) == [refused.id])
        #expect(left.first?.state == .failed(.accessDenied) && left.first?.requestId == refused.requestId)
        try await second.outbox.cancel(refused.id)
        await second.shutdown()

        // A third launch has nothing left; new ids continue above the old ones.
        let (third, thirdTransport, _) = try makeOutboxClient { $0.outbox.journalPath = path }
        #expect(try await third.outbox.messages.isEmpty)
        let next = try await third.outbox.enqueue(channel: "a", message: "later")
        #expect(next.id > accepted[2].id)
        try #require(await thirdTransport.next(path: "/publish")).respond(json: #"[1,"Sent","17000000000000200"]"#)
        _ = try await third.outbox.result(of: next.id)
        await third.shutdown()
    }

    /// A cancel the journal cannot keep is refused: otherwise the next launch would restore the
    /// message and send what the app cancelled.
    @Test func aCancelTheJournalCannotKeepIsRefusedAndTheMessageStays() async throws {
        let directory = try OutboxJournalTests.TemporaryDirectory()
        defer { withExtendedLifetime(directory) {} }  // removed when the test ends, not before
        let path = directory.journal
        let monitor = SteppedNetworkMonitor()
        let (first, firstTransport, _) = try makeOutboxClient(monitor: monitor) { $0.outbox.journalPath = path }
        try await first.outbox.open()
        await monitor.send(.down)
        let kept = try await first.outbox.enqueue(channel: "a", message: "kept")
        let cancelled = try await first.outbox.enqueue(channel: "b", message: "cancelled")
        await first.outboxDriver.failJournalWrites(ENOSPC)
        do {
            try await first.outbox.cancel(kept.id)
            Issue.record("a cancel the journal did not keep was made")
        } catch {
            #expect(error.code == .journal)
            #expect(error.message.contains("stays in the outbox"))
        }
        #expect(try await first.outbox.messages.map(\.id) == [kept.id, cancelled.id])
        await first.outboxDriver.failJournalWrites(nil)
        try await first.outbox.cancel(cancelled.id)
        await first.shutdown()
        #expect(firstTransport.requests.isEmpty)

        // The next launch has the message whose cancel was refused, as the app was told, and sends
        // it; the cancel that was kept sticks.
        let (second, transport, _) = try makeOutboxClient { $0.outbox.journalPath = path }
        #expect(try await second.outbox.messages.map(\.id) == [kept.id])
        let exchange = try #require(await transport.next(path: "/publish"))
        #expect(exchange.path.hasSuffix("/0/a/0/%22kept%22"))
        exchange.respond(json: #"[1,"Sent","17000000000000300"]"#)
        _ = try await second.outbox.result(of: kept.id)
        #expect(transport.requests.allSatisfy { !$0.url.contains("cancelled") }, "the cancelled message was never sent")
        await second.shutdown()
    }

    /// `publish` removes a message that failed once it returns the failure (the caller owns it),
    /// even when the journal cannot record the removal: the journal writes it with its next record
    /// (here, at shutdown), and if the disk never comes back the message comes back failed, never
    /// sent.
    @Test(arguments: [true, false])
    func aFailedMessageLeavesTheOutboxWhenItsRemovalCannotBeJournalled(diskComesBack: Bool) async throws {
        let directory = try OutboxJournalTests.TemporaryDirectory()
        defer { withExtendedLifetime(directory) {} }  // removed when the test ends, not before
        let path = directory.journal
        let (first, transport, _) = try makeOutboxClient { $0.outbox.journalPath = path }
        let refused = try await first.outbox.enqueue(channel: "x", message: "refused")
        try #require(await transport.next(path: "/publish")).respond(status: 403, json: #"{"status":403,"error":true}"#)
        _ = await failure { try await first.outbox.result(of: refused.id) }
        await first.outboxDriver.failJournalWrites(ENOSPC)
        try await first.outboxDriver.cancel(refused.id, unjournalledIfFailed: true)
        #expect(try await first.outbox.messages.isEmpty)
        if diskComesBack { await first.outboxDriver.failJournalWrites(nil) }
        await first.shutdown()

        let (second, secondTransport, _) = try makeOutboxClient { $0.outbox.journalPath = path }
        let left = try await second.outbox.messages
        if diskComesBack {
            #expect(left.isEmpty, "the removal was written when the journal could write again")
        } else {
            #expect(left.map(\.id) == [refused.id])
            #expect(left.first?.state == .failed(.accessDenied))
        }
        await second.shutdown()
        #expect(secondTransport.requests.isEmpty, "a failed message is never sent again by itself")
    }

    /// A failure the journal could not record while `publish` waited (a full disk) is not undone
    /// at the next launch: once the journal can write again it catches up, so the message whose
    /// failure `publish` returned is not sent by the next launch.
    @Test func aFailureTheJournalCouldNotRecordIsNotSentAtTheNextLaunch() async throws {
        let directory = try OutboxJournalTests.TemporaryDirectory()
        defer { withExtendedLifetime(directory) {} }  // removed when the test ends, not before
        let path = directory.journal
        let monitor = SteppedNetworkMonitor()
        let (first, transport, _) = try makeOutboxClient(monitor: monitor) { $0.outbox.journalPath = path }
        let publish = Task { try await first.publish(channel: "x", message: "refused") }
        let exchange = try #require(await transport.next(path: "/publish"))
        await first.outboxDriver.failJournalWrites(ENOSPC)   // the disk fills up while it is in flight
        exchange.respond(status: 403, json: #"{"status":403,"error":true}"#)
        #expect(await failure { try await publish.value }?.category == .accessDenied)
        #expect(try await first.outbox.messages.isEmpty)
        await first.outboxDriver.failJournalWrites(nil)
        // The next message the app sends is written, and the journal catches up before it.
        await monitor.send(.down)
        let later = try await first.outbox.enqueue(channel: "y", message: "later")
        await first.shutdown()

        let (second, secondTransport, _) = try makeOutboxClient { $0.outbox.journalPath = path }
        #expect(try await second.outbox.messages.map(\.id) == [later.id])
        let resent = try #require(await secondTransport.next(path: "/publish"))
        #expect(resent.path.hasSuffix("/0/y/0/%22later%22"))
        resent.respond(json: #"[1,"Sent","17000000000000400"]"#)
        _ = try await second.outbox.result(of: later.id)
        await second.shutdown()
        #expect(secondTransport.requests.allSatisfy { !$0.url.contains("refused") }, "the failed message was not sent again")
    }

    /// Two clients on one journal would both send its messages: the second is refused until the
    /// first shuts down, and then sends what the first left.
    @Test func aJournalAnotherClientHoldsIsRefusedUntilItLetsGo() async throws {
        let directory = try OutboxJournalTests.TemporaryDirectory()
        defer { withExtendedLifetime(directory) {} }
        let path = directory.journal
        let monitor = SteppedNetworkMonitor()
        let (first, firstTransport, _) = try makeOutboxClient(monitor: monitor) { $0.outbox.journalPath = path }
        try await first.outbox.open()
        await monitor.send(.down)
        let held = try await first.outbox.enqueue(channel: "a", message: "held")

        let (second, transport, _) = try makeOutboxClient { $0.outbox.journalPath = path }
        do {
            try await second.outbox.open()
            Issue.record("a second client opened a journal the first holds")
        } catch {
            #expect(error.code == .journal)
            #expect(error.message.contains("in use by another client"))
        }
        let status = await failure { try await second.outbox.enqueue(channel: "b", message: "refused") }
        #expect(status?.category == .unknown && status?.serverMessage?.contains("in use") == true)
        #expect(transport.requests.isEmpty && firstTransport.requests.isEmpty)

        await first.shutdown()
        try await second.outbox.open()
        let exchange = try #require(await transport.next(path: "/publish"))
        #expect(exchange.query["requestid"] == held.requestId)
        exchange.respond(json: #"[1,"Sent","17000000000000001"]"#)
        _ = try await second.outbox.result(of: held.id)
        await second.shutdown()
    }

    @Test func aJournalThatCannotBeOpenedRefusesWithAClearError() async throws {
        let (client, _, _) = try makeOutboxClient { $0.outbox.journalPath = "/nonexistent-\(UUID().uuidString)/outbox.journal" }
        do {
            try await client.outbox.enqueue(channel: "a", message: "x")
            Issue.record("accepted without a journal")
        } catch {
            #expect(error.outboxError?.code == .journal)
        }
        await client.shutdown()
    }
}

/// The outbox against a real server, through the fault proxy, over loopback.
@Suite("Outbox over a real server and the fault proxy", .timeLimit(.minutes(1)))
struct OutboxFaultProxyTests {
    @Test func aBurstOverALinkThatIsCutAndRestoredIsStoredOnceInOrder() async throws {
        let server = try await InProcessServer.start()
        let proxy = try await FaultProxy.start(upstream: server.origin)
        let client = try makeClient(origin: proxy.origin) {
            $0.nonSubscribeTimeout = .seconds(5)
            $0.outbox.retry = RetryConfiguration(policy: .linear(delay: .milliseconds(50), maximumRetries: 1_000),
                                                 minimumInterval: .zero, jitter: .zero ... .zero)
        }
        let channel = unique("burst")
        var ids: [OutboxMessageID] = []
        for i in 0..<10 { ids.append(try await client.outbox.enqueue(channel: channel, message: .int(i)).id) }
        for id in ids { _ = try await client.outbox.result(of: id) }

        // The link is cut: connections are reset as they open (nothing reaches the server).
        try await proxy.apply(.reset)
        for i in 10..<30 { ids.append(try await client.outbox.enqueue(channel: channel, message: .int(i)).id) }
        // Let the cut last until attempts have failed, then restore it.
        while proxy.counters.reset < 3 { try await Task.sleep(for: .milliseconds(20)) }
        #expect(try await client.outbox.messages.count > 0, "messages wait in the outbox while the link is cut")
        try await proxy.apply(.pass)
        var timetokens: [Timetoken] = []
        for id in ids { timetokens.append(try await client.outbox.result(of: id).timetoken) }
        #expect(timetokens == timetokens.sorted(), "sent in acceptance order")

        let page = try await client.fetchMessages(channels: [channel])
        let stored = page.channels[channel] ?? []
        #expect(stored.map(\.payload) == (0..<30).map { JSONValue.int($0) }, "each stored once, in order")
        #expect(stored.map(\.timetoken) == timetokens)
        await client.shutdown()
        await proxy.stop()
        await server.stop()
    }
}

// MARK: - Support

/// A client on an in-memory transport and a manual clock, with jitter-free retries (2 s, 4 s, 8 s…).
func makeOutboxClient(monitor: (any NetworkMonitor)? = nil, configure: (inout TetherConfiguration) -> Void = { _ in })
    throws -> (TetherClient, InMemoryTransport, ManualClock)
{
    try makeStepClient(monitor: monitor) { configuration in
        configuration.outbox.retry = RetryConfiguration(jitter: .zero ... .zero)
        configure(&configuration)
    }
}

/// A ``NetworkMonitor`` whose ``send(_:)`` returns once the consumer has handled the report
/// (it has asked for the next one), so a test knows the outbox saw the link change.
final class SteppedNetworkMonitor: NetworkMonitor {
    private struct State {
        var queue: [NetworkPathStatus] = []
        var consumer: CheckedContinuation<NetworkPathStatus?, Never>?
        var sent = 0
        var asks = 0
        var handled: [(target: Int, continuation: CheckedContinuation<Void, Never>)] = []
    }

    private let state = Mutex(State())

    func pathUpdates() -> AsyncStream<NetworkPathStatus> {
        AsyncStream(unfolding: { [self] in await take() })
    }

    /// Reports `status` and waits until the consumer has handled it.
    func send(_ status: NetworkPathStatus) async {
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            let consumer = state.withLock { state -> CheckedContinuation<NetworkPathStatus?, Never>? in
                state.sent += 1
                state.handled.append((state.sent + 1, done))
                if let consumer = state.consumer {
                    state.consumer = nil
                    return consumer
                }
                state.queue.append(status)
                return nil
            }
            consumer?.resume(returning: status)
        }
    }

    private func take() async -> NetworkPathStatus? {
        let done = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.asks += 1
            let ready = state.handled.filter { $0.target <= state.asks }.map(\.continuation)
            state.handled.removeAll { $0.target <= state.asks }
            return ready
        }
        for continuation in done { continuation.resume() }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<NetworkPathStatus?, Never>) in
                let next = state.withLock { state -> NetworkPathStatus?? in
                    if !state.queue.isEmpty { return .some(state.queue.removeFirst()) }
                    if Task.isCancelled { return .some(nil) }
                    state.consumer = continuation
                    return .none
                }
                if let next { continuation.resume(returning: next) }
            }
        } onCancel: {
            let consumer = state.withLock { state -> CheckedContinuation<NetworkPathStatus?, Never>? in
                defer { state.consumer = nil }
                return state.consumer
            }
            consumer?.resume(returning: nil)
        }
    }
}
