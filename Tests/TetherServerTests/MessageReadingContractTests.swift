import Foundation
import Testing
@_spi(Benchmarks) import TetherProtocol
@_spi(Benchmarks) import TetherServerCore
@testable import TetherServer

/// History, catch-up reads, counts, deletes and retention: one contract, run against the
/// embedded SQLite store and against a cluster's shared log in PostgreSQL.
enum MessageReadingContract {
    static func message(_ tt: UInt64, _ channel: String, _ payload: String, expiresAt: UInt64? = nil) -> StoredMessage {
        StoredMessage(subscribeKey: "k", channel: channel, timetoken: Timetoken(tt), publisher: "p", payload: payload, meta: nil,
                      customMessageType: nil, sequence: nil, expiresAt: expiresAt.map { Timetoken($0) })
    }

    static func readsAnswerTheSame(_ kind: RecordStoreKind) async throws {
        try await RecordStoreSite.withStore(kind) { store in
            let base: UInt64 = 17_000_000_000_000_000
            let tts = (0..<6).map { base + UInt64($0) * 10 }
            for (i, tt) in tts.enumerated() {
                try await store.storeMessage(message(tt, i < 4 ? "room.a" : "room.b", "\(i)", expiresAt: i == 0 ? tt + 5 : nil))
            }
            try await store.storeMessage(message(base + 100, "other", "\"x\""))
            let all = try await store.history(subscribeKey: "k", channel: "room.a", start: nil, end: nil, count: 100, reverse: false)
            #expect(all.map(\.payload) == ["0", "1", "2", "3"])
            let newestTwo = try await store.history(subscribeKey: "k", channel: "room.a", start: nil, end: nil, count: 2, reverse: false)
            #expect(newestTwo.map(\.payload) == ["2", "3"])
            let oldestTwo = try await store.history(subscribeKey: "k", channel: "room.a", start: nil, end: nil, count: 2, reverse: true)
            #expect(oldestTwo.map(\.payload) == ["0", "1"])
            let between = try await store.history(subscribeKey: "k", channel: "room.a", start: Timetoken(tts[0]), end: Timetoken(tts[2]),
                                                  count: 100, reverse: false)
            #expect(between.map(\.payload) == ["1", "2"])
            let reversedBounds = try await store.history(subscribeKey: "k", channel: "room.a", start: Timetoken(tts[3]),
                                                         end: Timetoken(tts[1]), count: 100, reverse: false)
            #expect(reversedBounds.map(\.payload) == ["1", "2"])
            // With both bounds `reverse` is ignored (PubNub): the newest of the range, not the oldest.
            let bothBoundsReversed = try await store.history(subscribeKey: "k", channel: "room.a", start: Timetoken(tts[3]),
                                                             end: Timetoken(tts[0]), count: 2, reverse: true)
            #expect(bothBoundsReversed.map(\.payload) == ["1", "2"])
            let counts = try await store.messageCounts(subscribeKey: "k", channels: [("room.a", Timetoken(tts[1])), ("room.b", .zero)],
                                                       through: nil)
            #expect(counts == ["room.a": 2, "room.b": 2])
            let countedThrough = try await store.messageCounts(subscribeKey: "k", channels: [("room.a", .zero)], through: Timetoken(tts[1]))
            #expect(countedThrough == ["room.a": 2])
            let wildcard = try await store.read(StoreRange(subscribeKey: "k", selector: .prefix("room."), after: Timetoken(tts[2]),
                                                           through: .maximumStorable, match: "room.*"), limit: 10)
            #expect(wildcard.envelopes.map(\.payload) == ["3", "4", "5"])
            #expect(!wildcard.reachedLimit)
            let limited = try await store.read(StoreRange(subscribeKey: "k", selector: .channel("room.a"), after: .zero,
                                                          through: .maximumStorable, match: nil), limit: 2)
            #expect(limited.envelopes.map(\.payload) == ["0", "1"])
            #expect(limited.reachedLimit)
            #expect(try await store.delete(subscribeKey: "k", channel: "room.b", start: nil, end: nil) == 2)
            #expect(try await store.delete(subscribeKey: "k", channel: "room.a", start: Timetoken(tts[2]), end: nil) == 1)
            #expect(try await store.messageCount() == 4)
            // Retention: the first message expires 5 units after its timetoken.
            #expect(try await store.pruneRetention(now: Timetoken(tts[0] + 6)) == 1)
            let gaps = try await store.retentionGaps(subscribeKey: "k", channels: ["room.a"], prefixes: [], after: .zero)
            #expect(gaps == [RetentionGap(channel: "room.a", from: .zero, through: Timetoken(tts[0]))])
            let wildcardGaps = try await store.retentionGaps(subscribeKey: "k", channels: [], prefixes: ["room."], after: .zero)
            #expect(wildcardGaps.map(\.channel) == ["room.a"])
            #expect(try await store.retentionGaps(subscribeKey: "k", channels: ["room.a"], prefixes: [], after: Timetoken(tts[0])).isEmpty)
        }
    }
}

@Suite struct MessageReadingSQLiteTests {
    @Test func readsAnswerTheSame() async throws { try await MessageReadingContract.readsAnswerTheSame(.sqlite) }
}

@Suite(.enabled(if: TestPostgres.available, RecordStoreKind.postgresSkipReason))
struct MessageReadingPostgresTests {
    @Test func readsAnswerTheSame() async throws { try await MessageReadingContract.readsAnswerTheSame(.postgres) }
}
