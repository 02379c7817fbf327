import Foundation
import Testing
@testable import Tether
import TetherClientCore
import TetherProtocol
import TetherTesting

/// `sendFile` after its upload: the file is on the server and only its file message announces
/// it, so that message is sent with a request id (stored once however often it is sent), tried
/// again on a transient failure, and a final failure says which file and can announce it.
@Suite("sendFile's file message (in-memory transport, manual clock)", .timeLimit(.minutes(1)))
struct FileStepTests {
    static let form = #"""
        {"status":200,"data":{"id":"f1","name":"a.txt"},"file_upload_request":{"url":"http://tether.invalid/upload/f1","method":"POST",
        "expiration_date":"2026-12-01T00:00:00Z","form_fields":[{"key":"policy","value":"p"}]}}
        """#

    @Test func aFileMessageThatKeepsFailingNamesTheFileAndItsRetryAnnouncesIt() async throws {
        let (client, transport, _) = try makeStepClient()
        let send = Task { try await client.sendFile(channel: "room", data: Array("hello".utf8), name: "a.txt") }
        try #require(await transport.next(path: "/v1/files/demo/channels/room/generate-upload-url")).respond(json: Self.form)
        try #require(await transport.next(path: "/upload/f1")).respond(status: 204, json: "")
        var ids: Set<String?> = []
        for _ in 0..<FileStepTests.attempts {
            let exchange = try #require(await transport.next(path: "/v1/files/publish-file"))
            ids.insert(exchange.query["requestid"])
            exchange.fail(.connectionClosed("reset"))
        }
        let status = try #require(await failure { try await send.value })
        #expect(ids.count == 1 && ids.first! != nil, "one request id for every attempt")
        #expect(status.requestId == ids.first!)
        #expect(status.serverMessage?.contains("id f1") == true && status.serverMessage?.contains("a.txt") == true)
        #expect(transport.requests.filter { $0.url.contains("/publish-file/") }.count == FileStepTests.attempts)

        let announce = Task { try await status.retry() }
        let again = try #require(await transport.next(path: "/v1/files/publish-file"))
        #expect(again.query["requestid"] == status.requestId)
        again.respond(json: #"[1,"Sent","17000000000000001"]"#)
        _ = try await announce.value
        await client.shutdown()
    }

    @Test func aRefusedFileMessageIsNotSentAgain() async throws {
        let (client, transport, _) = try makeStepClient()
        let send = Task { try await client.sendFile(channel: "room", data: Array("hello".utf8), name: "a.txt") }
        try #require(await transport.next(path: "/v1/files/demo/channels/room/generate-upload-url")).respond(json: Self.form)
        try #require(await transport.next(path: "/upload/f1")).respond(status: 204, json: "")
        try #require(await transport.next(path: "/v1/files/publish-file"))
            .respond(status: 403, json: #"{"status":403,"error":true,"message":"Forbidden","service":"Access Manager"}"#)
        let status = try #require(await failure { try await send.value })
        #expect(status.category == .accessDenied)
        #expect(transport.requests.filter { $0.url.contains("/publish-file/") }.count == 1)
        await client.shutdown()
    }

    static var attempts: Int { TetherClient.fileMessageAttempts }

    @Test func anUploadsDefaultDeadlineGrowsWithTheFile() {
        #expect(TetherClient.uploadTimeout(bytes: 1_000, base: .seconds(15)) == .seconds(15))
        #expect(TetherClient.uploadTimeout(bytes: 5 << 20, base: .seconds(15)) == .seconds(95))
    }
}
