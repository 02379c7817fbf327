import Foundation
import NIOCore
import Synchronization
import TetherProtocol
import TetherServerCore
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// `tether bench --scenario recorder` and `--scenario console-cost`: what the console's flight
// recorder costs the server (issue #20: under 2 % of publish throughput with nobody watching).
// docs/benchmarks.md, "The console's flight recorder".

/// The recorder's own cost, measured directly: the console's hooks driven in a tight loop on one
/// thread, timed in that thread's CPU time.
struct RecorderCostResult: Codable, Sendable {
    /// Distinct uuids the loop cycles through (each with its own ring and summary).
    var clients: Int
    /// Subscribe cycles (a long-poll's start and end) per publish: the fan-out's subscribers.
    var cyclesPerPublish: Int
    /// Publish-equivalents per repetition.
    var iterations: Int
    /// Repetitions of each variant; the figures are their medians.
    var repetitions: Int
    /// Hook calls per publish-equivalent: one publish plus a start and an end per cycle.
    var hooksPerPublish: Int { 1 + 2 * cyclesPerPublish }
    /// Console on: median thread CPU ns per publish-equivalent, and every repetition's figure.
    var onNanosPerPublish: Double
    var onRepetitions: [Double]
    /// Console off (the hooks are `nil`, as in the server without an admin secret).
    var offNanosPerPublish: Double
    var offRepetitions: [Double]
    /// What the recorder adds per publish-equivalent (on − off, ns).
    var costNanosPerPublish: Double { onNanosPerPublish - offNanosPerPublish }
    /// What it adds per hook call (ns).
    var costNanosPerHook: Double { costNanosPerPublish / Double(hooksPerPublish) }
    /// Uuids in the recorder at the end of the last repetition (at most its bound).
    var recordedClients: Int
}

/// The console off/on comparison on whole servers: alternating fan-out runs with server CPU per
/// publish, plus the recorder's direct cost and the overhead fraction they give.
struct ConsoleCostResult: Codable, Sendable {
    /// Subscribers per run (each a uuid of its own: that many recorded cycles per delivery round).
    var subscribers: Int
    var publishers: Int
    /// The open-loop publish rate (`--fanout-rate`), or `nil` for closed-loop publishers.
    var rate: Int?
    var stored: Bool
    var seconds: Double
    /// Runs with the console off and on; round `i`'s pair is `off[i]`, `on[i]`.
    var off: [FanoutResult]
    var on: [FanoutResult]
    /// Server CPU µs per acknowledged publish: on − off per round.
    var cpuDifference: PairedDifference?
    /// Publishes/s: on − off per round.
    var throughputDifference: PairedDifference?
    /// The recorder's direct cost (the `recorder` scenario with the same subscribers per publish).
    var recorder: RecorderCostResult
    /// Median server CPU µs per publish with the console off.
    var offMicrosPerPublish: Double?
    /// The recorder's cost per publish-equivalent ÷ the server's CPU per publish, console off (%):
    /// a bound, since it counts a subscribe cycle per subscriber for every publish.
    var overheadPercent: Double? {
        offMicrosPerPublish.map { recorder.costNanosPerPublish / 1_000 / $0 * 100 }
    }
    /// Subscribe cycles per publish the runs actually made (long-poll answers after the
    /// handshakes ÷ publishes, median over all runs): under load an answer carries several messages.
    var observedCyclesPerPublish: Double? {
        let values = (off + on).filter { $0.published > 0 }.map {
            Double(max(0, $0.subscribeResponses - $0.subscribers)) / Double($0.published)
        }
        return values.isEmpty ? nil : PairedDifference.median(values)
    }
    /// The overhead with the cycles the runs made (the publish hook counted with the cycles: an over-estimate).
    var observedOverheadPercent: Double? {
        guard let offMicrosPerPublish, let cycles = observedCyclesPerPublish, recorder.cyclesPerPublish > 0 else { return nil }
        return recorder.costNanosPerPublish / Double(recorder.cyclesPerPublish) * cycles / 1_000 / offMicrosPerPublish * 100
    }
}

/// Mean, median and 95 % confidence interval of paired differences (`b − a` per pair), with the
/// Student t quantile for `n − 1` degrees of freedom. Pure, for the bench's A/B comparisons.
struct PairedDifference: Codable, Sendable, Equatable {
    var pairs: Int
    var mean: Double
    var median: Double
    /// Sample standard deviation of the differences (0 for one pair).
    var standardDeviation: Double
    /// The 95 % confidence interval of the mean difference (`nil` bounds for one pair).
    var low: Double?
    var high: Double?
    /// Mean of the `a` values, for expressing the difference in percent.
    var baseline: Double

    /// `nil` without pairs.
    init?(a: [Double], b: [Double]) {
        let n = min(a.count, b.count)
        guard n > 0 else { return nil }
        let differences = (0..<n).map { b[$0] - a[$0] }
        pairs = n
        mean = differences.reduce(0, +) / Double(n)
        median = Self.median(differences)
        baseline = a.prefix(n).reduce(0, +) / Double(n)
        if n > 1 {
            let m = mean
            let variance = differences.reduce(0) { $0 + ($1 - m) * ($1 - m) } / Double(n - 1)
            standardDeviation = variance.squareRoot()
            let half = Self.t975(degreesOfFreedom: n - 1) * standardDeviation / Double(n).squareRoot()
            low = mean - half
            high = mean + half
        } else {
            standardDeviation = 0
        }
    }

    /// The median of `values` (the mean of the middle two for an even count); 0 when empty.
    static func median(_ values: [Double]) -> Double {
        let sorted = values.sorted()
        guard !sorted.isEmpty else { return 0 }
        let middle = sorted.count / 2
        return sorted.count % 2 == 1 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2
    }

    /// The 97.5th percentile of Student's t distribution (two-sided 95 %).
    static func t975(degreesOfFreedom df: Int) -> Double {
        let table: [Double] = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                               2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                               2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]
        if df >= 1 && df <= table.count { return table[df - 1] }
        if df <= 40 { return 2.021 }
        if df <= 60 { return 2.000 }
        if df <= 120 { return 1.980 }
        return 1.960
    }
}

extension FanoutResult {
    /// The server's CPU (user + system, first publish to last delivery) per acknowledged
    /// publish, in µs; spawned servers only.
    var serverMicrosPerPublish: Double? {
        guard let perDelivery = serverMicrosPerDelivery, published > 0 else { return nil }
        return perDelivery * Double(deliveries) / Double(published)
    }
}

extension BenchMachine {
    /// utime + stime in clock ticks from the text of /proc/<pid>/stat; the command name in
    /// parentheses may hold spaces and parentheses, so fields are counted after the last `)`.
    static func cpuTicks(statLine text: String) -> UInt64? {
        guard let close = text.lastIndex(of: ")") else { return nil }
        // Fields after "(comm)": state is field 3, utime 14, stime 15.
        let fields = text[text.index(after: close)...].split(separator: " ", omittingEmptySubsequences: true)
        guard fields.count > 12, let user = UInt64(fields[11]), let system = UInt64(fields[12]) else { return nil }
        return user + system
    }

    /// This thread's CPU time in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`).
    static func threadCPUNanoseconds() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &time)
        return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
    }
}

/// A stand-in for a long-poll's NIO channel: the recording keeps one per open long-poll.
private final class StandInConnection: Sendable {}

/// The console's hook shell as `AdminConsole` (TetherServer) has it: the address formatted, a
/// clock read, one lock around the shared ``ConsoleRecording`` call, and relaxed atomics for the
/// counters. The recording, recorder, rings and histogram are the server's own code.
private final class RecorderHooks: Sendable {
    let recording: Mutex<ConsoleRecording>
    let publishes = Atomic<Int>(0)
    let deliveries = Atomic<Int>(0)

    init() { recording = Mutex(ConsoleRecording(recorder: ConnectionRecorder())) }

    /// As `AdminConsole.now()`.
    static func now() -> Int64 {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        return Int64(time.tv_sec) * 1_000 + Int64(time.tv_nsec) / 1_000_000
    }

    /// As `AdminConsole.text(of:)`.
    static func text(of address: SocketAddress?) -> String {
        switch address {
        // sockaddr_in: family and port (2 bytes each), then the address, in network byte order.
        case .v4(let v4):
            withUnsafeBytes(of: v4.address) {
                ConsoleRecording.ipv4Text(networkOrder: $0.loadUnaligned(fromByteOffset: 4, as: UInt32.self))
            }
        case let other?: other.ipAddress ?? "unknown"
        case nil: "unknown"
        }
    }

    func published() { publishes.add(1, ordering: .relaxed) }

    func longPollBegan(uuid: String?, subscribeKey: String, address: SocketAddress?, channels: [String], groups: [String],
                       cursor: Timetoken, connection: StandInConnection?) {
        guard let uuid else { return }
        let address = Self.text(of: address)
        let now = Self.now()
        recording.withLock {
            $0.longPollBegan(uuid: uuid, subscribeKey: subscribeKey, address: address, channels: channels, groups: groups,
                             cursor: cursor, connection: connection, now: now)
        }
    }

    func longPollEnded(uuid: String?, connection: StandInConnection, delivered: Int, cursor: Timetoken) {
        if delivered > 0 { deliveries.add(delivered, ordering: .relaxed) }
        let now = Self.now()
        recording.withLock {
            $0.longPollEnded(uuid: uuid, connection: connection, delivered: delivered, gaps: 0, cursor: cursor, now: now)
        }
    }

    var recorded: Int { recording.withLock { $0.recorder.count } }
}

/// What the server holds: the console, or `nil` when it is off.
private final class HookSite: Sendable {
    let console: RecorderHooks?
    init(console: RecorderHooks?) { self.console = console }
}

/// One simulated long-poll client.
private struct SimulatedClient {
    var uuid: String
    var address: SocketAddress
    var channels: [String]
    var connection: StandInConnection
}

enum RecorderBench {
    /// Drives the console's hooks as the fan-out does: per publish-equivalent one `published()`
    /// and, for `cyclesPerPublish` clients in turn, the end of their long-poll (one envelope
    /// delivered) and the start of the next (a continuation, with its connection), with the
    /// address formatted inside the hook as the server does. `repetitions` timed runs of each
    /// variant, alternating, each on a fresh recorder warmed by one pass over every client.
    static func run(clients: Int, cyclesPerPublish: Int, iterations: Int, repetitions: Int) -> RecorderCostResult {
        var generator = SystemRandomNumberGenerator()
        let simulated = (0..<clients).map { index in
            SimulatedClient(
                uuid: UUID().uuidString.lowercased(),
                address: (try? SocketAddress(ipAddress: "10.\(index / 65_536 % 256).\(index / 256 % 256).\(index % 256)",
                                             port: 40_000 + Int(generator.next() as UInt16) % 20_000))
                    ?? (try! SocketAddress(ipAddress: "127.0.0.1", port: 1)),
                channels: ["chat.room-\(index % 50)", "user.\(index)"],
                connection: StandInConnection())
        }
        var on: [Double] = []
        var off: [Double] = []
        var recorded = 0
        for repetition in 0..<repetitions {
            for enabled in repetition % 2 == 0 ? [false, true] : [true, false] {
                let site = HookSite(console: enabled ? RecorderHooks() : nil)
                let nanos = drive(site, simulated, cyclesPerPublish: cyclesPerPublish, iterations: iterations)
                if enabled {
                    on.append(nanos / Double(iterations))
                    recorded = site.console?.recorded ?? 0
                } else {
                    off.append(nanos / Double(iterations))
                }
            }
        }
        return RecorderCostResult(clients: clients, cyclesPerPublish: cyclesPerPublish, iterations: iterations, repetitions: repetitions,
                                  onNanosPerPublish: PairedDifference.median(on), onRepetitions: on,
                                  offNanosPerPublish: PairedDifference.median(off), offRepetitions: off, recordedClients: recorded)
    }

    /// Thread CPU ns of `iterations` publish-equivalents (after an untimed warm-up pass).
    @inline(never)
    private static func drive(_ site: HookSite, _ clients: [SimulatedClient], cyclesPerPublish: Int, iterations: Int) -> Double {
        let subscribeKey = "sub-c-bench"
        let base = UInt64(RecorderHooks.now()) * 10_000
        // Every client has a long-poll open, as in a running fan-out.
        for client in clients {
            site.console?.longPollBegan(uuid: client.uuid, subscribeKey: subscribeKey, address: client.address,
                                        channels: client.channels, groups: [], cursor: Timetoken(base), connection: client.connection)
        }
        var next = 0
        let start = BenchMachine.threadCPUNanoseconds()
        for iteration in 0..<iterations {
            site.console?.published()
            let cursor = Timetoken(base + UInt64(iteration) + 1)
            for _ in 0..<cyclesPerPublish {
                let client = clients[next]
                next = next + 1 == clients.count ? 0 : next + 1
                site.console?.longPollEnded(uuid: client.uuid, connection: client.connection, delivered: 1, cursor: cursor)
                site.console?.longPollBegan(uuid: client.uuid, subscribeKey: subscribeKey,
                                            address: client.address, channels: client.channels, groups: [],
                                            cursor: cursor, connection: client.connection)
            }
        }
        return Double(BenchMachine.threadCPUNanoseconds() - start)
    }
}

extension Bench {
    /// The recorder's direct cost with `cyclesPerPublish` subscribe cycles per publish.
    func measureRecorder(cyclesPerPublish: Int) -> RecorderCostResult {
        benchLog("recorder: \(recorderIterations) publish-equivalents × \(recorderRepetitions) repetitions per variant, "
                 + "\(recorderClients) clients, \(cyclesPerPublish) cycles per publish")
        return RecorderBench.run(clients: recorderClients, cyclesPerPublish: cyclesPerPublish, iterations: recorderIterations,
                                 repetitions: recorderRepetitions)
    }

    /// Alternating fan-out runs without and with the console, a fresh spawned server each.
    func measureConsoleCost(runner: BenchRunner, external: BenchTarget?) async throws -> ConsoleCostResult {
        let subscribers = subscriberCounts[0]
        var off: [FanoutResult] = []
        var on: [FanoutResult] = []
        for round in 0..<dedupRounds {
            // Alternating, and starting with the other variant every round, so drift in the
            // machine's speed falls on both.
            for enabled in round % 2 == 0 ? [false, true] : [true, false] {
                let run = try await withServer(external, console: enabled) { target, pid in
                    try await runner.fanout(target: target, serverPID: pid, subscribers: subscribers, publishers: publishers,
                                            rate: fanoutRate, duration: duration, store: !noStore, transport: transport)
                }
                if enabled { on.append(run) } else { off.append(run) }
                if !json {
                    benchLog("round \(round + 1) console \(enabled ? "on: " : "off:") " + Self.describe(run)
                             + (run.serverMicrosPerPublish.map { ", server \(Self.fixed($0, 1)) µs CPU/publish" } ?? ""))
                }
            }
        }
        let offCPU = off.compactMap(\.serverMicrosPerPublish)
        let onCPU = on.compactMap(\.serverMicrosPerPublish)
        var result = ConsoleCostResult(
            subscribers: subscribers, publishers: publishers, rate: fanoutRate, stored: !noStore, seconds: duration, off: off, on: on,
            cpuDifference: offCPU.count == off.count && onCPU.count == on.count ? PairedDifference(a: offCPU, b: onCPU) : nil,
            throughputDifference: PairedDifference(a: off.map(\.publishesPerSecond), b: on.map(\.publishesPerSecond)),
            recorder: measureRecorder(cyclesPerPublish: subscribers))
        result.offMicrosPerPublish = offCPU.isEmpty ? nil : PairedDifference.median(offCPU)
        return result
    }

    /// The recorder scenario's lines.
    static func renderRecorder(_ r: RecorderCostResult) -> [String] {
        var lines = [""]
        lines.append("Flight recorder, direct cost — the console's hooks in a loop on one thread (thread CPU time), "
                     + "\(grouped(Double(r.clients))) clients, \(r.cyclesPerPublish) subscribe cycles per publish, "
                     + "\(grouped(Double(r.iterations))) publish-equivalents × \(r.repetitions) repetitions per variant (medians)")
        lines.append("  console on:  \(fixed(r.onNanosPerPublish, 0)) ns per publish-equivalent "
                     + "(\(r.onRepetitions.map { fixed($0, 0) }.joined(separator: ", ")))")
        lines.append("  console off: \(fixed(r.offNanosPerPublish, 0)) ns per publish-equivalent "
                     + "(\(r.offRepetitions.map { fixed($0, 0) }.joined(separator: ", ")))")
        lines.append("  recorder cost: \(fixed(r.costNanosPerPublish, 0)) ns per publish-equivalent "
                     + "(1 publish + \(r.cyclesPerPublish) × start and end = \(r.hooksPerPublish) hook calls), "
                     + "\(fixed(r.costNanosPerHook, 0)) ns per hook call; \(grouped(Double(r.recordedClients))) uuids recorded")
        return lines
    }

    /// The console-cost scenario's lines.
    static func renderConsoleCost(_ r: ConsoleCostResult) -> [String] {
        func interval(_ d: PairedDifference, _ decimals: Int) -> String {
            guard let low = d.low, let high = d.high else { return "no interval with one round" }
            return "95 % CI [\(fixed(low, decimals)), \(fixed(high, decimals))]"
        }
        var lines = renderRecorder(r.recorder)
        lines.append("")
        let publishing = r.rate.map { "publishing \(grouped(Double($0))) msg/s over \(r.publishers) connections" }
            ?? "\(r.publishers) closed-loop publishers"
        lines.append("Console off vs on — \(r.off.count) alternating rounds of fan-out, \(publishing), "
                     + "\(r.subscribers) subscriber(s), \(fixed(r.seconds, 1)) s per run, "
                     + (r.stored ? "stored (durable) publishes" : "store=0") + ", a fresh server per run")
        let offCPU = r.off.map { $0.serverMicrosPerPublish.map { fixed($0, 1) } ?? "-" }.joined(separator: ", ")
        let onCPU = r.on.map { $0.serverMicrosPerPublish.map { fixed($0, 1) } ?? "-" }.joined(separator: ", ")
        lines.append("  server CPU µs/publish, off: \(offCPU)")
        lines.append("  server CPU µs/publish, on:  \(onCPU)")
        if let d = r.cpuDifference {
            lines.append("  on − off: mean \(fixed(d.mean, 2)) µs (\(fixed(d.mean / d.baseline * 100, 1)) %), "
                         + "median \(fixed(d.median, 2)) µs, "
                         + interval(d, 2))
        } else {
            lines.append("  on − off CPU: not measured (needs spawned servers)")
        }
        lines.append("  publishes/s, off: \(r.off.map { grouped($0.publishesPerSecond) }.joined(separator: ", "))")
        lines.append("  publishes/s, on:  \(r.on.map { grouped($0.publishesPerSecond) }.joined(separator: ", "))")
        if let d = r.throughputDifference {
            lines.append("  on − off: mean \(grouped(d.mean)) (\(fixed(d.mean / d.baseline * 100, 1)) %), median \(grouped(d.median)), "
                         + interval(d, 0))
        }
        let runs = r.off + r.on
        lines.append("  missing \(runs.reduce(0) { $0 + $1.lost }), duplicates \(runs.reduce(0) { $0 + $1.duplicates }), "
                     + "out of order \(runs.reduce(0) { $0 + $1.outOfOrder }), "
                     + "publish errors \(runs.reduce(0) { $0 + $1.publishErrors })")
        // The verdict uses numerator and denominator from the same runs: the recorder's cost for
        // the subscribe cycles the runs made per publish ÷ the server's CPU per publish in them.
        if let cycles = r.observedCyclesPerPublish, let observed = r.observedOverheadPercent {
            lines.append("  overhead as run: \(fixed(cycles, 2)) subscribe cycles per publish (answers carry several messages under load) "
                         + "→ \(fixed(observed, 2)) % of the server's CPU per publish (goal < 2 %: \(observed < 2 ? "met" : "NOT met"))")
        }
        if let percent = r.overheadPercent, let offMicros = r.offMicrosPerPublish {
            lines.append("  over-estimate: recorder \(fixed(r.recorder.costNanosPerPublish, 0)) ns per publish-equivalent (one cycle per "
                         + "subscriber per publish) ÷ \(fixed(offMicros, 1)) µs (console off, median) = \(fixed(percent, 2)) %; at one "
                         + "cycle per subscriber per publish the server's CPU per publish is higher, so the share is lower (a paced run, "
                         + "--fanout-rate, measures that case)")
        }
        return lines
    }
}
