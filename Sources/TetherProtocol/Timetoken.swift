/// A position on Tether's single timeline: the number of 100-nanosecond units since the Unix epoch.
///
/// Every stored or delivered event gets a unique, strictly increasing timetoken from the server's
/// sequencer. A subscriber's cursor is a timetoken meaning "I have every event up to here".
/// Timetokens exceed 2^53, so on the wire they travel as JSON strings wherever clients parse them
/// as strings (subscribe cursors, envelopes, publish results, v3 history) and as JSON numbers in
/// `/time/0` and v2 history.
public struct Timetoken: RawRepresentable, Hashable, Comparable, Sendable, CustomStringConvertible {
    /// The raw count of 100 ns units since 1970-01-01T00:00:00Z.
    public var rawValue: UInt64

    /// Creates a timetoken from its raw 100 ns count.
    public init(rawValue: UInt64) { self.rawValue = rawValue }

    /// Creates a timetoken from its raw 100 ns count.
    public init(_ rawValue: UInt64) { self.rawValue = rawValue }

    /// The zero timetoken: a handshake cursor (`tt=0`).
    public static let zero = Timetoken(0)

    /// The largest timetoken a request may carry. Anything above this is an absurd value and is
    /// rejected as a bad request (a 17-digit timetoken reaches year 5138 at `99999999999999999`).
    package static let maximumAccepted = Timetoken(99_999_999_999_999_999)

    /// Creates a timetoken for a moment given in nanoseconds since the Unix epoch.
    public init(unixNanoseconds: UInt64) { self.rawValue = unixNanoseconds / 100 }

    /// Creates a timetoken for a moment given in (fractional) seconds since the Unix epoch.
    /// Negative and non-finite inputs give zero; values past ``maximumStorable`` saturate there.
    public init(unixSeconds: Double) {
        let units = unixSeconds * 10_000_000
        guard units.isFinite, units > 0 else { self.rawValue = 0; return }
        self.rawValue = units >= Double(Self.maximumStorable.rawValue) ? Self.maximumStorable.rawValue : UInt64(units)
    }

    /// The largest timetoken a store can hold (stores keep timetokens as signed 64-bit
    /// integers). Arithmetic on timetokens saturates here instead of trapping.
    package static let maximumStorable = Timetoken(UInt64(Int64.max))

    /// This timetoken moved forward by `seconds` (fractions allowed), saturating at
    /// ``maximumStorable``; negative or non-finite amounts are treated as zero.
    package func adding(seconds: Double) -> Timetoken {
        let units = seconds * 10_000_000
        guard units.isFinite, units > 0 else { return self }
        let room = Self.maximumStorable.rawValue - min(rawValue, Self.maximumStorable.rawValue)
        if units >= Double(room) { return Self.maximumStorable }
        return Timetoken(rawValue + UInt64(units))
    }

    /// The raw value as a signed 64-bit integer, saturating at `Int64.max` (what stores keep).
    package var storageValue: Int64 { rawValue > UInt64(Int64.max) ? Int64.max : Int64(rawValue) }

    /// Whole seconds since the Unix epoch (what presence `timestamp` fields carry).
    public var unixSeconds: Int64 { Int64(rawValue / 10_000_000) }

    /// Parses the decimal form clients send (`tt`, `start`, `end`, `timetoken`...).
    ///
    /// Accepts 1–17 ASCII digits; returns `nil` for anything else (signs, spaces, exponents,
    /// values above ``maximumAccepted``), so callers can answer with a clear 400.
    /// (Inlinable: the server parses a `tt` on every subscribe, and the generic body called from
    /// another module walked the text through protocol witnesses, 1.4 % of a subscribe cycle.)
    @inlinable
    public init?(parsing text: some StringProtocol) {
        guard !text.isEmpty, text.utf8.count <= 17 else { return nil }
        var value: UInt64 = 0
        for byte in text.utf8 {
            guard byte >= 0x30 && byte <= 0x39 else { return nil }
            value = value * 10 + UInt64(byte - 0x30)
        }
        self.rawValue = value
    }

    /// The next timetoken after this one.
    package var successor: Timetoken { Timetoken(rawValue &+ 1) }

    /// The decimal form, as used on the wire.
    public var description: String { String(rawValue) }

    public static func < (lhs: Timetoken, rhs: Timetoken) -> Bool { lhs.rawValue < rhs.rawValue }
}
