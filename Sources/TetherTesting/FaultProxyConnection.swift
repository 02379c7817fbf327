import NIOCore
import NIOPosix

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// One proxied client connection and its upstream connection. Every member is used on the
/// client channel's event loop only (the upstream channel runs on the same loop).
final class FaultProxyConnection {
    enum Side { case client, upstream }

    /// Bytes waiting to be written in one direction.
    struct Pipe {
        var queue = CircularBuffer<(buffer: ByteBuffer, readyAt: NIODeadline)>()
        var queuedBytes = 0
        var lastReadyAt = NIODeadline.uptimeNanoseconds(0)
        var nextSendAt = NIODeadline.uptimeNanoseconds(0)
        var wakeUp: Scheduled<Void>?
        var wakeUpAt: NIODeadline?
        /// The source sent end-of-stream (half-close) or went away.
        var sourceEnded = false
        /// The destination's output has been shut down (after the queue drained).
        var finished = false
        var readingPaused = false
    }

    static let highWater = 1 << 20
    static let lowWater = 1 << 18

    let id: Int
    let client: any Channel
    let proxy: FaultProxy
    var upstream: (any Channel)?
    var connectingUpstream = false
    var fault: FaultProxy.Fault
    var toUpstream = Pipe()
    var toClient = Pipe()
    /// Bytes still allowed to the client under `.dropMidResponse`.
    var dropBudget: Int?
    /// The proxy answered (or dropped) this connection itself: discard whatever else arrives.
    var answered = false
    var sawClientBytes = false
    var request: [UInt8] = []
    var closed = false

    init(id: Int, client: any Channel, proxy: FaultProxy, fault: FaultProxy.Fault) {
        self.id = id
        self.client = client
        self.proxy = proxy
        self.fault = fault
        if case .dropMidResponse(let bytes) = fault { dropBudget = max(0, bytes) }
    }

    var eventLoop: any EventLoop { client.eventLoop }

    // MARK: Events

    func clientActive() {
        switch fault {
        case .reset: reset()
        case .pass, .refuse, .latency, .bandwidth, .dropMidResponse: connectUpstream()
        case .blackhole, .captivePortal, .truncatedJSON, .overloaded, .failTLSHandshake: break  // connect on demand
        }
    }

    func read(_ buffer: ByteBuffer, from side: Side) {
        guard !closed, !answered else { return }
        switch side {
        case .client:
            let first = !sawClientBytes
            sawClientBytes = true
            switch fault {
            case .captivePortal, .truncatedJSON, .overloaded:
                request.append(contentsOf: buffer.readableBytesView)
                if request.count > 65536 || request.firstRange(of: Array("\r\n\r\n".utf8)) != nil { answer(with: fault) }
                return
            case .failTLSHandshake where first && buffer.readableBytesView.first == 0x16:
                answer(with: fault)
                return
            case .reset:
                reset()
                return
            default:
                enqueue(buffer, on: \.toUpstream)
            }
            pump(\.toUpstream)
        case .upstream:
            enqueue(buffer, on: \.toClient)
            pump(\.toClient)
        }
    }

    func inputEnded(on side: Side) {
        guard !closed else { return }
        if answered {
            if side == .client { closeAll() }
            return
        }
        switch side {
        case .client: toUpstream.sourceEnded = true; pump(\.toUpstream)
        case .upstream: toClient.sourceEnded = true; pump(\.toClient)
        }
    }

    func inactive(_ side: Side) {
        switch side {
        case .client:
            closeAll()
        case .upstream:
            upstream = nil
            guard !closed else { return }
            toUpstream.queue.removeAll()
            toUpstream.queuedBytes = 0
            toClient.sourceEnded = true
            pump(\.toClient)
        }
    }

    func writabilityChanged(on side: Side) {
        pump(side == .client ? \.toClient : \.toUpstream)
    }

    func faultChanged(to new: FaultProxy.Fault) {
        guard !closed else { return }
        fault = new
        switch new {
        case .reset:
            reset()
            return
        case .dropMidResponse(let bytes):
            dropBudget = max(0, bytes)
        default:
            dropBudget = nil
        }
        pump(\.toUpstream)
        pump(\.toClient)
    }

    // MARK: Forwarding

    private func enqueue(_ buffer: ByteBuffer, on pipe: ReferenceWritableKeyPath<FaultProxyConnection, Pipe>) {
        var readyAt = NIODeadline.now()
        if case .latency(let base, let jitter) = fault {
            let jitterNanos = nanoseconds(jitter)
            let random = jitterNanos > 0 ? Int64.random(in: -jitterNanos...jitterNanos) : 0
            readyAt = readyAt + .nanoseconds(max(0, nanoseconds(base) + random))
        }
        readyAt = max(readyAt, self[keyPath: pipe].lastReadyAt)
        self[keyPath: pipe].lastReadyAt = readyAt
        self[keyPath: pipe].queue.append((buffer, readyAt))
        self[keyPath: pipe].queuedBytes += buffer.readableBytes
        if self[keyPath: pipe].queuedBytes > Self.highWater, !self[keyPath: pipe].readingPaused {
            self[keyPath: pipe].readingPaused = true
            source(of: pipe)?.setAutoRead(false)
        }
    }

    private func source(of pipe: ReferenceWritableKeyPath<FaultProxyConnection, Pipe>) -> (any Channel)? {
        pipe == \.toUpstream ? client : upstream
    }

    private func destination(of pipe: ReferenceWritableKeyPath<FaultProxyConnection, Pipe>) -> (any Channel)? {
        pipe == \.toUpstream ? upstream : client
    }

    /// Writes whatever the fault allows from `pipe` to its destination now, and schedules itself
    /// for what has to wait.
    func pump(_ pipe: ReferenceWritableKeyPath<FaultProxyConnection, Pipe>) {
        guard !closed, !answered else { return }
        if fault == .blackhole { return }
        if pipe == \.toUpstream, upstream == nil, !self[keyPath: pipe].queue.isEmpty {
            connectUpstream()
            return
        }
        guard let destination = destination(of: pipe), destination.isActive else { return }
        var wrote = false
        defer { if wrote { destination.flush() } }
        while let head = self[keyPath: pipe].queue.first {
            guard destination.isWritable else { return }
            let now = NIODeadline.now()
            var chunk = head.buffer
            switch fault {
            case .latency where head.readyAt > now:
                wake(pipe, at: head.readyAt)
                return
            case .bandwidth(let rate):
                let rate = max(1, rate)
                if self[keyPath: pipe].nextSendAt > now {
                    wake(pipe, at: self[keyPath: pipe].nextSendAt)
                    return
                }
                let slice = min(chunk.readableBytes, max(1, rate / 20))
                chunk = head.buffer.getSlice(at: head.buffer.readerIndex, length: slice)!
                self[keyPath: pipe].nextSendAt = now + .nanoseconds(Int64(slice) * 1_000_000_000 / Int64(rate))
            case .dropMidResponse where pipe == \.toClient:
                let budget = dropBudget ?? 0
                if budget == 0 {
                    drop()
                    return
                }
                let slice = min(chunk.readableBytes, budget)
                chunk = head.buffer.getSlice(at: head.buffer.readerIndex, length: slice)!
                dropBudget = budget - slice
            default:
                break
            }
            // Consume `chunk` from the head of the queue.
            let taken = chunk.readableBytes
            if taken == head.buffer.readableBytes {
                self[keyPath: pipe].queue.removeFirst()
            } else {
                var rest = head.buffer
                rest.moveReaderIndex(forwardBy: taken)
                self[keyPath: pipe].queue[self[keyPath: pipe].queue.startIndex] = (rest, head.readyAt)
            }
            self[keyPath: pipe].queuedBytes -= taken
            destination.write(chunk, promise: nil)
            wrote = true
            if pipe == \.toUpstream {
                proxy.count { $0.bytesToUpstream += taken }
            } else {
                proxy.count { $0.bytesToClient += taken }
            }
            if self[keyPath: pipe].readingPaused, self[keyPath: pipe].queuedBytes < Self.lowWater {
                self[keyPath: pipe].readingPaused = false
                source(of: pipe)?.setAutoRead(true)
            }
            if case .dropMidResponse = fault, pipe == \.toClient, dropBudget == 0 {
                destination.flush()
                wrote = false
                drop()
                return
            }
        }
        if self[keyPath: pipe].sourceEnded, !self[keyPath: pipe].finished {
            self[keyPath: pipe].finished = true
            if pipe == \.toClient, upstream == nil {
                // Upstream went away entirely: nothing more can flow either way.
                destination.flush()
                wrote = false
                closeAll()
            } else {
                destination.close(mode: .output, promise: nil)
                if toUpstream.finished, toClient.finished { closeAll() }
            }
        }
    }

    private func wake(_ pipe: ReferenceWritableKeyPath<FaultProxyConnection, Pipe>, at deadline: NIODeadline) {
        if let at = self[keyPath: pipe].wakeUpAt, at <= deadline, self[keyPath: pipe].wakeUp != nil { return }
        self[keyPath: pipe].wakeUp?.cancel()
        self[keyPath: pipe].wakeUpAt = deadline
        let bound = NIOLoopBound(self, eventLoop: eventLoop)
        let isToUpstream = pipe == \.toUpstream
        self[keyPath: pipe].wakeUp = eventLoop.scheduleTask(deadline: deadline) {
            let connection = bound.value
            let pipe: ReferenceWritableKeyPath<FaultProxyConnection, Pipe> = isToUpstream ? \.toUpstream : \.toClient
            connection[keyPath: pipe].wakeUp = nil
            connection[keyPath: pipe].wakeUpAt = nil
            connection.pump(pipe)
        }
    }

    private func connectUpstream() {
        guard upstream == nil, !connectingUpstream, !closed, !answered else { return }
        connectingUpstream = true
        let bound = NIOLoopBound(self, eventLoop: eventLoop)
        ClientBootstrap(group: eventLoop)
            .connectTimeout(.seconds(5))
            .channelOption(.allowRemoteHalfClosure, value: true)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(
                        FaultProxySideHandler(connection: bound.value, side: .upstream))
                }
            }
            .connect(host: proxy.upstreamHost, port: proxy.upstreamPort)
            .whenComplete { result in
                let connection = bound.value
                connection.connectingUpstream = false
                switch result {
                case .success(let channel):
                    guard !connection.closed, !connection.answered else {
                        channel.close(promise: nil)
                        return
                    }
                    connection.upstream = channel
                    connection.proxy.count { $0.forwarded += 1 }
                    connection.pump(\.toUpstream)
                    connection.pump(\.toClient)
                case .failure:
                    connection.proxy.count { $0.upstreamFailures += 1 }
                    connection.reset(counting: false)
                }
            }
    }

    // MARK: Faults that end the connection

    /// Resets the client (a TCP RST) and closes upstream.
    func reset(counting: Bool = true) {
        guard !closed else { return }
        if counting { proxy.count { $0.reset += 1 } }
        if let provider = client as? any SocketOptionProvider {
            _ = provider.setSoLinger(linger(l_onoff: 1, l_linger: 0))
        }
        closeAll()
    }

    /// Answers the client in the proxy's name and closes.
    private func answer(with fault: FaultProxy.Fault) {
        answered = true
        let reply: [UInt8]
        switch fault {
        case .captivePortal: reply = FaultProxyReplies.captivePortal
        case .truncatedJSON: reply = FaultProxyReplies.truncatedJSON
        case .overloaded(let seconds): reply = FaultProxyReplies.overloaded(retryAfterSeconds: seconds)
        default: reply = FaultProxyReplies.notTLS
        }
        proxy.count {
            $0.answered += 1
            $0.bytesToClient += reply.count
        }
        upstream?.close(promise: nil)
        client.writeAndFlush(client.allocator.buffer(bytes: reply), promise: nil)
        finishClient()
    }

    /// Ends the response stream after the budget of `.dropMidResponse`.
    private func drop() {
        answered = true
        proxy.count { $0.dropped += 1 }
        upstream?.close(promise: nil)
        finishClient()
    }

    /// Half-closes towards the client (a FIN after what was written), keeps reading (and
    /// discarding) so that unread bytes do not turn the close into a reset, and closes fully when
    /// the client closes or after a grace period.
    private func finishClient() {
        client.close(mode: .output, promise: nil)
        let bound = NIOLoopBound(self, eventLoop: eventLoop)
        eventLoop.scheduleTask(in: .seconds(2)) { bound.value.closeAll() }
    }

    func closeAll() {
        if !closed {
            closed = true
            toUpstream.wakeUp?.cancel()
            toClient.wakeUp?.cancel()
            toUpstream.queue.removeAll()
            toClient.queue.removeAll()
        }
        client.close(promise: nil)
        upstream?.close(promise: nil)
        proxy.connectionClosed(id)
    }
}

/// Relays one side's events to its ``FaultProxyConnection``.
final class FaultProxySideHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer

    let connection: FaultProxyConnection
    let side: FaultProxyConnection.Side

    init(connection: FaultProxyConnection, side: FaultProxyConnection.Side) {
        self.connection = connection
        self.side = side
    }

    func channelActive(context: ChannelHandlerContext) {
        if side == .client { connection.clientActive() }
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        connection.read(unwrapInboundIn(data), from: side)
    }

    func channelInactive(context: ChannelHandlerContext) {
        connection.inactive(side)
        context.fireChannelInactive()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { connection.writabilityChanged(on: side) }
        context.fireChannelWritabilityChanged()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case ChannelEvent.inputClosed = event {
            connection.inputEnded(on: side)
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // A reset from upstream becomes a reset towards the client, like a transparent path.
        if side == .upstream, let error = error as? IOError, error.errnoCode == ECONNRESET {
            connection.reset(counting: false)
        } else {
            context.close(promise: nil)
        }
    }
}

extension Channel {
    fileprivate func setAutoRead(_ on: Bool) {
        try? syncOptions?.setOption(.autoRead, value: on)
        if on { read() }
    }
}

func nanoseconds(_ duration: Duration) -> Int64 {
    let (seconds, attoseconds) = duration.components
    return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
}

/// The canned answers of the answering faults.
enum FaultProxyReplies {
    static let portalPage = """
        <!DOCTYPE html>
        <html><head><title>Sign in to Wi-Fi</title></head>
        <body><h1>Welcome to Free Airport Wi-Fi</h1>
        <p>Please accept the terms of use to continue.</p>
        <form method="post" action="/login"><button>Accept and connect</button></form>
        </body></html>

        """

    static let captivePortal: [UInt8] = Array("""
        HTTP/1.1 200 OK\r
        Content-Type: text/html; charset=utf-8\r
        Content-Length: \(portalPage.utf8.count)\r
        Cache-Control: no-store\r
        Connection: close\r
        \r
        \(portalPage)
        """.utf8)

    /// A subscribe-shaped JSON document; the reply carries its first half.
    static let fullJSON = """
        {"t":{"t":"17000000000000000","r":1},"m":[{"a":"1","f":0,"i":"fault-proxy","p":{"t":"17000000000000000","r":1},\
        "k":"demo","c":"chaos","d":{"text":"this message was cut in half by the fault proxy"}}]}
        """

    static var truncatedBody: String { String(fullJSON.prefix(fullJSON.count / 2)) }

    static let truncatedJSON: [UInt8] = Array("""
        HTTP/1.1 200 OK\r
        Content-Type: application/json\r
        Content-Length: \(truncatedBody.utf8.count)\r
        Connection: close\r
        \r
        \(truncatedBody)
        """.utf8)

    static let overloadedBody = #"{"status":429,"error":true,"service":"Balancer","message":"Too many requests."}"#

    static func overloaded(retryAfterSeconds: Int) -> [UInt8] {
        Array("""
            HTTP/1.1 429 Too Many Requests\r
            Content-Type: application/json\r
            Content-Length: \(overloadedBody.utf8.count)\r
            Retry-After: \(retryAfterSeconds)\r
            Connection: close\r
            \r
            \(overloadedBody)
            """.utf8)
    }

    static let notTLS: [UInt8] = Array("HTTP/1.1 400 Bad Request\r\nContent-Length: 16\r\n\r\nthis is not TLS\n".utf8)
}
