import Crypto
import CryptoExtras
import Foundation
import Synchronization
import Testing
import TetherTestingServer
import TetherProtocol
import TetherServer
import TetherTesting

/// Mobile push (docs/push.md): registrations through the routes, then the providers against a
/// local HTTP/2 TLS gateway (`PushGatewayServer`) that checks every request as Apple's and
/// Google's documentation describe it — method, path, HTTP/2, headers, the JWT's header and
/// claims with its signature verified with the public key, the payload's shape.
@Suite(.serialized) struct PushTests {
    static let apnsToken = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    static let topic = "com.example.tether"

    // MARK: - Fixtures

    /// A temporary directory with the test CA (for the providers to trust the gateway).
    struct Files {
        let directory: URL
        var caPath: String { directory.appendingPathComponent("ca.pem").path }

        init() throws {
            directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-push-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            try Data(TestCertificates.certificateAuthorityPEM).write(to: directory.appendingPathComponent("ca.pem"))
        }

        func write(_ name: String, _ text: String) throws -> String {
            let url = directory.appendingPathComponent(name)
            try Data(text.utf8).write(to: url)
            return url.path
        }
    }

    static func decodeBase64URL(_ text: Substring) -> Data? {
        var s = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while s.count % 4 != 0 { s += "=" }
        return Data(base64Encoded: s)
    }

    /// A JWT's header, claims, signing input and signature.
    static func parseJWT(_ jwt: String) throws -> (header: [String: Any], claims: [String: Any], input: Data, signature: Data) {
        let parts = jwt.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let h = decodeBase64URL(parts[0]), let c = decodeBase64URL(parts[1]), let sig = decodeBase64URL(parts[2]),
              let header = try JSONSerialization.jsonObject(with: h) as? [String: Any],
              let claims = try JSONSerialization.jsonObject(with: c) as? [String: Any]
        else { throw TestFailure("not a JWT: \(jwt)") }
        return (header, claims, Data("\(parts[0]).\(parts[1])".utf8), sig)
    }

    static func json(_ bytes: [UInt8]) -> [String: Any]? {
        (try? JSONSerialization.jsonObject(with: Data(bytes))) as? [String: Any]
    }

    static func register(_ server: TestServer, token: String, channel: String, apns2 environment: String? = nil,
                         type: String = "apns") async throws {
        let path: String
        if let environment {
            path = "/v2/push/sub-key/demo/devices-apns2/\(token)?add=\(channel)&environment=\(environment)&topic=\(topic)&uuid=t"
        } else {
            path = "/v1/push/sub-key/demo/devices/\(token)?add=\(channel)&type=\(type)&uuid=t"
        }
        let response = try await server.get(path)
        guard response.status == 200 else { throw TestFailure("register: \(response.status) \(response.body)") }
    }

    static func channels(_ server: TestServer, token: String, type: String = "apns") async throws -> [String] {
        let response = try await server.get("/v1/push/sub-key/demo/devices/\(token)?type=\(type)&uuid=t")
        return (try JSONSerialization.jsonObject(with: Data(response.body.utf8))) as? [String] ?? []
    }

    static func apnsServer(_ gateway: PushGatewayServer, files: Files, key: P256.Signing.PrivateKey, keysets: [Keyset] = [],
                           push: (inout ConfigurationFile.Push) -> Void = { _ in }) async throws -> TestServer {
        let keyPath = try files.write("AuthKey.p8", key.pemRepresentation)
        var settings = ConfigurationFile.Push(apns: .init(keyPath: keyPath, keyId: "KEY1234567", teamId: "TEAM123456", topic: topic,
                                                          baseURL: gateway.baseURL, caCertificatePath: files.caPath))
        settings.retryBaseDelayMilliseconds = 1
        push(&settings)
        var file = ConfigurationFile(keysets: keysets, subscribeTimeoutSeconds: 30)
        file.push = settings
        return try await TestServer.start(file: file)
    }

    // MARK: - Registrations

    @Test func registrationsAreBoundedPerDeviceAndPerChannel() async throws {
        var file = ConfigurationFile(subscribeTimeoutSeconds: 30)
        var push = ConfigurationFile.Push()
        push.maxChannelsPerDevice = 2
        push.maxDevicesPerChannel = 2
        file.push = push
        let server = try await TestServer.start(file: file)
        let base = "/v1/push/sub-key/demo/devices"
        #expect(try await server.get("\(base)/aa?type=gcm&add=a,b&uuid=t").status == 200)
        let full = try await server.get("\(base)/aa?type=gcm&add=c&uuid=t")
        #expect(full.status == 400 && full.body.contains("Too many channels for this device: at most 2"))
        #expect(try await Self.channels(server, token: "aa", type: "gcm") == ["a", "b"])
        // Replacing one channel in one request stays within the bound (removals come first).
        #expect(try await server.get("\(base)/aa?type=gcm&remove=b&add=c&uuid=t").status == 200)
        #expect(try await Self.channels(server, token: "aa", type: "gcm") == ["a", "c"])
        #expect(try await server.get("\(base)/bb?type=gcm&add=a&uuid=t").status == 200)
        let crowded = try await server.get("\(base)/cc?type=gcm&add=a&uuid=t")
        #expect(crowded.status == 400 && crowded.body.contains("Too many devices on channel"))
        #expect(try await Self.channels(server, token: "cc", type: "gcm") == [])
        await server.stop()
    }

    /// The check every publish makes of its payload (`"pn_`, `"pn_debug"`) finds exactly what a
    /// search of the UTF-8 bytes finds (and, where no combining mark follows the needle, what
    /// Foundation's substring search finds): listed cases, then strings over a small alphabet
    /// that makes near misses and overlaps common.
    @Test func thePushMarkerSearchFindsWhatASubstringSearchFinds() {
        var texts = ["", "\"", "\"pn", "\"pn_", "x\"pn_", "{\"pn_apns\":{}}", "{\"text\":\"pn_\"}", "\"p\"pn_debug\"",
                     "é\"pn_debug\"ü", String(repeating: "\"pn", count: 50) + "_", "\"pn_debug", "{\"pn_debug\":true}"]
        let alphabet: [Character] = ["\"", "p", "n", "_", "d", "e", "b", "u", "g", "é", "\u{301}"]
        var seed: UInt64 = 0x2545F4914F6CDD1D
        for _ in 0..<2_000 {
            var text = ""
            seed = seed &* 6364136223846793005 &+ 1442695040888963407
            for _ in 0..<Int(seed >> 58) {
                seed = seed &* 6364136223846793005 &+ 1442695040888963407
                text.append(alphabet[Int(seed >> 33) % alphabet.count])
            }
            texts.append(text)
        }
        func bytesContain(_ text: String, _ needle: String) -> Bool {
            let bytes = Array(text.utf8), pattern = Array(needle.utf8)
            guard bytes.count >= pattern.count else { return false }
            return (0...(bytes.count - pattern.count)).contains { Array(bytes[$0..<$0 + pattern.count]) == pattern }
        }
        for text in texts {
            #expect(PushDispatcher.contains(text, "\"pn_") == bytesContain(text, "\"pn_"), "\(text)")
            #expect(PushDispatcher.contains(text, "\"pn_debug\"") == bytesContain(text, "\"pn_debug\""), "\(text)")
            if !text.unicodeScalars.contains("\u{301}") {
                #expect(PushDispatcher.contains(text, "\"pn_") == text.contains("\"pn_"), "\(text)")
            }
        }
        // A combining mark after the needle does not hide it from the byte search.
        #expect(PushDispatcher.contains("{\"pn_\u{301}apns\":1}", "\"pn_"))
    }

    /// Every numeric push setting is bounded: hostile values are refused at load, naming the key.
    @Test(arguments: [0, -1, Int.min, Int.max, 600_001])
    func pushSettingsOutOfRangeAreRefusedNamingTheKey(_ value: Int) {
        let setters: [(String, (inout ConfigurationFile.Push) -> Void)] = [
            ("push.retryMaxDelayMilliseconds", { $0.retryMaxDelayMilliseconds = value }),
            ("push.retryBaseDelayMilliseconds", { $0.retryBaseDelayMilliseconds = value }),
            ("push.maxAttempts", { $0.maxAttempts = value }),
            ("push.concurrency", { $0.concurrency = value }),
        ]
        for (key, set) in setters {
            var push = ConfigurationFile.Push()
            set(&push)
            #expect(throws: ServerConfigurationError.self, "\(key) = \(value)") { try push.validate() }
            do { try push.validate() } catch { #expect("\(error)".contains(key), "\(error)") }
        }
        var fine = ConfigurationFile.Push()
        fine.retryMaxDelayMilliseconds = 600_000
        #expect(throws: Never.self) { try fine.validate() }
    }

    @Test func backoffDoublesToItsCapWithEqualJitter() {
        let backoff = PushBackoff(base: .milliseconds(100), cap: .seconds(1))
        #expect(backoff.delay(afterAttempt: 1, jitter: 0) == .milliseconds(50))
        #expect(backoff.delay(afterAttempt: 1, jitter: 1) == .milliseconds(100))
        #expect(backoff.delay(afterAttempt: 2, jitter: 1) == .milliseconds(200))
        #expect(backoff.delay(afterAttempt: 3, jitter: 0.5) == .milliseconds(300))
        #expect(backoff.delay(afterAttempt: 10, jitter: 1) == .seconds(1))
        #expect(backoff.delay(afterAttempt: 1000, jitter: 0) == .milliseconds(500))
        #expect(backoff.delay(afterAttempt: 1, jitter: 0, retryAfter: .milliseconds(800)) == .milliseconds(800))
        #expect(backoff.delay(afterAttempt: 1, jitter: 0, retryAfter: .seconds(5)) == .seconds(1), "a Retry-After waits the cap at most")
    }

    // MARK: - APNs

    @Test func apnsRequestIsExactlyAsAppleDocumentsIt() async throws {
        let files = try Files()
        let key = P256.Signing.PrivateKey()
        let gateway = try await PushGatewayServer.start { _ in .init(status: 200) }
        let server = try await Self.apnsServer(gateway, files: files, key: key)
        try await Self.register(server, token: Self.apnsToken, channel: "news", apns2: "development")
        let message = #"{"text":"hi","pn_apns":{"aps":{"alert":{"title":"T","body":"B"},"badge":2},"custom":"x","pn_push":[{"push_type":"alert","targets":[{"environment":"development","topic":"com.example.tether"}],"version":"v2"}]},"pn_fcm":{"data":{"a":"b"}}}"#
        let before = Int(Date().timeIntervalSince1970)
        try await server.publish("news", message)
        await server.server.state.push.waitUntilIdle()

        let requests = gateway.requests
        try #require(requests.count == 1)
        let r = requests[0]
        #expect(r.method == "POST")
        #expect(r.path == "/3/device/\(Self.apnsToken)")
        #expect(r.isHTTP2)
        #expect(r.header("apns-topic") == Self.topic)
        #expect(r.header("apns-push-type") == "alert")
        #expect(r.header("apns-priority") == "10")
        let expiration = Int(r.header("apns-expiration") ?? "") ?? 0
        #expect(expiration >= before + 86_400 && expiration <= Int(Date().timeIntervalSince1970) + 86_400)
        let id = r.header("apns-id") ?? ""
        #expect(UUID(uuidString: id) != nil && id == id.lowercased())
        let authorization = try #require(r.header("authorization"))
        #expect(authorization.hasPrefix("bearer "))
        let jwt = try Self.parseJWT(String(authorization.dropFirst("bearer ".count)))
        #expect(jwt.header["alg"] as? String == "ES256" && jwt.header["kid"] as? String == "KEY1234567")
        #expect(jwt.header.count == 2)
        #expect(jwt.claims["iss"] as? String == "TEAM123456")
        let iat = jwt.claims["iat"] as? Int ?? 0
        #expect(iat >= before - 1 && iat <= Int(Date().timeIntervalSince1970))
        let signature = try P256.Signing.ECDSASignature(rawRepresentation: jwt.signature)
        #expect(key.publicKey.isValidSignature(signature, for: jwt.input))
        // The body is pn_apns without its pn_* keys.
        let body = try #require(Self.json(r.body))
        #expect(Set(body.keys) == ["aps", "custom"])
        #expect((body["aps"] as? [String: Any])?["badge"] as? Int == 2)

        // A second message reuses the provider token (Apple refuses one refreshed too often).
        try await server.publish("news", #"{"pn_apns":{"aps":{"alert":"again"}}}"#)
        await server.server.state.push.waitUntilIdle()
        try #require(gateway.requests.count == 2)
        #expect(gateway.requests[1].header("authorization") == authorization)
        #expect(gateway.requests[1].header("apns-id") != id)
        await server.stop()
        await gateway.stop()
    }

    @Test func apnsEnvironmentTargetsAndBackgroundPushes() async throws {
        let files = try Files()
        let gateway = try await PushGatewayServer.start { _ in .init(status: 200) }
        let server = try await Self.apnsServer(gateway, files: files, key: P256.Signing.PrivateKey())
        try await Self.register(server, token: "aa01", channel: "targets", apns2: "development")
        try await Self.register(server, token: "bb02", channel: "targets", apns2: "production")
        // Only production devices of the topic are targeted; a background push has priority 5.
        try await server.publish("targets", #"{"pn_apns":{"aps":{"content-available":1},"pn_push":[{"push_type":"background","targets":[{"environment":"production","topic":"com.example.tether"}]}]}}"#)
        await server.server.state.push.waitUntilIdle()
        try #require(gateway.requests.count == 1)
        #expect(gateway.requests[0].path == "/3/device/bb02")
        #expect(gateway.requests[0].header("apns-push-type") == "background")
        #expect(gateway.requests[0].header("apns-priority") == "5")
        #expect(gateway.requests[0].header("apns-topic") == Self.topic)
        // A VoIP push goes to the bundle's `.voip` topic, as Apple requires.
        try await server.publish("targets", #"{"pn_apns":{"aps":{},"pn_push":[{"push_type":"voip","targets":[{"environment":"development","topic":"com.example.tether"}]}]}}"#)
        await server.server.state.push.waitUntilIdle()
        try #require(gateway.requests.count == 2)
        #expect(gateway.requests[1].path == "/3/device/aa01")
        #expect(gateway.requests[1].header("apns-push-type") == "voip" && gateway.requests[1].header("apns-topic") == Self.topic + ".voip")
        await server.stop()
        await gateway.stop()
    }

    @Test(arguments: [(410, "Unregistered"), (400, "BadDeviceToken")])
    func apnsInvalidTokenUnregistersTheDevice(_ status: Int, _ reason: String) async throws {
        let files = try Files()
        let gateway = try await PushGatewayServer.start { _ in .init(status: status, body: #"{"reason":"\#(reason)"}"#) }
        let server = try await Self.apnsServer(gateway, files: files, key: P256.Signing.PrivateKey())
        try await Self.register(server, token: Self.apnsToken, channel: "gone")
        try await Self.register(server, token: Self.apnsToken, channel: "other")
        #expect(try await Self.channels(server, token: Self.apnsToken) == ["gone", "other"])
        try await server.publish("gone", #"{"pn_apns":{"aps":{"alert":"x"}}}"#)
        await server.server.state.push.waitUntilIdle()
        #expect(gateway.requests.count == 1)
        // v1 devices are sent to production with the configured topic.
        #expect(gateway.requests.first?.header("apns-topic") == Self.topic)
        #expect(try await Self.channels(server, token: Self.apnsToken) == [])
        #expect(try await server.server.state.store.pushRegistrationCount() == 0)
        await server.stop()
        await gateway.stop()
    }

    /// A publisher chooses `push_type`, and so the topic: Apple's `DeviceTokenNotForTopic` is
    /// not the device's fault, and an undocumented push type is not sent (nor retried). Neither
    /// may unregister the device from its channels.
    @Test func aTopicTheDeviceIsNotForLeavesItRegistered() async throws {
        let files = try Files()
        let gateway = try await PushGatewayServer.start { request in
            request.header("apns-topic")?.hasSuffix(".voip") == true
                ? .init(status: 400, body: #"{"reason":"DeviceTokenNotForTopic"}"#) : .init(status: 200)
        }
        let server = try await Self.apnsServer(gateway, files: files, key: P256.Signing.PrivateKey())
        try await Self.register(server, token: Self.apnsToken, channel: "room")
        try await Self.register(server, token: Self.apnsToken, channel: "other")
        try await server.publish("room", #"{"pn_apns":{"aps":{"alert":"x"},"pn_push":[{"push_type":"voip","targets":[]}]}}"#)
        try await server.publish("room", #"{"pn_apns":{"aps":{"alert":"y"},"pn_push":[{"push_type":"a\r\nb","targets":[]}]}}"#)
        await server.server.state.push.waitUntilIdle()
        #expect(gateway.requests.count == 1, "the undocumented push type is not sent")
        #expect(gateway.requests.first?.header("apns-topic") == Self.topic + ".voip")
        #expect(try await Self.channels(server, token: Self.apnsToken) == ["other", "room"])
        // A VoIP entry for another topic does not set this APNs2 device's push type.
        let token2 = String(repeating: "ab", count: 32)
        try await Self.register(server, token: token2, channel: "mixed", apns2: "production")
        try await server.publish("mixed", #"""
            {"pn_apns":{"aps":{"alert":"z"},"pn_push":[{"push_type":"voip","targets":[{"topic":"com.other.voip","environment":"production"}]},
            {"push_type":"alert","targets":[{"topic":"\#(Self.topic)","environment":"production"}]}]}}
            """#)
        await server.server.state.push.waitUntilIdle()
        let last = try #require(gateway.requests.last)
        #expect(last.path == "/3/device/\(token2)")
        #expect(last.header("apns-push-type") == "alert" && last.header("apns-topic") == Self.topic)
        await server.stop()
        await gateway.stop()
    }

    @Test func apns429And500AreRetriedThenSucceed() async throws {
        let files = try Files()
        let answers = Mutex([PushGatewayServer.Reply(status: 429, headers: [("retry-after", "0")], body: #"{"reason":"TooManyRequests"}"#),
                             PushGatewayServer.Reply(status: 500, body: #"{"reason":"InternalServerError"}"#),
                             PushGatewayServer.Reply(status: 200)])
        let gateway = try await PushGatewayServer.start { _ in answers.withLock { $0.isEmpty ? .init(status: 200) : $0.removeFirst() } }
        let server = try await Self.apnsServer(gateway, files: files, key: P256.Signing.PrivateKey())
        try await Self.register(server, token: Self.apnsToken, channel: "retry")
        try await server.publish("retry", #"{"pn_apns":{"aps":{"alert":"x"}}}"#)
        await server.server.state.push.waitUntilIdle()
        #expect(gateway.requests.count == 3)
        // The same notification each time, and the device stays registered.
        #expect(Set(gateway.requests.map { $0.body }).count == 1)
        #expect(try await Self.channels(server, token: Self.apnsToken) == ["retry"])
        await server.stop()
        await gateway.stop()
    }

    /// One worker sends every push: a `Retry-After` longer than the backoff's longest wait is
    /// waited for that long at most (`retryMaxDelayMilliseconds`), not an hour with every other
    /// push behind it; the notification is retried within `maxAttempts`.
    @Test func aRetryAfterLongerThanTheBackoffWaitsTheBackoffsLongestAtMost() async throws {
        let files = try Files()
        let gateway = try await PushGatewayServer.start { request in
            request.path.hasSuffix("/aa02") ? .init(status: 200)
                : .init(status: 429, headers: [("retry-after", "3600")], body: #"{"reason":"TooManyRequests"}"#)
        }
        let server = try await Self.apnsServer(gateway, files: files, key: P256.Signing.PrivateKey()) {
            $0.retryMaxDelayMilliseconds = 50
            $0.maxAttempts = 2
        }
        try await Self.register(server, token: "aa01", channel: "busy")
        try await Self.register(server, token: "aa02", channel: "calm")
        try await server.publish("busy", #"{"pn_apns":{"aps":{"alert":"1"}}}"#)
        try await server.publish("calm", #"{"pn_apns":{"aps":{"alert":"2"}}}"#)
        #expect(await finishes(within: 20) { await server.server.state.push.waitUntilIdle() })
        #expect(gateway.requests.map(\.path) == ["/3/device/aa01", "/3/device/aa01", "/3/device/aa02"])
        #expect(try await Self.channels(server, token: "aa01") == ["busy"], "still registered")
        await server.stop()
        await gateway.stop()
    }

    @Test func retriesAreBoundedByMaxAttempts() async throws {
        let files = try Files()
        let gateway = try await PushGatewayServer.start { _ in .init(status: 503, body: #"{"reason":"ServiceUnavailable"}"#) }
        let server = try await Self.apnsServer(gateway, files: files, key: P256.Signing.PrivateKey()) { $0.maxAttempts = 3 }
        try await Self.register(server, token: Self.apnsToken, channel: "down")
        try await server.publish("down", #"{"pn_apns":{"aps":{"alert":"x"}}}"#)
        await server.server.state.push.waitUntilIdle()
        #expect(gateway.requests.count == 3)
        #expect(try await Self.channels(server, token: Self.apnsToken) == ["down"])
        await server.stop()
        await gateway.stop()
    }

    @Test func aSlowGatewayNeverHoldsAPublish() async throws {
        let files = try Files()
        let (gate, open) = AsyncStream.makeStream(of: Void.self)
        let gateway = try await PushGatewayServer.start { _ in
            for await _ in gate { break }
            return .init(status: 200)
        }
        let server = try await Self.apnsServer(gateway, files: files, key: P256.Signing.PrivateKey()) { $0.queueCapacity = 2 }
        try await Self.register(server, token: Self.apnsToken, channel: "slow")
        let push = server.server.state.push
        // The first push is held at the gateway; publishes keep being answered meanwhile.
        try await server.publish("slow", #"{"pn_apns":{"aps":{"alert":"1"}}}"#)
        #expect(await finishes(within: 10) { while gateway.requests.isEmpty { try? await Task.sleep(for: .milliseconds(5)) } })
        try await server.publish("slow", #"{"pn_apns":{"aps":{"alert":"2"}}}"#)
        try await server.publish("slow", #"{"pn_apns":{"aps":{"alert":"3"}}}"#)
        // Over the queue's bound: answered too, its push dropped.
        try await server.publish("slow", #"{"pn_apns":{"aps":{"alert":"4"}}}"#)
        #expect(gateway.requests.count == 1)
        #expect(push.pendingJobs == 3)
        // Messages without push parts never enter the queue.
        try await server.publish("slow", #"{"text":"plain"}"#)
        #expect(push.pendingJobs == 3)
        open.yield()
        open.finish()
        await push.waitUntilIdle()
        let alerts = gateway.requests.compactMap { Self.json($0.body).flatMap { ($0["aps"] as? [String: Any])?["alert"] as? String } }
        #expect(alerts == ["1", "2", "3"])
        await server.stop()
        await gateway.stop()
    }

    // MARK: - FCM

    static func fcmServer(_ gateway: PushGatewayServer, files: Files, key: _RSA.Signing.PrivateKey) async throws -> TestServer {
        let account: [String: Any] = [
            "type": "service_account", "project_id": "tether-test", "private_key_id": "abc",
            "private_key": key.pemRepresentation, "client_email": "push@tether-test.iam.gserviceaccount.com",
            "token_uri": gateway.baseURL + "/token",
        ]
        let path = try files.write("service-account.json",
                                   String(decoding: try JSONSerialization.data(withJSONObject: account), as: UTF8.self))
        var settings = ConfigurationFile.Push(fcm: .init(serviceAccountPath: path, baseURL: gateway.baseURL, caCertificatePath: files.caPath))
        settings.retryBaseDelayMilliseconds = 1
        var file = ConfigurationFile(subscribeTimeoutSeconds: 30)
        file.push = settings
        return try await TestServer.start(file: file)
    }

    /// A token endpoint that verifies the RS256 assertion with `key`'s public key.
    static func fcmGateway(key: _RSA.Signing.PrivateKey, send: @escaping @Sendable (PushGatewayServer.Request) -> PushGatewayServer.Reply)
        async throws -> PushGatewayServer
    {
        try await PushGatewayServer.start { request in
            guard request.path == "/token" else { return send(request) }
            let form = String(decoding: request.body, as: UTF8.self)
            var fields: [String: String] = [:]
            for pair in form.split(separator: "&") {
                let kv = pair.split(separator: "=", maxSplits: 1).map { String($0).removingPercentEncoding ?? "" }
                if kv.count == 2 { fields[kv[0]] = kv[1] }
            }
            guard request.method == "POST", request.header("content-type") == "application/x-www-form-urlencoded",
                  fields["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer", let assertion = fields["assertion"],
                  let jwt = try? parseJWT(assertion), jwt.header["alg"] as? String == "RS256",
                  jwt.claims["iss"] as? String == "push@tether-test.iam.gserviceaccount.com",
                  jwt.claims["scope"] as? String == "https://www.googleapis.com/auth/firebase.messaging",
                  let audience = jwt.claims["aud"] as? String, audience.hasPrefix("https://localhost:"), audience.hasSuffix("/token"),
                  let iat = jwt.claims["iat"] as? Int, jwt.claims["exp"] as? Int == iat + 3600,
                  key.publicKey.isValidSignature(_RSA.Signing.RSASignature(rawRepresentation: jwt.signature), for: jwt.input,
                                                 padding: .insecurePKCS1v1_5)
            else { return .init(status: 400, body: #"{"error":"invalid_grant"}"#) }
            return .init(status: 200, body: #"{"access_token":"ya29.test-token","expires_in":3599,"token_type":"Bearer"}"#)
        }
    }

    @Test func fcmRequestAndTokenAreExactlyAsGoogleDocumentsThem() async throws {
        let files = try Files()
        let key = try _RSA.Signing.PrivateKey(keySize: .bits2048)
        let gateway = try await Self.fcmGateway(key: key) { _ in .init(status: 200, body: #"{"name":"projects/tether-test/messages/1"}"#) }
        let server = try await Self.fcmServer(gateway, files: files, key: key)
        try await Self.register(server, token: "fcm-token-1", channel: "droid", type: "fcm")
        try await server.publish("droid", #"{"pn_fcm":{"notification":{"title":"T","body":"B"},"data":{"n":3,"flag":true,"obj":{"a":1},"s":"x","gone":null},"android":{"priority":"high"},"pn_exceptions":["nobody"]}}"#)
        await server.server.state.push.waitUntilIdle()
        let requests = gateway.requests
        try #require(requests.count == 2, "\(requests.map(\.path))")
        #expect(requests[0].path == "/token" && requests[0].isHTTP2)
        let send = requests[1]
        #expect(send.method == "POST" && send.isHTTP2)
        #expect(send.path == "/v1/projects/tether-test/messages:send")
        #expect(send.header("authorization") == "Bearer ya29.test-token")
        let body = try #require(Self.json(send.body))
        let message = try #require(body["message"] as? [String: Any])
        #expect(body.count == 1)
        #expect(Set(message.keys) == ["token", "notification", "data", "android"])
        #expect(message["token"] as? String == "fcm-token-1")
        // FCM's data is a map of strings.
        #expect(message["data"] as? [String: String] == ["n": "3", "flag": "true", "obj": #"{"a":1}"#, "s": "x"])
        #expect((message["android"] as? [String: Any])?["priority"] as? String == "high")

        // The access token is reused until it expires; pn_gcm works as pn_fcm does.
        try await server.publish("droid", #"{"pn_gcm":{"data":{"k":"v"}}}"#)
        await server.server.state.push.waitUntilIdle()
        #expect(gateway.requests.map(\.path) == ["/token", "/v1/projects/tether-test/messages:send", "/v1/projects/tether-test/messages:send"])
        await server.stop()
        await gateway.stop()
    }

    @Test func fcmUnregisteredTokenUnregistersAndExceptionsAreSkipped() async throws {
        let files = try Files()
        let key = try _RSA.Signing.PrivateKey(keySize: .bits2048)
        let unregistered = #"{"error":{"code":404,"message":"Requested entity was not found.","status":"NOT_FOUND","details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"UNREGISTERED"}]}}"#
        let invalid = #"{"error":{"code":400,"message":"The registration token is not a valid FCM registration token","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"INVALID_ARGUMENT"}]}}"#
        let gateway = try await Self.fcmGateway(key: key) { request in
            let token = (Self.json(request.body)?["message"] as? [String: Any])?["token"] as? String
            switch token {
            case "dead": return .init(status: 404, body: unregistered)
            case "malformed": return .init(status: 400, body: invalid)
            default: return .init(status: 200, body: "{}")
            }
        }
        let server = try await Self.fcmServer(gateway, files: files, key: key)
        for token in ["dead", "malformed", "alive", "skipped"] { try await Self.register(server, token: token, channel: "mixed", type: "gcm") }
        try await server.publish("mixed", #"{"pn_fcm":{"data":{"k":"v"}},"pn_exceptions":["skipped"]}"#)
        await server.server.state.push.waitUntilIdle()
        let sentTo = gateway.requests.filter { $0.path != "/token" }
            .compactMap { (Self.json($0.body)?["message"] as? [String: Any])?["token"] as? String }
        #expect(Set(sentTo) == ["dead", "malformed", "alive"])
        #expect(try await Self.channels(server, token: "dead", type: "gcm") == [])
        #expect(try await Self.channels(server, token: "malformed", type: "gcm") == [])
        #expect(try await Self.channels(server, token: "alive", type: "gcm") == ["mixed"])
        #expect(try await Self.channels(server, token: "skipped", type: "gcm") == ["mixed"])
        await server.stop()
        await gateway.stop()
    }

    /// Google's validation messages repeat the publisher's field names and values; only what it
    /// says about the token (`UNREGISTERED`, a violation on `message.token`) unregisters a device,
    /// and a plain 404 (a proxy, a wrong base URL) does not.
    @Test func fcmErrorsAboutOtherFieldsLeaveTheDeviceRegistered() async throws {
        let files = try Files()
        let key = try _RSA.Signing.PrivateKey(keySize: .bits2048)
        let echo = #"{"error":{"code":400,"message":"Invalid value at 'message.android.priority' (type.googleapis.com/google.firebase.fcm.v1.AndroidMessagePriority), \"token\"","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.BadRequest","fieldViolations":[{"field":"message.android.priority","description":"Invalid value at 'message.android.priority', \"token\""}]}]}}"#
        let badToken = #"{"error":{"code":400,"message":"Invalid value","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.BadRequest","fieldViolations":[{"field":"message.token","description":"Invalid registration token"}]}]}}"#
        let gateway = try await Self.fcmGateway(key: key) { request in
            let token = (Self.json(request.body)?["message"] as? [String: Any])?["token"] as? String
            switch token {
            case "echoed": return .init(status: 400, body: echo)
            case "proxied": return .init(status: 404, body: "<html>Not Found</html>")
            case "bad": return .init(status: 400, body: badToken)
            default: return .init(status: 200, body: "{}")
            }
        }
        let server = try await Self.fcmServer(gateway, files: files, key: key)
        for token in ["echoed", "proxied", "bad"] { try await Self.register(server, token: token, channel: "room", type: "gcm") }
        try await server.publish("room", #"{"pn_fcm":{"data":{"k":"v"},"android":{"priority":"token"}}}"#)
        await server.server.state.push.waitUntilIdle()
        #expect(try await Self.channels(server, token: "echoed", type: "gcm") == ["room"])
        #expect(try await Self.channels(server, token: "proxied", type: "gcm") == ["room"])
        #expect(try await Self.channels(server, token: "bad", type: "gcm") == [])
        await server.stop()
        await gateway.stop()
    }

    // MARK: - Webhook

    @Test func webhookPostsASignedDocument() async throws {
        let files = try Files()
        let gateway = try await PushGatewayServer.start { _ in .init(status: 204) }
        var file = ConfigurationFile(subscribeTimeoutSeconds: 30)
        file.push = ConfigurationFile.Push(webhook: .init(url: gateway.baseURL + "/hooks/push", secret: "s3cret", caCertificatePath: files.caPath))
        let server = try await TestServer.start(file: file)
        try await Self.register(server, token: "w1", channel: "hook", type: "gcm")
        let tt = try await server.publish("hook", #"{"pn_gcm":{"data":{"k":"v"}}}"#)
        await server.server.state.push.waitUntilIdle()
        try #require(gateway.requests.count == 1)
        let r = gateway.requests[0]
        #expect(r.method == "POST" && r.path == "/hooks/push")
        #expect(r.header("content-type") == "application/json")
        #expect(r.header("x-tether-signature") == WebhookPushProvider.signature(body: r.body, secret: "s3cret"))
        let mac = HMAC<SHA256>.authenticationCode(for: r.body, using: SymmetricKey(data: Array("s3cret".utf8)))
        #expect(r.header("x-tether-signature") == "sha256=" + mac.map { String(format: "%02x", $0) }.joined())
        let body = try #require(Self.json(r.body))
        #expect(body["channel"] as? String == "hook" && body["timetoken"] as? String == String(tt.rawValue))
        #expect(body["device"] as? [String: String] == ["token": "w1", "type": "gcm"])
        #expect(body["payload"] as? [String: [String: String]] == ["data": ["k": "v"]])
        await server.stop()
        await gateway.stop()
    }
}

/// The providers' credentials on an injected clock: Apple's provider token is reused for 50
/// minutes and renewed after (never sooner than 20 minutes on `ExpiredProviderToken`); Google's
/// access token until a minute before its `expires_in`.
@Suite(.serialized) struct PushCredentialTests {
    final class TestClock: Sendable {
        let date = Mutex(Date(timeIntervalSince1970: 1_800_000_000))
        func advance(minutes: Double) { date.withLock { $0 = $0.addingTimeInterval(minutes * 60) } }
        var now: Date { date.withLock { $0 } }
    }

    @Test func apnsTokenIsReusedFor50MinutesAndNeverRenewedWithin20() throws {
        let files = try PushTests.Files()
        let key = P256.Signing.PrivateKey()
        let clock = TestClock()
        let provider = try APNsPushProvider(.init(keyPath: try files.write("k.p8", key.pemRepresentation), keyId: "K", teamId: "T"),
                                            now: { clock.now })
        func iat(_ token: String) throws -> Int { try PushTests.parseJWT(token).claims["iat"] as? Int ?? -1 }
        let first = try provider.token()
        let firstIssued = try iat(first)
        #expect(firstIssued == 1_800_000_000)
        clock.advance(minutes: 49)
        #expect(try provider.token() == first)
        // ExpiredProviderToken before 20 minutes would be renewing too often: kept.
        clock.advance(minutes: -40)
        #expect(try provider.token(replacingExpired: true) == first)
        clock.advance(minutes: 40 + 1)
        let second = try provider.token()
        let secondIssued = try iat(second)
        #expect(second != first && secondIssued == 1_800_000_000 + 50 * 60)
        clock.advance(minutes: 21)
        let third = try provider.token(replacingExpired: true)
        let thirdIssued = try iat(third)
        #expect(third != second && thirdIssued == 1_800_000_000 + 71 * 60)
        let jwt = try PushTests.parseJWT(third)
        #expect(key.publicKey.isValidSignature(try P256.Signing.ECDSASignature(rawRepresentation: jwt.signature), for: jwt.input))
    }

    @Test func fcmAccessTokenIsReusedUntilAMinuteBeforeItExpires() async throws {
        let files = try PushTests.Files()
        let key = try _RSA.Signing.PrivateKey(keySize: .bits2048)
        let issued = Mutex(0)
        let gateway = try await PushTests.fcmGateway(key: key) { _ in .init(status: 200) }
        let counting = try await PushGatewayServer.start { request in
            let n = issued.withLock { $0 += 1; return $0 }
            _ = request
            return .init(status: 200, body: #"{"access_token":"token-\#(n)","expires_in":600,"token_type":"Bearer"}"#)
        }
        let account: [String: Any] = ["project_id": "p", "client_email": "e@p.iam.gserviceaccount.com", "private_key": key.pemRepresentation,
                                      "token_uri": counting.baseURL + "/token"]
        let path = try files.write("sa.json", String(decoding: try JSONSerialization.data(withJSONObject: account), as: UTF8.self))
        let clock = TestClock()
        let provider = try FCMPushProvider(.init(serviceAccountPath: path, caCertificatePath: files.caPath), now: { clock.now })
        #expect(try await provider.accessToken() == "token-1")
        clock.advance(minutes: 8.9)
        #expect(try await provider.accessToken() == "token-1")
        clock.advance(minutes: 0.2)
        #expect(try await provider.accessToken() == "token-2")
        #expect(try await provider.accessToken(forceRefresh: true) == "token-3")
        await provider.shutdown()
        await counting.stop()
        await gateway.stop()
    }
}

/// Issue 18, point 2: a WebSocket session suspended with a push device has what arrives on its
/// channels pushed to that device until it is resumed — checked at a local APNs gateway.
@Suite(.serialized) struct SuspendedPushTests {
    @Test func whatArrivesWhileSuspendedIsPushedAndNothingAfterTheResume() async throws {
        let files = try PushTests.Files()
        let key = P256.Signing.PrivateKey()
        let gateway = try await PushGatewayServer.start { _ in .init(status: 200) }
        let server = try await PushTests.apnsServer(gateway, files: files, key: key)
        let (client, welcome, _) = try await WebSocketTests.session(server.inProcess, uuid: "alice", channels: ["inbox"])
        let token = try #require(welcome["resumeToken"]?.stringValue)
        client.send(.object(["type": "suspend", "keepAliveSeconds": 600,
                             "push": ["token": .string(PushTests.apnsToken), "type": "apns2", "environment": "development",
                                      "topic": .string(PushTests.topic)]]))
        #expect(await client.frame(ofType: "suspended")?["keepAliveSeconds"] == 600)
        await client.close()

        // A plain message: a notification made from it. One with a pn_apns part: that part.
        try await server.publish("inbox", #"{"text":"are you there?"}"#)
        try await server.publish("inbox", #"{"text":"x","pn_apns":{"aps":{"alert":"custom"}}}"#)
        try await server.publish("elsewhere", #"{"text":"not subscribed"}"#)
        await server.server.state.push.waitUntilIdle()
        let sent = gateway.requests
        try #require(sent.count == 2)
        #expect(sent.allSatisfy { $0.path == "/3/device/\(PushTests.apnsToken)" && $0.header("apns-topic") == PushTests.topic })
        let first = try #require(PushTests.json(sent[0].body))
        let alert = (first["aps"] as? [String: Any])?["alert"] as? [String: Any]
        #expect(alert?["title"] as? String == "inbox" && alert?["body"] as? String == "are you there?")
        #expect((first["tether"] as? [String: Any])?["channel"] as? String == "inbox")
        let second = try #require(PushTests.json(sent[1].body))
        #expect((second["aps"] as? [String: Any])?["alert"] as? String == "custom")

        // Resumed: deliveries flow on the socket again, and nothing more is pushed.
        let back = WebSocketTestClient(baseURL: server.baseURL)
        back.send(WebSocketTests.hello("alice", resume: (token, nil)))
        #expect(await back.frame(ofType: "welcome")?["resumed"] == true)
        try await server.publish("inbox", #"{"text":"welcome back"}"#)
        #expect(await WebSocketTests.envelopes(back, count: 3).count == 3, "the two missed and the new one")
        await server.server.state.push.waitUntilIdle()
        #expect(gateway.requests.count == 2)
        await back.close()
        await server.stop()
        await gateway.stop()
    }

    /// A session subscribed through a group and a wildcard gets pushes for what arrives on the
    /// group's channels and under the wildcard, as its deliveries would carry them.
    @Test func aSessionsGroupsAndWildcardsArePushedToo() async throws {
        let files = try PushTests.Files()
        let gateway = try await PushGatewayServer.start { _ in .init(status: 200) }
        let server = try await PushTests.apnsServer(gateway, files: files, key: P256.Signing.PrivateKey())
        #expect(try await server.get("/v1/channel-registration/sub-key/demo/channel-group/g?add=inbox&uuid=admin").status == 200)
        let client = WebSocketTestClient(baseURL: server.baseURL)
        client.send(WebSocketTests.hello("alice"))
        #expect(await client.frame(ofType: "welcome") != nil)
        client.send(.object(["type": "subscribe", "channels": ["news.*"], "groups": ["g"]]))
        #expect(await client.frame(ofType: "subscribed") != nil)
        client.send(.object(["type": "suspend", "keepAliveSeconds": 600,
                             "push": ["token": .string(PushTests.apnsToken), "type": "apns2", "environment": "development",
                                      "topic": .string(PushTests.topic)]]))
        #expect(await client.frame(ofType: "suspended") != nil)
        await client.close()
        for channel in ["inbox", "news.eu", "sports"] { try await server.publish(channel, #"{"text":"on \#(channel)"}"#) }
        await server.server.state.push.waitUntilIdle()
        let bodies = gateway.requests.compactMap { PushTests.json($0.body) }
            .compactMap { (($0["aps"] as? [String: Any])?["alert"] as? [String: Any])?["body"] as? String }
        #expect(bodies.sorted() == ["on inbox", "on news.eu"])
        await server.stop()
        await gateway.stop()
    }

    /// A suspended session's pushes carry its messages: each checks the session's read access
    /// when it goes, as the socket's deliveries do. A revoked grant stops them.
    @Test func aRevokedGrantStopsTheSuspendedSessionsPushes() async throws {
        let files = try PushTests.Files()
        let key = P256.Signing.PrivateKey()
        let gateway = try await PushGatewayServer.start { _ in .init(status: 200) }
        let keyset = Keyset(name: "secure", publishKey: "pub-s", subscribeKey: "sub-s", secretKey: "s3cret")
        let server = try await PushTests.apnsServer(gateway, files: files, key: key, keysets: [keyset])
        func grant(read: Bool) async throws {
            let answer = try await server.get(signedPath("/v2/auth/grant/sub-key/sub-s",
                                                         ["channel": "inbox", "auth": "ak", "r": read ? "1" : "0", "w": "0", "ttl": "5",
                                                          "uuid": "admin"], keyset: keyset))
            #expect(answer.status == 200, "\(answer.body)")
        }
        func publish(_ text: String) async throws {
            let answer = try await server.get(signedPath("/publish/pub-s/sub-s/0/inbox/0/\(PercentCoding.encode(text))", ["uuid": "admin"],
                                                         keyset: keyset))
            #expect(answer.status == 200, "\(answer.body)")
        }
        try await grant(read: true)
        let client = WebSocketTestClient(baseURL: server.baseURL)
        client.send(.object(["type": "hello", "v": 1, "subscribeKey": "sub-s", "publishKey": "pub-s", "uuid": "alice", "auth": "ak"]))
        #expect(await client.frame(ofType: "welcome") != nil)
        client.send(WebSocketTests.subscribe(["inbox"]))
        #expect(await client.frame(ofType: "subscribed")?["channels"] == ["inbox"])
        client.send(.object(["type": "suspend", "keepAliveSeconds": 600,
                             "push": ["token": .string(PushTests.apnsToken), "type": "apns2", "environment": "development",
                                      "topic": .string(PushTests.topic)]]))
        #expect(await client.frame(ofType: "suspended") != nil)
        await client.close()

        try await publish(#"{"text":"allowed"}"#)
        await server.server.state.push.waitUntilIdle()
        #expect(gateway.requests.count == 1, "pushed while the grant holds")
        try await grant(read: false)
        try await publish(#"{"text":"secret"}"#)
        await server.server.state.push.waitUntilIdle()
        #expect(gateway.requests.count == 1, "nothing pushed once read is revoked")
        await server.stop()
        await gateway.stop()
    }

    @Test(arguments: [
        #"{"type":"suspend","push":{"type":"apns2","topic":"a.b"}}"#,
        #"{"type":"suspend","push":{"token":"t","type":"mpns"}}"#,
        #"{"type":"suspend","push":{"token":"t","type":"apns2"}}"#,
        #"{"type":"suspend","push":{"token":"t","type":"fcm","environment":"staging"}}"#,
        #"{"type":"suspend","push":"t"}"#,
    ])
    func malformedSuspendPushIsRefused(_ text: String) async throws {
        let server = try await WebSocketTests.start()
        let client = WebSocketTestClient(baseURL: server.baseURL)
        client.send(WebSocketTests.hello())
        #expect(await client.frame()?.type == "welcome")
        client.send(text)
        #expect(await client.frame()?["code"]?.stringValue == "malformed")
        #expect(await client.closeCode() == 4400)
        await client.close()
        await server.stop()
    }
}

/// In a cluster a suspended session's device is held by the node the session is on: what is
/// published on any node is pushed to it, once.
@Suite(.enabled(if: TestPostgres.available, RecordStoreKind.postgresSkipReason), .serialized)
struct ClusterSuspendedPushTests {
    @Test func whatIsPublishedOnAnotherNodeIsPushedToTheSuspendedSessionsDevice() async throws {
        try await TestPostgres.withDatabase { url in
            let files = try PushTests.Files()
            let key = P256.Signing.PrivateKey()
            let gateway = try await PushGatewayServer.start { _ in .init(status: 200) }
            let keyPath = try files.write("AuthKey.p8", key.pemRepresentation)
            func node() async throws -> TestServer {
                var settings = ConfigurationFile.Push(apns: .init(keyPath: keyPath, keyId: "KEY1234567", teamId: "TEAM123456",
                                                                  topic: PushTests.topic, baseURL: gateway.baseURL,
                                                                  caCertificatePath: files.caPath))
                settings.retryBaseDelayMilliseconds = 1
                var file = ConfigurationFile(subscribeTimeoutSeconds: 30)
                file.push = settings
                return try await TestServer.start(file: file, databaseURL: url.description)
            }
            let a = try await node(), b = try await node()
            let (client, _, _) = try await WebSocketTests.session(a.inProcess, uuid: "alice", channels: ["inbox"])
            client.send(.object(["type": "suspend", "keepAliveSeconds": 600,
                                 "push": ["token": .string(PushTests.apnsToken), "type": "apns2", "environment": "development",
                                          "topic": .string(PushTests.topic)]]))
            #expect(await client.frame(ofType: "suspended") != nil)
            await client.close()

            try await b.publish("inbox", #"{"text":"from b"}"#)
            try await a.publish("inbox", #"{"text":"from a"}"#)
            #expect(await finishes(within: 20) {
                while gateway.requests.count < 2 { try? await Task.sleep(for: .milliseconds(20)) }
            })
            await a.server.state.push.waitUntilIdle()
            await b.server.state.push.waitUntilIdle()
            let bodies = gateway.requests.compactMap { PushTests.json($0.body) }
                .compactMap { (($0["aps"] as? [String: Any])?["alert"] as? [String: Any])?["body"] as? String }
            #expect(bodies.sorted() == ["from a", "from b"], "each once: \(bodies)")
            await a.stop()
            await b.stop()
            await gateway.stop()
        }
    }
}
