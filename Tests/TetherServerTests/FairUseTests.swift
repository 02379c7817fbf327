import Foundation
import Synchronization
import Testing
@testable import TetherServer
import TetherProtocol
import TetherServerCore

/// Rate limits on by default, per client and per address, and handshakes counted; driven with
/// a manual clock, never with wall time.
@Suite struct FairUseTests {
    /// A clock the test moves by hand.
    final class ManualClock: Sendable {
        private let seconds = Mutex(0.0)
        func advance(_ by: Double) { seconds.withLock { $0 += by } }
        var now: Double { seconds.withLock { $0 } }
    }

    @Test func defaultLimitsApplyPerClientAndPerAddress() {
        let clock = ManualClock()
        let limits = RateLimits(clock: { clock.now })
        let defaults = Limits()
        #expect(defaults.publishRatePerSecond == 100 && defaults.publishBurst == 500)
        // One uuid: the burst, then 429 with the time to the next token.
        for _ in 0..<500 { #expect(limits.take(.publish, uuid: "a", address: "10.0.0.1", subscribeKey: "k", limits: defaults) == nil) }
        let wait = limits.take(.publish, uuid: "a", address: "10.0.0.1", subscribeKey: "k", limits: defaults)
        #expect(wait.map { abs($0 - 0.01) < 1e-9 } == true)
        // Another uuid on the same address is not affected by the first one's bucket.
        #expect(limits.take(.publish, uuid: "b", address: "10.0.0.1", subscribeKey: "k", limits: defaults) == nil)
        // One second later the rate has refilled 100.
        clock.advance(1)
        for _ in 0..<100 { #expect(limits.take(.publish, uuid: "a", address: "10.0.0.1", subscribeKey: "k", limits: defaults) == nil) }
        #expect(limits.take(.publish, uuid: "a", address: "10.0.0.1", subscribeKey: "k", limits: defaults) != nil)
    }

    @Test func rotatingUUIDsMeetTheAddressBucket() {
        let clock = ManualClock()
        let limits = RateLimits(clock: { clock.now })
        var tight = Limits()
        tight.requestRatePerAddress = 10
        tight.requestBurstPerAddress = 20
        var refused = 0
        for i in 0..<30 where limits.take(.request, uuid: "fresh-\(i)", address: "10.0.0.9", subscribeKey: "k", limits: tight) != nil {
            refused += 1
        }
        #expect(refused == 10)
        // Other addresses are untouched; other keysets have their own buckets.
        #expect(limits.take(.request, uuid: "fresh-0", address: "10.0.0.10", subscribeKey: "k", limits: tight) == nil)
        #expect(limits.take(.request, uuid: "fresh-99", address: "10.0.0.9", subscribeKey: "other", limits: tight) == nil)
    }

    @Test func switchedOffMeansNoLimit() {
        let limits = RateLimits(enabled: false)
        let looked = Mutex(0)
        func address() -> String {
            looked.withLock { $0 += 1 }
            return "x"
        }
        for _ in 0..<2_000 { #expect(limits.take(.publish, uuid: "a", address: address(), subscribeKey: "k", limits: Limits()) == nil) }
        #expect(limits.trackedBuckets == 0)
        // Switched off, a request does not even look up its address.
        #expect(looked.withLock { $0 } == 0)
    }

    @Test func aUUIDSpelledLikeAnAddressIsNotThatAddressesClient() {
        let clock = ManualClock()
        let limits = RateLimits(clock: { clock.now })
        var tight = Limits()
        tight.requestRatePerSecond = 1
        tight.requestBurst = 2
        // The address's own client (requests without a uuid) uses up its bucket…
        for _ in 0..<2 { #expect(limits.take(.request, uuid: nil, address: "10.0.0.1", subscribeKey: "k", limits: tight) == nil) }
        #expect(limits.take(.request, uuid: nil, address: "10.0.0.1", subscribeKey: "k", limits: tight) != nil)
        // …and a client whose uuid is that address's text still has its own.
        #expect(limits.take(.request, uuid: "10.0.0.1", address: "10.0.0.2", subscribeKey: "k", limits: tight) == nil)
    }

    @Test func manyTrackedClientsKeepTheirOwnBuckets() {
        let clock = ManualClock()
        let limits = RateLimits(clock: { clock.now })
        var tight = Limits()
        tight.publishRatePerSecond = 1
        tight.publishBurst = 1
        for i in 0..<5_000 {
            #expect(limits.take(.publish, uuid: "u\(i)", address: "a\(i % 50)", subscribeKey: "k", limits: tight) == nil)
        }
        #expect(limits.trackedBuckets == 5_050)
        // Every client's bucket is its own and remembered: each second publish is refused.
        var refused = 0
        for i in 0..<5_000 where limits.take(.publish, uuid: "u\(i)", address: "a\(i % 50)", subscribeKey: "k", limits: tight) != nil {
            refused += 1
        }
        #expect(refused == 5_000)
    }

    @Test func idleBucketsAreSwept() {
        let clock = ManualClock()
        let limits = RateLimits(clock: { clock.now })
        for i in 0..<1_000 { _ = limits.take(.request, uuid: "u\(i)", address: "a\(i)", subscribeKey: "k", limits: Limits()) }
        #expect(limits.trackedBuckets == 2_000)
        clock.advance(60)
        limits.sweep()
        #expect(limits.trackedBuckets == 0)
    }

    /// The presence cap and the rate-limit switch from a configuration file: hostile values are
    /// refused with a message naming the key, never a trap or a silent default.
    @Test(arguments: ["0", "-1", "99", "100000001", "9223372036854775807", "1e300", "\"many\"", "null"])
    func hostilePresenceCapsAreRefused(_ value: String) throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("tether-cap-\(UUID().uuidString).json").path
        try Data(#"{"maxPresenceMemberships": \#(value)}"#.utf8).write(to: URL(fileURLWithPath: path))
        defer { try? FileManager.default.removeItem(atPath: path) }
        if value == "null" {
            // Absent: the default applies.
            #expect(try ConfigurationFile.load(path: path).maxPresenceMemberships == nil)
            return
        }
        #expect(throws: ServerConfigurationError.self) { try ConfigurationFile.load(path: path) }
        try Data(#"{"maxPresenceMemberships": 250000, "rateLimiting": false}"#.utf8).write(to: URL(fileURLWithPath: path))
        let file = try ConfigurationFile.load(path: path)
        #expect(file.maxPresenceMemberships == 250_000 && file.rateLimiting == false)
        try Data(#"{"rateLimiting": "off"}"#.utf8).write(to: URL(fileURLWithPath: path))
        #expect(throws: ServerConfigurationError.self) { try ConfigurationFile.load(path: path) }
    }

    /// Channel groups per keyset are bounded: a new group past `maxGroupsPerKeyset` is refused
    /// with the registry's 400, while existing groups still change, and a group emptied makes room.
    @Test func channelGroupsPerKeysetAreBounded() async throws {
        var limits = Limits()
        limits.maxGroupsPerKeyset = 2
        let server = try await TestServer.start(file: .init(limits: limits, subscribeTimeoutSeconds: 1))
        let base = "/v1/channel-registration/sub-key/demo/channel-group/"
        #expect(try await server.get(base + "g1?add=a,b").status == 200)
        #expect(try await server.get(base + "g2?add=c").status == 200)
        let refused = try await server.get(base + "g3?add=d")
        #expect(refused.status == 400)
        #expect(refused.body.contains("Maximum channel group count exceeded."), "\(refused.body)")
        #expect(try await server.get(base + "g1?add=e").status == 200, "an existing group still grows")
        #expect(try await server.get(base + "g2?remove=c").status == 200)
        #expect(try await server.get(base + "g3?add=d").status == 200, "an emptied group made room")
        await server.stop()
    }

    /// Handshakes are requests (each may join a uuid to 200 channels); long-polls that follow
    /// their cursor never are.
    @Test func handshakesAreRateLimitedLongPollsAreNot() async throws {
        var limits = Limits()
        limits.requestRatePerAddress = 0.001
        limits.requestBurstPerAddress = 3
        let server = try await TestServer.start(file: .init(limits: limits, subscribeTimeoutSeconds: 1))
        var statuses: [Int] = []
        for i in 0..<4 { statuses.append(try await server.get("/v2/subscribe/demo/c\(i)/0?uuid=fresh-\(i)").status) }
        #expect(statuses == [200, 200, 200, 429])
        let cursor = server.server.state.hub.currentCursor
        for i in 0..<5 {
            #expect(try await server.get("/v2/subscribe/demo/c0/0?uuid=fresh-\(i)&tt=\(cursor.rawValue)").status == 200)
        }
        await server.stop()
    }
}
