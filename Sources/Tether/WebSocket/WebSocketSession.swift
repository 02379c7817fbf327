import Logging
import Synchronization
import TetherClientCore
@_spi(Benchmarks) import TetherProtocol

/// What the session wire reports besides deliveries (typed; the client turns them into
/// ``ConnectionEvent``s).
enum SessionReport: Sendable, Hashable {
    /// A `hello` with a resume token got the kept session back.
    case resumed(sessionId: String)
    /// The server no longer held the session; a new one was opened (the subscription is sent
    /// again with the cursor, so the catch-up comes from the store).
    case expired(message: String)
    /// Access to some of the session's names was refused or revoked; the others keep flowing.
    case partlyDenied(channels: [String], groups: [String], message: String)
}

/// A failure of the session wire, with whether it was a refused upgrade (a plain HTTP answer
/// other than 503: a proxy stripping `Upgrade`, a server without the endpoint) — the case
/// ``TransportPreference/automatic`` falls back to long-poll for.
struct SessionFailure: Error, Sendable {
    var error: TetherError
    var upgradeRefused: Bool = false
}

/// The SDK's side of one WebSocket session (docs/websocket-protocol.md), shaped for the
/// subscribe engine: ``receive(channels:groups:cursor:filter:)`` answers exactly like one
/// subscribe long-poll (a cursor and the events after it, decoded by the long-poll's decoder), so
/// the ``SubscribeMachine`` — handshake, de-duplication, catch-up, retry policies, statuses —
/// runs unchanged over either wire.
///
/// The socket outlives the calls: the first call opens it (`hello` → `welcome`, keeping the
/// resume token), later calls take the next `messages` frame. When the socket drops, the next
/// call resumes with the token and the caller's cursor; a `sessionExpired` notice means a new
/// session, which gets `subscribe` with the cursor. A `drain` notice turns the close that
/// follows into a failure carrying the server's delay plus jitter as `retryAfter`; a refused
/// upgrade with `503` carries its `Retry-After`. Server pings are answered at once; after
/// ``WebSocketOptions/inactivityPing`` without a frame the session pings, and a socket silent
/// for ``WebSocketOptions/pongTimeout`` more is closed as dead.
final class WebSocketSession: Sendable {
    /// A client `ping` waiting for its `pong`.
    private struct Ping {
        var sentAt: Duration
        var reply: CheckedContinuation<Duration?, Never>?
        var rtt: Duration?
    }

    /// The receive waiting for a frame, and which wait it is (``WebSocketSession/nextFrame(generation:)``).
    fileprivate struct Consumer {
        var wait: Int
        var continuation: CheckedContinuation<Void, Never>
    }

    private struct State {
        var link: (any WebSocketLink)?
        var generation = 0
        var resumeToken: String?
        var sessionId: String?
        /// What the server's session is subscribed to.
        var serverChannels: [String] = []
        var serverGroups: [String] = []
        /// The filter expression the server's session holds (nil: none), as far as the client knows.
        var serverFilter: String?
        /// Whether the session has a subscription flowing (subscribed, or resumed).
        var subscribed = false
        /// The cursor deliveries continue from: the last `messages` frame handed out, or where
        /// the subscription or resume started.
        var expected: Timetoken?
        /// The server's cursor in the last `welcome`.
        var welcomeCursor: Timetoken?
        /// Server frames not yet consumed, for the current generation.
        var frames: [SessionFrame.Server] = []
        var closure: (code: UInt16?, reason: String)?
        /// The receive waiting for a frame. Resumed only after the lock is released: a
        /// cancellation handler takes this lock while the runtime holds the cancelled task's
        /// status lock, which resuming a continuation also takes — resuming under this lock
        /// could deadlock against it.
        var consumer: Consumer?
        var nextWait = 0
        var drainDelay: Duration?
        /// The origin the current socket was opened to.
        var origin: String?
        var lastFrameAt: Duration = .zero
        var nextPing = 0
        var pings: [Int: Ping] = [:]
        var isShutDown = false
        /// When the engine's current receive began waiting for a `messages` frame.
        var receiveWaitingSince: Duration?
        /// The current receive has waited long enough: answer it empty, as a long-poll would.
        var quietDue = false
        /// A socket the server (or the network) closed while no receive was waiting on it: the
        /// next receive reports the loss, so the engine's retry policy and connection events run
        /// instead of a silent reopen.
        var unnoticedLoss: Int?
        /// Names the server refused or revoked while others kept flowing: not subscribed again
        /// until the app changes its subscription, calls `connect()`/`reconnect()`, or a new
        /// session starts.
        var deniedChannels: Set<String> = []
        var deniedGroups: Set<String> = []
        /// The current socket's `hello` was answered by `welcome`: only then is it usable.
        var welcomed = false
        /// Frames to send, in order, each for its socket generation: the subscription's changes
        /// are queued under the lock that changes the client's picture of it, so the server gets
        /// them in the order the client made them (a quick `unsubscribe` then `subscribe` of one
        /// name cannot reach it reversed). One task at a time sends a socket's frames (`flushing`).
        var outgoing: [(generation: Int, text: String)] = []
        /// The socket generation whose frame is being sent, if one is. Per socket: a send stuck on
        /// a socket being let go does not hold the next socket's `hello`.
        var flushing: Int?
        /// Flushes waiting for the task sending the current socket's frames (their frames among
        /// them) to finish: woken when a flush finds nothing more to send, when the socket goes
        /// away (its frames go with it), and one by one when cancelled.
        var flushWaiters: [(id: Int, continuation: CheckedContinuation<Void, Never>)] = []
        var nextFlushWaiter = 0
        /// The engine's current receive (``startReceive()``): a receive holding another ticket
        /// was replaced, and changes nothing. Set in the engine's action loop, in the machine's
        /// order — a replaced receive's task learns of its cancellation only later.
        var receiveTicket = 0
        /// Counts ``beginClose(bye:)``: an opening that began before a close does not install
        /// its socket (it would resume the session the close ended).
        var closeEpoch = 0
        /// A socket is being opened; others wait for it in `openWaiters`.
        var opening = false
        var openWaiters: [CheckedContinuation<Void, Never>] = []
    }

    private let state = Mutex(State())
    private let connector: any WebSocketConnector
    private let configuration: TetherConfiguration
    private let clock: ElapsedClock
    private let links: AsyncStream<(any WebSocketLink, Int)>
    private let linkSink: AsyncStream<(any WebSocketLink, Int)>.Continuation
    private let report: @Sendable (SessionReport) -> Void
    private let logger: Logger
    /// Where sockets are opened (the primary or a fallback origin); told about failed openings
    /// and drains.
    private let origins: OriginRouter
    /// The client's token (``TetherClient/setToken(_:)``), sent with every `hello`.
    private let authToken: AuthTokenStore

    init(connector: any WebSocketConnector, configuration: TetherConfiguration, clock: ElapsedClock, origins: OriginRouter,
         authToken: AuthTokenStore? = nil, report: @escaping @Sendable (SessionReport) -> Void) {
        self.connector = connector
        self.authToken = authToken ?? AuthTokenStore(configuration.authKey)
        self.origins = origins
        self.configuration = configuration
        self.clock = clock
        self.report = report
        self.logger = configuration.logger
        (links, linkSink) = AsyncStream.makeStream(of: (any WebSocketLink, Int).self)
    }

    /// The URL of the session endpoint at `origin`.
    func url(of origin: String) -> String { (configuration.useTLS ? "wss://" : "ws://") + origin + WebSocketProtocol.path }

    /// Whether a socket is open (after `welcome`).
    var isOpen: Bool { state.withLock { $0.link != nil && $0.welcomed } }

    /// Whether a receive is waiting for a frame (tests).
    var hasWaitingReceive: Bool { state.withLock { $0.consumer != nil } }

    /// Reads every open socket (answering pings, queueing frames) and runs its inactivity pings,
    /// until ``finish()``.
    func run() async {
        await withDiscardingTaskGroup { group in
            for await (link, generation) in links {
                group.addTask { [self] in await serve(link, generation: generation) }
            }
        }
    }

    /// Closes the socket (sending `bye` first when `bye`) and stops ``run()``.
    func finish() async {
        await close(bye: false)
        state.withLock { $0.isShutDown = true }
        linkSink.finish()
    }

    // MARK: - The engine's calls

    /// One "subscribe request" over the session: `cursor` nil is the handshake (the socket is
    /// opened or resumed; the answer carries the session's cursor and no events); otherwise the
    /// next `messages` frame after `cursor`. `opened` runs once a welcomed socket is in hand.
    func receive(channels: [String], groups: [String], cursor: Timetoken?, filter: String?, ticket: Int? = nil,
                 opened: @Sendable () -> Void = {}) async throws(SessionFailure)
        -> (response: SubscribeResponse, gaps: [RetentionGap])
    {
        do {
            return try await receiveOnce(channels: channels, groups: groups, cursor: cursor, filter: filter, ticket: ticket,
                                         opened: opened)
        } catch {
            // Whatever the engine's current receive throws, the engine runs its retry policy for:
            // a loss of the socket marked unreported (``State/unnoticedLoss``) is reported by it,
            // and the next receive must not fail at once with it again (that cost a second retry
            // delay). A cancelled or replaced receive's failure is stale to the engine: it reports
            // nothing.
            let reporting = !Task.isCancelled
            state.withLock { state in
                if reporting, ticket.map({ $0 == state.receiveTicket }) ?? true { state.unnoticedLoss = nil }
            }
            throw error
        }
    }

    private func receiveOnce(channels: [String], groups: [String], cursor: Timetoken?, filter: String?, ticket: Int?,
                             opened: @Sendable () -> Void) async throws(SessionFailure)
        -> (response: SubscribeResponse, gaps: [RetentionGap])
    {
        // A socket lost while no receive waited is reported, not reopened: checked where the
        // opening is decided, so a loss an instant before cannot be reopened silently.
        let filter = filter.flatMap { $0.isEmpty ? nil : $0 }
        let (openGeneration, openedNow) = try await open(resumeCursor: cursor ?? state.withLock { $0.expected }, reportingLoss: true)
        var generation = openGeneration
        opened()
        guard let cursor else {
            let (subscribed, expected, welcome) = state.withLock { ($0.subscribed, $0.expected, $0.welcomeCursor) }
            if subscribed,
               case let added = try await reconcile(channels: channels, groups: groups, filter: filter, ticket: ticket, generation: generation),
               !(added.channels.isEmpty && added.groups.isEmpty) {
                // The handshake succeeds only once the server took the names: a revoked grant
                // fails it (as a long-poll handshake's 403 would) instead of reporting
                // `reconnected` and failing the next poll.
                _ = try await awaitSubscribeAnswer(added: added, channels: channels, groups: groups, generation: generation)
            }
            if !subscribed && !openedNow {
                // The socket was opened before this handshake (`open()`, `connect()`): its
                // welcome's cursor is as old as the socket, and starting there would replay what
                // was published since. A handshake starts now, as a long-poll's does: at the
                // server's cursor of this moment.
                let start = try await serverCursor(generation: generation)
                return (SubscribeResponse(timetoken: start ?? welcome ?? Timetoken(0), region: 1, events: []), [])
            }
            // A resumed session's welcome carries the server's cursor: the engine catches up from
            // its own cursor to there (the replay ends with a frame at or past it), so the
            // continuity outcome counts what was replayed.
            let start = subscribed ? max(expected ?? Timetoken(0), welcome ?? Timetoken(0)) : welcome ?? Timetoken(0)
            return (SubscribeResponse(timetoken: start, region: 1, events: []), [])
        }
        let (subscribed, expected) = state.withLock { ($0.subscribed, $0.expected) }
        if subscribed && expected != cursor {
            // The engine asks from another point (a rewind, a switch of wire): resume from it.
            await drop(generation: generation)
            generation = try await open(resumeCursor: cursor).generation
        }
        enum First { case replaced, closed, subscribed, queued }
        let first = state.withLock { state -> First in
            // (A replaced receive subscribes nothing: see ``reconcile``.)
            if Task.isCancelled || ticket.map({ $0 != state.receiveTicket }) == true { return .replaced }
            if state.subscribed { return .subscribed }
            guard Self.enqueue(SessionFrame.subscribe(channels: channels, groups: groups, cursor: cursor, filter: filter),
                               generation: generation, in: &state) else { return .closed }
            state.subscribed = true
            state.serverChannels = channels
            state.serverGroups = groups
            state.serverFilter = filter
            state.expected = cursor
            return .queued
        }
        switch first {
        case .replaced: throw SessionFailure(error: TetherError(Status(category: .cancelled, operation: .subscribe)))
        case .closed: throw closedFailure(generation: generation)
        case .subscribed: _ = try await reconcile(channels: channels, groups: groups, filter: filter, ticket: ticket, generation: generation)
        case .queued: try await flush(generation: generation)
        }
        state.withLock { state in
            state.receiveWaitingSince = clock.now()
            state.quietDue = false
        }
        defer { state.withLock { $0.receiveWaitingSince = nil } }
        while true {
            guard let frame = try await nextFrame(generation: generation) else {
                // Quiet for a long-poll's duration: answer with no events (before the engine's watchdog).
                let current = state.withLock { $0.expected } ?? cursor
                return (SubscribeResponse(timetoken: current, region: 1, events: []), [])
            }
            switch frame {
            case .messages(let response, let gaps):
                // A frame continues this receive only if nothing was taken since its cursor: a
                // receive the engine replaced (a restart) may have taken one an instant before its
                // cancellation, and that answer went nowhere. Then the session rewinds to this
                // receive's cursor and the server replays — nothing is lost.
                let continues = state.withLock { state -> Bool in
                    guard state.expected == cursor else { return false }
                    state.expected = response.timetoken
                    return true
                }
                guard continues else {
                    await drop(generation: generation)
                    generation = try await open(resumeCursor: cursor).generation
                    continue
                }
                return (response, gaps)
            case .subscribed, .unsubscribed:
                // Acknowledgements: the client's picture of the session already has the change
                // (made with the frame), and changes queued after this one — taking it from here
                // could bring back a name left since. Refused names come as notices.
                continue
            case .notice(.accessDenied(let deniedChannels, let deniedGroups, let message)):
                _ = try denied(deniedChannels, deniedGroups, message: message, channels: channels, groups: groups)
            case .error(let code, let message):
                if let failure = Self.failure(errorCode: code, message: message, channels: channels, groups: groups) {
                    // Nothing of a refused subscribe was applied: subscribe again after the retry.
                    state.withLock { $0.subscribed = false }
                    await drop(generation: generation)
                    throw failure
                }
            case .welcome, .ack, .ping, .pong, .unknown, .notice:
                continue
            }
        }
    }

    /// Opens (or resumes) the session's socket unless one is open, without touching the
    /// subscription: ``TetherClient/open()``.
    func openSession() async throws(SessionFailure) {
        _ = try await open(resumeCursor: state.withLock { $0.expected })
    }

    /// The server's cursor now, for a session that has no subscription yet: a `subscribe` with
    /// no names changes nothing and is answered with `subscribed` at the server's cursor. The
    /// subscription itself is left to the engine's first receive, which starts it from whatever
    /// cursor the engine chose (this one, or the app's own timetoken). Nil when the answer
    /// carried none.
    private func serverCursor(generation: Int) async throws(SessionFailure) -> Timetoken? {
        try await send(SessionFrame.subscribe(channels: [], groups: [], cursor: nil, filter: nil), generation: generation)
        return try await awaitSubscribeAnswer(added: ([], []), channels: [], groups: [], generation: generation)
    }

    /// The app removed names: the session stops delivering them (`unsubscribe` sends the leave).
    /// Takes them out of the session's picture and queues the frame at once, so a `subscribe` of
    /// the same names that follows is queued after it; ``flushOutgoing()`` sends it. False when no
    /// session is subscribed (the caller sends a REST leave).
    func leave(channels: [String], groups: [String]) -> Bool {
        state.withLock { state -> Bool in
            // A receive started before the leave holds the lists from before it: it is replaced
            // (the machine restarts the receive with the lists after it, in a later action, and
            // the old one must not subscribe the left names again in between).
            state.receiveTicket += 1
            guard state.link != nil && state.subscribed else { return false }
            let leavingChannels = channels.filter(state.serverChannels.contains)
            let leavingGroups = groups.filter(state.serverGroups.contains)
            guard !(leavingChannels.isEmpty && leavingGroups.isEmpty) else { return true }
            _ = Self.enqueue(SessionFrame.unsubscribe(channels: leavingChannels, groups: leavingGroups), generation: state.generation,
                             in: &state)
            state.serverChannels.removeAll { leavingChannels.contains($0) }
            state.serverGroups.removeAll { leavingGroups.contains($0) }
            return true
        }
    }

    /// The engine starts a receive (in its action loop, in the machine's order): returns its
    /// ticket for ``receive(channels:groups:cursor:filter:ticket:opened:)``. Every receive
    /// started before is replaced: it no longer changes the session's subscription.
    func startReceive() -> Int {
        state.withLock { state in
            state.receiveTicket += 1
            return state.receiveTicket
        }
    }

    /// The engine cancelled its receive without starting another.
    func endReceive() {
        state.withLock { $0.receiveTicket += 1 }
    }

    /// Sends the queued frames (``leave(channels:groups:)``'s).
    func flushOutgoing() async {
        let generation = state.withLock { $0.generation }
        try? await flush(generation: generation)
    }

    /// A `ping` frame and its round-trip time; fails when no socket is open or no `pong` comes
    /// within `timeout`.
    func ping(timeout: Duration) async throws(TetherError) -> Duration {
        let opened = state.withLock { state -> (any WebSocketLink, Int)? in
            guard let link = state.link else { return nil }
            state.nextPing += 1
            state.pings[state.nextPing] = Ping(sentAt: clock.now())
            return (link, state.nextPing)
        }
        guard let (link, id) = opened else {
            throw TetherError(Status(category: .networkIssues, operation: .time, serverMessage: "no WebSocket session is open"))
        }
        // Not awaited: behind a write the peer never reads, the ping never goes out, and the
        // timeout below is what tells. The write ends when the socket closes (the inactivity
        // watch or the engine's probe gives a socket with stuck writes up).
        Task { try? await link.send(SessionFrame.ping(id: id)) }
        let rtt: Duration? = await withTaskGroup(of: Duration?.self) { race in
            race.addTask { [self] in
                await withCheckedContinuation { (reply: CheckedContinuation<Duration?, Never>) in
                    let ready = state.withLock { state -> Duration?? in
                        guard var ping = state.pings[id] else { return .some(nil) }
                        if let rtt = ping.rtt {
                            state.pings[id] = nil
                            return .some(rtt)
                        }
                        ping.reply = reply
                        state.pings[id] = ping
                        return .none
                    }
                    if let ready { reply.resume(returning: ready) }
                }
            }
            race.addTask { [self] in
                try? await clock.sleep(timeout)
                return nil
            }
            let first = await race.next() ?? nil
            if first == nil {
                state.withLock { $0.pings.removeValue(forKey: id) }?.reply?.resume(returning: nil)
            }
            race.cancelAll()
            return first
        }
        guard let rtt else { throw TetherError(Status(category: .timeout, operation: .time, serverMessage: "no pong within \(timeout)")) }
        return rtt
    }

    /// Closes the socket; with `bye` the server ends the session (presence leave) and the resume
    /// token is forgotten, otherwise the server keeps the session for its keep-alive window.
    func close(bye: Bool) async {
        await beginClose(bye: bye).finish()
    }

    /// A socket taken out of the session by ``beginClose(bye:)``: its `bye` and close, still to do.
    struct ClosingSocket: Sendable {
        fileprivate let link: (any WebSocketLink)?
        fileprivate let consumer: Consumer?
        fileprivate let bye: Bool

        /// Lets the waiting receive go, sends `bye` when asked, and closes the socket.
        func finish() async {
            consumer?.continuation.resume()
            guard let link else { return }
            // `bye` goes with the close, not awaited: a socket whose writes are stuck still closes.
            await link.close(code: WebSocketCloseCode.normal, sendingFirst: bye ? SessionFrame.bye : nil)
        }
    }

    /// ``close(bye:)``'s change of the session, at once: from here on no receive uses the socket
    /// or (with `bye`) the resume token, so a `subscribe` right after `unsubscribeAll()` opens a
    /// new session instead of racing the `bye` of the old one. The caller must call
    /// ``ClosingSocket/finish()``.
    func beginClose(bye: Bool) -> ClosingSocket {
        let (closing, waiters) = state.withLock { state in (Self.beginClose(bye: bye, in: &state), Self.takeFlushWaiters(&state)) }
        for waiter in waiters { waiter.resume() }
        return closing
    }

    private static func beginClose(bye: Bool, in state: inout State) -> ClosingSocket {
        defer {
            state.closeEpoch += 1
            state.link = nil
            state.generation += 1
            state.unnoticedLoss = nil
            state.subscribed = false
            state.outgoing = []
            if bye { state.resumeToken = nil; state.expected = nil }
            state.consumer = nil
        }
        return ClosingSocket(link: state.link, consumer: state.consumer, bye: bye)
    }

    /// The flushes waiting on the current socket's sender, to resume once the lock is released
    /// (the socket changed or went away: what they queued went with it, or was sent).
    private static func takeFlushWaiters(_ state: inout State) -> [CheckedContinuation<Void, Never>] {
        defer { state.flushWaiters = [] }
        return state.flushWaiters.map(\.continuation)
    }

    /// The app goes to the background (``BackgroundPolicy/suspend(keepAlive:keepPresence:)``): asks the
    /// server to keep the session — subscription, cursor, presence unless `keepPresence` is
    /// false — for `keepAlive`, then closes
    /// the socket without `bye`. The resume token is kept, so the next receive resumes the session.
    /// Without an open socket there is nothing to tell; the server keeps the session for its
    /// ordinary keep-alive.
    func suspend(keepAlive: Duration, keepPresence: Bool, push: BackgroundPushDevice? = nil) async {
        let seconds = Int(min(max(keepAlive.components.seconds, 1), 86_400))
        // Queued behind the subscription changes not yet sent (an `unsubscribe` the app made
        // just before), which the close would otherwise drop: the server keeps what the app left.
        // Only on a welcomed socket: the server's first frame must be `hello`.
        let frame = SessionFrame.suspend(keepAliveSeconds: seconds, presence: keepPresence, push: push)
        let generation = state.withLock { state -> Int? in
            guard state.welcomed, Self.enqueue(frame, generation: state.generation, in: &state) else { return nil }
            return state.generation
        }
        guard let generation else {
            await close(bye: false)
            return
        }
        // Closed once nothing is left to send: a leave queued while the suspend was sent goes
        // too (a leave after the close finds no socket and is sent over REST).
        while true {
            try? await flush(generation: generation)
            // A cancelled flush returns before its frames are sent: then the socket is let go.
            let cancelled = Task.isCancelled
            let closing = state.withLock { state -> (ClosingSocket, [CheckedContinuation<Void, Never>])? in
                if !cancelled, state.generation == generation, state.link != nil,
                   state.flushing == generation || state.outgoing.contains(where: { $0.generation == generation }) {
                    return nil
                }
                return (Self.beginClose(bye: false, in: &state), Self.takeFlushWaiters(&state))
            }
            if let (closing, waiters) = closing {
                for waiter in waiters { waiter.resume() }
                await closing.finish()
                return
            }
        }
    }

    /// Whether the client holds a session the server may keep (a resume token).
    var holdsSession: Bool { state.withLock { $0.resumeToken != nil } }

    // MARK: - Opening

    /// Opens (or resumes) the session unless a socket is open; returns the socket's generation,
    /// and whether this call opened it (false: it was open, or another caller opened it).
    /// One opening at a time: a caller that finds another opening in progress waits for it and
    /// uses its socket (the engine's receive and ``TetherClient/open()`` may race).
    ///
    /// With `reportingLoss`, a socket lost while no receive waited on it (``State/unnoticedLoss``)
    /// fails this call with the loss instead of being reopened, in the same step that would
    /// reopen it: the engine's retry policy and connection events run for it.
    private func open(resumeCursor: Timetoken?, reportingLoss: Bool = false) async throws(SessionFailure)
        -> (generation: Int, opened: Bool)
    {
        while true {
            enum Gate { case open(Int), shutDown, busy, mine, lost(Int) }
            let gate = state.withLock { state -> Gate in
                if reportingLoss, let lost = state.unnoticedLoss {
                    state.unnoticedLoss = nil
                    return .lost(lost)
                }
                if state.opening { return .busy }
                if state.link != nil && state.welcomed { return .open(state.generation) }
                if state.isShutDown { return .shutDown }
                state.opening = true
                return .mine
            }
            switch gate {
            case .open(let generation): return (generation, false)
            case .shutDown: throw SessionFailure(error: TetherError(Status(category: .cancelled, operation: .subscribe)))
            case .lost(let generation): throw closedFailure(generation: generation)
            case .busy:
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let done = state.withLock { state -> Bool in
                        guard state.opening else { return true }
                        state.openWaiters.append(continuation)
                        return false
                    }
                    if done { continuation.resume() }
                }
                continue
            case .mine:
                let result: Result<Int, SessionFailure>
                do { result = .success(try await openSocket(resumeCursor: resumeCursor)) } catch { result = .failure(error) }
                let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
                    state.opening = false
                    defer { state.openWaiters = [] }
                    return state.openWaiters
                }
                for waiter in waiters { waiter.resume() }
                return (try result.get(), true)
            }
        }
    }

    /// Opens the socket and plays `hello` → `welcome` (with the resume token when there is one).
    private func openSocket(resumeCursor: Timetoken?) async throws(SessionFailure) -> Int {
        let (token, epoch) = state.withLock { ($0.resumeToken, $0.closeEpoch) }
        let origin = origins.next()
        let link: any WebSocketLink
        do {
            link = try await connector.connect(url: url(of: origin), subprotocol: WebSocketProtocol.jsonSubprotocol,
                                               timeout: configuration.connectTimeout)
        } catch {
            var failure = Self.failure(error)
            failure.error.status.origin = origin
            // A node that does not accept the socket (refused, unreachable, timed out, TLS, a
            // 503 while it drains) sends the next opening to the next origin; the resume token
            // goes along (a node that does not hold the session answers `sessionExpired`).
            origins.failed(at: origin, status: failure.error.status)
            throw failure
        }
        // The node accepted the socket: a fallback being tried is kept (until the primary's turn).
        origins.answered(at: origin)
        var staleWaiters: [CheckedContinuation<Void, Never>] = []
        let installed = state.withLock { state -> Int? in
            // Closed while connecting: the socket is not used (with its token it would resume the
            // session the close ended).
            guard state.closeEpoch == epoch else { return nil }
            staleWaiters = Self.takeFlushWaiters(&state)
            state.generation += 1
            state.unnoticedLoss = nil
            state.link = link
            state.welcomed = false
            state.frames = []
            state.closure = nil
            state.subscribed = false
            state.drainDelay = nil
            state.origin = origin
            state.lastFrameAt = clock.now()
            return state.generation
        }
        for waiter in staleWaiters { waiter.resume() }
        guard let generation = installed else {
            await link.close(code: WebSocketCloseCode.normal)
            throw SessionFailure(error: TetherError(Status(category: .cancelled, operation: .subscribe,
                                                           serverMessage: "the session was closed while the socket opened")))
        }
        linkSink.yield((link, generation))
        // A socket is usable only once welcomed: an exchange that fails or is cancelled (a
        // network change restarting the handshake) drops it, so the next opening starts afresh
        // instead of finding a half-open socket whose `welcome` nobody read.
        do { return try await helloExchange(token: token, resumeCursor: resumeCursor, generation: generation) } catch {
            await drop(generation: generation)
            throw error
        }
    }

    /// `hello` (with the resume token when there is one) → `welcome` on socket `generation`.
    private func helloExchange(token: String?, resumeCursor: Timetoken?, generation: Int) async throws(SessionFailure) -> Int {
        let resume = token.flatMap { token in resumeCursor.map { (token: token, cursor: Optional($0)) } }
        try await send(SessionFrame.hello(subscribeKey: configuration.subscribeKey, publishKey: configuration.publishKey,
                                          uuid: configuration.userId, auth: authToken.current, resume: resume),
                       generation: generation)
        var expiredReported = false
        while true {
            guard let frame = try await nextFrame(generation: generation) else { continue }
            switch frame {
            case .notice(.sessionExpired(let message)):
                expiredReported = true
                report(.expired(message: message))
            case .welcome(let welcome):
                state.withLock { state in
                    state.welcomed = true
                    state.resumeToken = welcome.resumeToken
                    state.sessionId = welcome.sessionId
                    state.welcomeCursor = welcome.cursor
                    if welcome.resumed {
                        state.subscribed = true
                        state.serverChannels = welcome.channels
                        state.serverGroups = welcome.groups
                        state.serverFilter = welcome.filter
                        state.expected = resumeCursor
                    } else {
                        state.subscribed = false
                        state.serverChannels = []
                        state.serverGroups = []
                        state.serverFilter = nil
                        state.deniedChannels = []
                        state.deniedGroups = []
                    }
                }
                if welcome.resumed {
                    report(.resumed(sessionId: welcome.sessionId))
                } else if resume != nil && !expiredReported {
                    report(.expired(message: "the server did not resume the session"))
                }
                logger.debug("websocket session open", metadata: ["session": "\(welcome.sessionId)", "resumed": "\(welcome.resumed)"])
                return generation
            case .error(let code, let message):
                await drop(generation: generation)
                throw Self.failure(errorCode: code, message: message, channels: [], groups: [])
                    ?? SessionFailure(error: TetherError(Status(category: .badRequest, operation: .subscribe, serverMessage: message)))
            case .subscribed, .unsubscribed, .messages, .ack, .ping, .pong, .notice, .unknown:
                continue
            }
        }
    }

    /// Sends `subscribe` / `unsubscribe` for the difference between the wanted and the session's
    /// lists, and the filter expression when the session's differs (a resumed session whose
    /// first `subscribe`, which carried it, was refused or lost with its socket).
    /// Returns the names a `subscribe` was sent for.
    @discardableResult
    private func reconcile(channels: [String], groups: [String], filter: String?, ticket: Int?, generation: Int)
        async throws(SessionFailure)
        -> (channels: [String], groups: [String])
    {
        // The difference, its frames and the client's new picture of the session in one step:
        // a leave or another reconcile cannot slip between them.
        enum Outcome { case cancelled, closed, added(channels: [String], groups: [String], queued: Bool) }
        let outcome = state.withLock { state -> Outcome in
            // A receive the engine replaced changes nothing: its replacement, started after the
            // cancellation, may already have reconciled the newer lists.
            if Task.isCancelled || ticket.map({ $0 != state.receiveTicket }) == true { return .cancelled }
            guard state.generation == generation, state.link != nil else { return .closed }
            // Names the app no longer wants are no longer "denied": subscribing to them later tries again.
            state.deniedChannels.formIntersection(channels)
            state.deniedGroups.formIntersection(groups)
            let (serverChannels, serverGroups, deniedChannels, deniedGroups) =
                (state.serverChannels, state.serverGroups, state.deniedChannels, state.deniedGroups)
            let addedChannels = channels.filter { !serverChannels.contains($0) && !deniedChannels.contains($0) }
            let addedGroups = groups.filter { !serverGroups.contains($0) && !deniedGroups.contains($0) }
            let removedChannels = serverChannels.filter { !channels.contains($0) }
            let removedGroups = serverGroups.filter { !groups.contains($0) }
            var queued = false
            if !addedChannels.isEmpty || !addedGroups.isEmpty || state.serverFilter != filter {
                // With the cursor the client holds: a server ignores it on a session that has
                // subscribed before, and starts there on a resumed one that never did (its first
                // subscribe refused or lost), instead of at its current cursor. The filter goes
                // with every `subscribe` (`""` removes one the session should not have).
                _ = Self.enqueue(SessionFrame.subscribe(channels: addedChannels, groups: addedGroups, cursor: state.expected,
                                                        filter: state.serverFilter != filter ? filter ?? "" : filter),
                                 generation: generation, in: &state)
                state.serverFilter = filter
                queued = true
            }
            if !removedChannels.isEmpty || !removedGroups.isEmpty {
                _ = Self.enqueue(SessionFrame.unsubscribe(channels: removedChannels, groups: removedGroups), generation: generation,
                                 in: &state)
                queued = true
            }
            state.serverChannels = channels.filter { !deniedChannels.contains($0) }
            state.serverGroups = groups.filter { !deniedGroups.contains($0) }
            return .added(channels: addedChannels, groups: addedGroups, queued: queued)
        }
        switch outcome {
        case .cancelled: throw SessionFailure(error: TetherError(Status(category: .cancelled, operation: .subscribe)))
        case .closed: throw closedFailure(generation: generation)
        case .added(let channels, let groups, let queued):
            // Nothing queued: nothing to wait for (a send in progress is not this receive's).
            if queued { try await flush(generation: generation) }
            return (channels, groups)
        }
    }

    /// Waits for the server's answer to a `subscribe`: `subscribed` (the names it took), or an
    /// access-denied notice or error, handled as ``receive(channels:groups:cursor:filter:)``
    /// handles them. Deliveries that arrive first stay queued, in order, for the next receive.
    /// Returns the cursor the `subscribed` answer carried.
    @discardableResult
    private func awaitSubscribeAnswer(added: (channels: [String], groups: [String]), channels: [String], groups: [String],
                                      generation: Int) async throws(SessionFailure) -> Timetoken? {
        var cursor: Timetoken?
        var held: [SessionFrame.Server] = []
        defer {
            if !held.isEmpty {
                state.withLock { state in
                    if state.generation == generation { state.frames.insert(contentsOf: held, at: 0) }
                }
            }
        }
        while true {
            guard let frame = try await nextFrame(generation: generation) else { continue }
            switch frame {
            case .subscribed(let subscribedChannels, let subscribedGroups, let at):
                // (The client's picture already has the names; see ``receive``.)
                cursor = at
                // Names left out were refused: their notice follows.
                if added.channels.allSatisfy(subscribedChannels.contains) && added.groups.allSatisfy(subscribedGroups.contains) {
                    return cursor
                }
            case .notice(.accessDenied(let deniedChannels, let deniedGroups, let message)):
                if try denied(deniedChannels, deniedGroups, message: message, channels: channels, groups: groups) { return cursor }
            case .error(let code, let message):
                if let failure = Self.failure(errorCode: code, message: message, channels: channels, groups: groups) {
                    state.withLock { $0.subscribed = false }
                    await drop(generation: generation)
                    throw failure
                }
            case .messages:
                held.append(frame)
            case .welcome, .ack, .ping, .pong, .unknown, .notice, .unsubscribed:
                continue
            }
        }
    }

    /// An access-denied notice: true when other names keep flowing (reported, not thrown);
    /// throws when nothing is left.
    private func denied(_ deniedChannels: [String], _ deniedGroups: [String], message: String, channels: [String], groups: [String])
        throws(SessionFailure) -> Bool
    {
        let othersFlow = state.withLock { state -> Bool in
            state.serverChannels.removeAll { deniedChannels.contains($0) }
            state.serverGroups.removeAll { deniedGroups.contains($0) }
            guard !state.serverChannels.isEmpty || !state.serverGroups.isEmpty else { return false }
            state.deniedChannels.formUnion(deniedChannels)
            state.deniedGroups.formUnion(deniedGroups)
            return true
        }
        guard othersFlow else {
            throw SessionFailure(error: TetherError(Status(
                category: .accessDenied, operation: .subscribe, statusCode: 403, serverMessage: message, affectedChannels: channels,
                affectedGroups: groups, deniedChannels: deniedChannels, deniedGroups: deniedGroups)))
        }
        // Only these names end; the session keeps delivering the others.
        report(.partlyDenied(channels: deniedChannels, groups: deniedGroups, message: message))
        return true
    }

    /// Forgets the names access was denied for, so the next receive subscribes to them again
    /// (``TetherClient/connect()``, ``TetherClient/reconnect(timetoken:)``: the app says "try now").
    func forgetDenied() {
        state.withLock { state in
            state.deniedChannels = []
            state.deniedGroups = []
        }
    }

    // MARK: - Frames

    private func send(_ text: String, generation: Int) async throws(SessionFailure) {
        guard state.withLock({ Self.enqueue(text, generation: generation, in: &$0) }) else { throw closedFailure(generation: generation) }
        try await flush(generation: generation)
    }

    /// Queues `text` for socket `generation`; false when that socket is gone.
    private static func enqueue(_ text: String, generation: Int, in state: inout State) -> Bool {
        guard state.generation == generation, state.link != nil else { return false }
        state.outgoing.append((generation, text))
        return true
    }

    /// Sends socket `generation`'s queued frames in order and returns once the frames queued
    /// before the call are sent (or the socket is gone). When another call is sending them, it
    /// sends this caller's too, after what was queued before them, and this call waits for it.
    /// A socket that cannot be written is given up: the retry opens a new one and resumes,
    /// instead of finding this one still "open"; the failure is thrown when this call sent the
    /// frame, and otherwise found by the caller's next wait on its socket.
    private func flush(generation: Int) async throws(SessionFailure) {
        enum Next { case send(any WebSocketLink, String), busy, done }
        var failure: SessionFailure?
        while true {
            let next = state.withLock { state -> Next in
                // The caller's socket is gone, and its frames with it.
                guard state.generation == generation, let link = state.link else { return .done }
                // Another task is sending this socket's frames: it sends ours too.
                if state.flushing == generation { return .busy }
                while let first = state.outgoing.first {
                    state.outgoing.removeFirst()
                    // Frames for a socket that is gone are dropped with it.
                    if first.generation == generation {
                        state.flushing = generation
                        return .send(link, first.text)
                    }
                }
                return .done
            }
            switch next {
            case .send(let link, let text):
                do { try await link.send(text) } catch {
                    failure = SessionFailure(error: TetherError(Status(category: error.category, operation: .subscribe, error: error)))
                    state.withLock { if $0.flushing == generation { $0.flushing = nil } }
                    await drop(generation: generation)
                    continue
                }
                state.withLock { if $0.flushing == generation { $0.flushing = nil } }
            case .busy:
                // Woken when a flush finds nothing more to send or the socket goes; then looks
                // again. A cancelled caller stops waiting (its frames stay queued in order).
                if Task.isCancelled { return }
                let id = state.withLock { state -> Int in
                    state.nextFlushWaiter += 1
                    return state.nextFlushWaiter
                }
                await withTaskCancellationHandler {
                    await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                        let done = state.withLock { state -> Bool in
                            guard state.flushing == generation, state.generation == generation, state.link != nil, !Task.isCancelled
                            else { return true }
                            state.flushWaiters.append((id, continuation))
                            return false
                        }
                        if done { continuation.resume() }
                    }
                } onCancel: {
                    let mine = state.withLock { state -> CheckedContinuation<Void, Never>? in
                        guard let index = state.flushWaiters.firstIndex(where: { $0.id == id }) else { return nil }
                        return state.flushWaiters.remove(at: index).continuation
                    }
                    mine?.resume()
                }
                if Task.isCancelled { return }
            case .done:
                let waiters = state.withLock { Self.takeFlushWaiters(&$0) }
                for waiter in waiters { waiter.resume() }
                if let failure { throw failure }
                return
            }
        }
    }

    /// The next server frame of the socket `generation`, waiting for it; throws once that socket
    /// is closed (or the caller is cancelled).
    /// nil: the receive waited ``quietAnswer`` without a delivery.
    private func nextFrame(generation: Int) async throws(SessionFailure) -> SessionFrame.Server? {
        while true {
            enum Next { case frame(SessionFrame.Server), closed, quiet, wait }
            let next = state.withLock { state -> Next in
                guard state.generation == generation else { return .closed }
                // A cancelled receive leaves the frames to the one that replaced it.
                if !state.frames.isEmpty && !Task.isCancelled { return .frame(state.frames.removeFirst()) }
                if state.closure != nil || state.link == nil { return .closed }
                if state.quietDue {
                    state.quietDue = false
                    return .quiet
                }
                return .wait
            }
            switch next {
            case .frame(let frame): return frame
            case .quiet: return nil
            case .closed:
                state.withLock { if $0.unnoticedLoss == generation { $0.unnoticedLoss = nil } }
                throw closedFailure(generation: generation)
            case .wait: break
            }
            if Task.isCancelled { throw SessionFailure(error: TetherError(Status(category: .cancelled, operation: .subscribe))) }
            let wait = state.withLock { state -> Int in
                state.nextWait += 1
                return state.nextWait
            }
            await withTaskCancellationHandler {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    // A receive still waiting (one the engine replaced) is let go: it finds its
                    // task cancelled, or the frames left to this one.
                    let (ready, replaced) = state.withLock { state -> (Bool, Consumer?) in
                        if state.generation != generation || !state.frames.isEmpty || state.closure != nil || state.link == nil
                            || state.quietDue || Task.isCancelled { return (true, nil) }
                        defer { state.consumer = Consumer(wait: wait, continuation: continuation) }
                        return (false, state.consumer)
                    }
                    replaced?.continuation.resume()
                    if ready { continuation.resume() }
                }
            } onCancel: {
                // Only this wait's own continuation: another receive's is not resumed from here.
                let mine = state.withLock { state -> Consumer? in
                    guard let consumer = state.consumer, consumer.wait == wait else { return nil }
                    state.consumer = nil
                    return consumer
                }
                mine?.continuation.resume()
            }
        }
    }

    /// Why socket `generation` is gone, as the engine's failure: a drain's delay becomes
    /// `retryAfter`; a close code names its cause.
    private func closedFailure(generation: Int) -> SessionFailure {
        let (closure, drain, origin) = state.withLock {
            ($0.generation == generation ? $0.closure : nil, $0.drainDelay, $0.generation == generation ? $0.origin : nil)
        }
        var status: Status
        switch closure?.code {
        case WebSocketCloseCode.forbidden?:
            status = Status(category: .accessDenied, operation: .subscribe, statusCode: 403, serverMessage: closure?.reason)
        case WebSocketCloseCode.malformed?, WebSocketCloseCode.unknownType?, WebSocketCloseCode.tooManyChannels?:
            status = Status(category: .badRequest, operation: .subscribe, statusCode: 400,
                            serverMessage: "the server closed the session with \(closure?.code ?? 0): \(closure?.reason ?? "")")
        default:
            let failure = TransportFailure.connectionClosed("the WebSocket closed" + (closure?.code.map { " with \($0)" } ?? "")
                + ((closure?.reason).map { $0.isEmpty ? "" : ": \($0)" } ?? ""))
            status = Status(category: failure.category, operation: .subscribe, error: failure)
        }
        status.retryAfter = drain
        status.origin = origin
        return SessionFailure(error: TetherError(status))
    }

    /// A socket taken out of the session (``detachSocket()``): the receive that waited on it
    /// and the socket's close, both still to do, outside every lock (``finish()``).
    struct DetachedSocket: Sendable {
        fileprivate let link: any WebSocketLink
        fileprivate let consumer: Consumer?
        fileprivate let flushWaiters: [CheckedContinuation<Void, Never>]

        /// Lets the waiting receive fail (the socket is gone) and closes the socket.
        func finish() async {
            consumer?.continuation.resume()
            for waiter in flushWaiters { waiter.resume() }
            await link.close(code: WebSocketCloseCode.normal)
        }
    }

    /// Takes the current socket out of the session without `bye` (the server keeps the session
    /// for its keep-alive window), at once: from here on no opening uses it, and the next one
    /// resumes on a new socket. The subscribe engine calls it inside the machine transition
    /// that reacts to a failed probe of the socket, so the reconnection that transition starts
    /// cannot pick up the dead socket, and the receive that waited on it fails only after the
    /// machine moved on (its failure is then stale, not a second reconnection with its own
    /// retry delay). Nothing is resumed here: the caller must call ``DetachedSocket/finish()``
    /// (the waiting receive's own cancellation no longer reaches it). A loss the server caused
    /// before (``State/unnoticedLoss``) is forgotten: the caller's reconnection is its report.
    func detachSocket() -> DetachedSocket? {
        state.withLock { state -> DetachedSocket? in
            state.unnoticedLoss = nil
            return Self.detach(&state)
        }
    }

    /// Drops socket `generation` without `bye` (the server keeps the session).
    private func drop(generation: Int) async {
        let dropped = state.withLock { state in state.generation == generation ? Self.detach(&state) : nil }
        await dropped?.finish()
    }

    /// Takes the open socket, and the receive waiting on it, out of `state` (with the lock held).
    private static func detach(_ state: inout State) -> DetachedSocket? {
        guard let link = state.link else { return nil }
        state.link = nil
        state.closure = state.closure ?? (nil, "dropped by the client")
        defer { state.consumer = nil }
        return DetachedSocket(link: link, consumer: state.consumer, flushWaiters: takeFlushWaiters(&state))
    }

    // MARK: - Reading a socket

    private func serve(_ link: any WebSocketLink, generation: Int) async {
        // The reading decides how long the socket is served; the liveness watch (which may be
        // off, or end early on a dead link) only closes it.
        await withTaskGroup(of: Void.self) { group in
            group.addTask { [self] in await watchLiveness(link, generation: generation) }
            await read(link, generation: generation)
            group.cancelAll()
        }
    }

    private func read(_ link: any WebSocketLink, generation: Int) async {
        for await inbound in link.inbound {
            switch inbound {
            case .text(let text):
                let frame: SessionFrame.Server
                do { frame = try SessionFrame.read(text) } catch {
                    // A frame of an unknown type reads as `.unknown` and is passed over; this one
                    // could not be read at all, and may have carried messages. Skipping it would
                    // lose them behind a cursor the next frame moves on, so the socket is closed
                    // (1002, protocol error) and the session resumes from the last cursor read.
                    logger.warning("websocket frame unreadable; reconnecting from the last cursor", metadata: ["reason": "\(error)"])
                    await link.close(code: WebSocketCloseCode.protocolError)
                    closed(generation: generation, code: WebSocketCloseCode.protocolError, reason: "the server sent a frame the client cannot read (\(error))")
                    return
                }
                let now = clock.now()
                switch frame {
                case .ping(let id):
                    state.withLock { $0.lastFrameAt = now }
                    try? await link.send(SessionFrame.pong(id: id))
                case .pong(let id):
                    let answered = state.withLock { state -> (CheckedContinuation<Duration?, Never>, Duration)? in
                        state.lastFrameAt = now
                        guard let key = id.intValue, var ping = state.pings[key] else { return nil }
                        let rtt = now - ping.sentAt
                        guard let reply = ping.reply else {
                            ping.rtt = rtt
                            state.pings[key] = ping
                            return nil
                        }
                        state.pings[key] = nil
                        return (reply, rtt)
                    }
                    if let (reply, rtt) = answered { reply.resume(returning: rtt) }
                case .notice(.drain(let after, let jitter)):
                    let delay = Duration.milliseconds(after) + .milliseconds(Int.random(in: 0...max(0, jitter)))
                    let origin = state.withLock { state -> String? in
                        state.lastFrameAt = now
                        state.drainDelay = delay
                        return state.generation == generation ? state.origin : nil
                    }
                    // The node is going away: the next socket opens at the next origin (and the
                    // subscribe engine, seeing the move, reconnects at once instead of waiting
                    // out the drain's delay, which is for clients coming back to this node).
                    if let origin { origins.drained(at: origin) }
                default:
                    let consumer = state.withLock { state -> Consumer? in
                        state.lastFrameAt = now
                        guard state.generation == generation else { return nil }
                        state.frames.append(frame)
                        defer { state.consumer = nil }
                        return state.consumer
                    }
                    consumer?.continuation.resume()
                }
            case .closed(let code, let reason):
                closed(generation: generation, code: code, reason: reason)
                return
            }
        }
        closed(generation: generation, code: nil, reason: "the connection closed")
    }

    private func closed(generation: Int, code: UInt16?, reason: String) {
        let (consumer, pings, waiters) = state.withLock {
            state -> (Consumer?, [CheckedContinuation<Duration?, Never>], [CheckedContinuation<Void, Never>]) in
            guard state.generation == generation else { return (nil, [], []) }
            state.closure = state.closure ?? (code, reason)
            if state.link != nil { state.unnoticedLoss = generation }
            state.link = nil
            defer { state.consumer = nil; state.pings = [:] }
            return (state.consumer, state.pings.values.compactMap(\.reply), Self.takeFlushWaiters(&state))
        }
        logger.debug("websocket closed", metadata: ["code": "\(code.map(String.init) ?? "none")", "reason": "\(reason)"])
        consumer?.continuation.resume()
        for waiter in waiters { waiter.resume() }
        for ping in pings { ping.resume(returning: nil) }
    }

    /// Pings after ``WebSocketOptions/inactivityPing`` without a frame; a socket still silent
    /// ``WebSocketOptions/pongTimeout`` after the ping is dead: it is closed, and the engine's
    /// pending receive fails so the retry policy runs. Also answers a receive that has waited
    /// ``quietAnswer`` empty — with the pings off too, or the engine's watchdog would take a
    /// quiet subscription for an outage.
    private func watchLiveness(_ link: any WebSocketLink, generation: Int) async {
        let options = configuration.webSocket
        let pinging = options.inactivityPing > .zero
        var wait = pinging ? options.inactivityPing : quietAnswer
        while !Task.isCancelled {
            do { try await clock.sleep(wait) } catch { return }
            let now = clock.now()
            let (quiet, waitingSince) = state.withLock { state -> (Consumer?, Duration?) in
                guard let since = state.receiveWaitingSince else { return (nil, nil) }
                guard now - since >= quietAnswer else { return (nil, since) }
                state.quietDue = true
                defer { state.consumer = nil }
                return (state.consumer, nil)
            }
            quiet?.continuation.resume()
            // When the waiting receive's quiet answer is due, or a whole quiet answer from now (a
            // receive that starts meanwhile waits at least that long).
            let quietIn = waitingSince.map { max(.milliseconds(1), $0 + quietAnswer - now) } ?? quietAnswer
            guard pinging else {
                wait = quietIn
                continue
            }
            let silence = now - state.withLock { $0.lastFrameAt }
            if silence < options.inactivityPing {
                wait = min(options.inactivityPing - silence, quietIn)
                continue
            }
            let id = state.withLock { state -> Int in
                state.nextPing += 1
                return state.nextPing
            }
            let sentAt = clock.now()
            // Not awaited, as in ``ping(timeout:)``: a socket whose writes are stuck (the peer
            // stopped reading) is as dead as a silent one, and only the timeout can tell.
            Task { try? await link.send(SessionFrame.ping(id: id)) }
            do { try await clock.sleep(options.pongTimeout) } catch { return }
            if state.withLock({ $0.lastFrameAt }) < sentAt {
                logger.debug("websocket dead: no frame after a ping", metadata: ["timeout": "\(options.pongTimeout)"])
                closed(generation: generation, code: nil, reason: "no answer to a ping within \(options.pongTimeout)")
                await link.close(code: WebSocketCloseCode.normal)
                return
            }
            // Also when the waiting receive's quiet answer falls due before the next ping.
            let afterPing = clock.now()
            let stillWaitingSince = state.withLock { $0.receiveWaitingSince }
            wait = min(options.inactivityPing, stillWaitingSince.map { max(.milliseconds(1), $0 + quietAnswer - afterPing) } ?? quietAnswer)
        }
    }

    /// How long a receive waits for a delivery before answering empty, like the server's
    /// long-poll (280 s), and always before the engine's watchdog (``TetherConfiguration/subscribeTimeout`` + 10 s).
    private var quietAnswer: Duration {
        max(.seconds(1), min(.seconds(280), configuration.subscribeTimeout - .seconds(10)))
    }

    // MARK: - Failures

    private static func failure(_ connect: WebSocketConnectFailure) -> SessionFailure {
        switch connect {
        case .transport(let failure):
            return SessionFailure(error: TetherError(Status(category: failure.category, operation: .subscribe, error: failure)))
        case .notUpgraded(let code, let headers):
            var category: StatusCategory
            switch ResponseClassifier.classify(statusCode: code, body: []) {
            case .failure(let classified, _): category = classified
            case .success: category = .badRequest
            }
            if code == 503 || code == 429 { category = .networkIssues }
            var status = Status(category: category, operation: .subscribe, statusCode: code,
                                serverMessage: "the WebSocket upgrade was refused with HTTP \(code)")
            status.retryAfter = TetherClient.retryAfter(statusCode: code, headers: headers)
            return SessionFailure(error: TetherError(status), upgradeRefused: code != 503 && code != 429)
        }
    }

    private static func failure(errorCode: String, message: String, channels: [String], groups: [String]) -> SessionFailure? {
        let category: StatusCategory
        var statusCode = 400
        var retryAfter: Duration?
        switch errorCode {
        case "invalidFilter": category = .malformedFilterExpression
        case "invalidChannel", "malformed", "unknownType", "tooManyChannels": category = .badRequest
        case "forbidden": category = .accessDenied; statusCode = 403
        case "rateLimited": category = .networkIssues; statusCode = 429; retryAfter = .seconds(1)
        default: return nil
        }
        var status = Status(category: category, operation: .subscribe, statusCode: statusCode, serverMessage: message,
                            affectedChannels: channels, affectedGroups: groups)
        status.retryAfter = retryAfter
        return SessionFailure(error: TetherError(status))
    }
}
