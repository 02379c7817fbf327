import Foundation
import Testing
@testable import Tether
import TetherTesting

/// APIs the server does not implement yet (presence, channel groups, Access Manager), tested
/// against scripted servers that answer with the recorded PubNub shapes (pubnub-wire §7, §11, §16).
@Suite("Presence, channel groups and Access Manager against scripted servers")
struct ScriptedAPITests {
    @Test func presence() async throws {
        let server = try await ScriptedServer.start { request in
            switch request.path {
            case "/v2/presence/sub-key/demo/channel/lobby":
                return .json(#"{"status":200,"message":"OK","service":"Presence","uuids":[{"uuid":"u1","state":{"mood":"ok"}}],"occupancy":1}"#)
            case "/v2/presence/sub-key/demo":
                return .json(#"{"status":200,"message":"OK","service":"Presence","payload":{"channels":{"a":{"uuids":["u1","u2"],"occupancy":2},"b":{"occupancy":1}},"total_channels":2,"total_occupancy":3}}"#)
            case "/v2/presence/sub-key/demo/uuid/tester":
                return .json(#"{"status":200,"message":"OK","payload":{"channels":["a","b"]},"service":"Presence"}"#)
            case "/v2/presence/sub-key/demo/channel/a/uuid/tester/data":
                return .json(#"{"status":200,"message":"OK","payload":{"mood":"ok"},"service":"Presence"}"#)
            case "/v2/presence/sub-key/demo/channel/a/uuid/tester":
                return .json(#"{"status":200,"uuid":"tester","service":"Presence","message":"OK","payload":{"mood":"ok"},"channel":"a"}"#)
            case "/v2/presence/sub-key/demo/channel/a,b/uuid/other":
                return .json(#"{"status":200,"message":"OK","payload":{"channels":{"a":{"x":1},"b":{}}},"service":"Presence","uuid":"other"}"#)
            case "/v2/presence/sub-key/demo/channel/a/heartbeat":
                return .json(#"{"status":200,"message":"OK","service":"Presence"}"#)
            case "/v2/presence/sub-key/demo/channel/a/leave":
                return .json(#"{"status":200,"action":"leave","message":"OK","service":"Presence"}"#)
            default:
                return .json(status: 404, #"{"message":"Not found","error":1,"service":"Presence"}"#)
            }
        }
        let client = try makeClient(origin: server.origin) { $0.presenceTimeout = 60 }
        let lobby = try await client.hereNow(channels: ["lobby"], options: HereNowOptions(includeState: true))
        #expect(lobby.channels["lobby"]?.occupants == [Occupant(userId: "u1", state: ["mood": "ok"])])
        let global = try await client.hereNow()
        #expect(global.totalOccupancy == 3 && global.channels["a"]?.occupants.count == 2)
        #expect(try await client.whereNow() == ["a", "b"])
        #expect(try await client.setState(["mood": "ok"], channels: ["a"]) == ["mood": "ok"])
        #expect(try await client.getState(channels: ["a"]) == ["a": ["mood": "ok"]])
        #expect(try await client.getState(userId: "other", channels: ["a", "b"]) == ["a": ["x": 1], "b": [:]])
        try await client.heartbeat(channels: ["a"])
        try await client.leave(channels: ["a"])
        let heartbeat = server.requests.first { $0.path.hasSuffix("/heartbeat") }
        #expect(heartbeat?.query["heartbeat"] == "60")
        let setState = server.requests.first { $0.path.hasSuffix("/data") }
        #expect(setState?.query["state"] == "%7B%22mood%22%3A%22ok%22%7D")
        await client.shutdown()
        try await server.stop()
    }

    @Test func channelGroups() async throws {
        let ok = #"{"status":200,"message":"OK","service":"channel-registry","error":false}"#
        let server = try await ScriptedServer.start { request in
            switch (request.path, request.query["add"], request.query["remove"]) {
            case ("/v1/channel-registration/sub-key/demo/channel-group", _, _):
                return .json(#"{"status":200,"payload":{"namespace":"","groups":["g1","g2"]},"service":"channel-registry","error":false}"#)
            case ("/v1/channel-registration/sub-key/demo/channel-group/g1", nil, nil):
                return .json(#"{"status":200,"payload":{"channels":["a","b"],"group":"g1"},"service":"channel-registry","error":false}"#)
            default:
                return .json(ok)
            }
        }
        let client = try makeClient(origin: server.origin)
        try await client.addChannels(["a", "b"], toGroup: "g1")
        try await client.removeChannels(["b"], fromGroup: "g1")
        #expect(try await client.channels(inGroup: "g1") == ["a", "b"])
        #expect(try await client.channelGroups() == ["g1", "g2"])
        try await client.deleteGroup("g1")
        #expect(server.requests.map(\.query["add"]).compactMap { $0 } == ["a,b"])
        #expect(server.requests.last?.path == "/v1/channel-registration/sub-key/demo/channel-group/g1/remove")
        await client.shutdown()
        try await server.stop()
    }

    @Test func signatureMatchesPythonVector() {
        let text = "GET\npub\n/time/0\ntimestamp=1700000000&uuid=me\n"
        #expect(TetherClient.signature(of: text, secretKey: "secret") == "v2.uPpNrOYj25pJEgwCIYwui5TZnAlDWv6GdZpHdDOujLc")
    }

    @Test func grantAndRevokeAreSigned() async throws {
        let server = try await ScriptedServer.start { request in
            request.method == "POST"
                ? .json(#"{"data":{"message":"Success","token":"qEF2AkF0GmgvIEBD"},"service":"Access Manager","status":200}"#)
                : .json(#"{"data":{"message":"Success"},"service":"Access Manager","status":200}"#)
        }
        let admin = try makeClient(origin: server.origin, secretKey: "s3cret")
        let token = try await admin.grantToken(TokenGrant(ttlMinutes: 15, authorizedUserId: "alice", channels: ["room": [.read, .write]]))
        #expect(token == "qEF2AkF0GmgvIEBD")
        try await admin.revokeToken(token)
        for request in server.requests {
            // Recompute the signature server-side from what arrived.
            let items = request.query.filter { $0.key != "signature" }.map { QueryItem($0.key, PercentCoding.decode($0.value) ?? "") }
            let body = String(decoding: request.body, as: UTF8.self)
            let text = "\(request.method)\ndemo\n\(request.path)\n\(RequestSigning.canonicalQuery(items))\n\(body)"
            #expect(request.query["signature"] == TetherClient.signature(of: text, secretKey: "s3cret"))
            #expect(request.query["timestamp"] != nil)
        }
        let body = try JSONValue(parsing: server.requests[0].body)
        #expect(body["permissions"]?["resources"]?["channels"]?["room"]?.intValue == 3)

        let user = try makeClient(origin: server.origin)
        let status = await failure { try await user.grantToken(TokenGrant(ttlMinutes: 15)) }
        #expect(status?.category == .badRequest)
        #expect(server.requests.count == 2)  // refused locally, nothing sent
        await admin.shutdown()
        await user.shutdown()
        try await server.stop()
    }

    @Test func tokensAreSentAndParsed() async throws {
        let server = try await ScriptedServer.start { _ in .json("[17953281264739664]") }
        let client = try makeClient(origin: server.origin)
        client.setToken("my-token")
        _ = try? await client.whereNow()
        #expect(server.requests.last?.query["auth"] == "my-token")
        _ = try await client.time()
        #expect(server.requests.last?.query["auth"] == nil)  // never on /time (pubnub-wire §1.3)
        await client.shutdown()
        try await server.stop()
    }
}
