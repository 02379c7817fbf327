import Foundation
import Synchronization
import Testing
import Tether
import TetherTesting
import TetherTestingServer

/// Issue #15's promise end to end: the SDK's outbox against a real server (real SQLite store) on
/// loopback, through the fault proxy. Faults are applied at points in the message sequence, not
/// on a timer, so what each test asserts holds however the machine schedules the work.
@Suite("Outbox end to end", .timeLimit(.minutes(2)))
struct OutboxEndToEndTests {
    /// Retries every 50–100 ms, never giving up within a test.
    static func quickRetries(_ configuration: inout TetherConfiguration) {
        configuration.outbox.retry = RetryConfiguration(policy: .linear(delay: .milliseconds(50), maximumRetries: 10_000),
                                                        minimumInterval: .milliseconds(50), jitter: .zero ... .milliseconds(50),
                                                        fastReconnect: nil)
    }

    @Test func aRetryAfterALostResponseGetsTheOriginalTimetokenAndHistoryHoldsOneCopy() async throws {
        let server = try await InProcessServer.start()
        let proxy = try await FaultProxy.start(upstream: server.origin)
        let publisher = try makeClient(origin: proxy.origin, userId: "outbox-publisher", configure: Self.quickRetries)
        let reader = try makeClient(origin: server.origin)
        let channel = unique("outbox")

        // The server stores the message, then the connection closes before a byte of the answer.
        try await proxy.apply(.dropMidResponse(afterBytes: 0))
        let entry = try await publisher.outbox.enqueue(channel: channel, message: ["n": 1])
        #expect(await eventually { (try? await reader.messages(since: .zero, channels: [channel]).count) == 1 })
        #expect(proxy.counters.dropped >= 1)
        try await proxy.apply(.pass)

        let result = try await publisher.outbox.result(of: entry.id)
        let history = try await reader.messages(since: .zero, channels: [channel])
        #expect(history.count == 1, "every retry carried the same request id")
        #expect(history.first?.timetoken == result.timetoken, "the retry was answered with the original timetoken")
        #expect(result.isRepeat)
        #expect(result.requestId == entry.requestId)

        await publisher.shutdown()
        await reader.shutdown()
        await proxy.stop()
        await server.stop()
    }

    @Test func aBurstOverAFlappingLinkReachesASubscriberOnceEachInSendOrder() async throws {
        let server = try await InProcessServer.start()
        let proxy = try await FaultProxy.start(upstream: server.origin)
        let publisher = try makeClient(origin: proxy.origin, userId: "outbox-publisher", configure: Self.quickRetries)
        let subscriber = try makeClient(origin: server.origin, userId: "outbox-subscriber")
        let channel = unique("outbox")
        let received = Mutex<[Int]>([])
        let connected = Mutex(false)
        subscriber.addStatusListener { status in if status.category == .connected { connected.withLock { $0 = true } } }
        for subscription in subscriber.subscribe(to: [channel]) {
            subscription.onEvent { event in
                guard let n = event.payload["n"]?.intValue else { return }
                received.withLock { $0.append(n) }
            }
        }
        #expect(await eventually { connected.withLock { $0 } })

        // The link flaps while the app keeps publishing: every tenth message changes the fault.
        let faults: [FaultProxy.Fault] = [.reset, .pass, .dropMidResponse(afterBytes: 0), .pass, .refuse, .pass]
        let count = 60
        var ids: [OutboxMessageID] = []
        for n in 0..<count {
            if n % 10 == 0 { try await proxy.apply(faults[(n / 10) % faults.count]) }
            ids.append(try await publisher.outbox.enqueue(channel: channel, message: ["n": .number(JSONValue.Number(Int64(n)))]).id)
        }
        try await proxy.apply(.pass)
        var timetokens: [Timetoken] = []
        for id in ids { timetokens.append(try await publisher.outbox.result(of: id).timetoken) }

        #expect(timetokens == timetokens.sorted(), "acknowledged in send order")
        #expect(await eventually { received.withLock { $0.count } >= count })
        #expect(received.withLock { $0 } == Array(0..<count), "each message once, in send order")
        let history = try await subscriber.messages(since: .zero, channels: [channel])
        #expect(history.compactMap { $0.payload["n"]?.intValue } == Array(0..<count))

        await publisher.shutdown()
        await subscriber.shutdown()
        await proxy.stop()
        await server.stop()
    }

    @Test func aServerRestartBetweenTheOriginalAndTheRetryStillLeavesOneCopy() async throws {
        var server = try await InProcessServer.start()
        let proxy = try await FaultProxy.start(upstream: server.origin)
        let publisher = try makeClient(origin: proxy.origin, userId: "outbox-publisher", configure: Self.quickRetries)
        let channel = unique("outbox")

        try await proxy.apply(.dropMidResponse(afterBytes: 0))
        let entry = try await publisher.outbox.enqueue(channel: channel, message: ["n": 1])
        let reader = try makeClient(origin: server.origin)
        #expect(await eventually { (try? await reader.messages(since: .zero, channels: [channel]).count) == 1 })
        await reader.shutdown()

        // The server restarts on the same port and store while the publisher keeps retrying.
        let port = server.port, directory = server.directory
        await server.stop(removingData: false)
        server = try await InProcessServer.start(port: port, directory: directory)
        try await proxy.apply(.pass)

        let result = try await publisher.outbox.result(of: entry.id)
        let after = try makeClient(origin: server.origin)
        let history = try await after.messages(since: .zero, channels: [channel])
        #expect(history.count == 1, "the dedup memory is in the store and survived the restart")
        #expect(history.first?.timetoken == result.timetoken)
        #expect(result.isRepeat)

        await publisher.shutdown()
        await after.shutdown()
        await proxy.stop()
        await server.stop()
    }
}
