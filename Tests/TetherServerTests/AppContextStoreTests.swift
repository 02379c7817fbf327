import Foundation
import GRDB
import Logging
import Testing
@_spi(Benchmarks) import TetherProtocol
@testable import TetherServer

/// App Context in the store: PATCH semantics, eTags and `If-Match`, memberships removed with
/// their user or channel, everything durable across a reopen of the SQLite file.
@Suite struct AppContextStoreTests {
    @Test func patchSemanticsETagsAndDurability() async throws {
        try await Self.patchSemanticsETagsAndDurability(.sqlite)
    }

    static func membership(_ uuid: String, _ channel: String, custom: JSONValue = .null) -> AppContextMembership {
        AppContextMembership(uuid: uuid, channel: channel, fields: ["custom": custom], updated: "2026-01-01T00:00:00.000000Z", eTag: "")
    }

    /// The test both stores answer alike (SQLite here, PostgreSQL in ``AppContextPostgresStoreTests``).
    static func patchSemanticsETagsAndDurability(_ kind: RecordStoreKind) async throws {
        try await RecordStoreSite.withNew(kind) { site in
            var firstTag = ""
            try await site.withStore { store in
                guard case .set(let first) = try await store.setAppContextObject(
                    subscribeKey: "k", kind: .uuid, id: "alice", patch: ["name": "Alice", "email": "a@x", "custom": ["r": "admin"]],
                    ifMatch: nil, updated: "2026-01-01T00:00:00.000001Z")
                else { Issue.record("first set refused"); return }
                firstTag = first.eTag
                // A member present replaces, null clears, absent keeps.
                guard case .set(let second) = try await store.setAppContextObject(
                    subscribeKey: "k", kind: .uuid, id: "alice", patch: ["name": "A", "email": .null], ifMatch: first.eTag,
                    updated: "2026-01-01T00:00:00.000002Z")
                else { Issue.record("matching If-Match refused"); return }
                #expect(second.fields == ["name": "A", "email": .null, "custom": ["r": "admin"]] && second.eTag != first.eTag)
                #expect(try await store.setAppContextObject(subscribeKey: "k", kind: .uuid, id: "alice", patch: ["name": "B"],
                                                            ifMatch: first.eTag, updated: "x") == .preconditionFailed)
                #expect(try await store.setAppContextObject(subscribeKey: "k", kind: .channel, id: "nobody", patch: [:],
                                                            ifMatch: "any", updated: "x") == .preconditionFailed)
                // The same id as a channel or on another keyset is another object.
                _ = try await store.setAppContextObject(subscribeKey: "k", kind: .channel, id: "alice", patch: ["name": "Room"], ifMatch: nil,
                                                        updated: "t")
                #expect(try await store.appContextObject(subscribeKey: "other", kind: .uuid, id: "alice") == nil)
                _ = try await store.applyAppContextMemberships(subscribeKey: "k", set: [Self.membership("alice", "c1"), Self.membership("alice", "c2"),
                                                                                         Self.membership("bob", "c1")], delete: [])
            }
            // Reopened: all of it is on disk.
            try await site.withStore { store in
                let alice = try await store.appContextObject(subscribeKey: "k", kind: .uuid, id: "alice")
                #expect(alice?.fields["name"] == "A" && alice?.eTag != firstTag)
                #expect(try await store.appContextMemberships(subscribeKey: "k", of: .uuid, id: "alice", limit: 10).map(\.channel).sorted()
                        == ["c1", "c2"])
                // Deleting a membership reports only what existed; removing a user removes its memberships.
                let changes = try await store.applyAppContextMemberships(subscribeKey: "k", set: [],
                                                                         delete: [(uuid: "alice", channel: "c2"), (uuid: "alice", channel: "c9")])
                #expect(changes.deleted.map(\.channel) == ["c2"])
                #expect(try await store.removeAppContextObject(subscribeKey: "k", kind: .uuid, id: "alice"))
                #expect(try await store.appContextMemberships(subscribeKey: "k", of: .uuid, id: "alice", limit: 10).isEmpty)
                #expect(try await store.appContextMemberships(subscribeKey: "k", of: .channel, id: "c1", limit: 10).map(\.uuid) == ["bob"])
                #expect(try await !store.removeAppContextObject(subscribeKey: "k", kind: .uuid, id: "alice"))
                // Removing a channel removes its members.
                #expect(try await !store.removeAppContextObject(subscribeKey: "k", kind: .channel, id: "c1"))
                #expect(try await store.appContextCounts() == (objects: 1, memberships: 0))
                // PubNub's limits (here 2 per user, 3 per channel): the whole change is refused.
                _ = try await store.applyAppContextMemberships(subscribeKey: "k", set: [Self.membership("u", "a"), Self.membership("u", "b")],
                                                               delete: [], perUser: 2, perChannel: 3)
                await #expect(throws: AppContextMembershipLimitExceeded(kind: "uuid", id: "u", limit: 2)) {
                    try await store.applyAppContextMemberships(subscribeKey: "k", set: [Self.membership("u", "c")], delete: [],
                                                               perUser: 2, perChannel: 3)
                }
                // Replacing one in the same change stays within it.
                _ = try await store.applyAppContextMemberships(subscribeKey: "k", set: [Self.membership("u", "c")],
                                                               delete: [(uuid: "u", channel: "a")], perUser: 2, perChannel: 3)
                await #expect(throws: AppContextMembershipLimitExceeded(kind: "channel", id: "c", limit: 3)) {
                    try await store.applyAppContextMemberships(subscribeKey: "k", set: ["v", "w", "x"].map { Self.membership($0, "c") },
                                                               delete: [], perUser: 2, perChannel: 3)
                }
                #expect(try await store.appContextMemberships(subscribeKey: "k", of: .uuid, id: "u", limit: 10).map(\.channel).sorted() == ["b", "c"])
                #expect(try await store.appContextMemberships(subscribeKey: "k", of: .channel, id: "c", limit: 10).map(\.uuid) == ["u"])
            }
        }
    }
}

/// App Context store tests on the cluster's PostgreSQL (the shared log's tables).
@Suite(.enabled(if: TestPostgres.available, RecordStoreKind.postgresSkipReason))
struct AppContextPostgresStoreTests {
    @Test func patchSemanticsETagsAndDurability() async throws {
        try await AppContextStoreTests.patchSemanticsETagsAndDurability(.postgres)
    }

    /// Two nodes adding members to one channel at once never take it past its limit.
    @Test func concurrentMembershipsKeepTheChannelLimit() async throws {
        try await TestPostgres.withDatabase { url in
            // Twenty changes to one channel take turns on its lock: a write timeout no loaded
            // machine reaches, so this tests the limit and not the timeout (the next test does).
            let a = try await TestPostgres.open(url, options: .patient), b = try await TestPostgres.open(url, options: .patient)
            let added = try await withThrowingTaskGroup(of: Bool.self) { group in
                for i in 0..<20 {
                    let node = i % 2 == 0 ? a : b
                    group.addTask {
                        do {
                            _ = try await node.applyAppContextMemberships(subscribeKey: "k", set: [AppContextStoreTests.membership("u\(i)", "c")],
                                                                          delete: [], perUser: 10, perChannel: 5)
                            return true
                        } catch is AppContextMembershipLimitExceeded {
                            return false
                        }
                    }
                }
                return try await group.reduce(into: 0) { $0 += $1 ? 1 : 0 }
            }
            #expect(added == 5)
            #expect(try await a.appContextMemberships(subscribeKey: "k", of: .channel, id: "c", limit: 100).count == 5)
            a.close()
            b.close()
        }
    }

    /// A change that waits on a record lock longer than the write timeout is refused as `busy`
    /// (503, retried by SDKs), not as a failed write.
    @Test func aChangeThatWaitsOutTheLockTimeoutIsBusy() async throws {
        try await TestPostgres.withDatabase { url in
            var quick = SharedLogOptions()
            quick.writeTimeout = .milliseconds(300)
            let holder = try await TestPostgres.open(url), waiter = try await TestPostgres.open(url, options: quick)
            let (locked, lockedContinuation) = AsyncStream<Void>.makeStream()
            let (release, releaseContinuation) = AsyncStream<Void>.makeStream()
            // The channel's lock, held by another transaction until the waiter has given up.
            let holding = Task {
                try await holder.recordTransaction { connection in
                    try await SharedLog.lockRecords(["app-context-channel\u{0}k\u{0}c"], connection: connection, logger: holder.logger)
                    lockedContinuation.yield()
                    for await _ in release { break }
                }
            }
            for await _ in locked { break }
            await #expect(throws: StoreError.self) {
                do {
                    _ = try await waiter.applyAppContextMemberships(subscribeKey: "k", set: [AppContextStoreTests.membership("u", "c")],
                                                                    delete: [], perUser: 10, perChannel: 5)
                } catch let error as StoreError {
                    #expect(error.code == .busy, "\(error)")
                    throw error
                }
            }
            releaseContinuation.yield()
            try await holding.value
            // With the lock free the same change goes through.
            _ = try await waiter.applyAppContextMemberships(subscribeKey: "k", set: [AppContextStoreTests.membership("u", "c")],
                                                            delete: [], perUser: 10, perChannel: 5)
        }
    }

    /// Ids are listed in byte order, as the embedded store lists them.
    @Test func listsInByteOrder() async throws {
        for kind in [RecordStoreKind.sqlite, .postgres] {
            try await RecordStoreSite.withStore(kind) { store in
                for id in ["b", "B", "a", "_"] {
                    _ = try await store.setAppContextObject(subscribeKey: "k", kind: .channel, id: id, patch: [:], ifMatch: nil,
                                                            updated: "t")
                }
                #expect(try await store.appContextObjects(subscribeKey: "k", kind: .channel, limit: 3).map(\.id) == ["B", "_", "a"],
                        "\(kind)")
                #expect(try await store.appContextObjects(subscribeKey: "k", kind: .channel, ids: ["a", "zz"]).keys.sorted() == ["a"])
                // A page in the same order, and the count of all of them.
                let page = try await store.appContextObjectsPage(subscribeKey: "k", kind: .channel, offset: 1, limit: 2)
                #expect(page.records.map(\.id) == ["_", "a"] && page.total == 4, "\(kind)")
                let past = try await store.appContextObjectsPage(subscribeKey: "k", kind: .channel, offset: 9, limit: 2)
                #expect(past.records.isEmpty && past.total == 4, "\(kind)")
                #expect(try await store.appContextObjectsPage(subscribeKey: "k", kind: .uuid, offset: 0, limit: 2).total == 0)
            }
        }
    }
}

