import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
@_spi(Benchmarks) import TetherProtocol
import TetherServerCore

/// A v2 grant (pubnub-wire §11.1), read after the signature is checked: who gets which
/// permissions on what, for how long.
struct GrantRequest {
    /// `ttl` in minutes (default 1,440); 0 never expires.
    var ttlMinutes: Int
    var permissions: Permissions
    /// Channels, groups and uuids named; the whole keyset when none is.
    var targets: [GrantTarget]
    /// `auth` keys named; `[nil]` (everybody) when none is.
    var authKeys: [String?]

    init(_ wire: WireRequest) throws(ParameterError) {
        ttlMinutes = try wire.integer("ttl", in: ParameterBounds.grantTTLMinutes) ?? 1440
        permissions = Permissions(r: wire.bool("r"), w: wire.bool("w"), m: wire.bool("m"), d: wire.bool("d"),
                                  g: wire.bool("g"), u: wire.bool("u"), j: wire.bool("j"))
        let names = try ["channel", "channel-group", "target-uuid", "auth"].map { (name) throws(ParameterError) in
            try Self.names(name, wire)
        }
        targets = names[0].map { .channel($0) } + names[1].map { .group($0) } + names[2].map { .uuid($0) }
        if targets.isEmpty { targets = [.keyset] }
        authKeys = names[3].isEmpty ? [nil] : names[3].map { $0 }
    }

    /// The names a grant parameter lists. A grant is kept (in a cluster, in PostgreSQL, whose
    /// text cannot hold a NUL), so a name that holds a control character is refused here with 400
    /// instead of failing in the store — in a cluster, with every publish its write was batched
    /// with. An empty name is refused too (`auth=`, `channel=`, `channel=a,,b`): the list split
    /// without it would be empty, and an empty `auth` list grants every client, an empty target
    /// list the whole keyset — wider than anything the request named.
    private static func names(_ parameter: String, _ wire: WireRequest) throws(ParameterError) -> [String] {
        if let raw = wire.rawQueryValue(parameter),
           raw.utf8.split(separator: UInt8(ascii: ","), omittingEmptySubsequences: false).contains(where: \.isEmpty) {
            throw ParameterError(name: parameter, expected: "one or more names, none of them empty, separated by commas")
        }
        let names = wire.queryNames(parameter)
        for name in names where name.isEmpty || name.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) {
            throw ParameterError(name: parameter, expected: "names without control characters, separated by commas")
        }
        return names
    }

    /// One grant row per target and auth key.
    func grants(subscribeKey: String, expiresAt: Timetoken?) -> [Grant] {
        var grants: [Grant] = []
        for target in targets {
            for auth in authKeys {
                grants.append(Grant(subscribeKey: subscribeKey, target: target, authKey: auth, permissions: permissions,
                                    ttlMinutes: ttlMinutes, expiresAt: expiresAt))
            }
        }
        return grants
    }
}

/// Access Manager's admin endpoints (pubnub-wire §11.1–§11.3): grant and audit, token grant and
/// revoke.
extension TetherResponder {
    // MARK: - v2 grant / audit (§11.1)

    /// v2 grant, or audit of what is granted.
    @inline(never) func grantV2(_ wire: WireRequest, audit: Bool) async throws -> Response {
        let s = wire.segments
        guard s.count == 5, s[3] == "sub-key" else {
            return Reply.error(.notFound, service: "Access Manager", "Not found: '\(wire.rawPath)'")
        }
        let keyset = try state.keysets.keyset(subscribeKey: s[4], service: "Access Manager", uriLength: wire.uriLength)
        try requireAdmin(keyset, wire, method: "GET")
        let auths = wire.queryNames("auth")
        let channels = wire.queryNames("channel")
        let groups = wire.queryNames("channel-group")
        if audit {
            var grants: [Grant] = []
            let auth = auths.first
            if channels.isEmpty && groups.isEmpty {
                grants = state.access.audit(subscribeKey: keyset.subscribeKey, channel: nil, group: nil, authKey: auth)
            }
            for channel in channels {
                grants += state.access.audit(subscribeKey: keyset.subscribeKey, channel: channel, group: nil, authKey: auth)
            }
            for group in groups {
                grants += state.access.audit(subscribeKey: keyset.subscribeKey, channel: nil, group: group, authKey: auth)
            }
            return Reply.json(.ok, Self.grantPayload(keyset: keyset, grants: grants, ttl: grants.first?.ttlMinutes ?? 0))
        }
        let request = try GrantRequest(wire)
        let expiresAt = request.ttlMinutes == 0 ? nil : state.hub.currentCursor.adding(seconds: Double(request.ttlMinutes) * 60)
        let grants = request.grants(subscribeKey: keyset.subscribeKey, expiresAt: expiresAt)
        try await state.access.apply(grants)
        state.hub.recheckAccess()
        return Reply.json(.ok, Self.grantPayload(keyset: keyset, grants: grants, ttl: request.ttlMinutes))
    }

    /// The grant/audit response payload in the shapes of §11.1.
    static func grantPayload(keyset: Keyset, grants: [Grant], ttl: Int) -> [UInt8] {
        func perms(_ w: inout JSONWriter, _ p: Permissions) {
            w.raw("{\"r\":"); w.number(p.contains(.read) ? 1 : 0)
            w.raw(",\"w\":"); w.number(p.contains(.write) ? 1 : 0)
            w.raw(",\"m\":"); w.number(p.contains(.manage) ? 1 : 0)
            w.raw(",\"d\":"); w.number(p.contains(.delete) ? 1 : 0)
            w.raw(",\"g\":"); w.number(p.contains(.get) ? 1 : 0)
            w.raw(",\"u\":"); w.number(p.contains(.update) ? 1 : 0)
            w.raw(",\"j\":"); w.number(p.contains(.join) ? 1 : 0)
            w.raw("}")
        }
        var channels: [String: [Grant]] = [:]
        var groups: [String: [Grant]] = [:]
        var uuids: [String: [Grant]] = [:]
        var keysetGrants: [Grant] = []
        for grant in grants {
            switch grant.target {
            case .keyset: keysetGrants.append(grant)
            case .channel(let n): channels[n, default: []].append(grant)
            case .group(let n): groups[n, default: []].append(grant)
            case .uuid(let n): uuids[n, default: []].append(grant)
            }
        }
        let hasAuth = grants.contains { $0.authKey != nil }
        let level: String
        if !uuids.isEmpty { level = "uuid" }
        else if !groups.isEmpty { level = hasAuth ? "channel-group+auth" : "channel-group" }
        else if !channels.isEmpty { level = hasAuth ? "user" : "channel" }
        else { level = "subkey" }
        var w = JSONWriter(capacity: 512)
        w.raw("{\"message\":\"Success\",\"payload\":{\"level\":")
        w.string(level)
        w.raw(",\"subscribe_key\":")
        w.string(keyset.subscribeKey)
        w.raw(",\"ttl\":")
        w.number(ttl)
        // `"auths":{"<auth key>":<permissions>,…}` for the rows that name an auth key.
        func auths(_ rows: [Grant]) {
            w.raw("\"auths\":{")
            for (j, row) in rows.filter({ $0.authKey != nil }).enumerated() {
                if j > 0 { w.raw(",") }
                w.string(row.authKey!)
                w.raw(":")
                perms(&w, row.permissions)
            }
            w.raw("}")
        }
        func section(_ name: String, _ entries: [String: [Grant]]) {
            guard !entries.isEmpty else { return }
            w.raw(",")
            w.string(name)
            w.raw(":{")
            for (i, key) in entries.keys.sorted().enumerated() {
                if i > 0 { w.raw(",") }
                w.string(key)
                w.raw(":")
                let rows = entries[key]!
                if rows.allSatisfy({ $0.authKey == nil }) {
                    perms(&w, rows.reduce(into: Permissions()) { $0.formUnion($1.permissions) })
                } else {
                    w.raw("{")
                    auths(rows)
                    w.raw("}")
                }
            }
            w.raw("}")
        }
        section("channels", channels)
        section("channel-groups", groups)
        section("uuids", uuids)
        if !keysetGrants.isEmpty {
            if keysetGrants.allSatisfy({ $0.authKey == nil }) {
                let p = keysetGrants.reduce(into: Permissions()) { $0.formUnion($1.permissions) }
                for (name, bit) in [("r", Permissions.read), ("w", .write), ("m", .manage), ("d", .delete), ("g", .get), ("u", .update), ("j", .join)] {
                    w.raw(",")
                    w.string(name)
                    w.raw(":")
                    w.number(p.contains(bit) ? 1 : 0)
                }
            } else {
                w.raw(",")
                auths(keysetGrants)
            }
        }
        w.raw("},\"service\":\"Access Manager\",\"status\":200}")
        return w.bytes
    }

    // MARK: - v3 tokens (§11.2, §11.3)

    /// Issues a token for the grant in the body.
    @inline(never) func grantToken(_ request: Request, _ wire: WireRequest) async throws -> Response {
        let s = wire.segments
        let keyset = try state.keysets.keyset(subscribeKey: s[2], service: "Access Manager", uriLength: wire.uriLength)
        guard let buffer = try? await request.body.collect(upTo: 64 * 1024) else {
            return Reply.json(.contentTooLarge, ErrorBody.service(status: 413, service: "Access Manager", message: "Request Entity Too Large"))
        }
        let body = Array(buffer: buffer)
        try requireAdmin(keyset, wire, method: "POST", body: body)
        let grant: AccessManager.GrantTokenRequest
        do {
            grant = try JSONDecoder().decode(AccessManager.GrantTokenRequest.self, from: Data(body))
        } catch {
            return Reply.json(.badRequest, ErrorBody.service(status: 400, service: "Access Manager", message: "Invalid JSON body: expected {\"ttl\":…,\"permissions\":{…}}"))
        }
        do {
            let token = try state.access.issueToken(grant, keyset: keyset)
            var w = JSONWriter()
            w.raw("{\"data\":{\"message\":\"Success\",\"token\":")
            w.string(token)
            w.raw("},\"service\":\"Access Manager\",\"status\":200}")
            return Reply.json(.ok, w.bytes)
        } catch where !(1...43_200).contains(grant.ttl) {
            return Reply.json(.badRequest, Array(#"{"error":{"message":"Invalid ttl","source":"grant","details":[{"message":"Range should be 1 to 43200 minute(s).","location":"ttl","locationType":"body"}]},"service":"Access Manager","status":400}"#.utf8))
        } catch {
            return Reply.json(.badRequest, ErrorBody.service(status: 400, service: "Access Manager", message: error.description))
        }
    }

    /// Revokes a token.
    @inline(never) func revokeToken(_ wire: WireRequest) async throws -> Response {
        let s = wire.segments
        let keyset = try state.keysets.keyset(subscribeKey: s[2], service: "Access Manager", uriLength: wire.uriLength)
        try requireAdmin(keyset, wire, method: "DELETE")
        let verified: AccessManager.VerifiedToken
        do {
            verified = try state.access.verifiedToken(s[4], keyset: keyset)
        } catch {
            return Reply.json(.badRequest, Array(#"{"error":{"message":"Invalid token","source":"revoke","details":[{"message":"Token is not valid for this keyset.","location":"token","locationType":"path"}]},"service":"Access Manager","status":400}"#.utf8))
        }
        if verified.grant.expiresAt <= state.hub.currentCursor {
            return Reply.json(.badRequest, Array(#"{"error":{"details":[{"location":"token","locationType":"path","message":"Token is expired."}],"message":"Invalid token","source":"revoke"},"service":"Access Manager","status":400}"#.utf8))
        }
        try await state.access.revoke(verified)
        state.hub.recheckAccess()
        return Reply.json(.ok, #"{"data":{"message":"Success"},"service":"Access Manager","status":200}"#)
    }
}
