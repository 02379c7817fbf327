public import TetherProtocol

/// A user's App Context metadata (PubNub's "UUID metadata"; docs/sdk-guide.md, "App Context").
/// When setting, a `nil` field is left as stored; to clear one, set it to an empty value.
public struct UserMetadata: Sendable, Hashable {
    /// The user id.
    public var id: String
    /// Display name.
    public var name: String?
    /// Email address.
    public var email: String?
    /// An identifier in another system.
    public var externalId: String?
    /// A profile picture's URL.
    public var profileUrl: String?
    /// A status of the app's choosing (`"active"`…), up to 50 characters.
    public var status: String?
    /// A type of the app's choosing (`"admin"`…), up to 50 characters.
    public var type: String?
    /// Custom scalar fields (strings, numbers, booleans), at most 100.
    public var custom: [String: JSONValue]?
    /// When it was last set (ISO 8601), from the server.
    public var updated: String?
    /// Its version tag, from the server (pass it as `ifMatchesETag` to update only that version).
    public var eTag: String?

    /// Creates user metadata.
    public init(id: String, name: String? = nil, email: String? = nil, externalId: String? = nil, profileUrl: String? = nil,
                status: String? = nil, type: String? = nil, custom: [String: JSONValue]? = nil, updated: String? = nil,
                eTag: String? = nil) {
        self.id = id
        self.name = name
        self.email = email
        self.externalId = externalId
        self.profileUrl = profileUrl
        self.status = status
        self.type = type
        self.custom = custom
        self.updated = updated
        self.eTag = eTag
    }
}

/// A channel's App Context metadata. When setting, a `nil` field is left as stored.
public struct ChannelMetadata: Sendable, Hashable {
    /// The channel name.
    public var id: String
    /// Display name.
    public var name: String?
    /// Description.
    public var description: String?
    /// A status of the app's choosing, up to 50 characters.
    public var status: String?
    /// A type of the app's choosing, up to 50 characters.
    public var type: String?
    /// Custom scalar fields (strings, numbers, booleans), at most 100.
    public var custom: [String: JSONValue]?
    /// When it was last set (ISO 8601), from the server.
    public var updated: String?
    /// Its version tag, from the server.
    public var eTag: String?

    /// Creates channel metadata.
    public init(id: String, name: String? = nil, description: String? = nil, status: String? = nil, type: String? = nil,
                custom: [String: JSONValue]? = nil, updated: String? = nil, eTag: String? = nil) {
        self.id = id
        self.name = name
        self.description = description
        self.status = status
        self.type = type
        self.custom = custom
        self.updated = updated
        self.eTag = eTag
    }
}

/// A user's membership of a channel. In a user's memberships ``channel`` carries the channel's
/// metadata (when it has any); in a channel's members ``user`` carries the user's.
public struct Membership: Sendable, Hashable {
    /// The user.
    public var user: UserMetadata
    /// The channel.
    public var channel: ChannelMetadata
    /// The membership's own custom fields.
    public var custom: [String: JSONValue]?
    /// The membership's status.
    public var status: String?
    /// The membership's type.
    public var type: String?
    /// When it was last set.
    public var updated: String?
    /// Its version tag.
    public var eTag: String?

    /// Creates a membership.
    public init(user: UserMetadata, channel: ChannelMetadata, custom: [String: JSONValue]? = nil, status: String? = nil,
                type: String? = nil, updated: String? = nil, eTag: String? = nil) {
        self.user = user
        self.channel = channel
        self.custom = custom
        self.status = status
        self.type = type
        self.updated = updated
        self.eTag = eTag
    }
}

/// One membership to set: the other side's id (a channel for a user's memberships, a user for
/// a channel's members) and the membership's own fields.
public struct MembershipUpdate: Sendable, Hashable {
    /// The channel (for memberships) or user id (for members).
    public var id: String
    /// Custom scalar fields.
    public var custom: [String: JSONValue]?
    /// Status, up to 50 characters.
    public var status: String?
    /// Type, up to 50 characters.
    public var type: String?

    /// Creates an update.
    public init(_ id: String, custom: [String: JSONValue]? = nil, status: String? = nil, type: String? = nil) {
        self.id = id
        self.custom = custom
        self.status = status
        self.type = type
    }
}

/// A page cursor of the App Context lists.
public enum PageCursor: Sendable, Hashable {
    /// The page after the one that returned it.
    case next(String)
    /// The page before.
    case previous(String)
}

/// One page of an App Context list.
public struct AppContextPage<Item: Sendable & Hashable>: Sendable, Hashable {
    /// The items.
    public var items: [Item]
    /// How many match in all.
    public var totalCount: Int?
    /// The next page (present while the page is not empty; an empty page ends the list).
    public var next: PageCursor?
    /// The previous page (absent on the first).
    public var previous: PageCursor?

    /// Creates a page.
    public init(items: [Item], totalCount: Int? = nil, next: PageCursor? = nil, previous: PageCursor? = nil) {
        self.items = items
        self.totalCount = totalCount
        self.next = next
        self.previous = previous
    }
}

/// An App Context change received by a subscription (an event of kind ``EventKind/object``):
/// user metadata on the channel named by the user id, channel metadata and memberships on the
/// channel (memberships also on the user's channel).
public struct AppContextEvent: Sendable, Hashable {
    /// Set or deleted.
    public enum Change: String, Sendable, Hashable {
        /// Created or updated.
        case set
        /// Removed.
        case delete
    }

    /// What changed.
    public enum Entity: Sendable, Hashable {
        /// A user's metadata (on delete, only the id).
        case user(UserMetadata)
        /// A channel's metadata (on delete, only the id).
        case channel(ChannelMetadata)
        /// A membership.
        case membership(Membership)
    }

    /// Set or delete.
    public var change: Change
    /// The object.
    public var entity: Entity
    /// The channel the event arrived on.
    public var channel: String
    /// The event's timetoken.
    public var timetoken: Timetoken
}

extension ReceivedEvent {
    /// The App Context change this event carries, when it is one (``kind`` is
    /// ``EventKind/object`` and the payload has PubNub's shape).
    public var appContextEvent: AppContextEvent? {
        guard kind == .object, payload["source"]?.stringValue == "objects",
              let change = payload["event"]?.stringValue.flatMap(AppContextEvent.Change.init(rawValue:)),
              let data = payload["data"], let type = payload["type"]?.stringValue
        else { return nil }
        let entity: AppContextEvent.Entity
        switch type {
        case "uuid":
            guard let user = ResponseDecoding.userMetadata(data) else { return nil }
            entity = .user(user)
        case "channel":
            guard let channel = ResponseDecoding.channelMetadata(data) else { return nil }
            entity = .channel(channel)
        case "membership":
            guard let membership = ResponseDecoding.membership(data) else { return nil }
            entity = .membership(membership)
        default: return nil
        }
        return AppContextEvent(change: change, entity: entity, channel: channel, timetoken: timetoken)
    }
}

extension Endpoints {
    private var objectsBase: String { "/v2/objects/\(PercentCoding.encode(context.subscribeKey))" }
    static let objectIncludes = "custom,status,type,totalCount"

    private func appContextSpec(_ operation: TetherOperation, _ method: HTTPVerb, _ path: String, body: [UInt8]? = nil,
                                timeout: Duration?) -> RequestSpec {
        var spec = RequestSpec(operation: operation, method: method, path: path, body: body, timeout: timeout)
        spec.append("uuid", context.userId)
        spec.append("pnsdk", context.sdkName)
        spec.carriesAuth = true
        if let key = context.authKey, !key.isEmpty { spec.append("auth", key) }
        return spec
    }

    private func objectPath(_ kind: String, _ id: String) -> String { "\(objectsBase)/\(kind)/\(PercentCoding.encode(id))" }

    private static func list(_ spec: inout RequestSpec, filter: String?, sort: [String], limit: Int, page: PageCursor?)
        throws(RequestBuildError)
    {
        guard (1...100).contains(limit) else { throw .invalidArgument("limit must be 1–100") }
        spec.append("limit", String(limit))
        if let filter, !filter.isEmpty { spec.append("filter", filter) }
        if !sort.isEmpty { spec.append("sort", sort.joined(separator: ",")) }
        switch page {
        case .next(let cursor)?: spec.append("start", cursor)
        case .previous(let cursor)?: spec.append("end", cursor)
        case nil: break
        }
    }

    /// `GET /v2/objects/{sub}/uuids/{id}` or `…/channels/{id}` with everything included.
    package func fetchAppContextObject(user: Bool, id: String, timeout: Duration? = nil) throws(RequestBuildError) -> RequestSpec {
        try Self.checkObject(user: user, id)
        var spec = appContextSpec(user ? .fetchUserMetadata : .fetchChannelMetadata, .get, objectPath(user ? "uuids" : "channels", id),
                                  timeout: timeout)
        spec.append("include", "custom,status,type")
        return spec
    }

    /// `PATCH /v2/objects/{sub}/uuids/{id}` with the user's non-nil fields.
    package func setUserMetadata(_ user: UserMetadata, ifMatchesETag: String?, timeout: Duration? = nil) throws(RequestBuildError)
        -> RequestSpec
    {
        try Self.checkObject(user: true, user.id)
        var fields: [String: JSONValue] = [:]
        for (name, value) in [("name", user.name), ("email", user.email), ("externalId", user.externalId),
                              ("profileUrl", user.profileUrl), ("status", user.status), ("type", user.type)] {
            if let value { fields[name] = .string(value) }
        }
        if let custom = user.custom { fields["custom"] = .object(custom) }
        var spec = appContextSpec(.setUserMetadata, .patch, objectPath("uuids", user.id), body: JSONValue.object(fields).jsonBytes,
                                  timeout: timeout)
        spec.append("include", "custom,status,type")
        if let ifMatchesETag { spec.headers["If-Match"] = ifMatchesETag }
        return spec
    }

    /// `PATCH /v2/objects/{sub}/channels/{id}` with the channel's non-nil fields.
    package func setChannelMetadata(_ channel: ChannelMetadata, ifMatchesETag: String?, timeout: Duration? = nil)
        throws(RequestBuildError) -> RequestSpec
    {
        try Self.checkObject(user: false, channel.id)
        var fields: [String: JSONValue] = [:]
        for (name, value) in [("name", channel.name), ("description", channel.description), ("status", channel.status),
                              ("type", channel.type)] {
            if let value { fields[name] = .string(value) }
        }
        if let custom = channel.custom { fields["custom"] = .object(custom) }
        var spec = appContextSpec(.setChannelMetadata, .patch, objectPath("channels", channel.id), body: JSONValue.object(fields).jsonBytes,
                                  timeout: timeout)
        spec.append("include", "custom,status,type")
        if let ifMatchesETag { spec.headers["If-Match"] = ifMatchesETag }
        return spec
    }

    /// `DELETE /v2/objects/{sub}/uuids/{id}` or `…/channels/{id}`.
    package func removeAppContextObject(user: Bool, id: String, timeout: Duration? = nil) throws(RequestBuildError) -> RequestSpec {
        try Self.checkObject(user: user, id)
        return appContextSpec(user ? .removeUserMetadata : .removeChannelMetadata, .delete, objectPath(user ? "uuids" : "channels", id),
                              timeout: timeout)
    }

    /// `GET /v2/objects/{sub}/uuids` or `…/channels` with filter, sort, limit and page.
    package func fetchAllAppContextObjects(user: Bool, filter: String?, sort: [String], limit: Int, page: PageCursor?,
                                           timeout: Duration? = nil) throws(RequestBuildError) -> RequestSpec
    {
        var spec = appContextSpec(user ? .fetchAllUserMetadata : .fetchAllChannelMetadata, .get,
                                  "\(objectsBase)/\(user ? "uuids" : "channels")", timeout: timeout)
        spec.append("include", Self.objectIncludes)
        try Self.list(&spec, filter: filter, sort: sort, limit: limit, page: page)
        return spec
    }

    /// `GET` (or, with `set`/`delete`, `PATCH`) `/v2/objects/{sub}/uuids/{id}/channels` — a
    /// user's memberships — or `/v2/objects/{sub}/channels/{id}/uuids` — a channel's members.
    package func appContextMemberships(ofUser: Bool, id: String, set: [MembershipUpdate]? = nil, delete: [String]? = nil,
                                       filter: String? = nil, sort: [String] = [], limit: Int = 100, page: PageCursor? = nil,
                                       timeout: Duration? = nil) throws(RequestBuildError) -> RequestSpec
    {
        try Self.checkObject(user: ofUser, id)
        let other = ofUser ? "channel" : "uuid"
        for update in set ?? [] { try Self.checkObject(user: !ofUser, update.id) }
        for otherId in delete ?? [] { try Self.checkObject(user: !ofUser, otherId) }
        var body: [UInt8]?
        if set != nil || delete != nil {
            let setItems: [JSONValue] = (set ?? []).map { update in
                var item: [String: JSONValue] = [other: .object(["id": .string(update.id)])]
                if let custom = update.custom { item["custom"] = .object(custom) }
                if let status = update.status { item["status"] = .string(status) }
                if let type = update.type { item["type"] = .string(type) }
                return .object(item)
            }
            let deleteItems: [JSONValue] = (delete ?? []).map { .object([other: .object(["id": .string($0)])]) }
            body = JSONValue.object(["set": .array(setItems), "delete": .array(deleteItems)]).jsonBytes
        }
        let operation: TetherOperation = body == nil ? (ofUser ? .fetchMemberships : .fetchChannelMembers)
                                                     : (ofUser ? .setMemberships : .setChannelMembers)
        var spec = appContextSpec(operation, body == nil ? .get : .patch, objectPath(ofUser ? "uuids" : "channels", id) + "/\(other)s",
                                  body: body, timeout: timeout)
        spec.append("include", "\(Self.objectIncludes),\(other),\(other).custom,\(other).status,\(other).type")
        try Self.list(&spec, filter: filter, sort: sort, limit: limit, page: page)
        return spec
    }

    static func checkObject(user: Bool, _ id: String) throws(RequestBuildError) {
        if user {
            do { try NameRules.validateUserId(id) } catch { throw .invalidName(id, "\(error)") }
        } else {
            try check(channel: id)
        }
    }
}

extension ResponseDecoding {
    static func custom(_ value: JSONValue?) -> [String: JSONValue]? { value?.objectValue }

    /// A user object (`{"id","name",…}`); `nil` without an id.
    package static func userMetadata(_ value: JSONValue) -> UserMetadata? {
        guard let id = value["id"]?.stringValue else { return nil }
        return UserMetadata(id: id, name: value["name"]?.stringValue, email: value["email"]?.stringValue,
                            externalId: value["externalId"]?.stringValue, profileUrl: value["profileUrl"]?.stringValue,
                            status: value["status"]?.stringValue, type: value["type"]?.stringValue, custom: custom(value["custom"]),
                            updated: value["updated"]?.stringValue, eTag: value["eTag"]?.stringValue)
    }

    /// A channel object; `nil` without an id.
    package static func channelMetadata(_ value: JSONValue) -> ChannelMetadata? {
        guard let id = value["id"]?.stringValue else { return nil }
        return ChannelMetadata(id: id, name: value["name"]?.stringValue, description: value["description"]?.stringValue,
                               status: value["status"]?.stringValue, type: value["type"]?.stringValue, custom: custom(value["custom"]),
                               updated: value["updated"]?.stringValue, eTag: value["eTag"]?.stringValue)
    }

    /// A membership (`{"channel":{…}}` or `{"uuid":{…}}`, or both in an event).
    package static func membership(_ value: JSONValue, userId: String? = nil, channelId: String? = nil) -> Membership? {
        let user = value["uuid"].flatMap(userMetadata) ?? userId.map { UserMetadata(id: $0) }
        let channel = value["channel"].flatMap(channelMetadata) ?? channelId.map { ChannelMetadata(id: $0) }
        guard let user, let channel else { return nil }
        return Membership(user: user, channel: channel, custom: custom(value["custom"]), status: value["status"]?.stringValue,
                          type: value["type"]?.stringValue, updated: value["updated"]?.stringValue, eTag: value["eTag"]?.stringValue)
    }

    package static func user(_ body: JSONValue) throws(DecodingFailure) -> UserMetadata {
        guard let data = body["data"], let user = userMetadata(data) else { throw DecodingFailure("user metadata: expected data") }
        return user
    }

    package static func channel(_ body: JSONValue) throws(DecodingFailure) -> ChannelMetadata {
        guard let data = body["data"], let channel = channelMetadata(data) else { throw DecodingFailure("channel metadata: expected data") }
        return channel
    }

    package static func page<Item: Sendable & Hashable>(_ body: JSONValue, _ item: (JSONValue) -> Item?) throws(DecodingFailure) -> AppContextPage<Item> {
        guard let data = body["data"]?.arrayValue else { throw DecodingFailure("App Context list: expected a data list") }
        var items: [Item] = []
        for value in data {
            guard let decoded = item(value) else { throw DecodingFailure("App Context list: an item without an id") }
            items.append(decoded)
        }
        return AppContextPage(items: items, totalCount: body["totalCount"]?.numberValue?.exactInteger.map { Int($0) },
                              next: body["next"]?.stringValue.map(PageCursor.next),
                              previous: body["prev"]?.stringValue.map(PageCursor.previous))
    }
}
