import HTTPTypes
import Synchronization
import Hummingbird
import NIOCore
@_spi(Benchmarks) import TetherProtocol
import TetherServerCore

extension Reply {
    /// The message-actions error object (PubNub's, as its SDKs' fixtures record it):
    /// `{"status":N,"error":{"source":"actions","message":"…"}}`.
    static func actionsError(_ status: HTTPResponse.Status, _ message: String) -> Response {
        var w = JSONWriter()
        w.raw("{\"status\":")
        w.number(status.code)
        w.raw(",\"error\":{\"source\":\"actions\",\"message\":")
        w.string(message)
        w.raw("}}")
        return json(status, w.bytes)
    }
}

/// The message-actions bounds (docs/protocol.md, "Message actions").
enum ActionBounds {
    /// `type`: 1…15 characters, PubNub's documented maximum.
    static let typeCharacters = 1...15
    /// `value`: 1…1,024 bytes of UTF-8 (a Tether bound; PubNub documents none).
    static let valueBytes = 1...1024
    /// The add request's body.
    static let bodyBytes = 4096
    /// `limit` of a get: at most 100, the default (larger values are served as 100).
    static let limit = 100
}

/// A request of the message-actions family (`/v1/message-actions/{sub}/channel/{ch}[/message/
/// {tt}[/action/{tt}]]`): keyset, channel and timetokens, checked before access. Every error
/// is the actions error object.
struct MessageActionRequest {
    var keyset: Keyset
    var channel: String
    var messageTimetoken: Timetoken?
    var actionTimetoken: Timetoken?

    init(_ wire: WireRequest, keysets: KeysetRegistry) throws(RequestError) {
        let s = wire.segments
        guard NameRules.validateKey(s[2]), let keyset = keysets.keyset(subscribeKey: s[2]) else {
            throw RequestError(response: Reply.actionsError(.badRequest, "Invalid Subscribe Key"))
        }
        if wire.uriLength > keysets.limits(for: keyset).maxURIBytes { throw RequestError(response: Reply.uriTooLong) }
        do { try NameRules.validateChannel(s[4]) } catch {
            throw RequestError(response: Reply.actionsError(.badRequest, "Invalid channel \(String(reflecting: s[4])): \(error)"))
        }
        if NameRules.isPresence(s[4]) {
            throw RequestError(response: Reply.actionsError(.badRequest, "Invalid channel: presence channels carry no message actions"))
        }
        func timetoken(_ index: Int, _ name: String) throws(RequestError) -> Timetoken? {
            guard index < s.count else { return nil }
            guard let value = Timetoken(parsing: s[index]), value != .zero else {
                throw RequestError(response: Reply.actionsError(.badRequest, "Invalid \(name): expected a timetoken of up to 17 digits"))
            }
            return value
        }
        if let uuid = wire.query["uuid"] {
            do { try NameRules.validateUserId(uuid) } catch {
                throw RequestError(response: Reply.actionsError(.badRequest, "Invalid uuid: \(error)"))
            }
        }
        self.keyset = keyset
        self.channel = s[4]
        self.messageTimetoken = try timetoken(6, "message timetoken")
        self.actionTimetoken = try timetoken(8, "action timetoken")
    }

    /// The request's `uuid`, required to add or remove an action (it is whose action it is).
    func uuid(_ wire: WireRequest) throws(RequestError) -> String {
        guard let uuid = wire.query["uuid"], !uuid.isEmpty else {
            throw RequestError(response: Reply.actionsError(.badRequest, "Missing uuid"))
        }
        return uuid
    }
}

/// The add request's body, `{"type":"…","value":"…"}`.
struct ActionBody {
    var type: String
    var value: String

    init(_ bytes: [UInt8]) throws(Refusal) {
        func refuse(_ message: String) -> Refusal { Refusal(response: Reply.actionsError(.badRequest, message), message: message) }
        guard case .object(let object)? = try? JSONValue(parsing: bytes) else { throw refuse("Invalid JSON body: expected an object") }
        func field(_ name: String) throws(Refusal) -> String {
            guard let value = object[name] else { throw refuse("Missing field: \(name)") }
            guard case .string(let text) = value else { throw refuse("Invalid field: \(name) must be a string") }
            if text.isEmpty { throw refuse("Missing field: \(name)") }
            return text
        }
        type = try field("type")
        value = try field("value")
        guard ActionBounds.typeCharacters.contains(type.count) else {
            throw refuse("Invalid field: type is longer than \(ActionBounds.typeCharacters.upperBound) characters")
        }
        guard ActionBounds.valueBytes.contains(value.utf8.count) else {
            throw refuse("Invalid field: value is longer than \(ActionBounds.valueBytes.upperBound) bytes")
        }
    }
}

extension TetherResponder {
    // MARK: - Add

    @inline(never) func addMessageAction(_ request: Request, _ wire: WireRequest) async throws -> Response {
        let target = try MessageActionRequest(wire, keysets: state.keysets)
        guard let messageTimetoken = target.messageTimetoken else { throw RequestError(response: Reply.actionsError(.badRequest, "Missing message timetoken")) }
        let uuid = try target.uuid(wire)
        guard let body = try? await request.body.collect(upTo: ActionBounds.bodyBytes) else {
            throw Refusal(response: Reply.actionsError(.contentTooLarge, "Request body too large"))
        }
        let bytes = Array(buffer: body)
        try authorize(target.keyset, wire, method: "POST", channels: [target.channel], groups: [], permission: .write, body: bytes)
        let fields = try ActionBody(bytes)
        let subscribeKey = target.keyset.subscribeKey, channel = target.channel
        let (timetoken, outcome) = try await state.hub.publishAfterWrite({ tt in
            Self.actionEnvelope(StoredAction(subscribeKey: subscribeKey, channel: channel, messageTimetoken: messageTimetoken,
                                             actionTimetoken: tt, type: fields.type, value: fields.value, uuid: uuid),
                                event: "added", at: tt)
        }, write: { tt, actions in
            let outcome = try await actions.addAction(StoredAction(
                subscribeKey: subscribeKey, channel: channel, messageTimetoken: messageTimetoken, actionTimetoken: tt,
                type: fields.type, value: fields.value, uuid: uuid))
            return (outcome == .added, outcome)
        })
        switch outcome {
        case .messageNotFound:
            // A Tether deviation: PubNub stores actions on any timetoken (docs/compatibility.md).
            return Reply.actionsError(.badRequest, "Message not found: actions are added to stored messages")
        case .duplicate:
            return Reply.actionsError(.conflict, "Action Already Added")
        case .added:
            state.metrics.recordPublish(kind: "message-action")
            var w = JSONWriter()
            w.raw("{\"status\":200,\"data\":")
            Self.writeAction(&w, type: fields.type, value: fields.value, uuid: uuid, actionTimetoken: timetoken,
                             messageTimetoken: messageTimetoken)
            w.raw("}")
            return Reply.json(.ok, w.bytes)
        }
    }

    // MARK: - Remove

    @inline(never) func removeMessageAction(_ wire: WireRequest) async throws -> Response {
        let target = try MessageActionRequest(wire, keysets: state.keysets)
        guard let messageTimetoken = target.messageTimetoken, let actionTimetoken = target.actionTimetoken else {
            throw RequestError(response: Reply.actionsError(.badRequest, "Missing timetoken"))
        }
        let uuid = try target.uuid(wire)
        try authorize(target.keyset, wire, method: "DELETE", channels: [target.channel], groups: [], permission: .delete)
        let subscribeKey = target.keyset.subscribeKey, channel = target.channel
        // The event names the removed action; the envelope is built from the request, which
        // matches the stored row whenever the event is delivered (same keys, same uuid).
        let removed = Mutex<StoredAction?>(nil)
        let (_, outcome) = try await state.hub.publishAfterWrite({ tt in
            let action = removed.withLock { $0 } ?? StoredAction(subscribeKey: subscribeKey, channel: channel,
                                                                  messageTimetoken: messageTimetoken, actionTimetoken: actionTimetoken,
                                                                  type: "", value: "", uuid: uuid)
            return Self.actionEnvelope(action, event: "removed", at: tt)
        }, write: { _, actions in
            let outcome = try await actions.removeAction(subscribeKey: subscribeKey, channel: channel, messageTimetoken: messageTimetoken,
                                                       actionTimetoken: actionTimetoken, uuid: uuid)
            if case .removed(let action) = outcome {
                removed.withLock { $0 = action }
                return (true, outcome)
            }
            return (false, outcome)
        })
        switch outcome {
        case .wrongUUID:
            return Reply.actionsError(.badRequest, "Not deleting message action: wrong uuid specified")
        case .removed, .notFound:
            // Removing an action that is not there is answered as a removal (idempotent, so a
            // retried remove succeeds); no event is sent for it.
            return Reply.json(.ok, "{\"status\":200,\"data\":{}}")
        }
    }

    // MARK: - Get

    @inline(never) func getMessageActions(_ wire: WireRequest) async throws -> Response {
        let target = try MessageActionRequest(wire, keysets: state.keysets)
        try authorize(target.keyset, wire, channels: [target.channel], groups: [], permission: .read)
        let start = try wire.timetoken("start")
        let end = try wire.timetoken("end")
        let limit = min(try wire.integer("limit", in: ParameterBounds.actionsLimit) ?? ActionBounds.limit, ActionBounds.limit)
        let page = try await state.messageActions.actions(subscribeKey: target.keyset.subscribeKey, channel: target.channel, start: start,
                                                 end: end, limit: limit)
        var w = JSONWriter(capacity: 128 + page.actions.count * 160)
        w.raw("{\"status\":200,\"data\":[")
        for (i, a) in page.actions.enumerated() {
            if i > 0 { w.raw(",") }
            Self.writeAction(&w, type: a.type, value: a.value, uuid: a.uuid, actionTimetoken: a.actionTimetoken,
                             messageTimetoken: a.messageTimetoken)
        }
        w.raw("]")
        if page.more, let oldest = page.actions.first?.actionTimetoken {
            // PubNub's `more`: the next page is the actions before the oldest one returned.
            var url = "/v1/message-actions/\(target.keyset.subscribeKey)/channel/\(PercentCoding.encode(target.channel))"
            url += "?start=\(oldest.rawValue)"
            if let end { url += "&end=\(end.rawValue)" }
            url += "&limit=\(limit)"
            w.raw(",\"more\":{\"url\":")
            w.string(url)
            w.raw(",\"start\":")
            w.timetokenString(oldest)
            if let end {
                w.raw(",\"end\":")
                w.timetokenString(end)
            }
            w.raw(",\"limit\":")
            w.number(limit)
            w.raw("}")
        }
        w.raw("}")
        return Reply.json(.ok, w.bytes)
    }

    // MARK: - Wire shapes

    /// `{"type","value","uuid","actionTimetoken","messageTimetoken"}` (timetokens as strings).
    static func writeAction(_ w: inout JSONWriter, type: String, value: String, uuid: String, actionTimetoken: Timetoken,
                            messageTimetoken: Timetoken) {
        w.raw("{\"type\":")
        w.string(type)
        w.raw(",\"value\":")
        w.string(value)
        w.raw(",\"uuid\":")
        w.string(uuid)
        w.raw(",\"actionTimetoken\":")
        w.timetokenString(actionTimetoken)
        w.raw(",\"messageTimetoken\":")
        w.timetokenString(messageTimetoken)
        w.raw("}")
    }

    /// The subscribe envelope of an action event (`e: 3`), as PubNub sends it: the uuid is the
    /// publisher `i`, the payload `{"source":"actions","version":"1.0","data":{…},"event":…}`.
    static func actionEnvelope(_ action: StoredAction, event: String, at timetoken: Timetoken) -> SubscribeEnvelope {
        var w = JSONWriter(capacity: 160 + action.type.utf8.count + action.value.utf8.count)
        w.raw("{\"source\":\"actions\",\"version\":\"1.0\",\"data\":{\"type\":")
        w.string(action.type)
        w.raw(",\"value\":")
        w.string(action.value)
        w.raw(",\"messageTimetoken\":")
        w.timetokenString(action.messageTimetoken)
        w.raw(",\"actionTimetoken\":")
        w.timetokenString(action.actionTimetoken)
        w.raw("},\"event\":")
        w.string(event)
        w.raw("}")
        return SubscribeEnvelope(timetoken: timetoken, subscribeKey: action.subscribeKey, channel: action.channel,
                                 payload: String(decoding: w.bytes, as: UTF8.self), publisher: action.uuid, kind: .messageAction)
    }
}
