import Foundation
import Synchronization
import Logging
import Testing
@testable import Tether
import TetherServer
import TetherTestingServer

/// The SDK's App Context calls and events against the real server (a real SQLite file).
@Suite("SDK App Context against the real server", .serialized)
struct AppContextAPITests {
    private func client(_ server: InProcessServer, userId: String) throws -> TetherClient {
        var logger = Logger(label: "tether.test.objects")
        logger.logLevel = .warning
        let configuration = try TetherConfiguration(subscribeKey: "demo", publishKey: "demo", userId: userId, origin: server.origin,
                                                    useTLS: false, logger: logger)
        return try TetherClient(configuration: configuration)
    }

    @Test func userAndChannelMetadata() async throws {
        let server = try await InProcessServer.start()
        let alice = try client(server, userId: "alice")
        let set = try await alice.setUserMetadata(UserMetadata(id: "alice", name: "Alice", email: "a@example.com", status: "online",
                                                               custom: ["role": "admin", "level": 3]))
        #expect(set.name == "Alice" && set.email == "a@example.com" && set.status == "online")
        #expect(set.custom == ["role": "admin", "level": 3] && set.eTag != nil && set.updated?.hasSuffix("Z") == true)
        let fetched = try await alice.fetchUserMetadata()
        #expect(fetched == set)

        // Only the given fields change; a stale eTag is refused with 412.
        let renamed = try await alice.setUserMetadata(UserMetadata(id: "alice", name: "Alice B"), ifMatchesETag: set.eTag)
        #expect(renamed.name == "Alice B" && renamed.email == "a@example.com" && renamed.custom == set.custom)
        do {
            _ = try await alice.setUserMetadata(UserMetadata(id: "alice", name: "stale"), ifMatchesETag: set.eTag)
            Issue.record("a stale eTag was accepted")
        } catch {
            #expect(error.status.statusCode == 412)
        }

        for (i, name) in ["delta", "alpha", "charlie"].enumerated() {
            _ = try await alice.setChannelMetadata(ChannelMetadata(id: "room-\(i)", name: name, custom: ["n": .number(.init(i))]))
        }
        let sorted = try await alice.fetchAllChannelMetadata(filter: #"id LIKE "room-*""#, sort: ["name:asc"])
        #expect(sorted.items.map(\.name) == ["alpha", "charlie", "delta"] && sorted.totalCount == 3)
        let filtered = try await alice.fetchAllChannelMetadata(filter: "custom.n >= 1")
        #expect(filtered.items.map(\.id) == ["room-1", "room-2"])
        let first = try await alice.fetchAllChannelMetadata(limit: 2)
        #expect(first.items.map(\.id) == ["room-0", "room-1"] && first.previous == nil)
        let second = try await alice.fetchAllChannelMetadata(limit: 2, page: first.next)
        #expect(second.items.map(\.id) == ["room-2"])
        let end = try await alice.fetchAllChannelMetadata(limit: 2, page: second.next)
        #expect(end.items.isEmpty)

        do {
            _ = try await alice.fetchAllUserMetadata(filter: "name ==")
            Issue.record("an invalid filter was accepted")
        } catch {
            #expect(error.status.category == .badRequest && error.status.statusCode == 400)
        }
        try await alice.removeUserMetadata()
        do {
            _ = try await alice.fetchUserMetadata()
            Issue.record("a removed user was found")
        } catch {
            #expect(error.status.statusCode == 404)
        }
        await alice.shutdown()
        await server.stop()
    }

    @Test func membershipsAndMembers() async throws {
        let server = try await InProcessServer.start()
        let bob = try client(server, userId: "bob")
        _ = try await bob.setChannelMetadata(ChannelMetadata(id: "lobby", name: "Lobby"))
        let page = try await bob.setMemberships([MembershipUpdate("lobby", custom: ["role": "host"]), MembershipUpdate("kitchen")])
        #expect(page.items.map(\.channel.id).sorted() == ["kitchen", "lobby"])
        let lobby = page.items.first { $0.channel.id == "lobby" }
        #expect(lobby?.channel.name == "Lobby" && lobby?.custom == ["role": "host"] && lobby?.user.id == "bob")

        try await bob.setChannelMembers([MembershipUpdate("carol")], channel: "lobby")
        let members = try await bob.fetchChannelMembers(channel: "lobby", sort: ["uuid.id:desc"])
        #expect(members.items.map(\.user.id) == ["carol", "bob"])
        let hosts = try await bob.fetchChannelMembers(channel: "lobby", filter: #"custom.role == "host""#)
        #expect(hosts.items.map(\.user.id) == ["bob"])

        try await bob.removeMemberships(channels: ["kitchen"])
        #expect(try await bob.fetchMemberships().items.map(\.channel.id) == ["lobby"])
        try await bob.removeChannelMembers(userIds: ["carol"], channel: "lobby")
        #expect(try await bob.fetchChannelMembers(channel: "lobby").items.map(\.user.id) == ["bob"])
        try await bob.removeChannelMetadata(channel: "lobby")
        #expect(try await bob.fetchMemberships().items.isEmpty)
        await bob.shutdown()
        await server.stop()
    }

    @Test func appContextEventsReachTheSubscription() async throws {
        let server = try await InProcessServer.start()
        let watcher = try client(server, userId: "watcher"), actor = try client(server, userId: "actor")
        var statuses = watcher.statuses().makeAsyncIterator()
        let subscription = watcher.subscribe(to: ["room"])[0]
        var events = subscription.appContextEvents.makeAsyncIterator()
        let heard = Mutex<[AppContextEvent]>([])
        subscription.onAppContextEvent { event in heard.withLock { $0.append(event) } }
        let plainMessages = Mutex(0)
        subscription.onMessage { _ in plainMessages.withLock { $0 += 1 } }
        #expect(await statuses.next()?.category == .connected)

        let set = try await actor.setChannelMetadata(ChannelMetadata(id: "room", name: "Room", custom: ["k": "v"]))
        let first = await events.next()
        #expect(first?.change == .set && first?.channel == "room")
        #expect(first?.entity == .channel(set))
        try await actor.setMemberships([MembershipUpdate("room", status: "joined")])
        let second = await events.next()
        guard case .membership(let membership)? = second?.entity else {
            Issue.record("expected a membership event, got \(String(describing: second))")
            return
        }
        #expect(membership.user.id == "actor" && membership.channel.id == "room" && membership.status == "joined")
        try await actor.removeChannelMetadata(channel: "room")
        let third = await events.next()
        #expect(third?.change == .delete && third?.entity == .channel(ChannelMetadata(id: "room")))
        #expect(heard.withLock { $0.count } >= 2)
        #expect(plainMessages.withLock { $0 } == 0)
        for c in [watcher, actor] { await c.shutdown() }
        await server.stop()
    }
}
