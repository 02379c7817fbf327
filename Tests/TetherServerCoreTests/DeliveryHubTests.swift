import Testing
@_spi(Benchmarks) import TetherProtocol
@_spi(Benchmarks) import TetherServerCore

private func envelope(_ tt: Timetoken, _ channel: String, key: String = "k", payload: String = "1") -> SubscribeEnvelope {
    SubscribeEnvelope(timetoken: tt, subscribeKey: key, channel: channel, payload: payload)
}

private func decodedTimetokens(_ page: [[UInt8]]) -> [String] {
    page.map { bytes in
        let text = String(decoding: bytes, as: UTF8.self)
        let afterMarker = text.split(separator: "\"p\":{\"t\":\"", maxSplits: 1)[1]
        return String(afterMarker.prefix { $0 != "\"" })
    }
}

@Suite struct SequencerTests {
    @Test func strictlyIncreasingEvenWhenTheClockStepsBack() {
        var sequencer = TimetokenSequencer(floor: Timetoken(100))
        #expect(sequencer.next(now: Timetoken(50)) == Timetoken(101))
        #expect(sequencer.next(now: Timetoken(500)) == Timetoken(500))
        #expect(sequencer.next(now: Timetoken(500)) == Timetoken(501))
        #expect(sequencer.next(now: Timetoken(10)) == Timetoken(502))
    }
}

@Suite struct DeliveryHubTests {
    let now = Timetoken(1_000_000_000)

    @Test func eventsBecomeVisibleOnlyWhenEveryEarlierReservationCommitted() {
        var hub = DeliveryHub(floor: .zero, now: now)
        let start = hub.visibleThrough
        let spec = SubscriptionSpec(subscribeKey: "k", channels: ["a", "b"])
        let first = hub.reserve(ChannelKey(subscribeKey: "k", channel: "a"), now: now)
        let second = hub.reserve(ChannelKey(subscribeKey: "k", channel: "b"), now: now)
        #expect(first < second)
        #expect(hub.visibleThrough == Timetoken(first.rawValue - 1))

        let waiter = hub.register(spec)
        // The later event commits first: still invisible, nobody is woken.
        let wokenEarly = hub.commit(BufferedEvent(envelope: envelope(second, "b"), isStored: false), now: now)
        #expect(wokenEarly.isEmpty)
        #expect(hub.plan(spec, after: start, now: now).bufferEvents.isEmpty)
        // The earlier one commits: both become visible and the waiter wakes once.
        let woken = hub.commit(BufferedEvent(envelope: envelope(first, "a"), isStored: false), now: now)
        #expect(woken == [waiter])
        let plan = hub.plan(spec, after: start, now: now)
        #expect(plan.bufferEvents.map(\.event.timetoken) == [first, second])
        #expect(plan.visibleThrough == second)
        #expect(hub.waiterCount == 0)
    }

    @Test func abandonedReservationsReleaseTheCursor() {
        var hub = DeliveryHub(floor: .zero, now: now)
        let tt = hub.reserve(ChannelKey(subscribeKey: "k", channel: "a"), now: now)
        #expect(hub.visibleThrough < tt)
        _ = hub.abandon(tt)
        #expect(hub.visibleThrough == tt)
        #expect(hub.plan(SubscriptionSpec(subscribeKey: "k", channels: ["a"]), after: Timetoken(tt.rawValue - 1), now: now).isEmpty)
    }

    @Test func wakesOnlyMatchingWaitersIncludingWildcards() {
        var hub = DeliveryHub(floor: .zero, now: now)
        let direct = hub.register(SubscriptionSpec(subscribeKey: "k", channels: ["sports.eu"]))
        let wildcard = hub.register(SubscriptionSpec(subscribeKey: "k", names: ["sports.*"]))
        let other = hub.register(SubscriptionSpec(subscribeKey: "k", channels: ["news"]))
        let otherKeyset = hub.register(SubscriptionSpec(subscribeKey: "other", channels: ["sports.eu"]))
        let tt = hub.reserve(ChannelKey(subscribeKey: "k", channel: "sports.eu"), now: now)
        let woken = hub.commit(BufferedEvent(envelope: envelope(tt, "sports.eu"), isStored: true), now: now)
        #expect(Set(woken) == [direct, wildcard])
        #expect(hub.waiterCount == 2)
        let removedOther = hub.unregister(other)
        let removedOtherKeyset = hub.unregister(otherKeyset)
        let removedTwice = hub.unregister(other)
        #expect(removedOther && removedOtherKeyset && !removedTwice)
    }

    @Test func wildcardDeliveryCarriesThePatternAndSkipsPresence() {
        var hub = DeliveryHub(floor: .zero, now: now)
        let start = hub.visibleThrough
        for channel in ["a.b", "a.c.d", "a.b-pnpres", "ab"] {
            let tt = hub.reserve(ChannelKey(subscribeKey: "k", channel: channel), now: now)
            _ = hub.commit(BufferedEvent(envelope: envelope(tt, channel), isStored: false), now: now)
        }
        let plan = hub.plan(SubscriptionSpec(subscribeKey: "k", names: ["a.*"]), after: start, now: now)
        #expect(plan.bufferEvents.sorted { $0.event.timetoken < $1.event.timetoken }.map(\.event.envelope.channel) == ["a.b", "a.c.d"])
        #expect(plan.bufferEvents.allSatisfy { $0.match == "a.*" })
        let (_, page) = plan.merge(storeResults: [], limit: 100)
        #expect(String(decoding: page[0], as: UTF8.self).hasPrefix(#"{"b":"a.*""#))
    }

    @Test func evictionMovesCoverageAndPlansAStoreRead() {
        var hub = DeliveryHub(floor: .zero, now: now, configuration: .init(bufferCapacity: 3))
        let start = hub.visibleThrough
        var tts: [Timetoken] = []
        for _ in 0..<5 {
            let tt = hub.reserve(ChannelKey(subscribeKey: "k", channel: "c"), now: now)
            _ = hub.commit(BufferedEvent(envelope: envelope(tt, "c"), isStored: true), now: now)
            tts.append(tt)
        }
        let plan = hub.plan(SubscriptionSpec(subscribeKey: "k", channels: ["c"]), after: start, now: now)
        #expect(plan.storeRanges == [StoreRange(subscribeKey: "k", selector: .channel("c"), after: start, through: tts[1], match: nil)])
        #expect(plan.bufferEvents.map(\.event.timetoken) == Array(tts[2...]))
        // A client already past the evicted events needs no store read.
        let current = hub.plan(SubscriptionSpec(subscribeKey: "k", channels: ["c"]), after: tts[2], now: now)
        #expect(current.storeRanges.isEmpty)
        #expect(current.bufferEvents.map(\.event.timetoken) == Array(tts[3...]))
    }

    @Test func ageEvictionDropsOldEventsFromTheWindow() {
        var hub = DeliveryHub(floor: .zero, now: now, configuration: .init(bufferCapacity: 100, bufferMaximumAgeSeconds: 60))
        let start = hub.visibleThrough
        let tt = hub.reserve(ChannelKey(subscribeKey: "k", channel: "c"), now: now)
        _ = hub.commit(BufferedEvent(envelope: envelope(tt, "c"), isStored: false), now: now)
        hub.sweep(now: Timetoken(now.rawValue + 61 * 10_000_000))
        let plan = hub.plan(SubscriptionSpec(subscribeKey: "k", channels: ["c"]), after: start, now: now)
        #expect(plan.bufferEvents.isEmpty)
    }

    @Test func oldCursorsFromBeforeStartReadTheStore() {
        let floor = Timetoken(900_000_000)
        var hub = DeliveryHub(floor: floor, now: now)
        let plan = hub.plan(SubscriptionSpec(subscribeKey: "k", names: ["c", "w.*"]), after: Timetoken(5), now: now)
        let expected = [
            StoreRange(subscribeKey: "k", selector: .channel("c"), after: Timetoken(5), through: hub.startCursor, match: nil),
            StoreRange(subscribeKey: "k", selector: .prefix("w."), after: Timetoken(5), through: hub.startCursor, match: "w.*"),
        ]
        #expect(plan.storeRanges == expected)
    }

    @Test func aSweptWindowStillSendsOldCursorsToTheStore() {
        // Regression: dropping an emptied window made the channel look covered from the start
        // cursor, skipping stored messages evicted from memory since the server started.
        var hub = DeliveryHub(floor: .zero, now: now, configuration: .init(bufferCapacity: 100, bufferMaximumAgeSeconds: 60))
        let start = hub.visibleThrough
        let tt = hub.reserve(ChannelKey(subscribeKey: "k", channel: "c"), now: now)
        _ = hub.commit(BufferedEvent(envelope: envelope(tt, "c"), isStored: true), now: now)
        hub.sweep(now: Timetoken(now.rawValue + 21 * 60 * 10_000_000))
        let plan = hub.plan(SubscriptionSpec(subscribeKey: "k", channels: ["c"]), after: start, now: now)
        #expect(plan.storeRanges == [StoreRange(subscribeKey: "k", selector: .channel("c"), after: start, through: tt, match: nil)])
    }

    @Test func anIdleCursorFollowsTheClockButNeverPassesInFlightEvents() {
        var hub = DeliveryHub(floor: .zero, now: now)
        let later = Timetoken(now.rawValue + 50_000_000)
        #expect(hub.advance(now: later) == later)
        let tt = hub.reserve(ChannelKey(subscribeKey: "k", channel: "c"), now: later)
        #expect(tt > later)
        #expect(hub.advance(now: Timetoken(later.rawValue + 99_000_000)) == Timetoken(tt.rawValue - 1))
    }

    @Test func eventsNoSubscriberCouldSeeYetAreNeverEvicted() {
        // A stored publish is still being made durable while many non-stored ones commit behind
        // it: they are invisible, and the window must keep them however many there are.
        var hub = DeliveryHub(floor: .zero, now: now, configuration: .init(bufferCapacity: 3))
        let start = hub.visibleThrough
        let key = ChannelKey(subscribeKey: "k", channel: "c")
        let slow = hub.reserve(key, now: now)
        var fast: [Timetoken] = []
        for _ in 0..<10 {
            let tt = hub.reserve(key, now: now)
            _ = hub.commit(BufferedEvent(envelope: envelope(tt, "c"), isStored: false), now: now)
            fast.append(tt)
        }
        _ = hub.commit(BufferedEvent(envelope: envelope(slow, "c"), isStored: true), now: now)
        let plan = hub.plan(SubscriptionSpec(subscribeKey: "k", channels: ["c"]), after: start, now: now)
        #expect(plan.bufferEvents.map(\.event.timetoken) == [slow] + fast)
        #expect(plan.windowGaps.isEmpty)
    }

    @Test func nonStoredEventsLeavingTheWindowAreReportedAsAGap() {
        var hub = DeliveryHub(floor: .zero, now: now, configuration: .init(bufferCapacity: 2))
        let start = hub.visibleThrough
        var tts: [Timetoken] = []
        for i in 0..<4 {
            let tt = hub.reserve(ChannelKey(subscribeKey: "k", channel: "c"), now: now)
            _ = hub.commit(BufferedEvent(envelope: envelope(tt, "c"), isStored: i != 1), now: now)
            tts.append(tt)
        }
        let plan = hub.plan(SubscriptionSpec(subscribeKey: "k", channels: ["c"]), after: start, now: now)
        #expect(plan.windowGaps.map(\.through) == [tts[1]])
        #expect(hub.plan(SubscriptionSpec(subscribeKey: "k", channels: ["c"]), after: tts[1], now: now).windowGaps.isEmpty)
    }

    // MARK: - Memory bounded by configuration

    /// Commits one event of `payload` bytes on `channel`; returns its timetoken.
    @discardableResult
    private func put(_ hub: inout DeliveryHub, _ channel: String, stored: Bool, payload: Int = 1_000) -> Timetoken {
        let tt = hub.reserve(ChannelKey(subscribeKey: "k", channel: channel), now: now)
        _ = hub.commit(BufferedEvent(envelope: envelope(tt, channel, payload: "\"" + String(repeating: "x", count: payload) + "\""),
                                     isStored: stored), now: now)
        return tt
    }

    @Test func theWindowsStayWithinTheirMemoryBudget() {
        let budget = 200_000
        var hub = DeliveryHub(floor: .zero, now: now, configuration: .init(bufferCapacity: 100, memoryBudgetBytes: budget))
        let start = hub.visibleThrough
        var lastOnC0 = Timetoken.zero
        for i in 0..<200 {
            let channel = "c\(i % 20)"
            let tt = put(&hub, channel, stored: i % 40 != 1 && i % 40 != 20)
            if channel == "c0" { lastOnC0 = tt }
            #expect(hub.bufferedBytes <= budget)
        }
        #expect(hub.bufferedBytes > budget / 2)
        // A subscriber from the start: the stored messages evicted early come from the store, the
        // non-stored ones are reported as a gap, and the newest are still served from memory.
        let plan = hub.plan(SubscriptionSpec(subscribeKey: "k", channels: ["c0"]), after: start, now: now)
        #expect(plan.storeRanges.first?.after == start)
        #expect(plan.windowGaps.count == 1)
        #expect(plan.bufferEvents.last?.event.timetoken == lastOnC0)
    }

    @Test func channelsWithAWindowAreCappedAndCatchUpStaysExact() {
        var hub = DeliveryHub(floor: .zero, now: now, configuration: .init(bufferCapacity: 100, maxChannels: 10))
        let start = hub.visibleThrough
        let firstStored = put(&hub, "early-stored", stored: true)
        let firstUnstored = put(&hub, "early-unstored", stored: false)
        for i in 0..<50 {
            put(&hub, "fresh-\(i)", stored: i % 2 == 0)
            #expect(hub.bufferedChannelCount <= 10)
        }
        // The early windows were dropped; a subscriber behind them still finds everything.
        let stored = hub.plan(SubscriptionSpec(subscribeKey: "k", channels: ["early-stored"]), after: start, now: now)
        #expect(stored.bufferEvents.isEmpty)
        #expect(stored.storeRanges.count == 1)
        #expect(stored.storeRanges.first.map { $0.after == start && $0.through >= firstStored } == true)
        let unstored = hub.plan(SubscriptionSpec(subscribeKey: "k", channels: ["early-unstored"]), after: start, now: now)
        #expect(unstored.windowGaps.map(\.through) == [firstUnstored])
        // Past the loss, nothing is reported.
        #expect(hub.plan(SubscriptionSpec(subscribeKey: "k", channels: ["early-unstored"]), after: firstUnstored, now: now)
            .windowGaps.isEmpty)
    }

    @Test func emptyWindowsAreDroppedAndTheWildcardIndexFollows() {
        var hub = DeliveryHub(floor: .zero, now: now, configuration: .init(bufferCapacity: 100, bufferMaximumAgeSeconds: 60))
        for i in 0..<5 { put(&hub, "a.old\(i)", stored: true) }
        put(&hub, "b.other", stored: true)
        #expect(hub.bufferedChannelCount == 6)
        let later = Timetoken(now.rawValue + 61 * 10_000_000)
        hub.sweep(now: later)
        #expect(hub.bufferedChannelCount == 0)
        let before = hub.visibleThrough
        let tt = hub.reserve(ChannelKey(subscribeKey: "k", channel: "a.new"), now: later)
        _ = hub.commit(BufferedEvent(envelope: envelope(tt, "a.new"), isStored: false), now: later)
        let plan = hub.plan(SubscriptionSpec(subscribeKey: "k", names: ["a.*"]), after: before, now: later)
        #expect(plan.bufferEvents.map(\.event.envelope.channel) == ["a.new"])
        #expect(plan.bufferEvents.allSatisfy { $0.match == "a.*" })
    }

    /// A wildcard subscriber behind windows that were dropped (emptied by age) still gets their
    /// stored messages, read by prefix from the store, and is told of their non-stored events
    /// that left memory, as a subscriber naming the channel is.
    @Test func aWildcardSubscriberBehindDroppedWindowsReadsTheStoreAndIsToldOfTheRest() {
        var hub = DeliveryHub(floor: .zero, now: now, configuration: .init(bufferCapacity: 100, bufferMaximumAgeSeconds: 60))
        let start = hub.visibleThrough
        let stored = put(&hub, "a.stored", stored: true)
        let signal = put(&hub, "a.signal", stored: false)
        put(&hub, "b.other", stored: false)
        let later = Timetoken(now.rawValue + 61 * 10_000_000)
        hub.sweep(now: later)
        #expect(hub.bufferedChannelCount == 0)
        let spec = SubscriptionSpec(subscribeKey: "k", names: ["a.*"])
        let plan = hub.plan(spec, after: start, now: later)
        let range = plan.storeRanges.first { $0.selector == .prefix("a.") }
        #expect(range.map { $0.after == start && $0.through >= stored && $0.match == "a.*" } == true, "\(plan.storeRanges)")
        #expect(plan.windowGaps.map(\.channel) == ["a.signal"])
        #expect(plan.windowGaps.map(\.through) == [signal])
        // A window opened again on a matching channel: its new event comes from memory, the old
        // stored one still from the store.
        let fresh = put(&hub, "a.stored", stored: true)
        let again = hub.plan(spec, after: start, now: later)
        #expect(again.bufferEvents.map(\.event.timetoken) == [fresh])
        #expect(again.storeRanges.contains { $0.selector == .prefix("a.") && $0.through >= stored })
        // Past all of it: nothing to read and nothing to report.
        let past = hub.plan(spec, after: fresh, now: later)
        #expect(past.storeRanges.isEmpty && past.windowGaps.isEmpty && past.bufferEvents.isEmpty)
    }

    /// Loss records folded at their cap are reported to a wildcard subscriber behind them, as the
    /// keyset's conservative floor, under the pattern's name.
    @Test func foldedLossRecordsAreAGapForAWildcardSubscriber() {
        var hub = DeliveryHub(floor: .zero, now: now,
                              configuration: .init(bufferCapacity: 100, bufferMaximumAgeSeconds: 60, maxLossRecords: 1))
        let start = hub.visibleThrough
        put(&hub, "a.one", stored: false)
        let later = Timetoken(now.rawValue + 61 * 10_000_000)
        hub.sweep(now: later)
        let second = put(&hub, "z.two", stored: false)
        hub.sweep(now: Timetoken(later.rawValue + 61 * 10_000_000))
        let plan = hub.plan(SubscriptionSpec(subscribeKey: "k", names: ["a.*"]), after: start, now: later)
        #expect(plan.windowGaps.contains { $0.channel == "a.*" })
        #expect(plan.windowGaps.allSatisfy { $0.through <= second })
    }

    /// A loss record folded into the keyset's floor still reaches a subscriber of that channel
    /// after the channel gets a window again.
    @Test func aFoldedLossRecordOutlivesTheChannelsNextWindow() {
        var hub = DeliveryHub(floor: .zero, now: now,
                              configuration: .init(bufferCapacity: 100, bufferMaximumAgeSeconds: 60, maxLossRecords: 1))
        let start = hub.visibleThrough
        let lost = put(&hub, "a", stored: false)
        let later = Timetoken(now.rawValue + 61 * 10_000_000)
        hub.sweep(now: later)
        put(&hub, "b", stored: false)
        hub.sweep(now: Timetoken(later.rawValue + 61 * 10_000_000))   // a's record is folded here
        put(&hub, "a", stored: true)
        let plan = hub.plan(SubscriptionSpec(subscribeKey: "k", channels: ["a"]), after: start, now: later)
        #expect(plan.windowGaps.map(\.channel) == ["a"])
        #expect(plan.windowGaps.allSatisfy { $0.through >= lost })
    }

    @Test func presenceChannelsAreNeverReadFromTheStore() {
        var hub = DeliveryHub(floor: .zero, now: now)
        let plan = hub.plan(SubscriptionSpec(subscribeKey: "k", channels: ["c-pnpres"]), after: Timetoken(5), now: now)
        #expect(plan.storeRanges.isEmpty)
    }
}

@Suite struct MergeTests {
    private func stored(_ values: [UInt64], channel: String = "c") -> [SubscribeEnvelope] {
        values.map { envelope(Timetoken($0), channel) }
    }

    @Test func truncatesAtTheLimitAndPointsTheCursorAtTheLastIncluded() {
        let plan = ReadPlan(visibleThrough: Timetoken(1000), bufferEvents: [], storeRanges: [])
        let range = StoreRange(subscribeKey: "k", selector: .channel("c"), after: .zero, through: Timetoken(1000), match: nil)
        let result = StoreRangeResult(range: range, envelopes: stored(Array(1...5)), reachedLimit: false)
        let (cursor, page) = plan.merge(storeResults: [result], limit: 3)
        #expect(decodedTimetokens(page) == ["1", "2", "3"])
        #expect(cursor == Timetoken(3))
    }

    @Test func aLimitedStoreReadCapsEveryOtherSource() {
        // Channel c's store read stopped at 3 (more may exist); d has 2 and 4. Delivering 4 now
        // would let the cursor pass c's unread events, so the page stops at 3.
        let plan = ReadPlan(visibleThrough: Timetoken(1000), bufferEvents: [], storeRanges: [])
        let rc = StoreRange(subscribeKey: "k", selector: .channel("c"), after: .zero, through: Timetoken(900), match: nil)
        let rd = StoreRange(subscribeKey: "k", selector: .channel("d"), after: .zero, through: Timetoken(900), match: nil)
        let (cursor, page) = plan.merge(storeResults: [
            StoreRangeResult(range: rc, envelopes: stored([1, 3]), reachedLimit: true),
            StoreRangeResult(range: rd, envelopes: stored([2, 4], channel: "d"), reachedLimit: false),
        ], limit: 100)
        #expect(decodedTimetokens(page) == ["1", "2", "3"])
        #expect(cursor == Timetoken(3))
    }

    @Test func duplicatesReachedTwiceAreDeliveredOnce() {
        let plan = ReadPlan(visibleThrough: Timetoken(10), bufferEvents: [], storeRanges: [])
        let r1 = StoreRange(subscribeKey: "k", selector: .channel("a.b"), after: .zero, through: Timetoken(10), match: nil)
        let r2 = StoreRange(subscribeKey: "k", selector: .prefix("a."), after: .zero, through: Timetoken(10), match: "a.*")
        let (cursor, page) = plan.merge(storeResults: [
            StoreRangeResult(range: r1, envelopes: stored([7], channel: "a.b"), reachedLimit: false),
            StoreRangeResult(range: r2, envelopes: stored([7], channel: "a.b"), reachedLimit: false),
        ], limit: 100)
        #expect(page.count == 1)
        #expect(cursor == Timetoken(10))
    }
}
