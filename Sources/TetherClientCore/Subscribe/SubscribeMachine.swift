@_spi(Benchmarks) package import TetherProtocol

/// The subscribe loop as a pure state machine (ARCHITECTURE.md, STYLE.md §1–3): a thin parent
/// composing small child machines.
///
/// Every input is a `mutating func` returning the ``Action``s the shell must perform: start or
/// cancel the subscribe request, schedule or cancel timers by ``TimerID``, report to the app,
/// deliver events, probe, backfill. Time (`now`, a duration since the shell's origin) and
/// randomness come in as arguments. Reports are typed facts (``SubscribeReport``); the shell
/// turns them into public ``Status`` values.
///
/// The parent owns the subscription (channels, groups), the connection state the app sees and
/// which child runs when:
///
/// - ``HandshakeMachine``: the `tt=0` request every (re)connection starts with, and what its
///   answer announces (`connected`, `reconnected`) and where the loop continues.
/// - ``ReceiveLoop`` (``LongPollLoop`` today): delivery while connected — de-duplication,
///   catch-up, backfill, the message-count burst. A WebSocket session is one more case there.
/// - ``HeartbeatMachine``: liveness probes while receiving, and the dead-link verdict.
/// - ``RetryMachine``: one outage's retry schedule (back-off, quick attempts, `Retry-After`,
///   access denied), carried through every state of the outage.
/// - ``NetworkWatch``: the network monitor's reports, and the limit on early attempts.
package struct SubscribeMachine: Sendable {
    // MARK: State

    private struct Handshaking: Sendable {
        var handshake: HandshakeMachine
        /// The outage this handshake tries to end (nil: none).
        var outage: RetryMachine?
    }

    private struct Receiving: Sendable {
        var loop: ReceiveLoop
        var heartbeat: HeartbeatMachine
        /// Liveness probes that succeeded over another connection while this long-poll waited.
        var probesDuringPoll: (poll: RequestID?, count: Int) = (nil, 0)
    }

    private struct Retrying: Sendable {
        var cursor: Cursor?
        var connectedBefore: Bool
        var outage: RetryMachine
    }

    private struct Paused: Sendable {
        var cursor: Cursor?
        var connectedBefore: Bool
        var outage: RetryMachine?
    }

    /// After `enterForeground()` with the connection let go: the probe runs before anything is
    /// trusted.
    private struct Resuming: Sendable {
        var cursor: Cursor?
        var connectedBefore: Bool
        var probe: RequestID
    }

    /// What a foreground with ``ForegroundCatchUp/unreadCounts`` or ``ForegroundCatchUp/latestOnly``
    /// skips: everything after `from`, reported once the new subscription is established.
    private struct PendingSkip: Sendable {
        var from: Timetoken
        var counts: [String: Int]?
        /// The cursor the counts go through (Tether's `Tether-Counted-Through`): the new
        /// subscription resumes from it, so nothing after it is skipped uncounted. `nil`: the
        /// skip goes to the handshake's cursor.
        var through: Timetoken?
    }

    /// What a stopped loop does on its own.
    private enum Afterwards: Sendable, Hashable {
        /// Probe the Time API every `timeProbeInterval` and restore when it answers.
        case probeTime
        /// Nothing: the app must call `reconnect()` or subscribe again.
        case waitForApp
    }

    private struct Stopped: Sendable {
        var cursor: Cursor?
        var connectedBefore: Bool
        var reason: StatusCategory
        var afterwards: Afterwards
        /// The outage that ended in access denied (its re-checks continue it quietly).
        var outage: RetryMachine? = nil
        /// The retries ran out on their own (not `cancelAutomaticRetry()`): a network that comes
        /// back restarts the subscription even when no Time probe runs.
        var restartsOnNetworkUp = false
        /// The outage whose retries ran out on their own: its statuses' `cancelAutomaticRetry()`
        /// still stops what follows a give-up (Time probes, the restart on network up).
        var episode: Int? = nil
    }

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
        /// The app is in the background and the connection was let go (policy disconnect or suspend).
        case background(Paused)
        /// Back in the foreground; the probe runs.
        case resuming(Resuming)
    }

    // MARK: Stored properties

    /// The settings.
    package let configuration: Configuration
    private let receiveSettings: ReceiveSettings
    private var state: State = .idle {
        didSet { noteCatchUp(leaving: oldValue) }
    }
    /// A catch-up an outage cut short (the loop left while catching up): the next reconnect's
    /// catch-up continues it, so the gaps it was told of and what it recovered are reported once
    /// the client is current, with the cursor it first resumed from.
    private var interruptedCatchUp: CatchUpPlanner?
    private var channels: [String] = []
    private var groups: [String] = []
    private var network = NetworkWatch()
    /// When the loop last came back from an outage (`reconnected`).
    private var lastRecovery: Duration?
    private var requestIDs = RequestIDs()
    private var nextEpisode = 0
    private var watermarks = DeliveryWatermarks()
    /// A reconnect cycle was announced (`started`) and has not ended yet.
    private var reconnectCycleOpen = false
    /// The app said it is in the background.
    private var inBackground = false
    /// The foreground probe of a kept connection (policy keep), while it runs.
    private var keptProbe: RequestID?
    /// What the foreground skips, until the new subscription reports it.
    private var pendingSkip: PendingSkip?

    /// Creates an idle machine.
    package init(configuration: Configuration = Configuration()) {
        self.configuration = configuration
        self.receiveSettings = ReceiveSettings(configuration)
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
            switch h.handshake.purpose {
            case .connect: return .connecting
            case .restore: return .reconnecting(attempt: 0)
            case .listChange: return .connected
            }
        case .receiving: return .connected
        case .retrying(let r): return .reconnecting(attempt: r.outage.attempts)
        case .waitingForNetwork: return .waitingForNetwork
        case .stopped(let s): return .failed(s.reason)
        case .disconnected: return .disconnected
        case .background: return .background
        case .resuming(let r): return r.connectedBefore ? .reconnecting(attempt: 0) : .connecting
        }
    }

    /// The cursor the loop would continue from, if any.
    package var cursor: Cursor? {
        switch state {
        case .idle: return nil
        case .handshaking(let h): return h.handshake.cursor
        case .receiving(let r): return r.loop.cursor
        case .retrying(let r): return r.cursor
        case .waitingForNetwork(let p), .disconnected(let p), .background(let p): return p.cursor
        case .stopped(let s): return s.cursor
        case .resuming(let r): return r.cursor
        }
    }

    /// A summary for tests and logs: the state's name.
    package var stateName: String {
        switch state {
        case .idle: return "idle"
        case .handshaking: return "handshaking"
        case .receiving(let r): return r.loop.stateName
        case .retrying: return "retrying"
        case .waitingForNetwork: return "waitingForNetwork"
        case .stopped: return "stopped"
        case .disconnected: return "disconnected"
        case .background: return "background"
        case .resuming: return "resuming"
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
        watermarks.forget(removedChannels)
        let before = connectionState
        let affectedChannels = changed ? addedChannels + removedChannels : newChannels
        let affectedGroups = changed ? addedGroups + removedGroups : newGroups
        let removalOnly = changed && addedChannels.isEmpty && addedGroups.isEmpty

        if newChannels.isEmpty && newGroups.isEmpty {
            switch state {
            case .idle:
                return actions
            case .disconnected(var paused):
                paused.cursor = nil
                state = .disconnected(paused)
                return actions
            case .handshaking, .receiving, .retrying, .waitingForNetwork, .stopped, .background, .resuming:
                let last = cursor?.timetoken
                pendingSkip = nil
                actions += stopEverything()
                state = .idle
                actions.append(report(.unsubscribed(channels: removedChannels, groups: removedGroups, last: last)))
                return actions + connectionChange(from: before)
            }
        }

        switch state {
        case .idle:
            if network.isDown {
                state = .waitingForNetwork(Paused(cursor: timetoken.map { Cursor(timetoken: $0, region: 0) }, connectedBefore: false,
                                                  outage: nil))
                return actions + connectionChange(from: before)
            }
            actions += startHandshake(purpose: .connect, resume: timetoken, last: nil, outage: nil)
        case .handshaking(let h):
            actions += startHandshake(purpose: h.handshake.purpose, resume: timetoken ?? h.handshake.resume, last: h.handshake.last,
                                      outage: h.outage)
        case .receiving(var r):
            let current = r.loop.cursor
            if changed {
                actions.append(report(.subscriptionChanged(channels: affectedChannels, groups: affectedGroups, last: current.timetoken,
                                                           current: timetoken ?? current.timetoken, removalOnly: removalOnly)))
            }
            if configuration.keepTimetokenOnListChange || timetoken != nil || !changed {
                actions += perform(r.loop.restart(from: timetoken, settings: receiveSettings, ids: &requestIDs))
                state = .receiving(r)
            } else {
                actions.append(.cancelTimer(.liveness))
                actions.append(.cancelTimer(.longPollWatchdog))
                actions += startHandshake(purpose: .listChange, resume: nil, last: current, outage: nil)
            }
        case .retrying(let r):
            // Seed 001: subscribing (even to the same set) forces an immediate attempt.
            if changed && r.connectedBefore {
                actions.append(report(.subscriptionChanged(channels: affectedChannels, groups: affectedGroups, last: r.cursor?.timetoken,
                                                           current: r.cursor?.timetoken, removalOnly: removalOnly)))
            }
            actions.append(.cancelTimer(.retry))
            actions += startHandshake(purpose: r.connectedBefore ? .restore : .connect,
                                      resume: timetoken ?? resumePoint(r.cursor, connectedBefore: r.connectedBefore),
                                      last: r.cursor, outage: r.outage)
        case .waitingForNetwork(var paused):
            if let timetoken { paused.cursor = Cursor(timetoken: timetoken, region: paused.cursor?.region ?? 0) }
            state = .waitingForNetwork(paused)
            if changed && paused.connectedBefore {
                actions.append(report(.subscriptionChanged(channels: affectedChannels, groups: affectedGroups,
                                                           last: paused.cursor?.timetoken, current: paused.cursor?.timetoken, removalOnly: removalOnly)))
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
        case .background(var paused):
            // In the background nothing connects; the foreground subscribes to the new set.
            if let timetoken { paused.cursor = Cursor(timetoken: timetoken, region: paused.cursor?.region ?? 0) }
            state = .background(paused)
        case .resuming(var r):
            // The probe runs; the handshake that follows takes the new set.
            if let timetoken { r.cursor = Cursor(timetoken: timetoken, region: r.cursor?.region ?? 0) }
            state = .resuming(r)
        }
        return actions + connectionChange(from: before)
    }

    /// The app called `disconnect()`: everything stops, the cursor is kept for `reconnect()`.
    package mutating func disconnect(now: Duration) -> [Action] {
        let before = connectionState
        switch state {
        case .idle, .disconnected:
            return []
        case .handshaking, .receiving, .retrying, .waitingForNetwork, .stopped, .background, .resuming:
            pendingSkip = nil
            keptProbe = nil
            let saved = cursor
            let connectedBefore = wasConnected
            var actions = stopEverything()
            state = .disconnected(Paused(cursor: saved, connectedBefore: connectedBefore, outage: nil))
            // `disconnected` pairs with a `connected` (or `reconnected`) the app saw; a client
            // stopped before it ever connected only changes state.
            if connectedBefore { actions.append(report(.disconnected(last: saved?.timetoken))) }
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
            actions += perform(r.loop.restart(from: timetoken, settings: receiveSettings, ids: &requestIDs))
            state = .receiving(r)
        case .handshaking(let h):
            actions += startHandshake(purpose: h.handshake.purpose, resume: timetoken ?? h.handshake.resume, last: h.handshake.last,
                                      outage: h.outage)
        case .retrying(let r):
            actions.append(.cancelTimer(.retry))
            actions += startHandshake(purpose: r.connectedBefore ? .restore : .connect, resume: timetoken ?? r.cursor?.timetoken,
                                      last: r.cursor, outage: r.outage)
        case .waitingForNetwork(let p), .disconnected(let p), .background(let p):
            actions += startHandshake(purpose: p.connectedBefore ? .restore : .connect, resume: timetoken ?? p.cursor?.timetoken,
                                      last: p.cursor, outage: nil)
        case .resuming(let r):
            actions += startHandshake(purpose: r.connectedBefore ? .restore : .connect, resume: timetoken ?? r.cursor?.timetoken,
                                      last: r.cursor, outage: nil)
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
            actions += giveUp(cursor: r.cursor, connectedBefore: r.connectedBefore, cause: nil, byApp: true)
            return actions + connectionChange(from: before)
        case .handshaking(let h) where h.outage?.episode == episode:
            var actions: [Action] = [.cancelSubscribe]
            let connectedBefore = h.handshake.connectedBefore
            actions += giveUp(cursor: h.handshake.last, connectedBefore: connectedBefore, cause: nil, byApp: true)
            return actions + connectionChange(from: before)
        case .waitingForNetwork(let p) where p.outage?.episode == episode, .background(let p) where p.outage?.episode == episode:
            // The outage waits for the network (or the foreground): what it would retry then is
            // what the app cancelled.
            let actions = giveUp(cursor: p.cursor, connectedBefore: p.connectedBefore, cause: nil, byApp: true)
            return actions + connectionChange(from: before)
        case .stopped(var s) where (s.episode ?? s.outage?.episode) == episode && (s.afterwards == .probeTime || s.restartsOnNetworkUp):
            // Already given up, still probing to restart on its own: the app says not to.
            s.afterwards = .waitForApp
            s.restartsOnNetworkUp = false
            state = .stopped(s)
            return [.cancelTimer(.timeProbe)] + connectionChange(from: before)
        case .idle, .handshaking, .receiving, .retrying, .waitingForNetwork, .stopped, .disconnected, .background, .resuming:
            return []
        }
    }

    // MARK: Events — subscribe results

    /// A subscribe request answered 200.
    package mutating func subscribeSucceeded(_ id: RequestID, response: SubscribeResponse, gaps: [RetentionGap] = [],
                                            now: Duration) -> [Action] {
        let before = connectionState
        switch state {
        case .handshaking(var h):
            guard let established = h.handshake.succeeded(id, response: response) else { return [] }
            var actions: [Action] = [.cancelTimer(.longPollWatchdog)]
            switch established.announcement {
            case .connected(let last):
                actions.append(report(.connected(last: last, current: established.cursor.timetoken)))
            case .reconnected(let last):
                actions.append(report(.reconnected(last: last, current: established.cursor.timetoken)))
                lastRecovery = now
            case .nothing:
                break
            }
            let (heartbeat, startHeartbeat) = HeartbeatMachine.start(configuration)
            let loop: LongPollLoop
            let receive: [ReceiveAction]
            let skipped = pendingSkip
            if let skip = skipped {
                // The foreground chose not to replay: say what was skipped, per channel — through
                // the counted cursor (the subscription resumed there), else the handshake's.
                pendingSkip = nil
                actions.append(.continuity(channels.filter { !NameRules.isPresence($0) && !$0.hasSuffix(".*") }.map {
                    ChannelContinuity(channel: $0, outcome: .skipped(through: skip.through ?? established.cursor.timetoken,
                                                                     count: skip.counts?[$0]),
                                      resumedFrom: skip.from)
                }))
            }
            switch established.continuation {
            case .catchUp(let resume, let server):
                let plain = channels.filter { !NameRules.isPresence($0) && !$0.hasSuffix(".*") }
                let planner = interruptedCatchUp.map { $0.continued(upTo: server, channels: plain) }
                    ?? CatchUpPlanner(channels: plain, resumedFrom: resume, upTo: server, pageSize: configuration.catchUpPageSize,
                                      filtered: configuration.filtered)
                interruptedCatchUp = nil
                switch configuration.backfill {
                case .onEveryReconnect where !plain.isEmpty:
                    let ranges = plain.map { BackfillRange(channel: $0, after: resume, through: server) }
                    let (backfilling, backfill) = LongPollLoop.backfilling(from: established.cursor, catchUp: planner, ranges: ranges,
                                                                           ids: &requestIDs)
                    actions += perform(backfill)
                    actions += perform(startHeartbeat, failure: nil)
                    state = .receiving(Receiving(loop: .longPoll(backfilling), heartbeat: heartbeat))
                    return actions + connectionChange(from: before)
                case .never, .onGap, .onEveryReconnect:
                    (loop, receive) = LongPollLoop.polling(from: established.cursor, catchUp: planner, ids: &requestIDs)
                }
            case .continuous(let resume):
                if let earlier = interruptedCatchUp {
                    // The catch-up an outage cut short had reached the server's cursor: its
                    // outcomes are the ones to report.
                    interruptedCatchUp = nil
                    if skipped == nil { actions.append(.continuity(earlier.outcomes())) }
                } else if skipped == nil {
                    actions.append(.continuity(channels.filter { !NameRules.isPresence($0) }.map {
                        ChannelContinuity(channel: $0, outcome: .continuous, resumedFrom: resume)
                    }))
                }
                (loop, receive) = LongPollLoop.polling(from: established.cursor, catchUp: nil, ids: &requestIDs)
            case .live:
                // Not resumed from a cursor: what a catch-up cut short had found is still told.
                if let earlier = interruptedCatchUp, skipped == nil { actions.append(.continuity(earlier.outcomes())) }
                interruptedCatchUp = nil
                (loop, receive) = LongPollLoop.polling(from: established.cursor, catchUp: nil, ids: &requestIDs)
            }
            actions += perform(startHeartbeat, failure: nil)
            actions += perform(receive)
            state = .receiving(Receiving(loop: .longPoll(loop), heartbeat: heartbeat))
            return actions + connectionChange(from: before)
        case .receiving(var r):
            switch r.loop {
            case .longPoll(var loop):
                let receive = loop.pollSucceeded(id, response: response, gaps: gaps, watermarks: &watermarks, settings: receiveSettings,
                                                 ids: &requestIDs)
                r.loop = .longPoll(loop)
                state = .receiving(r)
                return perform(receive)
            }
        case .idle, .retrying, .waitingForNetwork, .stopped, .disconnected, .background, .resuming:
            return []
        }
    }

    /// A subscribe request failed (already classified). `randomness` in `0...1` picks the jitter.
    ///
    /// - Parameter destination: where the next attempt goes: ``RetryMachine/Destination/anotherOrigin``
    ///   when the failure moved the client to a fallback origin not yet tried (it goes at once).
    package mutating func subscribeFailed(_ id: RequestID, status: Status, now: Duration, randomness: Double,
                                          destination: RetryMachine.Destination = .sameOrigin) -> [Action] {
        if status.category == .cancelled { return [] }
        switch state {
        case .handshaking(var h):
            guard h.handshake.failed(id) else { return [] }
            return failure(status, cursor: h.handshake.cursor, connectedBefore: h.handshake.connectedBefore, outage: h.outage, now: now,
                           randomness: randomness, destination: destination)
        case .receiving(let r):
            guard r.loop.pollRequest == id else { return [] }
            return [.cancelTimer(.liveness), .cancelTimer(.longPollWatchdog)]
                + failure(status, cursor: r.loop.cursor, connectedBefore: true, outage: nil, now: now, randomness: randomness,
                          destination: destination)
        case .idle, .retrying, .waitingForNetwork, .stopped, .disconnected, .background, .resuming:
            return []
        }
    }

    /// History for a backfill arrived (events oldest first, any channels).
    package mutating func backfillCompleted(_ id: RequestID, events: [ReceivedEvent], now: Duration) -> [Action] {
        guard case .receiving(var r) = state else { return [] }
        let receive = r.loop.backfillCompleted(id, events: events, watermarks: &watermarks, settings: receiveSettings, ids: &requestIDs)
        state = .receiving(r)
        return perform(receive)
    }

    /// A backfill failed: the app is told (the history request's status), what the server sent
    /// is delivered, and the gap stays reported.
    package mutating func backfillFailed(_ id: RequestID, status: Status, now: Duration) -> [Action] {
        let actions = backfillCompleted(id, events: [], now: now)
        // Only the running backfill's failure (a stale one completes nothing).
        guard !actions.isEmpty, status.category != .cancelled else { return actions }
        return [report(.backfillFailed(status))] + actions
    }

    // MARK: Events — timers and probes

    /// A timer the machine scheduled fired.
    package mutating func timerFired(_ timer: TimerID, now: Duration, randomness: Double) -> [Action] {
        let before = connectionState
        // Seed 001: retries and Time probing pause in the background; the foreground resumes.
        if inBackground && (timer == .retry || timer == .timeProbe) { return [] }
        switch (timer, state) {
        case (.retry, .retrying(let r)):
            let actions = startHandshake(purpose: r.connectedBefore ? .restore : .connect,
                                         resume: resumePoint(r.cursor, connectedBefore: r.connectedBefore), last: r.cursor, outage: r.outage)
            return actions + connectionChange(from: before)
        case (.timeProbe, .stopped(let s)) where s.afterwards == .probeTime:
            return [.probeTime]
        case (.liveness, .receiving(let r)):
            return perform(r.heartbeat.timerFired(), failure: nil)
        case (.longPollWatchdog, .handshaking(let h)):
            guard let id = h.handshake.request else { return [] }
            let status = Status.subscribeDeadlinePassed("the handshake outlived its deadline", channels: channels, groups: groups)
            return [.cancelSubscribe] + subscribeFailed(id, status: status, now: now, randomness: randomness)
        case (.longPollWatchdog, .receiving(let r)):
            guard let id = r.loop.pollRequest else { return [] }
            let status = Status.subscribeDeadlinePassed("the long-poll outlived its deadline", channels: channels, groups: groups)
            return [.cancelSubscribe] + subscribeFailed(id, status: status, now: now, randomness: randomness)
        case (.retry, _), (.timeProbe, _), (.liveness, _), (.longPollWatchdog, _):
            return []
        }
    }

    /// A Time API probe answered: restore the subscription (seed 001).
    package mutating func timeProbeSucceeded(now: Duration) -> [Action] {
        let before = connectionState
        guard !inBackground, case .stopped(let s) = state, s.afterwards == .probeTime else { return [] }
        return resume(from: s) + connectionChange(from: before)
    }

    /// A Time API probe failed: probe again later.
    package mutating func timeProbeFailed(now: Duration) -> [Action] {
        guard case .stopped(let s) = state, s.afterwards == .probeTime else { return [] }
        return [.schedule(.timeProbe, after: configuration.timeProbeInterval)]
    }

    /// A liveness probe (heartbeat or Time) answered. `checkedSubscribeConnection` says whether
    /// it went over the subscription's own connection (a WebSocket ping). A probe over another
    /// connection (REST) proves the path, not the long-poll's socket, which a NAT or a middlebox
    /// may have dropped silently: a long-poll that has waited through two such probes is
    /// restarted from its cursor, so a dead socket is noticed within about two probe intervals
    /// (nothing is lost: the server replays from the cursor).
    package mutating func livenessProbeSucceeded(now: Duration, checkedSubscribeConnection: Bool = true) -> [Action] {
        guard case .receiving(var r) = state else { return [] }
        let heartbeat = r.heartbeat.probeSucceeded()
        var actions = perform(heartbeat, failure: nil)
        if !checkedSubscribeConnection, let poll = r.loop.pollRequest {
            r.probesDuringPoll = r.probesDuringPoll.poll == poll ? (poll, r.probesDuringPoll.count + 1) : (poll, 1)
            if r.probesDuringPoll.count >= 2 {
                r.probesDuringPoll = (nil, 0)
                actions += [.cancelSubscribe, .cancelTimer(.longPollWatchdog)]
                actions += perform(r.loop.restart(from: nil, settings: receiveSettings, ids: &requestIDs))
            }
        }
        state = .receiving(r)
        return actions
    }

    /// A liveness probe failed: a dead link (seed 001's broken pipe) restarts the loop at once.
    package mutating func livenessProbeFailed(status: Status, now: Duration, randomness: Double) -> [Action] {
        let before = connectionState
        guard case .receiving(var r) = state else { return [] }
        let heartbeat = r.heartbeat.probeFailed()
        guard heartbeat.contains(.declareDead) else {
            state = .receiving(r)
            return perform(heartbeat, failure: status)
        }
        let cursor = r.loop.cursor
        let outage = RetryMachine(episode: makeEpisode(), start: now)
        var actions = perform(heartbeat.filter { $0 != .declareDead }, failure: status)
        actions += [.cancelSubscribe, .cancelTimer(.liveness), .cancelTimer(.longPollWatchdog)]
        actions.append(report(.failure(.unexpectedDisconnect, cause: status, last: cursor.timetoken), retryEpisode: outage.episode))
        actions += startHandshake(purpose: .restore, resume: resumePoint(cursor, connectedBefore: true), last: cursor, outage: outage)
        return actions + connectionChange(from: before)
    }

    // MARK: Events — app lifecycle

    /// The app went to the background. With ``BackgroundPolicy/keep`` the loop goes on, but
    /// retries and Time probes pause (seed 001); with ``BackgroundPolicy/disconnect`` or
    /// ``BackgroundPolicy/suspend(keepAlive:keepPresence:)`` the connection is let go and the cursor kept. A
    /// loop stopped for good (the app cancelled its retries, or a fatal error) stays stopped.
    package mutating func enterBackground(now: Duration) -> [Action] {
        guard !inBackground else { return [] }
        inBackground = true
        let before = connectionState
        let policy = configuration.lifecycle.backgroundPolicy
        switch policy {
        case .keep:
            switch state {
            case .retrying: return [.cancelTimer(.retry)]
            case .stopped: return [.cancelTimer(.timeProbe)]
            case .idle, .handshaking, .receiving, .waitingForNetwork, .disconnected, .background, .resuming: return []
            }
        case .disconnect, .suspend:
            switch state {
            case .idle, .disconnected, .background:
                return []
            case .stopped(let s) where !(s.afterwards == .probeTime || s.restartsOnNetworkUp):
                return []
            case .handshaking, .receiving, .retrying, .waitingForNetwork, .stopped, .resuming:
                let saved = cursor
                let connectedBefore = wasConnected
                keptProbe = nil
                var actions = stopEverything()
                actions.append(.releaseConnection(policy, channels: channels.filter { !NameRules.isPresence($0) }, groups: groups))
                state = .background(Paused(cursor: saved, connectedBefore: connectedBefore, outage: nil))
                return actions + connectionChange(from: before)
            }
        }
    }

    /// The app came back to the foreground: probe before trusting (Diffusion), reset the back-off,
    /// and resume — the kept session, or a subscription from the cursor — catching up as
    /// ``LifecycleOptions/foregroundCatchUp`` says. A kept long-poll restarts from its cursor
    /// (its socket may have died unnoticed) while the probe runs.
    ///
    /// `probeCoversSubscription`: the probe will go over the subscription's own connection (a
    /// WebSocket ping), so the kept receive is not restarted.
    package mutating func enterForeground(now: Duration, probeCoversSubscription: Bool = false) -> [Action] {
        guard inBackground else { return [] }
        inBackground = false
        let before = connectionState
        switch state {
        case .background(let p):
            return foregroundResume(cursor: p.cursor, connectedBefore: p.connectedBefore) + connectionChange(from: before)
        case .retrying(let r):
            return [.cancelTimer(.retry)] + foregroundResume(cursor: r.cursor, connectedBefore: r.connectedBefore)
                + connectionChange(from: before)
        case .stopped(let s) where s.afterwards == .probeTime || s.restartsOnNetworkUp:
            return [.cancelTimer(.timeProbe)] + foregroundResume(cursor: s.cursor, connectedBefore: s.connectedBefore)
                + connectionChange(from: before)
        case .receiving(var r):
            let id = requestIDs.next()
            keptProbe = id
            var actions: [Action] = [.probeForeground(id, counting: [:], timeout: configuration.lifecycle.foregroundProbeTimeout)]
            if r.loop.pollRequest != nil && !probeCoversSubscription {
                actions += [.cancelSubscribe, .cancelTimer(.longPollWatchdog)]
                actions += perform(r.loop.restart(from: nil, settings: receiveSettings, ids: &requestIDs))
                state = .receiving(r)
            }
            return actions
        case .waitingForNetwork(let p) where !network.isDown:
            // The network came back while in the background, where nothing connects.
            return foregroundResume(cursor: p.cursor, connectedBefore: p.connectedBefore) + connectionChange(from: before)
        case .idle, .handshaking, .waitingForNetwork, .stopped, .disconnected, .resuming:
            return []
        }
    }

    /// The foreground probe answered (`counts`: the `message-counts` answer when it counted;
    /// `countedThrough`: the cursor those counts go through, when the server said).
    package mutating func foregroundProbeSucceeded(_ id: RequestID, counts: [String: Int]?, countedThrough: Timetoken? = nil,
                                                   now: Duration) -> [Action] {
        let before = connectionState
        switch state {
        case .resuming(let r) where r.probe == id:
            if let counts {
                pendingSkip?.counts = counts
                // Resume from where the counts end: a message published between the count and
                // the new subscription is delivered, not lost between the two.
                if let countedThrough, let from = pendingSkip?.from, countedThrough >= from { pendingSkip?.through = countedThrough }
            }
            let resume = pendingSkip.map(\.through) ?? resumePoint(r.cursor, connectedBefore: r.connectedBefore)
            return startHandshake(purpose: r.connectedBefore ? .restore : .connect, resume: resume, last: r.cursor, outage: nil)
                + connectionChange(from: before)
        case .receiving where keptProbe == id:
            keptProbe = nil
            return []
        case .idle, .handshaking, .receiving, .retrying, .waitingForNetwork, .stopped, .disconnected, .background, .resuming:
            return []
        }
    }

    /// The foreground probe failed or timed out: the link is down. A fresh outage begins (the
    /// back-off starts over) with its retry schedule; a kept connection is declared dead.
    package mutating func foregroundProbeFailed(_ id: RequestID, status: Status, now: Duration, randomness: Double) -> [Action] {
        let before = connectionState
        switch state {
        case .resuming(let r) where r.probe == id:
            return failure(status, cursor: pendingSkip == nil ? r.cursor : nil, connectedBefore: r.connectedBefore, outage: nil,
                           now: now, randomness: randomness)
        case .receiving(let r) where keptProbe == id:
            keptProbe = nil
            let cursor = r.loop.cursor
            let outage = RetryMachine(episode: makeEpisode(), start: now)
            var actions: [Action] = [.cancelSubscribe, .cancelTimer(.liveness), .cancelTimer(.longPollWatchdog)]
            actions.append(report(.failure(.unexpectedDisconnect, cause: status, last: cursor.timetoken), retryEpisode: outage.episode))
            actions += startHandshake(purpose: .restore, resume: resumePoint(cursor, connectedBefore: true), last: cursor, outage: outage)
            return actions + connectionChange(from: before)
        case .idle, .handshaking, .receiving, .retrying, .waitingForNetwork, .stopped, .disconnected, .background, .resuming:
            return []
        }
    }

    /// Whether the app said it is in the background.
    package var isInBackground: Bool { inBackground }

    /// Re-establishes after the foreground: the probe first (counting what is skipped when the
    /// catch-up mode skips), or waiting for the network when it is down.
    private mutating func foregroundResume(cursor: Cursor?, connectedBefore: Bool) -> [Action] {
        let mode = configuration.lifecycle.foregroundCatchUp
        var counting: [String: Timetoken] = [:]
        pendingSkip = nil
        if mode != .everything, connectedBefore, let from = cursor?.timetoken {
            pendingSkip = PendingSkip(from: from, counts: nil)
            if mode == .unreadCounts {
                for channel in channels where !NameRules.isPresence(channel) && !channel.hasSuffix(".*") { counting[channel] = from }
            }
        }
        if network.isDown {
            state = .waitingForNetwork(Paused(cursor: pendingSkip == nil ? cursor : nil, connectedBefore: connectedBefore, outage: nil))
            return []
        }
        let id = requestIDs.next()
        state = .resuming(Resuming(cursor: cursor, connectedBefore: connectedBefore, probe: id))
        return [.probeForeground(id, counting: counting, timeout: configuration.lifecycle.foregroundProbeTimeout)]
    }

    // MARK: Events — network

    /// The network monitor reports no usable network: stop pointless retries.
    package mutating func networkDown(now: Duration) -> [Action] {
        let before = connectionState
        switch network.down() {
        case .wentDown: break
        case .unchanged, .cameBack, .pathChanged: return []
        }
        var actions: [Action] = [report(.networkDown)]
        switch state {
        case .idle, .disconnected, .waitingForNetwork, .background:
            return actions
        case .resuming(let r):
            state = .waitingForNetwork(Paused(cursor: pendingSkip == nil ? r.cursor : nil, connectedBefore: r.connectedBefore, outage: nil))
            return actions + connectionChange(from: before)
        case .stopped(let s):
            guard s.afterwards == .probeTime || s.restartsOnNetworkUp else { return actions }
            actions.append(.cancelTimer(.timeProbe))
            state = .waitingForNetwork(Paused(cursor: s.cursor, connectedBefore: s.connectedBefore,
                                              outage: s.reason == .accessDenied ? s.outage : nil))
            return actions + connectionChange(from: before)
        case .handshaking, .receiving, .retrying:
            let saved = cursor
            let connectedBefore = wasConnected
            let outage = currentOutage
            actions += stopEverything()
            if connectedBefore && !configuration.restoreSubscription {
                // Seed 001: with `restoreSubscription` off, a network failure clears the channel
                // list, and the network coming back does nothing; the app subscribes again.
                channels = []
                groups = []
                state = .idle
                return actions + connectionChange(from: before)
            }
            state = .waitingForNetwork(Paused(cursor: saved, connectedBefore: connectedBefore, outage: outage))
            return actions + connectionChange(from: before)
        }
    }

    /// The network monitor reports the network back: one immediate attempt, then the policy resumes.
    package mutating func networkUp(now: Duration) -> [Action] {
        switch network.up() {
        case .cameBack: return networkCameBack()
        case .unchanged, .wentDown, .pathChanged: return []
        }
    }

    /// The network monitor reports that the path changed while staying usable (Wi-Fi → cellular,
    /// an interface gone while another remains): requests in flight may sit on a dead path
    /// with no error to come, so the long-poll restarts at once from its cursor over the new
    /// path (no status: nothing was lost), a running handshake is re-sent, and a scheduled retry
    /// runs now. From down, this is ``networkUp(now:)``.
    package mutating func networkChanged(now: Duration) -> [Action] {
        switch network.changed() {
        case .pathChanged: break
        case .cameBack: return networkCameBack()
        case .unchanged, .wentDown: return []
        }
        let before = connectionState
        switch state {
        case .receiving(var r):
            guard r.loop.pollRequest != nil else { return [] }
            var actions: [Action] = [.cancelSubscribe, .cancelTimer(.longPollWatchdog)]
            actions += perform(r.loop.restart(from: nil, settings: receiveSettings, ids: &requestIDs))
            state = .receiving(r)
            return actions
        case .handshaking(let h):
            return [.cancelSubscribe, .cancelTimer(.longPollWatchdog)]
                + startHandshake(purpose: h.handshake.purpose, resume: h.handshake.resume, last: h.handshake.last, outage: h.outage)
                + connectionChange(from: before)
        case .retrying(let r):
            // In the background nothing connects on its own (the retries wait for the
            // foreground). The server's Retry-After still holds on the new path; and a flapping
            // interface list must not turn back-off into a tight loop (one early attempt per
            // second at most).
            if inBackground || r.outage.honorsRetryAfter { return [] }
            switch network.claimEarlyAttempt(now: now) {
            case .allowed: break
            case .tooSoon: return []
            }
            return [.cancelTimer(.retry)]
                + startHandshake(purpose: r.connectedBefore ? .restore : .connect,
                                 resume: resumePoint(r.cursor, connectedBefore: r.connectedBefore), last: r.cursor, outage: r.outage)
                + connectionChange(from: before)
        case .stopped(let s) where !inBackground && (s.afterwards == .probeTime || s.restartsOnNetworkUp):
            return [.cancelTimer(.timeProbe)] + resume(from: s) + connectionChange(from: before)
        case .idle, .stopped, .waitingForNetwork, .disconnected, .background, .resuming:
            return []
        }
    }

    /// The network is back after being down: one immediate attempt.
    private mutating func networkCameBack() -> [Action] {
        let before = connectionState
        var actions: [Action] = [report(.networkUp)]
        // In the background nothing connects on its own; the foreground does.
        if inBackground { return actions }
        switch state {
        case .waitingForNetwork(let p):
            actions += startHandshake(purpose: p.connectedBefore ? .restore : .connect,
                                      resume: resumePoint(p.cursor, connectedBefore: p.connectedBefore), last: p.cursor, outage: p.outage)
        case .retrying(let r):
            actions.append(.cancelTimer(.retry))
            actions += startHandshake(purpose: r.connectedBefore ? .restore : .connect,
                                      resume: resumePoint(r.cursor, connectedBefore: r.connectedBefore), last: r.cursor, outage: r.outage)
        case .stopped(let s) where s.afterwards == .probeTime || s.restartsOnNetworkUp:
            actions.append(.cancelTimer(.timeProbe))
            actions += resume(from: s)
        case .idle, .handshaking, .receiving, .stopped, .disconnected, .background, .resuming:
            break
        }
        return actions + connectionChange(from: before)
    }

    // MARK: Transition helpers

    /// A subscribe request failed: the outage's ``RetryMachine`` decides, the parent moves.
    private mutating func failure(_ status: Status, cursor: Cursor?, connectedBefore: Bool, outage existing: RetryMachine?, now: Duration,
                                  randomness: Double, destination: RetryMachine.Destination = .sameOrigin) -> [Action] {
        let before = connectionState
        let isNewOutage = existing == nil
        var outage = existing ?? RetryMachine(episode: makeEpisode(), start: now)
        let last = cursor?.timetoken
        let decision = outage.failed(status, retry: configuration.retry, now: now, randomness: randomness,
                                     recoveredAt: isNewOutage ? lastRecovery : nil, destination: destination)
        switch decision {
        case .stop:
            // Retrying cannot help (seed 002): report and stop.
            var actions: [Action] = [.cancelTimer(.retry), .cancelTimer(.longPollWatchdog)]
            actions.append(report(.failure(status.category, cause: status, last: last)))
            state = .stopped(Stopped(cursor: cursor, connectedBefore: connectedBefore, reason: status.category, afterwards: .waitForApp))
            return actions + connectionChange(from: before)
        case .accessDeniedExhausted(let notice, let recheck):
            var actions: [Action] = [.cancelTimer(.longPollWatchdog)]
            switch notice {
            case .report: actions.append(report(.failure(.accessDenied, cause: status, last: last)))
            case .quiet: break
            }
            let afterwards: Afterwards
            switch recheck {
            case .everyProbeInterval: afterwards = .probeTime
            case .never: afterwards = .waitForApp
            }
            state = .stopped(Stopped(cursor: cursor, connectedBefore: connectedBefore, reason: .accessDenied, afterwards: afterwards,
                                     outage: outage))
            if afterwards == .probeTime { actions.append(.schedule(.timeProbe, after: configuration.timeProbeInterval)) }
            return actions + connectionChange(from: before)
        case .retry(let delay):
            var actions: [Action] = [.cancelTimer(.longPollWatchdog)]
            if status.category == .accessDenied {
                // Every denial is reported: the app may be waiting for a grant to propagate.
                actions.append(report(.failure(.accessDenied, cause: status, last: last), retryEpisode: outage.episode))
            } else if isNewOutage {
                let category: StatusCategory = connectedBefore ? .unexpectedDisconnect : status.category
                actions.append(report(.failure(category, cause: status, last: last), retryEpisode: outage.episode))
            }
            state = .retrying(Retrying(cursor: cursor, connectedBefore: connectedBefore, outage: outage))
            actions.append(.schedule(.retry, after: delay))
            return actions + connectionChange(from: before)
        case .giveUp:
            var actions: [Action] = [.cancelTimer(.longPollWatchdog)]
            actions += giveUp(cursor: cursor, connectedBefore: connectedBefore, cause: status, episode: outage.episode)
            return actions + connectionChange(from: before)
        }
    }

    /// Gives up: `connectionError` before ever connecting, `disconnectedUnexpectedly` after; then
    /// probes the Time API (or forgets the subscription when `restoreSubscription` is off). A
    /// give-up the app asked for (`cancelAutomaticRetry()`) stays given up: no Time probe and no
    /// restart on network up undo it; `reconnect()` does. Otherwise a network that comes back
    /// restarts the subscription, also for a client that never connected.
    private mutating func giveUp(cursor: Cursor?, connectedBefore: Bool, cause: Status?, byApp: Bool = false,
                                 episode: Int? = nil) -> [Action] {
        let category: StatusCategory = connectedBefore ? .disconnectedUnexpectedly : .connectionError
        var actions: [Action] = []
        let last = cursor?.timetoken
        if let cause {
            actions.append(report(.failure(category, cause: cause, last: last)))
        } else {
            actions.append(report(.gaveUp(category, last: last)))
        }
        if connectedBefore && !configuration.restoreSubscription {
            channels = []
            groups = []
            state = .idle
            return actions
        }
        let afterwards: Afterwards = connectedBefore && !byApp ? .probeTime : .waitForApp
        state = .stopped(Stopped(cursor: cursor, connectedBefore: connectedBefore, reason: category, afterwards: afterwards,
                                 restartsOnNetworkUp: !byApp, episode: episode))
        if afterwards == .probeTime { actions.append(.schedule(.timeProbe, after: configuration.timeProbeInterval)) }
        return actions
    }

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
        case .handshaking(let h): return h.handshake.connectedBefore
        case .receiving: return true
        case .retrying(let r): return r.connectedBefore
        case .waitingForNetwork(let p), .disconnected(let p), .background(let p): return p.connectedBefore
        case .stopped(let s): return s.connectedBefore
        case .resuming(let r): return r.connectedBefore
        }
    }

    private var isQuietAccessRecheck: Bool {
        switch state {
        case .handshaking(let h): return h.outage?.isRecheckingAccess == true
        case .waitingForNetwork(let p): return p.outage?.isRecheckingAccess == true
        case .idle, .receiving, .retrying, .stopped, .disconnected, .background, .resuming: return false
        }
    }

    private var currentOutage: RetryMachine? {
        switch state {
        case .handshaking(let h): return h.outage
        case .retrying(let r): return r.outage
        case .waitingForNetwork(let p), .disconnected(let p), .background(let p): return p.outage
        case .idle, .receiving, .stopped, .resuming: return nil
        }
    }

    private func resumePoint(_ cursor: Cursor?, connectedBefore: Bool) -> Timetoken? {
        guard let cursor else { return nil }
        if connectedBefore && !configuration.catchUpOnSubscriptionRestore { return nil }
        return cursor.timetoken
    }

    private mutating func makeEpisode() -> Int {
        nextEpisode += 1
        return nextEpisode
    }

    private mutating func startHandshake(purpose: HandshakeMachine.Purpose, resume: Timetoken?, last: Cursor?,
                                         outage: RetryMachine?) -> [Action] {
        let id = requestIDs.next()
        state = .handshaking(Handshaking(handshake: HandshakeMachine(request: id, purpose: purpose, resume: resume, last: last),
                                         outage: outage))
        return [.startSubscribe(id, channels: channels, groups: groups, cursor: nil),
                .schedule(.longPollWatchdog, after: configuration.longPollWatchdog)]
    }

    /// Keeps the catch-up of a receiving loop that the machine leaves (``interruptedCatchUp``);
    /// forgets it when the subscription ends.
    private mutating func noteCatchUp(leaving old: State) {
        switch state {
        case .idle:
            interruptedCatchUp = nil
        case .receiving:
            break
        case .handshaking, .retrying, .waitingForNetwork, .stopped, .disconnected, .background, .resuming:
            // (A loop that continued an earlier interrupted catch-up carries it: entering
            // `receiving` always takes ``interruptedCatchUp``.)
            guard case .receiving(let r) = old, let planner = r.loop.catchUp else { return }
            interruptedCatchUp = planner
        }
    }

    private func stopEverything() -> [Action] {
        [.cancelSubscribe] + TimerID.allCases.map { .cancelTimer($0) }
    }

    /// The change of connection state, with its reconnect event. The events are derived here, in
    /// one place, so they pair strictly: `started` when a client that had connected begins to
    /// reconnect (a dropped link, the network gone, a restore after a give-up or a `reconnect()`),
    /// then exactly one `succeeded` (connected again) or `failed` (gave up, stopped, disconnected
    /// or unsubscribed) — never two `started` in a row, never an end without a start.
    private mutating func connectionChange(from before: ConnectionState) -> [Action] {
        let after = connectionState
        var event: ReconnectEvent?
        switch after {
        case .reconnecting, .waitingForNetwork:
            // A quiet re-check of access after the retries ran out is not a reconnection.
            if !reconnectCycleOpen && wasConnected && !isQuietAccessRecheck { event = .started }
        case .connected:
            if reconnectCycleOpen { event = .succeeded }
        case .idle, .connecting, .failed, .disconnected:
            if reconnectCycleOpen { event = .failed }
        case .background:
            // Neither an outage nor its end: the foreground continues (or starts) the cycle.
            break
        }
        switch event {
        case .started?: reconnectCycleOpen = true
        case .succeeded?, .failed?: reconnectCycleOpen = false
        case nil: break
        }
        guard after != before || event != nil else { return [] }
        return [.connectionChanged(ConnectionChange(previous: before, current: after, reconnectEvent: event))]
    }

    private func report(_ event: SubscribeReport.Event, retryEpisode: Int? = nil) -> Action {
        .report(SubscribeReport(event, channels: channels, groups: groups, retryEpisode: retryEpisode))
    }

    // MARK: Children's actions

    /// The receive child's actions, in the shell's vocabulary.
    private func perform(_ receive: [ReceiveAction]) -> [Action] {
        var actions: [Action] = []
        for action in receive {
            switch action {
            case .poll(let id, let cursor):
                actions.append(.startSubscribe(id, channels: channels, groups: groups, cursor: cursor))
                actions.append(.schedule(.longPollWatchdog, after: configuration.longPollWatchdog))
            case .cancelWatchdog:
                actions.append(.cancelTimer(.longPollWatchdog))
            case .deliver(let events):
                actions.append(.deliver(events))
            case .decryptionFailed(let status):
                actions.append(report(.decryptionFailed(status)))
            case .messageCountExceeded(let count, let threshold, let last, let current):
                actions.append(report(.messageCountExceeded(count: count, threshold: threshold, last: last, current: current)))
            case .continuity(let outcomes):
                actions.append(.continuity(outcomes))
            case .backfill(let id, let ranges):
                actions.append(.backfill(id, ranges))
            }
        }
        return actions
    }

    /// The heartbeat child's actions (but the dead-link verdict, which the caller handles), in the
    /// shell's vocabulary; `failure` is the failed probe's status, for its report.
    private func perform(_ heartbeat: [HeartbeatMachine.Action], failure: Status?) -> [Action] {
        var actions: [Action] = []
        for action in heartbeat {
            switch action {
            case .schedule(let delay):
                actions.append(.schedule(.liveness, after: delay))
            case .probe(let probe, let timeout):
                let presence: Bool
                switch probe {
                case .presenceHeartbeat: presence = true
                case .time: presence = false
                }
                actions.append(.probeLiveness(presence: presence, channels: channels.filter { !NameRules.isPresence($0) }, groups: groups,
                                              timeout: timeout))
            case .reportSuccess:
                actions.append(report(.heartbeatSucceeded))
            case .reportFailure:
                if let failure { actions.append(report(.heartbeatFailed(failure))) }
            case .declareDead:
                break
            }
        }
        return actions
    }
}
