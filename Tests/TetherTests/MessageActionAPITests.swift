import Foundation
import Synchronization
import Logging
import Testing
@testable import Tether
import TetherServer
import TetherTestingServer

/// The SDK's message-action calls and events against the real server (a real SQLite file).
@Suite("SDK message actions against the real server", .serialized)
struct MessageActionAPITests {
    private func client(_ server: InProcessServer, userId: String) throws -> TetherClient {
        var logger = Logger(label: "tether.test.actions")
        logger.logLevel = .warning
        let configuration = try TetherConfiguration(subscribeKey: "demo", publishKey: "demo", userId: userId, origin: server.origin,
                                                    useTLS: false, logger: logger)
        return try TetherClient(configuration: configuration)
    }

    @Test func addFetchRemoveAndHistoryWithActions() async throws {
        let server = try await InProcessServer.start()
        let alice = try client(server, userId: "alice"), bob = try client(server, userId: "bob")
        let room = "room-\(UUID().uuidString.prefix(6))"
        let message = try await alice.publish(channel: room, message: "hi").timetoken
        let plain = try await alice.publish(channel: room, message: "no reactions").timetoken

        let smile = try await alice.addMessageAction(channel: room, messageTimetoken: message, type: "reaction", value: "smile")
        #expect(smile.userId == "alice" && smile.messageTimetoken == message && smile.actionTimetoken > message)
        let read = try await bob.addMessageAction(channel: room, messageTimetoken: message, type: "receipt", value: "read")

        // A duplicate: PubNub's 409; a message that is not stored: a bad request.
        do {
            _ = try await alice.addMessageAction(channel: room, messageTimetoken: message, type: "reaction", value: "smile")
            Issue.record("a duplicate was accepted")
        } catch {
            #expect(error.status.statusCode == 409)
            #expect(error.status.serverMessage == "Action Already Added")
        }
        do {
            _ = try await alice.addMessageAction(channel: room, messageTimetoken: message.successor, type: "reaction", value: "x")
            Issue.record("an action on no message was accepted")
        } catch {
            #expect(error.status.category == .badRequest)
        }

        let page = try await alice.fetchMessageActions(channel: room)
        #expect(page.actions == [smile, read] && page.nextStart == nil)
        let first = try await alice.fetchMessageActions(channel: room, limit: 1)
        #expect(first.actions == [read] && first.nextStart == read.actionTimetoken)
        let older = try await alice.fetchMessageActions(channel: room, start: first.nextStart, limit: 1)
        #expect(older.actions == [smile])

        let history = try await alice.fetchMessages(channel: room, includeActions: true)
        #expect(history.map(\.timetoken) == [message, plain])
        #expect(history.first?.actions == [smile, read])
        #expect(history.last?.actions == [])

        // Only its author removes an action.
        do {
            try await bob.removeMessageAction(channel: room, messageTimetoken: message, actionTimetoken: smile.actionTimetoken)
            Issue.record("bob removed alice's action")
        } catch {
            #expect(error.status.category == .badRequest)
        }
        try await alice.removeMessageAction(channel: room, messageTimetoken: message, actionTimetoken: smile.actionTimetoken)
        #expect(try await alice.fetchMessageActions(channel: room).actions == [read])
        for c in [alice, bob] { await c.shutdown() }
        await server.stop()
    }

    @Test func actionEventsReachTheSubscription() async throws {
        let server = try await InProcessServer.start()
        let watcher = try client(server, userId: "watcher"), actor = try client(server, userId: "actor")
        let room = "room-\(UUID().uuidString.prefix(6))"
        let message = try await actor.publish(channel: room, message: "hi").timetoken
        var statuses = watcher.statuses().makeAsyncIterator()
        let subscription = watcher.subscribe(to: [room])[0]
        var events = subscription.messageActions.makeAsyncIterator()
        let heard = Mutex<[MessageActionEvent]>([])
        subscription.onMessageAction { event in heard.withLock { $0.append(event) } }
        let plainMessages = Mutex(0)
        subscription.onMessage { _ in plainMessages.withLock { $0 += 1 } }
        #expect(await statuses.next()?.category == .connected)

        let added = try await actor.addMessageAction(channel: room, messageTimetoken: message, type: "reaction", value: "wave")
        let first = await events.next()
        #expect(first?.change == .added && first?.action == added && first?.channel == room)
        try await actor.removeMessageAction(channel: room, messageTimetoken: message, actionTimetoken: added.actionTimetoken)
        let second = await events.next()
        #expect(second?.change == .removed && second?.action == added)
        // The listener saw the first event before the second was delivered (deliveries are in order).
        #expect(heard.withLock { $0.first?.change } == .added)
        // Action events are not messages.
        #expect(plainMessages.withLock { $0 } == 0)
        for c in [watcher, actor] { await c.shutdown() }
        await server.stop()
    }
}
