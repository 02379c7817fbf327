import Logging
import PostgresNIO

extension PostgresConnection {
    /// Runs a statement whose rows Tether does not need (`SELECT pg_notify(…)`, a lock, an
    /// insert that returns rows) and reads them to the end.
    ///
    /// PostgreSQL answers a statement that returns rows with their description first and any
    /// error after it; PostgresNIO hands that error to the row sequence, so a statement whose
    /// rows are left unread fails silently. In a transaction that is worse than a lost error:
    /// the transaction is aborted, and a `COMMIT` of an aborted transaction is answered
    /// `ROLLBACK` without an error, so the write looked committed while nothing was kept.
    /// Every statement with rows that the shared log does not read goes through here.
    func statement(_ query: PostgresQuery, logger: Logger) async throws {
        for try await _ in try await self.query(query, logger: logger) {}
    }
}
