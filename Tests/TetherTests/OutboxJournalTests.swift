import Foundation
import Testing
@testable import Tether

/// The durable outbox journal against a real file in a temporary directory.
@Suite("OutboxJournal: a real file")
struct OutboxJournalTests {
    /// A fresh directory per test, removed afterwards.
    final class TemporaryDirectory {
        let path: String
        init() throws {
            path = FileManager.default.temporaryDirectory.appendingPathComponent("tether-outbox-\(UUID().uuidString)").path
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        }
        var journal: String { path + "/outbox.journal" }
        deinit { try? FileManager.default.removeItem(atPath: path) }
    }

    static func message(_ n: UInt64, channel: String = "a", kind: OutboxMessage.Kind = .publish, bytes: Int = 16,
                        options: PublishOptions = PublishOptions()) -> OutboxMessage {
        OutboxMessage(id: .init(n), requestID: "req-\(n)", kind: kind, channel: channel,
                      payload: Array(#""\#(String(repeating: "x", count: max(bytes - 2, 0)))""#.utf8), options: options)
    }

    func fileSize(_ path: String) throws -> Int {
        try (FileManager.default.attributesOfItem(atPath: path)[.size] as? NSNumber)?.intValue ?? -1
    }

    func appendRaw(_ bytes: [UInt8], to path: String) throws {
        let handle = try #require(FileHandle(forWritingAtPath: path))
        try handle.seekToEnd()
        try handle.write(contentsOf: Data(bytes))
        try handle.close()
    }

    @Test("accepted messages survive a reopen, with every field and option")
    func appendAndReopen() throws {
        let dir = try TemporaryDirectory()
        let options = PublishOptions(meta: ["lang": "en", "n": 3], store: false, ttl: 24, replicate: false, usePOST: true,
                                     customMessageType: "chat-text", timeout: .milliseconds(1500))
        let messages = [Self.message(1, options: options), Self.message(2, channel: "b", kind: .signal),
                        Self.message(3, channel: "ünïcode/ch")]
        do {
            let journal = try OutboxJournal(path: dir.journal)
            #expect(journal.restored.isEmpty)
            #expect(journal.nextID == .init(1))
            for message in messages { try journal.append(.accepted(message)) }
        }
        let reopened = try OutboxJournal(path: dir.journal)
        #expect(reopened.restored == messages.map { OutboxMachine.Restored($0, .pending) })
        #expect(reopened.nextID == .init(4))
        #expect(reopened.recovery == .init(records: 3, discardedBytes: 0))
    }

    @Test("an intact record this version cannot read is skipped, and every record after it is kept")
    func anUnreadableRecordDoesNotEndTheLog() throws {
        let dir = try TemporaryDirectory()
        // `meta` as deep as the SDK lets through, inside the journal's options object.
        let deep = (1..<48).reduce(JSONValue.object(["x": 1])) { inner, _ in .object(["x": inner]) }
        do {
            let journal = try OutboxJournal(path: dir.journal)
            try journal.append(.accepted(Self.message(1, options: PublishOptions(meta: deep))))
        }
        // A whole frame, its checksum right, of a kind this version does not know.
        func frame(_ body: [UInt8]) -> [UInt8] {
            func littleEndian(_ value: UInt32) -> [UInt8] { (0..<4).map { UInt8(truncatingIfNeeded: value >> (8 * $0)) } }
            return littleEndian(UInt32(body.count)) + littleEndian(CRC32.checksum(body)) + body
        }
        try appendRaw(frame([0xEE, 1, 2, 3]), to: dir.journal)
        // And a message accepted after it, in the same file.
        try appendRaw(frame(OutboxJournal.encode(.accepted(Self.message(2)))), to: dir.journal)
        let reopened = try OutboxJournal(path: dir.journal)
        #expect(reopened.restored.map(\.message.id) == [.init(1), .init(2)])
        #expect(reopened.restored.first?.message.options.meta == deep)
        #expect(reopened.recovery == .init(records: 2, discardedBytes: 0, unreadableRecords: 1))
    }

    @Test("settled, failed and resent messages come back as they were left")
    func settle() throws {
        let dir = try TemporaryDirectory()
        do {
            let journal = try OutboxJournal(path: dir.journal)
            for n in 1...5 { try journal.append(.accepted(Self.message(UInt64(n)))) }
            try journal.record(.init(1), changedTo: .sending(attempt: 1))
            try journal.record(.init(1), changedTo: .sent(Timetoken(17)))
            try journal.record(.init(2), changedTo: .cancelled)
            try journal.record(.init(3), changedTo: .failed(.accessDenied))
            try journal.record(.init(4), changedTo: .failed(.badRequest))
            try journal.record(.init(4), changedTo: .pending)  // resent
            try journal.record(.init(5), changedTo: .pending)  // a retry wait: nothing to write
            try journal.record(.init(9), changedTo: .sent(Timetoken(1)))  // unknown: ignored
        }
        let reopened = try OutboxJournal(path: dir.journal)
        // 4 was resent after 5 was accepted: it is behind 5, as it was in the outbox.
        #expect(reopened.restored == [
            .init(Self.message(3), .failed(.accessDenied)), .init(Self.message(5), .pending), .init(Self.message(4), .pending),
        ])
        #expect(reopened.recovery.records == 5 + 5, "five acceptances; two removals, two failures, one requeue")
        #expect(reopened.nextID == .init(6), "ids of sent messages are never reused")
    }

    @Test("a torn last record is cut off; everything before it is kept, and appends continue",
          arguments: [TornTail.partialHeader, .partialBody, .badChecksum, .absurdLength, .zeroLength])
    func tornTail(_ tail: TornTail) throws {
        let dir = try TemporaryDirectory()
        do {
            let journal = try OutboxJournal(path: dir.journal)
            try journal.append(.accepted(Self.message(1)))
            try journal.append(.accepted(Self.message(2)))
        }
        let good = try fileSize(dir.journal)
        let frame = OutboxJournal.frame(OutboxJournal.encode(.accepted(Self.message(3))))
        let garbage: [UInt8]
        switch tail {
        case .partialHeader: garbage = Array(frame.prefix(5))
        case .partialBody: garbage = Array(frame.dropLast(3))
        case .badChecksum:
            var copy = frame
            copy[copy.count - 1] ^= 0xFF
            garbage = copy
        case .absurdLength: garbage = [0xFF, 0xFF, 0xFF, 0x7F, 0, 0, 0, 0] + frame
        case .zeroLength: garbage = [0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3]
        }
        try appendRaw(garbage, to: dir.journal)

        do {
            let journal = try OutboxJournal(path: dir.journal)
            #expect(journal.restored.map(\.message.id) == [.init(1), .init(2)])
            #expect(journal.recovery == .init(records: 2, discardedBytes: garbage.count))
            #expect(try fileSize(dir.journal) == good, "the damaged tail is truncated")
            try journal.append(.accepted(Self.message(3)))
        }
        let again = try OutboxJournal(path: dir.journal)
        #expect(again.restored.map(\.message.id) == [.init(1), .init(2), .init(3)])
        #expect(again.recovery.discardedBytes == 0)
    }

    enum TornTail: String, Sendable, CaseIterable {
        case partialHeader, partialBody, badChecksum, absurdLength, zeroLength
    }

    @Test("compaction keeps the file bounded when settled records dominate, and keeps live messages and ids")
    func compaction() throws {
        let dir = try TemporaryDirectory()
        let limits = OutboxJournal.Limits(compactionThreshold: 2048)
        var largest = 0
        do {
            let journal = try OutboxJournal(path: dir.journal, limits: limits)
            try journal.append(.accepted(Self.message(1, bytes: 100)))
            try journal.record(.init(1), changedTo: .failed(.accessDenied))
            for n in 2...500 {
                try journal.append(.accepted(Self.message(UInt64(n), bytes: 100)))
                try journal.record(.init(UInt64(n)), changedTo: .sent(Timetoken(UInt64(n))))
                largest = max(largest, journal.sizeInBytes)
                #expect(journal.sizeInBytes == (try fileSize(dir.journal)))
            }
            try journal.append(.accepted(Self.message(501, bytes: 100)))
        }
        #expect(largest < 4096, "500 sent messages of ~170 bytes each never grow the file past twice the threshold")
        #expect(!FileManager.default.fileExists(atPath: dir.journal + ".compact"))
        let reopened = try OutboxJournal(path: dir.journal, limits: limits)
        #expect(reopened.restored == [.init(Self.message(1, bytes: 100), .failed(.accessDenied)),
                                      .init(Self.message(501, bytes: 100), .pending)])
        #expect(reopened.nextID == .init(502))
    }

    @Test("after everything is sent and compacted, ids still never repeat (the watermark)")
    func watermark() throws {
        let dir = try TemporaryDirectory()
        do {
            let journal = try OutboxJournal(path: dir.journal)
            for n in 1...3 {
                try journal.append(.accepted(Self.message(UInt64(n))))
                try journal.record(.init(UInt64(n)), changedTo: .sent(Timetoken(1)))
            }
            try journal.compact()
        }
        let reopened = try OutboxJournal(path: dir.journal)
        #expect(reopened.restored.isEmpty)
        #expect(reopened.nextID == .init(4))
    }

    @Test("a record above maximumRecordBytes is refused and nothing is written")
    func recordBound() throws {
        let dir = try TemporaryDirectory()
        let journal = try OutboxJournal(path: dir.journal, limits: .init(maximumRecordBytes: 1024))
        try journal.append(.accepted(Self.message(1, bytes: 900)))
        let before = try fileSize(dir.journal)
        #expect(throws: OutboxJournalError.self) { try journal.append(.accepted(Self.message(2, bytes: 1100))) }
        do {
            try journal.append(.accepted(Self.message(2, bytes: 1100)))
        } catch {
            #expect(error.code == .recordTooLarge)
        }
        #expect(try fileSize(dir.journal) == before)
        #expect(journal.restored.map(\.message.id) == [.init(1)])
    }

    @Test("a compaction that fails leaves the journal as it was; after one, appends go to the new file")
    func compactionFailureAndAfter() throws {
        let dir = try TemporaryDirectory()
        do {
            let journal = try OutboxJournal(path: dir.journal)
            for n in 1...3 { try journal.append(.accepted(Self.message(UInt64(n)))) }
            try journal.record(.init(2), changedTo: .sent(Timetoken(2)))
            journal.writeFailure = ENOSPC
            #expect(throws: OutboxJournalError.self) { try journal.compact() }
            #expect(!FileManager.default.fileExists(atPath: dir.journal + ".compact"), "the partial file is removed")
            journal.writeFailure = nil
            try journal.append(.accepted(Self.message(4)))
            try journal.compact()
            try journal.append(.accepted(Self.message(5)))
            try journal.record(.init(1), changedTo: .cancelled)
            #expect(journal.sizeInBytes == (try fileSize(dir.journal)))
        }
        let reopened = try OutboxJournal(path: dir.journal)
        #expect(reopened.restored.map(\.message.id) == [.init(3), .init(4), .init(5)])
        #expect(reopened.nextID == .init(6))
    }

    @Test("an append that fails half-way leaves nothing of itself: later records are kept at the next launch")
    func failedAppendIsCutBack() throws {
        let dir = try TemporaryDirectory()
        do {
            let journal = try OutboxJournal(path: dir.journal)
            try journal.append(.accepted(Self.message(1)))
            let before = try fileSize(dir.journal)
            journal.writeFailure = ENOSPC
            #expect(throws: OutboxJournalError.self) { try journal.append(.accepted(Self.message(2))) }
            #expect(try fileSize(dir.journal) == before, "the torn half is cut off at once")
            journal.writeFailure = nil
            try journal.append(.accepted(Self.message(3)))
            #expect(journal.sizeInBytes == (try fileSize(dir.journal)))
        }
        let reopened = try OutboxJournal(path: dir.journal)
        #expect(reopened.restored.map(\.message.id) == [.init(1), .init(3)])
        #expect(reopened.recovery.discardedBytes == 0)
    }

    @Test("a change that already happened but could not be written is written by the next record that can be, the file rewritten whole")
    func unwrittenChangesCatchUp() throws {
        let dir = try TemporaryDirectory()
        do {
            let journal = try OutboxJournal(path: dir.journal)
            for n in 1...4 { try journal.append(.accepted(Self.message(UInt64(n)))) }
            journal.writeFailure = ENOSPC
            // 1 failed and 2 was sent: both have happened. 3's cancel is refused (dropped).
            #expect(throws: OutboxJournalError.self) {
                try journal.record(.init(1), changedTo: .failed(.accessDenied), ifUnwritten: .kept)
            }
            #expect(throws: OutboxJournalError.self) { try journal.record(.init(2), changedTo: .sent(Timetoken(2)), ifUnwritten: .kept) }
            #expect(throws: OutboxJournalError.self) { try journal.record(.init(3), changedTo: .cancelled) }
            #expect(journal.isBehind)
            // Still full: the rewrite fails too, the acceptance is refused, nothing is left behind.
            #expect(throws: OutboxJournalError.self) { try journal.append(.accepted(Self.message(5))) }
            #expect(!FileManager.default.fileExists(atPath: dir.journal + ".compact"))
            #expect(journal.isBehind)
            journal.writeFailure = nil
            try journal.append(.accepted(Self.message(6)))
            #expect(!journal.isBehind)
            #expect(journal.sizeInBytes == (try fileSize(dir.journal)))
        }
        let reopened = try OutboxJournal(path: dir.journal)
        #expect(reopened.restored.map(\.message.id) == [.init(1), .init(3), .init(4), .init(6)])
        #expect(reopened.restored.first?.state == .failed(.accessDenied))
        #expect(reopened.nextID == .init(7))
        #expect(reopened.recovery.discardedBytes == 0)
    }

    @Test("catchUp rewrites a journal that is behind, and does nothing to one that is not")
    func catchUpAlone() throws {
        let dir = try TemporaryDirectory()
        do {
            let journal = try OutboxJournal(path: dir.journal)
            for n in 1...2 { try journal.append(.accepted(Self.message(UInt64(n)))) }
            let before = try fileSize(dir.journal)
            try journal.catchUp()
            #expect(try fileSize(dir.journal) == before, "not behind: not rewritten")
            journal.writeFailure = ENOSPC
            #expect(throws: OutboxJournalError.self) { try journal.record(.init(1), changedTo: .sent(Timetoken(1)), ifUnwritten: .kept) }
            #expect(throws: OutboxJournalError.self) { try journal.catchUp() }
            journal.writeFailure = nil
            try journal.catchUp()
            #expect(!journal.isBehind)
        }
        #expect(try OutboxJournal(path: dir.journal).restored.map(\.message.id) == [.init(2)])
    }

    @Test("a second owner is refused at once and changes nothing; it opens once the first is closed")
    func oneOwnerAtATime() throws {
        let dir = try TemporaryDirectory()
        var first: OutboxJournal? = try OutboxJournal(path: dir.journal)
        try first?.append(.accepted(Self.message(1)))
        // What the first owner's next append looks like half-way through its write.
        let frame = OutboxJournal.frame(OutboxJournal.encode(.accepted(Self.message(2))))
        try appendRaw(Array(frame.prefix(frame.count / 2)), to: dir.journal)
        let size = try fileSize(dir.journal)

        do {
            _ = try OutboxJournal(path: dir.journal)
            Issue.record("a second owner opened the journal")
        } catch {
            #expect(error.code == .inUse)
            #expect(error.description.contains("in use by another client"))
        }
        #expect(try fileSize(dir.journal) == size, "the half-written record was not cut")

        first = nil
        let second = try OutboxJournal(path: dir.journal)
        #expect(second.restored.map(\.message.id) == [.init(1)])
        #expect(second.recovery.discardedBytes == frame.count / 2)
        withExtendedLifetime(first) {}
    }

    @Test("a journal another process holds is refused; it opens once that process lets go")
    func heldByAnotherProcess() throws {
        let dir = try TemporaryDirectory()
        let python = Process()
        python.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        python.arguments = ["python3", "-c", """
            import fcntl, sys
            f = open(sys.argv[1], "a")
            fcntl.flock(f, fcntl.LOCK_EX)
            print("locked", flush=True)
            sys.stdin.read()
            """, dir.journal + ".lock"]
        let input = Pipe(), output = Pipe()
        python.standardInput = input
        python.standardOutput = output
        do { try python.run() } catch {
            Issue.record("python3 is needed for this test (scripts/test installs it): \(error)")
            return
        }
        let line = String(decoding: output.fileHandleForReading.readData(ofLength: 7), as: UTF8.self)
        #expect(line == "locked\n")
        do {
            _ = try OutboxJournal(path: dir.journal)
            Issue.record("opened a journal another process holds")
        } catch {
            #expect(error.code == .inUse)
        }
        try input.fileHandleForWriting.close()
        python.waitUntilExit()
        let journal = try OutboxJournal(path: dir.journal)
        try journal.append(.accepted(Self.message(1)))
        #expect(journal.restored.count == 1)
    }

    @Test("an unreadable path is a clear error")
    func unopenable() {
        #expect(throws: OutboxJournalError.self) { try OutboxJournal(path: "/nonexistent-dir-\(UUID().uuidString)/outbox") }
    }

    @Test("a message resent before a relaunch is sent behind the messages it was resent after, through a compaction too",
          arguments: [false, true])
    func resendThenRelaunch(compacting: Bool) throws {
        let dir = try TemporaryDirectory()
        func run(_ journal: OutboxJournal, _ actions: [OutboxMachine.Action], sends: inout [UInt64]) throws {
            for action in actions {
                switch action {
                case .send(let m, _): sends.append(m.id.rawValue)
                case .changed(let id, let state): try journal.record(id, changedTo: state)
                case .schedule, .cancelTimer: break
                }
            }
        }
        // First launch: 1 fails (access denied), 2 and 3 wait behind the link, 1 is resent: the
        // outbox's order on channel "a" is now 2, 3, 1. The process dies before any is sent.
        do {
            let journal = try OutboxJournal(path: dir.journal)
            var machine = OutboxMachine(link: .online)
            var sends: [UInt64] = []
            try journal.append(.accepted(Self.message(1)))
            guard case .accepted(let first) = machine.enqueue(Self.message(1), now: .zero) else { Issue.record("refused"); return }
            try run(journal, first, sends: &sends)
            try run(journal, machine.sendFailed(.init(1), OutboxSendFailure(category: .accessDenied, statusCode: 403), now: .zero,
                                                randomness: 0), sends: &sends)
            try run(journal, machine.linkChanged(.offline, now: .zero), sends: &sends)
            for n: UInt64 in [2, 3] {
                try journal.append(.accepted(Self.message(n)))
                guard case .accepted(let actions) = machine.enqueue(Self.message(n), now: .zero) else { Issue.record("refused"); return }
                try run(journal, actions, sends: &sends)
            }
            guard case .accepted(let resent) = machine.resend(.init(1), now: .zero) else { Issue.record("not resent"); return }
            try run(journal, resent, sends: &sends)
            #expect(sends == [1], "offline: nothing more was sent")
            #expect(machine.entries.map(\.message.id.rawValue) == [2, 3, 1])
            if compacting { try journal.compact() }
        }
        // Second launch: the same order.
        let journal = try OutboxJournal(path: dir.journal)
        #expect(journal.restored.map(\.message.id.rawValue) == [2, 3, 1])
        var machine = OutboxMachine(link: .online)
        var sends: [UInt64] = []
        try run(journal, machine.restore(journal.restored, now: .zero), sends: &sends)
        for n: UInt64 in [2, 3] {
            try run(journal, machine.sendSucceeded(.init(n), timetoken: Timetoken(n), now: .zero), sends: &sends)
        }
        #expect(sends == [2, 3, 1])
    }

    @Test("killed with messages pending: the next launch sends each exactly once, in order, with its request id")
    func killAndRelaunch() throws {
        let dir = try TemporaryDirectory()
        // First launch: accept four messages, send one, fail one; then the process dies.
        do {
            let journal = try OutboxJournal(path: dir.journal)
            var machine = OutboxMachine(link: .online)
            var sends: [OutboxMessage] = []
            for n in 1...4 {
                let message = Self.message(UInt64(n), channel: n == 3 ? "b" : "a")
                #expect(machine.admission(byteCount: message.byteCount) == nil)
                try journal.append(.accepted(message))
                guard case .accepted(let actions) = machine.enqueue(message, now: .zero) else {
                    Issue.record("refused")
                    return
                }
                for action in actions {
                    switch action {
                    case .send(let m, _): sends.append(m)
                    case .changed(let id, let state): try journal.record(id, changedTo: state)
                    case .schedule, .cancelTimer: break
                    }
                }
            }
            #expect(sends.map(\.id.rawValue) == [1, 3])
            var settled = machine.sendSucceeded(.init(1), timetoken: Timetoken(100), now: .zero)
            settled += machine.sendFailed(.init(3), OutboxSendFailure(category: .accessDenied, statusCode: 403), now: .zero, randomness: 0)
            for action in settled {
                if case .changed(let id, let state) = action { try journal.record(id, changedTo: state) }
            }
            // Message 2 is now in flight; the process is killed before its answer.
        }
        // Second launch.
        let journal = try OutboxJournal(path: dir.journal)
        var machine = OutboxMachine(link: .online)
        let actions = machine.restore(journal.restored, now: .zero)
        let sends = actions.compactMap { action -> OutboxMessage? in
            if case .send(let m, _) = action { return m }
            return nil
        }
        #expect(sends.map(\.id.rawValue) == [2], "message 2 (maybe stored: same request id) goes first; 4 waits behind it")
        #expect(sends.first?.requestID == "req-2")
        #expect(machine.entry(.init(3))?.state == .failed(.accessDenied))
        #expect(machine.entry(.init(1)) == nil, "the sent message is not sent again")
        #expect(journal.nextID == .init(5))
    }
}
