import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import TetherProtocol
import TetherServerCore

/// Access Manager enforcement (pubnub-wire §11.5) and its admin endpoints (§11.1–§11.3).
extension TetherResponder {
    /// Verifies the request signature (when present) and checks `permission` on the resources.
    /// Throws a 403 with only the denied channels and groups listed.
    @discardableResult
    func authorize(_ keyset: Keyset, _ wire: WireRequest, method: String = "GET", channels: [String], groups: [String],
                   permission: Permissions, body: [UInt8] = []) throws(RequestError) -> AccessManager.Check {
        guard keyset.secretKey != nil else { return AccessManager.Check(decision: .allowed, validUntil: nil) }
        let verdict = state.access.verifySignature(keyset: keyset, method: method, rawPath: wire.rawPath, rawQuery: wire.rawQuery, body: body)
        if case .invalid(let reason) = verdict {
            throw RequestError(response: Reply.json(.forbidden, ErrorBody.service(status: 403, service: "Access Manager", message: reason)))
        }
        let request = AccessRequest(channels: channels, groups: groups, permission: permission, uuid: wire.query["uuid"])
        let check = state.access.check(request, keyset: keyset, auth: wire.query["auth"], signature: verdict)
        if case .denied(let deniedChannels, let deniedGroups, let message) = check.decision {
            throw RequestError(response: Self.forbidden(channels: deniedChannels, groups: deniedGroups, message: message))
        }
        return check
    }

    /// Like ``authorize(_:_:method:channels:groups:permission:body:)`` for requests that act on
    /// behalf of `uuid` (leave, set-state): besides `permission` on every channel and group, the
    /// request must prove it speaks for that uuid — a request signed with the secret key, a v3
    /// token whose authorized uuid is `uuid`, or (v2 auth keys, which bind no uuid) the request's
    /// own `uuid`. A Tether deviation from PubNub, which lets anybody send a leave for anybody
    /// (docs/compatibility.md).
    func authorizeActing(as uuid: String, _ keyset: Keyset, _ wire: WireRequest, channels: [String], groups: [String],
                         permission: Permissions) throws(RequestError) {
        guard keyset.secretKey != nil else { return }
        let verdict = state.access.verifySignature(keyset: keyset, method: "GET", rawPath: wire.rawPath, rawQuery: wire.rawQuery, body: [])
        switch verdict {
        case .valid: return
        case .invalid(let reason):
            throw RequestError(response: Reply.json(.forbidden, ErrorBody.service(status: 403, service: "Access Manager", message: reason)))
        case .absent: break
        }
        func refuse(_ message: String) -> RequestError {
            RequestError(response: Reply.json(.forbidden, ErrorBody.service(status: 403, service: "Access Manager", message: message),
                                              extraHeaders: [.pnCause: "9500"]))
        }
        guard wire.query["uuid"] == uuid else { throw refuse("Forbidden: a client can only act for its own uuid") }
        if let auth = wire.query["auth"], !auth.isEmpty, let token = try? state.access.verifiedToken(auth, keyset: keyset),
           token.grant.authorizedUUID != uuid {
            throw refuse("Forbidden: the token is not authorized for this uuid")
        }
        try authorize(keyset, wire, channels: channels, groups: groups, permission: permission)
    }

    /// The 403 body of §3, with `X-Pn-Cause`. A revoked token gets the recorded body, which
    /// has no resource list.
    static func forbidden(channels: [String], groups: [String], message: String) -> Response {
        if channels.isEmpty && groups.isEmpty && message != "Forbidden" {
            return Reply.json(.forbidden, ErrorBody.service(status: 403, service: "Access Manager", message: message),
                              extraHeaders: [.pnCause: "9500"])
        }
        return Reply.json(.forbidden, ErrorBody.forbidden(channels: channels, groups: groups, message: message),
                          extraHeaders: [.pnCause: "9500"])
    }

    /// Admin calls must be signed with the keyset's secret key.
    func requireAdmin(_ keyset: Keyset, _ wire: WireRequest, method: String, body: [UInt8] = []) throws(RequestError) {
        guard keyset.secretKey != nil else {
            throw RequestError(response: Reply.json(.badRequest, ErrorBody.service(
                status: 400, service: "Access Manager", message: "This keyset has no secret key: Access Manager is off")))
        }
        switch state.access.verifySignature(keyset: keyset, method: method, rawPath: wire.rawPath, rawQuery: wire.rawQuery, body: body) {
        case .valid: return
        case .absent:
            throw RequestError(response: Reply.json(.forbidden, ErrorBody.service(status: 403, service: "Access Manager",
                                                                                   message: "Signature required: sign with the secret key")))
        case .invalid(let reason):
            throw RequestError(response: Reply.json(.forbidden, ErrorBody.service(status: 403, service: "Access Manager", message: reason)))
        }
    }

    // MARK: - v2 grant / audit (§11.1)

    func grantV2(_ wire: WireRequest, audit: Bool) async throws -> Response {
        let s = wire.segments
        guard s.count == 5, s[3] == "sub-key" else {
            return Reply.error(.notFound, service: "Access Manager", "Not found: '\(wire.rawPath)'")
        }
        let keyset = try keyset(subscribeKey: s[4], service: "Access Manager", uriLength: wire.uriLength)
        try requireAdmin(keyset, wire, method: "GET")
        let auths = wire.queryNames("auth")
        let channels = wire.queryNames("channel")
        let groups = wire.queryNames("channel-group")
        let uuids = wire.queryNames("target-uuid")
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
        let ttl = try wire.integer("ttl", in: ParameterBounds.grantTTLMinutes) ?? 1440
        let permissions = Permissions(r: wire.bool("r"), w: wire.bool("w"), m: wire.bool("m"), d: wire.bool("d"),
                                      g: wire.bool("g"), u: wire.bool("u"), j: wire.bool("j"))
        let expiresAt = ttl == 0 ? nil : state.hub.currentCursor.adding(seconds: Double(ttl) * 60)
        var targets: [GrantTarget] = channels.map { .channel($0) } + groups.map { .group($0) } + uuids.map { .uuid($0) }
        if targets.isEmpty { targets = [.keyset] }
        let authKeys: [String?] = auths.isEmpty ? [nil] : auths.map { $0 }
        var grants: [Grant] = []
        for target in targets {
            for auth in authKeys {
                grants.append(Grant(subscribeKey: keyset.subscribeKey, target: target, authKey: auth, permissions: permissions,
                                    ttlMinutes: ttl, expiresAt: expiresAt))
            }
        }
        try await state.access.apply(grants)
        state.hub.recheckAccess()
        return Reply.json(.ok, Self.grantPayload(keyset: keyset, grants: grants, ttl: ttl))
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
                    w.raw("{\"auths\":{")
                    for (j, row) in rows.filter({ $0.authKey != nil }).enumerated() {
                        if j > 0 { w.raw(",") }
                        w.string(row.authKey!)
                        w.raw(":")
                        perms(&w, row.permissions)
                    }
                    w.raw("}}")
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
                w.raw(",\"auths\":{")
                for (j, row) in keysetGrants.filter({ $0.authKey != nil }).enumerated() {
                    if j > 0 { w.raw(",") }
                    w.string(row.authKey!)
                    w.raw(":")
                    perms(&w, row.permissions)
                }
                w.raw("}")
            }
        }
        w.raw("},\"service\":\"Access Manager\",\"status\":200}")
        return w.bytes
    }

    // MARK: - v3 tokens (§11.2, §11.3)

    func grantToken(_ request: Request, _ wire: WireRequest) async throws -> Response {
        let s = wire.segments
        let keyset = try keyset(subscribeKey: s[2], service: "Access Manager", uriLength: wire.uriLength)
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
        } catch {
            return Reply.json(.badRequest, Array(#"{"error":{"message":"Invalid ttl","source":"grant","details":[{"message":"Range should be 1 to 43200 minute(s).","location":"ttl","locationType":"body"}]},"service":"Access Manager","status":400}"#.utf8))
        }
    }

    func revokeToken(_ wire: WireRequest) async throws -> Response {
        let s = wire.segments
        let keyset = try keyset(subscribeKey: s[2], service: "Access Manager", uriLength: wire.uriLength)
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

extension HTTPField.Name {
    static let pnCause = HTTPField.Name("X-Pn-Cause")!
}
