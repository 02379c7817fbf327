import HTTPTypes
import Hummingbird
import NIOCore
@_spi(Benchmarks) import TetherProtocol
import TetherServerCore

/// A request of the storage family (pubnub-wire §9: history v2, fetch v3, history with
/// actions, delete, message counts): its keyset and channels, checked before access. Options
/// are read after the access check, by each endpoint.
struct StorageRequest {
    /// The shape of the family's error bodies: history v2 answers the service object, v3
    /// endpoints the history object.
    enum ErrorShape {
        case service
        case history

        func response(_ status: Int, _ message: String) -> Response {
            switch self {
            case .service: Reply.error(.init(code: status), service: "Storage", message)
            case .history: Reply.historyError(.init(code: status), message)
            }
        }
    }

    var keyset: Keyset
    var channels: [String]

    init(_ wire: WireRequest, keysets: KeysetRegistry, errors shape: ErrorShape) throws(RequestError) {
        keyset = try keysets.keyset(subscribeKey: wire.segments[3], service: "Storage", uriLength: wire.uriLength)
        let channels = wire.pathNames(5)
        if channels.isEmpty { throw RequestError(response: shape.response(400, "No channels given")) }
        for channel in channels {
            do { try NameRules.validateChannel(channel) } catch {
                throw RequestError(response: shape.response(400, "Invalid channel \(String(reflecting: channel)): \(error)"))
            }
        }
        self.channels = channels
    }

    /// Refuses unless exactly one channel is named.
    func requireOneChannel(_ refusal: @autoclosure () -> Response) throws(Refusal) {
        guard channels.count == 1 else { throw Refusal(response: refusal()) }
    }
}

/// History v2's options, read after the access check.
struct HistoryOptions {
    /// `count`: at most 100 (larger values are served as 100, as PubNub does).
    var count: Int
    var start: Timetoken?
    var end: Timetoken?
    var reverse: Bool
    var includeToken: Bool
    var includeMeta: Bool
    /// `string_message_token`: timetokens as strings.
    var timetokensAsStrings: Bool

    init(_ wire: WireRequest) throws(ParameterError) {
        count = min(try wire.integer("count", in: ParameterBounds.historyCount) ?? 100, 100)
        start = try wire.timetoken("start")
        end = try wire.timetoken("end")
        reverse = wire.bool("reverse")
        includeToken = wire.bool("include_token")
        includeMeta = wire.bool("include_meta")
        timetokensAsStrings = wire.bool("string_message_token")
    }
}

/// Fetch v3's (and history with actions') options, read after the access check.
struct FetchOptions {
    /// `max` messages per channel, at most `ceiling`.
    var max: Int
    var start: Timetoken?
    var end: Timetoken?
    var includeMeta: Bool
    var includeUUID: Bool
    var includeType: Bool
    var includeCustomType: Bool

    init(_ wire: WireRequest, ceiling: Int) throws(ParameterError) {
        max = Swift.min(try wire.integer("max", in: ParameterBounds.fetchMax) ?? ceiling, ceiling)
        start = try wire.timetoken("start")
        end = try wire.timetoken("end")
        includeMeta = wire.bool("include_meta")
        includeUUID = wire.bool("include_uuid")
        includeType = wire.bool("include_message_type")
        includeCustomType = wire.bool("include_custom_message_type")
    }
}

/// Message counts' cursors: one per channel (`channelsTimetoken`) or one for all (`timetoken`).
struct MessageCountCursors {
    var pairs: [(String, Timetoken)]

    init(_ wire: WireRequest, channels: [String]) throws {
        if let list = wire.query["channelsTimetoken"], !list.isEmpty {
            let tokens = list.split(separator: ",", omittingEmptySubsequences: false).map { Timetoken(parsing: $0) }
            guard tokens.count == channels.count, tokens.allSatisfy({ $0 != nil }) else {
                throw Refusal(response: Reply.historyError(.badRequest, "Invalid Arguments"))
            }
            pairs = zip(channels, tokens.compactMap { $0 }).map { ($0, $1) }
        } else if let tt = try wire.timetoken("timetoken") {
            pairs = channels.map { ($0, tt) }
        } else {
            throw Refusal(response: Reply.historyError(.badRequest, "Invalid Arguments"))
        }
    }
}

extension TetherResponder {
    // MARK: - History v2

    @inline(never) func historyV2(_ wire: WireRequest) async throws -> Response {
        let request = try StorageRequest(wire, keysets: state.keysets, errors: .service)
        try request.requireOneChannel(Reply.error(.badRequest, service: "Storage", "History v2 takes exactly one channel"))
        try authorize(request.keyset, wire, channels: request.channels, groups: [], permission: .read)
        let options = try HistoryOptions(wire)
        let messages = try await state.hub.messages.history(subscribeKey: request.keyset.subscribeKey, channel: request.channels[0],
                                                     start: options.start, end: options.end, count: options.count,
                                                     reverse: options.reverse)
        let (includeToken, includeMeta, asStrings) = (options.includeToken, options.includeMeta, options.timetokensAsStrings)
        var w = JSONWriter(capacity: 64 + messages.reduce(0) { $0 + $1.payload.utf8.count + 64 })
        w.raw("[[")
        for (i, m) in messages.enumerated() {
            if i > 0 { w.raw(",") }
            if includeToken || includeMeta {
                w.raw("{\"message\":")
                w.raw(m.payload.utf8)
                w.raw(",\"timetoken\":")
                if asStrings { w.timetokenString(m.timetoken) } else { w.number(m.timetoken.rawValue) }
                if includeMeta {
                    w.raw(",\"meta\":")
                    if let meta = m.meta { w.raw(meta.utf8) } else { w.raw("\"\"") }
                }
                w.raw("}")
            } else {
                w.raw(m.payload.utf8)
            }
        }
        w.raw("],")
        let first = messages.first?.timetoken ?? .zero
        let last = messages.last?.timetoken ?? .zero
        if asStrings { w.timetokenString(first) } else { w.number(first.rawValue) }
        w.raw(",")
        if asStrings { w.timetokenString(last) } else { w.number(last.rawValue) }
        w.raw("]")
        return Reply.json(.ok, w.bytes)
    }

    // MARK: - Fetch v3 and history with actions

    @inline(never) func fetchV3(_ wire: WireRequest, withActions: Bool) async throws -> Response {
        let request = try StorageRequest(wire, keysets: state.keysets, errors: .history)
        let channels = request.channels
        if withActions {
            try request.requireOneChannel(Reply.historyError(.badRequest, "History with actions takes exactly one channel"))
        }
        if channels.count > 500 { throw Refusal(response: Reply.historyError(.badRequest, "Too many channels (at most 500)")) }
        let keyset = request.keyset
        try authorize(keyset, wire, channels: channels, groups: [], permission: .read)
        let ceiling = channels.count == 1 && !withActions ? 100 : 25
        let options = try FetchOptions(wire, ceiling: ceiling)
        let (max, start, end) = (options.max, options.start, options.end)
        let (includeMeta, includeUUID) = (options.includeMeta, options.includeUUID)
        let (includeType, includeCustomType) = (options.includeType, options.includeCustomType)
        // One channel's messages as `"name":[…]` (or nothing when it has none).
        let store = state.messageActions
        let log = state.hub.messages
        let subscribeKey = keyset.subscribeKey
        @Sendable func channelEntry(_ channel: String, first: Bool) async throws -> (bytes: [UInt8], oldest: Timetoken?, full: Bool) {
            let messages = try await log.history(subscribeKey: subscribeKey, channel: channel, start: start, end: end,
                                                   count: max, reverse: false)
            guard !messages.isEmpty else { return ([], nil, false) }
            // History with actions: every action of the page's messages, in one range read.
            let actions = withActions
                ? try await store.actions(subscribeKey: subscribeKey, channel: channel, messagesFrom: messages[0].timetoken,
                                          through: messages[messages.count - 1].timetoken)
                : [:]
            var w = JSONWriter(capacity: 64 + messages.reduce(0) { $0 + $1.payload.utf8.count + ($1.meta?.utf8.count ?? 0) + 96 })
            if !first { w.raw(",") }
            w.string(channel)
            w.raw(":[")
            for (i, m) in messages.enumerated() {
                if i > 0 { w.raw(",") }
                w.raw("{\"message\":")
                w.raw(m.payload.utf8)
                w.raw(",\"timetoken\":")
                w.timetokenString(m.timetoken)
                if includeUUID {
                    w.raw(",\"uuid\":")
                    if let p = m.publisher { w.string(p) } else { w.raw("null") }
                }
                if includeMeta {
                    w.raw(",\"meta\":")
                    if let meta = m.meta { w.raw(meta.utf8) } else { w.raw("\"\"") }
                }
                if includeType {
                    w.raw(",\"message_type\":")
                    if m.kind == .message { w.raw("null") } else { w.number(m.kind.rawValue) }
                }
                if includeCustomType {
                    w.raw(",\"custom_message_type\":")
                    if let cmt = m.customMessageType { w.string(cmt) } else { w.raw("null") }
                }
                if withActions { Self.writeActions(&w, actions[m.timetoken] ?? []) }
                w.raw("}")
            }
            w.raw("]")
            return (w.bytes, messages.first?.timetoken, messages.count == max)
        }
        let head = Array("{\"status\":200,\"error\":false,\"error_message\":\"\",\"channels\":{".utf8)
        if channels.count == 1 {
            let entry = try await channelEntry(channels[0], first: true)
            var w = JSONWriter(capacity: head.count + entry.bytes.count + 256)
            w.raw(head)
            w.raw(entry.bytes)
            w.raw("}")
            if withActions, entry.full, let oldest = entry.oldest {
                w.raw(",\"more\":{\"url\":")
                w.string("/v3/history-with-actions/sub-key/\(keyset.subscribeKey)/channel/\(PercentCoding.encode(channels[0]))?start=\(oldest.rawValue)&max=\(max)")
                w.raw(",\"start\":")
                w.timetokenString(oldest)
                w.raw(",\"max\":")
                w.number(max)
                w.raw("}")
            }
            w.raw("}")
            return Reply.json(.ok, w.bytes)
        }
        // Several channels (up to 500 × 25 messages of up to 32 KiB): streamed one channel at a
        // time, so the response never sits whole in memory. A store failure mid-way aborts the
        // connection (the client sees a truncated response and retries), never a wrong body.
        let body = ResponseBody { writer in
            try await writer.write(ByteBuffer(bytes: head))
            var first = true
            for channel in channels {
                let entry = try await channelEntry(channel, first: first)
                guard !entry.bytes.isEmpty else { continue }
                first = false
                try await writer.write(ByteBuffer(bytes: entry.bytes))
            }
            try await writer.write(ByteBuffer(string: "}}"))
            try await writer.finish(nil)
        }
        return Reply.json(.ok, body: body)
    }

    /// A message's actions as history with actions answers them (PubNub's shape):
    /// `"actions":{"<type>":{"<value>":[{"uuid":"…","actionTimetoken":"…"}]}}`, oldest first.
    static func writeActions(_ w: inout JSONWriter, _ actions: [StoredAction]) {
        w.raw(",\"actions\":{")
        var types: [String] = []
        var byType: [String: [String: [StoredAction]]] = [:]
        var valueOrder: [String: [String]] = [:]
        for action in actions {
            if byType[action.type] == nil { types.append(action.type) }
            if byType[action.type, default: [:]][action.value] == nil { valueOrder[action.type, default: []].append(action.value) }
            byType[action.type, default: [:]][action.value, default: []].append(action)
        }
        for (i, type) in types.enumerated() {
            if i > 0 { w.raw(",") }
            w.string(type)
            w.raw(":{")
            for (j, value) in (valueOrder[type] ?? []).enumerated() {
                if j > 0 { w.raw(",") }
                w.string(value)
                w.raw(":[")
                for (k, action) in (byType[type]?[value] ?? []).enumerated() {
                    if k > 0 { w.raw(",") }
                    w.raw("{\"uuid\":")
                    w.string(action.uuid)
                    w.raw(",\"actionTimetoken\":")
                    w.timetokenString(action.actionTimetoken)
                    w.raw("}")
                }
                w.raw("]")
            }
            w.raw("}")
        }
        w.raw("}")
    }

    // MARK: - Delete

    @inline(never) func deleteMessages(_ wire: WireRequest) async throws -> Response {
        let request = try StorageRequest(wire, keysets: state.keysets, errors: .history)
        try request.requireOneChannel(Reply.historyError(.badRequest, "Delete takes exactly one channel"))
        try authorize(request.keyset, wire, method: "DELETE", channels: request.channels, groups: [], permission: .delete)
        let start = try wire.timetoken("start")
        let end = try wire.timetoken("end")
        try await state.hub.messages.delete(subscribeKey: request.keyset.subscribeKey, channel: request.channels[0], start: start, end: end)
        return Reply.json(.ok, "{\"status\":200,\"error\":false,\"error_message\":\"\"}")
    }

    // MARK: - Message counts

    @inline(never) func messageCounts(_ wire: WireRequest) async throws -> Response {
        let request = try StorageRequest(wire, keysets: state.keysets, errors: .history)
        let channels = request.channels
        if channels.count > 100 { throw Refusal(response: Reply.historyError(.badRequest, "Invalid Arguments")) }
        try authorize(request.keyset, wire, channels: channels, groups: [], permission: .read)
        let cursors = try MessageCountCursors(wire, channels: channels)
        // Counted through the hub's visible cursor, read first: every message at or below it is
        // committed (so in the store), and one committed during the count is not counted.
        let through = state.hub.currentCursor
        let counts = try await state.hub.messages.messageCounts(subscribeKey: request.keyset.subscribeKey, channels: cursors.pairs,
                                                         through: through)
        var w = JSONWriter()
        w.raw("{\"status\":200,\"error\":false,\"error_message\":\"\",\"channels\":{")
        for (i, channel) in channels.enumerated() {
            if i > 0 { w.raw(",") }
            w.string(channel)
            w.raw(":")
            w.number(counts[channel] ?? 0)
        }
        w.raw("}}")
        return Reply.json(.ok, w.bytes, extraHeaders: [.tetherCountedThrough: String(through.rawValue),
                                                       .accessControlExposeHeaders: "Tether-Counted-Through"])
    }
}
