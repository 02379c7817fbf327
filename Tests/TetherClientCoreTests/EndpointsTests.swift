import Testing
import TetherClientCore
import TetherProtocol

@Suite("Request building (pubnub-wire §4–§16)")
struct EndpointsTests {
    let e = Endpoints(context: RequestContext(publishKey: "pub", subscribeKey: "sub", userId: "me", authKey: "tok"))

    @Test func time() {
        let spec = e.time()
        #expect(spec.target == "/time/0?uuid=me&pnsdk=Tether-Swift%2F0.1")
    }

    @Test func publishGET() throws {
        let spec = try e.publish(channel: "ch 1", messageJSON: #"{"text":"hi"}"#,
                                 options: PublishOptions(meta: ["k": "v"], store: true, ttl: 5, replicate: false, customMessageType: "chat-msg"))
        #expect(spec.method == .get)
        #expect(spec.path == "/publish/pub/sub/0/ch%201/0/%7B%22text%22%3A%22hi%22%7D")
        #expect(spec.queryValue("store") == "1")
        #expect(spec.queryValue("ttl") == "5")
        #expect(spec.queryValue("norep") == "true")
        #expect(spec.queryValue("meta") == #"{"k":"v"}"#)
        #expect(spec.queryValue("custom_message_type") == "chat-msg")
        #expect(spec.queryValue("auth") == "tok")
        #expect(spec.queryValue("uuid") == "me")
    }

    @Test func requestIdsOnPublishAndSignal() throws {
        let outbox = try e.publish(channel: "c", messageJSON: "1", options: PublishOptions(requestId: "app-id"), requestID: "outbox-id")
        #expect(outbox.queryValue("requestid") == "outbox-id", "the outbox's id wins")
        let chosen = try e.publish(channel: "c", messageJSON: "1", options: PublishOptions(requestId: "app-id"))
        #expect(chosen.queryValue("requestid") == "app-id")
        #expect(try e.publish(channel: "c", messageJSON: "1", options: PublishOptions()).queryValue("requestid") == nil)
        let signal = try e.signal(channel: "c", messageJSON: "1", requestID: "sig-1")
        #expect(signal.queryValue("requestid") == "sig-1")
        for bad in ["", "a b", String(repeating: "x", count: 65), "\u{7F}", "é"] {
            #expect(throws: RequestBuildError.self) { try e.publish(channel: "c", messageJSON: "1", options: PublishOptions(), requestID: bad) }
            #expect(PublishOptions.requestIdProblem(bad) != nil)
        }
        #expect(PublishOptions.requestIdProblem(String(repeating: "~", count: 64)) == nil)
    }

    @Test func publishPOSTAndFire() throws {
        let post = try e.publish(channel: "c", messageJSON: "\"x\"", options: PublishOptions(usePOST: true))
        #expect(post.method == .post && post.path == "/publish/pub/sub/0/c/0" && post.body == Array("\"x\"".utf8))
        let fire = try e.publish(channel: "c", messageJSON: "1", options: PublishOptions(), fire: true)
        #expect(fire.operation == .fire && fire.queryValue("store") == "0" && fire.queryValue("norep") == "1")
    }

    /// Lists are joined with commas, which the server splits on: a name holding one would act on
    /// other names, so it is refused here.
    @Test func aNameWithACommaIsRefusedWhereverNamesAreJoined() {
        #expect(throws: RequestBuildError.self) { try e.removeChannels(["a,b"], fromGroup: "g") }
        #expect(throws: RequestBuildError.self) { try e.heartbeat(channels: ["c"], groups: ["g,h"], presenceTimeout: 300) }
        #expect(throws: RequestBuildError.self) { try e.leave(channels: [], groups: ["g,h"]) }
        #expect(throws: RequestBuildError.self) { try e.setState(["k": 1], channels: [], groups: ["g,h"]) }
        #expect(throws: RequestBuildError.self) { try e.getState(userId: "u", channels: [], groups: ["g,h"]) }
        #expect(throws: RequestBuildError.self) {
            try e.subscribe(channels: [], groups: ["g,h"], cursor: nil, filterExpression: nil, presenceTimeout: nil)
        }
        #expect(throws: RequestBuildError.self) { try e.grant(AuthKeyGrant(channels: ["a,b"], read: true)) }
        #expect(throws: RequestBuildError.self) { try e.grant(AuthKeyGrant(groups: ["g,h"], read: true)) }
        #expect(throws: RequestBuildError.self) { try e.grant(AuthKeyGrant(channels: ["a"], authKeys: ["k1,k2"])) }
        #expect(throws: RequestBuildError.self) { try e.grant(AuthKeyGrant(channels: ["a"], authKeys: [""])) }
        #expect((try? e.grant(AuthKeyGrant(channels: ["news.*"], authKeys: ["k1"]))) != nil)
        #expect((try? e.leave(channels: ["a", "a-pnpres"], groups: ["g", "g-pnpres"])) != nil)
    }

    @Test func publishNeedsKeyAndValidNames() {
        let noKey = Endpoints(context: RequestContext(publishKey: nil, subscribeKey: "sub", userId: "me", authKey: nil))
        #expect(throws: RequestBuildError.missingPublishKey) { try noKey.publish(channel: "c", messageJSON: "1", options: PublishOptions()) }
        #expect(throws: RequestBuildError.self) { try e.publish(channel: "a,b", messageJSON: "1", options: PublishOptions()) }
        #expect(throws: RequestBuildError.self) { try e.publish(channel: "c", messageJSON: "1", options: PublishOptions(meta: [1])) }
    }

    @Test func historyAndFetch() throws {
        let h = try e.history(channel: "c", options: HistoryOptions(start: Timetoken(5), count: 10, reverse: true, includeMeta: true))
        #expect(h.path == "/v2/history/sub-key/sub/channel/c")
        #expect(h.queryValue("count") == "10" && h.queryValue("start") == "5" && h.queryValue("reverse") == "true")
        #expect(h.queryValue("include_token") == "true" && h.queryValue("string_message_token") == "true")
        let f = try e.fetch(channels: ["b", "a"], options: FetchOptions(end: Timetoken(7)))
        #expect(f.path == "/v3/history/sub-key/sub/channel/b,a")
        #expect(f.queryValue("max") == "25" && f.queryValue("end") == "7" && f.queryValue("include_uuid") == "true")
        #expect(try e.fetch(channels: ["a"], options: FetchOptions()).queryValue("max") == "100")
    }

    @Test func messageCountsAndDelete() throws {
        let one = try e.messageCounts([("a", Timetoken(1)), ("b", Timetoken(1))])
        #expect(one.path == "/v3/history/sub-key/sub/message-counts/a,b" && one.queryValue("timetoken") == "1")
        let many = try e.messageCounts([("a", Timetoken(1)), ("b", Timetoken(2))])
        #expect(many.queryValue("channelsTimetoken") == "1,2")
        let delete = try e.deleteMessages(channel: "a", start: Timetoken(9), end: nil)
        #expect(delete.method == .delete && delete.queryValue("start") == "9")
    }

    @Test func presence() throws {
        #expect(try e.hereNow(channels: [], groups: [], options: HereNowOptions()).path == "/v2/presence/sub-key/sub")
        let groupsOnly = try e.hereNow(channels: [], groups: ["g"], options: HereNowOptions(includeState: true))
        #expect(groupsOnly.path == "/v2/presence/sub-key/sub/channel/," && groupsOnly.queryValue("channel-group") == "g")
        #expect(groupsOnly.queryValue("state") == "1")
        #expect(try e.whereNow(userId: "u 1").path == "/v2/presence/sub-key/sub/uuid/u%201")
        let hb = try e.heartbeat(channels: ["a"], groups: [], presenceTimeout: 60)
        #expect(hb.path == "/v2/presence/sub-key/sub/channel/a/heartbeat" && hb.queryValue("heartbeat") == "60")
        #expect(try e.leave(channels: ["a", "b"], groups: []).path == "/v2/presence/sub-key/sub/channel/a,b/leave")
        let set = try e.setState(["k": 1], channels: ["a"], groups: [])
        #expect(set.path == "/v2/presence/sub-key/sub/channel/a/uuid/me/data" && set.queryValue("state") == #"{"k":1}"#)
        #expect(try e.getState(userId: "x", channels: ["a"], groups: []).path == "/v2/presence/sub-key/sub/channel/a/uuid/x")
    }

    @Test func channelGroupsAndAccessManager() throws {
        #expect(try e.addChannels(["a", "b"], toGroup: "g").queryValue("add") == "a,b")
        #expect(try e.deleteGroup("g").path == "/v1/channel-registration/sub-key/sub/channel-group/g/remove")
        #expect(e.listGroups().path == "/v1/channel-registration/sub-key/sub/channel-group")
        let grant = try e.grantToken(TokenGrant(ttlMinutes: 60, authorizedUserId: "u", channels: ["c": [.read, .write]]))
        #expect(grant.method == .post && grant.path == "/v3/pam/sub/grant" && grant.queryValue("auth") == nil)
        let body = try JSONValue(parsing: grant.body ?? [])
        #expect(body["ttl"]?.intValue == 60)
        #expect(body["permissions"]?["resources"]?["channels"]?["c"]?.intValue == 3)
        #expect(body["permissions"]?["uuid"]?.stringValue == "u")
        #expect(try e.revokeToken("a+b/c").path == "/v3/pam/sub/grant/a%2Bb%2Fc")
    }

    @Test func subscribe() throws {
        let handshake = try e.subscribe(channels: ["a", "b.*"], groups: ["g"], cursor: nil, filterExpression: "meta.k == 'v'",
                                        presenceTimeout: 300)
        #expect(handshake.path == "/v2/subscribe/sub/a,b.%2A/0")
        #expect(handshake.queryValue("tt") == "0" && handshake.queryValue("tr") == nil && handshake.queryValue("channel-group") == "g")
        #expect(handshake.queryValue("filter-expr") == "meta.k == 'v'")
        let next = try e.subscribe(channels: [], groups: ["g"], cursor: (Timetoken(17), 1), filterExpression: nil, presenceTimeout: nil)
        #expect(next.path == "/v2/subscribe/sub/,/0" && next.queryValue("tt") == "17" && next.queryValue("tr") == "1")
    }
}

@Suite("Request signing (pubnub-wire §12)")
struct SigningTests {
    @Test func canonicalQuerySortsAndEncodes() {
        let q = RequestSigning.canonicalQuery([QueryItem("uuid", "a b~"), QueryItem("auth", "x*y"), QueryItem("signature", "s")])
        #expect(q == "auth=x%2Ay&uuid=a%20b%7E")
    }

    @Test func stringToSign() {
        var spec = RequestSpec(operation: .publish, method: .post, path: "/publish/pub/sub/0/c/0", query: [QueryItem("uuid", "me")],
                               body: Array("{\"a\":1}".utf8))
        let text = RequestSigning.prepare(&spec, publishKey: "pub", unixSeconds: 1_700_000_000)
        #expect(text == "POST\npub\n/publish/pub/sub/0/c/0\ntimestamp=1700000000&uuid=me\n{\"a\":1}")
        #expect(spec.queryValue("timestamp") == "1700000000")
    }

    @Test func theRequestIdIsSigned() throws {
        var spec = try Endpoints(context: RequestContext(publishKey: "pub", subscribeKey: "sub", userId: "me", authKey: nil))
            .publish(channel: "c", messageJSON: "1", options: PublishOptions(), requestID: "r-1")
        let text = RequestSigning.prepare(&spec, publishKey: "pub", unixSeconds: 1_700_000_000)
        #expect(text.contains("requestid=r-1&"))
    }

    @Test func signatureEncoding() {
        #expect(RequestSigning.signatureValue(hmac: [0xFB, 0xFF, 0xFE]) == "v2.-__-")
    }
}
