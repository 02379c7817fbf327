/// The kind of an event as carried in a subscribe envelope's `e` field.
public enum EventKind: Int, Sendable, Hashable, Codable {
    /// A published message (`e` absent or 0).
    case message = 0
    /// A signal (`e: 1`): small, never stored.
    case signal = 1
    /// An App Context object event (`e: 2`).
    case object = 2
    /// A message action event (`e: 3`).
    case messageAction = 3
    /// A file message (`e: 4`).
    case file = 4
}

/// One event as it appears in the `m` array of a subscribe response (pubnub-wire §6.3).
///
/// The server encodes each envelope once, when the event is published, and splices in the
/// per-subscription `b` field at delivery time (see ``encodedWithMatch(_:)``).
@_spi(Benchmarks) public struct SubscribeEnvelope: Sendable, Hashable {
    /// Publish timetoken (`p.t`).
    package var timetoken: Timetoken
    /// Region (`p.r`); never 0.
    package var region: Int
    /// Subscribe key (`k`).
    package var subscribeKey: String
    /// The actual channel (`c`); presence events use `{ch}-pnpres`.
    package var channel: String
    /// The payload (`d`) as JSON text.
    package var payload: String
    /// Publisher uuid (`i`), absent for presence events.
    package var publisher: String?
    /// Publish metadata (`u`) as JSON object text.
    package var meta: String?
    /// Event kind (`e`); omitted on the wire for plain messages.
    package var kind: EventKind
    /// Custom message type (`cmt`).
    package var customMessageType: String?
    /// Publisher sequence number (`s`).
    package var sequence: Int?
    /// Shard id (`a`), always present on the wire.
    package var shard: String

    /// Creates an envelope.
    @_spi(Benchmarks) public init(
        timetoken: Timetoken, region: Int = 1, subscribeKey: String, channel: String, payload: String,
        publisher: String? = nil, meta: String? = nil, kind: EventKind = .message, customMessageType: String? = nil,
        sequence: Int? = nil, shard: String = "1"
    ) {
        self.timetoken = timetoken
        self.region = region
        self.subscribeKey = subscribeKey
        self.channel = channel
        self.payload = payload
        self.publisher = publisher
        self.meta = meta
        self.kind = kind
        self.customMessageType = customMessageType
        self.sequence = sequence
        self.shard = shard
    }

    /// The envelope as JSON object bytes, without `b`.
    @_spi(Benchmarks) public func encoded() -> [UInt8] {
        var w = JSONWriter(capacity: encodedCapacity)
        w.raw("{\"a\":")
        w.string(shard)
        w.raw(",\"f\":0")
        if kind != .message {
            w.raw(",\"e\":")
            w.number(kind.rawValue)
        }
        if let publisher {
            w.raw(",\"i\":")
            w.string(publisher)
        }
        if let sequence {
            w.raw(",\"s\":")
            w.number(sequence)
        }
        w.raw(",\"p\":{\"t\":")
        w.timetokenString(timetoken)
        w.raw(",\"r\":")
        w.number(region)
        w.raw("},\"k\":")
        w.string(subscribeKey)
        w.raw(",\"c\":")
        w.string(channel)
        w.raw(",\"d\":")
        w.raw(payload.utf8)
        if let meta {
            w.raw(",\"u\":")
            w.raw(meta.utf8)
        }
        if let customMessageType {
            w.raw(",\"cmt\":")
            w.string(customMessageType)
        }
        w.raw("}")
        return w.bytes
    }

    /// The length of ``encoded()`` when no string in it needs escaping (one that does grows the
    /// buffer once), and a timetoken of 20 digits: the in-memory windows keep every encoded
    /// envelope, so its buffer is sized to fit rather than with a fixed allowance (128 bytes
    /// over the payload and meta used to leave ~30 bytes unused in a short event, and a long
    /// channel name or publisher made the buffer double).
    package var encodedCapacity: Int {
        // {"a":"","f":0,"p":{"t":"<20 digits>","r":<region>},"k":"","c":"","d":}
        var size = 72 + shard.utf8.count + subscribeKey.utf8.count + channel.utf8.count + payload.utf8.count
        if region < 0 || region > 9 { size += 19 }
        if kind != .message { size += 8 }  // ,"e":<kind>
        if let publisher { size += 7 + publisher.utf8.count }  // ,"i":""
        if sequence != nil { size += 25 }  // ,"s":<sequence>
        if let meta { size += 5 + meta.utf8.count }  // ,"u":
        if let customMessageType { size += 9 + customMessageType.utf8.count }  // ,"cmt":""
        return size
    }

    /// Splices the subscription match `b` (a group, wildcard pattern or presence name) into an
    /// envelope produced by ``encoded()``.
    @_spi(Benchmarks) public static func encodedWithMatch(_ encoded: [UInt8], match: String?) -> [UInt8] {
        guard let match else { return encoded }
        var w = JSONWriter(capacity: encoded.count + match.utf8.count + 8)
        w.raw("{\"b\":")
        w.string(match)
        w.raw(",")
        w.raw(encoded.dropFirst())
        return w.bytes
    }
}

/// Builds the body of a subscribe v2 response: `{"t":{"t":"<cursor>","r":1},"m":[…]}`.
@_spi(Benchmarks) public enum SubscribeResponseBody {
    /// Encodes the cursor and already-encoded envelopes into a response body.
    @_spi(Benchmarks) public static func encode(cursor: Timetoken, region: Int, envelopes: [[UInt8]]) -> [UInt8] {
        var capacity = 48
        for e in envelopes { capacity += e.count + 1 }
        var w = JSONWriter(capacity: capacity)
        w.raw("{\"t\":{\"t\":")
        w.timetokenString(cursor)
        w.raw(",\"r\":")
        w.number(region)
        w.raw("},\"m\":[")
        for (i, e) in envelopes.enumerated() {
            if i > 0 { w.raw(",") }
            w.raw(e)
        }
        w.raw("]}")
        return w.bytes
    }
}
