import Foundation
import Logging
import Testing
@testable import Tether
import TetherServer
import TetherTestingServer

/// The SDK's push registration calls against the real server (a real SQLite file), and the
/// request each builds, as PubNub's SDKs send them.
@Suite("SDK push registrations against the real server", .serialized)
struct PushAPITests {
    private func client(_ server: InProcessServer, userId: String = "phone") throws -> TetherClient {
        var logger = Logger(label: "tether.test.push")
        logger.logLevel = .warning
        let configuration = try TetherConfiguration(subscribeKey: "demo", publishKey: "demo", userId: userId, origin: server.origin,
                                                    useTLS: false, logger: logger)
        return try TetherClient(configuration: configuration)
    }

    static let token = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

    @Test func registerListRemoveForEachPushType() async throws {
        let server = try await InProcessServer.start()
        let client = try client(server)
        let (a, b, c) = ("inbox-\(UUID().uuidString.prefix(6))", "news", "alerts")

        try await client.addPushChannels([a, b], device: Self.token, pushType: .apns2, environment: .production, topic: "com.example.app")
        try await client.addPushChannels([c], device: Self.token, pushType: .apns2, environment: .development, topic: "com.example.app")
        #expect(try await client.listPushChannels(device: Self.token, pushType: .apns2, environment: .production, topic: "com.example.app")
            == [a, b].sorted())
        #expect(try await client.listPushChannels(device: Self.token, pushType: .apns2, environment: .development, topic: "com.example.app")
            == [c])
        // Each gateway keeps its own registrations.
        #expect(try await client.listPushChannels(device: Self.token, pushType: .apns) == [])
        try await client.addPushChannels([a], device: "fcm-registration-token", pushType: .fcm)
        #expect(try await client.listPushChannels(device: "fcm-registration-token", pushType: .fcm) == [a])

        try await client.removePushChannels([b], device: Self.token, pushType: .apns2, environment: .production, topic: "com.example.app")
        #expect(try await client.listPushChannels(device: Self.token, pushType: .apns2, environment: .production, topic: "com.example.app")
            == [a])
        try await client.removeAllPushChannels(device: Self.token, pushType: .apns2, environment: .production, topic: "com.example.app")
        #expect(try await client.listPushChannels(device: Self.token, pushType: .apns2, environment: .production, topic: "com.example.app")
            == [])
        #expect(try await client.listPushChannels(device: Self.token, pushType: .apns2, environment: .development, topic: "com.example.app")
            == [c])
        await client.shutdown()
        await server.stop()
    }

    @Test func badInputIsRefusedWithTheServersMessageOrBeforeSending() async throws {
        let server = try await InProcessServer.start()
        let client = try client(server)
        // PubNub's answer to an Apple token that is not hexadecimal.
        do {
            try await client.addPushChannels(["a"], device: "not-hex-token", pushType: .apns)
            Issue.record("a non-hex APNs token was accepted")
        } catch {
            #expect(error.status.category == .badRequest)
            #expect(error.status.statusCode == 400)
            #expect(error.status.serverMessage == "Invalid device token")
            #expect(error.status.operation == .addPushChannels)
        }
        // Refused by the SDK: no topic for APNs2, no channel.
        do {
            try await client.addPushChannels(["a"], device: Self.token, pushType: .apns2)
            Issue.record("an APNs2 registration without a topic was sent")
        } catch {
            #expect(error.status.category == .badRequest && error.status.statusCode == nil)
        }
        do {
            try await client.addPushChannels([], device: Self.token, pushType: .fcm)
            Issue.record("a registration without channels was sent")
        } catch {
            #expect(error.status.category == .badRequest)
        }
        await client.shutdown()
        await server.stop()
    }

    @Test func requestsAreBuiltAsPubNubsSDKsSendThem() throws {
        let endpoints = Endpoints(context: RequestContext(publishKey: "pub", subscribeKey: "sub", userId: "u", authKey: "tok", sdkName: "Tether"))
        let apns2 = PushDeviceAddress(token: "ab01", type: .apns2, environment: .production, topic: "com.example.app")
        let add = try endpoints.addPushChannels(["a", "b"], device: apns2)
        #expect(add.path == "/v2/push/sub-key/sub/devices-apns2/ab01")
        #expect(add.queryValue("add") == "a,b" && add.queryValue("environment") == "production" && add.queryValue("topic") == "com.example.app")
        #expect(add.queryValue("auth") == "tok" && add.queryValue("uuid") == "u")
        #expect(add.target.contains("add=a,b"))
        let fcm = PushDeviceAddress(token: "t/1", type: .fcm, environment: .development, topic: nil)
        let remove = try endpoints.removeAllPushChannels(device: fcm)
        #expect(remove.path == "/v1/push/sub-key/sub/devices/t%2F1/remove" && remove.queryValue("type") == "fcm")
        #expect(remove.queryValue("environment") == nil)
        let list = try endpoints.listPushChannels(device: PushDeviceAddress(token: "ab", type: .apns, environment: .development, topic: nil))
        #expect(list.path == "/v1/push/sub-key/sub/devices/ab" && list.queryValue("type") == "apns" && list.queryValue("add") == nil)
    }
}
