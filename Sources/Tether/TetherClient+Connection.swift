import Synchronization
public import TetherClientCore
import TetherProtocol

/// Which wire the engine uses now (``TransportPreference/automatic`` moves between them).
struct WireChoice: Sendable {
    /// Under `.automatic`: stay on long-poll until then (the engine's clock), after a refused upgrade.
    var fallbackUntil: Duration?
    /// The wire of the last receive, for ``ConnectionEvent/transportChanged(_:)``.
    var last: TransportPreference?
}

/// SendBird's three connection states (seed 003), derived from ``ConnectionState``.
public enum ConnectionPhase: String, Sendable, Hashable, CustomStringConvertible {
    /// Real-time data flows (``ConnectionState/connected``).
    case open
    /// A first connection or an automatic reconnection runs (``ConnectionState/connecting``,
    /// ``ConnectionState/reconnecting(attempt:)``).
    case connecting
    /// Nothing runs: idle, disconnected by the app, waiting for the network, or given up.
    case closed

    /// The case name.
    public var description: String { rawValue }
}

extension ConnectionState {
    /// SendBird's `OPEN` / `CONNECTING` / `CLOSED` for this state.
    public var phase: ConnectionPhase {
        switch self {
        case .connected: return .open
        case .connecting, .reconnecting: return .connecting
        case .idle, .waitingForNetwork, .disconnected, .background, .failed: return .closed
        }
    }
}

/// A typed connection event: SendBird's reconnect started / succeeded / failed, Diffusion's
/// session resumed / expired, and the wire in use.
public enum ConnectionEvent: Sendable, Hashable, CustomStringConvertible {
    /// The connection was lost and automatic reconnection began.
    case reconnectStarted
    /// Receiving again after a reconnection.
    case reconnectSucceeded
    /// Automatic reconnection gave up; ``TetherClient/connect()`` or ``TetherClient/reconnect(timetoken:)`` starts again.
    case reconnectFailed
    /// The WebSocket session was resumed with its token: no resubscribe, and the server replays
    /// everything after the client's cursor, once, in order.
    case sessionResumed(sessionId: String)
    /// The server no longer held the WebSocket session (keep-alive lapsed, evicted, restarted):
    /// the client subscribed again with its cursor and catches up from the store.
    case sessionExpired(message: String)
    /// The engine now receives on this wire (``TransportPreference/webSocket`` or
    /// ``TransportPreference/longPoll``).
    case transportChanged(TransportPreference)
    /// Requests go to another origin from now on (``TetherConfiguration/fallbackOrigins``): a
    /// connection-level failure or a node's drain moved the client to a fallback, every
    /// fallback failed and the cycle is back on the primary, or a fallback was used for
    /// ``TetherConfiguration/fallbackRetryTimeout`` and the primary is tried again. The
    /// subscription continues there from its cursor (``TetherClient/currentOrigin``).
    case originChanged(from: String, to: String)

    /// A short description for logs and CLIs.
    public var description: String {
        switch self {
        case .reconnectStarted: return "reconnect started"
        case .reconnectSucceeded: return "reconnect succeeded"
        case .reconnectFailed: return "reconnect failed"
        case .sessionResumed(let id): return "session resumed (\(id))"
        case .sessionExpired(let message): return "session expired: \(message)"
        case .transportChanged(.longPoll): return "transport long-poll"
        case .transportChanged(.webSocket): return "transport websocket"
        case .transportChanged(.automatic): return "transport automatic"
        case .originChanged(let from, let to): return "origin \(from) -> \(to)"
        }
    }
}

extension TetherClient {
    // MARK: - Connection

    /// Opens the connection now: with a subscription, an attempt starts at once (during an
    /// automatic reconnection cycle this attempt replaces the scheduled one and the cycle
    /// continues — every listener, stream and retry policy stays as it was, unlike SendBird's
    /// `connect()` which stops its reconnection manager); without one, on the WebSocket wire the
    /// session's socket is opened (`hello` → `welcome`) so the first subscribe starts on it. Lazy
    /// connection on the first subscribe still works.
    public func connect() {
        startEngineIfNeeded()
        session.forgetDenied()
        let subscribed = engine.read { !$0.subscribedChannels.isEmpty || !$0.subscribedGroups.isEmpty }
        if subscribed {
            engine.send { machine, now in machine.reconnect(timetoken: nil, now: now) }
        } else if currentWire() == .webSocket {
            engine.spawn { [session] in try? await session.openSession() }
        }
    }

    /// Opens the WebSocket session now and returns once the server has welcomed it (resumed
    /// with its token when the client held one): the awaitable form of ``connect()``, for apps
    /// that want to know the session is up before they subscribe or ``ping(timeout:)``.
    ///
    /// Throws what the opening met (``StatusCategory/networkIssues``, a refused upgrade with its
    /// HTTP status…). With ``TransportPreference/longPoll`` there is no session to open and it
    /// throws ``StatusCategory/badRequest``; under ``TransportPreference/automatic`` a refused
    /// upgrade switches the client to long-poll (as the subscribe engine would) before throwing.
    public func open() async throws(TetherError) {
        guard currentWire() == .webSocket else {
            throw TetherError(Status(category: .badRequest, operation: .subscribe,
                                     serverMessage: "no WebSocket session to open: the client uses long-poll"))
        }
        startEngineIfNeeded()
        do { try await session.openSession() } catch {
            if configuration.transport == .automatic && error.upgradeRefused {
                let until = elapsedClock.now() + configuration.webSocket.fallbackRetryInterval
                wire.withLock { $0.fallbackUntil = until }
            }
            throw error.error
        }
    }

    /// Whether a WebSocket session's socket is open right now.
    public var isSessionOpen: Bool { session.isOpen }

    /// The connection phase right now (SendBird's `OPEN` / `CONNECTING` / `CLOSED`).
    public var connectionPhase: ConnectionPhase { connectionState.phase }

    /// Every change of ``connectionPhase`` from now on.
    public func connectionPhaseChanges() -> AsyncStream<ConnectionPhase> {
        engine.listeners.stream { yield in
            engine.listeners.add(connection: { change in
                if change.previous.phase != change.current.phase { yield(change.current.phase) }
            })
        }
    }

    /// Every typed connection event from now on (reconnect started / succeeded / failed, session
    /// resumed / expired, the wire in use). Finishes at ``shutdown()``.
    public func connectionEvents() -> AsyncStream<ConnectionEvent> {
        engine.listeners.stream { engine.listeners.add(event: $0) }
    }

    /// Adds a closure called for every typed connection event.
    @discardableResult
    public func addConnectionEventListener(_ handler: @escaping @Sendable (ConnectionEvent) -> Void) -> ListenerToken {
        engine.listeners.add(event: handler)
    }

    /// Measures the round-trip time to the server (Diffusion's `pingServer`): a `ping` frame on
    /// an open WebSocket session, otherwise a `GET /time/0` request.
    public func ping(timeout: Duration? = nil) async throws(TetherError) -> Duration {
        let limit = timeout ?? configuration.nonSubscribeTimeout
        if session.isOpen { return try await session.ping(timeout: limit) }
        let start = elapsedClock.now()
        _ = try await time(timeout: limit)
        return elapsedClock.now() - start
    }

    // MARK: - Internals

    /// The wire the next receive uses.
    func currentWire() -> TransportPreference {
        switch configuration.transport {
        case .longPoll: return .longPoll
        case .webSocket: return .webSocket
        case .automatic:
            guard hasWebSocketWire else { return .longPoll }
            let now = elapsedClock.now()
            return wire.withLock { choice in
                if let until = choice.fallbackUntil, now < until { return .longPoll }
                choice.fallbackUntil = nil
                return .webSocket
            }
        }
    }

    /// One "subscribe request" on the configured wire, for the subscribe engine. The client is
    /// held only around the wait's edges: a WebSocket receive waits without it (it may wait for
    /// a message indefinitely), a long-poll holds it for at most the subscribe timeout.
    static func receive(owner: WeakClient, session: WebSocketSession, channels: [String], groups: [String],
                        cursor: SubscribeMachine.Cursor?, ticket: Int? = nil) async throws(TetherError) -> (response: SubscribeResponse, gaps: [RetentionGap])
    {
        let released = TetherError(Status(category: .cancelled, operation: .subscribe, serverMessage: "the client was released",
                                           affectedChannels: channels, affectedGroups: groups))
        guard let chosen = owner.client?.currentWire(), let configuration = owner.client?.configuration else { throw released }
        if chosen == .webSocket {
            do {
                // Announced once the upgrade is taken: under `.automatic` a refused one falls back
                // to long-poll without announcing a switch that never happened.
                var (response, gaps) = try await session.receive(channels: channels, groups: groups, cursor: cursor?.timetoken,
                                                                  filter: configuration.filterExpression, ticket: ticket,
                                                                  opened: { owner.client?.noteWire(.webSocket) })
                decrypt(&response, module: configuration.cryptoModule)
                return (response, gaps)
            } catch {
                guard configuration.transport == .automatic, error.upgradeRefused, let client = owner.client else { throw error.error }
                let until = client.elapsedClock.now() + configuration.webSocket.fallbackRetryInterval
                client.wire.withLock { $0.fallbackUntil = until }
            }
        }
        guard let client = owner.client else { throw released }
        client.noteWire(.longPoll)
        let retryAt = configuration.transport == .automatic ? client.wire.withLock { $0.fallbackUntil } : nil
        if let retryAt, let cursor, cursor.timetoken != Timetoken(0) {
            return try await client.longPoll(channels: channels, groups: groups, cursor: cursor, until: retryAt)
        }
        return try await client.subscribeRequest(channels: channels, groups: groups, cursor: cursor)
    }

    /// A long-poll under ``TransportPreference/automatic`` after a refused upgrade, cut short when
    /// WebSocket is due to be tried again: it then answers empty at `cursor`, as the server's own
    /// quiet answer does, and the next receive tries the upgrade. Without it, an idle
    /// subscription retried only when a 280 s long-poll ended. What the cancelled request may
    /// have been about to carry is received again from the same cursor.
    private func longPoll(channels: [String], groups: [String], cursor: SubscribeMachine.Cursor, until retryAt: Duration)
        async throws(TetherError) -> (response: SubscribeResponse, gaps: [RetentionGap])
    {
        enum Outcome: Sendable {
            case answered(Result<(response: SubscribeResponse, gaps: [RetentionGap]), TetherError>)
            case retryDue
            case cancelled
        }
        let wait = retryAt - elapsedClock.now()
        let outcome = await withTaskGroup(of: Outcome.self) { race in
            race.addTask { [self] in
                do throws(TetherError) {
                    return .answered(.success(try await subscribeRequest(channels: channels, groups: groups, cursor: cursor)))
                } catch {
                    return .answered(.failure(error))
                }
            }
            race.addTask { [elapsedClock] in
                do { try await elapsedClock.sleep(max(.zero, wait)) } catch { return .cancelled }
                return .retryDue
            }
            // A cancelled wait (the receive itself was cancelled) leaves the request's answer.
            var first = await race.next() ?? .cancelled
            if case .cancelled = first { first = await race.next() ?? .cancelled }
            race.cancelAll()
            return first
        }
        switch outcome {
        case .answered(let result): return try result.get()
        case .retryDue: return (SubscribeResponse(timetoken: cursor.timetoken, region: cursor.region, events: []), [])
        case .cancelled:
            throw TetherError(Status(category: .cancelled, operation: .subscribe, serverMessage: "the receive was cancelled",
                                     affectedChannels: channels, affectedGroups: groups))
        }
    }

    func noteWire(_ used: TransportPreference) {
        // Under `.automatic` the client starts out meaning WebSocket: a first upgrade refused is
        // a switch to long-poll, a first one taken is none.
        let intended: TransportPreference? = configuration.transport == .automatic ? .webSocket : nil
        let changed = wire.withLock { choice -> Bool in
            defer { choice.last = used }
            guard let previous = choice.last ?? intended else { return false }
            return previous != used
        }
        if changed { engine.listeners.emit(event: .transportChanged(used)) }
    }
}
