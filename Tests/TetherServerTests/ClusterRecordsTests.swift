import Foundation
import NIOCore
import NIOHTTP1
import PostgresNIO
import Testing
@_spi(Benchmarks) import TetherProtocol
@testable import TetherServer
import TetherTestingServer

/// Push registrations, App Context and message actions across two nodes of a cluster (two
/// servers on one PostgreSQL database): what is written on one node is read on the other, and
/// an action's event reaches the other node's subscribers with the action's own timetoken.
@Suite(.enabled(if: TestPostgres.available, RecordStoreKind.postgresSkipReason), .serialized)
struct ClusterRecordsTests {
    /// The connection string of `url`'s database (the test server's, with that database).
    private static func connectionString(_ url: DatabaseURL) throws -> String {
        let text = try #require(ProcessInfo.processInfo.environment["TETHER_TEST_DATABASE_URL"])
        var components = try #require(URLComponents(string: text))
        components.path = "/" + url.database
        return try #require(components.string)
    }

    private static func json(_ body: String) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any])
    }

    /// What a subscriber saw of one envelope.
    private struct SeenEvent: Sendable {
        var kind: Int?
        var timetoken: String?
        var actionTimetoken: String?
        var value: String?

        init(_ envelope: [String: Any]) {
            kind = envelope["e"] as? Int
            timetoken = (envelope["p"] as? [String: Any])?["t"] as? String
            let data = (envelope["d"] as? [String: Any])?["data"] as? [String: Any]
            actionTimetoken = data?["actionTimetoken"] as? String
            value = data?["value"] as? String
        }
    }

    /// Without its database, every record store answers `unavailable` (503 at the routes),
    /// never hangs or crashes.
    @Test func recordsWithoutTheDatabaseAreUnavailable() async throws {
        try await TestPostgres.withDatabase { url in
            let log = try await TestPostgres.open(url)
            log.close()
            let unavailable: @Sendable (any Error) -> Bool = { ($0 as? StoreError)?.code == .unavailable }
            await #expect(performing: { _ = try await log.pushRegistrationCount() }, throws: unavailable)
            await #expect(performing: {
                _ = try await log.changePushRegistrations(PushDevice(subscribeKey: "k", token: "t", gateway: .gcm), add: ["c"], remove: [],
                                                          maxChannelsPerDevice: 10, maxDevicesPerChannel: 10)
            }, throws: unavailable)
            await #expect(performing: {
                _ = try await log.setAppContextObject(subscribeKey: "k", kind: .uuid, id: "u", patch: [:], ifMatch: nil, updated: "t")
            }, throws: unavailable)
            await #expect(performing: {
                _ = try await log.appendAfterWrite({ SubscribeEnvelope(timetoken: $0, subscribeKey: "k", channel: "c", payload: "1") },
                                                   write: { _, actions in (true, try await actions.actionCount()) })
            }, throws: unavailable)
        }
    }

    /// A record change waiting for a lock longer than the write timeout (here the sequencer,
    /// held by a stuck transaction) is answered `busy`, not left hanging.
    @Test func aLockHeldTooLongIsAnsweredBusy() async throws {
        try await TestPostgres.withDatabase { url in
            var options = SharedLogOptions()
            options.writeTimeout = .milliseconds(300)
            let log = try await TestPostgres.open(url, options: options)
            let holder = try await TestPostgres.open(url)
            try await holder.client.withTransaction(logger: holder.logger) { connection in
                try await connection.query("SELECT last_tt FROM tether_sequencer WHERE id = 1 FOR UPDATE", logger: holder.logger)
                let started = ContinuousClock.now
                await #expect(performing: {
                    _ = try await log.appendAfterWrite({ SubscribeEnvelope(timetoken: $0, subscribeKey: "k", channel: "c", payload: "1") },
                                                       write: { _, actions in (true, try await actions.actionCount()) })
                }, throws: { ($0 as? StoreError)?.code == .busy })
                #expect(ContinuousClock.now - started < .seconds(5))
            }
            log.close()
            holder.close()
        }
    }

    @Test func recordsWrittenOnOneNodeAreReadOnTheOther() async throws {
        try await TestPostgres.withDatabase { url in
            let database = try Self.connectionString(url)
            let a = TestServer(inProcess: try await InProcessServer.start(databaseURL: database))
            let b = TestServer(inProcess: try await InProcessServer.start(databaseURL: database))

            // A message on A, then a subscriber on B parked past it.
            let message = try await a.publish("room", #""hello""#)
            // B's cursor follows the log as B's reader reads it (on a fresh database it starts
            // at 0, and a subscribe from 0 is a handshake): subscribe once it has passed the message.
            var cursor = try await b.handshake("room")
            for _ in 0..<500 where cursor < message {
                try await Task.sleep(for: .milliseconds(10))
                cursor = try await b.handshake("room")
            }
            #expect(cursor >= message)
            let subscriber = Task { [cursor] in
                var seen: [SeenEvent] = []
                var pages: [String] = []
                var next = cursor
                // Until the action's event arrives.
                for _ in 0..<5 {
                    let page = try await b.subscribe("room", tt: next, timeout: .seconds(20))
                    seen += page.messages.map(SeenEvent.init)
                    pages.append("\(next) -> \(page.cursor): kinds \(page.messages.map { $0["e"] as? Int ?? 0 })")
                    next = page.cursor
                    if seen.contains(where: { $0.kind == 3 }) { break }
                }
                return (seen, pages)
            }
            #expect(await b.longPollsWaiting(1))

            // An action added on A: its timetoken is its event's, and B's subscriber gets it.
            let added = try await a.send("/v1/message-actions/demo/channel/room/message/\(message.rawValue)?uuid=alice", method: .POST,
                                         body: Array(#"{"type":"reaction","value":"smile"}"#.utf8))
            #expect(added.status == 200, "\(added.body)")
            let data = try #require(try Self.json(added.body)["data"] as? [String: Any])
            let actionTimetoken = try #require((data["actionTimetoken"] as? String).flatMap(Timetoken.init(parsing:)))
            #expect(actionTimetoken > message)
            let (seen, pages) = try await subscriber.value
            let events = seen.filter { $0.kind == 3 }
            #expect(events.count == 1, "pages seen on B: \(pages)")
            let event = try #require(events.first)
            #expect(event.timetoken == String(actionTimetoken.rawValue), "the event carries the action's timetoken")
            #expect(event.actionTimetoken == String(actionTimetoken.rawValue))
            #expect(event.value == "smile")

            // Listed on B, with the same timetoken; repeated on B: refused as a duplicate.
            let listed = try Self.json(try await b.get("/v1/message-actions/demo/channel/room?uuid=bob").body)
            let actions = try #require(listed["data"] as? [[String: Any]])
            #expect(actions.map { $0["actionTimetoken"] as? String } == [String(actionTimetoken.rawValue)])
            let again = try await b.send("/v1/message-actions/demo/channel/room/message/\(message.rawValue)?uuid=alice", method: .POST,
                                         body: Array(#"{"type":"reaction","value":"smile"}"#.utf8))
            #expect(again.status == 409)
            // History with actions on B has it too.
            let history = try Self.json(try await b.get("/v3/history-with-actions/sub-key/demo/channel/room?uuid=bob").body)
            #expect("\(history)".contains("smile"))
            // Removed on B: gone on A.
            let removed = try await b.send("/v1/message-actions/demo/channel/room/message/\(message.rawValue)/action/"
                                           + "\(actionTimetoken.rawValue)?uuid=alice", method: .DELETE, body: nil)
            #expect(removed.status == 200)
            let afterRemoval = try Self.json(try await a.get("/v1/message-actions/demo/channel/room?uuid=bob").body)
            #expect((afterRemoval["data"] as? [Any])?.isEmpty == true)

            // App Context: set on A, read on B.
            let set = try await a.send("/v2/objects/demo/uuids/alice?uuid=alice", method: .PATCH,
                                       body: Array(#"{"name":"Alice","custom":{"team":"blue"}}"#.utf8))
            #expect(set.status == 200, "\(set.body)")
            let read = try Self.json(try await b.get("/v2/objects/demo/uuids/alice?uuid=bob&include=custom").body)
            let user = read["data"] as? [String: Any]
            #expect(user?["name"] as? String == "Alice")
            #expect((user?["custom"] as? [String: Any])?["team"] as? String == "blue")

            // Push: registered on A, listed on B; removed on B, gone on A.
            #expect(try await a.get("/v1/push/sub-key/demo/devices/aa?type=gcm&add=room,lobby&uuid=t").status == 200)
            let channels = try await b.get("/v1/push/sub-key/demo/devices/aa?type=gcm&uuid=t")
            #expect(channels.body == #"["lobby","room"]"#)
            #expect(try await b.get("/v1/push/sub-key/demo/devices/aa/remove?type=gcm&uuid=t").status == 200)
            #expect(try await a.get("/v1/push/sub-key/demo/devices/aa?type=gcm&uuid=t").body == "[]")

            await a.stop()
            await b.stop()
        }
    }
}
