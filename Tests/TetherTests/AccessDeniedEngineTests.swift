import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import Synchronization
import Testing
@testable import Tether
import TetherServer
import TetherTesting
import TetherTestingServer

/// Seed 002's access-denied strategy end to end: a subscribe refused with 403 reports the denied
/// channels and retries automatically (bounded); once the grant is given it connects and receives.
@Suite("Subscribe engine: 403 then re-grant", .serialized)
struct AccessDeniedEngineTests {
    static let keyset = Keyset(name: "secure", publishKey: "pub-s", subscribeKey: "sub-s", secretKey: "s3cret")

    /// A signed admin grant of read+write on `channel` for `authKey`.
    private func grant(_ server: InProcessServer, channel: String, authKey: String) async throws -> Int {
        let path = "/v2/auth/grant/sub-key/sub-s"
        let query = AccessManager.signedQuery(method: "GET", publishKey: "pub-s", path: path,
                                              query: ["channel": channel, "auth": authKey, "r": "1", "w": "1", "ttl": "0", "uuid": "admin"],
                                              secret: "s3cret", timestamp: Int64(Date().timeIntervalSince1970))
        let response = try await HTTPClient.shared.execute(HTTPClientRequest(url: "http://\(server.origin)\(path)?\(query)"), timeout: .seconds(10))
        return Int(response.status.code)
    }

    @Test func accessDeniedIsRetriedUntilTheGrantArrives() async throws {
        let server = try await InProcessServer.start(file: ConfigurationFile(keysets: [Self.keyset], subscribeTimeoutSeconds: 5))
        let (client, _, clock) = try makeObservedClient(origin: server.origin) { configuration in
            configuration.subscribeKey = "sub-s"
            configuration.publishKey = "pub-s"
            configuration.authKey = "ak"
            configuration.retry = RetryConfiguration(jitter: .zero ... .zero, accessDeniedRetryLimit: 5)
        }
        var statuses = client.statuses().makeAsyncIterator()
        let channel = "guarded-\(UUID().uuidString.prefix(6))"
        let subscription = client.subscribe(to: [channel])[0]
        var messages = subscription.messages.makeAsyncIterator()

        // Refused: access denied with exactly the denied channel, and an automatic retry coming.
        let denied = try #require(await statuses.next())
        #expect(denied.category == .accessDenied)
        #expect(denied.deniedChannels == [channel])
        #expect(denied.statusCode == 403)
        #expect(denied.willAutomaticallyRetry)

        // The administrator grants access; the next automatic retry (2 s later) connects.
        #expect(try await grant(server, channel: channel, authKey: "ak") == 200)
        await clock.advanceToSleeper(after: .seconds(2))
        #expect(await statuses.next()?.category == .connected)

        _ = try await client.publish(channel: channel, message: .string("welcome"))
        #expect(await messages.next()?.payload == .string("welcome"))
        await client.shutdown()
        await server.stop()
    }
}
