import Dispatch
import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A `tether serve` child process with its own temporary data directory, started by the bench.
final class SpawnedServer {
    /// The server's URL.
    let target: BenchTarget
    /// The child's process id.
    let pid: Int32
    private let process: Process
    private let stdoutPipe: Pipe
    private let directory: URL
    private var stopped = false

    /// The executable of this process (the same `tether` binary serves).
    static var executablePath: String {
        if let path = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") { return path }
        return URL(fileURLWithPath: CommandLine.arguments[0]).standardizedFileURL.path
    }

    /// Starts `tether serve --port 0` and waits for its "listening" line.
    init(subscribeTimeout: Int = 300, extraArguments: [String] = []) async throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-bench-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let logPath = directory.appendingPathComponent("server.log").path
        guard FileManager.default.createFile(atPath: logPath, contents: nil) else {
            throw BenchError("cannot create \(logPath)")
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: Self.executablePath)
        process.arguments = [
            "serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", directory.appendingPathComponent("data").path,
            "--log-level", "warning", "--subscribe-timeout", String(subscribeTimeout),
            // Throughput is measured from one address; the default rate limits would cap it.
            "--rate-limits", "off",
        ] + extraArguments
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = FileHandle(forWritingAtPath: logPath)
        process.standardInput = FileHandle.nullDevice
        do {
            try process.run()
        } catch {
            try? FileManager.default.removeItem(at: directory)
            throw BenchError("cannot start \(Self.executablePath) serve: \(error)")
        }
        self.process = process
        self.stdoutPipe = pipe
        self.pid = process.processIdentifier

        // Read the ready line on a plain thread; kill the child if it takes too long.
        let handle = pipe.fileHandleForReading
        let pid = process.processIdentifier
        let watchdog = Task {
            try await Task.sleep(for: .seconds(30))
            kill(pid, SIGKILL)
        }
        let line: String? = await withCheckedContinuation { continuation in
            Thread.detachNewThread {
                var bytes: [UInt8] = []
                while true {
                    let chunk = handle.availableData
                    if chunk.isEmpty { break }
                    bytes.append(contentsOf: chunk)
                    if bytes.contains(UInt8(ascii: "\n")) { break }
                }
                let text = String(decoding: bytes, as: UTF8.self)
                continuation.resume(returning: text.split(separator: "\n").first.map(String.init))
            }
        }
        watchdog.cancel()
        let prefix = "Tether listening on "
        guard let line, line.hasPrefix(prefix), let target = BenchTarget(url: String(line.dropFirst(prefix.count))) else {
            let log = (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? ""
            kill(pid, SIGKILL)
            process.waitUntilExit()
            try? FileManager.default.removeItem(at: directory)
            throw BenchError("the spawned server did not start (got \(String(reflecting: line))); its log:\n\(log)")
        }
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
        if process.isRunning {
            kill(pid, SIGTERM)
            let deadline = ContinuousClock.now + .seconds(10)
            while process.isRunning && ContinuousClock.now < deadline {
                try? await Task.sleep(for: .milliseconds(50))
            }
            if process.isRunning {
                kill(pid, SIGKILL)
                while process.isRunning { try? await Task.sleep(for: .milliseconds(20)) }
            }
        }
        try? stdoutPipe.fileHandleForReading.close()
        try? FileManager.default.removeItem(at: directory)
    }
}

/// Facts about the machine and build a measurement was taken on.
struct BenchMachine: Codable, Sendable {
    /// Online CPUs.
    var cpus: Int
    /// CPU model name, if known.
    var cpuModel: String?
    /// Total memory in MiB, if known.
    var memoryMiB: Int?
    /// Kernel release.
    var kernel: String
    /// `debug` or `release`.
    var build: String
    /// When the run started (ISO 8601).
    var date: String

    /// Describes this machine and build.
    static func current() -> BenchMachine {
        #if DEBUG
        let build = "debug"
        #else
        let build = "release"
        #endif
        var cpuModel: String?
        if let text = try? String(contentsOfFile: "/proc/cpuinfo", encoding: .utf8),
           let line = text.split(separator: "\n").first(where: { $0.hasPrefix("model name") }),
           let colon = line.firstIndex(of: ":") {
            cpuModel = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        var memory: Int?
        if let text = try? String(contentsOfFile: "/proc/meminfo", encoding: .utf8),
           let line = text.split(separator: "\n").first(where: { $0.hasPrefix("MemTotal:") }) {
            memory = Int(line.split(separator: " ").dropFirst().first ?? "").map { $0 / 1024 }
        }
        var name = utsname()
        uname(&name)
        let kernel = withUnsafeBytes(of: &name.release) { raw in
            String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
        }
        return BenchMachine(cpus: ProcessInfo.processInfo.activeProcessorCount, cpuModel: cpuModel, memoryMiB: memory,
                            kernel: kernel, build: build, date: ISO8601DateFormatter().string(from: Date()))
    }

    /// A numeric field in KiB of /proc/<pid>/status (`VmRSS`, `RssAnon`, …).
    static func statusField(_ name: String, pid: Int32) -> Int? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix(name + ":") {
            return line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first.flatMap { Int($0) }
        }
        return nil
    }

    /// CPU time (user + system) a process has used, in seconds, from /proc/<pid>/stat; `nil`
    /// for `pid` reads this process.
    static func cpuSeconds(pid: Int32?) -> Double? {
        let path = pid.map { "/proc/\($0)/stat" } ?? "/proc/self/stat"
        guard let text = try? String(contentsOfFile: path, encoding: .utf8),
              let close = text.lastIndex(of: ")")
        else { return nil }
        // Fields after "(comm)": state is field 3, utime 14, stime 15.
        let fields = text[text.index(after: close)...].split(separator: " ")
        guard fields.count > 13, let user = Double(fields[11]), let system = Double(fields[12]) else { return nil }
        let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
        return (user + system) / (ticks > 0 ? ticks : 100)
    }

    /// Busy CPU time of the whole machine from /proc/stat, in seconds: `busy` is user, nice,
    /// system, irq, softirq and steal; `interrupts` is irq plus softirq (loopback networking is
    /// mostly accounted there rather than to a process).
    static func machineCPUSeconds() -> (busy: Double, interrupts: Double)? {
        guard let text = try? String(contentsOfFile: "/proc/stat", encoding: .utf8),
              let line = text.split(separator: "\n").first(where: { $0.hasPrefix("cpu ") })
        else { return nil }
        let values = line.split(separator: " ").dropFirst().compactMap { Double($0) }
        guard values.count >= 8 else { return nil }
        let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
        let hz = ticks > 0 ? ticks : 100
        // user nice system idle iowait irq softirq steal
        let busy = values[0] + values[1] + values[2] + values[5] + values[6] + values[7]
        return (busy / hz, (values[5] + values[6]) / hz)
    }

    /// Raises the soft open-file limit towards `wanted` (at most the hard limit); returns the
    /// resulting soft limit. Children started afterwards inherit it.
    static func raiseOpenFileLimit(to wanted: Int) -> Int {
        var limit = rlimit()
        #if canImport(Glibc)
        let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
        #else
        let resource = RLIMIT_NOFILE
        #endif
        guard getrlimit(resource, &limit) == 0 else { return 0 }
        let target = min(rlim_t(wanted), limit.rlim_max)
        if limit.rlim_cur < target {
            limit.rlim_cur = target
            _ = setrlimit(resource, &limit)
            _ = getrlimit(resource, &limit)
        }
        return Int(clamping: limit.rlim_cur)
    }
}
