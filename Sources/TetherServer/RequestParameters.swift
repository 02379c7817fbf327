import TetherProtocol

/// A query parameter that is malformed or outside its documented range.
///
/// Every number a request carries is read through ``WireRequest``'s bounded accessors, which
/// throw this instead of trapping, clamping silently or overflowing later. The router turns it
/// into the 400 body of the route's service family (see ``ParameterBounds``).
struct ParameterError: Error, CustomStringConvertible {
    /// The parameter's name (`ttl`, `count`, …).
    var name: String
    /// What was expected.
    var expected: String

    var description: String { "Invalid \(name): expected \(expected)" }
}

/// The documented range of every numeric request parameter (docs/security.md, "Request
/// parameters"). PubNub's ranges are used where PubNub documents one.
enum ParameterBounds {
    /// Publish `ttl`, in hours: 0 (keep forever) up to 100 years. Fractions are accepted.
    static let publishTTLHours: ClosedRange<Double> = 0...876_000
    /// Publish `seqn`: the publisher's sequence number (PubNub SDKs count 1…65,535).
    static let sequence: ClosedRange<Int> = 0...4_294_967_295
    /// Presence `heartbeat` (the presence timeout a client asks for), in seconds. The keyset's
    /// minimum and maximum are applied afterwards; 0 means the default.
    static let heartbeatSeconds: ClosedRange<Int> = 0...86_400
    /// Subscribe `tr` (region): any small non-negative number is accepted and ignored.
    static let region: ClosedRange<Int> = 0...1_000_000
    /// History v2 `count`: 1…100 (larger values are served as 100, as PubNub does).
    static let historyCount: ClosedRange<Int> = 1...Int(Int32.max)
    /// Fetch v3 `max`: 1…100 for one channel, 1…25 otherwise (larger values are served at the
    /// ceiling, as PubNub does).
    static let fetchMax: ClosedRange<Int> = 1...Int(Int32.max)
    /// Here-now `limit` (occupants listed per channel): 0…1,000 (larger values give 1,000).
    static let hereNowLimit: ClosedRange<Int> = 0...Int(Int32.max)
    /// Here-now `offset`.
    static let hereNowOffset: ClosedRange<Int> = 0...Int(Int32.max)
    /// Message actions `limit`: 1…100 (larger values are served as 100, as PubNub does).
    static let actionsLimit: ClosedRange<Int> = 1...Int(Int32.max)
    /// v2 grant `ttl`, in minutes: 0 (no expiry) … 525,600 (one year), PubNub's range.
    static let grantTTLMinutes: ClosedRange<Int> = 0...525_600
}

extension WireRequest {
    /// The query value of `name`, `nil` when absent or empty.
    func text(_ name: String) -> String? {
        guard let value = query[name], !value.isEmpty else { return nil }
        return value
    }

    /// An integer parameter within `range`; `nil` when absent or empty.
    ///
    /// Accepts an optional `-` and ASCII digits only (no `+`, spaces, exponents or fractions);
    /// anything that does not fit in `Int` is out of range, not a trap.
    func integer(_ name: String, in range: ClosedRange<Int>) throws(ParameterError) -> Int? {
        guard let text = text(name) else { return nil }
        guard text.utf8.count <= 20, let value = Int(text, radix: 10), text.utf8.first != UInt8(ascii: "+") else {
            throw ParameterError(name: name, expected: "an integer from \(range.lowerBound) to \(range.upperBound)")
        }
        guard range.contains(value) else {
            throw ParameterError(name: name, expected: "an integer from \(range.lowerBound) to \(range.upperBound)")
        }
        return value
    }

    /// A decimal parameter within `range` (finite; `nan`, `inf` and exponents beyond the range
    /// are refused); `nil` when absent or empty.
    func decimal(_ name: String, in range: ClosedRange<Double>) throws(ParameterError) -> Double? {
        guard let text = text(name) else { return nil }
        let bytes = text.utf8
        let plain = bytes.count <= 32 && bytes.allSatisfy { ($0 >= 0x30 && $0 <= 0x39) || $0 == UInt8(ascii: ".") }
        guard plain, let value = Double(text), value.isFinite, range.contains(value) else {
            throw ParameterError(name: name, expected: "a number from \(Self.format(range.lowerBound)) to \(Self.format(range.upperBound))")
        }
        return value
    }

    /// A boolean parameter: `1`/`true` or `0`/`false` (any case); `nil` when absent or empty.
    func strictBool(_ name: String) throws(ParameterError) -> Bool? {
        guard let text = text(name) else { return nil }
        switch text.lowercased() {
        case "1", "true": return true
        case "0", "false": return false
        default: throw ParameterError(name: name, expected: "0 or 1")
        }
    }

    /// A timetoken parameter (1–17 digits); `nil` when absent or empty.
    func timetoken(_ name: String) throws(ParameterError) -> Timetoken? {
        guard let text = text(name) else { return nil }
        guard let value = Timetoken(parsing: text) else {
            throw ParameterError(name: name, expected: "a timetoken of up to 17 digits")
        }
        return value
    }

    private static func format(_ value: Double) -> String {
        value == value.rounded() && abs(value) < 1e15 ? String(Int64(value)) : String(value)
    }
}
