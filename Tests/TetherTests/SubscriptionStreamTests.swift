import Testing
@testable import Tether
import TetherClientCore
import TetherProtocol

/// A subscription's streams: an unread stream keeps a bounded number of events, a read one every
/// event. Driven through the subscription's delivery directly (no server needed).
@Suite struct SubscriptionStreamTests {
    static func message(_ index: Int, kind: EventKind = .message) -> ReceivedEvent {
        ReceivedEvent(timetoken: Timetoken(UInt64(1_000 + index)), channel: "room", subscription: nil, payload: .string(String(index)),
                      publisher: "p", meta: nil, kind: kind, customMessageType: nil)
    }

    static func drain(_ stream: AsyncStream<ReceivedEvent>) async -> [Int] {
        var values: [Int] = []
        for await event in stream {
            if let value = event.payload.stringValue.flatMap({ Int($0) }) { values.append(value) }
        }
        return values
    }

    /// An app that listens with closures never reads the streams: they keep the newest
    /// `unreadStreamLimit` events, not every event for as long as the subscription lives.
    @Test func aStreamNotYetReadKeepsOnlyTheNewestEvents() async throws {
        let client = try makeClient(origin: "127.0.0.1:9")
        let room = client.subscription(channel: "room")
        let heard = Counter()
        room.onMessage { _ in _ = heard.increment() }
        let total = Subscription.unreadStreamLimit + 500
        for index in 0..<total { room.deliver(Self.message(index)) }
        #expect(heard.increment() == total + 1, "closure listeners get every event")
        room.finish()
        let kept = await Self.drain(room.messages)
        #expect(kept == Array(500..<total), "the newest \(Subscription.unreadStreamLimit), in order")
        #expect(await Self.drain(room.signals).isEmpty)
        await client.shutdown()
    }

    /// A stream read before its events arrive gets every one of them, however many its consumer
    /// has not taken yet; reading the property again gives the same stream.
    @Test func aStreamReadFirstGetsEveryEvent() async throws {
        let client = try makeClient(origin: "127.0.0.1:9")
        let room = client.subscription(channel: "room")
        let messages = room.messages
        let total = Subscription.unreadStreamLimit * 3
        for index in 0..<total { room.deliver(Self.message(index)) }
        room.deliver(Self.message(total, kind: .signal))
        room.finish()
        #expect(await Self.drain(messages) == Array(0..<total))
        #expect(await Self.drain(room.messages).isEmpty, "one stream, already consumed")
        #expect(await Self.drain(room.signals) == [total], "a signal kept for the unread signal stream")
        await client.shutdown()
    }
}
