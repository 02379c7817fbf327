import Foundation
import GRDB
import Testing
import TetherProtocol
@testable import TetherServer
import TetherServerCore
import TetherTesting
import TetherTestingServer

/// A session's subscription changing while its deliveries read from the store: over a real
/// socket, against a real server and SQLite file, with the store's connections held by the test
/// so the order of the steps is fixed, not timed.
@Suite(.serialized) struct WebSocketSubscriptionChangeTests {
    /// Takes `count` of the store's connections (readers, or the writer) on threads of their own
    /// and keeps them until ``release()``.
    final class ConnectionHold: Sendable {
        private let released = DispatchSemaphore(value: 0)
        private let count: Int

        private init(count: Int) { self.count = count }

        static func readers(of pool: DatabasePool) async -> ConnectionHold {
            await hold(pool.configuration.maximumReaderCount) { hold in try? pool.read { _ in hold() } }
        }

        static func writer(of pool: DatabasePool) async -> ConnectionHold {
            await hold(1) { hold in try? pool.write { _ in hold() } }
        }

        private static func hold(_ count: Int, _ take: @escaping @Sendable (_ hold: () -> Void) -> Void) async -> ConnectionHold {
            let hold = ConnectionHold(count: count)
            let (taken, signal) = AsyncStream<Void>.makeStream()
            for _ in 0..<count {
                Thread {
                    take {
                        signal.yield()
                        hold.released.wait()
                    }
                }.start()
            }
            var held = 0
            for await _ in taken {
                held += 1
                if held == count { break }
            }
            return hold
        }

        func release() {
            for _ in 0..<count { released.signal() }
        }
    }

    /// `subscribe` adds names to the session before it saves their presence join and restarts the
    /// deliveries. A round reading the store meanwhile was planned without them: had its page moved
    /// the session's cursor, the restarted deliveries would start past the new names' messages and
    /// skip them. The page is dropped and read again with the whole subscription.
    @Test func namesAddedWhileARoundReadsTheStoreMissNothing() async throws {
        let inProcess = try await WebSocketTests.start()
        let server = TestServer(inProcess: inProcess)
        let pool = inProcess.server.state.store.pool
        let start = try await server.publish("elsewhere", "0")
        // More on `a` than its in-memory window holds, so a round from `start` reads the store.
        var published: [String: [Timetoken]] = ["a": [], "b": []]
        for index in 0..<150 {
            published["a", default: []].append(try await server.publish("a", "\(index)"))
            if index % 30 == 29 { published["b", default: []].append(try await server.publish("b", "\(index)")) }
        }

        // The first round, from `start`, waits for a reader.
        let readers = await ConnectionHold.readers(of: pool)
        let client = WebSocketTestClient(baseURL: inProcess.baseURL)
        client.send(WebSocketTests.hello())
        #expect(await client.frame(ofType: "welcome") != nil)
        client.send(WebSocketTests.subscribe(["a"], cursor: String(start.rawValue)))
        #expect(await client.frame(ofType: "subscribed") != nil)

        // `b` is added; its presence join waits for the writer.
        let writer = await ConnectionHold.writer(of: pool)
        client.send(WebSocketTests.subscribe(["b"]))
        let presence = inProcess.server.state.presence
        #expect(await eventually { presence.read { $0.membershipCount } == 2 }, "alice joined `b`")

        // The round planned for `a` alone reads its page now.
        readers.release()
        var received: [String: [Timetoken]] = [:]
        while received["a", default: []].count < published["a", default: []].count,
              let frame = await client.frame(ofType: "messages") {
            for envelope in frame["m"]?.arrayValue ?? [] {
                guard let channel = envelope["c"]?.stringValue, let text = envelope["p"]?["t"]?.stringValue,
                      let timetoken = Timetoken(parsing: text) else { continue }
                received[channel, default: []].append(timetoken)
            }
        }
        writer.release()
        let subscribed = try #require(await client.frame(ofType: "subscribed"))
        #expect(subscribed["channels"] == ["a", "b"])

        #expect(received["a"] == published["a"], "every message of `a` once, in order")
        #expect(received["b"] == published["b"], "every message of `b` after the cursor it was added at")
        await client.close()
        await inProcess.stop()
    }

    /// The presence state a session keeps is for names of its subscription only: a `subscribe`
    /// with state for any other name is refused whole, and a name's state leaves with the name.
    /// (Before, any number of names could be given state, never dropped: one session could grow
    /// past the kept sessions' byte bound and, once kept, push every other kept session out.)
    @Test func presenceStateIsKeptOnlyForTheSubscriptionsNames() async throws {
        let inProcess = try await WebSocketTests.start()
        let client = WebSocketTestClient(baseURL: inProcess.baseURL)
        client.send(WebSocketTests.hello())
        let welcome = try #require(await client.frame(ofType: "welcome"))
        let session = try #require(welcome["sessionId"]?.stringValue.flatMap { UInt64($0.dropFirst(2)) })
        let sessions = inProcess.server.webSockets
        func keys() -> [String] { sessions.state(of: session)?.states.keys.sorted() ?? ["(no session)"] }

        client.send(#"{"type":"subscribe","channels":["a"],"groups":[],"state":{"a":{"mood":"ok"}}}"#)
        #expect(await client.frame(ofType: "subscribed") != nil)
        #expect(keys() == ["a"])
        client.send(#"{"type":"subscribe","channels":[],"groups":[],"state":{"a":{"mood":"sad"},"stray":{}}}"#)
        let refused = try #require(await client.frame(ofType: "error"))
        #expect(refused["code"] == "invalidState", "\(refused)")
        #expect(keys() == ["a"], "nothing of the refused subscribe is applied")
        client.send(#"{"type":"subscribe","channels":["b"],"groups":[],"state":{"b":{"n":1}}}"#)
        #expect(await client.frame(ofType: "subscribed") != nil)
        #expect(keys() == ["a", "b"])
        client.send(#"{"type":"unsubscribe","channels":["a"],"groups":[]}"#)
        #expect(await client.frame(ofType: "unsubscribed") != nil)
        #expect(keys() == ["b"], "a name's state leaves with the name")
        await client.close()
        await inProcess.stop()
    }

    /// After a resume on another socket took the session over, what the old socket still sends
    /// is dropped: its late `unsubscribe` does not take names from the session the new socket
    /// carries, and its late `publish` is not stored (its `ack` could no longer be sent).
    @Test func framesOnATakenOverSocketChangeNothing() async throws {
        let inProcess = try await WebSocketTests.start()
        let rest = TestServer(inProcess: inProcess)
        let (first, welcome, _) = try await WebSocketTests.session(inProcess, channels: ["a", "b"])
        let token = try #require(welcome["resumeToken"]?.stringValue)
        let session = try #require(welcome["sessionId"]?.stringValue.flatMap { UInt64($0.dropFirst(2)) })
        first.pauseReading()  // it does not see the takeover's close, and keeps sending
        let second = WebSocketTestClient(baseURL: inProcess.baseURL)
        second.send(WebSocketTests.hello(resume: (token, nil)))
        #expect(await second.frame(ofType: "welcome")?["resumed"] == .bool(true))

        first.send(.object(["type": "unsubscribe", "channels": ["b"], "groups": []]))
        first.send(.object(["type": "publish", "requestId": "late", "channel": "a", "message": "late"]))
        first.drop()
        #expect(await eventually { inProcess.server.webSocketCounts.connections == 1 })
        #expect(inProcess.server.webSockets.state(of: session)?.channels == ["a", "b"])
        let timetoken = try await rest.publish("b", "1")
        #expect(await WebSocketTests.envelopes(second, count: 1).map(\.tt) == [String(timetoken.rawValue)],
                "the new socket still gets `b`")
        let (status, history, _) = try await rest.get("/v2/history/sub-key/demo/channel/a")
        #expect(status == 200 && history.hasPrefix("[[]"), "the late publish was not stored: \(history)")
        await second.close()
        await first.close()
        await inProcess.stop()
    }
}
