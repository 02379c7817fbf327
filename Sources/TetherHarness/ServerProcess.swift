import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A `tether serve` child process of this same binary: the harness's one out-of-process launcher
/// (tests start their server in process with TetherTestingServer's `InProcessServer`).
///
/// The first start listens on a free port; later starts reuse that port, so the chaos suite can
/// stop, kill and restart it like a production server. Standard error is appended to `logPath`.
final class ServerProcess: Sendable {
    private struct State {
        var process: Process?
        var port = 0
    }

    private let state = Mutex(State())
    /// The `serve` arguments after `--host` and `--port`.
    let arguments: [String]
    /// The subcommand run: `serve`, or `bench floor-server` (``BenchFloorServer``).
    let command: [String]
    /// The binary run: ``executablePath`` unless given.
    let executable: String
    /// Where the server's standard error goes (appended).
    let logPath: String

    /// The executable of this process (the same `tether` binary serves), or the one named by
    /// `TETHER_SERVER_BINARY` (to measure another build's server with this build's bench client).
    static var executablePath: String {
        if let path = ProcessInfo.processInfo.environment["TETHER_SERVER_BINARY"], !path.isEmpty { return path }
        return ownExecutablePath
    }

    /// A server process to be started with `tether serve --host 127.0.0.1 --port … <arguments>`
    /// (or `command` instead of `serve`, `executable` instead of ``executablePath``). The
    /// command must print `Tether listening on http://HOST:PORT` once it listens.
    init(arguments: [String], logPath: String, command: [String] = ["serve"], executable: String? = nil) {
        self.arguments = arguments
        self.logPath = logPath
        self.command = command
        self.executable = executable ?? Self.executablePath
    }

    /// This process's own binary, whatever `TETHER_SERVER_BINARY` says: for a subcommand that an
    /// older build given there may not have.
    static var ownExecutablePath: String {
        if let path = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") { return path }
        return URL(fileURLWithPath: CommandLine.arguments[0]).standardizedFileURL.path
    }

    /// `127.0.0.1:<port>` once started.
    var origin: String { "127.0.0.1:\(state.withLock { $0.port })" }

    /// The running child's process id.
    var pid: Int32? { state.withLock { $0.process?.processIdentifier } }

    /// Whether the process is running.
    var isRunning: Bool { state.withLock { $0.process?.isRunning ?? false } }

    /// Starts the server (on a free port the first time, the same port afterwards) and waits for
    /// its "listening" line; kills it when that line does not come within `timeout`.
    func start(timeout: Duration = .seconds(30)) async throws {
        let port = state.withLock { $0.port }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = command + ["--host", "127.0.0.1", "--port", String(port)] + arguments
        let out = Pipe()
        process.standardOutput = out
        process.standardInput = FileHandle.nullDevice
        if !FileManager.default.fileExists(atPath: logPath), !FileManager.default.createFile(atPath: logPath, contents: nil) {
            throw ServerProcessError("cannot create \(logPath)")
        }
        let log = try FileHandle(forWritingTo: URL(fileURLWithPath: logPath))
        log.seekToEndOfFile()
        process.standardError = log
        do {
            try process.run()
        } catch {
            throw ServerProcessError("cannot start \(executable) \(command.joined(separator: " ")): \(error)")
        }
        let pid = process.processIdentifier
        let watchdog = Task {
            try await Task.sleep(for: timeout)
            kill(pid, SIGKILL)
        }
        let listening: Int? = await withCheckedContinuation { continuation in
            // A plain thread: the read blocks.
            Thread.detachNewThread {
                var buffer = Data()
                while true {
                    let chunk = out.fileHandleForReading.availableData
                    if chunk.isEmpty { continuation.resume(returning: nil); return }
                    buffer.append(chunk)
                    let text = String(decoding: buffer, as: UTF8.self)
                    if let line = text.split(separator: "\n").first(where: { $0.hasPrefix("Tether listening on ") }),
                       let colon = line.lastIndex(of: ":"), let value = Int(line[line.index(after: colon)...].filter(\.isNumber)) {
                        continuation.resume(returning: value)
                        // Keep draining so the child never blocks on a full pipe.
                        while !out.fileHandleForReading.availableData.isEmpty {}
                        return
                    }
                }
            }
        }
        watchdog.cancel()
        guard let listening else {
            kill(pid, SIGKILL)
            process.waitUntilExit()
            let tail = ((try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "").suffix(4000)
            throw ServerProcessError("tether \(command.joined(separator: " ")) exited with status \(process.terminationStatus) before listening; its log (\(logPath)):\n\(tail)")
        }
        state.withLock {
            $0.process = process
            $0.port = listening
        }
    }

    /// Sends `signal` and waits for the process to exit (SIGKILL after `grace`).
    func stop(signal: Int32 = SIGTERM, grace: Duration = .seconds(10)) async {
        guard let process = state.withLock({ $0.process }), process.isRunning else { return }
        kill(process.processIdentifier, signal)
        let deadline = ContinuousClock.now + grace
        while process.isRunning && ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(20)) }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        while process.isRunning { try? await Task.sleep(for: .milliseconds(20)) }
        state.withLock { $0.process = nil }
    }
}

/// Why a `tether serve` child could not be started.
struct ServerProcessError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
