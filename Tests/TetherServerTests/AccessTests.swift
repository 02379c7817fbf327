import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import Logging
import Testing
import TetherProtocol
import TetherServer
import TetherTestingServer

@Suite(.serialized) struct AccessTests {
    static let keyset = Keyset(name: "secure", publishKey: "pub-s", subscribeKey: "sub-s", secretKey: "s3cret")
    static let other = Keyset(name: "other", publishKey: "pub-o", subscribeKey: "sub-o", secretKey: "another")

    private func start(_ directory: String? = nil, limits: Limits? = nil) async throws -> TestServer {
        var secure = Self.keyset
        secure.limits = limits
        return try await TestServer.start(directory: directory, file: .init(keysets: [secure, Self.other], subscribeTimeoutSeconds: 30))
    }

    private func signed(_ path: String, _ query: [String: String] = [:], method: String = "GET", body: String = "",
                        keyset: Keyset = AccessTests.keyset, timestamp: Int64? = nil) -> String {
        signedPath(path, query, method: method, body: body, keyset: keyset, timestamp: timestamp)
    }

    private func json(_ body: String) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(body.utf8))) as? [String: Any] ?? [:]
    }

    private func deniedChannels(_ body: String) -> [String]? {
        (json(body)["payload"] as? [String: Any])?["channels"] as? [String]
    }

    /// A grant is kept (in a cluster, in PostgreSQL, whose text cannot hold a NUL): a name with
    /// a control character is refused with 400, naming the parameter, and nothing is granted.
    @Test func v2GrantNamesWithControlCharactersAreRefused() async throws {
        let server = try await start()
        for (parameter, value) in [("auth", "a\u{0}b"), ("channel", "room\u{1}"), ("channel-group", "g\u{7F}"), ("target-uuid", "\u{0}")] {
            var query = ["r": "1", "ttl": "5", "uuid": "admin", "channel": "open"]
            query[parameter] = value
            let refused = try await server.get(signed("/v2/auth/grant/sub-key/sub-s", query))
            #expect(refused.status == 400, "\(parameter): \(refused.body)")
            #expect(refused.body.contains("Invalid \(parameter)"), "\(refused.body)")
            #expect(json(refused.body)["service"] as? String == "Access Manager")
        }
        let audit = try await server.get(signed("/v2/auth/audit/sub-key/sub-s", ["uuid": "admin"]))
        #expect(audit.status == 200)
        #expect(!audit.body.contains("\"open\""), "\(audit.body)")
        #expect(try await server.get("/v2/subscribe/sub-s/open/0?tt=0&uuid=u&auth=ak").status == 403)
        await server.stop()
    }

    @Test func v2GrantsAllowExactlyWhatWasGranted() async throws {
        let server = try await start()
        // Nothing granted: denied, with the channel listed.
        let denied = try await server.get("/v2/subscribe/sub-s/open/0?tt=0&uuid=u&auth=ak")
        #expect(denied.status == 403)
        #expect(deniedChannels(denied.body) == ["open"])
        #expect(json(denied.body)["service"] as? String == "Access Manager")

        let grant = try await server.get(signed("/v2/auth/grant/sub-key/sub-s", ["channel": "open", "auth": "ak", "r": "1", "w": "1", "ttl": "5", "uuid": "admin"]))
        #expect(grant.status == 200, "\(grant.body)")
        #expect((json(grant.body)["payload"] as? [String: Any])?["level"] as? String == "user")

        #expect(try await server.get("/v2/subscribe/sub-s/open/0?tt=0&uuid=u&auth=ak").status == 200)
        #expect(try await server.get("/publish/pub-s/sub-s/0/open/0/1?uuid=u&auth=ak").status == 200)
        // Only the denied channel is listed; another auth key gets nothing.
        let mixed = try await server.get("/v2/subscribe/sub-s/open,closed,open-pnpres/0?tt=0&uuid=u&auth=ak")
        #expect(mixed.status == 403)
        #expect(Set(deniedChannels(mixed.body) ?? []) == ["closed", "open-pnpres"])
        #expect(try await server.get("/v2/subscribe/sub-s/open/0?tt=0&uuid=u&auth=other").status == 403)
        // History needs read, delete needs delete.
        #expect(try await server.get("/v3/history/sub-key/sub-s/channel/open?auth=ak&uuid=u").status == 200)
        #expect(try await server.send("/v3/history/sub-key/sub-s/channel/open?auth=ak&uuid=u", method: .DELETE, body: nil).status == 403)

        let audit = try await server.get(signed("/v2/auth/audit/sub-key/sub-s", ["channel": "open", "uuid": "admin"]))
        let channels = (json(audit.body)["payload"] as? [String: Any])?["channels"] as? [String: Any]
        #expect(channels?["open"] != nil)
        await server.stop()

        // Grants are durable.
        let restarted = try await start(server.directory)
        #expect(try await restarted.get("/v2/subscribe/sub-s/open/0?tt=0&uuid=u&auth=ak").status == 200)
        await restarted.stop()
    }

    @Test func signaturesAreVerified() async throws {
        let server = try await start()
        let path = "/v2/auth/grant/sub-key/sub-s"
        let good = signed(path, ["channel": "c", "r": "1", "uuid": "admin"])
        #expect(try await server.get(good).status == 200)
        // Tampered query, old timestamp, missing signature, another keyset's secret.
        let tampered = good.replacingOccurrences(of: "channel=c", with: "channel=d")
        #expect(try await server.get(tampered).body.contains("Signature does not match"))
        let old = try await server.get(signed(path, ["channel": "c", "r": "1"], timestamp: Int64(Date().timeIntervalSince1970) - 3600))
        #expect(old.status == 403)
        #expect(old.body.contains("window"))
        #expect(try await server.get("\(path)?channel=c&r=1").status == 403)
        var wrongSecret = Self.keyset
        wrongSecret.secretKey = "guess"
        #expect(try await server.get(signed(path, ["channel": "c", "r": "1"], keyset: wrongSecret)).status == 403)
        // A signed (admin) request needs no grant.
        let adminPublish = signed("/publish/pub-s/sub-s/0/anything/0/1", ["uuid": "server"])
        #expect(try await server.get(adminPublish).status == 200)
        await server.stop()
    }

    /// A signed long-poll that waits longer than the signature window is still answered: the
    /// signature was verified when the request arrived, and a long-poll served again after a
    /// wait parked in the hub keeps that verdict (it re-checks grants, not the timestamp).
    /// Waits 3 s of wall time: the signature window is the server's wall clock.
    @Test func aSignedLongPollOutlivesItsSignatureWindow() async throws {
        let server = try await start()
        let handshake = try await server.get(signed("/v2/subscribe/sub-s/late/0", ["tt": "0", "uuid": "admin"]))
        let cursor = (json(handshake.body)["t"] as? [String: Any])?["t"] as? String ?? ""
        #expect(handshake.status == 200 && !cursor.isEmpty, "\(handshake.body)")
        // Signed 58 s ago: inside the 60 s window when it arrives, outside it 3 s later.
        let stale = Int64(Date().timeIntervalSince1970) - 58
        async let waiting = server.get(signed("/v2/subscribe/sub-s/late/0", ["tt": cursor, "uuid": "admin"], timestamp: stale))
        #expect(await server.longPollsWaiting(1))
        try await Task.sleep(for: .seconds(3))
        #expect(try await server.get(signed("/publish/pub-s/sub-s/0/late/0/1", ["uuid": "server"])).status == 200)
        let answer = try await waiting
        #expect(answer.status == 200, "\(answer.body)")
        #expect(((json(answer.body)["m"] as? [[String: Any]]) ?? []).count == 1)
        await server.stop()
    }

    private func grantToken(_ server: TestServer, _ body: String, keyset: Keyset = AccessTests.keyset) async throws -> String {
        let path = "/v3/pam/\(keyset.subscribeKey)/grant"
        let response = try await server.send(signed(path, ["uuid": "admin"], method: "POST", body: body, keyset: keyset), method: .POST,
                                             body: Array(body.utf8), headers: [("Content-Type", "application/json")])
        guard let token = (json(response.body)["data"] as? [String: Any])?["token"] as? String else {
            throw TestFailure("grant-token failed: \(response.status) \(response.body)")
        }
        return token
    }

    @Test func tokensAreSignedScopedAndRevocableWhileALongPollWaits() async throws {
        let server = try await start()
        let token = try await grantToken(server, #"{"ttl":10,"permissions":{"resources":{"channels":{"room":3}},"patterns":{"channels":{"^team-.*$":1}},"meta":{"app":"test"},"uuid":"alice"}}"#)
        let auth = PercentCoding.encode(token)
        #expect(try await server.get("/publish/pub-s/sub-s/0/room/0/1?uuid=alice&auth=\(auth)").status == 200)
        #expect(try await server.get("/v2/subscribe/sub-s/team-red/0?tt=0&uuid=alice&auth=\(auth)").status == 200)
        let notGranted = try await server.get("/publish/pub-s/sub-s/0/team-red/0/1?uuid=alice&auth=\(auth)")
        #expect(notGranted.status == 403)  // patterns grant read only
        #expect(deniedChannels(notGranted.body) == ["team-red"])
        #expect(try await server.get("/v2/subscribe/sub-s/room/0?tt=0&uuid=mallory&auth=\(auth)").status == 403)

        // Forged, truncated, and another keyset's tokens are refused.
        var bytes = Base64.decode(token)!
        bytes[bytes.count / 2] ^= 0x01
        #expect(try await server.get("/v2/subscribe/sub-s/room/0?tt=0&uuid=alice&auth=\(PercentCoding.encode(Base64.encode(bytes)))").status == 403)
        #expect(try await server.get("/v2/subscribe/sub-s/room/0?tt=0&uuid=alice&auth=\(PercentCoding.encode(String(token.prefix(20))))").status == 403)
        let foreign = try await grantToken(server, #"{"ttl":10,"permissions":{"resources":{"channels":{"room":3}}}}"#, keyset: Self.other)
        #expect(try await server.get("/v2/subscribe/sub-s/room/0?tt=0&uuid=alice&auth=\(PercentCoding.encode(foreign))").status == 403)

        // A subscriber waiting in a long-poll is answered 403 as soon as its token is revoked.
        let cursor = try await server.object("/v2/subscribe/sub-s/room/0?tt=0&uuid=alice&auth=\(auth)")
        let tt = (cursor["t"] as? [String: Any])?["t"] as? String ?? "0"
        async let waiting = server.get("/v2/subscribe/sub-s/room/0?tt=\(tt)&tr=1&uuid=alice&auth=\(auth)")
        #expect(await server.longPollsWaiting(1))
        let revokePath = "/v3/pam/sub-s/grant/\(PercentCoding.encode(token))"
        let revoked = try await server.send(signed(revokePath, ["uuid": "admin"], method: "DELETE"), method: .DELETE, body: nil)
        #expect(revoked.status == 200, "\(revoked.body)")
        let answered = try await waiting
        #expect(answered.status == 403)
        #expect(answered.body.contains("Token is revoked"))
        await server.stop()

        // Revocation is durable.
        let restarted = try await start(server.directory)
        #expect(try await restarted.get("/publish/pub-s/sub-s/0/room/0/1?uuid=alice&auth=\(auth)").status == 403)
        await restarted.stop()
    }

    @Test func aGrantThatExpiresWhileALongPollWaitsAnswersItWith403() async throws {
        // The shortest grant is one minute: the long-poll (timeout 90 s) must be refused at the
        // expiry, not answered empty at its own timeout.
        let server = try await TestServer.start(file: .init(keysets: [Self.keyset], subscribeTimeoutSeconds: 90))
        #expect(try await server.get(signed("/v2/auth/grant/sub-key/sub-s", ["channel": "brief", "auth": "ak", "r": "1", "ttl": "1", "uuid": "admin"])).status == 200)
        let handshake = try await server.object("/v2/subscribe/sub-s/brief/0?tt=0&uuid=u&auth=ak")
        let tt = (handshake["t"] as? [String: Any])?["t"] as? String ?? "0"
        let started = ContinuousClock.now
        let answered = try await server.get("/v2/subscribe/sub-s/brief/0?tt=\(tt)&tr=1&uuid=u&auth=ak", timeout: .seconds(120))
        let waited = ContinuousClock.now - started
        #expect(answered.status == 403)
        #expect(deniedChannels(answered.body) == ["brief"])
        #expect(waited < .seconds(75), "refused at the grant's expiry (~60 s), not at the 90 s long-poll timeout: \(waited)")
        await server.stop()
    }

    @Test func invalidTokenGrantsAreRefused() async throws {
        let server = try await start()
        let path = "/v3/pam/sub-s/grant"
        for body in [#"{"ttl":0}"#, #"{"ttl":50000}"#] {
            let response = try await server.send(signed(path, ["uuid": "admin"], method: "POST", body: body), method: .POST, body: Array(body.utf8))
            #expect(response.status == 400)
            #expect(response.body.contains("Invalid ttl"))
        }
        let unsigned = try await server.send("\(path)?uuid=x", method: .POST, body: Array(#"{"ttl":5}"#.utf8))
        #expect(unsigned.status == 403)
        await server.stop()
    }

    @Test func aFloodingClientGetsTooManyRequestsWithoutDisturbingOthers() async throws {
        var limits = Limits()
        limits.publishRatePerSecond = 1
        limits.publishBurst = 3
        let server = try await start(limits: limits)
        let admin = ["uuid": "reader"]
        _ = admin
        // Open keyset access for this test through a keyset-level grant.
        #expect(try await server.get(signed("/v2/auth/grant/sub-key/sub-s", ["r": "1", "w": "1", "ttl": "0", "uuid": "admin"])).status == 200)
        let cursor = try await server.object("/v2/subscribe/sub-s/busy/0?tt=0&uuid=reader")
        let tt = (cursor["t"] as? [String: Any])?["t"] as? String ?? "0"
        var statuses: [Int] = []
        var retryAfter: String?
        for i in 0..<6 {
            let response = try await server.get("/publish/pub-s/sub-s/0/busy/0/\(i)?uuid=flooder")
            statuses.append(response.status)
            if response.status == 429 { retryAfter = response.headers.first(name: "Retry-After") }
        }
        #expect(statuses.prefix(3).allSatisfy { $0 == 200 })
        #expect(statuses.contains(429))
        #expect(retryAfter.flatMap(Int.init).map { $0 >= 1 } == true)
        // Another client publishes fine and the subscriber receives everything accepted.
        #expect(try await server.get("/publish/pub-s/sub-s/0/busy/0/%22calm%22?uuid=polite").status == 200)
        let page = try await server.object("/v2/subscribe/sub-s/busy/0?tt=\(tt)&tr=1&uuid=reader")
        #expect((page["m"] as? [[String: Any]])?.count == statuses.filter { $0 == 200 }.count + 1)
        await server.stop()
    }

    @Test func servesHTTPSWithTheConfiguredCertificate() async throws {
        let certificates = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("Sources/TetherTesting/Certificates")
        let server = try await InProcessServer.start(file: ConfigurationFile(),
                                                     tls: (certificates.appendingPathComponent("server.pem").path,
                                                           certificates.appendingPathComponent("server-key.pem").path))
        let url = server.baseURL
        #expect(url.hasPrefix("https://"))

        var trusting = TLSConfiguration.makeClientConfiguration()
        trusting.trustRoots = .file(certificates.appendingPathComponent("ca.pem").path)
        let client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: .init(tlsConfiguration: trusting))
        let response = try await client.execute(HTTPClientRequest(url: url + "/time/0"), timeout: .seconds(10))
        #expect(response.status == .ok)
        try await client.shutdown()

        let untrusting = HTTPClient(eventLoopGroupProvider: .singleton)
        await #expect(throws: (any Error).self) {
            _ = try await untrusting.execute(HTTPClientRequest(url: url + "/time/0"), timeout: .seconds(10))
        }
        try await untrusting.shutdown()
        await server.stop()
    }
}
