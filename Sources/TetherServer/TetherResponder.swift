import Foundation
import HTTPTypes
import Synchronization
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
}

/// Routes every request of the PubNub-compatible REST wire. Paths are parsed here (not by a
/// router) because PubNub requires splitting the raw path before percent-decoding.
public struct TetherResponder: HTTPResponder {
    /// The request context type.
    public typealias Context = TetherRequestContext

    let state: ServerState

    /// Creates a responder over shared server state.
    public init(state: ServerState) { self.state = state }

    /// Answers one request; never throws (every failure becomes a JSON error response).
    public func respond(to request: Request, context: TetherRequestContext) async throws -> Response {
        let (endpoint, response) = await route(request, context: context)
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
            return ("uri", Reply.json(.uriTooLong, ErrorBody.service(status: 414, service: "Balancer", message: "Request URI Too Long")))
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
            let service = family == "presence" ? "Presence" : family == "channel-registration" ? "channel-registry" : "Tether"
            return ("unknown", Reply.error(.notFound, service: service, "Not found: '\(request.uri.path)'"))
        }
        if let limited = rateLimit(route, wire, context: context) { return ("rate-limited", limited) }
        do {
            let response: Response
            // Exhaustive: a new route is dispatched here and needs a row in AccessTableTests.
            switch route {
            case .options: response = Reply.json(.ok, "{}")
            case .time: response = Reply.json(.ok, "[\(state.hub.currentCursor.rawValue)]")
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
            case .health: response = await health()
            case .metrics: response = metrics()
            }
            return (route.rawValue, response)
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
        case .publish, .signal:
            return Reply.publishError(.badRequest, message, timetoken: now)
        case .fetch, .historyWithActions, .deleteMessages, .messageCounts:
            return Reply.historyError(.badRequest, message)
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

    // MARK: - Keys and names

    /// A client error that already knows its response.
    struct RequestError: Error {
        var response: Response
    }

    /// The keyset's per-request bounds on channels and groups (docs/operations.md, "Bounds"):
    /// too many names in total answer PubNub's 414, too many groups a 400 naming the limit.
    func checkCounts(channels: [String], groups: [String], limits: Limits, service: String) throws(RequestError) {
        if channels.count + groups.count > limits.maxChannelsPerSubscribe {
            throw RequestError(response: Self.uriTooLong)
        }
        if groups.count > limits.maxGroupsPerRequest {
            throw RequestError(response: Reply.error(.badRequest, service: service,
                                                     "Too many channel groups: at most \(limits.maxGroupsPerRequest) per request"))
        }
    }

    func keyset(subscribeKey: String, service: String, uriLength: Int = 0) throws(RequestError) -> Keyset {
        guard NameRules.validateKey(subscribeKey), let keyset = state.keysets.keyset(subscribeKey: subscribeKey) else {
            throw RequestError(response: Reply.json(.badRequest, ErrorBody.service(status: 400, service: service, message: "Invalid Subscribe Key")))
        }
        if uriLength > state.keysets.limits(for: keyset).maxURIBytes {
            throw RequestError(response: Self.uriTooLong)
        }
        return keyset
    }

    static let uriTooLong = Reply.json(.uriTooLong, ErrorBody.service(status: 414, service: "Balancer", message: "Request URI Too Long"))

    private func validateUserId(_ wire: WireRequest, service: String) throws(RequestError) {
        if let uuid = wire.query["uuid"] {
            do { try NameRules.validateUserId(uuid) } catch {
                throw RequestError(response: Reply.error(.badRequest, service: service, "Invalid uuid: \(error)"))
            }
        }
    }


    // MARK: - Publish and signal (pubnub-wire §5)

    private func publish(_ request: Request, _ wire: WireRequest, kind: EventKind) async throws -> Response {
        let s = wire.segments
        let now = state.hub.currentCursor
        guard NameRules.validateKey(s[1]), NameRules.validateKey(s[2]), let keyset = state.keysets.keyset(subscribeKey: s[2]),
              keyset.publishKey == s[1]
        else { return Reply.publishError(.badRequest, "Invalid Key", timetoken: now) }
        let limits = state.keysets.limits(for: keyset)
        if wire.uriLength > limits.maxURIBytes { return Self.uriTooLong }
        let channel = s[4]
        do { try NameRules.validateChannel(channel) } catch {
            return Reply.publishError(.badRequest, "Invalid Channel: \(error)", timetoken: now)
        }
        if NameRules.isPresence(channel) {
            return Reply.publishError(.badRequest, "Invalid Channel: presence channels are written by the server", timetoken: now)
        }
        if let uuid = wire.query["uuid"] {
            do { try NameRules.validateUserId(uuid) } catch {
                return Reply.publishError(.badRequest, "Invalid uuid: \(error)", timetoken: now)
            }
        }

        // The message: GET carries it in the path, POST in the (possibly compressed) body.
        var messageBytes: [UInt8]
        if request.method == .post {
            let maxBody = limits.maxMessageBytes * 4 + 1024
            guard let body = try? await request.body.collect(upTo: maxBody) else {
                return Reply.publishError(.contentTooLarge, "Message Too Large", timetoken: now)
            }
            messageBytes = Array(buffer: body)
            try authorize(keyset, wire, method: "POST", channels: [channel], groups: [], permission: .write, body: messageBytes)
            if let encoding = request.headers[.contentEncoding]?.lowercased(), encoding.contains("gzip") || encoding.contains("deflate") {
                do {
                    messageBytes = try Decompression.inflate(messageBytes, limit: limits.maxMessageBytes + 1)
                } catch .tooLarge {
                    return Reply.publishError(.contentTooLarge, "Message Too Large", timetoken: now)
                } catch {
                    return Reply.publishError(.badRequest, "Invalid compressed body", timetoken: now)
                }
            }
        } else {
            messageBytes = Array(s[6].utf8)
            try authorize(keyset, wire, channels: [channel], groups: [], permission: .write)
        }
        guard String(validating: messageBytes, as: UTF8.self) != nil, (try? JSONText.validate(messageBytes)) != nil else {
            return Reply.publishError(.badRequest, "Invalid JSON", timetoken: now)
        }
        let payload = String(decoding: messageBytes, as: UTF8.self)
        switch kind {
        case .signal:
            if messageBytes.count > limits.maxSignalBytes {
                return Reply.publishError(.badRequest, "Signal size too large", timetoken: now)
            }
        default:
            if messageBytes.count + channel.utf8.count > limits.maxMessageBytes {
                return Reply.publishError(.contentTooLarge, "Message Too Large", timetoken: now)
            }
        }

        var meta: String?
        if let text = wire.query["meta"], !text.isEmpty {
            guard (try? JSONText.validate(text)) == .object else {
                return Reply.publishError(.badRequest, "Invalid meta: must be a JSON object", timetoken: now)
            }
            meta = text
        }
        var customType: String?
        if let cmt = wire.query["custom_message_type"], !cmt.isEmpty {
            let allowed = cmt.utf8.allSatisfy { b in
                (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A) || b == 0x2D || b == 0x5F
            }
            guard allowed, (3...50).contains(cmt.utf8.count) else {
                return Reply.publishError(.badRequest, "Invalid custom_message_type: 3-50 characters of A-Z a-z 0-9 _ -", timetoken: now)
            }
            customType = cmt
        }
        let sequence = try wire.integer("seqn", in: ParameterBounds.sequence)
        let ttlHours = try wire.decimal("ttl", in: ParameterBounds.publishTTLHours)
        let storeFlag = wire.query["store"] ?? "1"
        guard storeFlag == "0" || storeFlag == "1" || storeFlag == "true" || storeFlag == "false" else {
            return Reply.publishError(.badRequest, "Invalid store: expected 0 or 1", timetoken: now)
        }
        let store = kind == .message && (storeFlag == "1" || storeFlag == "true")
        let publisher = wire.query["uuid"]

        // Fire (store=0&norep=1, pubnub-wire §5.3): for server-side handlers only — reaches no
        // subscriber and no history. Tether has no server-side handlers yet, so it is
        // acknowledged with a fresh timetoken and goes nowhere.
        if kind == .message, !store, wire.query["norep"] == "1" {
            state.metrics.recordPublish(kind: "fire")
            return Reply.json(.ok, "[1,\"Sent\",\"\(state.hub.currentCursor.successor.rawValue)\"]")
        }

        let retentionHours = ttlHours.flatMap { $0 > 0 ? $0 : nil } ?? keyset.historyRetentionHours
        let subscribeKey = keyset.subscribeKey
        let timetoken: Timetoken
        do {
            timetoken = try await state.hub.publish({ tt in
                SubscribeEnvelope(timetoken: tt, subscribeKey: subscribeKey, channel: channel, payload: payload, publisher: publisher,
                                  meta: meta, kind: kind, customMessageType: customType, sequence: sequence)
            }, store: store ? { tt in
                StoredMessage(subscribeKey: subscribeKey, channel: channel, timetoken: tt, kind: .message, publisher: publisher,
                              payload: payload, meta: meta, customMessageType: customType, sequence: sequence,
                              expiresAt: retentionHours > 0 ? tt.adding(seconds: retentionHours * 3600) : nil)
            } : nil)
        } catch let error as StoreError {
            // The reservation was abandoned: nothing was delivered, and (unless the outcome is
            // unknown) nothing stored.
            state.metrics.recordPublish(kind: "store-failed")
            let (status, text, retryAfter) = Self.storeFailure(error)
            return Reply.json(status, ErrorBody.publish(text, timetoken: state.hub.currentCursor),
                              extraHeaders: Self.retryAfterHeader(retryAfter))
        }
        state.metrics.recordPublish(kind: kind == .signal ? "signal" : "message")
        return Reply.json(.ok, "[1,\"Sent\",\"\(timetoken.rawValue)\"]")
    }

    // MARK: - Subscribe (pubnub-wire §6)

    private func subscribe(_ wire: WireRequest, context: TetherRequestContext) async throws -> Response {
        let s = wire.segments
        let keyset = try keyset(subscribeKey: s[2], service: "Subscribe", uriLength: wire.uriLength)
        let limits = state.keysets.limits(for: keyset)
        try validateUserId(wire, service: "Subscribe")
        let names = wire.pathNames(3)
        let groups = wire.queryNames("channel-group")
        try checkCounts(channels: names, groups: groups, limits: limits, service: "Subscribe")
        if names.isEmpty && groups.isEmpty {
            return Reply.error(.badRequest, service: "Subscribe", "No channels or channel groups given")
        }
        for name in names {
            do { try NameRules.validateSubscribeChannel(name) } catch {
                return Reply.error(.badRequest, service: "Subscribe", "Invalid channel \(String(reflecting: name)): \(error)")
            }
        }
        for group in groups {
            do { try NameRules.validateGroup(group) } catch {
                return Reply.error(.badRequest, service: "Subscribe", "Invalid channel group \(String(reflecting: group)): \(error)")
            }
        }
        var filter: FilterExpression?
        if let text = wire.query["filter-expr"], !text.isEmpty {
            do {
                filter = try state.filters.expression(text)
            } catch {
                return Reply.json(Reply.malformedFilterExpression, ErrorBody.service(
                    status: 481, service: "Subscribe", message: "Invalid filter expression: \(error.reason) at position \(error.position)"))
            }
        }
        let check = try authorize(keyset, wire, channels: names, groups: groups, permission: .read)
        let requested = try wire.timetoken("tt") ?? .zero
        _ = try wire.integer("tr", in: ParameterBounds.region)
        // A subscribe is a heartbeat for its uuid on every channel and group in it (§6.4.8).
        let heartbeat = try heartbeatSeconds(wire, service: "Subscribe")
        let states = try channelStates(wire, service: "Subscribe", channels: names)
        let uuid = wire.query["uuid"].flatMap { $0.isEmpty ? nil : $0 }
        if let uuid {
            await state.presence.heartbeat(subscribeKey: keyset.subscribeKey, uuid: uuid, channels: names, groups: groups,
                                     timeoutSeconds: heartbeat, states: states)
        }
        if requested == .zero {
            // Handshake: the current cursor, never backlog (pubnub-wire §6.4.1).
            return Reply.json(.ok, SubscribeResponseBody.encode(cursor: state.hub.currentCursor, region: 1, envelopes: []))
        }
        let spec = SubscriptionSpec(subscribeKey: keyset.subscribeKey, names: names, groups: groups)
        // A cursor from the future is treated as current rather than waited for.
        let after = min(requested, state.hub.currentCursor)
        let access = state.access
        let accessRequest = AccessRequest(channels: names, groups: groups, permission: .read, uuid: wire.query["uuid"])
        let auth = wire.query["auth"]
        let signature = keyset.secretKey == nil ? AccessManager.SignatureVerdict.absent
            : access.verifySignature(keyset: keyset, method: "GET", rawPath: wire.rawPath, rawQuery: wire.rawQuery, body: [])
        var recheck: (@Sendable () -> AccessManager.Check)?
        if keyset.secretKey != nil {
            recheck = { access.check(accessRequest, keyset: keyset, auth: auth, signature: signature) }
        }
        let page = try await state.hub.receive(
            spec, after: after, limit: limits.maxEnvelopesPerResponse, timeout: state.subscribeTimeout, channel: context.channel,
            access: check, recheck: recheck, filter: filter)
        if let uuid {
            // The connection was alive for the whole long-poll: its end extends the uuid's
            // presence where it still is — but never re-joins one that left meanwhile.
            await state.presence.refresh(subscribeKey: keyset.subscribeKey, uuid: uuid, channels: names, groups: groups,
                                   timeoutSeconds: heartbeat)
        }
        var headers: HTTPFields = [:]
        if !page.gaps.isEmpty {
            let value = page.gaps.map { "\(PercentCoding.encode($0.channel));from=\($0.from.rawValue);through=\($0.through.rawValue)" }
                .joined(separator: ", ")
            headers[.tetherGap] = value
        }
        return Reply.json(.ok, SubscribeResponseBody.encode(cursor: page.cursor, region: 1, envelopes: page.envelopes), extraHeaders: headers)
    }

    // MARK: - History (pubnub-wire §9)

    private func historyChannels(_ channels: [String], service: (Int, String) -> Response) throws(RequestError) -> [String] {
        if channels.isEmpty { throw RequestError(response: service(400, "No channels given")) }
        for channel in channels {
            do { try NameRules.validateChannel(channel) } catch {
                throw RequestError(response: service(400, "Invalid channel \(String(reflecting: channel)): \(error)"))
            }
        }
        return channels
    }

    private func historyV2(_ wire: WireRequest) async throws -> Response {
        let s = wire.segments
        let keyset = try keyset(subscribeKey: s[3], service: "Storage", uriLength: wire.uriLength)
        let channels = try historyChannels(wire.pathNames(5)) { Reply.error(.init(code: $0), service: "Storage", $1) }
        guard channels.count == 1 else { return Reply.error(.badRequest, service: "Storage", "History v2 takes exactly one channel") }
        try authorize(keyset, wire, channels: channels, groups: [], permission: .read)
        let count = min(try wire.integer("count", in: ParameterBounds.historyCount) ?? 100, 100)
        let start = try wire.timetoken("start")
        let end = try wire.timetoken("end")
        let messages = try await state.store.history(subscribeKey: keyset.subscribeKey, channel: channels[0], start: start, end: end,
                                                     count: count, reverse: wire.bool("reverse"))
        let includeToken = wire.bool("include_token")
        let includeMeta = wire.bool("include_meta")
        let asStrings = wire.bool("string_message_token")
        var w = JSONWriter(capacity: 64 + messages.reduce(0) { $0 + $1.payload.utf8.count + 64 })
        w.raw("[[")
        for (i, m) in messages.enumerated() {
            if i > 0 { w.raw(",") }
            if includeToken || includeMeta {
                w.raw("{\"message\":")
                w.raw(m.payload.utf8)
                w.raw(",\"timetoken\":")
                if asStrings { w.timetokenString(m.timetoken) } else { w.number(m.timetoken.rawValue) }
                if includeMeta {
                    w.raw(",\"meta\":")
                    if let meta = m.meta { w.raw(meta.utf8) } else { w.raw("\"\"") }
                }
                w.raw("}")
            } else {
                w.raw(m.payload.utf8)
            }
        }
        w.raw("],")
        let first = messages.first?.timetoken ?? .zero
        let last = messages.last?.timetoken ?? .zero
        if asStrings { w.timetokenString(first) } else { w.number(first.rawValue) }
        w.raw(",")
        if asStrings { w.timetokenString(last) } else { w.number(last.rawValue) }
        w.raw("]")
        return Reply.json(.ok, w.bytes)
    }

    private func fetchV3(_ wire: WireRequest, withActions: Bool) async throws -> Response {
        let s = wire.segments
        let keyset = try keyset(subscribeKey: s[3], service: "Storage", uriLength: wire.uriLength)
        let channels = try historyChannels(wire.pathNames(5)) { Reply.historyError(.init(code: $0), $1) }
        if withActions && channels.count != 1 {
            return Reply.historyError(.badRequest, "History with actions takes exactly one channel")
        }
        if channels.count > 500 { return Reply.historyError(.badRequest, "Too many channels (at most 500)") }
        try authorize(keyset, wire, channels: channels, groups: [], permission: .read)
        let ceiling = channels.count == 1 && !withActions ? 100 : 25
        let max = Swift.min(try wire.integer("max", in: ParameterBounds.fetchMax) ?? ceiling, ceiling)
        let start = try wire.timetoken("start")
        let end = try wire.timetoken("end")
        let includeMeta = wire.bool("include_meta")
        let includeUUID = wire.bool("include_uuid")
        let includeType = wire.bool("include_message_type")
        let includeCustomType = wire.bool("include_custom_message_type")
        // One channel's messages as `"name":[…]` (or nothing when it has none).
        let store = state.store
        let subscribeKey = keyset.subscribeKey
        @Sendable func channelEntry(_ channel: String, first: Bool) async throws -> (bytes: [UInt8], oldest: Timetoken?, full: Bool) {
            let messages = try await store.history(subscribeKey: subscribeKey, channel: channel, start: start, end: end,
                                                   count: max, reverse: false)
            guard !messages.isEmpty else { return ([], nil, false) }
            var w = JSONWriter(capacity: 64 + messages.reduce(0) { $0 + $1.payload.utf8.count + ($1.meta?.utf8.count ?? 0) + 96 })
            if !first { w.raw(",") }
            w.string(channel)
            w.raw(":[")
            for (i, m) in messages.enumerated() {
                if i > 0 { w.raw(",") }
                w.raw("{\"message\":")
                w.raw(m.payload.utf8)
                w.raw(",\"timetoken\":")
                w.timetokenString(m.timetoken)
                if includeUUID {
                    w.raw(",\"uuid\":")
                    if let p = m.publisher { w.string(p) } else { w.raw("null") }
                }
                if includeMeta {
                    w.raw(",\"meta\":")
                    if let meta = m.meta { w.raw(meta.utf8) } else { w.raw("\"\"") }
                }
                if includeType {
                    w.raw(",\"message_type\":")
                    if m.kind == .message { w.raw("null") } else { w.number(m.kind.rawValue) }
                }
                if includeCustomType {
                    w.raw(",\"custom_message_type\":")
                    if let cmt = m.customMessageType { w.string(cmt) } else { w.raw("null") }
                }
                if withActions { w.raw(",\"actions\":{}") }
                w.raw("}")
            }
            w.raw("]")
            return (w.bytes, messages.first?.timetoken, messages.count == max)
        }
        let head = Array("{\"status\":200,\"error\":false,\"error_message\":\"\",\"channels\":{".utf8)
        if channels.count == 1 {
            let entry = try await channelEntry(channels[0], first: true)
            var w = JSONWriter(capacity: head.count + entry.bytes.count + 256)
            w.raw(head)
            w.raw(entry.bytes)
            w.raw("}")
            if withActions, entry.full, let oldest = entry.oldest {
                w.raw(",\"more\":{\"url\":")
                w.string("/v3/history-with-actions/sub-key/\(keyset.subscribeKey)/channel/\(PercentCoding.encode(channels[0]))?start=\(oldest.rawValue)&max=\(max)")
                w.raw(",\"start\":")
                w.timetokenString(oldest)
                w.raw(",\"max\":")
                w.number(max)
                w.raw("}")
            }
            w.raw("}")
            return Reply.json(.ok, w.bytes)
        }
        // Several channels (up to 500 × 25 messages of up to 32 KiB): streamed one channel at a
        // time, so the response never sits whole in memory. A store failure mid-way aborts the
        // connection (the client sees a truncated response and retries), never a wrong body.
        let body = ResponseBody { writer in
            try await writer.write(ByteBuffer(bytes: head))
            var first = true
            for channel in channels {
                let entry = try await channelEntry(channel, first: first)
                guard !entry.bytes.isEmpty else { continue }
                first = false
                try await writer.write(ByteBuffer(bytes: entry.bytes))
            }
            try await writer.write(ByteBuffer(string: "}}"))
            try await writer.finish(nil)
        }
        return Reply.json(.ok, body: body)
    }

    private func deleteMessages(_ wire: WireRequest) async throws -> Response {
        let s = wire.segments
        let keyset = try keyset(subscribeKey: s[3], service: "Storage", uriLength: wire.uriLength)
        let channels = try historyChannels(wire.pathNames(5)) { Reply.historyError(.init(code: $0), $1) }
        guard channels.count == 1 else { return Reply.historyError(.badRequest, "Delete takes exactly one channel") }
        try authorize(keyset, wire, method: "DELETE", channels: channels, groups: [], permission: .delete)
        let start = try wire.timetoken("start")
        let end = try wire.timetoken("end")
        try await state.store.delete(subscribeKey: keyset.subscribeKey, channel: channels[0], start: start, end: end)
        return Reply.json(.ok, "{\"status\":200,\"error\":false,\"error_message\":\"\"}")
    }

    private func messageCounts(_ wire: WireRequest) async throws -> Response {
        let s = wire.segments
        let keyset = try keyset(subscribeKey: s[3], service: "Storage", uriLength: wire.uriLength)
        let channels = try historyChannels(wire.pathNames(5)) { Reply.historyError(.init(code: $0), $1) }
        if channels.count > 100 { return Reply.historyError(.badRequest, "Invalid Arguments") }
        try authorize(keyset, wire, channels: channels, groups: [], permission: .read)
        var pairs: [(String, Timetoken)] = []
        if let list = wire.query["channelsTimetoken"], !list.isEmpty {
            let tokens = list.split(separator: ",", omittingEmptySubsequences: false).map { Timetoken(parsing: $0) }
            guard tokens.count == channels.count, tokens.allSatisfy({ $0 != nil }) else {
                return Reply.historyError(.badRequest, "Invalid Arguments")
            }
            pairs = zip(channels, tokens.compactMap { $0 }).map { ($0, $1) }
        } else if let tt = try wire.timetoken("timetoken") {
            pairs = channels.map { ($0, tt) }
        } else {
            return Reply.historyError(.badRequest, "Invalid Arguments")
        }
        let counts = try await state.store.messageCounts(subscribeKey: keyset.subscribeKey, channels: pairs)
        var w = JSONWriter()
        w.raw("{\"status\":200,\"error\":false,\"error_message\":\"\",\"channels\":{")
        for (i, channel) in channels.enumerated() {
            if i > 0 { w.raw(",") }
            w.string(channel)
            w.raw(":")
            w.number(counts[channel] ?? 0)
        }
        w.raw("}}")
        return Reply.json(.ok, w.bytes)
    }

    // MARK: - Operations

    private func health() async -> Response {
        // Cheap: the last write's outcome, or a tiny probe at most once a second (never a scan).
        let condition = await state.store.condition()
        let healthy = condition == .writable
        let uptime = ContinuousClock.now - state.startedAt
        var w = JSONWriter()
        w.raw("{\"status\":")
        w.string(healthy ? "ok" : "degraded")
        w.raw(",\"store\":")
        w.string(condition.rawValue)
        w.raw(",\"uptime_seconds\":")
        w.number(uptime.components.seconds)
        w.raw(",\"waiting_long_polls\":")
        w.number(state.hub.waitingCount)
        w.raw(",\"timetoken\":")
        w.timetokenString(state.hub.currentCursor)
        w.raw("}")
        return Reply.json(healthy ? .ok : .serviceUnavailable, w.bytes)
    }

    private func metrics() -> Response {
        guard let registry = state.registry else {
            return Reply.error(.notFound, service: "Tether", "Metrics are not enabled on this server")
        }
        var bytes: [UInt8] = []
        registry.emit(into: &bytes)
        return Response(status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                        body: .init(byteBuffer: ByteBuffer(bytes: bytes)))
    }
}

/// Parsed filter expressions by their text, shared by every subscriber sending the same filter.
/// Bounded: when full it starts over (a subscriber's next long-poll parses its filter again).
final class FilterCache: Sendable {
    private let entries = Mutex<[String: FilterExpression]>([:])
    /// Filters kept at most.
    static let capacity = 4096

    /// The parsed expression for `text`, parsed on first use.
    func expression(_ text: String) throws(FilterExpressionError) -> FilterExpression {
        if let cached = entries.withLock({ $0[text] }) { return cached }
        let parsed = try FilterExpression(parsing: text)
        entries.withLock { entries in
            if entries.count >= Self.capacity { entries.removeAll(keepingCapacity: true) }
            entries[text] = parsed
        }
        return parsed
    }
}
