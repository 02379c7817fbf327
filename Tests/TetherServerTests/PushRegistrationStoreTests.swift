import Foundation
import Testing
@_spi(Benchmarks) import TetherProtocol
@testable import TetherServer

/// Push registrations in the store (the part of docs/push.md below the routes): removals before
/// additions, both bounds all-or-nothing, channels listed in byte order after `start`, devices
/// of a channel, a device removed from everything — answered alike by SQLite and PostgreSQL.
@Suite struct PushRegistrationStoreTests {
    @Test func registrationsAreBoundedOrderedAndRemoved() async throws {
        try await Self.registrationsAreBoundedOrderedAndRemoved(.sqlite)
    }

    /// A change with at most 3 channels per device and 2 devices per channel.
    private static func change(_ store: any RecordStoreUnderTest, _ device: PushDevice, add: [String] = [], remove: [String] = [])
        async throws -> PushModifyOutcome
    {
        try await store.changePushRegistrations(device, add: add, remove: remove, maxChannelsPerDevice: 3, maxDevicesPerChannel: 2)
    }

    static func registrationsAreBoundedOrderedAndRemoved(_ kind: RecordStoreKind) async throws {
        try await RecordStoreSite.withStore(kind) { store throws in
            let phone = PushDevice(subscribeKey: "k", token: "aa", gateway: .gcm)
            let tablet = PushDevice(subscribeKey: "k", token: "bb", gateway: .apns2, environment: "development", topic: "com.example")
            let other = PushDevice(subscribeKey: "k", token: "cc", gateway: .gcm)
            #expect(try await Self.change(store, phone, add: ["b", "a", "B"]) == .modified)
            // Byte order ("B" before "a"), after `start`, at most `limit`.
            #expect(try await store.pushChannels(phone, after: nil, limit: 10) == ["B", "a", "b"])
            #expect(try await store.pushChannels(phone, after: "B", limit: 1) == ["a"])
            // A fourth channel is refused and nothing of the change is kept.
            #expect(try await Self.change(store, phone, add: ["a", "c"], remove: ["b"]) == .modified)
            #expect(try await Self.change(store, phone, add: ["d"]) == .deviceFull(limit: 3))
            #expect(try await store.pushChannels(phone, after: nil, limit: 10) == ["B", "a", "c"])
            // Adding a channel the device has is no change; removals come first.
            #expect(try await Self.change(store, phone, add: ["a"]) == .modified)
            #expect(try await Self.change(store, phone, add: ["d"], remove: ["B"]) == .modified)
            // The same token on another gateway or topic is another device.
            #expect(try await Self.change(store, tablet, add: ["a"]) == .modified)
            #expect(try await Self.change(store, other, add: ["a"]) == .channelFull("a", limit: 2))
            #expect(try await store.pushChannels(other, after: nil, limit: 10) == [])
            #expect(Set(try await store.pushDevices(subscribeKey: "k", channel: "a", limit: 10)) == [phone, tablet])
            #expect(try await store.pushDevices(subscribeKey: "k", channel: "a", limit: 1).count == 1)
            #expect(try await store.pushDevices(subscribeKey: "other", channel: "a", limit: 10).isEmpty)
            #expect(try await store.pushRegistrationCount() == 4)
            #expect(try await store.removePushDevice(phone) == 3)
            #expect(try await store.removePushDevice(phone) == 0)
            #expect(try await store.pushDevices(subscribeKey: "k", channel: "a", limit: 10) == [tablet])
            #expect(try await store.pushRegistrationCount() == 1)
        }
    }
}

/// Push registration store tests on the cluster's PostgreSQL (the shared log's tables).
@Suite(.enabled(if: TestPostgres.available, RecordStoreKind.postgresSkipReason))
struct PushRegistrationPostgresStoreTests {
    @Test func registrationsAreBoundedOrderedAndRemoved() async throws {
        try await PushRegistrationStoreTests.registrationsAreBoundedOrderedAndRemoved(.postgres)
    }

    /// Two nodes registering devices on one channel at once never take it past its bound.
    @Test func concurrentRegistrationsKeepTheChannelBound() async throws {
        try await TestPostgres.withDatabase { url in
            // Twenty changes to one channel take turns on its lock: a write timeout no loaded
            // machine reaches, so this tests the bound and not the timeout.
            let a = try await TestPostgres.open(url, options: .patient), b = try await TestPostgres.open(url, options: .patient)
            let outcomes = try await withThrowingTaskGroup(of: PushModifyOutcome.self) { group in
                for i in 0..<20 {
                    let node = i % 2 == 0 ? a : b
                    group.addTask {
                        try await node.changePushRegistrations(PushDevice(subscribeKey: "k", token: "t\(i)", gateway: .gcm), add: ["busy"],
                                                               remove: [], maxChannelsPerDevice: 10, maxDevicesPerChannel: 5)
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(outcomes.filter { $0 == .modified }.count == 5)
            #expect(try await a.pushDevices(subscribeKey: "k", channel: "busy", limit: 100).count == 5)
            a.close()
            b.close()
        }
    }
}
