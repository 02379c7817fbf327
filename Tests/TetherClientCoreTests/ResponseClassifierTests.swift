import Testing
import TetherClientCore
@_spi(Benchmarks) import TetherProtocol

@Suite("Response classification (pubnub-wire §3, §13.2)")
struct ResponseClassifierTests {
    struct Case: Sendable, CustomTestStringConvertible {
        var status: Int
        var body: String
        var expected: StatusCategory?
        var testDescription: String { "\(status) \(body.prefix(40)) → \(expected.map { "\($0)" } ?? "success")" }
    }

    static let cases: [Case] = [
        Case(status: 200, body: "[17953281264739664]", expected: nil),
        Case(status: 200, body: "<html><body>Sign in to the Wi-Fi</body></html>", expected: .malformedResponse),
        Case(status: 200, body: "{\"t\":{\"t\":\"1795", expected: .malformedResponse),
        Case(status: 200, body: "", expected: .malformedResponse),
        Case(status: 302, body: "<html>moved</html>", expected: .malformedResponse),
        Case(status: 400, body: "[0,\"Invalid Key\",\"17953281264739664\"]", expected: .badRequest),
        Case(status: 400, body: "<html>bad</html>", expected: .badRequest),
        Case(status: 413, body: "[0,\"Message Too Large\",\"1\"]", expected: .badRequest),
        Case(status: 414, body: "{\"status\":414,\"error\":true,\"message\":\"Request URI Too Long\"}", expected: .badRequest),
        Case(status: 403, body: "{\"message\":\"Forbidden\",\"payload\":{\"channels\":[\"c1\"]},\"error\":true,\"status\":403}", expected: .accessDenied),
        Case(status: 481, body: "{\"status\":481,\"error\":true,\"message\":\"Invalid filter expression\"}", expected: .malformedFilterExpression),
        Case(status: 481, body: "", expected: .malformedFilterExpression),
        Case(status: 500, body: "{\"status\":500,\"error\":true,\"message\":\"Internal\"}", expected: .unknown),
        Case(status: 429, body: "{\"status\":429,\"error\":true,\"message\":\"Too Many Requests\"}", expected: .unknown),
        Case(status: 502, body: "<html>Bad Gateway</html>", expected: .malformedResponse),
        // A proxy's "access denied" page is not Access Manager's answer (seed 002).
        Case(status: 403, body: "<html><body>Access denied by the proxy</body></html>", expected: .malformedResponse),
        Case(status: 403, body: "", expected: .accessDenied),
        Case(status: 200, body: "{\"status\":403,\"error\":true,\"message\":\"Forbidden\"}", expected: .accessDenied),
        Case(status: 200, body: "{\"status\":200,\"error\":false}", expected: nil),
    ]

    @Test(arguments: cases)
    func classifies(_ c: Case) {
        switch ResponseClassifier.classify(statusCode: c.status, body: Array(c.body.utf8)) {
        case .success: #expect(c.expected == nil)
        case .failure(let category, _): #expect(category == c.expected)
        }
    }

    @Test func accessDeniedListsChannelsAndGroups() {
        let body = #"{"message":"Forbidden","payload":{"channels":["a","b"],"channel-groups":["g"]},"error":true,"service":"Access Manager","status":403}"#
        guard case .failure(.accessDenied, let details) = ResponseClassifier.classify(statusCode: 403, body: Array(body.utf8)) else {
            Issue.record("not access denied")
            return
        }
        #expect(details.deniedChannels == ["a", "b"])
        #expect(details.deniedGroups == ["g"])
        #expect(details.message == "Forbidden")
        #expect(details.service == "Access Manager")
    }

    @Test func errorMessageVariants() throws {
        let variants: [(String, String)] = [
            (#"{"error_message":"Invalid Arguments","error":true}"#, "Invalid Arguments"),
            (#"{"error":"Invalid type argument"}"#, "Invalid type argument"),
            (#"{"error":{"message":"Invalid ttl","source":"grant"}}"#, "Invalid ttl"),
            (#"[0,"Invalid JSON","1"]"#, "Invalid JSON"),
        ]
        for (body, message) in variants {
            let details = ResponseClassifier.decodeError(try JSONValue(parsing: body), statusCode: 400)
            #expect(details.message == message)
        }
    }

    @Test func transportFailureCategories() {
        #expect(TransportFailure.timedOut.category == .timeout)
        #expect(TransportFailure.connectionRefused.category == .networkIssues)
        #expect(TransportFailure.unreachable("x").category == .networkIssues)
        #expect(TransportFailure.tlsHandshakeFailed("x").category == .tlsConnectionFailed)
        #expect(TransportFailure.tlsUntrustedCertificate("x").category == .tlsUntrustedCertificate)
        #expect(TransportFailure.cancelled.category == .cancelled)
    }

    @Test func everyIssueCategoryExists() {
        let names = Set(StatusCategory.allCases.map(\.rawValue))
        for name in ["connected", "reconnected", "disconnected", "unexpectedDisconnect", "connectionError", "disconnectedUnexpectedly",
                     "accessDenied", "timeout", "networkIssues", "networkUp", "networkDown", "badRequest", "malformedFilterExpression",
                     "malformedResponse", "decryptionError", "tlsConnectionFailed", "tlsUntrustedCertificate",
                     "requestMessageCountExceeded", "unknown", "cancelled"] {
            #expect(names.contains(name), "missing \(name)")
        }
    }

    /// A message a server stored before it limited stored values to 48 levels (it took up to 64)
    /// is read inside its subscribe answer and its WebSocket frame: otherwise every read of its
    /// channel fails, and the SDK retries the same answer for ever. Deeper than the answer limit
    /// is still a malformed response.
    @Test func anAnswerCarryingAValueStoredBeforeTheValueLimitIsRead() throws {
        func nested(_ depth: Int) -> String { String(repeating: "[", count: depth) + String(repeating: "]", count: depth) }
        func envelope(_ payload: String) -> String {
            #"{"a":"1","f":0,"i":"p","p":{"t":"17000000000000000001","r":1},"k":"demo","c":"ch","d":"# + payload + "}"
        }
        let legacy = nested(JSONText.maximumDepth)
        let answer = #"{"t":{"t":"17000000000000000001","r":1},"m":["# + envelope(legacy) + "]}"
        guard case .success(let value) = ResponseClassifier.classify(statusCode: 200, body: Array(answer.utf8)) else {
            Issue.record("a subscribe answer carrying a 64-deep message was not read")
            return
        }
        #expect(value["m"]?[0]?["d"]?.nestingDepth == JSONText.maximumDepth)

        let frame = #"{"type":"messages","t":{"t":"17000000000000000001","r":1},"m":["# + envelope(legacy) + "]}"
        guard case .messages(let response, _) = try SessionFrame.read(frame) else {
            Issue.record("not read as messages")
            return
        }
        #expect(response.events.first?.payload.nestingDepth == JSONText.maximumDepth)

        // Beyond the answer limit: refused, and bounded.
        let tooDeep = #"{"t":{"t":"1","r":1},"m":["# + envelope(nested(JSONText.maximumAnswerDepth)) + "]}"
        guard case .failure(let category, _) = ResponseClassifier.classify(statusCode: 200, body: Array(tooDeep.utf8)) else {
            Issue.record("an answer deeper than the answer limit was read")
            return
        }
        #expect(category == .malformedResponse)
        #expect(throws: SessionFrame.Malformed.self) {
            try SessionFrame.read(#"{"type":"messages","t":{"t":"1","r":1},"m":["# + envelope(nested(JSONText.maximumAnswerDepth)) + "]}")
        }
    }
}
