import HTTPTypes
import Hummingbird
import NIOCore
@_spi(Benchmarks) import TetherProtocol
import TetherServerCore

/// A publish or signal (pubnub-wire §5), read from the wire in the order PubNub answers its
/// errors: the target (keys, channel, uuid) first, then — after the body is read and access
/// is checked — the message and its options. Every error is PubNub's publish array
/// `[0,"<text>","<timetoken>"]` carrying the timetoken of when the request arrived.
struct PublishRequest {
    /// Where the message goes and who sends it; checked before the body is read.
    struct Target {
        var kind: EventKind
        var keyset: Keyset
        var limits: Limits
        var channel: String
        /// The timetoken error arrays carry.
        var arrivedAt: Timetoken

        init(_ wire: WireRequest, kind: EventKind, keysets: KeysetRegistry, now: Timetoken) throws(Refusal) {
            let s = wire.segments
            func refuse(_ status: HTTPResponse.Status, _ text: String) -> Refusal {
                Refusal(response: Reply.publishError(status, text, timetoken: now), message: text)
            }
            guard NameRules.validateKey(s[1]), NameRules.validateKey(s[2]), let keyset = keysets.keyset(subscribeKey: s[2]),
                  keyset.publishKey == s[1]
            else { throw refuse(.badRequest, "Invalid Key") }
            let limits = keysets.limits(for: keyset)
            if wire.uriLength > limits.maxURIBytes { throw Refusal(response: Reply.uriTooLong) }
            let channel = s[4]
            do { try NameRules.validateChannel(channel) } catch {
                throw refuse(.badRequest, "Invalid Channel: \(error)")
            }
            if NameRules.isPresence(channel) {
                throw refuse(.badRequest, "Invalid Channel: presence channels are written by the server")
            }
            if let uuid = wire.query["uuid"] {
                do { try NameRules.validateUserId(uuid) } catch {
                    throw refuse(.badRequest, "Invalid uuid: \(error)")
                }
            }
            self.kind = kind
            self.keyset = keyset
            self.limits = limits
            self.channel = channel
            self.arrivedAt = now
        }

        func refuse(_ status: HTTPResponse.Status, _ text: String) -> Refusal {
            Refusal(response: Reply.publishError(status, text, timetoken: arrivedAt), message: text)
        }
    }

    var target: Target
    /// The message as JSON text.
    var payload: String
    var meta: String?
    var customMessageType: String?
    var sequence: Int?
    var ttlHours: Double?
    /// Whether the message goes to history (`store`, and never for signals).
    var store: Bool
    /// Fire (`store=0&norep=1`): acknowledged, delivered nowhere.
    var isFire: Bool
    var publisher: String?
    /// The client's request id (`requestid`, issue #15): a repeat within the server's dedup
    /// window is answered with the original timetoken.
    var requestID: String?

    /// The longest request id accepted, in bytes (a UUID is 36).
    static let maxRequestIDBytes = 64

    /// Whether `text` is a valid request id: 1–64 bytes of printable ASCII, no space.
    static func isValidRequestID(_ text: String) -> Bool {
        let bytes = text.utf8
        return !bytes.isEmpty && bytes.count <= maxRequestIDBytes && bytes.allSatisfy { (0x21...0x7E).contains($0) }
    }

    /// Reads the message (`messageBytes`, already decompressed) and its options. Throws
    /// ``Refusal`` or, for a malformed number, `ParameterError`.
    init(_ target: Target, message messageBytes: [UInt8], _ wire: WireRequest) throws {
        let limits = target.limits
        guard String(validating: messageBytes, as: UTF8.self) != nil else { throw target.refuse(.badRequest, "Invalid JSON") }
        // At most as deep as a kept value: it is delivered inside envelopes that add levels of
        // their own, and deeper it would be stored and then break every answer that carries it.
        do {
            _ = try JSONText.validate(messageBytes, maximumDepth: JSONText.maximumValueDepth)
        } catch {
            throw target.refuse(.badRequest, error.isTooDeep ? "Invalid JSON: nested deeper than \(JSONText.maximumValueDepth) levels" : "Invalid JSON")
        }
        payload = String(decoding: messageBytes, as: UTF8.self)
        switch target.kind {
        case .signal:
            if messageBytes.count > limits.maxSignalBytes {
                throw target.refuse(.badRequest, "Signal size too large")
            }
        default:
            if messageBytes.count + target.channel.utf8.count > limits.maxMessageBytes {
                throw target.refuse(.contentTooLarge, "Message Too Large")
            }
        }
        // `meta=null` is what PubNub SDKs send for no meta on publish-file (PubNub accepts it);
        // on a plain publish it stays a bad meta (docs/protocol.md).
        if let text = wire.query["meta"], !text.isEmpty, !(text == "null" && target.kind == .file) {
            do {
                guard try JSONText.validate(text, maximumDepth: JSONText.maximumValueDepth) == .object else {
                    throw target.refuse(.badRequest, "Invalid meta: must be a JSON object")
                }
            } catch let error as JSONText.Invalid {
                throw target.refuse(.badRequest, error.isTooDeep ? "Invalid meta: nested deeper than \(JSONText.maximumValueDepth) levels"
                                                                 : "Invalid meta: must be a JSON object")
            }
            meta = text
        }
        if let cmt = wire.query["custom_message_type"], !cmt.isEmpty {
            let allowed = cmt.utf8.allSatisfy { b in
                (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A) || b == 0x2D || b == 0x5F
            }
            guard allowed, (3...50).contains(cmt.utf8.count) else {
                throw target.refuse(.badRequest, "Invalid custom_message_type: 3-50 characters of A-Z a-z 0-9 _ -")
            }
            customMessageType = cmt
        }
        sequence = try wire.integer("seqn", in: ParameterBounds.sequence)
        ttlHours = try wire.decimal("ttl", in: ParameterBounds.publishTTLHours)
        let storeFlag = wire.query["store"] ?? "1"
        guard storeFlag == "0" || storeFlag == "1" || storeFlag == "true" || storeFlag == "false" else {
            throw target.refuse(.badRequest, "Invalid store: expected 0 or 1")
        }
        // A file message (publish-file, type 4) is stored like a message.
        store = (target.kind == .message || target.kind == .file) && (storeFlag == "1" || storeFlag == "true")
        // Fire (store=0&norep=1, pubnub-wire §5.3): for server-side handlers only — reaches no
        // subscriber and no history.
        isFire = target.kind == .message && !store && wire.query["norep"] == "1"
        publisher = wire.query["uuid"]
        if let id = wire.query["requestid"] {
            guard Self.isValidRequestID(id) else {
                throw target.refuse(.badRequest, "Invalid requestid: 1-64 printable ASCII characters without spaces")
            }
            requestID = id
        }
        self.target = target
    }
}

extension TetherResponder {
    /// Publish and signal: target, body, access, message, then the hub (which stores it).
    @inline(never) nonisolated(nonsending) func publish(_ request: Request, _ wire: WireRequest, kind: EventKind) async throws -> Response {
        let target = try PublishRequest.Target(wire, kind: kind, keysets: state.keysets, now: state.hub.currentCursor)
        let limits = target.limits
        // The message: GET carries it in the path, POST in the (possibly compressed) body.
        var messageBytes: [UInt8]
        if request.method == .post {
            let maxBody = limits.maxMessageBytes * 4 + 1024
            guard let body = try? await request.body.collect(upTo: maxBody) else {
                throw target.refuse(.contentTooLarge, "Message Too Large")
            }
            messageBytes = Array(buffer: body)
            try authorize(target.keyset, wire, method: "POST", channels: [target.channel], groups: [], permission: .write,
                          body: messageBytes)
            if let encoding = request.headers[.contentEncoding]?.lowercased(), encoding.contains("gzip") || encoding.contains("deflate") {
                do {
                    messageBytes = try Decompression.inflate(messageBytes, limit: limits.maxMessageBytes + 1)
                } catch .tooLarge {
                    throw target.refuse(.contentTooLarge, "Message Too Large")
                } catch {
                    throw target.refuse(.badRequest, "Invalid compressed body")
                }
            }
        } else {
            messageBytes = Array(wire.segments[6].utf8)
            try authorize(target.keyset, wire, channels: [target.channel], groups: [], permission: .write)
        }
        let publish = try PublishRequest(target, message: messageBytes, wire)
        switch try await commitPublish(publish, kind: kind) {
        case .sent(let timetoken, let isRepeat):
            var w = JSONWriter(capacity: 32)
            w.raw("[1,\"Sent\",")
            w.timetokenString(timetoken)
            w.raw("]")
            let body = w.bytes
            guard isRepeat else { return Reply.json(.ok, body) }
            // Tether extension: PubNub's answer, plus a header saying nothing new was stored.
            // Exposed to browsers' scripts too (CORS hides unlisted headers).
            return Reply.json(.ok, body, extraHeaders: [.tetherDuplicate: "1", .accessControlExposeHeaders: "Tether-Duplicate"])
        case .failed(let status, let text, let retryAfter, let at):
            return Reply.json(status, ErrorBody.publish(text, timetoken: at), extraHeaders: Self.retryAfterHeader(retryAfter))
        }
    }

    /// What a publish that passed its checks came to.
    enum PublishOutcome {
        /// Acknowledged: the timetoken, and whether it was a repeat of a request id the server
        /// already had (nothing new stored or delivered).
        case sent(Timetoken, isRepeat: Bool)
        /// A store failure: status, the error array's text, `Retry-After`, the error's timetoken.
        case failed(HTTPResponse.Status, String, retryAfter: Int?, at: Timetoken)
    }

    /// The hub part of a publish, shared by REST and the WebSocket session: a fire is only
    /// acknowledged; otherwise the hub reserves, stores and delivers the message.
    nonisolated(nonsending) func commitPublish(_ publish: PublishRequest, kind: EventKind) async throws -> PublishOutcome {
        let target = publish.target
        if publish.isFire {
            // Tether has no server-side handlers yet: acknowledged with a fresh timetoken.
            state.metrics.recordPublish(kind: "fire")
            return .sent(state.hub.currentCursor.successor, isRepeat: false)
        }
        let retentionHours = publish.ttlHours.flatMap { $0 > 0 ? $0 : nil } ?? target.keyset.historyRetentionHours
        let subscribeKey = target.keyset.subscribeKey
        let channel = target.channel
        let outcome: HubPublishResult
        do {
            outcome = try await state.hub.publish({ tt in
                SubscribeEnvelope(timetoken: tt, subscribeKey: subscribeKey, channel: channel, payload: publish.payload,
                                  publisher: publish.publisher, meta: publish.meta, kind: kind,
                                  customMessageType: publish.customMessageType, sequence: publish.sequence)
            }, store: publish.store ? { tt in
                StoredMessage(subscribeKey: subscribeKey, channel: channel, timetoken: tt, kind: kind, publisher: publish.publisher,
                              payload: publish.payload, meta: publish.meta, customMessageType: publish.customMessageType,
                              sequence: publish.sequence,
                              expiresAt: retentionHours > 0 ? tt.adding(seconds: retentionHours * 3600) : nil)
            } : nil, dedupKey: publish.requestID.map { DedupKey(subscribeKey: subscribeKey, publisher: publish.publisher, requestID: $0) })
        } catch let error as StoreError {
            // The reservation was abandoned: nothing was delivered, and (unless the outcome is
            // unknown) nothing stored.
            state.metrics.recordPublish(kind: "store-failed")
            let (status, text, retryAfter) = Self.storeFailure(error)
            return .failed(status, text, retryAfter: retryAfter, at: state.hub.currentCursor)
        }
        if outcome.isRepeat {
            return .sent(outcome.timetoken, isRepeat: true)
        }
        state.metrics.recordPublish(kind: kind == .signal ? "signal" : kind == .file ? "file" : "message")
        if kind == .message {
            state.push.messagePublished(subscribeKey: subscribeKey, channel: channel, timetoken: outcome.timetoken, payload: publish.payload,
                                        includingHeld: state.hub.shared == nil)
        }
        state.console?.published()
        return .sent(outcome.timetoken, isRepeat: false)
    }
}
