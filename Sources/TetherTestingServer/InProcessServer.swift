import Foundation
public import Logging
public import TetherServer

/// A real Tether server running inside the test process on a loopback port, with its own
/// SQLite file in a temporary directory. The one in-process launcher: client end-to-end tests,
/// server tests and tools all start their server through it (`tether serve` child processes
/// are started by TetherHarness's `ServerProcess`).
///
/// ```swift
/// let server = try await InProcessServer.start()
/// defer { Task { await server.stop() } }   // or `await server.stop()` at the end of the test
/// configuration.origin = server.origin
/// ```
public struct InProcessServer: Sendable {
    /// The running server.
    public let server: TetherServer
    /// `http://127.0.0.1:<port>` (`https://` with TLS).
    public let baseURL: String
    /// `127.0.0.1:<port>`, ready for `TetherConfiguration.origin`.
    public let origin: String
    /// The port it listens on (pass it to ``start(port:file:directory:tls:clock:logLevel:webSocket:adminSecret:databaseURL:)`` to
    /// restart on the same one).
    public var port: Int { Int(origin.split(separator: ":").last ?? "") ?? 0 }
    /// The data directory (removed by ``stop(removingData:)``).
    public let directory: String
    private let task: Task<Void, any Error>

    /// Starts a server on `127.0.0.1` and waits until it listens.
    ///
    /// - Parameters:
    ///   - port: the port; 0 (the default) picks a free one outside the system's ephemeral port
    ///     range, which a restart can count on getting again. Pass the port of a stopped server
    ///     to restart it where its clients expect it.
    ///   - file: the server's settings.
    ///   - directory: its data directory; a new temporary one when `nil`. Pass the directory of
    ///     a stopped server (stopped with `removingData: false`) to restart on the same store.
    ///   - tls: the PEM certificate chain and private key to serve HTTPS with; plain HTTP when `nil`.
    ///   - clock: the server's clock (a manual clock drives presence timeouts without waiting).
    ///   - logLevel: the server's log level.
    ///   - webSocket: the WebSocket session endpoint's settings (keep-alive, pings, bounds).
    ///   - adminSecret: turns on the console and admin API (docs/console.md); `nil` leaves the file's `adminSecret`.
    ///   - databaseURL: a `postgres://` URL: the server is one node of a cluster on that database.
    public static func start<C: Clock>(port: Int = 0, file: ConfigurationFile = ConfigurationFile(subscribeTimeoutSeconds: 30),
                                       directory: String? = nil,
                                       tls: (certificatePath: String, privateKeyPath: String)? = nil, clock: C = ContinuousClock(),
                                       logLevel: Logger.Level = .warning,
                                       webSocket: WebSocketSettings = .init(),
                                       adminSecret: String? = nil,
                                       databaseURL: String? = nil) async throws -> InProcessServer where C.Duration == Duration {
        let directory = directory ?? FileManager.default.temporaryDirectory
            .appendingPathComponent("tether-testing-\(UUID().uuidString)").path
        // A port picked here may be in use by another process or test: another one is tried, on
        // the same data directory. A port asked for is tried once.
        var attempts = 0
        while true {
            attempts += 1
            do {
                return try await launch(port: port == 0 ? pickedPorts.randomElement()! : port, file: file, directory: directory, tls: tls,
                                        clock: clock, logLevel: logLevel, webSocket: webSocket, adminSecret: adminSecret,
                                        databaseURL: databaseURL)
            } catch InProcessServerError.didNotStart where port == 0 && attempts < 8 {
                continue
            }
        }
    }

    /// Where a server started without a port listens: outside the system's ephemeral port range
    /// (`/proc/sys/net/ipv4/ip_local_port_range` on Linux; 32768–60999 when it cannot be read),
    /// below it, or above it when it starts too low to leave room. A port the kernel picked from
    /// that range (port 0) could be given, once its server stopped, to an outgoing connection of
    /// a test running in parallel, and the server restarted on it would fail to listen; a port
    /// outside the range never is. (A range covering 10000–65535 leaves no such room; the ports
    /// are then picked from 10000–32767 all the same.)
    static let pickedPorts: ClosedRange<Int> = {
        let bounds = (try? String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8))?
            .split(whereSeparator: \.isWhitespace).compactMap { Int($0) }
        let (low, high) = bounds.flatMap { $0.count == 2 ? ($0[0], $0[1]) : nil } ?? (32768, 60999)
        if low > 11_000 { return 10_000...(low - 1) }
        if high < 64_535 { return (high + 1)...65_535 }
        return 10_000...32_767
    }()

    private static func launch<C: Clock>(port: Int, file: ConfigurationFile, directory: String,
                                         tls: (certificatePath: String, privateKeyPath: String)?, clock: C, logLevel: Logger.Level,
                                         webSocket: WebSocketSettings, adminSecret: String?,
                                         databaseURL: String?) async throws -> InProcessServer where C.Duration == Duration {
        var logger = Logger(label: "tether.testing.server")
        logger.logLevel = logLevel
        var configuration = ServerConfiguration(host: "127.0.0.1", port: port, dataDirectory: directory, file: file, tls: tls)
        configuration.webSocket = webSocket
        if let adminSecret { configuration.adminSecret = adminSecret }
        let server: TetherServer
        if let databaseURL {
            // One node of a cluster on that database (docs/operations.md).
            let shared = try await SharedLog.open(DatabaseURL(databaseURL), logger: logger, metrics: ServerMetrics())
            server = try TetherServer(configuration: configuration, logger: logger, registry: nil, clock: clock, shared: shared)
        } else {
            server = try TetherServer(configuration: configuration, logger: logger, clock: clock)
        }
        let (urls, continuation) = AsyncStream.makeStream(of: String.self)
        let task = Task {
            defer { continuation.finish() }
            try await server.run(handleSignals: false) { url in continuation.yield(url) }
        }
        var iterator = urls.makeAsyncIterator()
        guard let url = await iterator.next() else {
            // Why, for the test's log (a port asked for again may have been taken meanwhile).
            if case .failure(let error) = await task.result {
                logger.error("in-process server did not start", metadata: ["port": "\(port)", "error": "\(error)"])
            }
            throw InProcessServerError.didNotStart
        }
        let origin = String(url.split(separator: "://", maxSplits: 1).last ?? "")
        return InProcessServer(server: server, baseURL: url, origin: origin, directory: directory, task: task)
    }

    /// Stops the server gracefully (``TetherServer/shutdown()``, as SIGTERM does: waiting
    /// long-polls are answered), waits until it has closed its store, and by default removes its
    /// data.
    public func stop(removingData: Bool = true) async {
        await server.shutdown()
        _ = await task.result
        if removingData { try? FileManager.default.removeItem(atPath: directory) }
    }
}

/// Why ``InProcessServer/start(port:file:directory:tls:clock:logLevel:webSocket:adminSecret:databaseURL:)`` failed.
public enum InProcessServerError: Error, Sendable {
    /// The server exited before it started listening.
    case didNotStart
}
