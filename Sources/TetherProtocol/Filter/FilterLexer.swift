/// A problem found while reading a filter, positioned in Unicode scalars (converted to a
/// character offset for ``FilterExpressionError``).
struct FilterSyntaxError: Error {
    var offset: Int
    var reason: String
}

/// One token of a filter expression. Offsets are in Unicode scalars.
struct FilterToken: Sendable {
    enum Kind: Sendable, Equatable {
        /// A quoted string, escapes decoded.
        case string(String)
        /// An unsigned number literal, leading zeros removed (`-` is a separate token).
        case number(String)
        /// `meta.a`, `data["k"]`, or a legacy bare name.
        case variable(FilterPath)
        case comparison(FilterComparison)
        /// `+ - * / % & ^ |` (the `-` of a negative literal is decided by the parser).
        case arithmetic(FilterArithmetic)
        case and, or, not, bitwiseNot
        case leftParen, rightParen, comma
        case end
    }

    var kind: Kind
    var start: Int
    var end: Int
}

/// Splits a filter into tokens in one left-to-right pass over its Unicode scalars. Working on
/// scalars (not `Character`s) means a combining mark can never merge with a quote or an operator.
struct FilterLexer {
    let scalars: [Unicode.Scalar]
    var index = 0
    /// Steps taken: one per scalar consumed and one per token (see `FilterExpression.parse`).
    var work = 0

    init(scalars: [Unicode.Scalar]) { self.scalars = scalars }

    mutating func tokenize() throws(FilterSyntaxError) -> [FilterToken] {
        var tokens: [FilterToken] = []
        while true {
            skipWhitespace()
            work += 1
            guard index < scalars.count else {
                tokens.append(FilterToken(kind: .end, start: index, end: index))
                return tokens
            }
            let start = index
            let kind = try token()
            tokens.append(FilterToken(kind: kind, start: start, end: index))
        }
    }

    // MARK: - Characters

    func peek(_ offset: Int = 0) -> Unicode.Scalar? {
        let position = index + offset
        return position < scalars.count ? scalars[position] : nil
    }

    static func isDigit(_ scalar: Unicode.Scalar) -> Bool { scalar.value >= 0x30 && scalar.value <= 0x39 }

    static func isIdentifierStart(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x41...0x5A, 0x61...0x7A, 0x5F, 0x24: return true  // A-Z a-z _ $
        case 0..<0x80: return false
        default: return scalar.properties.isAlphabetic
        }
    }

    /// Characters allowed after the first of a name, and in every position of a `.segment`.
    static func isIdentifierContinue(_ scalar: Unicode.Scalar) -> Bool {
        if isIdentifierStart(scalar) || isDigit(scalar) { return true }
        guard scalar.value >= 0x80 else { return false }
        switch scalar.properties.generalCategory {
        case .nonspacingMark, .spacingMark, .enclosingMark, .decimalNumber: return true
        default: return false
        }
    }

    static func isWhitespace(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x20, 0x09, 0x0A, 0x0D: return true
        case 0..<0x80: return false
        default: return scalar.properties.isWhitespace
        }
    }

    mutating func skipWhitespace() {
        while index < scalars.count, Self.isWhitespace(scalars[index]) {
            index += 1
            work += 1
        }
    }

    func fail(_ reason: String, at offset: Int? = nil) -> FilterSyntaxError {
        FilterSyntaxError(offset: offset ?? index, reason: reason)
    }

    // MARK: - Tokens

    mutating func token() throws(FilterSyntaxError) -> FilterToken.Kind {
        let scalar = scalars[index]
        let start = index
        switch scalar {
        case "'", "\"":
            return .string(try string())
        case "0"..."9":
            return .number(try number())
        case "(":
            return advance(1, .leftParen)
        case ")":
            return advance(1, .rightParen)
        case ",":
            return advance(1, .comma)
        case "=":
            if peek(1) == "=" {
                if peek(2) == "=" { throw fail("unknown operator '==='; use '=='") }
                return advance(2, .comparison(.equal))
            }
            if peek(1) == ">" { throw fail("unknown operator '=>'; use '>='") }
            if peek(1) == "<" { throw fail("unknown operator '=<'; use '<='") }
            throw fail("unknown operator '='; use '==' to compare")
        case "!":
            if peek(1) == "=" {
                if peek(2) == "=" { throw fail("unknown operator '!=='; use '!='") }
                return advance(2, .comparison(.notEqual))
            }
            return advance(1, .not)
        case "<":
            if peek(1) == "=" { return advance(2, .comparison(.lessOrEqual)) }
            if peek(1) == ">" { throw fail("unknown operator '<>'; use '!='") }
            if peek(1) == "<" { throw fail("unknown operator '<<'") }
            return advance(1, .comparison(.less))
        case ">":
            if peek(1) == "=" { return advance(2, .comparison(.greaterOrEqual)) }
            if peek(1) == ">" { throw fail("unknown operator '>>'") }
            return advance(1, .comparison(.greater))
        case "&":
            return peek(1) == "&" ? advance(2, .and) : advance(1, .arithmetic(.bitwiseAnd))
        case "|":
            return peek(1) == "|" ? advance(2, .or) : advance(1, .arithmetic(.bitwiseOr))
        case "^": return advance(1, .arithmetic(.bitwiseXor))
        case "~": return advance(1, .bitwiseNot)
        case "+": return advance(1, .arithmetic(.add))
        case "-": return advance(1, .arithmetic(.subtract))
        case "*": return advance(1, .arithmetic(.multiply))
        case "/": return advance(1, .arithmetic(.divide))
        case "%": return advance(1, .arithmetic(.remainder))
        default:
            if Self.isIdentifierStart(scalar) { return try word() }
            throw fail("unexpected character '\(scalar.escaped(asASCII: false))'", at: start)
        }
    }

    mutating func advance(_ count: Int, _ kind: FilterToken.Kind) -> FilterToken.Kind {
        index += count
        work += count
        return kind
    }

    /// A quoted string starting at `index`. Escapes: `\\ \' \" \/ \b \f \n \r \t \uXXXX`; any other
    /// `\x` is kept as the two characters `\x`, so a LIKE pattern can say `\*` for a literal `*`.
    mutating func string() throws(FilterSyntaxError) -> String {
        let start = index
        let quote = scalars[index]
        index += 1
        var value = String.UnicodeScalarView()
        while index < scalars.count {
            let scalar = scalars[index]
            work += 1
            if scalar == quote {
                index += 1
                return String(value)
            }
            guard scalar == "\\" else {
                value.append(scalar)
                index += 1
                continue
            }
            guard let escape = peek(1) else { break }
            switch escape {
            case "'", "\"", "\\", "/": value.append(escape)
            case "b": value.append("\u{08}")
            case "f": value.append("\u{0C}")
            case "n": value.append("\n")
            case "r": value.append("\r")
            case "t": value.append("\t")
            case "u":
                value.append(try unicodeEscape())
                continue
            default:
                value.append("\\")
                value.append(escape)
            }
            index += 2
            work += 1
        }
        throw fail("unterminated string", at: start)
    }

    /// `\uXXXX` at `index` (a surrogate pair is two consecutive escapes); advances past it.
    mutating func unicodeEscape() throws(FilterSyntaxError) -> Unicode.Scalar {
        let start = index
        guard let high = hex4(at: index + 2) else { throw fail("invalid \\u escape: expected four hex digits", at: start) }
        index += 6
        work += 6
        if (0xD800...0xDBFF).contains(high) {
            guard peek() == "\\", peek(1) == "u", let low = hex4(at: index + 2), (0xDC00...0xDFFF).contains(low) else {
                throw fail("invalid \\u escape: unpaired surrogate", at: start)
            }
            index += 6
            work += 6
            return Unicode.Scalar(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)) ?? "\u{FFFD}"
        }
        guard let scalar = Unicode.Scalar(high) else { throw fail("invalid \\u escape: unpaired surrogate", at: start) }
        return scalar
    }

    func hex4(at start: Int) -> UInt32? {
        guard start >= 0, start + 4 <= scalars.count else { return nil }
        var value: UInt32 = 0
        for scalar in scalars[start..<(start + 4)] {
            guard let digit = hexDigit(scalar) else { return nil }
            value = value << 4 | digit
        }
        return value
    }

    func hexDigit(_ scalar: Unicode.Scalar) -> UInt32? {
        switch scalar.value {
        case 0x30...0x39: scalar.value - 0x30
        case 0x41...0x46: scalar.value - 0x41 + 10
        case 0x61...0x66: scalar.value - 0x61 + 10
        default: nil
        }
    }

    /// An unsigned number: `[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?`, not directly followed by a name
    /// character or `.`. Returns its text without redundant leading zeros.
    mutating func number() throws(FilterSyntaxError) -> String {
        let start = index
        func skipDigits() {
            while index < scalars.count, Self.isDigit(scalars[index]) {
                index += 1
                work += 1
            }
        }
        skipDigits()
        if peek() == "." {
            index += 1
            guard let next = peek(), Self.isDigit(next) else { throw fail("invalid number: expected a digit after '.'") }
            skipDigits()
        }
        if peek() == "e" || peek() == "E" {
            let signed = peek(1) == "+" || peek(1) == "-"
            if let digit = peek(signed ? 2 : 1), Self.isDigit(digit) {
                index += signed ? 2 : 1
                skipDigits()
            } else {
                throw fail("invalid number: expected a digit in the exponent", at: index + (signed ? 2 : 1))
            }
        }
        if let next = peek(), next == "." || Self.isIdentifierContinue(next) {
            throw fail("invalid number: unexpected '\(next.escaped(asASCII: false))'")
        }
        var text = String(String.UnicodeScalarView(scalars[start..<index]))
        // Drop leading zeros of the integer part ("007" → "7", "00.5" → "0.5").
        let zeros = text.utf8.prefix { $0 == UInt8(ascii: "0") }.count
        let integerDigits = text.utf8.prefix { $0 >= 0x30 && $0 <= 0x39 }.count
        if zeros > 0, integerDigits > 1 {
            text.removeFirst(min(zeros, integerDigits - 1))
        }
        guard (Double(text) ?? .infinity).isFinite else { throw fail("number out of range", at: start) }
        return text
    }

    /// A name: a keyword (`like`, `contains`, any case), a `meta`/`data` path, or a legacy bare
    /// name (a `meta` key), each optionally followed by `.name` and `["name"]` segments.
    mutating func word() throws(FilterSyntaxError) -> FilterToken.Kind {
        let start = index
        while index < scalars.count, Self.isIdentifierContinue(scalars[index]) {
            index += 1
            work += 1
        }
        let name = String(String.UnicodeScalarView(scalars[start..<index]))
        switch name.lowercased() {
        case "like": return .comparison(.like)
        case "contains": return .comparison(.contains)
        default: break
        }
        var path: FilterPath
        if name == "meta" || name == "data" {
            guard peek() == "." || peek() == "[" else {
                throw fail("expected '.' or '[' and a field name after '\(name)'")
            }
            path = FilterPath(root: name == "meta" ? .meta : .data, keys: [])
        } else {
            path = FilterPath(root: .meta, keys: [name])
        }
        while true {
            if peek() == "." {
                index += 1
                work += 1
                let segmentStart = index
                while index < scalars.count, Self.isIdentifierContinue(scalars[index]) {
                    index += 1
                    work += 1
                }
                guard index > segmentStart else { throw fail("expected a field name after '.'") }
                path.keys.append(String(String.UnicodeScalarView(scalars[segmentStart..<index])))
            } else if peek() == "[" {
                index += 1
                work += 1
                skipWhitespace()
                guard peek() == "'" || peek() == "\"" else { throw fail("expected a quoted field name after '['") }
                path.keys.append(try string())
                skipWhitespace()
                guard peek() == "]" else { throw fail("expected ']' after the field name") }
                index += 1
                work += 1
            } else {
                return .variable(path)
            }
        }
    }
}
