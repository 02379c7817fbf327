import NIOCore
import NIOPosix
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// A deliberately small HTTP/1.1 client for `tether bench`: one keep-alive connection per
// subscriber or publisher, requests written as prebuilt bytes, responses parsed by hand and
// handled on the connection's event loop. No per-request tasks, futures or header
// dictionaries, so the client spends as little of the shared CPUs as possible.

/// Where the server under test listens.
struct BenchTarget: Sendable {
    /// Host name or address to connect to.
    var host: String
    /// TCP port.
    var port: Int

    /// The base URL, as printed by `tether serve`.
    var url: String { "http://\(host.contains(":") ? "[\(host)]" : host):\(port)" }

    /// Parses `http://host:port` (a path, if any, is ignored).
    init?(url: String) {
        guard url.hasPrefix("http://") else { return nil }
        var rest = url.dropFirst("http://".count)
        if let slash = rest.firstIndex(of: "/") { rest = rest[..<slash] }
        var hostPart: Substring
        var portPart: Substring?
        if rest.hasPrefix("[") {
            guard let close = rest.firstIndex(of: "]") else { return nil }
            hostPart = rest[rest.index(after: rest.startIndex)..<close]
            let after = rest[rest.index(after: close)...]
            if after.hasPrefix(":") { portPart = after.dropFirst() }
        } else if let colon = rest.lastIndex(of: ":") {
            hostPart = rest[..<colon]
            portPart = rest[rest.index(after: colon)...]
        } else {
            hostPart = rest
        }
        guard !hostPart.isEmpty else { return nil }
        let port = portPart.map { Int($0) } ?? 80
        guard let port, (1...65535).contains(port) else { return nil }
        self.host = String(hostPart)
        self.port = port
    }

    /// Creates a target from its parts.
    init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    /// The request head ending every request: `HTTP/1.1`, `Host`, blank line.
    var requestTrailer: String { " HTTP/1.1\r\nHost: \(host):\(port)\r\n\r\n" }
}

/// An error of the bench client.
struct BenchError: Error, CustomStringConvertible {
    /// What went wrong.
    var description: String

    /// Creates an error.
    init(_ description: String) { self.description = description }
}

/// One HTTP response as the bench client sees it.
struct BenchResponse {
    /// Status code.
    var status: Int
    /// The (de-chunked) body.
    var body: ByteBuffer
}

/// An incremental HTTP/1.1 response parser: status line, `Content-Length` or chunked body.
/// Enough for Tether's responses; not a general HTTP implementation.
struct BenchResponseParser {
    private var buffer = ByteBuffer()

    private enum Parse {
        /// More bytes are needed.
        case incomplete
        /// A response: its status, body byte ranges, and total length.
        case complete(status: Int, body: [Range<Int>], consumed: Int)
    }

    /// Adds bytes read from the connection.
    mutating func append(_ incoming: ByteBuffer) {
        if buffer.readableBytes == 0 {
            buffer = incoming
        } else {
            var incoming = incoming
            buffer.writeBuffer(&incoming)
        }
    }

    /// The next complete response, if the buffered bytes hold one.
    mutating func next() throws(BenchError) -> BenchResponse? {
        let parse = try buffer.withUnsafeReadableBytes { (raw: UnsafeRawBufferPointer) throws(BenchError) -> Parse in
            try Self.parse(raw)
        }
        guard case .complete(let status, let ranges, let consumed) = parse else { return nil }
        let base = buffer.readerIndex
        var body: ByteBuffer
        if ranges.count == 1, let range = ranges.first {
            body = buffer.getSlice(at: base + range.lowerBound, length: range.count) ?? ByteBuffer()
        } else {
            body = ByteBuffer()
            body.reserveCapacity(ranges.reduce(0) { $0 + $1.count })
            for range in ranges {
                if var piece = buffer.getSlice(at: base + range.lowerBound, length: range.count) {
                    body.writeBuffer(&piece)
                }
            }
        }
        buffer.moveReaderIndex(forwardBy: consumed)
        if buffer.readableBytes == 0 {
            buffer.clear()
        } else if buffer.readerIndex > 1 << 16 {
            buffer.discardReadBytes()
        }
        return BenchResponse(status: status, body: body)
    }

    private static func parse(_ raw: UnsafeRawBufferPointer) throws(BenchError) -> Parse {
        guard let headerEnd = BenchBytes.find("\r\n\r\n", in: raw, from: 0) else {
            if raw.count > 1 << 20 { throw BenchError("response head too large") }
            return .incomplete
        }
        // "HTTP/1.1 200 OK"
        guard headerEnd >= 12, raw[0] == UInt8(ascii: "H"),
              let code = BenchBytes.decimal(in: raw, from: 9)?.value, code >= 100 && code < 600
        else { throw BenchError("malformed status line") }
        let status = Int(code)
        var contentLength: Int?
        var chunked = false
        var lineStart = (BenchBytes.find("\r\n", in: raw, from: 0) ?? headerEnd) + 2
        while lineStart < headerEnd {
            let lineEnd = BenchBytes.find("\r\n", in: raw, from: lineStart) ?? headerEnd
            if BenchBytes.hasPrefixIgnoringCase("content-length:", in: raw, at: lineStart) {
                var p = lineStart + 15
                while p < lineEnd, raw[p] == UInt8(ascii: " ") { p += 1 }
                contentLength = BenchBytes.decimal(in: raw, from: p).map { Int($0.value) }
            } else if BenchBytes.hasPrefixIgnoringCase("transfer-encoding:", in: raw, at: lineStart) {
                chunked = BenchBytes.find("chunked", in: UnsafeRawBufferPointer(rebasing: raw[lineStart..<lineEnd]), from: 0) != nil
            }
            lineStart = lineEnd + 2
        }
        let bodyStart = headerEnd + 4
        if chunked {
            var ranges: [Range<Int>] = []
            var p = bodyStart
            while true {
                guard let sizeEnd = BenchBytes.find("\r\n", in: raw, from: p) else { return .incomplete }
                var size = 0
                var q = p
                while q < sizeEnd, let digit = BenchBytes.hexValue(raw[q]) {
                    size = size * 16 + digit
                    q += 1
                }
                guard q > p else { throw BenchError("malformed chunk size") }
                p = sizeEnd + 2
                if size == 0 {
                    if raw.count >= p + 2, raw[p] == 13, raw[p + 1] == 10 {
                        return .complete(status: status, body: ranges, consumed: p + 2)
                    }
                    guard let trailerEnd = BenchBytes.find("\r\n\r\n", in: raw, from: p) else { return .incomplete }
                    return .complete(status: status, body: ranges, consumed: trailerEnd + 4)
                }
                guard raw.count >= p + size + 2 else { return .incomplete }
                ranges.append(p..<(p + size))
                p += size + 2
            }
        }
        let length = contentLength ?? 0
        guard raw.count >= bodyStart + length else { return .incomplete }
        return .complete(status: status, body: [bodyStart..<(bodyStart + length)], consumed: bodyStart + length)
    }
}

/// Byte-level helpers for scanning responses without building strings.
enum BenchBytes {
    /// The offset of the first occurrence of `pattern` in `raw` at or after `from`.
    static func find(_ pattern: StaticString, in raw: UnsafeRawBufferPointer, from: Int) -> Int? {
        let count = pattern.utf8CodeUnitCount
        guard count > 0, from >= 0, from + count <= raw.count, let base = raw.baseAddress else { return nil }
        let needle = pattern.utf8Start
        let first = Int32(needle[0])
        var offset = from
        let lastStart = raw.count - count
        while offset <= lastStart {
            guard let hit = memchr(base + offset, first, lastStart - offset + 1) else { return nil }
            let position = base.distance(to: UnsafeRawPointer(hit))
            if memcmp(base + position, needle, count) == 0 { return position }
            offset = position + 1
        }
        return nil
    }

    /// Parses the unsigned decimal number starting at `from`; returns it and the offset after it.
    static func decimal(in raw: UnsafeRawBufferPointer, from: Int) -> (value: UInt64, end: Int)? {
        var p = from
        var value: UInt64 = 0
        while p < raw.count {
            let byte = raw[p]
            guard byte >= 0x30 && byte <= 0x39 else { break }
            value = value &* 10 &+ UInt64(byte - 0x30)
            p += 1
        }
        return p > from ? (value, p) : nil
    }

    /// The value of a hexadecimal digit.
    static func hexValue(_ byte: UInt8) -> Int? {
        switch byte {
        case 0x30...0x39: Int(byte - 0x30)
        case 0x41...0x46: Int(byte - 0x41 + 10)
        case 0x61...0x66: Int(byte - 0x61 + 10)
        default: nil
        }
    }

    /// Whether the bytes at `offset` start with `prefix` (ASCII, lower-case), ignoring case.
    static func hasPrefixIgnoringCase(_ prefix: StaticString, in raw: UnsafeRawBufferPointer, at offset: Int) -> Bool {
        let count = prefix.utf8CodeUnitCount
        guard offset + count <= raw.count else { return false }
        let p = prefix.utf8Start
        for i in 0..<count where raw[offset + i] | 0x20 != p[i] | 0x20 {
            return false
        }
        return true
    }
}

/// What a bench connection does; every call happens on the connection's event loop.
protocol BenchConnectionLogic: AnyObject, SendableMetatype {
    /// The connection is established.
    func connectionActive(_ context: ChannelHandlerContext)
    /// A complete response arrived.
    func received(_ response: BenchResponse, context: ChannelHandlerContext)
    /// The connection closed (for whatever reason).
    func connectionClosed()
}

/// Drives one keep-alive connection: parses responses and hands them to its logic.
final class BenchConnectionHandler<Logic: BenchConnectionLogic>: ChannelInboundHandler {
    /// Bytes from the socket.
    typealias InboundIn = ByteBuffer
    /// Request bytes.
    typealias OutboundOut = ByteBuffer

    private let logic: Logic
    private var parser = BenchResponseParser()

    /// Creates a handler driving `logic`.
    init(logic: Logic) { self.logic = logic }

    /// Tells the logic the connection is up.
    func channelActive(context: ChannelHandlerContext) {
        logic.connectionActive(context)
        context.fireChannelActive()
    }

    /// Parses responses and hands each to the logic.
    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        parser.append(unwrapInboundIn(data))
        do {
            while let response = try parser.next() {
                logic.received(response, context: context)
            }
        } catch {
            context.close(promise: nil)
        }
    }

    /// Tells the logic the connection closed.
    func channelInactive(context: ChannelHandlerContext) {
        logic.connectionClosed()
        context.fireChannelInactive()
    }

    /// Closes the connection on any error.
    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}

/// Opens bench connections.
enum BenchConnector {
    /// Connects to `target` on `loop`; `makeLogic` runs on that loop to create the connection's logic.
    static func connect<Logic: BenchConnectionLogic>(
        to target: BenchTarget, on loop: any EventLoop, makeLogic: @escaping @Sendable () -> Logic
    ) async throws -> any Channel {
        try await connectTCP(to: target, on: loop) { BenchConnectionHandler(logic: makeLogic()) }
    }

    /// A TCP connection to `target` on `loop` (no Nagle, 10 s connect timeout) whose only handler
    /// `makeHandler` creates on that loop.
    static func connectTCP<Handler: ChannelHandler>(
        to target: BenchTarget, on loop: any EventLoop, makeHandler: @escaping @Sendable () -> Handler
    ) async throws -> any Channel {
        try await ClientBootstrap(group: loop)
            .channelOption(ChannelOptions.socketOption(.tcp_nodelay), value: 1)
            .connectTimeout(.seconds(10))
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(makeHandler())
                }
            }
            .connect(host: target.host, port: target.port)
            .get()
    }

    /// Opens `count` connections spread over the loops of `group`, at most `parallel` connects at a time.
    static func connectMany<Logic: BenchConnectionLogic>(
        _ count: Int, to target: BenchTarget, group: any EventLoopGroup, parallel: Int = 128,
        makeLogic: @escaping @Sendable (Int) -> Logic
    ) async throws -> [any Channel] {
        try await openMany(count, group: group, parallel: parallel) { index, loop in
            try await connect(to: target, on: loop) { makeLogic(index) }
        }
    }

    /// Runs `open` for indexes `0..<count`, each on the next loop of `group`, at most `parallel` at
    /// a time; returns the channels in index order.
    static func openMany(
        _ count: Int, group: any EventLoopGroup, parallel: Int,
        open: @escaping @Sendable (Int, any EventLoop) async throws -> any Channel
    ) async throws -> [any Channel] {
        var channels: [(Int, any Channel)] = []
        channels.reserveCapacity(count)
        var next = 0
        try await withThrowingTaskGroup(of: (Int, any Channel).self) { tasks in
            func start() {
                let index = next
                next += 1
                let loop = group.next()
                tasks.addTask { (index, try await open(index, loop)) }
            }
            while next < min(count, parallel) { start() }
            while let opened = try await tasks.next() {
                channels.append(opened)
                if next < count { start() }
            }
        }
        return channels.sorted { $0.0 < $1.0 }.map(\.1)
    }

    /// One request on a fresh connection, for setup and checks (`/health`, handshakes).
    static func get(_ path: String, target: BenchTarget, on loop: any EventLoop) async throws -> BenchResponse {
        let promise = loop.makePromise(of: (Int, ByteBuffer).self)
        let request = "GET \(path)\(target.requestTrailer)"
        let channel = try await connect(to: target, on: loop) { OneShotRequest(request: request, promise: promise) }
        defer { channel.close(promise: nil) }
        let (status, body) = try await promise.futureResult.get()
        return BenchResponse(status: status, body: body)
    }
}

/// Sends one request and completes a promise with the response.
private final class OneShotRequest: BenchConnectionLogic {
    /// The request bytes.
    let request: String
    /// Completed with the response.
    let promise: EventLoopPromise<(Int, ByteBuffer)>

    /// Creates a one-shot request.
    init(request: String, promise: EventLoopPromise<(Int, ByteBuffer)>) {
        self.request = request
        self.promise = promise
    }

    /// Sends the request.
    func connectionActive(_ context: ChannelHandlerContext) {
        context.writeAndFlush(NIOAny(context.channel.allocator.buffer(string: request)), promise: nil)
    }

    /// Completes the promise and closes.
    func received(_ response: BenchResponse, context: ChannelHandlerContext) {
        promise.succeed((response.status, response.body))
        context.close(promise: nil)
    }

    /// Fails the promise if no response came.
    func connectionClosed() {
        promise.fail(BenchError("connection closed before a response"))
    }
}
