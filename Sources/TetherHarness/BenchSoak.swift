import ArgumentParser
import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import Synchronization
import Tether
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// `tether bench soak`: mixed legitimate and hostile load for minutes, sampling the server's
/// resident memory, to show that memory is bounded by configuration and not by what clients
/// send (docs/operations.md, "Bounds").
struct BenchSoak: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "soak",
        abstract: "Run mixed legitimate and hostile load against a server and report its peak memory.",
        discussion: """
            Starts its own `tether serve` (this binary; rate limits off, so the hostile load is \
            not turned away at the door and reaches every buffer) unless --url is given, then for \
            --seconds runs:

            legitimate: long-poll subscribers following their cursors on 50 channels, \
            publishers of 1 KiB messages, history and here-now readers, presence heartbeats;

            hostile: 30 KiB messages to ever-new channels (stored and not), subscribes naming 200 \
            fresh channels under a fresh uuid and then abandoned, channel groups filled to their \
            limit and subscribed, fetches of 500 channels at once, out-of-range and malformed \
            parameters, invalid percent-encoding and UTF-8, deeply nested JSON, duplicated \
            parameters, very long URLs and unknown paths.

            The server's VmRSS is sampled every second. The report gives the peak, the level \
            after the first tenth of the run, and the growth over the second half; memory is \
            "flat" when the second half grows less than 10 % over the first. Not a CI test: the \
            default run takes 10 minutes. Exits non-zero if the server stops answering or the \
            memory is not flat.
            """
    )

    // Not `--duration`: `tether bench` has its own, which would take the value.
    @Option(help: "Seconds of load (default: 600).")
    var seconds: Double = 600

    @Option(help: "Soak an already-running server (http://host:port); memory is then read from --pid, if given.")
    var url: String?

    @Option(help: "With --url: the server's process id, to sample its VmRSS.")
    var pid: Int32?

    @Option(name: .customLong("legitimate-workers"), help: "Concurrent legitimate request loops (besides the subscribers).")
    var legitimateWorkers: Int = 4

    @Option(name: .customLong("hostile-workers"), help: "Concurrent hostile request loops.")
    var hostileWorkers: Int = 4

    @Option(help: "Long-poll subscribers.")
    var subscribers: Int = 20

    @Option(name: .customLong("window-budget-mib"),
            help: "Spawned server: window.memoryBudgetBytes in MiB (default 64, small enough that a 10-minute run reaches it; the server's own default is 256).")
    var windowBudgetMiB: Int = 64

    @Flag(help: "Print the report as JSON.")
    var json = false

    func validate() throws {
        guard seconds >= 5, seconds <= 86_400 else { throw ValidationError("--seconds must be between 5 and 86400") }
        guard (1...256).contains(legitimateWorkers), (0...256).contains(hostileWorkers), (0...2_000).contains(subscribers) else {
            throw ValidationError("--legitimate-workers 1…256, --hostile-workers 0…256, --subscribers 0…2000")
        }
        if pid != nil && url == nil { throw ValidationError("--pid goes with --url") }
        guard (1...1_048_576).contains(windowBudgetMiB) else { throw ValidationError("--window-budget-mib must be between 1 and 1048576") }
    }

    func run() async throws {
        signal(SIGPIPE, SIG_IGN)
        var spawned: BenchServer?
        if url == nil {
            let config = FileManager.default.temporaryDirectory.appendingPathComponent("tether-soak-\(UUID().uuidString).json")
            try Data(#"{"window": {"memoryBudgetBytes": \#(windowBudgetMiB << 20)}}"#.utf8).write(to: config)
            defer { try? FileManager.default.removeItem(at: config) }
            spawned = try await BenchServer(subscribeTimeout: 10, extraArguments: ["--config", config.path])
        }
        guard let base = url ?? spawned?.target.url else { throw ValidationError("--url must look like http://host:port") }
        let serverPID = pid ?? spawned?.pid
        var configuration = HTTPClient.Configuration()
        configuration.connectionPool = .init(idleTimeout: .seconds(30), concurrentHTTP1ConnectionsPerHostSoftLimit: 1024)
        configuration.timeout = .init(connect: .seconds(5), read: .seconds(30))
        _ = HTTPDecoderTypes.ready  // before the client's first connections (``HTTPDecoderTypes``)
        let client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
        let load = SoakLoad(base: base, client: client)
        let deadline = ContinuousClock.now + .seconds(seconds)
        benchLog("soak: \(Int(seconds)) s against \(base)" + (serverPID.map { " (pid \($0))" } ?? ""))

        var samples: [(seconds: Double, kib: Int)] = []
        let started = ContinuousClock.now
        try await withThrowingTaskGroup(of: Void.self) { group in
            for index in 0..<subscribers { group.addTask { await load.subscriber(index, until: deadline) } }
            for index in 0..<legitimateWorkers { group.addTask { await load.legitimate(index, until: deadline) } }
            for index in 0..<hostileWorkers { group.addTask { await load.hostile(index, until: deadline) } }
            var lastReport = ContinuousClock.now
            while ContinuousClock.now < deadline {
                try await Task.sleep(for: .seconds(1))
                let elapsed = (ContinuousClock.now - started) / .seconds(1)
                if let serverPID, let kib = BenchMachine.statusField("VmRSS", pid: serverPID) { samples.append((elapsed, kib)) }
                if ContinuousClock.now - lastReport >= .seconds(30) {
                    lastReport = .now
                    let bounds = await load.bounds()
                    benchLog("soak: \(Int(elapsed)) s, \(load.counts.withLock { $0.total }) requests, "
                             + "RSS \(samples.last.map { "\($0.kib) KiB" } ?? "?"); \(bounds.map(SoakLoad.describe) ?? "no /metrics")")
                }
            }
            try await group.waitForAll()
        }
        let alive = await load.stillServes()
        try? await client.shutdown()
        await spawned?.stop()

        let report = SoakReport(duration: seconds, samples: samples, counts: load.counts.withLock { $0 }, stillServes: alive)
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            print(String(decoding: try encoder.encode(report), as: UTF8.self))
        } else {
            print(report.text)
        }
        if !alive { throw ExitCode(2) }
        if report.flat == false { throw ExitCode(3) }
    }
}

/// What the soak saw.
struct SoakReport: Encodable {
    var duration: Double
    var peakKiB: Int?
    var afterWarmupKiB: Int?
    var finalKiB: Int?
    var firstHalfPeakKiB: Int?
    var secondHalfPeakKiB: Int?
    var flat: Bool?
    var requests: SoakCounts
    var stillServes: Bool

    init(duration: Double, samples: [(seconds: Double, kib: Int)], counts: SoakCounts, stillServes: Bool) {
        self.duration = duration
        requests = counts
        self.stillServes = stillServes
        guard !samples.isEmpty else { return }
        peakKiB = samples.map(\.kib).max()
        afterWarmupKiB = samples.first { $0.seconds >= duration / 10 }?.kib
        finalKiB = samples.last?.kib
        // After the warm-up tenth: the peak of the first half of what remains against the second.
        let measured = samples.filter { $0.seconds >= duration / 10 }
        let middle = duration / 10 + (duration * 0.9) / 2
        firstHalfPeakKiB = measured.filter { $0.seconds < middle }.map(\.kib).max()
        secondHalfPeakKiB = measured.filter { $0.seconds >= middle }.map(\.kib).max()
        if let first = firstHalfPeakKiB, let second = secondHalfPeakKiB {
            flat = Double(second) < Double(first) * 1.10
        }
    }

    var text: String {
        func kib(_ value: Int?) -> String { value.map { "\(Bench.grouped(Double($0))) KiB" } ?? "not sampled" }
        var lines = ["Soak: \(Int(duration)) s of mixed legitimate and hostile load"]
        lines.append("  server VmRSS: peak \(kib(peakKiB)); after warm-up \(kib(afterWarmupKiB)); at the end \(kib(finalKiB))")
        lines.append("  peak in the first half \(kib(firstHalfPeakKiB)), in the second half \(kib(secondHalfPeakKiB)): "
                     + (flat.map { $0 ? "flat" : "GROWING" } ?? "unknown"))
        lines.append("  requests: \(requests.total) (legitimate \(requests.legitimate), hostile \(requests.hostile)); "
                     + "answers 2xx \(requests.success), 4xx \(requests.clientError), 5xx \(requests.serverError), "
                     + "no answer \(requests.transportError)")
        lines.append("  legitimate deliveries received: \(requests.delivered)")
        lines.append("  server still serves publish + history after the run: \(stillServes ? "yes" : "NO")")
        return lines.joined(separator: "\n")
    }
}

/// Request tallies.
struct SoakCounts: Encodable, Sendable {
    var legitimate = 0
    var hostile = 0
    var success = 0
    var clientError = 0
    var serverError = 0
    var transportError = 0
    var delivered = 0
    var total: Int { legitimate + hostile }
}

/// The soak's request loops.
final class SoakLoad: Sendable {
    let base: String
    let client: HTTPClient
    let counts = Mutex(SoakCounts())

    init(base: String, client: HTTPClient) {
        self.base = base
        self.client = client
    }

    /// Sends one request; returns the status and body, or `nil` when no answer came.
    @discardableResult
    func send(_ path: String, method: HTTPMethod = .GET, body: [UInt8]? = nil, hostile: Bool, timeout: TimeAmount = .seconds(30))
        async -> (status: Int, body: ByteBuffer)?
    {
        var request = HTTPClientRequest(url: base + path)
        request.method = method
        if let body { request.body = .bytes(ByteBuffer(bytes: body)) }
        let result: (Int, ByteBuffer)?
        do {
            let response = try await client.execute(request, timeout: timeout)
            result = (Int(response.status.code), try await response.body.collect(upTo: 64 << 20))
        } catch {
            result = nil
        }
        counts.withLock { c in
            if hostile { c.hostile += 1 } else { c.legitimate += 1 }
            switch result?.0 {
            case nil: c.transportError += 1
            case let status? where status >= 500: c.serverError += 1
            case let status? where status >= 400: c.clientError += 1
            default: c.success += 1
            }
        }
        return result
    }

    static func payload(bytes: Int) -> String {
        "%22" + String(repeating: "x", count: bytes) + "%22"
    }

    /// A long-poll subscriber on 5 of the 50 legitimate channels, following its cursor.
    func subscriber(_ index: Int, until deadline: ContinuousClock.Instant) async {
        let channels = (0..<5).map { "room-\((index * 5 + $0) % 50)" }.joined(separator: ",")
        var cursor = "0"
        while ContinuousClock.now < deadline {
            guard let (status, body) = await send("/v2/subscribe/demo/\(channels)/0?tt=\(cursor)&uuid=sub-\(index)&heartbeat=60",
                                                  hostile: false, timeout: .seconds(20)), status == 200,
                  let object = try? JSONSerialization.jsonObject(with: Data(body.readableBytesView)) as? [String: Any],
                  let t = object["t"] as? [String: Any], let next = t["t"] as? String
            else {
                try? await Task.sleep(for: .milliseconds(200))
                continue
            }
            cursor = next
            let delivered = (object["m"] as? [Any])?.count ?? 0
            counts.withLock { $0.delivered += delivered }
        }
    }

    /// Publishes, history, here-now and heartbeats on the legitimate channels.
    func legitimate(_ index: Int, until deadline: ContinuousClock.Instant) async {
        var step = 0
        let message = Self.payload(bytes: 1024)
        while ContinuousClock.now < deadline {
            step += 1
            let channel = "room-\((index * 7 + step) % 50)"
            switch step % 5 {
            case 0: await send("/v3/history/sub-key/demo/channel/\(channel)?max=25&uuid=reader-\(index)", hostile: false)
            case 1: await send("/v2/presence/sub-key/demo/channel/\(channel)?uuid=reader-\(index)", hostile: false)
            case 2: await send("/v2/presence/sub-key/demo/channel/\(channel)/heartbeat?heartbeat=60&uuid=reader-\(index)", hostile: false)
            default: await send("/publish/demo/demo/0/\(channel)/0/\(message)?uuid=writer-\(index)", hostile: false)
            }
            try? await Task.sleep(for: .milliseconds(5))
        }
    }

    /// One hostile request after another, cycling through every class.
    func hostile(_ index: Int, until deadline: ContinuousClock.Instant) async {
        var step = 0
        let big = Self.payload(bytes: 30 * 1024)
        let deep = String(repeating: "%5B", count: 5_000) + String(repeating: "%5D", count: 5_000)
        let manyChannels = (0..<500).map { "h\(index)-\($0)" }.joined(separator: ",")
        while ContinuousClock.now < deadline {
            step += 1
            let fresh = "x\(index)-\(step)"
            switch step % 12 {
            case 0: await send("/publish/demo/demo/0/\(fresh)/0/\(big)?uuid=\(fresh)", hostile: true)
            case 1: await send("/publish/demo/demo/0/\(fresh)/0/\(big)?uuid=\(fresh)&store=0", hostile: true)
            case 2:
                let channels = (0..<200).map { "\(fresh)-\($0)" }.joined(separator: ",")
                await send("/v2/subscribe/demo/\(channels)/0?tt=0&uuid=\(fresh)&heartbeat=60", hostile: true, timeout: .milliseconds(500))
            case 3:
                let group = "g\(index)-\(step % 20)"
                let channels = (0..<100).map { "\(group)-\($0)" }.joined(separator: ",")
                await send("/v1/channel-registration/sub-key/demo/channel-group/\(group)?add=\(channels)&uuid=\(fresh)", hostile: true)
                await send("/v2/subscribe/demo/,/0?tt=0&channel-group=\(group)&uuid=\(fresh)", hostile: true, timeout: .milliseconds(500))
            case 4: await send("/v3/history/sub-key/demo/channel/\(manyChannels)?max=25&uuid=\(fresh)", hostile: true)
            case 5: await send("/publish/demo/demo/0/c/0/1?ttl=1000000000&uuid=\(fresh)&seqn=-99999999999999999999", hostile: true)
            case 6: await send("/v2/history/sub-key/demo/channel/c?count=NaN&start=99999999999999999999&uuid=\(fresh)", hostile: true)
            case 7: await send("/publish/demo/demo/0/%zz/0/%ff%fe?uuid=%&meta=%7B", hostile: true)
            case 8: await send("/publish/demo/demo/0/deep/0/\(deep)?uuid=\(fresh)", hostile: true)
            case 9: await send("/v2/presence/sub-key/demo/channel/c/heartbeat?heartbeat=1&heartbeat=99999999999&uuid=a&uuid=b", hostile: true)
            case 10: await send("/v2/subscribe/demo/" + String(repeating: "a,", count: 20_000) + "/0?uuid=\(fresh)", hostile: true)
            default:
                await send("/nothing/here/\(fresh)?x=\(String(repeating: "y", count: 4_000))", method: .DELETE,
                           body: Array(repeating: 0xFF, count: 1024), hostile: true)
            }
        }
    }

    /// The server's bound gauges from `/metrics` (refreshed every 10 s by the server).
    func bounds() async -> [String: Double]? {
        guard let (status, body) = await send("/metrics", hostile: false), status == 200 else { return nil }
        var values: [String: Double] = [:]
        for line in String(buffer: body).split(separator: "\n") where !line.hasPrefix("#") {
            let parts = line.split(separator: " ")
            guard parts.count == 2, ["tether_window_bytes", "tether_windows", "tether_presence_memberships"].contains(String(parts[0])),
                  let value = Double(parts[1]) else { continue }
            values[String(parts[0])] = value
        }
        return values
    }

    static func describe(_ bounds: [String: Double]) -> String {
        let mib = (bounds["tether_window_bytes"] ?? 0) / 1_048_576
        return "windows \(Int(mib)) MiB in \(Int(bounds["tether_windows"] ?? 0)), "
            + "presence \(Int(bounds["tether_presence_memberships"] ?? 0)) memberships"
    }

    /// Whether the server still accepts a publish and returns it from history.
    func stillServes() async -> Bool {
        let channel = "soak-check-\(UInt32.random(in: 0...UInt32.max))"
        guard let (status, _) = await send("/publish/demo/demo/0/\(channel)/0/%22alive%22?uuid=checker", hostile: false), status == 200,
              let (historyStatus, body) = await send("/v3/history/sub-key/demo/channel/\(channel)?uuid=checker", hostile: false),
              historyStatus == 200
        else { return false }
        return String(buffer: body).contains("alive")
    }
}
