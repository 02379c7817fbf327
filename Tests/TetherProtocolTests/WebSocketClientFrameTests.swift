import Testing
import TetherProtocol

/// The `suspend` frame's push device: its topic becomes an HTTP header (`apns-topic`), so it is
/// held to REST registration's rule (a bundle id of A-Z a-z 0-9 . - _), not only to a length.
@Suite struct WebSocketClientFrameTests {
    static func suspend(topic: String) -> String {
        #"{"type":"suspend","push":{"token":"aa01","type":"apns2","environment":"production","topic":"\#(topic)"}}"#
    }

    @Test func aSuspendTopicIsABundleId() throws {
        guard case .suspend(_, _, let push?) = try WebSocketClientFrame(parsing: Self.suspend(topic: "com.example.app-1_x")) else {
            Issue.record("not a suspend with a device")
            return
        }
        #expect(push.topic == "com.example.app-1_x")
        for bad in [#"a\r\nb"#, "a b", "a:b", "é", String(repeating: "a", count: 256)] {
            #expect(throws: WebSocketClientFrame.ReadError.self, "\(bad)") { try WebSocketClientFrame(parsing: Self.suspend(topic: bad)) }
        }
    }
}
