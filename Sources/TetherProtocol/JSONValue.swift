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
        var scanner = JSONScanner<JSONTreeBuilder>(bytes: Array(bytes))
        self = try scanner.document()
    }

    /// Parses one JSON value from a string (see the byte-collection variant).
    public init(parsing text: String) throws(JSONText.Invalid) {
        try self.init(parsing: Array(text.utf8))
    }

    /// Parses one JSON value nested at most `maximumDepth` deep (capped at
    /// ``JSONText/maximumAnswerDepth``): the SDK reads servers' answers with that limit.
    package init(parsing bytes: some Collection<UInt8>, maximumDepth: Int) throws(JSONText.Invalid) {
        var scanner = JSONScanner<JSONTreeBuilder>(bytes: Array(bytes), depthLimit: maximumDepth)
        self = try scanner.document()
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
    /// How deeply arrays and objects nest in this value (0 for a scalar, 1 for `[]` or `{}`).
    package var nestingDepth: Int {
        switch self {
        case .array(let items): 1 + (items.lazy.map(\.nestingDepth).max() ?? 0)
        case .object(let members): 1 + (members.values.lazy.map(\.nestingDepth).max() ?? 0)
        default: 0
        }
    }

    /// Whether this is `null`.
    public var isNull: Bool { if case .null = self { true } else { false } }

    /// Appends the compact JSON text of this value (object members sorted by name) to `writer`.
    ///
    /// Recursion follows the value's nesting; values produced by the parser are at most
    /// ``JSONText/maximumAnswerDepth`` deep.
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
