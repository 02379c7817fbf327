import ArgumentParser
import Foundation
import Tether
import TetherHarness

/// `tether publish`: publish one message with the SDK, through its outbox.
struct ClientPublish: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "publish",
        abstract: "Publish a message on a channel.",
        discussion: """
            The message is JSON; anything that is not valid JSON is sent as a JSON string. Prints \
            `sent timetoken=<timetoken> request-id=<id>`, followed by `(repeat: stored earlier)` \
            when the server answered that it already had this request id (the message was not \
            stored again).

            Every attempt carries the same request id: one the outbox makes (a UUID), or \
            --request-id. Without --outbox the message gets one attempt (--retries to allow \
            more); with --outbox FILE it is written to that durable outbox journal before it is \
            sent and retried (network failures, timeouts, 5xx, 429) with back-off, and a message \
            left in the journal by an interrupted run is sent by the next `tether publish` or \
            `tether outbox flush` on the same file, with its original request id.

              tether publish chat '{"text":"hello"}'
              tether publish chat '{"text":"hello"}' --request-id order-42
            """)

    @OptionGroup var client: ClientOptions

    @Argument(help: "The channel.")
    var channel: String

    @Argument(help: "The message (JSON, or text sent as a string).")
    var message: String

    @Option(help: "Metadata, a JSON object (delivered as meta, usable by filters).")
    var meta: String?

    @Flag(inversion: .prefixedNo, help: "Store the message in history (default: the keyset's default).")
    var store: Bool?

    @Option(help: "Retention in hours when stored.")
    var ttl: Int?

    @Flag(help: "Send the message in a POST body.")
    var post = false

    @Option(name: .customLong("request-id"),
            help: "The request id to send (an idempotency key: 1-64 printable ASCII characters, no spaces). (default: a new UUID)")
    var requestId: String?

    @OptionGroup var outbox: OutboxOptions

    func validate() throws {
        if let requestId, let problem = PublishOptions.requestIdProblem(requestId) { throw ValidationError("--request-id: \(problem)") }
        try outbox.validate()
    }

    func run() async throws {
        let payload = (try? JSONValue(parsing: message)) ?? .string(message)
        var options = PublishOptions(store: store, ttl: ttl, usePOST: post, requestId: requestId)
        if let meta {
            guard let value = try? JSONValue(parsing: meta), value.objectValue != nil else {
                throw ValidationError("--meta must be a JSON object")
            }
            options.meta = value
        }
        try await withClient(client, configure: outbox.apply) { (c: TetherClient) throws(TetherError) in
            let result = try await c.publish(channel: channel, message: payload, options: options)
            print(sentLine(result))
        }
    }
}

/// `sent timetoken=… request-id=…`, with `(repeat: stored earlier)` when the server said so.
func sentLine(_ result: PublishResult) -> String {
    var line = "sent timetoken=\(result.timetoken)"
    if let id = result.requestId { line += " request-id=\(id)" }
    if result.isRepeat { line += " (repeat: stored earlier)" }
    return line
}

/// `tether history`: print stored messages with the SDK.
struct ClientHistory: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "history",
        abstract: "Print stored messages of one or more channels, oldest first.",
        discussion: """
            One line per message: timetoken, channel, publisher and the message as JSON.

              tether history chat --limit 10
              tether history chat news --since 17953281264739664
            """)

    @OptionGroup var client: ClientOptions

    @Argument(help: "The channels.")
    var channels: [String]

    @Option(help: "Print every message after this timetoken (all pages).")
    var since: String?

    @Option(help: "Newest messages per channel to print without --since (1-100). (default: 25)")
    var limit: Int = 25

    @Flag(help: "Print JSON objects instead of columns.")
    var json = false

    func validate() throws {
        guard !channels.isEmpty else { throw ValidationError("give at least one channel") }
        guard (1...100).contains(limit) else { throw ValidationError("--limit must be 1-100") }
        if let since, Timetoken(parsing: since) == nil { throw ValidationError("--since must be a timetoken (up to 17 digits)") }
    }

    func run() async throws {
        try await withClient(client) { (c: TetherClient) throws(TetherError) in
            let messages: [HistoryMessage]
            if let since, let tt = Timetoken(parsing: since) {
                messages = try await c.messages(since: tt, channels: channels)
            } else {
                let page = try await c.fetchMessages(channels: channels, options: FetchOptions(maximumPerChannel: limit))
                messages = page.messages
            }
            for m in messages { print(line(m)) }
        }
    }

    private func line(_ m: HistoryMessage) -> String {
        if json {
            var object: [String: JSONValue] = ["timetoken": .string(m.timetoken.description), "channel": .string(m.channel), "message": m.payload]
            if let p = m.publisher { object["publisher"] = .string(p) }
            if let meta = m.meta { object["meta"] = meta }
            if m.decryptionError != nil { object["decryption_error"] = true }
            return JSONValue.object(object).jsonText
        }
        let flag = m.decryptionError != nil ? " [undecryptable]" : ""
        return "\(m.timetoken)  \(m.channel)  \(m.publisher ?? "-")  \(m.payload.jsonText)\(flag)"
    }
}

/// `tether here-now`: print who is present.
struct ClientHereNow: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "here-now",
        abstract: "Print who is present on channels (all channels without arguments).")

    @OptionGroup var client: ClientOptions

    @Argument(help: "The channels (none: the whole keyset).")
    var channels: [String] = []

    @Option(name: .customLong("group"), help: "A channel group (repeatable).")
    var groups: [String] = []

    @Flag(help: "Include each occupant's state.")
    var state = false

    func run() async throws {
        try await withClient(client) { (c: TetherClient) throws(TetherError) in
            let result = try await c.hereNow(channels: channels, groups: groups, options: HereNowOptions(includeState: state))
            print("total: \(result.totalOccupancy) present on \(result.totalChannels) channel(s)")
            for name in result.channels.keys.sorted() {
                guard let presence = result.channels[name] else { continue }
                print("\(name): \(presence.occupancy)")
                for occupant in presence.occupants {
                    print("  \(occupant.userId)\(occupant.state.map { "  \($0.jsonText)" } ?? "")")
                }
            }
        }
    }
}

/// `tether time`: print the server's timetoken.
struct ClientTime: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "time",
        abstract: "Print the server's current timetoken (a quick reachability check).")

    @OptionGroup var client: ClientOptions

    func run() async throws {
        try await withClient(client) { (c: TetherClient) throws(TetherError) in
            print(try await c.time())
        }
    }
}

/// `tether ping`: round-trip times to the server (Diffusion's `pingServer`).
struct ClientPing: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ping",
        abstract: "Measure round-trip times to the server: a ping frame on a WebSocket session, or GET /time/0 over HTTP.",
        discussion: """
            Prints one line per ping (`rtt=1.23 ms transport=websocket`) and a summary (min / \
            median / max). With --transport websocket (the default) the session is opened first \
            (hello → welcome) and each ping is a `ping` frame answered by the server at once; with \
            long-poll each ping is a `GET /time/0`. Exits 1 when no ping is answered.

              tether ping --count 5 --interval 0.5
            """)

    @OptionGroup var client: ClientOptions

    @Option(help: "How many pings. (default: 3)")
    var count: Int = 3

    @Option(help: "Seconds between pings. (default: 1)")
    var interval: Double = 1

    @Option(help: "websocket (default), long-poll or auto.")
    var transport: TransportChoice = .websocket

    func validate() throws {
        guard (1...10_000).contains(count) else { throw ValidationError("--count must be between 1 and 10000") }
        guard interval >= 0 && interval <= 3_600 else { throw ValidationError("--interval must be between 0 and 3600 seconds") }
    }

    func run() async throws {
        let tether = try client.makeClient { $0.transport = transport.preference }
        var rtts: [Duration] = []
        var lastError: TetherError?
        if transport != .longPoll {
            do { try await tether.open() } catch {
                lastError = error
                if transport == .websocket {
                    await tether.shutdown()
                    FileHandle.standardError.write(Data("error: \(error.description)\n\(hint(for: error.status, origin: tether.configuration.origin))".utf8))
                    throw ExitCode.failure
                }
            }
        }
        let wire = tether.isSessionOpen ? "websocket" : "long-poll"
        for index in 0..<count {
            if index > 0 { try? await Task.sleep(for: .milliseconds(Int(interval * 1000))) }
            do {
                let rtt = try await tether.ping()
                rtts.append(rtt)
                emit("rtt=\(Self.milliseconds(rtt)) ms transport=\(wire)")
            } catch {
                lastError = error
                emit("no answer: \(error.description)")
            }
        }
        await tether.shutdown()
        guard !rtts.isEmpty else {
            FileHandle.standardError.write(Data("error: no ping was answered\(lastError.map { ": \($0.description)" } ?? "")\n".utf8))
            throw ExitCode.failure
        }
        let sorted = rtts.sorted()
        emit("\(rtts.count)/\(count) answered: min \(Self.milliseconds(sorted[0])) ms, median \(Self.milliseconds(sorted[sorted.count / 2])) ms, max \(Self.milliseconds(sorted[sorted.count - 1])) ms")
    }

    static func milliseconds(_ duration: Duration) -> String {
        let (seconds, attoseconds) = duration.components
        return String(format: "%.3f", Double(seconds) * 1000 + Double(attoseconds) / 1e15)
    }
}
