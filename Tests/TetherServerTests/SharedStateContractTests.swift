import Foundation
import Testing
@_spi(Benchmarks) import TetherProtocol
import TetherServerCore
@testable import TetherServer

/// Channel groups, v2 grants and token revocations: one contract run against the embedded
/// SQLite store and against a cluster's shared log in PostgreSQL (where a change goes through
/// the log and a node starting reads the tables back).
protocol SharedStateUnderTest {
    /// Adds and removes channels of a group; returns the group's channels afterwards.
    func updateGroup(subscribeKey: String, group: String, add: [String], remove: [String]) async throws -> Set<String>
    func deleteGroup(subscribeKey: String, group: String) async throws
    func groupNames(subscribeKey: String) async throws -> [String]
    func saveGrants(_ grants: [Grant]) async throws
    func saveRevocation(signature: String, expiresAt: Timetoken) async throws
    /// What a server starting now would load: memberships, grants, revocations.
    func reload() async throws -> (groups: Set<[String]>, grants: Set<Grant>, revocations: [String: Timetoken])
}

extension MessageStore: SharedStateUnderTest {
    func reload() async throws -> (groups: Set<[String]>, grants: Set<Grant>, revocations: [String: Timetoken]) {
        (Set(try allGroupMemberships().map { [$0.0, $0.1, $0.2] }), Set(try allGrants()), try allRevocations())
    }
}

/// The shared log through its change API (what the routes call in a cluster).
struct SharedStateOnLog: SharedStateUnderTest {
    let log: SharedLog
    let url: DatabaseURL

    func updateGroup(subscribeKey: String, group: String, add: [String], remove: [String]) async throws -> Set<String> {
        let (control, _) = try await log.change(.group(subscribeKey: subscribeKey, group: group, add: add, remove: remove,
                                                       delete: false, maximum: .max))
        guard case .group(_, _, let channels, _) = control else { throw TestFailure("not a group control: \(control)") }
        return channels
    }

    func deleteGroup(subscribeKey: String, group: String) async throws {
        _ = try await log.change(.group(subscribeKey: subscribeKey, group: group, add: [], remove: [], delete: true, maximum: .max))
    }

    func groupNames(subscribeKey: String) async throws -> [String] { try await log.groupNames(subscribeKey: subscribeKey) }
    func saveGrants(_ grants: [Grant]) async throws { _ = try await log.change(.grants(grants)) }

    func saveRevocation(signature: String, expiresAt: Timetoken) async throws {
        _ = try await log.change(.revocation(signature: signature, expiresAt: expiresAt))
    }

    func reload() async throws -> (groups: Set<[String]>, grants: Set<Grant>, revocations: [String: Timetoken]) {
        let fresh = try await TestPostgres.open(url)
        defer { fresh.close() }
        let state = fresh.startState
        return (Set(state.groups.map { [$0.0, $0.1, $0.2] }), Set(state.grants), state.revocations)
    }
}

enum SharedStateContract {
    static func withState(_ kind: RecordStoreKind, _ body: (any SharedStateUnderTest) async throws -> Void) async throws {
        switch kind {
        case .sqlite:
            try await RecordStoreSite.withStore(.sqlite) { store in try await body(try #require(store as? MessageStore)) }
        case .postgres:
            try await TestPostgres.withDatabase { url in
                let node = RunningLog(try await TestPostgres.open(url))
                do { try await body(SharedStateOnLog(log: node.log, url: url)) } catch {
                    await node.stop()
                    throw error
                }
                await node.stop()
            }
        }
    }

    static func groupsGrantsAndRevocationsAreKept(_ kind: RecordStoreKind) async throws {
        try await withState(kind) { state in
            #expect(try await state.updateGroup(subscribeKey: "k", group: "team", add: ["a", "b"], remove: []) == ["a", "b"])
            #expect(try await state.updateGroup(subscribeKey: "k", group: "team", add: ["c"], remove: ["a"]) == ["b", "c"])
            #expect(try await state.updateGroup(subscribeKey: "k", group: "ops", add: ["x"], remove: []) == ["x"])
            #expect(try await state.updateGroup(subscribeKey: "other", group: "zeta", add: ["y"], remove: []) == ["y"])
            #expect(try await state.groupNames(subscribeKey: "k") == ["ops", "team"])
            try await state.deleteGroup(subscribeKey: "k", group: "ops")
            #expect(try await state.groupNames(subscribeKey: "k") == ["team"])
            let channelGrant = Grant(subscribeKey: "k", target: .channel("room.*"), authKey: "key-1", permissions: [.read, .write],
                                     ttlMinutes: 60, expiresAt: Timetoken(unixSeconds: 4_000_000_000))
            let keysetGrant = Grant(subscribeKey: "k", target: .keyset, authKey: nil, permissions: [.read], ttlMinutes: 0, expiresAt: nil)
            let uuidGrant = Grant(subscribeKey: "k", target: .uuid("u-1"), authKey: "key-2", permissions: [.get], ttlMinutes: 0,
                                  expiresAt: nil)
            try await state.saveGrants([channelGrant, keysetGrant, uuidGrant])
            var withdrawn = uuidGrant
            withdrawn.permissions = []
            try await state.saveGrants([withdrawn])
            var changed = keysetGrant
            changed.permissions = [.read, .manage]
            try await state.saveGrants([changed])
            try await state.saveRevocation(signature: "sig-1", expiresAt: Timetoken(unixSeconds: 4_000_000_000))
            let reloaded = try await state.reload()
            #expect(reloaded.groups == [["k", "team", "b"], ["k", "team", "c"], ["other", "zeta", "y"]])
            #expect(reloaded.grants == [channelGrant, changed])
            #expect(reloaded.revocations == ["sig-1": Timetoken(unixSeconds: 4_000_000_000)])
        }
    }
}

@Suite struct SharedStateSQLiteTests {
    @Test func groupsGrantsAndRevocationsAreKept() async throws { try await SharedStateContract.groupsGrantsAndRevocationsAreKept(.sqlite) }
}

@Suite(.enabled(if: TestPostgres.available, RecordStoreKind.postgresSkipReason))
struct SharedStatePostgresTests {
    @Test func groupsGrantsAndRevocationsAreKept() async throws { try await SharedStateContract.groupsGrantsAndRevocationsAreKept(.postgres) }
}

/// Presence memberships and remembered request ids as each store keeps them for a restart:
/// recorded, changed, removed, and read back by a server starting on the same store.
enum DurableMembershipContract {
    /// A membership: keyset, channel, uuid, state.
    typealias Member = [String]

    protocol Site {
        func join(_ channel: String, _ uuid: String, state: String?) async throws
        func leave(_ channel: String, _ uuid: String) async throws
        /// Remembers a publish's request id at `timetoken`, `age` seconds ago.
        func remember(requestID: String, timetoken: Timetoken) async throws
        /// What a server starting now would restore: memberships, and the request ids it would
        /// answer as repeats with their timetokens.
        func reload() async throws -> (members: Set<Member>, requestIDs: [String: Timetoken])
    }

    struct SQLiteSite: Site {
        let store: MessageStore
        func join(_ channel: String, _ uuid: String, state: String?) async throws {
            try await store.savePresence([.save(PresenceRecord(subscribeKey: "k", channel: channel, uuid: uuid, timeout: .seconds(60),
                                                               state: state))])
        }
        func leave(_ channel: String, _ uuid: String) async throws {
            try await store.savePresence([.remove(subscribeKey: "k", channel: channel, uuid: uuid)])
        }
        func remember(requestID: String, timetoken: Timetoken) async throws {
            let key = DedupKey(subscribeKey: "k", publisher: "p", requestID: requestID)
            try await store.append(StoreWrite(message: nil, record: PublishRecord(key: key, timetoken: timetoken, channel: "c",
                                                                                  createdAt: LongPollHub.systemNow())))
        }
        func reload() async throws -> (members: Set<Member>, requestIDs: [String: Timetoken]) {
            let members = Set(try store.presenceRecords().map { [$0.subscribeKey, $0.channel, $0.uuid, $0.state ?? ""] })
            let records = try store.publishRecords(since: .zero, limit: 1000)
            return (members, Dictionary(uniqueKeysWithValues: records.map { ($0.key.requestID, $0.timetoken) }))
        }
    }

    struct PostgresSite: Site {
        let log: SharedLog
        let url: DatabaseURL
        var presence: SharedPresence { SharedPresence(log: log, now: { Int64(Date().timeIntervalSince1970 * 1000) }) }

        func join(_ channel: String, _ uuid: String, state: String?) async throws {
            try await presence.heartbeat(subscribeKey: "k", uuid: uuid, channels: [channel], timeout: .seconds(60),
                                         states: state.map { [channel: $0] } ?? [:])
        }
        func leave(_ channel: String, _ uuid: String) async throws {
            try await presence.leave(subscribeKey: "k", uuid: uuid, channels: [channel])
        }
        func remember(requestID: String, timetoken: Timetoken) async throws {
            // The log numbers the publish itself; what is remembered is its own timetoken.
            let key = DedupKey(subscribeKey: "k", publisher: "p", requestID: requestID)
            _ = try await log.append(SharedEvent(envelope: SubscribeEnvelope(timetoken: .zero, subscribeKey: "k", channel: "c",
                                                                             payload: "1", publisher: "p"),
                                                 isStored: true, retentionHours: nil, dedupKey: key))
        }
        func reload() async throws -> (members: Set<Member>, requestIDs: [String: Timetoken]) {
            let running = RunningLog(try await TestPostgres.open(url))
            let fresh = running.log
            let reader = SharedPresence(log: fresh, now: { Int64(Date().timeIntervalSince1970 * 1000) })
            var members = Set<Member>()
            for channel in try await reader.occupiedChannels(subscribeKey: "k") {
                for (uuid, state) in try await reader.occupants(subscribeKey: "k", channels: [channel])[channel] ?? [] {
                    members.insert(["k", channel, uuid, state ?? ""])
                }
            }
            // A repeat of each remembered id is answered with the original timetoken.
            var ids: [String: Timetoken] = [:]
            for id in ["r-1", "r-2"] {
                let key = DedupKey(subscribeKey: "k", publisher: "p", requestID: id)
                let again = try await fresh.append(SharedEvent(envelope: SubscribeEnvelope(timetoken: .zero, subscribeKey: "k", channel: "c",
                                                                                           payload: "1", publisher: "p"),
                                                               isStored: true, retentionHours: nil, dedupKey: key))
                if case .repeated(let original) = again { ids[id] = original }
            }
            await running.stop()
            return (members, ids)
        }
    }

    static func membershipsAndRequestIDsSurviveARestart(_ kind: RecordStoreKind) async throws {
        func check(_ site: any Site) async throws {
            try await site.join("lobby", "ann", state: #"{"mood":"ok"}"#)
            try await site.join("lobby", "bob", state: nil)
            try await site.join("kitchen", "ann", state: nil)
            try await site.leave("lobby", "bob")
            try await site.remember(requestID: "r-1", timetoken: Timetoken(17_000_000_000_000_001))
            try await site.remember(requestID: "r-2", timetoken: Timetoken(17_000_000_000_000_002))
            let (members, ids) = try await site.reload()
            #expect(members == [["k", "lobby", "ann", #"{"mood":"ok"}"#], ["k", "kitchen", "ann", ""]])
            #expect(Set(ids.keys) == ["r-1", "r-2"])
            #expect(ids["r-1"] != ids["r-2"])
        }
        switch kind {
        case .sqlite:
            try await RecordStoreSite.withStore(.sqlite) { store in try await check(SQLiteSite(store: try #require(store as? MessageStore))) }
        case .postgres:
            try await TestPostgres.withDatabase { url in
                let node = RunningLog(try await TestPostgres.open(url))
                do { try await check(PostgresSite(log: node.log, url: url)) } catch {
                    await node.stop()
                    throw error
                }
                await node.stop()
            }
        }
    }
}

@Suite struct DurableMembershipSQLiteTests {
    @Test func membershipsAndRequestIDsSurviveARestart() async throws {
        try await DurableMembershipContract.membershipsAndRequestIDsSurviveARestart(.sqlite)
    }
}

@Suite(.enabled(if: TestPostgres.available, RecordStoreKind.postgresSkipReason))
struct DurableMembershipPostgresTests {
    @Test func membershipsAndRequestIDsSurviveARestart() async throws {
        try await DurableMembershipContract.membershipsAndRequestIDsSurviveARestart(.postgres)
    }
}
