/// What ``JSONScanner`` builds while it reads. One grammar, one set of error offsets and reasons,
/// two outputs: ``JSONKindBuilder`` only checks (no allocation; what the server needs to relay a
/// payload verbatim) and ``JSONTreeBuilder`` builds a ``JSONValue``.
protocol JSONBuilder {
    associatedtype Value
    associatedtype Members
    associatedtype Items
    /// Whether string contents are decoded (escapes resolved) and handed to the builder, or
    /// only checked.
    static var decodesStrings: Bool { get }
    static func emptyMembers() -> Members
    static func emptyItems() -> Items
    static func insert(_ value: Value, forKey key: String, into members: inout Members)
    static func append(_ value: Value, to items: inout Items)
    static func object(_ members: Members) -> Value
    static func array(_ items: Items) -> Value
    /// A string; `text` is empty unless ``decodesStrings``.
    static func string(_ text: String) -> Value
    static func bool(_ value: Bool) -> Value
    static func null() -> Value
    /// A number; `text` is exactly one well-formed JSON number.
    static func number(_ text: ArraySlice<UInt8>) -> Value
}

/// Validation: the kind of the top-level value, nothing else.
enum JSONKindBuilder: JSONBuilder {
    typealias Value = JSONText.Kind
    typealias Members = Void
    typealias Items = Void
    static var decodesStrings: Bool { false }
    static func emptyMembers() {}
    static func emptyItems() {}
    static func insert(_ value: JSONText.Kind, forKey key: String, into members: inout Void) {}
    static func append(_ value: JSONText.Kind, to items: inout Void) {}
    static func object(_ members: Void) -> JSONText.Kind { .object }
    static func array(_ items: Void) -> JSONText.Kind { .array }
    static func string(_ text: String) -> JSONText.Kind { .string }
    static func bool(_ value: Bool) -> JSONText.Kind { .bool }
    static func null() -> JSONText.Kind { .null }
    static func number(_ text: ArraySlice<UInt8>) -> JSONText.Kind { .number }
}

/// Parsing: a ``JSONValue`` tree.
enum JSONTreeBuilder: JSONBuilder {
    typealias Value = JSONValue
    typealias Members = [String: JSONValue]
    typealias Items = [JSONValue]
    static var decodesStrings: Bool { true }
    static func emptyMembers() -> [String: JSONValue] { [:] }
    static func emptyItems() -> [JSONValue] { [] }
    static func insert(_ value: JSONValue, forKey key: String, into members: inout [String: JSONValue]) { members[key] = value }
    static func append(_ value: JSONValue, to items: inout [JSONValue]) { items.append(value) }
    static func object(_ members: [String: JSONValue]) -> JSONValue { .object(members) }
    static func array(_ items: [JSONValue]) -> JSONValue { .array(items) }
    static func string(_ text: String) -> JSONValue { .string(text) }
    static func bool(_ value: Bool) -> JSONValue { .bool(value) }
    static func null() -> JSONValue { .null }
    static func number(_ text: ArraySlice<UInt8>) -> JSONValue {
        .number(JSONValue.Number(uncheckedText: String(decoding: text, as: UTF8.self)))
    }
}

/// The one JSON (RFC 8259) reader of the package, strict and with nesting bounded (by
/// ``JSONText/maximumDepth``, or at most ``JSONText/maximumAnswerDepth`` when asked) so hostile
/// input (`[[[[…`) cannot exhaust the stack.
///
/// Inside strings, bytes that are not valid UTF-8 and `\u` escapes of unpaired surrogates are
/// accepted; when strings are decoded they become U+FFFD.
struct JSONScanner<Builder: JSONBuilder> {
    let bytes: [UInt8]
    var index = 0
    /// The deepest nesting accepted (``JSONText/maximumDepth`` unless a caller asks for another,
    /// never more than ``JSONText/maximumAnswerDepth``).
    let depthLimit: Int

    init(bytes: [UInt8], depthLimit: Int = JSONText.maximumDepth) {
        self.bytes = bytes
        self.depthLimit = min(depthLimit, JSONText.maximumAnswerDepth)
    }

    /// One value surrounded by optional whitespace, and nothing after it.
    mutating func document() throws(JSONText.Invalid) -> Builder.Value {
        skipWhitespace()
        let value = try value(depth: 0)
        skipWhitespace()
        guard index == bytes.count else { throw fail("trailing characters") }
        return value
    }

    private func fail(_ reason: String) -> JSONText.Invalid { JSONText.Invalid(offset: index, reason: reason) }

    private mutating func skipWhitespace() {
        while index < bytes.count, bytes[index] == 0x20 || bytes[index] == 0x0A || bytes[index] == 0x0D || bytes[index] == 0x09 {
            index += 1
        }
    }

    private mutating func value(depth: Int) throws(JSONText.Invalid) -> Builder.Value {
        guard index < bytes.count else { throw fail("unexpected end of input") }
        switch bytes[index] {
        case UInt8(ascii: "{"): return try object(depth: depth + 1)
        case UInt8(ascii: "["): return try array(depth: depth + 1)
        case UInt8(ascii: "\""): return Builder.string(try string())
        case UInt8(ascii: "t"):
            try literal("true")
            return Builder.bool(true)
        case UInt8(ascii: "f"):
            try literal("false")
            return Builder.bool(false)
        case UInt8(ascii: "n"):
            try literal("null")
            return Builder.null()
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            return Builder.number(try number())
        default:
            throw fail("unexpected character")
        }
    }

    private mutating func literal(_ word: StaticString) throws(JSONText.Invalid) {
        let count = word.utf8CodeUnitCount
        guard index + count <= bytes.count else { throw fail("unexpected end of input") }
        let expected = UnsafeBufferPointer(start: word.utf8Start, count: count)
        for offset in 0..<count where bytes[index + offset] != expected[offset] {
            throw fail("invalid literal")
        }
        index += count
    }

    private mutating func object(depth: Int) throws(JSONText.Invalid) -> Builder.Value {
        guard depth <= depthLimit else { throw fail("\(JSONText.Invalid.tooDeep) \(depthLimit)") }
        index += 1
        var members = Builder.emptyMembers()
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
            index += 1
            return Builder.object(members)
        }
        while true {
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw fail("expected a string key") }
            let key = try string()
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw fail("expected ':'") }
            index += 1
            skipWhitespace()
            Builder.insert(try value(depth: depth), forKey: key, into: &members)
            skipWhitespace()
            guard index < bytes.count else { throw fail("unexpected end of input") }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
            } else if bytes[index] == UInt8(ascii: "}") {
                index += 1
                return Builder.object(members)
            } else {
                throw fail("expected ',' or '}'")
            }
        }
    }

    private mutating func array(depth: Int) throws(JSONText.Invalid) -> Builder.Value {
        guard depth <= depthLimit else { throw fail("\(JSONText.Invalid.tooDeep) \(depthLimit)") }
        index += 1
        var items = Builder.emptyItems()
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
            index += 1
            return Builder.array(items)
        }
        while true {
            skipWhitespace()
            Builder.append(try value(depth: depth), to: &items)
            skipWhitespace()
            guard index < bytes.count else { throw fail("unexpected end of input") }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
            } else if bytes[index] == UInt8(ascii: "]") {
                index += 1
                return Builder.array(items)
            } else {
                throw fail("expected ',' or ']'")
            }
        }
    }

    /// Reads a string (the index is at its opening quote); returns its decoded text when the
    /// builder decodes strings, `""` otherwise.
    private mutating func string() throws(JSONText.Invalid) -> String {
        let decodes = Builder.decodesStrings
        index += 1  // opening quote
        let start = index
        var decoded: [UInt8] = []  // used only once an escape appears
        var escaped = false
        while index < bytes.count {
            let byte = bytes[index]
            switch byte {
            case UInt8(ascii: "\""):
                let text = !decodes ? "" : escaped ? String(decoding: decoded, as: UTF8.self) : String(decoding: bytes[start..<index], as: UTF8.self)
                index += 1
                return text
            case UInt8(ascii: "\\"):
                if decodes, !escaped {
                    escaped = true
                    decoded.append(contentsOf: bytes[start..<index])
                }
                index += 1
                guard index < bytes.count else { throw fail("unexpected end of input") }
                let unescaped: UInt8
                switch bytes[index] {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): unescaped = bytes[index]
                case UInt8(ascii: "b"): unescaped = 0x08
                case UInt8(ascii: "f"): unescaped = 0x0C
                case UInt8(ascii: "n"): unescaped = 0x0A
                case UInt8(ascii: "r"): unescaped = 0x0D
                case UInt8(ascii: "t"): unescaped = 0x09
                case UInt8(ascii: "u"):
                    guard index + 4 < bytes.count else { throw fail("unexpected end of input") }
                    guard let unit = hex4(at: index + 1) else { throw fail("invalid \\u escape") }
                    index += 5
                    if decodes { appendScalar(for: unit, into: &decoded) }
                    continue
                default:
                    throw fail("invalid escape")
                }
                if decodes { decoded.append(unescaped) }
                index += 1
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
    private mutating func appendScalar(for unit: UInt32, into decoded: inout [UInt8]) {
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

    private func hex4(at start: Int) -> UInt32? {
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

    /// Reads one number (the index is at its first byte); returns its text.
    private mutating func number() throws(JSONText.Invalid) -> ArraySlice<UInt8> {
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
        return bytes[start..<index]
    }
}
