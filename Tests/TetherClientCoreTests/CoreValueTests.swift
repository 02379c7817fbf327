import Testing
import TetherClientCore
import TetherProtocol

@Suite("Decoding, tokens, base64, pagination")
struct CoreValueTests {
    @Test func base64RoundTrip() {
        for count in 0..<40 {
            let bytes = (0..<count).map { UInt8(($0 * 37 + 11) & 0xFF) }
            #expect(Base64.decode(Base64.encode(bytes)) == bytes)
        }
        #expect(Base64.encode(Array("hello".utf8)) == "aGVsbG8=")
        #expect(Base64.decode("aGVsbG8") == Array("hello".utf8))
        #expect(Base64.decode("a$b") == nil)
    }

    @Test func timetokensAsNumbersOrStrings() throws {
        #expect(try ResponseDecoding.time(JSONValue(parsing: "[17953281264739664]")) == Timetoken(17953281264739664))
        #expect(try ResponseDecoding.publish(JSONValue(parsing: #"[1,"Sent","17953281264739665"]"#)).timetoken == Timetoken(17953281264739665))
        #expect(throws: DecodingFailure.self) { try ResponseDecoding.time(JSONValue(parsing: "{}")) }
    }

    @Test func hereNowShapes() throws {
        let single = try JSONValue(parsing: #"{"status":200,"uuids":[{"uuid":"u1","state":{"k":1}},"u2"],"occupancy":2}"#)
        let one = try ResponseDecoding.hereNow(single, channels: ["c"], groups: [])
        #expect(one.channels["c"]?.occupants == [Occupant(userId: "u1", state: ["k": 1]), Occupant(userId: "u2")])
        let multi = try JSONValue(parsing: #"{"payload":{"channels":{"a":{"uuids":["u"],"occupancy":1}},"total_channels":1,"total_occupancy":1}}"#)
        let many = try ResponseDecoding.hereNow(multi, channels: ["a", "b"], groups: [])
        #expect(many.totalOccupancy == 1 && many.channels["a"]?.occupancy == 1)
    }

    @Test func subscribeResponse() throws {
        let body = try JSONValue(parsing: #"""
            {"t":{"t":"17953281265171442","r":1},"m":[{"a":"4","f":0,"i":"other","p":{"t":"17953281265171441","r":1},
             "k":"sub","c":"ch1","d":{"text":"hello"},"u":{"k":"v"}},
             {"a":"1","f":0,"p":{"t":"17953281265171442","r":1},"k":"sub","c":"ch1","b":"g1","d":"sig","e":1}]}
            """#)
        let r = try ResponseDecoding.subscribe(body)
        #expect(r.timetoken == Timetoken(17953281265171442) && r.region == 1 && r.events.count == 2)
        #expect(r.events[0].publisher == "other" && r.events[0].meta == ["k": "v"] && r.events[0].kind == .message)
        #expect(r.events[1].kind == .signal && r.events[1].subscription == "g1")
    }

    @Test func parsesAccessToken() throws {
        // CBOR written by hand: {"v":2,"t":1000,"ttl":60,"res":{"chan":{"c":3}},"uuid":"u","sig":h'0102'} with byte-string keys.
        var cbor: [UInt8] = [0xA6]
        func key(_ s: String) { cbor.append(0x40 | UInt8(s.utf8.count)); cbor += Array(s.utf8) }
        func text(_ s: String) { cbor.append(0x60 | UInt8(s.utf8.count)); cbor += Array(s.utf8) }
        key("v"); cbor.append(0x02)
        key("t"); cbor += [0x19, 0x03, 0xE8]
        key("ttl"); cbor.append(0x18); cbor.append(60)
        key("res"); cbor.append(0xA1); key("chan"); cbor.append(0xA1); text("c"); cbor.append(0x03)
        key("uuid"); text("u")
        key("sig"); cbor += [0x42, 0x01, 0x02]
        let token = try AccessToken(parsing: Base64.encode(cbor).replacingOccurrences(of: "+", with: "-"))
        #expect(token.version == 2 && token.issuedAt == 1000 && token.ttlMinutes == 60 && token.expiresAt == 1000 + 3600)
        #expect(token.resources.channels == ["c": [.read, .write]])
        #expect(token.authorizedUserId == "u" && token.signature == [1, 2])
        #expect(throws: DecodingFailure.self) { try AccessToken(parsing: "not base64 !") }
    }

    @Test func paginatorWalksBackwardsWithoutRepeats() {
        func page(_ channel: String, _ tts: ClosedRange<UInt64>) -> HistoryPage {
            HistoryPage(channels: [channel: tts.map { HistoryMessage(channel: channel, timetoken: Timetoken($0), payload: .null) }])
        }
        var p = FetchPaginator(channels: ["a"], options: FetchOptions(end: Timetoken(1), maximumPerChannel: 3))
        #expect(p.pageSize == 3)
        #expect(p.received(page("a", 8...10)).messages.count == 3)
        #expect(p.options.start == Timetoken(8) && !p.isFinished)
        #expect(p.received(page("a", 5...7)).messages.count == 3)
        #expect(p.received(page("a", 4...4)).messages.count == 1)
        #expect(p.isFinished)
    }

    @Test func jsonValueClientHelpers() throws {
        #expect(JSONValue.int(UInt64(17953281264739664)).uint64Value == 17953281264739664)
        #expect(JSONValue.string("42").intValue == 42)
        struct Point: Codable, Equatable { var x: Int; var y: String }
        let value = try JSONValue(encoding: Point(x: 1, y: "a"))
        #expect(value == ["x": 1, "y": "a"])
        #expect(try value.decode(Point.self) == Point(x: 1, y: "a"))
    }

    @Test func retryConfigurationDefaults() {
        let d = RetryConfiguration.default
        #expect(d.policy == .exponential(minimumDelay: .seconds(2), maximumDelay: .seconds(150), maximumRetries: 6))
        #expect(d.excludedEndpoints.contains(.messageSend) && !d.excludedEndpoints.contains(.subscribe))
        #expect(RetryConfiguration.disabled.policy == .none)
    }
}

extension String {
    fileprivate func replacingOccurrences(of a: String, with b: String) -> String {
        split(separator: Character(a), omittingEmptySubsequences: false).joined(separator: b)
    }
}
