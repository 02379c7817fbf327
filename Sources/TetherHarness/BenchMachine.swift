import Foundation

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
        guard let text = try? String(contentsOfFile: path, encoding: .utf8), let used = cpuTicks(statLine: text) else { return nil }
        let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
        return Double(used) / (ticks > 0 ? ticks : 100)
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
