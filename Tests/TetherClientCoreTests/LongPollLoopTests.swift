import Testing
import TetherClientCore
@_spi(Benchmarks) import TetherProtocol

/// Drives one ``LongPollLoop`` and collects what it asks for.
struct LoopHarness {
    var loop: LongPollLoop
    var ids = SubscribeMachine.RequestIDs()
    var watermarks = DeliveryWatermarks()
    var settings: ReceiveSettings
    var lastPoll: SubscribeMachine.RequestID?
    var lastBackfill: SubscribeMachine.RequestID?
    var delivered: [UInt64] = []
    var deliveredEvents: [ReceivedEvent] = []
    var exceeded = 0
    var continuity: [ChannelContinuity] = []
    var undecryptable = 0
    var watchdogCancelled = 0

    init(from cursor: UInt64 = 100, catchUp: CatchUpPlanner? = nil, _ configuration: SubscribeMachine.Configuration = .init()) {
        settings = ReceiveSettings(configuration)
        let (loop, actions) = LongPollLoop.polling(from: SubscribeMachine.Cursor(timetoken: Timetoken(cursor), region: 1), catchUp: catchUp,
                                                   ids: &ids)
        self.loop = loop
        record(actions)
    }

    mutating func record(_ actions: [ReceiveAction]) {
        for action in actions {
            switch action {
            case .poll(let id, _): lastPoll = id
            case .cancelWatchdog: watchdogCancelled += 1
            case .deliver(let events):
                delivered += events.map(\.timetoken.rawValue)
                deliveredEvents += events
            case .decryptionFailed: undecryptable += 1
            case .messageCountExceeded: exceeded += 1
            case .continuity(let outcomes): continuity += outcomes
            case .backfill(let id, _): lastBackfill = id
            }
        }
    }

    @discardableResult
    mutating func answer(_ tt: UInt64, _ events: [ReceivedEvent] = [], gaps: [RetentionGap] = [],
                         id: SubscribeMachine.RequestID? = nil) -> [ReceiveAction] {
        guard let id = id ?? lastPoll else { return [] }
        let actions = loop.pollSucceeded(id, response: SubscribeResponse(timetoken: Timetoken(tt), region: 1, events: events), gaps: gaps,
                                         watermarks: &watermarks, settings: settings, ids: &ids)
        record(actions)
        return actions
    }

    mutating func backfilled(_ events: [ReceivedEvent]) {
        guard let id = lastBackfill else { return }
        record(loop.backfillCompleted(id, events: events, watermarks: &watermarks, settings: settings, ids: &ids))
    }
}

@Suite("LongPollLoop: polls, delivery, catch-up and backfill")
struct LongPollLoopTests {
    enum Input: String, CaseIterable, Sendable {
        case answer, staleAnswer, answerWithGap, backfillArrives, staleBackfill, restart
    }

    enum Start: String, CaseIterable, Sendable { case receiving, backfilling }

    static func harness(in start: Start) -> LoopHarness {
        var h = LoopHarness()
        if start == .backfilling {
            h.answer(300, [event("a", 300)], gaps: [RetentionGap(channel: "a", from: Timetoken(100), through: Timetoken(200))])
        }
        #expect(h.loop.stateName == start.rawValue)
        return h
    }

    /// Expected state after each input, in `Input.allCases` order.
    static let table: [Start: [String]] = [
        .receiving: ["receiving", "receiving", "backfilling", "receiving", "receiving", "receiving"],
        .backfilling: ["backfilling", "backfilling", "backfilling", "receiving", "backfilling", "receiving"],
    ]

    @Test(arguments: Start.allCases)
    func everyInputFrom(_ start: Start) {
        for (index, input) in Input.allCases.enumerated() {
            var h = Self.harness(in: start)
            switch input {
            case .answer: h.answer(400)
            case .staleAnswer: h.answer(400, id: SubscribeMachine.RequestIDs().nextID())
            case .answerWithGap: h.answer(400, gaps: [RetentionGap(channel: "a", from: Timetoken(100), through: Timetoken(150))])
            case .backfillArrives: h.backfilled([])
            case .staleBackfill:
                h.lastBackfill = SubscribeMachine.RequestIDs().nextID()
                h.backfilled([])
            case .restart: h.record(h.loop.restart(from: nil, ids: &h.ids))
            }
            #expect(h.loop.stateName == Self.table[start]?[index], "\(start) + \(input)")
        }
    }

    @Test func answersAdvanceTheCursorAndNothingIsDeliveredTwice() {
        var h = LoopHarness()
        let first = h.lastPoll
        h.answer(150, [event("a", 120), event("a", 150)])
        #expect(h.lastPoll != first)
        #expect(h.loop.cursor.timetoken == Timetoken(150))
        h.answer(160, [event("a", 150), event("a", 160), event("b", 150)])
        #expect(h.delivered == [120, 150, 160, 150])
        h.answer(140)                                    // a cursor never goes back
        #expect(h.loop.cursor.timetoken == Timetoken(160))
        let stale = h.answer(170, id: first)
        #expect(stale.isEmpty)
        h.record(h.loop.restart(from: Timetoken(90), ids: &h.ids))
        #expect(h.loop.cursor == SubscribeMachine.Cursor(timetoken: Timetoken(90), region: 1))
    }

    /// A message both in the backfilled history and in the answer is delivered as the answer has
    /// it: history does not say which group or wildcard matched it, and without that a group's
    /// listeners never see it (a window gap on a group member: every stored message of the gap
    /// is in both). With a gap reported, the history is merged with the answer it held back.
    @Test func aMessageInHistoryAndInTheHeldAnswerKeepsTheSubscriptionThatMatchedIt() {
        var h = LoopHarness(from: 100, catchUp: CatchUpPlanner(channels: ["c"], resumedFrom: Timetoken(100), upTo: Timetoken(1000)))
        h.answer(400, Self.answeredOnGroup, gaps: [RetentionGap(channel: "c", from: Timetoken(100), through: Timetoken(300))])
        #expect(h.loop.stateName == "backfilling")
        h.backfilled([event("c", 150), event("c", 200)])
        #expect(h.delivered == [150, 200, 250, 400])
        #expect(h.deliveredEvents.map(\.subscription) == [nil, "G", "G", "G"],
                "history's own message has no `b`; the one the answer also carried keeps the answer's")
    }

    /// The same when history is fetched on every reconnect, before the first poll, and held
    /// until a poll reaches it.
    @Test func aMessageInHistoryAndInALaterAnswerKeepsTheSubscriptionThatMatchedIt() {
        var h = LoopHarness()
        let planner = CatchUpPlanner(channels: ["c"], resumedFrom: Timetoken(100), upTo: Timetoken(1000))
        let (loop, actions) = LongPollLoop.backfilling(from: SubscribeMachine.Cursor(timetoken: Timetoken(100), region: 1), catchUp: planner,
                                                      ranges: [BackfillRange(channel: "c", after: Timetoken(100), through: Timetoken(1000))],
                                                      ids: &h.ids)
        h.loop = loop
        h.record(actions)
        h.backfilled([event("c", 150), event("c", 200)])
        #expect(h.delivered.isEmpty)
        h.answer(400, Self.answeredOnGroup)
        #expect(h.delivered == [150, 200, 250, 400])
        #expect(h.deliveredEvents.map(\.subscription) == [nil, "G", "G", "G"])
    }

    /// A poll's answer on group `G`: a message history also holds, a signal, a newer message.
    static let answeredOnGroup = [event("c", 200, subscription: "G"), event("c", 250, kind: .signal, subscription: "G"),
                                  event("c", 400, subscription: "G")]

    @Test func aGapIsBackfilledBeforeTheResponseThatReportedIt() {
        var h = LoopHarness(from: 110, catchUp: CatchUpPlanner(channels: ["a"], resumedFrom: Timetoken(110), upTo: Timetoken(1000)))
        let actions = h.answer(600, [event("a", 500), event("a", 600)],
                               gaps: [RetentionGap(channel: "a", from: Timetoken(110), through: Timetoken(400))])
        #expect(h.watchdogCancelled == 1)
        #expect(actions.count == 2)
        #expect(h.delivered.isEmpty)
        h.backfilled([event("a", 500), event("a", 300)])
        #expect(h.delivered == [300, 500, 600])
        #expect(h.loop.stateName == "receiving")
        #expect(h.loop.cursor.timetoken == Timetoken(600))
    }

    /// History holds stored messages only: the held response's signals and `store=0` messages
    /// older than the newest backfilled message are delivered too, in timetoken order, not
    /// dropped behind the watermark the backfill raised.
    @Test func aBackfillNeverHidesTheHeldResponsesUnstoredEvents() {
        var h = LoopHarness(from: 110, catchUp: CatchUpPlanner(channels: ["a"], resumedFrom: Timetoken(110), upTo: Timetoken(1000)))
        h.answer(500, [event("a", 450), event("a", 500)], gaps: [RetentionGap(channel: "a", from: Timetoken(110), through: Timetoken(400))])
        h.backfilled([event("a", 300), event("a", 500)])
        #expect(h.delivered == [300, 450, 500])
        #expect(h.loop.cursor.timetoken == Timetoken(500))
    }

    /// A backfill on every reconnect runs before the first poll. Its history (stored messages
    /// only) is delivered as the catch-up polls reach each message, merged with what they bring,
    /// so their signals, `store=0` messages and actions older than the newest backfilled message
    /// are not dropped behind the watermark the history would have raised.
    @Test func aBackfillOnEveryReconnectNeverHidesTheCatchUpsUnstoredEvents() {
        var h = LoopHarness(from: 110)
        let planner = CatchUpPlanner(channels: ["a"], resumedFrom: Timetoken(110), upTo: Timetoken(1000))
        let (loop, actions) = LongPollLoop.backfilling(from: SubscribeMachine.Cursor(timetoken: Timetoken(110), region: 1), catchUp: planner,
                                                       ranges: [BackfillRange(channel: "a", after: Timetoken(110), through: Timetoken(1000))],
                                                       ids: &h.ids)
        h.loop = loop
        h.record(actions)
        h.backfilled([event("a", 500), event("a", 300)])
        #expect(h.delivered.isEmpty, "held until the polls reach it")
        #expect(h.loop.stateName == "receiving")
        // The first catch-up page: a signal at 200, the stored 300, a store=0 message at 350.
        h.answer(400, [event("a", 200), event("a", 300), event("a", 350)])
        #expect(h.delivered == [200, 300, 350])
        // The next: a signal at 450 below the backfilled 500, then live messages.
        h.answer(1000, [event("a", 450), event("a", 500), event("a", 600)])
        #expect(h.delivered == [200, 300, 350, 450, 500, 600])
        #expect(h.continuity.map(\.outcome) == [.recovered(count: 3)])
    }

    @Test func noBackfillWhenThePolicySaysNever() {
        var h = LoopHarness(from: 110, .init(backfill: .never))
        h.answer(600, [event("a", 600)], gaps: [RetentionGap(channel: "a", from: Timetoken(110), through: Timetoken(400))])
        #expect(h.loop.stateName == "receiving")
        #expect(h.delivered == [600])
        #expect(h.lastBackfill == nil)
    }

    @Test func theMessageCountIsReportedOncePerBurst() {
        var h = LoopHarness(.init(requestMessageCountThreshold: 2))
        h.answer(102, [event("a", 101), event("a", 102)])
        h.answer(104, [event("a", 103), event("a", 104)])
        h.answer(105, [event("a", 105)])
        h.answer(107, [event("a", 106), event("a", 107)])
        #expect(h.exceeded == 2)
    }

    @Test func catchUpEndsWithContinuity() {
        var h = LoopHarness(from: 100, catchUp: CatchUpPlanner(channels: ["a"], resumedFrom: Timetoken(100), upTo: Timetoken(300)))
        h.answer(300, [event("a", 200)])
        #expect(h.continuity == [ChannelContinuity(channel: "a", outcome: .recovered(count: 1), resumedFrom: Timetoken(100))])
    }

    /// With a filter expression the server leaves out what the filter excludes, so a catch-up
    /// page is short while more remains: the catch-up ends at the server's cursor of the
    /// reconnect (or an answer with nothing), counting every page. Before, the first short page
    /// ended it, with `recovered(count: 2)` of 5.
    @Test(arguments: [true, false])
    func aFilteredCatchUpIsNotEndedByAShortPage(filtered: Bool) {
        let planner = CatchUpPlanner(channels: ["a"], resumedFrom: Timetoken(100), upTo: Timetoken(1000), pageSize: 100, filtered: filtered)
        var h = LoopHarness(from: 100, catchUp: planner)
        h.answer(400, [event("a", 150), event("a", 400)])
        if !filtered {
            #expect(h.continuity.map(\.outcome) == [.recovered(count: 2)], "a short page ends an unfiltered catch-up")
            return
        }
        #expect(h.continuity.isEmpty)
        h.answer(700, [event("a", 500), event("a", 700)])
        #expect(h.continuity.isEmpty)
        h.answer(1000, [event("a", 900)])
        #expect(h.continuity.map(\.outcome) == [.recovered(count: 5)])
        // An answer with no events ends it too (the server had nothing more).
        var empty = LoopHarness(from: 100, catchUp: planner)
        empty.answer(400, [event("a", 400)])
        empty.answer(600)
        #expect(empty.continuity.map(\.outcome) == [.recovered(count: 1)])
    }

    @Test func undecryptableEventsAreDeliveredAndReported() {
        var h = LoopHarness()
        var broken = event("a", 101)
        broken.decryptionError = Status(category: .decryptionError, operation: .subscribe)
        h.answer(101, [broken, event("a", 102)])
        #expect(h.delivered == [101, 102])
        #expect(h.undecryptable == 1)
    }
}
