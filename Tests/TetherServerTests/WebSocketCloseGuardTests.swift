import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOWebSocket
import Testing
@testable import TetherServer

/// Nothing goes out after a WebSocket connection's close frame (RFC 6455 §5.5.1), whichever
/// writer sends it: a frame written after it is dropped and its write fails, which ends the
/// session's writer as a failed write does.
@Suite struct WebSocketCloseGuardTests {
    private static func frame(_ opcode: WebSocketOpcode, _ text: String) -> WebSocketFrame {
        WebSocketFrame(fin: true, opcode: opcode, data: ByteBuffer(string: text))
    }

    @Test func framesAfterTheCloseFrameAreDroppedAndTheirWritesFail() throws {
        let channel = EmbeddedChannel(handler: WebSocketCloseGuard())
        try channel.writeOutbound(Self.frame(.text, "before"))
        try channel.writeOutbound(WebSocketFrame(fin: true, opcode: .connectionClose, data: ByteBuffer(bytes: [0x03, 0xE8])))  // 1000
        let late = channel.eventLoop.makePromise(of: Void.self)
        channel.writeAndFlush(Self.frame(.text, "after"), promise: late)
        let failed = NIOLockedValueBox<(any Error)?>(nil)
        late.futureResult.whenFailure { error in failed.withLockedValue { $0 = error } }
        #expect(failed.withLockedValue { $0 } is WebSocketCloseGuard.AfterClose)
        #expect(try channel.readOutbound(as: WebSocketFrame.self)?.opcode == .text)
        #expect(try channel.readOutbound(as: WebSocketFrame.self)?.opcode == .connectionClose)
        #expect(try channel.readOutbound(as: WebSocketFrame.self) == nil, "nothing follows the close frame")
        _ = try channel.finish()
    }

    @Test func dataAndControlFramesPassUntilTheClose() throws {
        let channel = EmbeddedChannel(handler: WebSocketCloseGuard())
        for opcode in [WebSocketOpcode.text, .binary, .ping, .pong] {
            try channel.writeOutbound(Self.frame(opcode, "x"))
            #expect(try channel.readOutbound(as: WebSocketFrame.self)?.opcode == opcode)
        }
        _ = try channel.finish()
    }
}
