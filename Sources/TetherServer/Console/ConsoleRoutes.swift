import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
@_spi(Benchmarks) import TetherProtocol
import TetherServerCore

/// The console's pages (`/console`) and its JSON admin API (`/admin/v1/…`), answered before the
/// PubNub routes (docs/console.md). Every admin request needs the admin secret as a bearer token
/// or a signed-in session cookie; state-changing requests from a browser must be same-origin
/// and carry the session's CSRF token.
extension TetherResponder {
    static let consoleCookie = "tether_console"

    /// The console's answer, or `nil` when the path is not the console's.
    @inline(never) func console(_ console: AdminConsole, _ request: Request, context: TetherRequestContext) async -> Response? {
        let path = request.uri.path
        let isPage = path == "/console" || path.hasPrefix("/console/")
        guard isPage || path.hasPrefix("/admin/v1/") else { return nil }
        let segments = path.split(separator: "/", omittingEmptySubsequences: true).map(String.init)
        var request = request
        switch (request.method, segments) {
        case (.get, ["console"]):
            guard let session = signedIn(console, request) else { return Self.html(.ok, ConsoleAssets.loginPage(error: nil)) }
            return Self.html(.ok, ConsoleAssets.appPage(csrfToken: session.csrfToken))
        case (.get, ["console", "app.js"]):
            return Self.asset(ConsoleAssets.script, type: "text/javascript; charset=utf-8")
        case (.get, ["console", "app.css"]):
            return Self.asset(ConsoleAssets.stylesheet, type: "text/css; charset=utf-8")
        case (.post, ["console", "login"]):
            guard Self.isSameOrigin(request) else { return Self.refuseCrossSite() }
            let form = await Self.form(&request)
            let attempt = console.attempt(form["secret"], from: Self.address(context))
            if let retryAfter = attempt.retryAfter {
                console.logger.notice("console sign-in throttled", metadata: ["address": "\(Self.address(context))"])
                let page = ConsoleAssets.loginPage(error: "Too many wrong secrets; try again in \(retryAfter) s.")
                var response = Self.html(.tooManyRequests, page)
                response.headers[.retryAfter] = String(retryAfter)
                return response
            }
            guard attempt.accepted else {
                console.logger.notice("console sign-in refused: wrong secret", metadata: ["address": "\(Self.address(context))"])
                return Self.html(.unauthorized, ConsoleAssets.loginPage(error: "Wrong secret."))
            }
            let (id, _) = console.openSession()
            console.logger.info("console sign-in", metadata: ["address": "\(Self.address(context))"])
            var cookie = "\(Self.consoleCookie)=\(id); Path=/; HttpOnly; SameSite=Strict; Max-Age=43200"
            if console.usesTLS { cookie += "; Secure" }
            return Response(status: .seeOther, headers: [.location: "/console", .setCookie: cookie, .cacheControl: "no-store"])
        case (.post, ["console", "logout"]):
            guard Self.isSameOrigin(request) else { return Self.refuseCrossSite() }
            let form = await Self.form(&request)
            if let id = Self.cookie(request), let session = console.session(id), let token = form["csrf"],
               AdminSessions.constantTimeEquals(token, session.csrfToken) {
                console.closeSession(id)
            }
            return Response(status: .seeOther, headers: [.location: "/console", .setCookie: "\(Self.consoleCookie)=; Path=/; Max-Age=0"])
        default:
            break
        }
        if isPage { return Self.adminError(.notFound, "Not found") }
        // The admin API.
        let actor: String
        if let bearer = Self.bearer(request) {
            let attempt = console.attempt(bearer, from: Self.address(context))
            if let retryAfter = attempt.retryAfter {
                var response = Self.adminError(.tooManyRequests, "Too many wrong secrets")
                response.headers[.retryAfter] = String(retryAfter)
                return response
            }
            guard attempt.accepted else { return Self.adminError(.unauthorized, "Unauthorized") }
            actor = "bearer"
        } else if let session = signedIn(console, request) {
            actor = "console session"
            if request.method != .get && request.method != .head {
                guard Self.isSameOrigin(request) else { return Self.refuseCrossSite() }
                guard let token = request.headers[Self.csrfHeader], AdminSessions.constantTimeEquals(token, session.csrfToken) else {
                    return Self.adminError(.forbidden, "Missing or wrong CSRF token")
                }
            }
        } else {
            return Self.adminError(.unauthorized, "Unauthorized")
        }
        let api = Array(segments.dropFirst(2))
        let get = request.method == .get
        let post = request.method == .post
        if api.count == 2, api[0] == "clients", get {
            guard let client = clients(console, uuid: api[1]).first else { return Self.adminError(.notFound, "No such client") }
            return Self.json(client)
        }
        if api.count == 3, api[0] == "clients", post {
            let uuid = api[1]
            switch api[2] {
            case "kick":
                let closed = console.kick(uuid: uuid)
                console.logger.info("console: client kicked", metadata: ["by": "\(actor)", "uuid": "\(uuid)", "connections": "\(closed)"])
                return Self.json(["closed": closed])
            case "end-session":
                let ended = await console.webSockets?.endKept(uuid: uuid) ?? 0
                console.logger.info("console: kept session ended", metadata: ["by": "\(actor)", "uuid": "\(uuid)", "sessions": "\(ended)"])
                return Self.json(["ended": ended])
            default:
                return Self.adminError(.notFound, "Not found")
            }
        }
        switch (get, post, api.first ?? "", api.count) {
        case (true, _, "overview", 1): return Self.json(overview(console))
        case (true, _, "channels", 1): return Self.json(channels(console, query: request.uri.queryParameters["q"].map(String.init) ?? "*"))
        case (true, _, "clients", 1): return Self.json(clients(console, uuid: nil))
        case (true, _, "keysets", 1):
            return Self.json(state.keysets.all.sorted { $0.subscribeKey < $1.subscribeKey }.map {
                AdminKeyset(name: $0.name, subscribeKey: $0.subscribeKey, publishKey: $0.publishKey, accessManager: $0.secretKey != nil,
                            retentionHours: $0.historyRetentionHours)
            })
        case (true, _, "events", 1):
            return events(console)
        case (_, true, "publish", 1):
            return await adminPublish(console, &request, actor: actor)
        default:
            return Self.adminError(.notFound, "Not found")
        }
    }

    // MARK: - Views

    struct AdminKeyset: Encodable {
        var name: String?
        var subscribeKey: String
        var publishKey: String
        var accessManager: Bool
        var retentionHours: Double
    }

    struct AdminOverview: Encodable {
        struct Point: Encodable {
            var t: Int64
            var publishes: Double
            var deliveries: Double
            var p99: Int?
            var longPolls: Int
            var webSockets: Int
            var kept: Int
        }
        var now: Int64
        var uptimeSeconds: Int64
        var connections: [String: Int]
        var keptSessions: Int
        var publishesPerSecond: Double
        var deliveriesPerSecond: Double
        var p99DeliveryMilliseconds: Int?
        var publishesTotal: Int
        var deliveriesTotal: Int
        var clientsRecorded: Int
        var storeBytes: Int64
        var retentionHours: [String: Double]
        var series: [Point]
    }

    func overview(_ console: AdminConsole) -> AdminOverview {
        let series = console.series
        let last = series.last
        let counts = console.read { $0.connectedCounts }
        let totals = console.totals
        var storeBytes: Int64 = 0
        for suffix in ["", "-wal"] {
            let size = (try? FileManager.default.attributesOfItem(atPath: state.store.path + suffix)[.size] as? NSNumber)?.int64Value
            storeBytes += size ?? 0
        }
        return AdminOverview(
            now: AdminConsole.now(), uptimeSeconds: (ContinuousClock.now - state.startedAt).components.seconds,
            connections: ["long-poll": counts.longPoll, "websocket": console.webSockets?.connectionCount ?? counts.webSocket],
            keptSessions: console.webSockets?.keptCount ?? 0,
            publishesPerSecond: last?.publishesPerSecond ?? 0, deliveriesPerSecond: last?.deliveriesPerSecond ?? 0,
            p99DeliveryMilliseconds: series.suffix(10).compactMap(\.p99Milliseconds).max(),
            publishesTotal: totals.publishes, deliveriesTotal: totals.deliveries, clientsRecorded: console.read { $0.count },
            storeBytes: storeBytes,
            retentionHours: Dictionary(state.keysets.all.map { ($0.name ?? $0.subscribeKey, $0.historyRetentionHours) }, uniquingKeysWith: { a, _ in a }),
            series: series.map { .init(t: $0.at, publishes: $0.publishesPerSecond, deliveries: $0.deliveriesPerSecond, p99: $0.p99Milliseconds,
                                       longPolls: $0.longPolls, webSockets: $0.webSockets, kept: $0.keptSessions) })
    }

    struct AdminChannel: Encodable {
        struct Message: Encodable {
            var timetoken: String
            var publisher: String?
            var payload: String
            var truncated: Bool
        }
        var subscribeKey: String
        var channel: String
        var occupancy: Int
        var heldInMemory: Int
        var messagesPerMinute: Int
        var lastMessages: [Message]
        var presenceEvents: [Message]
    }

    /// Channels whose name matches `query` (`*` anywhere is a wildcard; plain text matches a part
    /// of the name), from the in-memory windows and presence; at most 200.
    func channels(_ console: AdminConsole, query: String) -> [AdminChannel] {
        let pattern = query.isEmpty ? "*" : query
        func matches(_ name: String) -> Bool {
            let base = NameRules.isPresence(name) ? String(name.dropLast(NameRules.presenceSuffix.count)) : name
            return Self.wildcardMatch(pattern.contains("*") ? pattern : "*\(pattern)*", base)
        }
        let since = Timetoken(UInt64(max(0, AdminConsole.now() - 60_000)) * 10_000)
        let windows = state.hub.windowSummaries(matching: { _, channel in matches(channel) }, since: since, last: 5)
        func messages(_ envelopes: [SubscribeEnvelope]) -> [AdminChannel.Message] {
            envelopes.reversed().map {
                let truncated = $0.payload.count > 200
                return .init(timetoken: String($0.timetoken.rawValue), publisher: $0.publisher,
                             payload: truncated ? String($0.payload.prefix(200)) + "…" : $0.payload, truncated: truncated)
            }
        }
        var byKey: [String: AdminChannel] = [:]
        func entry(_ subscribeKey: String, _ channel: String) -> AdminChannel {
            byKey["\(subscribeKey)/\(channel)"] ?? AdminChannel(
                subscribeKey: subscribeKey, channel: channel,
                occupancy: state.presence.read { $0.occupancy(subscribeKey: subscribeKey, channel: channel) },
                heldInMemory: 0, messagesPerMinute: 0, lastMessages: [], presenceEvents: [])
        }
        for window in windows {
            if NameRules.isPresence(window.channel) {
                let base = String(window.channel.dropLast(NameRules.presenceSuffix.count))
                var e = entry(window.subscribeKey, base)
                e.presenceEvents = messages(window.newest)
                byKey["\(window.subscribeKey)/\(base)"] = e
            } else {
                var e = entry(window.subscribeKey, window.channel)
                e.heldInMemory = window.held
                e.messagesPerMinute = window.recent
                e.lastMessages = messages(window.newest)
                byKey["\(window.subscribeKey)/\(window.channel)"] = e
            }
        }
        for keyset in state.keysets.all {
            for channel in state.presence.read({ $0.occupiedChannels(subscribeKey: keyset.subscribeKey) }) where matches(channel) {
                let key = "\(keyset.subscribeKey)/\(channel)"
                if byKey[key] == nil { byKey[key] = entry(keyset.subscribeKey, channel) }
            }
        }
        return Array(byKey.values.sorted { ($0.subscribeKey, $0.channel) < ($1.subscribeKey, $1.channel) }.prefix(200))
    }

    /// `*` matches any run of characters.
    static func wildcardMatch(_ pattern: String, _ text: String) -> Bool {
        let parts = pattern.split(separator: "*", omittingEmptySubsequences: false).map(String.init)
        guard parts.count > 1 else { return pattern == text }
        var rest = Substring(text)
        guard rest.hasPrefix(parts[0]) else { return false }
        rest = rest.dropFirst(parts[0].count)
        for part in parts.dropFirst().dropLast() where !part.isEmpty {
            guard let range = rest.range(of: part) else { return false }
            rest = rest[range.upperBound...]
        }
        return rest.hasSuffix(parts.last!)
    }

    struct AdminClient: Encodable {
        struct Event: Encodable {
            var at: Int64
            var type: String
            var detail: String
        }
        var uuid: String
        var subscribeKey: String?
        var connected: Bool
        var transport: String?
        var address: String?
        var longPolls: Int
        var webSockets: Int
        var session: String?
        var channels: [String]
        var groups: [String]
        var cursor: String
        var pingMilliseconds: Int64?
        var delivered: Int
        var firstSeen: Int64
        var lastSeen: Int64
        var timeline: [Event]
    }

    func clients(_ console: AdminConsole, uuid: String?) -> [AdminClient] {
        let clients: [ConnectionRecorder.Client] = console.read { recorder in
            if let uuid { return recorder.client(uuid).map { [$0] } ?? [] }
            return recorder.clients(limit: 500)
        }
        return clients.map { c in
            AdminClient(uuid: c.uuid, subscribeKey: c.subscribeKey, connected: c.isConnected, transport: c.transport?.rawValue,
                        address: c.address, longPolls: c.openLongPolls, webSockets: c.openSockets, session: c.session,
                        channels: c.channels, groups: c.groups, cursor: String(c.cursor.rawValue), pingMilliseconds: c.pingMilliseconds,
                        delivered: c.delivered, firstSeen: c.firstSeen, lastSeen: c.lastSeen,
                        timeline: c.timeline.map { Self.describe($0) })
        }
    }

    static func describe(_ entry: ConnectionRecorder.Entry) -> AdminClient.Event {
        func seconds(_ ms: Int64) -> String { String(format: "%.1f s", Double(ms) / 1000) }
        let (type, detail): (String, String)
        switch entry.event {
        case .connected(let transport, let address): (type, detail) = ("connected", "\(transport.rawValue) from \(address)")
        case .reconnectAttempt(let transport): (type, detail) = ("reconnect-attempt", "\(transport.rawValue) handshake")
        case .dropped(let transport, let reason): (type, detail) = ("dropped", "\(transport.rawValue): \(reason)")
        case .sessionOpened(let session): (type, detail) = ("session-opened", session)
        case .resumed(let session, let away): (type, detail) = ("resumed", "\(session) after \(seconds(away)) away")
        case .expired(let session, let reason): (type, detail) = ("expired", "\(session): \(reason)")
        case .accessDenied(let channels): (type, detail) = ("access-denied", channels.joined(separator: ", "))
        case .rateLimited(let route): (type, detail) = ("rate-limited", route)
        case .catchUp(let messages, let away, let gaps):
            (type, detail) = ("catch-up", "\(messages) message\(messages == 1 ? "" : "s") after \(seconds(away)) away"
                                + (gaps > 0 ? ", \(gaps) retention gap\(gaps == 1 ? "" : "s")" : ""))
        case .kicked: (type, detail) = ("kicked", "closed by the operator")
        }
        return .init(at: entry.at, type: type, detail: detail)
    }

    // MARK: - Live events

    /// Server-sent events: an `overview` event a second (from the sampler). A watcher whose
    /// queue fills is dropped; the server never waits for one.
    func events(_ console: AdminConsole) -> Response {
        guard let (_, stream) = console.watch() else { return Self.adminError(.serviceUnavailable, "Too many console watchers") }
        let body = ResponseBody { writer in
            try await writer.write(ByteBuffer(string: "retry: 2000\n\n"))
            for await event in stream {
                try await writer.write(ByteBuffer(string: event))
            }
            try await writer.finish(nil)
        }
        return Response(status: .ok, headers: [.contentType: "text/event-stream", .cacheControl: "no-store"], body: body)
    }

    // MARK: - Try it

    struct AdminPublish: Decodable {
        var subscribeKey: String?
        var channel: String
        var message: String
        var uuid: String?
        var auth: String?
    }

    /// Publishes through the PubNub publish path (name rules, access manager with `auth`, size
    /// limits, the store), as uuid `tether-console` unless another is given.
    func adminPublish(_ console: AdminConsole, _ request: inout Request, actor: String) async -> Response {
        guard let body = try? await request.collectBody(upTo: 64 * 1024),
              let publish = try? JSONDecoder().decode(AdminPublish.self, from: Data(body.readableBytesView)) else {
            return Self.adminError(.badRequest, "Expected {\"channel\": …, \"message\": <JSON text>}")
        }
        guard let keyset = publish.subscribeKey.flatMap({ state.keysets.keyset(subscribeKey: $0) })
                ?? state.keysets.all.sorted(by: { $0.subscribeKey < $1.subscribeKey }).first else {
            return Self.adminError(.badRequest, "Unknown subscribe key")
        }
        var query = "uuid=\(PercentCoding.encode(publish.uuid ?? "tether-console"))"
        if let auth = publish.auth, !auth.isEmpty { query += "&auth=\(PercentCoding.encode(auth))" }
        let path = "/publish/\(PercentCoding.encode(keyset.publishKey))/\(PercentCoding.encode(keyset.subscribeKey))/0/"
            + "\(PercentCoding.encode(publish.channel))/0/\(PercentCoding.encode(publish.message))"
        console.logger.info("console: publish", metadata: ["by": "\(actor)", "channel": "\(publish.channel)", "bytes": "\(publish.message.utf8.count)"])
        do {
            var wire = try WireRequest(rawPath: path, rawQuery: query)
            wire.uriLength = path.utf8.count + query.utf8.count
            let target = try PublishRequest.Target(wire, kind: .message, keysets: state.keysets, now: state.hub.currentCursor)
            try authorize(target.keyset, wire, channels: [target.channel], groups: [], permission: .write)
            let message = try PublishRequest(target, message: Array(publish.message.utf8), wire)
            switch try await commitPublish(message, kind: .message) {
            case .sent(let timetoken, _): return Self.json(["timetoken": String(timetoken.rawValue)])
            case .failed(let status, let text, _, _): return Self.adminError(status, text)
            }
        } catch let refusal as Refusal {
            return refusal.response
        } catch let error as RequestError {
            return error.response
        } catch let error as ParameterError {
            return Self.adminError(.badRequest, error.description)
        } catch {
            return Self.adminError(.badRequest, "Could not publish: \(error)")
        }
    }

    // MARK: - Helpers

    static let csrfHeader = HTTPField.Name("X-CSRF-Token")!

    private func signedIn(_ console: AdminConsole, _ request: Request) -> AdminSessions.Session? {
        guard let id = Self.cookie(request) else { return nil }
        return console.session(id)
    }

    static func cookie(_ request: Request) -> String? {
        for header in request.headers[values: .cookie] {
            for part in header.split(separator: ";") {
                let pair = part.trimmingCharacters(in: .whitespaces).split(separator: "=", maxSplits: 1)
                if pair.count == 2, pair[0] == consoleCookie { return String(pair[1]) }
            }
        }
        return nil
    }

    static func bearer(_ request: Request) -> String? {
        guard let value = request.headers[.authorization], value.lowercased().hasPrefix("bearer ") else { return nil }
        return String(value.dropFirst(7)).trimmingCharacters(in: .whitespaces)
    }

    /// A browser's cross-site request is refused: `Sec-Fetch-Site` must be same-origin (or
    /// none: typed by the user), and an `Origin` must name this host.
    static func isSameOrigin(_ request: Request) -> Bool {
        if let site = request.headers[HTTPField.Name("Sec-Fetch-Site")!]?.lowercased(), site != "same-origin", site != "none" {
            return false
        }
        if let origin = request.headers[HTTPField.Name("Origin")!] {
            guard let host = request.head.authority,
                  let url = URL(string: origin), let originHost = url.host else { return false }
            let port = url.port.map { ":\($0)" } ?? ""
            return "\(originHost)\(port)".lowercased() == host.lowercased()
        }
        return true
    }

    static func refuseCrossSite() -> Response { adminError(.forbidden, "Cross-site request refused") }

    static func form(_ request: inout Request) async -> [String: String] {
        guard let body = try? await request.collectBody(upTo: 16 * 1024) else { return [:] }
        var fields: [String: String] = [:]
        for pair in String(buffer: body).split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1).map { String($0).replacingOccurrences(of: "+", with: " ") }
            guard let name = parts.first.flatMap({ $0.removingPercentEncoding }) else { continue }
            fields[name] = parts.count > 1 ? parts[1].removingPercentEncoding ?? "" : ""
        }
        return fields
    }

    static func address(_ context: TetherRequestContext) -> String { context.channel.remoteAddress?.ipAddress ?? "unknown" }

    static func json(_ value: some Encodable) -> Response {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        let data = (try? encoder.encode(value)) ?? Data("{}".utf8)
        return Response(status: .ok, headers: [.contentType: "application/json", .cacheControl: "no-store"],
                        body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }

    static func adminError(_ status: HTTPResponse.Status, _ message: String) -> Response {
        let encoder = JSONEncoder()
        let data = (try? encoder.encode(["error": message, "status": String(status.code)])) ?? Data()
        var headers: HTTPFields = [.contentType: "application/json", .cacheControl: "no-store"]
        if status == .unauthorized { headers[.wwwAuthenticate] = "Bearer realm=\"tether-admin\"" }
        return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }

    static func html(_ status: HTTPResponse.Status, _ text: String) -> Response {
        Response(status: status, headers: [.contentType: "text/html; charset=utf-8", .cacheControl: "no-store",
                                           .contentSecurityPolicy: "default-src 'self'; frame-ancestors 'none'",
                                           HTTPField.Name("X-Frame-Options")!: "DENY"],
                 body: .init(byteBuffer: ByteBuffer(string: text)))
    }

    static func asset(_ text: String, type: String) -> Response {
        Response(status: .ok, headers: [.contentType: type, .cacheControl: "no-cache"], body: .init(byteBuffer: ByteBuffer(string: text)))
    }
}
