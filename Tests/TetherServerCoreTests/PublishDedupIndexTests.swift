import Testing
import TetherProtocol
import TetherServerCore

/// The deduplication index on its own: claims, waiters, the window and the bound, with time
/// passed in (timetoken units: 10,000,000 per second).
@Suite struct PublishDedupIndexTests {
    typealias Index = PublishDedupIndex<String>

    static func key(_ id: String, publisher: String? = "p") -> DedupKey {
        DedupKey(subscribeKey: "demo", publisher: publisher, requestID: id)
    }

    static func at(seconds: UInt64) -> Timetoken { Timetoken(1_000_000_000_000 + seconds * 10_000_000) }

    private func describe(_ claim: Index.Claim) -> String {
        switch claim {
        case .fresh: "fresh"
        case .repeated(let tt): "repeated(\(tt.rawValue))"
        case .inFlight: "inFlight"
        }
    }

    @Test func aClaimedKeyMakesRepeatsWaitAndSettlingAnswersThem() {
        var index = Index(configuration: .init(windowSeconds: 60, maximumEntries: 10))
        let key = Self.key("a")
        #expect(describe(index.claim(key, now: Self.at(seconds: 0))) == "fresh")
        #expect(describe(index.claim(key, now: Self.at(seconds: 0))) == "inFlight")
        #expect(describe(index.wait(key, "second", now: Self.at(seconds: 0))) == "inFlight")
        #expect(describe(index.wait(key, "third", now: Self.at(seconds: 0))) == "inFlight")
        #expect(index.inFlightCount == 1 && index.waiterCount == 2 && index.rememberedCount == 0)
        #expect(index.settle(key, timetoken: Timetoken(42), now: Self.at(seconds: 1)) == ["second", "third"])
        #expect(describe(index.claim(key, now: Self.at(seconds: 2))) == "repeated(42)")
        #expect(describe(index.wait(key, "late", now: Self.at(seconds: 2))) == "repeated(42)")
        #expect(index.inFlightCount == 0 && index.rememberedCount == 1)
    }

    @Test func aFailedPublishReleasesItsWaitersToClaimAgain() {
        var index = Index(configuration: .init(windowSeconds: 60, maximumEntries: 10))
        let key = Self.key("a")
        _ = index.claim(key, now: Self.at(seconds: 0))
        _ = index.wait(key, "w1", now: Self.at(seconds: 0))
        _ = index.wait(key, "w2", now: Self.at(seconds: 0))
        #expect(index.release(key) == ["w1", "w2"])
        // The first waiter to come back becomes the fresh attempt; the other waits for it.
        #expect(describe(index.wait(key, "w1", now: Self.at(seconds: 1))) == "fresh")
        #expect(describe(index.wait(key, "w2", now: Self.at(seconds: 1))) == "inFlight")
        #expect(index.settle(key, timetoken: Timetoken(7), now: Self.at(seconds: 1)) == ["w2"])
        #expect(index.release(key).isEmpty)  // a remembered key is not released
        #expect(describe(index.claim(key, now: Self.at(seconds: 1))) == "repeated(7)")
    }

    @Test func theWindowEndsARepeatAndTheSweepForgets() {
        var index = Index(configuration: .init(windowSeconds: 60, maximumEntries: 10))
        let key = Self.key("a")
        _ = index.claim(key, now: Self.at(seconds: 0))
        _ = index.settle(key, timetoken: Timetoken(1), now: Self.at(seconds: 0))
        #expect(describe(index.claim(key, now: Self.at(seconds: 59))) == "repeated(1)")
        // At the window's end the key is free again: a new publish, remembered anew.
        #expect(describe(index.claim(key, now: Self.at(seconds: 60))) == "fresh")
        #expect(index.rememberedCount == 0)
        _ = index.settle(key, timetoken: Timetoken(2), now: Self.at(seconds: 60))
        _ = index.claim(Self.key("b"), now: Self.at(seconds: 61))
        _ = index.settle(Self.key("b"), timetoken: Timetoken(3), now: Self.at(seconds: 61))
        // The first entry's stale place in the order is skipped, not counted.
        #expect(index.expire(now: Self.at(seconds: 119)) == 0)
        #expect(index.expire(now: Self.at(seconds: 120)) == 1)
        #expect(describe(index.claim(Self.key("b"), now: Self.at(seconds: 120))) == "repeated(3)")
        #expect(index.expire(now: Self.at(seconds: 121)) == 1)
        #expect(index.rememberedCount == 0)
    }

    @Test func theBoundForgetsTheOldestAndCountsIt() {
        var index = Index(configuration: .init(windowSeconds: 600, maximumEntries: 3))
        for n in 1...5 {
            let key = Self.key("r\(n)")
            _ = index.claim(key, now: Self.at(seconds: UInt64(n)))
            _ = index.settle(key, timetoken: Timetoken(UInt64(n)), now: Self.at(seconds: UInt64(n)))
        }
        #expect(index.rememberedCount == 3)
        #expect(index.takeEvictionCount() == 2)
        #expect(index.takeEvictionCount() == 0)
        #expect(describe(index.claim(Self.key("r1"), now: Self.at(seconds: 6))) == "fresh")
        #expect(describe(index.claim(Self.key("r3"), now: Self.at(seconds: 6))) == "repeated(3)")
        // Keys in flight do not count towards the bound.
        #expect(index.rememberedCount == 3 && index.inFlightCount == 1)
    }

    @Test func restoredRecordsAreRememberedUntilTheirOwnWindowEnds() {
        var index = Index(configuration: .init(windowSeconds: 60, maximumEntries: 10))
        index.restore(Self.key("old"), timetoken: Timetoken(1), at: Self.at(seconds: 0), now: Self.at(seconds: 70))
        index.restore(Self.key("recent"), timetoken: Timetoken(2), at: Self.at(seconds: 30), now: Self.at(seconds: 70))
        #expect(index.rememberedCount == 1)
        #expect(describe(index.claim(Self.key("recent"), now: Self.at(seconds: 70))) == "repeated(2)")
        #expect(describe(index.claim(Self.key("recent"), now: Self.at(seconds: 90))) == "fresh")
        #expect(describe(index.claim(Self.key("recent", publisher: nil), now: Self.at(seconds: 90))) == "fresh")
    }

    @Test func theKeyDistinguishesKeysetPublisherAndID() {
        #expect(DedupKey(subscribeKey: "a", publisher: nil, requestID: "x") == DedupKey(subscribeKey: "a", publisher: "", requestID: "x"))
        #expect(DedupKey(subscribeKey: "a", publisher: "u", requestID: "x") != DedupKey(subscribeKey: "b", publisher: "u", requestID: "x"))
        #expect(DedupKey(subscribeKey: "a", publisher: "u", requestID: "x") != DedupKey(subscribeKey: "a", publisher: "v", requestID: "x"))
    }
}
