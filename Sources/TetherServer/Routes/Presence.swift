import HTTPTypes
import Hummingbird
@_spi(Benchmarks) import TetherProtocol
import TetherServerCore

/// A presence request (pubnub-wire §7): its keyset, and the channels and groups it names.
struct PresenceRequest {
    var keyset: Keyset
    var limits: Limits

    init(_ wire: WireRequest, keysets: KeysetRegistry) throws(RequestError) {
        keyset = try keysets.keyset(subscribeKey: wire.segments[3], service: "Presence", uriLength: wire.uriLength)
        limits = keysets.limits(for: keyset)
    }

    /// Channels (from a path segment) and groups (from `channel-group`), validated; presence
    /// names are kept here and ignored by the presence model.
    func targets(_ channels: [String], _ wire: WireRequest) throws(RequestError) -> (channels: [String], groups: [String]) {
        let groups = wire.queryNames("channel-group")
        try RequestValidation.checkCounts(channels: channels, groups: groups, limits: limits, service: "Presence")
        for channel in channels {
            do { try NameRules.validateChannel(channel) } catch {
                throw RequestError(response: Reply.error(.badRequest, service: "Presence", "Invalid channel \(String(reflecting: channel)): \(error)"))
            }
        }
        for group in groups {
            do { try NameRules.validateGroup(group) } catch {
                throw RequestError(response: Reply.error(.badRequest, service: "Presence", "Invalid channel group \(String(reflecting: group)): \(error)"))
            }
        }
        return (channels, groups)
    }
}

/// Here-now's options, read after the access check.
struct HereNowOptions {
    /// `state`: list each occupant's state.
    var includeState: Bool
    /// Not `disable_uuids`: list occupants, not only count them.
    var includeUUIDs: Bool
    /// `limit`: occupants listed per channel, at most 1,000.
    var limit: Int
    /// `offset`: occupants skipped per channel.
    var offset: Int

    init(_ wire: WireRequest) throws(ParameterError) {
        includeState = wire.bool("state")
        includeUUIDs = !wire.bool("disable_uuids")
        limit = min(try wire.integer("limit", in: ParameterBounds.hereNowLimit) ?? 1000, 1000)
        offset = try wire.integer("offset", in: ParameterBounds.hereNowOffset) ?? 0
    }
}

extension TetherResponder {
    /// Here-now, where-now, heartbeat, leave, and presence state.
    @inline(never) func presence(_ route: Route, _ wire: WireRequest) async throws -> Response {
        let s = wire.segments
        // /v2/presence/sub-key/{sub}[/channel/{chs}[/heartbeat|/leave|/uuid/{uuid}[/data]]] or /uuid/{uuid}
        let request = try PresenceRequest(wire, keysets: state.keysets)
        let keyset = request.keyset
        let key = keyset.subscribeKey
        switch route {
        case .hereNowGlobal:
            if keyset.secretKey != nil { try requireAdmin(keyset, wire, method: "GET") }
            return try await hereNow(key: key, channels: nil, groups: [], wire)
        case .hereNow where s.count == 4:
            let groups = try request.targets([], wire).groups
            try authorize(keyset, wire, channels: [], groups: groups, permission: .read)
            return try await hereNow(key: key, channels: nil, groups: groups, wire)
        case .hereNow:
            let (channels, groups) = try request.targets(wire.pathNames(5), wire)
            try authorize(keyset, wire, channels: channels, groups: groups, permission: .read)
            return try await hereNow(key: key, channels: channels, groups: groups, wire)
        case .whereNow:
            // No permission, as PubNub has it: where-now names channels, not their content.
            let uuid = s[5]
            do { try NameRules.validateUserId(uuid) } catch {
                return Reply.error(.badRequest, service: "Presence", "Invalid uuid: \(error)")
            }
            let channels = try await state.presence.whereNow(subscribeKey: key, uuid: uuid)
            var w = JSONWriter()
            w.raw("{\"status\":200,\"message\":\"OK\",\"payload\":{\"channels\":")
            w.stringArray(channels)
            w.raw("},\"service\":\"Presence\"}")
            return Reply.json(.ok, w.bytes)
        case .heartbeat:
            let (channels, groups) = try request.targets(wire.pathNames(5), wire)
            let uuid = try RequestValidation.requiredUserId(wire, service: "Presence")
            let verdict = keyset.secretKey == nil ? AccessManager.SignatureVerdict.absent
                : state.access.verifySignature(keyset: keyset, method: "GET", rawPath: wire.rawPath, rawQuery: wire.rawQuery, body: [])
            try authorize(keyset, wire, channels: channels.filter { !NameRules.isPresence($0) },
                          groups: groups.filter { !NameRules.isPresence($0) }, permission: .read, verified: verdict)
            let timeout = try RequestValidation.heartbeatSeconds(wire)
            var states = try RequestValidation.channelStates(wire, service: "Presence", channels: channels, groups: groups)
            // Setting state is acting for the uuid, as set-state is (docs/security.md): without
            // that proof the heartbeat counts and its state is ignored. (Refused whole, it would
            // stop a PubNub JavaScript client, which repeats the state of a refused `setState`
            // on every later heartbeat and subscribe.)
            if !states.isEmpty, !mayAct(as: uuid, keyset, wire, verdict: verdict) { states = [:] }
            await state.presence.heartbeat(subscribeKey: key, uuid: uuid, channels: channels, groups: groups, timeoutSeconds: timeout, states: states)
            return Reply.json(.ok, #"{"status":200,"message":"OK","service":"Presence"}"#)
        case .leave:
            let (channels, groups) = try request.targets(wire.pathNames(5), wire)
            let uuid = try RequestValidation.requiredUserId(wire, service: "Presence")
            // Tether deviation (docs/compatibility.md): on an access-controlled keyset a leave
            // must come from a subscriber of those channels acting for itself, so nobody forges
            // leave events for other users.
            try authorizeActing(as: uuid, keyset, wire, channels: channels.filter { !NameRules.isPresence($0) },
                                groups: groups.filter { !NameRules.isPresence($0) }, permission: .read)
            await state.presence.leave(subscribeKey: key, uuid: uuid, channels: channels, groups: groups)
            return Reply.json(.ok, #"{"status":200,"action":"leave","message":"OK","service":"Presence"}"#)
        case .getState:
            let (channels, groups) = try request.targets(wire.pathNames(5), wire)
            try authorize(keyset, wire, channels: channels, groups: groups, permission: .read)
            return try await getState(key: key, uuid: s[7], channels: channels, groups: groups)
        case .setState:
            let (channels, groups) = try request.targets(wire.pathNames(5), wire)
            let uuid = s[7]
            do { try NameRules.validateUserId(uuid) } catch {
                return Reply.error(.badRequest, service: "Presence", "Invalid uuid: \(error)")
            }
            // Tether deviation (docs/compatibility.md): state is set by its own uuid (or a
            // signed server), never by another client.
            try authorizeActing(as: uuid, keyset, wire, channels: channels, groups: groups, permission: .read)
            guard let text = wire.query["state"], !text.isEmpty else {
                return Reply.json(.badRequest, #"{"status":400,"error":1,"message":"No state specified.","service":"Presence"}"#)
            }
            switch Result(catching: { () throws(JSONText.Invalid) in try JSONText.validate(text, maximumDepth: JSONText.maximumValueDepth) }) {
            case .success(.object):
                break
            case .failure(let error) where error.isTooDeep:
                return Reply.error(.badRequest, service: "Presence", "Invalid state: nested deeper than \(JSONText.maximumValueDepth) levels")
            default:
                return Reply.error(.badRequest, service: "Presence", "Invalid state: expected a JSON object")
            }
            try await state.presence.setState(subscribeKey: key, uuid: uuid, channels: channels, groups: groups, state: text)
            var w = JSONWriter()
            w.raw("{\"status\":200,\"message\":\"OK\",\"payload\":")
            w.raw(text.utf8)
            w.raw(",\"service\":\"Presence\"}")
            return Reply.json(.ok, w.bytes)
        default:
            return Reply.error(.notFound, service: "Presence", "Not found: '/\(s.joined(separator: "/"))'")
        }
    }

    private func hereNow(key: String, channels requested: [String]?, groups: [String], _ wire: WireRequest) async throws -> Response {
        let options = try HereNowOptions(wire)
        let (includeState, includeUUIDs, limit, offset) = (options.includeState, options.includeUUIDs, options.limit, options.offset)
        let presence = state.presence

        func occupantsJSON(_ w: inout JSONWriter, _ occupants: [(uuid: String, state: String?)]) {
            w.raw("[")
            for (i, occupant) in occupants.dropFirst(offset).prefix(limit).enumerated() {
                if i > 0 { w.raw(",") }
                if includeState {
                    w.raw("{\"uuid\":")
                    w.string(occupant.uuid)
                    if let s = occupant.state {
                        w.raw(",\"state\":")
                        w.raw(s.utf8)
                    }
                    w.raw("}")
                } else {
                    w.string(occupant.uuid)
                }
            }
            w.raw("]")
        }

        // One channel and no groups: the top-level shape (pubnub-wire §7.3).
        if let requested, requested.count == 1, groups.isEmpty {
            let found = try await presence.hereNow(subscribeKey: key, channels: requested, includeUUIDs: includeUUIDs)[requested[0]]
            let (occupancy, occupants) = found ?? (0, [])
            var w = JSONWriter()
            w.raw("{\"status\":200,\"message\":\"OK\",\"service\":\"Presence\"")
            if includeUUIDs {
                w.raw(",\"uuids\":")
                occupantsJSON(&w, occupants)
            }
            w.raw(",\"occupancy\":")
            w.number(occupancy)
            w.raw("}")
            return Reply.json(.ok, w.bytes)
        }
        var names: [String]
        if let requested {
            names = presence.concreteChannels(subscribeKey: key, channels: requested, groups: groups)
        } else if !groups.isEmpty {
            names = presence.concreteChannels(subscribeKey: key, channels: [], groups: groups)
        } else {
            names = try await presence.occupiedChannels(subscribeKey: key)
        }
        // The occupancy, and the sorted occupant list only when the answer shows it.
        let found = try await presence.hereNow(subscribeKey: key, channels: names, includeUUIDs: includeUUIDs)
        var w = JSONWriter(capacity: 1024)
        w.raw("{\"status\":200,\"message\":\"OK\",\"service\":\"Presence\",\"payload\":{\"channels\":{")
        var totalChannels = 0
        var totalOccupancy = 0
        for name in names {
            guard let (occupancy, occupants) = found[name], occupancy > 0 else { continue }
            if totalChannels > 0 { w.raw(",") }
            totalChannels += 1
            totalOccupancy += occupancy
            w.string(name)
            w.raw(":{")
            if includeUUIDs {
                w.raw("\"uuids\":")
                occupantsJSON(&w, occupants)
                w.raw(",")
            }
            w.raw("\"occupancy\":")
            w.number(occupancy)
            w.raw("}")
        }
        w.raw("},\"total_channels\":")
        w.number(totalChannels)
        w.raw(",\"total_occupancy\":")
        w.number(totalOccupancy)
        w.raw("}}")
        return Reply.json(.ok, w.bytes)
    }

    private func getState(key: String, uuid: String, channels: [String], groups: [String]) async throws -> Response {
        let presence = state.presence
        let concrete = presence.concreteChannels(subscribeKey: key, channels: channels, groups: groups)
        var w = JSONWriter()
        if channels.count == 1, groups.isEmpty {
            let value = try await presence.states(subscribeKey: key, uuid: uuid, channels: channels)[channels[0]] ?? "{}"
            w.raw("{\"status\":200,\"uuid\":")
            w.string(uuid)
            w.raw(",\"service\":\"Presence\",\"message\":\"OK\",\"payload\":")
            w.raw(value.utf8)
            w.raw(",\"channel\":")
            w.string(channels[0])
            w.raw("}")
        } else {
            w.raw("{\"status\":200,\"message\":\"OK\",\"payload\":{\"channels\":{")
            var first = true
            let states = try await presence.states(subscribeKey: key, uuid: uuid, channels: concrete)
            for channel in concrete {
                guard let value = states[channel] else { continue }
                if !first { w.raw(",") }
                first = false
                w.string(channel)
                w.raw(":")
                w.raw(value.utf8)
            }
            w.raw("}},\"service\":\"Presence\",\"uuid\":")
            w.string(uuid)
            w.raw("}")
        }
        return Reply.json(.ok, w.bytes)
    }
}
