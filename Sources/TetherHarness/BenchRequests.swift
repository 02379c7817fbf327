import Foundation
import NIOCore
import Synchronization

/// Result of the `requests` scenario: the server's CPU per request of one kind, closed loop.
struct RequestCostResult: Codable, Sendable {
    /// `floor`, `time`, `publish-realtime` (store=0), `publish-stored` or `subscribe-one`.
    var kind: String
    /// Keep-alive connections, one request in flight each.
    var connections: Int
    /// Seconds measured.
    var seconds: Double
    /// Requests answered with 200.
    var answered: Int
    /// Requests answered otherwise.
    var errors: Int
    /// Answered requests per second.
    var requestsPerSecond: Double
    /// The server's CPU time (user + system) over the run ÷ answered requests (µs; spawned servers only).
    var serverMicrosPerRequest: Double?
    /// Server, client, softirq and other processes' CPU, in percent of one CPU.
    var serverCPUPercent: Double?
    var clientCPUPercent: Double?
    var interruptCPUPercent: Double?
    var otherCPUPercent: Double?
}

/// Which request the `requests` scenario repeats.
enum RequestCostKind: String, CaseIterable, Sendable {
    /// The `subscribe-one` request sent to ``BenchFloorServer`` (a NIO server writing one
    /// prebuilt subscribe answer per request head) instead of Tether: what NIO and the kernel
    /// cost a request on this machine, subtracted from the other kinds in the report.
    case floor
    /// `GET /time/0`: Tether's least work (HTTP, routing, the response), no keyset and no store.
    case time
    /// A publish with `store=0`: validated, reserved, delivered to nobody, not stored.
    case publishRealtime = "publish-realtime"
    /// A stored publish: acknowledged after its group commit (the server's `--durability`).
    case publishStored = "publish-stored"
    /// A subscribe that returns one message at once: each connection's uuid subscribes to the
    /// run's channel from the timetoken of the first of two messages published before the run,
    /// so every answer is the second message, read from the in-memory window (with its presence
    /// heartbeat, cursor, plan and encoding; without the parking and wake-up of a live long-poll,
    /// which the fan-out runs measure with the publish).
    case subscribeOne = "subscribe-one"
}

/// A closed-loop connection that repeats one kind of request.
final class RequestFlood: BenchConnectionLogic {
    private let kind: RequestCostKind
    private let request: PublishRequest
    private let timeRequest: String
    /// The `subscribe-one` request; empty for the other kinds.
    private let subscribeRequest: String
    private let ledger: PublishLedger
    private let control: FloodControl
    private var inFlight = false
    private var done = false

    /// - Parameter after: `subscribe-one`: the timetoken to subscribe from; `uuid`, the connection's.
    init(kind: RequestCostKind, channel: String, target: BenchTarget, ledger: PublishLedger, control: FloodControl,
         after: UInt64 = 0, uuid: String = "bench-requests") {
        self.kind = kind
        self.request = PublishRequest(channel: channel, target: target, store: kind == .publishStored)
        self.timeRequest = "GET /time/0" + target.requestTrailer
        self.subscribeRequest = kind == .subscribeOne || kind == .floor
            ? "GET /v2/subscribe/demo/\(channel)/0?tt=\(after)&tr=1&uuid=\(uuid)" + target.requestTrailer : ""
        self.ledger = ledger
        self.control = control
    }

    func connectionActive(_ context: ChannelHandlerContext) { sendNext(context) }

    private func sendNext(_ context: ChannelHandlerContext) {
        guard !control.stop.load(ordering: .acquiring) else {
            finish()
            return
        }
        inFlight = true
        switch kind {
        case .time, .subscribeOne, .floor:
            let text = kind == .time ? timeRequest : subscribeRequest
            var buffer = context.channel.allocator.buffer(capacity: text.utf8.count)
            buffer.writeString(text)
            context.writeAndFlush(NIOAny(buffer), promise: nil)
        case .publishRealtime, .publishStored:
            let id = ledger.nextID.wrappingAdd(1, ordering: .relaxed).oldValue
            request.write(id: id, sentAt: benchNow(), context: context)
        }
    }

    func received(_ response: BenchResponse, context: ChannelHandlerContext) {
        if response.status == 200, kind != .subscribeOne && kind != .floor || Self.carriesOneMessage(response.body) {
            ledger.ackedCount.add(1, ordering: .relaxed)
        } else {
            ledger.errors.add(1, ordering: .relaxed)
        }
        inFlight = false
        sendNext(context)
    }

    /// Whether a subscribe answer carries exactly one message (`"m":[{…}]`, one `"p":{` in it).
    static func carriesOneMessage(_ body: ByteBuffer) -> Bool {
        body.withUnsafeReadableBytes { raw in
            guard let list = BenchBytes.find("\"m\":[{", in: raw, from: 0),
                  let first = BenchBytes.find("\"p\":{", in: raw, from: list) else { return false }
            return BenchBytes.find("\"p\":{", in: raw, from: first + 1) == nil
        }
    }

    private func finish() {
        guard !done else { return }
        done = true
        control.finished.add(1, ordering: .releasing)
    }

    func connectionClosed() {
        if inFlight { ledger.errors.add(1, ordering: .relaxed) }
        finish()
    }
}

extension BenchRunner {
    /// `requests`: `connections` closed-loop keep-alive connections repeat one kind of request for
    /// `duration` seconds; the server's CPU per answered request.
    func requestCost(kind: RequestCostKind, target: BenchTarget, serverPID: Int32?, connections: Int, duration: Double) async throws
        -> RequestCostResult
    {
        let ledger = PublishLedger()
        let control = FloodControl()
        let channel = freshChannel("requests")
        var after: UInt64 = 0
        if kind == .subscribeOne {
            // Two messages on the channel; every subscribe reads from the first one's timetoken.
            var timetokens: [UInt64] = []
            for text in ["first", "second"] {
                let published = try await BenchConnector.get("/publish/demo/demo/0/\(channel)/0/%22\(text)%22?store=0&uuid=bench-requests",
                                                             target: target, on: group.next())
                guard published.status == 200,
                      let timetoken = published.body.withUnsafeReadableBytes({ raw in
                          BenchBytes.find("\"Sent\",\"", in: raw, from: 0).flatMap { BenchBytes.decimal(in: raw, from: $0 + 8)?.value }
                      })
                else { throw BenchError("requests: the setup publish failed with status \(published.status)") }
                timetokens.append(timetoken)
            }
            after = timetokens[0]
        } else if kind == .floor {
            // The floor server reads no message: any timetoken of the same length gives the same
            // request bytes as `subscribe-one`.
            after = 17_957_854_125_496_650
        }
        benchLog("requests: \(kind.rawValue) over \(connections) keep-alive connections for \(duration) s")
        let meter = CPUMeter(serverPID: serverPID)
        let start = benchNow()
        let countAtStart = ledger.ackedCount.load(ordering: .relaxed)
        let channels = try await BenchConnector.connectMany(connections, to: target, group: group) { [after] index in
            RequestFlood(kind: kind, channel: channel, target: target, ledger: ledger, control: control,
                         after: after, uuid: "bench-requests-\(index)")
        }
        try await Task.sleep(for: .seconds(duration))
        let answered = ledger.ackedCount.load(ordering: .acquiring) - countAtStart
        let stoppedAt = benchNow()
        let cpu = meter.read()
        let serverSeconds = meter.serverSeconds()
        control.stop.store(true, ordering: .releasing)
        let deadline = ContinuousClock.now + .seconds(30)
        while control.finished.load(ordering: .acquiring) < connections && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(2))
        }
        await close(channels)
        let elapsed = seconds(start, stoppedAt)
        return RequestCostResult(
            kind: kind.rawValue, connections: connections, seconds: elapsed, answered: answered,
            errors: ledger.errors.load(ordering: .relaxed), requestsPerSecond: Double(answered) / elapsed,
            serverMicrosPerRequest: serverSeconds.flatMap { answered > 0 ? $0 * 1e6 / Double(answered) : nil },
            serverCPUPercent: cpu.server, clientCPUPercent: cpu.client, interruptCPUPercent: cpu.interrupts, otherCPUPercent: cpu.other)
    }
}
