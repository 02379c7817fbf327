import Foundation
import NIOCore
import NIOPosix
import Synchronization

/// One configuration of the cluster scenario (`tether bench --scenario cluster`): one node on
/// SQLite, or `nodes` nodes on one PostgreSQL.
struct ClusterResult: Codable, Sendable {
    /// `sqlite` or `postgres`.
    var store: String
    /// Nodes serving; publishers and subscribers are spread evenly over them.
    var nodes: Int
    /// Subscribers (long-polls) in all, on one channel.
    var subscribers: Int

    /// Paced run: target publish rate (messages/s, over all nodes).
    var rate: Int
    /// Paced run: seconds measured after the warm-up.
    var seconds: Double
    /// Paced run: publishes acknowledged (warm-up included).
    var pacedPublished: Int
    /// Paced run: publish → deliver latency, every subscriber on every node (ms).
    var p50Ms: Double
    var p99Ms: Double
    var maxMs: Double
    /// Paced run: publish round trip until acknowledged (ms).
    var publishAckP50Ms: Double
    var publishAckP99Ms: Double

    /// Flood run: closed-loop publishers per node.
    var publishersPerNode: Int
    /// Flood run: publishes acknowledged per second (all nodes).
    var publishesPerSecond: Double
    /// Flood run: deliveries per second to all subscribers.
    var deliveriesPerSecond: Double
    /// Flood run: each node's CPU, percent of one CPU.
    var nodeCPUPercent: [Double]
    /// Flood run: each node's CPU per delivery it made to its own subscribers (µs).
    var nodeMicrosPerDelivery: [Double]
    /// Flood run: all nodes' CPU per delivery (µs).
    var clusterMicrosPerDelivery: Double?
    /// Flood run: PostgreSQL's CPU (every `postgres` process), percent of one CPU.
    var postgresCPUPercent: Double?

    /// Both runs: acknowledged publishes a subscriber never received, duplicates, and
    /// deliveries out of timetoken order.
    var lost: Int
    var duplicates: Int
    var outOfOrder: Int
    var publishErrors: Int
}

extension BenchRunner {
    /// The cluster scenario on running nodes: a paced run (publish → deliver latency with
    /// publishers and subscribers spread over the nodes, so most deliveries cross nodes), then a
    /// flood run (closed-loop publishers on every node) for throughput and CPU per delivery.
    func cluster(store: String, targets: [BenchTarget], pids: [Int32], subscribers: Int, rate: Int, duration: Double, warmup: Double,
                 publishersPerNode: Int) async throws -> ClusterResult {
        let nodes = targets.count
        @Sendable func share(_ total: Int, _ index: Int) -> Int { total / nodes + (index < total % nodes ? 1 : 0) }
        var result = ClusterResult(
            store: store, nodes: nodes, subscribers: subscribers, rate: rate, seconds: duration, pacedPublished: 0, p50Ms: 0, p99Ms: 0,
            maxMs: 0, publishAckP50Ms: 0, publishAckP99Ms: 0, publishersPerNode: publishersPerNode, publishesPerSecond: 0,
            deliveriesPerSecond: 0, nodeCPUPercent: [], nodeMicrosPerDelivery: [], lost: 0, duplicates: 0, outOfOrder: 0, publishErrors: 0)

        // Paced: latency.
        do {
            let channel = freshChannel("cluster")
            let warmupCount = Int(Double(rate) * warmup)
            let total = warmupCount + Int(Double(rate) * duration)
            var progress: [SubscriberProgress] = []
            var subscriberChannels: [any Channel] = []
            for (index, target) in targets.enumerated() {
                let (p, c) = try await openSubscribers(share(subscribers, index), channel: channel, target: target,
                                                       recordLatencyFrom: warmupCount, transport: .longPoll)
                progress += p
                subscriberChannels += c
            }
            benchLog("cluster \(store) ×\(nodes): \(subscribers) subscribers; publishing \(rate) msg/s spread over the nodes")
            let ledger = PublishLedger()
            let loop = group.next()
            var publishers: [NIOLoopBound<PacedPublisher>] = []
            var publisherChannels: [any Channel] = []
            for (index, target) in targets.enumerated() {
                let request = PublishRequest(channel: channel, target: target, store: true)
                let nodeRate = share(rate, index)
                let nodeTotal = share(total, index)
                let publisher = try await loop.submit {
                    NIOLoopBound(PacedPublisher(request: request, ledger: ledger, rate: nodeRate, total: nodeTotal, idOffset: index,
                                                idStride: nodes), eventLoop: loop)
                }.get()
                publishers.append(publisher)
                publisherChannels += try await BenchConnector.connectMany(max(8, nodeRate / 50), to: target, group: loop) { _ in
                    publisher.value.makeConnection()
                }
            }
            for publisher in publishers { try await loop.submit { publisher.value.start(on: loop) }.get() }
            try await Task.sleep(for: .seconds(warmup + duration))
            let deadline = ContinuousClock.now + .seconds(30)
            for publisher in publishers {
                while try await !loop.submit({ publisher.value.isFinished }).get() && ContinuousClock.now < deadline {
                    try await Task.sleep(for: .milliseconds(10))
                }
            }
            while ledger.ackedCount.load(ordering: .acquiring) + ledger.errors.load(ordering: .relaxed) < total
                    && ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(10))
            }
            let published = ledger.ackedCount.load(ordering: .acquiring)
            _ = try await waitForDelivery(progress, expected: published, timeout: .seconds(30))
            for publisher in publishers { try await loop.submit { publisher.value.stop() }.get() }
            await close(publisherChannels)
            await closeSubscribers(subscriberChannels, transport: .longPoll)
            let acked = ledger.acked.withLock { $0 }
            var latencies: [UInt64] = []
            for report in reports(progress) {
                latencies += report.latencies
                result.lost += acked.countMissing(from: report.received)
                result.duplicates += report.duplicates
                result.outOfOrder += report.outOfOrder
            }
            latencies.sort()
            let roundTrips = ledger.roundTrips.withLock { $0 }.sorted()
            result.pacedPublished = published
            result.publishErrors += ledger.errors.load(ordering: .relaxed)
            result.p50Ms = milliseconds(percentile(latencies, 0.5))
            result.p99Ms = milliseconds(percentile(latencies, 0.99))
            result.maxMs = milliseconds(latencies.last ?? 0)
            result.publishAckP50Ms = milliseconds(percentile(roundTrips, 0.5))
            result.publishAckP99Ms = milliseconds(percentile(roundTrips, 0.99))
        }

        // Flood: throughput and CPU per delivery.
        do {
            let channel = freshChannel("cluster-flood")
            var progress: [[SubscriberProgress]] = []
            var subscriberChannels: [any Channel] = []
            for (index, target) in targets.enumerated() {
                let (p, c) = try await openSubscribers(share(subscribers, index), channel: channel, target: target,
                                                       recordLatencyFrom: nil, transport: .longPoll)
                progress.append(p)
                subscriberChannels += c
            }
            benchLog("cluster \(store) ×\(nodes): flood, \(publishersPerNode) closed-loop publishers per node for \(duration) s")
            let ledger = PublishLedger()
            let control = FloodControl()
            let nodeStart = pids.map { BenchMachine.cpuSeconds(pid: $0) ?? 0 }
            let postgresStart = BenchMachine.cpuSeconds(processesNamed: "postgres")
            let start = benchNow()
            var floodChannels: [any Channel] = []
            for target in targets {
                let request = PublishRequest(channel: channel, target: target, store: true)
                floodChannels += try await BenchConnector.connectMany(publishersPerNode, to: target, group: group) { _ in
                    FloodPublisher(request: request, ledger: ledger, control: control)
                }
            }
            try await Task.sleep(for: .seconds(duration))
            control.stop.store(true, ordering: .releasing)
            let stoppedAt = benchNow()
            let deadline = ContinuousClock.now + .seconds(30)
            while control.finished.load(ordering: .acquiring) < publishersPerNode * nodes && ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(2))
            }
            let published = ledger.ackedCount.load(ordering: .acquiring)
            _ = try await waitForDelivery(progress.flatMap { $0 }, expected: published, timeout: .seconds(max(30, duration * 3)))
            let finished = benchNow()
            let wall = seconds(start, finished)
            let nodeSeconds = zip(pids, nodeStart).map { (BenchMachine.cpuSeconds(pid: $0) ?? $1) - $1 }
            let postgresSeconds = postgresStart.flatMap { s in BenchMachine.cpuSeconds(processesNamed: "postgres").map { $0 - s } }
            await close(floodChannels)
            await closeSubscribers(subscriberChannels, transport: .longPoll)
            let acked = ledger.acked.withLock { $0 }
            var deliveriesByNode: [Int] = []
            for nodeProgress in progress {
                var delivered = 0
                for report in reports(nodeProgress) {
                    delivered += report.deliveries
                    result.lost += acked.countMissing(from: report.received)
                    result.duplicates += report.duplicates
                    result.outOfOrder += report.outOfOrder
                }
                deliveriesByNode.append(delivered)
            }
            let deliveries = deliveriesByNode.reduce(0, +)
            result.publishErrors += ledger.errors.load(ordering: .relaxed)
            result.publishesPerSecond = Double(published) / seconds(start, stoppedAt)
            result.deliveriesPerSecond = Double(deliveries) / wall
            result.nodeCPUPercent = nodeSeconds.map { $0 / wall * 100 }
            result.nodeMicrosPerDelivery = zip(nodeSeconds, deliveriesByNode).map { $1 > 0 ? $0 * 1e6 / Double($1) : 0 }
            if deliveries > 0 { result.clusterMicrosPerDelivery = nodeSeconds.reduce(0, +) * 1e6 / Double(deliveries) }
            result.postgresCPUPercent = store == "postgres" ? postgresSeconds.map { $0 / wall * 100 } : nil
        }
        return result
    }
}

extension BenchMachine {
    /// CPU seconds used so far by every live process with this command name (PostgreSQL's
    /// postmaster and its backends), or `nil` when /proc cannot be read.
    static func cpuSeconds(processesNamed name: String) -> Double? {
        guard let entries = try? FileManager.default.contentsOfDirectory(atPath: "/proc") else { return nil }
        var total = 0.0
        for entry in entries where entry.allSatisfy(\.isNumber) {
            guard let comm = try? String(contentsOfFile: "/proc/\(entry)/comm", encoding: .utf8),
                  comm.trimmingCharacters(in: .whitespacesAndNewlines) == name,
                  let seconds = cpuSeconds(pid: Int32(entry))
            else { continue }
            total += seconds
        }
        return total
    }
}
