import HTTPTypes
import HummingbirdCore
import Logging
import NIOCore
import NIOWebSocket
import Synchronization
@_spi(Benchmarks) import TetherProtocol
import TetherServerCore

/// One upgraded socket speaking the session protocol (docs/websocket-protocol.md): it handles
/// the client's frames (handed over by its ``WebSocketSessionHandler``), sends the server's
/// (``OutboundQueue``), and runs the session's deliveries — long-polls of the same
/// ``LongPollHub`` from the session's cursor, so timetokens and cursors are those of the REST
/// wire. Nothing of it waits in a task: a frame that needs one (hello, subscribe, publish, …) is
/// handled in a short task on the connection's event loop, deliveries run in short tasks on the
/// same loop, and an idle session's wait is parked in the hub (``Deliveries``).
final class WebSocketConnection: Sendable {
    typealias Table = SessionTable<SessionState>

    private struct Locked: Sendable {
        var session: Table.SessionID?
        /// Set by a resume: the replay of what the session missed ends with a `messages` frame
        /// (empty if need be) at the server's cursor, so the client knows it has caught up.
        var markReplayEnd = false
    }

    let id: Table.ConnectionID
    private let channel: any Channel
    /// What the session sends, in order (its handler pumps it when the channel is writable).
    let queue: OutboundQueue
    private let sessions: WebSocketSessions
    private let responder: TetherResponder
    private let locked = Mutex(Locked())
    private let deliveries = Mutex(Deliveries())
    /// Where the delivery runs run: the connection's event loop (its hot path's executor).
    private let executor: EventLoopTaskExecutor
    private let maxFrameBytes: Int
    /// Taken by whichever comes first: ``start()``, or the cleanup of an upgrade
    /// that never got that far (``releaseIfNeverRun()``).
    private let claimed = Atomic<Bool>(false)

    private var state: ServerState { responder.state }

    init(id: Table.ConnectionID, channel: any Channel, executor: EventLoopTaskExecutor, queue: OutboundQueue, sessions: WebSocketSessions,
         responder: TetherResponder, maxFrameBytes: Int) {
        self.id = id
        self.channel = channel
        self.queue = queue
        self.sessions = sessions
        self.responder = responder
        self.maxFrameBytes = maxFrameBytes
        self.executor = executor
    }

    private var session: Table.SessionID? { locked.withLock { $0.session } }

    /// Gives the connection's slot back when its socket closed before the upgrade reached
    /// ``start()`` (a client that sends the upgrade request and hangs up, an upgrade NIO refuses
    /// after the endpoint accepted it): without this, each such socket kept a slot of
    /// `maxConnections` until the hello timeout (10 s), so a burst of them refused every upgrade
    /// meanwhile. Call when the channel closes.
    func releaseIfNeverRun() {
        guard !claimed.exchange(true, ordering: .acquiringAndReleasing) else { return }
        let (sessions, id) = (sessions, id)
        Task { await sessions.disconnected(id) }
    }

    /// The session's handler is in the socket's pipeline (``WebSocketSessionHandler``); `false`
    /// when the socket closed before, and its slot was given back already.
    func start() -> Bool {
        !claimed.exchange(true, ordering: .acquiringAndReleasing)
    }

    /// The socket closed: nothing more is written, the deliveries stop, and the session is kept
    /// (or was ended by `bye`). `then` runs once that is done.
    func socketClosed(then: @escaping @Sendable () -> Void) {
        queue.finish()
        Task(executorPreference: executor) {
            await self.endDeliveries()
            self.forgetUndelivered()
            await self.sessions.disconnected(self.id)
            then()
        }
    }

    /// The session's cursor moved with each delivery frame as it was sent; a frame that never
    /// reached the socket (dropped for a slow consumer, or held when the socket closed) sets it
    /// back to before that frame, so a client that resumes without a cursor of its own is sent
    /// it again instead of skipping it. (What reached the socket but not the client is only sent
    /// again to a client that resumes with its cursor: the protocol's rule.) Only while this
    /// connection carries the session, after its deliveries ended.
    private func forgetUndelivered() {
        guard let after = queue.undeliveredAfter, let session else { return }
        sessions.update(session, on: id) { $0.cursor = min($0.cursor, after) }
    }

    /// A message the client sent: a text frame, or a binary one (not part of the protocol).
    enum Inbound: Sendable {
        case text(String)
        case binary
    }

    /// What ``handleAtOnce(_:)`` did with a message.
    enum AtOnce: Sendable {
        case handled
        /// The socket is closing (the close frame is queued): the rest is dropped.
        case closing
        /// The frame needs ``handle(_:)``, in a task.
        case needsTask(WebSocketClientFrame)
    }

    /// Counts a message as a sign of life (the session's ping deadline).
    func noteReceived() {
        sessions.received(id)
    }

    // MARK: - Writing

    /// Sends a frame (``OutboundQueue``): written at once on the connection's event loop while
    /// the channel is writable, otherwise held; a full buffer closes the socket as a slow
    /// consumer (session kept).
    private func send(_ text: String, after: Timetoken? = nil) {
        guard !queue.send(text, after: after) else { return }
        state.logger.debug("WebSocket closed: slow consumer (outbound buffer full)")
        // The buffer is stuck behind unread data: the close frame goes straight to the channel,
        // behind that data, and the socket is closed.
        let attached = queue.isAttached
        queue.finish()
        guard attached else {
            channel.close(promise: nil)  // still HTTP's pipeline: no frame can be written
            return
        }
        var buffer = channel.allocator.buffer(capacity: 32)
        buffer.writeInteger(WebSocketCloseCode.slowConsumer)
        buffer.writeString("slow consumer")
        let channel = self.channel
        channel.writeAndFlush(WebSocketFrame(fin: true, opcode: .connectionClose, data: buffer)).whenComplete { _ in
            channel.close(promise: nil)
        }
        channel.eventLoop.scheduleTask(in: .seconds(1)) { channel.close(promise: nil) }
    }

    private func fail(_ code: UInt16, _ errorCode: String, _ message: String) {
        send(WebSocketServerFrame.error(code: errorCode, message: message))
        queue.close(code: code, reason: message)  // cut to a close frame's size by the queue
    }

    // MARK: - Reading

    /// Handles what needs no task (a `ping`, a `pong`, a frame that closes the socket); other
    /// frames go to ``handle(_:)``. On the connection's event loop.
    func handleAtOnce(_ message: Inbound) -> AtOnce {
        // After the server's close (a takeover, a drain, a ping timeout, an error), what the
        // client still sends is read and dropped: a late `unsubscribe` must not change a
        // session another socket now carries, nor a `publish` be stored with its `ack` lost.
        if queue.isClosing { return .handled }
        guard case .text(let text) = message else {
            fail(WebSocketCloseCode.malformed, "malformed", "binary frames are not part of tether.v1.json")
            return .closing
        }
        let frame: WebSocketClientFrame
        do {
            frame = try WebSocketClientFrame(parsing: text)
        } catch {
            switch error {
            case .malformed(let reason):
                fail(WebSocketCloseCode.malformed, "malformed", reason)
            case .unknownType(let type):
                fail(WebSocketCloseCode.unknownType, "unknownType", "unknown frame type \(String(reflecting: type))")
            }
            return .closing
        }
        switch frame {
        case .ping(let id):
            send(WebSocketServerFrame.pong(id: id))
            return .handled
        case .pong:
            return .handled  // ``noteReceived()`` already counted it
        case .hello:
            guard session != nil else { return .needsTask(frame) }
            fail(WebSocketCloseCode.malformed, "malformed", "hello was already received")
            return .closing
        default:
            guard session != nil else {
                fail(WebSocketCloseCode.malformed, "malformed", "the first frame must be hello")
                return .closing
            }
            return .needsTask(frame)
        }
    }

    /// Handles one frame that needs a task (``handleAtOnce(_:)``); `false` when the socket is
    /// closing.
    func handle(_ frame: WebSocketClientFrame) async -> Bool {
        guard let session else {
            guard case .hello(let hello) = frame else { return false }
            return await self.hello(hello)
        }
        switch frame {
        case .hello:
            fail(WebSocketCloseCode.malformed, "malformed", "hello was already received")
            return false
        case .subscribe(let subscribe):
            return await self.subscribe(subscribe, session: session)
        case .unsubscribe(let channels, let groups):
            await self.unsubscribe(channels: channels, groups: groups, session: session)
            return true
        case .publish(let publish):
            await self.publish(publish, session: session)
            return true
        case .bye:
            await sessions.end(id)
            locked.withLock { $0.session = nil }
            restartDeliveries()
            queue.close(code: WebSocketCloseCode.normal, reason: "bye")
            return false
        case .suspend(let seconds, let presence, let push):
            // The app goes to the background: the session outlives its socket this long.
            // Pushes while suspended carry the messages: each one re-checks the session's read
            // access, as its deliveries do (a revoked grant or an expired token stops them).
            var mayRead: (@Sendable (String) -> Bool)?
            if let current = sessions.state(of: session), current.keyset.secretKey != nil {
                let (access, keyset, uuid, auth) = (state.access, current.keyset, current.uuid, current.auth)
                let (names, groups) = (current.channels, current.groups)
                mayRead = { channel in
                    // Read on the channel when the session names it; otherwise on what brought
                    // it (the wildcards that match it, and the session's groups), as the
                    // session's deliveries check the names it subscribed to.
                    let request = names.contains(channel)
                        ? AccessRequest(channels: [channel], groups: [], permission: .read, uuid: uuid)
                        : AccessRequest(channels: names.filter { NameRules.isWildcard($0) && channel.hasPrefix(String($0.dropLast())) },
                                        groups: groups, permission: .read, uuid: uuid)
                    let check = access.check(request, keyset: keyset, auth: auth, signature: .absent)
                    if case .denied = check.decision { return false }
                    return true
                }
            }
            if let granted = await sessions.suspend(id, seconds: seconds, presence: presence, push: push, mayRead: mayRead) {
                send(WebSocketServerFrame.suspended(keepAliveSeconds: granted))
            }
            return true
        case .ping, .pong:
            return true
        }
    }

    // MARK: - Hello

    private func hello(_ hello: WebSocketClientFrame.Hello) async -> Bool {
        guard hello.version == WebSocketProtocol.version else {
            fail(WebSocketCloseCode.malformed, "malformed", "unsupported protocol version \(hello.version); this server speaks 1")
            return false
        }
        guard NameRules.validateKey(hello.subscribeKey), let keyset = state.keysets.keyset(subscribeKey: hello.subscribeKey) else {
            fail(WebSocketCloseCode.forbidden, "forbidden", "Invalid subscribe key")
            return false
        }
        if let publishKey = hello.publishKey, publishKey != keyset.publishKey {
            fail(WebSocketCloseCode.forbidden, "forbidden", "Invalid publish key")
            return false
        }
        do { try NameRules.validateUserId(hello.uuid) } catch {
            fail(WebSocketCloseCode.malformed, "malformed", "Invalid uuid: \(error)")
            return false
        }
        let current = state.hub.currentCursor
        if let token = hello.resumeToken {
            // Bounded as a long-poll's cursor is (``LongPollHub/readPoint(for:)``): lowered to the
            // server's cursor when from the future, kept in a cluster when another node handed it out.
            var resumePoint: Timetoken?
            if let cursor = hello.resumeCursor { resumePoint = await state.hub.readPoint(for: cursor) }
            // A token is a bearer secret, but a session is only resumed by its own uuid on its keyset.
            let result = sessions.resume(id, token: token) { kept in
                kept.keyset.subscribeKey == keyset.subscribeKey && kept.uuid == hello.uuid
            }
            switch result {
            case .resumed(let session, let kept, _):
                locked.withLock {
                    $0.session = session
                    $0.markReplayEnd = true
                }
                let resumed = sessions.update(session) { s in
                    if let resumePoint {
                        if s.hasSubscribed { s.cursor = resumePoint } else { s.resumedCursor = resumePoint }
                    }
                    s.auth = hello.auth
                    s.actsForUUID = mayActFor(s)
                    if hello.publishKey != nil { s.publishKey = hello.publishKey }
                } ?? kept
                send(welcome(session: session, token: token, resumed: true, state: resumed, cursor: current))
                await sessions.rejoinIfAbsent(session)
                sessions.releaseSuspendedPush(session)
                if resumed.hasSubscribed { restartDeliveries() }
                return true
            case .unknown:
                send(WebSocketServerFrame.sessionExpired(
                    message: "the session is not held (keep-alive lapsed, evicted, or the server restarted): subscribe again with your cursor"))
            }
        }
        let token = WebSocketSessions.makeToken()
        var fresh = SessionState(keyset: keyset, uuid: hello.uuid, auth: hello.auth, publishKey: hello.publishKey)
        fresh.actsForUUID = mayActFor(fresh)
        guard let session = sessions.open(id, token: token, state: fresh) else {
            fail(WebSocketCloseCode.malformed, "malformed", "hello was already received")
            return false
        }
        locked.withLock { $0.session = session }
        send(welcome(session: session, token: token, resumed: false, state: fresh, cursor: current))
        return true
    }

    private func welcome(session: Table.SessionID, token: String, resumed: Bool, state session_: SessionState, cursor: Timetoken) -> String {
        let limits = state.keysets.limits(for: session_.keyset)
        return WebSocketServerFrame.welcome(
            sessionId: "s-\(session)", resumeToken: token, resumed: resumed, cursor: cursor,
            keepAliveSeconds: sessions.settings.keepAliveSeconds, pingIntervalSeconds: sessions.settings.pingIntervalSeconds,
            limits: .init(maxFrameBytes: maxFrameBytes, maxChannels: limits.maxChannelsPerSubscribe, maxMessageBytes: limits.maxMessageBytes,
                          maxSignalBytes: limits.maxSignalBytes, outboundBufferFrames: sessions.settings.outboundBufferFrames),
            subscription: resumed ? (session_.channels, session_.groups, session_.filter) : nil)
    }

    // MARK: - Subscribe

    /// Takes a token from the client's rate bucket; `false` (with the notice sent) when over it.
    private func takeRate(_ kind: RateLimits.Kind, keyset: Keyset, uuid: String, requestId: String?) -> Bool {
        guard let wait = state.rateLimits.take(kind, uuid: uuid, address: channel.remoteAddress?.ipAddress ?? "unknown",
                                               subscribeKey: keyset.subscribeKey,
                                               limits: state.keysets.limits(for: keyset)) else { return true }
        let seconds = TetherResponder.retryAfterSeconds(wait)
        if let requestId {
            send(WebSocketServerFrame.ack(requestId: requestId, status: 429, message: "Too Many Requests"))
        } else {
            send(WebSocketServerFrame.error(code: "rateLimited", message: "Too Many Requests"))
        }
        state.console?.rateLimited(uuid: uuid, route: requestId == nil ? "ws-subscribe" : "ws-publish")
        send(WebSocketServerFrame.rateLimited(retryAfterSeconds: seconds))
        return false
    }

    private func subscribe(_ request: WebSocketClientFrame.Subscribe, session: Table.SessionID) async -> Bool {
        guard let current = sessions.state(of: session) else { return true }
        let keyset = current.keyset
        guard takeRate(.request, keyset: keyset, uuid: current.uuid, requestId: nil) else { return true }
        let limits = state.keysets.limits(for: keyset)
        for name in request.channels {
            do { try NameRules.validateSubscribeChannel(name) } catch {
                send(WebSocketServerFrame.error(code: "invalidChannel", message: "Invalid channel \(String(reflecting: name)): \(error)"))
                return true
            }
        }
        for group in request.groups {
            do { try NameRules.validateGroup(group) } catch {
                send(WebSocketServerFrame.error(code: "invalidChannel", message: "Invalid channel group \(String(reflecting: group)): \(error)"))
                return true
            }
        }
        let newChannels = request.channels.filter { !current.channels.contains($0) }.uniqued()
        let newGroups = request.groups.filter { !current.groups.contains($0) }.uniqued()
        if current.channels.count + newChannels.count + current.groups.count + newGroups.count > limits.maxChannelsPerSubscribe
            || current.groups.count + newGroups.count > limits.maxGroupsPerRequest {
            fail(WebSocketCloseCode.tooManyChannels, "tooManyChannels",
                 "at most \(limits.maxChannelsPerSubscribe) channels and groups (\(limits.maxGroupsPerRequest) groups) per session")
            return false
        }
        // Presence state is kept and handed out again (here-now, presence events): no deeper than
        // any kept value (docs/protocol.md, "Publish details").
        for (channel, text) in request.states where (try? JSONText.validate(text, maximumDepth: JSONText.maximumValueDepth)) != .object {
            send(WebSocketServerFrame.error(code: "invalidState", message: "Invalid state for \(String(reflecting: channel)): "
                                                + "expected a JSON object nested at most \(JSONText.maximumValueDepth) levels"))
            return true
        }
        // State only for names of the subscription (this frame's or earlier ones): the session
        // keeps it, so what a client can make it hold is bounded by its names.
        if let stray = request.states.keys.first(where: { name in
            !(request.channels.contains(name) || request.groups.contains(name) || current.channels.contains(name)
                || current.groups.contains(name))
        }) {
            send(WebSocketServerFrame.error(code: "invalidState", message: "Invalid state for \(String(reflecting: stray)): "
                                                + "not a channel or channel group of the subscription"))
            return true
        }
        // Setting state is acting for the uuid, as REST's set-state is (docs/security.md).
        if !request.states.isEmpty, !current.actsForUUID {
            send(WebSocketServerFrame.error(code: "invalidState", message: "Forbidden: setting presence state acts for the uuid, "
                                                + "and the session's token is not authorized for \(String(reflecting: current.uuid))"))
            return true
        }
        if let text = request.filter, !text.isEmpty {
            do { _ = try state.filters.expression(text) } catch {
                send(WebSocketServerFrame.error(code: "invalidFilter",
                                                message: "Invalid filter expression: \(error.reason) at position \(error.position)"))
                return true
            }
        }
        // Access: read on the new names, with the session's auth; denied names are left out.
        var deniedChannels: [String] = []
        var deniedGroups: [String] = []
        var deniedMessage = "Forbidden"
        if keyset.secretKey != nil, !(newChannels.isEmpty && newGroups.isEmpty) {
            let check = state.access.check(AccessRequest(channels: newChannels, groups: newGroups, permission: .read, uuid: current.uuid),
                                           keyset: keyset, auth: current.auth, signature: .absent)
            if case .denied(let channels, let groups, let message) = check.decision {
                deniedChannels = channels.isEmpty && groups.isEmpty ? newChannels : channels
                deniedGroups = channels.isEmpty && groups.isEmpty ? newGroups : groups
                deniedMessage = message
            }
        }
        let addedChannels = newChannels.filter { !deniedChannels.contains($0) }
        let addedGroups = newGroups.filter { !deniedGroups.contains($0) }
        let now = state.hub.currentCursor
        var requested: Timetoken?
        if let cursor = request.cursor { requested = await state.hub.readPoint(for: cursor) }
        // Only while this socket carries the session (a resume elsewhere may have taken it over
        // while this frame waited).
        guard let updated = sessions.update(session, on: id, { s in
            let filter: String?? = request.filter.map { $0.isEmpty ? nil : $0 }
            if !(addedChannels.isEmpty && addedGroups.isEmpty) || filter.map({ $0 != s.filter }) == true {
                s.widenings &+= 1
            }
            s.channels += addedChannels
            s.groups += addedGroups
            if let filter { s.filter = filter }
            // Denied names are not the session's: nor is their state.
            s.states.merge(request.states.filter { s.channels.contains($0.key) || s.groups.contains($0.key) }) { _, new in new }
            if !s.hasSubscribed, !(addedChannels.isEmpty && addedGroups.isEmpty) {
                s.hasSubscribed = true
                // The resumed cursor was bounded when the session resumed.
                s.cursor = requested ?? s.resumedCursor ?? now
                s.resumedCursor = nil
            }
        }) else { return true }
        // Presence: the session's uuid joins the names it added (the session is one occupant).
        if !(addedChannels.isEmpty && addedGroups.isEmpty) {
            await state.presence.heartbeat(subscribeKey: keyset.subscribeKey, uuid: updated.uuid, channels: addedChannels, groups: addedGroups,
                                           timeoutSeconds: sessions.settings.keepAliveSeconds,
                                           states: request.states.filter { addedChannels.contains($0.key) })
        }
        state.console?.sessionSubscribed(uuid: updated.uuid, channels: updated.channels, groups: updated.groups, cursor: updated.cursor)
        send(WebSocketServerFrame.subscribed(channels: updated.channels, groups: updated.groups,
                                             cursor: updated.hasSubscribed ? updated.cursor : now))
        if !(deniedChannels.isEmpty && deniedGroups.isEmpty) {
            state.console?.accessDenied(uuid: updated.uuid, channels: deniedChannels + deniedGroups)
            send(WebSocketServerFrame.accessDenied(channels: deniedChannels, groups: deniedGroups, message: deniedMessage))
        }
        restartDeliveries()
        return true
    }

    /// Whether the session may act for its uuid (leave, set state), as REST's
    /// ``TetherResponder/requireActing(as:_:_:verdict:)`` decides: always on a keyset without a
    /// secret key and with a v2 auth key (which binds no uuid); with a v3 token, only when the
    /// token's authorized uuid is the session's (`hello` names a uuid nobody proves).
    private func mayActFor(_ session: SessionState) -> Bool {
        guard session.keyset.secretKey != nil, let auth = session.auth, !auth.isEmpty,
              let token = try? state.access.verifiedToken(auth, keyset: session.keyset) else { return true }
        return token.grant.authorizedUUID == session.uuid
    }

    private func unsubscribe(channels: [String], groups: [String], session: Table.SessionID) async {
        guard let before = sessions.state(of: session) else { return }
        let removedChannels = before.channels.filter { channels.contains($0) }
        let removedGroups = before.groups.filter { groups.contains($0) }
        guard let after = sessions.update(session, on: id, { s in
            s.channels.removeAll { channels.contains($0) }
            s.groups.removeAll { groups.contains($0) }
            s.forgetStates()
        }) else { return }
        // A leave acts for the uuid, as REST's is refused for a token bound to another uuid or to
        // none: then the names leave the subscription and the uuid times out there.
        if !(removedChannels.isEmpty && removedGroups.isEmpty), after.actsForUUID {
            await state.presence.leave(subscribeKey: after.keyset.subscribeKey, uuid: after.uuid, channels: removedChannels, groups: removedGroups)
        }
        send(WebSocketServerFrame.unsubscribed(channels: after.channels, groups: after.groups))
        restartDeliveries()
    }

    // MARK: - Publish

    private func publish(_ frame: WebSocketClientFrame.Publish, session: Table.SessionID) async {
        guard let current = sessions.state(of: session) else { return }
        let keyset = current.keyset
        guard takeRate(.publish, keyset: keyset, uuid: current.uuid, requestId: frame.requestId) else { return }
        func refuse(_ status: Int, _ message: String) {
            send(WebSocketServerFrame.ack(requestId: frame.requestId, status: status, message: message))
        }
        // The REST publish's own reading and checks, on a request built from the frame.
        var wire: WireRequest
        do { wire = try WireRequest(rawPath: "/", rawQuery: nil) } catch { return }
        wire.segments = [frame.isSignal ? "signal" : "publish", current.publishKey ?? "", keyset.subscribeKey, "0", frame.channel, "0", frame.message]
        var query: QueryParameters = ["uuid": current.uuid, "requestid": frame.requestId]
        if let meta = frame.meta { query["meta"] = meta }
        if let store = frame.store { query["store"] = store ? "1" : "0" }
        if let ttl = frame.ttlHours { query["ttl"] = String(ttl) }
        if let type = frame.customMessageType { query["custom_message_type"] = type }
        wire.query = query
        let kind: EventKind = frame.isSignal ? .signal : .message
        do {
            let target = try PublishRequest.Target(wire, kind: kind, keysets: state.keysets, now: state.hub.currentCursor)
            if keyset.secretKey != nil {
                let check = state.access.check(AccessRequest(channels: [target.channel], groups: [], permission: .write, uuid: current.uuid),
                                               keyset: keyset, auth: current.auth, signature: .absent)
                if case .denied(_, _, let message) = check.decision {
                    refuse(403, message)
                    return
                }
            }
            let request = try PublishRequest(target, message: Array(frame.message.utf8), wire)
            switch try await responder.commitPublish(request, kind: kind) {
            case .sent(let timetoken, let isRepeat):
                send(WebSocketServerFrame.ack(requestId: frame.requestId, timetoken: timetoken, isRepeat: isRepeat))
            case .failed(let status, let text, _, _):
                refuse(Int(status.code), text)
            }
        } catch let refusal as Refusal {
            refuse(Int(refusal.response.status.code), refusal.message ?? "Invalid request")
        } catch let error as ParameterError {
            refuse(400, error.description)
        } catch {
            state.logger.error("WebSocket publish failed", metadata: ["error": "\(error)"])
            refuse(500, "Internal Server Error")
        }
    }

    // MARK: - Deliveries

    /// The session's deliveries: at most one *run* at a time, a task on the connection's event
    /// loop that long-polls the hub from the session's cursor and sends each page as a
    /// `messages` frame. When nothing is ready the run parks its wait in the hub with a callback
    /// and ends, so an idle subscribed session has no delivery task; the wait's end (an event, the
    /// timeout, an access change, the server draining) starts the next run. A subscription change
    /// starts a new *generation*: the run in progress is cancelled, a parked wait is ended, and a
    /// run of the new generation starts once the old one has finished.
    private struct Deliveries: Sendable {
        var generation: UInt64 = 0
        /// The run in progress (`nil` while the wait is parked, or with nothing to deliver).
        var run: Task<Void, Never>?
        /// The current generation's parked wait; the cursor it waits after (where the next run
        /// reads from: the hub may have moved it past store reads that found nothing) and when
        /// it must answer (kept by the runs after a wake-up that found nothing to send, as a
        /// long-poll keeps its deadline, so the session's cursor moves on at least that often).
        var parked: ParkedWait?
        var parkedAt: (after: Timetoken, deadline: NIODeadline)?
        /// The socket closed: no run starts again.
        var ended = false
    }

    /// The subscription changed (or the session ended, or was resumed): deliveries start over
    /// from the session's state.
    private func restartDeliveries() {
        let stopped = deliveries.withLock { d -> (run: Task<Void, Never>?, parked: ParkedWait?)? in
            guard !d.ended else { return nil }
            d.generation += 1
            let stopped = (run: d.run, parked: d.parked)
            (d.parked, d.parkedAt) = (nil, nil)
            d.run = startRun(generation: d.generation, finishing: false, from: nil, after: stopped.run)
            return stopped
        }
        stopped?.run?.cancel()
        if let parked = stopped?.parked { state.hub.cancelParked(parked) }
    }

    /// The socket closed: stops the deliveries and waits for the run in progress to end.
    private func endDeliveries() async {
        let (run, parked) = deliveries.withLock { d -> (Task<Void, Never>?, ParkedWait?) in
            d.ended = true
            defer { (d.run, d.parked) = (nil, nil) }
            return (d.run, d.parked)
        }
        run?.cancel()
        if let parked { state.hub.cancelParked(parked) }
        await run?.value
    }

    /// A run of `generation`, after `previous` (cancelled) has ended. `finishing`: the first
    /// round reads without waiting (its wait timed out, or the server drains), so the session's
    /// cursor moves on as the hub's last read of a timed-out long-poll does. `from`: the cursor
    /// the first round reads after and the deadline it answers by (a parked wait's), instead of
    /// the session's cursor and a new deadline.
    private func startRun(generation: UInt64, finishing: Bool, from: (after: Timetoken, deadline: NIODeadline)?,
                          after previous: Task<Void, Never>?) -> Task<Void, Never>
    {
        Task(executorPreference: executor) {
            await previous?.value
            await self.deliver(generation: generation, finishing: finishing, from: from)
        }
    }

    /// How a run of `generation` parks its wait, which must answer by `deadline`, in the hub.
    private func parking(_ generation: UInt64, deadline: NIODeadline) -> LongPollParking {
        LongPollParking(parked: { [weak self] wait, after in
            self?.parked(wait, after: after, deadline: deadline, generation: generation)
        }, wake: { [weak self] reason in
            self?.woken(reason, generation: generation)
        })
    }

    /// The run of `generation` is parking its wait (after cursor `after`, to answer by
    /// `deadline`): kept to end it if the subscription changes (or ended at once if it already
    /// did), and for the next run to go on from.
    private func parked(_ wait: ParkedWait, after: Timetoken, deadline: NIODeadline, generation: UInt64) {
        let current = deliveries.withLock { d -> Bool in
            guard d.generation == generation, !d.ended else { return false }
            (d.parked, d.parkedAt) = (wait, (after, deadline))
            // The run ends now without suspending again (`park`, then `LongPollParked` to its
            // `deliver`, which returns), on the connection's loop, where the next run's first
            // job can only run after it: no two runs overlap, and none needs the other's handle.
            d.run = nil
            return true
        }
        if !current { state.hub.cancelParked(wait) }
    }

    /// The parked wait of `generation` ended: the next run starts (not for a wait that a
    /// change or the socket's close ended).
    private func woken(_ reason: WakeReason, generation: UInt64) {
        deliveries.withLock { d in
            guard d.generation == generation, !d.ended, reason != .clientGone else { return }
            let from = d.parkedAt
            (d.parked, d.parkedAt) = (nil, nil)
            d.run = startRun(generation: generation, finishing: reason == .timeout || reason == .shutdown, from: from, after: d.run)
        }
    }

    /// One run: rounds until its wait parks, delivering stops, or the run is cancelled (the
    /// subscription changed or the socket closed).
    ///
    /// A run's task keeps the memory its largest async frame needed: what is decided before and
    /// after each wait is in synchronous functions (``startRound(session:finishing:from:)``,
    /// ``finishRound(_:page:session:)``), so this frame holds only a ``DeliveryRound`` across
    /// the wait (docs/benchmarks.md, seventh pass of issue #16).
    @inline(never)
    private func deliver(generation: UInt64, finishing: Bool, from: (after: Timetoken, deadline: NIODeadline)?) async {
        var (finishing, from) = (finishing, from)
        while !Task.isCancelled {
            guard let session else { return }
            let round: DeliveryRound
            switch startRound(session: session, finishing: finishing, from: from?.after) {
            case .stop: return
            case .again: continue
            case .round(let next): round = next
            }
            // After a wake-up, the wait goes on to the deadline it was parked with.
            let now = NIODeadline.now()
            let deadline = round.timeout > .zero ? from?.deadline ?? now + round.timeout : now
            let timeout = max(.zero, deadline - now)
            (finishing, from) = (false, nil)
            do {
                let page = try await state.hub.receive(
                    round.spec, after: round.after, limit: round.limit, timeout: timeout,
                    channel: channel, access: round.check, recheck: round.recheck, filter: round.filter,
                    // A round that must not wait reads in this task: parked, its wait would end
                    // at once (timed out), and that would start the next run, and so on.
                    parking: timeout > .zero ? parking(generation, deadline: deadline) : nil)
                if Task.isCancelled { return }
                let full = page.envelopes.count >= round.limit
                if !finishRound(round, page: page, session: session) { return }
                // A full page means more is likely ready at once, and a receive that finds it
                // does not suspend: without this a session catching up from memory would send
                // its whole backlog in one job of the event loop it shares with other
                // connections (and the writer, which ends the session after a slow-consumer
                // close, would wait for it).
                if full { await Task.yield() }
            } catch is LongPollParked {
                return  // the wait goes on in the hub; its end starts the next run
            } catch {
                if !deliveryFailed(error, session: session) { return }
            }
        }
    }

    /// One wait of ``deliver(generation:finishing:from:)``: what it asks the hub, and what it needs of the answer.
    private struct DeliveryRound {
        var spec: SubscriptionSpec
        var after: Timetoken
        var limit: Int
        var timeout: TimeAmount
        var check: AccessManager.Check?
        var recheck: (@Sendable () -> AccessManager.Check)?
        var filter: FilterExpression?
        /// After a resume, pages are read without waiting until one is not full: that one —
        /// empty or not — is sent at the cursor it reached (docs/websocket-protocol.md).
        var marking: Bool
        /// With a filter a page is short because the filter left messages out, not because the
        /// replay ended: the replay ends at a page that reaches this cursor (the hub's when the
        /// round was planned).
        var replayEnd: Timetoken
        var uuid: String
        /// The session's ``SessionState/widenings`` when the round was planned.
        var widenings: UInt64
    }

    private enum RoundStart {
        /// Unsubscribed, or the session is gone.
        case stop
        /// Denied names were removed: start again.
        case again
        case round(DeliveryRound)
    }

    /// The next round of ``deliver(generation:finishing:from:)`` from the session's state, or
    /// why there is none. `finishing`: the round reads what is there without waiting. `from`:
    /// the cursor to read after, instead of the session's.
    @inline(never)
    private func startRound(session: Table.SessionID, finishing: Bool, from: Timetoken?) -> RoundStart {
        guard let current = sessions.state(of: session), current.hasSubscribed,
              !(current.channels.isEmpty && current.groups.isEmpty)
        else { return .stop }
        let keyset = current.keyset
        let limits = state.keysets.limits(for: keyset)
        let filter = current.filter.flatMap { try? state.filters.expression($0) }
        var recheck: (@Sendable () -> AccessManager.Check)?
        var check: AccessManager.Check?
        if keyset.secretKey != nil {
            let access = state.access
            let request = AccessRequest(channels: current.channels, groups: current.groups, permission: .read, uuid: current.uuid)
            let auth = current.auth
            recheck = { access.check(request, keyset: keyset, auth: auth, signature: .absent) }
            let now = access.check(request, keyset: keyset, auth: auth, signature: .absent)
            if case .denied = now.decision {
                return removeDenied(now, session: session) ? .again : .stop
            }
            check = now
        }
        let marking = locked.withLock { $0.markReplayEnd }
        // The session's cursor came from this hub's pages or was bounded when it was set
        // (``LongPollHub/readPoint(for:)``). On one node it is never above the hub's cursor; in
        // a cluster it may be one another node handed out, ahead of this node's reader: kept, as
        // the REST subscribe keeps it (lowering it would deliver what is in between again).
        let after = from ?? (state.hub.shared == nil ? min(current.cursor, state.hub.currentCursor) : current.cursor)
        return .round(DeliveryRound(spec: current.spec, after: after,
                                    limit: limits.maxEnvelopesPerResponse, timeout: marking || finishing ? .zero : state.subscribeTimeout,
                                    check: check, recheck: recheck, filter: filter, marking: marking,
                                    replayEnd: marking && filter != nil ? state.hub.currentCursor : .zero, uuid: current.uuid,
                                    widenings: current.widenings))
    }

    /// Sends what a round's wait brought; `false` when delivering stops (the server drains).
    @inline(never)
    private func finishRound(_ round: DeliveryRound, page: SubscribePage, session: Table.SessionID) -> Bool {
        // Only while this connection carries the session: after a resume elsewhere took it
        // over, what this one reads is not sent, and the session's cursor is not moved (the
        // other connection's deliveries read from it).
        var widened = false
        guard sessions.update(session, on: id, { s in
            guard s.widenings == round.widenings else {
                widened = true
                return
            }
            s.cursor = max(s.cursor, page.cursor)
        }) != nil else { return false }
        // The subscription grew while this round read (a `subscribe` added names or changed the
        // filter before its presence join was saved and its restart came): the page was read
        // without them, and its cursor may pass their messages. Nothing of it is sent and the
        // cursor stays; the next round reads again from there with the whole subscription.
        if widened { return true }
        let endsReplay = round.marking && page.envelopes.count < round.limit && (round.filter == nil || page.cursor >= round.replayEnd)
        if endsReplay { locked.withLock { $0.markReplayEnd = false } }
        guard page.cursor > round.after || !page.envelopes.isEmpty || endsReplay else {
            return !sessions.isDraining  // the hub answers at once while shutting down
        }
        state.console?.sessionDelivered(uuid: round.uuid, page: page)
        if page.envelopes.isEmpty && page.gaps.isEmpty && !endsReplay { return true }
        send(WebSocketServerFrame.messages(cursor: page.cursor, envelopes: page.envelopes,
                                           gaps: page.gaps.map { ($0.channel, $0.from, $0.through) }),
             after: round.after)
        return true
    }

    /// A round's wait failed; `false` when delivering stops.
    @inline(never)
    private func deliveryFailed(_ error: any Error, session: Table.SessionID) -> Bool {
        if let denied = error as? AccessDeniedError {
            return removeDenied(denied.check, session: session)
        }
        if Task.isCancelled || error is CancellationError { return false }  // subscription changed or socket closed
        // A store read failed: the client resumes from its cursor on a new socket.
        state.logger.error("WebSocket delivery failed", metadata: ["error": "\(error)"])
        queue.close(code: WebSocketCloseCode.internalError, reason: "delivery failed; resume from your cursor")
        return false
    }

    /// A grant was revoked or a token expired: the denied names leave the subscription and the
    /// client is told; the others continue. `false` when this connection no longer carries the
    /// session (its deliveries stop).
    private func removeDenied(_ check: AccessManager.Check, session: Table.SessionID) -> Bool {
        guard case .denied(let channels, let groups, let message) = check.decision else { return true }
        let everything = channels.isEmpty && groups.isEmpty
        var removed: (channels: [String], groups: [String]) = ([], [])
        guard sessions.update(session, on: id, { s in
            removed = everything ? (s.channels, s.groups) : (s.channels.filter { channels.contains($0) }, s.groups.filter { groups.contains($0) })
            s.channels.removeAll { removed.channels.contains($0) }
            s.groups.removeAll { removed.groups.contains($0) }
            s.forgetStates()
        }) != nil else { return false }
        send(WebSocketServerFrame.accessDenied(channels: removed.channels, groups: removed.groups, message: message))
        return true
    }
}

extension Array where Element: Hashable {
    /// The elements in order, each once.
    fileprivate func uniqued() -> [Element] {
        var seen = Set<Element>()
        return filter { seen.insert($0).inserted }
    }
}
