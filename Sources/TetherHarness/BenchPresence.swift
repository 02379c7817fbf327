import Foundation
import NIOCore
import Synchronization

/// One round of presence heartbeats: every uuid heartbeats its channel once.
struct PresenceHeartbeatRound: Codable, Sendable {
    /// Heartbeat requests sent.
    var requests: Int
    /// Requests not answered with 200.
    var errors: Int
    /// Seconds from the first connect to the last answer.
    var seconds: Double
    /// Answered heartbeats per second.
    var perSecond: Double
    /// Server CPU during the round, in percent of one CPU (spawned servers only).
    var serverCPUPercent: Double?
    /// Server CPU time per heartbeat, in microseconds (spawned servers only).
    var serverCPUMicrosPerRequest: Double?
    /// CPU of other processes during the round, in percent of one CPU: near 0 on a quiet machine.
    var otherCPUPercent: Double?
    /// Server VmRSS one second after the round (KiB, spawned servers only).
    var rssAfterKiB: Int?
}

/// Here-now latency of the large channel, one variant of the request.
struct HereNowLatency: Codable, Sendable {
    /// The query that varies (`uuid=…` or `disable_uuids=1`).
    var variant: String
    /// Sequential requests measured.
    var requests: Int
    /// Occupancy every response reported (the bench fails if one differs from the expected).
    var occupancy: Int
    /// Size of one response body in bytes.
    var responseBytes: Int
    /// Request sent → response parsed, median (ms).
    var p50Ms: Double
    /// 90th percentile (ms).
    var p90Ms: Double
    /// 99th percentile (ms).
    var p99Ms: Double
    /// Maximum (ms).
    var maxMs: Double
    /// Mean (ms).
    var meanMs: Double
}

/// Result of the presence run.
struct PresenceResult: Codable, Sendable {
    /// Distinct uuids made present.
    var uuids: Int
    /// Channels they are spread over.
    var channels: Int
    /// The large channel's name.
    var largeChannel: String
    /// Occupants of the large channel.
    var largeChannelOccupancy: Int
    /// Presence timeout every heartbeat asks for (seconds).
    var heartbeatSeconds: Int
    /// Keep-alive connections sending heartbeats (one request in flight each).
    var connections: Int
    /// Heartbeat rounds: the first makes everyone present (joins), later ones only extend.
    var rounds: [PresenceHeartbeatRound]
    /// The large channel's occupants heartbeating it again, ``largeChannelRepeats`` times each:
    /// the cost of a heartbeat on a crowded channel.
    var largeChannelRound: PresenceHeartbeatRound
    /// Heartbeats per occupant in ``largeChannelRound``.
    var largeChannelRepeats: Int
    /// Occupancy and occupied channels of the keyset after the first round (keyset here-now).
    var keysetOccupancy: Int
    /// Occupied channels of the keyset after the first round.
    var keysetChannels: Int
    /// Server VmRSS before any heartbeat, after a warm-up (KiB, spawned servers only).
    var rssBeforeKiB: Int?
    /// Server VmRSS with everyone present after the first round, settled (KiB).
    var rssPresentKiB: Int?
    /// (present − before) / uuids, in bytes.
    var bytesPerPresentUUID: Double?
    /// Server VmRSS after the idle window (KiB).
    var rssAfterIdleKiB: Int?
    /// Here-now latencies of the large channel.
    var hereNow: [HereNowLatency]
    /// Seconds of the idle window with everyone present.
    var idleSeconds: Double
    /// Server CPU over the idle window, in percent of one CPU.
    var idleServerCPUPercent: Double?
    /// Seconds of the idle window before anyone was present.
    var baselineSeconds: Double
    /// Server CPU over that window, in percent of one CPU.
    var baselineServerCPUPercent: Double?
    /// CPU of other processes during the idle window (percent of one CPU): near 0 on a quiet machine.
    var idleOtherCPUPercent: Double?
    /// `/proc/loadavg` when the run started.
    var loadAverage: String?
}

/// Sends a fixed list of requests one after another on one keep-alive connection (one in
/// flight), hands every answer with its round-trip time to `record`, and completes `finished`
/// after the last one.
final class RequestScript: BenchConnectionLogic {
    private let requests: [String]
    private let record: @Sendable (BenchResponse, UInt64) -> Void
    private let finished: EventLoopPromise<Void>
    private var next = 0
    private var sentAt: UInt64 = 0
    private var done = false

    /// Creates a script; `record` runs on the connection's event loop for every answer.
    init(requests: [String], record: @escaping @Sendable (BenchResponse, UInt64) -> Void, finished: EventLoopPromise<Void>) {
        self.requests = requests
        self.record = record
        self.finished = finished
    }

    /// Sends the first request.
    func connectionActive(_ context: ChannelHandlerContext) {
        sendNext(context)
    }

    private func sendNext(_ context: ChannelHandlerContext) {
        guard next < requests.count else {
            done = true
            finished.succeed()
            context.close(promise: nil)
            return
        }
        let request = requests[next]
        next += 1
        sentAt = benchNow()
        context.writeAndFlush(NIOAny(context.channel.allocator.buffer(string: request)), promise: nil)
    }

    /// Records the answer and sends the next request.
    func received(_ response: BenchResponse, context: ChannelHandlerContext) {
        record(response, benchNow() &- sentAt)
        sendNext(context)
    }

    /// Fails the run if the connection closed before the last answer.
    func connectionClosed() {
        if !done { finished.fail(BenchError("connection closed after \(next) of \(requests.count) requests")) }
    }
}

/// Answers counted by the presence run's connections.
final class PresenceTally: Sendable {
    /// Answers with status 200.
    let ok = Atomic<Int>(0)
    /// Other answers.
    let errors = Atomic<Int>(0)
    /// Round-trip times in nanoseconds (here-now only).
    let roundTrips = Mutex<[UInt64]>([])
    /// Occupancy values that differed from the expected one.
    let wrongOccupancy = Mutex<[Int]>([])
    /// The first here-now body, checked in full after the run.
    let firstBody = Mutex<ByteBuffer?>(nil)

    /// Creates an empty tally.
    init() {}
}

extension BenchRunner {
    /// Sends each script on its own connection, all at once; returns the seconds from the first
    /// connect to the last answer.
    private func runScripts(
        _ scripts: [[String]], target: BenchTarget, record: @escaping @Sendable (BenchResponse, UInt64) -> Void
    ) async throws -> Double {
        let promises = scripts.map { _ in group.next().makePromise(of: Void.self) }
        let start = benchNow()
        let channels = try await BenchConnector.connectMany(scripts.count, to: target, group: group) { index in
            RequestScript(requests: scripts[index], record: record, finished: promises[index])
        }
        defer { for channel in channels { channel.close(promise: nil) } }
        for promise in promises { try await promise.futureResult.get() }
        return seconds(start, benchNow())
    }

    /// Presence at scale: `uuids` distinct uuids heartbeating over `channels` channels, one of
    /// which holds `largeOccupancy` of them. Measures heartbeat throughput, the server's memory
    /// per present uuid, here-now latency of the large channel and the server's CPU while idle
    /// with everyone present. `server` is `nil` for an external server (no RSS or CPU then).
    func presence(
        target: BenchTarget, server: BenchServer?, uuids: Int, channels: Int, largeOccupancy: Int, connections: Int,
        rounds: Int, hereNowRequests: Int, idleSeconds: Double
    ) async throws -> PresenceResult {
        let heartbeat = 300
        // Names unique to this run against an external server, where earlier runs' uuids may still be present.
        let prefix = server == nil ? "presence-bench-\(UUID().uuidString.prefix(6).lowercased())-" : "presence-bench-"
        let largeChannel = "\(prefix)0"
        let trailer = target.requestTrailer
        func channelIndex(ofUUID i: Int) -> Int {
            i < largeOccupancy ? 0 : 1 + (i - largeOccupancy) % max(channels - 1, 1)
        }
        let heartbeats = (0..<uuids).map { i in
            "GET /v2/presence/sub-key/demo/channel/\(prefix)\(channelIndex(ofUUID: i))/heartbeat?uuid=\(prefix)u\(i)"
                + "&heartbeat=\(heartbeat)\(trailer)"
        }
        // Connection k sends uuids k, k + connections, …: the large channel fills from the start.
        let scripts = (0..<connections).map { k in Array(stride(from: k, to: uuids, by: connections).map { heartbeats[$0] }) }
        let loadAverage = (try? String(contentsOfFile: "/proc/loadavg", encoding: .utf8))?
            .trimmingCharacters(in: .whitespacesAndNewlines)

        // Warm up: the same connections answer a cheap request each, so the allocator has their memory already.
        let warmup = PresenceTally()
        _ = try await runScripts((0..<connections).map { _ in Array(repeating: "GET /time/0\(trailer)", count: 10) },
                                 target: target) { response, _ in
            if response.status == 200 { warmup.ok.add(1, ordering: .relaxed) } else { warmup.errors.add(1, ordering: .relaxed) }
        }
        guard warmup.errors.load(ordering: .relaxed) == 0 else { throw BenchError("warm-up requests failed") }

        let baselineSeconds = min(idleSeconds, 10)
        var baselineCPU: Double?
        if let server {
            benchLog("presence: server idle and empty; measuring its CPU for \(String(format: "%.0f", baselineSeconds)) s")
            let meter = CPUMeter(serverPID: server.pid)
            try await Task.sleep(for: .seconds(baselineSeconds))
            baselineCPU = meter.read().server
        }
        let rssBefore = server?.residentKiB()

        /// Sends the scripts once, checks every answer, lets the server settle for `settle` seconds.
        func heartbeatRound(_ scripts: [[String]], settle: Int) async throws -> PresenceHeartbeatRound {
            let tally = PresenceTally()
            let meter = CPUMeter(serverPID: server?.pid)
            let elapsed = try await runScripts(scripts, target: target) { response, _ in
                if response.status == 200 { tally.ok.add(1, ordering: .relaxed) } else { tally.errors.add(1, ordering: .relaxed) }
            }
            let reading = meter.read()
            let cpu = reading.server
            let errors = tally.errors.load(ordering: .relaxed)
            guard errors == 0 else { throw BenchError("\(errors) of \(scripts.joined().count) heartbeats failed") }
            try await Task.sleep(for: .seconds(settle))
            let answered = tally.ok.load(ordering: .relaxed)
            return PresenceHeartbeatRound(
                requests: answered, errors: errors, seconds: elapsed, perSecond: Double(answered) / max(elapsed, 1e-9),
                serverCPUPercent: cpu, serverCPUMicrosPerRequest: cpu.map { $0 / 100 * elapsed / Double(max(answered, 1)) * 1e6 },
                otherCPUPercent: reading.other, rssAfterKiB: server?.residentKiB())
        }
        var results: [PresenceHeartbeatRound] = []
        for round in 1...rounds {
            benchLog("presence: heartbeat round \(round) of \(rounds): \(uuids) uuids on \(channels) channels, \(connections) connections")
            results.append(try await heartbeatRound(scripts, settle: round == 1 ? 2 : 1))
        }
        let rssPresent = results.first?.rssAfterKiB
        let repeats = 5
        benchLog("presence: the \(largeOccupancy) occupants of \(largeChannel) heartbeat it \(repeats) times each")
        let largeScripts = (0..<connections).map { k in
            Array(repeatElement(stride(from: k, to: largeOccupancy, by: connections).map { heartbeats[$0] }, count: repeats).joined())
        }
        let largeRound = try await heartbeatRound(largeScripts, settle: 1)

        // The whole keyset: everyone present, on the expected channels.
        let keyset = try await BenchConnector.get("/v2/presence/sub-key/demo?disable_uuids=1&uuid=\(prefix)observer",
                                                  target: target, on: group.next())
        let payload = (try? JSONSerialization.jsonObject(with: Data(keyset.body.readableBytesView)) as? [String: Any])?["payload"]
            as? [String: Any]
        let keysetOccupancy = (payload?["total_occupancy"] as? NSNumber)?.intValue ?? -1
        let keysetChannels = (payload?["total_channels"] as? NSNumber)?.intValue ?? -1
        // An external server may hold other channels too; a spawned one exactly ours.
        let complete = server == nil ? keysetOccupancy >= uuids && keysetChannels >= channels
            : keysetOccupancy == uuids && keysetChannels == channels
        guard keyset.status == 200, complete else {
            throw BenchError("keyset here-now: \(keysetOccupancy) present on \(keysetChannels) channels, expected \(uuids) on \(channels)")
        }

        var hereNow: [HereNowLatency] = []
        for variant in ["uuid=\(prefix)observer", "disable_uuids=1&uuid=\(prefix)observer"] {
            benchLog("presence: \(hereNowRequests) sequential here-now requests on \(largeChannel) (\(variant))")
            let tally = PresenceTally()
            let request = "GET /v2/presence/sub-key/demo/channel/\(largeChannel)?\(variant)\(trailer)"
            let expected = largeOccupancy
            _ = try await runScripts([Array(repeating: request, count: hereNowRequests)], target: target) { response, roundTrip in
                guard response.status == 200 else {
                    tally.errors.add(1, ordering: .relaxed)
                    return
                }
                tally.roundTrips.withLock { $0.append(roundTrip) }
                let occupancy = response.body.withUnsafeReadableBytes { raw in
                    BenchBytes.find("\"occupancy\":", in: raw, from: 0).flatMap { BenchBytes.decimal(in: raw, from: $0 + 12) }
                }
                let value = occupancy.map { Int($0.value) } ?? -1
                if value != expected { tally.wrongOccupancy.withLock { $0.append(value) } }
                tally.firstBody.withLock { if $0 == nil { $0 = response.body } }
            }
            let errors = tally.errors.load(ordering: .relaxed)
            let wrong = tally.wrongOccupancy.withLock { $0 }
            guard errors == 0, wrong.isEmpty else {
                throw BenchError("here-now of \(largeChannel): \(errors) errors, occupancy \(wrong.prefix(5)) instead of \(expected)")
            }
            let body = tally.firstBody.withLock { $0 } ?? ByteBuffer()
            if !variant.hasPrefix("disable_uuids") {
                let listed = (try? JSONSerialization.jsonObject(with: Data(body.readableBytesView)) as? [String: Any])?["uuids"] as? [String]
                guard let listed, Set(listed).count == expected, listed.allSatisfy({ $0.hasPrefix(prefix + "u") }) else {
                    throw BenchError("here-now of \(largeChannel) did not list \(expected) distinct uuids")
                }
            }
            let sorted = tally.roundTrips.withLock { $0 }.sorted()
            hereNow.append(HereNowLatency(
                variant: variant.hasPrefix("disable_uuids") ? "disable_uuids=1" : "with uuids", requests: sorted.count,
                occupancy: expected, responseBytes: body.readableBytes,
                p50Ms: milliseconds(percentile(sorted, 0.5)), p90Ms: milliseconds(percentile(sorted, 0.9)),
                p99Ms: milliseconds(percentile(sorted, 0.99)), maxMs: milliseconds(sorted.last ?? 0),
                meanMs: sorted.isEmpty ? 0 : Double(sorted.reduce(0, &+)) / Double(sorted.count) / 1e6))
        }

        var idleCPU: Double?
        var idleOther: Double?
        var rssAfterIdle: Int?
        if let server {
            try await Task.sleep(for: .seconds(2))
            benchLog("presence: \(uuids) present, no requests; measuring the server's CPU for \(String(format: "%.0f", idleSeconds)) s")
            let meter = CPUMeter(serverPID: server.pid)
            try await Task.sleep(for: .seconds(idleSeconds))
            let reading = meter.read()
            idleCPU = reading.server
            idleOther = reading.other
            rssAfterIdle = server.residentKiB()
        }
        return PresenceResult(
            uuids: uuids, channels: channels, largeChannel: largeChannel, largeChannelOccupancy: largeOccupancy,
            heartbeatSeconds: heartbeat, connections: connections, rounds: results, largeChannelRound: largeRound,
            largeChannelRepeats: repeats, keysetOccupancy: keysetOccupancy,
            keysetChannels: keysetChannels, rssBeforeKiB: rssBefore, rssPresentKiB: rssPresent,
            bytesPerPresentUUID: rssBefore.flatMap { before in rssPresent.map { Double($0 - before) * 1024 / Double(uuids) } },
            rssAfterIdleKiB: rssAfterIdle, hereNow: hereNow, idleSeconds: server == nil ? 0 : idleSeconds, idleServerCPUPercent: idleCPU,
            baselineSeconds: server == nil ? 0 : baselineSeconds, baselineServerCPUPercent: baselineCPU, idleOtherCPUPercent: idleOther,
            loadAverage: loadAverage)
    }
}

extension Bench {
    /// The presence section of the human-readable report.
    static func renderPresence(_ r: PresenceResult) -> [String] {
        var lines: [String] = []
        lines.append("")
        lines.append("Presence — \(grouped(Double(r.uuids))) uuids on \(grouped(Double(r.channels))) channels "
                     + "(\(grouped(Double(r.largeChannelOccupancy))) on \(r.largeChannel)), heartbeat=\(r.heartbeatSeconds), "
                     + "\(r.connections) keep-alive connections")
        if let load = r.loadAverage { lines.append("  load average at start: \(load)") }
        func describe(_ round: PresenceHeartbeatRound) -> String {
            var line = "\(grouped(Double(round.requests))) in \(fixed(round.seconds)) s = \(grouped(round.perSecond))/s"
            if let cpu = round.serverCPUPercent, let micros = round.serverCPUMicrosPerRequest {
                line += ", server CPU \(percent(cpu)) (\(fixed(micros, 0)) µs per heartbeat)"
            }
            if let other = round.otherCPUPercent { line += ", other processes \(percent(other))" }
            if let rss = round.rssAfterKiB { line += ", VmRSS after \(grouped(Double(rss))) KiB" }
            return line
        }
        for (i, round) in r.rounds.enumerated() {
            lines.append("  heartbeat round \(i + 1) (\(i == 0 ? "joins" : "already present")): \(describe(round))")
        }
        lines.append("  \(r.largeChannel) only, \(r.largeChannelRepeats) heartbeats per occupant: \(describe(r.largeChannelRound))")
        lines.append("  keyset here-now: \(grouped(Double(r.keysetOccupancy))) present on \(grouped(Double(r.keysetChannels))) channels "
                     + "(checked)")
        if let before = r.rssBeforeKiB, let present = r.rssPresentKiB, let perUUID = r.bytesPerPresentUUID {
            lines.append("  server VmRSS: \(grouped(Double(before))) KiB before, \(grouped(Double(present))) KiB with everyone present "
                         + "→ \(fixed(perUUID, 0)) bytes per present uuid"
                         + (r.rssAfterIdleKiB.map { "; \(grouped(Double($0))) KiB after the idle window" } ?? ""))
        }
        for h in r.hereNow {
            lines.append("  here-now \(r.largeChannel) \(h.variant) (occupancy \(grouped(Double(h.occupancy))) checked, "
                         + "\(grouped(Double(h.responseBytes))) B): p50 \(fixed(h.p50Ms)) ms, p90 \(fixed(h.p90Ms)) ms, "
                         + "p99 \(fixed(h.p99Ms)) ms, max \(fixed(h.maxMs)) ms, mean \(fixed(h.meanMs)) ms "
                         + "(\(h.requests) sequential requests)")
        }
        if let idle = r.idleServerCPUPercent {
            lines.append("  idle CPU with everyone present: server \(fixed(idle)) % of one CPU over \(fixed(r.idleSeconds, 0)) s "
                         + "(empty server: \(r.baselineServerCPUPercent.map { fixed($0) } ?? "-") % over \(fixed(r.baselineSeconds, 0)) s); "
                         + "other processes \(percent(r.idleOtherCPUPercent))")
            lines.append("  target: idle CPU under 2% of a core with \(grouped(Double(r.uuids))) present uuids — "
                         + (idle < 2 ? "met" : "NOT met"))
        }
        return lines
    }
}
