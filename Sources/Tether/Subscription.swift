import Synchronization
public import TetherClientCore
public import TetherProtocol

/// One channel, wildcard pattern or channel group the app listens to, with its own streams.
///
/// ```swift
/// let room = client.subscription(channel: "room-1", withPresence: true)
/// room.subscribe()
/// for await message in room.messages { print(message.payload) }
/// ```
///
/// Each stream (``messages``, ``signals``, ``presence``, ``messageActions``) has one consumer; closure listeners
/// (``onMessage(_:)``…) can be added any number of times. Streams finish when the subscription is
/// unsubscribed or the client shuts down. Events arrive in timetoken order, each exactly once.
public final class Subscription: Sendable {
    /// What the subscription names.
    public enum Target: Sendable, Hashable {
        /// A channel or wildcard pattern (`news.*`).
        case channel(String)
        /// A channel group.
        case group(String)
    }

    /// The channel or group.
    public let target: Target
    /// Whether presence events (`-pnpres`) are received too.
    public let withPresence: Bool
    /// Published messages (and files; message actions and App Context events have their own
    /// streams, ``messageActions`` and ``appContextEvents``).
    public let messages: AsyncStream<ReceivedEvent>
    /// Signals.
    public let signals: AsyncStream<ReceivedEvent>
    /// Presence events (join, leave, timeout, state-change) as received on `-pnpres`.
    public let presence: AsyncStream<ReceivedEvent>
    /// Message actions added to or removed from the channel's messages (events of kind
    /// ``EventKind/messageAction``).
    public let messageActions: AsyncStream<MessageActionEvent>
    private let actionSink: AsyncStream<MessageActionEvent>.Continuation
    /// App Context changes (user, channel and membership metadata set or deleted; events of
    /// kind ``EventKind/object``).
    public let appContextEvents: AsyncStream<AppContextEvent>
    private let appContextSink: AsyncStream<AppContextEvent>.Continuation
    /// File messages (message type 4) on the target (``EventKind/file``).
    public let files: AsyncStream<FileEvent>
    private let fileSink: AsyncStream<FileEvent>.Continuation
    private let messageSink: AsyncStream<ReceivedEvent>.Continuation
    private let signalSink: AsyncStream<ReceivedEvent>.Continuation
    private let presenceSink: AsyncStream<ReceivedEvent>.Continuation
    private let handlers = Mutex<[@Sendable (ReceivedEvent) -> Void]>([])
    private weak let client: TetherClient?

    init(target: Target, withPresence: Bool, client: TetherClient) {
        self.target = target
        self.withPresence = withPresence
        self.client = client
        (messages, messageSink) = AsyncStream.makeStream(of: ReceivedEvent.self)
        (signals, signalSink) = AsyncStream.makeStream(of: ReceivedEvent.self)
        (presence, presenceSink) = AsyncStream.makeStream(of: ReceivedEvent.self)
        (messageActions, actionSink) = AsyncStream.makeStream(of: MessageActionEvent.self)
        (appContextEvents, appContextSink) = AsyncStream.makeStream(of: AppContextEvent.self)
        (files, fileSink) = AsyncStream.makeStream(of: FileEvent.self)
    }

    /// Adds a closure called for every event (message, signal or presence), in order.
    public func onEvent(_ handler: @escaping @Sendable (ReceivedEvent) -> Void) {
        handlers.withLock { $0.append(handler) }
    }

    /// Adds a closure called for every message.
    public func onMessage(_ handler: @escaping @Sendable (ReceivedEvent) -> Void) {
        onEvent { event in
            if !event.isPresence && event.kind != .signal && event.kind != .messageAction && event.kind != .object && event.kind != .file {
                handler(event)
            }
        }
    }

    /// Adds a closure called for every signal.
    public func onSignal(_ handler: @escaping @Sendable (ReceivedEvent) -> Void) {
        onEvent { event in if event.kind == .signal { handler(event) } }
    }

    /// Adds a closure called for every message action added or removed.
    public func onMessageAction(_ handler: @escaping @Sendable (MessageActionEvent) -> Void) {
        onEvent { event in if let action = event.messageAction { handler(action) } }
    }

    /// Adds a closure called for every App Context change (user, channel, membership).
    public func onAppContextEvent(_ handler: @escaping @Sendable (AppContextEvent) -> Void) {
        onEvent { event in if let change = event.appContextEvent { handler(change) } }
    }

    /// Adds a closure called for every file message (a file shared on the channel).
    public func onFile(_ handler: @escaping @Sendable (FileEvent) -> Void) {
        onEvent { event in if let file = event.file { handler(file) } }
    }

    /// Adds a closure called for every presence event.
    public func onPresence(_ handler: @escaping @Sendable (ReceivedEvent) -> Void) {
        onEvent { event in if event.isPresence { handler(event) } }
    }

    /// Starts receiving (adds the target to the client's subscription).
    public func subscribe(timetoken: Timetoken? = nil) {
        client?.attach(self, timetoken: timetoken)
    }

    /// Stops receiving: removes the target (unless another subscription still names it) and
    /// finishes the streams.
    public func unsubscribe() {
        client?.detach(self)
        finish()
    }

    /// Whether an event belongs to this subscription.
    func matches(_ event: ReceivedEvent) -> Bool {
        switch target {
        case .group(let name):
            return event.subscription == name || event.subscription == name + NameRules.presenceSuffix
        case .channel(let name):
            if let match = event.subscription, match.hasSuffix(".*") || match.hasSuffix(".*" + NameRules.presenceSuffix) {
                return match == name || match == name + NameRules.presenceSuffix
            }
            if event.isPresence { return withPresence && event.channel == name + NameRules.presenceSuffix }
            return event.channel == name && event.subscription == nil
        }
    }

    func deliver(_ event: ReceivedEvent) {
        if event.isPresence {
            presenceSink.yield(event)
        } else if event.kind == .signal {
            signalSink.yield(event)
        } else if event.kind == .messageAction {
            if let action = event.messageAction { actionSink.yield(action) }
        } else if event.kind == .object {
            if let change = event.appContextEvent { appContextSink.yield(change) }
        } else if event.kind == .file {
            if let file = event.file { fileSink.yield(file) }
        } else {
            messageSink.yield(event)
        }
        for handler in handlers.withLock({ $0 }) { handler(event) }
    }

    func finish() {
        messageSink.finish()
        signalSink.finish()
        presenceSink.finish()
        actionSink.finish()
        appContextSink.finish()
        fileSink.finish()
    }
}

/// Keeps a closure listener registered until ``cancel()``.
public struct ListenerToken: Sendable, Hashable {
    let id: Int
    let registry: ObjectIdentifier
    let remove: @Sendable () -> Void

    /// Removes the listener.
    public func cancel() { remove() }

    /// Equal when they name the same listener.
    public static func == (lhs: Self, rhs: Self) -> Bool { lhs.id == rhs.id && lhs.registry == rhs.registry }
    /// Hashes the identity.
    public func hash(into hasher: inout Hasher) {
        hasher.combine(id)
        hasher.combine(registry)
    }
}

/// Everything the engine delivers to: subscriptions, status, connection and continuity listeners.
final class ListenerRegistry: Sendable {
    private struct Listeners {
        var next = 0
        var status: [Int: @Sendable (Status) -> Void] = [:]
        var connection: [Int: @Sendable (ConnectionChange) -> Void] = [:]
        var continuity: [Int: @Sendable (ChannelContinuity) -> Void] = [:]
        var events: [Int: @Sendable (ConnectionEvent) -> Void] = [:]
        var subscriptions: [ObjectIdentifier: Subscription] = [:]
        var finishers: [Int: @Sendable () -> Void] = [:]
        /// ``finishAll()`` ran (the client shut down): what is made or registered later ends at once.
        var finished = false
    }

    private let state = Mutex(Listeners())

    func add(status handler: @escaping @Sendable (Status) -> Void) -> ListenerToken { add(handler, to: \.status) }

    func add(connection handler: @escaping @Sendable (ConnectionChange) -> Void) -> ListenerToken {
        add(handler, to: \.connection)
    }

    func add(continuity handler: @escaping @Sendable (ChannelContinuity) -> Void) -> ListenerToken {
        add(handler, to: \.continuity)
    }

    func add(event handler: @escaping @Sendable (ConnectionEvent) -> Void) -> ListenerToken {
        add(handler, to: \.events)
    }

    private func add<Event>(_ handler: @escaping @Sendable (Event) -> Void,
                            to listeners: any WritableKeyPath<Listeners, [Int: @Sendable (Event) -> Void]> & Sendable) -> ListenerToken {
        let id = state.withLock { s in
            s.next += 1
            s[keyPath: listeners][s.next] = handler
            return s.next
        }
        return token(id) { $0[keyPath: listeners][id] = nil }
    }

    private func token(_ id: Int, remove: @escaping @Sendable (inout Listeners) -> Void) -> ListenerToken {
        ListenerToken(id: id, registry: ObjectIdentifier(self)) { [weak self] in self?.state.withLock { remove(&$0) } }
    }

    /// A stream fed by a listener that goes away when the consumer stops.
    func stream<Element: Sendable>(_ add: (@escaping @Sendable (Element) -> Void) -> ListenerToken) -> AsyncStream<Element> {
        let (stream, continuation) = AsyncStream.makeStream(of: Element.self)
        let token = add { continuation.yield($0) }
        // Checked and registered in one step: a stream made as the client shuts down is either
        // finished by ``finishAll()`` or here, never left open.
        let registered = state.withLock { s -> Bool in
            guard !s.finished else { return false }
            s.finishers[token.id] = { continuation.finish() }
            return true
        }
        guard registered else {
            token.cancel()
            continuation.finish()
            return stream
        }
        continuation.onTermination = { [weak self] _ in
            token.cancel()
            self?.state.withLock { _ = $0.finishers.removeValue(forKey: token.id) }
        }
        return stream
    }

    func register(_ subscription: Subscription) {
        let registered = state.withLock { s -> Bool in
            guard !s.finished else { return false }
            s.subscriptions[ObjectIdentifier(subscription)] = subscription
            return true
        }
        // After the shutdown nothing is delivered: its streams end at once.
        if !registered { subscription.finish() }
    }

    func unregister(_ subscription: Subscription) {
        state.withLock { $0.subscriptions[ObjectIdentifier(subscription)] = nil }
    }

    var subscriptions: [Subscription] { state.withLock { Array($0.subscriptions.values) } }

    func emit(_ status: Status) {
        for handler in state.withLock({ Array($0.status.values) }) { handler(status) }
    }

    func emit(_ change: ConnectionChange) {
        for handler in state.withLock({ Array($0.connection.values) }) { handler(change) }
        switch change.reconnectEvent {
        case .started?: emit(event: .reconnectStarted)
        case .succeeded?: emit(event: .reconnectSucceeded)
        case .failed?: emit(event: .reconnectFailed)
        case nil: break
        }
    }

    func emit(event: ConnectionEvent) {
        for handler in state.withLock({ Array($0.events.values) }) { handler(event) }
    }

    func emit(_ outcomes: [ChannelContinuity]) {
        let handlers = state.withLock { Array($0.continuity.values) }
        for outcome in outcomes { for handler in handlers { handler(outcome) } }
    }

    func deliver(_ events: [ReceivedEvent]) {
        let subscriptions = state.withLock { Array($0.subscriptions.values) }
        for event in events {
            for subscription in subscriptions where subscription.matches(event) { subscription.deliver(event) }
        }
    }

    func finishAll() {
        let (subscriptions, finishers) = state.withLock { s in
            defer {
                s.finished = true
                s.subscriptions = [:]
                s.status = [:]
                s.connection = [:]
                s.continuity = [:]
                s.events = [:]
                s.finishers = [:]
            }
            return (Array(s.subscriptions.values), Array(s.finishers.values))
        }
        for subscription in subscriptions { subscription.finish() }
        for finish in finishers { finish() }
    }
}
