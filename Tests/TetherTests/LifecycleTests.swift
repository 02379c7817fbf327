import Testing
@testable import Tether
import TetherTesting

@Suite("Client lifecycle: lazy creation, keep-alive, long-poll connection, shutdown")
struct LifecycleTests {
    static let timeReply = ScriptedServer.Reply.json("[17953281264739664]")

    @Test func creatingAClientDoesNoIO() async throws {
        let server = try await ScriptedServer.start { _ in Self.timeReply }
        let client = try makeClient(origin: server.origin)
        try await Task.sleep(for: .milliseconds(300))
        #expect(server.connectionsAccepted == 0)
        #expect((client.transport as? HTTPClientTransport)?.isRunning == false)
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

    @Test func longPollRunsOnItsOwnConnection() async throws {
        let server = try await ScriptedServer.start { request in
            request.path.hasPrefix("/v2/subscribe") ? .hang : Self.timeReply
        }
        let client = try makeClient(origin: server.origin)
        _ = try await client.time()
        let poll = Task { await failure { try await client.longPoll(channels: ["a"], cursor: (Timetoken(1), 1), timeout: .seconds(30)) } }
        #expect(await eventually { server.requests.contains { $0.path.hasPrefix("/v2/subscribe") } })
        for _ in 0..<3 { _ = try await client.time() }
        #expect(server.connectionsAccepted == 2)
        poll.cancel()
        #expect(await poll.value?.category == .cancelled)
        await client.shutdown()
        try await server.stop()
    }

    @Test func shutdownClosesEveryConnectionAndStopsTheTransport() async throws {
        let server = try await ScriptedServer.start { request in
            request.path.hasPrefix("/v2/subscribe") ? .hang : Self.timeReply
        }
        let client = try makeClient(origin: server.origin)
        _ = try await client.time()
        let poll = Task { await failure { try await client.longPoll(channels: ["a"], cursor: (Timetoken(1), 1), timeout: .seconds(30)) } }
        #expect(await eventually { server.openConnections == 2 })
        await client.shutdown()
        #expect(await poll.value?.category == .cancelled)
        #expect(await eventually { server.openConnections == 0 })
        #expect((client.transport as? HTTPClientTransport)?.isRunning == false)
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
        #expect(await eventually { server.openConnections == 0 })
        try await server.stop()
    }
}
