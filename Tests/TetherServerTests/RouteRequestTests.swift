import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import Synchronization
import Testing
@_spi(Benchmarks) import TetherProtocol
@testable import TetherServer

/// The typed requests of `Routes/` parse the wire once and refuse bad input with the PubNub
/// error body of their family, without a server: each row is a request and the status and body
/// it is refused with (or `nil` when it parses).
@Suite struct RouteRequestTests {
    static let keysets = KeysetRegistry(configuration: ConfigurationFile())
    static let arrivedAt = Timetoken(17_000_000_000_000_000)

    struct Row: Sendable, CustomStringConvertible {
        var target: String
        var status: Int?
        var body: String?
        var description: String { target }
    }

    static func wire(_ target: String) throws -> WireRequest {
        let pieces = target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
        var wire = try WireRequest(rawPath: String(pieces[0]), rawQuery: pieces.count > 1 ? String(pieces[1]) : nil)
        wire.uriLength = target.utf8.count
        return wire
    }

    /// The status and the body as text.
    static func body(_ response: Response) async throws -> (Int, String) {
        let sink = BodySink()
        try await response.body.write(BodyCollector(sink: sink))
        return (response.status.code, sink.buffer.withLock { String(buffer: $0) })
    }

    static let publishTargets: [Row] = [
        Row(target: "/publish/demo/demo/0/c/0/1", status: nil, body: nil),
        Row(target: "/publish/nope/demo/0/c/0/1", status: 400, body: #"[0,"Invalid Key","17000000000000000"]"#),
        Row(target: "/publish/demo/nope/0/c/0/1", status: 400, body: #"[0,"Invalid Key","17000000000000000"]"#),
        Row(target: "/publish/demo/demo/0/c-pnpres/0/1", status: 400,
            body: #"[0,"Invalid Channel: presence channels are written by the server","17000000000000000"]"#),
    ]

    @Test(arguments: publishTargets)
    func publishTarget(_ row: Row) async throws {
        let wire = try Self.wire(row.target)
        do {
            _ = try PublishRequest.Target(wire, kind: .message, keysets: Self.keysets, now: Self.arrivedAt)
            #expect(row.status == nil, "accepted")
        } catch {
            let (status, body) = try await Self.body(error.response)
            #expect(status == row.status)
            #expect(body == row.body)
        }
    }

    static let publishMessages: [Row] = [
        Row(target: "/publish/demo/demo/0/c/0/1?seqn=1&ttl=1.5&store=0", status: nil, body: nil),
        Row(target: "/publish/demo/demo/0/c/0/%7Bbad", status: 400, body: #"[0,"Invalid JSON","17000000000000000"]"#),
        Row(target: "/publish/demo/demo/0/c/0/1?meta=%5B1%5D", status: 400,
            body: #"[0,"Invalid meta: must be a JSON object","17000000000000000"]"#),
        Row(target: "/publish/demo/demo/0/c/0/1?custom_message_type=a", status: 400,
            body: #"[0,"Invalid custom_message_type: 3-50 characters of A-Z a-z 0-9 _ -","17000000000000000"]"#),
        Row(target: "/publish/demo/demo/0/c/0/1?store=2", status: 400,
            body: #"[0,"Invalid store: expected 0 or 1","17000000000000000"]"#),
    ]

    @Test(arguments: publishMessages)
    func publishMessage(_ row: Row) async throws {
        let wire = try Self.wire(row.target)
        let target = try PublishRequest.Target(wire, kind: .message, keysets: Self.keysets, now: Self.arrivedAt)
        do {
            let request = try PublishRequest(target, message: Array(wire.segments[6].utf8), wire)
            #expect(row.status == nil, "accepted")
            #expect(request.payload == "1")
            #expect(request.sequence == 1)
            #expect(request.ttlHours == 1.5)
            #expect(!request.store)
            #expect(!request.isFire)
        } catch let refusal as Refusal {
            let (status, body) = try await Self.body(refusal.response)
            #expect(status == row.status)
            #expect(body == row.body)
        }
    }

    @Test func theRequestLineIsSplitOnBytesBeforeDecoding() throws {
        // A combining mark after `/` joins it into one Character; the path still splits there.
        let wire = try WireRequest(rawPath: "/v2/subscribe/demo/a\u{301}/\u{301}b/%2F/", rawQuery: "&x=1&&flag&y=a%26b&x=2&e=")
        #expect(wire.segments == ["v2", "subscribe", "demo", "a\u{301}", "\u{301}b", "/"])
        #expect(wire.rawSegments.last == "%2F")
        #expect(wire.query == ["x": "2", "y": "a&b", "e": ""])
        #expect(wire.rawQueryValue("y") == "a%26b")
        #expect(wire.flags == ["flag"])
        #expect(try WireRequest(rawPath: "/c/a,%2C,,b", rawQuery: nil).pathNames(1) == ["a", ",", "b"])
        #expect(throws: WireRequest.ParseError.self) { try WireRequest(rawPath: "/a/%zz", rawQuery: nil) }
        #expect(throws: WireRequest.ParseError.self) { try WireRequest(rawPath: "/a", rawQuery: "k=%E9") }
    }

    @Test func queryParametersReadTheLastValueOfAKey() throws {
        var wire = try WireRequest(rawPath: "/time/0", rawQuery: "a=1&b=2&a=3&a=&c=%2B")
        #expect(wire.query["a"] == "")
        #expect(wire.query["b"] == "2")
        #expect(wire.query["c"] == "+")
        #expect(wire.query["d"] == nil)
        #expect(wire.query.dictionary == ["a": "", "b": "2", "c": "+"])
        wire.query["a"] = "4"
        #expect(wire.query["a"] == "4")
        wire.query["b"] = nil
        #expect(wire.query["b"] == nil)
        #expect(wire.query == ["c": "+", "a": "4"])
        #expect(wire.query != ["c": "+", "a": "5"])
        #expect(try WireRequest(rawPath: "/time/0", rawQuery: nil).query.isEmpty)
    }

    /// Past ``QueryParameters/indexedAbove`` pairs reads go through an index of each key's last
    /// pair: the same answers as walking them, while they are added, set and removed.
    @Test func manyQueryParametersReadAsFewDo() throws {
        for count in [QueryParameters.indexedAbove - 1, QueryParameters.indexedAbove, QueryParameters.indexedAbove + 1, 300] {
            let keys = (0..<count).map { "k\($0 % 7)" }
            let raw = keys.enumerated().map { "\($1)=v\($0)" }.joined(separator: "&")
            var wire = try WireRequest(rawPath: "/time/0", rawQuery: raw)
            var reference = Dictionary(keys.enumerated().map { ($1, "v\($0)") }, uniquingKeysWith: { _, last in last })
            for key in (0..<8).map({ "k\($0)" }) { #expect(wire.query[key] == reference[key], "\(count) \(key)") }
            wire.query["k1"] = nil
            reference["k1"] = nil
            wire.query["k2"] = "set"
            reference["k2"] = "set"
            wire.query["new"] = "n"
            reference["new"] = "n"
            for key in (0..<8).map({ "k\($0)" }) + ["new"] { #expect(wire.query[key] == reference[key], "\(count) \(key)") }
            #expect(wire.query.dictionary == reference)
        }
    }

    @Test func theSignatureCheckSplitsTheQueryOnBytesAsRoutingDoes() throws {
        // A raw combining mark right after `&` makes `&` and the mark one Character: split on
        // Characters, `timestamp` swallowed the next parameter and the signature check found no
        // timestamp, while routing (above) saw two parameters.
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-sig-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let logger = Logger(label: "signature")
        let store = try MessageStore(directory: directory, logger: logger, metrics: ServerMetrics())
        defer { try? store.close() }
        let now = Timetoken(unixSeconds: 1_800_000_000)
        let access = try AccessManager(store: store, logger: logger, clock: { now })
        let keyset = Keyset(name: "k", publishKey: "pub", subscribeKey: "sub", secretKey: "secret")
        let path = "/v2/subscribe/sub/ch/0"
        let query = AccessManager.signedQuery(method: "GET", publishKey: "pub", path: path, query: ["\u{301}x": "1"],
                                              secret: "secret", timestamp: now.unixSeconds)
        #expect(try WireRequest(rawPath: path, rawQuery: query).query["\u{301}x"] == "1")
        #expect(access.verifySignature(keyset: keyset, method: "GET", rawPath: path, rawQuery: query, body: []) == .valid)
        let tampered = query.replacingOccurrences(of: "\u{301}x=1", with: "\u{301}x=2")
        #expect(access.verifySignature(keyset: keyset, method: "GET", rawPath: path, rawQuery: tampered, body: []) != .valid)
    }

    @Test func aMalformedNumberIsLeftToTheRoutersParameterAnswer() throws {
        let wire = try Self.wire("/publish/demo/demo/0/c/0/1?seqn=x")
        let target = try PublishRequest.Target(wire, kind: .message, keysets: Self.keysets, now: Self.arrivedAt)
        #expect(throws: ParameterError.self) { try PublishRequest(target, message: Array("1".utf8), wire) }
    }

    @Test func fireIsAMessageNeitherStoredNorReplicated() throws {
        let wire = try Self.wire("/publish/demo/demo/0/c/0/1?store=0&norep=1")
        let target = try PublishRequest.Target(wire, kind: .message, keysets: Self.keysets, now: Self.arrivedAt)
        #expect(try PublishRequest(target, message: Array("1".utf8), wire).isFire)
        let signal = try PublishRequest.Target(wire, kind: .signal, keysets: Self.keysets, now: Self.arrivedAt)
        #expect(try !PublishRequest(signal, message: Array("1".utf8), wire).isFire)
    }

    static let subscribes: [Row] = [
        Row(target: "/v2/subscribe/demo/a,b/0?channel-group=g", status: nil, body: nil),
        Row(target: "/v2/subscribe/demo/,/0", status: 400,
            body: #"{"status":400,"error":true,"service":"Subscribe","message":"No channels or channel groups given"}"#),
        Row(target: "/v2/subscribe/demo/c/0?filter-expr=%3D%3D", status: 481, body: nil),
        Row(target: "/v2/subscribe/nope/c/0", status: 400,
            body: #"{"status":400,"error":true,"service":"Subscribe","message":"Invalid Subscribe Key"}"#),
    ]

    @Test(arguments: subscribes)
    func subscribe(_ row: Row) async throws {
        do {
            let request = try SubscribeRequest(try Self.wire(row.target), keysets: Self.keysets, filters: FilterCache())
            #expect(row.status == nil, "accepted")
            #expect(request.channels == ["a", "b"])
            #expect(request.groups == ["g"])
        } catch let refusal as Refusal {
            let (status, body) = try await Self.body(refusal.response)
            #expect(status == row.status)
            if let expected = row.body { #expect(body == expected) }
        } catch let error as RequestError {
            let (status, body) = try await Self.body(error.response)
            #expect(status == row.status)
            if let expected = row.body { #expect(body == expected) }
        }
    }

    @Test(arguments: [(StorageRequest.ErrorShape.history, #"{"status":400,"error":true,"error_message":"No channels given","channels":{}}"#),
                      (.service, #"{"status":400,"error":true,"service":"Storage","message":"No channels given"}"#)])
    func storageRequestsAnswerInTheirFamilysShape(_ shape: StorageRequest.ErrorShape, _ expected: String) async throws {
        do {
            _ = try StorageRequest(try Self.wire("/v3/history/sub-key/demo/channel/,"), keysets: Self.keysets, errors: shape)
            Issue.record("a request naming no channel was accepted")
        } catch let error as RequestError {
            let (status, body) = try await Self.body(error.response)
            #expect(status == 400)
            #expect(body == expected)
        }
    }
}

private final class BodySink: Sendable {
    let buffer = Mutex(ByteBuffer())
}

private struct BodyCollector: ResponseBodyWriter {
    let sink: BodySink

    mutating func write(_ buffer: ByteBuffer) async throws {
        var buffer = buffer
        _ = sink.buffer.withLock { $0.writeBuffer(&buffer) }
    }

    consuming func finish(_ trailingHeaders: HTTPFields?) async throws {}
}

/// The files family's target (`FileRequest`): keyset, channel, uuid, each refused with the
/// files error object; and the classification of its paths (a wrong method is a 405).
@Suite struct FileRouteRequestTests {
    static let files: [RouteRequestTests.Row] = [
        .init(target: "/v1/files/demo/channels/room/files", status: nil, body: nil),
        .init(target: "/v1/files/nope/channels/room/files", status: 400,
              body: #"{"status":400,"error":{"source":"files","message":"Invalid Subscribe Key"}}"#),
        .init(target: "/v1/files/demo/channels/room-pnpres/files", status: 400,
              body: #"{"status":400,"error":{"source":"files","message":"Invalid channel: presence channels carry no files"}}"#),
    ]

    @Test(arguments: files)
    func fileTarget(_ row: RouteRequestTests.Row) async throws {
        let wire = try RouteRequestTests.wire(row.target)
        do {
            _ = try FileRequest(wire, keysets: RouteRequestTests.keysets)
            #expect(row.status == nil, "accepted")
        } catch {
            let (status, body) = try await RouteRequestTests.body(error.response)
            #expect(status == row.status)
            #expect(body == row.body)
        }
    }

    @Test func filesPathsClassifyByMethodAndShape() throws {
        func route(_ method: HTTPRequest.Method, _ path: String) throws -> Route? {
            let wire = try RouteRequestTests.wire(path)
            return Route.classify(method, wire.segments, wire)
        }
        #expect(try route(.post, "/v1/files/demo/channels/c/generate-upload-url") == .generateFileUploadURL)
        #expect(try route(.get, "/v1/files/demo/channels/c/generate-upload-url") == nil)
        #expect(try route(.post, "/v1/files/upload/demo/id") == .uploadFile)
        #expect(try route(.get, "/v1/files/upload/demo/id") == nil)
        #expect(try route(.get, "/v1/files/demo/channels/c/files/id/n") == .getFile)
        #expect(try route(.delete, "/v1/files/demo/channels/c/files/id/n") == .deleteFile)
        #expect(try route(.post, "/v1/files/demo/channels/c/files/id/n") == nil)
        #expect(TetherResponder.isFilesPath(["v1", "files", "demo", "channels", "c", "files", "id", "n"]))
        #expect(!TetherResponder.isFilesPath(["v1", "files", "demo", "channels", "c", "other"]))
        #expect(!TetherResponder.isFilesPath(["v1", "files"]))
    }

    @Test func cursorsRoundTripAndGarbageIsRefused() {
        let text = TetherResponder.encodeFileCursor(created: Timetoken(17_000_000_000_000_000), id: "abc")
        #expect(TetherResponder.decodeFileCursor(text)?.created == Timetoken(17_000_000_000_000_000))
        #expect(TetherResponder.decodeFileCursor(text)?.id == "abc")
        for garbage in ["", "%%", "bm90LWEtY3Vyc29y", String(repeating: "A", count: 400)] {
            #expect(TetherResponder.decodeFileCursor(garbage) == nil)
        }
    }
}
