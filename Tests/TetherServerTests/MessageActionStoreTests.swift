import Foundation
import GRDB
import Logging
import Testing
@_spi(Benchmarks) import TetherProtocol
@testable import TetherServer

/// Message actions in the store: tied to their message (refused without one, removed with it
/// by a history delete and by retention), duplicates refused, pages newest-first with `more`.
@Suite struct MessageActionStoreTests {
    private static func openStore() throws -> MessageStore {
        var logger = Logger(label: "actions-test")
        logger.logLevel = .critical
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-actions-\(UUID().uuidString)").path
        return try MessageStore(directory: directory, logger: logger, metrics: ServerMetrics())
    }

    private static func message(_ tt: UInt64, channel: String = "c", expiresAt: UInt64? = nil) -> StoredMessage {
        StoredMessage(subscribeKey: "k", channel: channel, timetoken: Timetoken(tt), publisher: "p", payload: "\"m\"", meta: nil,
                      customMessageType: nil, sequence: nil, expiresAt: expiresAt.map { Timetoken($0) })
    }

    private static func action(_ message: UInt64, _ tt: UInt64, value: String = "v", uuid: String = "u", channel: String = "c")
        -> StoredAction
    {
        StoredAction(subscribeKey: "k", channel: channel, messageTimetoken: Timetoken(message), actionTimetoken: Timetoken(tt),
                     type: "reaction", value: value, uuid: uuid)
    }

    private static func withStore(_ body: (MessageStore) async throws -> Void) async throws {
        try await withStore(openStore(), body)
    }

    private static func withStore(_ store: MessageStore, _ body: (MessageStore) async throws -> Void) async throws {
        try await store.withWriterRunning(body)
        try store.close()
    }

    @Test func messageCountsStopAtTheCursorTheyAreCountedThrough() async throws {
        try await Self.withStore { store in
            for tt in [100, 200, 300, 400] as [UInt64] { try await store.append(Self.message(tt)) }
            let all = try await store.messageCounts(subscribeKey: "k", channels: [("c", Timetoken(100))])
            #expect(all == ["c": 3])
            let through = try await store.messageCounts(subscribeKey: "k", channels: [("c", Timetoken(100))], through: Timetoken(300))
            #expect(through == ["c": 2], "200 and 300; 400 is after the cursor")
            let none = try await store.messageCounts(subscribeKey: "k", channels: [("c", Timetoken(300))], through: Timetoken(300))
            #expect(none == ["c": 0])
        }
    }

    @Test func anActionNeedsItsMessageAndIsAddedOncePerUUID() async throws {
        try await MessageActionStoreContract.anActionNeedsItsMessageAndIsAddedOncePerUUID(.sqlite)
        // The action's timetoken raises the sequencer's floor (above the reservation the
        // message's batch wrote: TimetokenReservationTests).
        try await Self.withStore { store in
            try await store.append(Self.message(100))
            let actionTimetoken = 203 + UInt64(MessageStore.timetokenReservation)
            #expect(try await store.addAction(Self.action(100, actionTimetoken)) == .added)
            #expect(try store.highestTimetoken() == Timetoken(actionTimetoken))
        }
    }

    @Test func removalChecksTheUUID() async throws {
        try await MessageActionStoreContract.removalChecksTheUUID(.sqlite)
    }

    @Test func pagesAreTheNewestBeforeStartOldestFirst() async throws {
        try await MessageActionStoreContract.pagesAreTheNewestBeforeStartOldestFirst(.sqlite)
    }

    @Test func actionsLeaveWithTheirMessageOnDeleteAndRetention() async throws {
        try await MessageActionStoreContract.actionsLeaveWithTheirMessageOnDeleteAndRetention(.sqlite)
    }

    @Test func recoveryKeepsActionsOfKeptMessagesAndTheirTimetokens() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-actions-\(UUID().uuidString)").path
        var logger = Logger(label: "actions-test")
        logger.logLevel = .critical
        try await Self.withStore(MessageStore(directory: directory, logger: logger, metrics: ServerMetrics())) { store in
            try await store.append(Self.message(100))
            _ = try await store.addAction(Self.action(100, 900))
        }
        // An action whose message is gone (as a damaged file can leave it), written without
        // the foreign key check.
        var unchecked = Configuration()
        unchecked.foreignKeysEnabled = false
        let raw = try DatabaseQueue(path: MessageStore.databasePath(in: directory), configuration: unchecked)
        try await raw.write { db in
            try db.execute(sql: "INSERT INTO message_action VALUES ('k', 'c', 55, 950, 'reaction', 'lost', 'u')")
            try db.execute(sql: "UPDATE server_state SET value = 100 WHERE key = 'highest_timetoken'")
        }
        try raw.close()
        _ = try StoreRecovery.recover(directory: directory)
        try await Self.withStore(MessageStore(directory: directory, logger: logger, metrics: ServerMetrics())) { store in
            let kept = try await store.actions(subscribeKey: "k", channel: "c", start: nil, end: nil, limit: 10).actions
            #expect(kept == [Self.action(100, 900)])
            // Timetokens stay above every action the file held.
            let highest = try store.highestTimetoken()
            #expect(highest >= Timetoken(950))
        }
    }
}

/// The message-action tests both stores answer alike (the SQLite suite above, the PostgreSQL
/// one below).
enum MessageActionStoreContract {
    static func message(_ tt: UInt64, channel: String = "c", expiresAt: UInt64? = nil) -> StoredMessage {
        StoredMessage(subscribeKey: "k", channel: channel, timetoken: Timetoken(tt), publisher: "p", payload: "\"m\"", meta: nil,
                      customMessageType: nil, sequence: nil, expiresAt: expiresAt.map { Timetoken($0) })
    }

    static func action(_ message: UInt64, _ tt: UInt64, value: String = "v", uuid: String = "u", channel: String = "c")
        -> StoredAction
    {
        StoredAction(subscribeKey: "k", channel: channel, messageTimetoken: Timetoken(message), actionTimetoken: Timetoken(tt),
                     type: "reaction", value: value, uuid: uuid)
    }

    static func anActionNeedsItsMessageAndIsAddedOncePerUUID(_ kind: RecordStoreKind) async throws {
        try await RecordStoreSite.withStore(kind) { store in
            try await store.storeMessage(message(100))
            #expect(try await store.addAction(action(99, 200)) == .messageNotFound)
            #expect(try await store.addAction(action(100, 200, channel: "other")) == .messageNotFound)
            #expect(try await store.addAction(action(100, 201)) == .added)
            #expect(try await store.addAction(action(100, 202)) == .duplicate)
            #expect(try await store.addAction(action(100, 203, uuid: "someone-else")) == .added)
            #expect(try await store.actionCount() == 2)
        }
    }

    static func removalChecksTheUUID(_ kind: RecordStoreKind) async throws {
        try await RecordStoreSite.withStore(kind) { store in
            try await store.storeMessage(message(100))
            _ = try await store.addAction(action(100, 201))
            #expect(try await store.removeAction(subscribeKey: "k", channel: "c", messageTimetoken: Timetoken(100),
                                                 actionTimetoken: Timetoken(201), uuid: "intruder") == .wrongUUID)
            #expect(try await store.removeAction(subscribeKey: "k", channel: "c", messageTimetoken: Timetoken(101),
                                                 actionTimetoken: Timetoken(201), uuid: "u") == .notFound)
            #expect(try await store.removeAction(subscribeKey: "k", channel: "c", messageTimetoken: Timetoken(100),
                                                 actionTimetoken: Timetoken(201), uuid: "u") == .removed(action(100, 201)))
            #expect(try await store.actionCount() == 0)
        }
    }

    static func pagesAreTheNewestBeforeStartOldestFirst(_ kind: RecordStoreKind) async throws {
        try await RecordStoreSite.withStore(kind) { store in
            try await store.storeMessage(message(100))
            for i in 0..<5 { _ = try await store.addAction(action(100, UInt64(201 + i), value: "\(i)")) }
            let first = try await store.actions(subscribeKey: "k", channel: "c", start: nil, end: nil, limit: 2)
            #expect(first.actions.map(\.value) == ["3", "4"] && first.more)
            let second = try await store.actions(subscribeKey: "k", channel: "c", start: Timetoken(204), end: nil, limit: 2)
            #expect(second.actions.map(\.value) == ["1", "2"] && second.more)
            let last = try await store.actions(subscribeKey: "k", channel: "c", start: Timetoken(202), end: nil, limit: 2)
            #expect(last.actions.map(\.value) == ["0"] && !last.more)
            let bounded = try await store.actions(subscribeKey: "k", channel: "c", start: nil, end: Timetoken(203), limit: 2)
            #expect(bounded.actions.map(\.value) == ["3", "4"] && bounded.more)
            let byMessage = try await store.actions(subscribeKey: "k", channel: "c", messagesFrom: Timetoken(100), through: Timetoken(100))
            #expect(byMessage[Timetoken(100)]?.map(\.value) == ["0", "1", "2", "3", "4"])
        }
    }

    static func actionsLeaveWithTheirMessageOnDeleteAndRetention(_ kind: RecordStoreKind) async throws {
        try await RecordStoreSite.withStore(kind) { store in
            try await store.storeMessage(message(100))
            try await store.storeMessage(message(101))
            try await store.storeMessage(message(102, expiresAt: 500))
            _ = try await store.addAction(action(100, 201))
            _ = try await store.addAction(action(101, 202))
            _ = try await store.addAction(action(102, 203))
            try await store.delete(subscribeKey: "k", channel: "c", start: Timetoken(100), end: Timetoken(101))
            #expect(try await store.actions(subscribeKey: "k", channel: "c", start: nil, end: nil, limit: 10).actions
                .map(\.messageTimetoken) == [Timetoken(100), Timetoken(102)])
            #expect(try await store.pruneRetention(now: Timetoken(600)) == 1)
            #expect(try await store.actions(subscribeKey: "k", channel: "c", start: nil, end: nil, limit: 10).actions
                .map(\.messageTimetoken) == [Timetoken(100)])
        }
    }
}

/// The message-action store tests on the cluster's PostgreSQL (the shared log's tables).
@Suite(.enabled(if: TestPostgres.available, RecordStoreKind.postgresSkipReason))
struct MessageActionPostgresStoreTests {
    @Test func anActionNeedsItsMessageAndIsAddedOncePerUUID() async throws {
        try await MessageActionStoreContract.anActionNeedsItsMessageAndIsAddedOncePerUUID(.postgres)
    }

    @Test func removalChecksTheUUID() async throws {
        try await MessageActionStoreContract.removalChecksTheUUID(.postgres)
    }

    @Test func pagesAreTheNewestBeforeStartOldestFirst() async throws {
        try await MessageActionStoreContract.pagesAreTheNewestBeforeStartOldestFirst(.postgres)
    }

    @Test func actionsLeaveWithTheirMessageOnDeleteAndRetention() async throws {
        try await MessageActionStoreContract.actionsLeaveWithTheirMessageOnDeleteAndRetention(.postgres)
    }

    private struct WriteFailed: Error {}

    /// In a cluster the log numbers an action and writes it with its event in one transaction:
    /// the action's timetoken is its event's; a refused or failed write leaves no event.
    @Test func anActionIsNumberedByTheLogAndCommittedWithItsEvent() async throws {
        try await TestPostgres.withDatabase { url in
            let log = RunningLog(try await TestPostgres.open(url))
            let message = try await log.log.append(SharedEvent(
                envelope: SubscribeEnvelope(timetoken: .zero, subscribeKey: "k", channel: "c", payload: "\"m\"", publisher: "p"),
                isStored: true, retentionHours: nil, dedupKey: nil)).timetoken
            func add(_ value: String, failing: Bool = false) async throws -> (Timetoken, ActionAddOutcome) {
                try await log.log.appendAfterWrite({ tt in
                    SubscribeEnvelope(timetoken: tt, subscribeKey: "k", channel: "c", payload: "\"\(value)\"", publisher: "u",
                                      kind: .messageAction)
                }, write: { tt, actions in
                    let outcome = try await actions.addAction(StoredAction(subscribeKey: "k", channel: "c", messageTimetoken: message,
                                                                           actionTimetoken: tt, type: "reaction", value: value, uuid: "u"))
                    if failing { throw WriteFailed() }
                    return (outcome == .added, outcome)
                })
            }
            let (first, added) = try await add("x")
            #expect(added == .added && first > message)
            #expect(try await add("x").1 == .duplicate)
            await #expect(throws: (any Error).self) { try await add("lost", failing: true) }
            let (second, _) = try await add("y")
            #expect(second > first)
            #expect(await log.waitForDeliveries(3))
            #expect(log.timetokens == [message, first, second], "the message, then each added action's event at its timetoken")
            let stored = try await log.log.actions(subscribeKey: "k", channel: "c", start: nil, end: nil, limit: 10).actions
            #expect(stored.map(\.actionTimetoken) == [first, second])
            #expect(stored.map(\.value) == ["x", "y"])
            await log.stop()
        }
    }

    /// Only a stored message takes actions: an event the log keeps just for delivery does not.
    @Test func anEventThatIsNotStoredTakesNoAction() async throws {
        try await TestPostgres.withDatabase { url in
            let log = RunningLog(try await TestPostgres.open(url))
            let outcome = try await log.log.append(SharedEvent(
                envelope: SubscribeEnvelope(timetoken: .zero, subscribeKey: "k", channel: "c", payload: "\"s\"", publisher: "p"),
                isStored: false, retentionHours: nil, dedupKey: nil))
            #expect(try await log.log.addAction(MessageActionStoreContract.action(UInt64(outcome.timetoken.rawValue), 1))
                    == .messageNotFound)
            await log.stop()
        }
    }
}
