package import TetherProtocol

/// The console's flight recorder (docs/console.md): for each client uuid, what its connections
/// did — connected, dropped, resumed, expired, refused — in a bounded ring of timeline events,
/// plus a summary (transport, address, channels, cursor).
///
/// Pure: every call takes `now` (wall-clock milliseconds since 1970) and returns nothing to do;
/// the shell (`AdminConsole`) holds it under a lock. Bounded twice: at most
/// ``Configuration/maxClients`` uuids (the least recently active are forgotten first, an eighth
/// of the bound at a time) and
/// ``Configuration/eventsPerClient`` events per uuid (the oldest are overwritten). Recording
/// writes into bounded rings: no encoding happens until somebody reads.
///
/// A long-poll has no connection to watch, so its story is inferred: a subscribe cycle arriving
/// means connected; no new cycle within ``Configuration/longPollGraceMilliseconds`` after the last
/// one ended means dropped (``tick(now:)`` notices); a continuation that follows a drop is a
/// catch-up, and how many messages it got is recorded.
package struct ConnectionRecorder: Sendable {
    package struct Configuration: Sendable, Hashable {
        /// Uuids remembered at most.
        package var maxClients: Int
        /// Timeline events kept per uuid.
        package var eventsPerClient: Int
        /// How long after a long-poll ended a uuid may go without a new one before it counts as
        /// dropped (a client re-polls at once; its network does not).
        package var longPollGraceMilliseconds: Int64

        package init(maxClients: Int = 2_000, eventsPerClient: Int = 64, longPollGraceMilliseconds: Int64 = 5_000) {
            self.maxClients = max(1, maxClients)
            self.eventsPerClient = max(1, eventsPerClient)
            self.longPollGraceMilliseconds = max(0, longPollGraceMilliseconds)
        }
    }

    package enum Transport: String, Sendable, Hashable {
        case longPoll = "long-poll"
        case webSocket = "websocket"
    }

    /// One timeline event.
    package enum Event: Sendable, Hashable {
        /// A connection arrived (a long-poll cycle after none, or a WebSocket `hello`).
        case connected(Transport, address: String)
        /// A handshake (`tt=0`) from a uuid already seen: the client started over.
        case reconnectAttempt(Transport)
        /// The connection went away: inferred for a long-poll, a closed socket for a WebSocket.
        case dropped(Transport, reason: String)
        /// A WebSocket session was opened.
        case sessionOpened(session: String)
        /// A kept WebSocket session was resumed after `awayMilliseconds` without a socket.
        case resumed(session: String, awayMilliseconds: Int64)
        /// A kept WebSocket session ended without being resumed.
        case expired(session: String, reason: String)
        /// A request or subscription was refused by the access manager.
        case accessDenied(channels: [String])
        /// A request was refused by the rate limiter.
        case rateLimited(route: String)
        /// The first answer after a drop or resume: how many messages it carried, how long the
        /// client was away, and how many channels had a retention gap.
        case catchUp(messages: Int, awayMilliseconds: Int64, gaps: Int)
        /// An operator closed the client's connections from the console.
        case kicked
    }

    package struct Entry: Sendable, Hashable {
        /// Wall-clock milliseconds since 1970.
        package var at: Int64
        package var event: Event
    }

    /// What the console shows for one uuid.
    package struct Client: Sendable {
        package var uuid: String
        package var subscribeKey: String?
        package var transport: Transport?
        package var address: String?
        package var channels: [String] = []
        package var groups: [String] = []
        package var cursor: Timetoken = .zero
        /// Whether a connection is believed to be up now.
        package var isConnected = false
        /// Long-polls in flight for this uuid.
        package var openLongPolls = 0
        /// WebSocket connections open for this uuid.
        package var openSockets = 0
        /// The WebSocket session id while one exists (connected or kept).
        package var session: String?
        package var firstSeen: Int64
        package var lastSeen: Int64
        /// Envelopes delivered to this uuid.
        package var delivered = 0
        /// Ping round trip of the last WebSocket ping answered, when known.
        package var pingMilliseconds: Int64?
        fileprivate var lastCycleEnded: Int64?
        fileprivate var droppedAt: Int64?
        fileprivate var catchUpPending = false
        fileprivate var ring: EventRing
        fileprivate var touch: UInt64

        /// The timeline, oldest first.
        package var timeline: [Entry] { ring.entries }
    }

    private let configuration: Configuration
    private var clients: [String: Client] = [:]
    private var touches: UInt64 = 0

    package init(configuration: Configuration = .init()) {
        self.configuration = configuration
    }

    package var count: Int { clients.count }

    /// The clients, most recently active first (at most `limit`).
    package func clients(limit: Int = .max) -> [Client] {
        Array(clients.values.sorted { $0.touch > $1.touch }.prefix(limit))
    }

    package func client(_ uuid: String) -> Client? { clients[uuid] }

    /// Connected clients by transport.
    package var connectedCounts: (longPoll: Int, webSocket: Int) {
        var counts = (longPoll: 0, webSocket: 0)
        for client in clients.values where client.isConnected {
            switch client.transport {
            case .longPoll: counts.longPoll += 1
            case .webSocket: counts.webSocket += 1
            case nil: break
            }
        }
        return counts
    }

    // MARK: - Long-poll

    /// A subscribe request arrived (a handshake when `cursor` is zero).
    package mutating func longPollBegan(uuid: String, subscribeKey: String, address: String, channels: [String], groups: [String],
                                        cursor: Timetoken, now: Int64) {
        update(uuid, now: now) { client, append in
            let wasConnected = client.isConnected && client.transport == .longPoll
            if cursor == .zero, client.firstSeen < now || !client.timeline.isEmpty {
                append(.reconnectAttempt(.longPoll))
            }
            if !wasConnected {
                append(.connected(.longPoll, address: address))
                if cursor != .zero, client.droppedAt != nil { client.catchUpPending = true }
            }
            client.transport = .longPoll
            client.subscribeKey = subscribeKey
            client.address = address
            client.channels = channels
            client.groups = groups
            if cursor != .zero { client.cursor = cursor }
            client.isConnected = true
            client.openLongPolls += 1
        }
    }

    /// A long-poll was answered (or abandoned, `delivered` 0) with `cursor`.
    package mutating func longPollEnded(uuid: String, delivered: Int, gaps: Int, cursor: Timetoken?, now: Int64) {
        update(uuid, now: now) { client, append in
            client.openLongPolls = max(0, client.openLongPolls - 1)
            client.lastCycleEnded = now
            client.delivered += delivered
            if let cursor { client.cursor = max(client.cursor, cursor) }
            if client.catchUpPending {
                client.catchUpPending = false
                append(.catchUp(messages: delivered, awayMilliseconds: now - (client.droppedAt ?? now), gaps: gaps))
                client.droppedAt = nil
            }
        }
    }

    /// Marks long-poll clients that stopped polling as dropped. Call about once a second.
    package mutating func tick(now: Int64) {
        for (uuid, client) in clients where client.isConnected && client.transport == .longPoll && client.openLongPolls == 0 {
            guard let ended = client.lastCycleEnded, now - ended > configuration.longPollGraceMilliseconds else { continue }
            var changed = client
            changed.isConnected = false
            changed.droppedAt = ended
            changed.ring.append(Entry(at: now, event: .dropped(.longPoll, reason: "no subscribe within \(configuration.longPollGraceMilliseconds) ms")))
            clients[uuid] = changed
        }
    }

    // MARK: - WebSocket

    /// `hello` opened a new session.
    package mutating func sessionOpened(uuid: String, subscribeKey: String, session: String, address: String, now: Int64) {
        update(uuid, now: now) { client, append in
            append(.connected(.webSocket, address: address))
            append(.sessionOpened(session: session))
            client.transport = .webSocket
            client.subscribeKey = subscribeKey
            client.address = address
            client.session = session
            client.isConnected = true
            client.openSockets += 1
            client.droppedAt = nil
        }
    }

    /// `hello` resumed a kept session; the first delivery after it is recorded as its catch-up.
    package mutating func sessionResumed(uuid: String, session: String, address: String, now: Int64) {
        update(uuid, now: now) { client, append in
            let away = client.droppedAt.map { now - $0 } ?? 0
            append(.connected(.webSocket, address: address))
            append(.resumed(session: session, awayMilliseconds: away))
            client.transport = .webSocket
            client.address = address
            client.session = session
            client.isConnected = true
            client.openSockets += 1
            client.catchUpPending = true
        }
    }

    /// The session's subscription or cursor changed.
    package mutating func sessionSubscribed(uuid: String, channels: [String], groups: [String], cursor: Timetoken, now: Int64) {
        update(uuid, now: now) { client, _ in
            client.channels = channels
            client.groups = groups
            client.cursor = max(client.cursor, cursor)
        }
    }

    /// A WebSocket session delivered a page.
    package mutating func sessionDelivered(uuid: String, delivered: Int, gaps: Int, cursor: Timetoken, now: Int64) {
        update(uuid, now: now) { client, append in
            client.delivered += delivered
            client.cursor = max(client.cursor, cursor)
            if client.catchUpPending {
                client.catchUpPending = false
                append(.catchUp(messages: delivered, awayMilliseconds: now - (client.droppedAt ?? now), gaps: gaps))
                client.droppedAt = nil
            }
        }
    }

    /// A WebSocket with a session closed (`reason`: kept, bye, …).
    package mutating func socketClosed(uuid: String, reason: String, now: Int64) {
        update(uuid, now: now) { client, append in
            client.openSockets = max(0, client.openSockets - 1)
            if client.openSockets == 0 {
                client.isConnected = false
                client.droppedAt = now
                append(.dropped(.webSocket, reason: reason))
            }
        }
    }

    /// A kept session ended without a resume.
    package mutating func sessionExpired(uuid: String, session: String, reason: String, now: Int64) {
        update(uuid, now: now) { client, append in
            append(.expired(session: session, reason: reason))
            if client.session == session { client.session = nil }
        }
    }

    /// A WebSocket ping was answered after `milliseconds`.
    package mutating func pingAnswered(uuid: String, milliseconds: Int64, now: Int64) {
        guard clients[uuid] != nil else { return }
        update(uuid, now: now) { client, _ in client.pingMilliseconds = milliseconds }
    }

    // MARK: - Refusals and operator actions

    package mutating func accessDenied(uuid: String, channels: [String], now: Int64) {
        update(uuid, now: now) { _, append in append(.accessDenied(channels: Array(channels.prefix(8)))) }
    }

    package mutating func rateLimited(uuid: String, route: String, now: Int64) {
        update(uuid, now: now) { _, append in append(.rateLimited(route: route)) }
    }

    package mutating func kicked(uuid: String, now: Int64) {
        guard clients[uuid] != nil else { return }
        update(uuid, now: now) { _, append in append(.kicked) }
    }

    // MARK: - Storage

    /// Finds or creates the uuid's record (evicting the least recently active when full), lets
    /// `change` edit it and append events, and stores it back.
    private mutating func update(_ uuid: String, now: Int64, _ change: (inout Client, (Event) -> Void) -> Void) {
        touches &+= 1
        let touch = touches
        let index: [String: Client].Index
        if let existing = clients.index(forKey: uuid) {
            index = existing
        } else {
            if clients.count >= configuration.maxClients { forgetLeastRecentlyActive() }
            clients[uuid] = Client(uuid: uuid, firstSeen: now, lastSeen: now, ring: EventRing(capacity: configuration.eventsPerClient),
                                   touch: touch)
            index = clients.index(forKey: uuid)!
        }
        // Edited in place: one lookup per hook, and the ring's storage is never copied.
        func apply(_ client: inout Client) {
            var pending: [Event] = []
            change(&client) { pending.append($0) }
            for event in pending { client.ring.append(Entry(at: now, event: event)) }
            client.lastSeen = now
            client.touch = touch
        }
        apply(&clients.values[index])
    }
}

extension ConnectionRecorder {
    /// At the bound: forgets the least recently active eighth of the uuids at once (at least
    /// one), so that with more active uuids than the bound — every update then a new uuid — the
    /// scan is paid once per `maxClients / 8` new uuids rather than on every one.
    private mutating func forgetLeastRecentlyActive() {
        let batch = max(1, configuration.maxClients / 8)
        var touches = clients.values.map(\.touch)
        touches.sort()
        let threshold = touches[min(batch, touches.count) - 1]
        clients = clients.filter { $0.value.touch > threshold }
    }
}

/// A bounded ring of timeline entries: grows to its capacity as events arrive (a uuid seen once
/// costs one small allocation, not a full ring), then the oldest is overwritten.
private struct EventRing: Sendable {
    private var storage: [ConnectionRecorder.Entry] = []
    private let capacity: Int
    /// Once full: where the oldest entry is (the next to overwrite).
    private var next = 0

    init(capacity: Int) {
        self.capacity = capacity
    }

    mutating func append(_ entry: ConnectionRecorder.Entry) {
        if storage.count < capacity {
            storage.append(entry)
        } else {
            storage[next] = entry
            next = (next + 1) % capacity
        }
    }

    var entries: [ConnectionRecorder.Entry] {
        storage.count < capacity ? storage : Array(storage[next...] + storage[..<next])
    }
}
