import Foundation
import Logging
import Tether

/// One column of the background scenario (`background`): an SDK on a wire with a background
/// policy and a foreground catch-up preset, or the PubNub Python SDK running PubNub's own recipe.
struct ChaosLifecycleColumn: Sendable {
    /// A short name (`ws-suspend-everything`), in the JSON as ``ChaosLifecycleCounts/column``.
    let id: String
    let sdk: ChaosSDK
    /// Tether: the probe's `--background-policy`; nil for the PubNub recipe.
    let policy: BackgroundPolicyChoice?
    let catchUp: CatchUpChoice?
    /// The suspend policy's asked keep-alive, in seconds.
    let suspendKeepAlive: Int
    /// The table's words for the policy and the preset.
    let policyLabel: String
    let catchUpLabel: String

    /// Whether the preset skips what was published while away on purpose.
    var skipsByDesign: Bool { catchUp == .unreadCounts || catchUp == .latestOnly }

    /// The columns for a background of `backgroundSeconds`, for the chosen SDKs: on each Tether
    /// wire disconnect / keep / suspend with `everything` and the two skip presets (with
    /// disconnect, as ``LifecycleOptions/unreadCountsWithPush`` and ``LifecycleOptions/latestOnly``
    /// are); on WebSocket also a suspend asking half the background when that differs from the
    /// default 300 s (the quick run: a session that expires while away); PubNub's recipe on the
    /// threaded Python SDK.
    static func all(backgroundSeconds: Double, sdks: [ChaosSDK]) -> [ChaosLifecycleColumn] {
        var columns: [ChaosLifecycleColumn] = []
        for sdk in [ChaosSDK.tetherWebSocket, .tether] where sdks.contains(sdk) {
            let wire = sdk == .tetherWebSocket ? "ws" : "lp"
            func column(_ policy: BackgroundPolicyChoice, _ catchUp: CatchUpChoice, keepAlive: Int = 300, _ policyLabel: String,
                        _ catchUpLabel: String) -> ChaosLifecycleColumn {
                let suffix = policy == .suspend && keepAlive != 300 ? "-\(keepAlive)s" : ""
                return ChaosLifecycleColumn(id: "\(wire)-\(policy.rawValue)\(suffix)-\(catchUp.rawValue)", sdk: sdk, policy: policy,
                                            catchUp: catchUp, suspendKeepAlive: keepAlive, policyLabel: policyLabel,
                                            catchUpLabel: catchUpLabel)
            }
            columns.append(column(.disconnect, .everything, "disconnect", "everything (scenario 1, unsubscribe)"))
            columns.append(column(.keep, .everything, "keep", "everything (scenario 1, no unsubscribe)"))
            columns.append(column(.suspend, .everything, "suspend(300 s)", "everything"))
            let half = max(1, Int(backgroundSeconds / 2))
            if sdk == .tetherWebSocket, half != 300 {
                columns.append(column(.suspend, .everything, keepAlive: half, "suspend(\(half) s)", "everything"))
            }
            columns.append(column(.disconnect, .unreadCounts, "disconnect", "unreadCounts (scenario 2)"))
            columns.append(column(.disconnect, .latestOnly, "disconnect", "latestOnly (scenario 3)"))
        }
        if sdks.contains(.pubnubThreaded) {
            columns.append(ChaosLifecycleColumn(id: "pubnub-recipe", sdk: .pubnubThreaded, policy: nil, catchUp: nil, suspendKeepAlive: 0,
                                                policyLabel: "unsubscribe (PubNub's recipe)",
                                                catchUpLabel: "history since the last timetoken + 1, paged, live cached"))
        }
        return columns
    }
}

/// The background scenario's numbers for one column.
struct ChaosLifecycleCounts: Sendable, Codable {
    /// ``ChaosLifecycleColumn/id``, and its labels.
    var column: String
    var policy: String
    var catchUp: String
    /// How long the probes were frozen (SIGSTOP), in seconds.
    var backgroundSeconds: Double
    /// Acknowledged messages sent between the `background` command and the `foreground` one.
    var publishedAway: Int
    /// Whether the preset skips on purpose (unreadCounts, latestOnly): `lost` then counts only
    /// messages outside the skipped ranges.
    var skipsByDesign: Bool
    /// Clients that reported a `skipped` continuity outcome after the foreground.
    var skippedOutcomes: Int
    /// The sum of the skipped outcomes' counts; nil when not counted (latestOnly).
    var skippedReported: Int?
    /// Acknowledged messages whose timetoken is in a reported skipped range `(from, through]`.
    var skippedInRange: Int
    /// Of those, how many were sent before the `foreground` line (the rest were published
    /// between the foreground and the resubscribe that closed the range).
    var skippedInRangeBeforeForeground: Int
    /// Of those, how many were delivered anyway.
    var deliveredInSkippedRange: Int
    /// Whether a counted skip covers every message of its range published while away and no more
    /// than its range: `skippedInRangeBeforeForeground ≤ skippedReported ≤ skippedInRange`.
    /// The count (`message-counts`) is taken when the foreground probe runs, the range closes at
    /// the resubscribe just after it, so messages published in between are in the range and may
    /// not be counted. True when not counted.
    var countMatches: Bool
    /// The lifecycle lines the probe acknowledged (`background`, `foreground`; diagnosis).
    var acknowledged: [String] = []
    /// The continuity outcomes after the foreground (`recovered 300`, `skipped 312`…); for
    /// PubNub's recipe what its foreground fetched (`history 3011 in 31 pages, 4 cached live`).
    var continuity: [String]
}

extension ChaosScenarioRunner {
    /// The background scenario: every column's probe runs at once against one server (default
    /// WebSocket settings: 300 s keep-alive, 25 s pings, suspends up to 3,600 s) while numbered
    /// messages are published; each probe is told `background`, given 2 s (the time iOS leaves an
    /// app to finish), frozen with SIGSTOP for the background time, thawed with SIGCONT and told
    /// `foreground`. Publishing goes on for 5 s more.
    func runBackground() async throws -> [ChaosResult] {
        let config = #"{"demoKeyset": true, "rateLimiting": false}"#
        try config.write(toFile: workDirectory + "/tether.json", atomically: true, encoding: .utf8)
        let server = ServerProcess(
            arguments: ["--data-dir", workDirectory + "/data", "--config", workDirectory + "/tether.json", "--log-level", "warning"],
            logPath: workDirectory + "/server.log")
        try await server.start()
        defer { Task { await server.stop() } }
        let admin = try makeAdmin(origin: server.origin)
        let channel = "chaos-background-\(UInt32.random(in: 0...UInt32.max))"
        let backgroundSeconds = max(1, (600 * options.scale * 1000).rounded() / 1000)
        let columns = ChaosLifecycleColumn.all(backgroundSeconds: backgroundSeconds, sdks: sdks)

        var results: [ChaosResult] = []
        if sdks.contains(.pubnubAsyncio) {
            results.append(lifecycleNote(.pubnubAsyncio, note: "skipped: PubNub's recipe runs on the threaded SDK (pubnub-threaded)"))
        }
        var probes: [(column: ChaosLifecycleColumn, probe: ProbeProcess)] = []
        for column in columns {
            var command: [String]
            switch column.sdk {
            case .tether, .tetherWebSocket:
                guard let policy = column.policy, let catchUp = column.catchUp else { continue }
                command = [ServerProcess.executablePath, "chaos", "probe", "--origin", server.origin, "--channel", channel,
                           "--user-prefix", column.id, "--transport", column.sdk == .tetherWebSocket ? "websocket" : "long-poll",
                           "--background-policy", policy.rawValue, "--suspend-keep-alive", String(column.suspendKeepAlive),
                           "--catch-up", catchUp.rawValue]
            case .pubnubThreaded:
                if let pythonProblem {
                    results.append(lifecycleNote(column.sdk, note: pythonProblem, column: column, backgroundSeconds: backgroundSeconds))
                    continue
                }
                command = [absolute(pythonPath), "-u", probeScript, "--mode", "threaded", "--recipe", "catch-up", "--origin", server.origin,
                           "--channel", channel, "--user-prefix", column.id]
            case .pubnubAsyncio:
                continue
            }
            probes.append((column, try ProbeProcess(sdk: column.sdk, clients: 1, command: command,
                                                    stderrPath: workDirectory + "/probe-\(column.id).log")))
        }
        defer { for entry in probes { Task { await entry.probe.stop(grace: .seconds(1)) } } }

        let connectDeadline = ContinuousClock.now + .seconds(60)
        while ContinuousClock.now < connectDeadline {
            if probes.allSatisfy({ hasStatus($0.probe, $0.probe.sdk.connectedCategory) }) { break }
            try await Task.sleep(for: .milliseconds(100))
        }

        let publisher = ChaosPublisher(client: admin, channel: channel, rate: scenario.publishRate)
        let publishing = Task { await publisher.run() }
        try await Task.sleep(for: .seconds(2))

        // Background: tell every app, let it finish (bye, suspend frame, leave, unsubscribe), freeze it.
        let backgroundAt = unixMilliseconds()
        for entry in probes { entry.probe.send("background") }
        let ackDeadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < ackDeadline, !probes.allSatisfy({ hasLifecycle($0.probe, "background") }) {
            try await Task.sleep(for: .milliseconds(50))
        }
        try await Task.sleep(for: .seconds(2))
        for entry in probes { entry.probe.freeze(true) }
        FileHandle.standardError.write(Data(("   background: \(probes.count) probes frozen for \(ChaosTable.seconds(backgroundSeconds))\n").utf8))
        try await Task.sleep(for: .milliseconds(Int64(backgroundSeconds * 1000)))

        // Foreground: thaw and tell every app at once.
        let foregroundAt = unixMilliseconds()
        for entry in probes { entry.probe.freeze(false) }
        for entry in probes { entry.probe.send("foreground") }
        try await Task.sleep(for: .seconds(5))
        publisher.stop()
        await publishing.value
        let published = publisher.records

        func measure(_ entry: (column: ChaosLifecycleColumn, probe: ProbeProcess)) -> ChaosResult {
            ChaosLifecycleMeasure.result(column: entry.column, events: entry.probe.snapshot, published: published,
                                         backgroundAt: backgroundAt, foregroundAt: foregroundAt, backgroundSeconds: backgroundSeconds)
        }
        let settleDeadline = ContinuousClock.now + .milliseconds(Int64(max(options.settleTimeout, 30) * 1000))
        while ContinuousClock.now < settleDeadline {
            if probes.allSatisfy({ let r = measure($0); return r.lost == 0 && r.caughtUpClients == r.clients }) { break }
            try await Task.sleep(for: .milliseconds(250))
        }
        try await Task.sleep(for: .milliseconds(500))  // late duplicates

        let acknowledged = published.filter(\.acknowledged).count
        for entry in probes {
            var result = measure(entry)
            if !entry.probe.isRunning {
                result.note = "the probe exited: \(entry.probe.errorTail)"
            } else if acknowledged < 10 {
                result.note = "the run itself failed: only \(acknowledged) publishes were acknowledged"
            }
            results.append(result)
        }
        for entry in probes { await entry.probe.stop() }
        await admin.shutdown()
        let serverSurvived = server.isRunning
        await server.stop()
        if !serverSurvived {
            for index in results.indices where results[index].note == nil { results[index].note = "the server was not running at the end" }
        }
        return results
    }

    private func lifecycleNote(_ sdk: ChaosSDK, note: String, column: ChaosLifecycleColumn? = nil,
                               backgroundSeconds: Double = 0) -> ChaosResult {
        var result = ChaosResult(scenario: scenario.id.rawValue, sdk: sdk, clients: 0, notConnected: 0, lost: 0, duplicated: 0,
                                 outOfOrder: 0, caughtUpClients: 0, caughtUpMedian: nil, caughtUpMax: nil, statuses: [],
                                 peakReconnectsPerSecond: nil, note: note)
        result.lifecycle = ChaosLifecycleCounts(
            column: column?.id ?? sdk.rawValue, policy: column?.policyLabel ?? "–", catchUp: column?.catchUpLabel ?? "–",
            backgroundSeconds: backgroundSeconds, publishedAway: 0, skipsByDesign: column?.skipsByDesign ?? false, skippedOutcomes: 0,
            skippedReported: nil, skippedInRange: 0, skippedInRangeBeforeForeground: 0, deliveredInSkippedRange: 0, countMatches: true,
            continuity: [])
        return result
    }

    private func hasStatus(_ probe: ProbeProcess, _ category: String) -> Bool {
        probe.snapshot.contains { if case .status(let c) = $0.kind { c == category } else { false } }
    }

    private func hasLifecycle(_ probe: ProbeProcess, _ what: String) -> Bool {
        probe.snapshot.contains { if case .lifecycle(let w) = $0.kind { w == what } else { false } }
    }
}

/// Computes the background scenario's result for one column (one client per probe).
enum ChaosLifecycleMeasure {
    /// Lost: acknowledged messages never delivered, outside any skipped range the client
    /// reported (a skip preset's range is skipped by design and counted apart). Caught up:
    /// for `everything` and the PubNub recipe, when the last message sent before the foreground
    /// was delivered; for the skip presets, when the skipped outcome was reported and the first
    /// message after its range was delivered — in seconds from the foreground.
    static func result(column: ChaosLifecycleColumn, events: [ProbeEvent], published: [PublishRecord], backgroundAt: Int64,
                       foregroundAt: Int64, backgroundSeconds: Double) -> ChaosResult {
        let acknowledgedRecords = published.filter(\.acknowledged)
        let connectedCategory = column.sdk.connectedCategory
        let connected = events.contains { if case .status(let c) = $0.kind { c == connectedCategory && $0.at < backgroundAt } else { false } }

        var ranges: [(from: UInt64, through: UInt64)] = []
        var skippedOutcomes = 0
        var skippedReported: Int?
        var skippedAt: Int64?
        var continuity: [String] = []
        var acknowledged: [String] = []
        var statuses: [String] = []
        var statusCounts: [String: Int] = [:]
        var sessionEvents: [String] = []
        var eventCounts: [String: Int] = [:]
        var seen: Set<Int> = []
        var arrival: [Int: Int64] = [:]
        var highest = Int.min
        var duplicated = 0, outOfOrder = 0
        for event in events {
            switch event.kind {
            case .message(let seq):
                guard seq >= 0 else { continue }
                if seen.contains(seq) { duplicated += 1; continue }
                seen.insert(seq)
                arrival[seq] = event.at
                if seq < highest { outOfOrder += 1 }
                highest = max(highest, seq)
            case .continuity(let outcome, let count, let from, let through):
                guard event.at >= foregroundAt - 50 else { continue }
                continuity.append(outcome + (count.map { " \($0)" } ?? (outcome == "skipped" ? " (not counted)" : "")))
                if outcome == "skipped", let from, let through {
                    ranges.append((from, through))
                    skippedOutcomes += 1
                    if let count { skippedReported = (skippedReported ?? 0) + count }
                    skippedAt = skippedAt ?? event.at
                }
            case .status(let category):
                guard event.at >= backgroundAt - 50 else { continue }
                if statusCounts[category] == nil { statuses.append(category) }
                statusCounts[category, default: 0] += 1
            case .event(let what):
                guard event.at >= backgroundAt - 50, !what.hasPrefix("reconnect ") else { continue }
                if eventCounts[what] == nil { sessionEvents.append(what) }
                eventCounts[what, default: 0] += 1
            case .lifecycle(let what):
                // PubNub's recipe says what its foreground fetched (`history 3011 in 31 pages, 4 cached live`).
                if what.hasPrefix("history ") { continuity.append(what) } else { acknowledged.append(what) }
            case .publishAccepted, .publishSent, .publishFailed, .publishDone:
                continue
            }
        }
        func inSkippedRange(_ record: PublishRecord) -> Bool {
            guard let tt = record.timetoken else { return false }
            return ranges.contains { tt > $0.from && tt <= $0.through }
        }
        let skippedRecords = acknowledgedRecords.filter(inSkippedRange)
        let skippedSeqs = Set(skippedRecords.map(\.seq))
        let beforeForeground = skippedRecords.filter { $0.sentAt <= foregroundAt }.count
        let lost = connected ? acknowledgedRecords.filter { !seen.contains($0.seq) && !skippedSeqs.contains($0.seq) }.count : 0
        let lostSample = acknowledgedRecords.filter { !seen.contains($0.seq) && !skippedSeqs.contains($0.seq) }.prefix(10).map(\.seq)

        var caughtUp: Double?
        if column.skipsByDesign {
            let firstAfter = acknowledgedRecords.filter { rec in
                guard let tt = rec.timetoken else { return false }
                return !ranges.isEmpty && ranges.allSatisfy { tt > $0.through }
            }.min { $0.seq < $1.seq }
            if let skippedAt, let firstAfter, let at = arrival[firstAfter.seq] {
                caughtUp = max(0, Double(max(skippedAt, at) - foregroundAt) / 1000)
            }
        } else {
            let needed = acknowledgedRecords.filter { $0.sentAt <= foregroundAt }.map(\.seq)
            if needed.allSatisfy(seen.contains) {
                caughtUp = max(0, Double((needed.compactMap { arrival[$0] }.max() ?? foregroundAt) - foregroundAt) / 1000)
            }
        }
        let counts = ChaosLifecycleCounts(
            column: column.id, policy: column.policyLabel, catchUp: column.catchUpLabel, backgroundSeconds: backgroundSeconds,
            publishedAway: acknowledgedRecords.filter { $0.sentAt >= backgroundAt && $0.sentAt <= foregroundAt }.count,
            skipsByDesign: column.skipsByDesign, skippedOutcomes: skippedOutcomes, skippedReported: skippedReported,
            skippedInRange: skippedRecords.count, skippedInRangeBeforeForeground: beforeForeground,
            deliveredInSkippedRange: skippedRecords.filter { seen.contains($0.seq) }.count,
            countMatches: skippedReported.map { beforeForeground <= $0 && $0 <= skippedRecords.count } ?? true, acknowledged: acknowledged,
            continuity: continuity)
        var result = ChaosResult(
            scenario: ChaosScenario.ID.background.rawValue, sdk: column.sdk, clients: 1, notConnected: connected ? 0 : 1, lost: lost,
            duplicated: duplicated, outOfOrder: outOfOrder, caughtUpClients: caughtUp == nil ? 0 : 1, caughtUpMedian: caughtUp,
            caughtUpMax: caughtUp,
            statuses: statuses.map { statusCounts[$0]! > 1 ? "\($0) ×\(statusCounts[$0]!)" : $0 },
            events: sessionEvents.map { eventCounts[$0]! > 1 ? "\($0) ×\(eventCounts[$0]!)" : $0 },
            peakReconnectsPerSecond: nil, note: nil, lostSample: Array(lostSample))
        result.lifecycle = counts
        return result
    }
}

extension ChaosTable {
    /// The background scenario's table: one row per column.
    static func lifecycleMarkdown(_ results: [ChaosResult]) -> String? {
        let rows = results.filter { $0.lifecycle != nil }
        guard !rows.isEmpty else { return nil }
        let away = rows.compactMap { $0.lifecycle?.backgroundSeconds }.max() ?? 0
        var lines = [
            "Background \(seconds(away)) (SIGSTOP), then foreground:",
            "",
            "| SDK | Background policy | Foreground catch-up | Published while away | Lost | Duplicated | Out of order "
                + "| Skipped: reported / in its range | Foreground → caught up | Continuity; statuses and events after the background |",
            "|---|---|---|---:|---:|---:|---:|---|---|---|",
        ]
        for result in rows {
            guard let counts = result.lifecycle else { continue }
            let start = "| \(result.sdk.label) | \(counts.policy) | \(counts.catchUp) |"
            if let note = result.note {
                lines.append(start + " – | – | – | – | – | – | \(escapeCell(note)) |")
                continue
            }
            var skipped = "–"
            if counts.skipsByDesign {
                skipped = counts.skippedOutcomes == 0 ? "**none reported**"
                    : "\(counts.skippedReported.map(String.init) ?? "not counted") / \(counts.skippedInRange)"
                if counts.skippedInRange != counts.skippedInRangeBeforeForeground {
                    skipped += " (\(counts.skippedInRange - counts.skippedInRangeBeforeForeground) sent after the foreground)"
                }
                if !counts.countMatches { skipped += " **(count outside the range)**" }
                if counts.deliveredInSkippedRange > 0 { skipped += " (\(counts.deliveredInSkippedRange) delivered anyway)" }
            }
            let lost = counts.skipsByDesign ? "\(result.lost) (+\(counts.skippedInRange) skipped by design)" : "\(result.lost)"
            var detail = counts.continuity.isEmpty ? "" : counts.continuity.joined(separator: ", ") + "; "
            detail += statusesCell(result)
            lines.append(start + " \(counts.publishedAway) | \(lost) | \(result.duplicated) | \(result.outOfOrder) | \(skipped) | "
                + "\(caughtUpCell(result)) | \(escapeCell(detail)) |")
        }
        return lines.joined(separator: "\n")
    }

    static func escapeCell(_ text: String) -> String { text.replacingOccurrences(of: "|", with: "\\|") }
}
