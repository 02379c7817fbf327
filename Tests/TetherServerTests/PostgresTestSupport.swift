import Foundation
import Logging
import Synchronization
import Testing
@_spi(Benchmarks) import TetherProtocol
@_spi(Benchmarks) import TetherServerCore
@testable import TetherServer

/// The PostgreSQL the cluster tests run against: `TETHER_TEST_DATABASE_URL` names a server
/// (`scripts/test` starts one: initdb in a temporary directory, a loopback port). Every test
/// gets a database of its own, dropped afterwards. Without the variable the tests are skipped,
/// and say why.
enum TestPostgres {
    static let server: DatabaseURL? = ProcessInfo.processInfo.environment["TETHER_TEST_DATABASE_URL"]
        .flatMap { $0.isEmpty ? nil : try? DatabaseURL($0) }
    static var available: Bool { server != nil }

    static var logger: Logger {
        var logger = Logger(label: "tether.test.postgres")
        logger.logLevel = .critical
        return logger
    }

    /// Runs `body` with the URL of a fresh, empty database.
    static func withDatabase(_ body: (DatabaseURL) async throws -> Void) async throws {
        let server = try #require(server)
        let url = try await DatabaseAdmin.createDatabase(on: server)
        do {
            try await body(url)
        } catch {
            try? await DatabaseAdmin.dropDatabase(url, on: server)
            throw error
        }
        try await DatabaseAdmin.dropDatabase(url, on: server)
    }

    /// Opens a log on `url` (migrating it) with a test clock.
    static func open(_ url: DatabaseURL, options: SharedLogOptions = .init(),
                     clock: @escaping @Sendable () -> Timetoken = LongPollHub.systemNow) async throws -> SharedLog {
        try await SharedLog.open(url, options: options, logger: logger, metrics: ServerMetrics(), clock: clock)
    }
}

/// A shared log with its writer and reader running, and what its reader delivered.
final class RunningLog: Sendable {
    let log: SharedLog
    /// Every event the reader delivered, in delivery order, with the horizon of its batch.
    let delivered = Mutex<[(event: BufferedEvent, horizon: Timetoken)]>([])
    /// Control entries the reader delivered, in order, with their timetokens.
    let controls = Mutex<[(control: SharedControl, at: Timetoken)]>([])
    /// Horizons of every delivery, in order.
    let horizons = Mutex<[Timetoken]>([])
    private let tasks = Mutex<[Task<Void, Never>]>([])

    init(_ log: SharedLog) {
        self.log = log
        let writer = Task { await log.runWriter() }
        let reader = Task { [self] in
            await log.runReader { entries, horizon in
                self.delivered.withLock { all in
                    for case .event(let event) in entries { all.append((event, horizon)) }
                }
                self.controls.withLock { all in
                    for case .control(let control, let at) in entries { all.append((control, at)) }
                }
                self.horizons.withLock { $0.append(horizon) }
            }
        }
        tasks.withLock { $0 = [writer, reader] }
    }

    var timetokens: [Timetoken] { delivered.withLock { $0.map(\.event.timetoken) } }

    /// Waits (at most `seconds`) until the reader has delivered `count` events.
    func waitForDeliveries(_ count: Int, within seconds: Double = 20) async -> Bool {
        let deadline = ContinuousClock.now + .seconds(seconds)
        while ContinuousClock.now < deadline {
            if delivered.withLock({ $0.count }) >= count { return true }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return delivered.withLock { $0.count } >= count
    }

    func stop() async {
        log.finish()
        let all = tasks.withLock { $0 }
        _ = await all[0].value
        all[1].cancel()
        log.close()
        _ = await all[1].value
    }
}

extension SharedLogOptions {
    /// A write timeout of a minute: for tests of limits under contention, whose changes take
    /// turns on one lock however slow the machine is.
    static var patient: SharedLogOptions {
        var options = SharedLogOptions()
        options.writeTimeout = .seconds(60)
        return options
    }
}
