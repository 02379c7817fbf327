import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOWebSocket
import Testing
import TetherProtocol
@testable import TetherServer

/// A WebSocket session's frames go to its channel at once while the channel is writable and
/// nothing is held before them; otherwise they are held, in order, and written when the channel
/// is writable again (``OutboundQueue/pump()``). These pin the order of a session's frames, the
/// bound that marks a slow consumer, and the close frame's place and timeout.
@Suite struct OutboundQueueTests {
    /// What went out: each text frame's text, and `close:<code>` for a close frame.
    private static func written(_ channel: EmbeddedChannel) throws -> [String] {
        var out: [String] = []
        while let frame = try channel.readOutbound(as: WebSocketFrame.self) {
            switch frame.opcode {
            case .text: out.append(String(buffer: frame.data))
            case .connectionClose: out.append("close:\(frame.data.getInteger(at: frame.data.readerIndex, as: UInt16.self) ?? 0)")
            default: out.append("\(frame.opcode)")
            }
        }
        return out
    }

    @Test func framesGoOutAtOnceAndInOrderAfterTheChannelStalls() throws {
        let channel = EmbeddedChannel()
        let queue = OutboundQueue(channel: channel, maxFrames: 4, maxBytes: 1024)
        queue.attach()
        #expect(queue.send("a"))
        #expect(try Self.written(channel) == ["a"], "written at once while writable")

        channel.isWritable = false
        #expect(queue.send("b"))
        #expect(queue.send("c"))
        #expect(try Self.written(channel) == [], "held while the channel takes no more")
        #expect(queue.held == 2)

        channel.isWritable = true
        #expect(queue.send("d"))
        #expect(try Self.written(channel) == ["b", "c", "d"], "a frame sent after held ones goes behind them")
        #expect(queue.held == 0)

        channel.isWritable = false
        #expect(queue.send("e"))
        channel.isWritable = true
        queue.pump()
        #expect(try Self.written(channel) == ["e"], "the channel's writability change writes what is held")
        _ = try channel.finish()
    }

    /// A close frame's payload fits a control frame (RFC 6455 §5.5: 125 bytes, the code included)
    /// whatever the reason: a long one is cut at a character's end, never inside one.
    @Test func aCloseReasonIsCutToAControlFramesSize() throws {
        let channel = EmbeddedChannel()
        let queue = OutboundQueue(channel: channel, maxFrames: 4, maxBytes: 1024)
        queue.attach()
        let reason = "unknown frame type \"" + String(repeating: "😀", count: 90) + "\""
        queue.close(code: 4404, reason: reason)
        let frame = try #require(try channel.readOutbound(as: WebSocketFrame.self))
        #expect(frame.opcode == .connectionClose)
        #expect(frame.data.readableBytes <= 125, "\(frame.data.readableBytes) bytes")
        var payload = frame.data
        let code = payload.readInteger(as: UInt16.self)
        #expect(code == 4404)
        let text = payload.readString(length: payload.readableBytes) ?? ""
        #expect(reason.hasPrefix(text) && text.hasSuffix("😀"), "cut after a whole character: \(text)")
        #expect(OutboundQueue.closeReason("short") == "short")
        _ = try channel.finish()
    }

    /// A delivery frame counts as undelivered until its write succeeds: held, dropped, failed or
    /// discarded ones keep the oldest such frame's `after`.
    @Test func deliveryFramesCountAsUndeliveredUntilWritten() throws {
        let channel = EmbeddedChannel()
        let queue = OutboundQueue(channel: channel, maxFrames: 2, maxBytes: 1024)
        queue.attach()
        #expect(queue.send("a", after: Timetoken(10)))
        #expect(queue.send("notice"))  // not a delivery frame
        #expect(queue.send("b", after: Timetoken(20)))
        #expect(try Self.written(channel) == ["a", "notice", "b"])
        #expect(queue.undeliveredAfter == nil, "written: confirmed")

        channel.isWritable = false
        #expect(queue.send("c", after: Timetoken(30)))
        #expect(queue.send("d", after: Timetoken(40)))
        #expect(queue.undeliveredAfter == Timetoken(30), "held: the oldest held frame's")
        #expect(!queue.send("e", after: Timetoken(50)), "overflow")
        #expect(queue.undeliveredAfter == Timetoken(30))

        channel.isWritable = true
        queue.pump()
        #expect(try Self.written(channel) == ["c", "d"])
        #expect(queue.undeliveredAfter == Timetoken(50), "the dropped frame stays")

        let other = EmbeddedChannel()
        let held = OutboundQueue(channel: other, maxFrames: 4, maxBytes: 1024)
        held.attach()
        other.isWritable = false
        #expect(held.send("f", after: Timetoken(60)))
        #expect(held.send("g", after: Timetoken(70)))
        held.finish()
        #expect(held.undeliveredAfter == Timetoken(60), "discarded with the queue: still undelivered")
        #expect(held.send("h", after: Timetoken(55)))
        #expect(held.undeliveredAfter == Timetoken(55), "dropped after the finish")
        _ = try channel.finish()
        _ = try other.finish()
    }

    @Test func aFullBufferIsASlowConsumer() throws {
        let channel = EmbeddedChannel()
        let queue = OutboundQueue(channel: channel, maxFrames: 2, maxBytes: 1024)
        queue.attach()
        channel.isWritable = false
        #expect(queue.send("a"))
        #expect(queue.send("b"))
        #expect(!queue.send("c"), "over the bound: the caller closes the connection")
        _ = try channel.finish()
    }

    @Test func theCloseFrameFollowsWhatWasSentBeforeItAndNothingFollowsIt() throws {
        let channel = EmbeddedChannel()
        let closed = channel.closeFuture
        let queue = OutboundQueue(channel: channel, maxFrames: 4, maxBytes: 1024)
        queue.attach()
        channel.isWritable = false
        queue.send("before")
        queue.close(code: 4001, reason: "ping timeout")
        #expect(queue.isClosing)
        #expect(try Self.written(channel) == [], "the close frame waits behind the held frame")
        queue.send("after")
        channel.isWritable = true
        queue.pump()
        #expect(try Self.written(channel) == ["before", "close:4001"])
        #expect(queue.send("late"), "a frame after the close frame is dropped, not an overflow")
        #expect(try Self.written(channel) == [])

        // The client does not answer the close: the connection is cut off after the timeout.
        let ended = NIOLockedValueBox(false)
        closed.whenComplete { _ in ended.withLockedValue { $0 = true } }
        channel.embeddedEventLoop.advanceTime(by: OutboundQueue.closeTimeout - .milliseconds(1))
        #expect(!ended.withLockedValue { $0 })
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(1))
        #expect(ended.withLockedValue { $0 })
    }

    @Test func aFinishedQueueWritesNothing() throws {
        let channel = EmbeddedChannel()
        let queue = OutboundQueue(channel: channel, maxFrames: 4, maxBytes: 1024)
        queue.attach()
        channel.isWritable = false
        queue.send("held")
        queue.finish()
        channel.isWritable = true
        queue.pump()
        queue.close(code: 1000, reason: "bye")
        #expect(queue.send("late"))
        #expect(try Self.written(channel) == [], "the socket ended: what was held is dropped")
        _ = try channel.finish()
    }

    @Test func nothingIsWrittenBeforeTheSessionsHandlerIsInThePipeline() throws {
        // An upgrade is accepted at the request's head; until the pipeline changes at its end,
        // a frame written to the channel would reach HTTP's handlers.
        let channel = EmbeddedChannel()
        let queue = OutboundQueue(channel: channel, maxFrames: 4, maxBytes: 1024)
        #expect(queue.send("early"))
        queue.close(code: 4002, reason: "hello timeout")
        queue.pump()
        #expect(try Self.written(channel) == [], "held until attached")
        queue.attach()
        #expect(try Self.written(channel) == ["early", "close:4002"])
        _ = try channel.finish()
    }
}
