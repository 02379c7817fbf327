import HTTPTypes
import Hummingbird
import NIOCore
@_spi(Benchmarks) import TetherProtocol
import TetherServerCore

extension Reply {
    /// The objects error object (PubNub's, as its SDKs' recorded fixtures show it):
    /// `{"status":N,"error":{"message":"…","source":"objects","details":[…]}}`.
    static func objectsError(_ status: HTTPResponse.Status, _ message: String,
                             details: [(message: String, location: String, locationType: String)] = []) -> Response {
        var w = JSONWriter()
        w.raw("{\"status\":")
        w.number(status.code)
        w.raw(",\"error\":{\"message\":")
        w.string(message)
        w.raw(",\"source\":\"objects\"")
        if !details.isEmpty {
            w.raw(",\"details\":[")
            for (i, d) in details.enumerated() {
                if i > 0 { w.raw(",") }
                w.raw("{\"message\":")
                w.string(d.message)
                w.raw(",\"location\":")
                w.string(d.location)
                w.raw(",\"locationType\":")
                w.string(d.locationType)
                w.raw("}")
            }
            w.raw("]")
        }
        w.raw("}}")
        return json(status, w.bytes)
    }

    /// PubNub's 400 for invalid input, with one detail naming the parameter or body field.
    static func objectsInvalid(_ message: String, location: String, locationType: String) -> Response {
        objectsError(.badRequest, "Request payload contained invalid input.",
                     details: [(message: message, location: location, locationType: locationType)])
    }
}

/// The App Context bounds (docs/compatibility.md, "App Context").
enum AppContextBounds {
    /// `limit` of a list: 1…100, default 100 (PubNub's).
    static let limit = 1...100
    /// A set request's body.
    static let bodyBytes = 32 * 1024
    /// A string field (name, email, externalId, profileUrl, description), in UTF-8 bytes.
    static let fieldBytes = 2048
    /// `status` and `type`, in characters.
    static let statusCharacters = 50
    /// `custom`: members, and each string value's bytes.
    static let customMembers = 100
    static let customValueBytes = 2048
    /// Memberships set or deleted by one PATCH (each array).
    static let membershipChanges = 100
    /// Objects or memberships one list scans before filtering (a Tether bound).
    static let scan = 100_000
}

/// A request of the objects v2 family (`/v2/objects/{sub}/{uuids|channels}[/{id}[/{channels|uuids}]]`):
/// keyset, kind and id, checked before access. Every error is the objects error object.
struct AppContextRequest {
    var keyset: Keyset
    var kind: AppContextKind
    var id: String?

    init(_ wire: WireRequest, keysets: KeysetRegistry) throws(RequestError) {
        let s = wire.segments
        guard NameRules.validateKey(s[2]), let keyset = keysets.keyset(subscribeKey: s[2]) else {
            throw RequestError(response: Reply.objectsInvalid("Invalid subscribe key", location: "subKey", locationType: "path"))
        }
        if wire.uriLength > keysets.limits(for: keyset).maxURIBytes { throw RequestError(response: Reply.uriTooLong) }
        self.keyset = keyset
        self.kind = s[3] == "uuids" ? .uuid : .channel
        if s.count > 4 {
            let id = s[4]
            try Self.validate(id, kind, location: kind == .uuid ? "uuid" : "channel", locationType: "path")
            self.id = id
        }
    }

    static func validate(_ id: String, _ kind: AppContextKind, location: String, locationType: String) throws(RequestError) {
        switch kind {
        case .uuid:
            do { try NameRules.validateUserId(id) } catch {
                throw RequestError(response: Reply.objectsInvalid("Invalid user id: \(error)", location: location, locationType: locationType))
            }
        case .channel:
            do { try NameRules.validateChannel(id) } catch {
                throw RequestError(response: Reply.objectsInvalid("Invalid channel id: \(error)", location: location, locationType: locationType))
            }
        }
    }
}

/// The `include` parameter: which optional parts a response carries.
struct AppContextIncludes {
    var custom = false, status = false, type = false, totalCount = false
    /// The other side of a membership (`channel` for memberships, `uuid` for members).
    var other = false, otherCustom = false, otherStatus = false, otherType = false

    /// Nothing included.
    init() {}

    init(_ wire: WireRequest, other: String?) throws(RequestError) {
        if ["true", "True", "1"].contains(wire.query["count"] ?? "") { totalCount = true }
        guard let text = wire.query["include"], !text.isEmpty else { return }
        for item in text.split(separator: ",", omittingEmptySubsequences: false) {
            switch item {
            case "custom": custom = true
            case "status": status = true
            case "type": type = true
            case "totalCount": totalCount = true
            default:
                guard let other, item.hasPrefix(other) else { throw Self.invalid(item) }
                switch item.dropFirst(other.count) {
                case "", ".id": self.other = true
                case ".custom": self.other = true; otherCustom = true
                case ".status": self.other = true; otherStatus = true
                case ".type": self.other = true; otherType = true
                default: throw Self.invalid(item)
                }
            }
        }
    }

    static func invalid(_ item: Substring) -> RequestError {
        RequestError(response: Reply.objectsInvalid("Unknown include value \(String(reflecting: String(item)))", location: "include",
                                                     locationType: "query"))
    }
}

/// `limit`, `start`/`end`, `sort` and `filter` of a list.
struct AppContextListOptions {
    var limit = AppContextBounds.limit.upperBound
    var start: Int?
    var end: Int?
    var sort: [AppContextSort] = []
    var filter: AppContextFilter?

    init(_ wire: WireRequest, sortable: Set<String>) throws(RequestError) {
        func invalid(_ message: String, _ name: String) -> RequestError {
            RequestError(response: Reply.objectsInvalid(message, location: name, locationType: "query"))
        }
        if let text = wire.query["limit"] {
            guard let value = Int(text), AppContextBounds.limit.contains(value) else {
                throw invalid("limit must be an integer from 1 to 100", "limit")
            }
            limit = value
        }
        if let text = wire.query["start"] {
            guard let offset = AppContextCursor.decode(text) else { throw invalid("Invalid page cursor", "start") }
            start = offset
        }
        if let text = wire.query["end"] {
            guard let offset = AppContextCursor.decode(text) else { throw invalid("Invalid page cursor", "end") }
            end = offset
        }
        // Python and Swift send one comma-separated `sort`; JavaScript repeats the key, one per
        // field, in order of precedence.
        if let text = Optional(wire.queryValues("sort").filter { !$0.isEmpty }.joined(separator: ",")), !text.isEmpty {
            guard let keys = AppContextSort.parse(text, allowed: sortable) else {
                throw invalid("Invalid sort: expected field[:asc|:desc] with a field from \(sortable.sorted().joined(separator: ", "))", "sort")
            }
            sort = keys
        }
        if let text = wire.query["filter"], !text.isEmpty {
            do { filter = try AppContextFilter(parsing: text) } catch {
                throw invalid("Invalid filter expression: \(error.message)", "filter")
            }
        }
    }

    /// Filters, sorts and pages `records` (JSON objects); the page, the total matched and the
    /// page's offset.
    func page(_ records: [JSONValue], tieBreak: [String]) -> (items: [JSONValue], total: Int, offset: Int) {
        var matched = filter.map { f in records.filter { f.matches($0) } } ?? records
        matched.sort { AppContextSort.ordered($0, $1, by: sort, tieBreak: tieBreak) }
        var offset = 0, count = limit
        if let start {
            offset = min(start, matched.count)
        } else if let end {
            offset = max(0, min(end, matched.count) - limit)
            count = min(limit, min(end, matched.count) - offset)
        }
        return (Array(matched[offset..<min(matched.count, offset + count)]), matched.count, offset)
    }
}

extension TetherResponder {
    // MARK: - Objects (user and channel metadata)

    /// `GET /v2/objects/{sub}/{uuids|channels}/{id}`.
    @inline(never) func getAppContextObject(_ wire: WireRequest) async throws -> Response {
        let target = try AppContextRequest(wire, keysets: state.keysets)
        guard let id = target.id else { throw RequestError(response: Reply.objectsError(.notFound, "Requested resource not found.")) }
        try authorizeAppContext(target.keyset, wire, kind: target.kind, id: id, permission: .get)
        let includes = try AppContextIncludes(wire, other: nil)
        guard let record = try await state.appContext.appContextObject(subscribeKey: target.keyset.subscribeKey, kind: target.kind, id: id) else {
            return Reply.objectsError(.notFound, "Requested object was not found.")
        }
        var w = JSONWriter()
        w.raw("{\"status\":200,\"data\":")
        Self.writeObject(&w, record, kind: target.kind, includes: includes)
        w.raw("}")
        return Reply.json(.ok, w.bytes)
    }

    /// `PATCH /v2/objects/{sub}/{uuids|channels}/{id}`: a partial update (members present
    /// replace, `null` clears), `If-Match` checked; the object's event is published on the
    /// channel named by its id.
    @inline(never) func setAppContextObject(_ request: Request, _ wire: WireRequest) async throws -> Response {
        let target = try AppContextRequest(wire, keysets: state.keysets)
        guard let id = target.id else { throw RequestError(response: Reply.objectsError(.notFound, "Requested resource not found.")) }
        guard let body = try? await request.body.collect(upTo: AppContextBounds.bodyBytes) else {
            throw Refusal(response: Reply.objectsError(.contentTooLarge, "Request payload is too large."))
        }
        let bytes = Array(buffer: body)
        try authorizeAppContext(target.keyset, wire, kind: target.kind, id: id, permission: .update, method: "PATCH", body: bytes)
        let includes = try AppContextIncludes(wire, other: nil)
        let patch = try Self.objectPatch(bytes, kind: target.kind)
        let ifMatch = request.headers[.ifMatch]
        let subscribeKey = target.keyset.subscribeKey
        let updated = AppContextTimestamp.format(state.appContextTime)
        let outcome = try await state.appContext.setAppContextObject(subscribeKey: subscribeKey, kind: target.kind, id: id, patch: patch,
                                                                ifMatch: ifMatch, updated: updated)
        guard case .set(let record) = outcome else {
            let what = target.kind == .uuid ? "User" : "Channel"
            return Reply.objectsError(.preconditionFailed, "\(what) to update has been modified after it was read.")
        }
        var data = record.fields.filter { !$0.value.isNull }
        data["id"] = .string(id)
        data["updated"] = .string(record.updated)
        data["eTag"] = .string(record.eTag)
        publishObjectEvent(subscribeKey: subscribeKey, channels: [id], event: "set", type: target.kind.rawValue, data: .object(data))
        var w = JSONWriter()
        w.raw("{\"status\":200,\"data\":")
        Self.writeObject(&w, record, kind: target.kind, includes: includes)
        w.raw("}")
        return Reply.json(.ok, w.bytes)
    }

    /// `DELETE /v2/objects/{sub}/{uuids|channels}/{id}`: removes the object and its memberships.
    @inline(never) func removeAppContextObject(_ wire: WireRequest) async throws -> Response {
        let target = try AppContextRequest(wire, keysets: state.keysets)
        guard let id = target.id else { throw RequestError(response: Reply.objectsError(.notFound, "Requested resource not found.")) }
        try authorizeAppContext(target.keyset, wire, kind: target.kind, id: id, permission: .delete, method: "DELETE")
        let subscribeKey = target.keyset.subscribeKey
        if try await state.appContext.removeAppContextObject(subscribeKey: subscribeKey, kind: target.kind, id: id) {
            publishObjectEvent(subscribeKey: subscribeKey, channels: [id], event: "delete", type: target.kind.rawValue,
                               data: .object(["id": .string(id)]))
        }
        return Reply.json(.ok, "{\"status\":200,\"data\":null}")
    }

    /// `GET /v2/objects/{sub}/{uuids|channels}`: filter, sort, limit, page cursors, count.
    @inline(never) func getAllAppContextObjects(_ wire: WireRequest) async throws -> Response {
        let target = try AppContextRequest(wire, keysets: state.keysets)
        try authorizeAppContext(target.keyset, wire, kind: target.kind, id: nil, permission: .get)
        let includes = try AppContextIncludes(wire, other: nil)
        let options = try AppContextListOptions(wire, sortable: ["id", "name", "updated", "status", "type"])
        let records: [AppContextRecord]
        let page: (items: [JSONValue], total: Int, offset: Int)
        if options.filter == nil, options.sort.allSatisfy({ $0.field == ["id"] && !$0.descending }) {
            // In the store's order, with nothing to match: only the page is read (a list of
            // every object, parsed and sorted for each page, made paging through N objects
            // cost N² and let one request parse every object of the keyset).
            let subscribeKey = target.keyset.subscribeKey
            var window = try await state.appContext.appContextObjectsPage(subscribeKey: subscribeKey, kind: target.kind,
                                                                         offset: options.start ?? 0, limit: options.limit)
            var offset = min(options.start ?? 0, window.total)
            if options.start == nil, let end = options.end {
                // A `prev` cursor: the page that ends there.
                let stop = min(end, window.total)
                offset = max(0, stop - options.limit)
                window = try await state.appContext.appContextObjectsPage(subscribeKey: subscribeKey, kind: target.kind,
                                                                         offset: offset, limit: stop - offset)
            }
            records = window.records
            page = (records.map { Self.filterView($0) }, window.total, offset)
        } else {
            records = try await state.appContext.appContextObjects(subscribeKey: target.keyset.subscribeKey, kind: target.kind,
                                                                   limit: AppContextBounds.scan)
            page = options.page(records.map { Self.filterView($0) }, tieBreak: ["id"])
        }
        let byId = Dictionary(records.map { ($0.id, $0) }, uniquingKeysWith: { a, _ in a })
        var w = JSONWriter(capacity: 256 + page.items.count * 256)
        w.raw("{\"status\":200,\"data\":[")
        for (i, item) in page.items.enumerated() {
            if i > 0 { w.raw(",") }
            if let id = item["id"]?.stringValue, let record = byId[id] { Self.writeObject(&w, record, kind: target.kind, includes: includes) }
        }
        w.raw("]")
        Self.writePaging(&w, page, includes: includes)
        w.raw("}")
        return Reply.json(.ok, w.bytes)
    }

    // MARK: - Memberships and members

    /// `GET /v2/objects/{sub}/uuids/{uuid}/channels` (a user's memberships) and
    /// `GET /v2/objects/{sub}/channels/{ch}/uuids` (a channel's members).
    @inline(never) func getAppContextMemberships(_ wire: WireRequest) async throws -> Response {
        let target = try AppContextRequest(wire, keysets: state.keysets)
        guard let id = target.id else { throw RequestError(response: Reply.objectsError(.notFound, "Requested resource not found.")) }
        try authorizeAppContext(target.keyset, wire, kind: target.kind, id: id, permission: .get)
        return try await membershipsPage(target, id: id, wire)
    }

    /// `PATCH …/uuids/{uuid}/channels` and `PATCH …/channels/{ch}/uuids`: `{"set":[…],"delete":[…]}`,
    /// answered with the page of memberships after the change; each change publishes a
    /// membership event on the channel and on the user's channel.
    @inline(never) func manageAppContextMemberships(_ request: Request, _ wire: WireRequest) async throws -> Response {
        let target = try AppContextRequest(wire, keysets: state.keysets)
        guard let id = target.id else { throw RequestError(response: Reply.objectsError(.notFound, "Requested resource not found.")) }
        guard let body = try? await request.body.collect(upTo: AppContextBounds.bodyBytes) else {
            throw Refusal(response: Reply.objectsError(.contentTooLarge, "Request payload is too large."))
        }
        let bytes = Array(buffer: body)
        try authorizeAppContext(target.keyset, wire, kind: target.kind, id: id, permission: target.kind == .uuid ? .update : .manage, method: "PATCH", body: bytes)
        _ = try AppContextIncludes(wire, other: target.kind == .uuid ? "channel" : "uuid")
        _ = try AppContextListOptions(wire, sortable: Self.membershipSortable(target.kind))
        let (set, delete) = try Self.membershipChanges(bytes, kind: target.kind, id: id)
        let updated = AppContextTimestamp.format(state.appContextTime)
        let subscribeKey = target.keyset.subscribeKey
        let changes: (set: [AppContextMembership], deleted: [(uuid: String, channel: String)])
        do {
            changes = try await state.appContext.applyAppContextMemberships(
                subscribeKey: subscribeKey,
                set: set.map { AppContextMembership(uuid: $0.uuid, channel: $0.channel, fields: $0.fields, updated: updated, eTag: "") },
                delete: delete)
        } catch let exceeded as AppContextMembershipLimitExceeded {
            let what = exceeded.kind == "uuid" ? "memberships of user" : "members of channel"
            throw RequestError(response: Reply.objectsInvalid("More than \(exceeded.limit) \(what) \(String(reflecting: exceeded.id))",
                                                              location: "set", locationType: "body"))
        }
        for pair in changes.deleted {
            publishObjectEvent(subscribeKey: subscribeKey, channels: [pair.channel, pair.uuid], event: "delete", type: "membership",
                               data: .object(["channel": .object(["id": .string(pair.channel)]), "uuid": .object(["id": .string(pair.uuid)])]))
        }
        for m in changes.set {
            var data = m.fields.filter { !$0.value.isNull }
            data["channel"] = .object(["id": .string(m.channel)])
            data["uuid"] = .object(["id": .string(m.uuid)])
            data["updated"] = .string(m.updated)
            data["eTag"] = .string(m.eTag)
            publishObjectEvent(subscribeKey: subscribeKey, channels: [m.channel, m.uuid], event: "set", type: "membership", data: .object(data))
        }
        return try await membershipsPage(target, id: id, wire)
    }

    static func membershipSortable(_ kind: AppContextKind) -> Set<String> {
        let other = kind == .uuid ? "channel" : "uuid"
        return ["updated", "status", "type", "\(other).id", "\(other).name", "\(other).updated", "\(other).status", "\(other).type"]
    }

    private func membershipsPage(_ target: AppContextRequest, id: String, _ wire: WireRequest) async throws -> Response {
        let otherKind: AppContextKind = target.kind == .uuid ? .channel : .uuid
        let otherName = otherKind.rawValue
        let includes = try AppContextIncludes(wire, other: otherName)
        let options = try AppContextListOptions(wire, sortable: Self.membershipSortable(target.kind))
        let subscribeKey = target.keyset.subscribeKey
        let memberships = try await state.appContext.appContextMemberships(subscribeKey: subscribeKey, of: target.kind, id: id,
                                                                      limit: AppContextBounds.scan)
        func otherId(_ m: AppContextMembership) -> String { otherKind == .channel ? m.channel : m.uuid }
        // The other side's metadata is read for every membership when the filter or the order
        // needs it; for the page's only when only the response does.
        let matchesOnOther = options.filter != nil || !options.sort.isEmpty
        var others = matchesOnOther
            ? try await state.appContext.appContextObjects(subscribeKey: subscribeKey, kind: otherKind, ids: Set(memberships.map(otherId)))
            : [:]
        var byOther: [String: AppContextMembership] = [:]
        let views: [JSONValue] = memberships.map { m in
            byOther[otherId(m)] = m
            var view = m.fields
            var side = others[otherId(m)].map { Self.filterView($0).objectValue ?? [:] } ?? [:]
            side["id"] = .string(otherId(m))
            view[otherName] = .object(side)
            view["updated"] = .string(m.updated)
            return .object(view)
        }
        let page = options.page(views, tieBreak: [otherName, "id"])
        if includes.other, !matchesOnOther {
            let ids = Set(page.items.compactMap { $0[otherName]?["id"]?.stringValue })
            others = try await state.appContext.appContextObjects(subscribeKey: subscribeKey, kind: otherKind, ids: ids)
        }
        var w = JSONWriter(capacity: 256 + page.items.count * 256)
        w.raw("{\"status\":200,\"data\":[")
        for (i, item) in page.items.enumerated() {
            guard let key = item[otherName]?["id"]?.stringValue, let m = byOther[key] else { continue }
            if i > 0 { w.raw(",") }
            w.raw("{\"")
            w.raw(Array(otherName.utf8))
            w.raw("\":")
            if includes.other, let record = others[key] {
                var nested = AppContextIncludes()
                nested.custom = includes.otherCustom
                nested.status = includes.otherStatus
                nested.type = includes.otherType
                Self.writeObject(&w, record, kind: otherKind, includes: nested)
            } else {
                w.raw("{\"id\":")
                w.string(key)
                w.raw("}")
            }
            if includes.type {
                w.raw(",\"type\":")
                (m.fields["type"] ?? .null).write(to: &w)
            }
            if includes.status {
                w.raw(",\"status\":")
                (m.fields["status"] ?? .null).write(to: &w)
            }
            if includes.custom {
                w.raw(",\"custom\":")
                (m.fields["custom"] ?? .null).write(to: &w)
            }
            w.raw(",\"updated\":")
            w.string(m.updated)
            w.raw(",\"eTag\":")
            w.string(m.eTag)
            w.raw("}")
        }
        w.raw("]")
        Self.writePaging(&w, page, includes: includes)
        w.raw("}")
        return Reply.json(.ok, w.bytes)
    }

    // MARK: - Access

    /// Access Manager for the objects routes (docs/security.md): user metadata and memberships
    /// need the permission on the user (a v3 token's `uuids` resources or patterns; with v2 auth
    /// keys or no token, only the request's own uuid), channel metadata and members on the
    /// channel (`channels`). A list of all users or channels needs a signed request.
    func authorizeAppContext(_ keyset: Keyset, _ wire: WireRequest, kind: AppContextKind, id: String?, permission: Permissions,
                             method: String = "GET", body: [UInt8] = []) throws(RequestError) {
        guard keyset.secretKey != nil else { return }
        let verdict = state.access.verifySignature(keyset: keyset, method: method, rawPath: wire.rawPath, rawQuery: wire.rawQuery, body: body)
        switch verdict {
        case .valid: return
        case .invalid(let reason):
            throw RequestError(response: Reply.json(.forbidden, ErrorBody.service(status: 403, service: "Access Manager", message: reason)))
        case .absent: break
        }
        guard let id else { throw RequestError(response: Self.forbidden(channels: [], groups: [], message: "Forbidden")) }
        switch kind {
        case .channel:
            try authorize(keyset, wire, method: method, channels: [id], groups: [], permission: permission, body: body)
        case .uuid:
            if state.access.allowsUUID(id, permission: permission, keyset: keyset, auth: wire.query["auth"], requestUUID: wire.query["uuid"]) {
                return
            }
            throw RequestError(response: Self.forbidden(channels: [], groups: [], message: "Forbidden"))
        }
    }

    // MARK: - Events

    /// Publishes an objects event (`e: 2`) on each channel that is a valid channel name.
    func publishObjectEvent(subscribeKey: String, channels: [String], event: String, type: String, data: JSONValue) {
        var w = JSONWriter()
        w.raw("{\"source\":\"objects\",\"version\":\"2.0\",\"event\":")
        w.string(event)
        w.raw(",\"type\":")
        w.string(type)
        w.raw(",\"data\":")
        data.write(to: &w)
        w.raw("}")
        let payload = String(decoding: w.bytes, as: UTF8.self)
        var seen = Set<String>()
        for channel in channels where seen.insert(channel).inserted {
            guard (try? NameRules.validateChannel(channel)) != nil, !NameRules.isPresence(channel) else { continue }
            state.hub.publishEphemeral { tt in
                SubscribeEnvelope(timetoken: tt, subscribeKey: subscribeKey, channel: channel, payload: payload, kind: .object)
            }
        }
        state.metrics.recordPublish(kind: "objects")
    }

    // MARK: - Wire shapes

    /// A record as filters and sorts see it: its fields plus `id` and `updated`.
    static func filterView(_ record: AppContextRecord) -> JSONValue {
        var view = record.fields
        view["id"] = .string(record.id)
        view["updated"] = .string(record.updated)
        return .object(view)
    }

    /// A user (`id,name,externalId,profileUrl,email`) or channel (`id,name,description`), then
    /// `type`, `status`, `custom` as included, `updated`, `eTag` — PubNub's member order.
    static func writeObject(_ w: inout JSONWriter, _ record: AppContextRecord, kind: AppContextKind, includes: AppContextIncludes) {
        w.raw("{\"id\":")
        w.string(record.id)
        let names = kind == .uuid ? ["name", "externalId", "profileUrl", "email"] : ["name", "description"]
        for name in names {
            w.raw(",\"")
            w.raw(Array(name.utf8))
            w.raw("\":")
            (record.fields[name] ?? .null).write(to: &w)
        }
        if includes.type {
            w.raw(",\"type\":")
            (record.fields["type"] ?? .null).write(to: &w)
        }
        if includes.status {
            w.raw(",\"status\":")
            (record.fields["status"] ?? .null).write(to: &w)
        }
        if includes.custom {
            w.raw(",\"custom\":")
            (record.fields["custom"] ?? .null).write(to: &w)
        }
        w.raw(",\"updated\":")
        w.string(record.updated)
        w.raw(",\"eTag\":")
        w.string(record.eTag)
        w.raw("}")
    }

    /// `totalCount` (when asked), `next` (when the page is not empty), `prev` (when it is not
    /// the first).
    static func writePaging(_ w: inout JSONWriter, _ page: (items: [JSONValue], total: Int, offset: Int), includes: AppContextIncludes) {
        if includes.totalCount {
            w.raw(",\"totalCount\":")
            w.number(page.total)
        }
        if !page.items.isEmpty {
            w.raw(",\"next\":")
            w.string(AppContextCursor.encode(page.offset + page.items.count))
        }
        if page.offset > 0 {
            w.raw(",\"prev\":")
            w.string(AppContextCursor.encode(page.offset))
        }
    }

    // MARK: - Bodies

    /// The fields of a set body: strings or `null`, `status`/`type` up to 50 characters, `custom`
    /// an object of scalars (or `null`). Unknown members are ignored, as PubNub ignores them.
    static func objectPatch(_ bytes: [UInt8], kind: AppContextKind) throws(RequestError) -> [String: JSONValue] {
        func invalid(_ message: String, _ field: String) -> RequestError {
            RequestError(response: Reply.objectsInvalid(message, location: field, locationType: "body"))
        }
        guard case .object(let object)? = try? JSONValue(parsing: bytes) else { throw invalid("Request body must be a JSON object", "body") }
        var patch: [String: JSONValue] = [:]
        let names = kind == .uuid ? ["name", "email", "externalId", "profileUrl"] : ["name", "description"]
        for name in names + ["status", "type"] {
            guard let value = object[name] else { continue }
            switch value {
            case .null: patch[name] = .null
            case .string(let text):
                if name == "status" || name == "type" {
                    guard text.count <= AppContextBounds.statusCharacters else {
                        throw invalid("\(name) is longer than \(AppContextBounds.statusCharacters) characters", name)
                    }
                } else if text.utf8.count > AppContextBounds.fieldBytes {
                    throw invalid("\(name) is longer than \(AppContextBounds.fieldBytes) bytes", name)
                }
                patch[name] = value
            default: throw invalid("\(name) must be a string or null", name)
            }
        }
        if let custom = object["custom"] {
            patch["custom"] = try customValue(custom, field: "custom")
        }
        return patch
    }

    /// `custom`: `null`, or an object of at most 100 scalar members (strings up to 2 KiB,
    /// numbers, booleans) — PubNub refuses nested objects and arrays.
    static func customValue(_ value: JSONValue, field: String) throws(RequestError) -> JSONValue {
        func invalid(_ message: String) -> RequestError {
            RequestError(response: Reply.objectsInvalid(message, location: field, locationType: "body"))
        }
        switch value {
        case .null: return .null
        case .object(let members):
            guard members.count <= AppContextBounds.customMembers else {
                throw invalid("custom has more than \(AppContextBounds.customMembers) members")
            }
            for (key, member) in members {
                switch member {
                case .string(let text):
                    guard text.utf8.count <= AppContextBounds.customValueBytes else {
                        throw invalid("custom.\(key) is longer than \(AppContextBounds.customValueBytes) bytes")
                    }
                case .number, .bool: break
                default: throw invalid("custom.\(key) must be a string, a number or a boolean")
                }
            }
            return value
        default: throw invalid("custom must be an object")
        }
    }

    /// The `set` and `delete` arrays of a memberships / members PATCH.
    static func membershipChanges(_ bytes: [UInt8], kind: AppContextKind, id: String) throws(RequestError)
        -> (set: [(uuid: String, channel: String, fields: [String: JSONValue])], delete: [(uuid: String, channel: String)])
    {
        func invalid(_ message: String, _ field: String) -> RequestError {
            RequestError(response: Reply.objectsInvalid(message, location: field, locationType: "body"))
        }
        guard case .object(let object)? = try? JSONValue(parsing: bytes) else { throw invalid("Request body must be a JSON object", "body") }
        let otherName = kind == .uuid ? "channel" : "uuid"
        let otherKind: AppContextKind = kind == .uuid ? .channel : .uuid
        func items(_ name: String) throws(RequestError) -> [(String, [String: JSONValue])] {
            guard let value = object[name], !value.isNull else { return [] }
            guard case .array(let array) = value else { throw invalid("\(name) must be an array", name) }
            guard array.count <= AppContextBounds.membershipChanges else {
                throw invalid("\(name) has more than \(AppContextBounds.membershipChanges) items", name)
            }
            var result: [(String, [String: JSONValue])] = []
            for (i, item) in array.enumerated() {
                guard case .object(let members) = item, let other = members[otherName]?["id"]?.stringValue else {
                    throw invalid("\(name)[\(i)].\(otherName).id is required", "\(name)[\(i)]")
                }
                try AppContextRequest.validate(other, otherKind, location: "\(name)[\(i)].\(otherName).id", locationType: "body")
                var fields: [String: JSONValue] = [:]
                if let custom = members["custom"] { fields["custom"] = try customValue(custom, field: "\(name)[\(i)].custom") }
                for key in ["status", "type"] {
                    guard let value = members[key], !value.isNull else { continue }
                    guard case .string(let text) = value, text.count <= AppContextBounds.statusCharacters else {
                        throw invalid("\(key) must be a string of up to \(AppContextBounds.statusCharacters) characters", "\(name)[\(i)].\(key)")
                    }
                    fields[key] = value
                }
                result.append((other, fields))
            }
            return result
        }
        let set = try items("set").map { other, fields in
            kind == .uuid ? (uuid: id, channel: other, fields: fields) : (uuid: other, channel: id, fields: fields)
        }
        let delete = try items("delete").map { other, _ in kind == .uuid ? (uuid: id, channel: other) : (uuid: other, channel: id) }
        return (set, delete)
    }
}
