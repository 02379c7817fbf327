import ArgumentParser
import Foundation
import Synchronization
import Tether
import TetherHarness

/// `tether subscribe`: print messages and connection changes as they happen, with the SDK's
/// subscribe engine (reconnection, catch-up, network awareness).
struct ClientSubscribe: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "subscribe",
        abstract: "Subscribe to channels and groups; print messages and status changes as they happen.",
        discussion: """
            One line per event: `message`, `signal` or `presence`, timetoken, channel, publisher and \
            the payload as JSON; `status` lines for every status (connected, unexpectedDisconnect, \
            reconnected…), `state` lines for connection-state changes, `continuity` lines after \
            each reconnect and `event` lines for the session's life (reconnect started / succeeded / \
            failed, session resumed / expired, transport changes). Runs until interrupted (or --count \
            events).

              tether subscribe chat 'news.*' --group team --presence
              tether subscribe chat --transport websocket
            """)

    @OptionGroup var client: ClientOptions

    @Argument(help: "Channels or wildcard patterns (news.*).")
    var channels: [String] = []

    @Option(name: .customLong("group"), help: "A channel group (repeatable).")
    var groups: [String] = []

    @Flag(help: "Also print presence events.")
    var presence = false

    @Option(help: "Start from this timetoken (catch up on what was published after it).")
    var timetoken: UInt64?

    @Option(help: "Exit after this many events.")
    var count: Int?

    @Option(help: "Filter expression (server-side, on meta).")
    var filter: String?

    @Option(help: "Reconnection policy: pubnub (default), linear, sendbird, diffusion, diffusion-backoff, none.")
    var policy: String = "pubnub"

    @Option(help: "Wire: websocket (a session kept across drops), long-poll (PubNub's HTTP) or auto (WebSocket, falling back to long-poll when the upgrade is refused).")
    var transport: TransportChoice = .auto

    @Option(name: .customLong("watch-interface"),
            help: "Linux: judge the network by these interfaces only, loopback allowed (repeatable; default: every non-loopback one).")
    var watchInterfaces: [String] = []

    func validate() throws {
        if channels.isEmpty && groups.isEmpty { throw ValidationError("give at least one channel or --group") }
    }

    func run() async throws {
        let base = try client.makeClient()
        var configuration = base.configuration
        configuration.filterExpression = filter
        configuration.transport = transport.preference
        switch policy {
        case "pubnub": configuration.retry = .default
        case "linear": configuration.retry = .linear
        case "sendbird": configuration.retry = .sendBird
        case "diffusion": configuration.retry = .diffusion
        case "diffusion-backoff": configuration.retry = .diffusionBackOff
        case "none": configuration.retry = .disabled
        default: throw ValidationError("--policy must be pubnub, linear, sendbird, diffusion, diffusion-backoff or none")
        }
        #if os(Linux)
        let monitor: (any NetworkMonitor)? = watchInterfaces.isEmpty
            ? RTNetlinkNetworkMonitor() : RTNetlinkNetworkMonitor(interfaces: Set(watchInterfaces), includeLoopback: true)
        #elseif canImport(Network)
        let monitor: (any NetworkMonitor)? = PathNetworkMonitor()
        #else
        let monitor: (any NetworkMonitor)? = nil
        #endif
        let tether = TetherClient(configuration: configuration, transport: base.transport, clock: ContinuousClock(), networkMonitor: monitor)
        let remaining = LockedCounter(limit: count)
        let (done, finish) = AsyncStream.makeStream(of: Void.self)
        tether.addStatusListener { status in
            var line = "status \(status.category)"
            if let current = status.currentTimetoken { line += " timetoken=\(current)" }
            if !status.deniedChannels.isEmpty { line += " denied=\(status.deniedChannels.joined(separator: ","))" }
            if status.willAutomaticallyRetry { line += " (retrying)" }
            if let message = status.serverMessage { line += " — \(message)" }
            emit(line)
            if status.category == .malformedFilterExpression || status.category == .badRequest { finish.finish() }
        }
        tether.addConnectionListener { change in emit("state \(change)") }
        tether.addContinuityListener { outcome in emit("continuity \(outcome)") }
        tether.addConnectionEventListener { event in emit("event \(event)") }
        let subscriptions = tether.subscribe(to: channels, groups: groups, withPresence: presence,
                                             timetoken: timetoken.map(Timetoken.init(_:)))
        for subscription in subscriptions {
            subscription.onEvent { event in
                let kind = event.isPresence ? "presence" : event.kind == .signal ? "signal" : "message"
                emit("\(kind) \(event.timetoken) \(event.channel) \(event.publisher ?? "-") \(event.payload.jsonText)")
                if remaining.consume() { finish.finish() }
            }
        }
        for await _ in done {}
        await tether.shutdown()
    }
}

func emit(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

/// Counts events down to zero (`--count`).
private final class LockedCounter: Sendable {
    private let left: Mutex<Int?>

    init(limit: Int?) { left = Mutex(limit) }

    /// Returns true when the limit is reached.
    func consume() -> Bool {
        left.withLock { left in
            guard let value = left else { return false }
            left = value - 1
            return value - 1 <= 0
        }
    }
}
