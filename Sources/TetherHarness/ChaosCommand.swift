package import ArgumentParser
import Foundation
import Logging
import TetherTesting

/// `tether chaos`: fault injection between clients and a server.
package struct ChaosCommand: AsyncParsableCommand {
    package static let configuration = CommandConfiguration(
        commandName: "chaos",
        abstract: "Inject network faults between clients and a server; run the resilience suite.",
        subcommands: [ChaosProxy.self, ChaosSuite.self, ChaosProbe.self, ChaosPublishProbe.self]
    )

    package init() {}
}

/// `tether chaos proxy`: run TetherTesting's `FaultProxy` from the command line.
struct ChaosProxy: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "proxy",
        abstract: "Run a fault-injecting TCP proxy in front of a server.",
        discussion: """
            Forwards --listen to --upstream and injects faults: pass, refuse, reset, blackhole, \
            latency <base> [<jitter>], bandwidth <bytes/s>, drop <bytes>, captive-portal, \
            truncated-json, overloaded [<retry-after s>], fail-tls. Each --fault may carry its own timing ("blackhole after 5s \
            for 30s"); otherwise the n-th --after/--for goes with the n-th --fault. Steps run one \
            after another.

              tether chaos proxy --upstream 127.0.0.1:8090 --fault blackhole --after 5s --for 30s
              tether chaos proxy --upstream 127.0.0.1:8090 --fault 'latency 200ms 50ms' --control 127.0.0.1:9091

            While it runs, each line read on standard input is a command (`blackhole for 30s`, \
            `pass`, `reset; captive-portal for 20s`, `status`); with --control, the same commands \
            are accepted over HTTP: `curl -d 'blackhole for 30s' 127.0.0.1:9091` (GET: status). \
            See docs/chaos.md.
            """)

    @Option(help: "Where to listen, host:port.")
    var listen = "127.0.0.1:9090"

    @Option(help: "Where to forward, host:port.")
    var upstream = "127.0.0.1:8090"

    @Option(help: "A fault or step to schedule (repeatable, run in order).")
    var fault: [String] = []

    @Option(help: "Delay before the matching --fault (repeatable; default 0s).")
    var after: [String] = []

    @Option(name: .customLong("for"), help: "How long the matching --fault lasts (repeatable; default: until changed).")
    var lasting: [String] = []

    @Option(help: "Also accept commands over HTTP on this host:port.")
    var control: String?

    @Flag(help: "Ignore standard input (for running in the background).")
    var noStdin = false

    func validate() throws {
        guard after.count <= fault.count, lasting.count <= fault.count else {
            throw ValidationError("each --after/--for needs a --fault")
        }
    }

    func run() async throws {
        let steps = try schedule()
        var logger = Logger(label: "tether.chaos")
        logger.logLevel = .info
        let proxy = try await FaultProxy.start(
            host: try hostPort(listen).0, port: try hostPort(listen).1, upstream: upstream, logger: logger)
        say("tether chaos proxy: \(proxy.origin) -> \(upstream)")
        var controlServer: FaultProxyControlServer?
        if let control {
            let (host, port) = try hostPort(control)
            controlServer = try await FaultProxyControlServer.start(proxy: proxy, host: host, port: port)
            say("control: http://\(host):\(controlServer?.port ?? port)")
        }
        if !steps.isEmpty {
            say("schedule: \(steps.map(\.description).joined(separator: "; "))")
            proxy.schedule(steps)
        }
        if !noStdin {
            for await line in standardInputLines() {
                do {
                    say(try await proxy.run(command: line))
                } catch {
                    say("error: \(error)")
                }
                    }
        }
        // Standard input closed (or ignored): serve until interrupted.
        while !Task.isCancelled { try await Task.sleep(for: .seconds(3600)) }
        await controlServer?.stop()
        await proxy.stop()
    }

    private func schedule() throws -> [FaultStep] {
        try fault.enumerated().map { index, text in
            var step = try FaultStep(parsing: text)
            if index < after.count { step.after = try FaultStep.duration(parsing: after[index]) }
            if index < lasting.count { step.lasting = try FaultStep.duration(parsing: lasting[index]) }
            return step
        }
    }

    private func hostPort(_ text: String) throws -> (String, Int) {
        guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]) else {
            throw ValidationError("expected host:port, got '\(text)'")
        }
        let host = String(text[..<colon])
        return (host.isEmpty ? "127.0.0.1" : host, port)
    }
}

/// Prints a line at once (unbuffered, so scripts reading the output see it immediately).
private func say(_ text: String) {
    FileHandle.standardOutput.write(Data((text + "\n").utf8))
}

/// Lines of standard input, read on a dedicated thread; finishes at end of input.
private func standardInputLines() -> AsyncStream<String> {
    let (stream, continuation) = AsyncStream.makeStream(of: String.self)
    let thread = Thread {
        while let line = readLine() {
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            if !trimmed.isEmpty { continuation.yield(trimmed) }
        }
        continuation.finish()
    }
    thread.start()
    return stream
}
