import ArgumentParser
import Foundation
import Logging
import Synchronization
import Tether
import TetherTesting

/// The publisher side of `tether chaos suite` (issue #15): each SDK publishes N numbered messages
/// through the fault proxy while the link flaps (connections reset, responses dropped after the
/// server stored the message, blackholes) and the server restarts once; afterwards history is
/// read straight from the server and every message is counted.
///
/// - Tether's SDK publishes through its outbox (`client.outbox.enqueue`): every message keeps
///   one request id across retries and the server deduplicates.
/// - The PubNub Python SDK publishes the way its documentation leaves it to the app: the SDK does
///   not retry a publish, so the probe resends a failed one itself (up to 5 attempts, 1 s apart —
///   the "resend failed messages" handler SendBird's seed describes), one message at a time.
enum ChaosPublishing {
    /// Counts for one SDK.
    struct Counts: Sendable, Codable {
        /// Messages the app handed to the SDK.
        var published: Int
        /// Distinct messages in history.
        var stored: Int
        /// Extra copies in history.
        var duplicated: Int
        /// Messages the app never heard a failure for that are not in history.
        var lostSilently: Int
        /// Messages the SDK (or the app's own resend handler) reported failed, and not in history.
        var failedVisibly: Int
        /// Stored messages whose first copy comes after a later message's (history order).
        var outOfOrder: Int
        /// Messages the server answered as a repeat of one it already had (Tether only).
        var repeats: Int
    }

    /// The faults, as one schedule lasting about `30 × scale` seconds: flapping (pass, reset,
    /// responses dropped after the request was forwarded, blackhole), with a server restart in
    /// the middle.
    static func flap(proxy: FaultProxy, server: ServerProcess, options: ChaosRunOptions) async throws {
        let cycle: [(FaultProxy.Fault, Double)] = [
            (.pass, 2), (.dropMidResponse(afterBytes: 0), 3), (.pass, 1), (.reset, 1), (.pass, 1), (.blackhole, 2),
        ]
        for round in 0..<3 {
            for (fault, seconds) in cycle {
                try await proxy.apply(fault)
                try await Task.sleep(for: options.scaled(seconds))
            }
            if round == 1 {
                // The server restarts behind the proxy (SIGTERM, then the same port and data).
                try await proxy.apply(.pass)
                await server.stop()
                try await server.start()
            }
        }
        try await proxy.apply(.pass)
    }

    /// Reads the history of `channel` and counts it against what the probe reported.
    static func count(history: [HistoryMessage], events: [ProbeEvent], published: Int) -> Counts {
        var copies: [Int: Int] = [:]
        var highest = Int.min
        var outOfOrder = 0
        for message in history {
            guard let seq = message.payload["seq"]?.intValue else { continue }
            copies[seq, default: 0] += 1
            if copies[seq] == 1 {
                if seq < highest { outOfOrder += 1 }
                highest = max(highest, seq)
            }
        }
        var failed: Set<Int> = []
        var repeats = 0
        for event in events {
            switch event.kind {
            case .publishFailed(let seq, _): failed.insert(seq)
            case .publishSent(let seq, let wasRepeat):
                failed.remove(seq)  // a resend that went through
                if wasRepeat { repeats += 1 }
            default: break
            }
        }
        let missing = Set(0..<published).subtracting(copies.keys)
        return Counts(published: published, stored: copies.count, duplicated: copies.values.reduce(0) { $0 + $1 - 1 },
                      lostSilently: missing.subtracting(failed).count, failedVisibly: missing.intersection(failed).count,
                      outOfOrder: outOfOrder, repeats: repeats)
    }

    /// The Markdown table of the publisher-side scenario.
    static func markdown(_ results: [ChaosResult]) -> String? {
        let rows = results.compactMap { result in result.publishing.map { (result, $0) } }
        guard !rows.isEmpty else { return nil }
        var lines = [
            "| SDK | Published | Stored | Duplicated | Lost silently | Failed (app told) | Out of order | Answered as a repeat |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for (result, counts) in rows {
            lines.append("| \(result.sdk.label) | \(counts.published) | \(counts.stored) | \(counts.duplicated) | \(counts.lostSilently) | "
                + "\(counts.failedVisibly) | \(counts.outOfOrder) | \(result.sdk == .tether ? String(counts.repeats) : "–") |")
        }
        return lines.joined(separator: "\n")
    }
}

/// `tether chaos publish-probe`: one Tether client publishing numbered messages through its outbox,
/// reporting each acceptance and outcome as a JSON line — the Tether side of the suite's
/// publisher scenario.
///
/// Lines: `{"c":0,"e":"accepted","seq":3,"at":…}`, `{"c":0,"e":"sent","seq":3,"tt":"…","repeat":false,"at":…}`,
/// `{"c":0,"e":"failed","seq":3,"cat":"…","at":…}` and, when every message has settled,
/// `{"c":0,"e":"done","at":…}`. Exits after `done`, or when standard input closes.
struct ChaosPublishProbe: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "publish-probe",
        abstract: "Publish numbered messages through Tether's outbox and print each outcome as a JSON line.",
        discussion: """
            Used by `tether chaos suite` (the publisher-flapping scenario); also handy on its own. \
            Messages are {"seq": n} for n in 0..<count, enqueued at --rate per second without \
            waiting for earlier ones; the outbox sends them in order, retrying with the same request id.

              tether chaos publish-probe --origin 127.0.0.1:9090 --channel chaos --count 200 --rate 20
            """)

    @Option(help: "Server (or proxy) host:port.")
    var origin = "127.0.0.1:8090"

    @Option(help: "The channel to publish to.")
    var channel: String

    @Option(help: "How many messages.")
    var count = 100

    @Option(help: "Messages handed to the outbox per second.")
    var rate: Double = 10

    @Option(name: .customLong("pub-key"), help: "Publish key.")
    var publishKey = "demo"

    @Option(name: .customLong("sub-key"), help: "Subscribe key.")
    var subscribeKey = "demo"

    @Option(name: .customLong("user-id"), help: "The publisher's user id.")
    var userId = "tether-publisher"

    func validate() throws {
        guard count >= 1 else { throw ValidationError("--count must be at least 1") }
        guard rate > 0 else { throw ValidationError("--rate must be positive") }
    }

    func run() async throws {
        var logger = Logger(label: "tether.chaos.publish-probe")
        logger.logLevel = .critical
        var configuration: TetherConfiguration
        do {
            configuration = try TetherConfiguration(subscribeKey: subscribeKey, publishKey: publishKey, userId: userId, origin: origin,
                                                    useTLS: false, logger: logger)
        } catch {
            throw ValidationError(error.description)
        }
        configuration.nonSubscribeTimeout = .seconds(3)
        configuration.connectTimeout = .seconds(2)
        let client = try TetherClient(configuration: configuration)
        let out = ProbeOutput()
        let start = ContinuousClock.now
        await withTaskGroup(of: Void.self) { group in
            for seq in 0..<count {
                let due = start + .milliseconds(Int64(Double(seq) * 1000 / rate))
                if due > ContinuousClock.now { try? await Task.sleep(until: due, clock: .continuous) }
                let id: OutboxMessageID
                do {
                    id = try await client.outbox.enqueue(channel: channel, message: ["seq": .number(JSONValue.Number(Int64(seq)))]).id
                } catch {
                    out.line(#"{"c":0,"e":"failed","seq":\#(seq),"cat":"refused: \#(error)","at":\#(unixMilliseconds())}"#)
                    continue
                }
                out.line(#"{"c":0,"e":"accepted","seq":\#(seq),"at":\#(unixMilliseconds())}"#)
                group.addTask {
                    do {
                        let result = try await client.outbox.result(of: id)
                        out.line(#"{"c":0,"e":"sent","seq":\#(seq),"tt":"\#(result.timetoken)","repeat":\#(result.isRepeat),"at":\#(unixMilliseconds())}"#)
                    } catch let error as TetherError {
                        out.line(#"{"c":0,"e":"failed","seq":\#(seq),"cat":"\#(error.category)","at":\#(unixMilliseconds())}"#)
                    } catch {
                        out.line(#"{"c":0,"e":"failed","seq":\#(seq),"cat":"unknown","at":\#(unixMilliseconds())}"#)
                    }
                }
            }
        }
        out.line(#"{"c":0,"e":"done","at":\#(unixMilliseconds())}"#)
        await client.shutdown()
    }
}

/// The PubNub Python SDK's publisher for the suite: publishes `{"seq": n}` one at a time at a
/// rate, resending a failed publish from the app (up to 5 attempts, 1 s apart), printing the
/// same JSON lines as `tether chaos publish-probe`.
enum ChaosPythonPublishProbe {
    static let script = #"""
import argparse
import json
import sys
import time

from pubnub.pnconfiguration import PNConfiguration
from pubnub.pubnub import PubNub


def emit(**fields):
    fields["at"] = int(time.time() * 1000)
    sys.stdout.write(json.dumps(fields, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser(description="PubNub Python SDK publisher for tether chaos suite")
    parser.add_argument("--origin", required=True)
    parser.add_argument("--channel", required=True)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--rate", type=float, default=10)
    parser.add_argument("--attempts", type=int, default=5)
    args = parser.parse_args()
    config = PNConfiguration()
    config.subscribe_key = "demo"
    config.publish_key = "demo"
    config.user_id = "pubnub-publisher"
    config.origin = args.origin
    config.ssl = False
    config.daemon = True
    config.non_subscribe_request_timeout = 3
    config.connect_timeout = 2
    pubnub = PubNub(config)
    start = time.monotonic()
    for seq in range(args.count):
        due = start + seq / args.rate
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        emit(c=0, e="accepted", seq=seq)
        for attempt in range(args.attempts):
            try:
                envelope = pubnub.publish().channel(args.channel).message({"seq": seq}).sync()
                emit(c=0, e="sent", seq=seq, tt=str(envelope.result.timetoken), repeat=False)
                break
            except Exception as error:  # the app's resend handler
                category = getattr(getattr(getattr(error, "status", None), "category", None), "name", type(error).__name__)
                if attempt == args.attempts - 1:
                    emit(c=0, e="failed", seq=seq, cat=category)
                else:
                    time.sleep(1)
    emit(c=0, e="done")
    pubnub.stop()


if __name__ == "__main__":
    main()
"""#
}
