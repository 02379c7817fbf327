import Logging
import NIOCore
import PostgresNIO

/// Why a transaction of the shared log did not commit, with the step that failed: the step
/// decides what the writer may tell a publisher.
///
/// - `begin` and `body`: nothing was committed (the body's error rolled it back).
/// - `commit` with PostgreSQL's own refusal (an error answering `COMMIT`, or `COMMIT` answered
///   `ROLLBACK`): nothing was committed.
/// - `commit` with the connection lost (or PostgreSQL shutting down) before the answer came:
///   the transaction may have committed. Only this one is "outcome unknown".
struct SharedTransactionError: Error, CustomStringConvertible {
    enum Step: String, Sendable {
        case begin, body, commit
    }

    /// The step that failed.
    var step: Step
    /// What failed it.
    var cause: any Error

    var description: String { "\(step.rawValue): \(cause)" }

    /// Whether the transaction may have committed although the commit did not say so.
    var mayHaveCommitted: Bool {
        guard step == .commit else { return false }
        guard let error = cause as? PSQLError else { return !(cause is RolledBackAtCommit) }
        guard error.code == .server else { return true }  // the connection, not PostgreSQL, failed
        // PostgreSQL's own answer to the COMMIT is a refusal, except when it is ending the
        // session (admin shutdown, a crash of another backend): that may come after the commit.
        let state = error.serverInfo?[.sqlState] ?? ""
        return state.hasPrefix("08") || state.hasPrefix("57")
    }
}

/// `COMMIT` was answered `ROLLBACK`: the transaction had been aborted by an error that was
/// never read. ``PostgresConnection/statement(_:logger:)`` reads every such error, so this is a
/// last line of defence: the write fails instead of being reported stored.
struct RolledBackAtCommit: Error, CustomStringConvertible {
    var description: String { "PostgreSQL rolled the transaction back at COMMIT (an earlier error in it went unread)" }
}

extension PostgresClient {
    /// Runs `body` in one transaction on a connection of the pool, and commits it. Unlike
    /// PostgresNIO's `withTransaction`, it reads the `COMMIT`'s command tag: PostgreSQL answers
    /// the `COMMIT` of an aborted transaction with `ROLLBACK` and no error, which would otherwise
    /// pass for a commit. Errors arrive as ``SharedTransactionError``.
    func transaction<Result>(
        logger: Logger,
        isolation: isolated (any Actor)? = #isolation,
        _ body: (PostgresConnection) async throws -> sending Result
    ) async throws -> sending Result {
        try await withConnection(isolation: isolation) { connection in
            try await connection.transaction(logger: logger, isolation: isolation, body)
        }
    }
}

extension PostgresConnection {
    /// ``PostgresClient/transaction(logger:isolation:_:)`` on this connection.
    func transaction<Result>(
        logger: Logger,
        isolation: isolated (any Actor)? = #isolation,
        _ body: (PostgresConnection) async throws -> sending Result
    ) async throws -> sending Result {
        do {
            try await begin(logger: logger)
        } catch {
            throw SharedTransactionError(step: .begin, cause: error)
        }
        let value: Result
        do {
            value = try await body(self)
        } catch {
            // The error is the caller's; a failed rollback (a lost connection) leaves nothing
            // committed either, and the pool closes a connection that failed.
            do { try await statement("ROLLBACK", logger: logger) } catch {}
            throw SharedTransactionError(step: .body, cause: error)
        }
        let tag: String
        do {
            tag = try await query("COMMIT", logger: logger).get().metadata.command
        } catch {
            throw SharedTransactionError(step: .commit, cause: error)
        }
        guard tag == "COMMIT" else { throw SharedTransactionError(step: .commit, cause: RolledBackAtCommit()) }
        return value
    }
}

/// `BEGIN` had no answer within ``PostgresConnection/beginLimit``.
struct BeginTimedOut: Error, CustomStringConvertible {
    var description: String { "BEGIN had no answer within \(PostgresConnection.beginLimit); the connection was closed" }
}

extension PostgresConnection {
    /// How long `BEGIN` may wait for its answer. It does no work, so only a connection that is
    /// already dead takes longer: PostgresNIO's pool can lease a connection whose socket has just
    /// failed, and a statement sent on it is never answered, not even with an error (seen when
    /// every connection of a node is reset at once). Without a limit the writer waited for its
    /// watchdog (twice the write timeout), and every publish of the node failed meanwhile.
    static let beginLimit: Duration = .seconds(2)

    /// Sends `BEGIN`; after ``beginLimit`` without an answer, closes the connection and throws
    /// ``BeginTimedOut`` (nothing was written: the transaction never began).
    fileprivate func begin(logger: Logger) async throws {
        let once = AnswerOnce()
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            let timer = Task {
                do { try await Task.sleep(for: Self.beginLimit) } catch { return }
                guard once.claim() else { return }
                // Closed before the caller hears of it: the caller hands the connection back to
                // the pool, and a late answer to BEGIN must not leave it inside a transaction
                // another lease would then write in (and the close would roll back).
                let closing: EventLoopFuture<Void> = self.close()
                continuation.resume(throwing: BeginTimedOut())
                try? await closing.get()
            }
            Task {
                let result: Result<Void, any Error>
                do { result = .success(try await self.statement("BEGIN", logger: logger)) } catch { result = .failure(error) }
                timer.cancel()
                if once.claim() { continuation.resume(with: result) }
            }
        }
    }
}
