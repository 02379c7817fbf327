package import TetherProtocol

/// Builds the request for every REST API of pubnub-wire §4–§16, purely.
///
/// Each builder adds `uuid`, `pnsdk` and (where the wire expects it) `auth`; signing is applied
/// afterwards by the client when a secret key is configured.
package struct Endpoints: Sendable {
    /// Keys and identity.
    package var context: RequestContext

    /// Creates a builder.
    package init(context: RequestContext) { self.context = context }

    private var sub: String { PercentCoding.encode(context.subscribeKey) }

    /// Comma-joined list, each name encoded, `,` for an empty list (pubnub-wire §1.2).
    package static func list(_ names: [String]) -> String {
        names.isEmpty ? "," : names.map { PercentCoding.encode($0) }.joined(separator: ",")
    }

    private func common(_ spec: inout RequestSpec, auth: Bool = true) {
        spec.append("uuid", context.userId)
        spec.append("pnsdk", context.sdkName)
        spec.carriesAuth = auth
        if auth, let key = context.authKey, !key.isEmpty { spec.append("auth", key) }
    }

    private func make(_ operation: TetherOperation, _ path: String, _ query: [QueryItem] = [], timeout: Duration? = nil,
                      auth: Bool = true) -> RequestSpec {
        make(operation, .get, path, query, timeout: timeout, auth: auth)
    }

    private func make(_ operation: TetherOperation, _ method: HTTPVerb, _ path: String, _ query: [QueryItem] = [],
                      body: [UInt8]? = nil, timeout: Duration? = nil, auth: Bool = true) -> RequestSpec {
        var spec = RequestSpec(operation: operation, method: method, path: path, query: query, body: body, timeout: timeout)
        common(&spec, auth: auth)
        return spec
    }

    /// `GET /time/0`.
    package func time(timeout: Duration? = nil) -> RequestSpec {
        make(.time, "/time/0", timeout: timeout, auth: false)
    }

    /// Publish (or fire when `fire` is true): `message` is the JSON text to send (already encrypted
    /// when a cryptor is configured). `requestID` (the outbox's, made once per message) is sent as
    /// `requestid`, so the server can answer a repeat with the original timetoken; without one,
    /// ``PublishOptions/requestId`` is sent when set.
    package func publish(channel: String, messageJSON: String, options: PublishOptions, fire: Bool = false,
                         requestID: String? = nil) throws(RequestBuildError) -> RequestSpec
    {
        guard let pub = context.publishKey, !pub.isEmpty else { throw .missingPublishKey }
        try Self.check(channel: channel)
        var query: [QueryItem] = []
        if fire {
            query += [QueryItem("store", "0"), QueryItem("norep", "1")]
        } else {
            if let store = options.store { query.append(QueryItem("store", store ? "1" : "0")) }
            if let ttl = options.ttl { query.append(QueryItem("ttl", String(ttl))) }
            if !options.replicate { query.append(QueryItem("norep", "true")) }
        }
        if let meta = options.meta {
            guard case .object = meta else { throw .invalidArgument("meta must be a JSON object") }
            let text = meta.jsonText
            // As deep as a server keeps (Tether refuses deeper with a 400 every time).
            guard (try? JSONText.validate(Array(text.utf8), maximumDepth: JSONText.maximumValueDepth)) != nil else {
                throw .invalidArgument("meta must be nested at most \(JSONText.maximumValueDepth) levels deep")
            }
            query.append(QueryItem("meta", text))
        }
        if let cmt = options.customMessageType { query.append(QueryItem("custom_message_type", cmt)) }
        if let id = requestID ?? options.requestId {
            if let problem = PublishOptions.requestIdProblem(id) { throw .invalidArgument(problem) }
            query.append(QueryItem("requestid", id))
        }
        let base = "/publish/\(PercentCoding.encode(pub))/\(sub)/0/\(PercentCoding.encode(channel))/0"
        if options.usePOST {
            return make(fire ? .fire : .publish, .post, base, query, body: Array(messageJSON.utf8), timeout: options.timeout)
        }
        return make(fire ? .fire : .publish, .get, base + "/" + PercentCoding.encode(messageJSON), query, timeout: options.timeout)
    }

    /// `GET /signal/{pub}/{sub}/0/{ch}/0/{message}`, with `requestid` when given.
    package func signal(channel: String, messageJSON: String, customMessageType: String? = nil, timeout: Duration? = nil,
                        requestID: String? = nil) throws(RequestBuildError) -> RequestSpec
    {
        guard let pub = context.publishKey, !pub.isEmpty else { throw .missingPublishKey }
        try Self.check(channel: channel)
        var query: [QueryItem] = []
        if let customMessageType { query.append(QueryItem("custom_message_type", customMessageType)) }
        if let requestID {
            if let problem = PublishOptions.requestIdProblem(requestID) { throw .invalidArgument(problem) }
            query.append(QueryItem("requestid", requestID))
        }
        return make(.signal, "/signal/\(PercentCoding.encode(pub))/\(sub)/0/\(PercentCoding.encode(channel))/0/\(PercentCoding.encode(messageJSON))",
                    query, timeout: timeout)
    }

    /// History v2 for one channel; always asks for timetokens as strings with each item.
    package func history(channel: String, options: HistoryOptions) throws(RequestBuildError) -> RequestSpec {
        try Self.check(channel: channel)
        guard (1...100).contains(options.count) else { throw .invalidArgument("count must be 1–100") }
        var query = [QueryItem("count", String(options.count)), QueryItem("include_token", "true"),
                     QueryItem("string_message_token", "true")]
        if let start = options.start { query.append(QueryItem("start", start.description)) }
        if let end = options.end { query.append(QueryItem("end", end.description)) }
        if options.reverse { query.append(QueryItem("reverse", "true")) }
        if options.includeMeta { query.append(QueryItem("include_meta", "true")) }
        return make(.history, "/v2/history/sub-key/\(sub)/channel/\(PercentCoding.encode(channel))", query, timeout: options.timeout)
    }

    /// Fetch messages v3 for one or more channels.
    package func fetch(channels: [String], options: FetchOptions) throws(RequestBuildError) -> RequestSpec {
        guard !channels.isEmpty else { throw .invalidArgument("at least one channel is required") }
        for channel in channels { try Self.check(channel: channel) }
        if options.includeActions, channels.count != 1 {
            throw .invalidArgument("fetching with actions takes exactly one channel")
        }
        let ceiling = channels.count == 1 && !options.includeActions ? 100 : 25
        let max = min(options.maximumPerChannel ?? ceiling, ceiling)
        guard max >= 1 else { throw .invalidArgument("maximumPerChannel must be at least 1") }
        var query = [QueryItem("max", String(max))]
        if let start = options.start { query.append(QueryItem("start", start.description)) }
        if let end = options.end { query.append(QueryItem("end", end.description)) }
        query.append(QueryItem("include_meta", options.includeMeta ? "true" : "false"))
        query.append(QueryItem("include_uuid", options.includePublisher ? "true" : "false"))
        if options.includeMessageType {
            query.append(QueryItem("include_message_type", "true"))
            query.append(QueryItem("include_custom_message_type", "true"))
        }
        let family = options.includeActions ? "history-with-actions" : "history"
        return make(.fetchMessages, "/v3/\(family)/sub-key/\(sub)/channel/\(Self.list(channels))", query, timeout: options.timeout)
    }

    /// Message counts since one timetoken (all channels) or one per channel.
    package func messageCounts(_ pairs: [(channel: String, after: Timetoken)], timeout: Duration? = nil) throws(RequestBuildError) -> RequestSpec {
        guard !pairs.isEmpty else { throw .invalidArgument("at least one channel is required") }
        for pair in pairs { try Self.check(channel: pair.channel) }
        let names = pairs.map(\.channel)
        let query: [QueryItem]
        if Set(pairs.map(\.after)).count == 1 {
            query = [QueryItem("timetoken", pairs[0].after.description)]
        } else {
            query = [QueryItem("channelsTimetoken", pairs.map(\.after.description).joined(separator: ","))]
        }
        return make(.messageCounts, "/v3/history/sub-key/\(sub)/message-counts/\(Self.list(names))", query, timeout: timeout)
    }

    /// `DELETE /v3/history/sub-key/{sub}/channel/{ch}` (`start` exclusive, `end` inclusive).
    package func deleteMessages(channel: String, start: Timetoken?, end: Timetoken?, timeout: Duration? = nil) throws(RequestBuildError)
        -> RequestSpec
    {
        try Self.check(channel: channel)
        var query: [QueryItem] = []
        if let start { query.append(QueryItem("start", start.description)) }
        if let end { query.append(QueryItem("end", end.description)) }
        return make(.deleteMessages, .delete, "/v3/history/sub-key/\(sub)/channel/\(PercentCoding.encode(channel))", query, timeout: timeout)
    }

    /// Here-now for channels and/or groups, or global when both are empty.
    package func hereNow(channels: [String], groups: [String], options: HereNowOptions) throws(RequestBuildError) -> RequestSpec {
        for channel in channels { try Self.check(channel: channel) }
        for group in groups { try Self.check(group: group) }
        var query = [QueryItem("state", options.includeState ? "1" : "0"), QueryItem("disable_uuids", options.includeUserIds ? "0" : "1")]
        if !groups.isEmpty { query.append(QueryItem("channel-group", groups.map { $0 }.joined(separator: ","))) }
        let path = channels.isEmpty && groups.isEmpty
            ? "/v2/presence/sub-key/\(sub)"
            : "/v2/presence/sub-key/\(sub)/channel/\(Self.list(channels))"
        return make(.hereNow, path, query, timeout: options.timeout)
    }

    /// Where-now for a user id.
    package func whereNow(userId: String, timeout: Duration? = nil) throws(RequestBuildError) -> RequestSpec {
        guard !userId.isEmpty else { throw .invalidArgument("user id is empty") }
        return make(.whereNow, "/v2/presence/sub-key/\(sub)/uuid/\(PercentCoding.encode(userId))", timeout: timeout)
    }

    /// Presence heartbeat announcing this user on channels and groups for `presenceTimeout` seconds.
    package func heartbeat(channels: [String], groups: [String], presenceTimeout: Int, state: JSONValue? = nil,
                          timeout: Duration? = nil) throws(RequestBuildError) -> RequestSpec {
        guard !channels.isEmpty || !groups.isEmpty else { throw .invalidArgument("at least one channel or group is required") }
        for group in groups { try Self.check(group: group) }
        var query = [QueryItem("heartbeat", String(presenceTimeout))]
        if !groups.isEmpty { query.append(QueryItem("channel-group", groups.joined(separator: ","))) }
        if let state { query.append(QueryItem("state", state.jsonText)) }
        return make(.heartbeat, "/v2/presence/sub-key/\(sub)/channel/\(Self.list(channels))/heartbeat", query, timeout: timeout)
    }

    /// Presence leave.
    package func leave(channels: [String], groups: [String], timeout: Duration? = nil) throws(RequestBuildError) -> RequestSpec {
        guard !channels.isEmpty || !groups.isEmpty else { throw .invalidArgument("at least one channel or group is required") }
        for group in groups { try Self.check(group: group) }
        var query: [QueryItem] = []
        if !groups.isEmpty { query.append(QueryItem("channel-group", groups.joined(separator: ","))) }
        return make(.leave, "/v2/presence/sub-key/\(sub)/channel/\(Self.list(channels))/leave", query, timeout: timeout)
    }

    /// Sets this user's presence state on channels and groups.
    package func setState(_ state: [String: JSONValue], channels: [String], groups: [String], timeout: Duration? = nil)
        throws(RequestBuildError) -> RequestSpec
    {
        guard !channels.isEmpty || !groups.isEmpty else { throw .invalidArgument("at least one channel or group is required") }
        for group in groups { try Self.check(group: group) }
        var query = [QueryItem("state", JSONValue.object(state).jsonText)]
        if !groups.isEmpty { query.append(QueryItem("channel-group", groups.joined(separator: ","))) }
        return make(.setState, "/v2/presence/sub-key/\(sub)/channel/\(Self.list(channels))/uuid/\(PercentCoding.encode(context.userId))/data",
                    query, timeout: timeout)
    }

    /// Gets a user's presence state on channels and groups.
    package func getState(userId: String, channels: [String], groups: [String], timeout: Duration? = nil) throws(RequestBuildError)
        -> RequestSpec
    {
        guard !channels.isEmpty || !groups.isEmpty else { throw .invalidArgument("at least one channel or group is required") }
        for group in groups { try Self.check(group: group) }
        var query: [QueryItem] = []
        if !groups.isEmpty { query.append(QueryItem("channel-group", groups.joined(separator: ","))) }
        return make(.getState, "/v2/presence/sub-key/\(sub)/channel/\(Self.list(channels))/uuid/\(PercentCoding.encode(userId))",
                    query, timeout: timeout)
    }

    /// Adds channels to a group.
    package func addChannels(_ channels: [String], toGroup group: String, timeout: Duration? = nil) throws(RequestBuildError) -> RequestSpec {
        try Self.check(group: group)
        guard !channels.isEmpty else { throw .invalidArgument("at least one channel is required") }
        for channel in channels { try Self.check(channel: channel) }
        return make(.addChannelsToGroup, groupPath(group), [QueryItem("add", channels.joined(separator: ","))], timeout: timeout)
    }

    /// Removes channels from a group.
    package func removeChannels(_ channels: [String], fromGroup group: String, timeout: Duration? = nil) throws(RequestBuildError)
        -> RequestSpec
    {
        try Self.check(group: group)
        guard !channels.isEmpty else { throw .invalidArgument("at least one channel is required") }
        for channel in channels { try Self.check(channel: channel) }
        return make(.removeChannelsFromGroup, groupPath(group), [QueryItem("remove", channels.joined(separator: ","))], timeout: timeout)
    }

    /// Lists the channels of a group.
    package func listChannels(inGroup group: String, timeout: Duration? = nil) throws(RequestBuildError) -> RequestSpec {
        try Self.check(group: group)
        return make(.listChannelsInGroup, groupPath(group), timeout: timeout)
    }

    /// Deletes a group.
    package func deleteGroup(_ group: String, timeout: Duration? = nil) throws(RequestBuildError) -> RequestSpec {
        try Self.check(group: group)
        return make(.deleteGroup, groupPath(group) + "/remove", timeout: timeout)
    }

    /// Lists every channel group of the keyset.
    package func listGroups(timeout: Duration? = nil) -> RequestSpec {
        make(.listGroups, "/v1/channel-registration/sub-key/\(sub)/channel-group", timeout: timeout)
    }

    private func groupPath(_ group: String) -> String {
        "/v1/channel-registration/sub-key/\(sub)/channel-group/\(PercentCoding.encode(group))"
    }

    /// `GET /v2/auth/grant/sub-key/{sub}` (requires the secret key; the client signs it).
    package func grant(_ grant: AuthKeyGrant, timeout: Duration? = nil) throws(RequestBuildError) -> RequestSpec {
        guard (0...525_600).contains(grant.ttlMinutes) else { throw .invalidArgument("ttl must be 0–525600 minutes") }
        // Joined with commas, which the server splits on: a name holding one would grant on others.
        for channel in grant.channels {
            do { try NameRules.validateSubscribeChannel(channel) } catch { throw .invalidName(channel, error.description) }
        }
        for group in grant.groups { try Self.check(group: group) }
        for key in grant.authKeys where key.isEmpty || key.contains(",") {
            throw .invalidArgument("an auth key may not be empty or hold a comma: \(String(reflecting: key))")
        }
        var query: [QueryItem] = []
        if !grant.authKeys.isEmpty { query.append(QueryItem("auth", grant.authKeys.joined(separator: ","))) }
        if !grant.channels.isEmpty { query.append(QueryItem("channel", grant.channels.joined(separator: ","))) }
        if !grant.groups.isEmpty { query.append(QueryItem("channel-group", grant.groups.joined(separator: ","))) }
        query.append(QueryItem("r", grant.read ? "1" : "0"))
        query.append(QueryItem("w", grant.write ? "1" : "0"))
        query.append(QueryItem("m", grant.manage ? "1" : "0"))
        query.append(QueryItem("d", grant.delete ? "1" : "0"))
        query.append(QueryItem("ttl", String(grant.ttlMinutes)))
        return make(.grant, "/v2/auth/grant/sub-key/\(sub)", query, timeout: timeout, auth: false)
    }

    /// `POST /v3/pam/{sub}/grant` (requires the secret key; the client signs it).
    package func grantToken(_ grant: TokenGrant, timeout: Duration? = nil) throws(RequestBuildError) -> RequestSpec {
        guard (1...43200).contains(grant.ttlMinutes) else { throw .invalidArgument("ttl must be 1–43200 minutes") }
        return make(.grantToken, .post, "/v3/pam/\(sub)/grant", body: grant.body.jsonBytes, timeout: timeout, auth: false)
    }

    /// `DELETE /v3/pam/{sub}/grant/{token}`.
    package func revokeToken(_ token: String, timeout: Duration? = nil) throws(RequestBuildError) -> RequestSpec {
        guard !token.isEmpty else { throw .invalidArgument("token is empty") }
        return make(.revokeToken, .delete, "/v3/pam/\(sub)/grant/\(PercentCoding.encode(token))", timeout: timeout, auth: false)
    }

    /// A subscribe v2 long-poll (handshake when `cursor` is nil); used by the subscribe engine.
    package func subscribe(channels: [String], groups: [String], cursor: (timetoken: Timetoken, region: Int)?, filterExpression: String?,
                          presenceTimeout: Int?, timeout: Duration? = nil) throws(RequestBuildError) -> RequestSpec {
        guard !channels.isEmpty || !groups.isEmpty else { throw .invalidArgument("at least one channel or group is required") }
        for channel in channels {
            do { try NameRules.validateSubscribeChannel(channel) } catch { throw .invalidName(channel, error.description) }
        }
        for group in groups { try Self.check(group: group) }
        var query: [QueryItem] = []
        if !groups.isEmpty { query.append(QueryItem("channel-group", groups.joined(separator: ","))) }
        if let cursor {
            query.append(QueryItem("tt", cursor.timetoken.description))
            query.append(QueryItem("tr", String(cursor.region)))
        } else {
            query.append(QueryItem("tt", "0"))
        }
        if let filterExpression, !filterExpression.isEmpty { query.append(QueryItem("filter-expr", filterExpression)) }
        if let presenceTimeout { query.append(QueryItem("heartbeat", String(presenceTimeout))) }
        query.append(QueryItem("ee", ""))
        return make(.subscribe, "/v2/subscribe/\(sub)/\(Self.list(channels))/0", query, timeout: timeout)
    }

    static func check(channel: String) throws(RequestBuildError) {
        do { try NameRules.validateChannel(channel) } catch { throw .invalidName(channel, error.description) }
    }

    static func check(group: String) throws(RequestBuildError) {
        do { try NameRules.validateGroup(group) } catch { throw .invalidName(group, error.description) }
    }
}

/// Why a request could not be built (reported as a bad-request status without any I/O).
public enum RequestBuildError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The call needs a publish key and none is configured.
    case missingPublishKey
    /// The call needs the secret key and none is configured.
    case missingSecretKey
    /// A channel, group or user id violates the naming rules.
    case invalidName(String, String)
    /// Another argument is invalid.
    case invalidArgument(String)

    /// A message for humans.
    public var description: String {
        switch self {
        case .missingPublishKey: return "this call needs a publish key; set TetherConfiguration.publishKey"
        case .missingSecretKey: return "this call needs the secret key; set TetherConfiguration.secretKey (server-side clients only)"
        case .invalidName(let name, let why): return "invalid name \(String(reflecting: name)): \(why)"
        case .invalidArgument(let why): return why
        }
    }
}
