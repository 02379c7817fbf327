import Foundation
import NIOHTTP1
import Testing
import TetherProtocol

/// Every answer of a real server over loopback carries exactly one `Content-Length` (its body's
/// length) and one `Date` (an IMF-fixdate, RFC 9110 §5.6.7): the hot path's answers, which get
/// them as they are written (`HotRequestHead.encode`), its errors, and the answers of routes
/// Hummingbird serves.
@Suite struct AnswerFramingTests {
    @Test func everyAnswerHasOneLengthItsBodysAndOneDate() async throws {
        let server = try await TestServer.start()
        let timetoken = try await server.publish("framing", "\"first\"")
        let answers: [(String, String, Int)] = [
            ("time", "/time/0", 200),
            ("store=0 publish", "/publish/demo/demo/0/framing/0/%22x%22?store=0&uuid=u1", 200),
            ("stored publish", "/publish/demo/demo/0/framing/0/%22y%22?uuid=u1", 200),
            ("subscribe answered at once", "/v2/subscribe/demo/framing/0?tt=\(timetoken.rawValue - 1)&tr=1&uuid=u1", 200),
            ("hot error: a message that is not JSON", "/publish/demo/demo/0/framing/0/not-json?uuid=u1", 400),
            ("hot error: an unknown keyset", "/publish/demo/nokey/0/framing/0/%22z%22?uuid=u1", 400),
            ("history (Hummingbird's side)", "/v2/history/sub-key/demo/channel/framing", 200),
            ("unknown route", "/no/such/route", 404),
        ]
        for (what, path, status) in answers {
            let (code, body, headers) = try await server.get(path)
            #expect(code == status, "\(what): \(body)")
            #expect(headers["Content-Length"] == [String(body.utf8.count)], "\(what)")
            let dates = headers["Date"]
            #expect(dates.count == 1, "\(what): \(dates)")
            #expect(dates.allSatisfy(Self.isIMFFixdate), "\(what): \(dates)")
        }
        await server.stop()
    }

    /// `Sun, 06 Nov 1994 08:49:37 GMT`.
    static func isIMFFixdate(_ text: String) -> Bool {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
        guard text.utf8.count == 29, let date = formatter.date(from: text) else { return false }
        return abs(date.timeIntervalSinceNow) < 120
    }
}
