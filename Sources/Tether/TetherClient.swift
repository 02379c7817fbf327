import Crypto
import Foundation
import Logging
import Synchronization
public import TetherClientCore
import TetherProtocol

/// The Tether client: REST APIs today, the subscribe engine next.
///
/// Creating a client does no I/O: no socket, no thread, no DNS lookup happens until the first
/// call. Every call is `async`, returns a typed result and throws ``TetherError`` (whose
/// ``TetherError/status`` says what happened and can ``Status/retry()`` the call).
/// Call ``shutdown()`` when done: it closes every connection and stops the transport's thread.
/// A client released without it is freed all the same (its background tasks hold it weakly; a
/// long-poll in flight holds it until it returns) and then closes what it opened, ending a
/// WebSocket session with `bye`.
public final class TetherClient: Sendable {
    /// The configuration the client was created with.
    public let configuration: TetherConfiguration
    /// The transport requests go through.
    public let transport: any Transport
    private let token: AuthTokenStore
    private let logger: Logger
    let engine: SubscribeEngine
    let engineTask = Mutex<EngineTaskState>(.idle)
    let desired = Mutex<DesiredSubscription>(DesiredSubscription())
    let outboxDriver: OutboxDriver
    let outboxListeners = OutboxListeners()
    let outboxTask = Mutex<EngineTaskState>(.idle)
    let networkMonitor: (any NetworkMonitor)?
    let session: WebSocketSession
    let webSocketConnector: any WebSocketConnector
    /// Whether the WebSocket wire can be used (see ``init(configuration:transport:clock:networkMonitor:)``).
    let hasWebSocketWire: Bool
    let wire = Mutex(WireChoice())
    let elapsedClock: ElapsedClock
    /// Which origin requests go to: the primary or a fallback (``TetherConfiguration/fallbackOrigins``).
    let origins: OriginRouter
    /// The device a suspended session's deliveries are pushed to (``setBackgroundPushDevice(_:pushType:environment:topic:)``).
    let backgroundPushDevice = Mutex<BackgroundPushDevice?>(nil)
    /// Whether ``shutdown()`` ran (so `deinit` has nothing left to stop).
    private let shutDownByApp = Mutex(false)
    /// Follows the application's background/foreground notifications (Apple platforms, when
    /// ``LifecycleOptions/observesApplicationState`` is on).
    private let applicationObserver = Mutex<ApplicationStateObserver?>(nil)

    /// Creates a client with the default AsyncHTTPClient transport. Does no I/O.
    public convenience init(configuration: TetherConfiguration) throws(ConfigurationError) {
        let transport: HTTPClientTransport
        do {
            transport = try HTTPClientTransport(trustedCertificateAuthoritiesPEM: configuration.trustedCertificateAuthoritiesPEM,
                                                connectTimeout: configuration.connectTimeout, logger: configuration.logger)
        } catch {
            throw .invalidCertificateAuthorities(String(describing: error))
        }
        self.init(configuration: configuration, transport: transport)
    }

    /// Creates a client on a custom transport (tests, other platforms). Does no I/O. It watches
    /// the network unless ``TetherConfiguration/watchesNetwork`` is off.
    public convenience init(configuration: TetherConfiguration, transport: any Transport) {
        self.init(configuration: configuration, transport: transport, clock: ContinuousClock(),
                  networkMonitor: configuration.watchesNetwork ? Self.platformNetworkMonitor(for: configuration) : nil)
    }

    /// The platform's network monitor: rtnetlink on Linux (counting loopback when the origin is
    /// a loopback address), `NWPathMonitor` on Apple platforms; nil elsewhere.
    static func platformNetworkMonitor(for configuration: TetherConfiguration) -> (any NetworkMonitor)? {
        #if os(Linux)
        return RTNetlinkNetworkMonitor(includeLoopback: configuration.originIsLoopback)
        #elseif canImport(Network)
        return PathNetworkMonitor()
        #else
        return nil
        #endif
    }

    /// Creates a client with an injected clock for the subscribe engine's timers (tests pass a
    /// `TestClock`) and an optional ``NetworkMonitor`` (``RTNetlinkNetworkMonitor`` on Linux,
    /// ``PathNetworkMonitor`` on Apple platforms). Does no I/O.
    ///
    /// The WebSocket wire opens its own sockets. A client on the built-in HTTP transport has it;
    /// a client on a custom ``Transport`` has it only when ``TetherConfiguration/transport`` is
    /// ``TransportPreference/webSocket`` — under ``TransportPreference/automatic`` it receives
    /// over long-poll through `transport`, so an app (or a test) that routes every request through
    /// its own transport keeps doing so.
    public convenience init<C: Clock>(configuration: TetherConfiguration, transport: any Transport, clock: C,
                                      networkMonitor: (any NetworkMonitor)?) where C.Duration == Duration {
        let sockets = transport is HTTPClientTransport || configuration.transport == .webSocket
        self.init(configuration: configuration, transport: transport, clock: clock, networkMonitor: networkMonitor,
                  webSocketConnector: sockets
                      ? LazyWebSocketConnector(trustedCertificateAuthoritiesPEM: configuration.trustedCertificateAuthoritiesPEM) : nil)
    }

    /// Creates a client whose WebSocket wire opens its sockets through `webSocketConnector`
    /// (tests pass TetherTesting's `InMemoryWebSocket`). Does no I/O.
    package init<C: Clock>(configuration: TetherConfiguration, transport: any Transport, clock: C,
                           networkMonitor: (any NetworkMonitor)?, webSocketConnector: (any WebSocketConnector)?) where C.Duration == Duration {
        var configuration = configuration
        configuration.webSocket = configuration.webSocket.bounded
        self.configuration = configuration
        self.transport = transport
        let tokenStore = AuthTokenStore(configuration.authKey)
        self.token = tokenStore
        self.logger = configuration.logger
        let elapsed = ElapsedClock(clock)
        self.engine = SubscribeEngine(configuration: configuration.subscribeMachineConfiguration, clock: elapsed,
                                      monitor: networkMonitor, logger: configuration.logger)
        self.networkMonitor = networkMonitor
        self.elapsedClock = elapsed
        let listeners = engine.listeners
        let origins = OriginRouter(configuration: configuration, clock: elapsed) { change in
            listeners.emit(event: .originChanged(from: change.from, to: change.to))
        }
        self.origins = origins
        self.webSocketConnector = webSocketConnector ?? UnavailableWebSocketConnector()
        self.hasWebSocketWire = webSocketConnector != nil
        self.session = WebSocketSession(connector: self.webSocketConnector, configuration: configuration, clock: elapsed,
                                        origins: origins, authToken: tokenStore) { report in
            switch report {
            case .resumed(let sessionId): listeners.emit(event: .sessionResumed(sessionId: sessionId))
            case .expired(let message): listeners.emit(event: .sessionExpired(message: message))
            case .partlyDenied(let channels, let groups, let message):
                // Only these names end: an accessDenied status naming them, with no retry (the
                // others keep flowing; connect() or reconnect() tries the denied ones again).
                listeners.emit(Status(category: .accessDenied, operation: .subscribe, statusCode: 403, serverMessage: message,
                                      affectedChannels: channels, affectedGroups: groups, deniedChannels: channels,
                                      deniedGroups: groups))
            }
        }
        self.outboxDriver = OutboxDriver(configuration: configuration.outbox, clock: elapsed, listeners: outboxListeners,
                                         logger: configuration.logger)
        if configuration.lifecycle.observesApplicationState && ApplicationStateObserver.isAvailable {
            let observer = ApplicationStateObserver(client: self)
            applicationObserver.withLock { $0 = observer }
        }
    }

    /// The origin (`host` or `host:port`) requests go to now: ``TetherConfiguration/origin``, or
    /// the fallback origin the client failed over to (``ConnectionEvent/originChanged(from:to:)``
    /// announces every move).
    public var currentOrigin: String { origins.current }

    /// The outbox every publish and signal goes through: list, resend or cancel its messages,
    /// follow their states, or hand it a message without awaiting the send (see ``Outbox``).
    public var outbox: Outbox { Outbox(client: self) }

    /// Starts the outbox's loop (sends, retry timers, network reports) on its first use.
    func startOutboxIfNeeded() {
        outboxTask.withLock { state in
            guard case .idle = state else { return }
            let driver = outboxDriver
            let monitor = networkMonitor
            let owner = WeakClient(self)
            let changes = connectionChanges()
            state = .running(Task { await driver.run(owner: owner, connectionChanges: changes, monitor: monitor) })
        }
    }

    /// Closes every connection and stops the transport, the subscribe engine and the outbox;
    /// subscription, status and outbox streams finish. Callers awaiting a publish get
    /// ``StatusCategory/cancelled``; with a durable outbox, messages not yet sent stay in its
    /// journal for the next launch. Calls made afterwards fail with ``StatusCategory/cancelled``.
    public func shutdown() async {
        shutDownByApp.withLock { $0 = true }
        await outboxDriver.shutdown()
        let outbox = outboxTask.withLock { state -> Task<Void, Never>? in
            defer { state = .shutDown }
            if case .running(let task) = state { return task }
            return nil
        }
        outbox?.cancel()
        await outbox?.value
        outboxListeners.finishAll()
        let task = engineTask.withLock { state -> Task<Void, Never>? in
            defer { state = .shutDown }
            if case .running(let task) = state { return task }
            return nil
        }
        engine.finish()
        task?.cancel()
        await task?.value
        await session.finish()
        engine.listeners.finishAll()
        await webSocketConnector.shutdown()
        await transport.shutdown()
    }

    /// A client the app released without ``shutdown()``: its background work holds it only
    /// weakly (``WeakClient``), so it gets here; stop that work and close its connections.
    deinit {
        guard !shutDownByApp.withLock({ $0 }) else { return }
        let engine = self.engine
        let engineTask = engineTask.withLock { state -> Task<Void, Never>? in
            defer { state = .shutDown }
            if case .running(let task) = state { return task }
            return nil
        }
        let outboxTask = outboxTask.withLock { state -> Task<Void, Never>? in
            defer { state = .shutDown }
            if case .running(let task) = state { return task }
            return nil
        }
        let (driver, outboxListeners, session, listeners, connector, transport) =
            (outboxDriver, self.outboxListeners, session, engine.listeners, webSocketConnector, transport)
        Task {
            // A WebSocket session ends with `bye` (presence leave), as an unsubscribe would —
            // before the engine's tasks stop, which would close the socket without it.
            await session.close(bye: true)
            engine.finish()
            engineTask?.cancel()
            outboxTask?.cancel()
            await driver.shutdown()
            await outboxTask?.value
            outboxListeners.finishAll()
            await engineTask?.value
            await session.finish()
            listeners.finishAll()
            await connector.shutdown()
            await transport.shutdown()
        }
    }

    // MARK: - Access Manager token

    /// Replaces the auth key / Access Manager token sent with every later request (`nil` removes
    /// it): REST calls, the long-poll's next request, a failed call's ``Status/retry()``, and the
    /// WebSocket wire's next `hello` (an open session keeps the token it was opened with until
    /// it reconnects or resumes: after an `accessDenied`, call this, then ``connect()``).
    public func setToken(_ token: String?) {
        self.token.set(token)
    }

    /// The auth key or token currently sent with requests.
    public var currentToken: String? { token.current }

    /// Parses an Access Manager v3 token (pubnub-wire §11.4) without any I/O.
    public static func parseToken(_ token: String) throws(TetherError) -> AccessToken {
        do { return try AccessToken(parsing: token) } catch {
            throw TetherError(Status(category: .badRequest, operation: .grantToken, error: error, serverMessage: error.description))
        }
    }

    // MARK: - Request pipeline

    var endpoints: Endpoints {
        Endpoints(context: RequestContext(publishKey: configuration.publishKey, subscribeKey: configuration.subscribeKey,
                                          userId: configuration.userId, authKey: currentToken))
    }

    /// Builds, sends, classifies and decodes one REST call.
    func perform<Result: Sendable>(
        _ operation: TetherOperation, channels: [String] = [], groups: [String] = [],
        build: (Endpoints) throws(RequestBuildError) -> RequestSpec,
        decode: @escaping @Sendable (JSONValue) throws(DecodingFailure) -> Result
    ) async throws(TetherError) -> Result {
        let spec: RequestSpec
        do { spec = try build(endpoints) } catch {
            throw TetherError(Status(category: .badRequest, operation: operation, error: error, serverMessage: error.description,
                                     affectedChannels: channels, affectedGroups: groups))
        }
        let endpoint = RetryConfiguration.Endpoint(operation)
        // Publishes retry in the outbox; the subscribe engine's own calls (probes, leaves,
        // backfill) follow the engine's policy, not this one. Both reach the next origin on
        // their next attempt.
        guard endpoint != .messageSend, endpoint != .subscribe, !Self.isEngineCall else {
            return try await execute(spec, channels: channels, groups: groups, decode: decode)
        }
        guard configuration.retry.retries(endpoint) else {
            return try await executeFailingOver(spec, channels: channels, groups: groups, decode: decode)
        }
        // The endpoint is not in `excludedEndpoints`: transient failures are retried with the
        // policy's delays (and never sooner than a `Retry-After`), then the last failure is thrown.
        let start = elapsedClock.now()
        var attempt = 0
        while true {
            do { return try await executeFailingOver(spec, channels: channels, groups: groups, decode: decode) } catch {
                attempt += 1
                guard RetryConfiguration.isTransient(error.status), RetryConfiguration.maySendAgain(error.status, spec),
                      let delay = configuration.retry.delay(beforeRetry: attempt, elapsed: elapsedClock.now() - start,
                                                            randomness: Double.random(in: 0..<1)) else { throw error }
                logger.debug("retrying", metadata: ["operation": "\(operation)", "attempt": "\(attempt)", "category": "\(error.status.category)"])
                do { try await elapsedClock.sleep(max(delay, error.status.retryAfter ?? .zero)) } catch {
                    throw TetherError(Status(category: .cancelled, operation: operation, affectedChannels: channels, affectedGroups: groups))
                }
            }
        }
    }

    /// ``execute(_:channels:groups:decode:)``, sent again at once to the next origin when a
    /// connection-level failure moved the client to a fallback not yet tried (Ably's RSC15: the
    /// fallbacks are part of one call, not a retry): each origin is tried at most once per call.
    func executeFailingOver<Result: Sendable>(
        _ spec: RequestSpec, channels: [String], groups: [String],
        decode: @escaping @Sendable (JSONValue) throws(DecodingFailure) -> Result
    ) async throws(TetherError) -> Result {
        try await executeWithHeadersFailingOver(spec, channels: channels, groups: groups, decode: decode).result
    }

    /// ``executeFailingOver(_:channels:groups:decode:)`` that also returns the header fields
    /// (the outbox's sends: a publish keeps its request id on every origin).
    func executeWithHeadersFailingOver<Result: Sendable>(
        _ spec: RequestSpec, channels: [String], groups: [String],
        decode: @escaping @Sendable (JSONValue) throws(DecodingFailure) -> Result
    ) async throws(TetherError) -> (result: Result, headers: [String: String]) {
        var hops = 0
        while true {
            do { return try await executeWithHeaders(spec, channels: channels, groups: groups, decode: decode) } catch {
                guard hops < configuration.fallbackOrigins.count, OriginSelector.qualifiesForFailover(error.status),
                      RetryConfiguration.maySendAgain(error.status, spec),
                      origins.failedOver(from: error.status.origin) else { throw error }
                hops += 1
                logger.debug("sending again to the next origin", metadata: ["operation": "\(spec.operation)", "origin": "\(origins.current)"])
            }
        }
    }

    /// Set for every task of the subscribe engine (``startEngineIfNeeded()``).
    @TaskLocal static var isEngineCall = false

    func execute<Result: Sendable>(
        _ spec: RequestSpec, channels: [String], groups: [String],
        decode: @escaping @Sendable (JSONValue) throws(DecodingFailure) -> Result
    ) async throws(TetherError) -> Result {
        try await executeWithHeaders(spec, channels: channels, groups: groups, decode: decode).result
    }

    /// ``execute(_:channels:groups:decode:)`` that also returns the response's header fields
    /// (the subscribe engine reads `X-Tether-Gap`).
    func executeWithHeaders<Result: Sendable>(
        _ spec: RequestSpec, channels: [String], groups: [String],
        decode: @escaping @Sendable (JSONValue) throws(DecodingFailure) -> Result
    ) async throws(TetherError) -> (result: Result, headers: [String: String]) {
        let operation = spec.operation
        // A status's retry holds the client weakly: statuses outlive requests in the app's hands.
        let retry = RetryAction { [weak self] () async throws -> any Sendable in
            guard let self else {
                throw TetherError(Status(category: .cancelled, operation: operation, serverMessage: "the client was released",
                                         affectedChannels: channels, affectedGroups: groups))
            }
            // With the token the app holds now: the documented answer to `accessDenied` is
            // `setToken(_:)`, then `retry()`.
            return try await self.execute(spec.withAuth(self.currentToken), channels: channels, groups: groups, decode: decode)
        }
        let origin = origins.next()
        func failure(_ category: StatusCategory, code: Int? = nil, error: (any Error)? = nil, details: ServerErrorDetails? = nil,
                     retryAfter: Duration? = nil) -> TetherError
        {
            var status = Status(category: category, operation: operation, statusCode: code ?? details?.statusCode, error: error,
                                serverMessage: details?.message, affectedChannels: channels, affectedGroups: groups,
                                deniedChannels: details?.deniedChannels ?? [], deniedGroups: details?.deniedGroups ?? [],
                                retry: retry)
            status.retryAfter = retryAfter
            status.origin = origin
            logger.debug("request failed", metadata: ["operation": "\(operation)", "category": "\(category)",
                                                      "status": "\(code ?? details?.statusCode ?? 0)"])
            return TetherError(status)
        }

        var signed = spec
        if let secret = configuration.secretKey, !secret.isEmpty {
            let text = RequestSigning.prepare(&signed, publishKey: configuration.publishKey ?? "",
                                              unixSeconds: Int64(Date().timeIntervalSince1970))
            signed.append("signature", Self.signature(of: text, secretKey: secret))
        }
        var headers = ["User-Agent": "Tether-Swift/0.1", "Accept": "application/json"]
        if signed.body != nil { headers["Content-Type"] = "application/json" }
        headers.merge(signed.headers) { _, extra in extra }
        let timeout = spec.timeout ?? (operation.isSubscribe ? configuration.subscribeTimeout : configuration.nonSubscribeTimeout)
        let request = TransportRequest(url: configuration.baseURL(of: origin) + signed.target, method: signed.method, headers: headers,
                                       body: signed.body, timeout: timeout, isLongPoll: operation.isSubscribe)
        logger.trace("request", metadata: ["operation": "\(operation)", "method": "\(signed.method.rawValue)", "path": "\(signed.path)"])

        let response: TransportResponse
        do {
            response = try await transport.send(request)
        } catch {
            let failed = failure(error.category, error: error)
            if error != .cancelled { origins.failed(at: origin, status: failed.status) }
            throw failed
        }
        let outcome: Swift.Result<(result: Result, headers: [String: String]), TetherError>
        switch ResponseClassifier.classify(statusCode: response.statusCode, body: response.body) {
        case .success(let json):
            do { outcome = .success((try decode(json), response.headers)) } catch {
                outcome = .failure(failure(.malformedResponse, code: response.statusCode, error: error,
                                           details: ServerErrorDetails(statusCode: response.statusCode, message: error.description)))
            }
        case .failure(let category, let details):
            outcome = .failure(failure(category, code: response.statusCode, details: details,
                                       retryAfter: Self.retryAfter(statusCode: response.statusCode, headers: response.headers)))
        }
        // The node answered: a fallback being tried is kept, unless the answer is a 5xx (then
        // the next request goes elsewhere). A node shutting down says so on every answer
        // (`Tether-Draining`): the next request goes to the next origin, with the same cursor.
        switch outcome {
        case .success: origins.answered(at: origin)
        case .failure(let error):
            if OriginSelector.qualifiesForFailover(error.status) {
                origins.failed(at: origin, status: error.status)
            } else {
                origins.answered(at: origin)
            }
        }
        if response.headers[Self.drainingHeader] != nil { origins.drained(at: origin) }
        return try outcome.get()
    }

    /// The header (lower-cased, as transports deliver them) a node sets on every answer once its
    /// graceful shutdown has started.
    static let drainingHeader = "tether-draining"

    /// The `Retry-After` of a 429 or 503, in delay-seconds form (the HTTP-date form is not used
    /// by realtime servers and is ignored); capped at one hour so a hostile value cannot park
    /// the client forever.
    static func retryAfter(statusCode: Int, headers: [String: String]) -> Duration? {
        guard statusCode == 429 || statusCode == 503 else { return nil }
        let value = headers["retry-after"] ?? headers.first { $0.key.lowercased() == "retry-after" }?.value
        guard let text = value?.trimmingCharacters(in: .whitespaces), let seconds = Int(text), seconds >= 0 else { return nil }
        return .seconds(min(seconds, 3600))
    }

    /// `v2.` + URL-safe base64 of HMAC-SHA256(secret key, text), padding stripped (pubnub-wire §12).
    static func signature(of text: String, secretKey: String) -> String {
        let mac = HMAC<SHA256>.authenticationCode(for: Array(text.utf8), using: SymmetricKey(data: Array(secretKey.utf8)))
        return RequestSigning.signatureValue(hmac: Array(mac))
    }
}

/// The auth key or token the client sends, shared by its REST calls and its WebSocket wire.
final class AuthTokenStore: Sendable {
    private let value: Mutex<String?>

    init(_ token: String?) { value = Mutex(token) }

    /// The token now.
    var current: String? { value.withLock { $0 } }

    /// Replaces it.
    func set(_ token: String?) { value.withLock { $0 = token } }
}
