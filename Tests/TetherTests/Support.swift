import Foundation
import Logging
@testable import Tether
import TetherTesting

/// A client for tests: plain HTTP to `origin` unless `tls`.
func makeClient(origin: String, tls: Bool = false, userId: String = "tester", cryptoModule: CryptoModule? = nil,
                secretKey: String? = nil, configure: (inout TetherConfiguration) -> Void = { _ in }) throws -> TetherClient {
    var logger = Logger(label: "tether.test.client")
    logger.logLevel = .warning
    var configuration = try TetherConfiguration(subscribeKey: "demo", publishKey: "demo", secretKey: secretKey, userId: userId,
                                                origin: origin, useTLS: tls, logger: logger)
    configuration.cryptoModule = cryptoModule
    configuration.nonSubscribeTimeout = .seconds(10)
    configure(&configuration)
    return try TetherClient(configuration: configuration)
}

/// Runs `body` expecting a `TetherError`; returns its status (records an issue when it succeeds).
func failure<T>(_ body: () async throws -> T) async -> Status? {
    do {
        _ = try await body()
        return nil
    } catch let error as TetherError {
        return error.status
    } catch {
        return Status(category: .unknown, operation: .time, error: error, serverMessage: "not a TetherError: \(error)")
    }
}


func unique(_ prefix: String = "ch") -> String { "\(prefix)-\(UUID().uuidString.prefix(8))" }
