import Foundation
import Logging
import Testing
@testable import Tether
import TetherServer
import TetherTesting
import TetherTestingServer

/// The SDK's presence, channel-group and Access Manager calls against the real server (the
/// scripted-server tests pin the wire; these prove the round trips).
@Suite("SDK REST calls against the real server", .serialized)
struct RealServerAPITests {
    private func client(_ server: InProcessServer, userId: String, subscribeKey: String = "demo", publishKey: String = "demo",
                        secretKey: String? = nil) throws -> TetherClient {
        var logger = Logger(label: "tether.test.rest")
        logger.logLevel = .warning
        let configuration = try TetherConfiguration(subscribeKey: subscribeKey, publishKey: publishKey, secretKey: secretKey,
                                                    userId: userId, origin: server.origin, useTLS: false, logger: logger)
        return try TetherClient(configuration: configuration)
    }

    /// A server whose only keyset, `sub-s`/`pub-s`, has a secret key, and a client holding it.
    private func secureServerWithAdmin() async throws -> (InProcessServer, TetherClient) {
        let secure = Keyset(name: "secure", publishKey: "pub-s", subscribeKey: "sub-s", secretKey: "s3cret")
        let server = try await InProcessServer.start(file: ConfigurationFile(keysets: [secure], subscribeTimeoutSeconds: 30))
        let admin = try client(server, userId: "admin", subscribeKey: "sub-s", publishKey: "pub-s", secretKey: "s3cret")
        return (server, admin)
    }

    @Test func presenceRoundTrips() async throws {
        let server = try await InProcessServer.start()
        let alice = try client(server, userId: "alice")
        let room = "room-\(UUID().uuidString.prefix(6))"
        try await alice.heartbeat(channels: [room])
        let here = try await alice.hereNow(channels: [room], options: HereNowOptions(includeState: true))
        #expect(here.channels[room]?.occupancy == 1)
        #expect(here.channels[room]?.occupants.map(\.userId) == ["alice"])
        try await alice.setState(["mood": "ok"], channels: [room])
        #expect(try await alice.getState(channels: [room])[room] == ["mood": "ok"])
        #expect(try await alice.whereNow() == [room])
        try await alice.leave(channels: [room])
        #expect(try await alice.hereNow(channels: [room]).channels[room]?.occupancy ?? 0 == 0)
        await alice.shutdown()
        await server.stop()
    }

    @Test func channelGroupRoundTrips() async throws {
        let server = try await InProcessServer.start()
        let admin = try client(server, userId: "admin")
        let group = "g-\(UUID().uuidString.prefix(6))"
        try await admin.addChannels(["a", "b"], toGroup: group)
        #expect(try await admin.channels(inGroup: group).sorted() == ["a", "b"])
        #expect(try await admin.channelGroups().contains(group))
        try await admin.removeChannels(["a"], fromGroup: group)
        #expect(try await admin.channels(inGroup: group) == ["b"])
        try await admin.deleteGroup(group)
        #expect(try await !admin.channelGroups().contains(group))
        await admin.shutdown()
        await server.stop()
    }

    @Test func tokensGrantedByAnAdminClientAllowAndRevokeForReal() async throws {
        let (server, admin) = try await secureServerWithAdmin()
        let user = try client(server, userId: "bob", subscribeKey: "sub-s", publishKey: "pub-s")
        let token = try await admin.grantToken(TokenGrant(ttlMinutes: 5, authorizedUserId: "bob", channels: ["room": [.read, .write]]))
        user.setToken(token)
        _ = try await user.publish(channel: "room", message: "hi")
        do {
            _ = try await user.publish(channel: "other", message: "hi")
            Issue.record("publishing outside the grant succeeded")
        } catch {
            #expect(error.category == .accessDenied)
            #expect(error.status.statusCode == 403)
        }
        try await admin.revokeToken(token)
        do {
            _ = try await user.publish(channel: "room", message: "again")
            Issue.record("a revoked token still worked")
        } catch {
            #expect(error.category == .accessDenied)
        }
        await admin.shutdown()
        await user.shutdown()
        await server.stop()
    }

    @Test func authKeyGrantsAllowAndRevokeForReal() async throws {
        let (server, admin) = try await secureServerWithAdmin()
        var configuration = try TetherConfiguration(subscribeKey: "sub-s", publishKey: "pub-s", userId: "carol", authKey: "k-carol",
                                                    origin: server.origin, useTLS: false)
        configuration.nonSubscribeTimeout = .seconds(10)
        let user = try TetherClient(configuration: configuration)
        do {
            _ = try await user.publish(channel: "room", message: "before the grant")
            Issue.record("publishing without a grant succeeded")
        } catch {
            #expect(error.category == .accessDenied)
        }
        try await admin.grant(AuthKeyGrant(channels: ["room"], authKeys: ["k-carol"], read: true, write: true, ttlMinutes: 5))
        _ = try await user.publish(channel: "room", message: "granted")
        #expect(try await user.history(channel: "room").map(\.payload) == ["granted"])
        // Every flag off revokes the row.
        try await admin.grant(AuthKeyGrant(channels: ["room"], authKeys: ["k-carol"], read: false, write: false, ttlMinutes: 5))
        do {
            _ = try await user.publish(channel: "room", message: "revoked")
            Issue.record("a revoked grant still worked")
        } catch {
            #expect(error.category == .accessDenied)
        }
        // Without the secret key the call is refused before any request.
        do {
            try await user.grant(AuthKeyGrant(channels: ["room"], authKeys: ["k-carol"]))
            Issue.record("a grant without the secret key was sent")
        } catch {
            #expect(error.category == .badRequest)
            #expect(error.status.error is RequestBuildError)
        }
        await admin.shutdown()
        await user.shutdown()
        await server.stop()
    }
}
