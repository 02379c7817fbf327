import Testing
import TetherProtocol
import TetherServerCore

/// The multipart/form-data parser on its own: well-formed bodies fed in every split, and the
/// hostile cases (no boundary, endless headers, too many parts, garbage after a delimiter,
/// truncation, random bytes) answered with a failure, never a crash or an unbounded buffer.
@Suite struct MultipartParserTests {
    typealias Event = MultipartParser.Event

    static let contentType = "multipart/form-data; boundary=XyZ"

    static func form(_ parts: [(headers: String, body: String)], boundary: String = "XyZ", preamble: String = "") -> [UInt8] {
        var text = preamble
        for part in parts { text += "--\(boundary)\r\n\(part.headers)\r\n\r\n\(part.body)\r\n" }
        text += "--\(boundary)--\r\nepilogue"
        return Array(text.utf8)
    }

    /// Parses `bytes` fed in chunks of `chunk` bytes; adjacent body chunks are merged.
    static func parse(_ bytes: [UInt8], chunk: Int, contentType: String = contentType,
                      limits: MultipartParser.Limits = .init()) throws(MultipartParser.Failure) -> [Event] {
        var parser = try MultipartParser(contentType: contentType, limits: limits)
        var events: [Event] = []
        var start = 0
        while start < bytes.count {
            let end = min(start + chunk, bytes.count)
            events += try parser.feed(bytes[start..<end])
            start = end
        }
        events += try parser.finish()
        var merged: [Event] = []
        for event in events {
            if case .body(let more) = event, case .body(let some)? = merged.last {
                merged[merged.count - 1] = .body(some + more)
            } else {
                merged.append(event)
            }
        }
        return merged
    }

    static let sample = form([
        (headers: "Content-Disposition: form-data; name=\"key\"", body: "a/b"),
        (headers: "Content-Disposition: form-data; name=\"file\"; filename=\"x \\\"y\\\".txt\"\r\nContent-Type: text/plain",
         body: "line one\r\n--XyQ not a delimiter\r\n--Xy"),
    ], preamble: "ignored preamble\r\n")

    static let expected: [Event] = [
        .partStart(.init(name: "key")), .body(Array("a/b".utf8)), .partEnd,
        .partStart(.init(name: "file", filename: "x \"y\".txt", contentType: "text/plain")),
        .body(Array("line one\r\n--XyQ not a delimiter\r\n--Xy".utf8)), .partEnd, .end,
    ]

    @Test(arguments: [1, 2, 3, 5, 7, 16, 64, 4096])
    func aWellFormedBodyParsesTheSameInEveryChunking(_ chunk: Int) throws {
        #expect(try Self.parse(Self.sample, chunk: chunk) == Self.expected)
    }

    @Test func aBodyChunkIsHandedOnWithoutWaitingForTheEnd() throws {
        var parser = try MultipartParser(contentType: Self.contentType)
        let head = Array("--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\r\n".utf8)
        #expect(try parser.feed(head) == [.partStart(.init(name: "file", filename: "f"))])
        let events = try parser.feed([UInt8](repeating: 0x41, count: 10_000))
        // All but a delimiter's length (minus one) is released at once.
        #expect(events == [.body([UInt8](repeating: 0x41, count: 10_000 - "\r\n--XyZ".utf8.count + 1))])
        #expect(try parser.feed(Array("\r\n--XyZ--".utf8)) == [.body([UInt8](repeating: 0x41, count: 6)), .partEnd, .end])
        #expect(parser.isComplete)
    }

    @Test(arguments: ["text/plain", "multipart/form-data", "multipart/form-data; boundary=",
                      "multipart/mixed; boundary=a", "multipart/form-data; boundary=" + String(repeating: "b", count: 71)])
    func aContentTypeWithoutAUsableBoundaryIsRefused(_ contentType: String) {
        #expect(throws: MultipartParser.Failure.notMultipart) { try MultipartParser(contentType: contentType) }
    }

    @Test func aQuotedBoundaryIsRead() {
        #expect(MultipartParser.boundary(contentType: "Multipart/Form-Data; charset=utf-8; boundary=\"a b\"") == "a b")
    }

    @Test func endlessHeadersAreRefusedAtTheLimit() throws {
        var parser = try MultipartParser(contentType: Self.contentType, limits: .init(headerBytes: 100, parts: 4))
        _ = try parser.feed(Array("--XyZ\r\n".utf8))
        #expect(throws: MultipartParser.Failure.headersTooLarge) {
            for _ in 0..<10 { _ = try parser.feed([UInt8](repeating: 0x61, count: 20)) }
        }
    }

    @Test func tooManyPartsAreRefused() {
        let parts = (0..<5).map { (headers: "Content-Disposition: form-data; name=\"f\($0)\"", body: "v") }
        #expect(throws: MultipartParser.Failure.tooManyParts) {
            try Self.parse(Self.form(parts), chunk: 1000, limits: .init(headerBytes: 1000, parts: 4))
        }
    }

    @Test(arguments: [
        ("--XyZ\r\nContent-Disposition: form-data\r\n\r\nx\r\n--XyZ--", "no name"),
        ("--XyZ\r\nContent-Disposition: attachment; name=\"a\"\r\n\r\nx\r\n--XyZ--", "not form-data"),
        ("--XyZ\r\nno colon here\r\n\r\nx\r\n--XyZ--", "no colon"),
        ("--XyZ\r\nContent-Disposition: form-data; name=\"open\r\n\r\nx\r\n--XyZ--", "unterminated quote"),
        ("--XyZ\r\nContent-Disposition: form-data; name\r\n\r\nx\r\n--XyZ--", "parameter without value"),
        ("--XyZ\r\n\r\nx\r\n--XyZ--", "no headers at all"),
    ])
    func malformedHeadersAreRefused(_ body: String, _ what: String) {
        #expect(throws: (any Error).self, "\(what)") { try Self.parse(Array(body.utf8), chunk: 3) }
    }

    @Test func headersThatAreNotUTF8AreRefused() {
        let body: [UInt8] = Array("--XyZ\r\nContent-Disposition: form-data; name=\"".utf8) + [0xFF, 0xFE] + Array("\"\r\n\r\nx\r\n--XyZ--".utf8)
        #expect(throws: MultipartParser.Failure.malformedHeaders("headers are not UTF-8")) { try Self.parse(body, chunk: 4) }
    }

    @Test func garbageAfterADelimiterIsRefused() {
        #expect(throws: MultipartParser.Failure.malformedDelimiter) { try Self.parse(Array("--XyZgarbage".utf8), chunk: 2) }
    }

    @Test(arguments: ["", "--XyZ\r\n", "--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nhalf", "preamble only"])
    func aTruncatedBodyIsRefused(_ body: String) {
        #expect(throws: MultipartParser.Failure.truncated) { try Self.parse(Array(body.utf8), chunk: 5) }
    }

    @Test func anEmptyFormEnds() throws {
        #expect(try Self.parse(Array("--XyZ--\r\n".utf8), chunk: 1) == [.end])
    }

    @Test func bytesAfterTheEndAreIgnored() throws {
        var parser = try MultipartParser(contentType: Self.contentType)
        _ = try parser.feed(Array("--XyZ--".utf8))
        #expect(try parser.feed([UInt8](repeating: 0, count: 100_000)) == [])
    }

    /// Random bytes, and random corruptions of a valid body: the parser answers every one with
    /// events or a failure, and what it keeps buffered stays bounded.
    @Test func randomAndCorruptedBodiesNeverCrash() {
        var generator = SplitMix64(seed: 0x7E7E)
        for round in 0..<2000 {
            var bytes: [UInt8]
            if round % 2 == 0 {
                bytes = (0..<Int(generator.next() % 300)).map { _ in UInt8(truncatingIfNeeded: generator.next()) }
            } else {
                bytes = Self.sample
                for _ in 0..<(1 + Int(generator.next() % 4)) {
                    let at = Int(generator.next() % UInt64(bytes.count))
                    bytes[at] = [0x2D, 0x0D, 0x0A, 0x22, 0x3A, 0x3B, 0x00, 0xFF][Int(generator.next() % 8)]
                }
            }
            let chunk = 1 + Int(generator.next() % 40)
            _ = try? Self.parse(bytes, chunk: chunk)
        }
    }
}

