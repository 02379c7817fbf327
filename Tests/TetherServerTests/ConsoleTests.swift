import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import Testing
import TetherProtocol
import TetherServer
import TetherTesting
import TetherTestingServer

/// The live debug console and its admin API over a real server on loopback (docs/console.md):
/// off without a secret, refused without it, the sign-in cookie and its cross-site defences, and
/// the flight recorder telling a WebSocket client's drop and resume and a long-poll client's
/// connection.
@Suite(.serialized) struct ConsoleTests {
    static let secret = "correct horse battery staple"

    static func start(secret: String? = ConsoleTests.secret) async throws -> TestServer {
        TestServer(inProcess: try await InProcessServer.start(file: .init(subscribeTimeoutSeconds: 30), adminSecret: secret))
    }

    static func json(_ body: String) throws -> Any { try JSONSerialization.jsonObject(with: Data(body.utf8)) }

    var bearer: [(String, String)] { [("Authorization", "Bearer \(Self.secret)")] }

    @Test func offWithoutASecret() async throws {
        let server = try await Self.start(secret: nil)
        defer { Task { await server.stop() } }
        #expect(try await server.get("/console").status == 404)
        #expect(try await server.send("/admin/v1/overview", method: .GET, body: nil, headers: bearer).status == 404)
        await server.stop()
    }

    @Test func theConfigFilesAdminSecretIsReadValidatedAndNeverWrittenBack() throws {
        let file = try JSONDecoder().decode(ConfigurationFile.self, from: Data(#"{"adminSecret": "from-the-config-file"}"#.utf8))
        #expect(file.adminSecret == "from-the-config-file")
        try file.validate()
        #expect(ServerConfiguration(file: file).adminSecret == "from-the-config-file")
        let encoded = String(decoding: try JSONEncoder().encode(file), as: UTF8.self)
        #expect(!encoded.contains("from-the-config-file") && !encoded.contains("adminSecret"))
        let short = try JSONDecoder().decode(ConfigurationFile.self, from: Data(#"{"adminSecret": "short"}"#.utf8))
        let error = try #require(throws: ServerConfigurationError.self) { try short.validate() }
        #expect(!"\(error)".contains("short\""))
        #expect(ServerConfiguration(file: .init()).adminSecret == nil)
    }

    @Test func theAdminAPIRefusesAMissingOrWrongSecret() async throws {
        let server = try await Self.start()
        #expect(try await server.get("/admin/v1/overview").status == 401)
        #expect(try await server.send("/admin/v1/clients", method: .GET, body: nil, headers: [("Authorization", "Bearer wrong")]).status == 401)
        #expect(try await server.send("/admin/v1/clients", method: .GET, body: nil, headers: [("Cookie", "tether_console=forged")]).status == 401)
        #expect(try await server.send("/admin/v1/clients/x/kick", method: .POST, body: [], headers: []).status == 401)
        let (status, body, _) = try await server.send("/admin/v1/overview", method: .GET, body: nil, headers: bearer)
        #expect(status == 200)
        let overview = try #require(try Self.json(body) as? [String: Any])
        #expect(overview["connections"] as? [String: Int] == ["long-poll": 0, "websocket": 0])
        #expect(!body.contains(Self.secret))
        // The PubNub wire is unaffected.
        #expect(try await server.get("/time/0").status == 200)
        await server.stop()
    }

    @Test func signInSetsAnHTTPOnlyStrictCookieAndStateChangesNeedSameOriginAndCSRF() async throws {
        let server = try await Self.start()
        let login = try await server.get("/console")
        #expect(login.status == 200)
        #expect(login.body.contains("name=\"secret\""))
        let form = Array("secret=wrong".utf8)
        let refused = try await server.send("/console/login", method: .POST, body: form, headers: [("Content-Type", "application/x-www-form-urlencoded")])
        #expect(refused.status == 401)
        let good = Array("secret=\(Self.secret.replacingOccurrences(of: " ", with: "+"))".utf8)
        let crossSite = try await server.send("/console/login", method: .POST, body: good,
                                              headers: [("Origin", "https://evil.example"), ("Content-Type", "application/x-www-form-urlencoded")])
        #expect(crossSite.status == 403)
        // The redirect after signing in is read, not followed, to see the cookie.
        var configuration = HTTPClient.Configuration()
        configuration.redirectConfiguration = .disallow
        let client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
        defer { _ = client.shutdown() }
        var loginRequest = HTTPClientRequest(url: server.baseURL + "/console/login")
        loginRequest.method = .POST
        loginRequest.headers.add(name: "Content-Type", value: "application/x-www-form-urlencoded")
        loginRequest.body = .bytes(ByteBuffer(bytes: good))
        let signedIn = try await client.execute(loginRequest, timeout: .seconds(10))
        #expect(signedIn.status == .seeOther)
        #expect(signedIn.headers["Location"].first == "/console")
        let cookieHeader = try #require(signedIn.headers["Set-Cookie"].first)
        #expect(cookieHeader.contains("HttpOnly"))
        #expect(cookieHeader.contains("SameSite=Strict"))
        #expect(!cookieHeader.contains("Secure"))  // plain HTTP here; with TLS it is Secure
        let cookie = String(cookieHeader.split(separator: ";")[0])
        let page = try await server.send("/console", method: .GET, body: nil, headers: [("Cookie", cookie)])
        #expect(page.status == 200)
        #expect(!page.body.contains(Self.secret))
        let csrf = try #require(page.body.range(of: "name=\"csrf-token\" content=\"").map { page.body[$0.upperBound...].prefix(64) })
        #expect(try await server.send("/admin/v1/clients", method: .GET, body: nil, headers: [("Cookie", cookie)]).status == 200)
        // A state change with the cookie: refused without the CSRF token, from another origin, or cross-site.
        #expect(try await server.send("/admin/v1/clients/x/kick", method: .POST, body: [], headers: [("Cookie", cookie)]).status == 403)
        #expect(try await server.send("/admin/v1/clients/x/kick", method: .POST, body: [],
                                      headers: [("Cookie", cookie), ("X-CSRF-Token", String(csrf)), ("Origin", "http://evil.example")]).status == 403)
        #expect(try await server.send("/admin/v1/clients/x/kick", method: .POST, body: [],
                                      headers: [("Cookie", cookie), ("X-CSRF-Token", String(csrf)), ("Sec-Fetch-Site", "cross-site")]).status == 403)
        #expect(try await server.send("/admin/v1/clients/x/kick", method: .POST, body: [],
                                      headers: [("Cookie", cookie), ("X-CSRF-Token", String(csrf)), ("Sec-Fetch-Site", "same-origin")]).status == 200)
        await server.stop()
    }

    func client(_ server: TestServer, _ uuid: String) async throws -> [String: Any] {
        let (status, body, _) = try await server.send("/admin/v1/clients/\(uuid)", method: .GET, body: nil, headers: bearer)
        #expect(status == 200, "\(body)")
        return try #require(try Self.json(body) as? [String: Any])
    }

    static func timeline(_ client: [String: Any]) -> [String] {
        (client["timeline"] as? [[String: Any]] ?? []).compactMap { $0["type"] as? String }
    }

    @Test func theTimelineTellsAWebSocketSessionsDropResumeAndCatchUp() async throws {
        let server = try await Self.start()
        let (first, welcome, cursor) = try await WebSocketTests.session(server.inProcess, uuid: "rider", channels: ["train"])
        let token = try #require(welcome["resumeToken"]?.stringValue)
        await first.close()
        try await server.publish("train", "{\"n\":1}")
        try await server.publish("train", "{\"n\":2}")
        let second = WebSocketTestClient(baseURL: server.baseURL)
        second.send(WebSocketTests.hello("rider", resume: (token, cursor)))
        #expect(try #require(await second.frame())["resumed"] == .bool(true))
        #expect(await WebSocketTests.envelopes(second, count: 2).count == 2)
        var events: [String] = []
        for _ in 0..<100 {
            events = Self.timeline(try await client(server, "rider"))
            if events.contains("catch-up") { break }
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(events == ["connected", "session-opened", "dropped", "connected", "resumed", "catch-up"])
        let rider = try await client(server, "rider")
        #expect(rider["transport"] as? String == "websocket")
        #expect(rider["channels"] as? [String] == ["train"])
        #expect(rider["address"] as? String == "127.0.0.1")
        let catchUp = try #require((rider["timeline"] as? [[String: Any]])?.last?["detail"] as? String)
        #expect(catchUp.hasPrefix("2 messages"))
        // Kick closes its socket (the session is kept); ending the kept session expires it.
        let kicked = try await server.send("/admin/v1/clients/rider/kick", method: .POST, body: [], headers: bearer)
        #expect(kicked.body == "{\"closed\":1}")
        #expect(await second.closeCode() != nil)
        for _ in 0..<100 where try await client(server, "rider")["connected"] as? Bool != false {
            try await Task.sleep(for: .milliseconds(20))
        }
        let ended = try await server.send("/admin/v1/clients/rider/end-session", method: .POST, body: [], headers: bearer)
        #expect(ended.body == "{\"ended\":1}")
        #expect(Self.timeline(try await client(server, "rider")).suffix(3) == ["kicked", "dropped", "expired"])
        #expect(server.server.webSocketCounts.kept == 0)
        await second.close()
        await server.stop()
    }

    @Test func aLongPollClientIsSeenAndAdminPublishUsesThePublishPath() async throws {
        let server = try await Self.start()
        let tt = try await server.handshake("news")
        async let poll = server.subscribe("news", tt: tt)
        #expect(await server.longPollsWaiting(1))
        let tester = try await client(server, "tester")
        #expect(tester["connected"] as? Bool == true)
        #expect(tester["transport"] as? String == "long-poll")
        #expect(tester["channels"] as? [String] == ["news"])
        #expect(tester["address"] as? String == "127.0.0.1")
        let body = Array(#"{"channel":"news","message":"{\"text\":\"from the console\"}"}"#.utf8)
        let published = try await server.send("/admin/v1/publish", method: .POST, body: body, headers: bearer)
        #expect(published.status == 200, "\(published.body)")
        let messages = try await poll.messages
        #expect(messages.count == 1)
        #expect((messages.first?["d"] as? [String: Any])?["text"] as? String == "from the console")
        #expect((messages.first?["i"] as? String) == "tether-console")
        let bad = try await server.send("/admin/v1/publish", method: .POST, body: Array(#"{"channel":"news","message":"not json"}"#.utf8), headers: bearer)
        #expect(bad.status == 400)
        let channels = try await server.send("/admin/v1/channels?q=ne*", method: .GET, body: nil, headers: bearer)
        let list = try #require(try Self.json(channels.body) as? [[String: Any]])
        #expect(list.map { $0["channel"] as? String } == ["news"])
        #expect(((list.first?["lastMessages"] as? [[String: Any]])?.first?["payload"] as? String)?.contains("from the console") == true)
        // Kick: the waiting long-poll's connection is closed.
        let cursor = try await poll.cursor
        async let kicked = try? server.subscribe("news", tt: cursor)
        #expect(await server.longPollsWaiting(1))
        let kick = try await server.send("/admin/v1/clients/tester/kick", method: .POST, body: [], headers: bearer)
        #expect(kick.status == 200 && kick.body.contains(#""closed":1"#), "\(kick.body)")
        #expect(await kicked == nil)
        await server.stop()
    }
}
