/// Strict, allocation-free validation of JSON text (RFC 8259), with bounded nesting.
///
/// The server relays message payloads verbatim, so it only needs to know that a payload *is*
/// JSON and what kind of value it is — never to build a tree. Nesting is bounded so hostile
/// input (`[[[[…`) cannot exhaust the stack.
public enum JSONText {
    /// The kind of the top-level JSON value.
    package enum Kind: Sendable, Equatable {
        /// `{…}`
        case object
        /// `[…]`
        case array
        /// `"…"`
        case string
        /// A number.
        case number
        /// `true` or `false`.
        case bool
        /// `null`.
        case null
    }

    /// Why a text is not acceptable JSON.
    public struct Invalid: Error, Equatable, Sendable, CustomStringConvertible {
        /// Byte offset of the problem.
        public var offset: Int
        /// What is wrong.
        public var reason: String
        /// A message for humans.
        public var description: String { "invalid JSON at byte \(offset): \(reason)" }
    }

    /// The deepest nesting of arrays and objects accepted.
    package static let maximumDepth = 64

    /// Validates `bytes` as one JSON value surrounded by optional whitespace.
    /// - Returns: the kind of the top-level value.
    package static func validate(_ bytes: some Collection<UInt8>) throws(Invalid) -> Kind {
        var scanner = Scanner(bytes: Array(bytes))
        scanner.skipWhitespace()
        let kind = try scanner.value(depth: 0)
        scanner.skipWhitespace()
        guard scanner.index == scanner.bytes.count else { throw Invalid(offset: scanner.index, reason: "trailing characters") }
        return kind
    }

    /// Validates a string as JSON text.
    package static func validate(_ text: String) throws(Invalid) -> Kind {
        try validate(Array(text.utf8))
    }

    private struct Scanner {
        let bytes: [UInt8]
        var index = 0

        init(bytes: [UInt8]) { self.bytes = bytes }

        mutating func skipWhitespace() {
            while index < bytes.count, bytes[index] == 0x20 || bytes[index] == 0x0A || bytes[index] == 0x0D || bytes[index] == 0x09 {
                index += 1
            }
        }

        func fail(_ reason: String) -> Invalid { Invalid(offset: index, reason: reason) }

        mutating func value(depth: Int) throws(Invalid) -> Kind {
            guard index < bytes.count else { throw fail("unexpected end of input") }
            switch bytes[index] {
            case UInt8(ascii: "{"):
                try object(depth: depth + 1)
                return .object
            case UInt8(ascii: "["):
                try array(depth: depth + 1)
                return .array
            case UInt8(ascii: "\""):
                try string()
                return .string
            case UInt8(ascii: "t"):
                try literal("true")
                return .bool
            case UInt8(ascii: "f"):
                try literal("false")
                return .bool
            case UInt8(ascii: "n"):
                try literal("null")
                return .null
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
                try number()
                return .number
            default:
                throw fail("unexpected character")
            }
        }

        mutating func literal(_ word: StaticString) throws(Invalid) {
            let count = word.utf8CodeUnitCount
            guard index + count <= bytes.count else { throw fail("unexpected end of input") }
            let expected = UnsafeBufferPointer(start: word.utf8Start, count: count)
            for offset in 0..<count where bytes[index + offset] != expected[offset] {
                throw fail("invalid literal")
            }
            index += count
        }

        mutating func object(depth: Int) throws(Invalid) {
            guard depth <= JSONText.maximumDepth else { throw fail("nesting deeper than \(JSONText.maximumDepth)") }
            index += 1
            skipWhitespace()
            if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
                index += 1
                return
            }
            while true {
                skipWhitespace()
                guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw fail("expected a string key") }
                try string()
                skipWhitespace()
                guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw fail("expected ':'") }
                index += 1
                skipWhitespace()
                _ = try value(depth: depth)
                skipWhitespace()
                guard index < bytes.count else { throw fail("unexpected end of input") }
                if bytes[index] == UInt8(ascii: ",") {
                    index += 1
                } else if bytes[index] == UInt8(ascii: "}") {
                    index += 1
                    return
                } else {
                    throw fail("expected ',' or '}'")
                }
            }
        }

        mutating func array(depth: Int) throws(Invalid) {
            guard depth <= JSONText.maximumDepth else { throw fail("nesting deeper than \(JSONText.maximumDepth)") }
            index += 1
            skipWhitespace()
            if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
                index += 1
                return
            }
            while true {
                skipWhitespace()
                _ = try value(depth: depth)
                skipWhitespace()
                guard index < bytes.count else { throw fail("unexpected end of input") }
                if bytes[index] == UInt8(ascii: ",") {
                    index += 1
                } else if bytes[index] == UInt8(ascii: "]") {
                    index += 1
                    return
                } else {
                    throw fail("expected ',' or ']'")
                }
            }
        }

        mutating func string() throws(Invalid) {
            index += 1  // opening quote
            while index < bytes.count {
                let byte = bytes[index]
                switch byte {
                case UInt8(ascii: "\""):
                    index += 1
                    return
                case UInt8(ascii: "\\"):
                    index += 1
                    guard index < bytes.count else { throw fail("unexpected end of input") }
                    switch bytes[index] {
                    case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"), UInt8(ascii: "f"),
                        UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                        index += 1
                    case UInt8(ascii: "u"):
                        guard index + 4 < bytes.count else { throw fail("unexpected end of input") }
                        for offset in 1...4 where !isHex(bytes[index + offset]) { throw fail("invalid \\u escape") }
                        index += 5
                    default:
                        throw fail("invalid escape")
                    }
                case 0x00..<0x20:
                    throw fail("control character in string")
                default:
                    index += 1
                }
            }
            throw fail("unterminated string")
        }

        mutating func number() throws(Invalid) {
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
        }

        func isDigit(_ b: UInt8) -> Bool { b >= 0x30 && b <= 0x39 }
        func isHex(_ b: UInt8) -> Bool { isDigit(b) || (b >= 0x41 && b <= 0x46) || (b >= 0x61 && b <= 0x66) }
    }
}

/// Appends JSON tokens to a byte buffer. Used to build responses without an intermediate tree.
package struct JSONWriter: Sendable {
    /// The bytes written so far.
    package private(set) var bytes: [UInt8] = []

    /// Creates an empty writer, optionally reserving capacity.
    package init(capacity: Int = 256) { bytes.reserveCapacity(capacity) }

    /// Appends raw bytes that are already valid JSON (or punctuation).
    package mutating func raw(_ text: StaticString) {
        bytes.append(contentsOf: UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
    }

    /// Appends raw bytes that are already valid JSON.
    package mutating func raw(_ other: some Sequence<UInt8>) { bytes.append(contentsOf: other) }

    /// Appends a JSON string literal with the required escapes.
    package mutating func string(_ value: String) {
        bytes.append(UInt8(ascii: "\""))
        for byte in value.utf8 {
            switch byte {
            case UInt8(ascii: "\""): raw("\\\"")
            case UInt8(ascii: "\\"): raw("\\\\")
            case 0x0A: raw("\\n")
            case 0x0D: raw("\\r")
            case 0x09: raw("\\t")
            case 0x00..<0x20:
                let hex = Array("0123456789abcdef".utf8)
                raw("\\u00")
                bytes.append(hex[Int(byte >> 4)])
                bytes.append(hex[Int(byte & 0x0F)])
            default: bytes.append(byte)
            }
        }
        bytes.append(UInt8(ascii: "\""))
    }

    /// Appends an integer.
    package mutating func number(_ value: some BinaryInteger) { bytes.append(contentsOf: String(value).utf8) }

    /// Appends a timetoken as a JSON string (`"17953281264739664"`).
    package mutating func timetokenString(_ value: Timetoken) {
        bytes.append(UInt8(ascii: "\""))
        bytes.append(contentsOf: String(value.rawValue).utf8)
        bytes.append(UInt8(ascii: "\""))
    }

    /// Appends `true` or `false`.
    package mutating func bool(_ value: Bool) { value ? raw("true") : raw("false") }

    /// Appends a list of strings as a JSON array.
    package mutating func stringArray(_ values: some Sequence<String>) {
        raw("[")
        var first = true
        for value in values {
            if !first { raw(",") }
            first = false
            string(value)
        }
        raw("]")
    }
}
