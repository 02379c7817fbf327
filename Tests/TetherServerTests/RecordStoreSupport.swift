import Foundation
import Logging
import PostgresNIO
import Testing
@_spi(Benchmarks) import TetherProtocol
@testable import TetherServer

/// What the record-store tests run against: the embedded SQLite store, or a cluster's shared
/// log on a fresh PostgreSQL database (`TETHER_TEST_DATABASE_URL`). Both answer the same tests.
enum RecordStoreKind: String, Sendable {
    case sqlite
    case postgres

    static let postgresSkipReason: Comment = "TETHER_TEST_DATABASE_URL is not set (scripts/test starts a PostgreSQL and sets it)"
}

/// A store of push registrations, App Context and message actions under test, with what the
/// tests need besides: messages stored at a given timetoken (what actions hang on), history
/// deletes and retention.
protocol RecordStoreUnderTest: PushRegistrationStoring, AppContextStoring, MessageActionStoring, MessageReading {
    /// Stores `message` at its own timetoken, with its expiry.
    func storeMessage(_ message: StoredMessage) async throws
    /// Removes what is past retention at `now`; returns how many messages (events) went.
    func pruneRetention(now: Timetoken) async throws -> Int
}

extension MessageStore {
    /// Runs `body` with the store's writer running; the writer writes what is queued and stops
    /// when `body` returns or throws.
    func withWriterRunning(_ body: (MessageStore) async throws -> Void) async throws {
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await self.runWriter() }
            do { try await body(self) } catch {
                finish()
                throw error
            }
            finish()
            try await group.waitForAll()
        }
    }
}

extension MessageStore: RecordStoreUnderTest {
    func storeMessage(_ message: StoredMessage) async throws { try await append(message) }
    func pruneRetention(now: Timetoken) async throws -> Int { try await pruneExpired(now: now) }
}

extension SharedLog: RecordStoreUnderTest {
    func storeMessage(_ message: StoredMessage) async throws {
        try await client.query("""
            INSERT INTO tether_event (tt, sub_key, channel, kind, publisher, payload, meta, custom_type, seqn, stored, expires_at)
            VALUES (\(message.timetoken.storageValue), \(message.subscribeKey), \(message.channel), \(message.kind.rawValue),
                    \(message.publisher), \(message.payload), \(message.meta), \(message.customMessageType), \(message.sequence), true,
                    \(message.expiresAt?.storageValue))
            """, logger: logger)
        try await client.query("""
            UPDATE tether_sequencer SET last_tt = GREATEST(last_tt, \(message.timetoken.storageValue)) WHERE id = 1
            """, logger: logger)
    }

    func pruneRetention(now: Timetoken) async throws -> Int { try await pruneExpired(now: now) }
}

/// Where a store under test lives, so that a test can close it and open it again.
struct RecordStoreSite: Sendable {
    let kind: RecordStoreKind
    let directory: String
    let url: DatabaseURL?

    private static var logger: Logger {
        var logger = Logger(label: "record-store-test")
        logger.logLevel = .critical
        return logger
    }

    /// A new, empty site of `kind` (a temporary directory; a fresh database, dropped afterwards).
    static func withNew(_ kind: RecordStoreKind, _ body: (RecordStoreSite) async throws -> Void) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-records-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        switch kind {
        case .sqlite:
            try await body(RecordStoreSite(kind: kind, directory: directory, url: nil))
        case .postgres:
            try await TestPostgres.withDatabase { url in
                try await body(RecordStoreSite(kind: kind, directory: directory, url: url))
            }
        }
    }

    /// Runs `body` with a new, empty store of `kind`.
    static func withStore(_ kind: RecordStoreKind, _ body: (any RecordStoreUnderTest) async throws -> Void) async throws {
        try await withNew(kind) { site in try await site.withStore(body) }
    }

    /// Opens the site's store (its writer running), runs `body`, and closes it.
    func withStore(_ body: (any RecordStoreUnderTest) async throws -> Void) async throws {
        switch kind {
        case .sqlite:
            let store = try MessageStore(directory: directory, logger: Self.logger, metrics: ServerMetrics())
            try await store.withWriterRunning(body)
            try store.close()
        case .postgres:
            let log = RunningLog(try await TestPostgres.open(try #require(url)))
            do { try await body(log.log) } catch {
                await log.stop()
                throw error
            }
            await log.stop()
        }
    }
}
