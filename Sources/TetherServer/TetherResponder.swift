import HTTPTypes
public import Hummingbird
public import Logging
public import NIOCore
public import Prometheus
@_spi(Benchmarks) import TetherProtocol
import TetherServerCore

/// Everything a request handler needs, shared by all requests.
public struct ServerState: Sendable {
    /// Keysets and limits.
    public var keysets: KeysetRegistry
    /// The durable store.
    public var store: MessageStore
    /// Delivery and long-polls.
    public var hub: LongPollHub
    /// Presence.
    public var presence: PresenceService
    /// Access Manager.
    public var access: AccessManager
    /// File sharing (storage, settings, upload signatures).
    public var files: FileService
    /// Per-client request rate limits.
    var rateLimits: RateLimits
    /// Parsed filter expressions, so a subscriber's filter is parsed once, not every long-poll.
    var filters = FilterCache()
    /// Metrics.
    public var metrics: ServerMetrics
    /// Registry exposed at `/metrics`, if any.
    public var registry: PrometheusCollectorRegistry?
    /// How long a subscribe waits before answering empty.
    public var subscribeTimeout: TimeAmount
    /// Logger.
    public var logger: Logger
    /// When the server started (for `/health`).
    public var startedAt: ContinuousClock.Instant
    /// Mobile push: device registrations' bounds and the worker that sends (docs/push.md).
    package var push: PushDispatcher
    /// The live debug console, when an admin secret is configured (docs/console.md).
    var console: AdminConsole?
}

/// Routes every request of the PubNub-compatible REST wire. Paths are parsed here (not by a
/// router) because PubNub requires splitting the raw path before percent-decoding.
///
/// A thin dispatcher: it classifies the request into one ``Route``, applies the route's rate
/// limit, calls the route family's handler (one file per family under `Routes/`), and turns
/// what a handler throws into the PubNub error body of its family.
public final class TetherResponder: HTTPResponder, Sendable {
    /// The request context type.
    public typealias Context = TetherRequestContext

    let state: ServerState

    /// Creates a responder over shared server state.
    public init(state: ServerState) { self.state = state }

    /// Answers one request; never throws (every failure becomes a JSON error response).
    public func respond(to request: Request, context: TetherRequestContext) async throws -> Response {
        await answer(request, context: context)
    }

    /// ``respond(to:context:)``, on its caller's executor: the hot path's answers run on their
    /// connection's event loop, and every nonisolated async call on the way went through the
    /// runtime's executor switch, which lands back on that loop (the task's executor
    /// preference) but takes the task's status lock each time (docs/benchmarks.md, ninth pass).
    nonisolated(nonsending) func answer(_ request: Request, context: TetherRequestContext) async -> Response {
        var (endpoint, response) = await route(request, context: context)
        // Shutting down: every answer closes its connection, so a client that polls in a tight
        // loop over keep-alive (a long-poll answered at once from now on) cannot hold the
        // server's graceful shutdown open.
        // `Tether-Draining` tells an SDK with fallback origins to send its next request elsewhere.
        if state.hub.isShuttingDown {
            response.headers[.connection] = "close"
            response.headers[.tetherDraining] = "1"
        }
        // A long-poll parked without a task is answered by a later run, which counts it.
        if endpoint == Self.parkedEndpoint { return response }
        state.metrics.recordRequest(endpoint: endpoint, status: response.status.code)
        if response.status.code >= 500 {
            state.logger.error("request failed", metadata: ["endpoint": "\(endpoint)", "status": "\(response.status.code)"])
        } else {
            state.logger.trace("request", metadata: ["endpoint": "\(endpoint)", "status": "\(response.status.code)"])
        }
        return response
    }

    /// A route's handler: runs on its caller's executor, without the runtime's executor switch
    /// on every call (docs/benchmarks.md, ninth pass).
    private typealias Handler = nonisolated(nonsending) () async throws -> Response

    /// What ``dispatch(_:context:)`` decided: an answer already, or the handler to await.
    private enum Dispatch {
        case answered(String, Response)
        case handler(Route, Handler)
    }

    /// The request's endpoint label and response. The only async part of routing: everything
    /// else is in the synchronous ``dispatch(_:context:)`` and ``failure(_:route:)``, so this
    /// function's async frame — allocated for every request and held for a long-poll's whole
    /// wait — stays small (docs/benchmarks.md, "Where a request's CPU and memory go").
    private nonisolated(nonsending) func route(_ request: Request, context: TetherRequestContext) async -> (String, Response) {
        if request.uri.string.utf8.count <= state.keysets.largestURILimit, let console = state.console,
           let response = await self.console(console, request, context: context) {
            return ("console", response)
        }
        switch dispatch(request, context: context) {
        case .answered(let endpoint, let response):
            return (endpoint, response)
        case .handler(let route, let handler):
            do {
                return (route.rawValue, try await handler())
            } catch {
                return failure(error, route: route)
            }
        }
    }

    /// Classifies the request and picks its handler, or answers it (bad URI, unknown route,
    /// rate-limited, preflight).
    @inline(never)
    private func dispatch(_ request: Request, context: TetherRequestContext) -> Dispatch {
        let uriLength = request.uri.string.utf8.count
        if uriLength > state.keysets.largestURILimit {
            return .answered("uri", Reply.uriTooLong)
        }
        if request.method == .options {
            return .answered(Route.options.rawValue, Reply.json(.ok, "{}"))
        }
        let wire: WireRequest
        do {
            var parsed = try WireRequest(rawPath: request.uri.path, rawQuery: request.uri.query)
            parsed.uriLength = uriLength
            wire = parsed
        } catch {
            return .answered("invalid", Reply.error(.badRequest, service: "Balancer", "Could Not Parse Request"))
        }
        let s = wire.segments
        guard let route = Route.classify(request.method, s, wire) else {
            let family = s.count > 1 ? s[1] : nil
            if family == "message-actions", s.first == "v1" {
                // A message-actions path with a method it does not take (or a shape it does not
                // have): PubNub's actions error object.
                let known = s.count == 5 || (s.count == 7 && s[5] == "message") || (s.count == 9 && s[5] == "message" && s[7] == "action")
                return .answered("unknown", known ? Reply.actionsError(.methodNotAllowed, "Method Not Allowed")
                                         : Reply.actionsError(.notFound, "Not found: '\(request.uri.path)'"))
            }
            if family == "objects", s.first == "v2" {
                // An objects path with a method it does not take, or an unknown shape.
                let users = s.count > 3 && s[3] == "uuids", channels = s.count > 3 && s[3] == "channels"
                let known = ((s.count == 4 || s.count == 5) && (users || channels))
                    || (s.count == 6 && ((users && s[5] == "channels") || (channels && s[5] == "uuids")))
                return .answered("unknown", known ? Reply.objectsError(.methodNotAllowed, "Method Not Allowed")
                                         : Reply.objectsError(.notFound, "Requested resource not found."))
            }
            if family == "files", s.first == "v1" {
                // A files path with a method it does not take: the files error object.
                return .answered("unknown", Reply.filesError(Self.isFilesPath(s) ? .methodNotAllowed : .notFound, Self.isFilesPath(s) ? "Method Not Allowed" : "Not found: '\(request.uri.path)'"))
            }
            let service = family == "presence" ? "Presence" : family == "channel-registration" ? "channel-registry" : "Tether"
            return .answered("unknown", Reply.error(.notFound, service: service, "Not found: '\(request.uri.path)'"))
        }
        if let limited = rateLimit(route, wire, context: context) { return .answered("rate-limited", limited) }
        // Exhaustive: a new route is dispatched here and needs a row in AccessTableTests.
        // The switch only picks the handler; ``route(_:context:)`` awaits it. With an `await`
        // in every case, the routing function's async frame held a slot for each: ~10 KiB
        // allocated for every request and held for a long-poll's whole wait (docs/benchmarks.md).
        // The handlers are `@inline(never)`, so each closure stays a call and its frame small.
        let handler: () async throws -> Response
        switch route {
        case .options: handler = { Reply.json(.ok, "{}") }
        case .time: handler = { self.time() }
        case .publish: handler = { try await self.publish(request, wire, kind: .message) }
        case .signal: handler = { try await self.publish(request, wire, kind: .signal) }
        case .subscribe: handler = { try await self.subscribe(wire, context: context) }
        case .history: handler = { try await self.historyV2(wire) }
        case .fetch: handler = { try await self.fetchV3(wire, withActions: false) }
        case .historyWithActions: handler = { try await self.fetchV3(wire, withActions: true) }
        case .deleteMessages: handler = { try await self.deleteMessages(wire) }
        case .messageCounts: handler = { try await self.messageCounts(wire) }
        case .hereNowGlobal, .hereNow, .whereNow, .heartbeat, .leave, .getState, .setState:
            handler = { try await self.presence(route, wire) }
        case .groupList, .groupChannels, .groupUpdate, .groupDelete:
            handler = { try await self.channelGroups(route, wire) }
        case .grant: handler = { try await self.grantV2(wire, audit: false) }
        case .audit: handler = { try await self.grantV2(wire, audit: true) }
        case .grantToken: handler = { try await self.grantToken(request, wire) }
        case .revokeToken: handler = { try await self.revokeToken(wire) }
        case .addMessageAction: handler = { try await self.addMessageAction(request, wire) }
        case .removeMessageAction: handler = { try await self.removeMessageAction(wire) }
        case .getMessageActions: handler = { try await self.getMessageActions(wire) }
        case .getUserMetadata, .getChannelMetadata: handler = { try await self.getAppContextObject(wire) }
        case .setUserMetadata, .setChannelMetadata: handler = { try await self.setAppContextObject(request, wire) }
        case .removeUserMetadata, .removeChannelMetadata: handler = { try await self.removeAppContextObject(wire) }
        case .getAllUserMetadata, .getAllChannelMetadata: handler = { try await self.getAllAppContextObjects(wire) }
        case .getMemberships, .getChannelMembers: handler = { try await self.getAppContextMemberships(wire) }
        case .manageMemberships, .manageChannelMembers: handler = { try await self.manageAppContextMemberships(request, wire) }
        case .pushModify: handler = { try await self.modifyPushChannels(wire) }
        case .pushList: handler = { try await self.listPushChannels(wire) }
        case .pushRemoveDevice: handler = { try await self.removePushDevice(wire) }
        case .generateFileUploadURL: handler = { try await self.generateUploadURL(request, wire) }
        case .uploadFile: handler = { try await self.uploadFile(request, wire) }
        case .publishFileMessage: handler = { try await self.publishFileMessage(request, wire) }
        case .listFiles: handler = { try await self.listFiles(wire) }
        case .getFile: handler = { try await self.getFile(request, wire) }
        case .downloadFile: handler = { try await self.downloadFile(wire) }
        case .deleteFile: handler = { try await self.deleteFile(wire) }
        case .health: handler = { await self.health() }
        case .metrics: handler = { self.metrics() }
        }
        return .handler(route, handler)
    }

    /// What ``route(_:context:)`` answers for a long-poll that parked (never written).
    static let parkedEndpoint = "parked"

    /// The answer to what a handler threw.
    @inline(never)
    private func failure(_ error: any Error, route: Route) -> (String, Response) {
        do {
            throw error
        } catch is LongPollParked {
            return (Self.parkedEndpoint, Response(status: .ok))
        } catch let refusal as Refusal {
            return (route.rawValue, refusal.response)
        } catch let error as RequestError {
            return ("invalid", error.response)
        } catch let error as ParameterError {
            return ("invalid", Self.invalidParameter(error, route: route, now: state.hub.currentCursor))
        } catch let error as AccessDeniedError {
            if case .denied(let channels, let groups, let message) = error.check.decision {
                return ("subscribe", Self.forbidden(channels: channels, groups: groups, message: message))
            }
            return ("subscribe", Self.forbidden(channels: [], groups: [], message: "Forbidden"))
        } catch let error where StoreError.storageFailure(error) != nil {
            // Store writes outside publish (groups, grants, deletes): a status that says what
            // happened, in the service error body.
            let storeError = StoreError.storageFailure(error) ?? StoreError.classify(error)
            state.logger.error("store failure", metadata: ["error": "\(storeError)", "code": "\(storeError.code)"])
            let (status, text, retryAfter) = Self.storeFailure(storeError)
            return ("store-failed", Reply.json(status, ErrorBody.service(status: status.code, service: "Tether", message: text),
                                               extraHeaders: Self.retryAfterHeader(retryAfter)))
        } catch is CancellationError {
            // The client went away (an abandoned long-poll): nothing is written. 499 as nginx names it.
            return ("client-closed", Reply.error(.init(code: 499, reasonPhrase: "Client Closed Request"), service: "Tether", "Client closed request"))
        } catch {
            state.logger.error("internal error", metadata: ["error": "\(error)"])
            return ("error", Reply.error(.internalServerError, service: "Tether", "Internal Server Error"))
        }
    }

    /// How a failed store write is answered (docs/operations.md, "Storage and durability"):
    /// status, the text of PubNub's error body, and `Retry-After` seconds when retrying is safe.
    static func storeFailure(_ error: StoreError) -> (HTTPResponse.Status, String, Int?) {
        switch error.code {
        case .full:
            return (.init(code: 507, reasonPhrase: "Insufficient Storage"), "Insufficient Storage: the message store is full", 30)
        case .queueFull:
            return (.serviceUnavailable, "Service Unavailable: the store's write queue is full", 1)
        case .busy:
            return (.serviceUnavailable, "Service Unavailable: the store is busy", 1)
        case .timedOut:
            return (.serviceUnavailable, "Service Unavailable: the store write timed out; the message was not stored", 1)
        case .outcomeUnknown:
            return (.gatewayTimeout, "Gateway Timeout: the store write timed out while committing; the message may be stored, and if it is, subscribers receive it", nil)
        case .readonly:
            return (.serviceUnavailable, "Service Unavailable: the message store is read-only", 30)
        case .unavailable:
            return (.serviceUnavailable, "Service Unavailable: the shared database cannot be reached; the message was not stored", 1)
        default:
            return (.internalServerError, "Internal Server Error: the store write failed", nil)
        }
    }

    /// `Retry-After: <seconds>`, or no header.
    static func retryAfterHeader(_ seconds: Int?) -> HTTPFields {
        guard let seconds else { return [:] }
        return [.retryAfter: String(seconds)]
    }

    /// The 400 for a malformed or out-of-range parameter, in the body of the route's family
    /// (pubnub-wire §3): the publish array, the v3 history object, or the service object.
    static func invalidParameter(_ error: ParameterError, route: Route, now: Timetoken) -> Response {
        let message = error.description
        switch route {
        case .publish, .signal, .publishFileMessage:
            return Reply.publishError(.badRequest, message, timetoken: now)
        case .fetch, .historyWithActions, .deleteMessages, .messageCounts:
            return Reply.historyError(.badRequest, message)
        case .addMessageAction, .removeMessageAction, .getMessageActions:
            return Reply.actionsError(.badRequest, message)
        case _ where route.service == "objects":
            return Reply.objectsInvalid(message, location: error.name, locationType: "query")
        case .pushModify, .pushList, .pushRemoveDevice:
            return Reply.pushError(.badRequest, message)
        case .generateFileUploadURL, .listFiles, .getFile, .deleteFile:
            return Reply.filesError(.badRequest, message)
        default:
            return Reply.error(.badRequest, service: route.service, message)
        }
    }

    // MARK: - Rate limits

    /// 429 with `Retry-After` when the client is over its keyset's rate (long-polls that follow
    /// their cursor, time, health and metrics are never limited).
    private func rateLimit(_ route: Route, _ wire: WireRequest, context: TetherRequestContext) -> Response? {
        guard state.rateLimits.enabled, let (kind, index) = route.rateLimit else { return nil }
        // A long-poll that follows its cursor is never limited (one request per answer); a
        // handshake (no `tt`, or 0) is, since each one can join its uuid to 200 channels.
        if route == .subscribe, !(wire.query["tt"] ?? "0").allSatisfy({ $0 == "0" }) { return nil }
        let s = wire.segments
        guard s.count > index, let keyset = state.keysets.keyset(subscribeKey: s[index]) else { return nil }
        let uuid = wire.query["uuid"].flatMap { $0.isEmpty ? nil : $0 }
        guard let wait = state.rateLimits.take(kind, uuid: uuid, address: context.channel.remoteAddress?.ipAddress ?? "unknown",
                                               subscribeKey: keyset.subscribeKey,
                                               limits: state.keysets.limits(for: keyset)) else { return nil }
        state.console?.rateLimited(uuid: uuid, route: route.rawValue)
        return Reply.json(.tooManyRequests, ErrorBody.service(status: 429, service: "Balancer", message: "Too Many Requests"),
                          extraHeaders: [.retryAfter: String(Self.retryAfterSeconds(wait))])
    }

    /// `Retry-After` for a wait in seconds: whole seconds, 1…86,400. A configured rate as small
    /// as 1e-300 per second is valid and makes the wait astronomically long (or infinite), which
    /// must saturate rather than trap converting to `Int`.
    static func retryAfterSeconds(_ wait: Double) -> Int {
        guard wait.isFinite else { return 86_400 }
        return Int(min(max(wait.rounded(.up), 1), 86_400))
    }
}
