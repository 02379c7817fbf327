import Foundation
import NIOCore
import NIOPosix
import Synchronization

// A deliberately small WebSocket client for `tether bench`, in the style of BenchHTTP.swift: the
// upgrade request written as prebuilt bytes, the 101 answer and the server's frames parsed by hand
// (RFC 6455 framing; server frames are unmasked), `messages` frames scanned for envelopes without
// building JSON objects, everything on the connection's event loop. It speaks just enough of the
// session protocol (docs/websocket-protocol.md) to subscribe, receive, answer pings and resume.

/// The wire a bench subscriber uses.
enum BenchTransport: String, Codable, CaseIterable, Sendable {
    /// Back-to-back REST long-polls (`GET /v2/subscribe`).
    case longPoll = "long-poll"
    /// A WebSocket session (`GET /v2/ws`, `tether.v1.json`).
    case websocket
}

/// The wire a bench fan-out's closed-loop publishers use.
enum BenchPublishWire: String, Codable, CaseIterable, Sendable {
    /// `GET /publish/…` over keep-alive HTTP connections.
    case rest
    /// `publish` frames over WebSocket sessions, each with a request id; the next is sent at
    /// each `ack`.
    case websocket
}

/// What a WebSocket bench subscriber knows of its session; kept across its sockets, so a later
/// socket can resume the session.
struct BenchSessionState: Sendable {
    /// The `resumeToken` of the last `welcome`.
    var resumeToken: String?
    /// The cursor: `t.t` of the last `messages` frame processed, or the `subscribed` cursor.
    var cursor: UInt64 = 0
    /// The highest publish timetoken seen (for the order check of a resumed socket).
    var lastTimetoken: UInt64 = 0
    /// `resumed` of the last `welcome`.
    var resumed: Bool?
    /// When the last `hello` was sent (monotonic ns).
    var helloSentAt: UInt64 = 0
    /// When the last `welcome` arrived (monotonic ns).
    var welcomeAt: UInt64 = 0
    /// The close code of a server close frame, if one came.
    var closeCode: Int?
    /// The last `error` or `notice` frame, or a client-side failure.
    var lastError: String?
}

/// What a WebSocket bench subscriber does after the upgrade.
enum BenchWebSocketMode: Sendable {
    /// `hello`, then `subscribe` to the channel; ready at `subscribed`.
    case subscribe(channel: String)
    /// `hello` only (a session with no subscription); ready at `welcome`.
    case helloOnly
    /// `hello` with the resume token and cursor of the progress's session; ready at a
    /// `welcome` with `resumed: true`, then receives the replay.
    case resume
    /// `hello`, then closed-loop `publish` frames (one in flight, the next sent at its `ack`)
    /// until the flood's control stops it: a fan-out's publisher on the session wire.
    case publish(BenchWebSocketFlood)
}

/// What a WebSocket publisher of a fan-out run publishes and where it records the answers: the
/// fan-out's messages (message `id` on channel `id mod channels`, the id from the shared ledger),
/// each a `publish` frame with a request id of its own.
struct BenchWebSocketFlood: Sendable {
    let channels: [String]
    let store: Bool
    let ledger: PublishLedger
    let control: FloodControl
    /// Unique to the run (23 characters of a fresh UUID and a dash), so a later run against the
    /// same server (`--url`, or the next subscriber count) is never answered as a repeat.
    let requestIDPrefix = UUID().uuidString.prefix(23) + "-"

    /// The `publish` frame of message `id` sent at `sentAt`.
    func frame(id: Int, sentAt: UInt64) -> String {
        "{\"type\":\"publish\",\"requestId\":\"\(requestIDPrefix)\(id)\",\"channel\":\"\(channels[id % channels.count])\","
            + "\"message\":{\"i\":\(id),\"s\":\(sentAt)}" + (store ? "}" : ",\"store\":false}")
    }
}

/// One WebSocket subscriber: upgrade, `hello`, `subscribe` (or resume), then every `messages`
/// frame checked for loss, duplication and order like ``BenchSubscriber``'s long-poll answers.
/// In `.publish` mode the same session client is a fan-out's publisher instead.
final class BenchWebSocketSubscriber: ChannelInboundHandler {
    /// Bytes from the socket.
    typealias InboundIn = ByteBuffer
    /// Frame bytes.
    typealias OutboundOut = ByteBuffer

    /// Largest server frame accepted (bounds the receive buffer).
    static let maxFrameBytes = 16 << 20

    private let progress: SubscriberProgress
    private let mode: BenchWebSocketMode
    private let upgradeRequest: String
    private let hello: String
    private var book: DeliveryBook
    private var inbound = ByteBuffer()
    private var upgraded = false
    private var fragments: ByteBuffer?
    private var cursor: UInt64 = 0
    private var resumeToken: String?
    /// A publisher's publish awaiting its `ack`.
    private var inFlight: Int?
    /// A publisher counted itself finished in its flood's control.
    private var publisherFinished = false

    /// Creates a subscriber with uuid `uuid` on the `demo` keyset. In `.resume` mode it continues
    /// the session (and the delivery checks) the progress recorded when its last socket closed.
    init(mode: BenchWebSocketMode, uuid: String, target: BenchTarget, progress: SubscriberProgress, recordLatencyFrom: Int?) {
        self.progress = progress
        self.mode = mode
        upgradeRequest = "GET /v2/ws HTTP/1.1\r\nHost: \(target.host):\(target.port)\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            + "Sec-WebSocket-Protocol: tether.v1.json\r\n\r\n"
        var hello = "{\"type\":\"hello\",\"v\":1,\"subscribeKey\":\"demo\",\"uuid\":\"\(uuid)\""
        if case .publish = mode { hello += ",\"publishKey\":\"demo\"" }
        if case .resume = mode {
            let session = progress.session.withLock { $0 }
            let prior = progress.report.withLock { $0 } ?? SubscriberReport()
            book = DeliveryBook(report: prior, lastTimetoken: session.lastTimetoken)
            cursor = session.cursor
            resumeToken = session.resumeToken
            hello += ",\"resume\":{\"token\":\"\(session.resumeToken ?? "")\",\"cursor\":\"\(session.cursor)\"}"
            progress.ready.store(false, ordering: .releasing)
            progress.closed.store(false, ordering: .releasing)
        } else {
            book = DeliveryBook(recordLatencyFrom: recordLatencyFrom)
        }
        self.hello = hello + "}"
    }

    /// Sends the upgrade request.
    func channelActive(context: ChannelHandlerContext) {
        context.writeAndFlush(NIOAny(context.channel.allocator.buffer(string: upgradeRequest)), promise: nil)
        context.fireChannelActive()
    }

    /// Parses the upgrade answer, then frames.
    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var incoming = unwrapInboundIn(data)
        if inbound.readableBytes == 0 {
            inbound = incoming
        } else {
            inbound.writeBuffer(&incoming)
        }
        if !upgraded {
            let head = inbound.withUnsafeReadableBytes { raw -> (end: Int, status: UInt64?)? in
                guard let end = BenchBytes.find("\r\n\r\n", in: raw, from: 0) else { return nil }
                return (end + 4, end >= 12 ? BenchBytes.decimal(in: raw, from: 9)?.value : nil)
            }
            guard let head else {
                if inbound.readableBytes > 1 << 16 { fail(context, "upgrade answer head too large") }
                return
            }
            guard head.status == 101 else {
                fail(context, "upgrade refused with status \(head.status.map(String.init) ?? "?")")
                return
            }
            inbound.moveReaderIndex(forwardBy: head.end)
            upgraded = true
            progress.session.withLock { $0.helloSentAt = benchNow() }
            send(hello, context: context)
        }
        readFrames(context: context)
    }

    private func readFrames(context: ChannelHandlerContext) {
        while inbound.readableBytes >= 2 {
            let base = inbound.readerIndex
            guard let b0 = inbound.getInteger(at: base, as: UInt8.self), let b1 = inbound.getInteger(at: base + 1, as: UInt8.self)
            else { return }
            var length = Int(b1 & 0x7F)
            var header = 2
            if length == 126 {
                guard let extended = inbound.getInteger(at: base + 2, as: UInt16.self) else { return }
                length = Int(extended)
                header = 4
            } else if length == 127 {
                guard let extended = inbound.getInteger(at: base + 2, as: UInt64.self) else { return }
                guard extended <= UInt64(Self.maxFrameBytes) else {
                    fail(context, "frame of \(extended) bytes")
                    return
                }
                length = Int(extended)
                header = 10
            }
            guard b1 & 0x80 == 0 else {
                fail(context, "masked server frame")
                return
            }
            guard length <= Self.maxFrameBytes else {
                fail(context, "frame of \(length) bytes")
                return
            }
            guard inbound.readableBytes >= header + length,
                  let payload = inbound.getSlice(at: base + header, length: length)
            else { break }
            inbound.moveReaderIndex(forwardBy: header + length)
            let fin = b0 & 0x80 != 0
            switch b0 & 0x0F {
            case 0x1:
                if fin { text(payload, context: context) } else { fragments = payload }
            case 0x0:
                guard var pending = fragments else {
                    fail(context, "continuation without a first fragment")
                    return
                }
                var piece = payload
                pending.writeBuffer(&piece)
                guard pending.readableBytes <= Self.maxFrameBytes else {
                    fail(context, "fragmented message too large")
                    return
                }
                fragments = fin ? nil : pending
                if fin { text(pending, context: context) }
            case 0x8:
                let code = payload.getInteger(at: payload.readerIndex, as: UInt16.self).map(Int.init)
                progress.session.withLock { $0.closeCode = code }
                context.close(promise: nil)
                return
            case 0x9:
                context.writeAndFlush(NIOAny(Self.frame(opcode: 0xA, payload: payload, allocator: context.channel.allocator)), promise: nil)
            case 0xA:
                break
            default:
                fail(context, "unexpected opcode \(b0 & 0x0F)")
                return
            }
        }
        if inbound.readableBytes == 0 {
            inbound.clear()
        } else if inbound.readerIndex > 1 << 16 {
            inbound.discardReadBytes()
        }
    }

    /// Handles one text message (a session protocol frame).
    private func text(_ payload: ByteBuffer, context: ChannelHandlerContext) {
        let now = benchNow()
        payload.withUnsafeReadableBytes { raw in
            if BenchBytes.hasPrefixIgnoringCase("{\"type\":\"messages\"", in: raw, at: 0) {
                book.report.responses += 1
                guard let t = BenchBytes.find("\"t\":{\"t\":\"", in: raw, from: 0),
                      let next = BenchBytes.decimal(in: raw, from: t + 10)
                else {
                    book.report.errors += 1
                    return
                }
                cursor = next.value
                book.scan(raw, from: next.end, now: now, progress: progress)
            } else if BenchBytes.hasPrefixIgnoringCase("{\"type\":\"ping\"", in: raw, at: 0) {
                // {"type":"ping","id":<id>} → {"type":"pong","id":<id>}
                guard let id = BenchBytes.find("\"id\":", in: raw, from: 0), raw.count > id + 5 else { return }
                let value = String(decoding: UnsafeRawBufferPointer(rebasing: raw[(id + 5)..<(raw.count - 1)]), as: UTF8.self)
                send("{\"type\":\"pong\",\"id\":\(value)}", context: context)
            } else if BenchBytes.hasPrefixIgnoringCase("{\"type\":\"welcome\"", in: raw, at: 0) {
                welcome(raw, now: now, context: context)
            } else if BenchBytes.hasPrefixIgnoringCase("{\"type\":\"subscribed\"", in: raw, at: 0) {
                book.report.responses += 1
                if let c = BenchBytes.find("\"cursor\":\"", in: raw, from: 0), let value = BenchBytes.decimal(in: raw, from: c + 10) {
                    cursor = max(cursor, value.value)
                }
                progress.ready.store(true, ordering: .releasing)
            } else if BenchBytes.hasPrefixIgnoringCase("{\"type\":\"error\"", in: raw, at: 0)
                        || BenchBytes.hasPrefixIgnoringCase("{\"type\":\"notice\"", in: raw, at: 0) {
                book.report.errors += 1
                let message = String(decoding: raw.prefix(300), as: UTF8.self)
                progress.session.withLock { $0.lastError = message }
            } else if BenchBytes.hasPrefixIgnoringCase("{\"type\":\"ack\"", in: raw, at: 0) {
                guard case .publish(let flood) = mode, let id = inFlight else { return }
                // An ack carries `timetoken` when the publish was accepted, `error` when it was not.
                let accepted = BenchBytes.find("\"timetoken\":", in: raw, from: 0) != nil
                flood.ledger.record(id: id, status: accepted ? 200 : 0, roundTrip: nil)
                inFlight = nil
                publishNext(flood, context: context)
            }
            // `pong`, `unsubscribed`: nothing to do.
        }
    }

    /// A publisher's next publish, or its end once the flood is stopped.
    private func publishNext(_ flood: BenchWebSocketFlood, context: ChannelHandlerContext) {
        guard !flood.control.stop.load(ordering: .acquiring) else {
            finishPublishing()
            return
        }
        let id = flood.ledger.nextID.wrappingAdd(1, ordering: .relaxed).oldValue
        inFlight = id
        send(flood.frame(id: id, sentAt: benchNow()), context: context)
    }

    private func finishPublishing() {
        guard case .publish(let flood) = mode, !publisherFinished else { return }
        publisherFinished = true
        flood.control.finished.add(1, ordering: .releasing)
    }

    private func welcome(_ raw: UnsafeRawBufferPointer, now: UInt64, context: ChannelHandlerContext) {
        var token: String?
        if let start = BenchBytes.find("\"resumeToken\":\"", in: raw, from: 0),
           let end = BenchBytes.find("\"", in: raw, from: start + 15) {
            token = String(decoding: UnsafeRawBufferPointer(rebasing: raw[(start + 15)..<end]), as: UTF8.self)
        }
        let resumed = BenchBytes.find("\"resumed\":true", in: raw, from: 0) != nil
        resumeToken = token
        progress.session.withLock {
            $0.resumeToken = token
            $0.resumed = resumed
            $0.welcomeAt = now
        }
        switch mode {
        case .subscribe(let channel):
            send("{\"type\":\"subscribe\",\"channels\":[\"\(channel)\"]}", context: context)
        case .helloOnly:
            progress.ready.store(true, ordering: .releasing)
        case .resume:
            if resumed {
                progress.ready.store(true, ordering: .releasing)
            } else {
                fail(context, "the session was not resumed")
            }
        case .publish(let flood):
            progress.ready.store(true, ordering: .releasing)
            publishNext(flood, context: context)
        }
    }

    private func send(_ text: String, context: ChannelHandlerContext) {
        context.writeAndFlush(NIOAny(Self.frame(text: text, allocator: context.channel.allocator)), promise: nil)
    }

    private func fail(_ context: ChannelHandlerContext, _ message: String) {
        book.report.errors += 1
        progress.session.withLock { $0.lastError = message }
        context.close(promise: nil)
    }

    /// Keeps what the next socket of the session needs and reports the checks.
    func channelInactive(context: ChannelHandlerContext) {
        if case .publish(let flood) = mode {
            if inFlight != nil { flood.ledger.errors.add(1, ordering: .relaxed) }
            inFlight = nil
            finishPublishing()
        }
        let report = book.report
        progress.report.withLock { $0 = report }
        progress.session.withLock {
            $0.cursor = cursor
            $0.lastTimetoken = book.lastTimetoken
            if let resumeToken { $0.resumeToken = resumeToken }
        }
        progress.closed.store(true, ordering: .releasing)
        context.fireChannelInactive()
    }

    /// Closes the connection on any error.
    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        progress.session.withLock { $0.lastError = "\(error)" }
        context.close(promise: nil)
    }

    /// A masked client text frame.
    static func frame(text: String, allocator: ByteBufferAllocator) -> ByteBuffer {
        frame(opcode: 0x1, payload: allocator.buffer(string: text), allocator: allocator)
    }

    /// A masked client frame (RFC 6455 §5.2).
    static func frame(opcode: UInt8, payload: ByteBuffer, allocator: ByteBufferAllocator) -> ByteBuffer {
        let count = payload.readableBytes
        var buffer = allocator.buffer(capacity: count + 14)
        buffer.writeInteger(0x80 | opcode)
        if count < 126 {
            buffer.writeInteger(UInt8(0x80 | count))
        } else if count <= 0xFFFF {
            buffer.writeInteger(UInt8(0x80 | 126))
            buffer.writeInteger(UInt16(count))
        } else {
            buffer.writeInteger(UInt8(0x80 | 127))
            buffer.writeInteger(UInt64(count))
        }
        let mask = (0..<4).map { _ in UInt8.random(in: 0...255) }
        buffer.writeBytes(mask)
        payload.withUnsafeReadableBytes { raw in
            for (i, byte) in raw.enumerated() { buffer.writeInteger(byte ^ mask[i & 3]) }
        }
        return buffer
    }
}

extension BenchConnector {
    /// Opens a WebSocket subscriber to `target` on `loop`; `makeHandler` runs on that loop.
    static func connectWebSocket(
        to target: BenchTarget, on loop: any EventLoop, makeHandler: @escaping @Sendable () -> BenchWebSocketSubscriber
    ) async throws -> any Channel {
        try await connectTCP(to: target, on: loop, makeHandler: makeHandler)
    }

    /// Opens `count` WebSocket subscribers spread over the loops of `group`, at most `parallel` at a time.
    static func connectManyWebSockets(
        _ count: Int, to target: BenchTarget, group: any EventLoopGroup, parallel: Int = 128,
        makeHandler: @escaping @Sendable (Int) -> BenchWebSocketSubscriber
    ) async throws -> [any Channel] {
        try await openMany(count, group: group, parallel: parallel) { index, loop in
            try await connectWebSocket(to: target, on: loop) { makeHandler(index) }
        }
    }

    /// Ends the sessions of WebSocket subscribers with `bye`, then closes their connections.
    static func sayGoodbye(_ channels: [any Channel]) {
        for channel in channels {
            let bye = BenchWebSocketSubscriber.frame(text: "{\"type\":\"bye\"}", allocator: channel.allocator)
            channel.writeAndFlush(bye).whenComplete { _ in channel.close(promise: nil) }
        }
    }
}
