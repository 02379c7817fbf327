import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import NIOEmbedded
import NIOHTTP1
import NIOHTTPTypes
import NIOHTTPTypesHTTP1
import Logging
import Synchronization
import Testing
import TetherServerCore

@testable import TetherServer

/// `HotRequestHead` (what the reader takes from a connection's bytes and what it leaves to NIO's
/// parser) and `HotRequestReader` in an embedded pipeline with NIO's real decoder and encoder
/// behind it: answers in request order, byte for byte what NIO's encoder writes, and the hand-over
/// to NIO's decoder at the first request it does not take. The whole server through it is
/// covered by every other server test and the conformance suite (its hostile-request tests
/// among them).
@Suite struct HotRequestReaderTests {
    // MARK: The head

    static func parse(_ text: String, maxBody: Int = 1024) -> HotRequestHead.Parse {
        parse(Array(text.utf8), maxBody: maxBody)
    }

    static func parse(_ bytes: [UInt8], maxBody: Int = 1024) -> HotRequestHead.Parse {
        bytes.withUnsafeBytes { HotRequestHead.parse($0, maxBodyBytes: maxBody) }
    }

    @Test func aPlainHotRequestIsTakenWithItsFieldsAndLengths() throws {
        let text = "GET /v2/subscribe/demo/ch/0?tt=0&uuid=u%201 HTTP/1.1\r\nHost: example.com:80\r\nUser-Agent:  PubNub-Python/10 \r\n"
            + "accept-encoding:gzip\r\nConnection: Keep-Alive\r\n\r\nGET /next"
        guard case .request(let head, let headBytes, let bodyBytes) = Self.parse(text) else {
            Issue.record("not taken: \(Self.parse(text))")
            return
        }
        #expect(head.method == .get)
        #expect(head.path == "/v2/subscribe/demo/ch/0?tt=0&uuid=u%201")
        #expect(head.authority == "example.com:80")
        #expect(head.scheme == "http")
        // Host is the authority (as NIO's conversion makes it); values without the whitespace
        // around them; names as sent.
        #expect(head.headerFields[HTTPField.Name("Host")!] == nil)
        #expect(head.headerFields[.userAgent] == "PubNub-Python/10")
        #expect(head.headerFields[.acceptEncoding] == "gzip")
        #expect(head.headerFields[.connection] == "Keep-Alive")
        #expect(head.headerFields.map(\.name.rawName) == ["User-Agent", "accept-encoding", "Connection"])
        #expect(headBytes == text.utf8.count - "GET /next".utf8.count)
        #expect(bodyBytes == 0)
    }

    @Test func aPostPublishDeclaresItsBodyAndCloseIsReadInAnySpelling() {
        let text = "POST /publish/p/s/0/ch/0?uuid=u HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 7\r\nConnection: Close\r\n\r\n"
        guard case .request(let head, let headBytes, let bodyBytes) = Self.parse(text + "\"hello\"") else {
            Issue.record("not taken")
            return
        }
        #expect(head.method == .post)
        #expect(head.headerFields[.contentLength] == "7")
        #expect(head.headerFields[.connection] == "close", "the hot path closes after exactly `close`")
        #expect(headBytes == text.utf8.count)
        #expect(bodyBytes == 7)
        // The head alone is enough: the reader waits for the body.
        #expect(Self.parse(text) == .request(head, headBytes: headBytes, bodyBytes: 7))
    }

    @Test func everyPrefixOfARequestIsIncomplete() {
        let text = "POST /publish/p/s/0/ch/0 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nX-Empty:\r\n\r\n"
        let bytes = Array(text.utf8)
        for end in 1..<bytes.count {
            #expect(Self.parse(Array(bytes[..<end])) == .incomplete, "prefix of \(end) bytes")
        }
        if case .request = Self.parse(bytes) {} else { Issue.record("the whole head is not taken") }
    }

    /// Everything the reader leaves to NIO's parser, which then reads the connection: not hot,
    /// not plain, or not what the reader can frame with certainty.
    @Test(arguments: [
        // Other methods, versions, routes and target forms.
        "PUT /publish/p/s/0/ch/0/1 HTTP/1.1\r\n\r\n",
        "HEAD /time/0 HTTP/1.1\r\n\r\n",
        "get /time/0 HTTP/1.1\r\n\r\n",
        "GET /time/0 HTTP/1.0\r\n\r\n",
        "GET /time/0 HTTP/2.0\r\n\r\n",
        "HEAD /v2/history/sub-key/s/channel/ch HTTP/1.1\r\n\r\n",
        "POST /v2/objects/s/uuids/u HTTP/1.1\r\nContent-Length: 2\r\n\r\n",
        "PATCH /v2/objects/s/uuids/u HTTP/1.1\r\nContent-Length: 2\r\n\r\n",
        "DELETE /v2/objects/s/uuids/u HTTP/1.1\r\nContent-Length: 2\r\n\r\n",
        "GET /v2/history/sub-key/s/channel/ch HTTP/1.1\r\nContent-Length: 1\r\n\r\n",
        "GET /v2/ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        "DELETE /publish/p/s/0/ch/0/1 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
        "POST /v2/subscribe/s/ch/0 HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        "GET http://x/time/0 HTTP/1.1\r\n\r\n",
        "GET  /time/0 HTTP/1.1\r\n\r\n",
        "GET /time/0  HTTP/1.1\r\n\r\n",
        "GET /time/\u{7F}0 HTTP/1.1\r\n\r\n",
        // Framing the reader does not take.
        "POST /publish/p/s/0/ch/0 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
        "POST /publish/p/s/0/ch/0 HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        "POST /publish/p/s/0/ch/0 HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
        "POST /publish/p/s/0/ch/0 HTTP/1.1\r\nContent-Length: +1\r\n\r\n",
        "POST /publish/p/s/0/ch/0 HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        "POST /publish/p/s/0/ch/0 HTTP/1.1\r\nContent-Length: 1 1\r\n\r\n",
        "POST /publish/p/s/0/ch/0 HTTP/1.1\r\nContent-Length: 0x10\r\n\r\n",
        "POST /publish/p/s/0/ch/0 HTTP/1.1\r\nContent-Length: 1234567890123456\r\n\r\n",
        "POST /publish/p/s/0/ch/0 HTTP/1.1\r\nContent-Length: 1025\r\n\r\n",
        "POST /publish/p/s/0/ch/0 HTTP/1.1\r\n\r\n",
        "GET /time/0 HTTP/1.1\r\nContent-Length: 5\r\n\r\n",
        "POST /publish/p/s/0/ch/0 HTTP/1.1\r\nContent-Length: 1\r\nExpect: 100-continue\r\n\r\n",
        "GET /time/0 HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
        "GET /time/0 HTTP/1.1\r\nConnection: close, te\r\n\r\n",
        "GET /time/0 HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        // Lines the grammar here does not have.
        "GET /time/0 HTTP/1.1\nHost: x\r\n\r\n",
        "GET /time/0 HTTP/1.1\r\nHost: x\n\r\n",
        "GET /time/0 HTTP/1.1\r\nHost: x\r\n\n",
        "GET /time/0 HTTP/1.1\r\nHost: x\r\n\rX",
        "GET /time/0 HTTP/1.1\r\nX-A: 1\r\n  folded\r\n\r\n",
        "GET /time/0 HTTP/1.1\r\nHost : x\r\n\r\n",
        "GET /time/0 HTTP/1.1\r\n: x\r\n\r\n",
        "GET /time/0 HTTP/1.1\r\nX(A): x\r\n\r\n",
        "GET /time/0 HTTP/1.1\r\nX-A: a\u{7F}b\r\n\r\n",
        "GET /time/0 HTTP/1.1\r\nX-A: a\u{0}b\r\n\r\n",
        "GET /time/0 HTTP/1.1\r\nX-A: a\rb\r\n\r\n",
        "\u{0}GET /time/0 HTTP/1.1\r\n\r\n",
        "\r\nGET /time/0 HTTP/1.1\r\n\r\n",
    ])
    func whatTheReaderLeavesToNIO(_ text: String) {
        #expect(Self.parse(text) == .handOver)
    }

    @Test func bytesOutsideASCIIAndOverlongHeadsAreLeftToNIO() {
        // obs-text in a value, and a byte over 0x7E in the target.
        #expect(Self.parse(Array("GET /time/0 HTTP/1.1\r\nX-Name: caf".utf8) + [0xC3, 0xA9] + Array("\r\n\r\n".utf8)) == .handOver)
        #expect(Self.parse(Array("GET /time/".utf8) + [0xFF] + Array(" HTTP/1.1\r\n\r\n".utf8)) == .handOver)
        // A head longer than the reader reads, whole or not yet.
        let long = "GET /time/0 HTTP/1.1\r\nX-Big: " + String(repeating: "a", count: HotRequestHead.maxHeadBytes) + "\r\n\r\n"
        #expect(Self.parse(long) == .handOver)
        #expect(Self.parse(String(long.prefix(HotRequestHead.maxHeadBytes + 10))) == .handOver)
        // More fields than it reads.
        let many = "GET /time/0 HTTP/1.1\r\n" + (0...HotRequestHead.maxFields).map { "X-\($0): 1\r\n" }.joined() + "\r\n"
        #expect(Self.parse(many) == .handOver)
        let enough = "GET /time/0 HTTP/1.1\r\n" + (1...HotRequestHead.maxFields).map { "X-\($0): 1\r\n" }.joined() + "\r\n"
        if case .request = Self.parse(enough) {} else { Issue.record("\(HotRequestHead.maxFields) fields are read") }
    }

    /// The same bytes through NIO's decoder, followed by a second request: where the reader
    /// takes a request, NIO reads one request with the same method, target, fields, body length
    /// and persistence, and the next request right after it (the two never disagree on where a
    /// request ends); where NIO refuses a head or reads it as ending the connection otherwise,
    /// the reader hands over.
    @Test(arguments: [
        ("GET /time/0 HTTP/1.1\r\nHost: x\r\n\r\n", "take"),
        ("GET /v2/subscribe/s/a%2Cb,c/0?tt=1&tr=2#f HTTP/1.1\r\nHost: x\r\nX-Tab:\tv\t\r\nContent-Length: 0\r\n\r\n", "take"),
        ("POST /publish/p/s/0/ch/0 HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\n[1]", "take"),
        ("POST /publish/p/s/0/ch/0 HTTP/1.1\r\nContent-Length: 0\r\n\r\n", "take"),
        ("POST /publish/p/s/0/ch/0 HTTP/1.1\r\nContent-Length:   003  \r\n\r\n[1]", "take"),
        ("GET /time/0 HTTP/1.1\r\nConnection: close\r\n\r\n", "take"),
        ("GET /time/0 HTTP/1.1\r\nConnection: CLOSE\r\n\r\n", "take"),
        ("GET /time/0 HTTP/1.1\r\nConnection: keep-alive\r\n\r\n", "take"),
        ("GET /time/0 HTTP/1.1\r\nX-A: !#$%&'*+-.^_`|~\r\n\r\n", "take"),
        // Handed over: NIO reads these as ending the connection, or refuses them.
        ("GET /time/0 HTTP/1.1\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n", "hand"),
        ("GET /time/0 HTTP/1.1\r\nConnection: close\r\nConnection: close\r\n\r\n", "hand"),
        ("GET /time/0 HTTP/1.1\r\nProxy-Connection: close\r\n\r\n", "hand"),
        ("POST /publish/p/s/0/ch/0 HTTP/1.1\r\nContent-Length: 3\t\r\n\r\n[1]", "hand"),
        ("POST /publish/p/s/0/ch/0 HTTP/1.1\r\nContent-Length:\t3\r\n\r\n[1]", "hand"),
        ("GET /time/0 HTTP/1.1\r\nContent-Length: 0\t\r\n\r\n", "hand"),
        ("GET /time/0 HTTP/1.1\r\nContent-Length: 00\r\n\r\n", "hand"),
        // Passed on: plain GETs and DELETEs to other routes.
        ("GET /v2/history/sub-key/s/channel/ch?count=2 HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n", "pass"),
        ("DELETE /v1/message-actions/s/channel/ch/message/1/action/2 HTTP/1.1\r\nhost: y\r\nContent-Length: 0\r\n\r\n", "pass"),
        ("GET /v2/presence/sub-key/s/channel/ch/leave HTTP/1.1\r\nConnection: Close\r\n\r\n", "pass"),
        ("GET /v2/presence/sub-key/s/channel/ch/heartbeat HTTP/1.1\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n", "hand"),
        ("DELETE /publish/p/s/0/ch/0/1 HTTP/1.1\r\n\r\n", "pass"),
    ])
    func whatTheReaderTakesNIOsParserTakesTheSameWay(_ text: String, _ expected: String) throws {
        let channel = EmbeddedChannel(handler: ByteToMessageHandler(HTTPRequestDecoder()))
        defer { _ = try? channel.finish() }
        var parts: [HTTPServerRequestPart] = []
        var refused = false
        do {
            try channel.writeInbound(ByteBuffer(string: text + "GET /time/1 HTTP/1.1\r\n\r\n"))
        } catch {
            refused = true
        }
        while let part = try? channel.readInbound(as: HTTPServerRequestPart.self) { parts.append(part) }
        switch (Self.parse(text), expected) {
        case (.request, "take"), (.passOn, "pass"), (.handOver, "hand"): break
        default: Issue.record("expected \(expected), read \(Self.parse(text))")
        }
        if case .passOn(let head, let headBytes) = Self.parse(text) {
            // Passed on as NIO's decoder passes it on (`close` marked as the hot path marks it).
            guard case .head(var nio) = parts.first else {
                Issue.record("NIO read no head")
                return
            }
            HotPathHandler.markNonPersistent(&nio)
            #expect(head.method == nio.method)
            #expect(head.uri == nio.uri)
            #expect(head.version == nio.version)
            // Names compare in any case (the mark spells `connection` in lower case).
            #expect(head.headers.map { "\($0.name.lowercased()): \($0.value)" } == nio.headers.map { "\($0.name.lowercased()): \($0.value)" })
            #expect(head.isKeepAlive == nio.isKeepAlive)
            #expect(refused == !nio.isKeepAlive)
            #expect(headBytes == text.utf8.count)
            // NIO frames it the same way: a head and its end, no body, and the next request.
            let kinds = parts.map { part -> String in
                switch part {
                case .head(let head): "head \(head.uri)"
                case .body: "body"
                case .end: "end"
                }
            }
            #expect(kinds == ["head \(head.uri)", "end"] + (nio.isKeepAlive ? ["head /time/1", "end"] : []))
            return
        }
        guard case .request(let head, let headBytes, let bodyBytes) = Self.parse(text) else {
            #expect(Self.parse(text) == .handOver, "a whole head is taken, passed on or handed over")
            return
        }
        guard case .head(let nio) = parts.first else {
            Issue.record("NIO read no head")
            return
        }
        // After a request that ends the connection NIO refuses what follows (as the reader
        // reads nothing after it); otherwise it refuses nothing.
        #expect(refused == !nio.isKeepAlive)
        #expect(nio.method.rawValue == head.method.rawValue)
        #expect(nio.uri == head.path)
        #expect(nio.isKeepAlive == (head.headerFields[.connection] != "close"), "the same persistence")
        // What the hot path made of NIO's head (`close` in any spelling marked exactly so).
        var marked = nio
        HotPathHandler.markNonPersistent(&marked)
        let converted = try HTTPRequest(marked, secure: false, splitCookie: false)
        #expect(converted.headerFields.map(\.value) == head.headerFields.map(\.value))
        #expect(converted.headerFields.map(\.name) == head.headerFields.map(\.name))
        #expect(converted.authority == head.authority)
        let body = parts.reduce(0) { if case .body(let buffer) = $1 { $0 + buffer.readableBytes } else { $0 } }
        #expect(body == bodyBytes)
        #expect(headBytes + bodyBytes == text.utf8.count)
        // Its end is where the reader's request ends: NIO reads the next request right after it.
        let heads = parts.compactMap { if case .head(let head) = $0 { head.uri } else { nil } }
        if nio.isKeepAlive { #expect(heads == [head.path!, "/time/1"]) }
    }

    @Test(arguments: [200, 204, 304, 400, 403, 404, 413, 414, 429, 500, 503])
    func anAnswerIsWhatNIOsEncoderWritesWithItsFramingFields(_ code: Int) throws {
        let text = code == 204 || code == 304 ? "" : "[1,\"Sent\"]\n"
        let date = "Fri, 27 Nov 2026 22:05:01 GMT"
        var head = HTTPResponse(status: .init(code: code))
        head.headerFields[.contentType] = "text/javascript; charset=\"UTF-8\""
        head.headerFields[.cacheControl] = "no-cache"
        var body = ByteBuffer(string: text)
        let ours = HotRequestHead.encode(head, body: &body, date: date, allocator: ByteBufferAllocator())
        #expect(body.readableBytes == 0, "a small body goes in the same buffer")

        // NIO's encoder, given the head as the hot path hands it over after a connection's
        // hand-over (``HotRequestHead/framed(_:bodyLength:date:)``), writes the same bytes; and
        // so does it given the fields set as the response's own, as they were before.
        var own = head
        own.headerFields[.contentLength] = String(text.utf8.count)
        own.headerFields[.date] = date
        for given in [HotRequestHead.framed(head, bodyLength: text.utf8.count, date: date), HTTPResponseHead(own)] {
            #expect(String(buffer: ours) == (try Self.nioEncoded(given, body: text)))
        }
    }

    @Test func aResponsesOwnLengthAndDateAreNotWrittenTheAnswersAre() {
        var head = HTTPResponse(status: .ok)
        head.headerFields[.contentLength] = "999"
        head.headerFields[.contentType] = "text/plain"
        head.headerFields[.date] = "Thu, 01 Jan 1970 00:00:00 GMT"
        var body = ByteBuffer(string: "hello")
        let out = HotRequestHead.encode(head, body: &body, date: "Sat, 28 Nov 2026 04:30:00 GMT", allocator: ByteBufferAllocator())
        #expect(String(buffer: out) == "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nDate: Sat, 28 Nov 2026 04:30:00 GMT\r\n\r\nhello")
    }

    /// What NIO's HTTP/1 encoder writes for `head` and `body`.
    static func nioEncoded(_ head: HTTPResponseHead, body text: String) throws -> String {
        let channel = EmbeddedChannel(handler: HTTPResponseEncoder())
        defer { _ = try? channel.finish() }
        try channel.writeOutbound(HTTPServerResponsePart.head(head))
        if !text.isEmpty { try channel.writeOutbound(HTTPServerResponsePart.body(.byteBuffer(ByteBuffer(string: text)))) }
        try channel.writeOutbound(HTTPServerResponsePart.end(nil))
        var theirs = ByteBuffer()
        while let part = try channel.readOutbound(as: IOData.self) {
            guard case .byteBuffer(var buffer) = part else { continue }
            theirs.writeBuffer(&buffer)
        }
        return String(buffer: theirs)
    }

    @Test func aLargeBodyIsWrittenAfterTheHeadNotCopiedIntoIt() {
        let head = HTTPResponse(status: .ok)
        var body = ByteBuffer(repeating: UInt8(ascii: "a"), count: 20000)
        let out = HotRequestHead.encode(head, body: &body, date: "Sat, 28 Nov 2026 04:30:00 GMT", allocator: ByteBufferAllocator())
        #expect(String(buffer: out) == "HTTP/1.1 200 OK\r\nContent-Length: 20000\r\nDate: Sat, 28 Nov 2026 04:30:00 GMT\r\n\r\n")
        #expect(body.readableBytes == 20000)
    }

    // MARK: The reader in a pipeline

    /// A `200` with `text` as its plain-text body (`closing`: marked `Connection: close`), as
    /// every answer in these tests is.
    static func textAnswer(_ text: String, closing: Bool = false) -> (HTTPResponse, ByteBuffer) {
        var head = HTTPResponse(status: .ok)
        head.headerFields[.contentType] = "text/plain"
        if closing { head.headerFields[.connection] = "close" }
        return (head, ByteBuffer(string: text))
    }

    /// Answers `200` with the request's path (and its body, if any) as the body; with `held`,
    /// waits until released.
    final class Answers: Sendable {
        let answered = Mutex<[String]>([])
        let gate = Mutex<(held: Bool, waiting: [CheckedContinuation<Void, Never>])>((false, []))

        func release() {
            let waiting = gate.withLock { state in
                state.held = false
                defer { state.waiting = [] }
                return state.waiting
            }
            for continuation in waiting { continuation.resume() }
        }

        var answer: HotPathHandler.Answer {
            { request, _, _ in
                await withCheckedContinuation { continuation in
                    let held = self.gate.withLock { state in
                        if state.held { state.waiting.append(continuation) }
                        return state.held
                    }
                    if !held { continuation.resume() }
                }
                var text = request.uri.string
                if request.method == .post {
                    let body = try? await request.body.collect(upTo: 1024)
                    text += " " + (body.map { String(buffer: $0) } ?? "")
                }
                self.answered.withLock { $0.append(text) }
                return HotRequestReaderTests.textAnswer(text)
            }
        }
    }

    /// Where Hummingbird's side would go: records the request heads NIO's decoder passes on.
    final class Behind: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = HTTPServerRequestPart
        var heads: [String] = []
        var ends = 0
        /// Parts passed on, and read completions, in order (`+`: a completion).
        var events = ""
        var context: ChannelHandlerContext?
        func handlerAdded(context: ChannelHandlerContext) { self.context = context }
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            switch unwrapInboundIn(data) {
            case .head(let head):
                heads.append(head.uri)
                events += "h"
            case .body: events += "b"
            case .end:
                ends += 1
                events += "e"
            }
        }
        func channelReadComplete(context: ChannelHandlerContext) { events += "+" }
    }

    struct Connection {
        let channel: EmbeddedChannel
        let reader: HotRequestReader
        let hotPath: HotPathHandler
        let behind: Behind
        let reads: HotPathTests.Reads

        /// Everything written to the client so far, with each answer's `Date` field (the time it was written) checked
        /// for its form and taken out, so that answers compare as text.
        func written() throws -> String {
            var out = ""
            while let part = try channel.readOutbound(as: IOData.self) {
                guard case .byteBuffer(let buffer) = part else { continue }
                out += String(buffer: buffer)
            }
            return try HotRequestReaderTests.withoutDates(out)
        }

        var readerInPipeline: Bool { (try? channel.pipeline.syncOperations.context(handler: reader)) != nil }

        /// Hummingbird's answer to a request passed on, through NIO's encoder.
        func answerPassedOn(_ status: HTTPResponseStatus = .ok, body: String = "") throws {
            try channel.writeOutbound(HTTPServerResponsePart.head(HTTPResponseHead(version: .http1_1, status: status,
                                                                                    headers: ["Content-Length": String(body.utf8.count)])))
            if !body.isEmpty { try channel.writeOutbound(HTTPServerResponsePart.body(.byteBuffer(ByteBuffer(string: body)))) }
            try channel.writeOutbound(HTTPServerResponsePart.end(nil))
        }
    }

    /// The server's connection pipeline (``TetherHTTPChannel``): the reader, NIO's encoder and
    /// decoder, the hot path, and a recorder where Hummingbird's side would go.
    func connection(_ answers: Answers) throws -> Connection {
        try connection(answer: answers.answer)
    }

    func connection(answer: @escaping HotPathHandler.Answer) throws -> Connection {
        let channel = EmbeddedChannel()
        let pipeline = channel.pipeline.syncOperations
        let reads = HotPathTests.Reads()
        let hotPath = HotPathHandler(maxBodyBytes: 1024, idleTimeout: .seconds(310), answer: answer)
        let reader = HotRequestReader(hotPath: hotPath)
        let behind = Behind()
        try pipeline.addHandler(reads)
        try pipeline.addHandler(reader)
        try pipeline.addHandler(HTTPResponseEncoder())
        try pipeline.addHandler(ByteToMessageHandler(HTTPRequestDecoder(leftOverBytesStrategy: .forwardBytes)))
        try pipeline.addHandler(hotPath)
        try pipeline.addHandler(behind)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        return Connection(channel: channel, reader: reader, hotPath: hotPath, behind: behind, reads: reads)
    }

    /// `text` without its `Date: …\r\n` fields, each checked to be an IMF-fixdate
    /// (`Sat, 28 Nov 2026 04:30:00 GMT`, RFC 9110 §5.6.7).
    static func withoutDates(_ text: String) throws -> String {
        let bytes = Array(text.utf8), field = Array("\r\nDate: ".utf8)
        var out: [UInt8] = [], index = 0
        while index < bytes.count {
            guard bytes[index...].starts(with: field) else {
                out.append(bytes[index])
                index += 1
                continue
            }
            // `\r\nDate: ` + 29 bytes + `\r\n` becomes `\r\n`.
            let value = String(decoding: bytes[min(index + field.count, bytes.count)..<min(index + field.count + 29, bytes.count)], as: UTF8.self)
            let parts = value.split(separator: " ")
            try #require(value.utf8.count == 29 && parts.count == 6 && parts[0].hasSuffix(",") && parts[5] == "GMT"
                         && bytes[(index + field.count + 29)...].starts(with: Array("\r\n".utf8)), "a Date field: \(value)")
            out += Array("\r\n".utf8)
            index += field.count + 29 + 2
        }
        return String(decoding: out, as: UTF8.self)
    }

    static func answer(_ text: String) -> String {
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: \(text.utf8.count)\r\n\r\n\(text)"
    }

    @Test func pipelinedHotRequestsAreAnsweredInOrderWhateverTheReadsCutThemInto() throws {
        let requests = "GET /time/0 HTTP/1.1\r\nHost: x\r\n\r\n"
            + "POST /publish/p/s/0/ch/0 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n[1,2]"
            + "GET /v2/subscribe/s/ch/0?tt=0 HTTP/1.1\r\nHost: x\r\n\r\n"
        let expected = Self.answer("/time/0") + Self.answer("/publish/p/s/0/ch/0 [1,2]") + Self.answer("/v2/subscribe/s/ch/0?tt=0")
        let bytes = Array(requests.utf8)
        for size in [1, 2, 3, 7, 16, 50, bytes.count] {
            let answers = Answers()
            let connection = try connection(answers)
            var written = ""
            for start in stride(from: 0, to: bytes.count, by: size) {
                try connection.channel.writeInbound(ByteBuffer(bytes: bytes[start..<min(start + size, bytes.count)]))
                connection.channel.embeddedEventLoop.run()
                written += try connection.written()
            }
            #expect(written == expected, "reads of \(size) bytes")
            #expect(connection.behind.heads.isEmpty, "nothing reached NIO's decoder")
            #expect(connection.readerInPipeline)
            _ = try connection.channel.finish()
        }
    }

    /// Whether hot answers start within the read (`Task.immediate`; before macOS 26 and its
    /// siblings they start on the loop's next turn, as a task of their own).
    static var answersStartAtOnce: Bool {
        if #available(macOS 26.0, iOS 26.0, tvOS 26.0, watchOS 26.0, visionOS 26.0, *) { true } else { false }
    }

    @Test(.enabled(if: answersStartAtOnce))
    func answersFoundWithoutWaitingAreWrittenWithinTheReadInOrderWithoutRecursion() throws {
        // An answer that never suspends (a subscribe with its messages in memory, a `store=0`
        // publish, `time`): written within the read that brought its request, with no trip
        // through the loop's queue, and the reader reads on in a loop, not by recursing once
        // per pipelined request (a few thousand in one read overflowed the stack).
        let depths = Mutex<[Int]>([])
        let connection = try connection { request, _, _ in
            depths.withLock { $0.append(Thread.callStackReturnAddresses.count) }
            let text = request.uri.string
            return HotRequestReaderTests.textAnswer(text)
        }
        let count = 300
        let requests = (0..<count).map { "GET /time/\($0) HTTP/1.1\r\nHost: x\r\n\r\n" }.joined()
        try connection.channel.writeInbound(ByteBuffer(string: requests))
        // Not a turn of the loop yet: every answer is already out.
        #expect(try connection.written() == (0..<count).map { Self.answer("/time/\($0)") }.joined())
        let seen = depths.withLock { $0 }
        #expect(seen.count == count)
        #expect(Set(seen).count == 1, "the stack is as deep for the last request as for the first: \(seen.first ?? 0) → \(seen.last ?? 0) frames")
        #expect(connection.readerInPipeline)
        // A request it does not take, behind answers written within the read: NIO's decoder
        // gets it after them.
        try connection.channel.writeInbound(ByteBuffer(string: "GET /time/a HTTP/1.1\r\n\r\nGET /x HTTP/1.0\r\n\r\n"))
        #expect(try connection.written() == Self.answer("/time/a"))
        #expect(connection.behind.heads == ["/x"])
        #expect(!connection.readerInPipeline)
        _ = try connection.channel.finish()
    }

    @Test(.enabled(if: answersStartAtOnce))
    func afterAHandOverRequestsHeldBehindAnAnswerAreAnsweredInOrderWithoutRecursion() throws {
        // NIO's decoder reads the connection (HTTP/1.0 first); hot requests held behind an
        // answer that waits are answered, when it comes, in the hot path's replay loop, each
        // written within it (none waits), not in a replay nested inside the one before.
        let gate = Mutex<CheckedContinuation<Void, Never>?>(nil)
        let depths = Mutex<[Int]>([])
        let connection = try connection { request, _, _ in
            let text = request.uri.string
            if text == "/time/hold" {
                await withCheckedContinuation { continuation in gate.withLock { $0 = continuation } }
            } else {
                depths.withLock { $0.append(Thread.callStackReturnAddresses.count) }
            }
            return HotRequestReaderTests.textAnswer(text)
        }
        let count = 300
        let requests = "GET /time/hold HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
            + (0..<count).map { "GET /time/\($0) HTTP/1.1\r\nHost: x\r\n\r\n" }.joined()
        try connection.channel.writeInbound(ByteBuffer(string: requests))
        connection.channel.embeddedEventLoop.run()
        #expect(!connection.readerInPipeline, "HTTP/1.0 is NIO's")
        #expect(try connection.written() == "")
        let waiting = try #require(gate.withLock { $0.take() })
        waiting.resume()
        connection.channel.embeddedEventLoop.run()
        #expect(try connection.written() == (["/time/hold"] + (0..<count).map { "/time/\($0)" }).map(Self.answer).joined())
        let seen = depths.withLock { $0 }
        #expect(seen.count == count)
        #expect(Set(seen).count == 1, "the stack is as deep for the last request as for the first: \(seen.first ?? 0) → \(seen.last ?? 0) frames")
        _ = try connection.channel.finish()
    }

    /// An answer that never waits, recording what it answers; `closing` marks it
    /// `Connection: close` (as every answer is during a graceful shutdown).
    final class Answered: Sendable {
        let paths = Mutex<[String]>([])
    }

    static func immediateAnswer(_ answered: Answered, closing: Bool = false) -> HotPathHandler.Answer {
        { request, _, _ in
            let text = request.uri.string
            answered.paths.withLock { $0.append(text) }
            return HotRequestReaderTests.textAnswer(text, closing: closing)
        }
    }

    @Test func afterAHandOverNothingBehindAClosingAnswerWrittenWithinTheReadIsRun() throws {
        // NIO's decoder reads the connection (HTTP/1.0 first) and passes the next request on in
        // the same read as the first, whose answer — written within that read — closes the
        // connection: the second is never run (a publish behind it would be stored unanswered).
        let answered = Answered()
        let connection = try connection(answer: Self.immediateAnswer(answered, closing: true))
        try connection.channel.writeInbound(ByteBuffer(string: "GET /time/a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
            + "GET /publish/p/s/0/ch/0/1 HTTP/1.1\r\n\r\n"))
        connection.channel.embeddedEventLoop.run()
        #expect(answered.paths.withLock { $0 } == ["/time/a"])
        let written = try connection.written()
        #expect(written.hasSuffix("\r\n\r\n/time/a"), "one answer: \(written.debugDescription)")
        #expect(written.ranges(of: "HTTP/1.").count == 1, "one answer: \(written.debugDescription)")
        _ = try? connection.channel.finish()
    }

    @Test func afterAHandOverBytesBehindAClosingRequestGetNo400AfterItsAnswer() throws {
        // An HTTP/1.0 request without keep-alive is the connection's last; NIO's parser refuses
        // the byte after it. Its answer, written within the read, is the only one: no 400.
        let answered = Answered()
        let connection = try connection(answer: Self.immediateAnswer(answered))
        try connection.channel.writeInbound(ByteBuffer(string: "GET /time/a HTTP/1.0\r\n\r\nX"))
        connection.channel.embeddedEventLoop.run()
        #expect(answered.paths.withLock { $0 } == ["/time/a"])
        let written = try connection.written()
        #expect(!written.contains("400"), "\(written.debugDescription)")
        #expect(written.ranges(of: "HTTP/1.").count == 1, "one answer: \(written.debugDescription)")
        _ = try? connection.channel.finish()
    }

    @Test func theFirstRequestItDoesNotTakeGoesToNIOWithEverythingAfterIt() throws {
        let answers = Answers()
        let connection = try connection(answers)
        let requests = "GET /time/0 HTTP/1.1\r\n\r\n" + "POST /v2/objects/s/uuids/u HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"
            + "GET /time/1 HTTP/1.1\r\n\r\n"
        try connection.channel.writeInbound(ByteBuffer(string: requests))
        connection.channel.embeddedEventLoop.run()
        // The first is the reader's; the second, and what follows it, NIO's decoder's: the
        // App Context request is passed on, and the time request behind it too.
        #expect(try connection.written() == Self.answer("/time/0"))
        #expect(connection.behind.heads == ["/v2/objects/s/uuids/u", "/time/1"])
        #expect(!connection.readerInPipeline, "the reader left the pipeline")
        #expect(connection.hotPath.reader == nil)
        // Hummingbird's answer goes through NIO's encoder.
        try connection.answerPassedOn(.ok)
        #expect(try connection.written() == "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        _ = try connection.channel.finish()
    }

    @Test func aHandOverWaitsForTheAnswerInFlight() throws {
        let answers = Answers()
        answers.gate.withLock { $0.held = true }
        let connection = try connection(answers)
        try connection.channel.writeInbound(ByteBuffer(string: "GET /time/0 HTTP/1.1\r\n\r\n"))
        connection.channel.embeddedEventLoop.run()
        // Behind the held answer: a request for NIO, in two reads.
        try connection.channel.writeInbound(ByteBuffer(string: "GET /v2/history/sub-key/s/cha"))
        try connection.channel.writeInbound(ByteBuffer(string: "nnel/ch HTTP/1.0\r\n\r\n"))
        connection.channel.embeddedEventLoop.run()
        #expect(try connection.written() == "")
        #expect(connection.behind.heads.isEmpty, "nothing goes to NIO before the answer ahead of it")
        #expect(connection.readerInPipeline)
        // Reading stops once a request waits behind the answer.
        let reads = connection.reads.count
        connection.channel.read()
        #expect(connection.reads.count == reads)
        answers.release()
        connection.channel.embeddedEventLoop.run()
        #expect(try connection.written() == Self.answer("/time/0"))
        #expect(connection.behind.heads == ["/v2/history/sub-key/s/channel/ch"])
        #expect(!connection.readerInPipeline, "HTTP/1.0 is NIO's")
        #expect(connection.reads.count == reads + 1, "the read held back is asked for once the answer is out")
        _ = try connection.channel.finish()
    }

    @Test func closeEndsTheConnectionAfterItsAnswerAndNothingAfterItIsRead() throws {
        let answers = Answers()
        let connection = try connection(answers)
        try connection.channel.writeInbound(ByteBuffer(string: "GET /time/0 HTTP/1.1\r\nConnection: close\r\n\r\nGET /time/1 HTTP/1.1\r\n\r\n"))
        connection.channel.embeddedEventLoop.run()
        #expect(try connection.written() == "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 7\r\n\r\n/time/0")
        try connection.channel.writeInbound(ByteBuffer(string: "GET /time/2 HTTP/1.1\r\n\r\n"))
        connection.channel.embeddedEventLoop.run()
        #expect(answers.answered.withLock { $0 } == ["/time/0"])
        #expect(connection.behind.heads.isEmpty)
        #expect(try connection.written() == "", "nothing after the answer that closes")
        connection.channel.embeddedEventLoop.advanceTime(by: .seconds(1))
        #expect(!connection.channel.isActive, "closed a second after its answer at the latest")
        _ = try? connection.channel.finish()
    }

    @Test func bytesNIOsParserRefusesGetTheProtocols400AfterTheAnswersBeforeThem() throws {
        let answers = Answers()
        let connection = try connection(answers)
        try connection.channel.writeInbound(ByteBuffer(string: "GET /time/0 HTTP/1.1\r\n\r\n\u{0}\u{1} garbage\r\n\r\n"))
        connection.channel.embeddedEventLoop.run()
        let written = try connection.written()
        #expect(written.hasPrefix(Self.answer("/time/0") + "HTTP/1.1 400 Bad Request\r\n"), "\(written)")
        #expect(written.contains("Could Not Parse Request"))
        _ = try? connection.channel.finish()
    }

    @Test func aPartialRequestKeepsTheConnectionFromBeingIdleAndTheBufferIsBounded() throws {
        let answers = Answers()
        let connection = try connection(answers)
        try connection.channel.writeInbound(ByteBuffer(string: "POST /publish/p/s/0/ch/0 HTTP/1.1\r\nContent-Length: 10\r\n\r\n[1,"))
        #expect(connection.reader.isMidRequest)
        #expect(answers.answered.withLock { $0.isEmpty })
        try connection.channel.writeInbound(ByteBuffer(string: "2,3,44]"))
        #expect(!connection.reader.isMidRequest)
        connection.channel.embeddedEventLoop.run()
        #expect(answers.answered.withLock { $0 } == ["/publish/p/s/0/ch/0 [1,2,3,44]"])
        // A head that never ends is handed to NIO's parser at the reader's bound, and NIO's own
        // limits apply from there.
        let connection2 = try self.connection(answers)
        try connection2.channel.writeInbound(ByteBuffer(string: "GET /time/0 HTTP/1.1\r\nX-Big: "
            + String(repeating: "a", count: HotRequestHead.maxHeadBytes)))
        #expect(!connection2.readerInPipeline)
        _ = try? connection.channel.finish()
        _ = try? connection2.channel.finish()
    }

    /// A client that pipelines requests and reads none of the answers: once the socket takes no
    /// more, the requests wait in the buffer and nothing more is read, until it takes them again
    /// (NIO's write queue has no bound of its own).
    @Test func requestsWaitWhileTheSocketTakesNoMoreOfTheAnswers() throws {
        let answers = Answers()
        let connection = try connection(answers)
        connection.channel.isWritable = false
        connection.channel.pipeline.fireChannelWritabilityChanged()
        try connection.channel.writeInbound(ByteBuffer(string: String(repeating: "GET /time/0 HTTP/1.1\r\n\r\n", count: 1_000)))
        connection.channel.embeddedEventLoop.run()
        #expect(answers.answered.withLock { $0.count } == 0)
        let reads = connection.reads.count
        connection.channel.read()
        #expect(connection.reads.count == reads, "nothing more is read while the answers are not taken")

        connection.channel.isWritable = true
        connection.channel.pipeline.fireChannelWritabilityChanged()
        connection.channel.embeddedEventLoop.run()
        #expect(answers.answered.withLock { $0.count } == 1_000)
        #expect(connection.reads.count == reads + 1, "and reading resumes")
        #expect(try connection.written() == String(repeating: Self.answer("/time/0"), count: 1_000))
        _ = try connection.channel.finish()
    }

    /// Every read ends inside the next request, so the buffer never empties: what was read is
    /// dropped as more arrives, and the buffer stays a few KiB whatever the connection sent.
    @Test func theInputBufferDropsWhatItReadWhenItNeverEmpties() throws {
        let answers = Answers()
        let connection = try connection(answers)
        try connection.channel.writeInbound(ByteBuffer(string: "GET /time/0 HTTP/1.1\r\n\r\nG"))
        for _ in 0..<20_000 {
            try connection.channel.writeInbound(ByteBuffer(string: "ET /time/0 HTTP/1.1\r\n\r\nG"))
            connection.channel.embeddedEventLoop.run()
            _ = try connection.written()
        }
        #expect(answers.answered.withLock { $0.count } == 20_001)
        #expect(connection.reader.bufferCapacity <= 16 << 10, "\(connection.reader.bufferCapacity) bytes held")
        _ = try connection.channel.finish()
    }

    @Test func theServersPipelinePutsTheReaderInFrontOfNIOsCodec() throws {
        let answers = Answers()
        let channel = EmbeddedChannel()
        let http = TetherHTTPChannel(responder: { _, _, _ in }, webSocket: nil, decoderLimits: .init(), tasks: HotPathTasks(),
                                     hotPath: { opener in
                                         HotPathHandler(maxBodyBytes: 1024, idleTimeout: .seconds(310), opener: opener, answer: answers.answer)
                                     },
                                     sides: HummingbirdSides(), logger: Logger(label: "test"))
        _ = try http.setup(channel: channel, logger: Logger(label: "test")).wait()
        // Reader, encoder, decoder, hot path: the reader's bytes go out past the encoder.
        let order = channel.pipeline.debugDescription
        let positions = ["HotRequestReader", "HTTPResponseEncoder", "ByteToMessageHandler<HTTPDecoder<HTTPPart<HTTPRequestHead", "HotPathHandler"].map {
            order.range(of: $0)?.lowerBound
        }
        #expect(positions.allSatisfy { $0 != nil }, "\(order)")
        #expect(positions.compactMap { $0 } == positions.compactMap { $0 }.sorted(), "\(order)")
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        try channel.writeInbound(ByteBuffer(string: "GET /time/0 HTTP/1.1\r\nHost: x\r\n\r\n"))
        channel.embeddedEventLoop.run()
        var written = ""
        while let part = try channel.readOutbound(as: IOData.self) {
            if case .byteBuffer(let buffer) = part { written += String(buffer: buffer) }
        }
        #expect(try Self.withoutDates(written) == Self.answer("/time/0"))
        _ = try? channel.finish()
    }

    /// Parks every subscribe the first time (as the responder does when nothing is there to
    /// deliver), answering it when its slot wakes it.
    final class Parking: Sendable {
        let slots = Mutex<[LongPollSlot]>([])

        var answer: HotPathHandler.Answer {
            { request, _, slot in
                let path = request.uri.string
                if path.hasPrefix("/v2/subscribe/"), let slot, !slot.parked.load(ordering: .relaxed),
                   self.slots.withLock({ slots in !slots.contains { $0 === slot } }) {
                    self.slots.withLock { $0.append(slot) }
                    slot.parked.store(true, ordering: .relaxed)
                    return nil
                }
                return HotRequestReaderTests.textAnswer(path)
            }
        }
    }

    @Test func aParkedLongPollWokenLaterIsAnsweredThroughTheReaderAndTheRequestsBehindItWait() throws {
        let parking = Parking()
        let channel = try connection(answer: parking.answer).channel
        try channel.writeInbound(ByteBuffer(string: "GET /v2/subscribe/s/ch/0?tt=1 HTTP/1.1\r\n\r\nGET /time/0 HTTP/1.1\r\n\r\n"))
        channel.embeddedEventLoop.run()
        #expect(try channel.readOutbound(as: IOData.self) == nil, "parked: nothing written, the time request waits")
        guard let slot = parking.slots.withLock({ $0.first }) else {
            Issue.record("the subscribe did not park")
            return
        }
        slot.parked.store(false, ordering: .relaxed)
        slot.wake(.event)
        channel.embeddedEventLoop.run()
        var written = ""
        while let part = try channel.readOutbound(as: IOData.self) {
            if case .byteBuffer(let buffer) = part { written += String(buffer: buffer) }
        }
        #expect(try Self.withoutDates(written) == Self.answer("/v2/subscribe/s/ch/0?tt=1") + Self.answer("/time/0"))
        _ = try? channel.finish()
    }

    @Test func answersHeldBackKeepPipelinedRequestsInOrderAndStopReading() throws {
        let answers = Answers()
        answers.gate.withLock { $0.held = true }
        let connection = try connection(answers)
        try connection.channel.writeInbound(ByteBuffer(string: "GET /time/0 HTTP/1.1\r\n\r\nGET /time/1 HTTP/1.1\r\n\r\n"))
        try connection.channel.writeInbound(ByteBuffer(string: "POST /publish/p/s/0/ch/0 HTTP/1.1\r\nContent-Length: 1\r\n\r\n7"))
        connection.channel.embeddedEventLoop.run()
        let reads = connection.reads.count
        connection.channel.read()
        connection.channel.read()
        #expect(connection.reads.count == reads, "no read while requests wait behind an answer")
        #expect(answers.answered.withLock { $0.isEmpty })
        for _ in 0..<3 {
            answers.release()
            answers.gate.withLock { $0.held = true }
            connection.channel.embeddedEventLoop.run()
        }
        answers.release()
        connection.channel.embeddedEventLoop.run()
        #expect(try connection.written() == Self.answer("/time/0") + Self.answer("/time/1") + Self.answer("/publish/p/s/0/ch/0 7"))
        #expect(connection.reads.count == reads + 1, "reading resumes once nothing waits")
        _ = try connection.channel.finish()
    }

    @Test func aGracefulShutdownClosesAConnectionWithAPartialHeadAtOnceAndAnswersAWholeOne() throws {
        let partial = try connection(Answers())
        try partial.channel.writeInbound(ByteBuffer(string: "GET /time/0 HTTP/1.1\r\nHost"))
        partial.channel.pipeline.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent())
        partial.channel.embeddedEventLoop.run()
        #expect(!partial.channel.isActive, "closed at once, as when NIO's decoder held the partial head")

        let answers = Answers()
        let body = try connection(answers)
        try body.channel.writeInbound(ByteBuffer(string: "POST /publish/p/s/0/ch/0 HTTP/1.1\r\nContent-Length: 3\r\n\r\n[1"))
        body.channel.pipeline.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent())
        body.channel.embeddedEventLoop.run()
        #expect(body.channel.isActive, "a whole head waits for its body and its answer")
        try body.channel.writeInbound(ByteBuffer(string: "]"))
        body.channel.embeddedEventLoop.run()
        #expect(answers.answered.withLock { $0 } == ["/publish/p/s/0/ch/0 [1]"])
        #expect(try body.written().hasSuffix("[1]"))
        body.channel.embeddedEventLoop.advanceTime(by: .seconds(1))
        #expect(!body.channel.isActive, "and closed after it")
        _ = try? partial.channel.finish()
        _ = try? body.channel.finish()
    }

    @Test func aHeadDribbledByteByByteDoesNotKeepTheConnectionFromItsIdleTimeout() throws {
        let connection = try connection(Answers())
        let idle = TimeAmount.seconds(310)
        // A byte of a head every 10 s, never a whole head: closed one idle timeout (plus up to a
        // sweep period) after the connection opened, not kept open by the bytes.
        var elapsed = TimeAmount.zero
        for byte in ("GET /time/0 HTTP/1.1\r\nX-Slow: " + String(repeating: "a", count: 60)).utf8 {
            guard connection.channel.isActive else { break }
            try connection.channel.writeInbound(ByteBuffer(bytes: [byte]))
            connection.channel.embeddedEventLoop.advanceTime(by: .seconds(10))
            elapsed = elapsed + .seconds(10)
        }
        #expect(!connection.channel.isActive)
        #expect(elapsed <= idle + .nanoseconds(idle.nanoseconds / 10) + .seconds(10), "closed after \(elapsed)")
    }

    @Test func aHalfCloseWhileTheReaderReadsClosesTheConnection() throws {
        let connection = try connection(Answers())
        try connection.channel.writeInbound(ByteBuffer(string: "GET /time/0 HTTP/1.1\r\n"))
        connection.channel.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
        connection.channel.embeddedEventLoop.run()
        #expect(!connection.channel.isActive)
    }

    @Test func plainRequestsToOtherRoutesArePassedOnAndTheReaderReadsOnAfterTheirAnswers() throws {
        let answers = Answers()
        let connection = try connection(answers)
        let requests = "GET /time/0 HTTP/1.1\r\n\r\n" + "GET /v2/history/sub-key/s/channel/ch HTTP/1.1\r\nHost: x\r\n\r\n"
            + "GET /time/1 HTTP/1.1\r\n\r\n"
        try connection.channel.writeInbound(ByteBuffer(string: requests))
        connection.channel.embeddedEventLoop.run()
        // The history request reaches Hummingbird's side whole, with a read completion (its
        // request stream takes parts only then); the time request behind it waits.
        #expect(try connection.written() == Self.answer("/time/0"))
        #expect(connection.behind.heads == ["/v2/history/sub-key/s/channel/ch"])
        #expect(connection.behind.events == "he+")
        #expect(answers.answered.withLock { $0 } == ["/time/0"])
        #expect(connection.readerInPipeline, "the reader stays")
        // Hummingbird's answer goes through NIO's encoder; then the reader answers the next.
        try connection.answerPassedOn(body: "[]")
        connection.channel.embeddedEventLoop.run()
        #expect(try connection.written() == "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]" + Self.answer("/time/1"))
        // Two in a row, and a DELETE, each after the other's answer.
        try connection.channel.writeInbound(ByteBuffer(string: "GET /a HTTP/1.1\r\n\r\nDELETE /b HTTP/1.1\r\n\r\n"))
        connection.channel.embeddedEventLoop.run()
        #expect(connection.behind.heads == ["/v2/history/sub-key/s/channel/ch", "/a"])
        try connection.answerPassedOn(.notFound)
        connection.channel.embeddedEventLoop.run()
        #expect(connection.behind.heads == ["/v2/history/sub-key/s/channel/ch", "/a", "/b"])
        #expect(connection.behind.events == "he+he+he+")
        _ = try? connection.channel.finish()
    }

    @Test func aPassedOnRequestThatClosesTheConnectionIsTheLastOneRead() throws {
        let answers = Answers()
        let connection = try connection(answers)
        try connection.channel.writeInbound(ByteBuffer(string: "GET /v2/history/sub-key/s/channel/ch HTTP/1.1\r\nConnection: close\r\n\r\n"
            + "GET /time/0 HTTP/1.1\r\n\r\n"))
        connection.channel.embeddedEventLoop.run()
        try connection.answerPassedOn(.ok)
        connection.channel.embeddedEventLoop.run()
        #expect(connection.behind.heads == ["/v2/history/sub-key/s/channel/ch"])
        #expect(try connection.written() == "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", "nothing after it is answered")
        #expect(answers.answered.withLock { $0.isEmpty }, "nor run")
        _ = try? connection.channel.finish()
    }

    @Test func whenHummingbirdClosesAfterItsAnswerTheHotRequestBehindItIsNotRun() throws {
        // A graceful shutdown while Hummingbird answers a passed-on request: its connection
        // handler closes after the answer. The publish pipelined behind must not be carried out
        // with its answer going nowhere.
        let answers = Answers()
        let connection = try connection(answers)
        try connection.channel.writeInbound(ByteBuffer(string: "GET /v2/history/sub-key/s/channel/ch HTTP/1.1\r\n\r\n"
            + "GET /publish/p/s/0/ch/0/1 HTTP/1.1\r\n\r\n"))
        connection.channel.embeddedEventLoop.run()
        try connection.answerPassedOn(.ok)
        connection.behind.context?.close(promise: nil)
        connection.channel.embeddedEventLoop.run()
        #expect(answers.answered.withLock { $0.isEmpty })
        _ = try? connection.channel.finish()
    }

    @Test func anEndWrittenWhileAHotAnswerIsHeldDoesNotLetTheNextRequestAhead() throws {
        let answers = Answers()
        answers.gate.withLock { $0.held = true }
        let connection = try connection(answers)
        try connection.channel.writeInbound(ByteBuffer(string: "GET /time/0 HTTP/1.1\r\n\r\nGET /time/1 HTTP/1.1\r\n\r\n"))
        connection.channel.embeddedEventLoop.run()
        // An end nobody asked for (Hummingbird's side has nothing in flight here).
        connection.hotPath.write(context: try connection.channel.pipeline.syncOperations.context(handler: connection.hotPath),
                                 data: NIOAny(HTTPServerResponsePart.end(nil)), promise: nil)
        connection.channel.embeddedEventLoop.run()
        #expect(answers.gate.withLock { $0.waiting.count } == 1, "the next request still waits behind the held answer")
        #expect(try connection.written() == "")
        answers.release()
        connection.channel.embeddedEventLoop.run()
        answers.release()
        connection.channel.embeddedEventLoop.run()
        #expect(answers.answered.withLock { $0 } == ["/time/0", "/time/1"])
        _ = try? connection.channel.finish()
    }

    @Test func aRequestForHummingbirdBehindAParkedLongPollWaitsForIt() throws {
        let parking = Parking()
        let connection = try connection(answer: parking.answer)
        let channel = connection.channel, behind = connection.behind
        try channel.writeInbound(ByteBuffer(string: "GET /v2/subscribe/s/ch/0?tt=1 HTTP/1.1\r\n\r\n"
            + "GET /v2/history/sub-key/s/channel/ch HTTP/1.1\r\n\r\n"))
        channel.embeddedEventLoop.run()
        #expect(behind.heads.isEmpty, "not passed on while the long-poll waits")
        let slot = parking.slots.withLock { $0.first }
        slot?.parked.store(false, ordering: .relaxed)
        slot?.wake(.event)
        channel.embeddedEventLoop.run()
        #expect(behind.heads == ["/v2/history/sub-key/s/channel/ch"])
        _ = try? channel.finish()
    }
}
