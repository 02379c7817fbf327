import Foundation
import Logging
import PostgresNIO

/// Creating and dropping whole databases on a PostgreSQL server: what the tests use to give
/// every test a database of its own (`TETHER_TEST_DATABASE_URL` names the server).
package enum DatabaseAdmin {
    /// Creates a new, empty database on `server`'s PostgreSQL (connecting to the database the
    /// URL names) and returns the URL of the new one.
    package static func createDatabase(on server: DatabaseURL, prefix: String = "t") async throws -> DatabaseURL {
        let name = "\(prefix)_\(UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: ""))"
        try await run(on: server, "CREATE DATABASE \(name)")
        var url = server
        url.database = name
        return url
    }

    /// Drops `url`'s database (ending its other sessions first).
    package static func dropDatabase(_ url: DatabaseURL, on server: DatabaseURL) async throws {
        guard url.database != server.database, url.database.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "_" }) else { return }
        try await run(on: server, "DROP DATABASE IF EXISTS \(url.database) WITH (FORCE)")
    }

    /// Runs one statement on `server`, with a client of its own.
    package static func run(on server: DatabaseURL, _ sql: String) async throws {
        var logger = Logger(label: "tether.database-admin")
        logger.logLevel = .error
        let client = PostgresClient(configuration: server.clientConfiguration, backgroundLogger: logger)
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            try await client.query(PostgresQuery(unsafeSQL: sql), logger: logger)
        }
    }
}
