import HTTPTypes
import Hummingbird
@_spi(Benchmarks) import TetherProtocol
import TetherServerCore

/// Channels added to and removed from a group (`add`, `remove`), read after the access check.
/// No change at all means "list the group's channels".
struct ChannelGroupChange {
    var add: [String]
    var remove: [String]

    var isEmpty: Bool { add.isEmpty && remove.isEmpty }

    init(_ wire: WireRequest) throws(Refusal) {
        add = wire.queryNames("add")
        remove = wire.queryNames("remove")
        for channel in add + remove {
            do { try NameRules.validateChannel(channel) } catch {
                throw Refusal(response: Self.registryError("Reserved character in input parameters."))
            }
            if NameRules.isPresence(channel) { throw Refusal(response: Self.registryError("Reserved character in input parameters.")) }
        }
    }

    /// The channel registry's 400 body.
    static func registryError(_ message: String) -> Response {
        var w = JSONWriter()
        w.raw("{\"status\":400,\"message\":")
        w.string(message)
        w.raw(",\"service\":\"channel-registry\",\"error\":true}")
        return Reply.json(.badRequest, w.bytes)
    }
}

/// Channel groups (pubnub-wire §16).
extension TetherResponder {
    /// List groups, list or change a group's channels, delete a group.
    @inline(never) func channelGroups(_ route: Route, _ wire: WireRequest) async throws -> Response {
        let s = wire.segments
        // /v1/channel-registration/sub-key/{sub}/channel-group[/{cg}[/remove]]
        guard s.count >= 5, s[2] == "sub-key", s[4] == "channel-group" else {
            return Reply.error(.notFound, service: "channel-registry", "Not found: '/\(s.joined(separator: "/"))'")
        }
        let keyset = try state.keysets.keyset(subscribeKey: s[3], service: "channel-registry", uriLength: wire.uriLength)
        let key = keyset.subscribeKey
        let ok: Response = Reply.json(.ok, #"{"status":200,"message":"OK","service":"channel-registry","error":false}"#)
        if s.count == 5 {
            if keyset.secretKey != nil { try requireAdmin(keyset, wire, method: "GET") }
            let groups = if let shared = state.hub.shared {
                try await shared.groupNames(subscribeKey: key)
            } else {
                try await state.store.groupNames(subscribeKey: key)
            }
            var w = JSONWriter()
            w.raw("{\"status\":200,\"payload\":{\"namespace\":\"\",\"groups\":")
            w.stringArray(groups)
            w.raw("},\"service\":\"channel-registry\",\"error\":false}")
            return Reply.json(.ok, w.bytes)
        }
        let group = s[5]
        do { try NameRules.validateGroup(group) } catch {
            return ChannelGroupChange.registryError("Reserved character in input parameters.")
        }
        try authorize(keyset, wire, channels: [], groups: [group], permission: .manage)
        if s.count == 7, s[6] == "remove" {
            if let shared = state.hub.shared {
                let (_, timetoken) = try await shared.change(.group(subscribeKey: key, group: group, add: [], remove: [], delete: true,
                                                                     maximum: .max))
                await state.hub.waitUntilVisible(timetoken)
                return ok
            }
            // The hub learns of the change in commit order: two concurrent changes never leave it
            // with the older membership.
            let hub = state.hub
            try await state.store.deleteGroup(subscribeKey: key, group: group) {
                hub.setGroup(subscribeKey: key, group: group, channels: [])
            }
            return ok
        }
        guard s.count == 6 else {
            return Reply.error(.notFound, service: "channel-registry", "Not found: '/\(s.joined(separator: "/"))'")
        }
        let change = try ChannelGroupChange(wire)
        if change.isEmpty {
            let channels = state.hub.channels(subscribeKey: key, group: group).sorted()
            var w = JSONWriter()
            w.raw("{\"status\":200,\"payload\":{\"channels\":")
            w.stringArray(channels)
            w.raw(",\"group\":")
            w.string(group)
            w.raw("},\"service\":\"channel-registry\",\"error\":false}")
            return Reply.json(.ok, w.bytes)
        }
        let limits = state.keysets.limits(for: keyset)
        let maximum = limits.maxChannelsPerGroup
        let current = state.hub.channels(subscribeKey: key, group: group)
        if current.union(change.add).subtracting(change.remove).count > maximum {
            return ChannelGroupChange.registryError("Maximum channel count exceeded.")
        }
        // A new group counts against the keyset's groups (in a cluster, as this node has them).
        if current.isEmpty, !change.add.isEmpty, state.hub.groupCount(subscribeKey: key) >= limits.maxGroupsPerKeyset {
            return ChannelGroupChange.registryError("Maximum channel group count exceeded.")
        }
        if let shared = state.hub.shared {
            // Checked again in the writing transaction, against the group as every node has it.
            let (control, timetoken) = try await shared.change(.group(subscribeKey: key, group: group, add: change.add,
                                                                       remove: change.remove, delete: false, maximum: maximum))
            // Read-your-writes: answer once this node's reader has applied it (in log order).
            await state.hub.waitUntilVisible(timetoken)
            if case .group(_, _, _, true) = control { return ChannelGroupChange.registryError("Maximum channel count exceeded.") }
            return ok
        }
        let hub = state.hub
        _ = try await state.store.updateGroup(subscribeKey: key, group: group, add: change.add, remove: change.remove) { channels in
            hub.setGroup(subscribeKey: key, group: group, channels: channels)
        }
        return ok
    }
}
