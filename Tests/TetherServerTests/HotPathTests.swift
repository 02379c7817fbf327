import HTTPTypes
import Hummingbird
import NIOCore
import NIOEmbedded
import NIOHTTP1
import NIOHTTPTypes
import NIOHTTPTypesHTTP1
import Synchronization
import Testing
import TetherTesting

@testable import TetherServer

/// `HotPathHandler` in an embedded pipeline: which requests it answers and which it passes on,
/// that answers keep request order, and its idle timeout and shutdown rules (driven by the
/// embedded loop's clock, not by sleeping). The whole server through it is covered by every
/// other server test and the conformance suite.
///
/// The tests are synchronous: the embedded loop runs the answers' tasks (their executor is the
/// loop) when the test runs the loop, on the test's thread.
@Suite struct HotPathTests {
    /// Answers `200` with the request's path as the body, after a wait (as a stored publish
    /// waits for its commit): the answer is written when the test runs the loop, so the tests
    /// can send what arrives while it is in flight. (An answer found without waiting is written
    /// within the read: ``HotRequestReaderTests``.)
    final class Answers: Sendable {
        let answered = Mutex<[String]>([])

        var answer: HotPathHandler.Answer {
            { request, _, _ in
                await Task.yield()
                let path = request.uri.string
                self.answered.withLock { $0.append(path) }
                var head = HTTPResponse(status: .ok)
                head.headerFields[.contentLength] = String(path.utf8.count)
                return (head, ByteBuffer(string: path))
            }
        }
    }

    /// Records when a connection's Hummingbird side is built, and puts a handler where
    /// Hummingbird's would go (after the hot path) that records the request heads reaching it.
    final class Opener: HummingbirdOpener, @unchecked Sendable {
        /// Request paths that reached Hummingbird's side.
        var heads: [String] = []
        var opened = 0

        final class Recorder: ChannelInboundHandler, @unchecked Sendable {
            typealias InboundIn = HTTPServerRequestPart
            let opener: Opener
            init(_ opener: Opener) { self.opener = opener }
            func channelRead(context: ChannelHandlerContext, data: NIOAny) {
                if case .head(let head) = unwrapInboundIn(data) { opener.heads.append(head.uri) }
            }
        }

        func openHummingbird(on channel: any Channel) {
            opened += 1
            try! channel.pipeline.syncOperations.addHandler(Recorder(self))
        }
    }

    static let idle = TimeAmount.seconds(310)

    /// Counts the graceful-shutdown quiesce events that reach Hummingbird's side.
    final class Quiesces: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = HTTPServerRequestPart
        var seen = 0
        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if event is ChannelShouldQuiesceEvent { seen += 1 }
        }
    }

    /// Counts the read completions that reach Hummingbird's side (its request stream hands
    /// over what it buffered only then).
    final class ReadCompletions: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = HTTPServerRequestPart
        var count = 0

        func channelReadComplete(context: ChannelHandlerContext) {
            count += 1
            context.fireChannelReadComplete()
        }
    }

    func pipeline(_ answers: Answers, maxBody: Int = 1024, completions: ReadCompletions = .init()) throws -> EmbeddedChannel {
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(HotPathHandler(maxBodyBytes: maxBody, idleTimeout: Self.idle, answer: answers.answer))
        try channel.pipeline.syncOperations.addHandler(completions)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        return channel
    }

    func request(_ channel: EmbeddedChannel, _ method: HTTPRequest.Method, _ path: String, headers: HTTPFields = [:],
                 body: String? = nil) throws {
        try channel.writeInbound(HTTPServerRequestPart.head(try HTTPRequestHead(HTTPRequest(method: method, scheme: nil, authority: nil, path: path,
                                                                  headerFields: headers))))
        if let body { try channel.writeInbound(HTTPServerRequestPart.body(ByteBuffer(string: body))) }
        try channel.writeInbound(HTTPServerRequestPart.end(nil))
    }

    /// What was passed on to the next handler: the paths of request heads.
    func forwarded(_ channel: EmbeddedChannel) throws -> [String] {
        var paths: [String] = []
        while let part = try channel.readInbound(as: HTTPServerRequestPart.self) {
            if case .head(let head) = part { paths.append(head.uri) }
        }
        return paths
    }

    /// What was written to the client: the bodies of whole responses, in order.
    func responses(_ channel: EmbeddedChannel) throws -> [String] {
        var bodies: [String] = []
        var body = ""
        while let part = try channel.readOutbound(as: HTTPServerResponsePart.self) {
            switch part {
            case .head: body = ""
            case .body(.byteBuffer(let buffer)): body += String(buffer: buffer)
            case .body: break
            case .end: bodies.append(body)
            }
        }
        return bodies
    }

    @Test func hotRoutesAreAnsweredAndTheRestPassedOn() throws {
        let answers = Answers()
        let channel = try pipeline(answers)
        try request(channel, .get, "/time/0")
        try request(channel, .get, "/publish/p/s/0/ch/0/1")
        try request(channel, .get, "/signal/p/s/0/ch/0/1")
        try request(channel, .get, "/v2/subscribe/s/ch/0?tt=0")
        try request(channel, .post, "/publish/p/s/0/ch/0", headers: [.contentLength: "1"], body: "2")
        channel.embeddedEventLoop.run()
        #expect(try responses(channel) == ["/time/0", "/publish/p/s/0/ch/0/1", "/signal/p/s/0/ch/0/1", "/v2/subscribe/s/ch/0?tt=0",
                                           "/publish/p/s/0/ch/0"])
        #expect(try forwarded(channel).isEmpty)

        // Not hot: other routes and methods, a POST body larger than the limit, without a
        // length, or chunked.
        try request(channel, .get, "/v2/history/sub-key/s/channel/ch")
        try channel.writeOutbound(HTTPServerResponsePart.end(nil))
        try request(channel, .delete, "/publish/p/s/0/ch/0/1")
        try channel.writeOutbound(HTTPServerResponsePart.end(nil))
        try request(channel, .post, "/publish/p/s/0/big/0", headers: [.contentLength: "1025"], body: String(repeating: "1", count: 1025))
        try channel.writeOutbound(HTTPServerResponsePart.end(nil))
        try request(channel, .post, "/publish/p/s/0/unsized/0", body: "1")
        try channel.writeOutbound(HTTPServerResponsePart.end(nil))
        try request(channel, .post, "/publish/p/s/0/chunked/0", headers: [.transferEncoding: "chunked"], body: "1")
        try channel.writeOutbound(HTTPServerResponsePart.end(nil))
        // A request asking for an upgrade (Hummingbird answers a failed one itself).
        try request(channel, .get, "/time/0", headers: [.upgrade: "websocket", .connection: "upgrade"])
        channel.embeddedEventLoop.run()
        #expect(try forwarded(channel) == ["/v2/history/sub-key/s/channel/ch", "/publish/p/s/0/ch/0/1", "/publish/p/s/0/big/0",
                                           "/publish/p/s/0/unsized/0", "/publish/p/s/0/chunked/0", "/time/0"])
        #expect(answers.answered.withLock { $0.count } == 5)
        _ = try channel.finish()
    }

    @Test func hummingbirdsSideIsBuiltOnlyWhenARequestIsPassedOn() throws {
        let answers = Answers()
        let channel = EmbeddedChannel()
        let opener = Opener()
        try channel.pipeline.syncOperations.addHandler(HotPathHandler(maxBodyBytes: 1024, idleTimeout: Self.idle, opener: opener,
                                                                      answer: answers.answer))
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        // Hot requests never build it.
        for _ in 0..<3 {
            try request(channel, .get, "/v2/subscribe/s/ch/0?tt=0")
            channel.embeddedEventLoop.run()
        }
        #expect(try responses(channel).count == 3)
        #expect(opener.opened == 0)
        // The first request passed on builds it, before its head goes on: the head reaches it.
        try request(channel, .get, "/v2/history/sub-key/s/channel/ch")
        channel.embeddedEventLoop.run()
        #expect(opener.opened == 1)
        #expect(opener.heads == ["/v2/history/sub-key/s/channel/ch"])
        try channel.writeOutbound(HTTPServerResponsePart.end(nil))
        // Once: later requests passed on reach the same side.
        try request(channel, .get, "/v1/channel-registration/sub-key/s/channel-group/g")
        channel.embeddedEventLoop.run()
        #expect(opener.opened == 1)
        #expect(opener.heads == ["/v2/history/sub-key/s/channel/ch", "/v1/channel-registration/sub-key/s/channel-group/g"])
        _ = try channel.finish()
    }

    @Test func cancellingTheServerStopsTheRequestLoopsAndClosesTheConnections() async throws {
        let tasks = HotPathTasks()
        tasks.startLoop(executor: nil) {
            // A request loop that would wait for its connection for an hour.
            try? await Task.sleep(for: .seconds(3600))
        }
        #expect(tasks.running == 1)
        // A connection with only its hot path (no loop running).
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(HotPathHandler(maxBodyBytes: 1024, idleTimeout: Self.idle, tasks: tasks,
                                                                      answer: Answers().answer))
        try await channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).get()
        #expect(tasks.openConnections == 1)
        #expect(tasks.stopAll() == (loops: 1, connections: 1))
        channel.embeddedEventLoop.run()
        #expect(!channel.isActive, "the held connection was closed")
        #expect(tasks.openConnections == 0)
        #expect(await eventually { tasks.running == 0 }, "the loop's task ended at its cancellation")
        // What starts after the stop is stopped at once.
        tasks.startLoop(executor: nil) { try? await Task.sleep(for: .seconds(3600)) }
        #expect(await eventually { tasks.running == 0 })
        let late = EmbeddedChannel()
        try await late.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).get()
        #expect(late.isActive)
        try late.pipeline.syncOperations.addHandler(HotPathHandler(maxBodyBytes: 1024, idleTimeout: Self.idle, tasks: tasks,
                                                                   answer: Answers().answer))
        late.embeddedEventLoop.run()
        #expect(!late.isActive, "a connection accepted after the stop is closed")
    }

    @Test func aParkedSubscribeIsRunAgainFromItsPathAndQuery() {
        let path = "/v2/subscribe/sub-c-1/a%2Cb,c/0?tt=17953281265171442&tr=1&uuid=u%201&filter-expr=x%20%3D%3D%201"
        let request = HotPathHandler.subscribeRequest(path: path)
        #expect(request.method == .get)
        #expect(request.uri.string == path)
        #expect(request.uri.path == "/v2/subscribe/sub-c-1/a%2Cb,c/0")
        #expect(request.uri.query == "tt=17953281265171442&tr=1&uuid=u%201&filter-expr=x%20%3D%3D%201")
    }

    @Test func stoppingClosesTheConnectionsOfTheLoopsItCancels() async throws {
        // A WebSocket session's connection has no hot path left: its loop's channel is closed.
        let tasks = HotPathTasks()
        let session = EmbeddedChannel()
        try await session.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).get()
        tasks.startLoop(executor: nil, channel: session) { try? await Task.sleep(for: .seconds(3600)) }
        #expect(tasks.stopAll() == (loops: 1, connections: 0))
        session.embeddedEventLoop.run()
        #expect(!session.isActive)
        #expect(await eventually { tasks.running == 0 })
        // A loop started after the stop: cancelled, its channel closed at once.
        let late = EmbeddedChannel()
        try await late.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).get()
        tasks.startLoop(executor: nil, channel: late) { try? await Task.sleep(for: .seconds(3600)) }
        late.embeddedEventLoop.run()
        #expect(!late.isActive)
        #expect(await eventually { tasks.running == 0 })
    }

    @Test func theHotPathCountsItsConnectionWhileOpenAndBuildsNothingAtItsEnd() throws {
        let channel = EmbeddedChannel()
        let tasks = HotPathTasks()
        let opener = Opener()
        try channel.pipeline.syncOperations.addHandler(HotPathHandler(maxBodyBytes: 1024, idleTimeout: Self.idle, tasks: tasks,
                                                                      opener: opener, answer: Answers().answer))
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        #expect(tasks.openConnections == 1, "counted while open, for a graceful shutdown to wait for")
        _ = try channel.finish()  // closed: the handlers are removed
        channel.embeddedEventLoop.run()
        #expect(tasks.openConnections == 0)
        #expect(opener.opened == 0, "a connection that ends without a request passed on builds nothing")
    }

    @Test func aConnectionThatLeavesItsHotPathIsNoLongerCountedHere() throws {
        // A WebSocket upgrade takes the hot path out; the session's task is counted instead.
        let channel = EmbeddedChannel()
        let tasks = HotPathTasks()
        let hotPath = HotPathHandler(maxBodyBytes: 1024, idleTimeout: Self.idle, tasks: tasks, answer: Answers().answer)
        try channel.pipeline.syncOperations.addHandler(hotPath)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        #expect(tasks.openConnections == 1)
        try channel.pipeline.syncOperations.removeHandler(hotPath).wait()
        #expect(tasks.openConnections == 0)
        #expect(channel.isActive)
        #expect(tasks.stopAll() == (loops: 0, connections: 0))
        channel.embeddedEventLoop.run()
        #expect(channel.isActive, "closed by the task that runs it, not here")
        _ = try channel.finish()
    }

    @Test func aHotRequestBehindAPassedOnOneIsPassedOnToo() throws {
        let answers = Answers()
        let channel = try pipeline(answers)
        try request(channel, .get, "/v2/history/sub-key/s/channel/ch")
        try request(channel, .get, "/time/0")
        channel.embeddedEventLoop.run()
        // Both go to Hummingbird, which answers them in order.
        #expect(try forwarded(channel) == ["/v2/history/sub-key/s/channel/ch", "/time/0"])
        #expect(answers.answered.withLock { $0.isEmpty })
        try channel.writeOutbound(HTTPServerResponsePart.end(nil))
        try channel.writeOutbound(HTTPServerResponsePart.end(nil))
        // Once both are answered, the next hot one is answered here again.
        try request(channel, .get, "/time/0")
        channel.embeddedEventLoop.run()
        #expect(try responses(channel) == ["", "", "/time/0"])
        _ = try channel.finish()
    }

    @Test func requestsBehindAHotOneWaitForItsAnswer() throws {
        let answers = Answers()
        let completions = ReadCompletions()
        let channel = try pipeline(answers, completions: completions)
        // Three requests in one read: hot, not hot, hot. The embedded loop has not run the
        // first answer's task yet, so the other two must wait.
        try request(channel, .get, "/time/0")
        try request(channel, .get, "/v2/history/sub-key/s/channel/ch")
        try request(channel, .get, "/publish/p/s/0/ch/0/1")
        #expect(try forwarded(channel).isEmpty, "nothing passed on before the hot answer is written")
        let completed = completions.count
        channel.embeddedEventLoop.run()
        // The hot answer is written; then the history request is passed on, and the publish
        // behind it goes to Hummingbird too (after the history answer).
        #expect(try responses(channel) == ["/time/0"])
        #expect(try forwarded(channel) == ["/v2/history/sub-key/s/channel/ch", "/publish/p/s/0/ch/0/1"])
        #expect(completions.count == completed + 1, "the replayed requests' read is completed, or Hummingbird never sees them")
        #expect(answers.answered.withLock { $0 } == ["/time/0"])
        _ = try channel.finish()
    }

    /// Counts the reads the hot path lets through to the socket.
    final class Reads: ChannelOutboundHandler, @unchecked Sendable {
        typealias OutboundIn = Any
        var count = 0
        func read(context: ChannelHandlerContext) {
            count += 1
            context.read()
        }
    }

    @Test func readingStopsOnlyOnceARequestIsHeldBehindAnAnswer() throws {
        let answers = Answers()
        let reads = Reads()
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(reads)
        try channel.pipeline.syncOperations.addHandler(HotPathHandler(maxBodyBytes: 1024, idleTimeout: Self.idle, answer: answers.answer))
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        // Answering, nothing held: reading goes on (stopping it costs the socket two epoll_ctl).
        try request(channel, .get, "/time/0")
        let before = reads.count
        channel.read()
        #expect(reads.count == before + 1)
        // A request held behind the answer: reading waits for the answer.
        try request(channel, .get, "/publish/p/s/0/ch/0/1")
        channel.read()
        channel.read()
        #expect(reads.count == before + 1, "held: nothing more read while a request waits behind the answer")
        channel.embeddedEventLoop.run()
        #expect(try responses(channel) == ["/time/0", "/publish/p/s/0/ch/0/1"])
        #expect(reads.count == before + 2, "the held read goes on once the answers are written")
        // A parse error behind an answer: nothing more is read; the 400 follows the answer.
        try request(channel, .get, "/time/0")
        channel.pipeline.fireErrorCaught(HTTPParserError.invalidVersion)
        channel.read()
        #expect(reads.count == before + 2, "nothing read after the parser's error")
        channel.embeddedEventLoop.run()
        var statuses: [HTTPResponseStatus] = []
        while let part = try channel.readOutbound(as: HTTPServerResponsePart.self) {
            if case .head(let head) = part { statuses.append(head.status) }
        }
        #expect(statuses == [.ok, .badRequest])
        _ = try? channel.finish()
    }

    @Test func aGetWithABodyIsPassedOn() throws {
        let answers = Answers()
        let channel = try pipeline(answers)
        // Nothing reads a GET's body: Hummingbird discards it as it streams, where the hot
        // path would have to hold it.
        try request(channel, .get, "/time/0", headers: [.transferEncoding: "chunked"], body: "xx")
        try channel.writeOutbound(HTTPServerResponsePart.end(nil))
        try request(channel, .get, "/time/0", headers: [.contentLength: "2"], body: "xx")
        channel.embeddedEventLoop.run()
        #expect(try forwarded(channel) == ["/time/0", "/time/0"])
        #expect(answers.answered.withLock { $0.isEmpty })
        _ = try channel.finish()
    }

    @Test func nothingIsReadAfterAPassedOnRequestThatClosesTheConnection() throws {
        let answers = Answers()
        let channel = try pipeline(answers)
        try request(channel, .get, "/v2/history/sub-key/s/channel/ch", headers: [.connection: "close"])
        try request(channel, .get, "/publish/p/s/0/ch/0/1")
        try channel.writeOutbound(HTTPServerResponsePart.end(nil))
        try request(channel, .get, "/publish/p/s/0/ch/0/2")
        channel.embeddedEventLoop.run()
        #expect(try forwarded(channel) == ["/v2/history/sub-key/s/channel/ch"])
        #expect(answers.answered.withLock { $0.isEmpty }, "nothing published after the closing request")
        _ = try channel.finish()
    }

    @Test func shutdownWhileAPassedOnRequestIsReadIsPassedOn() throws {
        let channel = try pipeline(Answers())
        let quiesces = Quiesces()
        try channel.pipeline.syncOperations.addHandler(quiesces)
        try channel.writeInbound(HTTPServerRequestPart.head(try HTTPRequestHead(HTTPRequest(method: .post, scheme: nil, authority: nil, path: "/v1/files/x",
                                                                  headerFields: [.contentLength: "10"]))))
        channel.pipeline.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent())
        #expect(quiesces.seen == 1, "Hummingbird's side closes the connection after its answer")
        _ = try channel.finish()
    }

    static let parseFailure = #"{"status":400,"error":true,"service":"Balancer","message":"Could Not Parse Request"}"#

    /// Stands in for the upgrade handler: takes the hot path out of the pipeline when it reads
    /// an upgrade request's head (as ``WebSocketEndpoint`` does when it accepts the upgrade),
    /// and records every part that reaches it.
    final class Upgrader: ChannelInboundHandler, RemovableChannelHandler, @unchecked Sendable {
        typealias InboundIn = HTTPServerRequestPart
        var parts: [String] = []
        var upgrading = false
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            switch unwrapInboundIn(data) {
            case .head(let head):
                parts.append("head \(head.uri)")
                if head.headers.contains(name: "upgrade"),
                   let hot = try? context.pipeline.syncOperations.context(handlerType: HotPathHandler.self) {
                    upgrading = true
                    context.pipeline.syncOperations.removeHandler(context: hot, promise: nil)
                }
            case .body: parts.append("body")
            case .end:
                parts.append("end")
                // Upgraded: the upgrade handler leaves too; what follows is not HTTP.
                if upgrading { context.pipeline.syncOperations.removeHandler(context: context, promise: nil) }
            }
        }
    }

    @Test func anUpgradeHeldBehindAHotAnswerReachesTheUpgraderWhole() throws {
        let channel = try pipeline(Answers())
        let upgrader = Upgrader()
        try channel.pipeline.syncOperations.addHandler(upgrader)
        try request(channel, .get, "/time/0")
        // Pipelined behind it, so held while it is answered.
        try request(channel, .get, "/v2/ws", headers: [.upgrade: "websocket", .connection: "upgrade"])
        #expect(upgrader.parts.isEmpty)
        channel.embeddedEventLoop.run()
        #expect(try responses(channel) == ["/time/0"])
        #expect(upgrader.parts == ["head /v2/ws", "end"], "the upgrade request's end is not lost with the hot path gone")
        #expect((try? channel.pipeline.syncOperations.handler(type: HotPathHandler.self)) == nil, "the hot path left")
        // After the upgrade, what arrives is passed on as it is (here: raw bytes).
        try channel.writeInbound(ByteBuffer(string: "frame"))
        #expect(try channel.readInbound(as: ByteBuffer.self) == ByteBuffer(string: "frame"))
        _ = try channel.finish()
    }

    @Test func aPassedOnRequestThatClosesTheConnectionKeepsItsBody() throws {
        let channel = try pipeline(Answers())
        try request(channel, .post, "/v1/objects/s/uuids/u", headers: [.connection: "close", .contentLength: "2"], body: "{}")
        var parts: [String] = []
        while let part = try channel.readInbound(as: HTTPServerRequestPart.self) {
            switch part {
            case .head: parts.append("head")
            case .body: parts.append("body")
            case .end: parts.append("end")
            }
        }
        #expect(parts == ["head", "body", "end"])
        // Nothing after it is read as a request.
        try request(channel, .get, "/time/0")
        channel.embeddedEventLoop.run()
        #expect(try responses(channel).isEmpty)
        #expect(try forwarded(channel).isEmpty)
        _ = try channel.finish()
    }

    @Test func anUpgradeHeaderAloneIsAnOrdinaryRequestAndTheConnectionGoesOn() throws {
        let channel = try pipeline(Answers())
        // `Upgrade` without the `upgrade` token in `Connection`: NIO's parser reads on, and
        // Hummingbird answers it as an ordinary keep-alive request.
        try request(channel, .get, "/v2/history/sub-key/s/channel/ch", headers: [.upgrade: "h2c"])
        try channel.writeOutbound(HTTPServerResponsePart.end(nil))
        _ = try responses(channel)  // Hummingbird's (stand-in) answer
        try request(channel, .get, "/time/0")
        channel.embeddedEventLoop.run()
        #expect(try responses(channel) == ["/time/0"], "the next request is still answered")
        // With the token it is an upgrade attempt: nothing after it is read as a request.
        try request(channel, .get, "/v2/ws", headers: [.upgrade: "websocket", .connection: "keep-alive, Upgrade"])
        try request(channel, .get, "/time/0")
        channel.embeddedEventLoop.run()
        #expect(try responses(channel).isEmpty)
        #expect(try forwarded(channel) == ["/v2/history/sub-key/s/channel/ch", "/v2/ws"])
        _ = try channel.finish()
    }

    @Test func anIdleConnectionHummingbirdNeverSawClosesAtShutdown() throws {
        let channel = try pipeline(Answers())
        try request(channel, .get, "/time/0")
        channel.embeddedEventLoop.run()
        #expect(try responses(channel) == ["/time/0"])
        // Hummingbird's handlers are not in this connection's pipeline: the hot path closes it.
        channel.pipeline.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent())
        channel.embeddedEventLoop.run()
        #expect(!channel.isActive)
    }

    @Test func anIdleConnectionHummingbirdServedLeavesShutdownToIt() throws {
        let channel = try pipeline(Answers())
        let quiesces = Quiesces()
        try channel.pipeline.syncOperations.addHandler(quiesces)
        try request(channel, .get, "/v2/history/sub-key/s/channel/ch")
        try channel.writeOutbound(HTTPServerResponsePart.end(nil))
        channel.pipeline.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent())
        channel.embeddedEventLoop.run()
        #expect(quiesces.seen == 1, "Hummingbird's connection handler closes it")
        #expect(channel.isActive)
        _ = try channel.finish()
    }

    @Test func aParseErrorBehindAHotAnswerIsAnsweredAfterItThenCloses() throws {
        let channel = try pipeline(Answers())
        try request(channel, .get, "/time/0")
        channel.pipeline.fireErrorCaught(HTTPParserError.invalidCharactersUsed)
        #expect(channel.isActive)
        channel.embeddedEventLoop.run()
        #expect(try responses(channel) == ["/time/0", Self.parseFailure], "the hot answer first, then the JSON 400")
        #expect(throws: Never.self) { try channel.throwIfErrorCaught() }
        #expect(!channel.isActive, "closed after the answers")
    }

    @Test func requestsWaitingBehindAHotAnswerAreAnsweredBeforeTheParseError() throws {
        let channel = try pipeline(Answers())
        try request(channel, .get, "/time/0")
        try request(channel, .get, "/publish/p/s/0/ch/0/1")
        // A third request cut short by the error: dropped whole, never answered.
        try channel.writeInbound(HTTPServerRequestPart.head(try HTTPRequestHead(HTTPRequest(method: .post, scheme: nil, authority: nil, path: "/publish/p/s/0/ch/0",
                                                                  headerFields: [.contentLength: "10"]))))
        channel.pipeline.fireErrorCaught(HTTPParserError.invalidChunkSize)
        channel.embeddedEventLoop.run()
        #expect(try responses(channel) == ["/time/0", "/publish/p/s/0/ch/0/1", Self.parseFailure])
        #expect(!channel.isActive)
    }

    @Test func aParseErrorBehindAPassedOnRequestWaitsForItsAnswer() throws {
        let channel = try pipeline(Answers())
        try request(channel, .get, "/v2/history/sub-key/s/channel/ch")
        channel.pipeline.fireErrorCaught(HTTPParserError.invalidCharactersUsed)
        channel.embeddedEventLoop.run()
        #expect(try responses(channel).isEmpty, "nothing before Hummingbird's answer")
        #expect(throws: Never.self) { try channel.throwIfErrorCaught() }
        #expect(channel.isActive)
        // Hummingbird answers the history request.
        try channel.writeOutbound(HTTPServerResponsePart.head(HTTPResponseHead(HTTPResponse(status: .ok))))
        try channel.writeOutbound(HTTPServerResponsePart.body(.byteBuffer(ByteBuffer(string: "history"))))
        try channel.writeOutbound(HTTPServerResponsePart.end(nil))
        channel.embeddedEventLoop.run()
        #expect(try responses(channel) == ["history", Self.parseFailure])
        #expect(!channel.isActive)
    }

    @Test func aParseErrorInAPassedOnRequestsBodyIsHummingbirds() throws {
        let channel = try pipeline(Answers())
        try channel.writeInbound(HTTPServerRequestPart.head(try HTTPRequestHead(HTTPRequest(method: .post, scheme: nil, authority: nil, path: "/v1/files/x",
                                                                  headerFields: [.transferEncoding: "chunked"]))))
        channel.pipeline.fireErrorCaught(HTTPParserError.invalidChunkSize)
        #expect(throws: HTTPParserError.self) { try channel.throwIfErrorCaught() }
        #expect(try responses(channel).isEmpty)
        _ = try channel.finish()
    }

    @Test func aParseErrorOnAnIdleConnectionIsAnsweredAtOnce() throws {
        let channel = try pipeline(Answers())
        channel.pipeline.fireErrorCaught(HTTPParserError.headerOverflow)
        channel.embeddedEventLoop.run()
        #expect(try responses(channel) == [Self.parseFailure])
        #expect(!channel.isActive)
    }

    @Test func aHalfClosedConnectionCloses() throws {
        let channel = try pipeline(Answers())
        try request(channel, .get, "/v2/history/sub-key/s/channel/ch")
        channel.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
        channel.embeddedEventLoop.run()
        #expect(!channel.isActive)
    }

    @Test func connectionCloseIsHonoured() throws {
        let channel = try pipeline(Answers())
        try request(channel, .get, "/time/0", headers: [.connection: "close"])
        channel.embeddedEventLoop.run()
        #expect(try responses(channel) == ["/time/0"])
        #expect(!channel.isActive)
    }

    @Test func idleConnectionsCloseAndAnsweringOnesDoNot() throws {
        let channel = try pipeline(Answers())
        // A passed-on request being answered (a long-poll) keeps the connection.
        try request(channel, .get, "/v2/history/sub-key/s/channel/ch")
        channel.embeddedEventLoop.advanceTime(by: Self.idle * 2)
        #expect(channel.isActive)
        try channel.writeOutbound(HTTPServerResponsePart.end(nil))
        // Idle from its answer on: closed one idle timeout later, not before, and no later than
        // one sweep period (a tenth of the timeout) after it.
        channel.embeddedEventLoop.advanceTime(by: Self.idle - .seconds(1))
        #expect(channel.isActive)
        channel.embeddedEventLoop.advanceTime(by: .seconds(1) + .nanoseconds(Self.idle.nanoseconds / 10))
        #expect(!channel.isActive)
    }

    @Test func oneSweepPerLoopChecksTheIdleTimeoutOfEveryConnection() throws {
        let loop = EmbeddedEventLoop()
        let tasks = HotPathTasks()
        func connection() throws -> EmbeddedChannel {
            let channel = EmbeddedChannel(loop: loop)
            try channel.pipeline.syncOperations.addHandler(HotPathHandler(maxBodyBytes: 1024, idleTimeout: Self.idle, tasks: tasks,
                                                                          answer: Answers().answer))
            try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
            return channel
        }
        let idle = try connection()
        let busy = try connection()
        let share = tasks.loopShare(for: loop, idleTimeout: Self.idle)
        #expect(share.count == 2, "both connections are in their loop's one sweep")
        try request(busy, .get, "/v2/history/sub-key/s/channel/ch")
        loop.advanceTime(by: Self.idle + .nanoseconds(Self.idle.nanoseconds / 10))
        #expect(!idle.isActive, "closed by the sweep")
        #expect(busy.isActive, "a request in flight keeps its connection")
        loop.run()
        #expect(share.count == 1, "a closed connection leaves the sweep")
        _ = try busy.finish()
        #expect(share.count == 0)
    }

    @Test func aRequestWhoseBodyStopsDoesNotHoldTheConnection() throws {
        let channel = try pipeline(Answers())
        try channel.writeInbound(HTTPServerRequestPart.head(try HTTPRequestHead(HTTPRequest(method: .post, scheme: nil, authority: nil, path: "/publish/p/s/0/c/0",
                                                                  headerFields: [.contentLength: "10"]))))
        try channel.writeInbound(HTTPServerRequestPart.body(ByteBuffer(string: "12")))
        channel.embeddedEventLoop.advanceTime(by: Self.idle * 2 + .seconds(1))
        #expect(!channel.isActive)
    }

    @Test func shutdownClosesAfterTheHotAnswer() throws {
        let channel = try pipeline(Answers())
        try request(channel, .get, "/time/0")
        channel.pipeline.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent())
        #expect(channel.isActive, "the hot request is answered first")
        channel.embeddedEventLoop.run()
        #expect(try responses(channel) == ["/time/0"])
        #expect(!channel.isActive)
    }

    /// The hot path's own conversion of a request head gives what NIO's conversion gives, for
    /// targets in origin form (which it takes as they are) and in the other forms (which it
    /// hands to NIO's conversion).
    @Test(arguments: [
        "/v2/subscribe/demo/a,b/0?tt=17957854125496649&tr=1&uuid=u%20x&filter-expr=a%3D%3D1",
        "/publish/demo/demo/0/ch/0/%7B%22a%22%3A1%7D?store=0",
        "/time/0", "/", "//evil.example/v2/subscribe/demo/x/0?tt=0", "/a%2Fb/%E2%9C%93?x=y#frag",
        "/path with space", "http://example.com/time/0?x=1", "https://example.com", "*",
    ])
    func theHotRequestIsNIOsConversionWithoutParsingAnOriginFormTarget(uri: String) throws {
        var headers = HTTPHeaders([("Host", "example.com:8080"), ("User-Agent", "t"), ("Cookie", "a=1; b=2"),
                                   ("Content-Length", "0"), ("X-Many", "1"), ("X-Many", "2")])
        headers.add(name: "Connection", value: "keep-alive")
        for method in [HTTPMethod.GET, .POST] {
            let head = HTTPRequestHead(version: .http1_1, method: method, uri: uri, headers: headers)
            let expected = try HTTPRequest(head, secure: false, splitCookie: false)
            #expect(HotPathHandler.hotRequest(head) == expected)
        }
        // Without a Host header, too.
        let bare = HTTPRequestHead(version: .http1_1, method: .GET, uri: uri)
        #expect(HotPathHandler.hotRequest(bare) == (try HTTPRequest(bare, secure: false, splitCookie: false)))
    }

    @Test func theDateHeaderIsIMFFixdate() {
        #expect(HTTPDate.format(0) == "Thu, 01 Jan 1970 00:00:00 GMT")
        #expect(HTTPDate.format(1_795_709_968) == "Thu, 26 Nov 2026 16:19:28 GMT")
        #expect(HTTPDate.format(951_782_400) == "Tue, 29 Feb 2000 00:00:00 GMT")
    }
}
