import Testing
import TetherTesting
@testable import TetherServer

/// A WebSocket session writes a frame straight to its channel only while its writer waits with
/// nothing queued (``OutboundQueue/writerIsWaiting``); otherwise the frame is queued behind what
/// the writer has yet to write. These pin that answer, on which the order of a session's frames
/// rests.
@Suite struct OutboundQueueTests {
    private static func text(_ item: OutboundItem?) -> String? {
        guard case .text(let text)? = item else { return nil }
        return text
    }

    @Test func theWriterIsWaitingOnlyWhileItWaitsWithNothingQueued() async {
        let queue = OutboundQueue(maxFrames: 4, maxBytes: 1024)
        #expect(!queue.writerIsWaiting, "no writer has asked yet")
        queue.send("a")
        #expect(!queue.writerIsWaiting)
        #expect(Self.text(await queue.next()) == "a", "a queued frame is taken without waiting")

        let writer = Task { await queue.next(onEventLoop: true) }
        #expect(await eventually { queue.writerIsWaiting })
        queue.send("b")
        #expect(!queue.writerIsWaiting, "a frame handed to the waiting writer ends its wait")
        #expect(Self.text(await writer.value) == "b")

        // Frames queued while the writer is busy: it is not waiting until it has taken them all.
        queue.send("c")
        queue.send("d")
        #expect(!queue.writerIsWaiting)
        #expect(Self.text(await queue.next()) == "c")
        #expect(Self.text(await queue.next()) == "d")
        let next = Task { await queue.next(onEventLoop: true) }
        #expect(await eventually { queue.writerIsWaiting })
        queue.close(code: 1000, reason: "bye")
        #expect(!queue.writerIsWaiting, "after the close frame nothing more is written")
        guard case .close(1000, "bye")? = await next.value else {
            Issue.record("the waiting writer gets the close frame")
            return
        }
        #expect(await queue.next() == nil)
        #expect(!queue.writerIsWaiting)
    }

    @Test func aWriterOffTheEventLoopIsNeverWrittenAround() async {
        // Off the loop, NIO's async writer hands a frame to the channel in a job of its own
        // after `write` returns: a frame written straight to the channel could overtake it.
        let queue = OutboundQueue(maxFrames: 4, maxBytes: 1024)
        let writer = Task { await queue.next(onEventLoop: false) }
        #expect(await eventually { queue.writerParked })
        #expect(!queue.writerIsWaiting)
        queue.finish()
        #expect(await writer.value == nil)
    }

    @Test func aFinishedQueueHasNoWaitingWriter() async {
        let queue = OutboundQueue(maxFrames: 4, maxBytes: 1024)
        let writer = Task { await queue.next(onEventLoop: true) }
        #expect(await eventually { queue.writerIsWaiting })
        queue.finish()
        #expect(!queue.writerIsWaiting)
        #expect(await writer.value == nil)
        #expect(queue.send("late"), "a frame after the end is dropped, not an overflow")
        #expect(!queue.writerIsWaiting)
    }
}
