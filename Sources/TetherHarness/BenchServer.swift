import Dispatch
import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The server a bench run measures: a ``ServerProcess`` on its own temporary data directory,
/// with the rate limits off, removed again by ``stop()`` or when the bench is interrupted.
final class BenchServer {
    /// The server's URL.
    let target: BenchTarget
    /// The child's process id.
    let pid: Int32
    private let process: ServerProcess
    private let directory: URL
    private var stopped = false

    /// Starts `tether serve --port 0` and waits for its "listening" line; with `floor`, this
    /// binary's `tether bench floor-server` instead (``BenchFloorServer``; the other arguments
    /// are not used).
    init(subscribeTimeout: Int = 300, extraArguments: [String] = [], floor: Bool = false) async throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-bench-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let logPath = directory.appendingPathComponent("server.log").path
        process = floor
            ? ServerProcess(arguments: [], logPath: logPath, command: ["bench", "floor-server"], executable: ServerProcess.ownExecutablePath)
            : ServerProcess(
                arguments: [
                    "--data-dir", directory.appendingPathComponent("data").path,
                    "--log-level", "warning", "--subscribe-timeout", String(subscribeTimeout),
                    // Throughput is measured from one address; the default rate limits would cap it.
                    "--rate-limits", "off",
                ] + extraArguments,
                logPath: logPath)
        do {
            try await process.start()
        } catch {
            try? FileManager.default.removeItem(at: directory)
            throw BenchError("the spawned server did not start: \(error)")
        }
        guard let pid = process.pid, let target = BenchTarget(url: "http://" + process.origin) else {
            await process.stop(signal: SIGKILL)
            try? FileManager.default.removeItem(at: directory)
            throw BenchError("the spawned server did not start")
        }
        self.pid = pid
        self.target = target
        Self.register(pid: pid, directory: directory.path)
    }

    /// Servers started and not yet stopped (pid → temporary directory), for the signal handler.
    private static let running = Mutex<[Int32: String]>([:])
    /// The SIGINT/SIGTERM sources, once installed.
    private static let signalSources = Mutex<[any DispatchSourceSignal]>([])

    private static func register(pid: Int32, directory: String) {
        running.withLock { $0[pid] = directory }
        installSignalHandlers()
    }

    /// On SIGINT or SIGTERM, stops every spawned server, removes its directory and exits, so an
    /// interrupted bench leaves nothing behind.
    private static func installSignalHandlers() {
        signalSources.withLock { sources in
            guard sources.isEmpty else { return }
            for signalNumber in [SIGINT, SIGTERM] {
                signal(signalNumber, SIG_IGN)
                let source = DispatchSource.makeSignalSource(signal: signalNumber, queue: .global())
                source.setEventHandler {
                    let servers = running.withLock { $0 }
                    for pid in servers.keys { kill(pid, SIGTERM) }
                    let deadline = Date().addingTimeInterval(10)
                    while Date() < deadline, servers.keys.contains(where: { kill($0, 0) == 0 && !isZombie($0) }) {
                        usleep(50_000)
                    }
                    for (pid, directory) in servers {
                        if kill(pid, 0) == 0 && !isZombie(pid) { kill(pid, SIGKILL) }
                        try? FileManager.default.removeItem(atPath: directory)
                    }
                    FileHandle.standardError.write(Data("[bench] interrupted; spawned servers stopped\n".utf8))
                    exit(128 + signalNumber)
                }
                source.resume()
                sources.append(source)
            }
        }
    }

    /// Whether `pid` has exited but was not reaped yet.
    private static func isZombie(_ pid: Int32) -> Bool {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = text.lastIndex(of: ")")
        else { return false }
        return text[text.index(after: close)...].dropFirst().first == "Z"
    }

    /// The server's resident set size in KiB (`VmRSS` of /proc/<pid>/status), Linux only.
    func residentKiB() -> Int? { BenchMachine.statusField("VmRSS", pid: pid) }

    /// Stops the server (SIGTERM, then SIGKILL after 10 s) and removes its data directory.
    func stop() async {
        guard !stopped else { return }
        stopped = true
        defer { _ = Self.running.withLock { $0.removeValue(forKey: pid) } }
        await process.stop()
        try? FileManager.default.removeItem(at: directory)
    }
}
