import Foundation
import Synchronization
import Testing

/// Issue 6 point 8, for real: a network namespace of its own, whose loopback link is taken down
/// and up while `tether subscribe` (the SDK's engine with the rtnetlink monitor) is connected to a
/// `tether serve` in the same namespace.
@Suite("Network namespace: link down and up", .serialized)
struct NetworkNamespaceTests {
    final class Output: Sendable {
        let lines = Mutex<[String]>([])
        func append(_ data: Data) {
            let text = String(decoding: data, as: UTF8.self)
            lines.withLock { $0 += text.split(separator: "\n").map(String.init) }
        }
        var statuses: [String] {
            lines.withLock { $0.filter { $0.hasPrefix("status ") }.map { String($0.split(separator: " ")[1]) } }
        }
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

    @Test func linkDownAndUpInAnIsolatedNamespace() async throws {
        let tether = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("tether").path
        let fm = FileManager.default
        guard fm.isExecutableFile(atPath: tether), fm.isExecutableFile(atPath: "/usr/bin/unshare"),
              fm.isExecutableFile(atPath: "/usr/bin/nsenter"), fm.isExecutableFile(atPath: "/usr/sbin/ip") || fm.isExecutableFile(atPath: "/sbin/ip"),
              (try? Self.run("/usr/bin/unshare", ["-n", "true"])) == 0
        else {
            print("skipped: network namespaces are not available here (needs root, unshare, nsenter, ip and the tether binary at \(tether))")
            return
        }
        let ip = fm.isExecutableFile(atPath: "/usr/sbin/ip") ? "/usr/sbin/ip" : "/sbin/ip"
        // The namespace lives as long as this process.
        let holder = try Self.launch("/usr/bin/unshare", ["-n", "sh", "-c", "\(ip) link set lo up; exec sleep 600"])
        defer { holder.terminate() }
        let pid = String(holder.processIdentifier)
        func inside(_ arguments: [String]) -> [String] { ["-t", pid, "-n"] + arguments }
        #expect(await eventually { (try? Self.run("/usr/bin/nsenter", inside([ip, "link", "show", "lo", "up"]))) == 0 })

        let directory = fm.temporaryDirectory.appendingPathComponent("tether-netns-\(UUID().uuidString)").path
        defer { try? fm.removeItem(atPath: directory) }
        let port = "18\(Int.random(in: 100...999))"
        let server = try Self.launch("/usr/bin/nsenter", inside([tether, "serve", "--port", port, "--data-dir", directory]))
        defer { server.terminate() }
        let origin = ["--origin", "127.0.0.1:\(port)"]
        #expect(await eventually { (try? Self.run("/usr/bin/nsenter", inside([tether, "time"] + origin))) == 0 })

        let output = Output()
        let subscriber = try Self.launch("/usr/bin/nsenter", inside([tether, "subscribe", "netns", "--watch-interface", "lo"] + origin),
                                         output: output)
        defer { subscriber.terminate() }
        #expect(await eventually { output.statuses == ["connected"] })

        #expect(try Self.run("/usr/bin/nsenter", inside([ip, "link", "set", "lo", "down"])) == 0)
        #expect(await eventually { output.statuses == ["connected", "networkDown"] })
        #expect(await eventually { output.lines.withLock { $0.contains { $0.contains("-> waitingForNetwork") } } })

        #expect(try Self.run("/usr/bin/nsenter", inside([ip, "link", "set", "lo", "up"])) == 0)
        #expect(await eventually(within: 15) { output.statuses == ["connected", "networkDown", "networkUp", "reconnected"] })
        #expect(try Self.run("/usr/bin/nsenter", inside([tether, "publish", "netns", "after the outage"] + origin)) == 0)
        #expect(await eventually { output.lines.withLock { $0.contains { $0.hasPrefix("message ") && $0.hasSuffix("\"after the outage\"") } } })
        #expect(output.statuses == ["connected", "networkDown", "networkUp", "reconnected"])
    }
}
