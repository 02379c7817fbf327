import Foundation
import NIOCore
import Testing
import TetherProtocol
import TetherServer

@Suite(.serialized) struct FilterTests {
    @Test func aFilteredSubscriberReceivesExactlyTheMatchingMessages() async throws {
        let server = try await TestServer.start()
        let filter = PercentCoding.encode("meta.lang == 'en' && (meta.score > 10 || data.n == 4)")
        let handshake = try await server.object("/v2/subscribe/demo/news/0?tt=0&uuid=f&filter-expr=\(filter)")
        var cursor = Timetoken(parsing: (handshake["t"] as? [String: Any])?["t"] as? String ?? "")!
        func publish(_ message: String, meta: String) async throws -> Timetoken {
            try await server.publish("news", message, query: "&meta=\(PercentCoding.encode(meta))")
        }
        let a = try await publish(#"{"n":1}"#, meta: #"{"lang":"en","score":11}"#)
        _ = try await publish(#"{"n":2}"#, meta: #"{"lang":"fr","score":50}"#)
        _ = try await publish(#"{"n":3}"#, meta: #"{"lang":"en","score":3}"#)
        let d = try await publish(#"{"n":4,"urgent":true}"#, meta: #"{"lang":"en","score":1}"#)
        _ = try await server.publish("news", #"{"n":5}"#)  // no meta at all
        var received: [String] = []
        while received.count < 2 {
            let (status, body, _) = try await server.get("/v2/subscribe/demo/news/0?tt=\(cursor.rawValue)&tr=1&uuid=f&filter-expr=\(filter)",
                                                        timeout: .seconds(10))
            #expect(status == 200)
            let object = try JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any]
            received += (object?["m"] as? [[String: Any]] ?? []).compactMap(\.publishTimetoken)
            cursor = Timetoken(parsing: (object?["t"] as? [String: Any])?["t"] as? String ?? "")!
        }
        #expect(received == [String(a.rawValue), String(d.rawValue)])
        await server.stop()
    }

    @Test(arguments: ["meta.a ==", "(meta.a == 1", "meta.a === 1", String(repeating: "(", count: 10_000) + "1==1"])
    func malformedExpressionsGet481(_ expression: String) async throws {
        let server = try await TestServer.start()
        let response = try await server.get("/v2/subscribe/demo/news/0?tt=0&uuid=f&filter-expr=\(PercentCoding.encode(expression))")
        #expect(response.status == 481)
        let object = try JSONSerialization.jsonObject(with: Data(response.body.utf8)) as? [String: Any]
        #expect(object?["status"] as? Int == 481)
        #expect((object?["message"] as? String)?.contains("Invalid filter expression") == true)
        await server.stop()
    }
}
