import Foundation
import GRDB
import NIOHTTP1
import Testing
import TetherProtocol
import TetherServerCore
@testable import TetherServer
import TetherTesting

/// Server-side deduplication of publishes by request id (issue #15): a repeat within the window
/// is answered with the original timetoken and the `Tether-Duplicate: 1` header, and nothing new
/// is stored or delivered — across concurrent retries and restarts, for a bounded number of
/// remembered publishes.
@Suite(.serialized) struct PublishDedupTests {
    /// One publish's answer.
    struct Answer {
        var status: Int
        var body: String
        var timetoken: Timetoken?
        var isRepeat: Bool
        var exposedHeaders: String?
    }

    private func publish(_ server: TestServer, _ channel: String, _ message: String, requestID: String?,
                         uuid: String? = "tester", kind: String = "publish", extra: String = "") async throws -> Answer {
        var query: [String] = []
        if let uuid { query.append("uuid=\(uuid)") }
        if let requestID { query.append("requestid=\(requestID)") }
        if !extra.isEmpty { query.append(extra) }
        let path = "/\(kind)/demo/demo/0/\(channel)/0/\(PercentCoding.encode(message))?" + query.joined(separator: "&")
        let response = try await server.get(path)
        return Self.answer(response)
    }

    private static func answer(_ response: (status: Int, body: String, headers: HTTPHeaders)) -> Answer {
        let array = (try? JSONSerialization.jsonObject(with: Data(response.body.utf8))) as? [Any]
        let timetoken = (array?.count == 3 ? array?[2] as? String : nil).flatMap { Timetoken(parsing: $0) }
        return Answer(status: response.status, body: response.body, timetoken: timetoken,
                      isRepeat: response.headers.first(name: "Tether-Duplicate") == "1",
                      exposedHeaders: response.headers.first(name: "Access-Control-Expose-Headers"))
    }

    private func history(_ server: TestServer, _ channel: String) async throws -> [String] {
        let object = try await server.object("/v3/history/sub-key/demo/channel/\(channel)?max=100&uuid=tester")
        let messages = ((object["channels"] as? [String: Any])?[channel] as? [[String: Any]]) ?? []
        return messages.map { "\($0["message"] ?? "")" }
    }

    // MARK: - Repeats

    @Test func aRepeatGetsTheOriginalTimetokenAndIsStoredAndDeliveredOnce() async throws {
        let server = try await TestServer.start()
        let cursor = try await server.handshake("chat")
        let first = try await publish(server, "chat", "\"hello\"", requestID: "6f1c-1")
        #expect(first.status == 200)
        #expect(first.isRepeat == false)
        let again = try await publish(server, "chat", "\"hello\"", requestID: "6f1c-1")
        #expect(again.status == 200)
        #expect(again.body == first.body)  // PubNub's `[1,"Sent","<tt>"]`, unchanged
        #expect(again.timetoken == first.timetoken)
        #expect(again.isRepeat)
        #expect(again.exposedHeaders == "Tether-Duplicate")  // readable by a browser's script
        // A repeat with a different body is still the same publish: the id decides.
        let changed = try await publish(server, "chat", "\"other text\"", requestID: "6f1c-1")
        #expect(changed.timetoken == first.timetoken && changed.isRepeat)
        _ = try await publish(server, "chat", "\"marker\"", requestID: "6f1c-2")

        #expect(try await history(server, "chat") == ["hello", "marker"])
        let page = try await server.subscribe("chat", tt: cursor)
        #expect(page.messages.map { $0["d"] as? String } == ["hello", "marker"])
        #expect(page.messages.first?.publishTimetoken == first.timetoken.map { String($0.rawValue) })
        #expect(server.server.state.hub.deduplicationCounts.remembered == 2)
        #expect(try await server.server.state.store.publishRecordCount() == 2)
        await server.stop()
    }

    @Test func aRepeatByPostIsDeduplicatedToo() async throws {
        let server = try await TestServer.start()
        let path = "/publish/demo/demo/0/post/0?uuid=p&requestid=post-1"
        let first = Self.answer(try await server.send(path, method: .POST, body: Array("{\"n\":1}".utf8)))
        let again = Self.answer(try await server.send(path, method: .POST, body: Array("{\"n\":1}".utf8)))
        #expect(first.status == 200 && again.status == 200)
        #expect(again.timetoken == first.timetoken && again.isRepeat && !first.isRepeat)
        #expect(try await server.server.state.store.messageCount() == 1)
        await server.stop()
    }

    @Test func concurrentRepeatsWaitForTheFirstAndMakeOneMessage() async throws {
        let server = try await TestServer.start()
        let hub = server.server.state.hub
        // Another connection holds SQLite's write lock, so the first publish stays in flight
        // while the repeats arrive.
        var configuration = Configuration()
        configuration.allowsUnsafeTransactions = true
        let blocker = try DatabaseQueue(path: server.server.state.store.path, configuration: configuration)
        try await blocker.writeWithoutTransaction { try $0.execute(sql: "BEGIN IMMEDIATE") }
        let answers = try await withThrowingTaskGroup(of: Answer.self) { group in
            for _ in 0..<5 {
                group.addTask { try await self.publish(server, "burst", "\"once\"", requestID: "same-id") }
            }
            // Polled: the repeats reach the hub over separate connections; the lock is released
            // only once one publish holds the key and the four others wait for it.
            #expect(await eventually { hub.deduplicationCounts.inFlight == 1 && hub.deduplicationCounts.waiting == 4 })
            try await blocker.writeWithoutTransaction { try $0.execute(sql: "ROLLBACK") }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(answers.allSatisfy { $0.status == 200 })
        #expect(Set(answers.compactMap(\.timetoken)).count == 1)
        #expect(answers.filter(\.isRepeat).count == 4)
        #expect(try await history(server, "burst") == ["once"])
        #expect(hub.deduplicationCounts.inFlight == 0 && hub.deduplicationCounts.waiting == 0)
        try blocker.close()
        await server.stop()
    }

    @Test func aRepeatAfterARestartGetsTheOriginalTimetoken() async throws {
        let server = try await TestServer.start()
        let first = try await publish(server, "durable", "\"kept\"", requestID: "restart-1")
        let signal = try await publish(server, "durable", "\"sig\"", requestID: "restart-2", kind: "signal")
        let unstored = try await publish(server, "durable", "\"live\"", requestID: "restart-3", extra: "store=0")
        await server.stop()

        let restarted = try await TestServer.start(directory: server.directory)
        #expect(restarted.server.state.hub.deduplicationCounts.remembered == 3)
        let again = try await publish(restarted, "durable", "\"kept\"", requestID: "restart-1")
        #expect(again.timetoken == first.timetoken && again.isRepeat)
        let signalAgain = try await publish(restarted, "durable", "\"sig\"", requestID: "restart-2", kind: "signal")
        #expect(signalAgain.timetoken == signal.timetoken && signalAgain.isRepeat)
        let unstoredAgain = try await publish(restarted, "durable", "\"live\"", requestID: "restart-3", extra: "store=0")
        #expect(unstoredAgain.timetoken == unstored.timetoken && unstoredAgain.isRepeat)
        #expect(try await history(restarted, "durable") == ["kept"])
        // New publishes get timetokens above every remembered one.
        let fresh = try await publish(restarted, "durable", "\"new\"", requestID: "restart-4")
        let freshTimetoken = try #require(fresh.timetoken)
        #expect(freshTimetoken > (unstored.timetoken ?? .zero))
        await restarted.stop()
        try? FileManager.default.removeItem(atPath: server.directory)
    }

    @Test func aRepeatAfterTheWindowIsStoredAgainAndOldRecordsArePruned() async throws {
        let clock = ManualClock()
        let server = try await TestServer.start(clock: clock)
        let hub = server.server.state.hub
        let store = server.server.state.store
        let first = try await publish(server, "late", "\"one\"", requestID: "window-1")
        clock.advance(by: .seconds(599))
        #expect(try await publish(server, "late", "\"one\"", requestID: "window-1").isRepeat)
        clock.advance(by: .seconds(2))  // 601 s after the first
        let late = try await publish(server, "late", "\"one\"", requestID: "window-1")
        #expect(late.status == 200 && !late.isRepeat)
        let lateTimetoken = try #require(late.timetoken), firstTimetoken = try #require(first.timetoken)
        #expect(lateTimetoken > firstTimetoken)
        #expect(try await history(server, "late") == ["one", "one"])
        // And the new publish is remembered from now on.
        #expect(try await publish(server, "late", "\"one\"", requestID: "window-1").timetoken == late.timetoken)

        // The sweep forgets expired entries; the store prunes rows past the window.
        _ = try await publish(server, "late", "\"two\"", requestID: "window-2")
        clock.advance(by: .seconds(601))
        #expect(hub.sweepDeduplication().entries == 0)
        #expect(try await store.publishRecordCount() == 2)
        #expect(try await store.prunePublishRecords(through: hub.publishRecordHorizon) == 2)
        #expect(try await store.publishRecordCount() == 0)
        await server.stop()
    }

    @Test func signalAndStoreZeroRepeatsAreDeliveredOnce() async throws {
        let server = try await TestServer.start()
        let cursor = try await server.handshake("live")
        let signal = try await publish(server, "live", "\"s\"", requestID: "sig-1", kind: "signal")
        let repeated = try await publish(server, "live", "\"s\"", requestID: "sig-1", kind: "signal")
        #expect(repeated.timetoken == signal.timetoken && repeated.isRepeat)
        let unstored = try await publish(server, "live", "\"u\"", requestID: "u-1", extra: "store=0")
        #expect(try await publish(server, "live", "\"u\"", requestID: "u-1", extra: "store=0").timetoken == unstored.timetoken)
        _ = try await publish(server, "live", "\"marker\"", requestID: nil, kind: "signal")
        let page = try await server.subscribe("live", tt: cursor)
        #expect(page.messages.map { $0["d"] as? String } == ["s", "u", "marker"])
        #expect(try await store(server).messageCount() == 0)
        await server.stop()
    }

    private func store(_ server: TestServer) -> MessageStore { server.server.state.store }

    @Test func theKeyIsPublisherAndRequestID() async throws {
        let server = try await TestServer.start()
        let alice = try await publish(server, "k", "1", requestID: "shared", uuid: "alice")
        let bob = try await publish(server, "k", "1", requestID: "shared", uuid: "bob")
        let anonymous = try await publish(server, "k", "1", requestID: "shared", uuid: nil)
        #expect(!bob.isRepeat && !anonymous.isRepeat)
        #expect(Set([alice.timetoken, bob.timetoken, anonymous.timetoken]).count == 3)
        // Each is remembered on its own, including the one without a uuid.
        #expect(try await publish(server, "k", "1", requestID: "shared", uuid: nil).timetoken == anonymous.timetoken)
        #expect(try await publish(server, "k", "1", requestID: "shared", uuid: "bob").timetoken == bob.timetoken)
        // The same id on another channel is still the same publish (a retry never changes channel).
        #expect(try await publish(server, "elsewhere", "1", requestID: "shared", uuid: "alice").timetoken == alice.timetoken)
        #expect(try await history(server, "k").count == 3)
        await server.stop()
    }

    @Test func withoutARequestIDNothingChanges() async throws {
        let server = try await TestServer.start()
        let a = try await publish(server, "plain", "1", requestID: nil)
        let b = try await publish(server, "plain", "1", requestID: nil)
        #expect(a.status == 200 && b.status == 200 && !a.isRepeat && !b.isRepeat)
        #expect(a.timetoken != b.timetoken)
        #expect(try await history(server, "plain").count == 2)
        #expect(try await store(server).publishRecordCount() == 0)
        #expect(server.server.state.hub.deduplicationCounts.remembered == 0)
        await server.stop()
    }

    @Test func anInvalidRequestIDGetsThePublishErrorArray() async throws {
        let server = try await TestServer.start()
        let tooLong = String(repeating: "a", count: 65)
        for id in ["", tooLong, "with%20space", "caf%C3%A9", "tab%09", "%7F"] {
            let answer = try await publish(server, "bad", "1", requestID: id)
            #expect(answer.status == 400, "\(id)")
            #expect(answer.body.hasPrefix(#"[0,"Invalid requestid: "#), "\(id): \(answer.body)")
            #expect(answer.timetoken != nil)
        }
        let signal = try await publish(server, "bad", "1", requestID: "two%20words", kind: "signal")
        #expect(signal.status == 400 && signal.body.hasPrefix(#"[0,"Invalid requestid"#))
        // The longest accepted id, every printable character.
        #expect(try await publish(server, "bad", "1", requestID: String(repeating: "b", count: 64)).status == 200)
        #expect(try await publish(server, "bad", "1", requestID: PercentCoding.encode("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")).status == 200)
        #expect(try await history(server, "bad").count == 2)
        await server.stop()
    }

    @Test func aSignedPublishWithARequestIDVerifies() async throws {
        let keyset = Keyset(name: "secure", publishKey: "pub-s", subscribeKey: "sub-s", secretKey: "s3cret")
        let server = try await TestServer.start(file: .init(keysets: [keyset], subscribeTimeoutSeconds: 30))
        let path = signedPath("/publish/pub-s/sub-s/0/signed/0/1", ["uuid": "backend", "requestid": "4b7e-aa"], keyset: keyset)
        let first = Self.answer(try await server.get(path))
        #expect(first.status == 200, "\(first.body)")
        let again = Self.answer(try await server.get(path))
        #expect(again.status == 200 && again.isRepeat && again.timetoken == first.timetoken)
        // The signature covers the request id.
        let tampered = Self.answer(try await server.get(path.replacingOccurrences(of: "requestid=4b7e-aa", with: "requestid=4b7e-ab")))
        #expect(tampered.status == 403)
        await server.stop()
    }

    // MARK: - Bound and configuration

    @Test func theBoundForgetsTheOldestFirst() async throws {
        var file = ConfigurationFile(subscribeTimeoutSeconds: 30)
        file.dedup = .init(maxEntries: 3)
        let server = try await TestServer.start(file: file)
        let hub = server.server.state.hub
        var first: [Timetoken?] = []
        for index in 1...4 { first.append(try await publish(server, "bound", "\(index)", requestID: "r\(index)").timetoken) }
        #expect(hub.deduplicationCounts.remembered == 3)
        let swept = hub.sweepDeduplication()
        #expect(swept.entries == 3 && swept.evicted == 1)
        // r2…r4 are remembered; r1 was forgotten early and is stored again.
        for index in [4, 3, 2] {
            let again = try await publish(server, "bound", "\(index)", requestID: "r\(index)")
            #expect(again.isRepeat && again.timetoken == first[index - 1], "r\(index)")
        }
        let forgotten = try await publish(server, "bound", "1", requestID: "r1")
        #expect(!forgotten.isRepeat && forgotten.timetoken != first[0])
        #expect(try await history(server, "bound").count == 5)
        await server.stop()
    }

    @Test func aZeroWindowTurnsDeduplicationOff() async throws {
        var file = ConfigurationFile(subscribeTimeoutSeconds: 30)
        file.dedup = .init(windowSeconds: 0)
        let server = try await TestServer.start(file: file)
        let a = try await publish(server, "off", "1", requestID: "id")
        let b = try await publish(server, "off", "1", requestID: "id")
        #expect(!b.isRepeat && a.timetoken != b.timetoken)
        #expect(try await store(server).publishRecordCount() == 0)
        // The id is still checked.
        #expect(try await publish(server, "off", "1", requestID: "two%20words").status == 400)
        await server.stop()
    }

    @Test func dedupSettingsDecodeAndValidate() throws {
        let file = try JSONDecoder().decode(ConfigurationFile.self, from: Data("""
            {"dedup": {"windowSeconds": 120, "maxEntries": 5000}}
            """.utf8))
        try file.validate()
        #expect(file.dedup == .init(windowSeconds: 120, maxEntries: 5000))
        let configuration = ServerConfiguration(file: file).deduplication
        #expect(configuration.windowSeconds == 120 && configuration.maximumEntries == 5000)
        #expect(ServerConfiguration().deduplication.windowSeconds == 600)
        #expect(ServerConfiguration().deduplication.maximumEntries == 100_000)
        var bad = ConfigurationFile()
        bad.dedup = .init(windowSeconds: -1)
        #expect(throws: ServerConfigurationError.self) { try bad.validate() }
        bad.dedup = .init(windowSeconds: 86_401)
        #expect(throws: ServerConfigurationError.self) { try bad.validate() }
        bad.dedup = .init(maxEntries: 0)
        #expect(throws: ServerConfigurationError.self) { try bad.validate() }
    }
}
