import Synchronization
public import TetherClientCore
public import TetherProtocol

/// Whether the engine's root task runs.
enum EngineTaskState: Sendable {
    case idle
    case running(Task<Void, Never>)
    case shutDown
}

/// What the app asked to receive: targets with a reference count per listener object.
struct DesiredSubscription: Sendable {
    var channels: [String: Int] = [:]
    var groups: [String: Int] = [:]
    /// How many attached subscriptions ask for each name's presence events: the `-pnpres` name
    /// is subscribed while one does (and the name itself is), and dropped with the last.
    var presenceChannels: [String: Int] = [:]
    var presenceGroups: [String: Int] = [:]
    var attached: [ObjectIdentifier: Subscription.Target] = [:]
    var attachedWithPresence: Set<ObjectIdentifier> = []

    var channelList: [String] {
        var list = channels.keys.sorted()
        for name in presenceChannels.keys.sorted() where channels[name] != nil { list.append(name + NameRules.presenceSuffix) }
        return list
    }

    var groupList: [String] {
        var list = groups.keys.sorted()
        for name in presenceGroups.keys.sorted() where groups[name] != nil { list.append(name + NameRules.presenceSuffix) }
        return list
    }

    /// Removes one attached subscription (its name's count and its presence count).
    mutating func detach(_ id: ObjectIdentifier) {
        guard let target = attached.removeValue(forKey: id) else { return }
        let withPresence = attachedWithPresence.remove(id) != nil
        switch target {
        case .channel(let name):
            Self.decrement(&channels, name)
            if withPresence { Self.decrement(&presenceChannels, name) }
        case .group(let name):
            Self.decrement(&groups, name)
            if withPresence { Self.decrement(&presenceGroups, name) }
        }
    }

    private static func decrement(_ counts: inout [String: Int], _ name: String) {
        counts[name, default: 1] -= 1
        if counts[name] ?? 0 <= 0 { counts[name] = nil }
    }
}

extension TetherConfiguration {
    /// The machine's settings derived from the configuration.
    var subscribeMachineConfiguration: SubscribeMachine.Configuration {
        SubscribeMachine.Configuration(
            retry: retry, keepTimetokenOnListChange: keepTimetokenOnListChange, restoreSubscription: restoreSubscription,
            catchUpOnSubscriptionRestore: catchUpOnSubscriptionRestore, requestMessageCountThreshold: requestMessageCountThreshold,
            timeProbeInterval: timeProbeInterval,
            liveness: deadLinkDetection.map { SubscribeMachine.Liveness(interval: $0.probeInterval, timeout: $0.probeTimeout) },
            presenceHeartbeat: heartbeatInterval > 0
                ? SubscribeMachine.PresenceHeartbeat(interval: .seconds(heartbeatInterval), reporting: heartbeatReporting) : nil,
            longPollWatchdog: subscribeTimeout + .seconds(10), backfill: backfill,
            filtered: !(filterExpression ?? "").isEmpty, lifecycle: lifecycle)
    }
}

extension TetherClient {
    // MARK: - Subscribing

    /// Subscribes to channels (wildcards like `news.*` included) and channel groups, adding them
    /// to the current subscription. The first subscribe performs the handshake and announces
    /// ``StatusCategory/connected``; later ones announce ``StatusCategory/subscriptionChanged``.
    /// Subscribing to what is already subscribed (or to nothing) restarts the long-poll (seed 001).
    ///
    /// - Parameters:
    ///   - timetoken: continue from this timetoken instead of the current cursor (catch-up).
    ///   - withPresence: also receive the `-pnpres` presence events of these targets.
    /// - Returns: one ``Subscription`` per target, already receiving.
    @discardableResult
    public func subscribe(to channels: [String] = [], groups: [String] = [], withPresence: Bool = false,
                          timetoken: Timetoken? = nil) -> [Subscription] {
        let subscriptions = channels.map { Subscription(target: .channel($0), withPresence: withPresence, client: self) }
            + groups.map { Subscription(target: .group($0), withPresence: withPresence, client: self) }
        for subscription in subscriptions { engine.listeners.register(subscription) }
        desired.withLock { desired in
            for subscription in subscriptions { Self.add(subscription, to: &desired) }
        }
        apply(timetoken: timetoken)
        return subscriptions
    }

    /// A subscription object for one channel (or wildcard pattern); call
    /// ``Subscription/subscribe(timetoken:)`` to start receiving.
    public func subscription(channel: String, withPresence: Bool = false) -> Subscription {
        Subscription(target: .channel(channel), withPresence: withPresence, client: self)
    }

    /// A subscription object for one channel group; call ``Subscription/subscribe(timetoken:)``.
    public func subscription(group: String, withPresence: Bool = false) -> Subscription {
        Subscription(target: .group(group), withPresence: withPresence, client: self)
    }

    /// Removes channels and groups from the subscription (whatever subscription objects name
    /// them): a presence leave is sent and ``StatusCategory/subscriptionChanged`` announced, or
    /// ``StatusCategory/disconnected`` when nothing remains.
    public func unsubscribe(from channels: [String] = [], groups: [String] = []) {
        let removed = desired.withLock { desired -> [ObjectIdentifier] in
            var removed: [ObjectIdentifier] = []
            for (id, target) in desired.attached {
                switch target {
                case .channel(let name) where channels.contains(name): removed.append(id)
                case .group(let name) where groups.contains(name): removed.append(id)
                case .channel, .group: break
                }
            }
            for id in removed { desired.detach(id) }
            for name in channels {
                desired.channels[name] = nil
                desired.presenceChannels[name] = nil
            }
            for name in groups {
                desired.groups[name] = nil
                desired.presenceGroups[name] = nil
            }
            return removed
        }
        for subscription in engine.listeners.subscriptions where removed.contains(ObjectIdentifier(subscription)) {
            engine.listeners.unregister(subscription)
            subscription.finish()
        }
        apply(timetoken: nil)
    }

    /// Unsubscribes from everything (``StatusCategory/disconnected``).
    public func unsubscribeAll() {
        let state = desired.withLock { ($0.channels.keys.map { $0 }, $0.groups.keys.map { $0 }) }
        unsubscribe(from: state.0, groups: state.1)
    }

    /// Stops the subscribe loop, keeping the subscription and cursor (``StatusCategory/disconnected``).
    /// Subscribing afterwards does not reconnect (seed 000); ``reconnect(timetoken:)`` does.
    public func disconnect() {
        engine.send { machine, now in machine.disconnect(now: now) }
    }

    /// Starts the subscribe loop again at once, from `timetoken` or from the saved cursor (so
    /// nothing published meanwhile is missed). Also the "retry now" button after a give-up.
    public func reconnect(timetoken: Timetoken? = nil) {
        startEngineIfNeeded()
        session.forgetDenied()
        engine.send { machine, now in machine.reconnect(timetoken: timetoken, now: now) }
    }

    /// The subscribed channels (presence channels as `-pnpres` names).
    public var subscribedChannels: [String] { engine.read { $0.subscribedChannels } }
    /// The subscribed channel groups.
    public var subscribedGroups: [String] { engine.read { $0.subscribedGroups } }
    /// The cursor the loop continues from.
    public var currentTimetoken: Timetoken? { engine.read { $0.cursor?.timetoken } }

    // MARK: - Statuses and connection state

    /// Every status the subscribe engine emits from now on (connected, reconnected, unexpected
    /// disconnect, access denied…; see `docs/status-reference.md`). One consumer per stream; call
    /// again for another. Finishes at ``shutdown()``.
    public func statuses() -> AsyncStream<Status> {
        engine.listeners.stream { engine.listeners.add(status: $0) }
    }

    /// Adds a closure called for every status, in order.
    @discardableResult
    public func addStatusListener(_ handler: @escaping @Sendable (Status) -> Void) -> ListenerToken {
        engine.listeners.add(status: handler)
    }

    /// The connection state right now (bind a UI to ``connectionChanges()``).
    public var connectionState: ConnectionState { engine.read { $0.connectionState } }

    /// Every connection-state change from now on, with SendBird-style reconnect started /
    /// succeeded / failed events.
    public func connectionChanges() -> AsyncStream<ConnectionChange> {
        engine.listeners.stream { engine.listeners.add(connection: $0) }
    }

    /// Adds a closure called for every connection-state change.
    @discardableResult
    public func addConnectionListener(_ handler: @escaping @Sendable (ConnectionChange) -> Void) -> ListenerToken {
        engine.listeners.add(connection: handler)
    }

    /// One outcome per channel after every reconnect or restore: continuous, recovered N, or a gap
    /// with its exact bounds.
    public func continuityOutcomes() -> AsyncStream<ChannelContinuity> {
        engine.listeners.stream { engine.listeners.add(continuity: $0) }
    }

    /// Adds a closure called for every continuity outcome.
    @discardableResult
    public func addContinuityListener(_ handler: @escaping @Sendable (ChannelContinuity) -> Void) -> ListenerToken {
        engine.listeners.add(continuity: handler)
    }

    // MARK: - Internals

    func attach(_ subscription: Subscription, timetoken: Timetoken?) {
        engine.listeners.register(subscription)
        desired.withLock { Self.add(subscription, to: &$0) }
        apply(timetoken: timetoken)
    }

    func detach(_ subscription: Subscription) {
        engine.listeners.unregister(subscription)
        desired.withLock { $0.detach(ObjectIdentifier(subscription)) }
        apply(timetoken: nil)
    }

    private static func add(_ subscription: Subscription, to desired: inout DesiredSubscription) {
        let id = ObjectIdentifier(subscription)
        guard desired.attached[id] == nil else { return }
        desired.attached[id] = subscription.target
        if subscription.withPresence { desired.attachedWithPresence.insert(id) }
        switch subscription.target {
        case .channel(let name):
            desired.channels[name, default: 0] += 1
            if subscription.withPresence { desired.presenceChannels[name, default: 0] += 1 }
        case .group(let name):
            desired.groups[name, default: 0] += 1
            if subscription.withPresence { desired.presenceGroups[name, default: 0] += 1 }
        }
    }

    private func apply(timetoken: Timetoken?) {
        startEngineIfNeeded()
        // The desired set is read inside the engine's transition so concurrent calls apply in order.
        engine.send { machine, now in
            let (channels, groups) = self.desired.withLock { ($0.channelList, $0.groupList) }
            return machine.subscriptionChanged(channels: channels, groups: groups, timetoken: timetoken, now: now)
        }
    }

    func startEngineIfNeeded() {
        engineTask.withLock { state in
            guard case .idle = state else { return }
            let engine = self.engine
            let owner = WeakClient(self)
            let session = self.session
            state = .running(Task { await Self.$isEngineCall.withValue(true) { await engine.run(owner: owner, session: session) } })
        }
    }
}
