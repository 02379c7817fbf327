import Testing
@_spi(Benchmarks) import TetherProtocol

@Suite struct TimetokenTests {
    @Test(arguments: ["0", "1", "17953281264739664", "99999999999999999"])
    func parsesValidTimetokens(_ text: String) {
        #expect(Timetoken(parsing: text)?.description == String(UInt64(text)!))
    }

    @Test(arguments: ["", "-1", "abc", "1e5", " 1", "999999999999999999", "999999999999999999999", "0x10", "１２"])
    func rejectsInvalidTimetokens(_ text: String) {
        #expect(Timetoken(parsing: text) == nil)
    }

    @Test func convertsToSeconds() {
        #expect(Timetoken(17953281264739664).unixSeconds == 1795328126)
        #expect(Timetoken(unixSeconds: 1.5).rawValue == 15_000_000)
    }
}

@Suite struct NameRulesTests {
    @Test(arguments: ["ch1", "ch 1", "a.b", "sports-pnpres", "ünïcode", "with/slash", String(repeating: "x", count: 92)])
    func acceptsChannels(_ name: String) throws {
        try NameRules.validateChannel(name)
    }

    @Test(arguments: ["", "a,b", "a*", "tab\there", String(repeating: "x", count: 93), "nul\u{0}"])
    func rejectsChannels(_ name: String) {
        #expect(throws: NameRules.Violation.self) { try NameRules.validateChannel(name) }
    }

    @Test func wildcardsOnlyOnSubscribe() throws {
        try NameRules.validateSubscribeChannel("sports.*")
        try NameRules.validateSubscribeChannel("sports.eu.*")
        #expect(throws: NameRules.Violation.invalidWildcard) { try NameRules.validateSubscribeChannel("a.b.c.*") }
        #expect(throws: NameRules.Violation.invalidWildcard) { try NameRules.validateSubscribeChannel("*") }
        #expect(throws: NameRules.Violation.invalidWildcard) { try NameRules.validateSubscribeChannel("a*") }
        #expect(throws: NameRules.Violation.self) { try NameRules.validateChannel("sports.*") }
    }

    @Test func keys() {
        #expect(NameRules.validateKey("demo"))
        #expect(NameRules.validateKey("sub-c-1234_abcd.x"))
        #expect(!NameRules.validateKey(""))
        #expect(!NameRules.validateKey("a b"))
        #expect(!NameRules.validateKey(String(repeating: "k", count: 101)))
    }
}

@Suite struct PercentCodingTests {
    @Test func decodesSegments() {
        #expect(PercentCoding.decode("ch%201") == "ch 1")
        #expect(PercentCoding.decode("a%2Fb") == "a/b")
        #expect(PercentCoding.decode("1+1") == "1+1")  // + is literal
        #expect(PercentCoding.decode("%7B%22text%22%3A%20%22hi%22%7D") == "{\"text\": \"hi\"}")
    }

    @Test(arguments: ["%", "%Z1", "%1", "%C3%28", "%FF"])
    func rejectsMalformed(_ text: String) {
        #expect(PercentCoding.decode(text) == nil)
    }

    @Test func roundTrips() {
        for text in ["hello world", "a/b+c", "{\"k\":\"ü\"}", "~._-"] {
            #expect(PercentCoding.decode(PercentCoding.encode(text)) == text)
        }
        #expect(PercentCoding.encode("a b/c") == "a%20b%2Fc")
    }
}

@Suite struct JSONTextTests {
    @Test(arguments: [
        ("{}", JSONText.Kind.object), ("[]", .array), ("\"s\"", .string), ("-1.5e3", .number), ("0", .number),
        ("true", .bool), ("null", .null), (" {\"a\": [1, {\"b\": null}], \"c\": \"\\u00e9\\n\"} ", .object),
    ])
    func acceptsValidJSON(_ text: String, _ kind: JSONText.Kind) throws {
        #expect(try JSONText.validate(text) == kind)
    }

    @Test(arguments: ["", "{", "{bad", "[1,]", "{\"a\":}", "01", "1.", "NaN", "'s'", "\"unterminated", "[1] [2]",
                      "\"tab\tinside\"", "{\"a\" 1}", "tru", "\"\\x\"", "-", "1e"])
    func rejectsInvalidJSON(_ text: String) {
        #expect(throws: JSONText.Invalid.self) { try JSONText.validate(text) }
    }

    @Test func boundsNesting() throws {
        let ok = String(repeating: "[", count: JSONText.maximumDepth) + String(repeating: "]", count: JSONText.maximumDepth)
        #expect(try JSONText.validate(ok) == .array)
        let deep = String(repeating: "[", count: 100_000) + String(repeating: "]", count: 100_000)
        #expect(throws: JSONText.Invalid.self) { try JSONText.validate(deep) }
    }

    @Test func writerEscapes() {
        var w = JSONWriter()
        w.string("a\"b\\c\n\u{1}é")
        #expect(String(decoding: w.bytes, as: UTF8.self) == "\"a\\\"b\\\\c\\n\\u0001é\"")
        #expect((try? JSONText.validate(w.bytes)) == .string)
    }

    /// Numbers are written digit by digit in place: every width, both signs and both ends of
    /// each type read back as `String(value)` writes them.
    @Test func writerNumbersAreTheirDecimalText() {
        var unsigned: [UInt64] = [0, 9, 10, 99, 100, UInt64.max, UInt64.max / 10, 17_953_281_264_739_664]
        var power: UInt64 = 1
        for _ in 0..<19 {
            power *= 10
            unsigned += [power - 1, power, power + 1]
        }
        for value in unsigned {
            var w = JSONWriter()
            w.number(value)
            #expect(String(decoding: w.bytes, as: UTF8.self) == String(value))
            var tt = JSONWriter()
            tt.timetokenString(Timetoken(value))
            #expect(String(decoding: tt.bytes, as: UTF8.self) == "\"\(value)\"")
        }
        for value in [0, -1, 1, -10, Int.min, Int.max, -17_953_281_264_739_664] {
            var w = JSONWriter()
            w.raw("[")
            w.number(value)
            w.number(Int32(truncatingIfNeeded: value))
            #expect(String(decoding: w.bytes, as: UTF8.self) == "[\(value)\(Int32(truncatingIfNeeded: value))")
        }
    }
}

@Suite struct EnvelopeTests {
    @Test func encodesEveryRequiredField() throws {
        let envelope = SubscribeEnvelope(timetoken: Timetoken(17953281265171442), subscribeKey: "demo", channel: "ch1",
                                         payload: "{\"text\":\"hello\"}", publisher: "other-user", meta: "{\"k\":\"v\"}")
        let text = String(decoding: envelope.encoded(), as: UTF8.self)
        #expect(text == #"{"a":"1","f":0,"i":"other-user","p":{"t":"17953281265171442","r":1},"k":"demo","c":"ch1","d":{"text":"hello"},"u":{"k":"v"}}"#)
        #expect(try JSONText.validate(text) == .object)
    }

    @Test func theEncodedBufferIsSizedToFit() {
        let long = String(repeating: "x", count: 92)
        let envelopes = [
            SubscribeEnvelope(timetoken: Timetoken(17953281265171442), subscribeKey: "demo", channel: "ch-pnpres",
                              payload: #"{"action":"join","timestamp":1795328126,"uuid":"u-1","occupancy":1}"#),
            SubscribeEnvelope(timetoken: Timetoken(.max), region: .max, subscribeKey: long, channel: long, payload: "1",
                              publisher: long, meta: #"{"k":"v"}"#, kind: .messageAction, customMessageType: long,
                              sequence: .min, shard: long),
            SubscribeEnvelope(timetoken: Timetoken(0), region: -1, subscribeKey: "k", channel: "c", payload: "null", sequence: 7),
            SubscribeEnvelope(timetoken: Timetoken(5), subscribeKey: "k", channel: "c", payload: "1", kind: .signal),
        ]
        for envelope in envelopes {
            let count = envelope.encoded().count
            #expect(count <= envelope.encodedCapacity, "never grown while encoding")
            #expect(envelope.encodedCapacity - count <= 64, "and little left unused")
        }
        // A 17-digit timetoken, one-digit region, nothing optional: 3 bytes to spare.
        #expect(envelopes[0].encodedCapacity - envelopes[0].encoded().count == 3)
        // And the buffer is made that size (the allocator may round it up a little).
        #expect(envelopes[0].encoded().capacity <= envelopes[0].encodedCapacity + 16)
        // A string that needs escaping grows the buffer, and is still encoded whole.
        let escaped = SubscribeEnvelope(timetoken: Timetoken(5), subscribeKey: "k", channel: "c", payload: "1",
                                        publisher: String(repeating: "\u{1}", count: 40))
        #expect(escaped.encoded().count > escaped.encodedCapacity)
    }

    @Test func signalsCarryEventType() {
        let envelope = SubscribeEnvelope(timetoken: Timetoken(5), subscribeKey: "k", channel: "c", payload: "1", kind: .signal)
        #expect(String(decoding: envelope.encoded(), as: UTF8.self).contains("\"e\":1"))
    }

    @Test func splicesSubscriptionMatch() throws {
        let envelope = SubscribeEnvelope(timetoken: Timetoken(5), subscribeKey: "k", channel: "a.b", payload: "1")
        let spliced = SubscribeEnvelope.encodedWithMatch(envelope.encoded(), match: "a.*")
        let text = String(decoding: spliced, as: UTF8.self)
        #expect(text.hasPrefix(#"{"b":"a.*","a":"1""#))
        #expect(try JSONText.validate(text) == .object)
        #expect(SubscribeEnvelope.encodedWithMatch(envelope.encoded(), match: nil) == envelope.encoded())
    }

    @Test func responseBody() {
        let body = SubscribeResponseBody.encode(cursor: Timetoken(42), region: 1, envelopes: [Array("{}".utf8), Array("{}".utf8)])
        #expect(String(decoding: body, as: UTF8.self) == #"{"t":{"t":"42","r":1},"m":[{},{}]}"#)
    }

    @Test func errorBodies() {
        #expect(String(decoding: ErrorBody.publish("Invalid JSON", timetoken: Timetoken(7)), as: UTF8.self) == #"[0,"Invalid JSON","7"]"#)
        let denied = String(decoding: ErrorBody.forbidden(channels: ["c1"], groups: ["g1"]), as: UTF8.self)
        #expect(denied == #"{"message":"Forbidden","payload":{"channels":["c1"],"channel-groups":["g1"]},"error":true,"service":"Access Manager","status":403}"#)
    }
}
