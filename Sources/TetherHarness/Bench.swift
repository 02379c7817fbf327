package import ArgumentParser
import Foundation
import NIOCore
import NIOPosix
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// `tether bench`: load tests against a server (see docs/benchmarks.md).
package struct Bench: AsyncParsableCommand {
    /// The command line help.
    package static let configuration = CommandConfiguration(
        abstract: "Measure fan-out throughput, publish-to-receive latency, idle long-poll memory and presence at scale.",
        discussion: """
            By default each run starts its own `tether serve` (this same binary) on a free port \
            with a temporary data directory and stops it afterwards; --url measures an \
            already-running server instead. The memory run always spawns its server, because it \
            reads the server's RSS from /proc.

            fanout: one channel, --publishers closed-loop publishers (one publish in flight \
            each) for --duration seconds, one run per --subscribers entry. Reports deliveries/s \
            and checks that every subscriber received every acknowledged message exactly once, \
            in timetoken order.

            latency: --rate publishes/s (open loop) to --latency-subscribers subscribers; latency \
            is receive time minus the send time carried in the message.

            memory: --long-polls idle long-polls; the server's VmRSS before and with them open, \
            divided by their number.

            publish-dedup: publish throughput without and with a unique `requestid` on every \
            publish (the server's deduplication check), --dedup-rounds alternating fan-out runs \
            of each to the first --subscribers count, a fresh server per run; reports the median \
            publishes/s of each and the cost of the check. --request-ids adds request ids to the \
            fanout scenario's publishes instead.

            recorder (only when named): the live console's flight recorder driven directly — its \
            hooks in a loop on one thread, as one publish and a subscribe cycle per --subscribers \
            (the first count) cause them, over --recorder-clients uuids — with and without the \
            console; reports thread CPU ns per publish-equivalent (median of \
            --recorder-repetitions). console-cost: that, plus --rounds alternating fan-out runs \
            without and with the console (a fresh server each), reporting server CPU per publish \
            with the mean, median and 95 % confidence interval of the difference, and the \
            recorder's overhead in percent of the server's CPU per publish (--fanout-rate for \
            paced publishing).

            presence: --uuids distinct uuids heartbeat (heartbeat=300) over --channels channels, \
            --here-now-occupancy of them on one channel, through --presence-connections \
            keep-alive connections, --heartbeat-rounds times. Reports heartbeats/s, the server's \
            VmRSS per present uuid, the latency of --here-now-requests sequential here-now \
            requests for the large channel (its occupancy is checked) and the server's CPU over \
            --idle-seconds with everyone present and no requests. RSS and CPU need a spawned server.

            --transport websocket: the fan-out, latency and memory subscribers are WebSocket sessions \
            (GET /v2/ws, hello, subscribe) instead of long-polls; publishing stays REST. The memory \
            run then holds idle sessions. --publish-wire websocket: the fan-out's closed-loop \
            publishers send `publish` frames over WebSocket sessions (each with a request id) \
            instead of REST publishes.

            resume (only when named): --resume-sessions WebSocket sessions subscribe, drop their \
            sockets without `bye`, --resume-missed messages are published, and after --drop-seconds \
            they resume with their token and cursor. Reports hello → last replayed message and checks \
            that every missed message arrives exactly once, in order.

            requests (only when named): for each of --request-kinds (floor, time, publish-realtime = \
            store=0, publish-stored, subscribe-one = a subscribe answered at once with one message \
            from the window), --publishers closed-loop keep-alive connections repeat that \
            request for --duration seconds on a fresh spawned server, --request-rounds times; reports \
            requests/s and the server's CPU per request (medians). floor sends the subscribe-one \
            request to `tether bench floor-server` (this binary's: a NIO server writing one prebuilt \
            subscribe answer per request head) instead: what NIO and the kernel cost a request on \
            this machine, which the report subtracts from each other kind. A spawned server inherits the \
            environment, so TETHER_DURABILITY=normal measures stored publishes without fsync.

            --fanout-channels N spreads the fan-out subscribers over N channels (subscriber i on \
            channel i mod N) and publishes round-robin (message i to channel i mod N): with as many \
            subscribers as channels every delivery is one subscribe cycle carrying one message.

            TETHER_SERVER_BINARY=<path> makes spawned servers run another build's `tether` (to compare \
            builds with the same client).

            The client and a spawned server share the machine's CPUs; see docs/benchmarks.md.

            `tether bench soak` runs mixed legitimate and hostile load for minutes and reports the \
            server's peak memory (see its --help).
            """,
        subcommands: [BenchSoak.self, BenchFloorServer.self]
    )

    /// Which measurement to run.
    enum Scenario: String, ExpressibleByArgument, CaseIterable, Sendable {
        /// The fan-out, latency, memory or presence run, or all four in that order; or the
        /// WebSocket resume run (not part of `all`).
        case fanout, latency, memory, presence, resume, all
        /// Fan-out publish throughput without and with request ids (not part of `all`).
        case publishDedup = "publish-dedup"
        /// The server's CPU per request of each kind, closed loop (not part of `all`).
        case requests
        /// The console's flight recorder driven directly (not part of `all`).
        case recorder
        /// The recorder's direct cost plus alternating fan-out runs without and with the console.
        case consoleCost = "console-cost"
        /// Publish → deliver across nodes: one node on SQLite, then 1, 2, 3… nodes on one
        /// PostgreSQL (`--database-url`), publishers and subscribers spread over the nodes.
        case cluster
    }

    /// Which runs to do.
    @Option(help: "fanout, latency, memory, presence, all (those four), resume, publish-dedup, requests, recorder or console-cost.")
    var scenario: Scenario = .all

    /// The subscribers' wire.
    @Option(help: "Subscribers' wire for fanout, latency and memory: long-poll or websocket.")
    var transport: BenchTransport = .longPoll

    /// The fan-out publishers' wire.
    @Option(name: .customLong("publish-wire"), help: "Fan-out's closed-loop publishers: rest or websocket (publish frames on sessions).")
    var publishWire: BenchPublishWire = .rest

    /// Every fan-out publish carries a unique request id.
    @Flag(name: .customLong("request-ids"), help: "Fan-out: every publish carries a unique requestid (the server's deduplication check).")
    var requestIDs = false

    /// Request kinds of the requests scenario.
    @Option(name: .customLong("request-kinds"), help: "requests: comma-separated kinds: floor, time, publish-realtime, publish-stored, subscribe-one.")
    var requestKinds: String = "floor,time,publish-realtime,publish-stored,subscribe-one"

    /// Rounds of the requests scenario.
    @Option(name: .customLong("request-rounds"), help: "requests: rounds (each kind once per round, a fresh server per run); medians are reported.")
    var requestRounds: Int = 3

    /// Runs of each variant in the publish-dedup and console-cost scenarios.
    @Option(name: [.customLong("rounds"), .customLong("dedup-rounds")],
            help: "publish-dedup, console-cost: alternating runs of each variant (without, with).")
    var dedupRounds: Int = 3

    /// Distinct uuids the recorder scenario cycles through.
    @Option(name: .customLong("recorder-clients"), help: "recorder, console-cost: distinct uuids the recorder loop cycles through.")
    var recorderClients: Int = 1_000

    /// Publish-equivalents per timed repetition of the recorder loop.
    @Option(name: .customLong("recorder-iterations"), help: "recorder, console-cost: publish-equivalents per timed repetition.")
    var recorderIterations: Int = 20_000

    /// Timed repetitions of each recorder variant.
    @Option(name: .customLong("recorder-repetitions"), help: "recorder, console-cost: timed repetitions per variant (median reported).")
    var recorderRepetitions: Int = 9

    /// Sessions in the resume run.
    @Option(name: .customLong("resume-sessions"), help: "Resume run: WebSocket sessions that drop and resume.")
    var resumeSessions: Int = 1

    /// Messages published while the resume run's sessions are away.
    @Option(name: .customLong("resume-missed"), help: "Resume run: messages published while the sessions are away.")
    var resumeMissed: Int = 5_000

    /// Seconds the resume run's sessions stay away.
    @Option(name: .customLong("drop-seconds"), help: "Resume run: seconds from the drop to the resume.")
    var dropSeconds: Double = 30

    /// An external server to measure instead of spawning one.
    @Option(help: "Measure an already-running server (http://host:port) instead of spawning one.")
    var url: String?

    /// Seconds each fan-out and latency run publishes.
    @Option(help: "Seconds each fan-out and latency run publishes.")
    var duration: Double = 10

    /// Comma-separated subscriber counts for fan-out.
    @Option(help: "Comma-separated subscriber counts, one fan-out run each.")
    var subscribers: String = "100,1000"

    /// Channels the fan-out subscribers are spread over.
    @Option(name: .customLong("fanout-channels"),
            help: "Fan-out: spread the subscribers over this many channels (subscriber i on channel i mod N) and publish round-robin over them (message i to channel i mod N).")
    var fanoutChannels: Int = 1

    /// Closed-loop fan-out publishers.
    @Option(help: "Fan-out publishers: closed-loop connections, one publish in flight each.")
    var publishers: Int = 32

    /// Fan-out open-loop publish rate, or `nil` for closed-loop publishers.
    @Option(name: .customLong("fanout-rate"),
            help: "Fan-out: publish at this fixed rate (messages/s, open loop, --publishers connections) instead of closed loop.")
    var fanoutRate: Int?

    /// Latency run publish rate (messages/s).
    @Option(help: "Latency run publish rate (messages/s).")
    var rate: Int = 1000

    /// Subscribers in the latency run.
    @Option(name: .customLong("latency-subscribers"), help: "Subscribers in the latency run.")
    var latencySubscribers: Int = 10

    /// Seconds of the latency run not measured.
    @Option(help: "Seconds of the latency run excluded as warm-up.")
    var warmup: Double = 1

    /// Idle long-polls in the memory run.
    @Option(name: .customLong("long-polls"), help: "Idle long-polls in the memory run.")
    var longPolls: Int = 10_000

    /// What the memory run keeps open.
    @Option(name: .customLong("idle"), help: "Memory run: long-poll (one channel each), shared-channel, or connection (no request).")
    var idle: BenchRunner.IdleMode = .longPoll

    /// Present uuids in the presence run.
    @Option(help: "Presence run: distinct uuids made present.")
    var uuids: Int = 10_000

    /// Channels the presence run spreads its uuids over.
    @Option(help: "Presence run: channels the uuids are spread over.")
    var channels: Int = 1_000

    /// Occupants of the presence run's large channel.
    @Option(name: .customLong("here-now-occupancy"), help: "Presence run: uuids on the one large channel whose here-now is timed.")
    var hereNowOccupancy: Int = 1_000

    /// Sequential here-now requests per variant.
    @Option(name: .customLong("here-now-requests"), help: "Presence run: sequential here-now requests timed per variant.")
    var hereNowRequests: Int = 200

    /// Keep-alive connections sending heartbeats.
    @Option(name: .customLong("presence-connections"), help: "Presence run: keep-alive connections sending heartbeats, one in flight each.")
    var presenceConnections: Int = 16

    /// Heartbeat rounds (the first joins, later ones extend).
    @Option(name: .customLong("heartbeat-rounds"), help: "Presence run: times every uuid heartbeats (the first round joins).")
    var heartbeatRounds: Int = 3

    /// Seconds of the idle CPU window.
    @Option(name: .customLong("idle-seconds"), help: "Presence run: seconds the server's CPU is measured while idle with everyone present.")
    var idleSeconds: Double = 20

    /// Publish with `store=0`.
    @Flag(name: .customLong("no-store"), help: "Publish with store=0 (not durable; skips the SQLite write and fsync).")
    var noStore = false

    /// Event loop threads of the client.
    @Option(name: .customLong("client-threads"), help: "Event loop threads of the bench client (default: one per CPU).")
    var clientThreads: Int?

    /// Print JSON instead of tables.
    @Option(name: .customLong("database-url"),
            help: "cluster: the PostgreSQL (postgres://…) the spawned nodes share; each configuration starts on the tables as they are.")
    var databaseURL: String?

    @Option(name: .customLong("cluster-nodes"),
            help: "cluster: comma-separated node counts on PostgreSQL; 0 is one node on SQLite (the baseline).")
    var clusterNodes: String = "0,1,2,3"

    @Option(name: .customLong("cluster-subscribers"), help: "cluster: long-poll subscribers in all, spread over the nodes.")
    var clusterSubscribers: Int = 30

    @Option(name: .customLong("cluster-publishers"), help: "cluster: closed-loop publishers per node in the flood run.")
    var clusterPublishers: Int = 8

    @Flag(help: "Print the results as JSON instead of tables.")
    var json = false

    /// Spawned servers run with the console on (its flight recorder records every client).
    @Flag(name: .customLong("console"), help: "Spawned servers run with the live console on (an admin secret), to measure the flight recorder's cost.")
    var console = false

    /// The note when `--url` leaves no floor to measure.
    static let floorSkipped = "requests: floor not measured (it needs this machine's own floor server, and --url measures a server elsewhere)"

    /// Parsed `--request-kinds`.
    private var parsedRequestKinds: [RequestCostKind] {
        requestKinds.split(separator: ",").compactMap { RequestCostKind(rawValue: $0.trimmingCharacters(in: .whitespaces)) }
    }

    /// Parsed `--subscribers`.
    var subscriberCounts: [Int] {
        subscribers.split(separator: ",").compactMap { Int($0.trimmingCharacters(in: .whitespaces)) }
    }

    /// Checks the options.
    package func validate() throws {
        guard duration > 0 else { throw ValidationError("--duration must be positive") }
        if scenario == .cluster {
            let counts = clusterNodes.split(separator: ",", omittingEmptySubsequences: false)
                .map { Int($0.trimmingCharacters(in: .whitespaces)) }
            guard !counts.isEmpty, counts.allSatisfy({ $0.map { (0...16).contains($0) } ?? false }) else {
                throw ValidationError("--cluster-nodes takes node counts from 0 (one node on SQLite) to 16, e.g. 0,1,2,3")
            }
            guard (1...100_000).contains(clusterSubscribers) else {
                throw ValidationError("--cluster-subscribers must be between 1 and 100000")
            }
            guard (1...1_000).contains(clusterPublishers) else { throw ValidationError("--cluster-publishers must be between 1 and 1000") }
            guard (1...1_000_000).contains(rate) else { throw ValidationError("--rate must be between 1 and 1000000") }
            if counts.contains(where: { ($0 ?? 0) > 0 }) {
                guard let databaseURL, databaseURL.hasPrefix("postgres://") || databaseURL.hasPrefix("postgresql://") else {
                    throw ValidationError("--cluster-nodes above 0 needs --database-url postgres://… (scripts/postgres starts one)")
                }
            }
        }
        let counts = subscriberCounts
        guard !counts.isEmpty, counts.count == subscribers.split(separator: ",").count, counts.allSatisfy({ $0 > 0 }) else {
            throw ValidationError("--subscribers must be a comma-separated list of positive numbers")
        }
        guard publishers > 0 else { throw ValidationError("--publishers must be positive") }
        guard (1...100_000).contains(fanoutChannels) else { throw ValidationError("--fanout-channels must be between 1 and 100000") }
        guard !parsedRequestKinds.isEmpty, parsedRequestKinds.count == requestKinds.split(separator: ",").count else {
            throw ValidationError("--request-kinds must list some of: \(RequestCostKind.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        guard (1...50).contains(requestRounds) else { throw ValidationError("--request-rounds must be between 1 and 50") }
        guard (1...100).contains(dedupRounds) else { throw ValidationError("--rounds must be between 1 and 100") }
        guard recorderClients > 0, recorderIterations > 0, (1...101).contains(recorderRepetitions) else {
            throw ValidationError("--recorder-clients and --recorder-iterations must be positive, --recorder-repetitions 1 to 101")
        }
        if let fanoutRate, !(1...100_000).contains(fanoutRate) { throw ValidationError("--fanout-rate must be between 1 and 100000") }
        if publishWire == .websocket {
            guard fanoutRate == nil else {
                throw ValidationError("--publish-wire websocket publishes closed-loop: leave out --fanout-rate")
            }
            guard !requestIDs else {
                throw ValidationError("--publish-wire websocket: every publish frame carries a request id already; leave out --request-ids")
            }
        }
        guard rate > 0 && rate <= 100_000 else { throw ValidationError("--rate must be between 1 and 100000") }
        guard latencySubscribers > 0 else { throw ValidationError("--latency-subscribers must be positive") }
        guard warmup >= 0 else { throw ValidationError("--warmup must not be negative") }
        guard longPolls > 0 else { throw ValidationError("--long-polls must be positive") }
        if let clientThreads, clientThreads <= 0 { throw ValidationError("--client-threads must be positive") }
        guard channels > 0, uuids > 0 else { throw ValidationError("--uuids and --channels must be positive") }
        guard hereNowOccupancy > 0, hereNowOccupancy <= uuids else { throw ValidationError("--here-now-occupancy must be between 1 and --uuids") }
        guard channels == 1 ? hereNowOccupancy == uuids : uuids - hereNowOccupancy >= channels - 1 else {
            throw ValidationError("--uuids beyond --here-now-occupancy must fill every other channel (at least --channels − 1 of them)")
        }
        guard hereNowRequests > 0, presenceConnections > 0, heartbeatRounds > 0 else {
            throw ValidationError("--here-now-requests, --presence-connections and --heartbeat-rounds must be positive")
        }
        guard idleSeconds > 0 else { throw ValidationError("--idle-seconds must be positive") }
        guard resumeSessions > 0, resumeMissed > 0 else { throw ValidationError("--resume-sessions and --resume-missed must be positive") }
        guard dropSeconds >= 0 else { throw ValidationError("--drop-seconds must not be negative") }
        if let url, BenchTarget(url: url) == nil { throw ValidationError("--url must look like http://127.0.0.1:8090") }
    }

    /// Everything one `tether bench` invocation measured.
    struct Report: Codable, Sendable {
        /// The machine and build.
        var machine: BenchMachine
        /// `spawned` or the external URL.
        var server: String
        /// Client event loop threads.
        var clientThreads: Int
        /// Fan-out runs.
        var fanout: [FanoutResult] = []
        /// Latency run.
        var latency: LatencyResult?
        /// Memory run.
        var memory: MemoryResult?
        /// Presence run.
        var presence: PresenceResult?
        /// Publish throughput without and with request ids.
        var publishDedup: PublishDedupResult?
        /// WebSocket resume run.
        var resume: ResumeResult?
        /// Requests scenario runs, in the order they ran.
        var requests: [RequestCostResult] = []
        /// The flight recorder's direct cost (recorder scenario).
        var recorder: RecorderCostResult?
        /// Console off vs on (console-cost scenario).
        var consoleCost: ConsoleCostResult?
        /// Cluster configurations, in the order they ran.
        var cluster: [ClusterResult] = []
        /// Things the reader should know (skipped runs, limits).
        var notes: [String] = []
    }

    package init() {}

    /// Runs the selected measurements and prints the report.
    package func run() async throws {
        signal(SIGPIPE, SIG_IGN)
        let threads = clientThreads ?? System.coreCount
        let external = url.flatMap(BenchTarget.init(url:))
        let runFanout = scenario == .fanout || scenario == .all
        let runLatency = scenario == .latency || scenario == .all
        let runMemory = scenario == .memory || scenario == .all
        let runPresence = scenario == .presence || scenario == .all
        let runPublishDedup = scenario == .publishDedup
        let runResume = scenario == .resume
        let runRequests = scenario == .requests
        var report = Report(machine: .current(), server: external?.url ?? "spawned", clientThreads: threads)

        // Every connection is a file descriptor on both sides; children inherit the limit.
        var needed = 1024
        if runRequests { needed = max(needed, publishers + 256) }
        if runFanout || runPublishDedup || scenario == .consoleCost { needed = max(needed, (subscriberCounts.max() ?? 0) + publishers + 256) }
        if runMemory && external == nil { needed = max(needed, longPolls + 512) }
        let limit = BenchMachine.raiseOpenFileLimit(to: needed)
        var longPollCount = longPolls
        if limit < needed {
            let note = "open-file limit is \(limit) (hard limit reached), \(needed) wanted; raise it with `ulimit -n`"
            report.notes.append(note)
            benchLog(note)
            longPollCount = min(longPollCount, max(limit - 512, 1))
        }

        let group = MultiThreadedEventLoopGroup(numberOfThreads: threads)
        let runner = BenchRunner(group: group)
        do {
            if runFanout {
                for count in subscriberCounts {
                    let result = try await withServer(external) { target, pid in
                        try await runner.fanout(target: target, serverPID: pid, subscribers: count, channels: fanoutChannels,
                                                publishers: publishers, rate: fanoutRate, duration: duration, store: !noStore, requestIDs: requestIDs,
                                                transport: transport, publishWire: publishWire)
                    }
                    report.fanout.append(result)
                    if !json { benchLog(Self.describe(result)) }
                }
            }
            if runRequests {
                for _ in 0..<requestRounds {
                    for kind in parsedRequestKinds {
                        if kind == .floor, external != nil {
                            if !report.notes.contains(Self.floorSkipped) { report.notes.append(Self.floorSkipped) }
                            continue
                        }
                        let result = try await withServer(external, floor: kind == .floor) { target, pid in
                            try await runner.requestCost(kind: kind, target: target, serverPID: pid, connections: publishers, duration: duration)
                        }
                        report.requests.append(result)
                        if !json {
                            benchLog("\(kind.rawValue): \(Self.grouped(result.requestsPerSecond)) requests/s, "
                                     + (result.serverMicrosPerRequest.map { "\(Self.fixed($0)) µs of server CPU per request" } ?? "server CPU unknown"))
                        }
                    }
                }
            }
            if runPublishDedup {
                var result = PublishDedupResult(subscribers: subscriberCounts[0], publishers: publishers, stored: !noStore,
                                                seconds: duration, without: [], with: [])
                for round in 0..<dedupRounds {
                    // Alternating, and starting with the other variant every round, so drift in
                    // the machine's speed falls on both.
                    for withIDs in (round % 2 == 0 ? [false, true] : [true, false]) {
                        let run = try await withServer(external) { target, pid in
                            try await runner.fanout(target: target, serverPID: pid, subscribers: result.subscribers,
                                                    publishers: publishers, rate: nil, duration: duration, store: !noStore,
                                                    requestIDs: withIDs, transport: transport)
                        }
                        if withIDs { result.with.append(run) } else { result.without.append(run) }
                        if !json { benchLog((withIDs ? "with request ids: " : "without: ") + Self.describe(run)) }
                    }
                }
                report.publishDedup = result
            }
            if scenario == .recorder {
                report.recorder = measureRecorder(cyclesPerPublish: subscriberCounts[0])
            }
            if scenario == .consoleCost {
                report.consoleCost = try await measureConsoleCost(runner: runner, external: external)
            }
            if scenario == .cluster {
                report.cluster = try await measureCluster(runner: runner)
                report.notes.append("cluster: every node, the bench client and PostgreSQL share this machine's CPUs")
            }
            if runLatency {
                report.latency = try await withServer(external) { target, pid in
                    try await runner.latency(target: target, serverPID: pid, subscribers: latencySubscribers, rate: rate, duration: duration,
                                             warmup: warmup, store: !noStore, transport: transport)
                }
            }
            if runMemory {
                if external != nil {
                    report.notes.append("memory run skipped: it needs a server spawned by the bench (drop --url)")
                } else {
                    // Above the WebSocket connection bound's default (10,000), so the sessions fit.
                    let server = try await BenchServer(subscribeTimeout: 300,
                                                       extraArguments: ["--ws-max-connections", String(longPollCount + 1_000)])
                    do {
                        report.memory = try await runner.memory(server: server, count: longPollCount, mode: idle, openFileLimit: limit,
                                                                transport: transport)
                    } catch {
                        await server.stop()
                        throw error
                    }
                    await server.stop()
                }
            }
            if runPresence {
                func measure(_ target: BenchTarget, _ server: BenchServer?) async throws -> PresenceResult {
                    try await runner.presence(
                        target: target, server: server, uuids: uuids, channels: channels, largeOccupancy: hereNowOccupancy,
                        connections: presenceConnections, rounds: heartbeatRounds, hereNowRequests: hereNowRequests,
                        idleSeconds: idleSeconds)
                }
                if let external {
                    report.notes.append("presence run: server memory and CPU not measured (they need a server spawned by the bench)")
                    report.presence = try await measure(external, nil)
                } else {
                    let server = try await BenchServer()
                    benchLog("spawned server pid \(server.pid) at \(server.target.url)")
                    do {
                        report.presence = try await measure(server.target, server)
                    } catch {
                        await server.stop()
                        throw error
                    }
                    await server.stop()
                }
            }
            if runResume {
                report.resume = try await withServer(external) { target, pid in
                    try await runner.resume(target: target, serverPID: pid, sessions: resumeSessions, missed: resumeMissed,
                                            dropSeconds: dropSeconds, store: !noStore)
                }
            }
        } catch {
            try? await group.shutdownGracefully()
            throw error
        }
        try await group.shutdownGracefully()

        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            FileHandle.standardOutput.write(try encoder.encode(report))
            FileHandle.standardOutput.write(Data("\n".utf8))
        } else {
            print(Self.render(report))
        }
    }

    /// Runs `body` against the external server, or a freshly spawned one that is stopped afterwards.
    /// `console` overrides `--console` for a spawned server.
    func withServer<T>(_ external: BenchTarget?, console: Bool? = nil, floor: Bool = false,
                       _ body: (BenchTarget, Int32?) async throws -> T) async throws -> T {
        if let external { return try await body(external, nil) }
        let server = try await BenchServer(extraArguments: console ?? self.console ? ["--admin-secret", "bench-console-secret"] : [], floor: floor)
        benchLog("spawned \(floor ? "floor server" : "server") pid \(server.pid) at \(server.target.url)")
        do {
            let result = try await body(server.target, server.pid)
            await server.stop()
            return result
        } catch {
            await server.stop()
            throw error
        }
    }

    /// The cluster scenario: each configuration on freshly spawned nodes.
    func measureCluster(runner: BenchRunner) async throws -> [ClusterResult] {
        // Checked by validate().
        let counts = clusterNodes.split(separator: ",").compactMap { Int($0.trimmingCharacters(in: .whitespaces)) }
        var results: [ClusterResult] = []
        for count in counts {
            let arguments = count == 0 ? [] : ["--database-url", databaseURL ?? ""]
            var servers: [BenchServer] = []
            do {
                for _ in 0..<max(count, 1) { servers.append(try await BenchServer(extraArguments: arguments)) }
                benchLog("cluster: \(count == 0 ? "1 node on SQLite" : "\(count) node(s) on PostgreSQL"): "
                         + servers.map { "pid \($0.pid) \($0.target.url)" }.joined(separator: ", "))
                let result = try await runner.cluster(
                    store: count == 0 ? "sqlite" : "postgres", targets: servers.map(\.target), pids: servers.map(\.pid),
                    subscribers: clusterSubscribers, rate: rate, duration: duration, warmup: warmup, publishersPerNode: clusterPublishers)
                results.append(result)
                if !json { benchLog(Self.describe(result)) }
            } catch {
                for server in servers { await server.stop() }
                throw error
            }
            for server in servers { await server.stop() }
        }
        return results
    }

    // MARK: - Output

    static func describe(_ r: ClusterResult) -> String {
        "\(r.store) ×\(r.nodes): p50 \(fixed(r.p50Ms)) ms, p99 \(fixed(r.p99Ms)) ms at \(grouped(Double(r.rate))) msg/s; flood "
            + "\(grouped(r.publishesPerSecond)) publishes/s, \(grouped(r.deliveriesPerSecond)) deliveries/s; "
            + "missing \(r.lost), duplicates \(r.duplicates), out of order \(r.outOfOrder)"
    }

    /// The cluster table.
    private static func render(cluster results: [ClusterResult]) -> [String] {
        guard let first = results.first else { return [] }
        var lines = ["", "Cluster — publish → deliver across nodes: \(first.subscribers) long-poll subscribers on one channel and the "
                     + "publishers spread evenly over the nodes; paced \(grouped(Double(first.rate))) msg/s for \(fixed(first.seconds, 1)) s "
                     + "(latency), then \(first.publishersPerNode) closed-loop publishers per node (throughput, CPU); stored publishes"]
        let header = ["store", "nodes", "p50 ms", "p99 ms", "ack p99", "publishes/s", "deliveries/s", "node CPU", "node µs/delivery",
                      "all µs/dlv", "PG CPU", "missing", "dup", "ooo", "errors"]
        let widths = [8, 5, 8, 8, 8, 12, 13, 18, 22, 10, 7, 8, 4, 4, 7]
        lines.append(zip(header, widths).map { pad($0, $1) }.joined(separator: " "))
        for r in results {
            let row = [r.store, "\(r.nodes)", fixed(r.p50Ms), fixed(r.p99Ms), fixed(r.publishAckP99Ms), grouped(r.publishesPerSecond),
                       grouped(r.deliveriesPerSecond), r.nodeCPUPercent.map { percent($0) }.joined(separator: "/"),
                       r.nodeMicrosPerDelivery.map { fixed($0, 1) }.joined(separator: "/"),
                       r.clusterMicrosPerDelivery.map { fixed($0, 1) } ?? "-", percent(r.postgresCPUPercent),
                       grouped(Double(r.lost)), grouped(Double(r.duplicates)), grouped(Double(r.outOfOrder)), grouped(Double(r.publishErrors))]
            lines.append(zip(row, widths).map { pad($0, $1) }.joined(separator: " "))
        }
        return lines
    }

    static func describe(_ r: FanoutResult) -> String {
        "fan-out \(r.subscribers) \(r.transport) subscribers: \(grouped(r.deliveriesPerSecond)) deliveries/s, \(grouped(r.publishesPerSecond)) publishes/s, "
            + "missing \(r.lost)\(r.complete ? "" : " (drain timed out)"), duplicates \(r.duplicates), out of order \(r.outOfOrder)"
    }

    /// A number with thousands separators, no decimals.
    static func grouped(_ value: Double) -> String {
        let digits = String(Int(value.rounded()))
        var out = ""
        for (i, c) in digits.reversed().enumerated() {
            if i > 0 && i % 3 == 0 && c != "-" { out.append(",") }
            out.append(c)
        }
        return String(out.reversed())
    }

    /// A number with `decimals` decimals.
    static func fixed(_ value: Double, _ decimals: Int = 2) -> String {
        String(format: "%.\(decimals)f", value)
    }

    /// A whole percentage, or `-`.
    static func percent(_ value: Double?) -> String {
        value.map { "\(Int($0.rounded()))%" } ?? "-"
    }

    private static func pad(_ text: String, _ width: Int) -> String {
        text.count >= width ? text : String(repeating: " ", count: width - text.count) + text
    }

    /// The publish-dedup lines of the report.
    private static func render(_ r: PublishDedupResult) -> [String] {
        var lines = [""]
        lines.append("Publish throughput with and without request ids — \(r.publishers) closed-loop publishers, "
                     + "\(r.subscribers) subscriber(s), \(fixed(r.seconds, 1)) s per run, "
                     + (r.stored ? "stored (durable) publishes" : "store=0"))
        lines.append("  without request ids: \(r.without.map { grouped($0.publishesPerSecond) }.joined(separator: ", ")) publishes/s "
                     + "(median \(grouped(r.medianWithout)))")
        lines.append("  with request ids:    \(r.with.map { grouped($0.publishesPerSecond) }.joined(separator: ", ")) publishes/s "
                     + "(median \(grouped(r.medianWith)))")
        lines.append("  cost of the check: \(fixed(r.costPercent, 1)) % of publish throughput (median against median); "
                     + "missing \((r.with + r.without).reduce(0) { $0 + $1.lost }), "
                     + "duplicates \((r.with + r.without).reduce(0) { $0 + $1.duplicates }), "
                     + "publish errors \((r.with + r.without).reduce(0) { $0 + $1.publishErrors })")
        return lines
    }

    /// The human-readable tables.
    static func render(_ report: Report) -> String {
        let m = report.machine
        var lines: [String] = []
        lines.append("tether bench — \(m.date)")
        lines.append("machine: \(m.cpus) CPUs\(m.cpuModel.map { " (\($0))" } ?? ""), \(m.memoryMiB.map { "\($0) MiB" } ?? "? MiB"), "
                     + "Linux \(m.kernel); \(m.build) build")
        lines.append("server:  \(report.server == "spawned" ? "spawned `tether serve` (same binary), temporary data dir" : report.server); "
                     + "client: \(report.clientThreads) event-loop threads on the same machine")
        lines += render(cluster: report.cluster)
        if !report.fanout.isEmpty {
            let first = report.fanout[0]
            lines.append("")
            let publishing = first.targetRate.map { "publishing \(grouped(Double($0))) msg/s over \(first.publishers) connections" }
                ?? "\(first.publishers) closed-loop publishers"
                + (first.publishWire == BenchPublishWire.websocket.rawValue ? " (publish frames on WebSocket sessions)" : "")
            let wire = first.transport == BenchTransport.websocket.rawValue ? "WebSocket sessions" : "long-polls"
            let channelText = first.channels == 1 ? "one channel" : "\(grouped(Double(first.channels))) channels (round-robin)"
            lines.append("Fan-out (\(wire)) — \(channelText), \(publishing), \(fixed(first.publishSeconds, 1)) s, "
                         + (first.stored ? "stored (durable) publishes" : "store=0"))
            let header = ["subscribers", "publishes/s", "deliveries/s", "while publishing", "msgs/response", "drain s", "missing", "dup",
                          "out-of-order", "sub errors", "CPU: server", "client", "softirq", "other", "server µs/delivery", "µs/request"]
            let widths = [11, 12, 13, 17, 14, 8, 11, 5, 13, 11, 12, 7, 8, 6, 19, 10]
            lines.append(zip(header, widths).map { pad($0, $1) }.joined(separator: " "))
            for r in report.fanout {
                let row = [grouped(Double(r.subscribers)), grouped(r.publishesPerSecond), grouped(r.deliveriesPerSecond),
                           grouped(r.deliveriesPerSecondWhilePublishing),
                           fixed(Double(r.deliveries) / Double(max(r.subscribeResponses - r.subscribers, 1)), 1), fixed(r.drainSeconds) + (r.complete ? "" : "!"),
                           grouped(Double(r.lost)), grouped(Double(r.duplicates)), grouped(Double(r.outOfOrder)),
                           grouped(Double(r.subscribeErrors)), percent(r.serverCPUPercent), percent(r.clientCPUPercent),
                           percent(r.interruptCPUPercent), percent(r.otherCPUPercent),
                           r.serverMicrosPerDelivery.map { fixed($0) } ?? "-", r.serverMicrosPerRequest.map { fixed($0) } ?? "-"]
                lines.append(zip(row, widths).map { pad($0, $1) }.joined(separator: " "))
            }
            lines.append("  deliveries/s: first publish to last delivery; drain: end of publishing to last delivery; "
                         + (first.transport == BenchTransport.websocket.rawValue ? "msgs/response: deliveries per `messages` frame"
                            : "msgs/response: deliveries per long-poll answer"))
            lines.append("  server µs/delivery: the server's CPU from the first publish to the last delivery (publishes included) "
                         + "÷ deliveries; µs/request: the same CPU ÷ (publishes + subscribe responses)")
            lines.append("  CPU while publishing, 100% = one of \(m.cpus) CPUs; softirq is mostly loopback TCP; "
                         + "other = other processes (should be ~0%)")
            if let lag = report.fanout.compactMap(\.maxScheduleLagMs).max(), lag > 100 {
                lines.append("  ! the paced publisher fell up to \(fixed(lag, 0)) ms behind its schedule: the rate was not sustained")
            }
            for r in report.fanout where r.subscribersDropped > 0 {
                lines.append("  ! \(r.subscribersDropped) of \(r.subscribers) subscribers were disconnected by the server during the run"
                             + (r.firstDropReason.map { " (first: \($0))" } ?? ""))
            }
            if report.fanout.contains(where: { !$0.complete }) {
                lines.append("  ! drain timed out: subscribers were still catching up, so `missing` counts messages not yet "
                             + "delivered (not necessarily lost)")
            }
            if first.transport == BenchTransport.websocket.rawValue {
                for r in report.fanout where r.subscribers == 100 || r.subscribers == 1_000 {
                    if let micros = r.serverMicrosPerDelivery {
                        lines.append("  goal: ~0.3 µs of server CPU per delivery (NATS-class), 1 → \(grouped(Double(r.subscribers))) — "
                                     + "\(fixed(micros)) µs, \(micros <= 0.3 ? "met" : "NOT met")")
                    }
                }
            } else {
                if let r = report.fanout.first(where: { $0.subscribers == 100 && $0.channels == 1 }) {
                    lines.append("  target: ≥ 150,000 deliveries/s to 100 subscribers — \(r.deliveriesPerSecond >= 150_000 ? "met" : "NOT met")")
                }
                for r in report.fanout where r.stored && r.subscribers <= 1 && r.targetRate == nil {
                    lines.append("  goal (#16): ≥ 30,000 durable publishes/s from 16 keep-alive connections — "
                                 + "\(grouped(r.publishesPerSecond))/s over \(r.publishers), \(r.publishesPerSecond >= 30_000 ? "met" : "NOT met")")
                }
                for r in report.fanout where r.subscribers >= 1_000 && r.channels >= 1_000 {
                    lines.append("  goal (#16): ≥ 50,000 deliveries/s with 1,000 subscribers on 1,000 channels — "
                                 + "\(grouped(r.deliveriesPerSecond)), \(r.deliveriesPerSecond >= 50_000 ? "met" : "NOT met")")
                }
                for r in report.fanout {
                    if let micros = r.serverMicrosPerRequest {
                        lines.append("  goal (#16): ≤ 15 µs of server CPU per request (publish or subscribe cycle) — "
                                     + "\(fixed(micros)) µs with \(grouped(Double(r.subscribers))) subscriber(s), \(micros <= 15 ? "met" : "NOT met")")
                    }
                }
            }
        }
        if !report.requests.isEmpty {
            lines.append("Request cost — closed loop, one request in flight per keep-alive connection, a fresh server per run")
            let header = ["kind", "connections", "runs", "requests/s (median)", "server µs/request (median)", "above floor (µs)", "all runs (µs)", "errors"]
            let widths = [17, 11, 5, 20, 27, 17, 30, 7]
            lines.append(zip(header, widths).map { pad($0, $1) }.joined(separator: " "))
            func medianMicros(_ kind: RequestCostKind) -> Double? {
                let micros = report.requests.filter { $0.kind == kind.rawValue }.compactMap(\.serverMicrosPerRequest).sorted()
                return micros.isEmpty ? nil : micros[micros.count / 2]
            }
            let floor = medianMicros(.floor)
            for kind in RequestCostKind.allCases {
                let runs = report.requests.filter { $0.kind == kind.rawValue }
                guard !runs.isEmpty else { continue }
                let micros = runs.compactMap(\.serverMicrosPerRequest).sorted()
                let rates = runs.map(\.requestsPerSecond).sorted()
                let median = medianMicros(kind)
                var above = "-"
                if kind != .floor, let median, let floor { above = fixed(median - floor, 1) }
                let row = [kind.rawValue, grouped(Double(runs[0].connections)), String(runs.count), grouped(rates[rates.count / 2]),
                           median.map { fixed($0, 1) } ?? "-", above, micros.map { fixed($0, 1) }.joined(separator: " "),
                           grouped(Double(runs.reduce(0) { $0 + $1.errors }))]
                lines.append(zip(row, widths).map { pad($0, $1) }.joined(separator: " "))
            }
            lines.append("  server µs/request: the server's CPU time (user + system, /proc) over the run ÷ requests answered with 200")
            if let floor {
                lines.append("  floor: \(fixed(floor, 1)) µs — `tether bench floor-server` (a NIO server writing one prebuilt subscribe answer "
                             + "per request head, as Tether's hot path writes its answers) under the same load: what NIO and the kernel cost a "
                             + "request on this machine; above floor: what the server adds to it")
            }
            if let other = report.requests.compactMap(\.otherCPUPercent).max(), other > 10 {
                lines.append("  ! other processes used up to \(percent(other)) of a CPU during these runs: figures are noisy")
            }
            let stored = report.requests.filter { $0.kind == RequestCostKind.publishStored.rawValue }.compactMap(\.serverMicrosPerRequest).sorted()
            if !stored.isEmpty {
                let median = stored[stored.count / 2]
                lines.append("  goal (#16): a stored publish ≤ 15 µs of server CPU — \(fixed(median, 1)) µs, \(median <= 15 ? "met" : "NOT met")")
            }
            let subscribes = report.requests.filter { $0.kind == RequestCostKind.subscribeOne.rawValue }.compactMap(\.serverMicrosPerRequest).sorted()
            if !subscribes.isEmpty {
                let median = subscribes[subscribes.count / 2]
                lines.append("  goal (#16): a subscribe cycle returning one message ≤ 15 µs — \(fixed(median, 1)) µs answered from the window, "
                             + "\(median <= 15 ? "met" : "NOT met") (a live long-poll also parks and wakes: see the fan-out runs)")
            }
        }
        if let r = report.latency {
            lines.append("")
            lines.append("Latency (\(r.transport)) — \(grouped(Double(r.rate))) msg/s to \(r.subscribers) subscribers, \(fixed(r.seconds, 1)) s after "
                         + "\(fixed(r.warmupSeconds, 1)) s warm-up, \(r.stored ? "stored (durable) publishes" : "store=0")")
            lines.append("  publish → receive: p50 \(fixed(r.p50Ms)) ms, p90 \(fixed(r.p90Ms)) ms, p99 \(fixed(r.p99Ms)) ms, "
                         + "p99.9 \(fixed(r.p999Ms)) ms, max \(fixed(r.maxMs)) ms, mean \(fixed(r.meanMs)) ms (\(grouped(Double(r.samples))) samples)")
            lines.append("  publish acknowledgement: p50 \(fixed(r.publishAckP50Ms)) ms, p99 \(fixed(r.publishAckP99Ms)) ms; "
                         + "schedule lag max \(fixed(r.maxScheduleLagMs)) ms, \(r.lateSends) sends > 1 ms late")
            lines.append("  CPU while measuring (100% = one CPU): server \(percent(r.serverCPUPercent)), client \(percent(r.clientCPUPercent)), "
                         + "softirq \(percent(r.interruptCPUPercent)), other processes \(percent(r.otherCPUPercent))")
            lines.append("  published \(grouped(Double(r.published))), missing \(r.lost), duplicates \(r.duplicates), "
                         + "out of order \(r.outOfOrder), publish errors \(r.publishErrors)")
            if r.transport == BenchTransport.websocket.rawValue && r.rate == 1000 {
                lines.append("  goal: p99 ≤ 1 ms at 1,000 msg/s over WebSocket — \(r.p99Ms <= 1 ? "met" : "NOT met")")
            } else if r.rate == 1000 && r.subscribers == 10 {
                lines.append("  goal (#16): p99 ≤ 1 ms at 1,000 msg/s to 10 subscribers — \(r.p99Ms <= 1 ? "met" : "NOT met")")
            }
        }
        if let r = report.memory {
            let isConnection = r.mode == BenchRunner.IdleMode.connection.rawValue
            let websocket = r.transport == BenchTransport.websocket.rawValue
            let what = websocket ? (isConnection ? "idle session (hello only)" : "idle WebSocket session")
                : isConnection ? "idle connection" : "idle long-poll"
            lines.append("")
            let shape = switch BenchRunner.IdleMode(rawValue: r.mode) {
            case .sharedChannel: "all on one channel"
            case .connection: websocket ? "welcomed, not subscribed" : "connected, no request sent"
            default: "one channel each"
            }
            let plural = websocket && isConnection ? "idle sessions (hello only)" : what + "s"
            lines.append("Idle memory — \(grouped(Double(r.longPolls))) \(plural), \(shape) (open-file limit \(r.openFileLimit))")
            lines.append("  server VmRSS: \(grouped(Double(r.rssBeforeKiB))) KiB before, \(grouped(Double(r.rssAfterKiB))) KiB with them open"
                         + (websocket ? " (\(grouped(Double(r.waitingOnServer))) ready)"
                            : isConnection ? "" : " (\(grouped(Double(r.waitingOnServer))) waiting)"))
            lines.append("  after closing them \(grouped(Double(r.rssAfterCloseKiB))) KiB; with as many open again "
                         + "\(grouped(Double(r.rssAfterReopenKiB))) KiB")
            lines.append("  \(fixed(r.kibPerLongPoll)) KiB per \(what) (opened in \(fixed(r.openSeconds, 1)) s"
                         + (r.answeredEarly > 0 ? ", \(r.answeredEarly) answered early" : "") + ")")
            if websocket && r.longPolls >= 10_000 {
                lines.append("  goal: ≤ 8 KiB per idle session at 10,000 — \(r.kibPerLongPoll <= 8 ? "met" : "NOT met")")
            } else if !websocket && !isConnection && r.longPolls >= 10_000 {
                lines.append("  goal (#16): ≤ 8 KiB per idle long-poll at 10,000 — \(r.kibPerLongPoll <= 8 ? "met" : "NOT met")")
            }
        }
        if let r = report.presence {
            lines += renderPresence(r)
        }
        if let r = report.publishDedup {
            lines += render(r)
        }
        if let r = report.resume {
            lines += renderResume(r)
        }
        if let r = report.recorder {
            lines += renderRecorder(r)
        }
        if let r = report.consoleCost {
            lines += renderConsoleCost(r)
        }
        for note in report.notes {
            lines.append("note: \(note)")
        }
        return lines.joined(separator: "\n")
    }
}

extension BenchRunner.IdleMode: ExpressibleByArgument {}

extension BenchTransport: ExpressibleByArgument {}
extension BenchPublishWire: ExpressibleByArgument {}

extension Bench {
    /// The resume run's lines.
    static func renderResume(_ r: ResumeResult) -> [String] {
        func spread(_ values: [Double]) -> String {
            let sorted = values.sorted()
            guard let low = sorted.first, let high = sorted.last else { return "-" }
            if sorted.count == 1 { return "\(fixed(low)) ms" }
            return "min \(fixed(low)) ms, median \(fixed(sorted[sorted.count / 2])) ms, max \(fixed(high)) ms"
        }
        var lines = [""]
        lines.append("Resume (WebSocket) — \(r.sessions) session\(r.sessions == 1 ? "" : "s") dropped (TCP close, no bye), "
                     + "\(grouped(Double(r.missed))) messages published while away (\(r.stored ? "stored" : "store=0"), "
                     + "in \(fixed(r.publishSeconds)) s), resumed after \(fixed(r.dropSeconds, 1)) s with token + cursor")
        lines.append("  resumed: \(r.resumed) of \(r.sessions); hello → welcome: \(spread(r.welcomeMs))")
        lines.append("  resume time, hello → last missed message: \(spread(r.resumeMs))\(r.complete ? "" : " (INCOMPLETE: timed out)")")
        lines.append("  replay: \(grouped(Double(r.replayFrames))) messages frames"
                     + (r.serverCPUMs.map { "; server CPU \(fixed($0, 1)) ms" } ?? ""))
        lines.append("  missing \(r.lost), duplicates \(r.duplicates), out of order \(r.outOfOrder), errors \(r.errors), "
                     + "publish errors \(r.publishErrors)" + (r.firstError.map { " — first: \($0)" } ?? ""))
        return lines
    }
}
