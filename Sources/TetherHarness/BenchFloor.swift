import ArgumentParser
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix

/// `tether bench floor-server`: NIO's own HTTP/1 server pipeline and one handler that answers
/// every request with the bytes of a `subscribe-one` answer. What a request costs a server on
/// this machine whatever the server does with it — NIO's pipeline, loopback TCP, the system
/// calls and the threads' wake-ups — which the `requests` scenario measures as its `floor` kind
/// and subtracts from every other kind (docs/benchmarks.md, "How it measures").
struct BenchFloorServer: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "floor-server",
        abstract: "Serve NIO's HTTP/1 pipeline with a fixed answer: the floor the requests scenario subtracts.",
        discussion: """
            Listens with SwiftNIO's own HTTP/1 server pipeline (the one Tether's server is built \
            on, without pipelining assistance or an error handler, as Tether's) on the same \
            event loop group as `tether serve`, and answers every request, whatever its method \
            and path, with 200 and the headers and 137-byte body of a `subscribe-one` answer, \
            written from the read that brought the request. It reads nothing else of a request \
            and keeps no state.

            `tether bench --scenario requests` spawns it for its `floor` kind: the server CPU per \
            request of this server is what NIO and the kernel cost on this machine, and each \
            other kind's figure above it is what Tether adds. Prints \
            "Tether listening on http://HOST:PORT" once listening; stops on SIGTERM or SIGINT.
            """
    )

    @Option(help: "Address to listen on.")
    var host = "127.0.0.1"

    @Option(help: "Port to listen on; 0 picks a free one.")
    var port = 0

    func validate() throws {
        guard (0...65_535).contains(port) else { throw ValidationError("--port must be between 0 and 65535") }
    }

    func run() async throws {
        let answer = FloorAnswer.make(date: Date())
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline(withPipeliningAssistance: false, withErrorHandling: false)
                    try channel.pipeline.syncOperations.addHandler(FloorHandler(answer: answer))
                }
            }
            .bind(host: host, port: port)
            .get()
        guard let bound = channel.localAddress?.port else { throw BenchError("floor-server: no local port after bind") }
        // One line on stdout, unbuffered, as `tether serve` writes it.
        FileHandle.standardOutput.write(Data("Tether listening on http://\(host):\(bound)\n".utf8))
        try await channel.closeFuture.get()
    }
}

/// The floor server's one answer: a `subscribe-one` answer's status, headers and body.
struct FloorAnswer: Sendable {
    /// The body: a subscribe answer carrying one message, as Tether writes it (137 bytes).
    static let body = #"{"t":{"t":"17957854257227760","r":1},"m":[{"a":"1","f":0,"i":"u1","p":{"t":"17957854125496650","r":1},"k":"demo","c":"ch1","d":"hello"}]}"#

    var head: HTTPResponseHead
    var body: ByteBuffer

    /// Tether's subscribe headers; `Date` is the server's start (formatting it per request would
    /// measure the floor server's own work, which is not NIO's).
    static func make(date: Date) -> FloorAnswer {
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: #"text/javascript; charset="UTF-8""#)
        headers.add(name: "Cache-Control", value: "no-cache")
        headers.add(name: "Access-Control-Allow-Origin", value: "*")
        headers.add(name: "Access-Control-Allow-Methods", value: "GET, POST, DELETE, OPTIONS")
        headers.add(name: "Content-Length", value: String(body.utf8.count))
        headers.add(name: "Date", value: httpDate(date))
        return FloorAnswer(head: HTTPResponseHead(version: .http1_1, status: .ok, headers: headers),
                           body: ByteBuffer(string: body))
    }

    /// An IMF-fixdate (RFC 9110 §5.6.7).
    static func httpDate(_ date: Date) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
        return formatter.string(from: date)
    }
}

/// Answers every request's end with ``FloorAnswer``.
final class FloorHandler: ChannelInboundHandler, Sendable {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let answer: FloorAnswer

    init(answer: FloorAnswer) { self.answer = answer }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard case .end = unwrapInboundIn(data) else { return }
        context.write(wrapOutboundOut(.head(answer.head)), promise: nil)
        context.write(wrapOutboundOut(.body(.byteBuffer(answer.body))), promise: nil)
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}
