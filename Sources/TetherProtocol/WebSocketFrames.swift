/// The frames of Tether's WebSocket session protocol, v1 (docs/websocket-protocol.md): JSON
/// objects in text messages, each with a `type`. This file reads the client's frames and writes
/// the server's; both sides share it.
package enum WebSocketProtocol {
    /// The protocol version `hello` carries.
    package static let version = 1
    /// The `Sec-WebSocket-Protocol` of the JSON encoding.
    package static let jsonSubprotocol = "tether.v1.json"
    /// The upgrade path.
    package static let path = "/v2/ws"
}

/// A frame the client sends.
package enum WebSocketClientFrame: Sendable, Hashable {
    package struct Hello: Sendable, Hashable {
        package var version: Int
        package var subscribeKey: String
        package var publishKey: String?
        package var uuid: String
        package var auth: String?
        package var resumeToken: String?
        package var resumeCursor: Timetoken?
    }

    package struct Subscribe: Sendable, Hashable {
        package var channels: [String]
        package var groups: [String]
        package var cursor: Timetoken?
        /// `nil`: unchanged; `""`: removed.
        package var filter: String?
        /// Presence state by channel, as JSON object text.
        package var states: [String: String]
    }

    package struct Publish: Sendable, Hashable {
        package var isSignal: Bool
        package var requestId: String
        package var channel: String
        /// The message as compact JSON text.
        package var message: String
        package var meta: String?
        package var store: Bool?
        package var ttlHours: Double?
        package var customMessageType: String?
    }

    case hello(Hello)
    case subscribe(Subscribe)
    case unsubscribe(channels: [String], groups: [String])
    case publish(Publish)
    case ping(id: JSONValue)
    case pong(id: JSONValue)
    case bye
    /// The app goes to the background: keep the session for `keepAliveSeconds` (nil: the
    /// server's maximum) after the socket closes; with `presence` false its uuid leaves now and
    /// joins again when the session is resumed; with `push`, what arrives while suspended is
    /// pushed to that device.
    case suspend(keepAliveSeconds: Int?, presence: Bool, push: SuspendPush?)

    /// The device a suspended session's deliveries are pushed to.
    package struct SuspendPush: Sendable, Hashable {
        /// The device token.
        package var token: String
        /// `apns2`, `apns`, `fcm` or `gcm`.
        package var type: String
        /// APNs2: `development` or `production`.
        package var environment: String
        /// APNs2: the app's bundle id.
        package var topic: String
    }

    /// Why a frame could not be read.
    package enum ReadError: Error, Sendable, Hashable {
        /// Not a JSON object with a string `type`, or a field of the wrong kind.
        case malformed(String)
        /// A `type` this version does not know.
        case unknownType(String)
    }

    /// Reads one text message.
    package init(parsing text: String) throws(ReadError) {
        let value: JSONValue
        do { value = try JSONValue(parsing: text) } catch { throw .malformed("not JSON: \(error)") }
        guard case .object(let fields) = value else { throw .malformed("a frame is a JSON object") }
        guard case .string(let type)? = fields["type"] else { throw .malformed("a frame needs a string \"type\"") }
        func string(_ key: String) throws(ReadError) -> String? {
            switch fields[key] {
            case nil, .null?: return nil
            case .string(let value)?: return value
            default: throw .malformed("\"\(key)\" must be a string")
            }
        }
        func required(_ key: String) throws(ReadError) -> String {
            guard let value = try string(key) else { throw .malformed("\"\(key)\" is required") }
            return value
        }
        func names(_ key: String) throws(ReadError) -> [String] {
            switch fields[key] {
            case nil, .null?: return []
            case .array(let items)?:
                var result: [String] = []
                for item in items {
                    guard case .string(let name) = item else { throw .malformed("\"\(key)\" must be an array of strings") }
                    result.append(name)
                }
                return result
            default: throw .malformed("\"\(key)\" must be an array of strings")
            }
        }
        func timetoken(_ key: String) throws(ReadError) -> Timetoken? {
            guard let text = try string(key) else { return nil }
            guard let value = Timetoken(parsing: text) else { throw .malformed("\"\(key)\" must be a timetoken (digits)") }
            return value
        }
        switch type {
        case "hello":
            guard case .number(let number)? = fields["v"], let version = number.exactInteger else {
                throw .malformed("\"v\" (protocol version) is required")
            }
            var resumeToken: String?
            var resumeCursor: Timetoken?
            switch fields["resume"] {
            case nil, .null?: break
            case .object(let resume)?:
                guard case .string(let token)? = resume["token"] else { throw .malformed("\"resume.token\" is required") }
                resumeToken = token
                switch resume["cursor"] {
                case nil, .null?: break
                case .string(let text)?:
                    guard let cursor = Timetoken(parsing: text) else { throw .malformed("\"resume.cursor\" must be a timetoken") }
                    resumeCursor = cursor
                default: throw .malformed("\"resume.cursor\" must be a timetoken string")
                }
            default: throw .malformed("\"resume\" must be an object")
            }
            self = .hello(Hello(version: Int(clamping: version), subscribeKey: try required("subscribeKey"),
                                publishKey: try string("publishKey"), uuid: try required("uuid"), auth: try string("auth"),
                                resumeToken: resumeToken, resumeCursor: resumeCursor))
        case "subscribe":
            var states: [String: String] = [:]
            switch fields["state"] {
            case nil, .null?: break
            case .object(let byChannel)?:
                for (channel, state) in byChannel {
                    guard case .object = state else { throw .malformed("\"state\" maps channels to JSON objects") }
                    states[channel] = state.jsonText
                }
            default: throw .malformed("\"state\" must be an object")
            }
            self = .subscribe(Subscribe(channels: try names("channels"), groups: try names("groups"), cursor: try timetoken("cursor"),
                                        filter: try string("filter"), states: states))
        case "unsubscribe":
            self = .unsubscribe(channels: try names("channels"), groups: try names("groups"))
        case "publish", "signal":
            guard let message = fields["message"] else { throw .malformed("\"message\" is required") }
            var meta: String?
            switch fields["meta"] {
            case nil, .null?: break
            case .object?: meta = fields["meta"]?.jsonText
            default: throw .malformed("\"meta\" must be an object")
            }
            var store: Bool?
            switch fields["store"] {
            case nil, .null?: break
            case .bool(let value)?: store = value
            default: throw .malformed("\"store\" must be a boolean")
            }
            var ttl: Double?
            switch fields["ttl"] {
            case nil, .null?: break
            case .number(let number)?: ttl = number.doubleValue
            default: throw .malformed("\"ttl\" must be a number (hours)")
            }
            let requestId = try required("requestId")
            guard (1...64).contains(requestId.utf8.count) else { throw .malformed("\"requestId\" must be 1…64 characters") }
            self = .publish(Publish(isSignal: type == "signal", requestId: requestId, channel: try required("channel"),
                                    message: message.jsonText, meta: meta, store: store, ttlHours: ttl,
                                    customMessageType: try string("customMessageType")))
        case "ping", "pong":
            let id = fields["id"] ?? .null
            switch id {
            case .string, .number, .null: break
            default: throw .malformed("\"id\" must be a string or a number")
            }
            self = type == "ping" ? .ping(id: id) : .pong(id: id)
        case "bye":
            self = .bye
        case "suspend":
            var seconds: Int?
            switch fields["keepAliveSeconds"] {
            case nil, .null?:
                break
            case .number(let number)?:
                guard let whole = Int(exactly: number.doubleValue), (1...86_400).contains(whole) else {
                    throw .malformed("\"keepAliveSeconds\" must be a whole number of seconds, 1…86400")
                }
                seconds = whole
            default:
                throw .malformed("\"keepAliveSeconds\" must be a number")
            }
            var presence = true
            switch fields["presence"] {
            case nil, .null?: break
            case .bool(let value)?: presence = value
            default: throw .malformed("\"presence\" must be a boolean")
            }
            var push: SuspendPush?
            switch fields["push"] {
            case nil, .null?: break
            case .object(let device)?:
                guard case .string(let token)? = device["token"], (1...256).contains(token.utf8.count),
                      token.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "/") }) else {
                    throw .malformed("\"push.token\" must be a device token (1…256 printable characters)")
                }
                guard case .string(let type)? = device["type"], ["apns2", "apns", "fcm", "gcm"].contains(type) else {
                    throw .malformed("\"push.type\" must be apns2, apns, fcm or gcm")
                }
                var environment = "development"
                switch device["environment"] {
                case nil, .null?: break
                case .string(let value)? where value == "development" || value == "production": environment = value
                default: throw .malformed("\"push.environment\" must be development or production")
                }
                var topic = ""
                switch device["topic"] {
                case nil, .null?: break
                // As REST registration has it: the topic becomes the `apns-topic` header.
                case .string(let value)? where value.utf8.count <= 255 && value.utf8.allSatisfy({ b in
                    (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A)
                        || b == UInt8(ascii: ".") || b == UInt8(ascii: "-") || b == UInt8(ascii: "_")
                }): topic = value
                default: throw .malformed("\"push.topic\" must be a bundle id (A-Z a-z 0-9 . - _)")
                }
                if type == "apns2" && topic.isEmpty { throw .malformed("\"push.topic\" is required for apns2") }
                push = SuspendPush(token: token, type: type, environment: environment, topic: topic)
            default:
                throw .malformed("\"push\" must be an object")
            }
            self = .suspend(keepAliveSeconds: seconds, presence: presence, push: push)
        default:
            throw .unknownType(type)
        }
    }
}

/// Writes the server's frames (compact JSON text).
package enum WebSocketServerFrame {
    package struct Limits: Sendable, Hashable {
        package var maxFrameBytes: Int
        package var maxChannels: Int
        package var maxMessageBytes: Int
        package var maxSignalBytes: Int
        package var outboundBufferFrames: Int

        package init(maxFrameBytes: Int, maxChannels: Int, maxMessageBytes: Int, maxSignalBytes: Int, outboundBufferFrames: Int) {
            self.maxFrameBytes = maxFrameBytes
            self.maxChannels = maxChannels
            self.maxMessageBytes = maxMessageBytes
            self.maxSignalBytes = maxSignalBytes
            self.outboundBufferFrames = outboundBufferFrames
        }
    }

    private static func frame(_ type: StaticString, _ body: (inout JSONWriter) -> Void) -> String {
        var writer = JSONWriter()
        writer.raw("{\"type\":\"")
        writer.raw(type)
        writer.raw("\"")
        body(&writer)
        writer.raw("}")
        return String(decoding: writer.bytes, as: UTF8.self)
    }

    private static func key(_ writer: inout JSONWriter, _ name: StaticString) {
        writer.raw(",\"")
        writer.raw(name)
        writer.raw("\":")
    }

    package static func welcome(sessionId: String, resumeToken: String, resumed: Bool, cursor: Timetoken, keepAliveSeconds: Int,
                                pingIntervalSeconds: Int, limits: Limits,
                                subscription: (channels: [String], groups: [String], filter: String?)?) -> String {
        frame("welcome") { w in
            key(&w, "v"); w.number(WebSocketProtocol.version)
            key(&w, "sessionId"); w.string(sessionId)
            key(&w, "resumeToken"); w.string(resumeToken)
            key(&w, "resumed"); w.bool(resumed)
            key(&w, "cursor"); w.timetokenString(cursor)
            key(&w, "keepAliveSeconds"); w.number(keepAliveSeconds)
            key(&w, "pingIntervalSeconds"); w.number(pingIntervalSeconds)
            key(&w, "limits")
            w.raw("{\"maxFrameBytes\":"); w.number(limits.maxFrameBytes)
            w.raw(",\"maxChannels\":"); w.number(limits.maxChannels)
            w.raw(",\"maxMessageBytes\":"); w.number(limits.maxMessageBytes)
            w.raw(",\"maxSignalBytes\":"); w.number(limits.maxSignalBytes)
            w.raw(",\"outboundBufferFrames\":"); w.number(limits.outboundBufferFrames)
            w.raw("}")
            if let subscription {
                key(&w, "subscription")
                w.raw("{\"channels\":"); w.stringArray(subscription.channels)
                w.raw(",\"groups\":"); w.stringArray(subscription.groups)
                if let filter = subscription.filter { w.raw(",\"filter\":"); w.string(filter) }
                w.raw("}")
            }
        }
    }

    package static func subscribed(channels: [String], groups: [String], cursor: Timetoken) -> String {
        frame("subscribed") { w in
            key(&w, "channels"); w.stringArray(channels)
            key(&w, "groups"); w.stringArray(groups)
            key(&w, "cursor"); w.timetokenString(cursor)
        }
    }

    package static func unsubscribed(channels: [String], groups: [String]) -> String {
        frame("unsubscribed") { w in
            key(&w, "channels"); w.stringArray(channels)
            key(&w, "groups"); w.stringArray(groups)
        }
    }

    /// A delivery: the long-poll's `t` and `m`, envelopes as encoded for the long-poll.
    package static func messages(cursor: Timetoken, envelopes: [[UInt8]], gaps: [(channel: String, from: Timetoken, through: Timetoken)])
        -> String
    {
        frame("messages") { w in
            key(&w, "t"); w.raw("{\"t\":"); w.timetokenString(cursor); w.raw(",\"r\":1}")
            key(&w, "m"); w.raw("[")
            for (offset, envelope) in envelopes.enumerated() {
                if offset > 0 { w.raw(",") }
                w.raw(envelope)
            }
            w.raw("]")
            if !gaps.isEmpty {
                key(&w, "gaps"); w.raw("[")
                for (offset, gap) in gaps.enumerated() {
                    if offset > 0 { w.raw(",") }
                    w.raw("{\"channel\":"); w.string(gap.channel)
                    w.raw(",\"from\":"); w.timetokenString(gap.from)
                    w.raw(",\"through\":"); w.timetokenString(gap.through)
                    w.raw("}")
                }
                w.raw("]")
            }
        }
    }

    /// `isRepeat`: the server already had this request id (nothing new stored or delivered);
    /// written as `"repeat": true`, and left out otherwise.
    package static func ack(requestId: String, timetoken: Timetoken, isRepeat: Bool = false) -> String {
        frame("ack") { w in
            key(&w, "requestId"); w.string(requestId)
            key(&w, "timetoken"); w.timetokenString(timetoken)
            if isRepeat { key(&w, "repeat"); w.raw("true") }
        }
    }

    package static func ack(requestId: String, status: Int, message: String) -> String {
        frame("ack") { w in
            key(&w, "requestId"); w.string(requestId)
            key(&w, "error"); w.raw("{\"status\":"); w.number(status); w.raw(",\"message\":"); w.string(message); w.raw("}")
        }
    }

    package static func ping(id: JSONValue) -> String {
        frame("ping") { w in key(&w, "id"); id.write(to: &w) }
    }

    package static func pong(id: JSONValue) -> String {
        frame("pong") { w in key(&w, "id"); id.write(to: &w) }
    }

    package static func error(code: String, message: String, requestId: String? = nil) -> String {
        frame("error") { w in
            key(&w, "code"); w.string(code)
            key(&w, "message"); w.string(message)
            if let requestId { key(&w, "requestId"); w.string(requestId) }
        }
    }

    package static func accessDenied(channels: [String], groups: [String], message: String) -> String {
        frame("notice") { w in
            key(&w, "notice"); w.string("accessDenied")
            key(&w, "channels"); w.stringArray(channels)
            key(&w, "groups"); w.stringArray(groups)
            key(&w, "message"); w.string(message)
        }
    }

    package static func rateLimited(retryAfterSeconds: Int) -> String {
        frame("notice") { w in
            key(&w, "notice"); w.string("rateLimited")
            key(&w, "retryAfterSeconds"); w.number(retryAfterSeconds)
        }
    }

    package static func drain(reconnectAfterMilliseconds: Int, jitterMilliseconds: Int) -> String {
        frame("notice") { w in
            key(&w, "notice"); w.string("drain")
            key(&w, "reconnectAfterMs"); w.number(reconnectAfterMilliseconds)
            key(&w, "jitterMs"); w.number(jitterMilliseconds)
        }
    }

    /// The answer to `suspend`: the session is kept this long after the socket closes.
    package static func suspended(keepAliveSeconds: Int) -> String {
        frame("suspended") { w in key(&w, "keepAliveSeconds"); w.number(keepAliveSeconds) }
    }

    package static func sessionExpired(message: String) -> String {
        frame("notice") { w in
            key(&w, "notice"); w.string("sessionExpired")
            key(&w, "message"); w.string(message)
        }
    }
}

/// Close codes of the protocol (docs/websocket-protocol.md, "Close codes").
package enum WebSocketCloseCode {
    package static let normal: UInt16 = 1000
    package static let protocolError: UInt16 = 1002
    package static let invalidText: UInt16 = 1007
    package static let tooBig: UInt16 = 1009
    package static let internalError: UInt16 = 1011
    package static let drain: UInt16 = 1012
    package static let pingTimeout: UInt16 = 4001
    package static let helloTimeout: UInt16 = 4002
    package static let slowConsumer: UInt16 = 4003
    package static let malformed: UInt16 = 4400
    package static let forbidden: UInt16 = 4403
    package static let unknownType: UInt16 = 4404
    package static let takenOver: UInt16 = 4409
    package static let tooManyChannels: UInt16 = 4413
}
