@_spi(Benchmarks) package import TetherProtocol

/// The subscribe loop as a pure state machine (ARCHITECTURE.md, STYLE.md §1–3).
///
/// Every input is a `mutating func` returning the ``Action``s the shell must perform: start or
/// cancel the long-poll, schedule or cancel timers by ``TimerID``, emit statuses, deliver events,
/// probe, backfill. Time (`now`, a duration since the shell's origin) and randomness come in as
/// arguments; statuses are emitted only here, from transitions.
///
/// Every (re)connection starts with a handshake (`tt=0`, answered at once), so `connected` and
/// `reconnected` are announced as soon as the server answers; the loop then continues from the
/// saved cursor, so the server pages everything missed (docs/protocol.md, catch-up).
package struct SubscribeMachine: Sendable {
    // MARK: Vocabulary

    /// Settings the machine reads (the shell builds them from `TetherConfiguration`).
    package struct Configuration: Sendable, Hashable {
        /// The retry policy.
        package var retry: RetryConfiguration
        /// Continue with the current cursor when the channel list changes (PubNub's
        /// `keepTimeTokenOnListChange`, default true); false takes a fresh cursor.
        package var keepTimetokenOnListChange: Bool
        /// After the loop gave up following an unexpected disconnect, probe the Time API and
        /// restore the subscription when it answers (default true); false forgets the channels.
        package var restoreSubscription: Bool
        /// Resume from the last cursor after a reconnect or restore (default true); false starts
        /// from "now" and messages published meanwhile are only in history.
        package var catchUpOnSubscriptionRestore: Bool
        /// A response with at least this many events raises `requestMessageCountExceeded` once per
        /// burst; 0 disables it.
        package var requestMessageCountThreshold: Int
        /// Time API probing period while unexpectedly disconnected (default 10 s).
        package var timeProbeInterval: Duration
        /// Liveness probing while receiving (nil: off). Default 25 s interval, 10 s timeout.
        package var liveness: Liveness?
        /// Whether presence heartbeats (rather than Time requests) are the liveness probe, and
        /// which of their results are reported as statuses.
        package var presenceHeartbeat: PresenceHeartbeat?
        /// A long-poll still running after this long is declared dead (default 320 s: the server
        /// answers within 280 s).
        package var longPollWatchdog: Duration
        /// When to backfill from history.
        package var backfill: BackfillPolicy
        /// Events per catch-up page (100).
        package var catchUpPageSize: Int

        /// Creates a configuration with the documented defaults.
        package init(retry: RetryConfiguration = .default, keepTimetokenOnListChange: Bool = true, restoreSubscription: Bool = true,
                    catchUpOnSubscriptionRestore: Bool = true, requestMessageCountThreshold: Int = 100,
                    timeProbeInterval: Duration = .seconds(10), liveness: Liveness? = Liveness(),
                    presenceHeartbeat: PresenceHeartbeat? = nil, longPollWatchdog: Duration = .seconds(320),
                    backfill: BackfillPolicy = .onGap, catchUpPageSize: Int = 100) {
            self.retry = retry
            self.keepTimetokenOnListChange = keepTimetokenOnListChange
            self.restoreSubscription = restoreSubscription
            self.catchUpOnSubscriptionRestore = catchUpOnSubscriptionRestore
            self.requestMessageCountThreshold = requestMessageCountThreshold
            self.timeProbeInterval = timeProbeInterval
            self.liveness = liveness
            self.presenceHeartbeat = presenceHeartbeat
            self.longPollWatchdog = longPollWatchdog
            self.backfill = backfill
            self.catchUpPageSize = catchUpPageSize
        }
    }

    /// Liveness probing while receiving: dead-link detection within `interval + timeout`.
    package struct Liveness: Sendable, Hashable {
        /// Time between probes (default 25 s).
        package var interval: Duration
        /// How long a probe may take (default 10 s).
        package var timeout: Duration
        /// Creates the settings.
        package init(interval: Duration = .seconds(25), timeout: Duration = .seconds(10)) {
            self.interval = interval
            self.timeout = timeout
        }
    }

    /// Presence heartbeats as the liveness probe.
    package struct PresenceHeartbeat: Sendable, Hashable {
        /// Which heartbeat results become statuses (public as ``HeartbeatReporting``).
        package typealias Reporting = HeartbeatReporting
        /// Seconds between heartbeats.
        package var interval: Duration
        /// Which results are reported.
        package var reporting: Reporting
        /// Creates the settings.
        package init(interval: Duration, reporting: Reporting = .failures) {
            self.interval = interval
            self.reporting = reporting
        }
    }

    /// When the engine fetches history itself (public as ``TetherClientCore/BackfillPolicy``).
    package typealias BackfillPolicy = TetherClientCore.BackfillPolicy

    /// Identifies one request the machine asked for; results for another ID are stale.
    package struct RequestID: Sendable, Hashable, CustomStringConvertible {
        /// The number.
        package let rawValue: Int
        /// `#n`.
        package var description: String { "#\(rawValue)" }
    }

    /// Timers the shell runs for the machine; scheduling one that exists replaces it.
    package enum TimerID: Sendable, Hashable, CaseIterable {
        /// The next retry of a failed subscribe.
        case retry
        /// The next Time API probe while unexpectedly disconnected.
        case timeProbe
        /// The next liveness probe while receiving.
        case liveness
        /// The deadline of the running long-poll.
        case longPollWatchdog
    }

    /// A subscribe position: the timetoken and region to send as `tt` / `tr`.
    package struct Cursor: Sendable, Hashable {
        /// `tt`.
        package var timetoken: Timetoken
        /// `tr`.
        package var region: Int
        /// Creates a cursor.
        package init(timetoken: Timetoken, region: Int) {
            self.timetoken = timetoken
            self.region = region
        }
    }

    /// What the shell must do.
    package enum Action: Sendable {
        /// Start a subscribe request (cancelling any running one): a handshake when `cursor` is nil.
        case startSubscribe(RequestID, channels: [String], groups: [String], cursor: Cursor?)
        /// Cancel the running subscribe request.
        case cancelSubscribe
        /// Start (or restart) a timer.
        case schedule(TimerID, after: Duration)
        /// Cancel a timer.
        case cancelTimer(TimerID)
        /// Emit a status; when `retryEpisode` is set the status can cancel that automatic retry.
        case emit(Status, retryEpisode: Int?)
        /// Publish a connection-state change.
        case connectionChanged(ConnectionChange)
        /// Deliver events to listeners, in order (already de-duplicated).
        case deliver([ReceivedEvent])
        /// Tell the server the user left these channels and groups (presence).
        case leave(channels: [String], groups: [String])
        /// Send one Time API request (restore probe).
        case probeTime
        /// Send one liveness probe: a presence heartbeat on the subscription or, when `presence`
        /// is false, a Time request; report the result within `timeout`.
        case probeLiveness(presence: Bool, channels: [String], groups: [String], timeout: Duration)
        /// Fetch history for these ranges and report it with ``SubscribeMachine/backfillCompleted(_:events:now:)``.
        case backfill(RequestID, [BackfillRange])
        /// Publish continuity outcomes.
        case continuity([ChannelContinuity])
    }

    // MARK: State

    private enum Purpose: Sendable, Hashable {
        /// First connection of this loop: announces `connected`.
        case connect
        /// After an outage, probe, network change or `reconnect()`: announces `reconnected`.
        case restore
        /// A fresh cursor after a list change (`keepTimetokenOnListChange == false`): silent.
        case listChange
    }

    private struct Outage: Sendable, Hashable {
        var start: Duration
        /// Retries the policy has counted (quick and `Retry-After` attempts are not).
        var retries: Int
        var accessDenied: Int
        var episode: Int
        /// Every attempt scheduled in this outage (what `reconnecting(attempt:)` shows).
        var attempts = 0
        /// Access-denied retries ran out and the app was told; later denials are quiet re-checks.
        var accessDeniedReported = false
        /// The scheduled retry waits for the server's `Retry-After` (a path change keeps it).
        var honoringRetryAfter = false
    }

    private struct Handshaking: Sendable {
        var request: RequestID
        var purpose: Purpose
        /// Where to continue after the handshake (nil: from the handshake's cursor).
        var resume: Timetoken?
        /// The last cursor the loop had (reported as `lastTimetoken`).
        var last: Cursor?
        var outage: Outage?
    }

    private enum Phase: Sendable {
        case polling(RequestID)
        case backfilling(RequestID, held: SubscribeResponse?)
    }

    private struct Receiving: Sendable {
        var phase: Phase
        var cursor: Cursor
        var catchUp: CatchUpPlanner?
        var liveness: HeartbeatTracker?
        var overflowReported: Bool
    }

    private struct Retrying: Sendable {
        var cursor: Cursor?
        var connectedBefore: Bool
        var outage: Outage
    }

    private struct Paused: Sendable {
        var cursor: Cursor?
        var connectedBefore: Bool
        var outage: Outage?
    }

    private struct Stopped: Sendable {
        var cursor: Cursor?
        var connectedBefore: Bool
        var reason: StatusCategory
        var probing: Bool
        /// The outage that ended in access denied (its re-checks continue it quietly).
        var outage: Outage? = nil
    }

    private enum NetworkPath: Sendable { case unknown, up, down }

    /// Can transition to: idle → handshaking, waitingForNetwork.
    /// handshaking → receiving, retrying, stopped, waitingForNetwork, disconnected, idle.
    /// receiving → receiving (next poll), handshaking (dead link, list change), retrying, stopped,
    /// waitingForNetwork, disconnected, idle. retrying → handshaking, stopped, waitingForNetwork,
    /// disconnected, idle. waitingForNetwork → handshaking, disconnected, idle.
    /// stopped → handshaking, waitingForNetwork, disconnected, idle. disconnected → handshaking, idle.
    private enum State: Sendable {
        case idle
        case handshaking(Handshaking)
        case receiving(Receiving)
        case retrying(Retrying)
        case waitingForNetwork(Paused)
        case stopped(Stopped)
        case disconnected(Paused)
    }

    // MARK: Stored properties

    /// The settings.
    package let configuration: Configuration
    private var state: State = .idle
    private var channels: [String] = []
    private var groups: [String] = []
    private var network: NetworkPath = .unknown
    /// When a path change last cut a retry's wait short.
    private var lastPathChangeAttempt: Duration?
    /// When the loop last came back from an outage (`reconnected`).
    private var lastRecovery: Duration?
    private var nextRequest = 0
    private var nextEpisode = 0
    /// Newest delivered timetoken per event channel: nothing at or below it is delivered again.
    private var watermarks: [String: Timetoken] = [:]

    /// Creates an idle machine.
    package init(configuration: Configuration = Configuration()) {
        self.configuration = configuration
    }

    // MARK: Queries

    /// The subscribed channels (presence channels included as `-pnpres` names).
    package var subscribedChannels: [String] { channels }
    /// The subscribed groups.
    package var subscribedGroups: [String] { groups }

    /// The connection state derived from the machine state.
    package var connectionState: ConnectionState {
        switch state {
        case .idle: return .idle
        case .handshaking(let h):
            if let outage = h.outage { return .reconnecting(attempt: outage.attempts) }
            switch h.purpose {
            case .connect: return .connecting
            case .restore: return .reconnecting(attempt: 0)
            case .listChange: return .connected
            }
        case .receiving: return .connected
        case .retrying(let r): return .reconnecting(attempt: r.outage.attempts)
        case .waitingForNetwork: return .waitingForNetwork
        case .stopped(let s): return .failed(s.reason)
        case .disconnected: return .disconnected
        }
    }

    /// The cursor the loop would continue from, if any.
    package var cursor: Cursor? {
        switch state {
        case .idle: return nil
        case .handshaking(let h): return h.resume.map { Cursor(timetoken: $0, region: h.last?.region ?? 0) } ?? h.last
        case .receiving(let r): return r.cursor
        case .retrying(let r): return r.cursor
        case .waitingForNetwork(let p), .disconnected(let p): return p.cursor
        case .stopped(let s): return s.cursor
        }
    }

    /// A summary for tests and logs: the state's name.
    package var stateName: String {
        switch state {
        case .idle: return "idle"
        case .handshaking: return "handshaking"
        case .receiving(let r):
            if case .backfilling = r.phase { return "backfilling" }
            return "receiving"
        case .retrying: return "retrying"
        case .waitingForNetwork: return "waitingForNetwork"
        case .stopped: return "stopped"
        case .disconnected: return "disconnected"
        }
    }

    // MARK: Events — app intents

    /// The app changed the subscription to exactly `channels` and `groups` (presence channels as
    /// `-pnpres` names). Subscribing to the same set restarts the long-poll (seed 001); an empty
    /// set unsubscribes from everything. `timetoken` overrides the cursor to continue from.
    package mutating func subscriptionChanged(channels newChannels: [String], groups newGroups: [String], timetoken: Timetoken? = nil,
                                             now: Duration) -> [Action] {
        let removedChannels = channels.filter { !newChannels.contains($0) }
        let removedGroups = groups.filter { !newGroups.contains($0) }
        let addedChannels = newChannels.filter { !channels.contains($0) }
        let addedGroups = newGroups.filter { !groups.contains($0) }
        let changed = !(removedChannels.isEmpty && removedGroups.isEmpty && addedChannels.isEmpty && addedGroups.isEmpty)
        channels = newChannels
        groups = newGroups
        var actions: [Action] = []
        let leaveChannels = removedChannels.filter { !NameRules.isPresence($0) }
        if !leaveChannels.isEmpty || !removedGroups.isEmpty {
            actions.append(.leave(channels: leaveChannels, groups: removedGroups))
        }
        for channel in removedChannels { watermarks[channel] = nil }
        let before = connectionState
        let affectedChannels = changed ? addedChannels + removedChannels : newChannels
        let affectedGroups = changed ? addedGroups + removedGroups : newGroups

        if newChannels.isEmpty && newGroups.isEmpty {
            switch state {
            case .idle:
                return actions
            case .disconnected(var paused):
                paused.cursor = nil
                state = .disconnected(paused)
                return actions
            case .handshaking, .receiving, .retrying, .waitingForNetwork, .stopped:
                let last = cursor?.timetoken
                actions += stopEverything()
                state = .idle
                actions.append(emit(.disconnected, operation: .unsubscribe, channels: removedChannels, groups: removedGroups,
                                    last: last, current: last))
                return actions + connectionChange(from: before)
            }
        }

        switch state {
        case .idle:
            if network == .down {
                state = .waitingForNetwork(Paused(cursor: timetoken.map { Cursor(timetoken: $0, region: 0) }, connectedBefore: false,
                                                  outage: nil))
                return actions + connectionChange(from: before)
            }
            actions += startHandshake(purpose: .connect, resume: timetoken, last: nil, outage: nil)
        case .handshaking(let h):
            actions += startHandshake(purpose: h.purpose, resume: timetoken ?? h.resume, last: h.last, outage: h.outage)
        case .receiving(let r):
            if changed {
                actions.append(emit(.subscriptionChanged, channels: affectedChannels, groups: affectedGroups,
                                    last: r.cursor.timetoken, current: timetoken ?? r.cursor.timetoken))
            }
            if configuration.keepTimetokenOnListChange || timetoken != nil || !changed {
                var next = r
                next.cursor = timetoken.map { Cursor(timetoken: $0, region: r.cursor.region) } ?? r.cursor
                actions += poll(&next)
                state = .receiving(next)
            } else {
                actions.append(.cancelTimer(.liveness))
                actions.append(.cancelTimer(.longPollWatchdog))
                actions += startHandshake(purpose: .listChange, resume: nil, last: r.cursor, outage: nil)
            }
        case .retrying(let r):
            // Seed 001: subscribing (even to the same set) forces an immediate attempt.
            if changed && r.connectedBefore {
                actions.append(emit(.subscriptionChanged, channels: affectedChannels, groups: affectedGroups,
                                    last: r.cursor?.timetoken, current: r.cursor?.timetoken))
            }
            actions.append(.cancelTimer(.retry))
            actions += startHandshake(purpose: r.connectedBefore ? .restore : .connect,
                                      resume: timetoken ?? resumePoint(r.cursor, connectedBefore: r.connectedBefore),
                                      last: r.cursor, outage: r.outage)
        case .waitingForNetwork(var paused):
            if let timetoken { paused.cursor = Cursor(timetoken: timetoken, region: paused.cursor?.region ?? 0) }
            state = .waitingForNetwork(paused)
            if changed && paused.connectedBefore {
                actions.append(emit(.subscriptionChanged, channels: affectedChannels, groups: affectedGroups,
                                    last: paused.cursor?.timetoken, current: paused.cursor?.timetoken))
            }
        case .stopped(let s):
            actions.append(.cancelTimer(.timeProbe))
            actions += startHandshake(purpose: s.connectedBefore ? .restore : .connect,
                                      resume: timetoken ?? resumePoint(s.cursor, connectedBefore: s.connectedBefore),
                                      last: s.cursor, outage: nil)
        case .disconnected(var paused):
            // Seed 000: after disconnect(), subscribe() does not reconnect; reconnect() does.
            if let timetoken { paused.cursor = Cursor(timetoken: timetoken, region: paused.cursor?.region ?? 0) }
            state = .disconnected(paused)
        }
        return actions + connectionChange(from: before)
    }

    /// The app called `disconnect()`: everything stops, the cursor is kept for `reconnect()`.
    package mutating func disconnect(now: Duration) -> [Action] {
        let before = connectionState
        switch state {
        case .idle, .disconnected:
            return []
        case .handshaking, .receiving, .retrying, .waitingForNetwork, .stopped:
            let saved = cursor
            let connectedBefore = wasConnected
            var actions = stopEverything()
            state = .disconnected(Paused(cursor: saved, connectedBefore: connectedBefore, outage: nil))
            actions.append(emit(.disconnected, last: saved?.timetoken, current: saved?.timetoken))
            return actions + connectionChange(from: before)
        }
    }

    /// The app called `reconnect(timetoken:)`: start again at once, from `timetoken` or the saved
    /// cursor. While receiving it restarts the long-poll.
    package mutating func reconnect(timetoken: Timetoken?, now: Duration) -> [Action] {
        let before = connectionState
        guard !channels.isEmpty || !groups.isEmpty else { return [] }
        var actions: [Action] = []
        switch state {
        case .idle:
            actions += startHandshake(purpose: .connect, resume: timetoken, last: nil, outage: nil)
        case .receiving(var r):
            if let timetoken { r.cursor = Cursor(timetoken: timetoken, region: r.cursor.region) }
            actions += poll(&r)
            state = .receiving(r)
        case .handshaking(let h):
            actions += startHandshake(purpose: h.purpose, resume: timetoken ?? h.resume, last: h.last, outage: h.outage)
        case .retrying(let r):
            actions.append(.cancelTimer(.retry))
            actions += startHandshake(purpose: r.connectedBefore ? .restore : .connect, resume: timetoken ?? r.cursor?.timetoken,
                                      last: r.cursor, outage: r.outage)
        case .waitingForNetwork(let p), .disconnected(let p):
            actions += startHandshake(purpose: p.connectedBefore ? .restore : .connect, resume: timetoken ?? p.cursor?.timetoken,
                                      last: p.cursor, outage: nil)
        case .stopped(let s):
            actions.append(.cancelTimer(.timeProbe))
            actions += startHandshake(purpose: s.connectedBefore ? .restore : .connect, resume: timetoken ?? s.cursor?.timetoken,
                                      last: s.cursor, outage: nil)
        }
        return actions + connectionChange(from: before)
    }

    /// The app called `cancelAutomaticRetry()` on a status of `episode`: stop retrying.
    package mutating func cancelAutomaticRetry(episode: Int, now: Duration) -> [Action] {
        let before = connectionState
        switch state {
        case .retrying(let r) where r.outage.episode == episode:
            var actions: [Action] = [.cancelTimer(.retry)]
            actions += giveUp(cursor: r.cursor, connectedBefore: r.connectedBefore, reason: nil, status: nil)
            return actions + connectionChange(from: before, event: r.connectedBefore ? .failed : nil)
        case .handshaking(let h) where h.outage?.episode == episode:
            var actions: [Action] = [.cancelSubscribe]
            let connectedBefore = h.purpose != .connect
            actions += giveUp(cursor: h.last, connectedBefore: connectedBefore, reason: nil, status: nil)
            return actions + connectionChange(from: before, event: connectedBefore ? .failed : nil)
        case .idle, .handshaking, .receiving, .retrying, .waitingForNetwork, .stopped, .disconnected:
            return []
        }
    }

    // MARK: Events — subscribe results

    /// A subscribe request answered 200.
    package mutating func subscribeSucceeded(_ id: RequestID, response: SubscribeResponse, gaps: [RetentionGap] = [],
                                            now: Duration) -> [Action] {
        let before = connectionState
        switch state {
        case .handshaking(let h) where h.request == id:
            let server = Cursor(timetoken: response.timetoken, region: response.region)
            let resumeCursor = h.resume.map { Cursor(timetoken: $0, region: response.region) } ?? server
            var actions: [Action] = [.cancelTimer(.longPollWatchdog)]
            var event: ReconnectEvent?
            switch h.purpose {
            case .connect:
                actions.append(emit(.connected, channels: channels, groups: groups, last: h.last?.timetoken ?? .zero,
                                    current: resumeCursor.timetoken))
                if h.outage != nil { event = .succeeded }
            case .restore:
                actions.append(emit(.reconnected, channels: channels, groups: groups, last: h.last?.timetoken,
                                    current: resumeCursor.timetoken))
                event = .succeeded
                lastRecovery = now
            case .listChange:
                break
            }
            var receiving = Receiving(phase: .polling(id), cursor: resumeCursor, catchUp: nil, liveness: nil, overflowReported: false)
            if let resume = h.resume, resume < server.timetoken {
                receiving.catchUp = CatchUpPlanner(channels: channels.filter { !NameRules.isPresence($0) && !$0.hasSuffix(".*") },
                                                   resumedFrom: resume, upTo: server.timetoken, pageSize: configuration.catchUpPageSize)
                if configuration.backfill == .onEveryReconnect {
                    let plain = channels.filter { !NameRules.isPresence($0) && !$0.hasSuffix(".*") }
                    if !plain.isEmpty {
                        let backfillID = makeRequestID()
                        receiving.phase = .backfilling(backfillID, held: nil)
                        actions.append(.backfill(backfillID, plain.map {
                            BackfillRange(channel: $0, after: resume, through: server.timetoken)
                        }))
                        actions += startLiveness(&receiving)
                        state = .receiving(receiving)
                        return actions + connectionChange(from: before, event: event)
                    }
                }
            } else if h.resume != nil {
                receiving.catchUp = nil
                actions.append(.continuity(channels.filter { !NameRules.isPresence($0) }.map {
                    ChannelContinuity(channel: $0, outcome: .continuous, resumedFrom: h.resume ?? .zero)
                }))
            }
            actions += startLiveness(&receiving)
            actions += poll(&receiving)
            state = .receiving(receiving)
            return actions + connectionChange(from: before, event: event)
        case .receiving(var r):
            guard case .polling(let current) = r.phase, current == id else { return [] }
            var actions: [Action] = []
            if !gaps.isEmpty {
                r.catchUp = r.catchUp ?? CatchUpPlanner(channels: [], resumedFrom: r.cursor.timetoken, upTo: response.timetoken,
                                                        pageSize: configuration.catchUpPageSize)
                r.catchUp?.recordGaps(gaps)
                if configuration.backfill != .never, let planner = r.catchUp {
                    let backfillID = makeRequestID()
                    r.phase = .backfilling(backfillID, held: response)
                    actions.append(.cancelTimer(.longPollWatchdog))
                    actions.append(.backfill(backfillID, planner.backfillRanges(for: gaps)))
                    state = .receiving(r)
                    return actions
                }
            }
            actions += accept(response, into: &r)
            actions += poll(&r)
            state = .receiving(r)
            return actions
        case .idle, .handshaking, .retrying, .waitingForNetwork, .stopped, .disconnected:
            return []
        }
    }

    /// A subscribe request failed (already classified). `randomness` in `0...1` picks the jitter.
    package mutating func subscribeFailed(_ id: RequestID, status: Status, now: Duration, randomness: Double) -> [Action] {
        if status.category == .cancelled { return [] }
        switch state {
        case .handshaking(let h) where h.request == id:
            return failure(status, cursor: h.resume.map { Cursor(timetoken: $0, region: h.last?.region ?? 0) } ?? h.last,
                           connectedBefore: h.purpose != .connect, outage: h.outage, now: now, randomness: randomness)
        case .receiving(let r):
            guard case .polling(let current) = r.phase, current == id else { return [] }
            return [.cancelTimer(.liveness), .cancelTimer(.longPollWatchdog)]
                + failure(status, cursor: r.cursor, connectedBefore: true, outage: nil, now: now, randomness: randomness)
        case .idle, .handshaking, .retrying, .waitingForNetwork, .stopped, .disconnected:
            return []
        }
    }

    /// History for a backfill arrived (events oldest first, any channels).
    package mutating func backfillCompleted(_ id: RequestID, events: [ReceivedEvent], now: Duration) -> [Action] {
        guard case .receiving(var r) = state, case .backfilling(let current, let held) = r.phase, current == id else { return [] }
        let sorted = events.sorted { ($0.timetoken, $0.channel) < ($1.timetoken, $1.channel) }
        var actions: [Action] = []
        let fresh = dedupe(sorted)
        if !fresh.isEmpty {
            actions.append(.deliver(fresh))
            actions += decryptionStatuses(fresh)
        }
        r.catchUp?.recordDelivered(fresh)
        r.catchUp?.recordBackfilled(sorted)
        if let held {
            actions += accept(held, into: &r)
        }
        actions += poll(&r)
        state = .receiving(r)
        return actions
    }

    /// A backfill failed: what the server sent is delivered, and the gap stays reported.
    package mutating func backfillFailed(_ id: RequestID, status: Status, now: Duration) -> [Action] {
        backfillCompleted(id, events: [], now: now)
    }

    // MARK: Events — timers and probes

    /// A timer the machine scheduled fired.
    package mutating func timerFired(_ timer: TimerID, now: Duration, randomness: Double) -> [Action] {
        let before = connectionState
        switch (timer, state) {
        case (.retry, .retrying(let r)):
            let actions = startHandshake(purpose: r.connectedBefore ? .restore : .connect,
                                         resume: resumePoint(r.cursor, connectedBefore: r.connectedBefore), last: r.cursor, outage: r.outage)
            return actions + connectionChange(from: before)
        case (.timeProbe, .stopped(let s)) where s.probing:
            return [.probeTime]
        case (.liveness, .receiving(let r)) where r.liveness != nil:
            let timeout = r.liveness?.timeout ?? .seconds(10)
            return [.probeLiveness(presence: configuration.presenceHeartbeat != nil, channels: channels.filter { !NameRules.isPresence($0) },
                                   groups: groups, timeout: timeout)]
        case (.longPollWatchdog, .handshaking(let h)):
            let status = Status(category: .timeout, operation: .subscribe, serverMessage: "the handshake outlived its deadline",
                                affectedChannels: channels, affectedGroups: groups)
            return [.cancelSubscribe] + subscribeFailed(h.request, status: status, now: now, randomness: randomness)
        case (.longPollWatchdog, .receiving(let r)):
            guard case .polling(let id) = r.phase else { return [] }
            let status = Status(category: .timeout, operation: .subscribe, serverMessage: "the long-poll outlived its deadline",
                                affectedChannels: channels, affectedGroups: groups)
            return [.cancelSubscribe] + subscribeFailed(id, status: status, now: now, randomness: randomness)
        case (.retry, _), (.timeProbe, _), (.liveness, _), (.longPollWatchdog, _):
            return []
        }
    }

    /// A Time API probe answered: restore the subscription (seed 001).
    package mutating func timeProbeSucceeded(now: Duration) -> [Action] {
        let before = connectionState
        guard case .stopped(let s) = state, s.probing else { return [] }
        return resume(from: s) + connectionChange(from: before)
    }

    /// A Time API probe failed: probe again later.
    package mutating func timeProbeFailed(now: Duration) -> [Action] {
        guard case .stopped(let s) = state, s.probing else { return [] }
        return [.schedule(.timeProbe, after: configuration.timeProbeInterval)]
    }

    /// A liveness probe (heartbeat or Time) answered.
    package mutating func livenessProbeSucceeded(now: Duration) -> [Action] {
        guard case .receiving(var r) = state, var tracker = r.liveness else { return [] }
        var actions: [Action] = []
        if case .probeAfter(let delay) = tracker.probeSucceeded() { actions.append(.schedule(.liveness, after: delay)) }
        r.liveness = tracker
        state = .receiving(r)
        if let heartbeat = configuration.presenceHeartbeat, heartbeat.reporting == .all {
            actions.append(.emit(Status(category: .acknowledgment, operation: .heartbeat, statusCode: 200, affectedChannels: channels,
                                        affectedGroups: groups), retryEpisode: nil))
        }
        return actions
    }

    /// A liveness probe failed: a dead link (seed 001's broken pipe) restarts the loop at once.
    package mutating func livenessProbeFailed(status: Status, now: Duration, randomness: Double) -> [Action] {
        let before = connectionState
        guard case .receiving(var r) = state, var tracker = r.liveness else { return [] }
        var actions: [Action] = []
        if let heartbeat = configuration.presenceHeartbeat, heartbeat.reporting != .none {
            actions.append(.emit(status, retryEpisode: nil))
        }
        switch tracker.probeFailed() {
        case .probeAfter(let delay):
            r.liveness = tracker
            state = .receiving(r)
            return actions + [.schedule(.liveness, after: delay)]
        case .declareDead:
            let outage = Outage(start: now, retries: 0, accessDenied: 0, episode: makeEpisode())
            actions += [.cancelSubscribe, .cancelTimer(.liveness), .cancelTimer(.longPollWatchdog)]
            actions.append(emit(.unexpectedDisconnect, from: status, last: r.cursor.timetoken, current: r.cursor.timetoken,
                                retryEpisode: outage.episode))
            actions += startHandshake(purpose: .restore, resume: resumePoint(r.cursor, connectedBefore: true), last: r.cursor,
                                      outage: outage)
            return actions + connectionChange(from: before, event: .started)
        }
    }

    // MARK: Events — network

    /// The network monitor reports no usable network: stop pointless retries.
    package mutating func networkDown(now: Duration) -> [Action] {
        let before = connectionState
        guard network != .down else { return [] }
        network = .down
        var actions: [Action] = [.emit(Status(category: .networkDown, operation: .subscribe, subscribedChannels: channels,
                                              subscribedGroups: groups), retryEpisode: nil)]
        switch state {
        case .idle, .disconnected, .waitingForNetwork:
            return actions
        case .stopped(let s):
            guard s.probing else { return actions }
            actions.append(.cancelTimer(.timeProbe))
            state = .waitingForNetwork(Paused(cursor: s.cursor, connectedBefore: s.connectedBefore,
                                              outage: s.reason == .accessDenied ? s.outage : nil))
            return actions + connectionChange(from: before)
        case .handshaking, .receiving, .retrying:
            let saved = cursor
            let connectedBefore = wasConnected
            let outage = currentOutage
            actions += stopEverything()
            state = .waitingForNetwork(Paused(cursor: saved, connectedBefore: connectedBefore, outage: outage))
            let event: ReconnectEvent? = (before == .connected) ? .started : nil
            return actions + connectionChange(from: before, event: event)
        }
    }

    /// The network monitor reports the network back: one immediate attempt, then the policy resumes.
    package mutating func networkUp(now: Duration) -> [Action] {
        let before = connectionState
        guard network != .up else { return [] }
        let wasDown = network == .down
        network = .up
        guard wasDown else { return [] }
        var actions: [Action] = [.emit(Status(category: .networkUp, operation: .subscribe, subscribedChannels: channels,
                                              subscribedGroups: groups), retryEpisode: nil)]
        switch state {
        case .waitingForNetwork(let p):
            actions += startHandshake(purpose: p.connectedBefore ? .restore : .connect,
                                      resume: resumePoint(p.cursor, connectedBefore: p.connectedBefore), last: p.cursor, outage: p.outage)
        case .retrying(let r):
            actions.append(.cancelTimer(.retry))
            actions += startHandshake(purpose: r.connectedBefore ? .restore : .connect,
                                      resume: resumePoint(r.cursor, connectedBefore: r.connectedBefore), last: r.cursor, outage: r.outage)
        case .stopped(let s) where s.probing:
            actions.append(.cancelTimer(.timeProbe))
            actions += resume(from: s)
        case .idle, .handshaking, .receiving, .stopped, .disconnected:
            break
        }
        return actions + connectionChange(from: before)
    }

    /// The network monitor reports that the path changed while staying usable (Wi-Fi → cellular,
    /// an interface gone while another remains): requests in flight may sit on a dead path
    /// with no error to come, so the long-poll restarts at once from its cursor over the new
    /// path (no status: nothing was lost), a running handshake is re-sent, and a scheduled retry
    /// runs now. From down, this is ``networkUp(now:)``.
    package mutating func networkChanged(now: Duration) -> [Action] {
        guard network == .up else { return networkUp(now: now) }
        let before = connectionState
        switch state {
        case .receiving(var r):
            guard case .polling = r.phase else { return [] }
            var actions: [Action] = [.cancelSubscribe, .cancelTimer(.longPollWatchdog)]
            actions += poll(&r)
            state = .receiving(r)
            return actions
        case .handshaking(let h):
            return [.cancelSubscribe, .cancelTimer(.longPollWatchdog)]
                + startHandshake(purpose: h.purpose, resume: h.resume, last: h.last, outage: h.outage) + connectionChange(from: before)
        case .retrying(let r):
            // The server's Retry-After still holds on the new path; and a flapping interface
            // list must not turn back-off into a tight loop (one early attempt per second at most).
            if r.outage.honoringRetryAfter { return [] }
            if let last = lastPathChangeAttempt, now - last < .seconds(1) { return [] }
            lastPathChangeAttempt = now
            return [.cancelTimer(.retry)]
                + startHandshake(purpose: r.connectedBefore ? .restore : .connect,
                                 resume: resumePoint(r.cursor, connectedBefore: r.connectedBefore), last: r.cursor, outage: r.outage)
                + connectionChange(from: before)
        case .stopped(let s) where s.probing:
            return [.cancelTimer(.timeProbe)] + resume(from: s) + connectionChange(from: before)
        case .idle, .stopped, .waitingForNetwork, .disconnected:
            return []
        }
    }

    /// Whether a failure never reached a working server: nothing listening (connection
    /// refused), the connection cut before a complete answer (a server going down, a middlebox's
    /// reset), or a `200` that is not JSON (a captive portal's sign-in page).
    static func neverReachedAServer(_ status: Status) -> Bool {
        switch status.error as? TransportFailure {
        case .connectionRefused?, .connectionClosed?: return true
        default: return status.category == .malformedResponse && status.statusCode == 200
        }
    }

    // MARK: Transition helpers

    /// Leaves a probing `stopped` state with a handshake: `connected` or `reconnected` as the
    /// client had connected before or not, and an access-denied outage carried on, so a
    /// re-check that is still denied stays quiet.
    private mutating func resume(from s: Stopped) -> [Action] {
        startHandshake(purpose: s.connectedBefore ? .restore : .connect,
                       resume: resumePoint(s.cursor, connectedBefore: s.connectedBefore), last: s.cursor,
                       outage: s.reason == .accessDenied ? s.outage : nil)
    }

    private var wasConnected: Bool {
        switch state {
        case .idle: return false
        case .handshaking(let h): return h.purpose != .connect
        case .receiving: return true
        case .retrying(let r): return r.connectedBefore
        case .waitingForNetwork(let p), .disconnected(let p): return p.connectedBefore
        case .stopped(let s): return s.connectedBefore
        }
    }

    private var currentOutage: Outage? {
        switch state {
        case .handshaking(let h): return h.outage
        case .retrying(let r): return r.outage
        case .waitingForNetwork(let p), .disconnected(let p): return p.outage
        case .idle, .receiving, .stopped: return nil
        }
    }

    private func resumePoint(_ cursor: Cursor?, connectedBefore: Bool) -> Timetoken? {
        guard let cursor else { return nil }
        if connectedBefore && !configuration.catchUpOnSubscriptionRestore { return nil }
        return cursor.timetoken
    }

    private mutating func makeRequestID() -> RequestID {
        nextRequest += 1
        return RequestID(rawValue: nextRequest)
    }

    private mutating func makeEpisode() -> Int {
        nextEpisode += 1
        return nextEpisode
    }

    private mutating func startHandshake(purpose: Purpose, resume: Timetoken?, last: Cursor?, outage: Outage?) -> [Action] {
        let id = makeRequestID()
        state = .handshaking(Handshaking(request: id, purpose: purpose, resume: resume, last: last, outage: outage))
        return [.startSubscribe(id, channels: channels, groups: groups, cursor: nil), .schedule(.longPollWatchdog, after: configuration.longPollWatchdog)]
    }

    private mutating func poll(_ receiving: inout Receiving) -> [Action] {
        let id = makeRequestID()
        receiving.phase = .polling(id)
        return [.startSubscribe(id, channels: channels, groups: groups, cursor: receiving.cursor),
                .schedule(.longPollWatchdog, after: configuration.longPollWatchdog)]
    }

    private func startLiveness(_ receiving: inout Receiving) -> [Action] {
        if let heartbeat = configuration.presenceHeartbeat {
            let timeout = configuration.liveness?.timeout ?? .seconds(10)
            receiving.liveness = HeartbeatTracker(interval: heartbeat.interval, timeout: timeout)
            return [.schedule(.liveness, after: heartbeat.interval)]
        }
        guard let liveness = configuration.liveness else { return [] }
        receiving.liveness = HeartbeatTracker(interval: liveness.interval, timeout: liveness.timeout)
        return [.schedule(.liveness, after: liveness.interval)]
    }

    private func stopEverything() -> [Action] {
        [.cancelSubscribe] + TimerID.allCases.map { .cancelTimer($0) }
    }

    private mutating func dedupe(_ events: [ReceivedEvent]) -> [ReceivedEvent] {
        var fresh: [ReceivedEvent] = []
        for event in events {
            if let mark = watermarks[event.channel], event.timetoken <= mark { continue }
            watermarks[event.channel] = event.timetoken
            fresh.append(event)
        }
        return fresh
    }

    private func decryptionStatuses(_ events: [ReceivedEvent]) -> [Action] {
        events.compactMap { event in event.decryptionError.map { .emit($0, retryEpisode: nil) } }
    }

    /// Delivers a response (de-duplicated), advances the cursor, reports overflow and continuity.
    private mutating func accept(_ response: SubscribeResponse, into r: inout Receiving) -> [Action] {
        var actions: [Action] = []
        let fresh = dedupe(response.events)
        if !fresh.isEmpty {
            actions.append(.deliver(fresh))
            actions += decryptionStatuses(fresh)
        }
        let threshold = configuration.requestMessageCountThreshold
        if threshold > 0, response.events.count >= threshold {
            if !r.overflowReported {
                r.overflowReported = true
                actions.append(emit(.requestMessageCountExceeded, channels: channels, groups: groups, last: r.cursor.timetoken,
                                    current: response.timetoken,
                                    message: "\(response.events.count) events in one response (threshold \(threshold))"))
            }
        } else {
            r.overflowReported = false
        }
        if var planner = r.catchUp {
            planner.recordDelivered(fresh)
            if planner.isComplete(afterResponseWith: response.events.count, cursor: response.timetoken) {
                actions.append(.continuity(planner.outcomes()))
                r.catchUp = nil
            } else {
                r.catchUp = planner
            }
        }
        r.cursor = Cursor(timetoken: max(response.timetoken, r.cursor.timetoken), region: response.region)
        return actions
    }

    private mutating func failure(_ status: Status, cursor: Cursor?, connectedBefore: Bool, outage existing: Outage?, now: Duration,
                                  randomness: Double) -> [Action] {
        let before = connectionState
        let isNewOutage = existing == nil
        var outage = existing ?? Outage(start: now, retries: 0, accessDenied: 0, episode: makeEpisode())
        let last = cursor?.timetoken
        switch status.category {
        case .malformedFilterExpression, .badRequest:
            // Retrying cannot help (seed 002): report and stop.
            var actions: [Action] = [.cancelTimer(.retry), .cancelTimer(.longPollWatchdog)]
            actions.append(emit(status.category, from: status, last: last, current: last, retryEpisode: nil))
            state = .stopped(Stopped(cursor: cursor, connectedBefore: connectedBefore, reason: status.category, probing: false))
            return actions + connectionChange(from: before, event: connectedBefore && !isNewOutage ? .failed : nil)
        case .accessDenied:
            outage.accessDenied += 1
            let delay = outage.accessDenied <= configuration.retry.accessDeniedRetryLimit && configuration.retry.retries(.subscribe)
                ? configuration.retry.delay(beforeRetry: outage.retries + 1, elapsed: now - outage.start, randomness: randomness) : nil
            guard let delay else {
                // Retries are used up: report it once, then re-check quietly every
                // `timeProbeInterval` so a restored grant resumes the subscription (`reconnected`)
                // without the app having to notice. A re-check still denied says nothing new.
                let recheck = outage.accessDeniedReported
                outage.accessDeniedReported = true
                var actions: [Action] = [.cancelTimer(.longPollWatchdog)]
                if !recheck { actions.append(emit(.accessDenied, from: status, last: last, current: last, retryEpisode: nil)) }
                let probing = configuration.retry.retries(.subscribe)
                state = .stopped(Stopped(cursor: cursor, connectedBefore: connectedBefore, reason: .accessDenied, probing: probing,
                                         outage: outage))
                if probing { actions.append(.schedule(.timeProbe, after: configuration.timeProbeInterval)) }
                return actions + connectionChange(from: before, event: connectedBefore && !isNewOutage && !recheck ? .failed : nil)
            }
            outage.retries += 1
            outage.attempts += 1
            var actions: [Action] = [.cancelTimer(.longPollWatchdog)]
            actions.append(emit(.accessDenied, from: status, last: last, current: last, retryEpisode: outage.episode))
            state = .retrying(Retrying(cursor: cursor, connectedBefore: connectedBefore, outage: outage))
            actions.append(.schedule(.retry, after: delay))
            return actions + connectionChange(from: before, event: connectedBefore && isNewOutage ? .started : nil)
        case .acknowledgment, .connected, .reconnected, .disconnected, .unexpectedDisconnect, .connectionError,
            .disconnectedUnexpectedly, .subscriptionChanged, .timeout, .networkIssues, .networkUp, .networkDown, .malformedResponse,
            .decryptionError, .tlsConnectionFailed, .tlsUntrustedCertificate, .requestMessageCountExceeded, .unknown, .cancelled:
            let delay = configuration.retry.retries(.subscribe)
                ? configuration.retry.delay(beforeRetry: outage.retries + 1, elapsed: now - outage.start, randomness: randomness) : nil
            // The failure never reached a working server (nothing listening, a connection cut
            // before any answer, a captive portal's page): knocking again costs the server nothing,
            // so try within about a second instead of waiting out the back-off; these quick
            // attempts do not use up the policy's retries.
            var quick: Duration?
            // An outage that starts within 30 s of recovering from the last one waits the policy's
            // first delay: a request that fails the same way after every reconnect (a middlebox
            // cutting one page) must not loop every second.
            let relapse = isNewOutage && lastRecovery.map { now - $0 < .seconds(30) } == true
            if let fast = configuration.retry.fastReconnect, configuration.retry.retries(.subscribe), !configuration.retry.policy.isCustom,
               now - outage.start < fast.window, Self.neverReachedAServer(status), !relapse {
                quick = fast.delay(randomness: randomness)
            }
            // A server shedding load (429/503) that says when to come back is taken at its word:
            // exactly its `Retry-After` plus up to 1 s of jitter (so its clients do not return in
            // the same instant) — never sooner, and not later than it asked either. These waits do
            // not use up the policy's retries: the server is alive and talking.
            if let retryAfter = status.retryAfter, configuration.retry.retries(.subscribe) {
                // At least 1 s: a `Retry-After: 0` must not turn into a tight loop.
                quick = max(retryAfter, .seconds(1)) + .milliseconds(Int64(min(max(randomness, 0), 1) * 1000))
                outage.honoringRetryAfter = true
            } else {
                outage.honoringRetryAfter = false
            }
            var actions: [Action] = [.cancelTimer(.longPollWatchdog)]
            guard let delay = status.retryAfter != nil ? quick : quick.map({ quick in delay.map { min($0, quick) } }) ?? delay else {
                actions += giveUp(cursor: cursor, connectedBefore: connectedBefore, reason: status, status: status)
                return actions + connectionChange(from: before, event: connectedBefore && !isNewOutage ? .failed : nil)
            }
            if quick == nil { outage.retries += 1 }
            outage.attempts += 1
            if isNewOutage {
                let category: StatusCategory = connectedBefore ? .unexpectedDisconnect : status.category
                actions.append(emit(category, from: status, last: last, current: last, retryEpisode: outage.episode))
            }
            state = .retrying(Retrying(cursor: cursor, connectedBefore: connectedBefore, outage: outage))
            actions.append(.schedule(.retry, after: delay))
            return actions + connectionChange(from: before, event: connectedBefore && isNewOutage ? .started : nil)
        }
    }

    /// Gives up: `connectionError` before ever connecting, `disconnectedUnexpectedly` after; then
    /// probes the Time API (or forgets the subscription when `restoreSubscription` is off).
    private mutating func giveUp(cursor: Cursor?, connectedBefore: Bool, reason: Status?, status: Status?) -> [Action] {
        let category: StatusCategory = connectedBefore ? .disconnectedUnexpectedly : .connectionError
        var actions: [Action] = []
        let last = cursor?.timetoken
        if let status {
            actions.append(emit(category, from: status, last: last, current: last, retryEpisode: nil))
        } else {
            actions.append(emit(category, last: last, current: last))
        }
        if connectedBefore && !configuration.restoreSubscription {
            channels = []
            groups = []
            state = .idle
            return actions
        }
        let probing = connectedBefore
        state = .stopped(Stopped(cursor: cursor, connectedBefore: connectedBefore, reason: category, probing: probing))
        if probing { actions.append(.schedule(.timeProbe, after: configuration.timeProbeInterval)) }
        return actions
    }

    private func connectionChange(from before: ConnectionState, event: ReconnectEvent? = nil) -> [Action] {
        let after = connectionState
        guard after != before || event != nil else { return [] }
        return [.connectionChanged(ConnectionChange(previous: before, current: after, reconnectEvent: event))]
    }

    private func emit(_ category: StatusCategory, operation: TetherOperation = .subscribe, channels affected: [String]? = nil,
                      groups affectedGroups: [String]? = nil, last: Timetoken?, current: Timetoken?, message: String? = nil) -> Action {
        .emit(Status(category: category, operation: operation, serverMessage: message, affectedChannels: affected ?? channels,
                     affectedGroups: affectedGroups ?? groups, subscribedChannels: channels, subscribedGroups: groups,
                     lastTimetoken: last, currentTimetoken: current), retryEpisode: nil)
    }

    private func emit(_ category: StatusCategory, from status: Status, last: Timetoken?, current: Timetoken?, retryEpisode: Int?) -> Action {
        var copy = Status(category: category, operation: .subscribe, statusCode: status.statusCode, error: status.error,
                          serverMessage: status.serverMessage ?? (category == status.category ? nil : "\(status.category)"),
                          affectedChannels: channels, affectedGroups: groups, subscribedChannels: channels, subscribedGroups: groups,
                          lastTimetoken: last, currentTimetoken: current, deniedChannels: status.deniedChannels,
                          deniedGroups: status.deniedGroups)
        copy.willAutomaticallyRetry = retryEpisode != nil
        return .emit(copy, retryEpisode: retryEpisode)
    }
}
