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
/// Each stream (``messages``, ``signals``, ``presence``, ``messageActions``, ``appContextEvents``,
/// ``files``) has one consumer; closure listeners (``onMessage(_:)``…) can be added any number of
/// times. Streams finish when the subscription is unsubscribed or the client shuts down. Events
/// arrive in timetoken order, each exactly once.
///
/// A stream holds what arrives for it from the moment it is first read, however long its
/// consumer takes. Before that, it keeps only the newest ``unreadStreamLimit`` events, so a
/// stream the app never reads (it listens with closures, or reads only ``messages``) does not
/// grow: read a stream before or right after ``subscribe(timetoken:)`` to get every event.
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
    public var messages: AsyncStream<ReceivedEvent> { messageSink.stream }
    /// Signals.
    public var signals: AsyncStream<ReceivedEvent> { signalSink.stream }
    /// Presence events (join, leave, timeout, state-change) as received on `-pnpres`.
    public var presence: AsyncStream<ReceivedEvent> { presenceSink.stream }
    /// Message actions added to or removed from the channel's messages (events of kind
    /// ``EventKind/messageAction``).
    public var messageActions: AsyncStream<MessageActionEvent> { actionSink.stream }
    /// App Context changes (user, channel and membership metadata set or deleted; events of
    /// kind ``EventKind/object``).
    public var appContextEvents: AsyncStream<AppContextEvent> { appContextSink.stream }
    /// File messages (message type 4) on the target (``EventKind/file``).
    public var files: AsyncStream<FileEvent> { fileSink.stream }
    private let messageSink = LazyStream<ReceivedEvent>()
    private let signalSink = LazyStream<ReceivedEvent>()
    private let presenceSink = LazyStream<ReceivedEvent>()
    private let actionSink = LazyStream<MessageActionEvent>()
    private let appContextSink = LazyStream<AppContextEvent>()
    private let fileSink = LazyStream<FileEvent>()
    private let handlers = Mutex<[@Sendable (ReceivedEvent) -> Void]>([])
    private weak let client: TetherClient?

    init(target: Target, withPresence: Bool, client: TetherClient) {
        self.target = target
        self.withPresence = withPresence
        self.client = client
    }

    /// Events a stream keeps before it is first read (the newest; older ones are dropped).
    public static let unreadStreamLimit = 1_000

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

/// One of a ``Subscription``'s streams, made when the app first reads it. Until then the events
/// for it are kept, at most ``Subscription/unreadStreamLimit`` (the newest), and handed to the
/// stream when it is made, in order.
final class LazyStream<Element: Sendable>: Sendable {
    private struct State {
        var stream: AsyncStream<Element>?
        var sink: AsyncStream<Element>.Continuation?
        var pending: [Element] = []
        /// Index of the oldest pending event (the array is compacted when it is half unused).
        var start = 0
        var finished = false
    }

    private let state = Mutex(State())

    /// The stream; the same one every time.
    var stream: AsyncStream<Element> {
        state.withLock { s in
            if let stream = s.stream { return stream }
            let (stream, sink) = AsyncStream.makeStream(of: Element.self)
            for element in s.pending[s.start...] { sink.yield(element) }
            s.pending = []
            s.start = 0
            if s.finished { sink.finish() }
            (s.stream, s.sink) = (stream, sink)
            return stream
        }
    }

    func yield(_ element: Element) {
        state.withLock { s in
            if let sink = s.sink {
                sink.yield(element)
                return
            }
            guard !s.finished else { return }
            s.pending.append(element)
            if s.pending.count - s.start > Subscription.unreadStreamLimit {
                s.start += 1
                if s.start * 2 >= s.pending.count {
                    s.pending.removeFirst(s.start)
                    s.start = 0
                }
            }
        }
    }

    func finish() {
        state.withLock { s in
            s.finished = true
            s.sink?.finish()
        }
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
