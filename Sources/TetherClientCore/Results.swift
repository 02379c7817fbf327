public import TetherProtocol

/// The result of publish, signal and fire.
public struct PublishResult: Sendable, Hashable {
    /// The timetoken the server assigned to the message (for a repeat, the original one).
    public var timetoken: Timetoken
    /// The request id every attempt of the message carried (`requestid`); `nil` for a `fire`
    /// sent without one.
    public var requestId: String?
    /// Whether the server said it had stored this request already (`Tether-Duplicate: 1`): an
    /// earlier attempt, whose answer was lost, or an earlier message with the same
    /// ``PublishOptions/requestId``, reached it within its dedup window. The timetoken is the
    /// original one and nothing was stored or delivered again. Always false against a server that
    /// does not deduplicate.
    public var isRepeat: Bool

    /// Creates a result.
    public init(timetoken: Timetoken, requestId: String? = nil, isRepeat: Bool = false) {
        self.timetoken = timetoken
        self.requestId = requestId
        self.isRepeat = isRepeat
    }
}

/// One stored message returned by history or fetch.
public struct HistoryMessage: Sendable {
    /// The channel.
    public var channel: String
    /// The message's timetoken.
    public var timetoken: Timetoken
    /// The message: decrypted when a cryptor is configured and decryption succeeded, otherwise as stored.
    public var payload: JSONValue
    /// The publisher, when requested and known.
    public var publisher: String?
    /// The publish metadata, when requested and present.
    public var meta: JSONValue?
    /// The kind of event (message, signal, file...), when requested.
    public var messageType: EventKind?
    /// The custom message type, when requested and present.
    public var customMessageType: String?
    /// Set when the payload could not be decrypted: the status carries the raw payload too.
    public var decryptionError: Status?
    /// The message's actions, oldest first, when fetched with ``FetchOptions/includeActions``.
    public var actions: [MessageAction] = []

    /// Creates a message.
    public init(channel: String, timetoken: Timetoken, payload: JSONValue, publisher: String? = nil, meta: JSONValue? = nil,
                messageType: EventKind? = nil, customMessageType: String? = nil, decryptionError: Status? = nil) {
        self.channel = channel
        self.timetoken = timetoken
        self.payload = payload
        self.publisher = publisher
        self.meta = meta
        self.messageType = messageType
        self.customMessageType = customMessageType
        self.decryptionError = decryptionError
    }
}

/// One page of fetched history: messages per channel, oldest first within each channel.
public struct HistoryPage: Sendable {
    /// Messages per channel, oldest → newest.
    public var channels: [String: [HistoryMessage]]

    /// Creates a page.
    public init(channels: [String: [HistoryMessage]]) { self.channels = channels }

    /// Every message of the page, ordered by timetoken.
    public var messages: [HistoryMessage] { channels.values.flatMap { $0 }.sorted { $0.timetoken < $1.timetoken } }

    /// Whether the page holds no message.
    public var isEmpty: Bool { channels.values.allSatisfy(\.isEmpty) }
}

/// Presence on one channel.
public struct ChannelPresence: Sendable, Hashable {
    /// The channel.
    public var channel: String
    /// How many users are present.
    public var occupancy: Int
    /// Who is present (empty when user ids were not requested).
    public var occupants: [Occupant]

    /// Creates the value.
    public init(channel: String, occupancy: Int, occupants: [Occupant]) {
        self.channel = channel
        self.occupancy = occupancy
        self.occupants = occupants
    }
}

/// A user present on a channel.
public struct Occupant: Sendable, Hashable {
    /// The user id.
    public var userId: String
    /// Their presence state, when requested and set.
    public var state: JSONValue?

    /// Creates the value.
    public init(userId: String, state: JSONValue? = nil) {
        self.userId = userId
        self.state = state
    }
}

/// The result of here-now.
public struct HereNowResult: Sendable, Hashable {
    /// Presence per channel.
    public var channels: [String: ChannelPresence]
    /// The number of channels with anyone present.
    public var totalChannels: Int
    /// The total number of occupants across channels.
    public var totalOccupancy: Int

    /// Creates the value.
    public init(channels: [String: ChannelPresence], totalChannels: Int, totalOccupancy: Int) {
        self.channels = channels
        self.totalChannels = totalChannels
        self.totalOccupancy = totalOccupancy
    }
}

/// The response could not be decoded as the API's result (reported as malformed response).
public struct DecodingFailure: Error, Sendable, Hashable, CustomStringConvertible {
    /// What was expected.
    public var reason: String
    /// Creates the error.
    public init(_ reason: String) { self.reason = reason }
    /// A message for humans.
    public var description: String { "unexpected response: \(reason)" }
}

/// Decodes each API's success body into its typed result (pubnub-wire §4–§16).
package enum ResponseDecoding {
    /// `/time/0` → `[17953281264739664]`.
    package static func time(_ body: JSONValue) throws(DecodingFailure) -> Timetoken {
        guard let value = body[0]?.uint64Value else { throw DecodingFailure("time: expected [<timetoken>]") }
        return Timetoken(value)
    }

    /// Publish/signal/fire → `[1,"Sent","<tt>"]`.
    package static func publish(_ body: JSONValue) throws(DecodingFailure) -> PublishResult {
        guard body[0]?.intValue == 1, let tt = body[2]?.uint64Value else {
            throw DecodingFailure("publish: expected [1,\"Sent\",\"<timetoken>\"]")
        }
        return PublishResult(timetoken: Timetoken(tt))
    }

    /// History v2 with `include_token` → `[[{"message":…,"timetoken":"…","meta":…}], start, end]`.
    package static func history(_ body: JSONValue, channel: String) throws(DecodingFailure) -> [HistoryMessage] {
        guard let items = body[0]?.arrayValue else { throw DecodingFailure("history: expected [[items], start, end]") }
        var out: [HistoryMessage] = []
        for item in items {
            guard let payload = item["message"], let tt = item["timetoken"]?.uint64Value else {
                throw DecodingFailure("history: item without message/timetoken")
            }
            out.append(HistoryMessage(channel: channel, timetoken: Timetoken(tt), payload: payload, meta: meta(item["meta"])))
        }
        return out
    }

    /// Fetch v3 → `{"channels":{"ch":[{"message":…,"timetoken":"…",…}]}}`.
    package static func fetch(_ body: JSONValue) throws(DecodingFailure) -> HistoryPage {
        guard let channels = body["channels"]?.objectValue else { throw DecodingFailure("fetch: expected a channels object") }
        var result: [String: [HistoryMessage]] = [:]
        for (channel, list) in channels {
            guard let items = list.arrayValue else { throw DecodingFailure("fetch: channel \(channel) is not a list") }
            var messages: [HistoryMessage] = []
            for item in items {
                guard let payload = item["message"], let tt = item["timetoken"]?.uint64Value else {
                    throw DecodingFailure("fetch: item without message/timetoken")
                }
                var kind: EventKind?
                if let type = item["message_type"] {
                    kind = type.isNull ? .message : type.intValue.flatMap(EventKind.init(rawValue:))
                }
                var message = HistoryMessage(channel: channel, timetoken: Timetoken(tt), payload: payload,
                                             publisher: item["uuid"]?.stringValue, meta: meta(item["meta"]), messageType: kind,
                                             customMessageType: item["custom_message_type"]?.stringValue)
                message.actions = historyActions(item["actions"], messageTimetoken: Timetoken(tt))
                messages.append(message)
            }
            result[channel] = messages.sorted { $0.timetoken < $1.timetoken }
        }
        return HistoryPage(channels: result)
    }

    /// Message counts → `{"channels":{"ch1":1}}`.
    package static func messageCounts(_ body: JSONValue) throws(DecodingFailure) -> [String: Int] {
        guard let channels = body["channels"]?.objectValue else { throw DecodingFailure("message counts: expected a channels object") }
        var out: [String: Int] = [:]
        for (channel, value) in channels {
            guard let count = value.intValue else { throw DecodingFailure("message counts: \(channel) is not a number") }
            out[channel] = count
        }
        return out
    }

    /// Here-now, both shapes (pubnub-wire §7.3).
    package static func hereNow(_ body: JSONValue, channels requested: [String], groups: [String]) throws(DecodingFailure) -> HereNowResult {
        if let payload = body["payload"]?.objectValue {
            let channelMap = payload["channels"]?.objectValue ?? [:]
            var result: [String: ChannelPresence] = [:]
            for (name, value) in channelMap { result[name] = try channelPresence(name, value) }
            let totalOccupancy = payload["total_occupancy"]?.intValue ?? result.values.reduce(0) { $0 + $1.occupancy }
            return HereNowResult(channels: result, totalChannels: payload["total_channels"]?.intValue ?? result.count,
                                 totalOccupancy: totalOccupancy)
        }
        guard requested.count == 1, groups.isEmpty, body["occupancy"] != nil else {
            throw DecodingFailure("here-now: expected a payload or a single-channel body")
        }
        let presence = try channelPresence(requested[0], body)
        return HereNowResult(channels: [requested[0]: presence], totalChannels: presence.occupancy > 0 ? 1 : 0,
                             totalOccupancy: presence.occupancy)
    }

    private static func channelPresence(_ name: String, _ value: JSONValue) throws(DecodingFailure) -> ChannelPresence {
        guard let occupancy = value["occupancy"]?.intValue else { throw DecodingFailure("here-now: \(name) has no occupancy") }
        var occupants: [Occupant] = []
        for entry in value["uuids"]?.arrayValue ?? [] {
            if let id = entry.stringValue {
                occupants.append(Occupant(userId: id))
            } else if let id = entry["uuid"]?.stringValue {
                occupants.append(Occupant(userId: id, state: entry["state"]))
            } else {
                throw DecodingFailure("here-now: malformed occupant in \(name)")
            }
        }
        return ChannelPresence(channel: name, occupancy: occupancy, occupants: occupants)
    }

    /// Where-now → `{"payload":{"channels":[…]}}`.
    package static func whereNow(_ body: JSONValue) throws(DecodingFailure) -> [String] {
        guard let channels = body["payload"]?["channels"]?.arrayValue else { throw DecodingFailure("where-now: expected payload.channels") }
        return channels.compactMap(\.stringValue)
    }

    /// Get-state, both shapes (pubnub-wire §7.6): state per channel.
    package static func getState(_ body: JSONValue, channels: [String], groups: [String]) throws(DecodingFailure) -> [String: JSONValue] {
        guard let payload = body["payload"] else { throw DecodingFailure("get-state: expected a payload") }
        if let channel = body["channel"]?.stringValue { return [channel: payload] }
        if let perChannel = payload["channels"]?.objectValue { return perChannel }
        if channels.count == 1, groups.isEmpty { return [channels[0]: payload] }
        throw DecodingFailure("get-state: expected payload.channels")
    }

    /// Set-state → `{"payload":{…}}`: the state the server stored.
    package static func setState(_ body: JSONValue) throws(DecodingFailure) -> JSONValue {
        guard let payload = body["payload"] else { throw DecodingFailure("set-state: expected a payload") }
        return payload
    }

    /// Channel-group listing → `{"payload":{"channels":[…]}}`.
    package static func groupChannels(_ body: JSONValue) throws(DecodingFailure) -> [String] {
        guard let channels = body["payload"]?["channels"]?.arrayValue else { throw DecodingFailure("channel group: expected payload.channels") }
        return channels.compactMap(\.stringValue)
    }

    /// Group listing → `{"payload":{"groups":[…]}}`.
    package static func groups(_ body: JSONValue) throws(DecodingFailure) -> [String] {
        guard let groups = body["payload"]?["groups"]?.arrayValue else { throw DecodingFailure("channel groups: expected payload.groups") }
        return groups.compactMap(\.stringValue)
    }

    /// Grant token → `{"data":{"token":"…"}}`.
    package static func grantToken(_ body: JSONValue) throws(DecodingFailure) -> String {
        guard let token = body["data"]?["token"]?.stringValue else { throw DecodingFailure("grant: expected data.token") }
        return token
    }

    private static func meta(_ value: JSONValue?) -> JSONValue? {
        guard let value else { return nil }
        if value.isNull || value == .string("") { return nil }
        return value
    }
}
