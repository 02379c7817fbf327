/// A parsed JSON value (RFC 8259).
///
/// The server relays payloads verbatim (see ``JSONText``); it builds a `JSONValue` only where it
/// must look inside one — a message's `meta` and payload, parsed once per message to evaluate
/// subscribe filters (``FilterExpression``).
///
/// Numbers keep their literal text (so a 20-digit id survives a round trip) together with the
/// nearest `Double` and, when the literal denotes an integer that fits, the exact `Int64`
/// (``Number``). Equality is structural: `1` and `1.0` are different values, and objects compare
/// as dictionaries (member order is not significant).
public enum JSONValue: Sendable, Hashable {
    /// `null`.
    case null
    /// `true` or `false`.
    case bool(Bool)
    /// A number.
    case number(Number)
    /// A string.
    case string(String)
    /// An array.
    case array([JSONValue])
    /// An object. When a text repeats a member name, the last occurrence wins.
    case object([String: JSONValue])

    /// A JSON number: its literal text, its nearest `Double`, and its exact integer value when it
    /// has one that fits in `Int64`.
    public struct Number: Sendable, Hashable, CustomStringConvertible {
        /// The literal text, in JSON number syntax (for example `42`, `-1.5e3`).
        public let text: String
        /// The nearest `Double` (infinite for literals beyond `Double`'s range, such as `1e999`).
        public let doubleValue: Double
        /// The exact value when the literal denotes an integer within `Int64`'s range
        /// (`42`, `-7`, `1.0`, `25e2`), otherwise `nil` (`1.5`, `1e30`, `12345678901234567890`).
        public let exactInteger: Int64?

        /// An integer.
        public init(_ value: Int64) {
            text = String(value)
            doubleValue = Double(value)
            exactInteger = value
        }

        /// An integer.
        public init(_ value: Int) { self.init(Int64(value)) }

        /// A floating-point number; `nil` when `value` is infinite or NaN, which JSON cannot express.
        public init?(_ value: Double) {
            guard value.isFinite else { return nil }
            self.init(uncheckedText: String(value))
        }

        /// Parses the literal text of a JSON number (`-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`);
        /// `nil` when `text` is anything else (including surrounding whitespace).
        public init?(text: String) {
            guard NumberSyntax.scan(Array(text.utf8), allowLeadingZeros: false) else { return nil }
            self.init(uncheckedText: text)
        }

        /// Builds a number from text already known to be a number in the relaxed syntax
        /// (``NumberSyntax``); leading zeros are accepted here.
        init(uncheckedText text: String) {
            self.text = text
            // `Double(_:)` accepts every string the number syntax does; it only fails on other syntax.
            doubleValue = Double(text) ?? .nan
            exactInteger = NumberSyntax.exactInteger(text.utf8)
        }

        /// The literal text.
        public var description: String { text }
    }

    /// Parses one JSON value surrounded by optional whitespace from UTF-8 bytes.
    ///
    /// Accepts exactly what `JSONText.validate(_:)` accepts and fails with the same offset and
    /// reason, including nesting deeper than ``JSONText/maximumDepth``. Inside strings,
    /// bytes that are not valid UTF-8 and `\u` escapes of unpaired surrogates (which `JSONText`
    /// also lets through) become U+FFFD.
    public init(parsing bytes: some Collection<UInt8>) throws(JSONText.Invalid) {
        var parser = JSONValueParser(bytes: Array(bytes))
        self = try parser.parseDocument()
    }

    /// Parses one JSON value from a string (see the byte-collection variant).
    public init(parsing text: String) throws(JSONText.Invalid) {
        try self.init(parsing: Array(text.utf8))
    }

    /// The member `key` of an object, or `nil` (also when this is not an object).
    public subscript(key: String) -> JSONValue? {
        if case .object(let members) = self { return members[key] }
        return nil
    }

    /// The element at `index` of an array, or `nil` when out of range or not an array.
    public subscript(index: Int) -> JSONValue? {
        guard case .array(let items) = self, items.indices.contains(index) else { return nil }
        return items[index]
    }

    /// The string, if this is a string.
    public var stringValue: String? { if case .string(let value) = self { value } else { nil } }
    /// The boolean, if this is a boolean.
    public var boolValue: Bool? { if case .bool(let value) = self { value } else { nil } }
    /// The number, if this is a number.
    public var numberValue: Number? { if case .number(let value) = self { value } else { nil } }
    /// The elements, if this is an array.
    public var arrayValue: [JSONValue]? { if case .array(let value) = self { value } else { nil } }
    /// The members, if this is an object.
    public var objectValue: [String: JSONValue]? { if case .object(let value) = self { value } else { nil } }
    /// Whether this is `null`.
    public var isNull: Bool { if case .null = self { true } else { false } }

    /// Appends the compact JSON text of this value (object members sorted by name) to `writer`.
    ///
    /// Recursion follows the value's nesting; values produced by the parser are at most
    /// ``JSONText/maximumDepth`` deep.
    package func write(to writer: inout JSONWriter) {
        switch self {
        case .null: writer.raw("null")
        case .bool(let value): writer.bool(value)
        case .number(let number): writer.raw(number.text.utf8)
        case .string(let value): writer.string(value)
        case .array(let items):
            writer.raw("[")
            for (offset, item) in items.enumerated() {
                if offset > 0 { writer.raw(",") }
                item.write(to: &writer)
            }
            writer.raw("]")
        case .object(let members):
            writer.raw("{")
            for (offset, key) in members.keys.sorted().enumerated() {
                if offset > 0 { writer.raw(",") }
                writer.string(key)
                writer.raw(":")
                (members[key] ?? .null).write(to: &writer)
            }
            writer.raw("}")
        }
    }

    /// The compact JSON text as UTF-8 bytes (object members sorted by name, so equal values
    /// serialize identically).
    package var jsonBytes: [UInt8] {
        var writer = JSONWriter()
        write(to: &writer)
        return writer.bytes
    }

    /// The compact JSON text (object members sorted by name).
    public var jsonText: String { String(decoding: jsonBytes, as: UTF8.self) }
}

extension JSONValue: CustomStringConvertible {
    /// The compact JSON text.
    public var description: String { jsonText }
}

extension JSONValue: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByFloatLiteral,
    ExpressibleByBooleanLiteral, ExpressibleByArrayLiteral, ExpressibleByDictionaryLiteral, ExpressibleByNilLiteral
{
    /// A string literal.
    public init(stringLiteral value: String) { self = .string(value) }
    /// An integer literal.
    public init(integerLiteral value: Int) { self = .number(Number(value)) }
    /// A floating-point literal (a non-finite value becomes `null`).
    public init(floatLiteral value: Double) { self = Number(value).map(JSONValue.number) ?? .null }
    /// A boolean literal.
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    /// An array literal.
    public init(arrayLiteral elements: JSONValue...) { self = .array(elements) }
    /// A dictionary literal (a repeated key keeps its last value).
    public init(dictionaryLiteral elements: (String, JSONValue)...) {
        self = .object(Dictionary(elements, uniquingKeysWith: { _, last in last }))
    }
    /// `nil` is `null`.
    public init(nilLiteral: ()) { self = .null }
}

/// The number syntax shared by JSON and filter expressions:
/// `-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?`, where JSON additionally forbids leading zeros.
enum NumberSyntax {
    /// Whether `bytes` is exactly one number.
    static func scan(_ bytes: [UInt8], allowLeadingZeros: Bool) -> Bool {
        var index = 0
        func digit(_ i: Int) -> Bool { i < bytes.count && bytes[i] >= 0x30 && bytes[i] <= 0x39 }
        if index < bytes.count, bytes[index] == UInt8(ascii: "-") { index += 1 }
        guard digit(index) else { return false }
        if !allowLeadingZeros, bytes[index] == UInt8(ascii: "0") {
            index += 1
        } else {
            while digit(index) { index += 1 }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            index += 1
            guard digit(index) else { return false }
            while digit(index) { index += 1 }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") { index += 1 }
            guard digit(index) else { return false }
            while digit(index) { index += 1 }
        }
        return index == bytes.count
    }

    /// The exact `Int64` a number literal (already known to be well-formed) denotes, or `nil` when
    /// it is not an integer or does not fit. Works on the decimal digits, so `1.0000000000000000001`
    /// is correctly not an integer even though its nearest `Double` is `1.0`. Linear in the length.
    static func exactInteger(_ utf8: some Collection<UInt8>) -> Int64? {
        var negative = false
        var digits: [UInt8] = []  // mantissa digits, integer part then fraction
        var fractionCount = 0
        var exponent = 0
        var exponentNegative = false
        var part = 0  // 0 integer, 1 fraction, 2 exponent
        for byte in utf8 {
            switch byte {
            case UInt8(ascii: "-"):
                if part == 2 { exponentNegative = true } else { negative = true }
            case UInt8(ascii: "+"):
                break
            case UInt8(ascii: "."):
                part = 1
            case UInt8(ascii: "e"), UInt8(ascii: "E"):
                part = 2
            default:
                let value = Int(byte &- 0x30)
                if part == 2 {
                    exponent = min(exponent * 10 + value, 1_000_000)  // clamped: far beyond any Int64
                } else {
                    digits.append(UInt8(value))
                    if part == 1 { fractionCount += 1 }
                }
            }
        }
        var scale = (exponentNegative ? -exponent : exponent) - fractionCount
        var first = 0
        while first < digits.count, digits[first] == 0 { first += 1 }
        var last = digits.count
        while last > first, digits[last - 1] == 0 {
            last -= 1
            scale += 1
        }
        if first == last { return 0 }
        guard scale >= 0, last - first + scale <= 19 else { return nil }
        // Accumulate as a negative number so Int64.min is reachable.
        var value: Int64 = 0
        for index in first..<(last + scale) {
            let digit = index < last ? Int64(digits[index]) : 0
            let (shifted, overflow1) = value.multipliedReportingOverflow(by: 10)
            let (next, overflow2) = shifted.subtractingReportingOverflow(digit)
            if overflow1 || overflow2 { return nil }
            value = next
        }
        if negative { return value }
        return value == .min ? nil : -value
    }
}

/// Builds ``JSONValue``s with exactly ``JSONText``'s grammar, error offsets and reasons.
private struct JSONValueParser {
    let bytes: [UInt8]
    var index = 0

    init(bytes: [UInt8]) { self.bytes = bytes }

    mutating func parseDocument() throws(JSONText.Invalid) -> JSONValue {
        skipWhitespace()
        let value = try value(depth: 0)
        skipWhitespace()
        guard index == bytes.count else { throw fail("trailing characters") }
        return value
    }

    func fail(_ reason: String) -> JSONText.Invalid { JSONText.Invalid(offset: index, reason: reason) }

    mutating func skipWhitespace() {
        while index < bytes.count, bytes[index] == 0x20 || bytes[index] == 0x0A || bytes[index] == 0x0D || bytes[index] == 0x09 {
            index += 1
        }
    }

    mutating func value(depth: Int) throws(JSONText.Invalid) -> JSONValue {
        guard index < bytes.count else { throw fail("unexpected end of input") }
        switch bytes[index] {
        case UInt8(ascii: "{"): return try object(depth: depth + 1)
        case UInt8(ascii: "["): return try array(depth: depth + 1)
        case UInt8(ascii: "\""): return .string(try string())
        case UInt8(ascii: "t"):
            try literal("true")
            return .bool(true)
        case UInt8(ascii: "f"):
            try literal("false")
            return .bool(false)
        case UInt8(ascii: "n"):
            try literal("null")
            return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            return .number(try number())
        default:
            throw fail("unexpected character")
        }
    }

    mutating func literal(_ word: StaticString) throws(JSONText.Invalid) {
        let count = word.utf8CodeUnitCount
        guard index + count <= bytes.count else { throw fail("unexpected end of input") }
        let expected = UnsafeBufferPointer(start: word.utf8Start, count: count)
        for offset in 0..<count where bytes[index + offset] != expected[offset] {
            throw fail("invalid literal")
        }
        index += count
    }

    mutating func object(depth: Int) throws(JSONText.Invalid) -> JSONValue {
        guard depth <= JSONText.maximumDepth else { throw fail("nesting deeper than \(JSONText.maximumDepth)") }
        index += 1
        var members: [String: JSONValue] = [:]
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
            index += 1
            return .object(members)
        }
        while true {
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw fail("expected a string key") }
            let key = try string()
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw fail("expected ':'") }
            index += 1
            skipWhitespace()
            members[key] = try value(depth: depth)
            skipWhitespace()
            guard index < bytes.count else { throw fail("unexpected end of input") }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
            } else if bytes[index] == UInt8(ascii: "}") {
                index += 1
                return .object(members)
            } else {
                throw fail("expected ',' or '}'")
            }
        }
    }

    mutating func array(depth: Int) throws(JSONText.Invalid) -> JSONValue {
        guard depth <= JSONText.maximumDepth else { throw fail("nesting deeper than \(JSONText.maximumDepth)") }
        index += 1
        var items: [JSONValue] = []
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
            index += 1
            return .array(items)
        }
        while true {
            skipWhitespace()
            items.append(try value(depth: depth))
            skipWhitespace()
            guard index < bytes.count else { throw fail("unexpected end of input") }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
            } else if bytes[index] == UInt8(ascii: "]") {
                index += 1
                return .array(items)
            } else {
                throw fail("expected ',' or ']'")
            }
        }
    }

    mutating func string() throws(JSONText.Invalid) -> String {
        index += 1  // opening quote
        let start = index
        var decoded: [UInt8] = []  // used only once an escape appears
        var escaped = false
        while index < bytes.count {
            let byte = bytes[index]
            switch byte {
            case UInt8(ascii: "\""):
                let text = escaped ? String(decoding: decoded, as: UTF8.self) : String(decoding: bytes[start..<index], as: UTF8.self)
                index += 1
                return text
            case UInt8(ascii: "\\"):
                if !escaped {
                    escaped = true
                    decoded.append(contentsOf: bytes[start..<index])
                }
                index += 1
                guard index < bytes.count else { throw fail("unexpected end of input") }
                switch bytes[index] {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"):
                    decoded.append(bytes[index])
                    index += 1
                case UInt8(ascii: "b"):
                    decoded.append(0x08)
                    index += 1
                case UInt8(ascii: "f"):
                    decoded.append(0x0C)
                    index += 1
                case UInt8(ascii: "n"):
                    decoded.append(0x0A)
                    index += 1
                case UInt8(ascii: "r"):
                    decoded.append(0x0D)
                    index += 1
                case UInt8(ascii: "t"):
                    decoded.append(0x09)
                    index += 1
                case UInt8(ascii: "u"):
                    guard index + 4 < bytes.count, let unit = hex4(at: index + 1) else {
                        // Same checks and order as JSONText.
                        guard index + 4 < bytes.count else { throw fail("unexpected end of input") }
                        throw fail("invalid \\u escape")
                    }
                    index += 5
                    appendScalar(for: unit, into: &decoded)
                default:
                    throw fail("invalid escape")
                }
            case 0x00..<0x20:
                throw fail("control character in string")
            default:
                if escaped { decoded.append(byte) }
                index += 1
            }
        }
        throw fail("unterminated string")
    }

    /// Decodes a `\u` code unit (the index is just past it), pairing a high surrogate with an
    /// immediately following `\u` low surrogate; an unpaired surrogate becomes U+FFFD.
    mutating func appendScalar(for unit: UInt32, into decoded: inout [UInt8]) {
        var scalarValue = unit
        if (0xD800...0xDBFF).contains(unit) {
            if index + 5 < bytes.count, bytes[index] == UInt8(ascii: "\\"), bytes[index + 1] == UInt8(ascii: "u"),
                let low = hex4(at: index + 2), (0xDC00...0xDFFF).contains(low)
            {
                scalarValue = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
                index += 6
            } else {
                scalarValue = 0xFFFD
            }
        } else if (0xDC00...0xDFFF).contains(unit) {
            scalarValue = 0xFFFD
        }
        let scalar = Unicode.Scalar(scalarValue) ?? "\u{FFFD}"
        decoded.append(contentsOf: String(scalar).utf8)
    }

    func hex4(at start: Int) -> UInt32? {
        guard start + 4 <= bytes.count else { return nil }
        var value: UInt32 = 0
        for byte in bytes[start..<(start + 4)] {
            let digit: UInt32
            switch byte {
            case 0x30...0x39: digit = UInt32(byte - 0x30)
            case 0x41...0x46: digit = UInt32(byte - 0x41 + 10)
            case 0x61...0x66: digit = UInt32(byte - 0x61 + 10)
            default: return nil
            }
            value = value << 4 | digit
        }
        return value
    }

    mutating func number() throws(JSONText.Invalid) -> JSONValue.Number {
        let start = index
        func isDigit(_ b: UInt8) -> Bool { b >= 0x30 && b <= 0x39 }
        if bytes[index] == UInt8(ascii: "-") { index += 1 }
        guard index < bytes.count, isDigit(bytes[index]) else { throw fail("invalid number") }
        if bytes[index] == UInt8(ascii: "0") {
            index += 1
        } else {
            while index < bytes.count, isDigit(bytes[index]) { index += 1 }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            index += 1
            guard index < bytes.count, isDigit(bytes[index]) else { throw fail("invalid number") }
            while index < bytes.count, isDigit(bytes[index]) { index += 1 }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") { index += 1 }
            guard index < bytes.count, isDigit(bytes[index]) else { throw fail("invalid number") }
            while index < bytes.count, isDigit(bytes[index]) { index += 1 }
        }
        return JSONValue.Number(uncheckedText: String(decoding: bytes[start..<index], as: UTF8.self))
    }
}
