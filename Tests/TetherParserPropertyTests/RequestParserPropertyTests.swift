import Foundation
import HTTPTypes
import PropertyBased
import Testing
import TetherProtocol
@testable import TetherServer

/// Property-based tests of everything that reads a request before a handler runs: percent
/// decoding, `WireRequest` (path split before decoding, query last-wins), the bounded
/// parameter accessors (`ParameterBounds`), timetokens, JSON validation and name rules.
///
/// Each property compares the parser with an independent reference (Foundation's percent
/// decoding, exact decimal comparison, a direct transcription of the documented rule) or checks
/// a round trip; a trap anywhere fails the whole run. Inputs that ever broke something are
/// replayed from `Tests/Corpus/hostile-requests.txt` by `CorpusReplayTests`.
@Suite struct RequestParserPropertyTests {
    // MARK: - Percent coding

    @Test func percentEncodingRoundTripsAnyText() async {
        await propertyCheck(count: 1_000, input: RequestGen.unicode(length: 0...40)) { text in
            let encoded = PercentCoding.encode(text)
            #expect(PercentCoding.decode(encoded) == text)
            // Only RFC 3986 unreserved characters and `%XX` (uppercase) leave the encoder.
            #expect(encoded.utf8.allSatisfy { b in
                (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A) || b == 0x2D || b == 0x2E
                    || b == 0x5F || b == 0x7E || b == 0x25
            })
        }
    }

    /// The reference decoder: `%` and two hex digits (parsed with `UInt8(_:radix:)`) become a
    /// byte, anything else is copied, and the bytes must be UTF-8 (`String(data:encoding:)`).
    /// Foundation's `removingPercentEncoding` is not used: on Linux it repairs invalid UTF-8
    /// (`%A9` → U+FFFD) where the wire must refuse it.
    static func referenceDecode(_ raw: String) -> String? {
        var data = Data()
        var bytes = raw.utf8[...]
        while let byte = bytes.popFirst() {
            guard byte == UInt8(ascii: "%") else { data.append(byte); continue }
            let hex = bytes.prefix(2)
            guard hex.count == 2, hex.allSatisfy({ $0 < 0x80 && Character(UnicodeScalar($0)).isHexDigit }),
                  let value = UInt8(String(decoding: hex, as: UTF8.self), radix: 16)
            else { return nil }
            data.append(value)
            bytes = bytes.dropFirst(2)
        }
        return String(data: data, encoding: .utf8)
    }

    @Test func percentDecodingAgreesWithTheReference() async {
        await propertyCheck(count: 3_000, input: RequestGen.text(RequestGen.rawURIAlphabet + "%%C3A9ED28", length: 0...24)) { raw in
            #expect(PercentCoding.decode(raw) == Self.referenceDecode(raw), "\(raw.debugDescription)")
        }
    }

    @Test func percentDecodingRefusesEveryMalformedEscapeAndInvalidUTF8() {
        for raw in ["%", "%2", "%zz", "%ZZ", "%G0", "a%", "%%", "%C3%28", "%C0%AF", "%ED%A0%80", "%F4%90%80%80", "%FF", "%C3"] {
            #expect(PercentCoding.decode(raw) == nil, "\(raw)")
        }
        #expect(PercentCoding.decode("%00") == "\u{0}")
        #expect(PercentCoding.decode("a+b") == "a+b")
    }

    // MARK: - WireRequest

    @Test func wireRequestRecoversEncodedSegmentsAndQuery() async {
        let segments = RequestGen.unicode(length: 0...6).array(of: 1...6)
        let pairs = RequestGen.unicode(length: 1...5).pair.array(of: 0...6)
        await propertyCheck(count: 1_000, input: segments, pairs) { segments, pairs in
            let rawPath = "/" + segments.map { PercentCoding.encode($0) }.joined(separator: "/")
            let rawQuery = pairs.map { "\(PercentCoding.encode($0.0))=\(PercentCoding.encode($0.1))" }.joined(separator: "&")
            guard let wire = try? WireRequest(rawPath: rawPath, rawQuery: rawQuery) else {
                Issue.record("well-formed request refused: \(rawPath)?\(rawQuery)")
                return
            }
            var expected = segments
            if expected.count > 1, expected.last == "" { expected.removeLast() }
            #expect(wire.segments == expected)
            #expect(wire.rawSegments.count == wire.segments.count)
            // A repeated key keeps its last value, in both the decoded and the raw view.
            let reference = Dictionary(pairs.map { ($0.0, $0.1) }, uniquingKeysWith: { _, last in last })
            #expect(wire.query.dictionary == reference)
            for (key, value) in reference {
                #expect(wire.rawQueryValue(key).flatMap { PercentCoding.decode($0) } == value)
            }
            #expect(wire.flags.isEmpty)
        }
    }

    @Test func wireRequestSplitsNameListsBeforeDecoding() async {
        let names = RequestGen.unicode(length: 0...5).array(of: 0...5)
        await propertyCheck(count: 1_000, input: names) { names in
            let raw = names.map { PercentCoding.encode($0) }.joined(separator: ",")
            guard let wire = try? WireRequest(rawPath: "/v2/subscribe/demo/\(raw)/0", rawQuery: "channel-group=\(raw)") else {
                Issue.record("refused \(raw)")
                return
            }
            // An encoded comma stays inside its name; empty names are dropped.
            let expected = names.filter { !$0.isEmpty }
            if wire.rawSegments.count > 3 { #expect(wire.pathNames(3) == expected) }
            #expect(wire.queryNames("channel-group") == expected)
        }
    }

    @Test func wireRequestOnHostileRawTextDecodesExactlyLikeTheReference() async {
        let raw = RequestGen.text(RequestGen.rawURIAlphabet, length: 0...30)
        await propertyCheck(count: 3_000, input: raw, raw) { path, query in
            let rawPath = "/" + path
            do {
                let wire = try WireRequest(rawPath: rawPath, rawQuery: query)
                var pieces = rawPath.split(separator: "/", omittingEmptySubsequences: false).dropFirst().map(String.init)
                if pieces.count > 1, pieces.last == "" { pieces.removeLast() }
                #expect(wire.segments == pieces.map { Self.referenceDecode($0) })
                for pair in query.split(separator: "&") {
                    if let equals = pair.firstIndex(of: "=") {
                        #expect(wire.query[Self.referenceDecode(String(pair[..<equals])) ?? "\u{FFFF}"] != nil)
                    } else {
                        #expect(wire.flags.contains(Self.referenceDecode(String(pair)) ?? "\u{FFFF}"))
                    }
                }
            } catch {
                // Refused: then some piece really is malformed.
                let pieces = rawPath.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
                    + query.split(separator: "&").flatMap { $0.split(separator: "=", maxSplits: 1).map(String.init) }
                #expect(pieces.contains { Self.referenceDecode($0) == nil }, "\(rawPath)?\(query) refused")
            }
        }
    }

    // MARK: - Bounded accessors (ParameterBounds)

    /// What a bounded accessor did with a parameter.
    enum Outcome<Value: Equatable>: Equatable {
        /// Absent or empty: the default applies.
        case absent
        case value(Value)
        /// Refused with a `ParameterError` (a 400).
        case refused
    }

    static func outcome<Value: Equatable>(_ read: () throws(ParameterError) -> Value?) -> Outcome<Value> {
        do {
            return try read().map(Outcome.value) ?? .absent
        } catch {
            return .refused
        }
    }

    /// The documented integer rule, transcribed: optional `-`, ASCII digits, at most 20
    /// characters, compared exactly (as `Decimal`) with the range.
    static func referenceInteger(_ text: String, _ range: ClosedRange<Int>) -> Outcome<Int> {
        if text.isEmpty { return .absent }
        let bytes = Array(text.utf8)
        let digits = bytes.first == UInt8(ascii: "-") ? bytes.dropFirst() : bytes[...]
        guard bytes.count <= 20, !digits.isEmpty, digits.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }),
              let exact = Decimal(string: text, locale: Locale(identifier: "en_US_POSIX"))
        else { return .refused }
        guard exact >= Decimal(range.lowerBound), exact <= Decimal(range.upperBound) else { return .refused }
        return .value(Int(text)!)
    }

    static let integerBounds: [(String, ClosedRange<Int>)] = [
        ("seqn", ParameterBounds.sequence), ("heartbeat", ParameterBounds.heartbeatSeconds), ("tr", ParameterBounds.region),
        ("count", ParameterBounds.historyCount), ("max", ParameterBounds.fetchMax), ("limit", ParameterBounds.hereNowLimit),
        ("offset", ParameterBounds.hereNowOffset), ("ttl", ParameterBounds.grantTTLMinutes),
    ]

    @Test(arguments: integerBounds.map(\.0))
    func integerAccessorAcceptsExactlyTheDocumentedRange(_ name: String) async throws {
        let range = try #require(Self.integerBounds.first { $0.0 == name }?.1)
        await propertyCheck(count: 2_000, input: RequestGen.integerText(around: range)) { text in
            let wire = try #require(try? WireRequest(rawPath: "/x", rawQuery: "\(name)=\(PercentCoding.encode(text))"))
            let got = Self.outcome { () throws(ParameterError) in try wire.integer(name, in: range) }
            #expect(got == Self.referenceInteger(text, range), "\(name)=\(text.debugDescription)")
            if case .value(let value) = got { #expect(range.contains(value)) }
        }
    }

    /// The documented decimal rule: ASCII digits and dots only, at most 32 characters, a
    /// finite number, within the range (compared exactly).
    static func referenceDecimal(_ text: String, _ range: ClosedRange<Double>) -> Bool {
        if text.isEmpty { return true }
        let bytes = Array(text.utf8)
        guard bytes.count <= 32, bytes.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || $0 == UInt8(ascii: ".") }),
              bytes.filter({ $0 == UInt8(ascii: ".") }).count <= 1, bytes.contains(where: { $0 != UInt8(ascii: ".") }),
              let exact = Decimal(string: text.hasPrefix(".") ? "0" + text : text, locale: Locale(identifier: "en_US_POSIX"))
        else { return false }
        return exact >= Decimal(range.lowerBound) && exact <= Decimal(range.upperBound)
    }

    @Test func decimalAccessorAcceptsExactlyTheDocumentedRange() async {
        let range = ParameterBounds.publishTTLHours
        await propertyCheck(count: 3_000, input: RequestGen.decimalText(around: range)) { text in
            let wire = try #require(try? WireRequest(rawPath: "/x", rawQuery: "ttl=\(PercentCoding.encode(text))"))
            let got = Self.outcome { () throws(ParameterError) in try wire.decimal("ttl", in: range) }
            #expect((got != .refused) == Self.referenceDecimal(text, range), "ttl=\(text.debugDescription)")
            #expect((got == .absent) == text.isEmpty)
            if case .value(let value) = got {
                #expect(value.isFinite && range.contains(value))
                #expect(value == Double(text))
            }
        }
    }

    @Test func strictBoolAcceptsOnlyTheFourSpellings() async {
        await propertyCheck(count: 1_000, input: RequestGen.text("01tTrRuUeEfFaAlLsS -", length: 0...6)) { text in
            let wire = try #require(try? WireRequest(rawPath: "/x", rawQuery: "store=\(PercentCoding.encode(text))"))
            let got = Self.outcome { () throws(ParameterError) in try wire.strictBool("store") }
            let expected: Outcome<Bool> = switch text.lowercased() {
            case "": .absent
            case "1", "true": .value(true)
            case "0", "false": .value(false)
            default: .refused
            }
            #expect(got == expected, "\(text.debugDescription)")
        }
    }

    // MARK: - Timetokens

    @Test func timetokensOfUpToSeventeenDigitsRoundTrip() async {
        await propertyCheck(count: 2_000, input: Gen.uint64(in: 0...Timetoken.maximumAccepted.rawValue)) { value in
            #expect(Timetoken(parsing: String(value))?.rawValue == value)
            // Leading zeros up to 17 characters are still the same timetoken.
            let padded = String(repeating: "0", count: max(0, 17 - String(value).count)) + String(value)
            #expect(Timetoken(parsing: padded)?.rawValue == value)
        }
    }

    @Test func timetokenParsingMatchesTheDocumentedRule() async {
        let texts = RequestGen.text("0123456789999-+. e", length: 0...22)
        await propertyCheck(count: 3_000, input: texts) { text in
            let digitsOnly = !text.isEmpty && text.utf8.count <= 17 && text.utf8.allSatisfy { $0 >= 0x30 && $0 <= 0x39 }
            let parsed = Timetoken(parsing: text)
            #expect((parsed != nil) == digitsOnly, "\(text.debugDescription)")
            if let parsed { #expect(parsed.rawValue == UInt64(text)!) }
            let wire = try #require(try? WireRequest(rawPath: "/x", rawQuery: "tt=\(PercentCoding.encode(text))"))
            let viaAccessor = Self.outcome { () throws(ParameterError) in try wire.timetoken("tt") }
            #expect(viaAccessor == (text.isEmpty ? .absent : parsed.map(Outcome.value) ?? .refused))
        }
    }

    @Test func timetokenArithmeticSaturatesForAnyInput() async {
        let seconds = Gen<Double>.frequency(
            (4, Gen.double(in: -1e6...1e6)),
            (2, Gen.double(in: -1e300...1e300)),
            (1, Gen<Double?>.element(of: [Double.nan, .infinity, -.infinity, .greatestFiniteMagnitude, -0.0, .leastNonzeroMagnitude,
                                 9.2233720368547758e11, 9.2233720368547758e18]).map { $0! }))
        await propertyCheck(count: 3_000, input: Gen.uint64(), seconds) { raw, seconds in
            let token = Timetoken(raw)
            let moved = token.adding(seconds: seconds)
            if !(seconds.isFinite && seconds > 0) {
                // Negative, zero, NaN and infinite amounts move nothing.
                #expect(moved == token)
            } else if raw <= Timetoken.maximumStorable.rawValue {
                // Forward, and saturating at what a store can hold.
                #expect(moved >= token && moved <= Timetoken.maximumStorable)
            } else {
                #expect(moved <= max(token, Timetoken.maximumStorable))
            }
            let fromSeconds = Timetoken(unixSeconds: seconds)
            #expect(fromSeconds.rawValue <= Timetoken.maximumStorable.rawValue)
            #expect(token.storageValue >= 0)
            _ = token.unixSeconds
            _ = token.successor
        }
    }

    // MARK: - JSON

    /// Random JSON trees (depth at most `depth`), built as values so the round trip can be checked.
    static func jsonTree(depth: Int) -> Generator<JSONValue, Shrink.None<JSONValue>> {
        Generator<JSONValue, Shrink.None<JSONValue>> { rng in jsonValue(depth, &rng) }
    }

    private static func jsonValue(_ remaining: Int, _ rng: inout any SeededRandomNumberGenerator) -> JSONValue {
        switch rng.next() % (remaining > 0 ? 7 : 5) {
        case 0: return .null
        case 1: return .bool(rng.next() % 2 == 0)
        case 2:
            let numbers = ["0", "-0", "1.5", "-1e-7", "12345678901234567890", "1E+400", "3", "-42.0e2"]
            return .number(JSONValue.Number(text: numbers[Int(rng.next() % UInt64(numbers.count))])!)
        case 3:
            let pool = Array("ab\"\\/\u{0}\u{1F}é€\u{1F600}\n ")
            var text = ""
            for _ in 0..<Int(rng.next() % 6) { text.append(pool[Int(rng.next() % UInt64(pool.count))]) }
            return .string(text)
        case 4: return .number(JSONValue.Number(Int64(truncatingIfNeeded: rng.next())))
        case 5:
            var items: [JSONValue] = []
            for _ in 0..<Int(rng.next() % 4) { items.append(jsonValue(remaining - 1, &rng)) }
            return .array(items)
        default:
            var members: [String: JSONValue] = [:]
            for i in 0..<Int(rng.next() % 4) { members["k\(i)\(rng.next() % 3)"] = jsonValue(remaining - 1, &rng) }
            return .object(members)
        }
    }

    @Test func jsonTreesRoundTripThroughTheValidatorAndParser() async {
        await propertyCheck(count: 1_000, input: Self.jsonTree(depth: 6)) { tree in
            let text = tree.jsonText
            let kind = try JSONText.validate(text)
            let expected: JSONText.Kind = switch tree {
            case .object: .object
            case .array: .array
            case .string: .string
            case .number: .number
            case .bool: .bool
            case .null: .null
            }
            #expect(kind == expected)
            #expect(try JSONValue(parsing: text) == tree)
        }
    }

    @Test func validatorAndParserAgreeOnArbitraryText() async {
        await propertyCheck(count: 5_000, input: RequestGen.text(RequestGen.jsonAlphabet, length: 0...24)) { text in
            let validated = Result { () throws(JSONText.Invalid) in try JSONText.validate(text) }
            let parsed = Result { () throws(JSONText.Invalid) in try JSONValue(parsing: text) }
            switch (validated, parsed) {
            case (.success, .success(let value)):
                // Accepted text re-serialises to text that is accepted again, as the same value.
                #expect((try? JSONValue(parsing: value.jsonText)) == value)
            case (.failure(let a), .failure(let b)):
                #expect(a == b, "\(text.debugDescription)")
                #expect(a.offset >= 0 && a.offset <= text.utf8.count)
            default:
                Issue.record("validator and parser disagree on \(text.debugDescription)")
            }
        }
    }

    @Test func nestingIsAcceptedExactlyUpToTheMaximumDepth() async {
        await propertyCheck(count: 300, input: Gen.int(in: 1...200), Gen.bool) { depth, objects in
            let open = objects ? String(repeating: "{\"a\":", count: depth) : String(repeating: "[", count: depth)
            let close = objects ? String(repeating: "}", count: depth) : String(repeating: "]", count: depth)
            let text = open + "1" + close
            let accepted = (try? JSONText.validate(text)) != nil
            #expect(accepted == (depth <= JSONText.maximumDepth), "depth \(depth)")
            #expect(((try? JSONValue(parsing: text)) != nil) == accepted)
        }
        // Far beyond the bound, unbalanced, or both: refused without exhausting the stack.
        for text in [String(repeating: "[", count: 200_000), String(repeating: "[", count: 100_000) + String(repeating: "]", count: 100_000),
                     String(repeating: "{\"\":", count: 50_000)] {
            #expect((try? JSONText.validate(text)) == nil)
            #expect((try? JSONValue(parsing: text)) == nil)
        }
    }

    // MARK: - Names

    static func referenceChannel(_ name: String, wildcard: Bool) -> Bool {
        let scalars = Array(name.unicodeScalars)
        guard !scalars.isEmpty, scalars.count <= 92, !scalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F || $0 == "," })
        else { return false }
        guard scalars.contains("*") else { return true }
        guard wildcard else { return false }
        // `prefix.*` with no other `*` and at most one dot in the prefix.
        let prefix = scalars.dropLast(2)
        return scalars.count > 2 && scalars.suffix(2) == [".", "*"] && !prefix.contains("*") && prefix.filter { $0 == "." }.count <= 1
    }

    @Test(arguments: ["a*\u{301}", "*\u{301}", "a.*\u{301}", "a.b.*", "a.b.c.*", ".*", "a.*", "*", "a**", "a.*.*", "é.*", "\u{1F600}.*"])
    func wildcardEdgeCasesFollowTheScalarRule(_ name: String) {
        #expect(((try? NameRules.validateChannel(name)) != nil) == Self.referenceChannel(name, wildcard: false), "\(name.debugDescription)")
        #expect(((try? NameRules.validateSubscribeChannel(name)) != nil) == Self.referenceChannel(name, wildcard: true),
                "\(name.debugDescription)")
    }

    @Test func nameRulesMatchTheDocumentedRules() async {
        let names = Gen<String>.frequency(
            (3, RequestGen.text("ab.*,-_\u{0}\u{7F}\u{1F}é\u{1F600} ", length: 0...8)),
            (1, RequestGen.text("a", length: 90...94)),
            (1, RequestGen.unicode(length: 0...100)))
        await propertyCheck(count: 3_000, input: names) { name in
            #expect(((try? NameRules.validateChannel(name)) != nil) == Self.referenceChannel(name, wildcard: false), "\(name.debugDescription)")
            #expect(((try? NameRules.validateGroup(name)) != nil) == Self.referenceChannel(name, wildcard: false))
            #expect(((try? NameRules.validateSubscribeChannel(name)) != nil) == Self.referenceChannel(name, wildcard: true),
                    "\(name.debugDescription)")
            let keyOK = !name.isEmpty && name.utf8.count <= 100
                && name.utf8.allSatisfy { $0 < 0x80 && (Character(UnicodeScalar($0)).isLetter || Character(UnicodeScalar($0)).isNumber || "._-".utf8.contains($0)) }
            #expect(NameRules.validateKey(name) == keyOK, "\(name.debugDescription)")
        }
    }

    // MARK: - Routes

    /// The highest path index each route's handler reads (`s[i]` or `pathNames(i)`).
    static func highestIndexRead(_ route: Route, method: HTTPRequest.Method, count: Int) -> Int {
        switch route {
        case .options, .time, .health, .metrics: 0
        case .publish, .signal: method == .post ? 4 : 6
        case .subscribe: 3
        case .history, .fetch, .historyWithActions, .deleteMessages, .messageCounts: 5
        case .hereNowGlobal: 3
        case .hereNow: count > 4 ? 5 : 3
        case .whereNow, .heartbeat, .leave: 5
        case .getState, .setState: 7
        case .groupList: 4
        case .groupChannels, .groupUpdate: 5
        case .groupDelete: 6
        case .grant, .audit: 4
        case .grantToken: 2
        case .revokeToken: 4
        case .getMessageActions: 4
        case .addMessageAction: 6
        case .removeMessageAction: 8
        case .getAllUserMetadata, .getAllChannelMetadata: 3
        case .getUserMetadata, .setUserMetadata, .removeUserMetadata, .getChannelMetadata, .setChannelMetadata, .removeChannelMetadata: 4
        case .getMemberships, .manageMemberships, .getChannelMembers, .manageChannelMembers: 5
        case .pushModify, .pushList: 5
        case .pushRemoveDevice: 6
        case .uploadFile: 4
        case .downloadFile: 6
        case .publishFileMessage: 8
        case .generateFileUploadURL, .listFiles: 5
        case .getFile, .deleteFile: 7
        }
    }

    @Test func everyClassifiedRouteHasTheSegmentsItsHandlerReads() async {
        let words = ["publish", "signal", "v1", "v2", "v3", "subscribe", "history", "history-with-actions", "sub-key", "channel",
                     "message-counts", "presence", "uuid", "heartbeat", "leave", "data", "channel-registration", "channel-group",
                     "remove", "auth", "grant", "audit", "pam", "time", "0", "health", "metrics", "demo", "", "%",
                     "message-actions", "message", "action", "objects", "uuids", "channels", "push", "devices", "devices-apns2",
                     "files", "upload", "download", "publish-file", "generate-upload-url"]
        let segments = Gen<String?>.element(of: words).map { $0! }.array(of: 0...10)
        let method = Gen<HTTPRequest.Method?>.element(of: [.get, .post, .delete, .put, .head, .options, .patch]).map { $0! }
        let query = Gen<String?>.element(of: ["", "channel-group=g", "add=a", "remove=r", "add=&remove="]).map { $0! }
        await propertyCheck(count: 5_000, input: segments, method, query) { segments, method, query in
            guard let wire = try? WireRequest(rawPath: "/" + segments.joined(separator: "/"), rawQuery: query) else { return }
            guard let route = Route.classify(method, wire.segments, wire) else { return }
            #expect(wire.segments.count > Self.highestIndexRead(route, method: method, count: wire.segments.count),
                    "\(route) from \(segments)")
        }
    }

    @Test func everyRouteIsReachableFromItsTemplate() throws {
        let templates: [Route: (HTTPRequest.Method, String, String)] = [
            .options: (.options, "/anything", ""), .time: (.get, "/time/0", ""),
            .publish: (.get, "/publish/p/s/0/c/0/1", ""), .signal: (.get, "/signal/p/s/0/c/0/1", ""),
            .subscribe: (.get, "/v2/subscribe/s/c/0", ""), .history: (.get, "/v2/history/sub-key/s/channel/c", ""),
            .fetch: (.get, "/v3/history/sub-key/s/channel/c", ""),
            .historyWithActions: (.get, "/v3/history-with-actions/sub-key/s/channel/c", ""),
            .messageCounts: (.get, "/v3/history/sub-key/s/message-counts/c", ""),
            .deleteMessages: (.delete, "/v3/history/sub-key/s/channel/c", ""),
            .hereNowGlobal: (.get, "/v2/presence/sub-key/s", ""), .hereNow: (.get, "/v2/presence/sub-key/s/channel/c", ""),
            .whereNow: (.get, "/v2/presence/sub-key/s/uuid/u", ""),
            .heartbeat: (.get, "/v2/presence/sub-key/s/channel/c/heartbeat", ""),
            .leave: (.get, "/v2/presence/sub-key/s/channel/c/leave", ""),
            .getState: (.get, "/v2/presence/sub-key/s/channel/c/uuid/u", ""),
            .setState: (.get, "/v2/presence/sub-key/s/channel/c/uuid/u/data", ""),
            .groupList: (.get, "/v1/channel-registration/sub-key/s/channel-group", ""),
            .groupChannels: (.get, "/v1/channel-registration/sub-key/s/channel-group/g", ""),
            .groupUpdate: (.get, "/v1/channel-registration/sub-key/s/channel-group/g", "add=c"),
            .groupDelete: (.get, "/v1/channel-registration/sub-key/s/channel-group/g/remove", ""),
            .grant: (.get, "/v2/auth/grant/sub-key/s", ""), .audit: (.get, "/v2/auth/audit/sub-key/s", ""),
            .grantToken: (.post, "/v3/pam/s/grant", ""), .revokeToken: (.delete, "/v3/pam/s/grant/t", ""),
            .health: (.get, "/health", ""), .metrics: (.get, "/metrics", ""),
            .getMessageActions: (.get, "/v1/message-actions/s/channel/c", ""),
            .addMessageAction: (.post, "/v1/message-actions/s/channel/c/message/1", ""),
            .removeMessageAction: (.delete, "/v1/message-actions/s/channel/c/message/1/action/2", ""),
            .getAllUserMetadata: (.get, "/v2/objects/s/uuids", ""), .getUserMetadata: (.get, "/v2/objects/s/uuids/u", ""),
            .setUserMetadata: (.patch, "/v2/objects/s/uuids/u", ""), .removeUserMetadata: (.delete, "/v2/objects/s/uuids/u", ""),
            .getMemberships: (.get, "/v2/objects/s/uuids/u/channels", ""),
            .manageMemberships: (.patch, "/v2/objects/s/uuids/u/channels", ""),
            .getAllChannelMetadata: (.get, "/v2/objects/s/channels", ""), .getChannelMetadata: (.get, "/v2/objects/s/channels/c", ""),
            .setChannelMetadata: (.patch, "/v2/objects/s/channels/c", ""),
            .removeChannelMetadata: (.delete, "/v2/objects/s/channels/c", ""),
            .getChannelMembers: (.get, "/v2/objects/s/channels/c/uuids", ""),
            .manageChannelMembers: (.patch, "/v2/objects/s/channels/c/uuids", ""),
            .pushModify: (.get, "/v2/push/sub-key/s/devices-apns2/t", "add=c&environment=production&topic=a.b"),
            .pushList: (.get, "/v1/push/sub-key/s/devices/t", "type=gcm"),
            .pushRemoveDevice: (.get, "/v1/push/sub-key/s/devices/t/remove", "type=apns"),
            .generateFileUploadURL: (.post, "/v1/files/s/channels/c/generate-upload-url", ""),
            .uploadFile: (.post, "/v1/files/upload/s/id", ""),
            .publishFileMessage: (.get, "/v1/files/publish-file/p/s/0/c/0/m", ""),
            .listFiles: (.get, "/v1/files/s/channels/c/files", ""),
            .getFile: (.get, "/v1/files/s/channels/c/files/id/n", ""),
            .downloadFile: (.get, "/v1/files/download/s/c/id/n", ""),
            .deleteFile: (.delete, "/v1/files/s/channels/c/files/id/n", ""),
        ]
        for route in Route.allCases {
            let (method, path, query) = try #require(templates[route], "no template for \(route)")
            let wire = try WireRequest(rawPath: path, rawQuery: query)
            #expect(Route.classify(method, wire.segments, wire) == route)
        }
    }
}
