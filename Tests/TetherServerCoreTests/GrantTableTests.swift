import Testing
import TetherProtocol
import TetherServerCore

/// The grant table's answer to "when must a waiting subscriber's access be checked again".
@Suite struct GrantTableTests {
    private static func grant(_ channel: String, expiresAt: UInt64?) -> Grant {
        Grant(subscribeKey: "k", target: .channel(channel), authKey: "a", permissions: Permissions(r: true, w: false, m: false, d: false),
              ttlMinutes: expiresAt == nil ? 0 : 5, expiresAt: expiresAt.map { Timetoken($0) })
    }

    @Test func theNextExpiryIsTheEarliestStillToCome() {
        var table = GrantTable()
        table.apply(Self.grant("forever", expiresAt: nil))
        #expect(table.nextExpiry(after: Timetoken(100)) == nil)
        table.apply(Self.grant("later", expiresAt: 500))
        table.apply(Self.grant("sooner", expiresAt: 300))
        #expect(table.nextExpiry(after: Timetoken(100)) == Timetoken(300))
        // One expired but not yet swept: the next expiry is still the first one to come, not
        // one in the past (which made every waiting subscriber's deadline "now").
        #expect(table.nextExpiry(after: Timetoken(300)) == Timetoken(500))
        #expect(table.nextExpiry(after: Timetoken(500)) == nil)
    }
}
