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

/// Polls `condition` until it holds or `seconds` pass — only for state another party owns and
/// announces to nobody (a loopback server's socket count, a child process's readiness). The
/// client's own progress is awaited directly: its status, connection and message streams, an
/// ``ObservedTransport``'s events, a ``ManualClock``'s sleepers.
func eventually(within seconds: Double = 10, _ condition: () async throws -> Bool) async rethrows -> Bool {
    let deadline = ContinuousClock.now + .milliseconds(Int(seconds * 1000))
    while ContinuousClock.now < deadline {
        if try await condition() { return true }
        try? await Task.sleep(for: .milliseconds(20))
    }
    return try await condition()
}

func unique(_ prefix: String = "ch") -> String { "\(prefix)-\(UUID().uuidString.prefix(8))" }
