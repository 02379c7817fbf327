import Foundation
import Testing
@testable import Tether
import TetherClientCore
import TetherProtocol
import TetherTesting

/// `setToken(_:)` reaches everything that sends the token after it: the WebSocket wire's next
/// `hello`, and a failed call's `Status.retry()` (the documented answer to `accessDenied`).
@Suite("Access Manager token after setToken (in-memory transport and socket, manual clock)", .timeLimit(.minutes(1)))
struct TokenTests {
    @Test func theWebSocketHelloSendsTheTokenSetLast() async throws {
        let (client, socket, _) = try makeSocketClient { $0.authKey = "old" }
        client.setToken("new")
        _ = client.subscribe(to: ["a"])
        let peer = try #require(await socket.nextAttempt()).accept()
        let hello = try frame(await peer.receive())
        #expect(hello["type"] == "hello" && hello["auth"] == "new")
        await client.shutdown()
    }

    @Test func aRetryAfterSetTokenSendsTheNewToken() async throws {
        let (client, transport, _) = try makeStepClient { $0.authKey = "old" }
        let call = Task { try await client.whereNow() }
        let first = try #require(await transport.next(path: "/v2/presence"))
        #expect(first.query["auth"] == "old")
        first.respond(status: 403, json: #"{"status":403,"error":true,"message":"Forbidden","service":"Access Manager"}"#)
        let status = try #require(await failure { try await call.value })
        #expect(status.category == .accessDenied)

        client.setToken("new")
        let retried = Task { try await status.retry() }
        let second = try #require(await transport.next(path: "/v2/presence"))
        #expect(second.query["auth"] == "new")
        second.respond(json: #"{"status":200,"message":"OK","payload":{"channels":["a"]},"service":"Presence"}"#)
        _ = try await retried.value

        // After the token is removed, a retry sends none; a call that never sends one (time) stays so.
        client.setToken(nil)
        let again = Task { try await status.retry() }
        let third = try #require(await transport.next(path: "/v2/presence"))
        #expect(third.query["auth"] == nil)
        third.respond(json: #"{"status":200,"message":"OK","payload":{"channels":[]},"service":"Presence"}"#)
        _ = try await again.value
        #expect(RequestSpec(operation: .time, path: "/time/0").withAuth("x").queryValue("auth") == nil)
        await client.shutdown()
    }
}
