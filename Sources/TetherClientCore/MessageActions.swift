public import TetherProtocol

/// A message action: a `type` / `value` pair a user attached to a stored message — a reaction,
/// a read receipt, an "edited" marker (docs/sdk-guide.md, "Message actions").
public struct MessageAction: Sendable, Hashable {
    /// What kind of action (`"reaction"`, `"receipt"`…); 1–15 characters.
    public var type: String
    /// Its value (`"smiley_face"`, `"read"`…).
    public var value: String
    /// The user who added it.
    public var userId: String
    /// The action's own timetoken (what ``TetherClient/removeMessageAction(channel:messageTimetoken:actionTimetoken:timeout:)`` takes).
    public var actionTimetoken: Timetoken
    /// The timetoken of the message it belongs to.
    public var messageTimetoken: Timetoken

    /// Creates an action.
    public init(type: String, value: String, userId: String, actionTimetoken: Timetoken, messageTimetoken: Timetoken) {
        self.type = type
        self.value = value
        self.userId = userId
        self.actionTimetoken = actionTimetoken
        self.messageTimetoken = messageTimetoken
    }
}

/// A message action added or removed, as received by a subscription (an event of kind
/// ``EventKind/messageAction``).
public struct MessageActionEvent: Sendable, Hashable {
    /// Whether the action was added or removed.
    public enum Change: String, Sendable, Hashable {
        /// The action was added.
        case added
        /// The action was removed.
        case removed
    }

    /// Added or removed.
    public var change: Change
    /// The action.
    public var action: MessageAction
    /// The channel of the message.
    public var channel: String
    /// The event's own timetoken (its position in the channel).
    public var timetoken: Timetoken
}

extension ReceivedEvent {
    /// The message action this event carries, when it is one (``kind`` is
    /// ``EventKind/messageAction`` and the payload has PubNub's shape).
    public var messageAction: MessageActionEvent? {
        guard kind == .messageAction, payload["source"]?.stringValue == "actions",
              let change = payload["event"]?.stringValue.flatMap(MessageActionEvent.Change.init(rawValue:)),
              let data = payload["data"], let type = data["type"]?.stringValue, let value = data["value"]?.stringValue,
              let actionTT = data["actionTimetoken"]?.uint64Value, let messageTT = data["messageTimetoken"]?.uint64Value
        else { return nil }
        let action = MessageAction(type: type, value: value, userId: data["uuid"]?.stringValue ?? publisher ?? "",
                                   actionTimetoken: Timetoken(actionTT), messageTimetoken: Timetoken(messageTT))
        return MessageActionEvent(change: change, action: action, channel: channel, timetoken: timetoken)
    }
}

/// One page of a channel's message actions, oldest first.
public struct MessageActionsPage: Sendable, Hashable {
    /// The actions, oldest first.
    public var actions: [MessageAction]
    /// When older actions remain in the range asked for: the `start` of the next page (the
    /// oldest action timetoken of this one).
    public var nextStart: Timetoken?

    /// Creates a page.
    public init(actions: [MessageAction], nextStart: Timetoken?) {
        self.actions = actions
        self.nextStart = nextStart
    }
}

extension Endpoints {
    private var actionsBase: String { "/v1/message-actions/\(PercentCoding.encode(context.subscribeKey))/channel" }

    /// `POST /v1/message-actions/{sub}/channel/{ch}/message/{tt}` with `{"type","value"}`.
    package func addMessageAction(channel: String, messageTimetoken: Timetoken, type: String, value: String,
                                  timeout: Duration? = nil) throws(RequestBuildError) -> RequestSpec
    {
        try Self.check(channel: channel)
        guard (1...15).contains(type.count) else { throw .invalidArgument("type must be 1–15 characters") }
        guard !value.isEmpty else { throw .invalidArgument("value is empty") }
        var w = JSONWriter()
        w.raw("{\"type\":")
        w.string(type)
        w.raw(",\"value\":")
        w.string(value)
        w.raw("}")
        var spec = RequestSpec(operation: .addMessageAction, method: .post,
                               path: "\(actionsBase)/\(PercentCoding.encode(channel))/message/\(messageTimetoken)", body: w.bytes,
                               timeout: timeout)
        appendCommon(&spec)
        return spec
    }

    /// `DELETE /v1/message-actions/{sub}/channel/{ch}/message/{tt}/action/{actionTT}`.
    package func removeMessageAction(channel: String, messageTimetoken: Timetoken, actionTimetoken: Timetoken,
                                     timeout: Duration? = nil) throws(RequestBuildError) -> RequestSpec
    {
        try Self.check(channel: channel)
        var spec = RequestSpec(operation: .removeMessageAction, method: .delete,
                               path: "\(actionsBase)/\(PercentCoding.encode(channel))/message/\(messageTimetoken)/action/\(actionTimetoken)",
                               timeout: timeout)
        appendCommon(&spec)
        return spec
    }

    /// `GET /v1/message-actions/{sub}/channel/{ch}` with `start` (exclusive), `end` (inclusive)
    /// and `limit` (1–100).
    package func fetchMessageActions(channel: String, start: Timetoken?, end: Timetoken?, limit: Int,
                                     timeout: Duration? = nil) throws(RequestBuildError) -> RequestSpec
    {
        try Self.check(channel: channel)
        guard (1...100).contains(limit) else { throw .invalidArgument("limit must be 1–100") }
        var spec = RequestSpec(operation: .fetchMessageActions, path: "\(actionsBase)/\(PercentCoding.encode(channel))", timeout: timeout)
        if let start { spec.append("start", start.description) }
        if let end { spec.append("end", end.description) }
        spec.append("limit", String(limit))
        appendCommon(&spec)
        return spec
    }

    /// `uuid`, `pnsdk` and `auth`, as every builder adds them.
    private func appendCommon(_ spec: inout RequestSpec) {
        spec.append("uuid", context.userId)
        spec.append("pnsdk", context.sdkName)
        spec.carriesAuth = true
        if let key = context.authKey, !key.isEmpty { spec.append("auth", key) }
    }
}

extension ResponseDecoding {
    /// One action object: `{"type","value","uuid","actionTimetoken","messageTimetoken"}`.
    package static func messageAction(_ value: JSONValue) throws(DecodingFailure) -> MessageAction {
        guard let type = value["type"]?.stringValue, let text = value["value"]?.stringValue, let uuid = value["uuid"]?.stringValue,
              let actionTT = value["actionTimetoken"]?.uint64Value, let messageTT = value["messageTimetoken"]?.uint64Value
        else { throw DecodingFailure("message action: expected type, value, uuid and timetokens") }
        return MessageAction(type: type, value: text, userId: uuid, actionTimetoken: Timetoken(actionTT),
                             messageTimetoken: Timetoken(messageTT))
    }

    /// Add → `{"status":200,"data":{…}}`.
    package static func addedMessageAction(_ body: JSONValue) throws(DecodingFailure) -> MessageAction {
        guard let data = body["data"] else { throw DecodingFailure("add message action: expected data") }
        return try messageAction(data)
    }

    /// Get → `{"status":200,"data":[…],"more":{"start":…}}`.
    package static func messageActionsPage(_ body: JSONValue) throws(DecodingFailure) -> MessageActionsPage {
        guard let items = body["data"]?.arrayValue else { throw DecodingFailure("message actions: expected a data list") }
        var actions: [MessageAction] = []
        for item in items { actions.append(try messageAction(item)) }
        let next = body["more"]?["start"]?.uint64Value.map { Timetoken($0) }
        return MessageActionsPage(actions: actions.sorted { $0.actionTimetoken < $1.actionTimetoken }, nextStart: next)
    }

    /// History with actions' `actions` of one message (`{"<type>":{"<value>":[{"uuid","actionTimetoken"}]}}`),
    /// oldest first.
    package static func historyActions(_ value: JSONValue?, messageTimetoken: Timetoken) -> [MessageAction] {
        guard let types = value?.objectValue else { return [] }
        var actions: [MessageAction] = []
        for (type, values) in types {
            for (text, list) in values.objectValue ?? [:] {
                for item in list.arrayValue ?? [] {
                    guard let uuid = item["uuid"]?.stringValue, let tt = item["actionTimetoken"]?.uint64Value else { continue }
                    actions.append(MessageAction(type: type, value: text, userId: uuid, actionTimetoken: Timetoken(tt),
                                                 messageTimetoken: messageTimetoken))
                }
            }
        }
        return actions.sorted { $0.actionTimetoken < $1.actionTimetoken }
    }
}
