import Foundation
import Logging
import NIOCore
import NIOWebSocket
import Synchronization
@_spi(Benchmarks) import TetherProtocol
import TetherServerCore

/// What a WebSocket session is (the ``SessionTable``'s payload): who, what it subscribes to, and
/// where it is. Kept while the session is kept, so a resume needs no resubscribe.
struct SessionState: Sendable {
    var keyset: Keyset
    var uuid: String
    var auth: String?
    var publishKey: String?
    var channels: [String] = []
    var groups: [String] = []
    var filter: String?
    var states: [String: String] = [:]
    /// The last cursor delivered (zero before the first `subscribe`).
    var cursor: Timetoken = .zero
    var hasSubscribed = false
    /// The cursor a `hello` resumed with before the session's first `subscribe` (a subscribe the
    /// server refused, or one lost with the socket): the first `subscribe` without a cursor of
    /// its own starts there, not at the current cursor, so nothing after it is skipped.
    var resumedCursor: Timetoken?
    /// Suspended with `presence: false`: the uuid left; it joins again when the session resumes.
    var presenceSuspended = false
    /// Whether the session may act for its uuid (send its leaves, set its state): `hello` names a
    /// uuid nobody proves, so with a v3 token bound to no uuid or another one it may not
    /// (docs/security.md); set at `hello` and at every resume (whose `auth` may differ).
    var actsForUUID = true
    /// Raised whenever the subscription grows (names added, or another filter): a delivery round
    /// read before it may have passed messages the subscription now takes, so its page must not
    /// move the cursor (``WebSocketConnection``'s `finishRound`).
    var widenings: UInt64 = 0

    /// Rough bytes held, for the kept sessions' byte bound.
    var estimatedBytes: Int {
        var bytes = 256 + uuid.utf8.count + (auth?.utf8.count ?? 0) + (filter?.utf8.count ?? 0)
        for name in channels { bytes += 32 + name.utf8.count }
        for name in groups { bytes += 32 + name.utf8.count }
        for (channel, state) in states { bytes += 48 + channel.utf8.count + state.utf8.count }
        return bytes
    }

    var spec: SubscriptionSpec { SubscriptionSpec(subscribeKey: keyset.subscribeKey, names: channels, groups: groups) }

    /// Drops the presence state of names that are no longer the session's.
    mutating func forgetStates() {
        guard !states.isEmpty else { return }
        states = states.filter { channels.contains($0.key) || groups.contains($0.key) }
    }
}

/// The shell around the ``SessionTable``: a lock around the pure table, the open connections'
/// outbound queues, and the loop that runs the table's timers (pings, hello and keep-alive
/// deadlines, presence refreshes) on the server's injected clock. Lock, transition, unlock,
/// then act.
final class WebSocketSessions: Sendable {
    typealias Table = SessionTable<SessionState>

    /// What the sessions need to reach an open connection.
    struct Handle: Sendable {
        var queue: OutboundQueue
        var channel: any Channel
        var address: String { channel.remoteAddress?.ipAddress ?? "unknown" }
    }

    private struct Locked: Sendable {
        var table: Table
        var handles: [Table.ConnectionID: Handle] = [:]
        /// Upgrades accepted since the server started (tests).
        var accepted = 0
        var evictionsLogged = 0
    }

    let settings: WebSocketSettings
    private let locked: Mutex<Locked>
    private let presence: PresenceService
    /// Where a suspended session's deliveries are pushed (nil: no push).
    private let push: PushDispatcher?
    private let clock: ElapsedClock
    private let logger: Logger
    /// The console's flight recorder, when the console is on.
    private let console: AdminConsole?

    init(settings: WebSocketSettings, presence: PresenceService, push: PushDispatcher? = nil, clock: ElapsedClock, logger: Logger,
         console: AdminConsole? = nil) {
        self.console = console
        self.settings = settings
        self.push = push
        let configuration = Table.Configuration(
            keepAlive: .seconds(settings.keepAliveSeconds), pingInterval: .seconds(settings.pingIntervalSeconds),
            maxConnections: settings.maxConnections, maxKeptSessions: settings.maxKeptSessions,
            maxKeptBytes: WebSocketSettings.maxKeptBytes)
        locked = Mutex(Locked(table: Table(configuration: configuration)))
        self.presence = presence
        self.clock = clock
        self.logger = logger
    }

    var now: Duration { clock.now() }

    /// Open connections (before and after `hello`).
    var connectionCount: Int { locked.withLock { $0.table.connectionCount } }
    /// Upgrades accepted (a connection slot taken) since the server started.
    var acceptedCount: Int { locked.withLock { $0.accepted } }
    /// Sessions, connected or kept.
    var sessionCount: Int { locked.withLock { $0.table.sessionCount } }
    /// Kept (disconnected) sessions.
    var keptCount: Int { locked.withLock { $0.table.keptCount } }

    /// Reads the table.
    func read<T>(_ body: (borrowing Table) -> T) -> T { locked.withLock { body($0.table) } }

    /// A new socket; `nil` at the connection bound or while draining (the upgrade is refused).
    func connect(channel: any Channel, queue: OutboundQueue) -> Table.ConnectionID? {
        let now = self.now
        let id = locked.withLock { s -> Table.ConnectionID? in
            guard case .accepted(let id) = s.table.connect(now: now) else { return nil }
            s.handles[id] = Handle(queue: queue, channel: channel)
            s.accepted += 1
            return id
        }
        return id
    }

    /// For the session with resume token `token`, its connection's ``OutboundQueue/undeliveredAfter``
    /// and held frames; `nil` when no connection carries it (tests).
    func outbound(forToken token: String) -> (undelivered: Timetoken?, held: Int)? {
        locked.withLock { s in
            guard let id = s.table.session(forToken: token),
                  let connection = s.table.sessions(where: { _ in true }).first(where: { $0.id == id })?.connection,
                  let queue = s.handles[connection]?.queue
            else { return nil }
            return (queue.undeliveredAfter, queue.held)
        }
    }

    /// Whether graceful shutdown started (deliveries stop: the hub answers at once from then on).
    var isDraining: Bool { locked.withLock { $0.table.isDraining } }

    func open(_ connection: Table.ConnectionID, token: String, state: SessionState) -> Table.SessionID? {
        let now = self.now
        let (id, address) = locked.withLock {
            ($0.table.open(connection, token: token, payload: state, bytes: state.estimatedBytes, now: now), $0.handles[connection]?.address)
        }
        if let id { console?.sessionOpened(uuid: state.uuid, subscribeKey: state.keyset.subscribeKey, session: "s-\(id)", address: address ?? "unknown") }
        return id
    }

    /// `hello` with a resume token: the session, if the table holds it and `belongs` says it is
    /// this client's (otherwise it is left as it was and the result is `.unknown`).
    func resume(_ connection: Table.ConnectionID, token: String, belongs: (SessionState) -> Bool) -> Table.ResumeResult {
        let now = self.now
        let (result, previous) = locked.withLock { s -> (Table.ResumeResult, Handle?) in
            guard let id = s.table.session(forToken: token), let state = s.table.payload(of: id), belongs(state) else {
                return (.unknown, nil)
            }
            var result = s.table.resume(connection, token: token, now: now)
            if case .resumed(let id, let state, _) = result {
                console?.sessionResumed(uuid: state.uuid, session: "s-\(id)", address: s.handles[connection]?.address ?? "unknown")
            }
            guard case .resumed(let id, var state, let previous?) = result else { return (result, nil) }
            // Taken over while the previous socket is open: what it has not written yet (held,
            // being written) is delivered again from here, not skipped by a resume without a
            // cursor. Under the lock, so no delivery of the previous connection moves the cursor
            // in between (its updates are refused from here on).
            if let undelivered = s.handles[previous]?.queue.undeliveredAfter, undelivered < state.cursor {
                state.cursor = undelivered
                s.table.update(id, payload: state, bytes: state.estimatedBytes)
                result = .resumed(id, state, previous: previous)
            }
            return (result, s.handles[previous])
        }
        previous?.queue.close(code: WebSocketCloseCode.takenOver, reason: "session resumed elsewhere")
        return result
    }

    func state(of session: Table.SessionID) -> SessionState? { locked.withLock { $0.table.payload(of: session) } }

    /// Changes a session's state (its subscription or cursor).
    @discardableResult
    func update(_ session: Table.SessionID, _ change: (inout SessionState) -> Void) -> SessionState? {
        locked.withLock { s in
            guard var state = s.table.payload(of: session) else { return nil }
            change(&state)
            s.table.update(session, payload: state, bytes: state.estimatedBytes)
            return state
        }
    }

    /// ``update(_:_:)`` while `connection` carries the session; `nil`, changing nothing, once
    /// another connection took it over (a resume elsewhere) or it ended.
    @discardableResult
    func update(_ session: Table.SessionID, on connection: Table.ConnectionID, _ change: (inout SessionState) -> Void) -> SessionState? {
        locked.withLock { s in
            guard var state = s.table.payload(of: session) else { return nil }
            change(&state)
            return s.table.update(session, on: connection, payload: state, bytes: state.estimatedBytes) ? state : nil
        }
    }

    func received(_ connection: Table.ConnectionID) {
        let now = self.now
        let answered = locked.withLock { s in
            s.table.received(connection, now: now).map { ($0, s.table.session(on: connection).flatMap { s.table.payload(of: $0)?.uuid }) }
        }
        if let (roundTrip, uuid) = answered, let uuid {
            console?.pingAnswered(uuid: uuid, milliseconds: roundTrip.components.seconds * 1000 + roundTrip.components.attoseconds / 1_000_000_000_000_000)
        }
    }

    /// `suspend`: the connection's session is kept for `seconds` (bounded by the settings'
    /// `maxSuspendSeconds`) once its socket closes; returns the window granted, nil without a session.
    /// With `presence` false the uuid leaves its channels now (others see a `leave`) and joins
    /// again on resume.
    ///
    /// With `device`, what is published on the session's channels while it is suspended is pushed
    /// to that device (``PushDispatcher/holdDevice(_:channels:owner:mayRead:)``) until it is
    /// resumed, ended or expired, while `mayRead` allows the channel (the session's access).
    func suspend(_ connection: Table.ConnectionID, seconds: Int?, presence: Bool,
                 push device: WebSocketClientFrame.SuspendPush? = nil, mayRead: (@Sendable (String) -> Bool)? = nil) async -> Int? {
        let granted = min(seconds ?? settings.maxSuspendSeconds, settings.maxSuspendSeconds)
        let (held, leaving, pushing) = locked.withLock { s -> (Bool, SessionState?, (Table.SessionID, SessionState)?) in
            guard s.table.suspend(connection, keepAlive: .seconds(granted)), let id = s.table.session(on: connection),
                  var state = s.table.payload(of: id) else { return (false, nil, nil) }
            let pushing = device != nil && state.hasSubscribed ? (id, state) : nil
            // A session that may not act for its uuid sends no leave: the uuid stays until its
            // timeout, as after a REST leave refused for it.
            guard !presence, state.hasSubscribed, !state.presenceSuspended, state.actsForUUID else { return (true, nil, pushing) }
            state.presenceSuspended = true
            s.table.update(id, payload: state, bytes: state.estimatedBytes)
            return (true, state, pushing)
        }
        if let device, let (id, state) = pushing, let push {
            let gateway: PushGateway = device.type == "apns2" ? .apns2 : device.type == "apns" ? .apns : .gcm
            push.holdDevice(PushDevice(subscribeKey: state.keyset.subscribeKey, token: device.token, gateway: gateway,
                                       environment: gateway == .apns2 ? device.environment : "",
                                       topic: gateway == .apns2 ? device.topic : ""),
                            // The session's channels, its groups' channels as they are now, and its
                            // wildcards (matched by prefix); not presence channels.
                            channels: Array(Set(state.channels.filter { !NameRules.isPresence($0) && NameRules.isWildcard($0) }
                                                + self.presence.concreteChannels(subscribeKey: state.keyset.subscribeKey,
                                                                                 channels: state.channels, groups: state.groups))),
                            owner: id, mayRead: mayRead ?? { _ in true })
        }
        if let leaving {
            await self.presence.leave(subscribeKey: leaving.keyset.subscribeKey, uuid: leaving.uuid, channels: leaving.channels,
                                      groups: leaving.groups)
        }
        return held ? granted : nil
    }

    /// A resumed session that was suspended without presence: its uuid joins its channels again.
    func rejoinIfAbsent(_ session: Table.SessionID) async {
        let joining = locked.withLock { s -> SessionState? in
            guard var state = s.table.payload(of: session), state.presenceSuspended else { return nil }
            state.presenceSuspended = false
            s.table.update(session, payload: state, bytes: state.estimatedBytes)
            return state
        }
        guard let joining, joining.hasSubscribed else { return }
        await presence.heartbeat(subscribeKey: joining.keyset.subscribeKey, uuid: joining.uuid, channels: joining.channels,
                                 groups: joining.groups, timeoutSeconds: settings.keepAliveSeconds, states: joining.states)
    }

    /// A suspended session is back (or gone): its deliveries are no longer pushed.
    func releaseSuspendedPush(_ session: Table.SessionID) {
        push?.releaseDevice(owner: session)
    }

    /// `bye`: the session ends; its uuid leaves every channel.
    func end(_ connection: Table.ConnectionID) async {
        if let session = locked.withLock({ $0.table.session(on: connection) }) { releaseSuspendedPush(session) }
        guard let state = locked.withLock({ $0.table.end(connection) }) else { return }
        console?.socketClosed(uuid: state.uuid, reason: "bye; session ended")
        if state.hasSubscribed, state.actsForUUID {
            await presence.leave(subscribeKey: state.keyset.subscribeKey, uuid: state.uuid, channels: state.channels, groups: state.groups)
        }
    }

    /// The socket is gone: its session is kept. Presence is extended to the end of the
    /// keep-alive window, so the uuid times out exactly when the window lapses unless it resumes.
    func disconnected(_ connection: Table.ConnectionID) async {
        let now = self.now
        let (kept, keepAlive, actions) = locked.withLock { s -> (SessionState?, Duration?, [Table.Action]) in
            s.handles[connection] = nil
            let session = s.table.session(on: connection)
            let keepAlive = session.flatMap { s.table.keepAlive(of: $0) }
            let actions = s.table.disconnected(connection, now: now)
            return (session.flatMap { s.table.payload(of: $0) }, keepAlive, actions)
        }
        if let kept, kept.hasSubscribed, !kept.presenceSuspended {
            let seconds = Int(keepAlive?.components.seconds ?? Int64(settings.keepAliveSeconds))
            await presence.refresh(subscribeKey: kept.keyset.subscribeKey, uuid: kept.uuid, channels: kept.channels, groups: kept.groups,
                                   timeoutSeconds: seconds)
        }
        await perform(actions)
        if let kept { console?.socketClosed(uuid: kept.uuid, reason: "socket closed; session kept") }
    }

    /// Graceful shutdown: refuses new connections, sends every open one the `drain` notice and
    /// its close frame (`1012`). Sessions stay kept until the process exits.
    func drain() {
        let handles = locked.withLock { s in s.table.drain().compactMap { s.handles[$0] } }
        let notice = WebSocketServerFrame.drain(reconnectAfterMilliseconds: settings.drainReconnectAfterMilliseconds,
                                                jitterMilliseconds: settings.drainJitterMilliseconds)
        if !handles.isEmpty {
            logger.info("draining WebSocket sessions for shutdown", metadata: ["connections": "\(handles.count)"])
        }
        for handle in handles {
            handle.queue.send(notice)
            handle.queue.close(code: WebSocketCloseCode.drain, reason: "server shutting down")
        }
    }

    /// Runs the table's timers until cancelled: sleeps until the next deadline (at most a second
    /// at a time, so a deadline set meanwhile is late by under a second), then performs what is due.
    func run() async {
        while !Task.isCancelled {
            let now = self.now
            let next = locked.withLock { $0.table.nextWakeUp }
            var wait = Duration.seconds(1)
            if let next { wait = max(.zero, min(wait, next - now)) }
            do {
                try await clock.sleep(wait)
            } catch {
                return
            }
            await tick()
        }
    }

    /// Performs what is due now (the loop calls it; tests may too).
    func tick() async {
        let now = self.now
        let actions = locked.withLock { $0.table.tick(now: now) }
        await perform(actions)
    }

    private func perform(_ actions: [Table.Action]) async {
        for action in actions {
            switch action {
            case .ping(let connection, let id):
                let handle = locked.withLock { $0.handles[connection] }
                handle?.queue.send(WebSocketServerFrame.ping(id: .number(.init(Int64(clamping: id)))))
            case .close(let connection, let reason):
                let handle = locked.withLock { $0.handles[connection] }
                switch reason {
                case .pingTimeout:
                    logger.debug("WebSocket closed: two missed pings")
                    handle?.queue.close(code: WebSocketCloseCode.pingTimeout, reason: "ping timeout")
                case .helloTimeout:
                    handle?.queue.close(code: WebSocketCloseCode.helloTimeout, reason: "hello timeout")
                    // Also the end of a connection whose upgrade never completed.
                    await disconnected(connection)
                case .takenOver:
                    handle?.queue.close(code: WebSocketCloseCode.takenOver, reason: "session resumed elsewhere")
                }
                // A peer that reads nothing never answers the close handshake: end the socket.
                if let channel = handle?.channel {
                    channel.eventLoop.scheduleTask(in: .seconds(2)) { channel.close(promise: nil) }
                }
            case .expired(let session, let state, let reason):
                releaseSuspendedPush(session)
                console?.sessionExpired(uuid: state.uuid, session: "s-\(session)", reason: reason == .evicted ? "evicted at the kept-session bound" : "keep-alive lapsed")
                switch reason {
                case .keepAliveLapsed:
                    // Presence times out on its own at this moment (extended to the window's end).
                    logger.debug("WebSocket session expired", metadata: ["uuid": "\(state.uuid)"])
                case .evicted:
                    let total = locked.withLock { s -> Int? in
                        s.evictionsLogged += 1
                        return s.evictionsLogged == 1 || s.evictionsLogged % 1000 == 0 ? s.evictionsLogged : nil
                    }
                    if let total {
                        logger.warning("kept WebSocket sessions at their bound; the oldest kept session expired (raise --ws-max-kept-sessions?)",
                                       metadata: ["evicted": "\(total)", "limit": "\(settings.maxKeptSessions)"])
                    }
                    if state.hasSubscribed {
                        await presence.leave(subscribeKey: state.keyset.subscribeKey, uuid: state.uuid, channels: state.channels,
                                             groups: state.groups)
                    }
                }
            case .refreshPresence(_, let state):
                guard state.hasSubscribed, !state.presenceSuspended else { continue }
                await presence.refresh(subscribeKey: state.keyset.subscribeKey, uuid: state.uuid, channels: state.channels,
                                       groups: state.groups, timeoutSeconds: settings.keepAliveSeconds)
            }
        }
    }

    /// The console's kick: closes every socket whose session is `uuid`'s (the sessions are kept).
    func kick(uuid: String) -> Int {
        let handles = locked.withLock { s in
            s.table.sessions { $0.uuid == uuid }.compactMap { $0.connection.flatMap { s.handles[$0] } }
        }
        for handle in handles {
            handle.queue.close(code: WebSocketCloseCode.normal, reason: "closed by the operator")
            let channel = handle.channel
            channel.eventLoop.scheduleTask(in: .seconds(2)) { channel.close(promise: nil) }
        }
        return handles.count
    }

    /// The console's end-session action: ends `uuid`'s kept sessions (not resumable any more;
    /// the uuid leaves its channels). Returns how many ended.
    func endKept(uuid: String) async -> Int {
        let ended = locked.withLock { s in
            s.table.sessions { $0.uuid == uuid }.compactMap { entry in s.table.endKept(entry.id).map { (entry.id, $0) } }
        }
        for (id, state) in ended {
            console?.sessionExpired(uuid: state.uuid, session: "s-\(id)", reason: "ended by the operator")
            if state.hasSubscribed {
                await presence.leave(subscribeKey: state.keyset.subscribeKey, uuid: state.uuid, channels: state.channels, groups: state.groups)
            }
        }
        return ended.count
    }

    /// A new resume token: 128 random bits, hex.
    static func makeToken() -> String {
        var generator = SystemRandomNumberGenerator()
        return (0..<2).map { _ in
            let value = generator.next() as UInt64
            let hex = String(value, radix: 16)
            return String(repeating: "0", count: 16 - hex.count) + hex
        }.joined()
    }
}
