import HTTPTypes
import Hummingbird
import TetherProtocol
import TetherServerCore

/// Access Manager enforcement (pubnub-wire §11.5): every route checks its request here.
extension TetherResponder {
    /// Verifies the request signature (when present) and checks `permission` on the resources.
    /// Throws a 403 with only the denied channels and groups listed.
    @discardableResult
    ///
    /// `verified` is a verdict on this request's signature taken earlier (a long-poll served again
    /// after a parked wait keeps its first run's, whose timestamp has since left the window).
    func authorize(_ keyset: Keyset, _ wire: WireRequest, method: String = "GET", channels: [String], groups: [String],
                   permission: Permissions, body: [UInt8] = [], verified: AccessManager.SignatureVerdict? = nil)
        throws(RequestError) -> AccessManager.Check
    {
        guard keyset.secretKey != nil else { return AccessManager.Check(decision: .allowed, validUntil: nil) }
        let verdict = verified
            ?? state.access.verifySignature(keyset: keyset, method: method, rawPath: wire.rawPath, rawQuery: wire.rawQuery, body: body)
        if case .invalid(let reason) = verdict {
            throw RequestError(response: Reply.json(.forbidden, ErrorBody.service(status: 403, service: "Access Manager", message: reason)))
        }
        let request = AccessRequest(channels: channels, groups: groups, permission: permission, uuid: wire.query["uuid"])
        let check = state.access.check(request, keyset: keyset, auth: wire.query["auth"], signature: verdict)
        if case .denied(let deniedChannels, let deniedGroups, let message) = check.decision {
            state.console?.accessDenied(uuid: wire.query["uuid"], channels: deniedChannels.isEmpty && deniedGroups.isEmpty ? channels + groups : deniedChannels + deniedGroups)
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
        try requireActing(as: uuid, keyset, wire, verdict: verdict)
        try authorize(keyset, wire, channels: channels, groups: groups, permission: permission)
    }

    /// Whether the request may act for `uuid` (``requireActing(as:_:_:verdict:)`` without the
    /// refusal): for requests authorized otherwise that also change what `uuid` shows others (a
    /// heartbeat or subscribe that sets presence state).
    func mayAct(as uuid: String, _ keyset: Keyset, _ wire: WireRequest, verdict: AccessManager.SignatureVerdict) -> Bool {
        do { try requireActing(as: uuid, keyset, wire, verdict: verdict) } catch { return false }
        return true
    }

    /// The proof ``authorizeActing(as:_:_:channels:groups:permission:)`` asks for, without the
    /// permission check. Nothing on a keyset without a secret key, or for a request signed with it.
    func requireActing(as uuid: String, _ keyset: Keyset, _ wire: WireRequest, verdict: AccessManager.SignatureVerdict) throws(RequestError) {
        guard keyset.secretKey != nil, verdict != .valid else { return }
        func refuse(_ message: String) -> RequestError {
            RequestError(response: Reply.json(.forbidden, ErrorBody.service(status: 403, service: "Access Manager", message: message),
                                              extraHeaders: [.pnCause: "9500"]))
        }
        guard wire.query["uuid"] == uuid else { throw refuse("Forbidden: a client can only act for its own uuid") }
        if let auth = wire.query["auth"], !auth.isEmpty, let token = try? state.access.verifiedToken(auth, keyset: keyset),
           token.grant.authorizedUUID != uuid {
            throw refuse("Forbidden: the token is not authorized for this uuid")
        }
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
}

extension HTTPField.Name {
    static let pnCause = HTTPField.Name("X-Pn-Cause")!
}
