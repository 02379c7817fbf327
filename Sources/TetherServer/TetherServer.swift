import Foundation
public import Hummingbird
import HummingbirdCore
import HummingbirdTLS
import NIOSSL
public import Logging
import NIOCore
import NIOHTTP1
public import Prometheus
import ServiceLifecycle
import Synchronization
import UnixSignals
@_spi(Benchmarks) import TetherProtocol
package import TetherServerCore

/// How to run a Tether server.
public struct ServerConfiguration: Sendable {
    /// Address to listen on (default 127.0.0.1).
    public var host: String
    /// Port (default 8090; 0 picks a free port).
    public var port: Int
    /// Directory holding the SQLite store (default `./.tether-data`).
    public var dataDirectory: String
    /// Keysets and limits.
    public var file: ConfigurationFile
    /// PEM certificate chain and private key: serve HTTPS instead of HTTP.
    public var tls: (certificatePath: String, privateKeyPath: String)?
    /// Run SQLite's quick check on the store before serving (default `true`); it reads the whole
    /// file once, about 7 s per GB on a small machine.
    public var checksStoreAtStart: Bool
    /// The WebSocket session endpoint (`GET /v2/ws`, docs/websocket-protocol.md).
    public var webSocket = WebSocketSettings()
    /// File sharing: where uploads are kept, the size limit, URL lifetimes (docs/files.md).
    public var files = FileSettings()
    /// The admin secret: with it the live debug console (`/console`) and the admin API
    /// (`/admin/v1/`) are served, protected by it (docs/console.md); without it both answer 404.
    /// Starts as the file's `adminSecret`.
    public var adminSecret: String?
    /// A `postgres://` URL: messages are shared with every other node on the same database
    /// (docs/operations.md). `nil` (the default) keeps everything in the embedded store. Open a
    /// server with one through ``TetherServer/open(configuration:logger:registry:)``.
    public var databaseURL: String?

    /// Creates a configuration.
    public init(host: String = "127.0.0.1", port: Int = 8090, dataDirectory: String = ".tether-data",
                file: ConfigurationFile = .init(), tls: (certificatePath: String, privateKeyPath: String)? = nil,
                checksStoreAtStart: Bool = true) {
        self.host = host
        self.port = port
        self.dataDirectory = dataDirectory
        self.file = file
        self.tls = tls
        self.checksStoreAtStart = checksStoreAtStart
        self.adminSecret = file.adminSecret
        self.databaseURL = file.databaseURL
    }

    /// The subscribe long-poll expiry. `ConfigurationFile.validate()` bounds the setting to
    /// 1…300 s; a configuration built in code without validating is still clamped (fractions
    /// of a second are kept for tests), so NaN or a huge value cannot trap the conversion.
    public var subscribeTimeout: TimeAmount {
        let seconds = file.subscribeTimeoutSeconds.flatMap { $0.isFinite ? $0 : nil } ?? 280
        return .milliseconds(Int64(min(max(seconds, 0.001), 300) * 1000))
    }

    /// The deduplication window and bound (`file.dedup`, clamped to their documented ranges).
    package var deduplication: PublishDedupConfiguration {
        PublishDedupConfiguration(
            windowSeconds: min(file.dedup?.windowSeconds ?? PublishDedupConfiguration.defaultWindowSeconds, 86_400),
            maximumEntries: min(file.dedup?.maxEntries ?? PublishDedupConfiguration.defaultMaximumEntries, 10_000_000))
    }
}

/// The Tether server: the PubNub-compatible REST wire over the embedded durable store.
///
/// ```swift
/// let server = try TetherServer(configuration: .init(port: 8090), logger: logger)
/// try await server.run { url in print("Tether listening on \(url)") }
/// ```
///
/// `run` returns after a graceful shutdown (SIGINT/SIGTERM when `handleSignals` is set,
/// ``shutdown()``, or task cancellation): waiting long-polls are answered, in-flight requests
/// finish, the store writes everything queued, checkpoints and closes. Prefer ``shutdown()`` to
/// cancelling the task that runs the server: cancellation can catch a connection between its
/// accept and its handler, which swift-nio treats as a programming error (apple/swift-nio#2813).
public struct TetherServer: Sendable {
    /// The configuration.
    public let configuration: ServerConfiguration
    /// Shared state (store, hub, keysets).
    public let state: ServerState
    private let logger: Logger
    /// The WebSocket sessions (connected and kept).
    let webSockets: WebSocketSessions
    /// Counts the connections whose Hummingbird side was built.
    private let hummingbirdSides = HummingbirdSides()
    /// The service group while ``run(handleSignals:onReady:)`` runs, for ``shutdown()``.
    private let running = RunningGroup()

    /// Opens the store and prepares the server; does not listen yet. `clock` drives the presence
    /// timeouts (tests pass a manual clock).
    ///
    /// - Throws: ``StoreOpenError`` naming the file and what to do when the store cannot be
    ///   opened, is not a database or is damaged (SQLite's quick check runs on every start
    ///   unless ``ServerConfiguration/checksStoreAtStart`` is off).
    public init<C: Clock>(configuration: ServerConfiguration, logger: Logger, registry: PrometheusCollectorRegistry? = nil,
                          clock: C = ContinuousClock()) throws where C.Duration == Duration {
        guard configuration.databaseURL == nil else {
            throw ServerConfigurationError("a server with a database URL is opened with TetherServer.open (it connects first)")
        }
        try self.init(configuration: configuration, logger: logger, registry: registry, clock: clock, shared: nil)
    }

    /// Opens a server: connects to and migrates the shared database first when the
    /// configuration has a ``ServerConfiguration/databaseURL``, then as the initialiser does.
    ///
    /// - Throws: ``ServerConfigurationError`` for a malformed URL, an error naming the database
    ///   (never its password) when it cannot be reached or its schema is newer than this
    ///   build, and what the initialiser throws.
    public static func open(configuration: ServerConfiguration, logger: Logger, registry: PrometheusCollectorRegistry? = nil)
        async throws -> TetherServer
    {
        guard let text = configuration.databaseURL else {
            return try TetherServer(configuration: configuration, logger: logger, registry: registry)
        }
        let url = try DatabaseURL(text)
        let metrics = registry.map { ServerMetrics(factory: PrometheusMetricsFactory(registry: $0)) } ?? ServerMetrics()
        var options = SharedLogOptions()
        if let store = configuration.file.store?.options {
            options.writeTimeout = store.writeTimeout
            options.writeQueueLimit = store.writeQueueLimit
        }
        let shared = try await SharedLog.open(url, options: options, logger: logger, metrics: metrics)
        do {
            return try TetherServer(configuration: configuration, logger: logger, registry: registry, clock: ContinuousClock(),
                                    shared: shared)
        } catch {
            shared.close()
            throw error
        }
    }

    /// The initialiser behind both: `shared` is the opened log of a cluster, or `nil`.
    package init<C: Clock>(configuration: ServerConfiguration, logger: Logger, registry: PrometheusCollectorRegistry?,
                           clock: C, shared: SharedLog?) throws where C.Duration == Duration {
        let clock = ElapsedClock(clock)
        self.configuration = configuration
        self.logger = logger
        let metrics: ServerMetrics
        if let registry {
            metrics = ServerMetrics(factory: PrometheusMetricsFactory(registry: registry))
        } else {
            metrics = ServerMetrics()
        }
        let path = MessageStore.databasePath(in: configuration.dataDirectory)
        let store: MessageStore
        let hub: LongPollHub
        let sharedState: SharedState?
        let presence: PresenceService
        let access: AccessManager
        let files: FileService
        let keysets = KeysetRegistry(configuration: configuration.file)
        // Everything that reads the store at start-up runs inside this one mapping, so damage
        // found anywhere is reported the same way: the file, SQLite's words, what to run.
        do {
            try StoreOpenError.checkNotEmpty(path: path)
            store = try MessageStore(directory: configuration.dataDirectory, options: configuration.file.store?.options ?? .init(),
                                     logger: logger, metrics: metrics)
            sharedState = shared?.startState
            if configuration.checksStoreAtStart { try store.verifyIntegrity() }
            let defaults = DeliveryHubConfiguration()
            let window = DeliveryHubConfiguration(
                bufferCapacity: configuration.file.window?.capacity ?? defaults.bufferCapacity,
                bufferMaximumAgeSeconds: UInt64(clamping: configuration.file.window?.maximumAgeSeconds ?? 20 * 60),
                memoryBudgetBytes: configuration.file.window?.memoryBudgetBytes ?? defaults.memoryBudgetBytes,
                maxChannels: configuration.file.window?.maxChannels ?? defaults.maxChannels)
            // The deduplication window runs on the injected clock, anchored to the wall clock so
            // that remembered publishes keep their age across restarts.
            let startedAt = LongPollHub.systemNow()
            hub = try LongPollHub(store: store, metrics: metrics, logger: logger, configuration: window,
                                  deduplication: configuration.deduplication,
                                  dedupClock: { startedAt.adding(elapsed: clock.now()) }, shared: shared)
            var groups: [String: [String: Set<String>]] = [:]
            for (subscribeKey, group, channel) in try sharedState?.groups ?? store.allGroupMemberships() {
                groups[subscribeKey, default: [:]][group, default: []].insert(channel)
            }
            for (subscribeKey, byGroup) in groups {
                for (group, channels) in byGroup { hub.setGroup(subscribeKey: subscribeKey, group: group, channels: channels) }
            }
            presence = try PresenceService(
                hub: hub, store: store, clock: clock, logger: logger,
                configurationBySubscribeKey: Dictionary(keysets.all.map { ($0.subscribeKey, $0.presenceConfiguration) },
                                                        uniquingKeysWith: { first, _ in first }),
                maximumMemberships: configuration.file.maxPresenceMemberships ?? PresenceTracker.defaultMaximumMemberships,
                // A cluster's presence deadlines: the injected clock anchored to the wall clock.
                shared: shared, wallNow: { startedAt.adding(elapsed: clock.now()).storageValue / 10_000 })
            access = try AccessManager(store: store, logger: logger, shared: shared.flatMap { log in sharedState.map { (log, $0) } })
        } catch {
            throw StoreOpenError(classifying: error, path: path)
        }
        let console = configuration.adminSecret.flatMap { $0.isEmpty ? nil : $0 }.map {
            AdminConsole(secret: $0, usesTLS: configuration.tls != nil, logger: logger)
        }
        let pushProviders = try PushDispatcher.providers(configuration.file.push)
        let push = PushDispatcher(settings: PushSettings(configuration.file.push), apple: pushProviders.apple,
                                  google: pushProviders.google, store: shared.map { $0 as any PushRegistrationStoring } ?? store,
                                  metrics: metrics, logger: logger)
        push.setDebugPublisher { [hub] subscribeKey, channel, report in
            _ = try? await hub.publish({ tt in
                SubscribeEnvelope(timetoken: tt, subscribeKey: subscribeKey, channel: channel, payload: report, publisher: "tether-push")
            }, store: nil)
        }
        // The file storage: temporaries of interrupted uploads are removed when it opens, and
        // objects whose metadata row never committed are removed here.
        files = try FileService(settings: configuration.files, dataDirectory: configuration.dataDirectory,
                                scheme: configuration.tls == nil ? "http" : "https")
        let orphans = try files.removeOrphans(keeping: store.allFileKeys())
        if orphans > 0 { logger.notice("removed stored files without metadata", metadata: ["count": "\(orphans)"]) }
        state = ServerState(keysets: keysets, store: store, hub: hub, presence: presence, access: access, files: files,
                            rateLimits: RateLimits(enabled: configuration.file.rateLimiting ?? true),
                            metrics: metrics,
                            registry: registry, subscribeTimeout: configuration.subscribeTimeout, logger: logger,
                            startedAt: .now, push: push, console: console)
        webSockets = WebSocketSessions(settings: configuration.webSocket, presence: presence, push: push, clock: clock, logger: logger,
                                       console: console)
        console?.attach(webSockets)
    }

    /// Connections open on the WebSocket endpoint, sessions held (connected or kept), and kept
    /// sessions, for tests and metrics.
    package var webSocketCounts: (connections: Int, sessions: Int, kept: Int) {
        (webSockets.connectionCount, webSockets.sessionCount, webSockets.keptCount)
    }

    /// The cursor the server holds for the WebSocket session with resume token `token`, as its
    /// raw timetoken (tests).
    package func webSocketSessionCursor(token: String) -> UInt64? {
        webSockets.read { table in table.session(forToken: token).flatMap { table.payload(of: $0) }?.cursor.rawValue }
    }

    /// For the WebSocket session with resume token `token`: the cursor after which its socket's
    /// oldest delivery frame not known to be written starts (raw timetoken), and the frames its
    /// socket holds; `nil` when no socket carries it (tests).
    package func webSocketOutbound(token: String) -> (undelivered: UInt64?, held: Int)? {
        webSockets.outbound(forToken: token).map { ($0.undelivered?.rawValue, $0.held) }
    }

    /// WebSocket upgrades accepted since the server started (tests).
    package var webSocketUpgradesAccepted: Int { webSockets.acceptedCount }

    /// Connections whose Hummingbird side (HTTP/1 handlers and request loop, or the upgrade
    /// handler) was built since the server started: only those that sent a request the hot
    /// path passes on (tests).
    package var hummingbirdConnections: Int { hummingbirdSides.total }

    /// Runs the WebSocket sessions' timers once (pings, deadlines) at the clock's current time;
    /// the server's own loop does this at least once a second.
    package func tickWebSocketSessions() async {
        await webSockets.tick()
    }

    /// Listens and serves until shutdown. `onReady` receives the base URL once listening.
    /// When it cannot listen (the port taken or privileged, an address that is not this
    /// machine's or does not resolve) it throws an error that says so and what to do.
    public func run(handleSignals: Bool = true, onReady: @escaping @Sendable (String) -> Void = { _ in }) async throws {
        let host = configuration.host
        // Connections with no traffic for longer than a long-poll (plus margin) are closed, so
        // half-sent requests cannot hold sockets forever.
        // The HTTP parser's limits sit above the largest URI limit, so an over-long URI reaches
        // the responder and gets the protocol's JSON 414 instead of the parser's bare 400.
        let headerLimit = max(256 * 1024, KeysetRegistry(configuration: configuration.file).largestURILimit * 2)
        // The hot routes are answered by `HotPathHandler`, which also owns the idle timeout
        // (Hummingbird's would not see the hot requests).
        let responder = TetherResponder(state: state)
        let logger = logger
        let idle = configuration.subscribeTimeout + .seconds(30)
        let maxBody = state.keysets.largestPublishBody
        let hotTasks = HotPathTasks()
        // Each connection's hot path sits right after the HTTP decoder; Hummingbird's handlers
        // come after it, and only once a request needs them (`TetherHTTPChannel`).
        // One answer closure for every connection (made per connection, its captures were
        // ~0.4 KiB of each).
        let answer: HotPathHandler.Answer = { request, channel, slot in
            var context = TetherRequestContext(source: .init(channel: channel, logger: logger))
            context.longPollSlot = slot
            return await responder.respondCollected(to: request, context: context)
        }
        let hotPath: @Sendable (any HummingbirdOpener) -> HotPathHandler = { opener in
            HotPathHandler(maxBodyBytes: maxBody, idleTimeout: idle, tasks: hotTasks, opener: opener, answer: answer)
        }
        var decoderLimits = NIOHTTPDecoderLimitConfiguration()
        decoderLimits.maxHeaderFieldSize = headerLimit
        decoderLimits.maxHeaderListSize = headerLimit
        decoderLimits.maxHeaderFieldCount = 1000
        // The same port serves REST and, with the endpoint on, upgrades `GET /v2/ws` to a
        // WebSocket session.
        let endpoint = configuration.webSocket.enabled
            ? WebSocketEndpoint(sessions: webSockets, responder: TetherResponder(state: state),
                                maxFrameBytes: WebSocketEndpoint.maxFrameBytes(keysets: state.keysets))
            : nil
        let http1 = HTTPServerBuilder { [decoderLimits] responder in
            TetherHTTPChannel(responder: responder, webSocket: endpoint, decoderLimits: decoderLimits, tasks: hotTasks,
                              hotPath: hotPath, sides: hummingbirdSides, logger: logger)
        }
        var server = http1
        let scheme = configuration.tls == nil ? "http" : "https"
        if let tls = configuration.tls {
            let chain = try NIOSSLCertificate.fromPEMFile(tls.certificatePath).map { NIOSSLCertificateSource.certificate($0) }
            let key = try NIOSSLPrivateKey(file: tls.privateKeyPath, format: .pem)
            server = try .tls(http1, tlsConfiguration: .makeServerConfiguration(certificateChain: chain, privateKey: .privateKey(key)))
        }
        let app = Application(
            responder: TetherResponder(state: state),
            server: server,
            configuration: .init(address: .hostname(host, port: configuration.port), serverName: nil, backlog: 4096),
            onServerRunning: { channel in
                let port = channel.localAddress?.port ?? 0
                let shownHost = host.contains(":") ? "[\(host)]" : host
                onReady("\(scheme)://\(shownHost):\(port)")
            },
            logger: logger
        )
        let group = ServiceGroup(configuration: .init(
            // Graceful shutdown stops services in reverse order: upkeep, then the HTTP server
            // (in-flight heartbeats and leaves finish), then presence (its last changes are
            // written), then the cursor lease or the shared log, then the store writer, which
            // closes the file. WebSocket sessions hear of it first: each gets its drain notice
            // and close before the long-polls are answered.
            services: [
                .init(service: StoreWriterService(store: state.store), successTerminationBehavior: .gracefullyShutdownGroup),
                // The cluster's log, or the embedded store's cursor lease.
                ServiceGroupConfiguration.ServiceConfiguration(
                    service: state.hub.shared.map {
                        SharedLogService(log: $0, hub: state.hub, access: state.access, presence: state.presence, push: state.push) as any Service
                    } ?? CursorLeaseService(hub: state.hub, logger: logger),
                    successTerminationBehavior: .gracefullyShutdownGroup),
                .init(service: PresenceLoopService(presence: state.presence), successTerminationBehavior: .gracefullyShutdownGroup),
                .init(service: PushDispatcherService(push: state.push), successTerminationBehavior: .gracefullyShutdownGroup),
                // Stops right after the HTTP server: the hot path's answers still running finish
                // before presence and the store stop.
                .init(service: HotPathDrainService(tasks: hotTasks, logger: logger), successTerminationBehavior: .gracefullyShutdownGroup),
                .init(service: ListeningService(app: app, host: host, port: configuration.port)),
                .init(service: MaintenanceService(hub: state.hub, store: state.store, access: state.access,
                                                  rateLimits: state.rateLimits, presence: state.presence,
                                                  metrics: state.metrics, logger: logger),
                      successTerminationBehavior: .gracefullyShutdownGroup),
                .init(service: WebSocketSessionsService(sessions: webSockets), successTerminationBehavior: .gracefullyShutdownGroup),
            ] + (state.console.map { [.init(service: ConsoleSampler(console: $0, responder: TetherResponder(state: state)),
                                             successTerminationBehavior: .gracefullyShutdownGroup)] } ?? []),
            gracefulShutdownSignals: handleSignals ? [.sigterm, .sigint] : [],
            logger: logger
        ))
        running.group.withLock { $0 = group }
        try await group.run()
    }

    /// Shuts a running server down gracefully, as SIGTERM does: it stops accepting connections,
    /// answers waiting long-polls, lets in-flight requests finish, writes presence and closes the
    /// store. Returns once the shutdown has been requested; ``run(handleSignals:onReady:)``
    /// returns when it is complete. Does nothing when the server is not running.
    public func shutdown() async {
        guard let group = running.group.withLock({ $0 }) else { return }
        await group.triggerGracefulShutdown()
    }
}

/// The service group of a running ``TetherServer``, shared by its copies.
private final class RunningGroup: Sendable {
    let group = Mutex<ServiceGroup?>(nil)
}

/// Waits, once the HTTP server has stopped, for the hot path's answers still in flight, the
/// request loops of connections whose hot path passed a request on, and the connections still
/// open (at most 10 s):
/// none of them is one of the server's per-connection tasks, which end at once for a connection
/// that only sends hot requests.
struct HotPathDrainService: Service {
    let tasks: HotPathTasks
    let logger: Logger

    func run() async throws {
        do { try await gracefulShutdown() } catch {
            tasks.stopAll()  // cancelled: connections and their request loops stop with the server
            return
        }
        let deadline = ContinuousClock.now + .seconds(10)
        while tasks.running > 0 || tasks.openConnections > 0, ContinuousClock.now < deadline {
            do { try await Task.sleep(for: .milliseconds(10)) } catch {
                tasks.stopAll()
                return
            }
        }
        let stopped = tasks.stopAll()
        if stopped.loops > 0 || stopped.connections > 0 {
            logger.warning("graceful shutdown: connections still open after 10 s were closed", metadata: [
                "connections": "\(stopped.connections)", "requestLoops": "\(stopped.loops)",
            ])
        }
    }
}

/// Runs the HTTP server. A failure to listen (the port taken, an address that is not this
/// machine's) is said in words (``ListenError``); the server's other errors pass through.
struct ListeningService<App: Service>: Service {
    let app: App
    let host: String
    let port: Int

    func run() async throws {
        do {
            try await app.run()
        } catch {
            throw ListenError(error, host: host, port: port) ?? error
        }
    }
}

/// Runs the store's group-commit writer; on shutdown it writes what is queued, checkpoints the
/// WAL and closes the file. Listed first so it stops last.
struct StoreWriterService: Service {
    let store: MessageStore

    func run() async throws {
        await withGracefulShutdownHandler {
            await store.runWriter()
        } onGracefulShutdown: {
            store.finish()
        }
        try store.close()
    }
}

/// Embedded store: renews the hub's cursor lease (``LongPollHub/renewCursorLease()``, checked
/// every second, renewed once 2.5 s of it is used: a write about every 3 s). Stops just before
/// the store, when every service that numbers events has stopped, and settles the lease to the
/// last cursor (``LongPollHub/settleCursorLease()``), so a server restarted at once starts at
/// its clock.
struct CursorLeaseService: Service {
    let hub: LongPollHub
    let logger: Logger

    func run() async throws {
        var failing = false
        while !Task.isCancelled && !Task.isShuttingDownGracefully {
            do {
                try await hub.renewCursorLease()
                if failing { logger.notice("the store takes the cursor lease again") }
                failing = false
            } catch {
                // Logged once per failure streak; until it ends the cursor stays at the last lease.
                if !failing {
                    logger.error("the store could not take the cursor lease; the cursor stops following the clock until it can",
                                 metadata: ["error": "\(error)"])
                }
                failing = true
            }
            do {
                try await cancelWhenGracefulShutdown { try await Task.sleep(for: .seconds(1)) }
            } catch {
                break
            }
        }
        // Cancelled rather than stopped gracefully: others may still number events; the lease stays.
        guard Task.isShuttingDownGracefully, !Task.isCancelled else { return }
        do {
            try hub.settleCursorLease()
        } catch {
            logger.warning("the cursor lease was not settled; a server restarted within 10 s starts up to 10 s ahead of its clock",
                           metadata: ["error": "\(error)"])
        }
    }
}

/// Runs a cluster's shared log: its group-commit writer until shutdown (everything queued is
/// written), and its reader, which feeds every node's events to this node's hub.
struct SharedLogService: Service {
    let log: SharedLog
    let hub: LongPollHub
    let access: AccessManager
    let presence: PresenceService
    let push: PushDispatcher

    func run() async throws {
        await withDiscardingTaskGroup { group in
            group.addTask { [hub, access, presence, push] in
                await log.runReader { entries, horizon in
                    Self.deliver(entries, through: horizon, hub: hub, access: access, presence: presence, push: push)
                }
            }
            await withGracefulShutdownHandler {
                await log.runWriter()
            } onGracefulShutdown: {
                log.finish()
            }
            group.cancelAll()
            log.close()
        }
    }

    /// Delivers a read of the log in its order: events go to the hub; a control entry is
    /// applied after every event before it and before every event after it.
    static func deliver(_ entries: [SharedLogEntry], through horizon: Timetoken, hub: LongPollHub, access: AccessManager,
                        presence: PresenceService, push: PushDispatcher? = nil) {
        var events: [BufferedEvent] = []
        // Suspended WebSocket sessions' devices are held by the node the session is on: each
        // node pushes to its own as every node's messages reach it here (docs/mobile.md).
        let pushing = push?.holdsDevices == true
        for entry in entries {
            switch entry {
            case .event(let event):
                events.append(event)
                if pushing, event.envelope.kind == .message, !NameRules.isPresence(event.envelope.channel) {
                    push?.heldMessageArrived(subscribeKey: event.envelope.subscribeKey, channel: event.envelope.channel,
                                             timetoken: event.envelope.timetoken, payload: event.envelope.payload)
                }
            case .control(let control, let at):
                if !events.isEmpty {
                    hub.ingest(events, through: Timetoken(at.rawValue - 1))
                    presence.observe(events)
                    events.removeAll()
                }
                switch control {
                case .group(let subscribeKey, let group, let channels, let refused):
                    if !refused { hub.setGroup(subscribeKey: subscribeKey, group: group, channels: channels) }
                case .grants, .revocation:
                    access.applyShared(control)
                }
            }
        }
        hub.ingest(events, through: horizon)
        presence.observe(events)
    }
}

/// Runs presence timeouts, interval events and the presence journal until shutdown; stops
/// after the HTTP server, so the presence changes of the last requests are written.
struct PresenceLoopService: Service {
    let presence: PresenceService

    func run() async throws {
        await cancelWhenGracefulShutdown { await presence.run() }
    }
}

/// The push worker (docs/push.md); stops after the HTTP server. Queued notifications not yet
/// sent when the server shuts down are dropped (a push is best effort, like PubNub's).
struct PushDispatcherService: Service {
    let push: PushDispatcher

    func run() async throws {
        await withGracefulShutdownHandler {
            await cancelWhenGracefulShutdown { await push.run() }
        } onGracefulShutdown: {
            push.finish()
        }
    }
}

/// Periodic upkeep (window sweeps, retention pruning); on shutdown it answers every waiting
/// long-poll. Listed last so it is the first to hear of shutdown, before the HTTP server
/// waits for in-flight requests.
struct MaintenanceService: Service {
    let hub: LongPollHub
    let store: MessageStore
    let access: AccessManager
    let rateLimits: RateLimits
    let presence: PresenceService
    let metrics: ServerMetrics
    let logger: Logger

    func run() async throws {
        await withGracefulShutdownHandler {
            var tick = 0
            while !Task.isCancelled && !Task.isShuttingDownGracefully {
                do {
                    try await cancelWhenGracefulShutdown { try await Task.sleep(for: .seconds(10)) }
                } catch {
                    break
                }
                let windows = hub.sweep()
                let dedup = hub.sweepDeduplication()
                metrics.recordDeduplication(entries: dedup.entries, evicted: dedup.evicted)
                if dedup.evicted > 0 {
                    logger.warning("deduplication memory full: forgot publishes before their window ended",
                                   metadata: ["count": "\(dedup.evicted)", "max-entries": "\(hub.deduplication.maximumEntries)"])
                }
                rateLimits.sweep()
                // A cluster's memberships are every node's (counted in PostgreSQL).
                var memberships = presence.read { $0.membershipCount }
                if let shared = presence.shared, let count = try? await shared.membershipCount() { memberships = count }
                metrics.recordBounds(windowBytes: windows.bytes, windows: windows.windows,
                                     presenceMemberships: memberships,
                                     rateLimitBuckets: rateLimits.trackedBuckets)
                access.removeExpired()
                tick += 1
                if tick % 6 == 1 {
                    do {
                        let removed: Int
                        let forgotten: Int
                        if let shared = hub.shared {
                            removed = try await shared.pruneExpired(now: LongPollHub.systemNow())
                            forgotten = try await shared.prunePublishRecords(through: hub.publishRecordHorizon)
                        } else {
                            removed = try await store.pruneExpired(now: LongPollHub.systemNow())
                            forgotten = try await store.prunePublishRecords(through: hub.publishRecordHorizon)
                        }
                        if removed > 0 { logger.info("retention removed messages", metadata: ["count": "\(removed)"]) }
                        if forgotten > 0 { logger.debug("pruned remembered publishes", metadata: ["count": "\(forgotten)"]) }
                    } catch {
                        logger.error("retention pruning failed", metadata: ["error": "\(error)"])
                    }
                }
            }
        } onGracefulShutdown: {
            hub.shutdown()
        }
    }
}

extension Timetoken {
    /// This timetoken plus a non-negative duration, saturating.
    func adding(elapsed: Duration) -> Timetoken {
        let units = UInt64(max(0, elapsed.nanoseconds)) / 100
        let (sum, overflow) = rawValue.addingReportingOverflow(units)
        return Timetoken(overflow ? .max : sum)
    }
}
