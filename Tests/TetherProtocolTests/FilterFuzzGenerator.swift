import TetherProtocol

/// Produces random filter expressions that are valid by construction, random messages to
/// evaluate them against, and mutations that are usually invalid.
struct FilterFuzzGenerator {
    var random: SplitMix64

    /// Keys used in both the generated expressions and the generated messages, so that fields
    /// are often present.
    static let keys = ["a", "b", "n", "s", "x", "uuid", "tags", "name", "flag", "count", "user", "weird key", "é"]
    static let legacyNames = ["uuid", "count", "name", "tags", "x", "flag", "n"]

    // MARK: - Valid expressions

    /// A valid expression: at most `nesting` levels of parentheses / `!` / `~`.
    mutating func expression(nesting: Int = 24) -> String {
        condition(height: random.int(0...5), nesting: nesting)
    }

    mutating func space() -> String {
        switch random.int(0...9) {
        case 0...5: " "
        case 6...7: ""
        case 8: "  "
        default: random.pick(["\t", "\n", "\u{00A0}"])
        }
    }

    mutating func condition(height: Int, nesting: Int) -> String {
        let choice = height <= 0 ? 0 : random.int(0...5)
        switch choice {
        case 1 where nesting > 0:
            return "!" + space() + condition(height: height - 1, nesting: nesting - 1)
        case 2 where nesting > 0:
            return "(" + space() + condition(height: height - 1, nesting: nesting - 1) + space() + ")"
        case 3:
            return condition(height: height - 1, nesting: nesting) + space() + "&&" + space() + condition(height: height - 1, nesting: nesting)
        case 4:
            return condition(height: height - 1, nesting: nesting) + space() + "||" + space() + condition(height: height - 1, nesting: nesting)
        default:
            return comparison(height: height, nesting: nesting)
        }
    }

    mutating func comparison(height: Int, nesting: Int) -> String {
        let left = value(height: min(height, 3), nesting: nesting)
        let right = value(height: min(height, 2), nesting: nesting)
        let symbolic = ["==", "!=", "<", ">", "<=", ">="]
        let keyword = ["LIKE", "like", "Like", "CONTAINS", "contains", "cOnTaInS"]
        if random.chance(35) {
            return left + " " + random.pick(keyword) + " " + right
        }
        return left + space() + random.pick(symbolic) + space() + right
    }

    mutating func value(height: Int, nesting: Int) -> String {
        let choice = height <= 0 ? 0 : random.int(0...6)
        switch choice {
        case 1 where nesting > 0:
            return "(" + space() + value(height: height - 1, nesting: nesting - 1) + space() + ")"
        case 2 where nesting > 0:
            return "~" + value(height: height - 1, nesting: nesting - 1)
        case 3 where nesting > 0:
            let count = random.int(2...5)
            var elements: [String] = []
            for _ in 0..<count { elements.append(value(height: height - 1, nesting: nesting - 1)) }
            return "(" + elements.joined(separator: "," + space()) + ")"
        case 4, 5:
            let op = random.pick(["+", "-", "*", "/", "%", "&", "|", "^"])
            return value(height: height - 1, nesting: nesting) + space() + op + space() + value(height: height - 1, nesting: nesting)
        default:
            return atom()
        }
    }

    mutating func atom() -> String {
        switch random.int(0...9) {
        case 0...3: return variable()
        case 4...6: return stringLiteral()
        default: return numberLiteral()
        }
    }

    mutating func variable() -> String {
        switch random.int(0...9) {
        case 0: return random.pick(Self.legacyNames)
        case 1: return "meta[" + quoted(random.pick(Self.keys)) + "]"
        case 2: return "data." + random.pick(["s", "n", "tags", "x"])
        case 3: return "meta.user." + random.pick(["role", "age", "missing"])
        case 4: return "data.user[\"role\"]"
        default:
            let key = random.pick(Self.keys)
            return key.contains(" ") ? "meta['\(key)']" : "meta." + key
        }
    }

    mutating func numberLiteral() -> String {
        switch random.int(0...9) {
        case 0: return "-" + String(random.int(0...1000))
        case 1: return String(random.int(0...99)) + "." + String(random.int(0...99))
        case 2: return String(random.int(1...9)) + random.pick(["e", "E"]) + random.pick(["", "+", "-"]) + String(random.int(0...30))
        case 3: return random.pick(["9223372036854775807", "-9223372036854775808", "18446744073709551616", "0.1", "007", "-0"])
        default: return String(random.int(0...20))
        }
    }

    mutating func stringLiteral() -> String {
        let fragments = ["a", "B", "*", "\\*", "an*", "news", "5", "-2.5", " ", "é", "e\\u0301", "\\n", "\\'", "\\\"", "\\\\", "😀", "alice", "7", "true", "Zü"]
        var body = ""
        for _ in 0..<random.int(0...4) { body += random.pick(fragments) }
        return random.chance(50) ? "'" + body + "'" : "\"" + body + "\""
    }

    func quoted(_ text: String) -> String {
        "'" + text.replacingOccurrences("\\", with: "\\\\").replacingOccurrences("'", with: "\\'") + "'"
    }

    // MARK: - Messages

    /// A random `meta` or payload: usually an object with some of ``keys``; sometimes large.
    mutating func message() -> JSONValue? {
        switch random.int(0...19) {
        case 0: return nil
        case 1: return .string("not an object")
        default:
            var members: [String: JSONValue] = [:]
            for key in Self.keys where random.chance(60) { members[key] = jsonValue(depth: 2) }
            if random.chance(5) {
                members["s"] = .string(String(repeating: random.pick(["a", "ab", "é"]), count: random.int(100...3000)))
            }
            if random.chance(5) {
                members["tags"] = .array((0..<random.int(50...400)).map { .string("t\($0)") })
            }
            return .object(members)
        }
    }

    mutating func jsonValue(depth: Int) -> JSONValue {
        switch random.int(0...(depth > 0 ? 11 : 8)) {
        case 0: return .null
        case 1: return .bool(random.chance(50))
        case 2: return .number(JSONValue.Number(Int64(random.int(-1000...1000))))
        case 3: return .number(JSONValue.Number(Double(random.int(-1000...1000)) / 8) ?? JSONValue.Number(0))
        case 4: return .number(JSONValue.Number(text: random.pick(["1e300", "9223372036854775807", "12345678901234567890", "-0"])) ?? JSONValue.Number(0))
        case 5...8:
            return .string(random.pick(["alice", "Anne", "news", "5", "007", "-2.5", "true", "a*b", "hello world", "", "Zürich", "e\u{301}"]))
        case 9, 10:
            return .array((0..<random.int(0...5)).map { _ in jsonValue(depth: depth - 1) })
        default:
            var members: [String: JSONValue] = [:]
            for key in ["role", "age", "x"] where random.chance(50) { members[key] = jsonValue(depth: depth - 1) }
            return .object(members)
        }
    }

    // MARK: - Mutations

    static let fragments = [
        "(", ")", "'", "\"", "\\", "==", "=", "===", "=>", "!", "!=", "&&", "||", "&", "|", "^", "~", "-", "+",
        "*", "/", "%", "<", ">", "<=", "<>", " LIKE ", " contains ", ",", ".", "[", "]", "meta", "meta.", "data[",
        "1e", "1.", "0x1F", "\\u", "\\uD800", "\u{301}", "é", "😀", "\u{0}", "\n", " ", "like", "()", "(1,", "'a",
    ]
    static let singleCharacters = fragments.filter { $0.count == 1 }.map { Character($0) }

    /// `text` with 1–3 random edits: byte flips, inserted operators / quotes / parentheses,
    /// deletions, truncation, duplication, deep nesting, huge lists and long strings.
    mutating func mutate(_ text: String) -> String {
        var characters = Array(text)
        for _ in 0..<random.int(1...3) {
            let position = characters.isEmpty ? 0 : random.int(0...characters.count)
            switch random.int(0...10) {
            case 0 where !characters.isEmpty:
                characters[min(position, characters.count - 1)] = random.pick(Self.singleCharacters)
            case 1, 2:
                characters.insert(contentsOf: random.pick(Self.fragments), at: position)
            case 3 where !characters.isEmpty:
                let end = min(characters.count, position + random.int(1...8))
                characters.removeSubrange(min(position, end)..<end)
            case 4:
                characters.removeSubrange(position..<characters.count)
            case 5 where !characters.isEmpty:
                let start = random.int(0...(characters.count - 1))
                let end = min(characters.count, start + random.int(1...20))
                characters.insert(contentsOf: Array(characters[start..<end]), at: position)
            case 6:
                let opener = random.pick(["(", "!", "~", "!(", "~("])
                let count = random.int(1...48)
                characters.insert(contentsOf: String(repeating: opener, count: count), at: position)
                if random.chance(50) { characters.append(contentsOf: String(repeating: ")", count: count)) }
            case 7:
                let element = random.pick(["1", "'a'", "meta.a", "-2.5", "meta.tags"])
                let count = random.int(1...(random.chance(10) ? 1_500 : 200))
                characters.insert(contentsOf: "(" + String(repeating: element + ",", count: count) + element + ")", at: position)
            case 8:
                let count = random.int(10...(random.chance(10) ? 5_000 : 500))
                let body = String(repeating: random.pick(["a", "*", "a*", "\\*", "é"]), count: count)
                characters.insert(contentsOf: "'" + body + "'", at: position)
            case 9 where characters.count > 1:
                let other = random.int(0...(characters.count - 1))
                characters.swapAt(min(position, characters.count - 1), other)
            default:
                characters.insert(Character(Unicode.Scalar(UInt8(random.int(0...127)))), at: position)
            }
        }
        return String(characters)
    }
}

extension String {
    /// `self` with every occurrence of `target` replaced (Foundation-free).
    fileprivate func replacingOccurrences(_ target: String, with replacement: String) -> String {
        split(separator: target, omittingEmptySubsequences: false).joined(separator: replacement)
    }
}
