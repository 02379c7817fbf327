import Synchronization
import Testing
@testable import Tether
import TetherServer
import TetherTesting
import TetherTestingServer

/// Issue 5 point 5: every category is produced for real — by a misbehaving server or the real
/// Tether server — never constructed.
@Suite("Status categories produced for real")
struct StatusCategoryTests {
    @Test func timeoutFromAServerThatNeverAnswers() async throws {
        let server = try await ScriptedServer.start { _ in .hang }
        let client = try makeClient(origin: server.origin)
        let started = ContinuousClock.now
        let status = await failure { try await client.time(timeout: .milliseconds(400)) }
        #expect(status?.category == .timeout)
        #expect(status?.operation == .time)
        #expect(ContinuousClock.now - started < .seconds(5))
        #expect(status?.canRetry == true)
        await client.shutdown()
        try await server.stop()
    }

    @Test func networkIssuesWhenNothingListens() async throws {
        let port = try await RawServer.unusedPort()
        // One attempt: the outbox would otherwise retry a network failure for minutes
        // (its retries are OutboxStepTests' subject); the category is that of the last attempt.
        let client = try makeClient(origin: "127.0.0.1:\(port)") { $0.outbox.retry = .disabled }
        let status = await failure { try await client.publish(channel: "c", message: "hi") }
        #expect(status?.category == .networkIssues)
        #expect(status?.affectedChannels == ["c"])
        await client.shutdown()
    }

    @Test func tlsConnectionFailedOnABadHandshake() async throws {
        let server = try await RawServer.start()
        let client = try makeClient(origin: server.origin, tls: true)
        let status = await failure { try await client.time() }
        #expect(status?.category == .tlsConnectionFailed, "\(String(describing: status))")
        await client.shutdown()
        try await server.stop()
    }

    @Test func tlsUntrustedCertificateForASelfSignedServer() async throws {
        let server = try await ScriptedServer.start(tls: .identity(TestCertificates.selfSigned)) { _ in .json("[1]") }
        let client = try makeClient(origin: server.origin, tls: true) {
            $0.trustedCertificateAuthoritiesPEM = TestCertificates.certificateAuthorityPEM
        }
        let status = await failure { try await client.time() }
        #expect(status?.category == .tlsUntrustedCertificate, "\(String(describing: status))")
        await client.shutdown()
        try await server.stop()
    }

    @Test func tlsWithACustomCertificateAuthority() async throws {
        let server = try await ScriptedServer.start(tls: .identity(TestCertificates.server)) { _ in .json("[17953281264739664]") }
        let trusting = try makeClient(origin: server.origin, tls: true) {
            $0.trustedCertificateAuthoritiesPEM = TestCertificates.certificateAuthorityPEM
        }
        #expect(try await trusting.time() == Timetoken(17953281264739664))
        await trusting.shutdown()
        let system = try makeClient(origin: server.origin, tls: true)
        #expect(await failure { try await system.time() }?.category == .tlsUntrustedCertificate)
        await system.shutdown()
        try await server.stop()
    }

    /// A body cut short of its `Content-Length` (a server stopping mid-answer, as a multi-channel
    /// fetch does on a failed read) is a malformed response, retried as one.
    @Test func malformedResponseFromABodyCutShort() async throws {
        let server = try await RawServer.start(replyingWith: Array(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n[17953281264739664".utf8))
        let client = try makeClient(origin: server.origin) { $0.retry = .disabled }
        let status = await failure { try await client.time() }
        #expect(status?.category == .malformedResponse, "\(String(describing: status))")
        #expect(status.map(RetryConfiguration.isTransient) == true)
        #expect(RetryConfiguration.isTransient(Status(category: .tlsConnectionFailed, operation: .time)))
        await client.shutdown()
        try await server.stop()
    }

    @Test func malformedResponseFromACaptivePortal() async throws {
        let server = try await ScriptedServer.start { _ in .html("<html><body><form>Accept the terms to use the Wi-Fi</form></body></html>") }
        let client = try makeClient(origin: server.origin)
        let status = await failure { try await client.publish(channel: "c", message: "hi") }
        #expect(status?.category == .malformedResponse)
        #expect(status?.statusCode == 200)
        await client.shutdown()
        try await server.stop()
    }

    @Test func malformedResponseFromTruncatedJSON() async throws {
        let server = try await ScriptedServer.start { _ in .json(#"{"t":{"t":"17953281265171442","r":1},"m":[{"a":"4","#) }
        let (client, _, _) = try makeObservedClient(origin: server.origin)
        var statuses = client.statuses().makeAsyncIterator()
        client.subscribe(to: ["c"])
        let status = await statuses.next()
        #expect(status?.category == .malformedResponse)
        #expect(status?.operation == .subscribe && status?.willAutomaticallyRetry == true)
        await client.shutdown()
        try await server.stop()
    }

    @Test func malformedResponseWhenTheJSONHasTheWrongShape() async throws {
        let server = try await ScriptedServer.start { _ in .json(#"{"unexpected":true}"#) }
        let client = try makeClient(origin: server.origin)
        #expect(await failure { try await client.time() }?.category == .malformedResponse)
        await client.shutdown()
        try await server.stop()
    }

    @Test func badRequestFromTheRealServer() async throws {
        let server = try await InProcessServer.start()
        let client = try makeClient(origin: server.origin)
        let channels = (0..<501).map { "c\($0)" }
        let status = await failure { try await client.fetchMessages(channels: channels) }
        #expect(status?.category == .badRequest, "\(String(describing: status))")
        #expect(status?.statusCode == 400)
        #expect(status?.serverMessage?.isEmpty == false)
        await client.shutdown()
        await server.stop()
    }

    @Test func badRequestFromAScriptedPublishError() async throws {
        let server = try await ScriptedServer.start { _ in .json(status: 400, #"[0,"Invalid Key","17953281264739664"]"#) }
        let client = try makeClient(origin: server.origin)
        let status = await failure { try await client.publish(channel: "c", message: "hi") }
        #expect(status?.category == .badRequest && status?.serverMessage == "Invalid Key")
        await client.shutdown()
        try await server.stop()
    }

    @Test func accessDeniedListsTheDeniedChannelsAndGroups() async throws {
        let server = try await ScriptedServer.start { _ in
            .json(status: 403, #"{"message":"Forbidden","payload":{"channels":["secret"],"channel-groups":["vip"]},"error":true,"service":"Access Manager","status":403}"#)
        }
        let client = try makeClient(origin: server.origin)
        let status = await failure { try await client.hereNow(channels: ["secret", "open"], groups: ["vip"]) }
        #expect(status?.category == .accessDenied)
        #expect(status?.deniedChannels == ["secret"])
        #expect(status?.deniedGroups == ["vip"])
        #expect(status?.statusCode == 403)
        await client.shutdown()
        try await server.stop()
    }

    @Test func malformedFilterExpression() async throws {
        let server = try await ScriptedServer.start { request in
            request.query["filter-expr"] != nil
                ? .json(status: 481, #"{"status":481,"error":true,"service":"Subscribe","message":"Invalid filter expression"}"#)
                : .json(#"{"t":{"t":"1","r":1},"m":[]}"#)
        }
        let (client, _, _) = try makeObservedClient(origin: server.origin) { $0.filterExpression = "meta.k == 'unterminated" }
        var statuses = client.statuses().makeAsyncIterator()
        client.subscribe(to: ["c"])
        let status = await statuses.next()
        #expect(status?.category == .malformedFilterExpression)
        #expect(status?.operation == .subscribe)
        #expect(status?.statusCode == 481 && status?.willAutomaticallyRetry == false)
        await client.shutdown()
        try await server.stop()
    }

    @Test func requestMessageCountExceededFromTheRealServer() async throws {
        let server = try await InProcessServer.start()
        let publisher = try makeClient(origin: server.origin)
        let channel = unique()
        let before = try await publisher.time()
        for i in 0..<120 { _ = try await publisher.publish(channel: channel, message: .int(i)) }
        let (subscriber, _, _) = try makeObservedClient(origin: server.origin)
        var statuses = subscriber.statuses().makeAsyncIterator()
        let subscription = subscriber.subscribe(to: [channel], timetoken: before)[0]
        var messages = subscription.messages.makeAsyncIterator()
        #expect(await statuses.next()?.category == .connected)
        let exceeded = await statuses.next()
        #expect(exceeded?.category == .requestMessageCountExceeded)
        #expect(exceeded?.lastTimetoken == before)
        var received: [JSONValue] = []
        for _ in 0..<120 { if let event = await messages.next() { received.append(event.payload) } }
        #expect(received == (0..<120).map { .int($0) })
        // The first response held 100 events: its cursor is the status's current timetoken.
        #expect(exceeded?.currentTimetoken != nil && exceeded?.currentTimetoken != before)
        // The 20 left arrive below the threshold: no second status (the next one is the disconnect).
        subscriber.disconnect()
        #expect(await statuses.next()?.category == .disconnected)
        await publisher.shutdown()
        await subscriber.shutdown()
        await server.stop()
    }

    @Test func unknownForServerFaults() async throws {
        let server = try await ScriptedServer.start { _ in .json(status: 503, #"{"status":503,"error":true,"message":"Service Unavailable"}"#) }
        let client = try makeClient(origin: server.origin)
        let status = await failure { try await client.time() }
        #expect(status?.category == .unknown && status?.statusCode == 503 && status?.serverMessage == "Service Unavailable")
        await client.shutdown()
        try await server.stop()
    }

    @Test func cancelledWhenTheTaskIsCancelled() async throws {
        let server = try await ScriptedServer.start { _ in .hang }
        let (client, observed, _) = try makeObservedClient(origin: server.origin)
        var events = observed.events.makeAsyncIterator()
        let call = Task { await failure { try await client.time() } }
        guard case .sent(let request) = await events.next() else {
            Issue.record("the call was not sent")
            return
        }
        #expect(request.url.contains("/time/0"))
        call.cancel()
        #expect(await call.value?.category == .cancelled)
        await client.shutdown()
        try await server.stop()
    }

    @Test func retryReRunsAFailedCall() async throws {
        let calls = Counter()
        let server = try await ScriptedServer.start { _ in
            calls.increment() == 1
                ? .json(status: 403, #"{"message":"Forbidden","payload":{"channels":["c"]},"error":true,"status":403}"#)
                : .json(#"[1,"Sent","17953281264739664"]"#)
        }
        let client = try makeClient(origin: server.origin)
        guard let status = await failure({ try await client.publish(channel: "c", message: "hi") }) else {
            Issue.record("expected a failure")
            return
        }
        #expect(status.category == .accessDenied && status.canRetry && !status.willAutomaticallyRetry)
        let result = try await status.retry(returning: PublishResult.self)
        #expect(result.timetoken == Timetoken(17953281264739664))
        #expect(server.requests.count == 2)
        await client.shutdown()
        try await server.stop()
    }
}

final class Counter: Sendable {
    private let value = Mutex(0)
    func increment() -> Int { value.withLock { $0 += 1; return $0 } }
}
