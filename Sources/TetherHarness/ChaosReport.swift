import Foundation

/// The client SDKs the suite compares.
enum ChaosSDK: String, CaseIterable, Sendable, Codable {
    /// Tether's SDK on PubNub's long-poll (`tether chaos probe`).
    case tether
    /// Tether's SDK on its WebSocket session (`tether chaos probe --transport websocket`).
    case tetherWebSocket = "tether-ws"
    case pubnubThreaded = "pubnub-threaded"
    case pubnubAsyncio = "pubnub-asyncio"

    /// The column label.
    var label: String {
        switch self {
        case .tether: "Tether Swift SDK (long-poll)"
        case .tetherWebSocket: "Tether Swift SDK (WebSocket)"
        case .pubnubThreaded: "PubNub Python (threaded)"
        case .pubnubAsyncio: "PubNub Python (asyncio)"
        }
    }

    /// Whether this is Tether's own SDK (held to "no silent loss"; its probe is `tether chaos probe`).
    var isTether: Bool {
        switch self {
        case .tether, .tetherWebSocket: true
        case .pubnubThreaded, .pubnubAsyncio: false
        }
    }

    /// The status category that says a client is connected.
    var connectedCategory: String { isTether ? "connected" : "PNConnectedCategory" }
}

/// One message the suite published.
struct PublishRecord: Sendable {
    var seq: Int
    /// When the publish was sent (Unix ms).
    var sentAt: Int64
    /// Whether the server acknowledged it (only acknowledged messages must be delivered).
    var acknowledged: Bool
    /// The timetoken the server gave it (raw), when acknowledged.
    var timetoken: UInt64?
}

/// What one SDK did in one scenario.
struct ChaosResult: Sendable, Codable {
    var scenario: String
    var sdk: ChaosSDK
    var clients: Int
    /// Clients that never reported `connected` before the fault (excluded from the counts).
    var notConnected: Int
    /// Acknowledged messages some client never received (summed over clients).
    var lost: Int
    /// Extra deliveries of a message a client had already received.
    var duplicated: Int
    /// First deliveries of a message older than one the client had already received.
    var outOfOrder: Int
    /// Clients that received everything published up to the fault's end plus the first message
    /// after it.
    var caughtUpClients: Int
    /// Seconds from the fault's end to caught up: median and maximum over the clients that got there.
    var caughtUpMedian: Double?
    var caughtUpMax: Double?
    /// Statuses after the fault started, in order of first appearance, with counts over clients.
    var statuses: [String]
    /// Tether's typed connection events after the fault started (reconnect started / succeeded /
    /// failed, session resumed / expired, transport changes), the same way; empty for PubNub.
    var events: [String] = []
    /// Peak reconnections in any one second (reconnection storm).
    var peakReconnectsPerSecond: Int?
    /// Why the SDK was not run, or what went wrong with the run itself.
    var note: String?
    /// Up to ten lost sequence numbers (diagnostics; in the JSON output).
    var lostSample: [Int] = []
    /// The publisher-side scenario's counts (nil for the subscriber scenarios).
    var publishing: ChaosPublishing.Counts?
    /// The background scenario's column (policy × preset, ``ChaosLifecycleColumn``) and its
    /// numbers (nil for the other scenarios).
    var lifecycle: ChaosLifecycleCounts?

    /// Whether the "no silent loss" bar holds: nothing lost, duplicated or reordered, and every
    /// client caught up (publisher side: every message stored exactly once, in order).
    var isClean: Bool {
        if let counts = publishing {
            return note == nil && counts.stored == counts.published && counts.duplicated == 0 && counts.lostSilently == 0
                && counts.outOfOrder == 0
        }
        if let counts = lifecycle, counts.skipsByDesign {
            // A skip preset: what it skipped on purpose is not lost (``ChaosLifecycleCounts``),
            // but it must say so, and a counted skip must cover what was published while away
            // within its range (``ChaosLifecycleCounts/countMatches``).
            return note == nil && lost == 0 && duplicated == 0 && outOfOrder == 0 && caughtUpClients == clients - notConnected && notConnected == 0
                && counts.skippedOutcomes == clients && counts.countMatches
        }
        return note == nil && lost == 0 && duplicated == 0 && outOfOrder == 0 && caughtUpClients == clients - notConnected && notConnected == 0
    }
}

/// Computes a ``ChaosResult`` from what was published and what a probe's clients received.
enum ChaosMeasure {
    static func result(scenario: String, sdk: ChaosSDK, clients: Int, events: [ProbeEvent], published: [PublishRecord],
                       faultStart: Int64, faultEnd: Int64, connectedCategory: String, reconnectCategories: Set<String>) -> ChaosResult {
        let acknowledged = published.filter(\.acknowledged)
        let expected = Set(acknowledged.map(\.seq))
        // Needed to be caught up: everything sent up to the fault's end and the first message after it.
        var needed = Set(acknowledged.filter { $0.sentAt <= faultEnd }.map(\.seq))
        if let firstAfter = acknowledged.filter({ $0.sentAt > faultEnd }).min(by: { $0.seq < $1.seq }) { needed.insert(firstAfter.seq) }

        var perClient: [Int: [ProbeEvent]] = [:]
        for event in events { perClient[event.client, default: []].append(event) }

        var lost = 0, duplicated = 0, outOfOrder = 0, notConnected = 0
        var caughtUp: [Double] = []
        var statusCounts: [String: Int] = [:]
        var statusOrder: [String] = []
        var eventCounts: [String: Int] = [:]
        var eventOrder: [String] = []
        var reconnectTimes: [Int64] = []
        var lostSample: Set<Int> = []
        for client in 0..<clients {
            let mine = perClient[client] ?? []
            let connected = mine.contains { if case .status(let c) = $0.kind { c == connectedCategory && $0.at < faultStart } else { false } }
            if !connected { notConnected += 1; continue }
            var seen: Set<Int> = []
            var highest = Int.min
            var arrival: [Int: Int64] = [:]
            var firstReconnect: Int64?
            for event in mine {
                switch event.kind {
                case .message(let seq):
                    guard seq >= 0 else { continue }
                    if seen.contains(seq) {
                        duplicated += 1
                        continue
                    }
                    seen.insert(seq)
                    arrival[seq] = event.at
                    if seq < highest { outOfOrder += 1 }
                    highest = max(highest, seq)
                case .status(let category):
                    guard event.at >= faultStart - 50 else { continue }
                    if statusCounts[category] == nil { statusOrder.append(category) }
                    statusCounts[category, default: 0] += 1
                    if firstReconnect == nil, reconnectCategories.contains(category), event.at >= faultEnd - 50 { firstReconnect = event.at }
                case .event(let what):
                    guard event.at >= faultStart - 50 else { continue }
                    if eventCounts[what] == nil { eventOrder.append(what) }
                    eventCounts[what, default: 0] += 1
                case .publishAccepted, .publishSent, .publishFailed, .publishDone, .lifecycle, .continuity:
                    continue
                }
            }
            let missing = expected.subtracting(seen)
            lost += missing.count
            if lostSample.count < 10 { lostSample.formUnion(missing.sorted().prefix(10 - lostSample.count)) }
            if let reconnect = firstReconnect { reconnectTimes.append(reconnect) }
            if needed.isSubset(of: seen) {
                let last = needed.compactMap { arrival[$0] }.max() ?? faultEnd
                caughtUp.append(max(0, Double(last - faultEnd) / 1000))
            }
        }
        caughtUp.sort()
        var peak: Int?
        if clients > 1, !reconnectTimes.isEmpty {
            reconnectTimes.sort()
            var best = 0, start = 0
            for end in reconnectTimes.indices {
                while reconnectTimes[end] - reconnectTimes[start] >= 1000 { start += 1 }
                best = max(best, end - start + 1)
            }
            peak = best
        }
        return ChaosResult(
            scenario: scenario, sdk: sdk, clients: clients, notConnected: notConnected, lost: lost, duplicated: duplicated,
            outOfOrder: outOfOrder, caughtUpClients: caughtUp.count,
            caughtUpMedian: caughtUp.isEmpty ? nil : caughtUp[caughtUp.count / 2], caughtUpMax: caughtUp.last,
            statuses: statusOrder.map { statusCounts[$0]! > 1 ? "\($0) ×\(statusCounts[$0]!)" : $0 },
            events: eventOrder.map { eventCounts[$0]! > 1 ? "\($0) ×\(eventCounts[$0]!)" : $0 },
            peakReconnectsPerSecond: peak, note: nil, lostSample: lostSample.sorted())
    }
}

/// Renders results as the Markdown table of `docs/resilience.md`.
enum ChaosTable {
    static func markdown(_ results: [ChaosResult], scenarios: [ChaosScenario]) -> String {
        var lines = [
            "| Scenario | SDK | Clients | Lost | Duplicated | Out of order | Caught up after the fault | Statuses after the fault starts |",
            "|---|---|---:|---:|---:|---:|---|---|",
        ]
        for scenario in scenarios where !scenario.isPublisherSide && !scenario.isLifecycle {
            for result in results where result.scenario == scenario.id.rawValue {
                if let note = result.note {
                    lines.append("| \(scenario.title) | \(result.sdk.label) | \(result.clients) | – | – | – | – | \(escape(note)) |")
                    continue
                }
                lines.append("| \(scenario.title) | \(result.sdk.label) | \(clientsCell(result)) | \(result.lost) | \(result.duplicated) | "
                    + "\(result.outOfOrder) | \(caughtUpCell(result)) | \(escape(statusesCell(result))) |")
            }
        }
        return lines.joined(separator: "\n")
    }

    static func clientsCell(_ result: ChaosResult) -> String {
        result.notConnected == 0 ? "\(result.clients)" : "\(result.clients) (\(result.notConnected) never connected)"
    }

    static func caughtUpCell(_ result: ChaosResult) -> String {
        let connected = result.clients - result.notConnected
        guard let median = result.caughtUpMedian, let maximum = result.caughtUpMax else { return "**never** (0/\(connected))" }
        var text = result.clients == 1 ? seconds(maximum) : "median \(seconds(median)), max \(seconds(maximum))"
        if result.caughtUpClients < connected { text += " (**\(connected - result.caughtUpClients) never**)" }
        if let peak = result.peakReconnectsPerSecond { text += "; peak \(peak) reconnects/s" }
        return text
    }

    /// The statuses, then the session's own events (resumed / expired / transport changes; the
    /// reconnect started / succeeded events mirror the statuses and are left to the JSON).
    static func statusesCell(_ result: ChaosResult) -> String {
        var text = result.statuses.isEmpty ? "none" : result.statuses.joined(separator: ", ")
        let session = result.events.filter { !$0.hasPrefix("reconnect ") }
        if !session.isEmpty { text += "; events: " + session.joined(separator: ", ") }
        return text
    }

    static func seconds(_ value: Double) -> String {
        value < 10 ? String(format: "%.2f s", value) : String(format: "%.1f s", value)
    }

    private static func escape(_ text: String) -> String { text.replacingOccurrences(of: "|", with: "\\|") }
}
