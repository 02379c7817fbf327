import Foundation
import Synchronization
import Testing
import TetherTesting

/// Issue 6 point 8, for real: a network namespace of its own, whose loopback link is taken down
/// and up while `tether subscribe` (the SDK's engine with the rtnetlink monitor) is connected to a
/// `tether serve` in the same namespace.
@Suite("Network namespace: link down and up", .serialized)
struct NetworkNamespaceTests {
    /// The subscriber's standard output, line by line, as it arrives.
    final class Output: Sendable {
        let lines = Mutex<[String]>([])
        let stream: AsyncStream<String>
        private let sink: AsyncStream<String>.Continuation
        private let partial = Mutex("")

        init() { (stream, sink) = AsyncStream.makeStream(of: String.self) }

        func append(_ data: Data) {
            guard !data.isEmpty else { return sink.finish() }
            let complete = partial.withLock { partial -> [String] in
                partial += String(decoding: data, as: UTF8.self)
                var parts = partial.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
                partial = parts.removeLast()
                return parts.filter { !$0.isEmpty }
            }
            lines.withLock { $0 += complete }
            for line in complete { sink.yield(line) }
        }
        var statuses: [String] {
            lines.withLock { $0.filter { $0.hasPrefix("status ") }.map { String($0.split(separator: " ")[1]) } }
        }
    }

    /// Whether this machine can run the test: network namespaces need root (or user namespaces),
    /// `unshare`, `nsenter`, `ip`, and the `tether` binary next to the test bundle.
    static let availability: (available: Bool, reason: String) = {
        let tether = tetherPath
        let fm = FileManager.default
        guard fm.isExecutableFile(atPath: tether) else { return (false, "no tether binary at \(tether)") }
        guard fm.isExecutableFile(atPath: "/usr/bin/unshare"), fm.isExecutableFile(atPath: "/usr/bin/nsenter") else {
            return (false, "unshare or nsenter is missing")
        }
        guard ipPath != nil else { return (false, "the ip tool is missing") }
        guard (try? run("/usr/bin/unshare", ["-n", "true"])) == 0 else {
            return (false, "cannot create a network namespace here (needs root or CAP_SYS_ADMIN)")
        }
        return (true, "")
    }()

    static var tetherPath: String {
        URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("tether").path
    }

    static var ipPath: String? {
        ["/usr/sbin/ip", "/sbin/ip"].first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    static func launch(_ path: String, _ arguments: [String], output: Output? = nil) throws -> Process {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = arguments
        if let output {
            let pipe = Pipe()
            process.standardOutput = pipe
            pipe.fileHandleForReading.readabilityHandler = { handle in output.append(handle.availableData) }
        } else {
            process.standardOutput = FileHandle.nullDevice
        }
        process.standardError = FileHandle.nullDevice
        try process.run()
        return process
    }

    static func run(_ path: String, _ arguments: [String]) throws -> Int32 {
        let process = try launch(path, arguments)
        process.waitUntilExit()
        return process.terminationStatus
    }

    /// Skipped, and reported as skipped with the reason, where namespaces cannot be created.
    @Test(.enabled(if: availability.available, "network namespaces are not available here: \(availability.reason)"))
    func linkDownAndUpInAnIsolatedNamespace() async throws {
        let tether = Self.tetherPath
        let fm = FileManager.default
        let ip = try #require(Self.ipPath)
        // The namespace lives as long as this process.
        let holder = try Self.launch("/usr/bin/unshare", ["-n", "sh", "-c", "\(ip) link set lo up; exec sleep 600"])
        defer { holder.terminate() }
        let pid = String(holder.processIdentifier)
        func inside(_ arguments: [String]) -> [String] { ["-t", pid, "-n"] + arguments }
        // Polled: the namespace belongs to another process (`unshare`), which announces nothing.
        #expect(await eventually { (try? Self.run("/usr/bin/nsenter", inside([ip, "link", "show", "lo", "up"]))) == 0 })

        let directory = fm.temporaryDirectory.appendingPathComponent("tether-netns-\(UUID().uuidString)").path
        defer { try? fm.removeItem(atPath: directory) }
        let port = "18\(Int.random(in: 100...999))"
        let server = try Self.launch("/usr/bin/nsenter", inside([tether, "serve", "--port", port, "--data-dir", directory]))
        defer { server.terminate() }
        let origin = ["--origin", "127.0.0.1:\(port)"]
        // Polled: the server is a child process in the namespace; it is ready when it answers.
        #expect(await eventually { (try? Self.run("/usr/bin/nsenter", inside([tether, "time"] + origin))) == 0 })

        let output = Output()
        var lines = output.stream.makeAsyncIterator()
        /// The next `status` line's category, skipping other lines.
        func nextStatus() async -> String? {
            while let line = await lines.next() {
                if line.hasPrefix("status ") { return String(line.split(separator: " ")[1]) }
            }
            return nil
        }
        let subscriber = try Self.launch("/usr/bin/nsenter", inside([tether, "subscribe", "netns", "--watch-interface", "lo"] + origin),
                                         output: output)
        defer { subscriber.terminate() }
        #expect(await nextStatus() == "connected")

        #expect(try Self.run("/usr/bin/nsenter", inside([ip, "link", "set", "lo", "down"])) == 0)
        #expect(await nextStatus() == "networkDown")

        #expect(try Self.run("/usr/bin/nsenter", inside([ip, "link", "set", "lo", "up"])) == 0)
        #expect(await nextStatus() == "networkUp")
        #expect(output.lines.withLock { $0.contains { $0.contains("-> waitingForNetwork") } })
        #expect(await nextStatus() == "reconnected")
        #expect(try Self.run("/usr/bin/nsenter", inside([tether, "publish", "netns", "after the outage"] + origin)) == 0)
        var delivered = false
        while !delivered, let line = await lines.next() {
            delivered = line.hasPrefix("message ") && line.hasSuffix("\"after the outage\"")
            #expect(!line.hasPrefix("status "), "an unexpected status: \(line)")
        }
        #expect(delivered)
        #expect(output.statuses == ["connected", "networkDown", "networkUp", "reconnected"])
    }
}
