import Logging
import Synchronization
import TetherClientCore
import TetherProtocol

/// The shell around ``SubscribeMachine``: lock, transition, unlock, then act (STYLE.md §4).
///
/// Inputs (app calls, request results, timer firings, network changes) transition the machine
/// under a `Mutex` and enqueue its actions, in order, on one stream. ``run(client:)`` owns a
/// discarding task group: it performs the actions one by one — requests and timers become
/// cancellable child tasks, statuses and events go to listeners — so listeners see everything in
/// order, outside any lock.
final class SubscribeEngine: Sendable {
    private let machine: Mutex<SubscribeMachine>
    private let actions: AsyncStream<[SubscribeMachine.Action]>
    private let actionSink: AsyncStream<[SubscribeMachine.Action]>.Continuation
    private let clock: ElapsedClock
    private let monitor: (any NetworkMonitor)?
    private let slots = CancellationSlots<SubscribeSlot>()
    let listeners = ListenerRegistry()
    private let logger: Logger
    private let chores: AsyncStream<@Sendable () async -> Void>
    private let choreSink: AsyncStream<@Sendable () async -> Void>.Continuation

    init(configuration: SubscribeMachine.Configuration, clock: ElapsedClock, monitor: (any NetworkMonitor)?, logger: Logger) {
        machine = Mutex(SubscribeMachine(configuration: configuration))
        (actions, actionSink) = AsyncStream.makeStream(of: [SubscribeMachine.Action].self)
        self.clock = clock
        self.monitor = monitor
        self.logger = logger
        (chores, choreSink) = AsyncStream.makeStream(of: (@Sendable () async -> Void).self)
    }

    /// Runs `work` as a child of ``run(client:)`` (cancelled when the engine stops).
    func spawn(_ work: @escaping @Sendable () async -> Void) { choreSink.yield(work) }

    /// Applies one input to the machine and enqueues its actions (inside the lock, so the order of
    /// actions is the order of transitions).
    ///
    /// The enqueue may resume the engine's loop while the machine's lock is held, so no task
    /// cancellation handler, and no stream termination handler, may ever take this lock: the
    /// runtime runs those holding a task's status lock, which that resume needs (the deadlock
    /// fixed in ``WebSocketSession``'s receive was this shape).
    func send(_ input: (inout SubscribeMachine, Duration) -> [SubscribeMachine.Action]) {
        let now = clock.now()
        machine.withLock { machine in
            let produced = input(&machine, now)
            if !produced.isEmpty { actionSink.yield(produced) }
        }
    }

    /// Reads the machine.
    func read<T>(_ body: (borrowing SubscribeMachine) -> T) -> T {
        machine.withLock { body($0) }
    }

    /// Stops accepting actions; `run` returns once the queue is drained.
    func finish() {
        actionSink.finish()
        choreSink.finish()
    }

    /// Performs actions until ``finish()`` or cancellation. The client is held weakly (`owner`):
    /// each request holds it only while it runs, and a WebSocket receive — which may wait for
    /// a message indefinitely — not at all, so a client the app released is freed.
    func run(owner: WeakClient, session: WebSocketSession) async {
        await withDiscardingTaskGroup { group in
            group.addTask { await session.run() }
            group.addTask { [chores] in
                await withDiscardingTaskGroup { choresGroup in
                    for await chore in chores { choresGroup.addTask { await chore() } }
                }
            }
            if let monitor {
                group.addTask { [self] in
                    for await path in monitor.pathUpdates() {
                        switch path {
                        case .up:
                            // Failures while the device had no network said nothing about the nodes.
                            owner.client?.origins.networkChanged()
                            send { machine, now in machine.networkUp(now: now) }
                        case .down: send { machine, now in machine.networkDown(now: now) }
                        case .changed:
                            owner.client?.origins.networkChanged()
                            send { machine, now in machine.networkChanged(now: now) }
                        }
                    }
                }
            }
            for await batch in actions {
                for action in batch { perform(action, owner: owner, session: session, group: &group) }
            }
            group.cancelAll()
        }
        slots.cancelAll()
    }

    private func random() -> Double { Double.random(in: 0...1) }

    /// A probe of the session's socket failed: the socket is given up in the same transition
    /// that reacts to the failure (``WebSocketSession/detachSocket()``), so the reconnection it
    /// starts opens a new socket and the receive that waited on the dead one fails as a stale
    /// request — not as a second failure racing the probe's, whose retry policy could delay the
    /// reconnection the probe starts at once.
    ///
    /// The socket is given up only when the machine gives the connection up (its actions cancel
    /// the subscribe request): a failure it tolerates (a liveness failure limit above one) or
    /// ignores (a stale probe) leaves the socket, and its receive, as they are. A probe that was
    /// cancelled (replaced, or the engine stopping) is no failure at all.
    private func failedOverSocket(_ session: WebSocketSession,
                                  _ input: (inout SubscribeMachine, Duration) -> [SubscribeMachine.Action]) async {
        guard !Task.isCancelled else { return }
        var detached: WebSocketSession.DetachedSocket?
        send { machine, now in
            let actions = input(&machine, now)
            if actions.contains(where: { if case .cancelSubscribe = $0 { true } else { false } }) {
                detached = session.detachSocket()
            }
            return actions
        }
        await detached?.finish()
    }

    private func perform(_ action: SubscribeMachine.Action, owner: WeakClient, session: WebSocketSession, group: inout DiscardingTaskGroup) {
        logger.trace("subscribe action", metadata: ["tether.action": "\(action)"])
        switch action {
        case .startSubscribe(let id, let channels, let groups, let cursor):
            let token = slots.replace(.subscribe)
            // The replaced receive is cancelled later, by its task: the session knows now.
            let ticket = session.startReceive()
            group.addTask { [self] in
                await slots.race(.subscribe, token: token) { [self] in
                    do throws(TetherError) {
                        let (response, gaps) = try await TetherClient.receive(owner: owner, session: session, channels: channels,
                                                                              groups: groups, cursor: cursor, ticket: ticket)
                        send { machine, now in machine.subscribeSucceeded(id, response: response, gaps: gaps, now: now) }
                    } catch {
                        let status = error.status
                        logger.debug("subscribe failed", metadata: ["category": "\(status.category)",
                                                                    "error": "\(status.error.map { String(describing: $0) } ?? "-")"])
                        // A failure (or a drain) that moved the client to a fallback origin not yet
                        // tried: the next attempt goes there at once.
                        let moved = owner.client?.origins.failedOver(from: status.origin) == true
                        let destination: RetryMachine.Destination = moved ? .anotherOrigin : .sameOrigin
                        send { [self] machine, now in
                            machine.subscribeFailed(id, status: status, now: now, randomness: random(), destination: destination)
                        }
                    }
                }
            }
        case .cancelSubscribe:
            slots.cancel(.subscribe)
            // A backfill belongs to the loop being abandoned (its answer would be stale).
            slots.cancel(.backfill)
            session.endReceive()
        case .schedule(let timer, let delay):
            let slot = SubscribeSlot.timer(timer)
            let token = slots.replace(slot)
            group.addTask { [self] in
                await slots.race(slot, token: token) { [self] in
                    do { try await clock.sleep(delay) } catch { return }
                    guard slots.complete(slot, token: token) else { return }
                    send { [self] machine, now in machine.timerFired(timer, now: now, randomness: random()) }
                }
            }
        case .cancelTimer(let timer):
            slots.cancel(.timer(timer))
            // The probe the liveness timer started, if still out, belongs to the connection the
            // machine is done with: its answer must not count against the next one.
            if timer == .liveness { slots.cancel(.liveness) }
        case .report(let report):
            // The edge where the machine's typed report becomes the app's status.
            var delivered = Status(report)
            if let episode = report.retryEpisode {
                delivered = delivered.withAutomaticRetry(AutomaticRetryCancellation { [self] in
                    send { machine, now in machine.cancelAutomaticRetry(episode: episode, now: now) }
                })
            }
            listeners.emit(delivered)
        case .connectionChanged(let change):
            listeners.emit(change)
            switch change.current {
            case .idle, .disconnected:
                // The app ended the subscription: `bye` ends the WebSocket session (presence leave).
                // The session lets the socket go here, in the machine's order: a subscribe that
                // follows opens a new session, and the `bye` cannot end that one.
                let closing = session.beginClose(bye: true)
                group.addTask { await closing.finish() }
            case .connecting, .connected, .reconnecting, .waitingForNetwork, .failed, .background:
                // In the background `releaseConnection` already did what the policy says.
                break
            }
        case .deliver(let events):
            listeners.deliver(events)
        case .continuity(let outcomes):
            listeners.emit(outcomes)
        case .leave(let channels, let groups):
            // Over a WebSocket session, `unsubscribe` stops the deliveries and sends the leave. It
            // is queued here, in the machine's order, so a `subscribe` of the same names made
            // right after it is sent after it, not overtaken by it.
            let overSession = session.leave(channels: channels, groups: groups)
            group.addTask {
                if overSession {
                    await session.flushOutgoing()
                    return
                }
                guard let client = owner.client else { return }
                do { try await client.leave(channels: channels, groups: groups) } catch {
                    // A failed leave only delays the others' leave event until the presence timeout.
                }
            }
        case .probeTime:
            let token = slots.replace(.probe)
            group.addTask { [self] in
                await slots.race(.probe, token: token) { [self] in
                    guard let client = owner.client else { return }
                    do throws(TetherError) {
                        _ = try await client.time()
                        guard slots.complete(.probe, token: token) else { return }
                        send { machine, now in machine.timeProbeSucceeded(now: now) }
                    } catch {
                        // A probe cancelled or replaced answers for nothing.
                        guard slots.complete(.probe, token: token) else { return }
                        send { machine, now in machine.timeProbeFailed(now: now) }
                    }
                }
            }
        case .probeLiveness(let presence, let channels, let groups, let timeout):
            let token = slots.replace(.liveness)
            group.addTask { [self] in
                await slots.race(.liveness, token: token) { [self] in
                    guard let client = owner.client else { return }
                    let overSocket = client.session.isOpen && client.currentWire() == .webSocket
                    do throws(TetherError) {
                        if overSocket {
                            // The session keeps presence; a ping checks the socket itself. A
                            // socket that does not answer is given up, so the reconnection opens a
                            // new one and resumes the session (not the same dead socket).
                            do throws(TetherError) { _ = try await client.session.ping(timeout: timeout) } catch {
                                guard slots.complete(.liveness, token: token) else { return }
                                let status = error.status
                                await failedOverSocket(client.session) { machine, now in
                                    machine.livenessProbeFailed(status: status, now: now, randomness: random())
                                }
                                return
                            }
                        } else if presence && !(channels.isEmpty && groups.isEmpty) {
                            try await client.heartbeat(channels: channels, groups: groups, timeout: timeout)
                        } else {
                            _ = try await client.time(timeout: timeout)
                        }
                        guard slots.complete(.liveness, token: token) else { return }
                        send { machine, now in machine.livenessProbeSucceeded(now: now, checkedSubscribeConnection: overSocket) }
                    } catch {
                        // A probe cancelled with its connection answers for nothing.
                        guard slots.complete(.liveness, token: token) else { return }
                        let status = error.status
                        send { [self] machine, now in machine.livenessProbeFailed(status: status, now: now, randomness: random()) }
                    }
                }
            }
        case .releaseConnection(let policy, let channels, let groups):
            group.addTask {
                guard let client = owner.client else { return }
                switch policy {
                case .disconnect:
                    // SendBird's background disconnect / PubNub scenario 1's unsubscribe: others see
                    // the user leave. `bye` ends a WebSocket session (its presence leave included).
                    if client.session.holdsSession {
                        await client.session.close(bye: true)
                    } else if !(channels.isEmpty && groups.isEmpty) {
                        try? await client.leave(channels: channels, groups: groups)
                    }
                case .suspend(let keepAlive, let keepPresence):
                    if client.session.holdsSession {
                        await client.session.suspend(keepAlive: keepAlive, keepPresence: keepPresence,
                                                     push: client.backgroundPushDevice.withLock { $0 })
                    } else if !keepPresence && !(channels.isEmpty && groups.isEmpty) {
                        try? await client.leave(channels: channels, groups: groups)
                    }
                case .keep:
                    break
                }
            }
        case .probeForeground(let id, let counting, let timeout):
            let token = slots.replace(.foreground)
            group.addTask { [self] in
                await slots.race(.foreground, token: token) { [self] in
                    guard let client = owner.client else { return }
                    do throws(TetherError) {
                        var counts: [String: Int]?
                        var countedThrough: Timetoken?
                        if !counting.isEmpty {
                            // The count is the probe; a server that cannot count (no storage, no
                            // grant) still answered, so a Time request decides about the link.
                            do throws(TetherError) {
                                (counts, countedThrough) = try await client.messageCountsThrough(since: counting, timeout: timeout)
                            } catch {
                                _ = try await client.time(timeout: timeout)
                            }
                        } else if client.session.isOpen && client.currentWire() == .webSocket {
                            do throws(TetherError) { _ = try await client.session.ping(timeout: timeout) } catch {
                                let status = error.status
                                await failedOverSocket(client.session) { [self] machine, now in
                                    machine.foregroundProbeFailed(id, status: status, now: now, randomness: random())
                                }
                                return
                            }
                        } else {
                            _ = try await client.time(timeout: timeout)
                        }
                        let answered = counts, through = countedThrough
                        send { machine, now in machine.foregroundProbeSucceeded(id, counts: answered, countedThrough: through, now: now) }
                    } catch {
                        let status = error.status
                        send { [self] machine, now in machine.foregroundProbeFailed(id, status: status, now: now, randomness: random()) }
                    }
                }
            }
        case .backfill(let id, let ranges):
            let token = slots.replace(.backfill)
            group.addTask { [self] in
                await slots.race(.backfill, token: token) { [self] in
                    guard let client = owner.client else { return }
                    do throws(TetherError) {
                        var events: [ReceivedEvent] = []
                        for range in ranges {
                            let messages = try await client.messages(after: range.after, through: range.through, channel: range.channel)
                            events += messages.map(ReceivedEvent.init(history:))
                        }
                        let collected = events
                        send { machine, now in machine.backfillCompleted(id, events: collected, now: now) }
                    } catch {
                        let status = error.status
                        send { machine, now in machine.backfillFailed(id, status: status, now: now) }
                    }
                }
            }
        }
    }
}

extension ReceivedEvent {
    /// A history message as a received event (backfill).
    init(history message: HistoryMessage) {
        self.init(timetoken: message.timetoken, channel: message.channel, subscription: nil, payload: message.payload,
                  publisher: message.publisher, meta: message.meta, kind: message.messageType ?? .message,
                  customMessageType: message.customMessageType, decryptionError: message.decryptionError)
    }
}

/// The subscribe engine's cancellable child tasks.
enum SubscribeSlot: Hashable, Sendable {
    case subscribe
    case probe
    case liveness
    case foreground
    case backfill
    case timer(SubscribeMachine.TimerID)
}

/// Individually cancellable child tasks inside one task group: each runs its work racing a
/// per-slot cancellation stream; starting a slot again cancels the previous occupant.
final class CancellationSlots<Slot: Hashable & Sendable>: Sendable {
    private struct Occupant {
        var token: Int
        var cancel: AsyncStream<Void>.Continuation
        var stream: AsyncStream<Void>
    }

    private let state = Mutex<(next: Int, occupants: [Slot: Occupant])>((0, [:]))

    /// Cancels the slot's occupant and reserves the slot; returns the new occupant's token.
    func replace(_ slot: Slot) -> Int {
        let (stream, continuation) = AsyncStream.makeStream(of: Void.self)
        let (token, previous) = state.withLock { state -> (Int, Occupant?) in
            state.next += 1
            let previous = state.occupants[slot]
            state.occupants[slot] = Occupant(token: state.next, cancel: continuation, stream: stream)
            return (state.next, previous)
        }
        previous?.cancel.finish()
        return token
    }

    /// Cancels the slot's occupant.
    func cancel(_ slot: Slot) {
        let occupant = state.withLock { $0.occupants.removeValue(forKey: slot) }
        occupant?.cancel.finish()
    }

    /// Cancels everything.
    func cancelAll() {
        let all = state.withLock { state in
            defer { state.occupants = [:] }
            return Array(state.occupants.values)
        }
        for occupant in all { occupant.cancel.finish() }
    }

    /// Frees the slot if `token` still holds it; false when it was cancelled or replaced.
    func complete(_ slot: Slot, token: Int) -> Bool {
        state.withLock { state in
            guard state.occupants[slot]?.token == token else { return false }
            state.occupants[slot] = nil
            return true
        }
    }

    /// Runs `work` until it finishes or the slot's occupant `token` is cancelled.
    func race(_ slot: Slot, token: Int, _ work: @escaping @Sendable () async -> Void) async {
        guard let stream = state.withLock({ $0.occupants[slot]?.token == token ? $0.occupants[slot]?.stream : nil }) else { return }
        await withTaskGroup(of: Void.self) { race in
            race.addTask { await work() }
            race.addTask { for await _ in stream {} }
            await race.next()
            race.cancelAll()
        }
    }
}
