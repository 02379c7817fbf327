@_spi(Benchmarks) package import TetherProtocol

/// The client's side of the WebSocket session protocol v1 (docs/websocket-protocol.md): the
/// frames the SDK writes, and the server's frames read into typed values. `messages` frames are
/// read with the long-poll's own decoder (``ResponseDecoding/subscribe(_:)``), so both wires
/// produce the same ``SubscribeResponse`` with the same cursor.
package enum SessionFrame {
    /// What `welcome` says.
    package struct Welcome: Sendable, Hashable {
        package var sessionId: String
        package var resumeToken: String
        package var resumed: Bool
        package var cursor: Timetoken
        package var keepAliveSeconds: Int
        package var pingIntervalSeconds: Int
        /// The kept subscription, when resumed.
        package var channels: [String]
        package var groups: [String]
        /// The kept subscription's filter expression, when resumed (nil: none).
        package var filter: String? = nil
    }

    /// A server notice.
    package enum Notice: Sendable, Hashable {
        case accessDenied(channels: [String], groups: [String], message: String)
        case rateLimited(retryAfterSeconds: Int)
        case drain(reconnectAfterMilliseconds: Int, jitterMilliseconds: Int)
        case sessionExpired(message: String)
        /// A notice this version does not know (ignored).
        case unknown(String)
    }

    /// A frame from the server.
    package enum Server: Sendable {
        case welcome(Welcome)
        case subscribed(channels: [String], groups: [String], cursor: Timetoken)
        case unsubscribed(channels: [String], groups: [String])
        case messages(SubscribeResponse, gaps: [RetentionGap])
        case ack(requestId: String)
        case ping(id: JSONValue)
        case pong(id: JSONValue)
        case notice(Notice)
        case error(code: String, message: String)
        /// A frame type this version does not know (ignored: room for later versions).
        case unknown(String)
    }

    /// Why a server frame could not be read.
    package struct Malformed: Error, Sendable, Hashable, CustomStringConvertible {
        package var description: String
        package init(_ description: String) { self.description = description }
    }

    /// Reads one text message from the server.
    package static func read(_ text: String) throws(Malformed) -> Server {
        let value: JSONValue
        do { value = try JSONValue(parsing: Array(text.utf8), maximumDepth: JSONText.maximumAnswerDepth) } catch {
            throw Malformed("not JSON: \(error)")
        }
        guard case .string(let type)? = value["type"] else { throw Malformed("a frame needs a string \"type\"") }
        func names(_ key: String, in object: JSONValue? = nil) -> [String] {
            ((object ?? value)[key]?.arrayValue ?? []).compactMap(\.stringValue)
        }
        func timetoken(_ field: JSONValue?) -> Timetoken? {
            field?.stringValue.flatMap { Timetoken(parsing: $0) }
        }
        switch type {
        case "welcome":
            guard let sessionId = value["sessionId"]?.stringValue, let token = value["resumeToken"]?.stringValue,
                  let cursor = timetoken(value["cursor"])
            else { throw Malformed("welcome: sessionId, resumeToken and cursor are required") }
            let subscription = value["subscription"]
            return .welcome(Welcome(sessionId: sessionId, resumeToken: token, resumed: value["resumed"]?.boolValue ?? false,
                                    cursor: cursor, keepAliveSeconds: value["keepAliveSeconds"]?.intValue ?? 0,
                                    pingIntervalSeconds: value["pingIntervalSeconds"]?.intValue ?? 0,
                                    channels: subscription.map { names("channels", in: $0) } ?? [],
                                    groups: subscription.map { names("groups", in: $0) } ?? [],
                                    filter: subscription?["filter"]?.stringValue.flatMap { $0.isEmpty ? nil : $0 }))
        case "subscribed":
            guard let cursor = timetoken(value["cursor"]) else { throw Malformed("subscribed: cursor is required") }
            return .subscribed(channels: names("channels"), groups: names("groups"), cursor: cursor)
        case "unsubscribed":
            return .unsubscribed(channels: names("channels"), groups: names("groups"))
        case "messages":
            let response: SubscribeResponse
            do { response = try ResponseDecoding.subscribe(value) } catch { throw Malformed("messages: \(error)") }
            let gaps = (value["gaps"]?.arrayValue ?? []).compactMap { gap -> RetentionGap? in
                guard let channel = gap["channel"]?.stringValue, let from = timetoken(gap["from"]),
                      let through = timetoken(gap["through"]) else { return nil }
                return RetentionGap(channel: channel, from: from, through: through)
            }
            return .messages(response, gaps: gaps)
        case "ack":
            return .ack(requestId: value["requestId"]?.stringValue ?? "")
        case "ping":
            return .ping(id: value["id"] ?? .null)
        case "pong":
            return .pong(id: value["id"] ?? .null)
        case "notice":
            switch value["notice"]?.stringValue ?? "" {
            case "accessDenied":
                return .notice(.accessDenied(channels: names("channels"), groups: names("groups"),
                                             message: value["message"]?.stringValue ?? "access denied"))
            case "rateLimited":
                return .notice(.rateLimited(retryAfterSeconds: value["retryAfterSeconds"]?.intValue ?? 1))
            case "drain":
                return .notice(.drain(reconnectAfterMilliseconds: max(0, value["reconnectAfterMs"]?.intValue ?? 0),
                                      jitterMilliseconds: max(0, value["jitterMs"]?.intValue ?? 0)))
            case "sessionExpired":
                return .notice(.sessionExpired(message: value["message"]?.stringValue ?? "session expired"))
            case let other:
                return .notice(.unknown(other))
            }
        case "error":
            return .error(code: value["code"]?.stringValue ?? "", message: value["message"]?.stringValue ?? "")
        default:
            return .unknown(type)
        }
    }

    // MARK: Client frames

    /// `hello`, resuming `resume` when given.
    package static func hello(subscribeKey: String, publishKey: String?, uuid: String, auth: String?,
                              resume: (token: String, cursor: Timetoken?)?) -> String {
        var fields: [String: JSONValue] = ["type": "hello", "v": .number(JSONValue.Number(WebSocketProtocol.version)),
                                           "subscribeKey": .string(subscribeKey), "uuid": .string(uuid)]
        if let publishKey { fields["publishKey"] = .string(publishKey) }
        if let auth { fields["auth"] = .string(auth) }
        if let resume {
            var object: [String: JSONValue] = ["token": .string(resume.token)]
            if let cursor = resume.cursor { object["cursor"] = .string(cursor.description) }
            fields["resume"] = .object(object)
        }
        return JSONValue.object(fields).jsonText
    }

    /// `subscribe`; `cursor` nil starts at the server's current cursor.
    package static func subscribe(channels: [String], groups: [String], cursor: Timetoken?, filter: String?) -> String {
        var fields: [String: JSONValue] = ["type": "subscribe", "channels": .array(channels.map(JSONValue.string)),
                                           "groups": .array(groups.map(JSONValue.string))]
        if let cursor { fields["cursor"] = .string(cursor.description) }
        if let filter { fields["filter"] = .string(filter) }
        return JSONValue.object(fields).jsonText
    }

    /// `unsubscribe`.
    package static func unsubscribe(channels: [String], groups: [String]) -> String {
        JSONValue.object(["type": "unsubscribe", "channels": .array(channels.map(JSONValue.string)),
                          "groups": .array(groups.map(JSONValue.string))]).jsonText
    }

    /// `ping` with `id`.
    package static func ping(id: Int) -> String {
        JSONValue.object(["type": "ping", "id": .number(JSONValue.Number(id))]).jsonText
    }

    /// `pong` answering the server's `id`.
    package static func pong(id: JSONValue) -> String {
        JSONValue.object(["type": "pong", "id": id]).jsonText
    }

    /// `bye`: ends the session.
    package static let bye = #"{"type":"bye"}"#

    /// `suspend`: the app goes to the background; keep the session `seconds` after the socket closes.
    package static func suspend(keepAliveSeconds seconds: Int, presence: Bool, push: BackgroundPushDevice? = nil) -> String {
        var frame: [String: JSONValue] = ["type": "suspend", "keepAliveSeconds": .number(JSONValue.Number(seconds)), "presence": .bool(presence)]
        if let push {
            var device: [String: JSONValue] = ["token": .string(push.token), "type": .string(push.pushType.rawValue)]
            if push.pushType == .apns2 {
                device["environment"] = .string(push.environment.rawValue)
                device["topic"] = .string(push.topic ?? "")
            }
            frame["push"] = .object(device)
        }
        return JSONValue.object(frame).jsonText
    }
}
