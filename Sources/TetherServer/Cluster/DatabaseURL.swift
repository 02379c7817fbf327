import Foundation
import NIOSSL
import PostgresNIO

/// A `postgres://` URL parsed into what PostgresNIO needs, with the password kept out of every
/// description (logs, errors, `/health`).
///
/// `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=disable|prefer|require]` — the
/// `postgresql://` scheme is accepted too. The port defaults to 5432 and `sslmode` to `prefer`
/// (TLS when the server offers it), as libpq does.
package struct DatabaseURL: Sendable, Equatable, CustomStringConvertible {
    /// How the connection uses TLS (libpq's `sslmode`, the three values that matter here).
    package enum TLSMode: String, Sendable, Equatable {
        case disable, prefer, require
    }

    package var host: String
    package var port: Int
    package var username: String
    package var password: String?
    package var database: String
    package var tls: TLSMode

    /// Parses `text`, or throws a message that says what is wrong with it (never echoing the password).
    package init(_ text: String) throws(ServerConfigurationError) {
        guard let components = URLComponents(string: text), let scheme = components.scheme?.lowercased(),
              scheme == "postgres" || scheme == "postgresql"
        else {
            throw ServerConfigurationError("database URL must look like postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE")
        }
        guard let host = components.host, !host.isEmpty else {
            throw ServerConfigurationError("database URL has no host (postgres://USER@HOST:PORT/DATABASE)")
        }
        guard let user = components.user, !user.isEmpty else {
            throw ServerConfigurationError("database URL has no user name (postgres://USER@\(host)/DATABASE)")
        }
        let database = String(components.path.drop(while: { $0 == "/" }))
        guard !database.isEmpty, !database.contains("/") else {
            throw ServerConfigurationError("database URL has no database name (postgres://\(user)@\(host)/DATABASE)")
        }
        if let port = components.port, !(1...65_535).contains(port) {
            throw ServerConfigurationError("database URL port must be between 1 and 65535")
        }
        var tls = TLSMode.prefer
        for item in components.queryItems ?? [] {
            switch item.name {
            case "sslmode":
                guard let value = item.value, let mode = TLSMode(rawValue: value) else {
                    throw ServerConfigurationError("database URL sslmode must be disable, prefer or require")
                }
                tls = mode
            default:
                throw ServerConfigurationError("database URL parameter '\(item.name)' is not supported (only sslmode)")
            }
        }
        self.host = host
        self.port = components.port ?? 5432
        self.username = user.removingPercentEncoding ?? user
        self.password = components.password.map { $0.removingPercentEncoding ?? $0 }
        self.database = database.removingPercentEncoding ?? database
        self.tls = tls
    }

    /// The whole URL, password included (to hand to another process; never log it).
    package var unredacted: String {
        var components = URLComponents()
        components.scheme = "postgres"
        components.user = username
        components.password = password
        components.host = host
        components.port = port
        components.path = "/" + database
        if tls != .prefer { components.queryItems = [URLQueryItem(name: "sslmode", value: tls.rawValue)] }
        return components.string ?? description
    }

    /// The URL without its password, for logs and errors.
    package var description: String {
        "postgres://\(username)\(password == nil ? "" : ":***")@\(host):\(port)/\(database)"
    }

    /// One connection's configuration (the reachability probe at start-up).
    func connectionConfiguration() throws -> PostgresConnection.Configuration {
        let mode: PostgresConnection.Configuration.TLS
        switch tls {
        case .disable: mode = .disable
        case .prefer: mode = .prefer(try NIOSSLContext(configuration: .makeClientConfiguration()))
        case .require: mode = .require(try NIOSSLContext(configuration: .makeClientConfiguration()))
        }
        var configuration = PostgresConnection.Configuration(host: host, port: port, username: username, password: password,
                                                             database: database, tls: mode)
        configuration.options.connectTimeout = .seconds(5)
        return configuration
    }

    /// PostgresNIO's client configuration for this URL.
    var clientConfiguration: PostgresClient.Configuration {
        let mode: PostgresClient.Configuration.TLS
        switch tls {
        case .disable: mode = .disable
        case .prefer: mode = .prefer(.makeClientConfiguration())
        case .require: mode = .require(.makeClientConfiguration())
        }
        var configuration = PostgresClient.Configuration(host: host, port: port, username: username, password: password,
                                                         database: database, tls: mode)
        configuration.options.connectTimeout = .seconds(5)
        configuration.options.maximumConnections = 16
        configuration.options.minimumConnections = 2
        // A node that dies or hangs inside a transaction must not hold the sequencer row (and
        // with it every node's publishes) for longer than this.
        configuration.options.additionalStartupParameters = [("idle_in_transaction_session_timeout", "30s")]
        return configuration
    }
}
