import ArgumentParser
import Foundation
import NIOCore
import NIOPosix
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// `tether bench floor-server`: a SwiftNIO server that answers every request head it reads with
/// one prebuilt subscribe answer, written as one buffer — the transport of Tether's hot path
/// (its own head reader in front of NIO's HTTP/1 codec, one buffer per answer) with nothing
/// behind it. What a request costs a server on this machine whatever the server does with it —
/// NIO's channel pipeline, loopback TCP, the system calls and the threads' wake-ups — which the
/// `requests` scenario measures as its `floor` kind and subtracts from every other kind
/// (docs/benchmarks.md, "How it measures").
struct BenchFloorServer: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "floor-server",
        abstract: "Serve a fixed answer to every request head: the floor the requests scenario subtracts.",
        discussion: """
            Listens with SwiftNIO on the same event loop group as `tether serve` and, for each \
            request head it reads (up to the blank line; a request must have no body), writes \
            and flushes one prebuilt buffer: 200 with Tether's subscribe headers and a 137-byte \
            body carrying one message. It parses nothing else, as Tether's hot path parses its \
            requests itself and writes each answer as one buffer without NIO's HTTP/1 codec.

            `tether bench --scenario requests` spawns it for its `floor` kind: this server's CPU \
            per request is what NIO and the kernel cost a request on this machine, and each other \
            kind's figure above it is what Tether adds (its head reader and everything after). \
            Prints "Tether listening on http://HOST:PORT" once listening; stops on SIGTERM or \
            SIGINT.
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
        // A parent that ignores these signals would pass that on through exec; this server stops
        // on them whatever it inherited.
        signal(SIGTERM, SIG_DFL)
        signal(SIGINT, SIG_DFL)
        let answer = FloorAnswer.bytes(date: Date())
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
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

/// The floor server's one answer: a subscribe answer carrying one message, with Tether's
/// headers, as the bytes of one HTTP/1.1 response.
enum FloorAnswer {
    /// The body: a subscribe answer carrying one message, in Tether's encoding (137 bytes).
    static let body = #"{"t":{"t":"17957854257227760","r":1},"m":[{"a":"1","f":0,"i":"u1","p":{"t":"17957854125496650","r":1},"k":"demo","c":"ch1","d":"hello"}]}"#

    /// The response, with `Date` the server's start (formatting it per request would measure
    /// the floor server's own work).
    static func bytes(date: Date) -> ByteBuffer {
        ByteBuffer(string: "HTTP/1.1 200 OK\r\n"
            + "Content-Type: text/javascript; charset=\"UTF-8\"\r\n"
            + "Cache-Control: no-cache\r\n"
            + "Access-Control-Allow-Origin: *\r\n"
            + "Access-Control-Allow-Methods: GET, POST, DELETE, OPTIONS\r\n"
            + "Content-Length: \(body.utf8.count)\r\n"
            + "Date: \(httpDate(date))\r\n\r\n"
            + body)
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

/// Writes ``FloorAnswer`` for every request head: every `\r\n\r\n` in the bytes read, found
/// across reads.
final class FloorHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let answer: ByteBuffer
    /// How many bytes of `\r\n\r\n` the bytes read so far end with.
    private var matched = 0

    init(answer: ByteBuffer) { self.answer = answer }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let bytes = unwrapInboundIn(data)
        var heads = 0
        bytes.withUnsafeReadableBytes { raw in
            for byte in raw {
                // `\r\n\r\n`: a `\r` at an even count, a `\n` at an odd one.
                if byte == (matched % 2 == 0 ? 0x0D : 0x0A) {
                    matched += 1
                    if matched == 4 {
                        heads += 1
                        matched = 0
                    }
                } else {
                    matched = byte == 0x0D ? 1 : 0
                }
            }
        }
        for _ in 0..<heads { context.writeAndFlush(wrapOutboundOut(answer), promise: nil) }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}
