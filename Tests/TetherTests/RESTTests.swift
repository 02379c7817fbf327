import Testing
@testable import Tether
import TetherTesting
import TetherTestingServer

/// REST APIs against the real Tether server, in process.
@Suite("REST APIs against the real server")
struct RESTTests {
    @Test func timePublishSignalFireHistory() async throws {
        let server = try await InProcessServer.start()
        let client = try makeClient(origin: server.origin)
        let channel = unique()
        let now = try await client.time()
        #expect(now > Timetoken(16_000_000_000_000_000))

        let first = try await client.publish(channel: channel, message: ["text": "hello"], options: PublishOptions(meta: ["k": "v"]))
        let second = try await client.publish(channel: channel, message: "via POST", options: PublishOptions(usePOST: true))
        let unstored = try await client.publish(channel: channel, message: "not stored", options: PublishOptions(store: false))
        let ttl = try await client.publish(channel: channel, message: "ttl", options: PublishOptions(store: true, ttl: 1, replicate: false))
        struct Note: Codable, Equatable { var n: Int }
        let encoded = try await client.publish(channel: channel, encoding: Note(n: 7))
        #expect(first.timetoken < second.timetoken && second.timetoken < unstored.timetoken && unstored.timetoken < ttl.timetoken)
        let signal = try await client.signal(channel: channel, message: "typing")
        let fire = try await client.fire(channel: channel, message: "fire")
        #expect(signal.timetoken > ttl.timetoken && fire.timetoken > signal.timetoken)

        let history = try await client.history(channel: channel, options: HistoryOptions(includeMeta: true))
        #expect(history.map(\.payload) == [["text": "hello"], "via POST", "ttl", ["n": 7]])
        #expect(history.first?.meta == ["k": "v"])
        #expect(history.last?.timetoken == encoded.timetoken)

        let page = try await client.fetchMessages(channels: [channel])
        let fetched = page.channels[channel] ?? []
        #expect(fetched.count == 4)
        #expect(fetched.first?.publisher == "tester" && fetched.first?.meta == ["k": "v"] && fetched.first?.messageType == .message)

        let counts = try await client.messageCounts(channels: [channel], since: first.timetoken)
        #expect(counts[channel] == 3)
        let perChannel = try await client.messageCounts(since: [channel: second.timetoken])
        #expect(perChannel[channel] == 2)

        try await client.deleteMessages(channel: channel, start: encoded.timetoken, end: second.timetoken)
        let remaining = try await client.history(channel: channel)
        #expect(remaining.map(\.timetoken) == [first.timetoken, encoded.timetoken])

        await client.shutdown()
        await server.stop()
    }

    @Test func historyPagesAndCatchUpAcrossChannels() async throws {
        let server = try await InProcessServer.start()
        let client = try makeClient(origin: server.origin)
        let a = unique("a"), b = unique("b")
        let start = try await client.time()
        var published: [(String, Timetoken)] = []
        for i in 0..<130 {
            let channel = i % 3 == 0 ? b : a
            published.append((channel, try await client.publish(channel: channel, message: .int(i)).timetoken))
        }
        // Pages of one channel (86 messages, 30 per page), newest page first.
        var sizes: [Int] = []
        var seen = Set<Timetoken>()
        for try await page in client.historyPages(channels: [a], options: FetchOptions(maximumPerChannel: 30)) {
            sizes.append(page.messages.count)
            for m in page.messages { #expect(seen.insert(m.timetoken).inserted) }
        }
        #expect(sizes == [30, 30, 26])
        #expect(seen.count == published.filter { $0.0 == a }.count)

        // Everything since a timetoken, across channels, oldest first, no repeats.
        let cut = published[29].1
        let since = try await client.messages(since: cut, channels: [a, b], options: FetchOptions(maximumPerChannel: 10))
        #expect(since.map(\.timetoken) == published.dropFirst(30).map(\.1))
        #expect(since.map(\.channel) == published.dropFirst(30).map(\.0))
        let all = try await client.messages(since: start, channels: [a, b])
        #expect(all.count == 130)
        await client.shutdown()
        await server.stop()
    }

    @Test func undecryptableHistoryIsDeliveredWithItsRawPayload() async throws {
        let server = try await InProcessServer.start()
        let channel = unique()
        let writer = try makeClient(origin: server.origin, cryptoModule: .aesCBC(cipherKey: "right key"))
        let reader = try makeClient(origin: server.origin, cryptoModule: .aesCBC(cipherKey: "wrong key"))
        let plain = try makeClient(origin: server.origin)
        _ = try await writer.publish(channel: channel, message: ["secret": 1])
        _ = try await plain.publish(channel: channel, message: ["clear": true])

        let good = try await writer.history(channel: channel)
        #expect(good.first?.payload == ["secret": 1] && good.first?.decryptionError == nil)
        #expect(good.last?.decryptionError?.category == .decryptionError)  // plaintext received with a cipher key

        let bad = try await reader.fetchMessages(channels: [channel]).messages
        #expect(bad.count == 2)
        let status = bad.first?.decryptionError
        #expect(status?.category == .decryptionError)
        #expect(status?.undecryptableMessage?.channel == channel)
        #expect(status?.undecryptableMessage?.rawPayload == bad.first?.payload)
        #expect(bad.first?.payload.stringValue != nil)

        // Live delivery through the subscribe engine: undecryptable messages are kept too.
        let (subscriber, _, _) = try makeObservedClient(origin: server.origin) { $0.cryptoModule = .aesCBC(cipherKey: "wrong key") }
        var statuses = subscriber.statuses().makeAsyncIterator()
        var live = subscriber.subscribe(to: [channel])[0].messages.makeAsyncIterator()
        #expect(await statuses.next()?.category == .connected)
        _ = try await writer.publish(channel: channel, message: "live")
        let event = await live.next()
        #expect(event?.decryptionError?.category == .decryptionError)
        #expect(event?.decryptionError?.undecryptableMessage?.rawPayload == event?.payload)
        #expect(await statuses.next()?.category == .decryptionError)
        for c in [writer, reader, plain, subscriber] { await c.shutdown() }
        await server.stop()
    }
}
