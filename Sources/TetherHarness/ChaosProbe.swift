import ArgumentParser
import Foundation
import Logging
import Synchronization
package import Tether

/// `tether chaos probe`: N Tether SDK clients subscribed to one channel, reporting every status
/// and every received message as a JSON line — the Tether side of `tether chaos suite` (the
/// PubNub side is a Python script speaking the same lines).
///
/// Lines on standard output, one JSON object each, `at` in Unix milliseconds:
/// `{"c":3,"e":"status","cat":"reconnected","at":…}`, `{"c":3,"e":"msg","seq":17,"tt":"…","at":…}`,
/// and the session's typed events, `{"c":3,"e":"event","what":"session resumed","at":…}`
/// (``ChaosProbe/eventName(_:)``).
/// The probe runs until standard input closes, then shuts every client down and exits.
///
/// The app lifecycle (the background scenario): a line `background` on standard input calls
/// ``TetherClient/enterBackground()`` on every client and `foreground` calls
/// ``TetherClient/enterForeground()``; each is acknowledged with
/// `{"c":3,"e":"lifecycle","what":"background","at":…}`. `--background-policy` and `--catch-up`
/// choose the clients' ``LifecycleOptions``. Every continuity outcome is a line too:
/// `{"c":3,"e":"continuity","outcome":"skipped","count":12,"from":"…","through":"…","at":…}`
/// (`count` is -1 when not counted; `recovered` outcomes carry their count, `gap` its range).
struct ChaosProbe: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "probe",
        abstract: "Run Tether SDK clients on one channel and print each status and message as a JSON line.",
        discussion: """
            Used by `tether chaos suite`; also handy on its own. Every client has its own \
            connections and its own network monitor, as separate devices would. Message payloads \
            are expected to be objects with an integer "seq". Runs until standard input closes.

              tether chaos probe --origin 127.0.0.1:9090 --channel chaos --clients 10 < /dev/tty
              tether chaos probe --origin 127.0.0.1:9090 --channel chaos --transport websocket < /dev/tty
            """)

    @Option(help: "Server (or proxy) host:port.")
    var origin = "127.0.0.1:8090"

    @Option(help: "The channel to subscribe to.")
    var channel: String

    @Option(help: "How many independent clients.")
    var clients = 1

    @Option(name: .customLong("sub-key"), help: "Subscribe key.")
    var subscribeKey = "demo"

    @Option(name: .customLong("auth-key"), help: "Access Manager auth key.")
    var authKey: String?

    @Option(name: .customLong("user-prefix"), help: "User ids are <prefix>-<n>.")
    var userPrefix = "tether"

    @Option(name: .customLong("watch-interface"),
            help: "Linux: judge the network by these interfaces only (repeatable; default: every non-loopback one).")
    var watchInterfaces: [String] = []

    @Option(help: "Wire: long-poll (PubNub's HTTP, the default), websocket (a session kept across drops) or auto (WebSocket, falling back to long-poll when the upgrade is refused).")
    var transport: TransportChoice = .longPoll

    @Flag(help: "No network monitor (the SDK learns of outages from failed requests only).")
    var noNetworkMonitor = false

    @Option(name: .customLong("background-policy"), help: "What enterBackground() does: disconnect, keep or suspend.")
    var backgroundPolicy: BackgroundPolicyChoice = .suspend

    @Option(name: .customLong("suspend-keep-alive"), help: "Seconds the suspend policy asks the server to keep the session.")
    var suspendKeepAlive = 300

    @Option(name: .customLong("catch-up"), help: "How enterForeground() catches up: everything, unread-counts or latest-only.")
    var catchUp: CatchUpChoice = .everything

    func validate() throws {
        guard clients >= 1 else { throw ValidationError("--clients must be at least 1") }
    }

    func run() async throws {
        var logger = Logger(label: "tether.chaos.probe")
        logger.logLevel = .critical
        let out = ProbeOutput()
        var all: [TetherClient] = []
        for index in 0..<clients {
            var configuration: TetherConfiguration
            do {
                configuration = try TetherConfiguration(subscribeKey: subscribeKey, publishKey: nil, userId: "\(userPrefix)-\(index)",
                                                        authKey: authKey, origin: origin, useTLS: false, logger: logger)
            } catch {
                throw ValidationError(error.description)
            }
            configuration.logger = logger
            configuration.transport = transport.preference
            configuration.lifecycle = LifecycleOptions(backgroundPolicy: backgroundPolicy.policy(keepAlive: .seconds(suspendKeepAlive)),
                                                       foregroundCatchUp: catchUp.preset, observesApplicationState: false)
            let transport = try HTTPClientTransport(connectTimeout: configuration.connectTimeout, logger: logger)
            let client = TetherClient(configuration: configuration, transport: transport, clock: ContinuousClock(),
                                      networkMonitor: noNetworkMonitor ? nil : makeMonitor())
            client.addStatusListener { status in
                out.line(#"{"c":\#(index),"e":"status","cat":"\#(status.category)","at":\#(unixMilliseconds())}"#)
            }
            client.addConnectionEventListener { event in
                out.line(#"{"c":\#(index),"e":"event","what":"\#(Self.eventName(event))","at":\#(unixMilliseconds())}"#)
            }
            client.addContinuityListener { continuity in
                out.line(#"{"c":\#(index),"e":"continuity",\#(Self.continuityFields(continuity)),"at":\#(unixMilliseconds())}"#)
            }
            for subscription in client.subscribe(to: [channel]) {
                subscription.onEvent { event in
                    guard !event.isPresence else { return }
                    let seq = event.payload["seq"]?.intValue ?? -1
                    out.line(#"{"c":\#(index),"e":"msg","seq":\#(seq),"tt":"\#(event.timetoken)","at":\#(unixMilliseconds())}"#)
                }
            }
            all.append(client)
        }
        // Run until standard input closes; `background` and `foreground` lines are the app's lifecycle.
        let clientsToTell = all
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            let thread = Thread {
                while let line = readLine() {
                    let command = line.trimmingCharacters(in: .whitespaces)
                    guard command == "background" || command == "foreground" else { continue }
                    for (index, client) in clientsToTell.enumerated() {
                        if command == "background" { client.enterBackground() } else { client.enterForeground() }
                        out.line(#"{"c":\#(index),"e":"lifecycle","what":"\#(command)","at":\#(unixMilliseconds())}"#)
                    }
                }
                done.resume()
            }
            thread.start()
        }
        await withTaskGroup(of: Void.self) { group in
            for client in all { group.addTask { await client.shutdown() } }
        }
    }

    /// A connection event's name on a probe line: fixed words, so no JSON escaping is needed
    /// (the expiry's server message and the session id are left out).
    static func eventName(_ event: ConnectionEvent) -> String {
        switch event {
        case .reconnectStarted: return "reconnect started"
        case .reconnectSucceeded: return "reconnect succeeded"
        case .reconnectFailed: return "reconnect failed"
        case .sessionResumed: return "session resumed"
        case .sessionExpired: return "session expired"
        case .transportChanged(let wire): return wire == .webSocket ? "transport websocket" : "transport long-poll"
        case .originChanged: return "origin changed"
        }
    }

    /// A continuity outcome's fields on a probe line (timetokens as strings, `count` -1 when
    /// not counted).
    static func continuityFields(_ continuity: ChannelContinuity) -> String {
        let from = #""from":"\#(continuity.resumedFrom.rawValue)""#
        switch continuity.outcome {
        case .continuous: return #""outcome":"continuous",\#(from)"#
        case .recovered(let count): return #""outcome":"recovered","count":\#(count),\#(from)"#
        case .gap(let gapFrom, let through, let recovered):
            return #""outcome":"gap","count":\#(recovered),"from":"\#(gapFrom.rawValue)","through":"\#(through.rawValue)""#
        case .skipped(let through, let count):
            return #""outcome":"skipped","count":\#(count ?? -1),\#(from),"through":"\#(through.rawValue)""#
        }
    }

    private func makeMonitor() -> (any NetworkMonitor)? {
        #if os(Linux)
        return watchInterfaces.isEmpty ? RTNetlinkNetworkMonitor() : RTNetlinkNetworkMonitor(interfaces: Set(watchInterfaces))
        #elseif canImport(Network)
        return PathNetworkMonitor()
        #else
        return nil
        #endif
    }
}

/// `--transport` of `tether subscribe`, `tether ping` and `tether chaos probe`: the CLI's names
/// for ``TransportPreference``.
package enum TransportChoice: String, ExpressibleByArgument, CaseIterable, Sendable {
    case websocket
    case longPoll = "long-poll"
    case auto

    package var preference: TransportPreference {
        switch self {
        case .websocket: return .webSocket
        case .longPoll: return .longPoll
        case .auto: return .automatic
        }
    }
}

/// `--background-policy` of `tether chaos probe`.
enum BackgroundPolicyChoice: String, ExpressibleByArgument, CaseIterable, Sendable {
    case disconnect, keep, suspend

    func policy(keepAlive: Duration) -> BackgroundPolicy {
        switch self {
        case .disconnect: return .disconnect
        case .keep: return .keep
        case .suspend: return .suspend(keepAlive: keepAlive)
        }
    }
}

/// `--catch-up` of `tether chaos probe`.
enum CatchUpChoice: String, ExpressibleByArgument, CaseIterable, Sendable {
    case everything
    case unreadCounts = "unread-counts"
    case latestOnly = "latest-only"

    var preset: ForegroundCatchUp {
        switch self {
        case .everything: return .everything
        case .unreadCounts: return .unreadCounts
        case .latestOnly: return .latestOnly
        }
    }
}

/// Whole lines to standard output from many threads, never interleaved.
final class ProbeOutput: Sendable {
    private let lock = Mutex(())

    /// Writes `text` and a newline at once.
    func line(_ text: String) {
        lock.withLock { _ in FileHandle.standardOutput.write(Data((text + "\n").utf8)) }
    }
}

/// Milliseconds since 1970 (the suite and its probes compare times across processes).
func unixMilliseconds() -> Int64 {
    var now = timespec()
    clock_gettime(CLOCK_REALTIME, &now)
    return Int64(now.tv_sec) * 1000 + Int64(now.tv_nsec) / 1_000_000
}
