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
public final class TetherClient: Sendable {
    /// The configuration the client was created with.
    public let configuration: TetherConfiguration
    /// The transport requests go through.
    public let transport: any Transport
    private let token: Mutex<String?>
    private let logger: Logger
    let engine: SubscribeEngine
    let engineTask = Mutex<EngineTaskState>(.idle)
    let desired = Mutex<DesiredSubscription>(DesiredSubscription())
    let outboxDriver: OutboxDriver
    let outboxListeners = OutboxListeners()
    let outboxTask = Mutex<EngineTaskState>(.idle)
    private let networkMonitor: (any NetworkMonitor)?

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

    /// Creates a client on a custom transport (tests, other platforms). Does no I/O.
    public convenience init(configuration: TetherConfiguration, transport: any Transport) {
        self.init(configuration: configuration, transport: transport, clock: ContinuousClock(), networkMonitor: nil)
    }

    /// Creates a client with an injected clock for the subscribe engine's timers (tests pass a
    /// `TestClock`) and an optional ``NetworkMonitor`` (``RTNetlinkNetworkMonitor`` on Linux,
    /// ``PathNetworkMonitor`` on Apple platforms). Does no I/O.
    public init<C: Clock>(configuration: TetherConfiguration, transport: any Transport, clock: C,
                          networkMonitor: (any NetworkMonitor)?) where C.Duration == Duration {
        self.configuration = configuration
        self.transport = transport
        self.token = Mutex(configuration.authKey)
        self.logger = configuration.logger
        let elapsed = ElapsedClock(clock)
        self.engine = SubscribeEngine(configuration: configuration.subscribeMachineConfiguration, clock: elapsed,
                                      monitor: networkMonitor, logger: configuration.logger)
        self.networkMonitor = networkMonitor
        self.outboxDriver = OutboxDriver(configuration: configuration.outbox, clock: elapsed, listeners: outboxListeners,
                                         logger: configuration.logger)
    }

    /// The outbox every publish and signal goes through: list, resend or cancel its messages,
    /// follow their states, or hand it a message without awaiting the send (see ``Outbox``).
    public var outbox: Outbox { Outbox(client: self) }

    /// Starts the outbox's loop (sends, retry timers, network reports) on its first use.
    func startOutboxIfNeeded() {
        outboxTask.withLock { state in
            guard case .idle = state else { return }
            let driver = outboxDriver
            let monitor = networkMonitor
            state = .running(Task { [self] in await driver.run(client: self, monitor: monitor) })
        }
    }

    /// Closes every connection and stops the transport, the subscribe engine and the outbox;
    /// subscription, status and outbox streams finish. Callers awaiting a publish get
    /// ``StatusCategory/cancelled``; with a durable outbox, messages not yet sent stay in its
    /// journal for the next launch. Calls made afterwards fail with ``StatusCategory/cancelled``.
    public func shutdown() async {
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
        engine.listeners.finishAll()
        await transport.shutdown()
    }

    // MARK: - Access Manager token

    /// Replaces the auth key / Access Manager token sent with every later request (`nil` removes it).
    public func setToken(_ token: String?) {
        self.token.withLock { $0 = token }
    }

    /// The auth key or token currently sent with requests.
    public var currentToken: String? { token.withLock { $0 } }

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
        return try await execute(spec, channels: channels, groups: groups, decode: decode)
    }

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
        let retry = RetryAction { [self] in try await self.execute(spec, channels: channels, groups: groups, decode: decode) }
        func failure(_ category: StatusCategory, code: Int? = nil, error: (any Error)? = nil, details: ServerErrorDetails? = nil,
                     retryAfter: Duration? = nil) -> TetherError
        {
            var status = Status(category: category, operation: operation, statusCode: code ?? details?.statusCode, error: error,
                                serverMessage: details?.message, affectedChannels: channels, affectedGroups: groups,
                                deniedChannels: details?.deniedChannels ?? [], deniedGroups: details?.deniedGroups ?? [],
                                retry: retry)
            status.retryAfter = retryAfter
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
        let timeout = spec.timeout ?? (operation.isSubscribe ? configuration.subscribeTimeout : configuration.nonSubscribeTimeout)
        let request = TransportRequest(url: configuration.baseURL + signed.target, method: signed.method, headers: headers,
                                       body: signed.body, timeout: timeout, isLongPoll: operation.isSubscribe)
        logger.trace("request", metadata: ["operation": "\(operation)", "method": "\(signed.method.rawValue)", "path": "\(signed.path)"])

        let response: TransportResponse
        do {
            response = try await transport.send(request)
        } catch {
            throw failure(error.category, error: error)
        }
        switch ResponseClassifier.classify(statusCode: response.statusCode, body: response.body) {
        case .success(let json):
            do { return (try decode(json), response.headers) } catch {
                throw failure(.malformedResponse, code: response.statusCode, error: error,
                              details: ServerErrorDetails(statusCode: response.statusCode, message: error.description))
            }
        case .failure(let category, let details):
            throw failure(category, code: response.statusCode, details: details,
                          retryAfter: Self.retryAfter(statusCode: response.statusCode, headers: response.headers))
        }
    }

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
