import Foundation
import Synchronization
import Logging
import Testing
@testable import Tether
import TetherClientCore
import TetherServer
import TetherTestingServer

/// The SDK's file calls and file events against the real server (a real SQLite file and the
/// server's local file storage).
@Suite("SDK files against the real server", .serialized)
struct FileAPITests {
    private func client(_ server: InProcessServer, userId: String, cryptoModule: CryptoModule? = nil) throws -> TetherClient {
        var logger = Logger(label: "tether.test.files")
        logger.logLevel = .warning
        var configuration = try TetherConfiguration(subscribeKey: "demo", publishKey: "demo", userId: userId, origin: server.origin,
                                                    useTLS: false, logger: logger)
        configuration.cryptoModule = cryptoModule
        return try TetherClient(configuration: configuration)
    }

    @Test func sendListDownloadDelete() async throws {
        let server = try await InProcessServer.start()
        let alice = try client(server, userId: "alice")
        let room = "room-\(UUID().uuidString.prefix(6))"
        let data = Array("hello, file".utf8)
        let reports = Mutex<[FileTransferProgress]>([])
        let sent = try await alice.sendFile(channel: room, data: data, name: "hello.txt", message: .string("see attached"),
                                            progress: { p in reports.withLock { $0.append(p) } })
        #expect(sent.name == "hello.txt" && !sent.id.isEmpty && sent.timetoken.rawValue > 0)
        #expect(reports.withLock { $0 } == [.init(completedBytes: 0, totalBytes: data.count), .init(completedBytes: data.count, totalBytes: data.count)])

        let page = try await alice.listFiles(channel: room)
        #expect(page.files.map(\.id) == [sent.id] && page.files.first?.size == data.count && page.next == nil)

        let downloaded = try await alice.downloadFile(channel: room, fileId: sent.id, fileName: "hello.txt")
        #expect(downloaded.data == data)
        #expect(downloaded.contentType == "text/plain; charset=utf-8")

        // The file message is in history with its file.
        let history = try await alice.fetchMessages(channel: room, includeActions: false)
        #expect(history.count == 1 && history.first?.payload["file"]?["id"]?.stringValue == sent.id)

        try await alice.deleteFile(channel: room, fileId: sent.id, fileName: "hello.txt")
        #expect(try await alice.listFiles(channel: room).files.isEmpty)
        do {
            _ = try await alice.downloadFile(channel: room, fileId: sent.id, fileName: "hello.txt")
            Issue.record("a deleted file was downloaded")
        } catch {
            #expect(error.status.statusCode == 404)
        }
        do {
            try await alice.deleteFile(channel: room, fileId: "no-such-id", fileName: "x")
            Issue.record("an unknown file was deleted")
        } catch {
            #expect(error.status.statusCode == 404 && error.status.serverMessage == "File not found")
        }
        // The announcing message stays.
        #expect(try await alice.fetchMessages(channel: room, includeActions: false).count == 1)
        await alice.shutdown()
        await server.stop()
    }

    @Test func progressIsReportedAsTheBytesGoAndCome() async throws {
        let server = try await InProcessServer.start()
        let alice = try client(server, userId: "alice")
        let room = "room-\(UUID().uuidString.prefix(6))"
        let data = (0..<(600 * 1024)).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        let up = Mutex<[FileTransferProgress]>([])
        let sent = try await alice.sendFile(channel: room, data: data, name: "big.bin", progress: { p in up.withLock { $0.append(p) } })
        let upReports = up.withLock { $0 }
        #expect(upReports.first == .init(completedBytes: 0, totalBytes: data.count))
        #expect(upReports.last == .init(completedBytes: data.count, totalBytes: data.count))
        #expect(upReports.count >= 5, "\(upReports.count) reports")
        #expect(zip(upReports, upReports.dropFirst()).allSatisfy { $0.completedBytes <= $1.completedBytes })

        let down = Mutex<[FileTransferProgress]>([])
        let got = try await alice.downloadFile(channel: room, fileId: sent.id, fileName: "big.bin", progress: { p in down.withLock { $0.append(p) } })
        #expect(got.data == data)
        let downReports = down.withLock { $0 }
        #expect(downReports.last == .init(completedBytes: data.count, totalBytes: data.count))
        #expect(downReports.count >= 2 && downReports.allSatisfy { $0.totalBytes == data.count })
        await alice.shutdown()
        await server.stop()
    }

    @Test func listPagesAndOversizeAndEncryption() async throws {
        let server = try await InProcessServer.start()
        let alice = try client(server, userId: "alice")
        let room = "room-\(UUID().uuidString.prefix(6))"
        var ids: [String] = []
        for i in 0..<3 { ids.append(try await alice.sendFile(channel: room, data: [UInt8(i)], name: "f\(i).bin").id) }
        let first = try await alice.listFiles(channel: room, limit: 2)
        let second = try await alice.listFiles(channel: room, limit: 2, next: first.next)
        #expect(first.files.count == 2 && first.next != nil && second.files.count == 1 && second.next == nil)
        #expect(Set((first.files + second.files).map(\.id)) == Set(ids))

        // Over the server's 5 MiB default: S3's EntityTooLarge, a bad request, and nothing listed.
        do {
            _ = try await alice.sendFile(channel: room, data: [UInt8](repeating: 7, count: 5 * 1024 * 1024 + 1), name: "big.bin")
            Issue.record("an oversize file was accepted")
        } catch {
            #expect(error.status.category == .badRequest && error.status.statusCode == 400)
            #expect(error.status.serverMessage?.contains("EntityTooLarge") == true)
        }
        #expect(try await alice.listFiles(channel: room).files.count == 3)

        // With a crypto module the stored bytes are encrypted and come back decrypted.
        let sealed = try client(server, userId: "sealed", cryptoModule: .aesGCM(cipherKey: "enigma"))
        let secret = Array("the plans".utf8)
        let file = try await sealed.sendFile(channel: room, data: secret, name: "plans.txt")
        #expect(try await sealed.downloadFile(channel: room, fileId: file.id, fileName: "plans.txt").data == secret)
        #expect(try await alice.downloadFile(channel: room, fileId: file.id, fileName: "plans.txt").data != secret)
        for c in [alice, sealed] { await c.shutdown() }
        await server.stop()
    }

    @Test func fileEventsReachTheSubscription() async throws {
        let server = try await InProcessServer.start()
        let watcher = try client(server, userId: "watcher"), sender = try client(server, userId: "sender")
        let room = "room-\(UUID().uuidString.prefix(6))"
        var statuses = watcher.statuses().makeAsyncIterator()
        let subscription = watcher.subscribe(to: [room])[0]
        var files = subscription.files.makeAsyncIterator()
        let heard = Mutex<[FileEvent]>([])
        subscription.onFile { event in heard.withLock { $0.append(event) } }
        let plainMessages = Mutex(0)
        subscription.onMessage { _ in plainMessages.withLock { $0 += 1 } }
        #expect(await statuses.next()?.category == .connected)

        let sent = try await sender.sendFile(channel: room, data: [1, 2, 3], name: "photo.png", message: .object(["caption": .string("look")]))
        let event = await files.next()
        #expect(event?.fileId == sent.id && event?.fileName == "photo.png" && event?.publisher == "sender")
        #expect(event?.message == .object(["caption": .string("look")]) && event?.timetoken == sent.timetoken)
        let again = try await sender.publishFileMessage(channel: room, fileId: sent.id, fileName: "photo.png")
        let second = await files.next()
        #expect(second?.timetoken == again && second?.message == nil, "\(String(describing: second))")
        #expect(heard.withLock { $0.count } >= 1)
        // File messages are not plain messages.
        #expect(plainMessages.withLock { $0 } == 0)
        for c in [watcher, sender] { await c.shutdown() }
        await server.stop()
    }
}
