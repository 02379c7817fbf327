import Synchronization
import Testing
@testable import Tether
import TetherTesting

@Suite("Client lifecycle: lazy creation, keep-alive, long-poll connection, shutdown")
struct LifecycleTests {
    static let timeReply = ScriptedServer.Reply.json("[17953281264739664]")

    @Test func creatingAClientDoesNoIO() async throws {
        let server = try await ScriptedServer.start { _ in Self.timeReply }
        let client = try makeClient(origin: server.origin)
        // Nothing can connect later either: the transport has no HTTP client and thread yet, and
        // the subscribe engine's task has not started.
        #expect(server.connectionsAccepted == 0)
        #expect((client.transport as? HTTPClientTransport)?.isRunning == false)
        #expect(client.engineTask.withLock { if case .idle = $0 { true } else { false } })
        #expect(try await client.time() == Timetoken(17953281264739664))
        #expect(server.connectionsAccepted == 1)
        await client.shutdown()
        try await server.stop()
    }

    @Test func nonSubscribeCallsReuseOneConnection() async throws {
        let server = try await ScriptedServer.start { _ in Self.timeReply }
        let client = try makeClient(origin: server.origin)
        for _ in 0..<10 { _ = try await client.time() }
        #expect(server.requests.count == 10)
        #expect(server.connectionsAccepted == 1)
        await client.shutdown()
        try await server.stop()
    }

    /// The handshake is answered, the next long-poll hangs: it runs on its own connection, so
    /// other calls go through meanwhile; disconnecting cancels it.
    static func holdingServer() async throws -> ScriptedServer {
        try await ScriptedServer.start { request in
            guard request.path.hasPrefix("/v2/subscribe") else { return Self.timeReply }
            return request.query["tt"] == "0" ? .json(#"{"t":{"t":"100","r":1},"m":[]}"#) : .hang
        }
    }

    /// A client of ``holdingServer()`` that has made one call and subscribed to `a`, with its
    /// first long-poll hanging on the server; the iterators were made before anything was sent.
    struct HangingLongPoll {
        let client: TetherClient
        let observed: ObservedTransport
        var events: AsyncStream<ObservedTransport.Event>.Iterator
        var statuses: AsyncStream<Status>.Iterator
        let poll: TransportRequest

        init(on server: ScriptedServer) async throws {
            (client, observed, _) = try makeObservedClient(origin: server.origin)
            events = observed.events.makeAsyncIterator()
            statuses = client.statuses().makeAsyncIterator()
            _ = try await client.time()
            client.subscribe(to: ["a"])
            #expect(await statuses.next()?.category == .connected)
            poll = try #require(await events.nextLongPollSent())
        }

        /// Expects the hanging long-poll to end cancelled.
        mutating func expectPollCancelled() async {
            let outcome = await events.outcome(of: poll)
            #expect(outcome.map { if case .failure(.cancelled) = $0 { true } else { false } } == true, "\(String(describing: outcome))")
        }
    }

    @Test func longPollRunsOnItsOwnConnection() async throws {
        let server = try await Self.holdingServer()
        var hanging = try await HangingLongPoll(on: server)
        let client = hanging.client
        for _ in 0..<3 { _ = try await client.time() }
        #expect(server.connectionsAccepted == 2)
        client.disconnect()
        await hanging.expectPollCancelled()
        #expect(await hanging.statuses.next()?.category == .disconnected)
        await client.shutdown()
        try await server.stop()
    }

    @Test func shutdownClosesEveryConnectionAndStopsTheTransport() async throws {
        let server = try await Self.holdingServer()
        var hanging = try await HangingLongPoll(on: server)
        let (client, observed) = (hanging.client, hanging.observed)
        #expect(server.openConnections == 2)
        await client.shutdown()
        await hanging.expectPollCancelled()
        // The server's side of the sockets closes when the FIN arrives.
        #expect(await finishes { await server.waitUntilOpenConnections(0) })
        #expect((observed.base as? HTTPClientTransport)?.isRunning == false)
        let after = await failure { try await client.time() }
        #expect(after?.category == .cancelled)
        try await server.stop()
    }

    @Test func aClientDroppedWithoutShutdownReleasesItsConnections() async throws {
        let server = try await ScriptedServer.start { _ in Self.timeReply }
        do {
            let client = try makeClient(origin: server.origin)
            _ = try await client.time()
        }
        #expect(await finishes { await server.waitUntilOpenConnections(0) })
        try await server.stop()
    }
}
