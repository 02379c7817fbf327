import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import Testing
import TetherProtocol
import TetherServer

@Suite(.serialized) struct RESTTests {
    private func json(_ text: String) throws -> Any { try JSONSerialization.jsonObject(with: Data(text.utf8), options: .fragmentsAllowed) }

    @Test func errorsAreJSONWithTheProtocolStatus() async throws {
        let server = try await TestServer.start()
        let big = String(repeating: "x", count: 33_000)
        let cases: [(String, Int, String)] = [
            ("/publish/demo/demo/0/c/0/%7Bbad", 400, "Invalid JSON"),
            ("/publish/nope/demo/0/c/0/1", 400, "Invalid Key"),
            ("/publish/demo/nope/0/c/0/1", 400, "Invalid Key"),
            ("/publish/demo/demo/0/a%2Cb/0/1", 400, "Invalid Channel"),
            ("/publish/demo/demo/0/c/0/1?meta=%5B1%5D", 400, "meta"),
            ("/signal/demo/demo/0/c/0/%22\(String(repeating: "s", count: 80))%22", 400, "Signal size too large"),
            ("/v2/subscribe/demo/c/0?tt=abc", 400, "Invalid tt"),
            ("/v2/subscribe/nope/c/0?tt=0", 400, "Invalid Subscribe Key"),
            ("/v2/history/sub-key/demo/channel/c?count=-1", 400, "Invalid count"),
            ("/v3/history/sub-key/demo/message-counts/a,b?channelsTimetoken=1", 400, "Invalid Arguments"),
            ("/nothing/here", 404, "Not found"),
            ("/time/0?\(big)", 414, "Request URI Too Long"),
        ]
        for (path, status, text) in cases {
            let response = try await server.get(path)
            #expect(response.status == status, "\(path)")
            #expect(response.body.contains(text), "\(path): \(response.body)")
            #expect(response.headers.first(name: "Content-Type")?.contains("javascript") == true)
            #expect((try? json(response.body)) != nil, "not JSON: \(response.body)")
        }
        let tooLarge = try await server.send("/publish/demo/demo/0/c/0", method: .POST, body: Array("\"\(big)\"".utf8))
        #expect(tooLarge.status == 413)
        #expect(tooLarge.body.hasPrefix(#"[0,"Message Too Large","#))
        // Still serving, nothing stored by the bad requests.
        let ok = try await server.publish("c", "1")
        #expect(ok > .zero)
        #expect(try await server.server.state.store.messageCount() == 1)
        await server.stop()
    }

    /// A message nests at most `JSONText.maximumValueDepth` deep, so every answer that carries
    /// it (a subscribe envelope, history, a presence state in here-now) still parses within the
    /// reader's own limit (`JSONText.maximumDepth`, which the SDK reads with). Deeper, it was
    /// stored and then made every subscribe answer of its channel unreadable.
    @Test func aMessageNestsNoDeeperThanItsAnswersCanBeRead() async throws {
        let server = try await TestServer.start()
        let depth = JSONText.maximumValueDepth
        let deepest = String(repeating: "[", count: depth) + String(repeating: "]", count: depth)
        let cursor = try await server.handshake("deep")
        let published = try await server.send("/publish/demo/demo/0/deep/0?uuid=tester", method: .POST, body: Array(deepest.utf8))
        #expect(published.status == 200, "\(published.body)")
        let tooDeep = "[" + deepest + "]"
        let refused = try await server.send("/publish/demo/demo/0/deep/0?uuid=tester", method: .POST, body: Array(tooDeep.utf8))
        #expect(refused.status == 400)
        #expect(refused.body.contains("Invalid JSON: nested deeper than \(depth) levels"), "\(refused.body)")
        let meta = try await server.get("/publish/demo/demo/0/deep/0/1?uuid=tester&meta=\(PercentCoding.encode("{\"a\":" + deepest + "}"))")
        #expect(meta.status == 400, "\(meta.body)")
        let page = try await server.get("/v2/subscribe/demo/deep/0?tt=\(cursor.rawValue)&tr=1&uuid=tester")
        #expect(page.status == 200)
        let parsed = try JSONValue(parsing: Array(page.body.utf8))
        #expect(parsed["m"]?.arrayValue?.count == 1)
        let history = try await server.get("/v3/history/sub-key/demo/channel/deep?include_meta=true")
        #expect((try? JSONValue(parsing: Array(history.body.utf8))) != nil, "\(history.body.prefix(200))")
        // Presence state: kept and handed out in here-now, inside six levels of its own.
        let state = "{\"s\":" + String(repeating: "[", count: depth - 1) + String(repeating: "]", count: depth - 1) + "}"
        let stateURL = "/v2/presence/sub-key/demo/channel/deep/uuid/tester/data?uuid=tester&state="
        #expect(try await server.get(stateURL + PercentCoding.encode(state)).status == 200)
        #expect(try await server.get(stateURL + PercentCoding.encode("{\"t\":" + state + "}")).status == 400)
        let hereNow = try await server.get("/v2/presence/sub-key/demo/channel/deep?state=1&uuid=tester")
        let occupants = try JSONValue(parsing: Array(hereNow.body.utf8))["uuids"]?.arrayValue ?? []
        #expect(occupants.first?["state"]?["s"]?.nestingDepth == depth - 1, "\(hereNow.body.prefix(200))")
        await server.stop()
    }

    @Test func publishByPostAcceptsGzipZlibAndPlainBodies() async throws {
        let server = try await TestServer.start()
        let message = Array(#"{"text":"compressed"}"#.utf8)
        let zlib = try compress(message, windowBits: 15)
        let gzip = try compress(message, windowBits: 31)
        for (body, encoding) in [(message, nil), (zlib, "gzip"), (gzip, "gzip"), (zlib, "deflate")] as [([UInt8], String?)] {
            let headers = encoding.map { [("Content-Encoding", $0), ("Content-Type", "application/json")] } ?? []
            let response = try await server.send("/publish/demo/demo/0/post/0?uuid=p", method: .POST, body: body, headers: headers)
            #expect(response.status == 200, "\(encoding ?? "plain"): \(response.body)")
        }
        let garbage = try await server.send("/publish/demo/demo/0/post/0", method: .POST, body: [1, 2, 3], headers: [("Content-Encoding", "gzip")])
        #expect(garbage.status == 400)
        let bomb = try compress([UInt8](repeating: 0, count: 10_000_000), windowBits: 31)
        let bombed = try await server.send("/publish/demo/demo/0/post/0", method: .POST, body: bomb, headers: [("Content-Encoding", "gzip")])
        #expect(bombed.status == 413)
        let history = try await server.get("/v2/history/sub-key/demo/channel/post")
        #expect(history.body.hasPrefix(#"[[{"text":"compressed"},{"text":"compressed"},{"text":"compressed"},{"text":"compressed"}],"#))
        await server.stop()
    }

    @Test func historyFetchCountsAndDelete() async throws {
        let server = try await TestServer.start()
        var tts: [Timetoken] = []
        for i in 0..<5 { tts.append(try await server.publish("h", "\(i)", query: "&meta=%7B%22n%22%3A\(i)%7D")) }
        _ = try await server.publish("h", "99", query: "&store=0")

        let newest2 = try json(try await server.get("/v2/history/sub-key/demo/channel/h?count=2").body) as! [Any]
        #expect(newest2[0] as! [Int] == [3, 4])
        let oldest2 = try json(try await server.get("/v2/history/sub-key/demo/channel/h?count=2&reverse=true").body) as! [Any]
        #expect(oldest2[0] as! [Int] == [0, 1])
        #expect((oldest2[1] as! NSNumber).uint64Value == tts[0].rawValue)
        let before = try json(try await server.get("/v2/history/sub-key/demo/channel/h?start=\(tts[3].rawValue)").body) as! [Any]
        #expect(before[0] as! [Int] == [0, 1, 2])
        let range = try json(try await server.get("/v2/history/sub-key/demo/channel/h?start=\(tts[4].rawValue)&end=\(tts[1].rawValue)").body) as! [Any]
        #expect(range[0] as! [Int] == [1, 2, 3])

        let fetched = try json(try await server.get("/v3/history/sub-key/demo/channel/h,empty?max=2&include_meta=true&include_uuid=true&include_message_type=true").body) as! [String: Any]
        let items = (fetched["channels"] as! [String: Any])["h"] as! [[String: Any]]
        #expect(items.map { $0["message"] as! Int } == [3, 4])
        #expect(items[0]["timetoken"] as? String == String(tts[3].rawValue))
        #expect((items[0]["meta"] as? [String: Int])?["n"] == 3)
        #expect(items[0]["uuid"] as? String == "tester")
        #expect(items[0]["message_type"] is NSNull)

        let countsResponse = try await server.get("/v3/history/sub-key/demo/message-counts/h,empty?channelsTimetoken=\(tts[1].rawValue),1")
        let counts = try json(countsResponse.body) as! [String: Any]
        #expect(counts["channels"] as? [String: Int] == ["h": 3, "empty": 0])
        // Tether's extension: the cursor the counts go through, at or after the last message counted.
        let through = try #require(countsResponse.headers.first(name: "Tether-Counted-Through").flatMap { UInt64($0) })
        #expect(through >= tts[4].rawValue)

        let deleted = try await server.send("/v3/history/sub-key/demo/channel/h?start=\(tts[1].rawValue)&end=\(tts[3].rawValue)", method: .DELETE, body: nil)
        #expect(deleted.status == 200)
        let remaining = try json(try await server.get("/v2/history/sub-key/demo/channel/h").body) as! [Any]
        #expect(remaining[0] as! [Int] == [0, 1, 4])
        // start > end: the same bounds as history (end <= tt < start).
        _ = try await server.send("/v3/history/sub-key/demo/channel/h?start=\(tts[4].rawValue)&end=\(tts[1].rawValue)", method: .DELETE, body: nil)
        let afterReverse = try json(try await server.get("/v2/history/sub-key/demo/channel/h").body) as! [Any]
        #expect(afterReverse[0] as! [Int] == [0, 4])
        // An encoded comma is part of a name, not a separator: refused as an invalid channel.
        #expect(try await server.get("/v3/history/sub-key/demo/channel/h%2Cx").status == 400)
        await server.stop()
    }

    @Test func timeHealthAndMetrics() async throws {
        let server = try await TestServer.start()
        let before = LongPollHub.systemNow()
        let time = try json(try await server.get("/time/0").body) as! [NSNumber]
        #expect(time[0].uint64Value >= before.rawValue - 10_000_000)
        // An idle server's time still follows the wall clock. The time endpoint reads the system
        // clock (not an injectable one), so 20 ms of wall time must pass: the thing under test,
        // not a wait for an event.
        try await Task.sleep(for: .milliseconds(20))
        let later = try json(try await server.get("/time/0").body) as! [NSNumber]
        #expect(later[0].uint64Value > time[0].uint64Value + 100_000)
        let health = try json(try await server.get("/health").body) as! [String: Any]
        #expect(health["status"] as? String == "ok")
        #expect(health["store"] as? String == "writable")
        await server.stop()
    }

    private func compress(_ input: [UInt8], windowBits: Int32) throws -> [UInt8] {
        try ZlibTestCompressor.compress(input, windowBits: windowBits)
    }
}
