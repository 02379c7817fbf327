import Foundation
import HTTPTypes
public import Hummingbird
public import Logging
public import NIOCore
public import Prometheus
import TetherProtocol
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
            return ("options", Reply.json(.ok, "{}"))
        }
        var wire: WireRequest
        do {
            wire = try WireRequest(rawPath: request.uri.path, rawQuery: request.uri.query)
            wire.uriLength = uriLength
        } catch {
            return ("invalid", Reply.error(.badRequest, service: "Balancer", "Could Not Parse Request"))
        }
        let s = wire.segments
        if let limited = rateLimit(wire, context: context) { return ("rate-limited", limited) }
        do {
            switch (request.method, s.first) {
            case (.get, "time") where s.count == 2 && s[1] == "0":
                return ("time", Reply.json(.ok, "[\(state.hub.currentCursor.rawValue)]"))
            case (.get, "publish") where s.count == 7, (.post, "publish") where s.count == 6:
                return ("publish", try await publish(request, wire, kind: .message))
            case (.get, "signal") where s.count == 7, (.post, "signal") where s.count == 6:
                return ("signal", try await publish(request, wire, kind: .signal))
            case (.get, "v2") where s.count >= 4 && s[1] == "subscribe":
                return ("subscribe", try await subscribe(wire, context: context))
            case (.get, "v2") where s.count == 6 && s[1] == "history" && s[2] == "sub-key" && s[4] == "channel":
                return ("history", try await historyV2(wire))
            case (.get, "v3") where s.count == 6 && (s[1] == "history" || s[1] == "history-with-actions") && s[2] == "sub-key" && s[4] == "channel":
                return ("fetch", try await fetchV3(wire, withActions: s[1] == "history-with-actions"))
            case (.delete, "v3") where s.count == 6 && s[1] == "history" && s[2] == "sub-key" && s[4] == "channel":
                return ("delete", try await deleteMessages(wire))
            case (.get, "v3") where s.count == 6 && s[1] == "history" && s[2] == "sub-key" && s[4] == "message-counts":
                return ("message-counts", try await messageCounts(wire))
            case (.get, "v2") where s.count >= 2 && s[1] == "presence":
                return try await presence(wire)
            case (.get, "v1") where s.count >= 2 && s[1] == "channel-registration":
                return try await channelGroups(wire)
            case (.get, "v2") where s.count >= 3 && s[1] == "auth" && (s[2] == "grant" || s[2] == "audit"):
                return (s[2], try await grantV2(wire, audit: s[2] == "audit"))
            case (.post, "v3") where s.count == 4 && s[1] == "pam" && s[3] == "grant":
                return ("grant-token", try await grantToken(request, wire))
            case (.delete, "v3") where s.count == 5 && s[1] == "pam" && s[3] == "grant":
                return ("revoke-token", try await revokeToken(wire))
            case (.get, "health") where s.count == 1:
                return ("health", await health())
            case (.get, "metrics") where s.count == 1:
                return ("metrics", metrics())
            default:
                let service = s.first == "v2" && s.count > 1 && s[1] == "presence" ? "Presence" : "Tether"
                return ("unknown", Reply.error(.notFound, service: service, "Not found: '\(request.uri.path)'"))
            }
        } catch let error as RequestError {
            return ("invalid", error.response)
        } catch let error as AccessDeniedError {
            if case .denied(let channels, let groups, let message) = error.check.decision {
                return ("subscribe", Self.forbidden(channels: channels, groups: groups, message: message))
            }
            return ("subscribe", Self.forbidden(channels: [], groups: [], message: "Forbidden"))
        } catch is CancellationError {
            // The client went away (an abandoned long-poll): nothing is written. 499 as nginx names it.
            return ("client-closed", Reply.error(.init(code: 499, reasonPhrase: "Client Closed Request"), service: "Tether", "Client closed request"))
        } catch {
            state.logger.error("internal error", metadata: ["error": "\(error)"])
            return ("error", Reply.error(.internalServerError, service: "Tether", "Internal Server Error"))
        }
    }

    // MARK: - Rate limits

    /// 429 with `Retry-After` when the client is over its keyset's rate (subscribes, time,
    /// health and metrics are never limited).
    private func rateLimit(_ wire: WireRequest, context: TetherRequestContext) -> Response? {
        let s = wire.segments
        guard let first = s.first else { return nil }
        let kind: RateLimits.Kind
        let subscribeKeyIndex: Int
        switch first {
        case "publish", "signal": (kind, subscribeKeyIndex) = (.publish, 2)
        case "v2" where s.count > 1 && s[1] == "subscribe": return nil
        case "v2" where s.count > 1 && s[1] == "auth": (kind, subscribeKeyIndex) = (.request, 4)
        case "v3" where s.count > 1 && s[1] == "pam": (kind, subscribeKeyIndex) = (.request, 2)
        case "v1", "v2", "v3": (kind, subscribeKeyIndex) = (.request, 3)
        default: return nil
        }
        guard s.count > subscribeKeyIndex, let keyset = state.keysets.keyset(subscribeKey: s[subscribeKeyIndex]) else { return nil }
        let client = wire.query["uuid"].flatMap { $0.isEmpty ? nil : "u:" + $0 }
            ?? "a:" + (context.channel.remoteAddress?.ipAddress ?? "unknown")
        guard let wait = state.rateLimits.take(kind, client: client, subscribeKey: keyset.subscribeKey,
                                               limits: state.keysets.limits(for: keyset)) else { return nil }
        return Reply.json(.tooManyRequests, ErrorBody.service(status: 429, service: "Balancer", message: "Too Many Requests"),
                          extraHeaders: [.retryAfter: String(max(1, Int(wait.rounded(.up))))])
    }

    // MARK: - Keys and names

    /// A client error that already knows its response.
    struct RequestError: Error {
        var response: Response
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

    func timetoken(_ wire: WireRequest, _ name: String, service: String) throws(RequestError) -> Timetoken? {
        guard let text = wire.query[name], !text.isEmpty else { return nil }
        guard let value = Timetoken(parsing: text) else {
            throw RequestError(response: Reply.error(.badRequest, service: service, "Invalid \(name): expected a timetoken of up to 17 digits"))
        }
        return value
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
        var sequence: Int?
        if let seqn = wire.query["seqn"], !seqn.isEmpty {
            guard let value = Int(seqn) else { return Reply.publishError(.badRequest, "Invalid seqn", timetoken: now) }
            sequence = value
        }
        var ttlHours: Double?
        if let ttl = wire.query["ttl"], !ttl.isEmpty {
            guard let value = Double(ttl), value >= 0, value.isFinite else {
                return Reply.publishError(.badRequest, "Invalid ttl: expected hours", timetoken: now)
            }
            ttlHours = value
        }
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
        let timetoken = try await state.hub.publish({ tt in
            SubscribeEnvelope(timetoken: tt, subscribeKey: subscribeKey, channel: channel, payload: payload, publisher: publisher,
                              meta: meta, kind: kind, customMessageType: customType, sequence: sequence)
        }, store: store ? { tt in
            StoredMessage(subscribeKey: subscribeKey, channel: channel, timetoken: tt, kind: .message, publisher: publisher,
                          payload: payload, meta: meta, customMessageType: customType, sequence: sequence,
                          expiresAt: retentionHours > 0 ? Timetoken(tt.rawValue + UInt64(retentionHours * 36_000_000_000)) : nil)
        } : nil)
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
        if names.count + groups.count > limits.maxChannelsPerSubscribe {
            return Reply.json(.uriTooLong, ErrorBody.service(status: 414, service: "Balancer", message: "Request URI Too Long"))
        }
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
                filter = try FilterExpression(parsing: text)
            } catch {
                return Reply.json(Reply.malformedFilterExpression, ErrorBody.service(
                    status: 481, service: "Subscribe", message: "Invalid filter expression: \(error.reason) at position \(error.position)"))
            }
        }
        let check = try authorize(keyset, wire, channels: names, groups: groups, permission: .read)
        let requested = try timetoken(wire, "tt", service: "Subscribe") ?? .zero
        if let region = wire.query["tr"], !region.isEmpty, Int(region) == nil {
            return Reply.error(.badRequest, service: "Subscribe", "Invalid tr: expected a region number")
        }
        // A subscribe is a heartbeat for its uuid on every channel and group in it (§6.4.8).
        let heartbeat = try heartbeatSeconds(wire, service: "Subscribe")
        let states = try channelStates(wire, service: "Subscribe", channels: names)
        let uuid = wire.query["uuid"].flatMap { $0.isEmpty ? nil : $0 }
        if let uuid {
            state.presence.heartbeat(subscribeKey: keyset.subscribeKey, uuid: uuid, channels: names, groups: groups,
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
            state.presence.refresh(subscribeKey: keyset.subscribeKey, uuid: uuid, channels: names, groups: groups,
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
        var count = 100
        if let text = wire.query["count"], !text.isEmpty {
            guard let value = Int(text), value > 0 else { return Reply.error(.badRequest, service: "Storage", "Invalid count") }
            count = min(value, 100)
        }
        let start = try timetoken(wire, "start", service: "Storage")
        let end = try timetoken(wire, "end", service: "Storage")
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
        var max = ceiling
        if let text = wire.query["max"], !text.isEmpty {
            guard let value = Int(text), value > 0 else { return Reply.historyError(.badRequest, "Invalid Arguments") }
            max = Swift.min(value, ceiling)
        }
        let start = try timetoken(wire, "start", service: "Storage")
        let end = try timetoken(wire, "end", service: "Storage")
        let includeMeta = wire.bool("include_meta")
        let includeUUID = wire.bool("include_uuid")
        let includeType = wire.bool("include_message_type")
        let includeCustomType = wire.bool("include_custom_message_type")
        var w = JSONWriter(capacity: 1024)
        w.raw("{\"status\":200,\"error\":false,\"error_message\":\"\",\"channels\":{")
        var firstChannel = true
        var more: (String, Timetoken)?
        for channel in channels {
            let messages = try await state.store.history(subscribeKey: keyset.subscribeKey, channel: channel, start: start, end: end,
                                                         count: max, reverse: false)
            guard !messages.isEmpty else { continue }
            if withActions, messages.count == max, let oldest = messages.first { more = (channel, oldest.timetoken) }
            if !firstChannel { w.raw(",") }
            firstChannel = false
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
        }
        w.raw("}")
        if let (channel, oldest) = more {
            w.raw(",\"more\":{\"url\":")
            w.string("/v3/history-with-actions/sub-key/\(keyset.subscribeKey)/channel/\(PercentCoding.encode(channel))?start=\(oldest.rawValue)&max=\(max)")
            w.raw(",\"start\":")
            w.timetokenString(oldest)
            w.raw(",\"max\":")
            w.number(max)
            w.raw("}")
        }
        w.raw("}")
        return Reply.json(.ok, w.bytes)
    }

    private func deleteMessages(_ wire: WireRequest) async throws -> Response {
        let s = wire.segments
        let keyset = try keyset(subscribeKey: s[3], service: "Storage", uriLength: wire.uriLength)
        let channels = try historyChannels(wire.pathNames(5)) { Reply.historyError(.init(code: $0), $1) }
        guard channels.count == 1 else { return Reply.historyError(.badRequest, "Delete takes exactly one channel") }
        try authorize(keyset, wire, method: "DELETE", channels: channels, groups: [], permission: .delete)
        let start = try timetoken(wire, "start", service: "Storage")
        let end = try timetoken(wire, "end", service: "Storage")
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
        } else if let single = wire.query["timetoken"], let tt = Timetoken(parsing: single) {
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
        let storeOK = (try? await state.store.messageCount()) != nil
        let uptime = ContinuousClock.now - state.startedAt
        var w = JSONWriter()
        w.raw("{\"status\":")
        w.string(storeOK ? "ok" : "degraded")
        w.raw(",\"store\":")
        w.string(storeOK ? "ok" : "unavailable")
        w.raw(",\"uptime_seconds\":")
        w.number(uptime.components.seconds)
        w.raw(",\"waiting_long_polls\":")
        w.number(state.hub.waitingCount)
        w.raw(",\"timetoken\":")
        w.timetokenString(state.hub.currentCursor)
        w.raw("}")
        return Reply.json(storeOK ? .ok : .serviceUnavailable, w.bytes)
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
