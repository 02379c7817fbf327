import Foundation
import NIOCore
import Synchronization

/// Result of one fan-out run.
/// The publish-dedup scenario: fan-out runs without and with a request id on every publish.
struct PublishDedupResult: Codable, Sendable {
    /// Subscribers per run.
    var subscribers: Int
    /// Closed-loop publishers per run.
    var publishers: Int
    /// Whether publishes were stored.
    var stored: Bool
    /// Seconds each run publishes.
    var seconds: Double
    /// Runs without request ids.
    var without: [FanoutResult]
    /// Runs with a unique request id on every publish.
    var with: [FanoutResult]

    private static func median(_ runs: [FanoutResult]) -> Double {
        let sorted = runs.map(\.publishesPerSecond).sorted()
        guard !sorted.isEmpty else { return 0 }
        return sorted.count % 2 == 1 ? sorted[sorted.count / 2] : (sorted[sorted.count / 2 - 1] + sorted[sorted.count / 2]) / 2
    }

    /// Median publishes/s without request ids.
    var medianWithout: Double { Self.median(without) }
    /// Median publishes/s with request ids.
    var medianWith: Double { Self.median(with) }
    /// How much throughput the check costs, in percent of the throughput without it.
    var costPercent: Double { medianWithout > 0 ? (medianWithout - medianWith) / medianWithout * 100 : 0 }
}

struct FanoutResult: Codable, Sendable {
    /// The subscribers' wire: `long-poll` or `websocket`.
    var transport: String
    /// Subscribers on the channel.
    var subscribers: Int
    /// Publisher connections: closed-loop publishers (one publish in flight each), or the
    /// connection pool of the paced publisher when ``targetRate`` is set.
    var publishers: Int
    /// The open-loop publish rate (messages/s), or `nil` for closed-loop publishing.
    var targetRate: Int?
    /// With ``targetRate``: the largest delay of a publish behind its schedule (ms).
    var maxScheduleLagMs: Double?
    /// Whether publishes were stored (`store=1`, durable before acknowledged).
    var stored: Bool
    /// Whether every publish carried a unique `requestid` (the server's deduplication check).
    var requestIDs: Bool
    /// Seconds publishing ran.
    var publishSeconds: Double
    /// Publishes acknowledged with 200.
    var published: Int
    /// Publishes answered with an error or lost with their connection.
    var publishErrors: Int
    /// Acknowledged publishes per second of publishing.
    var publishesPerSecond: Double
    /// Messages received, summed over subscribers.
    var deliveries: Int
    /// Deliveries per second, from the first publish to the last delivery.
    var deliveriesPerSecond: Double
    /// Deliveries per second while publishing ran.
    var deliveriesPerSecondWhilePublishing: Double
    /// Seconds from the end of publishing until every subscriber had every message.
    var drainSeconds: Double
    /// Whether every subscriber received every acknowledged message before the drain timeout.
    var complete: Bool
    /// Acknowledged messages a subscriber did not have when the run ended, summed over
    /// subscribers (not yet delivered when ``complete`` is false, lost when it is true).
    var lost: Int
    /// Subscribers that missed at least one message.
    var subscribersWithLoss: Int
    /// Messages received more than once, summed over subscribers.
    var duplicates: Int
    /// Messages whose timetoken was not above the previous one, summed over subscribers.
    var outOfOrder: Int
    /// Non-200 subscribe responses (WebSocket: `error` and `notice` frames).
    var subscribeErrors: Int
    /// Subscribers whose connection the server closed before the end of the run (WebSocket: a
    /// slow consumer is closed with 4003).
    var subscribersDropped: Int = 0
    /// Why the first of them was closed, if known.
    var firstDropReason: String?
    /// Long-poll responses (or WebSocket `subscribed` and `messages` frames) received, summed over subscribers.
    var subscribeResponses: Int
    /// The server's CPU time (user + system) from the first publish until every subscriber had
    /// every message, divided by the deliveries (µs; spawned servers only). It includes the
    /// publishes' own cost.
    var serverMicrosPerDelivery: Double?
    /// The same server CPU time divided by the requests it answered: publishes plus subscribe
    /// responses (long-poll cycles, or WebSocket frames) (µs; spawned servers only).
    var serverMicrosPerRequest: Double?
    /// Channels the subscribers were spread over and the publishes went round-robin to.
    var channels: Int = 1
    /// The closed-loop publishers' wire: `rest` or `websocket` (`publish` frames).
    var publishWire: String = BenchPublishWire.rest.rawValue
    /// Deliveries in each second of the run.
    var deliveriesPerSecondSeries: [Int]
    /// Server CPU while publishing, in percent of one CPU (spawned servers only).
    var serverCPUPercent: Double?
    /// Bench client CPU while publishing, in percent of one CPU.
    var clientCPUPercent: Double?
    /// Interrupt/softirq CPU while publishing, in percent of one CPU.
    var interruptCPUPercent: Double?
    /// CPU used by other processes while publishing (with an external server, includes it).
    var otherCPUPercent: Double?
}

/// Result of the latency run.
struct LatencyResult: Codable, Sendable {
    /// The subscribers' wire: `long-poll` or `websocket`.
    var transport: String
    /// Subscribers on the channel.
    var subscribers: Int
    /// Target publish rate (messages/s).
    var rate: Int
    /// Whether publishes were stored.
    var stored: Bool
    /// Seconds measured (after warm-up).
    var seconds: Double
    /// Seconds of warm-up excluded from the figures.
    var warmupSeconds: Double
    /// Messages published (acknowledged), including warm-up.
    var published: Int
    /// Latency samples (messages × subscribers after warm-up).
    var samples: Int
    /// Publish-to-receive latency percentiles in milliseconds.
    var p50Ms: Double
    /// 90th percentile (ms).
    var p90Ms: Double
    /// 99th percentile (ms).
    var p99Ms: Double
    /// 99.9th percentile (ms).
    var p999Ms: Double
    /// Maximum (ms).
    var maxMs: Double
    /// Mean (ms).
    var meanMs: Double
    /// Publish round trip (request sent → acknowledgement) median (ms).
    var publishAckP50Ms: Double
    /// Publish round trip 99th percentile (ms).
    var publishAckP99Ms: Double
    /// Largest delay of a publish behind its schedule (ms); large values mean the publisher
    /// could not keep the rate and latencies are understated (coordinated omission).
    var maxScheduleLagMs: Double
    /// Publishes sent more than 1 ms behind schedule.
    var lateSends: Int
    /// Lost, duplicate and out-of-order messages, summed over subscribers.
    var lost: Int
    /// Duplicates.
    var duplicates: Int
    /// Out of order.
    var outOfOrder: Int
    /// Publish errors.
    var publishErrors: Int
    /// Server CPU during the run, in percent of one CPU (spawned servers only).
    var serverCPUPercent: Double?
    /// Bench client CPU during the run, in percent of one CPU.
    var clientCPUPercent: Double?
    /// Interrupt/softirq CPU during the run, in percent of one CPU.
    var interruptCPUPercent: Double?
    /// CPU used by other processes during the run (with an external server, includes it).
    var otherCPUPercent: Double?
}

/// Measures the CPU time the server and this client use over an interval.
struct CPUMeter {
    /// CPU use over the measured interval, in percent of one CPU.
    struct Reading {
        /// The spawned server process.
        var server: Double?
        /// This bench client.
        var client: Double?
        /// Interrupt and softirq time (mostly loopback TCP).
        var interrupts: Double?
        /// Everything else on the machine (other processes): should be near 0 for a clean run.
        var other: Double?
    }

    private let serverPID: Int32?
    private let serverStart: Double?
    private let clientStart: Double?
    private let machineStart: (busy: Double, interrupts: Double)?
    private let started = benchNow()

    /// Starts measuring.
    init(serverPID: Int32?) {
        self.serverPID = serverPID
        serverStart = serverPID.flatMap { BenchMachine.cpuSeconds(pid: $0) }
        clientStart = BenchMachine.cpuSeconds(pid: nil)
        machineStart = BenchMachine.machineCPUSeconds()
    }

    /// The server's CPU seconds since the start (spawned servers only).
    func serverSeconds() -> Double? {
        guard let serverPID, let serverStart, let now = BenchMachine.cpuSeconds(pid: serverPID) else { return nil }
        return now - serverStart
    }

    /// CPU use since the start.
    func read() -> Reading {
        let wall = seconds(started, benchNow())
        var reading = Reading()
        guard wall > 0 else { return reading }
        if let serverPID, let serverStart, let now = BenchMachine.cpuSeconds(pid: serverPID) {
            reading.server = (now - serverStart) / wall * 100
        }
        if let clientStart, let now = BenchMachine.cpuSeconds(pid: nil) {
            reading.client = (now - clientStart) / wall * 100
        }
        if let machineStart, let now = BenchMachine.machineCPUSeconds() {
            let busy = (now.busy - machineStart.busy) / wall * 100
            let interrupts = (now.interrupts - machineStart.interrupts) / wall * 100
            reading.interrupts = interrupts
            if let client = reading.client, serverPID == nil || reading.server != nil {
                reading.other = max(0, busy - interrupts - client - (reading.server ?? 0))
            }
        }
        return reading
    }
}

/// Result of the idle long-poll memory run.
struct MemoryResult: Codable, Sendable {
    /// `long-poll` (idle long-polls) or `websocket` (idle sessions).
    var transport: String
    /// `long-poll` (one channel each), `shared-channel` or `connection` (no request).
    var mode: String
    /// Idle long-polls (or connections) opened.
    var longPolls: Int
    /// Long-polls the server reported waiting.
    var waitingOnServer: Int
    /// Server VmRSS before opening them (KiB).
    var rssBeforeKiB: Int
    /// Server VmRSS with all of them waiting (KiB).
    var rssAfterKiB: Int
    /// Server VmRSS after they were closed (KiB).
    var rssAfterCloseKiB: Int
    /// Server VmRSS with the same number open a second time (KiB): close to ``rssAfterKiB`` when
    /// the memory of the first round was reused rather than leaked.
    var rssAfterReopenKiB: Int
    /// (after − before) / long-polls.
    var kibPerLongPoll: Double
    /// Long-polls answered while they should have been idle.
    var answeredEarly: Int
    /// The open-file soft limit the bench ran with.
    var openFileLimit: Int
    /// Seconds it took to open them all.
    var openSeconds: Double
}

/// Prints progress to standard error (standard output is kept for results).
func benchLog(_ message: String) {
    FileHandle.standardError.write(Data("[bench] \(message)\n".utf8))
}

/// Value at quantile `q` of an ascending array (nearest rank).
func percentile(_ sorted: [UInt64], _ q: Double) -> UInt64 {
    guard !sorted.isEmpty else { return 0 }
    let rank = Int((q * Double(sorted.count)).rounded(.up))
    return sorted[min(max(rank, 1), sorted.count) - 1]
}

/// Milliseconds from nanoseconds.
func milliseconds(_ nanos: UInt64) -> Double { Double(nanos) / 1_000_000 }

/// Seconds between two monotonic instants in nanoseconds.
func seconds(_ from: UInt64, _ to: UInt64) -> Double { to > from ? Double(to - from) / 1e9 : 0 }

/// The scenarios of `tether bench`.
struct BenchRunner {
    /// The client's event loops.
    let group: any EventLoopGroup

    /// A channel name no earlier run used (matters with `--url`).
    func freshChannel(_ kind: String) -> String {
        "bench-\(kind)-\(UUID().uuidString.prefix(8).lowercased())"
    }

    /// Opens subscribers and waits until each has its handshake cursor (long-poll) or its
    /// `subscribed` answer (WebSocket).
    func openSubscribers(
        _ count: Int, channel: String, target: BenchTarget, recordLatencyFrom: Int?, transport: BenchTransport
    ) async throws -> ([SubscriberProgress], [any Channel]) {
        try await openSubscribers(count, channels: [channel], target: target, recordLatencyFrom: recordLatencyFrom, transport: transport)
    }

    /// Opens subscribers, subscriber `i` on `channels[i % channels.count]`, and waits until each
    /// has its handshake cursor (long-poll) or its `subscribed` answer (WebSocket).
    func openSubscribers(
        _ count: Int, channels names: [String], target: BenchTarget, recordLatencyFrom: Int?, transport: BenchTransport
    ) async throws -> ([SubscriberProgress], [any Channel]) {
        let progress = (0..<count).map { _ in SubscriberProgress() }
        let channels: [any Channel]
        switch transport {
        case .longPoll:
            channels = try await BenchConnector.connectMany(count, to: target, group: group) { index in
                BenchSubscriber(channel: names[index % names.count], uuid: "bench-sub-\(index)", target: target, progress: progress[index],
                                recordLatencyFrom: recordLatencyFrom)
            }
        case .websocket:
            channels = try await BenchConnector.connectManyWebSockets(count, to: target, group: group) { index in
                BenchWebSocketSubscriber(mode: .subscribe(channel: names[index % names.count]), uuid: "bench-sub-\(index)", target: target,
                                         progress: progress[index], recordLatencyFrom: recordLatencyFrom)
            }
        }
        let deadline = ContinuousClock.now + .seconds(30)
        while !progress.allSatisfy({ $0.ready.load(ordering: .acquiring) }) {
            if ContinuousClock.now > deadline || progress.contains(where: { $0.closed.load(ordering: .acquiring) }) {
                for channel in channels { channel.close(promise: nil) }
                let failure = progress.lazy.compactMap { $0.session.withLock { $0.lastError } }.first
                throw BenchError("subscribers did not complete their handshakes within 30 s" + (failure.map { ": \($0)" } ?? ""))
            }
            try await Task.sleep(for: .milliseconds(10))
        }
        return (progress, channels)
    }

    /// Closes subscribers' connections (WebSocket sessions end with `bye`) and waits until they are closed.
    func closeSubscribers(_ channels: [any Channel], transport: BenchTransport) async {
        if transport == .websocket { BenchConnector.sayGoodbye(channels) }
        await close(channels)
    }

    /// Closes connections and waits until they are closed.
    func close(_ channels: [any Channel]) async {
        for channel in channels { channel.close(promise: nil) }
        for channel in channels { try? await channel.closeFuture.get() }
    }

    /// Waits until every subscriber has `expected` distinct messages (or closed), up to `timeout`.
    func waitForDelivery(_ progress: [SubscriberProgress], expected: Int, timeout: Duration) async throws -> Bool {
        try await waitForDelivery(progress, expected: { _ in expected }, timeout: timeout)
    }

    /// Waits until every subscriber `i` has `expected(i)` distinct messages (or closed), up to `timeout`.
    func waitForDelivery(_ progress: [SubscriberProgress], expected: (Int) -> Int, timeout: Duration) async throws -> Bool {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if progress.indices.allSatisfy({ progress[$0].unique.load(ordering: .acquiring) >= expected($0) || progress[$0].closed.load(ordering: .acquiring) }) {
                return progress.allSatisfy { !$0.closed.load(ordering: .acquiring) }
            }
            try await Task.sleep(for: .milliseconds(5))
        }
        return false
    }

    /// Collects the subscribers' final reports (after their connections closed).
    func reports(_ progress: [SubscriberProgress]) -> [SubscriberReport] {
        progress.map { $0.report.withLock { $0 } ?? SubscriberReport() }
    }

    /// Fan-out: closed-loop publishers (or, with `rate`, a paced publisher) on `channels`
    /// channels (message `i` on channel `i mod channels`), `subscribers` long-polls receiving
    /// (subscriber `i` on channel `i mod channels`); checks every delivery.
    func fanout(
        target: BenchTarget, serverPID: Int32?, subscribers: Int, channels channelCount: Int = 1, publishers: Int, rate: Int?,
        duration: Double, store: Bool, requestIDs: Bool = false,
        transport: BenchTransport, publishWire: BenchPublishWire = .rest
    ) async throws -> FanoutResult {
        let prefix = freshChannel("fanout")
        let names = channelCount == 1 ? [prefix] : (0..<channelCount).map { "\(prefix)-\($0)" }
        benchLog("fan-out: opening \(subscribers) \(transport.rawValue) subscribers on "
                 + (channelCount == 1 ? prefix : "\(channelCount) channels \(prefix)-*"))
        let (progress, subscriberChannels) = try await openSubscribers(subscribers, channels: names, target: target,
                                                                       recordLatencyFrom: nil, transport: transport)
        let ledger = PublishLedger()
        let control = FloodControl()
        let request = PublishRequest(channels: names, target: target, store: store, requestIDs: requestIDs)
        let loop = group.next()
        var paced: NIOLoopBound<PacedPublisher>?
        if let rate {
            let total = Int(Double(rate) * duration)
            paced = try await loop.submit {
                NIOLoopBound(PacedPublisher(request: request, ledger: ledger, rate: rate, total: total), eventLoop: loop)
            }.get()
            benchLog("fan-out: publishing \(rate) msg/s for \(duration) s")
        } else {
            benchLog("fan-out: publishing for \(duration) s with \(publishers) closed-loop publishers")
        }
        let publisherChannels: [any Channel]
        if let paced {
            publisherChannels = try await BenchConnector.connectMany(publishers, to: target, group: loop) { _ in
                paced.value.makeConnection()
            }
        } else {
            publisherChannels = []
        }
        let start = benchNow()
        let meter = CPUMeter(serverPID: serverPID)
        let floodChannels: [any Channel]
        if let paced {
            try await loop.submit { paced.value.start(on: loop) }.get()
            floodChannels = []
        } else if publishWire == .websocket {
            let flood = BenchWebSocketFlood(channels: names, store: store, ledger: ledger, control: control)
            floodChannels = try await BenchConnector.connectManyWebSockets(publishers, to: target, group: group) { index in
                BenchWebSocketSubscriber(mode: .publish(flood), uuid: "bench-publisher-\(index)", target: target,
                                         progress: SubscriberProgress(), recordLatencyFrom: nil)
            }
        } else {
            floodChannels = try await BenchConnector.connectMany(publishers, to: target, group: group) { _ in
                FloodPublisher(request: request, ledger: ledger, control: control)
            }
        }
        var series: [Int] = []
        var lastSample = 0
        var nextSample = start + 1_000_000_000
        let publishEnd = start + UInt64(duration * 1e9)
        while benchNow() < publishEnd {
            try await Task.sleep(for: .milliseconds(20))
            if benchNow() >= nextSample {
                let total = progress.reduce(0) { $0 + $1.deliveries.load(ordering: .relaxed) }
                series.append(total - lastSample)
                lastSample = total
                nextSample += 1_000_000_000
            }
        }
        control.stop.store(true, ordering: .releasing)
        let deadline = ContinuousClock.now + .seconds(30)
        if let paced {
            // The schedule ends on its own; wait for the last sends and their acknowledgements.
            while try await !loop.submit({ paced.value.isFinished }).get() && ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(2))
            }
            let total = Int(Double(rate ?? 0) * duration)
            while ledger.ackedCount.load(ordering: .acquiring) + ledger.errors.load(ordering: .relaxed) < total
                    && ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(2))
            }
        }
        let stoppedAt = benchNow()
        let cpu = meter.read()
        let deliveredWhilePublishing = progress.reduce(0) { $0 + $1.deliveries.load(ordering: .relaxed) }
        while paced == nil && control.finished.load(ordering: .acquiring) < publishers && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(2))
        }
        var maxLag: UInt64?
        if let paced {
            maxLag = try await loop.submit {
                paced.value.stop()
                return paced.value.maxLag
            }.get()
        }
        let published = ledger.ackedCount.load(ordering: .acquiring)
        let publishSeconds = seconds(start, stoppedAt)
        benchLog("fan-out: \(published) publishes acknowledged; waiting for subscribers to catch up")
        let ackedSoFar = ledger.acked.withLock { $0 }
        let expectedPerChannel = ackedSoFar.countsByResidue(channelCount)
        let complete = try await waitForDelivery(progress, expected: { expectedPerChannel[$0 % channelCount] },
                                                 timeout: .seconds(max(30, duration * 3)))
        let caughtUp = benchNow()
        let serverSeconds = meter.serverSeconds()
        let dropped = progress.filter { $0.closed.load(ordering: .acquiring) }
        // WebSocket publishers end their sessions with `bye`, so an external server keeps none.
        if publishWire == .websocket { BenchConnector.sayGoodbye(floodChannels) }
        await close(publisherChannels + floodChannels)
        await closeSubscribers(subscriberChannels, transport: transport)
        let reports = reports(progress)
        let acked = ledger.acked.withLock { $0 }
        let lastDelivery = progress.map { $0.lastDelivery.load(ordering: .relaxed) }.max() ?? stoppedAt
        var result = FanoutResult(
            transport: transport.rawValue, subscribers: subscribers, publishers: publishers, targetRate: rate,
            maxScheduleLagMs: maxLag.map(milliseconds), stored: store, requestIDs: requestIDs, publishSeconds: publishSeconds,
            published: published, publishErrors: ledger.errors.load(ordering: .relaxed),
            publishesPerSecond: Double(published) / publishSeconds, deliveries: 0, deliveriesPerSecond: 0,
            deliveriesPerSecondWhilePublishing: Double(deliveredWhilePublishing) / publishSeconds,
            drainSeconds: complete ? seconds(stoppedAt, lastDelivery) : seconds(stoppedAt, caughtUp), complete: complete,
            lost: 0, subscribersWithLoss: 0, duplicates: 0, outOfOrder: 0, subscribeErrors: 0, subscribeResponses: 0,
            deliveriesPerSecondSeries: series, serverCPUPercent: cpu.server, clientCPUPercent: cpu.client,
            interruptCPUPercent: cpu.interrupts, otherCPUPercent: cpu.other)
        result.channels = channelCount
        result.publishWire = publishWire.rawValue
        if publishWire == .websocket { result.requestIDs = true }  // every publish frame carries one
        for (index, report) in reports.enumerated() {
            result.deliveries += report.deliveries
            let lost = acked.countMissing(from: report.received, residue: index % channelCount, modulus: channelCount)
            result.lost += lost
            if lost > 0 { result.subscribersWithLoss += 1 }
            result.duplicates += report.duplicates
            result.outOfOrder += report.outOfOrder
            result.subscribeErrors += report.errors
            result.subscribeResponses += report.responses
        }
        result.deliveriesPerSecond = Double(result.deliveries) / seconds(start, max(lastDelivery, stoppedAt))
        result.subscribersDropped = dropped.count
        result.firstDropReason = dropped.first.map { p in
            p.session.withLock { $0.closeCode.map { "close code \($0)" } ?? $0.lastError ?? "connection closed" }
        }
        if let serverSeconds, result.deliveries > 0 {
            result.serverMicrosPerDelivery = serverSeconds * 1e6 / Double(result.deliveries)
            result.serverMicrosPerRequest = serverSeconds * 1e6 / Double(result.published + result.publishErrors + result.subscribeResponses)
        }
        return result
    }

    /// Latency: an open-loop publisher at `rate` messages/s, `subscribers` long-polls receiving.
    func latency(target: BenchTarget, serverPID: Int32?, subscribers: Int, rate: Int, duration: Double, warmup: Double, store: Bool,
                 transport: BenchTransport) async throws -> LatencyResult {
        let channel = freshChannel("latency")
        let warmupCount = Int(Double(rate) * warmup)
        let total = warmupCount + Int(Double(rate) * duration)
        benchLog("latency: opening \(subscribers) \(transport.rawValue) subscribers on \(channel)")
        let (progress, subscriberChannels) = try await openSubscribers(subscribers, channel: channel, target: target,
                                                                       recordLatencyFrom: warmupCount, transport: transport)
        let ledger = PublishLedger()
        let loop = group.next()
        let request = PublishRequest(channel: channel, target: target, store: store)
        let publisher = try await loop.submit {
            NIOLoopBound(PacedPublisher(request: request, ledger: ledger, rate: rate, total: total), eventLoop: loop)
        }.get()
        let pool = max(16, rate / 50)
        let publisherChannels = try await BenchConnector.connectMany(pool, to: target, group: loop) { _ in
            publisher.value.makeConnection()
        }
        benchLog("latency: publishing \(rate) msg/s for \(warmup) s warm-up + \(duration) s")
        try await loop.submit { publisher.value.start(on: loop) }.get()
        try await Task.sleep(for: .seconds(warmup))
        let meter = CPUMeter(serverPID: serverPID)
        try await Task.sleep(for: .seconds(duration))
        let cpu = meter.read()
        let sendDeadline = ContinuousClock.now + .seconds(30)
        while try await !loop.submit({ publisher.value.isFinished }).get() && ContinuousClock.now < sendDeadline {
            try await Task.sleep(for: .milliseconds(10))
        }
        let ackDeadline = ContinuousClock.now + .seconds(30)
        while ledger.ackedCount.load(ordering: .acquiring) + ledger.errors.load(ordering: .relaxed) < total
                && ContinuousClock.now < ackDeadline {
            try await Task.sleep(for: .milliseconds(10))
        }
        let published = ledger.ackedCount.load(ordering: .acquiring)
        _ = try await waitForDelivery(progress, expected: published, timeout: .seconds(30))
        let (maxLag, lateSends) = try await loop.submit {
            let p = publisher.value
            p.stop()
            return (p.maxLag, p.lateSends)
        }.get()
        await close(publisherChannels)
        await closeSubscribers(subscriberChannels, transport: transport)
        let reports = reports(progress)
        let acked = ledger.acked.withLock { $0 }
        var latencies: [UInt64] = []
        latencies.reserveCapacity(reports.reduce(0) { $0 + $1.latencies.count })
        var lost = 0, duplicates = 0, outOfOrder = 0
        for report in reports {
            latencies.append(contentsOf: report.latencies)
            lost += acked.countMissing(from: report.received)
            duplicates += report.duplicates
            outOfOrder += report.outOfOrder
        }
        latencies.sort()
        let roundTrips = ledger.roundTrips.withLock { $0 }.sorted()
        let mean = latencies.isEmpty ? 0 : Double(latencies.reduce(0, &+)) / Double(latencies.count) / 1e6
        return LatencyResult(
            transport: transport.rawValue, subscribers: subscribers, rate: rate, stored: store, seconds: duration, warmupSeconds: warmup, published: published,
            samples: latencies.count, p50Ms: milliseconds(percentile(latencies, 0.5)), p90Ms: milliseconds(percentile(latencies, 0.9)),
            p99Ms: milliseconds(percentile(latencies, 0.99)), p999Ms: milliseconds(percentile(latencies, 0.999)),
            maxMs: milliseconds(latencies.last ?? 0), meanMs: mean,
            publishAckP50Ms: milliseconds(percentile(roundTrips, 0.5)), publishAckP99Ms: milliseconds(percentile(roundTrips, 0.99)),
            maxScheduleLagMs: milliseconds(maxLag), lateSends: lateSends, lost: lost, duplicates: duplicates, outOfOrder: outOfOrder,
            publishErrors: ledger.errors.load(ordering: .relaxed), serverCPUPercent: cpu.server, clientCPUPercent: cpu.client,
            interruptCPUPercent: cpu.interrupts, otherCPUPercent: cpu.other)
    }

    /// Reads `waiting_long_polls` from `/health`.
    private func waitingLongPolls(_ target: BenchTarget) async throws -> Int {
        let response = try await BenchConnector.get("/health", target: target, on: group.next())
        let object = try JSONSerialization.jsonObject(with: Data(response.body.readableBytesView)) as? [String: Any]
        return (object?["waiting_long_polls"] as? NSNumber)?.intValue ?? -1
    }

    /// What the memory run keeps open.
    enum IdleMode: String, Sendable, CaseIterable {
        /// Idle long-polls, one distinct channel each (the default).
        case longPoll = "long-poll"
        /// Idle long-polls all on one channel.
        case sharedChannel = "shared-channel"
        /// Bare keep-alive connections that never send a request (the connection's own cost).
        case connection
    }

    /// Memory: `count` idle long-polls (or connections) against a spawned server; the server's
    /// RSS before, with them open, after closing them, and with them open a second time.
    ///
    /// Over WebSocket (`transport`), each item is an idle session: upgraded, `hello`, and
    /// (except for `.connection`, which stops at `welcome`) subscribed to its channel; the sessions
    /// end with `bye` between the rounds.
    func memory(server: BenchServer, count: Int, mode: IdleMode, openFileLimit: Int, transport: BenchTransport = .longPoll) async throws -> MemoryResult {
        let target = server.target
        // Warm up: a handshake (for the cursor) and a health check, then let the server settle.
        let handshake = try await BenchConnector.get("/v2/subscribe/demo/bench-idle-0/0?tt=0&uuid=bench-idle",
                                                     target: target, on: group.next())
        guard handshake.status == 200,
              let cursor = handshake.body.withUnsafeReadableBytes({ raw in
                  BenchBytes.find("{\"t\":{\"t\":\"", in: raw, from: 0).flatMap { BenchBytes.decimal(in: raw, from: $0 + 11)?.value }
              })
        else { throw BenchError("handshake failed with status \(handshake.status)") }
        _ = try await waitingLongPolls(target)
        if transport == .websocket {
            // Warm the WebSocket endpoint too: one session, subscribed, ended with `bye`.
            let (_, warm) = try await openSubscribers(1, channel: "bench-idle-warm", target: target, recordLatencyFrom: nil,
                                                      transport: .websocket)
            await closeSubscribers(warm, transport: .websocket)
        }
        try await Task.sleep(for: .seconds(1))
        guard let before = server.residentKiB() else { throw BenchError("cannot read /proc/\(server.pid)/status") }
        let websocket = transport == .websocket
        let what = websocket ? (mode == .connection ? "idle sessions (hello only)" : "idle WebSocket sessions")
            : mode == .connection ? "idle connections" : "idle long-polls"
        let tally = IdleTally()
        let trailer = target.requestTrailer
        var sessionProgress: [SubscriberProgress] = []

        /// Opens the set, waits until the server holds all of them, lets it settle; returns the channels,
        /// the server's count and the seconds it took.
        func open(round: Int) async throws -> ([any Channel], Int, Double) {
            benchLog("memory: server RSS \(server.residentKiB() ?? 0) KiB; opening \(count) \(what) (round \(round))")
            let openStart = benchNow()
            if websocket {
                let progress = (0..<count).map { _ in SubscriberProgress() }
                let channels = try await BenchConnector.connectManyWebSockets(count, to: target, group: group, parallel: 256) { index in
                    BenchWebSocketSubscriber(
                        mode: mode == .connection ? .helloOnly : .subscribe(channel: mode == .sharedChannel ? "bench-idle" : "bench-idle-\(index)"),
                        uuid: "bench-idle-\(index)", target: target, progress: progress[index], recordLatencyFrom: nil)
                }
                var ready = 0
                let deadline = ContinuousClock.now + .seconds(120)
                while ContinuousClock.now < deadline {
                    ready = progress.reduce(0) { $0 + ($1.ready.load(ordering: .acquiring) ? 1 : 0) }
                    if ready >= count || progress.contains(where: { $0.closed.load(ordering: .acquiring) }) { break }
                    try await Task.sleep(for: .milliseconds(200))
                }
                let closed = progress.filter { $0.closed.load(ordering: .acquiring) }
                if let failed = closed.first {
                    let why = failed.session.withLock { $0.lastError ?? $0.closeCode.map { "close code \($0)" } ?? "closed" }
                    benchLog("memory: \(closed.count) sessions closed while opening (\(why))")
                }
                let openSeconds = seconds(openStart, benchNow())
                benchLog("memory: \(ready) sessions \(mode == .connection ? "welcomed" : "subscribed") after "
                         + "\(String(format: "%.1f", openSeconds)) s; letting the server settle")
                try await Task.sleep(for: .seconds(2))
                sessionProgress.append(contentsOf: progress)
                return (channels, ready, openSeconds)
            }
            let channels = try await BenchConnector.connectMany(count, to: target, group: group, parallel: 256) { index in
                let channel = mode == .sharedChannel ? "bench-idle" : "bench-idle-\(index)"
                return IdleLongPoll(
                    request: mode == .connection ? nil
                        : "GET /v2/subscribe/demo/\(channel)/0?tt=\(cursor)&tr=1&uuid=bench-idle-\(index)\(trailer)",
                    tally: tally)
            }
            var waiting = 0
            if mode != .connection {
                let deadline = ContinuousClock.now + .seconds(120)
                while ContinuousClock.now < deadline {
                    waiting = try await waitingLongPolls(target)
                    if waiting >= count { break }
                    try await Task.sleep(for: .milliseconds(200))
                }
            }
            let openSeconds = seconds(openStart, benchNow())
            benchLog("memory: \(mode == .connection ? count : waiting) open after \(String(format: "%.1f", openSeconds)) s; "
                     + "letting the server settle")
            try await Task.sleep(for: .seconds(mode == .connection ? 4 : 2))
            return (channels, waiting, openSeconds)
        }

        let (channels, waiting, openSeconds) = try await open(round: 1)
        let after = server.residentKiB() ?? 0
        await closeSubscribers(channels, transport: transport)
        try await Task.sleep(for: .seconds(2))
        let afterClose = server.residentKiB() ?? 0
        let (again, _, _) = try await open(round: 2)
        let afterReopen = server.residentKiB() ?? 0
        await closeSubscribers(again, transport: transport)
        let answered = tally.answered.load(ordering: .relaxed)
            + sessionProgress.reduce(0) { $0 + $1.deliveries.load(ordering: .relaxed) }
        return MemoryResult(transport: transport.rawValue, mode: mode.rawValue, longPolls: count, waitingOnServer: waiting, rssBeforeKiB: before, rssAfterKiB: after,
                            rssAfterCloseKiB: afterClose, rssAfterReopenKiB: afterReopen,
                            kibPerLongPoll: Double(after - before) / Double(max(count, 1)),
                            answeredEarly: answered, openFileLimit: openFileLimit, openSeconds: openSeconds)
    }
}
