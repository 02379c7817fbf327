import HTTPTypes
import Hummingbird
import TetherProtocol

/// A client error that already knows its response (the PubNub error body of its family),
/// counted in metrics and logs as an `invalid` request.
struct RequestError: Error {
    var response: Response
}

/// A request its route refuses with the family's error body, counted in metrics and logs
/// under the route's own label (a publish refused for "Invalid JSON" is a `publish`).
struct Refusal: Error {
    var response: Response
    /// The error's text, where a caller other than REST needs it (the WebSocket `ack`).
    var message: String? = nil
}

extension KeysetRegistry {
    /// The keyset of `subscribeKey`, answering 400 "Invalid Subscribe Key" in `service`'s body,
    /// and 414 when the URI is over that keyset's limit.
    func keyset(subscribeKey: String, service: String, uriLength: Int = 0) throws(RequestError) -> Keyset {
        guard NameRules.validateKey(subscribeKey), let keyset = keyset(subscribeKey: subscribeKey) else {
            throw RequestError(response: Reply.json(.badRequest, ErrorBody.service(status: 400, service: service, message: "Invalid Subscribe Key")))
        }
        if uriLength > limits(for: keyset).maxURIBytes {
            throw RequestError(response: Reply.uriTooLong)
        }
        return keyset
    }
}

/// Request checks every family shares.
enum RequestValidation {
    /// The keyset's per-request bounds on channels and groups (docs/operations.md, "Bounds"):
    /// too many names in total answer PubNub's 414, too many groups a 400 naming the limit.
    static func checkCounts(channels: [String], groups: [String], limits: Limits, service: String) throws(RequestError) {
        if channels.count + groups.count > limits.maxChannelsPerSubscribe {
            throw RequestError(response: Reply.uriTooLong)
        }
        if groups.count > limits.maxGroupsPerRequest {
            throw RequestError(response: Reply.error(.badRequest, service: service,
                                                     "Too many channel groups: at most \(limits.maxGroupsPerRequest) per request"))
        }
    }

    /// `uuid=`, when given, must be a valid user id.
    static func optionalUserId(_ wire: WireRequest, service: String) throws(RequestError) {
        if let uuid = wire.query["uuid"] {
            do { try NameRules.validateUserId(uuid) } catch {
                throw RequestError(response: Reply.error(.badRequest, service: service, "Invalid uuid: \(error)"))
            }
        }
    }

    /// `uuid=`, required and valid.
    static func requiredUserId(_ wire: WireRequest, service: String) throws(RequestError) -> String {
        guard let uuid = wire.query["uuid"], !uuid.isEmpty else {
            throw RequestError(response: Reply.error(.badRequest, service: service, "Missing uuid"))
        }
        do { try NameRules.validateUserId(uuid) } catch {
            throw RequestError(response: Reply.error(.badRequest, service: service, "Invalid uuid: \(error)"))
        }
        return uuid
    }

    /// `heartbeat=<seconds>` (the presence timeout a client asks for).
    static func heartbeatSeconds(_ wire: WireRequest) throws(ParameterError) -> Int? {
        try wire.integer("heartbeat", in: ParameterBounds.heartbeatSeconds)
    }

    /// `state=` as sent on subscribe and heartbeat: a JSON object keyed by channel or channel
    /// group of the request (`{"ch1":{"k":"v"},"g1":{"k":"v"}}`, as the JavaScript SDK sends it
    /// for groups too), or — as the Python SDK's heartbeat sends it — one flat state object for
    /// every channel in the request. A group's key is kept as the group's name: the presence
    /// service applies it to the group's channels (``PresenceService``).
    static func channelStates(_ wire: WireRequest, service: String, channels: [String], groups: [String] = [])
        throws(RequestError) -> [String: String]
    {
        guard let text = wire.query["state"], !text.isEmpty else { return [:] }
        guard case .object(let object)? = try? JSONValue(parsing: text) else {
            throw RequestError(response: Reply.error(.badRequest, service: service, "Invalid state: expected a JSON object"))
        }
        let keyedByChannel = !object.isEmpty && object.allSatisfy { key, value in
            if case .object = value { return channels.contains(key) || groups.contains(key) }
            return false
        }
        // Kept and handed out again (presence events, here-now): no deeper than a kept value may be.
        let deepest = keyedByChannel ? object.values.map(\.nestingDepth).max() ?? 0 : JSONValue.object(object).nestingDepth
        guard deepest <= JSONText.maximumValueDepth else {
            throw RequestError(response: Reply.error(.badRequest, service: service,
                                                     "Invalid state: nested deeper than \(JSONText.maximumValueDepth) levels"))
        }
        if keyedByChannel { return object.mapValues(\.jsonText) }
        let flat = JSONValue.object(object).jsonText
        return Dictionary(uniqueKeysWithValues: channels.filter { !NameRules.isPresence($0) }.map { ($0, flat) })
    }
}
