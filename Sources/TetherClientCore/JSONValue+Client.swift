import Foundation
public import TetherProtocol

/// Conveniences the SDK adds to ``TetherProtocol/JSONValue``: integer access for wire fields
/// (timetokens travel as numbers or strings) and bridges to `Codable`.
extension JSONValue {
    /// An integer number.
    public static func int(_ value: some BinaryInteger) -> JSONValue {
        JSONValue.Number(text: String(value)).map(JSONValue.number) ?? .null
    }

    /// A floating-point number (non-finite values become `null`, which JSON cannot express).
    public static func double(_ value: Double) -> JSONValue { JSONValue.Number(value).map(JSONValue.number) ?? .null }

    /// The integer value of an integral number, of a numeric string, or of a boolean.
    public var intValue: Int? {
        switch self {
        case .number(let n): return n.exactInteger.flatMap { Int(exactly: $0) }
        case .string(let text): return Int(text)
        case .bool(let b): return b ? 1 : 0
        default: return nil
        }
    }

    /// The value as an unsigned 64-bit integer: a number literal or a string of digits
    /// (how timetokens travel).
    public var uint64Value: UInt64? {
        switch self {
        case .number(let n): return UInt64(n.text)
        case .string(let text): return UInt64(text)
        default: return nil
        }
    }

    /// The value as a `Double`, if it is a number.
    public var doubleValue: Double? { if case .number(let n) = self { return n.doubleValue } else { return nil } }

    /// Creates a value from any `Encodable` (via `JSONEncoder`).
    public init(encoding value: some Encodable) throws {
        let data = try JSONEncoder().encode(value)
        self = try JSONValue(parsing: Array(data))
    }

    /// Decodes this value into a `Decodable` type (via `JSONDecoder`).
    public func decode<T: Decodable>(_ type: T.Type = T.self) throws -> T {
        try JSONDecoder().decode(type, from: Data(jsonBytes))
    }
}
