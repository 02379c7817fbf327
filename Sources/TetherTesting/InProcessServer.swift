import Foundation
public import Logging
public import TetherServer

/// A real Tether server running inside the test process on a loopback port, with its own
/// SQLite file in a temporary directory.
///
/// ```swift
/// let server = try await InProcessServer.start()
/// defer { Task { await server.stop() } }   // or `await server.stop()` at the end of the test
/// configuration.origin = server.origin
/// ```
public struct InProcessServer: Sendable {
    /// The running server.
    public let server: TetherServer
    /// `http://127.0.0.1:<port>`.
    public let baseURL: String
    /// `127.0.0.1:<port>`, ready for `TetherConfiguration.origin`.
    public let origin: String
    /// The data directory (removed by ``stop(removingData:)``).
    public let directory: String
    private let task: Task<Void, any Error>

    /// Starts a server on `127.0.0.1`, port 0 (a free port), and waits until it listens.
    public static func start(file: ConfigurationFile = ConfigurationFile(subscribeTimeoutSeconds: 30), directory: String? = nil,
                             logLevel: Logger.Level = .warning) async throws -> InProcessServer {
        let directory = directory ?? FileManager.default.temporaryDirectory
            .appendingPathComponent("tether-testing-\(UUID().uuidString)").path
        var logger = Logger(label: "tether.testing.server")
        logger.logLevel = logLevel
        let server = try TetherServer(configuration: ServerConfiguration(host: "127.0.0.1", port: 0, dataDirectory: directory, file: file),
                                      logger: logger)
        let (urls, continuation) = AsyncStream.makeStream(of: String.self)
        let task = Task {
            defer { continuation.finish() }
            try await server.run(handleSignals: false) { url in continuation.yield(url) }
        }
        var iterator = urls.makeAsyncIterator()
        guard let url = await iterator.next() else {
            _ = await task.result
            throw InProcessServerError.didNotStart
        }
        let origin = String(url.dropFirst("http://".count))
        return InProcessServer(server: server, baseURL: url, origin: origin, directory: directory, task: task)
    }

    /// Stops the server, waits until it has closed its store, and by default removes its data.
    public func stop(removingData: Bool = true) async {
        task.cancel()
        _ = await task.result
        if removingData { try? FileManager.default.removeItem(atPath: directory) }
    }
}

/// Why ``InProcessServer/start(file:directory:logLevel:)`` failed.
public enum InProcessServerError: Error, Sendable {
    /// The server exited before it started listening.
    case didNotStart
}
