import Foundation
import Testing
@_spi(Benchmarks) @testable import TetherProtocol

/// The message every match case is evaluated against unless it says otherwise.
private let sampleMeta: JSONValue = [
    "uuid": "alice", "count": 5, "countText": "5", "price": 9.5, "name": "Anne", "letter": "b",
    "tags": ["news", "sports", 7], "names": ["Anne", "anna", "Bob"], "flag": true, "id": 120,
    "a": 6, "b": 3, "zero": 0, "nothing": nil, "mask": 12, "level": "10", "code": "007", "neg": -4,
    "user": ["role": "admin", "profile": ["age": 30]], "star": "match*", "text": "hello world",
    "phone": 5_551_234, "big": 9_007_199_254_740_993, "weird key": "w",
    "quote": "it's", "nl": "a\nb", "uni": "é", "pair": [1, 2], "city": "Zürich",
]
private let sampleData: JSONValue = [
    "text": "Hello PubNub", "score": 85, "type": "chat", "user": ["name": "Zoe", "tags": ["x", "y"]],
]

struct FilterMatchCase: Sendable, CustomTestStringConvertible {
    var expression: String
    var expected: Bool
    var meta: JSONValue? = sampleMeta
    var data: JSONValue? = sampleData

    init(_ expression: String, _ expected: Bool, meta: JSONValue? = sampleMeta, data: JSONValue? = sampleData) {
        self.expression = expression
        self.expected = expected
        self.meta = meta
        self.data = data
    }

    var testDescription: String { "\(expression) → \(expected)" }
}

private let matchCases: [FilterMatchCase] = [
    // == and != on strings, numbers, numeric strings, booleans, null, objects
    .init("meta.uuid == 'alice'", true),
    .init("meta.uuid == \"alice\"", true),
    .init("meta.uuid == 'Alice'", false),
    .init("meta.count == 5", true),
    .init("meta.count == 5.0", true),
    .init("meta.count == 5e0", true),
    .init("meta.countText == 5", true),
    .init("meta.countText == '5'", true),
    .init("meta.count == '5'", true),
    .init("meta.count == '5.0'", true),
    .init("meta.code == 7", true),
    .init("meta.code == '7'", false),
    .init("meta.price == 9.50", true),
    .init("meta.neg == -4", true),
    .init("meta.big == 9007199254740992", false),
    .init("meta.uuid != 'bob'", true),
    .init("meta.uuid != 'alice'", false),
    .init("meta.uuid != 5", true),
    .init("meta.missing == 'x'", false),
    .init("meta.missing != 'x'", false),
    .init("!(meta.missing == 'x')", true),
    .init("meta.nothing == 'null'", false),
    .init("meta.nothing != 'x'", false),
    .init("meta.flag == 'true'", true),
    .init("meta.flag == 1", false),
    .init("meta.user == 'admin'", false),
    .init("meta.user != 'admin'", false),
    .init("meta.pair == (1, 2)", true),
    .init("meta.pair == (1, 3)", false),
    .init("meta.pair != 1", true),
    // legacy bare names are meta keys
    .init("uuid != 'bob'", true),
    .init("uuid == 'alice'", true),
    .init("count > 4", true),
    .init("user.role == 'admin'", true),
    .init("uuid != 'me'", false, meta: ["other": 1]),
    // ordering
    .init("meta.count > 4", true),
    .init("meta.count >= 5", true),
    .init("meta.count < 5", false),
    .init("meta.count <= 5", true),
    .init("meta.price > 9.25", true),
    .init("meta.level > 9", true),
    .init("meta.level > '9'", true),
    .init("meta.uuid > 'a'", false),
    .init("meta.uuid < 'z'", false),
    .init("meta.missing < 1", false),
    .init("meta.neg < -3", true),
    .init("meta.big > 9007199254740992", true),
    .init("meta.flag > 0", false),
    // arithmetic and bitwise operators, precedence, associativity
    .init("meta.a + meta.b == 9", true),
    .init("meta.a - meta.b == 3", true),
    .init("meta.a * meta.b == 18", true),
    .init("meta.a / meta.b == 2", true),
    .init("7 / 2 == 3.5", true),
    .init("meta.id % 10 == 0", true),
    .init("meta.id % 7 == 1", true),
    .init("-7 % 3 == -1", true),
    .init("7.5 % 2 == 1.5", true),
    .init("meta.a / meta.zero == 0", false),
    .init("meta.a / meta.zero != 0", false),
    .init("meta.a % 0 == 0", false),
    .init("!(meta.a / 0 == 1)", true),
    .init("meta.mask & 4 == 4", true),
    .init("meta.mask | 3 == 15", true),
    .init("meta.mask ^ 5 == 9", true),
    .init("~meta.mask == -13", true),
    .init("~~meta.mask == 12", true),
    .init("meta.price & 1 == 1", false),
    .init("(meta.a ^ meta.b) != (meta.count * 10)", true),
    .init("meta.count > (meta.a + meta.b - meta.mask)", true),
    .init("2 + 3 * 4 == 14", true),
    .init("(2 + 3) * 4 == 20", true),
    .init("10 - 4 - 3 == 3", true),
    .init("10 - (4 - 3) == 9", true),
    .init("100 / 10 / 5 == 2", true),
    .init("1 + 6 & 3 == 3", true),
    .init("1 | 2 ^ 3 & 4 == 3", true),
    .init("6 & 3 ^ 5 == 7", true),
    .init("meta.countText + 1 == 6", true),
    .init("meta.uuid + 1 == 1", false),
    .init("meta.a-1 == 5", true),
    .init("meta.a--1 == 7", true),
    .init("9223372036854775807 + 1 > 9223372036854775807", true),
    .init("-9223372036854775808 % -1 == 0", true),
    .init("-9223372036854775808 / -1 > 0", true),
    .init("9223372036854775807 * 9223372036854775807 > 0", true),
    .init("1e308 * 10 > 0", false),
    // LIKE
    .init("meta.name LIKE 'ann*'", true),
    .init("meta.name like 'ANNE'", true),
    .init("meta.name LiKe 'an'", false),
    .init("meta.name LIKE '*nn*'", true),
    .init("meta.name LIKE '*E'", true),
    .init("meta.name LIKE '*'", true),
    .init("meta.star LIKE 'match\\*'", true),
    .init("meta.name LIKE 'Ann\\*'", false),
    .init("meta.names LIKE 'bo*'", true),
    .init("meta.names LIKE 'carl*'", false),
    .init("('Anne', 'anna', 'Ann') LIKE 'ann*'", true),
    .init("('x', 'y') LIKE 'ann*'", false),
    .init("meta.phone LIKE '555*'", true),
    .init("meta.city LIKE 'zü*'", true),
    .init("meta.missing LIKE '*'", false),
    .init("meta.user LIKE '*'", false),
    .init("'' LIKE '*'", true),
    .init("'abcabc' LIKE 'a*c*c'", true),
    .init("'ac' LIKE 'a*c*c'", false),
    .init("'a\\\\b' LIKE 'a\\\\\\\\*'", true),
    .init("'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaab' LIKE '*a*a*a*a*a*a*a*a*a*c'", false),
    .init("'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaab' LIKE '*a*a*a*a*a*a*a*a*a*b'", true),
    // CONTAINS
    .init("meta.text CONTAINS 'lo wo'", true),
    .init("meta.text contains 'LO'", false),
    .init("meta.text CoNtAiNs ''", true),
    .init("meta.tags CONTAINS 'news'", true),
    .init("meta.tags CONTAINS 'new'", false),
    .init("meta.tags CONTAINS 7", true),
    .init("meta.tags CONTAINS '7'", true),
    .init("('a', 'b', 'c') CONTAINS meta.letter", true),
    .init("(3, 5, 9) contains meta.count", true),
    .init("!((3, 5, 9) contains meta.count)", false),
    .init("(3, 5, 9) contains meta.countText", true),
    .init("(3, 5, 9) contains meta.missing", false),
    .init("meta.phone CONTAINS 555", true),
    .init("'abc123' CONTAINS 123", true),
    .init("'abc1.5' CONTAINS 1.5", true),
    .init("meta.text CONTAINS meta.missing", false),
    .init("meta.user CONTAINS 'role'", false),
    .init("meta.tags CONTAINS ('news')", true),
    // data.*, nested paths, bracket keys, absent meta / data
    .init("data.text LIKE 'hello*'", true),
    .init("data.score > 80", true),
    .init("data.user.name == 'Zoe'", true),
    .init("data.user[\"name\"] == 'Zoe'", true),
    .init("data['user']['tags'] CONTAINS 'y'", true),
    .init("data.user.tags CONTAINS 'z'", false),
    .init("meta[\"weird key\"] == 'w'", true),
    .init("meta.user.profile.age >= 30", true),
    .init("meta.user.profile.age.x == 1", false),
    .init("data.score > 80", false, data: nil),
    .init("data.score > 80", false, data: "just a string"),
    .init("meta.count == 5", false, meta: nil),
    .init("meta.uuid == data.uuid", true, meta: ["uuid": "x"], data: ["uuid": "x"]),
    // &&, ||, !, precedence
    .init("meta.count == 5 && meta.uuid == 'alice'", true),
    .init("meta.count == 5 && meta.uuid == 'bob'", false),
    .init("meta.count == 4 || meta.uuid == 'alice'", true),
    .init("meta.count == 4 || meta.uuid == 'bob' || data.type == 'chat'", true),
    .init("meta.count == 5 || meta.uuid == 'x' && meta.a == 0", true),
    .init("(meta.count == 5 || meta.uuid == 'x') && meta.a == 0", false),
    .init("!meta.count == 4", true),
    .init("!!meta.count == 5", true),
    .init("! (meta.count == 5) || meta.flag == 'true'", true),
    .init("!(meta.count == 5 && meta.a == 6)", false),
    .init("(meta.priority == \"high\") && (data.score > 80)", true, meta: ["priority": "high"]),
    // string escapes
    .init("meta.quote == 'it\\'s'", true),
    .init("meta.quote == \"it's\"", true),
    .init("meta.nl == 'a\\nb'", true),
    .init("meta.uni == '\\u00e9'", true),
    .init("meta.uni == 'e\\u0301'", true),
    .init("'\\uD83D\\uDE00' == '😀'", true),
]

@Suite struct FilterExpressionMatchTests {
    @Test(arguments: matchCases)
    func evaluates(_ testCase: FilterMatchCase) throws {
        let filter = try FilterExpression(parsing: testCase.expression)
        #expect(filter.matches(meta: testCase.meta, data: testCase.data) == testCase.expected)
        // The canonical form means the same thing.
        let canonical = try FilterExpression(parsing: filter.description)
        #expect(canonical == filter)
        #expect(canonical.matches(meta: testCase.meta, data: testCase.data) == testCase.expected)
    }

    @Test func hasEnoughCases() {
        #expect(matchCases.count >= 60)
    }
}

struct FilterErrorCase: Sendable, CustomTestStringConvertible {
    var expression: String
    var position: Int
    var reason: String

    init(_ expression: String, _ position: Int, _ reason: String) {
        self.expression = expression
        self.position = position
        self.reason = reason
    }

    var testDescription: String { "\(expression.prefix(60)) → \(position): \(reason)" }
}

private let errorCases: [FilterErrorCase] = [
    .init("", 0, "empty expression"),
    .init("   ", 0, "empty expression"),
    .init("meta.a == 'abc", 10, "unterminated string"),
    .init("meta.a == \"abc", 10, "unterminated string"),
    .init("meta.a == 'abc\\'", 10, "unterminated string"),
    .init("meta.a ==", 9, "expected a value after '=='"),
    .init("meta.a LIKE", 11, "expected a value after 'LIKE'"),
    .init("meta.a == 1 &&", 14, "expected a condition after '&&'"),
    .init("meta.a == 1 ||", 14, "expected a condition after '||'"),
    .init("meta.a == 1 && && meta.b == 2", 15, "expected a condition after '&&'"),
    .init("(meta.a == 1", 12, "missing ')'"),
    .init("((meta.a == 1)", 14, "missing ')'"),
    .init("meta.a == 1)", 11, "unexpected ')'"),
    .init("meta.a === 1", 7, "unknown operator '==='"),
    .init("meta.a => 1", 7, "unknown operator '=>'"),
    .init("meta.a = 1", 7, "unknown operator '='"),
    .init("meta.a <> 1", 7, "unknown operator '<>'"),
    .init("meta.a !== 1", 7, "unknown operator '!=='"),
    .init("!", 1, "expected a condition after '!'"),
    .init("meta.a == 1 meta.b", 12, "expected '&&', '||' or the end"),
    .init("meta.a == 1.", 12, "expected a digit after '.'"),
    .init("meta.a == 1.2.3", 13, "invalid number"),
    .init("meta.a == 12abc", 12, "invalid number"),
    .init("meta.a == 1e", 12, "exponent"),
    .init("meta.a == .5", 10, "unexpected character '.'"),
    .init("meta.a == 1e999", 10, "number out of range"),
    .init("meta.a", 6, "expected a comparison operator"),
    .init("meta.a && meta.b == 1", 7, "expected a comparison operator, found '&&'"),
    .init("meta.a == 1 && meta.b", 21, "expected a comparison operator"),
    .init("meta.", 5, "expected a field name after '.'"),
    .init("meta == 1", 4, "expected '.' or '['"),
    .init("meta[\"a\" == 1", 9, "expected ']'"),
    .init("meta[a] == 1", 5, "expected a quoted field name"),
    .init("meta.a == 1 == 2", 12, "comparisons cannot be chained"),
    .init("(meta.a == 1) + 2 == 3", 14, "a condition cannot be an operand of '+'"),
    .init("meta.a == (meta.b == 1)", 10, "a condition cannot be compared"),
    .init("(meta.a == 1) == 1", 14, "a condition cannot be compared"),
    .init("~(meta.a == 1) == 2", 1, "'~' needs a number"),
    .init("() == 1", 1, "empty parentheses"),
    .init("(1, 2 == 3)", 4, "a list element must be a value"),
    .init("(1, 2", 5, "missing ')'"),
    .init("(1, 2 3) CONTAINS 1", 6, "expected an operator, ',' or ')', found a number"),
    .init("meta.a meta.b", 7, "expected a comparison operator, found a field name"),
    .init("(1, 2,) CONTAINS 1", 6, "expected a value after ','"),
    .init("(meta.a == 1, 2) CONTAINS 1", 1, "a list element must be a value"),
    .init("meta.a == - 5", 10, "expected a number directly after '-'"),
    .init("meta.a == -meta.b", 10, "expected a number directly after '-'"),
    .init("meta.a == 'x\\u12'", 12, "invalid \\u escape"),
    .init("meta.a == '\\uD800'", 11, "unpaired surrogate"),
    .init("meta.a # 1", 7, "unexpected character '#'"),
    .init("== 1", 0, "expected a condition, found '=='"),
    .init("like == 1", 0, "expected a condition, found 'LIKE'"),
    .init("'e\u{301}' == 'x", 7, "unterminated string"),
    .init(String(repeating: "(", count: 33) + "meta.a == 1" + String(repeating: ")", count: 33), 32, "nesting deeper than 32"),
    .init(String(repeating: "!", count: 33) + "meta.a == 1", 32, "nesting deeper than 32"),
    .init("meta.a == " + String(repeating: "~", count: 33) + "1", 42, "nesting deeper than 32"),
    .init("!(" + String(repeating: "!(", count: 16) + "meta.a == 1" + String(repeating: ")", count: 17), 32, "nesting deeper than 32"),
    .init("meta.a == '" + String(repeating: "a", count: 5000) + "'", 4096, "longer than 4096 characters"),
]

@Suite struct FilterExpressionErrorTests {
    @Test(arguments: errorCases)
    func rejects(_ testCase: FilterErrorCase) {
        #expect {
            _ = try FilterExpression(parsing: testCase.expression)
        } throws: { error in
            guard let error = error as? FilterExpressionError else { return false }
            #expect(error.position == testCase.position, "\(error)")
            #expect(error.reason.contains(testCase.reason), "\(error)")
            return true
        }
    }

    @Test func hasEnoughCases() {
        #expect(errorCases.count >= 25)
    }

    @Test func describesErrors() throws {
        let error = FilterExpressionError(position: 9, reason: "expected a value after '=='")
        #expect(error.description == "invalid filter expression at character 9: expected a value after '=='")
    }

    @Test func acceptsTheLimits() throws {
        let deep = String(repeating: "(", count: 32) + "meta.a == 1" + String(repeating: ")", count: 32)
        #expect(try FilterExpression(parsing: deep).matches(meta: ["a": 1], data: nil))
        let long = "meta.a == '" + String(repeating: "é", count: FilterExpression.maximumLength - 12) + "'"
        #expect(long.count == FilterExpression.maximumLength)
        _ = try FilterExpression(parsing: long)
    }
}

@Suite struct FilterExpressionCanonicalTests {
    @Test(arguments: [
        ("uuid != 'me'", "meta.uuid != 'me'"),
        ("a==1&&b==2", "meta.a == 1 && meta.b == 2"),
        ("((a == 1))", "meta.a == 1"),
        ("(a == 1 || b == 2) && c == 3", "(meta.a == 1 || meta.b == 2) && meta.c == 3"),
        ("a == 1 || (b == 2 || c == 3)", "meta.a == 1 || meta.b == 2 || meta.c == 3"),
        ("a == 1 && (b == 2 && c == 3)", "meta.a == 1 && meta.b == 2 && meta.c == 3"),
        ("!(a == 1)", "!meta.a == 1"),
        ("!(a == 1 && b == 2)", "!(meta.a == 1 && meta.b == 2)"),
        ("(a + b) + c > 1", "meta.a + meta.b + meta.c > 1"),
        ("a - (b - c) > 1", "meta.a - (meta.b - meta.c) > 1"),
        ("(a + b) * c > 1", "(meta.a + meta.b) * meta.c > 1"),
        ("a + (b * c) > 1", "meta.a + meta.b * meta.c > 1"),
        ("a like \"x*\"", "meta.a LIKE 'x*'"),
        ("meta[\"weird key\"] == \"it's\"", "meta['weird key'] == 'it\\'s'"),
        ("a == 007", "meta.a == 7"),
        ("a == -0.50", "meta.a == -0.50"),
        ("a--5 == 1", "meta.a - -5 == 1"),
        ("~(a + 1) == 1", "~(meta.a + 1) == 1"),
        ("('a',\"b\" , 3) contains x", "('a', 'b', 3) CONTAINS meta.x"),
        ("data.user['name'] == 'x'", "data.user.name == 'x'"),
        ("meta.like == 'a\\*\\n'", "meta.like == 'a\\\\*\\n'"),
    ])
    func canonicalForm(_ input: String, _ expected: String) throws {
        let filter = try FilterExpression(parsing: input)
        #expect(filter.description == expected)
        #expect(try FilterExpression(parsing: expected) == filter)
    }

    @Test func equalMeaningsAreEqual() throws {
        #expect(try FilterExpression(parsing: "uuid == 'a'") == FilterExpression(parsing: "meta.uuid=='a'"))
        #expect(try FilterExpression(parsing: "a LIKE 'x'") == FilterExpression(parsing: "(meta[\"a\"] like \"x\")"))
        #expect(try FilterExpression(parsing: "a == 1") != FilterExpression(parsing: "a == 1.0"))
    }
}

@Suite struct FilterExpressionRobustnessTests {
    /// The LIKE matcher is linear: a pattern that makes backtracking matchers exponential.
    @Test func likeIsLinear() throws {
        let text = String(repeating: "a", count: 2_000) + "b"
        let pattern = String(repeating: "*a", count: 1_000) + "*c"
        let source = "meta.t LIKE '\(pattern)'"
        let filter = try FilterExpression(parsing: source)
        let meta: JSONValue = ["t": .string(text)]
        var work = 0
        let clock = ContinuousClock()
        let elapsed = clock.measure { #expect(!filter.evaluate(meta: meta, data: nil, work: &work)) }
        #expect(work <= 16 * (source.unicodeScalars.count + text.utf8.count + 1), "work \(work)")
        #expect(elapsed < .seconds(1))
    }

    /// The deepest accepted expressions parse, evaluate, print, hash and compare on a thread
    /// with a small (512 KiB) stack, like a secondary thread on macOS.
    @Test func deepExpressionsFitInASmallStack() async throws {
        func value(nesting: Int) -> String {
            var value = "meta.v"
            for _ in 0..<nesting { value = "(1 | 2 ^ 3 & 4 + 5 * \(value))" }
            return value
        }
        let depth = FilterExpression.maximumDepth
        var condition = "meta.a == 1"
        for _ in 0..<(depth / 2) { condition = "!(meta.b == 1 || meta.c == 2 && \(condition))" }
        let sources = [
            "meta.x == " + value(nesting: depth),
            condition,
            String(repeating: "!", count: depth / 2) + "meta.a == ~" + value(nesting: depth / 2 - 1),
        ]
        let outcomes: [Bool] = await withCheckedContinuation { continuation in
            let thread = Thread {
                var results: [Bool] = []
                for source in sources {
                    guard let filter = try? FilterExpression(parsing: source) else {
                        results.append(false)
                        continue
                    }
                    _ = filter.matches(meta: ["v": 1, "a": 1, "b": 1], data: nil)
                    let again = try? FilterExpression(parsing: filter.description)
                    results.append(again == filter && again?.hashValue == filter.hashValue)
                }
                continuation.resume(returning: results)
            }
            thread.stackSize = 512 * 1024
            thread.start()
        }
        #expect(outcomes == [true, true, true])
    }

    @Test func errorsPointInsideTheInput() {
        for text in ["'", "(", "meta.a ==", "\u{301}", "'é", "👍🏽 == 1", "meta.a == 'x' &&"] {
            do {
                _ = try FilterExpression(parsing: text)
                Issue.record("accepted \(text)")
            } catch {
                #expect((0...text.count).contains(error.position), "\(text): \(error)")
            }
        }
    }
}
