import Foundation
import Synchronization

/// Errors of the chaos suite's machinery (not of the clients under test).
struct ChaosError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// Runs a command to completion; returns its exit status and combined output.
@discardableResult
func runCommand(_ arguments: [String]) -> (status: Int32, output: String) {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
    process.arguments = arguments
    let pipe = Pipe()
    process.standardOutput = pipe
    process.standardError = pipe
    do { try process.run() } catch { return (127, "\(error)") }
    let data = pipe.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return (process.terminationStatus, String(decoding: data, as: UTF8.self))
}

/// One event a probe reported.
struct ProbeEvent: Sendable {
    enum Kind: Sendable {
        case message(seq: Int), status(String)
        /// A typed connection event of the SDK (`session resumed`, `reconnect started`…).
        case event(String)
        /// Publisher probes: a message handed to the SDK, its acknowledgement, its failure, and
        /// the end of the run.
        case publishAccepted(seq: Int), publishSent(seq: Int, wasRepeat: Bool), publishFailed(seq: Int, category: String), publishDone
        /// The background scenario: a lifecycle line was acted on (`background`, `foreground`;
        /// the PubNub recipe also says `caught-up`).
        case lifecycle(String)
        /// A Tether continuity outcome (`skipped`, `recovered`, `gap`, `continuous`), its count
        /// (nil when not counted) and its range's bounds as raw timetokens.
        case continuity(outcome: String, count: Int?, from: UInt64?, through: UInt64?)
    }
    var client: Int
    var kind: Kind
    var at: Int64
}

/// A probe child process (`tether chaos probe` or the PubNub Python script): its events, parsed
/// from its JSON lines as they arrive. Closing its standard input stops it.
final class ProbeProcess: Sendable {
    let sdk: ChaosSDK
    let clients: Int
    private let process: Process
    private let input: Pipe
    private let events = Mutex<[ProbeEvent]>([])
    private let stderrPath: String

    init(sdk: ChaosSDK, clients: Int, command: [String], stderrPath: String) throws {
        self.sdk = sdk
        self.clients = clients
        self.stderrPath = stderrPath
        process = Process()
        process.executableURL = URL(fileURLWithPath: command[0])
        process.arguments = Array(command.dropFirst())
        input = Pipe()
        let output = Pipe()
        process.standardInput = input
        process.standardOutput = output
        guard FileManager.default.createFile(atPath: stderrPath, contents: nil) else { throw ChaosError("cannot create \(stderrPath)") }
        process.standardError = try FileHandle(forWritingTo: URL(fileURLWithPath: stderrPath))
        try process.run()
        // Every line is also kept beside the standard error log (`probe-….jsonl`), for diagnosis.
        let linesPath = (stderrPath.hasSuffix(".log") ? String(stderrPath.dropLast(4)) : stderrPath) + ".jsonl"
        let lines = FileManager.default.createFile(atPath: linesPath, contents: nil) ? FileHandle(forWritingAtPath: linesPath) : nil
        let reader = Thread { [self] in
            var pending = Data()
            while true {
                let chunk = output.fileHandleForReading.availableData
                if chunk.isEmpty {
                    try? lines?.close()
                    return
                }
                try? lines?.write(contentsOf: chunk)
                pending.append(chunk)
                var parsed: [ProbeEvent] = []
                while let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
                    let line = pending[pending.startIndex..<newline]
                    pending.removeSubrange(pending.startIndex...newline)
                    if let event = Self.parse(line) { parsed.append(event) }
                }
                if !parsed.isEmpty { self.events.withLock { $0 += parsed } }
            }
        }
        reader.start()
    }

    private static func parse(_ line: Data) -> ProbeEvent? {
        guard let object = try? JSONSerialization.jsonObject(with: line) as? [String: Any],
              let client = object["c"] as? Int, let kind = object["e"] as? String,
              let at = (object["at"] as? NSNumber)?.int64Value else { return nil }
        switch kind {
        case "msg": return ProbeEvent(client: client, kind: .message(seq: object["seq"] as? Int ?? -1), at: at)
        case "status": return ProbeEvent(client: client, kind: .status(object["cat"] as? String ?? "?"), at: at)
        case "event": return ProbeEvent(client: client, kind: .event(object["what"] as? String ?? "?"), at: at)
        case "accepted": return ProbeEvent(client: client, kind: .publishAccepted(seq: object["seq"] as? Int ?? -1), at: at)
        case "sent":
            return ProbeEvent(client: client, kind: .publishSent(seq: object["seq"] as? Int ?? -1, wasRepeat: object["repeat"] as? Bool ?? false),
                              at: at)
        case "failed":
            return ProbeEvent(client: client, kind: .publishFailed(seq: object["seq"] as? Int ?? -1, category: object["cat"] as? String ?? "?"),
                              at: at)
        case "done": return ProbeEvent(client: client, kind: .publishDone, at: at)
        case "lifecycle":
            var what = object["what"] as? String ?? "?"
            if what == "caught-up", let history = object["history"] as? Int, let pages = object["pages"] as? Int,
               let cached = object["cached"] as? Int {
                what = "history \(history) in \(pages) pages, \(cached) cached live"
            }
            return ProbeEvent(client: client, kind: .lifecycle(what), at: at)
        case "continuity":
            let count = (object["count"] as? Int).flatMap { $0 >= 0 ? $0 : nil }
            return ProbeEvent(client: client, kind: .continuity(outcome: object["outcome"] as? String ?? "?", count: count,
                                                                from: (object["from"] as? String).flatMap { UInt64($0) },
                                                                through: (object["through"] as? String).flatMap { UInt64($0) }),
                              at: at)
        default: return nil
        }
    }

    /// Every event so far, in arrival order.
    var snapshot: [ProbeEvent] { events.withLock { $0 } }

    /// Whether the process is still running.
    var isRunning: Bool { process.isRunning }

    /// The last lines the probe wrote to standard error (for diagnostics).
    var errorTail: String {
        let text = (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? ""
        return text.split(separator: "\n").suffix(5).joined(separator: "\n")
    }

    /// Writes `text` and a newline to the probe's standard input (a lifecycle command).
    func send(_ text: String) {
        try? input.fileHandleForWriting.write(contentsOf: Data((text + "\n").utf8))
    }

    /// Freezes the probe (SIGSTOP: what iOS does to a suspended app — no timers, nothing read
    /// or answered; its sockets stay open in the kernel) or thaws it (SIGCONT).
    func freeze(_ frozen: Bool) {
        guard process.isRunning else { return }
        kill(process.processIdentifier, frozen ? SIGSTOP : SIGCONT)
    }

    /// Closes standard input, waits up to `grace` for the probe to exit, then kills it.
    func stop(grace: Duration = .seconds(8)) async {
        freeze(false)
        try? input.fileHandleForWriting.close()
        let deadline = ContinuousClock.now + grace
        while process.isRunning && ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(50)) }
        if process.isRunning {
            process.terminate()
            try? await Task.sleep(for: .milliseconds(300))
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        }
    }
}

/// A network namespace for the clients with two links to the host — "Wi-Fi" (`wifi0`) and
/// "cellular" (`cell0`), each a veth pair with its own subnet — and a service address on the
/// host reachable over either, preferring Wi-Fi. Switching takes Wi-Fi down: traffic moves to
/// cellular with a new source address, as on a phone leaving a hotspot.
struct ChaosNetworkNamespace: Sendable {
    let name: String
    /// The host address the clients connect to (the proxy listens on it).
    let serviceAddress: String
    let wifiAddress: String
    let cellularAddress: String
    private let hostWifi: String
    private let hostCellular: String

    /// Creates the namespace and links; throws with the reason when that is not possible here
    /// (not root, no `ip`, no namespace support).
    static func create() throws -> ChaosNetworkNamespace {
        let id = Int(getpid()) % 100_000
        let octet = 200 + Int(getpid()) % 50
        let space = ChaosNetworkNamespace(name: "tchaos\(id)", serviceAddress: "10.\(octet).0.1", wifiAddress: "10.\(octet).1.2",
                                          cellularAddress: "10.\(octet).2.2", hostWifi: "tcw\(id)", hostCellular: "tcc\(id)")
        let net = "10.\(octet)"
        let steps: [[String]] = [
            ["ip", "netns", "add", space.name],
            ["ip", "link", "add", space.hostWifi, "type", "veth", "peer", "name", "wifi0", "netns", space.name],
            ["ip", "link", "add", space.hostCellular, "type", "veth", "peer", "name", "cell0", "netns", space.name],
            ["ip", "addr", "add", "\(net).1.1/24", "dev", space.hostWifi],
            ["ip", "addr", "add", "\(net).2.1/24", "dev", space.hostCellular],
            ["ip", "link", "set", space.hostWifi, "up"],
            ["ip", "link", "set", space.hostCellular, "up"],
            ["ip", "addr", "add", "\(space.serviceAddress)/32", "dev", "lo"],
            ["ip", "-n", space.name, "link", "set", "lo", "up"],
            ["ip", "-n", space.name, "addr", "add", "\(space.wifiAddress)/24", "dev", "wifi0"],
            ["ip", "-n", space.name, "addr", "add", "\(space.cellularAddress)/24", "dev", "cell0"],
            ["ip", "-n", space.name, "link", "set", "wifi0", "up"],
            ["ip", "-n", space.name, "link", "set", "cell0", "up"],
            ["ip", "-n", space.name, "route", "add", "\(space.serviceAddress)/32", "via", "\(net).1.1", "dev", "wifi0", "metric", "10"],
            ["ip", "-n", space.name, "route", "add", "\(space.serviceAddress)/32", "via", "\(net).2.1", "dev", "cell0", "metric", "20"],
        ]
        for step in steps {
            let result = runCommand(step)
            if result.status != 0 {
                space.destroy()
                throw ChaosError("`\(step.joined(separator: " "))` failed: \(result.output.trimmingCharacters(in: .whitespacesAndNewlines))")
            }
        }
        return space
    }

    /// The command prefix that runs a program inside the namespace.
    var prefix: [String] { ["/usr/sbin/ip", "netns", "exec", name] }

    /// New connections leave over cellular (and its address): the Wi-Fi route is withdrawn.
    /// The Wi-Fi link itself stays up until ``dropWifiLink()``, so resets sent to the old
    /// connections still arrive.
    func routeOverCellular() throws {
        let result = runCommand(["ip", "-n", name, "route", "del", "\(serviceAddress)/32", "dev", "wifi0"])
        guard result.status == 0 else { throw ChaosError("withdrawing the Wi-Fi route failed: \(result.output)") }
    }

    /// The Wi-Fi link goes down (what the clients' network monitors see).
    func dropWifiLink() throws {
        let result = runCommand(["ip", "-n", name, "link", "set", "wifi0", "down"])
        guard result.status == 0 else { throw ChaosError("taking wifi0 down failed: \(result.output)") }
    }

    /// Removes everything `create()` made.
    func destroy() {
        runCommand(["ip", "netns", "del", name])
        runCommand(["ip", "link", "del", hostWifi])
        runCommand(["ip", "link", "del", hostCellular])
        runCommand(["ip", "addr", "del", "\(serviceAddress)/32", "dev", "lo"])
    }
}
