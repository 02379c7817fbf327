import Foundation
import Logging
import Testing
import TetherProtocol
@testable import TetherServer

/// The store's `highest_timetoken` (the sequencer's floor after a restart) is written a second
/// ahead of the message batches, and only by a batch that passes it: it always covers every
/// stored timetoken, while a busy store rewrites that row about once a second.
@Suite struct TimetokenReservationTests {
    private static let ahead = MessageStore.timetokenReservation

    private static func openStore(_ directory: String) throws -> MessageStore {
        var logger = Logger(label: "reservation-test")
        logger.logLevel = .critical
        return try MessageStore(directory: directory, logger: logger, metrics: ServerMetrics())
    }

    private static func temporaryDirectory() -> String {
        FileManager.default.temporaryDirectory.appendingPathComponent("tether-reservation-\(UUID().uuidString)").path
    }

    private static func message(_ tt: Int64, payload: String = "\"m\"") -> StoredMessage {
        StoredMessage(subscribeKey: "k", channel: "c", timetoken: Timetoken(UInt64(tt)), publisher: "p", payload: payload, meta: nil,
                      customMessageType: nil, sequence: nil, expiresAt: nil)
    }

    @Test func aBatchWritesAReservationOnlyWhenItPassesTheStoredOne() {
        #expect(MessageStore.reservation(above: 100, stored: 0) == 100 + Self.ahead)
        #expect(MessageStore.reservation(above: 100, stored: 100) == nil)
        #expect(MessageStore.reservation(above: 50, stored: 100 + Self.ahead) == nil)
        #expect(MessageStore.reservation(above: 101 + Self.ahead, stored: 100 + Self.ahead) == 101 + 2 * Self.ahead)
        // No overflow: at the end of the range the batch's own highest is written.
        let last = Int64.max - 1
        #expect(MessageStore.reservation(above: last, stored: 0) == last)
    }

    @Test func theStoreKeepsItsHighestTimetokenAheadAcrossARestart() async throws {
        let directory = Self.temporaryDirectory()
        let store = try Self.openStore(directory)
        try await store.withWriterRunning { store in
            try await store.append(Self.message(100))
            #expect(try store.highestTimetoken().rawValue == UInt64(100 + Self.ahead))
            // Covered: the row is not written again (it would read 200 + ahead).
            try await store.append(Self.message(200))
            #expect(try store.highestTimetoken().rawValue == UInt64(100 + Self.ahead))
            // Passed: written a second ahead of the new highest.
            try await store.append(Self.message(300 + Self.ahead))
            #expect(try store.highestTimetoken().rawValue == UInt64(300 + 2 * Self.ahead))
        }
        try store.close()
        let reopened = try Self.openStore(directory)
        #expect(try reopened.highestTimetoken().rawValue == UInt64(300 + 2 * Self.ahead))
        try reopened.close()
    }

    @Test func aBatchThatFailedLeavesItsReservationToTheNextOne() async throws {
        let store = try Self.openStore(Self.temporaryDirectory())
        try await store.withWriterRunning { store in
            let big = "\"" + String(repeating: "x", count: 20_000) + "\""
            try await store.append(Self.message(100, payload: big))
            #expect(try store.highestTimetoken().rawValue == UInt64(100 + Self.ahead))
            // The file is capped: this batch, which would raise the reservation, rolls back.
            try store.setMaximumSize(1)
            await #expect(throws: StoreError.self) { try await store.append(Self.message(200 + Self.ahead, payload: big)) }
            try store.setMaximumSize(nil)
            // Below what the failed batch would have reserved, above what is stored: written.
            try await store.append(Self.message(150 + Self.ahead))
            #expect(try store.highestTimetoken().rawValue == UInt64(150 + 2 * Self.ahead))
        }
        try store.close()
    }
}
