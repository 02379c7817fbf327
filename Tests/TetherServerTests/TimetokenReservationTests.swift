import Foundation
import GRDB
import Logging
import Synchronization
import Testing
@_spi(Benchmarks) import TetherProtocol
@testable import TetherServer

/// The store's `highest_timetoken` (the sequencer's floor after a restart) is written a second
/// ahead of the message batches, and only by a batch that passes it: it always covers every
/// stored timetoken, while a busy store rewrites that row about once a second. The hub's cursor
/// lease keeps it ahead of every cursor and unstored event too, so a restart whose clock went
/// back never numbers an event below a cursor a subscriber holds.
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

    /// A clock the test sets, as the hub's timetoken clock.
    private final class SetClock: Sendable {
        let now: Mutex<Timetoken>
        init(_ start: Timetoken) { now = Mutex(start) }
        func advance(seconds: Double) { now.withLock { $0 = Timetoken(UInt64(Double($0.rawValue) + seconds * 10_000_000)) } }
        func set(_ value: Timetoken) { now.withLock { $0 = value } }
        var read: @Sendable () -> Timetoken { { self.now.withLock { $0 } } }
    }

    private static func hub(_ store: MessageStore, _ clock: SetClock) throws -> LongPollHub {
        var logger = Logger(label: "lease-test")
        logger.logLevel = .critical
        return try LongPollHub(store: store, metrics: ServerMetrics(), logger: logger, clock: clock.read)
    }

    private static func signal(_ hub: LongPollHub) -> Timetoken {
        hub.publishEphemeral { SubscribeEnvelope(timetoken: $0, subscribeKey: "k", channel: "c", payload: "\"s\"") }
    }

    @Test func aRestartWhoseClockWentBackNeverNumbersBelowACursorHandedOutBefore() async throws {
        let directory = Self.temporaryDirectory()
        let start = Timetoken(unixSeconds: 1_800_000_000)
        let clock = SetClock(start)
        var handedOut: [Timetoken] = []
        do {
            let store = try Self.openStore(directory)
            let hub = try Self.hub(store, clock)
            // Taken at start: the store holds a lease ahead of the clock before any cursor goes out.
            #expect(try store.highestTimetoken().storageValue >= start.storageValue + LongPollHub.cursorLease)
            clock.advance(seconds: 2)
            handedOut.append(hub.currentCursor)
            #expect(handedOut.last == clock.read())
            // Half the lease left: renewed, and the cursor follows the clock under it.
            clock.advance(seconds: 1)
            #expect(try await hub.renewCursorLease())
            #expect(try await hub.renewCursorLease() == false)  // more than half is left: no write
            clock.advance(seconds: 4)
            handedOut.append(hub.currentCursor)
            handedOut.append(Self.signal(hub))  // an unstored event: its timetoken reaches subscribers too
            #expect(handedOut.allSatisfy { $0.storageValue <= (try? store.highestTimetoken().storageValue) ?? 0 })
            // A store that cannot renew (here: nobody calls it) holds the cursor at the lease.
            clock.advance(seconds: 60)
            let held = hub.currentCursor
            #expect(held < clock.read())
            #expect(held.storageValue <= (try store.highestTimetoken()).storageValue)
            handedOut.append(held)
            try store.close()
        }
        // The next run starts an hour earlier by its clock (a clock stepped back, an RTC behind
        // before NTP): every timetoken it gives is above every cursor the first run handed out.
        clock.set(Timetoken(unixSeconds: 1_800_000_000 - 3600))
        let store = try Self.openStore(directory)
        let hub = try Self.hub(store, clock)
        let highest = try #require(handedOut.max())
        #expect(hub.currentCursor >= highest)
        #expect(Self.signal(hub) > highest)
        try store.close()
    }

    @Test func aGracefulStopSettlesTheLeaseSoARestartStartsAtItsClock() async throws {
        let directory = Self.temporaryDirectory()
        let start = Timetoken(unixSeconds: 1_800_000_000)
        let clock = SetClock(start)
        let last: Timetoken
        do {
            let store = try Self.openStore(directory)
            let hub = try Self.hub(store, clock)
            clock.advance(seconds: 1)
            _ = hub.currentCursor
            last = Self.signal(hub)
            #expect(try store.highestTimetoken().storageValue == start.storageValue + LongPollHub.cursorLease)
            #expect(try hub.settleCursorLease())
            // Settled to the last cursor: at or above everything handed out, no lease ahead.
            #expect(try store.highestTimetoken() == last)
            #expect(hub.currentCursor == last)  // held there from now on
            try store.close()
        }
        // Restarted a second later: it starts at its clock, not at the lease's end.
        clock.advance(seconds: 1)
        do {
            let store = try Self.openStore(directory)
            let hub = try Self.hub(store, clock)
            #expect(hub.currentCursor == clock.read())
            try store.close()
        }
        // Restarted with its clock an hour behind: still above the last cursor.
        clock.set(Timetoken(unixSeconds: 1_800_000_000 - 3600))
        let store = try Self.openStore(directory)
        let hub = try Self.hub(store, clock)
        #expect(hub.currentCursor >= last)
        #expect(Self.signal(hub) > last)
        try store.close()
    }

    /// `tether store recover` on a file whose `highest_timetoken` row was lost: the fresh store
    /// still starts above every cursor the last server could have handed out (its last write plus
    /// the lease), not at the highest stored message, even though the clock is now behind.
    @Test func aRecoveredStoreThatLostItsLeaseRowStartsAboveTheLastServersLease() async throws {
        let directory = Self.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = try Self.openStore(directory)
        try await store.withWriterRunning { store in try await store.append(Self.message(100)) }
        try store.close()
        let path = MessageStore.databasePath(in: directory)
        let raw = try DatabaseQueue(path: path)
        try await raw.write { db in try db.execute(sql: "DELETE FROM server_state WHERE key = 'highest_timetoken'") }
        try raw.close()
        // The last server wrote an hour after the clock the recovery and the restart now read.
        let lastWrite = Date().addingTimeInterval(3_600)
        for suffix in ["", "-wal"] where FileManager.default.fileExists(atPath: path + suffix) {
            try FileManager.default.setAttributes([.modificationDate: lastWrite], ofItemAtPath: path + suffix)
        }
        let report = try StoreRecovery.recover(directory: directory, now: Date())
        #expect(report.tables.first { $0.name == "message" }?.kept == 1)
        let recovered = try Self.openStore(directory)
        let floor = Timetoken(unixSeconds: lastWrite.timeIntervalSince1970).storageValue + LongPollHub.cursorLease
        #expect(try recovered.highestTimetoken().storageValue >= floor - 10_000)  // the file system's time resolution
        try recovered.close()
    }
}
