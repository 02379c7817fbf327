import ArgumentParser
import Foundation
import Logging
import Synchronization
import Tether
import TetherTesting

/// `tether chaos suite`: every seed situation, reproduced against a real server with Tether's SDK
/// (on long-poll and on its WebSocket session) and the PubNub Python SDK (threaded and asyncio)
/// side by side; see `docs/resilience.md`.
struct ChaosSuite: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "suite",
        abstract: "Run the resilience scenarios with Tether's SDK (long-poll and WebSocket) and the PubNub Python SDK and print the side-by-side table.",
        discussion: """
            For each scenario: a fresh `tether serve`, a fault proxy in front of it, one probe process \
            per SDK subscribed through the proxy, and a publisher sending numbered messages straight \
            to the server. The fault is injected, and every client's deliveries are checked against \
            what the server acknowledged: lost, duplicated, out of order, time from the fault's end \
            to caught up, and the statuses each SDK emitted. Tether's SDK runs twice: on long-poll \
            (tether) and on its WebSocket session (tether-ws). Exits 1 when Tether's SDK, on \
            either wire, lost, duplicated or reordered anything or did not catch up. The background \
            scenario runs one probe per policy and preset (and PubNub's own catch-up recipe), \
            freezes them all with SIGSTOP for 10 minutes (--quick: 60 s) and prints its own table.

              tether chaos suite                              # the full suite (about 26 minutes)
              tether chaos suite --quick                      # time-compressed (durations x0.1), as in scripts/test
              tether chaos suite --scenario tunnel --sdk tether --sdk tether-ws
              tether chaos suite --scenario background        # background 10 min, then foreground, every policy and preset
              tether chaos suite --markdown table.md --json results.json

            The PubNub probes need Python with `pubnub` (pip install pubnub==10.8.0); --python picks \
            the interpreter (default: ./.venv/bin/python when present, else python3). The Wi-Fi → \
            cellular scenario needs root and iproute2 (network namespaces); without them it is \
            reported as skipped.
            """)

    @Option(help: "A scenario to run (repeatable; default: all). --list shows them.")
    var scenario: [String] = []

    @Option(help: "An SDK to run: tether, tether-ws, pubnub-threaded, pubnub-asyncio (repeatable; default: all).")
    var sdk: [String] = []

    @Option(help: "Multiply every fault duration by this (0.1 compresses 30 s to 3 s).")
    var scale: Double = 1.0

    @Option(name: .customLong("storm-clients"), help: "Clients per SDK in the reconnection storm.")
    var stormClients = 500

    @Option(name: .customLong("storm-threaded-clients"),
            help: "Clients in the storm for the threaded PubNub SDK (each runs its own OS threads).")
    var stormThreadedClients = 100

    @Option(name: .customLong("settle-timeout"), help: "Seconds to wait after a fault for every client to catch up.")
    var settleTimeout: Double = 60

    @Flag(help: "Time-compressed run: --scale 0.1, 50 storm clients, 20 s settle timeout (what scripts/test runs).")
    var quick = false

    @Option(help: "Python interpreter with the pubnub package.")
    var python: String?

    @Option(help: "Also write the Markdown table here.")
    var markdown: String?

    @Option(help: "Also write every result as JSON here.")
    var json: String?

    @Option(name: .customLong("work-dir"), help: "Where servers keep their data and logs (default: a new temporary directory).")
    var workDirectory: String?

    @Flag(help: "List the scenarios and exit.")
    var list = false

    func validate() throws {
        let known = Set(ChaosScenario.ID.allCases.map(\.rawValue))
        for name in scenario where !known.contains(name) {
            throw ValidationError("unknown scenario '\(name)'; known: \(known.sorted().joined(separator: ", "))")
        }
        for name in sdk where ChaosSDK(rawValue: name) == nil {
            throw ValidationError("unknown SDK '\(name)'; known: \(ChaosSDK.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        guard scale > 0, scale <= 10 else { throw ValidationError("--scale must be in (0, 10]") }
        guard stormClients >= 1, stormThreadedClients >= 1 else { throw ValidationError("storm client counts must be at least 1") }
    }

    func run() async throws {
        if list {
            for item in ChaosScenario.all { print("\(item.id.rawValue.padding(toLength: 20, withPad: " ", startingAt: 0)) \(item.summary)") }
            return
        }
        // Every simulated client is a socket; children inherit the limit.
        _ = BenchMachine.raiseOpenFileLimit(to: .max)
        let options = ChaosRunOptions(
            scale: quick ? 0.1 : scale, stormClients: quick ? min(stormClients, 50) : stormClients,
            stormThreadedClients: quick ? min(stormThreadedClients, 25) : stormThreadedClients,
            settleTimeout: quick ? min(settleTimeout, 20) : settleTimeout)
        let scenarios = scenario.isEmpty ? ChaosScenario.all : ChaosScenario.all.filter { scenario.contains($0.id.rawValue) }
        let sdks = sdk.isEmpty ? ChaosSDK.allCases : ChaosSDK.allCases.filter { sdk.contains($0.rawValue) }
        let work = workDirectory ?? NSTemporaryDirectory() + "tether-chaos-\(getpid())"
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)

        let pythonPath = python ?? (FileManager.default.isExecutableFile(atPath: ".venv/bin/python") ? ".venv/bin/python" : "python3")
        let probeScript = work + "/pubnub_probe.py"
        try ChaosPythonProbe.script.write(toFile: probeScript, atomically: true, encoding: .utf8)
        let pubnubVersion = runCommand([pythonPath, "-c", "import pubnub.pubnub, importlib.metadata as m; print(m.version('pubnub'))"])
        let pythonProblem = pubnubVersion.status == 0 ? nil
            : "skipped: `\(pythonPath)` cannot import pubnub (pip install pubnub==10.8.0)"

        say("tether chaos suite: \(scenarios.count) scenario(s), SDKs \(sdks.map(\.rawValue).joined(separator: ", ")), "
            + "scale \(options.scale), work dir \(work)")
        if let pythonProblem { say(pythonProblem) } else {
            say("PubNub Python SDK \(pubnubVersion.output.trimmingCharacters(in: .whitespacesAndNewlines)) via \(pythonPath)")
        }

        var results: [ChaosResult] = []
        for item in scenarios {
            say("== \(item.id.rawValue): \(item.summary)")
            let runner = ChaosScenarioRunner(scenario: item, options: options, sdks: sdks, workDirectory: work + "/" + item.id.rawValue,
                                             pythonPath: pythonPath, probeScript: probeScript, pythonProblem: pythonProblem)
            let outcome = await runner.run()
            for result in outcome {
                if let counts = result.lifecycle, result.note == nil {
                    say("   \(result.sdk.rawValue) \(counts.column): published while away \(counts.publishedAway), lost \(result.lost), "
                        + "duplicated \(result.duplicated), out of order \(result.outOfOrder), skipped reported "
                        + "\(counts.skippedReported.map(String.init) ?? "–") / in range \(counts.skippedInRange), caught up "
                        + "\(ChaosTable.caughtUpCell(result)); \(counts.continuity.joined(separator: ", ")); \(ChaosTable.statusesCell(result))")
                    continue
                }
                if let counts = result.publishing, result.note == nil {
                    say("   \(result.sdk.rawValue): published \(counts.published), stored \(counts.stored), duplicated \(counts.duplicated), "
                        + "lost silently \(counts.lostSilently), failed visibly \(counts.failedVisibly), out of order \(counts.outOfOrder)")
                    continue
                }
                say("   \(result.sdk.rawValue): " + (result.note ?? "lost \(result.lost), duplicated \(result.duplicated), "
                    + "out of order \(result.outOfOrder), caught up \(ChaosTable.caughtUpCell(result)); "
                    + "statuses \(ChaosTable.statusesCell(result))"))
            }
            results += outcome
        }

        var table = scenarios.contains(where: { !$0.isPublisherSide && !$0.isLifecycle })
            ? ChaosTable.markdown(results, scenarios: scenarios) : ""
        if let publishing = ChaosPublishing.markdown(results) { table += (table.isEmpty ? "" : "\n\n") + "Publisher side:\n\n" + publishing }
        if let lifecycle = ChaosTable.lifecycleMarkdown(results) { table += (table.isEmpty ? "" : "\n\n") + lifecycle }
        print("")
        print(table)
        if let markdown { try (table + "\n").write(toFile: markdown, atomically: true, encoding: .utf8) }
        if let json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            try encoder.encode(results).write(to: URL(fileURLWithPath: json))
        }
        let failures = results.filter { $0.sdk.isTether && !$0.isClean && !($0.note?.hasPrefix("skipped") ?? false) }
        if !failures.isEmpty {
            say("\nTether's SDK did not hold the line in: \(failures.map { "\($0.scenario) (\($0.lifecycle?.column ?? $0.sdk.rawValue))" }.joined(separator: ", "))")
            throw ExitCode.failure
        }
    }
}

/// Durations and sizes of one suite run.
struct ChaosRunOptions: Sendable {
    var scale: Double
    var stormClients: Int
    var stormThreadedClients: Int
    var settleTimeout: Double

    /// `seconds` scaled, never below 0.2 s.
    func scaled(_ seconds: Double) -> Duration { .milliseconds(Int64(max(0.2, seconds * scale) * 1000)) }
}

/// Prints a progress line at once.
private func say(_ text: String) {
    FileHandle.standardError.write(Data((text + "\n").utf8))
}

/// Runs one scenario end to end.
struct ChaosScenarioRunner: Sendable {
    static let authKey = "chaos-auth"
    static let accessManagerKeys = (publish: "chaos-pub", subscribe: "chaos-sub", secret: "chaos-secret")

    let scenario: ChaosScenario
    let options: ChaosRunOptions
    let sdks: [ChaosSDK]
    let workDirectory: String
    let pythonPath: String
    let probeScript: String
    let pythonProblem: String?

    func run() async -> [ChaosResult] {
        do {
            return try await runChecked()
        } catch {
            return sdks.map { failure($0, note: "the scenario could not run: \(error)") }
        }
    }

    private func failure(_ sdk: ChaosSDK, note: String) -> ChaosResult {
        ChaosResult(scenario: scenario.id.rawValue, sdk: sdk, clients: 0, notConnected: 0, lost: 0, duplicated: 0, outOfOrder: 0,
                    caughtUpClients: 0, caughtUpMedian: nil, caughtUpMax: nil, statuses: [], peakReconnectsPerSecond: nil, note: note)
    }

    private func clients(for sdk: ChaosSDK) -> Int {
        guard scenario.isStorm else { return 1 }
        return sdk == .pubnubThreaded ? options.stormThreadedClients : options.stormClients
    }

    private func runChecked() async throws -> [ChaosResult] {
        try? FileManager.default.removeItem(atPath: workDirectory)
        try FileManager.default.createDirectory(atPath: workDirectory, withIntermediateDirectories: true)
        if scenario.isPublisherSide { return try await runPublisher() }
        if scenario.isLifecycle { return try await runBackground() }
        let keys = ChaosScenarioRunner.accessManagerKeys
        // Every simulated device shares one loopback address, which the default per-address
        // rate limits would read as one abusive client; the suite measures network faults.
        let config = """
            {"demoKeyset": true, "rateLimiting": false, "keysets": [{"name": "chaos-access-manager", "publishKey": "\(keys.publish)", \
            "subscribeKey": "\(keys.subscribe)", "secretKey": "\(keys.secret)"}]}
            """
        try config.write(toFile: workDirectory + "/tether.json", atomically: true, encoding: .utf8)
        let server = ServerProcess(
            arguments: ["--data-dir", workDirectory + "/data", "--config", workDirectory + "/tether.json", "--log-level", "warning"],
            logPath: workDirectory + "/server.log")
        try await server.start()
        defer { Task { await server.stop() } }

        var namespace: ChaosNetworkNamespace?
        if scenario.needsNamespace {
            do {
                namespace = try ChaosNetworkNamespace.create()
            } catch {
                await server.stop()
                return sdks.map { failure($0, note: "skipped: network namespaces unavailable here (\(error))") }
            }
        }
        defer { namespace?.destroy() }

        var proxyLogger = Logger(label: "tether.chaos.proxy")
        proxyLogger.logLevel = .critical
        let proxy = try await FaultProxy.start(host: namespace?.serviceAddress ?? "127.0.0.1", port: 0, upstream: server.origin,
                                               logger: proxyLogger)
        let channel = "chaos-\(scenario.id.rawValue)-\(UInt32.random(in: 0...UInt32.max))"
        let subscribeKey = scenario.usesAccessManager ? keys.subscribe : "demo"
        let admin = try makeAdmin(origin: server.origin)
        if scenario.usesAccessManager {
            try await admin.grant(AuthKeyGrant(channels: [channel], authKeys: [Self.authKey], read: true, write: false, ttlMinutes: 0))
        }

        // Probes: through the proxy, or straight to the server for the server's own restarts.
        let clientOrigin = scenario.direct ? server.origin : proxy.origin
        var probes: [ProbeProcess] = []
        var notes: [ChaosSDK: String] = [:]
        for sdk in sdks {
            if !sdk.isTether, let pythonProblem {
                notes[sdk] = pythonProblem
                continue
            }
            var command = namespace?.prefix ?? []
            switch sdk {
            case .tether, .tetherWebSocket:
                command += [ServerProcess.executablePath, "chaos", "probe", "--origin", clientOrigin, "--channel", channel,
                            "--clients", String(clients(for: sdk)), "--sub-key", subscribeKey, "--user-prefix", sdk.rawValue,
                            "--transport", sdk == .tetherWebSocket ? "websocket" : "long-poll"]
            case .pubnubThreaded, .pubnubAsyncio:
                command += [absolute(pythonPath), "-u", probeScript, "--mode", sdk == .pubnubThreaded ? "threaded" : "asyncio",
                            "--origin", clientOrigin, "--channel", channel, "--clients", String(clients(for: sdk)),
                            "--sub-key", subscribeKey, "--user-prefix", sdk.rawValue]
            }
            if scenario.usesAccessManager { command += ["--auth-key", Self.authKey] }
            if command[0] != "/usr/sbin/ip", !command[0].hasPrefix("/") { command[0] = absolute(command[0]) }
            probes.append(try ProbeProcess(sdk: sdk, clients: clients(for: sdk), command: command,
                                           stderrPath: workDirectory + "/probe-\(sdk.rawValue).log"))
        }
        defer { for probe in probes { Task { await probe.stop(grace: .seconds(1)) } } }

        // Wait until every client is connected (or 60 s).
        let connectDeadline = ContinuousClock.now + .seconds(60)
        while ContinuousClock.now < connectDeadline {
            if probes.allSatisfy({ connectedClients($0) >= $0.clients }) { break }
            try await Task.sleep(for: .milliseconds(100))
        }

        // Publish numbered messages straight to the server for the whole scenario.
        let publisher = ChaosPublisher(client: admin, channel: channel, rate: scenario.publishRate)
        let publishing = Task { await publisher.run() }
        try await Task.sleep(for: .seconds(2))

        let faultStart = unixMilliseconds()
        try await inject(server: server, proxy: proxy, admin: admin, channel: channel, namespace: namespace)
        let faultEnd = unixMilliseconds()

        // Keep publishing a little after the fault, then wait for every client to catch up.
        try await Task.sleep(for: .seconds(max(2, 3 * min(1, options.scale * 2))))
        publisher.stop()
        await publishing.value
        let published = publisher.records
        let expected = Set(published.filter(\.acknowledged).map(\.seq))
        let settleDeadline = ContinuousClock.now + .milliseconds(Int64(options.settleTimeout * 1000))
        while ContinuousClock.now < settleDeadline {
            if probes.allSatisfy({ everyClientHas(expected, probe: $0) }) { break }
            try await Task.sleep(for: .milliseconds(200))
        }
        // A short grace for late duplicates.
        try await Task.sleep(for: .milliseconds(500))

        var results: [ChaosResult] = []
        for sdk in sdks {
            if let note = notes[sdk] {
                results.append(failure(sdk, note: note))
                continue
            }
            guard let probe = probes.first(where: { $0.sdk == sdk }) else { continue }
            var result = ChaosMeasure.result(
                scenario: scenario.id.rawValue, sdk: sdk, clients: probe.clients, events: probe.snapshot, published: published,
                faultStart: faultStart, faultEnd: faultEnd, connectedCategory: sdk.connectedCategory,
                reconnectCategories: ["reconnected", "connected", "PNReconnectedCategory", "PNConnectedCategory"])
            if result.notConnected == probe.clients, !probe.isRunning {
                result.note = "the probe exited: \(probe.errorTail)"
            } else if expected.count < 5 {
                // Few enough to say the publishing itself broke. (The storm in `--quick` publishes
                // about 20 at 2 a second, and those sent while the server is down for 5 s fail:
                // 9 or 10 acknowledged is a normal run, which a bound of 10 made flaky.)
                result.note = "the run itself failed: only \(expected.count) publishes were acknowledged"
            }
            results.append(result)
        }
        for probe in probes { await probe.stop() }
        await proxy.stop()
        await admin.shutdown()
        let serverSurvived = server.isRunning
        await server.stop()
        if !serverSurvived {
            for index in results.indices where results[index].note == nil { results[index].note = "the server was not running at the end" }
        }
        return results
    }

    /// The publisher-side scenario: each SDK publishes through the proxy while the link flaps and
    /// the server restarts; then history is read straight from the server and counted.
    private func runPublisher() async throws -> [ChaosResult] {
        let server = ServerProcess(arguments: ["--data-dir", workDirectory + "/data", "--log-level", "warning", "--rate-limits", "off"],
                                   logPath: workDirectory + "/server.log")
        try await server.start()
        defer { Task { await server.stop() } }
        var proxyLogger = Logger(label: "tether.chaos.proxy")
        proxyLogger.logLevel = .critical
        let proxy = try await FaultProxy.start(port: 0, upstream: server.origin, logger: proxyLogger)
        let count = max(30, Int(300 * min(1, options.scale * 4)))
        let rate = Double(count) / (30 * options.scale)
        let pythonScript = workDirectory + "/pubnub_publish_probe.py"
        try ChaosPythonPublishProbe.script.write(toFile: pythonScript, atomically: true, encoding: .utf8)

        var probes: [(sdk: ChaosSDK, channel: String, probe: ProbeProcess)] = []
        var notes: [ChaosSDK: String] = [:]
        for sdk in sdks {
            let channel = "chaos-publisher-\(sdk.rawValue)-\(UInt32.random(in: 0...UInt32.max))"
            var command: [String]
            switch sdk {
            case .tether:
                command = [ServerProcess.executablePath, "chaos", "publish-probe", "--origin", proxy.origin, "--channel", channel,
                           "--count", String(count), "--rate", String(rate)]
            case .pubnubThreaded:
                if let pythonProblem {
                    notes[sdk] = pythonProblem
                    continue
                }
                command = [absolute(pythonPath), "-u", pythonScript, "--origin", proxy.origin, "--channel", channel,
                           "--count", String(count), "--rate", String(rate)]
            case .pubnubAsyncio:
                notes[sdk] = "skipped: the publisher scenario runs the threaded PubNub SDK (asyncio publishes the same way)"
                continue
            case .tetherWebSocket:
                notes[sdk] = "skipped: publishes go over REST through the outbox on either wire (the long-poll row is the same client)"
                continue
            }
            probes.append((sdk, channel, try ProbeProcess(sdk: sdk, clients: 1, command: command,
                                                          stderrPath: workDirectory + "/publish-probe-\(sdk.rawValue).log")))
        }
        defer { for entry in probes { Task { await entry.probe.stop(grace: .seconds(1)) } } }

        try await ChaosPublishing.flap(proxy: proxy, server: server, options: options)
        // Every probe has handed over its last message by now (the flapping lasts longer than the
        // publishing); wait for each to report that every message has settled.
        let settleDeadline = ContinuousClock.now + .seconds(max(60, options.settleTimeout * 3))
        while ContinuousClock.now < settleDeadline {
            if probes.allSatisfy({ entry in entry.probe.snapshot.contains { if case .publishDone = $0.kind { true } else { false } } }) { break }
            try await Task.sleep(for: .milliseconds(200))
        }
        let admin = try makeAdmin(origin: server.origin)
        var results: [ChaosResult] = []
        for sdk in sdks {
            if let note = notes[sdk] {
                results.append(failure(sdk, note: note))
                continue
            }
            guard let entry = probes.first(where: { $0.sdk == sdk }) else { continue }
            let events = entry.probe.snapshot
            var result = failure(sdk, note: "")
            result.clients = 1
            result.note = nil
            let history = try await admin.messages(since: .zero, channels: [entry.channel])
            result.publishing = ChaosPublishing.count(history: history, events: events, published: count)
            if !events.contains(where: { if case .publishDone = $0.kind { true } else { false } }) {
                result.note = entry.probe.isRunning ? "the probe had not settled every message when the suite gave up"
                    : "the probe exited: \(entry.probe.errorTail)"
            }
            results.append(result)
        }
        for entry in probes { await entry.probe.stop() }
        await proxy.stop()
        await admin.shutdown()
        await server.stop()
        return results
    }

    func absolute(_ path: String) -> String {
        guard !path.hasPrefix("/") else { return path }
        if path.contains("/") { return FileManager.default.currentDirectoryPath + "/" + path }
        let found = runCommand(["sh", "-c", "command -v \(path)"]).output.trimmingCharacters(in: .whitespacesAndNewlines)
        return found.isEmpty ? path : found
    }

    func makeAdmin(origin: String) throws -> TetherClient {
        var logger = Logger(label: "tether.chaos.publisher")
        logger.logLevel = .critical
        let keys = Self.accessManagerKeys
        var configuration = try TetherConfiguration(
            subscribeKey: scenario.usesAccessManager ? keys.subscribe : "demo", publishKey: scenario.usesAccessManager ? keys.publish : "demo",
            secretKey: scenario.usesAccessManager ? keys.secret : nil, userId: "chaos-publisher", origin: origin, useTLS: false, logger: logger)
        configuration.nonSubscribeTimeout = .seconds(5)
        configuration.connectTimeout = .seconds(2)
        // One attempt per publish, as the scenarios count them: a publish that fails is not
        // expected by the subscribers, and a retry must not store a message twice behind the
        // measurement's back (the scenarios measure the subscribe side).
        configuration.outbox.retry = .disabled
        return try TetherClient(configuration: configuration)
    }

    private func connectedClients(_ probe: ProbeProcess) -> Int {
        let category = probe.sdk.connectedCategory
        var clients: Set<Int> = []
        for event in probe.snapshot { if case .status(let c) = event.kind, c == category { clients.insert(event.client) } }
        return clients.count
    }

    private func everyClientHas(_ expected: Set<Int>, probe: ProbeProcess) -> Bool {
        var seen: [Int: Set<Int>] = [:]
        for event in probe.snapshot { if case .message(let seq) = event.kind { seen[event.client, default: []].insert(seq) } }
        return (0..<probe.clients).allSatisfy { expected.isSubset(of: seen[$0] ?? []) }
    }

    /// Injects the scenario's fault and returns when it has ended.
    private func inject(server: ServerProcess, proxy: FaultProxy, admin: TetherClient, channel: String,
                        namespace: ChaosNetworkNamespace?) async throws {
        let scaled = options.scaled
        switch scenario.id {
        case .tunnel:
            try await proxy.apply(.blackhole)
            try await Task.sleep(for: scaled(30))
            try await proxy.apply(.pass)
        case .wifiToCellular:
            guard let namespace else { throw ChaosError("no network namespace") }
            try namespace.routeOverCellular()   // new connections: cellular, a new source address
            await proxy.resetOpenConnections()  // every old connection reset (the RSTs arrive over Wi-Fi)
            try namespace.dropWifiLink()        // and the Wi-Fi link is gone
        case .serverRestart:
            await server.stop()
            try await server.start()
        case .serverDown:
            await server.stop()
            try await Task.sleep(for: scaled(120))
            try await server.start()
        case .captivePortal:
            // The portal takes the network over: established connections are cut, so an open
            // WebSocket meets the portal on its next upgrade like a long-poll on its next request
            // (without the cut a socket would never send another HTTP request to intercept).
            try await proxy.apply(.captivePortal)
            await proxy.resetOpenConnections()
            try await Task.sleep(for: scaled(20))
            try await proxy.apply(.pass)
        case .grantRevoked:
            try await admin.grant(AuthKeyGrant(channels: [channel], authKeys: [Self.authKey], read: false, write: false, ttlMinutes: 0))
            try await Task.sleep(for: scaled(20))
            try await admin.grant(AuthKeyGrant(channels: [channel], authKeys: [Self.authKey], read: true, write: false, ttlMinutes: 0))
        case .overload:
            // The load balancer sheds its connections too, so every wire meets the 429 on its
            // next connection (an established WebSocket sends no new request to answer).
            try await proxy.apply(.overloaded(retryAfterSeconds: max(1, Int((5 * options.scale).rounded()))))
            await proxy.resetOpenConnections()
            try await Task.sleep(for: scaled(20))
            try await proxy.apply(.pass)
        case .slowLink:
            try await proxy.apply(.latency(base: scaled(12), jitter: scaled(1)))
            try await Task.sleep(for: scaled(40))
            try await proxy.apply(.pass)
        case .outageBacklog:
            try await proxy.apply(.reset)
            try await Task.sleep(for: scaled(60))
            try await proxy.apply(.pass)
        case .reconnectionStorm:
            await server.stop()
            try await Task.sleep(for: scaled(5))
            try await server.start()
        case .publisherFlapping, .background:
            throw ChaosError("the \(scenario.id.rawValue) scenario runs its own faults")
        }
    }
}

/// Publishes `{"seq": n}` at a fixed rate straight to the server and records every outcome.
final class ChaosPublisher: Sendable {
    private let client: TetherClient
    private let channel: String
    private let rate: Double
    private let state = Mutex<(records: [PublishRecord], stopped: Bool)>(([], false))

    init(client: TetherClient, channel: String, rate: Double) {
        self.client = client
        self.channel = channel
        self.rate = rate
    }

    /// Every publish so far.
    var records: [PublishRecord] { state.withLock { $0.records } }

    /// Stops after the publish in progress.
    func stop() { state.withLock { $0.stopped = true } }

    /// Publishes until ``stop()``.
    func run() async {
        let start = ContinuousClock.now
        var seq = 0
        while !state.withLock({ $0.stopped }) {
            let due = start + .milliseconds(Int64(Double(seq) * 1000 / rate))
            if due > ContinuousClock.now { try? await Task.sleep(until: due, clock: .continuous) }
            let sentAt = unixMilliseconds()
            var timetoken: UInt64?
            do {
                timetoken = try await client.publish(channel: channel, message: ["seq": .number(JSONValue.Number(Int64(seq)))]).timetoken.rawValue
            } catch {}
            let record = PublishRecord(seq: seq, sentAt: sentAt, acknowledged: timetoken != nil, timetoken: timetoken)
            state.withLock { $0.records.append(record) }
            seq += 1
        }
    }
}
