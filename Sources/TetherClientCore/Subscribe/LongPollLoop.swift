@_spi(Benchmarks) package import TetherProtocol

/// The long-poll receive loop: one subscribe request at a time, each continuing from the cursor
/// the last one returned; delivery de-duplicated, catch-up tracked until complete, a gap the server
/// reports backfilled from history before live delivery goes on.
package struct LongPollLoop: Sendable {
    /// A subscribe position.
    package typealias Cursor = SubscribeMachine.Cursor
    /// A request identity.
    package typealias RequestID = SubscribeMachine.RequestID

    /// Can transition to: polling → polling (the next poll, a restart), backfilling (a reported
    /// gap). backfilling → polling (history arrived or failed; a restart abandons it).
    private enum State: Sendable {
        /// A subscribe request is out.
        case polling(RequestID)
        /// History is being fetched; `held` is the response that reported the gap, delivered after it.
        case backfilling(RequestID, held: SubscribeResponse?)
    }

    /// Whether the current burst of full responses was reported. Can transition to:
    /// quiet → reported (a response at the threshold) → quiet (one below it).
    private enum Burst: Sendable, Hashable {
        case quiet
        case reported
    }

    private var state: State
    /// The cursor the next poll sends.
    package private(set) var cursor: Cursor
    /// Catch-up after a reconnect, until the loop is current (nil: nothing to catch up).
    private var catchUp: CatchUpPlanner?
    private var burst = Burst.quiet
    /// History a backfill on every reconnect fetched before the first poll, not delivered yet:
    /// merged into the catch-up polls' answers as they reach each event, in timetoken order.
    /// Delivered at once, its stored messages would raise each channel's watermark above the
    /// signals, `store=0` messages and actions the polls then bring (history holds none of them),
    /// and those would be dropped as already delivered.
    private var pendingHistory: [ReceivedEvent] = []

    private init(state: State, cursor: Cursor, catchUp: CatchUpPlanner?) {
        self.state = state
        self.cursor = cursor
        self.catchUp = catchUp
    }

    /// A loop that starts by polling from `cursor`.
    package static func polling(from cursor: Cursor, catchUp: CatchUpPlanner?,
                                ids: inout SubscribeMachine.RequestIDs) -> (LongPollLoop, [ReceiveAction]) {
        let id = ids.next()
        return (LongPollLoop(state: .polling(id), cursor: cursor, catchUp: catchUp), [.poll(id, cursor: cursor)])
    }

    /// A loop that first fetches `ranges` from history (backfill on every reconnect).
    package static func backfilling(from cursor: Cursor, catchUp: CatchUpPlanner, ranges: [BackfillRange],
                                    ids: inout SubscribeMachine.RequestIDs) -> (LongPollLoop, [ReceiveAction]) {
        let id = ids.next()
        return (LongPollLoop(state: .backfilling(id, held: nil), cursor: cursor, catchUp: catchUp), [.backfill(id, ranges)])
    }

    /// The catch-up in progress (until its continuity outcomes are reported).
    package var catchUpInProgress: CatchUpPlanner? { catchUp }

    /// The running poll, if the loop is polling.
    package var pollRequest: RequestID? {
        switch state {
        case .polling(let id): return id
        case .backfilling: return nil
        }
    }

    /// `receiving` or `backfilling`.
    package var stateName: String {
        switch state {
        case .polling: return "receiving"
        case .backfilling: return "backfilling"
        }
    }

    /// Polls again from `timetoken` (nil: from the cursor), abandoning a running poll or backfill.
    package mutating func restart(from timetoken: Timetoken?, ids: inout SubscribeMachine.RequestIDs) -> [ReceiveAction] {
        if let timetoken { cursor = Cursor(timetoken: timetoken, region: cursor.region) }
        return poll(ids: &ids)
    }

    /// The running poll answered 200 (`gaps`: retention gaps the server reported with it).
    package mutating func pollSucceeded(_ id: RequestID, response: SubscribeResponse, gaps: [RetentionGap],
                                        watermarks: inout DeliveryWatermarks, settings: ReceiveSettings,
                                        ids: inout SubscribeMachine.RequestIDs) -> [ReceiveAction] {
        switch state {
        case .polling(let current) where current == id:
            if !gaps.isEmpty {
                var planner = catchUp ?? CatchUpPlanner(channels: [], resumedFrom: cursor.timetoken, upTo: response.timetoken,
                                                        pageSize: settings.catchUpPageSize, filtered: settings.filtered)
                planner.recordGaps(gaps)
                catchUp = planner
                switch settings.backfill {
                case .onGap, .onEveryReconnect:
                    let backfillID = ids.next()
                    state = .backfilling(backfillID, held: response)
                    return [.cancelWatchdog, .backfill(backfillID, planner.backfillRanges(for: gaps))]
                case .never:
                    break
                }
            }
            return accept(response, watermarks: &watermarks, settings: settings) + poll(ids: &ids)
        case .polling, .backfilling:
            return []
        }
    }

    /// History for the running backfill arrived (events oldest first, any channels): delivered,
    /// then the held response, then the loop polls on.
    package mutating func backfillCompleted(_ id: RequestID, events: [ReceivedEvent], watermarks: inout DeliveryWatermarks,
                                            settings: ReceiveSettings, ids: inout SubscribeMachine.RequestIDs) -> [ReceiveAction] {
        switch state {
        case .backfilling(let current, let held) where current == id:
            let sorted = events.sorted { ($0.timetoken, $0.channel) < ($1.timetoken, $1.channel) }
            guard let held else {
                // A backfill on every reconnect, before the first poll: held back, and delivered
                // with the polls that reach each event (``accept(_:watermarks:settings:)``).
                pendingHistory = Self.mergedHistory(pendingHistory, sorted)
                catchUp?.recordBackfilled(sorted)
                return poll(ids: &ids)
            }
            // Merged with the held response in timetoken order: history holds stored messages
            // only, and delivering it first would raise each channel's watermark above the
            // held response's signals, `store=0` messages and actions, which would then be
            // dropped as already delivered. An event in both is delivered once, as the
            // response has it (naming the group or wildcard that matched it).
            let merged = Self.mergedOnce(history: sorted, held.events)
            var actions: [ReceiveAction] = []
            let fresh = watermarks.fresh(merged)
            if !fresh.isEmpty {
                actions.append(.deliver(fresh))
                actions += Self.decryptionFailures(fresh)
            }
            catchUp?.recordDelivered(fresh)
            catchUp?.recordBackfilled(sorted)
            actions += accept(held, watermarks: &watermarks, settings: settings)
            return actions + poll(ids: &ids)
        case .polling, .backfilling:
            return []
        }
    }

    /// One event's identity across history and a subscribe response.
    private struct EventKey: Hashable {
        var channel: String
        var timetoken: Timetoken
    }

    /// `history` and `answered` (a subscribe answer's events) in timetoken order, an event in
    /// both once (history holds stored messages, a subscribe answer every kind of event; both
    /// may carry the same message). An event in both is taken from the answer: only it names
    /// the subscription that matched it (`b`: a channel group or a wildcard), without which a
    /// group's or a wildcard's listeners would never see it.
    private static func mergedOnce(history: [ReceivedEvent], _ answered: [ReceivedEvent]) -> [ReceivedEvent] {
        guard !history.isEmpty else { return answered }
        guard !answered.isEmpty else { return history }
        let known = Set(answered.map { EventKey(channel: $0.channel, timetoken: $0.timetoken) })
        let others = history.filter { !known.contains(EventKey(channel: $0.channel, timetoken: $0.timetoken)) }
        return (others + answered).sorted { ($0.timetoken, $0.channel) < ($1.timetoken, $1.channel) }
    }

    /// Two backfills' history, in timetoken order, an event in both once.
    private static func mergedHistory(_ first: [ReceivedEvent], _ second: [ReceivedEvent]) -> [ReceivedEvent] {
        mergedOnce(history: second, first)
    }

    private mutating func poll(ids: inout SubscribeMachine.RequestIDs) -> [ReceiveAction] {
        let id = ids.next()
        state = .polling(id)
        return [.poll(id, cursor: cursor)]
    }

    /// Delivers a response (de-duplicated), advances the cursor, reports overflow and continuity.
    private mutating func accept(_ response: SubscribeResponse, watermarks: inout DeliveryWatermarks,
                                 settings: ReceiveSettings) -> [ReceiveAction] {
        var actions: [ReceiveAction] = []
        var events = response.events
        if !pendingHistory.isEmpty {
            // The backfilled history this answer has reached (every event at or below its cursor
            // is in it), merged in order; later answers take the rest as they reach it.
            let due = pendingHistory.prefix { $0.timetoken <= response.timetoken }
            pendingHistory.removeFirst(due.count)
            events = Self.mergedOnce(history: Array(due), events)
        }
        let fresh = watermarks.fresh(events)
        if !fresh.isEmpty {
            actions.append(.deliver(fresh))
            actions += Self.decryptionFailures(fresh)
        }
        let threshold = settings.messageCountThreshold
        if threshold > 0, response.events.count >= threshold {
            switch burst {
            case .quiet:
                burst = .reported
                actions.append(.messageCountExceeded(count: response.events.count, threshold: threshold, last: cursor.timetoken,
                                                     current: response.timetoken))
            case .reported:
                break
            }
        } else {
            burst = .quiet
        }
        if var planner = catchUp {
            planner.recordDelivered(fresh)
            if planner.isComplete(afterResponseWith: response.events.count, cursor: response.timetoken) {
                actions.append(.continuity(planner.outcomes()))
                catchUp = nil
            } else {
                catchUp = planner
            }
        }
        cursor = Cursor(timetoken: max(response.timetoken, cursor.timetoken), region: response.region)
        return actions
    }

    private static func decryptionFailures(_ events: [ReceivedEvent]) -> [ReceiveAction] {
        events.compactMap { event in event.decryptionError.map { .decryptionFailed($0) } }
    }
}
