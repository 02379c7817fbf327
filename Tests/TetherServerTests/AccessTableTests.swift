import Foundation
import NIOHTTP1
import Testing
import TetherProtocol
import TetherServer
import TetherServerCore

/// Every route against a keyset with Access Manager on: nothing granted → 403 with PubNub's
/// body; the route's own permission granted → allowed; every other permission → still 403.
///
/// The expected table is written out here, from PubNub's operation-to-permission mapping
/// (docs/security.md, "Access Manager"), independently of `Route.access`; a route without a row
/// fails `everyRouteHasARow`, so no endpoint can be added without deciding its access.
@Suite(.serialized) struct AccessTableTests {
    static let keyset = Keyset(name: "table", publishKey: "pub-t", subscribeKey: "sub-t", secretKey: "table-secret")

    /// PubNub's mapping, plus Tether's two deviations (leave and set-state act for a uuid).
    static let expected: [Route: Route.Access] = [
        .options: .open, .time: .open, .health: .open, .metrics: .open,
        .publish: .permission(.write), .signal: .permission(.write),
        .subscribe: .permission(.read),
        .history: .permission(.read), .fetch: .permission(.read), .historyWithActions: .permission(.read),
        .messageCounts: .permission(.read),
        .deleteMessages: .permission(.delete),
        .hereNow: .permission(.read), .heartbeat: .permission(.read), .getState: .permission(.read),
        .whereNow: .none,
        .leave: .actingAs(.read), .setState: .actingAs(.read),
        .groupChannels: .permission(.manage), .groupUpdate: .permission(.manage), .groupDelete: .permission(.manage),
        .addMessageAction: .permission(.write), .getMessageActions: .permission(.read), .removeMessageAction: .permission(.delete),
        .hereNowGlobal: .admin, .groupList: .admin, .grant: .admin, .audit: .admin, .grantToken: .admin, .revokeToken: .admin,
        // App Context: the user's or the channel's get / update / delete; members are managed.
        .getUserMetadata: .user(.get), .setUserMetadata: .user(.update), .removeUserMetadata: .user(.delete),
        .getMemberships: .user(.get), .manageMemberships: .user(.update),
        .getChannelMetadata: .permission(.get), .setChannelMetadata: .permission(.update), .removeChannelMetadata: .permission(.delete),
        .getChannelMembers: .permission(.get), .manageChannelMembers: .permission(.manage),
        .getAllUserMetadata: .admin, .getAllChannelMetadata: .admin,
        .pushModify: .permission(.read), .pushList: .none, .pushRemoveDevice: .none,
        .generateFileUploadURL: .permission(.write), .publishFileMessage: .permission(.write),
        .listFiles: .permission(.read), .getFile: .permission(.read), .deleteFile: .permission(.delete),
        .uploadFile: .signed, .downloadFile: .signed,
    ]

    /// One request of each route, valid in every respect but its access, naming `resource` (a
    /// channel, or a group for the channel-group routes) and acting as `uuid`.
    struct Sample {
        var method: HTTPMethod = .GET
        var path: String
        var query: [String: String] = [:]
        var body: String = ""
        /// Whether the resource is a channel group.
        var isGroup = false
        /// Whether the resource is a user (App Context, `target-uuid`).
        var isUser = false
    }

    static func sample(_ route: Route, resource r: String) -> Sample {
        let sub = keyset.subscribeKey, pub = keyset.publishKey
        switch route {
        case .options: return Sample(method: .OPTIONS, path: "/v2/subscribe/\(sub)/\(r)/0")
        case .time: return Sample(path: "/time/0")
        case .health: return Sample(path: "/health")
        case .metrics: return Sample(path: "/metrics")
        case .publish: return Sample(path: "/publish/\(pub)/\(sub)/0/\(r)/0/%22hi%22")
        case .signal: return Sample(path: "/signal/\(pub)/\(sub)/0/\(r)/0/%22hi%22")
        case .subscribe: return Sample(path: "/v2/subscribe/\(sub)/\(r)/0", query: ["tt": "0"])
        case .history: return Sample(path: "/v2/history/sub-key/\(sub)/channel/\(r)")
        case .fetch: return Sample(path: "/v3/history/sub-key/\(sub)/channel/\(r)")
        case .historyWithActions: return Sample(path: "/v3/history-with-actions/sub-key/\(sub)/channel/\(r)")
        case .messageCounts:
            return Sample(path: "/v3/history/sub-key/\(sub)/message-counts/\(r)", query: ["timetoken": "15000000000000000"])
        case .deleteMessages: return Sample(method: .DELETE, path: "/v3/history/sub-key/\(sub)/channel/\(r)")
        case .hereNowGlobal: return Sample(path: "/v2/presence/sub-key/\(sub)")
        case .hereNow: return Sample(path: "/v2/presence/sub-key/\(sub)/channel/\(r)")
        case .whereNow: return Sample(path: "/v2/presence/sub-key/\(sub)/uuid/me")
        case .heartbeat: return Sample(path: "/v2/presence/sub-key/\(sub)/channel/\(r)/heartbeat", query: ["heartbeat": "60"])
        case .leave: return Sample(path: "/v2/presence/sub-key/\(sub)/channel/\(r)/leave")
        case .getState: return Sample(path: "/v2/presence/sub-key/\(sub)/channel/\(r)/uuid/me")
        case .setState: return Sample(path: "/v2/presence/sub-key/\(sub)/channel/\(r)/uuid/me/data", query: ["state": #"{"mood":"ok"}"#])
        case .groupList: return Sample(path: "/v1/channel-registration/sub-key/\(sub)/channel-group")
        case .groupChannels: return Sample(path: "/v1/channel-registration/sub-key/\(sub)/channel-group/\(r)", isGroup: true)
        case .groupUpdate:
            return Sample(path: "/v1/channel-registration/sub-key/\(sub)/channel-group/\(r)", query: ["add": "member"], isGroup: true)
        case .groupDelete: return Sample(path: "/v1/channel-registration/sub-key/\(sub)/channel-group/\(r)/remove", isGroup: true)
        case .grant: return Sample(path: "/v2/auth/grant/sub-key/\(sub)", query: ["channel": r, "auth": "someone", "r": "1", "ttl": "5"])
        case .audit: return Sample(path: "/v2/auth/audit/sub-key/\(sub)", query: ["channel": r])
        case .grantToken:
            return Sample(method: .POST, path: "/v3/pam/\(sub)/grant",
                          body: #"{"ttl":5,"permissions":{"resources":{"channels":{"\#(r)":1}}}}"#)
        case .revokeToken: return Sample(method: .DELETE, path: "/v3/pam/\(sub)/grant/not-a-token")
        case .addMessageAction:
            return Sample(method: .POST, path: "/v1/message-actions/\(sub)/channel/\(r)/message/15000000000000000",
                          body: #"{"type":"reaction","value":"smile"}"#)
        case .removeMessageAction:
            return Sample(method: .DELETE, path: "/v1/message-actions/\(sub)/channel/\(r)/message/15000000000000000/action/15000000000000001")
        case .getMessageActions: return Sample(path: "/v1/message-actions/\(sub)/channel/\(r)")
        case .getUserMetadata: return Sample(path: "/v2/objects/\(sub)/uuids/\(r)", isUser: true)
        case .setUserMetadata: return Sample(method: .PATCH, path: "/v2/objects/\(sub)/uuids/\(r)", body: #"{"name":"n"}"#, isUser: true)
        case .removeUserMetadata: return Sample(method: .DELETE, path: "/v2/objects/\(sub)/uuids/\(r)", isUser: true)
        case .getAllUserMetadata: return Sample(path: "/v2/objects/\(sub)/uuids")
        case .getMemberships: return Sample(path: "/v2/objects/\(sub)/uuids/\(r)/channels", isUser: true)
        case .manageMemberships:
            return Sample(method: .PATCH, path: "/v2/objects/\(sub)/uuids/\(r)/channels", body: #"{"set":[{"channel":{"id":"c"}}]}"#,
                          isUser: true)
        case .getChannelMetadata: return Sample(path: "/v2/objects/\(sub)/channels/\(r)")
        case .setChannelMetadata: return Sample(method: .PATCH, path: "/v2/objects/\(sub)/channels/\(r)", body: #"{"name":"n"}"#)
        case .removeChannelMetadata: return Sample(method: .DELETE, path: "/v2/objects/\(sub)/channels/\(r)")
        case .getAllChannelMetadata: return Sample(path: "/v2/objects/\(sub)/channels")
        case .getChannelMembers: return Sample(path: "/v2/objects/\(sub)/channels/\(r)/uuids")
        case .manageChannelMembers:
            return Sample(method: .PATCH, path: "/v2/objects/\(sub)/channels/\(r)/uuids", body: #"{"set":[{"uuid":{"id":"u"}}]}"#)
        case .pushModify: return Sample(path: "/v1/push/sub-key/\(sub)/devices/00aa", query: ["add": r, "type": "apns"])
        case .pushList: return Sample(path: "/v2/push/sub-key/\(sub)/devices-apns2/00aa", query: ["environment": "production", "topic": "com.example"])
        case .pushRemoveDevice: return Sample(path: "/v1/push/sub-key/\(sub)/devices/00aa/remove", query: ["type": "gcm"])
        case .generateFileUploadURL:
            return Sample(method: .POST, path: "/v1/files/\(sub)/channels/\(r)/generate-upload-url", body: #"{"name":"a.txt"}"#)
        case .publishFileMessage:
            return Sample(path: "/v1/files/publish-file/\(pub)/\(sub)/0/\(r)/0/%7B%22message%22%3Anull%2C%22file%22%3A%7B%22id%22%3A%22x%22%2C%22name%22%3A%22a.txt%22%7D%7D")
        case .listFiles: return Sample(path: "/v1/files/\(sub)/channels/\(r)/files")
        case .getFile: return Sample(path: "/v1/files/\(sub)/channels/\(r)/files/no-such-id/a.txt")
        case .deleteFile: return Sample(method: .DELETE, path: "/v1/files/\(sub)/channels/\(r)/files/no-such-id/a.txt")
        case .uploadFile: return Sample(method: .POST, path: "/v1/files/upload/\(sub)/no-such-id", body: "not a form")
        case .downloadFile: return Sample(path: "/v1/files/download/\(sub)/\(r)/no-such-id/a.txt")
        }
    }

    /// Sends `sample` as `uuid` with `auth` (or signed with the secret key).
    private func send(_ server: TestServer, _ sample: Sample, uuid: String = "me", auth: String?, signed: Bool = false) async throws
        -> (status: Int, body: String)
    {
        var query = sample.query
        query["uuid"] = uuid
        if let auth { query["auth"] = auth }
        let path: String
        if signed {
            path = signedPath(sample.path, query, method: sample.method.rawValue, body: sample.body, keyset: Self.keyset)
        } else {
            path = sample.path + "?" + query.sorted { $0.key < $1.key }
                .map { "\($0.key)=\(PercentCoding.encode($0.value))" }.joined(separator: "&")
        }
        let body: [UInt8]? = sample.body.isEmpty ? nil : Array(sample.body.utf8)
        let response = try await server.send(path, method: sample.method, body: body,
                                             headers: body == nil ? [] : [("Content-Type", "application/json")])
        return (response.status, response.body)
    }

    /// A v2 grant of `permissions` on `resource` for `auth`.
    private func grant(_ server: TestServer, _ permissions: Permissions, resource: String, group: Bool, user: Bool = false,
                       auth: String) async throws {
        var query = [user ? "target-uuid" : group ? "channel-group" : "channel": resource, "auth": auth, "ttl": "5", "uuid": "admin"]
        let flags: [(String, Permissions)] = [("r", .read), ("w", .write), ("m", .manage), ("d", .delete), ("g", .get), ("u", .update), ("j", .join)]
        for (flag, permission) in flags { query[flag] = permissions.contains(permission) ? "1" : "0" }
        let response = try await server.get(signedPath("/v2/auth/grant/sub-key/\(Self.keyset.subscribeKey)", query, keyset: Self.keyset))
        guard response.status == 200 else { throw TestFailure("grant failed: \(response.status) \(response.body)") }
    }

    /// Whether `body` is PubNub's 403 body (`{"status":403,"error":true,"service":"Access Manager",…}`).
    private func isForbiddenBody(_ body: String) -> Bool {
        guard let object = (try? JSONSerialization.jsonObject(with: Data(body.utf8))) as? [String: Any] else { return false }
        return object["status"] as? Int == 403 && object["service"] as? String == "Access Manager"
    }

    @Test func everyRouteHasARow() {
        for route in Route.allCases {
            #expect(Self.expected[route] != nil, "route \(route) has no row in the access table")
            #expect(route.access == Self.expected[route], "route \(route): the router says \(route.access)")
        }
    }

    @Test(arguments: Route.allCases) func routeAgainstTheAccessManager(_ route: Route) async throws {
        let server = try await TestServer.start(file: .init(keysets: [Self.keyset], subscribeTimeoutSeconds: 5))
        let resource = "r-\(route.rawValue)"
        let sample = Self.sample(route, resource: resource)
        let auth = "key-\(route.rawValue)"

        let anonymous = try await send(server, sample, auth: auth)
        #expect(anonymous.status < 500, "\(route): \(anonymous.status) \(anonymous.body)")
        switch Self.expected[route] ?? .open {
        case .open, .none:
            #expect(anonymous.status != 403, "\(route) needs no permission: \(anonymous.body)")
        case .signed:
            // No Access Manager permission: the server's own signature decides (403 here, as
            // S3 refuses a request without one, never PubNub's Access Manager body).
            #expect(!isForbiddenBody(anonymous.body), "\(route) is not an Access Manager route: \(anonymous.body)")
        case .admin:
            #expect(anonymous.status == 403 && isForbiddenBody(anonymous.body), "\(route) unsigned: \(anonymous.status) \(anonymous.body)")
            let admin = try await send(server, sample, auth: nil, signed: true)
            #expect(admin.status != 403 && admin.status < 500, "\(route) signed: \(admin.status) \(admin.body)")
        case .permission(let needed), .actingAs(let needed), .user(let needed):
            #expect(anonymous.status == 403 && isForbiddenBody(anonymous.body), "\(route) without a grant: \(anonymous.status) \(anonymous.body)")
            // Every other permission: still refused.
            let everythingElse = Permissions(rawValue: 0xFF).subtracting(needed)
            try await grant(server, everythingElse, resource: resource, group: sample.isGroup, user: sample.isUser, auth: auth)
            let wrong = try await send(server, sample, auth: auth)
            #expect(wrong.status == 403 && isForbiddenBody(wrong.body), "\(route) with \(everythingElse): \(wrong.status) \(wrong.body)")
            // The route's own permission: allowed.
            try await grant(server, needed, resource: resource, group: sample.isGroup, user: sample.isUser, auth: auth)
            let allowed = try await send(server, sample, auth: auth)
            #expect(allowed.status != 403 && allowed.status < 500, "\(route) with \(needed): \(allowed.status) \(allowed.body)")
            if route == .setState {
                // The same grant does not let one client set another uuid's state. (A leave
                // names only the request's own uuid; v2 auth keys bind no uuid, so for them
                // the read grant is the proof — tokens are checked in the next test.)
                let forged = try await send(server, sample, uuid: "somebody-else", auth: auth)
                #expect(forged.status == 403 && isForbiddenBody(forged.body), "\(route) for another uuid: \(forged.status) \(forged.body)")
            }
        }
        await server.stop()
    }

    /// A v3 token proves who it speaks for: one bound to `alice` may leave and set state for
    /// alice, never for bob; a token bound to nobody may not act for anybody.
    @Test func tokensActOnlyForTheirOwnUUID() async throws {
        let server = try await TestServer.start(file: .init(keysets: [Self.keyset], subscribeTimeoutSeconds: 5))
        func token(_ uuid: String?) async throws -> String {
            let bound = uuid.map { #","uuid":"\#($0)""# } ?? ""
            let body = #"{"ttl":5,"permissions":{"resources":{"channels":{"room":3}}\#(bound)}}"#
            let path = "/v3/pam/\(Self.keyset.subscribeKey)/grant"
            let response = try await server.send(signedPath(path, ["uuid": "admin"], method: "POST", body: body, keyset: Self.keyset),
                                                 method: .POST, body: Array(body.utf8), headers: [("Content-Type", "application/json")])
            let object = (try? JSONSerialization.jsonObject(with: Data(response.body.utf8))) as? [String: Any]
            guard let token = (object?["data"] as? [String: Any])?["token"] as? String else {
                throw TestFailure("grant-token failed: \(response.status) \(response.body)")
            }
            return PercentCoding.encode(token)
        }
        let alice = try await token("alice"), unbound = try await token(nil)
        let leave = "/v2/presence/sub-key/\(Self.keyset.subscribeKey)/channel/room/leave"
        let setState = { (uuid: String) in "/v2/presence/sub-key/\(Self.keyset.subscribeKey)/channel/room/uuid/\(uuid)/data?state=%7B%7D" }
        #expect(try await server.get("\(leave)?uuid=alice&auth=\(alice)").status == 200)
        #expect(try await server.get("\(leave)?uuid=bob&auth=\(alice)").status == 403)
        #expect(try await server.get("\(leave)?uuid=bob&auth=\(unbound)").status == 403)
        #expect(try await server.get("\(setState("alice"))&uuid=alice&auth=\(alice)").status == 200)
        #expect(try await server.get("\(setState("bob"))&uuid=alice&auth=\(alice)").status == 403)
        #expect(try await server.get("\(setState("bob"))&uuid=bob&auth=\(alice)").status == 403)
        // A heartbeat or a subscribe that sets state acts for its uuid too: without the proof it
        // still counts (a PubNub JavaScript client repeats a refused setState's state on every
        // later one), and its state is ignored.
        let heartbeat = "/v2/presence/sub-key/\(Self.keyset.subscribeKey)/channel/room/heartbeat"
        let subscribe = "/v2/subscribe/\(Self.keyset.subscribeKey)/room/0"
        let state = "state=%7B%22room%22%3A%7B%22x%22%3A1%7D%7D"
        #expect(try await server.get("\(heartbeat)?uuid=bob&auth=\(unbound)&\(state)").status == 200)
        #expect(try await server.get("\(heartbeat)?uuid=bob&auth=\(alice)&\(state)").status == 403, "alice's token is not bob's")
        #expect(try await server.get("\(subscribe)?tt=0&uuid=bob&auth=\(unbound)&\(state)").status == 200)
        func stateOf(_ uuid: String) async throws -> String {
            try await server.get(signedPath("/v2/presence/sub-key/\(Self.keyset.subscribeKey)/channel/room/uuid/\(uuid)", ["uuid": "admin"],
                                            keyset: Self.keyset)).body
        }
        #expect(try await stateOf("bob").contains(#""payload":{}"#), "bob's state was never set")
        #expect(try await server.get("\(heartbeat)?uuid=alice&auth=\(alice)&\(state)").status == 200)
        #expect(try await stateOf("alice").contains(#""x":1"#), "alice's own token sets her state")
        // A server signing with the secret key may act for anybody.
        let signedLeave = signedPath(leave, ["uuid": "bob"], keyset: Self.keyset)
        #expect(try await server.get(signedLeave).status == 200)
        let signedHeartbeat = signedPath(heartbeat, ["uuid": "bob", "state": #"{"room":{"x":1}}"#], keyset: Self.keyset)
        #expect(try await server.get(signedHeartbeat).status == 200)
        await server.stop()
    }

    /// A token is issued only if it can be used: one too long for a request, or with meta nested
    /// deeper than tokens are read, is refused at the grant instead of failing every request.
    @Test func aTokenThatCouldNotBeUsedIsNotIssued() async throws {
        let server = try await TestServer.start(file: .init(keysets: [Self.keyset], subscribeTimeoutSeconds: 5))
        func grant(_ body: String) async throws -> (status: Int, body: String, headers: HTTPHeaders) {
            let path = "/v3/pam/\(Self.keyset.subscribeKey)/grant"
            return try await server.send(signedPath(path, ["uuid": "admin"], method: "POST", body: body, keyset: Self.keyset),
                                         method: .POST, body: Array(body.utf8), headers: [("Content-Type", "application/json")])
        }
        let many = (0..<300).map { #""channel-with-a-long-name-\#($0)":1"# }.joined(separator: ",")
        let tooLong = try await grant(#"{"ttl":5,"permissions":{"resources":{"channels":{\#(many)}}}}"#)
        #expect(tooLong.status == 400 && tooLong.body.contains("grant fewer resources"), "\(tooLong.body)")
        let deep = (0..<20).reduce("1") { inner, _ in #"{"x":\#(inner)}"# }
        let tooDeep = try await grant(#"{"ttl":5,"permissions":{"resources":{"channels":{"a":1}},"meta":\#(deep)}}"#)
        #expect(tooDeep.status == 400, "\(tooDeep.body)")
        let fine = try await grant(#"{"ttl":5,"permissions":{"resources":{"channels":{"a":1}}}}"#)
        #expect(fine.status == 200)
        let badTTL = try await grant(#"{"ttl":0,"permissions":{"resources":{"channels":{"a":1}}}}"#)
        #expect(badTTL.status == 400 && badTTL.body.contains("Invalid ttl"))
        await server.stop()
    }

    /// A signature that covers neither method nor body (v1, and v2 signed as a GET) is taken for a
    /// POST publish only, as the SDKs that send them use it: elsewhere a signed GET, whose
    /// signature travels in the URL, could be sent again as a DELETE or PATCH of the same path.
    @Test func aSignedReadCannotBeReplayedAsADeleteOrAPatch() async throws {
        let server = try await TestServer.start(file: .init(keysets: [Self.keyset], subscribeTimeoutSeconds: 5))
        let key = Self.keyset.subscribeKey
        #expect(try await server.get(signedPath("/publish/pub-t/\(key)/0/keep/0/1", ["uuid": "admin"], keyset: Self.keyset)).status == 200)
        let fetch = signedPath("/v3/history/sub-key/\(key)/channel/keep", ["uuid": "admin"], keyset: Self.keyset)
        #expect(try await server.get(fetch).status == 200)
        #expect(try await server.send(fetch, method: .DELETE, body: nil).status == 403)
        let object = signedPath("/v2/objects/\(key)/uuids/alice", ["uuid": "admin"], keyset: Self.keyset)
        #expect(try await server.send(object, method: .PATCH, body: Array(#"{"name":"x"}"#.utf8),
                                      headers: [("Content-Type", "application/json")]).status == 403)
        let history = try await server.get(signedPath("/v3/history/sub-key/\(key)/channel/keep", ["uuid": "admin"], keyset: Self.keyset))
        #expect(history.body.contains(#""message":1"#), "the message is still there: \(history.body)")
        // A POST publish signed as a GET (JavaScript) is still taken.
        let body = "2"
        let asGet = signedPath("/publish/pub-t/\(key)/0/keep/0", ["uuid": "admin"], method: "GET", keyset: Self.keyset)
        #expect(try await server.send(asGet, method: .POST, body: Array(body.utf8),
                                      headers: [("Content-Type", "application/json")]).status == 200)
        await server.stop()
    }

    /// An empty name in a v2 grant's lists is refused: dropped, an empty `auth` list would grant
    /// every client and an empty target list the whole keyset.
    @Test func aV2GrantWithAnEmptyNameIsRefused() async throws {
        let server = try await TestServer.start(file: .init(keysets: [Self.keyset], subscribeTimeoutSeconds: 5))
        let grant = "/v2/auth/grant/sub-key/\(Self.keyset.subscribeKey)"
        for query in [["channel": "private", "auth": "", "r": "1"], ["channel": "", "auth": "ak", "r": "1", "w": "1"],
                      ["channel-group": "", "auth": "ak", "r": "1"]] {
            let response = try await server.get(signedPath(grant, query.merging(["uuid": "admin"]) { a, _ in a }, keyset: Self.keyset))
            #expect(response.status == 400, "\(query): \(response.body)")
        }
        let read = try await server.get("/v2/history/sub-key/\(Self.keyset.subscribeKey)/channel/private?uuid=x")
        #expect(read.status == 403)
        await server.stop()
    }
}
