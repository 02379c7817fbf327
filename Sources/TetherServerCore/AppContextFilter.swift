package import TetherProtocol

/// PubNub's App Context filter language (the `filter` query parameter of the objects v2 list
/// endpoints, docs/compatibility.md, "App Context"): relational tests on a record's fields joined
/// with `&&`, `||`, `!` and parentheses.
///
/// ```
/// expression := and ( "||" and )*
/// and        := unary ( "&&" unary )*
/// unary      := "!" unary | "(" expression ")" | field op value
/// op         := "==" | "!=" | "<" | "<=" | ">" | ">=" | "LIKE"
/// field      := name ( "." name )*          e.g. name, custom.role, channel.custom.kind
/// value      := "text" | 'text' | number | true | false | null
/// ```
///
/// `LIKE` matches a string against a pattern where `*` stands for any run of characters (`\*`
/// is a literal star), case-insensitively. A field that is missing is `null`. Ordering
/// operators compare two strings (so ISO-8601 `updated` values compare in time order) or two
/// numbers; any other pairing is false. Pure: parse once, evaluate per record.
package indirect enum AppContextFilter: Sendable, Hashable {
    case and(AppContextFilter, AppContextFilter)
    case or(AppContextFilter, AppContextFilter)
    case not(AppContextFilter)
    case compare(field: [String], op: Operator, value: JSONValue)

    /// A relational operator.
    package enum Operator: String, Sendable, Hashable {
        case equal = "==", notEqual = "!=", less = "<", lessOrEqual = "<=", greater = ">", greaterOrEqual = ">="
        case like = "LIKE"
    }

    /// Why a filter does not parse: the message names the position.
    package struct SyntaxError: Error, Sendable, Hashable, CustomStringConvertible {
        package var message: String
        package var description: String { message }
    }

    /// The longest filter accepted, in bytes.
    package static let maximumLength = 2048
    /// The deepest nesting of parentheses and `!` accepted.
    package static let maximumDepth = 32

    /// Parses `text`; throws ``SyntaxError`` for anything outside the grammar.
    package init(parsing text: String) throws(SyntaxError) {
        guard text.utf8.count <= Self.maximumLength else {
            throw SyntaxError(message: "filter is longer than \(Self.maximumLength) bytes")
        }
        var parser = Parser(Array(text.unicodeScalars))
        let result = try parser.expression(depth: 0)
        parser.skipSpace()
        guard parser.atEnd else { throw SyntaxError(message: "unexpected input at offset \(parser.index)") }
        self = result
    }

    /// Whether the record, read through `field` (a dotted path → its value, `nil` when missing),
    /// matches.
    package func matches(_ field: ([String]) -> JSONValue?) -> Bool {
        switch self {
        case .and(let a, let b): return a.matches(field) && b.matches(field)
        case .or(let a, let b): return a.matches(field) || b.matches(field)
        case .not(let a): return !a.matches(field)
        case .compare(let path, let op, let value): return Self.evaluate(field(path) ?? .null, op, value)
        }
    }

    /// Whether `record` (a JSON object) matches: paths walk nested objects.
    package func matches(_ record: JSONValue) -> Bool {
        matches { path in
            var current: JSONValue? = record
            for name in path { current = current?[name] }
            return current
        }
    }

    /// One relational test.
    package static func evaluate(_ lhs: JSONValue, _ op: Operator, _ rhs: JSONValue) -> Bool {
        switch op {
        case .equal: return equal(lhs, rhs)
        case .notEqual: return !equal(lhs, rhs)
        case .like:
            guard case .string(let text) = lhs, case .string(let pattern) = rhs else { return false }
            return like(Array(text.lowercased().unicodeScalars), Array(pattern.lowercased().unicodeScalars))
        case .less, .lessOrEqual, .greater, .greaterOrEqual:
            let order: Int
            switch (lhs, rhs) {
            case (.string(let a), .string(let b)): order = a == b ? 0 : (a < b ? -1 : 1)
            case (.number(let a), .number(let b)):
                order = a.doubleValue == b.doubleValue ? 0 : (a.doubleValue < b.doubleValue ? -1 : 1)
            default: return false
            }
            switch op {
            case .less: return order < 0
            case .lessOrEqual: return order <= 0
            case .greater: return order > 0
            default: return order >= 0
            }
        }
    }

    static func equal(_ a: JSONValue, _ b: JSONValue) -> Bool {
        switch (a, b) {
        case (.number(let x), .number(let y)): return x.doubleValue == y.doubleValue
        default: return a == b
        }
    }

    /// `*` matches any run; `\*` a literal star. Iterative with one backtrack point, so linear
    /// in practice and never exponential.
    static func like(_ text: [Unicode.Scalar], _ pattern: [Unicode.Scalar]) -> Bool {
        // Tokens: nil = wildcard, scalar = literal.
        var tokens: [Unicode.Scalar?] = []
        var i = 0
        while i < pattern.count {
            if pattern[i] == "\\", i + 1 < pattern.count { tokens.append(pattern[i + 1]); i += 2; continue }
            tokens.append(pattern[i] == "*" ? nil : pattern[i])
            i += 1
        }
        var t = 0, p = 0, starP = -1, starT = 0
        while t < text.count {
            if p < tokens.count, let literal = tokens[p], literal == text[t] {
                t += 1; p += 1
            } else if p < tokens.count, tokens[p] == nil {
                starP = p; starT = t; p += 1
            } else if starP >= 0 {
                p = starP + 1; starT += 1; t = starT
            } else {
                return false
            }
        }
        while p < tokens.count, tokens[p] == nil { p += 1 }
        return p == tokens.count
    }

    private struct Parser {
        let s: [Unicode.Scalar]
        var index = 0
        init(_ s: [Unicode.Scalar]) { self.s = s }

        var atEnd: Bool { index >= s.count }

        mutating func skipSpace() {
            while index < s.count, s[index] == " " || s[index] == "\t" || s[index] == "\n" || s[index] == "\r" { index += 1 }
        }

        mutating func take(_ token: String) -> Bool {
            skipSpace()
            let scalars = Array(token.unicodeScalars)
            guard index + scalars.count <= s.count, Array(s[index..<index + scalars.count]) == scalars else { return false }
            index += scalars.count
            return true
        }

        func error(_ what: String) -> SyntaxError { SyntaxError(message: "\(what) at offset \(index)") }

        mutating func expression(depth: Int) throws(SyntaxError) -> AppContextFilter {
            var result = try conjunction(depth: depth)
            while take("||") { result = .or(result, try conjunction(depth: depth)) }
            return result
        }

        mutating func conjunction(depth: Int) throws(SyntaxError) -> AppContextFilter {
            var result = try unary(depth: depth)
            while take("&&") { result = .and(result, try unary(depth: depth)) }
            return result
        }

        mutating func unary(depth: Int) throws(SyntaxError) -> AppContextFilter {
            guard depth < AppContextFilter.maximumDepth else { throw error("filter nests too deeply") }
            skipSpace()
            if index < s.count, s[index] == "!", !(index + 1 < s.count && s[index + 1] == "=") {
                index += 1
                return .not(try unary(depth: depth + 1))
            }
            if take("(") {
                let inner = try expression(depth: depth + 1)
                guard take(")") else { throw error("expected ')'") }
                return inner
            }
            let field = try fieldPath()
            let op = try relational()
            let value = try literal()
            return .compare(field: field, op: op, value: value)
        }

        static func isNameScalar(_ c: Unicode.Scalar) -> Bool {
            ("a"..."z").contains(c) || ("A"..."Z").contains(c) || ("0"..."9").contains(c) || c == "_" || c == "-"
        }

        mutating func fieldPath() throws(SyntaxError) -> [String] {
            skipSpace()
            var path: [String] = []
            while true {
                let start = index
                while index < s.count, Self.isNameScalar(s[index]) { index += 1 }
                guard index > start else { throw error("expected a field name") }
                path.append(String(String.UnicodeScalarView(s[start..<index])))
                guard index < s.count, s[index] == "." else { break }
                index += 1
            }
            guard path.count <= 4 else { throw error("field path is too long") }
            return path
        }

        mutating func relational() throws(SyntaxError) -> Operator {
            for op in ["==", "!=", "<=", ">=", "<", ">"] where take(op) { return Operator(rawValue: op)! }
            skipSpace()
            if index + 4 <= s.count, String(String.UnicodeScalarView(s[index..<index + 4])).uppercased() == "LIKE" {
                index += 4
                return .like
            }
            throw error("expected an operator (==, !=, <, <=, >, >=, LIKE)")
        }

        mutating func literal() throws(SyntaxError) -> JSONValue {
            skipSpace()
            guard index < s.count else { throw error("expected a value") }
            let c = s[index]
            if c == "\"" || c == "'" {
                index += 1
                var text = String.UnicodeScalarView()
                while index < s.count, s[index] != c {
                    if s[index] == "\\", index + 1 < s.count {
                        // Keep `\*` for LIKE; other escapes stand for the escaped character.
                        if s[index + 1] == "*" { text.append("\\") }
                        index += 1
                    }
                    text.append(s[index])
                    index += 1
                }
                guard index < s.count else { throw error("unterminated string") }
                index += 1
                return .string(String(text))
            }
            let start = index
            while index < s.count, !(s[index] == " " || s[index] == ")" || s[index] == "&" || s[index] == "|" || s[index] == "\t") {
                index += 1
            }
            let word = String(String.UnicodeScalarView(s[start..<index]))
            switch word {
            case "true": return .bool(true)
            case "false": return .bool(false)
            case "null": return .null
            default:
                if let number = JSONValue.Number(text: word) { return .number(number) }
                index = start
                throw error("expected a value (a quoted string, a number, true, false or null)")
            }
        }
    }
}

/// The `sort` parameter of the objects list endpoints: `field[:asc|:desc]`, comma-separated.
package struct AppContextSort: Sendable, Hashable {
    package var field: [String]
    package var descending: Bool

    package init(field: [String], descending: Bool) {
        self.field = field
        self.descending = descending
    }

    /// Parses `text` against the fields a list can sort by; `nil` on an unknown field or direction.
    package static func parse(_ text: String, allowed: Set<String>) -> [AppContextSort]? {
        var result: [AppContextSort] = []
        for part in text.split(separator: ",", omittingEmptySubsequences: false) {
            let pieces = part.split(separator: ":", omittingEmptySubsequences: false).map { $0.trimmingSpaces }
            guard (1...2).contains(pieces.count), allowed.contains(pieces[0]) else { return nil }
            var descending = false
            if pieces.count == 2 {
                switch pieces[1].lowercased() {
                case "asc": descending = false
                case "desc": descending = true
                default: return nil
                }
            }
            result.append(AppContextSort(field: pieces[0].split(separator: ".").map(String.init), descending: descending))
        }
        return result.count <= 8 ? result : nil
    }

    /// Orders two records by the sort keys (nulls last ascending, first descending), then by
    /// `tieBreak`.
    package static func ordered(_ a: JSONValue, _ b: JSONValue, by keys: [AppContextSort], tieBreak: [String]) -> Bool {
        func value(_ r: JSONValue, _ path: [String]) -> JSONValue? {
            var current: JSONValue? = r
            for name in path { current = current?[name] }
            if case .null? = current { return nil }
            return current
        }
        func order(_ x: JSONValue?, _ y: JSONValue?) -> Int {
            switch (x, y) {
            case (nil, nil): return 0
            case (nil, _): return 1
            case (_, nil): return -1
            case (.string(let s)?, .string(let t)?): return s == t ? 0 : (s < t ? -1 : 1)
            case (.number(let s)?, .number(let t)?): return s.doubleValue == t.doubleValue ? 0 : (s.doubleValue < t.doubleValue ? -1 : 1)
            default:
                let s = x.map { String(decoding: $0.jsonBytes, as: UTF8.self) } ?? "", t = y.map { String(decoding: $0.jsonBytes, as: UTF8.self) } ?? ""
                return s == t ? 0 : (s < t ? -1 : 1)
            }
        }
        for key in keys {
            let o = order(value(a, key.field), value(b, key.field))
            if o != 0 { return key.descending ? o > 0 : o < 0 }
        }
        return order(value(a, tieBreak), value(b, tieBreak)) < 0
    }
}

/// The opaque page cursors of the objects list endpoints: PubNub's are unpadded Base64 of the
/// offset (`MQ` is 1, `MTA` is 10), and so are these.
package enum AppContextCursor {
    package static func encode(_ offset: Int) -> String {
        var text = Base64.encode(Array(String(offset).utf8))
        while text.hasSuffix("=") { text.removeLast() }
        return text
    }

    /// The offset a cursor names; `nil` for anything that is not one of ours.
    package static func decode(_ cursor: String) -> Int? {
        guard !cursor.isEmpty, cursor.utf8.count <= 16 else { return nil }
        var padded = cursor
        while padded.utf8.count % 4 != 0 { padded += "=" }
        guard let bytes = Base64.decode(padded), let text = String(validating: bytes, as: UTF8.self),
              let value = Int(text), value >= 0, value <= 1_000_000_000 else { return nil }
        return value
    }
}

/// `updated` as PubNub writes it: ISO-8601 UTC with microseconds, `2024-03-07T08:47:38.835107Z`.
package enum AppContextTimestamp {
    package static func format(_ timetoken: Timetoken) -> String {
        let micros = Int64(timetoken.rawValue / 10)
        let seconds = micros / 1_000_000, fraction = micros % 1_000_000
        let days = seconds / 86_400, secondOfDay = seconds % 86_400
        // Civil from days (Howard Hinnant's algorithm).
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let doe = z - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let day = doy - (153 * mp + 2) / 5 + 1
        let month = mp < 10 ? mp + 3 : mp - 9
        let year = yoe + era * 400 + (month <= 2 ? 1 : 0)
        func pad(_ v: Int64, _ width: Int) -> String {
            let text = String(v)
            return String(repeating: "0", count: max(0, width - text.count)) + text
        }
        return "\(pad(year, 4))-\(pad(month, 2))-\(pad(day, 2))T\(pad(secondOfDay / 3600, 2)):\(pad(secondOfDay % 3600 / 60, 2)):"
            + "\(pad(secondOfDay % 60, 2)).\(pad(fraction, 6))Z"
    }
}

extension Substring {
    fileprivate var trimmingSpaces: String {
        String(drop { $0 == " " }.reversed().drop { $0 == " " }.reversed())
    }
}
