import NIOCore
import NIOPosix

/// A TCP server below HTTP, for failures that happen before any HTTP exchange: it answers the
/// first bytes a client sends (for example a TLS ClientHello) with fixed garbage and closes, which
/// makes the client's TLS handshake fail.
public final class RawServer: Sendable {
    private let channel: any Channel
    private let group: MultiThreadedEventLoopGroup

    /// The listening port.
    public let port: Int

    /// `127.0.0.1:<port>`.
    public var origin: String { "127.0.0.1:\(port)" }

    private init(channel: any Channel, group: MultiThreadedEventLoopGroup, port: Int) {
        self.channel = channel
        self.group = group
        self.port = port
    }

    /// Starts a server that replies `reply` to the first read and closes the connection.
    public static func start(replyingWith reply: [UInt8] = Array("HTTP/1.1 400 Bad Request\r\n\r\nthis is not TLS\r\n".utf8))
        async throws -> RawServer
    {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let channel = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(GarbageReplier(reply: reply))
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        return RawServer(channel: channel, group: group, port: channel.localAddress?.port ?? 0)
    }

    /// A loopback port with nothing listening on it (bound, then released).
    public static func unusedPort() async throws -> Int {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let channel = try await ServerBootstrap(group: group).bind(host: "127.0.0.1", port: 0).get()
        let port = channel.localAddress?.port ?? 0
        try await channel.close()
        try await group.shutdownGracefully()
        return port
    }

    /// Stops listening and the event loop.
    public func stop() async throws {
        try? await channel.close()
        try await group.shutdownGracefully()
    }
}

final class GarbageReplier: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    let reply: [UInt8]
    init(reply: [UInt8]) { self.reply = reply }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let channel = context.channel
        channel.writeAndFlush(channel.allocator.buffer(bytes: reply)).whenComplete { _ in channel.close(promise: nil) }
    }
}
