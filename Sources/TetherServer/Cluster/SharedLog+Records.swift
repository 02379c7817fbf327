import Logging
import PostgresNIO

/// A refusal a record write answers with (a limit reached): it rolls its transaction back and
/// reaches the caller as itself, not as a ``StoreError``.
protocol RecordRefusal: Error {}

extension AppContextMembershipLimitExceeded: RecordRefusal {}

/// What the record stores (push, App Context, message actions) share on the shared log:
/// transactions whose errors become ``StoreError`` (503 when PostgreSQL is unreachable), and
/// per-record locks, which serialise the read-check-write changes that the embedded store's
/// single writer serialises (a limit counted, then written; a PATCH read, then merged).
extension SharedLog {
    /// The class of the record locks (`pg_advisory_xact_lock(int, int)`; the migration lock
    /// uses the one-`bigint` key space, which does not overlap).
    static let recordLockClass: Int32 = 0x7465_7468  // "teth"

    /// Runs `body` in one transaction; refusals pass through, other errors as ``StoreError``.
    /// A lock (a record's, the sequencer's) awaited longer than ``SharedLogOptions/writeTimeout``
    /// ends it as `busy` (503), as a write queued too long on the embedded store is answered.
    func recordTransaction<Result: Sendable>(_ body: (PostgresConnection) async throws -> Result) async throws -> Result {
        let (seconds, attoseconds) = options.writeTimeout.components
        let lockTimeout = "\(max(1, seconds * 1000 + attoseconds / 1_000_000_000_000_000))ms"
        do {
            return try await client.transaction(logger: logger) { connection in
                try await connection.statement("SELECT set_config('lock_timeout', \(lockTimeout), true)", logger: logger)
                return try await body(connection)
            }
        } catch let error as SharedTransactionError where error.step == .body {
            throw Self.recordError(error.cause)
        } catch {
            throw Self.recordError(error)
        }
    }

    /// Runs `body` on a connection of the pool (reads, single statements); errors as ``StoreError``.
    func recordQuery<Result: Sendable>(_ body: (PostgresConnection) async throws -> Result) async throws -> Result {
        do {
            return try await client.withConnection { connection in try await body(connection) }
        } catch {
            throw Self.recordError(error)
        }
    }

    static func recordError(_ error: any Error) -> any Error {
        if error is any RecordRefusal { return error }
        if let error = error as? PSQLError, error.serverInfo?[.sqlState] == "55P03" {  // lock_not_available
            return StoreError(.busy, "the shared database is busy", cause: error)
        }
        return classify(error)
    }

    /// Takes the transaction's locks on `keys` (held to its end), in one global order, so two
    /// transactions locking overlapping keys never wait on each other in a cycle. Distinct keys
    /// may share a lock (a 32-bit hash): that only serialises them.
    ///
    /// Each lock's row is read to its end: PostgreSQL reports a lock wait that outlived
    /// `lock_timeout` after the statement's row description, so a statement whose rows were not
    /// read hid it — the next statement then failed as "current transaction is aborted" and the
    /// change was answered as a failed write instead of `busy`.
    static func lockRecords(_ keys: [String], connection: PostgresConnection, logger: Logger) async throws {
        for id in Set(keys.map(lockID)).sorted() {
            try await connection.statement("SELECT pg_advisory_xact_lock(\(recordLockClass), \(id))", logger: logger)
        }
    }

    /// FNV-1a, 32 bits.
    static func lockID(_ key: String) -> Int32 {
        var hash: UInt32 = 0x811c_9dc5
        for byte in key.utf8 { hash = (hash ^ UInt32(byte)) &* 0x0100_0193 }
        return Int32(bitPattern: hash)
    }
}
