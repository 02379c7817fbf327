/// The WebSocket sessions of a server and the connections that carry them, as a pure machine:
/// no I/O, no clock (every input takes `now`, the elapsed time of the server's clock), no
/// tasks. The shell (`WebSocketSessions` in TetherServer) feeds it the connection's events and
/// performs the actions it returns: pings to send, connections to close, sessions that expired.
///
/// A connection is accepted (bounded by `maxConnections`), must say `hello` within
/// `helloTimeout`, then carries one session. When it drops, its session is **kept** for
/// `keepAlive` and can be resumed by its token; a kept session past its window, or the oldest
/// one when the kept sessions are over their count or byte bound, expires.
///
/// Liveness (docs/websocket-protocol.md, "Liveness"): a connection that sent nothing for
/// `pingInterval` gets a ping; a ping still unanswered when the next is due is missed, and
/// `missedPongLimit` missed pings close the connection.
package struct SessionTable<Payload: Sendable>: Sendable {
    package typealias ConnectionID = UInt64
    package typealias SessionID = UInt64

    package struct Configuration: Sendable, Hashable {
        /// How long a session is kept after its socket drops.
        package var keepAlive: Duration
        /// Idle time before the server pings.
        package var pingInterval: Duration
        /// Missed pings that close a connection.
        package var missedPongLimit: Int
        /// Time a new connection has to send `hello`.
        package var helloTimeout: Duration
        /// Open connections at most (before and after `hello`).
        package var maxConnections: Int
        /// Kept (disconnected) sessions at most.
        package var maxKeptSessions: Int
        /// Estimated bytes of kept sessions' payloads at most.
        package var maxKeptBytes: Int
        /// How often a connected session's presence is refreshed.
        package var presenceRefresh: Duration

        package init(keepAlive: Duration = .seconds(300), pingInterval: Duration = .seconds(25), missedPongLimit: Int = 2,
                     helloTimeout: Duration = .seconds(10), maxConnections: Int = 10_000, maxKeptSessions: Int = 10_000,
                     maxKeptBytes: Int = 64 << 20, presenceRefresh: Duration? = nil) {
            self.keepAlive = keepAlive
            self.pingInterval = pingInterval
            self.missedPongLimit = max(1, missedPongLimit)
            self.helloTimeout = helloTimeout
            self.maxConnections = max(1, maxConnections)
            self.maxKeptSessions = max(0, maxKeptSessions)
            self.maxKeptBytes = max(0, maxKeptBytes)
            self.presenceRefresh = presenceRefresh ?? max(.seconds(1), keepAlive / 3)
        }
    }

    /// Why a connection is closed by the table.
    package enum CloseReason: Sendable, Hashable {
        case pingTimeout
        case helloTimeout
        case takenOver
    }

    /// Why a session expired.
    package enum ExpiryReason: Sendable, Hashable {
        /// Its keep-alive window lapsed.
        case keepAliveLapsed
        /// It was the oldest kept session when the kept sessions were over their bound.
        case evicted
    }

    /// What the shell must do.
    package enum Action: Sendable {
        case ping(ConnectionID, id: UInt64)
        case close(ConnectionID, CloseReason)
        case expired(SessionID, Payload, ExpiryReason)
        /// A connected session's presence should be extended (it needs no heartbeats).
        case refreshPresence(SessionID, Payload)
    }

    package enum ConnectResult: Sendable, Hashable {
        case accepted(ConnectionID)
        /// At `maxConnections`: refuse the upgrade.
        case refused
    }

    package enum ResumeResult: Sendable {
        /// The session is on this connection now; `previous` is the connection that carried it
        /// until now, to be closed (`.takenOver`), if it was still open.
        case resumed(SessionID, Payload, previous: ConnectionID?)
        /// No such session (expired, evicted, or from before a restart).
        case unknown
    }

    private struct Connection: Sendable {
        var session: SessionID?
        var lastInbound: Duration
        var helloDeadline: Duration?
        var outstandingPing: UInt64?
        var pingSentAt: Duration = .zero
        var missed = 0
        /// Closed by the table; waiting for the shell's `disconnected`.
        var closing = false
    }

    private struct Session: Sendable {
        var token: String
        var payload: Payload
        var bytes: Int
        var connection: ConnectionID?
        var keptSince: Duration?
        var presenceRefreshAt: Duration
        /// The keep-alive a `suspend` asked for (nil: the configuration's).
        var suspendedFor: Duration?

        func keepAlive(_ configuration: Configuration) -> Duration { suspendedFor ?? configuration.keepAlive }
    }

    package let configuration: Configuration
    private var connections: [ConnectionID: Connection] = [:]
    private var sessions: [SessionID: Session] = [:]
    private var byToken: [String: SessionID] = [:]
    /// Kept sessions in the order they were kept (oldest first); may hold ids no longer kept,
    /// skipped when met.
    private var keptOrder: [(id: SessionID, since: Duration)] = []
    private var keptOrderStart = 0
    package private(set) var keptCount = 0
    package private(set) var keptBytes = 0
    /// Sessions expired at the bound so far (for the shell's log and metrics).
    package private(set) var evictedCount = 0
    private var nextConnectionID: ConnectionID = 1
    private var nextSessionID: SessionID = 1
    private var nextPingID: UInt64 = 1
    package private(set) var isDraining = false

    package init(configuration: Configuration = .init()) {
        self.configuration = configuration
    }

    package var connectionCount: Int { connections.count }
    package var sessionCount: Int { sessions.count }

    /// The session a connection carries.
    package func session(on connection: ConnectionID) -> SessionID? { connections[connection]?.session }

    /// A session's payload.
    package func payload(of session: SessionID) -> Payload? { sessions[session]?.payload }

    /// The session a resume token names, if the table holds it.
    package func session(forToken token: String) -> SessionID? { byToken[token] }

    /// Whether the session is currently carried by a connection.
    package func isConnected(_ session: SessionID) -> Bool { sessions[session]?.connection != nil }

    /// A new socket (before `hello`). Refused at the connection bound or while draining.
    package mutating func connect(now: Duration) -> ConnectResult {
        guard !isDraining, connections.count < configuration.maxConnections else { return .refused }
        let id = nextConnectionID
        nextConnectionID += 1
        connections[id] = Connection(lastInbound: now, helloDeadline: now + configuration.helloTimeout)
        return .accepted(id)
    }

    /// `hello` without a resume (or with one the table does not know): a new session on the
    /// connection, known by `token` (random, made by the shell).
    package mutating func open(_ connection: ConnectionID, token: String, payload: Payload, bytes: Int, now: Duration) -> SessionID? {
        guard var entry = connections[connection], entry.session == nil, byToken[token] == nil else { return nil }
        let id = nextSessionID
        nextSessionID += 1
        sessions[id] = Session(token: token, payload: payload, bytes: bytes, connection: connection, keptSince: nil,
                               presenceRefreshAt: now + configuration.presenceRefresh)
        byToken[token] = id
        entry.session = id
        entry.helloDeadline = nil
        entry.lastInbound = now
        connections[connection] = entry
        return id
    }

    /// `hello` with a resume token.
    package mutating func resume(_ connection: ConnectionID, token: String, now: Duration) -> ResumeResult {
        guard var entry = connections[connection], entry.session == nil, let id = byToken[token], var session = sessions[id]
        else { return .unknown }
        var previous: ConnectionID?
        if let old = session.connection {
            // Taken over: the old connection no longer carries the session.
            connections[old]?.session = nil
            previous = old
        }
        if session.keptSince != nil {
            keptCount -= 1
            keptBytes -= session.bytes
        }
        session.connection = connection
        session.keptSince = nil
        session.suspendedFor = nil
        session.presenceRefreshAt = now + configuration.presenceRefresh
        sessions[id] = session
        entry.session = id
        entry.helloDeadline = nil
        entry.lastInbound = now
        connections[connection] = entry
        return .resumed(id, session.payload, previous: previous)
    }

    /// Replaces a session's payload (its subscription changed).
    package mutating func update(_ session: SessionID, payload: Payload, bytes: Int) {
        guard var entry = sessions[session] else { return }
        if entry.keptSince != nil { keptBytes += bytes - entry.bytes }
        entry.payload = payload
        entry.bytes = bytes
        sessions[session] = entry
    }

    /// ``update(_:payload:bytes:)`` by the connection that carries the session; `false`, changing
    /// nothing, when `connection` does not (another took the session over, or it ended).
    @discardableResult
    package mutating func update(_ session: SessionID, on connection: ConnectionID, payload: Payload, bytes: Int) -> Bool {
        guard connections[connection]?.session == session else { return false }
        update(session, payload: payload, bytes: bytes)
        return true
    }

    /// `suspend`: once the connection's socket closes, its session is kept for `keepAlive` instead
    /// of the configured window (until it is resumed). False when the connection carries no session.
    @discardableResult
    package mutating func suspend(_ connection: ConnectionID, keepAlive: Duration) -> Bool {
        guard let id = connections[connection]?.session, var session = sessions[id] else { return false }
        session.suspendedFor = keepAlive
        sessions[id] = session
        return true
    }

    /// How long a session is kept once its socket is gone (its `suspend` window, or the configured one).
    package func keepAlive(of session: SessionID) -> Duration? { sessions[session]?.keepAlive(configuration) }

    /// Any frame from the client: a sign of life.
    /// Returns the time since the server's outstanding ping, if one was waiting: the client's
    /// first frame after a ping is its pong (the console shows it as the ping round trip).
    @discardableResult
    package mutating func received(_ connection: ConnectionID, now: Duration) -> Duration? {
        guard var entry = connections[connection] else { return nil }
        let roundTrip = entry.outstandingPing == nil ? nil : now - entry.pingSentAt
        entry.lastInbound = now
        entry.outstandingPing = nil
        entry.missed = 0
        connections[connection] = entry
        return roundTrip
    }

    /// The socket is gone (dropped, closed without `bye`, or closed by the server). Its session
    /// is kept; over the kept bound the oldest kept sessions expire (returned).
    package mutating func disconnected(_ connection: ConnectionID, now: Duration) -> [Action] {
        guard let entry = connections.removeValue(forKey: connection) else { return [] }
        guard let id = entry.session, var session = sessions[id], session.connection == connection else { return [] }
        session.connection = nil
        session.keptSince = now
        sessions[id] = session
        keptCount += 1
        keptBytes += session.bytes
        keptOrder.append((id, now))
        return evictOverBound()
    }

    /// `bye`: the session ends (the shell sends presence leaves). Returns its payload.
    package mutating func end(_ connection: ConnectionID) -> Payload? {
        guard var entry = connections[connection], let id = entry.session, let session = sessions.removeValue(forKey: id)
        else { return nil }
        byToken[session.token] = nil
        entry.session = nil
        connections[connection] = entry
        return session.payload
    }

    /// Sessions whose payload `predicate` accepts, with their connection (`nil` while kept):
    /// the console's kick and end-session actions find them here.
    package func sessions(where predicate: (Payload) -> Bool) -> [(id: SessionID, connection: ConnectionID?)] {
        sessions.compactMap { predicate($0.value.payload) ? ($0.key, $0.value.connection) : nil }
    }

    /// An operator ends a kept session (it is not resumed); returns its payload, `nil` when the
    /// session is not kept.
    package mutating func endKept(_ id: SessionID) -> Payload? {
        guard let session = sessions[id], session.keptSince != nil else { return nil }
        remove(id)
        return session.payload
    }

    /// Pings due, connections to close, kept sessions past their window, presence refreshes.
    package mutating func tick(now: Duration) -> [Action] {
        var actions: [Action] = []
        for (id, var entry) in connections where !entry.closing {
            if let deadline = entry.helloDeadline {
                if now >= deadline {
                    connections[id]?.closing = true
                    actions.append(.close(id, .helloTimeout))
                }
                continue
            }
            let due = (entry.outstandingPing == nil ? entry.lastInbound : entry.pingSentAt) + configuration.pingInterval
            guard now >= due else { continue }
            if entry.outstandingPing != nil {
                entry.missed += 1
                if entry.missed >= configuration.missedPongLimit {
                    entry.closing = true
                    connections[id] = entry
                    actions.append(.close(id, .pingTimeout))
                    continue
                }
            }
            let pingID = nextPingID
            nextPingID += 1
            entry.outstandingPing = pingID
            entry.pingSentAt = now
            connections[id] = entry
            actions.append(.ping(id, id: pingID))
        }
        for (id, var session) in sessions {
            if let since = session.keptSince {
                if now >= since + session.keepAlive(configuration) {
                    actions.append(.expired(id, session.payload, .keepAliveLapsed))
                    remove(id)
                }
            } else if now >= session.presenceRefreshAt {
                session.presenceRefreshAt = now + configuration.presenceRefresh
                sessions[id] = session
                actions.append(.refreshPresence(id, session.payload))
            }
        }
        compactKeptOrder()
        return actions
    }

    /// The next moment `tick` has something to do, if any.
    package var nextWakeUp: Duration? {
        var next: Duration?
        func consider(_ at: Duration) { next = next.map { min($0, at) } ?? at }
        for entry in connections.values where !entry.closing {
            if let deadline = entry.helloDeadline {
                consider(deadline)
            } else {
                consider((entry.outstandingPing == nil ? entry.lastInbound : entry.pingSentAt) + configuration.pingInterval)
            }
        }
        for session in sessions.values {
            if let since = session.keptSince { consider(since + session.keepAlive(configuration)) } else { consider(session.presenceRefreshAt) }
        }
        return next
    }

    /// Graceful shutdown: refuse new connections; returns the open ones (to send `drain` to).
    package mutating func drain() -> [ConnectionID] {
        isDraining = true
        return Array(connections.keys)
    }

    private mutating func remove(_ id: SessionID) {
        guard let session = sessions.removeValue(forKey: id) else { return }
        byToken[session.token] = nil
        if session.keptSince != nil {
            keptCount -= 1
            keptBytes -= session.bytes
        }
    }

    private mutating func evictOverBound() -> [Action] {
        var actions: [Action] = []
        while keptCount > configuration.maxKeptSessions || (keptBytes > configuration.maxKeptBytes && keptCount > 0) {
            guard keptOrderStart < keptOrder.count else { break }
            let (id, since) = keptOrder[keptOrderStart]
            keptOrderStart += 1
            guard let session = sessions[id], session.keptSince == since else { continue }
            actions.append(.expired(id, session.payload, .evicted))
            remove(id)
            evictedCount += 1
        }
        compactKeptOrder()
        return actions
    }

    /// Drops the consumed prefix of `keptOrder` and entries no longer kept, so it stays
    /// proportional to the kept sessions.
    private mutating func compactKeptOrder() {
        guard keptOrder.count > 64, keptOrder.count > 2 * max(keptCount, 1) else { return }
        keptOrder = keptOrder[keptOrderStart...].filter { sessions[$0.id]?.keptSince == $0.since }
        keptOrderStart = 0
    }
}
