@_spi(Benchmarks) package import TetherProtocol

/// The receive child of ``SubscribeMachine``: what brings events in while the subscription is
/// connected.
///
/// The parent talks to it only through this enum and ``ReceiveAction``, so a second wire is one
/// more case here, not another branch through the parent: a WebSocket session (the next step)
/// becomes `case webSocket(WebSocketSession)`, answers ``restart(from:settings:ids:)`` and
/// ``backfillCompleted(_:events:watermarks:ids:)`` plus its own frame inputs with the same
/// actions, and the handshake, retry, heartbeat and network children stay as they are.
package enum ReceiveLoop: Sendable {
    /// HTTP long-poll: one subscribe request at a time, each continuing from the last cursor.
    case longPoll(LongPollLoop)

    /// The cursor the loop continues from.
    package var cursor: SubscribeMachine.Cursor {
        switch self {
        case .longPoll(let loop): return loop.cursor
        }
    }

    /// The request whose answer the loop waits for, if it waits for a subscribe response.
    package var pollRequest: SubscribeMachine.RequestID? {
        switch self {
        case .longPoll(let loop): return loop.pollRequest
        }
    }

    /// The catch-up in progress, if the loop is still catching up after a reconnect.
    package var catchUp: CatchUpPlanner? {
        switch self {
        case .longPoll(let loop): return loop.catchUpInProgress
        }
    }

    /// The state's name, for tests and logs.
    package var stateName: String {
        switch self {
        case .longPoll(let loop): return loop.stateName
        }
    }

    /// Starts receiving again from `timetoken` (nil: from the cursor), abandoning what runs.
    package mutating func restart(from timetoken: Timetoken?, settings: ReceiveSettings,
                                  ids: inout SubscribeMachine.RequestIDs) -> [ReceiveAction] {
        switch self {
        case .longPoll(var loop):
            let actions = loop.restart(from: timetoken, ids: &ids)
            self = .longPoll(loop)
            return actions
        }
    }

    /// History for a backfill arrived (events oldest first, any channels).
    package mutating func backfillCompleted(_ id: SubscribeMachine.RequestID, events: [ReceivedEvent], watermarks: inout DeliveryWatermarks,
                                            settings: ReceiveSettings, ids: inout SubscribeMachine.RequestIDs) -> [ReceiveAction] {
        switch self {
        case .longPoll(var loop):
            let actions = loop.backfillCompleted(id, events: events, watermarks: &watermarks, settings: settings, ids: &ids)
            self = .longPoll(loop)
            return actions
        }
    }
}

/// What a receive child asks of its parent; the same for every wire.
package enum ReceiveAction: Sendable {
    /// Send the next subscribe request from `cursor` (the parent adds the subscription and the
    /// watchdog).
    case poll(SubscribeMachine.RequestID, cursor: SubscribeMachine.Cursor)
    /// The running request's watchdog is no longer needed (a backfill runs instead).
    case cancelWatchdog
    /// Deliver events to listeners, in order (already de-duplicated).
    case deliver([ReceivedEvent])
    /// A delivered event could not be decrypted (its status).
    case decryptionFailed(Status)
    /// One response carried at least `threshold` events (once per burst).
    case messageCountExceeded(count: Int, threshold: Int, last: Timetoken, current: Timetoken)
    /// Catch-up is complete: these are its outcomes.
    case continuity([ChannelContinuity])
    /// Fetch history for these ranges and report it.
    case backfill(SubscribeMachine.RequestID, [BackfillRange])
}

/// The settings a receive child reads.
package struct ReceiveSettings: Sendable, Hashable {
    /// A response with at least this many events is reported once per burst; 0 disables it.
    package var messageCountThreshold: Int
    /// When to backfill from history.
    package var backfill: BackfillPolicy
    /// Events per catch-up page.
    package var catchUpPageSize: Int
    /// Whether the subscription has a filter expression (``SubscribeMachine/Configuration/filtered``).
    package var filtered: Bool

    /// The settings in a machine configuration.
    package init(_ configuration: SubscribeMachine.Configuration) {
        messageCountThreshold = configuration.requestMessageCountThreshold
        backfill = configuration.backfill
        catchUpPageSize = configuration.catchUpPageSize
        filtered = configuration.filtered
    }
}

/// Newest delivered timetoken per event channel: nothing at or below it is delivered again,
/// whichever wire or backfill brings it, across reconnections.
package struct DeliveryWatermarks: Sendable, Hashable {
    private var newest: [String: Timetoken] = [:]

    /// No event delivered yet.
    package init() {}

    /// The events not delivered before, in order; they count as delivered from now on.
    package mutating func fresh(_ events: [ReceivedEvent]) -> [ReceivedEvent] {
        var fresh: [ReceivedEvent] = []
        for event in events {
            if let mark = newest[event.channel], event.timetoken <= mark { continue }
            newest[event.channel] = event.timetoken
            fresh.append(event)
        }
        return fresh
    }

    /// Forgets channels the app left (subscribing again delivers from the cursor).
    package mutating func forget(_ channels: [String]) {
        for channel in channels { newest[channel] = nil }
    }
}
