import ArgumentParser
import Foundation
import Tether

/// `--outbox` and `--retries` of `tether publish`.
struct OutboxOptions: ParsableArguments {
    @Option(name: .customLong("outbox"),
            help: "A durable outbox journal file: the message is written there before it is sent, and what an interrupted run left there is sent first, with its original request id. (default: in memory only)")
    var journal: String?

    @Option(help: "Retries of a failed send (network failures, timeouts, 5xx, 429), exponential from 2 s to 150 s. (default: 0 without --outbox, 6 with it)")
    var retries: Int?

    func validate() throws {
        if let retries, !(0...100).contains(retries) { throw ValidationError("--retries must be 0-100") }
    }

    /// Puts the journal and the retry curve into the configuration.
    func apply(_ configuration: inout TetherConfiguration) {
        configuration.outbox.journalPath = journal
        configuration.outbox.retry = retryConfiguration(retries ?? (journal == nil ? 0 : 6))
    }
}

/// No retry for 0, otherwise PubNub's exponential curve with `retries` retries.
func retryConfiguration(_ retries: Int) -> RetryConfiguration {
    retries == 0
        ? .disabled
        : RetryConfiguration(policy: .exponential(minimumDelay: .seconds(2), maximumDelay: .seconds(150), maximumRetries: retries))
}

/// `tether outbox`: look into, and empty, a durable outbox journal.
struct OutboxCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "outbox",
        abstract: "List or send what a durable outbox journal (tether publish --outbox) holds.",
        discussion: """
            A `tether publish --outbox FILE` that was interrupted (killed, or the server was \
            unreachable) leaves its message in FILE. `list` shows what FILE holds without sending \
            anything; `flush` sends it, each message with its original request id, so a server that \
            deduplicates stores it once even if an earlier attempt reached it.
            """,
        subcommands: [OutboxList.self, OutboxFlush.self])
}

/// `tether outbox list --outbox FILE`.
struct OutboxList: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "list",
        abstract: "Print the messages a durable outbox journal holds, without sending them.",
        discussion: """
            One line per message: its id, state (pending or failed with its category), kind, \
            channel, request id and payload as sent; then a count.

              tether outbox list --outbox /tmp/outbox.journal
            """)

    @Option(name: .customLong("outbox"), help: "The outbox journal file.")
    var journal: String

    func run() throws {
        guard FileManager.default.fileExists(atPath: journal) else { throw ValidationError("no outbox journal at \(journal)") }
        let opened: OutboxJournal
        do { opened = try OutboxJournal(path: journal) } catch { throw ValidationError(error.description) }
        var failed = 0
        for item in opened.restored {
            let state: String
            switch item.state {
            case .pending: state = "pending"
            case .failed(let category):
                state = "failed(\(category))"
                failed += 1
            }
            let kind = item.message.kind == .signal ? "signal" : "publish"
            let payload = String(decoding: item.message.payload, as: UTF8.self)
            print("\(item.message.id) \(state) \(kind) \(item.message.channel) request-id=\(item.message.requestID) \(payload)")
        }
        let count = opened.restored.count
        print("\(count) message(s): \(count - failed) pending, \(failed) failed")
        if opened.recovery.discardedBytes > 0 {
            print("note: \(opened.recovery.discardedBytes) damaged byte(s) at the end of the journal were cut off")
        }
    }
}

/// `tether outbox flush --outbox FILE`.
struct OutboxFlush: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "flush",
        abstract: "Send every message a durable outbox journal holds, then exit with a summary.",
        discussion: """
            Sends the pending messages, and resends the failed ones, in order per channel, each \
            with its original request id and retried as --retries says. Prints one line per \
            message (`sent timetoken=... request-id=...`, or `failed ...` with the reason) and \
            `flushed N message(s): S sent, F failed`; exits 1 when any failed (they stay in the \
            journal, failed, for the next flush).

              tether outbox flush --outbox /tmp/outbox.journal
            """)

    @OptionGroup var client: ClientOptions

    @Option(name: .customLong("outbox"), help: "The outbox journal file.")
    var journal: String

    @Option(help: "Retries of a failed send (network failures, timeouts, 5xx, 429), exponential from 2 s to 150 s. (default: 6)")
    var retries: Int = 6

    func validate() throws {
        guard (0...100).contains(retries) else { throw ValidationError("--retries must be 0-100") }
    }

    func run() async throws {
        guard FileManager.default.fileExists(atPath: journal) else { throw ValidationError("no outbox journal at \(journal)") }
        let path = journal
        let retry = retryConfiguration(retries)
        let client = try self.client.makeClient { configuration in
            configuration.outbox.journalPath = path
            configuration.outbox.retry = retry
        }
        var sent = 0
        var failed = 0
        var lastFailure: Status?
        let entries: [OutboxEntry]
        do {
            try await client.outbox.open()
            entries = try await client.outbox.messages
            for entry in entries {
                if case .failed = entry.state { try await client.outbox.resend(entry.id) }
            }
        } catch {
            await client.shutdown()
            FileHandle.standardError.write(Data("error: \(error.description)\n".utf8))
            throw ExitCode.failure
        }
        for entry in entries {
            do {
                let result = try await client.outbox.result(of: entry.id)
                print("\(sentLine(result)) id=\(entry.id) channel=\(entry.channel)")
                sent += 1
            } catch {
                print("failed id=\(entry.id) channel=\(entry.channel) request-id=\(entry.requestId): \(error.description)")
                failed += 1
                lastFailure = error.status
            }
        }
        await client.shutdown()
        print("flushed \(entries.count) message(s): \(sent) sent, \(failed) failed")
        if let lastFailure {
            FileHandle.standardError.write(Data(hint(for: lastFailure, origin: client.configuration.origin).utf8))
            throw ExitCode.failure
        }
    }
}
