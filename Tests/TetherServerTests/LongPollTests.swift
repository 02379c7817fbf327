import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import Testing
import TetherProtocol
import TetherServer

@Suite(.serialized) struct LongPollTests {
    @Test func aWaitingLongPollIsAnsweredByAPublish() async throws {
        let server = try await TestServer.start()
        let cursor = try await server.handshake("live")
        async let waiting = server.subscribe("live", tt: cursor)
        #expect(await server.longPollsWaiting(1))
        let tt = try await server.publish("live", #"{"text":"hello"}"#)
        let (next, messages, _) = try await waiting
        #expect(messages.count == 1)
        #expect(messages.first?.publishTimetoken == String(tt.rawValue))
        #expect((messages.first?["d"] as? [String: Any])?["text"] as? String == "hello")
        #expect(messages.first?["c"] as? String == "live")
        #expect(next >= tt)
        await server.stop()
    }

    /// A long-poll waits parked in the hub without a task, and is served again when it wakes;
    /// that second run is not a new subscribe: a uuid that left while it waited is not joined
    /// again by it (its end only refreshes presence where the uuid still is).
    @Test func aUuidThatLeftWhileItsLongPollWaitedIsNotJoinedAgain() async throws {
        let server = try await TestServer.start()
        let cursor = try await server.handshake("room")
        func occupancy() async throws -> Int {
            let (_, body, _) = try await server.get("/v2/presence/sub-key/demo/channel/room")
            let object = try JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any]
            return object?["occupancy"] as? Int ?? -1
        }
        #expect(try await occupancy() == 1)
        async let waiting = server.subscribe("room", tt: cursor)
        #expect(await server.longPollsWaiting(1))
        _ = try await server.get("/v2/presence/sub-key/demo/channel/room/leave?uuid=tester")
        #expect(try await occupancy() == 0)
        let tt = try await server.publish("room", "1")
        let (_, messages, _) = try await waiting
        #expect(messages.map(\.publishTimetoken) == [String(tt.rawValue)])
        #expect(try await occupancy() == 0, "the long-poll's answer did not join tester again")
        await server.stop()
    }

    /// Long-polls that park and wake while publishes race them: 24 subscribers on 4 channels
    /// follow their cursors while 8 publishers send 240 messages; every subscriber receives
    /// every message of its channel exactly once, in publish order.
    @Test func parkedLongPollsRacingPublishesLoseAndRepeatNothing() async throws {
        var started = try await TestServer.start()
        // 24 long-polls and 8 publishers at once: a client with a connection for each.
        let client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: .init(
            connectionPool: .init(idleTimeout: .seconds(30), concurrentHTTP1ConnectionsPerHostSoftLimit: 64)))
        started.client = client
        let server = started
        let channels = (0..<4).map { "race-\($0)" }
        var starts: [String: Timetoken] = [:]
        for channel in channels { starts[channel] = try await server.handshake(channel) }
        let perPublisher = 30
        // (p + i) % 4 spreads each publisher's messages evenly: 60 per channel.
        let perChannel = 8 * perPublisher / channels.count
        enum Outcome { case sent([(String, String)]), received(String, [String]) }
        let outcomes = try await withThrowingTaskGroup(of: Outcome.self) { group in
            for s in 0..<24 {
                let channel = channels[s % channels.count]
                let start = starts[channel]!
                group.addTask {
                    var cursor = start
                    var got: [String] = []
                    while got.count < perChannel {
                        let (next, messages, _) = try await server.subscribe(channel, tt: cursor, timeout: .seconds(20))
                        got += messages.compactMap(\.publishTimetoken)
                        cursor = next
                    }
                    return .received(channel, got)
                }
            }
            for p in 0..<8 {
                group.addTask {
                    var sent: [(String, String)] = []
                    for i in 0..<perPublisher {
                        let channel = channels[(p + i) % channels.count]
                        sent.append((channel, String(try await server.publish(channel, "\(p * 1000 + i)").rawValue)))
                    }
                    return .sent(sent)
                }
            }
            var all: [Outcome] = []
            for try await outcome in group { all.append(outcome) }
            return all
        }
        var published: [(String, String)] = []
        var received: [(String, [String])] = []
        for outcome in outcomes {
            switch outcome {
            case .sent(let sent): published += sent
            case .received(let channel, let got): received.append((channel, got))
            }
        }
        // Timetokens are decimal strings of one length, so text order is numeric order.
        let expected = Dictionary(grouping: published, by: \.0).mapValues { $0.map(\.1).sorted() }
        #expect(received.count == 24)
        for (channel, got) in received {
            #expect(got == expected[channel], "\(channel): \(got.count) received, \(expected[channel]?.count ?? 0) published")
        }
        try await client.shutdown()
        await server.stop()
    }

    @Test func aLongPollStopsWaitingWhenItsClientDisconnects() async throws {
        let server = try await TestServer.start()
        let cursor = try await server.handshake("idle")
        let port = Int(server.baseURL.split(separator: ":").last!)!
        let group = MultiThreadedEventLoopGroup.singleton
        let channel = try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: port).get()
        let request = "GET /v2/subscribe/demo/idle/0?tt=\(cursor.rawValue)&uuid=u HTTP/1.1\r\nHost: x\r\n\r\n"
        try await channel.writeAndFlush(ByteBuffer(string: request))
        #expect(await server.longPollsWaiting(1))
        try await channel.close()
        #expect(await server.longPollsWaiting(0, within: 5))
        await server.stop()
    }

    @Test func anEmptyResponseComesAtTheConfiguredExpiry() async throws {
        let server = try await TestServer.start(file: .init(subscribeTimeoutSeconds: 1))
        let cursor = try await server.handshake("quiet")
        let (next, messages, _) = try await server.subscribe("quiet", tt: cursor, timeout: .seconds(10))
        #expect(messages.isEmpty)
        #expect(next >= cursor)
        await server.stop()
    }

    @Test func parkedLongPollsShareOneDeadlineTimerAndEachIsAnsweredAtItsExpiry() async throws {
        // The hub keeps one timer for every parked long-poll, armed for the earliest deadline.
        // The first long-poll arms it and is answered early by a message; the timer then fires
        // at that stale deadline, finds nobody due, and must re-arm for the three parked since.
        let server = try await TestServer.start(file: .init(subscribeTimeoutSeconds: 2))
        let first = try await server.handshake("expiry-0")
        async let early = server.subscribe("expiry-0", tt: first, timeout: .seconds(10))
        #expect(await server.longPollsWaiting(1))
        _ = try await server.publish("expiry-0", "\"early\"")
        #expect(try await early.messages.count == 1)
        let channels = (1...3).map { "expiry-\($0)" }
        var cursors: [Timetoken] = []
        for channel in channels { cursors.append(try await server.handshake(channel)) }
        try await withThrowingTaskGroup(of: Int.self) { group in
            for (channel, cursor) in zip(channels, cursors) {
                group.addTask { try await server.subscribe(channel, tt: cursor, timeout: .seconds(10)).messages.count }
            }
            var answered = 0
            for try await count in group {
                #expect(count == 0)
                answered += 1
            }
            #expect(answered == 3, "each answered at its expiry")
        }
        await server.stop()
    }

    @Test func catchUpIsPagedInOrderExactlyOnce() async throws {
        let server = try await TestServer.start()
        let start = try await server.handshake("paged")
        var published: [String] = []
        for i in 0..<250 {
            published.append(String(try await server.publish("paged", "\(i)").rawValue))
        }
        var cursor = start
        var received: [String] = []
        var pageSizes: [Int] = []
        while received.count < 250 {
            let (next, messages, _) = try await server.subscribe("paged", tt: cursor, timeout: .seconds(5))
            pageSizes.append(messages.count)
            received.append(contentsOf: messages.compactMap(\.publishTimetoken))
            #expect(next > cursor)
            cursor = next
        }
        #expect(received == published)
        #expect(pageSizes.allSatisfy { $0 <= 100 })
        await server.stop()
    }

    @Test func changingTheChannelListKeepsTheCursor() async throws {
        let server = try await TestServer.start()
        let cursor = try await server.handshake("first")
        let tt = try await server.publish("second", "1")
        // The client adds a channel it never handshook on, continuing from its old cursor.
        let (_, messages, _) = try await server.subscribe("first,second", tt: cursor, timeout: .seconds(5))
        #expect(messages.compactMap(\.publishTimetoken) == [String(tt.rawValue)])
        await server.stop()
    }

    @Test func wildcardAndNonStoredMessagesReachCatchingUpSubscribers() async throws {
        let server = try await TestServer.start()
        let cursor = try await server.handshake("scores.*")
        let a = try await server.publish("scores.eu", "1", query: "&store=0")
        let b = try await server.publish("scores.us.east", "2")
        _ = try await server.publish("scoresX", "3")
        let (_, messages, _) = try await server.subscribe("scores.*", tt: cursor, timeout: .seconds(5))
        #expect(messages.compactMap(\.publishTimetoken) == [String(a.rawValue), String(b.rawValue)])
        #expect(messages.allSatisfy { $0["b"] as? String == "scores.*" })
        await server.stop()
    }

    @Test func catchUpSurvivesARestartAndTimetokensKeepIncreasing() async throws {
        let first = try await TestServer.start()
        let cursor = try await first.handshake("durable")
        var published: [String] = []
        for i in 0..<120 { published.append(String(try await first.publish("durable", "\(i)").rawValue)) }
        _ = try await first.publish("durable", "\"gone\"", query: "&store=0")
        await first.stop()

        let second = try await TestServer.start(directory: first.directory)
        let after = try await second.publish("durable", "\"after\"")
        #expect(String(after.rawValue) > published.last!)
        var received: [String] = []
        var next = cursor
        while received.count < 121 {
            let page = try await second.subscribe("durable", tt: next, timeout: .seconds(5))
            received.append(contentsOf: page.messages.compactMap(\.publishTimetoken))
            next = page.cursor
        }
        // Stored messages survive the restart; the store=0 one lived only in the old process.
        #expect(received == published + [String(after.rawValue)])
        await second.stop()
    }

    /// Presence channels are never read from the store: presence events that left the window are
    /// still reported as a gap to a subscriber behind them.
    @Test func presenceEventsThatLeftTheWindowAreReportedAsAGap() async throws {
        var file = ConfigurationFile(subscribeTimeoutSeconds: 30)
        file.window = .init(capacity: 2)
        let server = try await TestServer.start(file: file)
        let cursor = try await server.handshake("lobby-pnpres")
        for uuid in ["u1", "u2", "u3"] {  // three joins: the first leaves the window of two
            #expect(try await server.get("/v2/subscribe/demo/lobby/0?tt=0&uuid=\(uuid)").status == 200)
        }
        let (_, messages, headers) = try await server.subscribe("lobby-pnpres", tt: cursor, timeout: .seconds(5))
        #expect(messages.count == 2, "\(messages)")
        let gap = headers.first(name: "X-Tether-Gap") ?? ""
        #expect(gap.hasPrefix("lobby-pnpres;from=\(cursor.rawValue);through="), "\(headers)")
        await server.stop()
    }

    @Test func aCursorOlderThanRetentionIsReportedAsAGap() async throws {
        let keyset = Keyset(name: "short", publishKey: "demo", subscribeKey: "demo", historyRetentionHours: 1)
        let server = try await TestServer.start(file: .init(keysets: [keyset], subscribeTimeoutSeconds: 30))
        let cursor = try await server.handshake("ephemeral")
        let old = try await server.publish("ephemeral", "1")
        // Two hours later retention removes it.
        let removed = try await server.server.state.store.pruneExpired(now: Timetoken(old.rawValue + 2 * 36_000_000_000))
        #expect(removed == 1)
        await server.stop()
        // After a restart nothing is in memory: the subscriber catches up from the store.
        let restarted = try await TestServer.start(directory: server.directory, file: .init(keysets: [keyset], subscribeTimeoutSeconds: 30))
        let kept = try await restarted.publish("ephemeral", "2")
        let (_, messages, headers) = try await restarted.subscribe("ephemeral", tt: cursor, timeout: .seconds(5))
        #expect(messages.compactMap(\.publishTimetoken) == [String(kept.rawValue)])
        #expect(headers.first(name: "X-Tether-Gap") == "ephemeral;from=\(cursor.rawValue);through=\(old.rawValue)")
        // Once past the gap, it is not reported again.
        _ = try await restarted.publish("ephemeral", "3")
        let (_, _, later) = try await restarted.subscribe("ephemeral", tt: kept, timeout: .seconds(5))
        #expect(later.first(name: "X-Tether-Gap") == nil)
        await restarted.stop()
    }

    /// A subscriber through a channel group is told of history retention removed on the group's
    /// channels, as one naming the channel is. Before, only named channels and wildcards were
    /// asked about, and the pruned message was skipped without a gap.
    @Test func aGroupSubscriberIsToldOfRetentionGapsOnItsChannels() async throws {
        let keyset = Keyset(name: "short", publishKey: "demo", subscribeKey: "demo", historyRetentionHours: 1)
        let file = ConfigurationFile(keysets: [keyset], subscribeTimeoutSeconds: 30)
        let server = try await TestServer.start(file: file)
        #expect(try await server.get("/v1/channel-registration/sub-key/demo/channel-group/team?add=ephemeral").status == 200)
        let cursor = try await server.subscribe(",", tt: .zero, groups: "team").cursor
        let old = try await server.publish("ephemeral", "1")
        #expect(try await server.server.state.store.pruneExpired(now: Timetoken(old.rawValue + 2 * 36_000_000_000)) == 1)
        await server.stop()
        let restarted = try await TestServer.start(directory: server.directory, file: file)
        let kept = try await restarted.publish("ephemeral", "2")
        let (_, messages, headers) = try await restarted.subscribe(",", tt: cursor, groups: "team", timeout: .seconds(5))
        #expect(messages.compactMap(\.publishTimetoken) == [String(kept.rawValue)])
        #expect(headers.first(name: "X-Tether-Gap") == "ephemeral;from=\(cursor.rawValue);through=\(old.rawValue)")
        await restarted.stop()
    }

    /// A channel with both a retention gap and non-stored events that left its window gets one
    /// gap reaching the later of the two. Before, the window's was dropped and the gap ended at
    /// the pruned message, before the lost signal.
    @Test func aRetentionGapAndAWindowLossOnOneChannelAreReportedToTheLaterOne() async throws {
        let keyset = Keyset(name: "short", publishKey: "demo", subscribeKey: "demo", historyRetentionHours: 1)
        var file = ConfigurationFile(keysets: [keyset], subscribeTimeoutSeconds: 30)
        file.window = .init(capacity: 2)
        let server = try await TestServer.start(file: file)
        let cursor = try await server.handshake("mixed")
        let old = try await server.publish("mixed", "1")
        #expect(try await server.server.state.store.pruneExpired(now: Timetoken(old.rawValue + 2 * 36_000_000_000)) == 1)
        // Three not stored: the first leaves the window of two (and "1" with it).
        var unstored: [Timetoken] = []
        for i in 2...4 { unstored.append(try await server.publish("mixed", "\(i)", query: "&store=0")) }
        let (_, messages, headers) = try await server.subscribe("mixed", tt: cursor, timeout: .seconds(5))
        #expect(messages.compactMap(\.publishTimetoken) == unstored.dropFirst().map { String($0.rawValue) })
        #expect(headers.first(name: "X-Tether-Gap") == "mixed;from=\(cursor.rawValue);through=\(unstored[0].rawValue)")
        await server.stop()
    }

    @Test func aCursorFromTheFutureIsTreatedAsCurrent() async throws {
        let server = try await TestServer.start()
        async let waiting = server.subscribe("future", tt: Timetoken(99_999_999_999_999_999), timeout: .seconds(10))
        #expect(await server.longPollsWaiting(1))
        let tt = try await server.publish("future", "1")
        #expect(try await waiting.messages.compactMap(\.publishTimetoken) == [String(tt.rawValue)])
        await server.stop()
    }
}
