public import TetherProtocol

/// One event received by a subscribe long-poll (pubnub-wire §6.3), decoded.
public struct ReceivedEvent: Sendable {
    /// The event's timetoken (`p.t`).
    public var timetoken: Timetoken
    /// The channel it was published on (`c`; presence events keep their `-pnpres` name).
    public var channel: String
    /// The subscription that matched (`b`): a group, a wildcard pattern or a presence name; `nil` for a plain channel.
    public var subscription: String?
    /// The payload (`d`): decrypted when a cryptor is configured and it is a message.
    public var payload: JSONValue
    /// The publisher (`i`).
    public var publisher: String?
    /// The publish metadata (`u`).
    public var meta: JSONValue?
    /// The kind of event (`e`); presence events are `.message` on a `-pnpres` channel.
    public var kind: EventKind
    /// The custom message type (`cmt`).
    public var customMessageType: String?
    /// Set when the payload could not be decrypted (the payload is then the raw one).
    public var decryptionError: Status?

    /// Creates an event.
    public init(timetoken: Timetoken, channel: String, subscription: String?, payload: JSONValue, publisher: String?, meta: JSONValue?,
                kind: EventKind, customMessageType: String?, decryptionError: Status? = nil) {
        self.timetoken = timetoken
        self.channel = channel
        self.subscription = subscription
        self.payload = payload
        self.publisher = publisher
        self.meta = meta
        self.kind = kind
        self.customMessageType = customMessageType
        self.decryptionError = decryptionError
    }

    /// Whether this is a presence event (its channel ends in `-pnpres`).
    public var isPresence: Bool { NameRules.isPresence(channel) }
}

/// The decoded body of one subscribe response: the next cursor and the events, oldest first.
package struct SubscribeResponse: Sendable {
    /// The cursor to send back as `tt`.
    package var timetoken: Timetoken
    /// The region to send back as `tr`.
    package var region: Int
    /// The events.
    package var events: [ReceivedEvent]

    /// Creates a response.
    package init(timetoken: Timetoken, region: Int, events: [ReceivedEvent]) {
        self.timetoken = timetoken
        self.region = region
        self.events = events
    }
}

extension ResponseDecoding {
    /// Subscribe v2 → `{"t":{"t":"<tt>","r":1},"m":[…]}`.
    package static func subscribe(_ body: JSONValue) throws(DecodingFailure) -> SubscribeResponse {
        guard let cursor = body["t"], let tt = cursor["t"]?.uint64Value else { throw DecodingFailure("subscribe: expected t.t") }
        let region = cursor["r"]?.intValue ?? 0
        var events: [ReceivedEvent] = []
        for envelope in body["m"]?.arrayValue ?? [] {
            guard let channel = envelope["c"]?.stringValue, let payload = envelope["d"],
                  let timetoken = envelope["p"]?["t"]?.uint64Value
            else { throw DecodingFailure("subscribe: envelope without c, d or p.t") }
            let kind = envelope["e"]?.intValue.flatMap(EventKind.init(rawValue:)) ?? .message
            let match = envelope["b"]?.stringValue
            events.append(ReceivedEvent(timetoken: Timetoken(timetoken), channel: channel, subscription: match == channel ? nil : match,
                                        payload: payload, publisher: envelope["i"]?.stringValue, meta: envelope["u"], kind: kind,
                                        customMessageType: envelope["cmt"]?.stringValue))
        }
        return SubscribeResponse(timetoken: Timetoken(tt), region: region, events: events)
    }
}
