import Foundation
import Synchronization

/// The text form of faults and schedules, shared by `tether chaos proxy` (flags, stdin) and the
/// HTTP control endpoint:
///
/// ```text
/// pass | refuse | reset | blackhole | captive-portal | truncated-json | fail-tls
/// latency <base> [<jitter>]        latency 200ms 50ms
/// bandwidth <bytes-per-second>     bandwidth 20k   (k = 1,000, m = 1,000,000)
/// drop <bytes>                     drop 512        (drop mid-response after 512 bytes)
/// ... [after <duration>] [for <duration>]          blackhole after 5s for 30s
/// ```
///
/// A fault without arguments also takes a bare duration as its length (`blackhole 30s`).
/// Several steps separated by `;` form a schedule. Durations: `250ms`, `5s`, `1.5s`, `2m`, `1h`
/// (a bare number is seconds).
extension FaultProxy.Fault: CustomStringConvertible {
    /// Parses one fault (`blackhole`, `latency 200ms 50ms`, `bandwidth 20k`...).
    public init(parsing text: String) throws(FaultProxyError) {
        let step = try FaultStep(parsing: text)
        guard step.after == .zero, step.lasting == nil else { throw FaultProxyError("'\(text)' is a step, not a fault") }
        self = step.fault
    }

    /// The fault in the command syntax (`latency 200ms 50ms`), which ``init(parsing:)`` reads back.
    public var description: String {
        switch self {
        case .pass: "pass"
        case .refuse: "refuse"
        case .reset: "reset"
        case .blackhole: "blackhole"
        case .latency(let base, let jitter):
            jitter == .zero ? "latency \(formatDuration(base))" : "latency \(formatDuration(base)) \(formatDuration(jitter))"
        case .bandwidth(let rate): "bandwidth \(rate)"
        case .dropMidResponse(let bytes): "drop \(bytes)"
        case .captivePortal: "captive-portal"
        case .truncatedJSON: "truncated-json"
        case .overloaded(let seconds): "overloaded \(seconds)"
        case .failTLSHandshake: "fail-tls"
        }
    }
}

extension FaultStep: CustomStringConvertible {
    /// Parses one step: a fault with optional `after <duration>` and `for <duration>`.
    public init(parsing text: String) throws(FaultProxyError) {
        var words = text.split(whereSeparator: \.isWhitespace).map(String.init)
        var after = Duration.zero
        var lasting: Duration?
        // Modifiers, anywhere after the fault name.
        var index = 1
        while index < words.count {
            let keyword = words[index].lowercased()
            if keyword == "after" || keyword == "for", index + 1 < words.count {
                let duration = try parseDuration(words[index + 1])
                if keyword == "after" { after = duration } else { lasting = duration }
                words.removeSubrange(index...(index + 1))
            } else {
                index += 1
            }
        }
        guard let name = words.first?.lowercased() else { throw FaultProxyError("empty fault") }
        var arguments = Array(words.dropFirst())
        func argumentCount(_ range: ClosedRange<Int>) throws(FaultProxyError) {
            guard range.contains(arguments.count) else {
                throw FaultProxyError("'\(name)' takes \(range.lowerBound == range.upperBound ? "\(range.lowerBound)" : "\(range.lowerBound)-\(range.upperBound)") argument(s): '\(text)'")
            }
        }
        let fault: FaultProxy.Fault
        switch name.replacingOccurrences(of: "-", with: "").replacingOccurrences(of: "_", with: "") {
        case "pass", "none", "ok":
            fault = .pass
        case "refuse":
            fault = .refuse
        case "reset":
            fault = .reset
        case "blackhole":
            fault = .blackhole
        case "captiveportal", "portal":
            fault = .captivePortal
        case "truncatedjson":
            fault = .truncatedJSON
        case "overloaded", "overload", "429":
            try argumentCount(0...2)
            // `overloaded [<retry-after seconds>] [<for>]`: the first bare number is Retry-After.
            var seconds = 5
            if let first = arguments.first, let value = Int(first), value >= 0 {
                seconds = value
                arguments.removeFirst()
            }
            fault = .overloaded(retryAfterSeconds: seconds)
        case "failtls", "failtlshandshake", "tls":
            fault = .failTLSHandshake
        case "latency":
            try argumentCount(1...2)
            fault = .latency(base: try parseDuration(arguments[0]),
                             jitter: arguments.count > 1 ? try parseDuration(arguments[1]) : .zero)
            arguments = []
        case "bandwidth":
            try argumentCount(1...1)
            fault = .bandwidth(bytesPerSecond: try parseByteCount(arguments[0]))
            arguments = []
        case "drop", "dropmidresponse":
            try argumentCount(1...1)
            fault = .dropMidResponse(afterBytes: try parseByteCount(arguments[0]))
            arguments = []
        default:
            throw FaultProxyError("unknown fault '\(name)'")
        }
        if arguments.count == 1, lasting == nil { lasting = try parseDuration(arguments[0]) }  // `blackhole 30s`
        else if !arguments.isEmpty { throw FaultProxyError("unexpected '\(arguments.joined(separator: " "))' in '\(text)'") }
        self.init(after: after, fault: fault, lasting: lasting)
    }

    /// Parses a schedule: steps separated by `;` or new lines (empty ones and `#` comments are skipped).
    public static func parseSchedule(_ text: String) throws(FaultProxyError) -> [FaultStep] {
        var steps: [FaultStep] = []
        for part in text.split(whereSeparator: { $0 == ";" || $0.isNewline }) {
            let line = part.trimmingCharacters(in: .whitespaces)
            if line.isEmpty || line.hasPrefix("#") { continue }
            steps.append(try FaultStep(parsing: line))
        }
        return steps
    }

    /// The step in the command syntax (`blackhole after 5s for 30s`).
    public var description: String {
        var text = fault.description
        if after != .zero { text += " after \(formatDuration(after))" }
        if let lasting { text += " for \(formatDuration(lasting))" }
        return text
    }
}

extension FaultProxy {
    /// Runs one control command and returns the answer to print: `status` returns
    /// ``statusJSON``; a single fault with no timing is applied at once (``apply(_:)``);
    /// anything else (timing, several `;`-separated steps) replaces the schedule
    /// (``schedule(_:)``).
    public func run(command: String) async throws -> String {
        let trimmed = command.trimmingCharacters(in: .whitespacesAndNewlines)
        if trimmed.lowercased() == "status" || trimmed.isEmpty { return statusJSON }
        let steps = try FaultStep.parseSchedule(trimmed)
        if steps.count == 1, steps[0].after == .zero, steps[0].lasting == nil {
            try await apply(steps[0].fault)
            return "ok: \(steps[0].fault)"
        }
        schedule(steps)
        return "ok: scheduled \(steps.map(\.description).joined(separator: "; "))"
    }

    /// The fault in effect and the counters, as one line of JSON.
    public var statusJSON: String {
        let (fault, c) = state.withLock { ($0.fault, $0.counters) }
        let fields: [(String, Int)] = [
            ("accepted", c.accepted), ("forwarded", c.forwarded), ("reset", c.reset), ("answered", c.answered),
            ("dropped", c.dropped), ("upstreamFailures", c.upstreamFailures), ("open", c.open),
            ("bytesToUpstream", c.bytesToUpstream), ("bytesToClient", c.bytesToClient),
        ]
        return "{\"fault\":\"\(fault)\"," + fields.map { "\"\($0.0)\":\($0.1)" }.joined(separator: ",") + "}"
    }
}

extension FaultStep {
    /// Parses a duration of the command syntax: `250ms`, `5s`, `1.5s`, `2m`, `1h`, `100us`; a
    /// bare number is seconds.
    public static func duration(parsing text: String) throws(FaultProxyError) -> Duration {
        try parseDuration(text)
    }
}

func parseDuration(_ text: String) throws(FaultProxyError) -> Duration {
    let lower = text.lowercased()
    let units: [(String, Double)] = [("ms", 1e-3), ("us", 1e-6), ("s", 1), ("m", 60), ("h", 3600)]
    var number = lower
    var scale = 1.0
    for (suffix, factor) in units where lower.hasSuffix(suffix) {
        number = String(lower.dropLast(suffix.count))
        scale = factor
        break
    }
    guard let value = Double(number), value >= 0, value.isFinite else { throw FaultProxyError("not a duration: '\(text)'") }
    return .nanoseconds(Int64((value * scale * 1e9).rounded()))
}

/// `5s`, `250ms`: the shortest exact form of a duration.
func formatDuration(_ duration: Duration) -> String {
    let nanos = nanoseconds(duration)
    if nanos % 1_000_000_000 == 0 { return "\(nanos / 1_000_000_000)s" }
    if nanos % 1_000_000 == 0 { return "\(nanos / 1_000_000)ms" }
    return "\(Double(nanos) / 1e9)s"
}

/// Parses `512`, `20k`, `1m`, `64kB/s` (k = 1,000, m = 1,000,000).
func parseByteCount(_ text: String) throws(FaultProxyError) -> Int {
    var lower = text.lowercased()
    if lower.hasSuffix("/s") { lower.removeLast(2) }
    if lower.hasSuffix("b") { lower.removeLast() }
    var scale = 1
    if lower.hasSuffix("k") { scale = 1000; lower.removeLast() } else if lower.hasSuffix("m") { scale = 1_000_000; lower.removeLast() }
    guard let value = Double(lower), value >= 0, value.isFinite else { throw FaultProxyError("not a byte count: '\(text)'") }
    return Int(value * Double(scale))
}
