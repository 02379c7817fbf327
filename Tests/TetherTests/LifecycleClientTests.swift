import Foundation
import Testing
@testable import Tether
import TetherClientCore
import TetherTesting

/// The client-level lifecycle bugs found in review (issue #18, point 7), each pinned by a test
/// that failed before its fix. The machine-level ones are in TetherClientCoreTests' LifecycleBugTests.
@Suite("Client: lifecycle bugs found in review", .timeLimit(.minutes(1)))
struct LifecycleClientTests {
    @Test func thePresenceChannelSetShrinksWithTheSubscriptionsThatAskedForIt() async throws {
        let (client, _, _) = try makeStepClient()
        client.subscribe(to: ["a"], withPresence: true)
        #expect(client.subscribedChannels == ["a", "a-pnpres"])
        client.unsubscribe(from: ["a"])
        #expect(client.subscribedChannels == [])
        // Subscribing again without presence does not bring the old presence channel back.
        client.subscribe(to: ["a"])
        #expect(client.subscribedChannels == ["a"])

        // Two subscription objects on one name: presence lasts while the one that asked for it does.
        let withPresence = client.subscription(channel: "b", withPresence: true)
        let plain = client.subscription(channel: "b")
        withPresence.subscribe()
        plain.subscribe()
        #expect(client.subscribedChannels == ["a", "b", "b-pnpres"])
        withPresence.unsubscribe()
        #expect(client.subscribedChannels == ["a", "b"])
        plain.unsubscribe()
        #expect(client.subscribedChannels == ["a"])
        await client.shutdown()
    }
}
