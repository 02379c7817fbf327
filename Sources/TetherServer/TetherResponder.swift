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
public struct TetherResponder: HTTPResponder {
    /// The request context type.
    public typealias Context = TetherRequestContext

    let state: ServerState

    /// Creates a responder over shared server state.
    public init(state: ServerState) { self.state = state }

    /// Answers one request; never throws (every failure becomes a JSON error response).
    public func respond(to request: Request, context: TetherRequestContext) async throws -> Response {
        var (endpoint, response) = await route(request, context: context)
        // Shutting down: every answer closes its connection, so a client that polls in a tight
        // loop over keep-alive (a long-poll answered at once from now on) cannot hold the
        // server's graceful shutdown open.
        // `Tether-Draining` tells an SDK with fallback origins to send its next request elsewhere.
        if state.hub.isShuttingDown {
            response.headers[.connection] = "close"
            response.headers[.tetherDraining] = "1"
        }
        state.metrics.recordRequest(endpoint: endpoint, status: response.status.code)
        if response.status.code >= 500 {
            state.logger.error("request failed", metadata: ["endpoint": "\(endpoint)", "status": "\(response.status.code)"])
        } else {
            state.logger.trace("request", metadata: ["endpoint": "\(endpoint)", "status": "\(response.status.code)"])
        }
        return response
    }

    private func route(_ request: Request, context: TetherRequestContext) async -> (String, Response) {
        let uriLength = request.uri.string.utf8.count
        if uriLength > state.keysets.largestURILimit {
            return ("uri", Reply.uriTooLong)
        }
        if let console = state.console, let response = await self.console(console, request, context: context) {
            return ("console", response)
        }
        if request.method == .options {
            return (Route.options.rawValue, Reply.json(.ok, "{}"))
        }
        var wire: WireRequest
        do {
            wire = try WireRequest(rawPath: request.uri.path, rawQuery: request.uri.query)
            wire.uriLength = uriLength
        } catch {
            return ("invalid", Reply.error(.badRequest, service: "Balancer", "Could Not Parse Request"))
        }
        let s = wire.segments
        guard let route = Route.classify(request.method, s, wire) else {
            let family = s.count > 1 ? s[1] : nil
            if family == "message-actions", s.first == "v1" {
                // A message-actions path with a method it does not take (or a shape it does not
                // have): PubNub's actions error object.
                let known = s.count == 5 || (s.count == 7 && s[5] == "message") || (s.count == 9 && s[5] == "message" && s[7] == "action")
                return ("unknown", known ? Reply.actionsError(.methodNotAllowed, "Method Not Allowed")
                                         : Reply.actionsError(.notFound, "Not found: '\(request.uri.path)'"))
            }
            if family == "objects", s.first == "v2" {
                // An objects path with a method it does not take, or an unknown shape.
                let users = s.count > 3 && s[3] == "uuids", channels = s.count > 3 && s[3] == "channels"
                let known = ((s.count == 4 || s.count == 5) && (users || channels))
                    || (s.count == 6 && ((users && s[5] == "channels") || (channels && s[5] == "uuids")))
                return ("unknown", known ? Reply.objectsError(.methodNotAllowed, "Method Not Allowed")
                                         : Reply.objectsError(.notFound, "Requested resource not found."))
            }
            if family == "files", s.first == "v1" {
                // A files path with a method it does not take: the files error object.
                return ("unknown", Reply.filesError(Self.isFilesPath(s) ? .methodNotAllowed : .notFound, Self.isFilesPath(s) ? "Method Not Allowed" : "Not found: '\(request.uri.path)'"))
            }
            let service = family == "presence" ? "Presence" : family == "channel-registration" ? "channel-registry" : "Tether"
            return ("unknown", Reply.error(.notFound, service: service, "Not found: '\(request.uri.path)'"))
        }
        if let limited = rateLimit(route, wire, context: context) { return ("rate-limited", limited) }
        do {
            let response: Response
            // Exhaustive: a new route is dispatched here and needs a row in AccessTableTests.
            switch route {
            case .options: response = Reply.json(.ok, "{}")
            case .time: response = time()
            case .publish: response = try await publish(request, wire, kind: .message)
            case .signal: response = try await publish(request, wire, kind: .signal)
            case .subscribe: response = try await subscribe(wire, context: context)
            case .history: response = try await historyV2(wire)
            case .fetch: response = try await fetchV3(wire, withActions: false)
            case .historyWithActions: response = try await fetchV3(wire, withActions: true)
            case .deleteMessages: response = try await deleteMessages(wire)
            case .messageCounts: response = try await messageCounts(wire)
            case .hereNowGlobal, .hereNow, .whereNow, .heartbeat, .leave, .getState, .setState:
                response = try await presence(route, wire)
            case .groupList, .groupChannels, .groupUpdate, .groupDelete:
                response = try await channelGroups(route, wire)
            case .grant: response = try await grantV2(wire, audit: false)
            case .audit: response = try await grantV2(wire, audit: true)
            case .grantToken: response = try await grantToken(request, wire)
            case .revokeToken: response = try await revokeToken(wire)
            case .addMessageAction: response = try await addMessageAction(request, wire)
            case .removeMessageAction: response = try await removeMessageAction(wire)
            case .getMessageActions: response = try await getMessageActions(wire)
            case .getUserMetadata, .getChannelMetadata: response = try await getAppContextObject(wire)
            case .setUserMetadata, .setChannelMetadata: response = try await setAppContextObject(request, wire)
            case .removeUserMetadata, .removeChannelMetadata: response = try await removeAppContextObject(wire)
            case .getAllUserMetadata, .getAllChannelMetadata: response = try await getAllAppContextObjects(wire)
            case .getMemberships, .getChannelMembers: response = try await getAppContextMemberships(wire)
            case .manageMemberships, .manageChannelMembers: response = try await manageAppContextMemberships(request, wire)
            case .pushModify: response = try await modifyPushChannels(wire)
            case .pushList: response = try await listPushChannels(wire)
            case .pushRemoveDevice: response = try await removePushDevice(wire)
            case .generateFileUploadURL: response = try await generateUploadURL(request, wire)
            case .uploadFile: response = try await uploadFile(request, wire)
            case .publishFileMessage: response = try await publishFileMessage(request, wire)
            case .listFiles: response = try await listFiles(wire)
            case .getFile: response = try await getFile(request, wire)
            case .downloadFile: response = try await downloadFile(wire)
            case .deleteFile: response = try await deleteFile(wire)
            case .health: response = await health()
            case .metrics: response = metrics()
            }
            return (route.rawValue, response)
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
        guard let (kind, index) = route.rateLimit else { return nil }
        // A long-poll that follows its cursor is never limited (one request per answer); a
        // handshake (no `tt`, or 0) is, since each one can join its uuid to 200 channels.
        if route == .subscribe, !(wire.query["tt"] ?? "0").allSatisfy({ $0 == "0" }) { return nil }
        let s = wire.segments
        guard s.count > index, let keyset = state.keysets.keyset(subscribeKey: s[index]) else { return nil }
        let uuid = wire.query["uuid"].flatMap { $0.isEmpty ? nil : $0 }
        let address = context.channel.remoteAddress?.ipAddress ?? "unknown"
        guard let wait = state.rateLimits.take(kind, uuid: uuid, address: address, subscribeKey: keyset.subscribeKey,
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
