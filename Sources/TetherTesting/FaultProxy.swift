public import Logging
import NIOCore
import NIOPosix
import Synchronization

/// A fault-injecting TCP proxy: it listens on a loopback port, forwards every connection to an
/// upstream `host:port`, and misbehaves on demand — refusing connections, resetting them,
/// blackholing them, adding latency and jitter, capping bandwidth, dropping a connection
/// mid-response, answering with a captive-portal page or truncated JSON, failing TLS handshakes.
///
/// The behaviour is a value that can be changed at any time, by hand or on a schedule:
///
/// ```swift
/// let proxy = try await FaultProxy.start(upstream: server.origin)
/// configuration.origin = proxy.origin
/// try await proxy.apply(.blackhole)          // requests hang...
/// try await proxy.apply(.pass)               // ...and complete
/// proxy.schedule([FaultStep(after: .seconds(2), fault: .reset),
///                 FaultStep(after: .zero, fault: .captivePortal, lasting: .seconds(20))])
/// await proxy.stop()
/// ```
///
/// The same proxy runs from the command line as `tether chaos proxy` (see `docs/chaos.md`).
public final class FaultProxy: Sendable {
    /// What the proxy does to traffic. See `docs/chaos.md` for the exact semantics of each.
    public enum Fault: Sendable, Hashable {
        /// Forward everything untouched.
        case pass
        /// Stop listening: new connections are refused (`ECONNREFUSED`); open ones keep working.
        case refuse
        /// Reset every open connection (`SO_LINGER` 0, so the client sees a TCP RST) and reset
        /// every new one as soon as it is accepted, for as long as the fault lasts.
        case reset
        /// Keep every socket open but forward nothing in either direction: bytes are held (the
        /// proxy stops reading, as a dead path stalls TCP) and flow again once the fault ends.
        case blackhole
        /// Delay every chunk of bytes, in each direction, by `base` plus a uniform random amount
        /// in `-jitter...jitter` (never below zero; order is preserved).
        case latency(base: Duration, jitter: Duration = .zero)
        /// Cap each direction of each connection to `bytesPerSecond`.
        case bandwidth(bytesPerSecond: Int)
        /// Forward at most `afterBytes` more bytes to the client on each connection, then close
        /// it (a FIN, so exactly that many bytes arrive before end-of-stream).
        case dropMidResponse(afterBytes: Int)
        /// Answer the next request on every connection with an HTTP 200 `text/html` sign-in page
        /// and close; nothing reaches upstream.
        case captivePortal
        /// Answer the next request on every connection with an HTTP 200 `application/json`
        /// response whose (correctly framed) body is valid JSON cut in half, and close.
        case truncatedJSON
        /// Answer the next request on every connection with `429 Too Many Requests`, a
        /// `Retry-After` of `retryAfterSeconds` and PubNub's JSON error body, and close: an
        /// overloaded server or load balancer shedding load. Nothing reaches upstream.
        case overloaded(retryAfterSeconds: Int)
        /// Answer a TLS ClientHello with bytes that are not TLS and close; plaintext connections
        /// and TLS connections established before the fault are forwarded.
        case failTLSHandshake
    }

    /// What the proxy has done so far.
    public struct Counters: Sendable, Hashable {
        /// TCP connections accepted from clients.
        public var accepted = 0
        /// Connections for which an upstream connection was established.
        public var forwarded = 0
        /// Connections the proxy reset (`.reset`).
        public var reset = 0
        /// Connections answered by the proxy itself (captive portal, truncated JSON, TLS garbage).
        public var answered = 0
        /// Connections closed mid-response by `.dropMidResponse`.
        public var dropped = 0
        /// Connections closed because upstream could not be reached.
        public var upstreamFailures = 0
        /// Client connections open now.
        public var open = 0
        /// Bytes written to upstream.
        public var bytesToUpstream = 0
        /// Bytes written to clients (forwarded or answered by the proxy).
        public var bytesToClient = 0

        /// All zero.
        public init() {}
    }

    struct State {
        var fault: Fault = .pass
        var counters = Counters()
        var connections: [Int: NIOLoopBound<FaultProxyConnection>] = [:]
        var nextID = 0
        var listener: (any Channel)?
        var stopped = false
        var schedule: FaultSchedule?
        var lastOperation: Task<Void, any Error>?
        /// Those awaiting a fault (``waitUntilFault(_:)``).
        var faultWatchers = ConditionWatchers<Fault>()
    }

    let state = Mutex(State())
    let group: MultiThreadedEventLoopGroup
    let clock: ScheduleClock
    let logger: Logger

    /// The host the proxy listens on.
    public let host: String
    /// The port the proxy listens on (stays the same across `.refuse`).
    public let port: Int
    /// The upstream host.
    public let upstreamHost: String
    /// The upstream port.
    public let upstreamPort: Int

    /// `host:port` of the proxy, ready for `TetherConfiguration.origin`.
    public var origin: String { "\(host):\(port)" }

    /// The fault in effect now.
    public var fault: Fault { state.withLock { $0.fault } }

    /// Returns once `fault` is in effect (at once if it is), or when the calling task is
    /// cancelled: resumed by the change itself, so a test follows a ``schedule(_:)`` without
    /// polling ``fault``.
    package func waitUntilFault(_ fault: Fault) async {
        await ConditionWatchers.wait(until: { $0 == fault }) { body in state.withLock { body(&$0.faultWatchers, $0.fault) } }
    }

    /// A snapshot of the counters.
    public var counters: Counters { state.withLock { $0.counters } }

    private init(host: String, port: Int, upstreamHost: String, upstreamPort: Int, group: MultiThreadedEventLoopGroup,
                 clock: ScheduleClock, logger: Logger) {
        self.host = host
        self.port = port
        self.upstreamHost = upstreamHost
        self.upstreamPort = upstreamPort
        self.group = group
        self.clock = clock
        self.logger = logger
    }

    /// Starts a proxy listening on `host:port` (port 0: a free port) and forwarding to
    /// `upstreamHost:upstreamPort`, initially with `fault` in effect.
    ///
    /// - Parameter clock: the clock ``schedule(_:)`` waits on (a `TestClock` in tests); the
    ///   socket-level behaviour itself (latency, bandwidth) always runs in real time.
    public static func start(host: String = "127.0.0.1", port: Int = 0, upstreamHost: String, upstreamPort: Int,
                             fault: Fault = .pass, clock: some Clock<Duration> = ContinuousClock(),
                             logger: Logger = Logger(label: "tether.fault-proxy")) async throws -> FaultProxy {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let reference = ProxyReference()
        let listener: any Channel
        do {
            listener = try await bind(host: host, port: port, group: group, proxy: reference)
        } catch {
            try? await group.shutdownGracefully()
            throw error
        }
        let proxy = FaultProxy(host: host, port: listener.localAddress?.port ?? port, upstreamHost: upstreamHost,
                               upstreamPort: upstreamPort, group: group, clock: ScheduleClock(clock), logger: logger)
        reference.set(proxy)
        proxy.state.withLock { $0.listener = listener }
        if fault != .pass { try await proxy.apply(fault) }
        return proxy
    }

    /// Starts a proxy forwarding to `upstream`, given as `host:port` (for example an
    /// `InProcessServer`'s `origin`).
    public static func start(host: String = "127.0.0.1", port: Int = 0, upstream: String, fault: Fault = .pass,
                             clock: some Clock<Duration> = ContinuousClock(),
                             logger: Logger = Logger(label: "tether.fault-proxy")) async throws -> FaultProxy {
        let (upstreamHost, upstreamPort) = try parseHostPort(upstream)
        return try await start(host: host, port: port, upstreamHost: upstreamHost, upstreamPort: upstreamPort, fault: fault,
                               clock: clock, logger: logger)
    }

    /// Puts `fault` into effect now, replacing the current one, and cancels any running
    /// ``schedule(_:)``. Returns once listening has stopped or resumed (for `.refuse`) and every
    /// open connection has been told (so after `apply(.reset)` every open connection is reset).
    ///
    /// - Throws: when the port cannot be listened on again after `.refuse`.
    public func apply(_ fault: Fault) async throws {
        let schedule = state.withLock { state -> FaultSchedule? in
            defer { state.schedule = nil }
            return state.schedule
        }
        schedule?.cancel()
        try await set(fault)
    }

    /// Resets every connection open now (a TCP RST to the client, as ``Fault/reset`` does) and
    /// leaves the fault in effect unchanged, so new connections are handled as before: a network
    /// switch that kills every socket of the old path while the new path works at once.
    public func resetOpenConnections() async {
        let connections = state.withLock { Array($0.connections.values) }
        for connection in connections {
            try? await connection.eventLoop.submit { connection.value.reset() }.get()
        }
    }

    /// Runs `steps` one after another on the proxy's clock, replacing any running schedule:
    /// each step waits `after` (counted from the end of the previous step, or from now), applies
    /// its fault, and when `lasting` is set returns to `.pass` after that long. Offsets are
    /// computed from the instant `schedule` is called, so a `TestClock` advanced right away
    /// still fires the steps.
    @discardableResult
    public func schedule(_ steps: [FaultStep]) -> FaultSchedule {
        let schedule = FaultSchedule()
        let previous = state.withLock { state -> FaultSchedule? in
            defer { state.schedule = schedule }
            return state.schedule
        }
        previous?.cancel()
        let body = runSchedule(steps, schedule: schedule)
        schedule.start(body)
        return schedule
    }

    /// Stops listening, closes every connection and shuts the event loop down.
    public func stop() async {
        let (listener, connections, schedule) = state.withLock { state in
            state.stopped = true
            defer { state.listener = nil; state.schedule = nil }
            return (state.listener, Array(state.connections.values), state.schedule)
        }
        schedule?.cancel()
        try? await listener?.close()
        for connection in connections {
            try? await connection.eventLoop.submit { connection.value.closeAll() }.get()
        }
        try? await group.shutdownGracefully()
    }

    // MARK: - Internals

    private func runSchedule(_ steps: [FaultStep], schedule: FaultSchedule) -> @Sendable () async -> Void {
        let sleep = clock.begin()
        var timeline: [(at: Duration, fault: Fault)] = []
        var offset = Duration.zero
        for step in steps {
            offset += step.after
            timeline.append((offset, step.fault))
            if let lasting = step.lasting {
                offset += lasting
                timeline.append((offset, .pass))
            }
        }
        let events = timeline
        return { [self] in
            for event in events {
                do { try await sleep(event.at) } catch { return }
                guard !Task.isCancelled, !schedule.isCancelled else { return }
                do { try await set(event.fault) } catch {
                    logger.error("fault proxy: could not apply \(event.fault): \(error)")
                }
            }
        }
    }

    /// Serialises fault changes (listening on/off must not interleave).
    func set(_ fault: Fault) async throws {
        let task = state.withLock { state -> Task<Void, any Error> in
            let previous = state.lastOperation
            let task = Task { [self] in
                _ = await previous?.result
                try await perform(fault)
            }
            state.lastOperation = task
            return task
        }
        try await task.value
    }

    private func perform(_ fault: Fault) async throws {
        let (old, connections, listener, stopped, watchers) = state.withLock { state in
            let old = state.fault
            state.fault = fault
            return (old, Array(state.connections.values), state.listener, state.stopped, state.faultWatchers.satisfied(by: fault))
        }
        for watcher in watchers { watcher.resume() }
        if old != fault { logger.info("fault proxy \(origin): \(old) -> \(fault)") }
        guard !stopped else { return }
        if fault == .refuse, let listener {
            state.withLock { $0.listener = nil }
            try? await listener.close()
        } else if fault != .refuse, listener == nil {
            let channel = try await Self.bind(host: host, port: port, group: group, proxy: ProxyReference(self))
            let stale = state.withLock { state -> (any Channel)? in
                if state.stopped { return channel }
                state.listener = channel
                return nil
            }
            try? await stale?.close()
        }
        for connection in connections {
            try? await connection.eventLoop.submit { connection.value.faultChanged(to: fault) }.get()
        }
    }

    private static func bind(host: String, port: Int, group: MultiThreadedEventLoopGroup, proxy: ProxyReference)
        async throws -> any Channel
    {
        try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.allowRemoteHalfClosure, value: true)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    guard let proxy = proxy.proxy else { throw ChannelError.ioOnClosedChannel }
                    try proxy.accept(channel)
                }
            }
            .bind(host: host, port: port).get()
    }

    /// Called on the accepted channel's event loop.
    private func accept(_ channel: any Channel) throws {
        let (id, fault) = state.withLock { state in
            state.nextID += 1
            state.counters.accepted += 1
            state.counters.open += 1
            return (state.nextID, state.fault)
        }
        let connection = FaultProxyConnection(id: id, client: channel, proxy: self, fault: fault)
        state.withLock { $0.connections[id] = NIOLoopBound(connection, eventLoop: channel.eventLoop) }
        try channel.pipeline.syncOperations.addHandler(FaultProxySideHandler(connection: connection, side: .client))
    }

    func connectionClosed(_ id: Int) {
        state.withLock { state in
            if state.connections.removeValue(forKey: id) != nil { state.counters.open -= 1 }
        }
    }

    func count(_ update: (inout Counters) -> Void) {
        state.withLock { update(&$0.counters) }
    }
}

/// A clock, erased: `begin()` notes the current instant and returns a function sleeping until
/// that instant plus an offset.
struct ScheduleClock: Sendable {
    let begin: @Sendable () -> @Sendable (Duration) async throws -> Void

    init<C: Clock>(_ clock: C) where C.Duration == Duration {
        begin = {
            let start = clock.now
            return { offset in
                let deadline = start.advanced(by: offset)
                // Some test clocks suspend a sleep whose deadline is exactly "now" until the next
                // advance; a deadline already reached needs no sleep at all.
                guard clock.now < deadline else { return }
                try await clock.sleep(until: deadline, tolerance: nil)
            }
        }
    }
}

/// A late-bound, thread-safe reference from the listening socket to its proxy.
final class ProxyReference: Sendable {
    private let reference: Mutex<FaultProxy?>
    init(_ proxy: FaultProxy? = nil) { reference = Mutex(proxy) }
    var proxy: FaultProxy? { reference.withLock { $0 } }
    func set(_ proxy: FaultProxy) { reference.withLock { $0 = proxy } }
}

/// One step of a ``FaultProxy/schedule(_:)``.
public struct FaultStep: Sendable, Hashable {
    /// How long to wait, after the previous step ended (or the schedule started), before applying `fault`.
    public var after: Duration
    /// The fault to apply.
    public var fault: FaultProxy.Fault
    /// How long the fault lasts before the proxy returns to `.pass`; `nil`: until the next step or change.
    public var lasting: Duration?

    /// A step applying `fault` after `after`, for `lasting` (or until changed).
    public init(after: Duration = .zero, fault: FaultProxy.Fault, lasting: Duration? = nil) {
        self.after = after
        self.fault = fault
        self.lasting = lasting
    }
}

/// A running ``FaultProxy/schedule(_:)``: cancel it, or wait for its last step.
public final class FaultSchedule: Sendable {
    private struct State {
        var task: Task<Void, Never>?
        var cancelled = false
    }

    private let state = Mutex(State())

    init() {}

    func start(_ body: @escaping @Sendable () async -> Void) {
        let task = Task { await body() }
        let cancelled = state.withLock { state in
            state.task = task
            return state.cancelled
        }
        if cancelled { task.cancel() }
    }

    /// Whether the schedule was cancelled (by ``cancel()``, `apply` or another `schedule`).
    public var isCancelled: Bool { state.withLock { $0.cancelled } }

    /// Stops the schedule; the fault in effect stays.
    public func cancel() {
        let task = state.withLock { state in
            state.cancelled = true
            return state.task
        }
        task?.cancel()
    }

    /// Waits until the last step has been applied (or the schedule was cancelled).
    public func finished() async {
        await state.withLock { $0.task }?.value
    }
}

/// Why a `host:port` or a fault command could not be understood.
public struct FaultProxyError: Error, Sendable, Hashable, CustomStringConvertible {
    /// What went wrong.
    public var message: String

    /// An error with `message`.
    public init(_ message: String) { self.message = message }

    /// The message.
    public var description: String { message }
}

func parseHostPort(_ text: String) throws(FaultProxyError) -> (String, Int) {
    var text = Substring(text)
    for scheme in ["http://", "https://"] where text.hasPrefix(scheme) { text = text.dropFirst(scheme.count) }
    guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]), (0...65535).contains(port) else {
        throw FaultProxyError("expected host:port, got '\(text)'")
    }
    var host = String(text[..<colon])
    if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
    return (host.isEmpty ? "127.0.0.1" : host, port)
}
