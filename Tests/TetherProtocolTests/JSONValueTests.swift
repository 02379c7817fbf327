import Testing
@testable import TetherProtocol

@Suite struct JSONValueTests {
    @Test func parsesEveryKind() throws {
        let value = try JSONValue(parsing: #" {"a": [1, -2.5e3, true, false, null], "b": {"c": "d\u00e9\n"}, "e": ""} "#)
        #expect(value["a"]?[0] == 1)
        #expect(value["a"]?[1]?.numberValue?.doubleValue == -2500)
        #expect(value["a"]?[2]?.boolValue == true)
        #expect(value["a"]?[4]?.isNull == true)
        #expect(value["a"]?[5] == nil)
        #expect(value["b"]?["c"]?.stringValue == "dé\n")
        #expect(value["e"] == "")
        #expect(value["missing"] == nil)
        #expect(value.objectValue?.count == 3)
        #expect(value["a"]?.arrayValue?.count == 5)
    }

    @Test(arguments: [
        ("0", Int64?.some(0)), ("-0", 0), ("42", 42), ("-7", -7), ("1.0", 1), ("1.5", nil), ("25e2", 2500),
        ("2.5e1", 25), ("1e19", nil), ("1e18", 1_000_000_000_000_000_000), ("9223372036854775807", .max),
        ("-9223372036854775808", .min), ("9223372036854775808", nil), ("1.0000000000000000001", nil),
        ("100e-2", 1), ("1e-2", nil), ("0e5000", 0), ("12345678901234567890e-10", nil), ("1E+2", 100),
        ("0.000", 0), ("-1.5e1", -15),
    ])
    func exactIntegers(_ text: String, _ expected: Int64?) throws {
        let number = try #require(JSONValue.Number(text: text))
        #expect(number.exactInteger == expected)
        #expect(number.text == text)
        #expect(number.doubleValue == Double(text))
    }

    @Test(arguments: ["01", "+1", " 1", "1 ", "1.", ".5", "-", "1e", "1e+", "NaN", "Infinity", "0x10", "", "1_000"])
    func rejectsNumberSyntax(_ text: String) {
        #expect(JSONValue.Number(text: text) == nil)
    }

    @Test func buildsNumbers() throws {
        #expect(JSONValue.Number(42).text == "42")
        #expect(JSONValue.Number(Int64.min).exactInteger == .min)
        #expect(JSONValue.Number(0.1)?.text == "0.1")
        #expect(JSONValue.Number(1e20)?.exactInteger == nil)
        #expect(JSONValue.Number(.infinity) == nil)
        #expect(JSONValue.Number(.nan) == nil)
        #expect(JSONValue(floatLiteral: 2.5) == .number(JSONValue.Number(2.5)!))
        #expect(try JSONValue(parsing: "1e999").numberValue?.doubleValue == .infinity)
    }

    @Test func equalityIsStructural() throws {
        #expect(try JSONValue(parsing: #"{"a":1,"b":[true]}"#) == JSONValue(parsing: #"{ "b" : [ true ] , "a" : 1 }"#))
        #expect(try JSONValue(parsing: "1") != JSONValue(parsing: "1.0"))
        #expect(try JSONValue(parsing: #"{"a":1,"a":2}"#) == ["a": 2])
    }

    @Test func serializesCompactlyWithSortedKeys() throws {
        let value: JSONValue = ["b": [1, "x\"\\\n\u{1}"], "a": nil, "c": ["d": false], "n": .number(JSONValue.Number(text: "-1.50e3")!)]
        #expect(value.jsonText == #"{"a":null,"b":[1,"x\"\\\n\u0001"],"c":{"d":false},"n":-1.50e3}"#)
        #expect(value.description == value.jsonText)
        #expect(try JSONValue(parsing: value.jsonBytes) == value)
    }

    @Test func repairsWhatJSONTextLetsThrough() throws {
        // JSONText accepts these; JSONValue must too, replacing what a String cannot hold.
        #expect(try JSONValue(parsing: #""\ud800""#) == "\u{FFFD}")
        #expect(try JSONValue(parsing: #""\udc00x""#) == "\u{FFFD}x")
        #expect(try JSONValue(parsing: #""\ud83d\ude00""#) == "😀")
        #expect(try JSONValue(parsing: #""\ud83dx""#) == "\u{FFFD}x")
        #expect(try JSONValue(parsing: [0x22, 0xFF, 0x41, 0x22]) == "\u{FFFD}A")
    }

    @Test func boundsNesting() throws {
        let deepest = String(repeating: "[", count: JSONText.maximumDepth) + String(repeating: "]", count: JSONText.maximumDepth)
        _ = try JSONValue(parsing: deepest)
        let tooDeep = "[" + deepest + "]"
        #expect(throws: JSONText.Invalid(offset: JSONText.maximumDepth, reason: "nesting deeper than 64")) {
            try JSONValue(parsing: tooDeep)
        }
    }

    @Test(arguments: [
        "", " ", "{", "[1,]", "[1 2]", "{\"a\"}", "{\"a\":}", "{a:1}", "tru", "nul", "\"abc", "\"\\x\"", "\"\\u12\"",
        "\"\\u12g4\"", "\"\u{1}\"", "01", "-", "1.", "1e", "[1]x", "{\"a\":1,}", "\"\\", "[\"\\u", "nulx",
    ])
    func failsExactlyLikeJSONText(_ text: String) {
        let expected = #expect(throws: JSONText.Invalid.self) { try JSONText.validate(text) }
        let actual = #expect(throws: JSONText.Invalid.self) { try JSONValue(parsing: text) }
        #expect(actual == expected)
    }

    /// Random JSON, then random byte edits: `JSONValue` accepts exactly what `JSONText` accepts
    /// (with the same error), and what it accepts serializes and re-parses to an equal value.
    @Test func agreesWithJSONTextOnRandomInput() {
        var generator = FilterFuzzGenerator(random: SplitMix64(seed: 0x15_0A_7E_57))
        let edits: [[UInt8]] = ["{", "}", "[", "]", ",", ":", "\"", "\\", "u", "0", "-", ".", "e", " ", "t", "n", "\u{1}"].map { Array($0.utf8) }
            + [[0xFF], [0xC3], [0xE2, 0x82]]
        for _ in 0..<3_000 {
            var bytes = generator.jsonValue(depth: 3).jsonBytes
            if generator.random.chance(70) {
                for _ in 0..<generator.random.int(1...3) {
                    let position = generator.random.int(0...bytes.count)
                    switch generator.random.int(0...2) {
                    case 0: bytes.insert(contentsOf: generator.random.pick(edits), at: position)
                    case 1 where position < bytes.count: bytes.remove(at: position)
                    default: bytes.removeSubrange(position...)
                    }
                }
            }
            let validation = Result { () throws(JSONText.Invalid) in try JSONText.validate(bytes) }
            let parse = Result { () throws(JSONText.Invalid) in try JSONValue(parsing: bytes) }
            switch (validation, parse) {
            case (.success, .success(let value)):
                #expect((try? JSONValue(parsing: value.jsonBytes)) == value, "\(value)")
            case (.failure(let expected), .failure(let actual)):
                #expect(actual == expected, "\(String(decoding: bytes, as: UTF8.self))")
            default:
                Issue.record("disagreement on \(String(decoding: bytes, as: UTF8.self)): \(validation) vs \(parse)")
            }
        }
    }
}
