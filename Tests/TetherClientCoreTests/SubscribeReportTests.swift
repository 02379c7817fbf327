import Testing
import TetherClientCore
@_spi(Benchmarks) import TetherProtocol

@Suite("SubscribeReport: the public Status built at the edge")
struct SubscribeReportTests {
    struct Row: Sendable, CustomStringConvertible {
        var name: String
        var event: SubscribeReport.Event
        var retryEpisode: Int? = nil
        var category: StatusCategory
        var operation: TetherOperation = .subscribe
        var affected: [String]
        var subscribed: [String]
        var last: Timetoken?
        var current: Timetoken?
        var message: String? = nil
        var willRetry = false
        var description: String { name }
    }

    static let cause = Status(category: .networkIssues, operation: .subscribe, statusCode: 502, deniedChannels: ["x"])

    /// Subscription at the time of every report: channels a, b.
    static let rows: [Row] = [
        Row(name: "connected", event: .connected(last: .zero, current: Timetoken(9)), category: .connected, affected: ["a", "b"],
            subscribed: ["a", "b"], last: .zero, current: Timetoken(9)),
        Row(name: "reconnected", event: .reconnected(last: Timetoken(5), current: Timetoken(9)), category: .reconnected,
            affected: ["a", "b"], subscribed: ["a", "b"], last: Timetoken(5), current: Timetoken(9)),
        Row(name: "subscription changed", event: .subscriptionChanged(channels: ["b"], groups: [], last: Timetoken(5), current: Timetoken(6)),
            category: .subscriptionChanged, affected: ["b"], subscribed: ["a", "b"], last: Timetoken(5), current: Timetoken(6)),
        Row(name: "unsubscribed", event: .unsubscribed(channels: ["c"], groups: [], last: Timetoken(5)), category: .disconnected,
            operation: .unsubscribe, affected: ["c"], subscribed: ["a", "b"], last: Timetoken(5), current: Timetoken(5)),
        Row(name: "disconnected", event: .disconnected(last: Timetoken(5)), category: .disconnected, affected: ["a", "b"],
            subscribed: ["a", "b"], last: Timetoken(5), current: Timetoken(5)),
        Row(name: "failure under another category keeps the cause's as its message",
            event: .failure(.unexpectedDisconnect, cause: cause, last: Timetoken(5)), retryEpisode: 3, category: .unexpectedDisconnect,
            affected: ["a", "b"], subscribed: ["a", "b"], last: Timetoken(5), current: Timetoken(5), message: "networkIssues",
            willRetry: true),
        Row(name: "failure under its own category", event: .failure(.networkIssues, cause: cause, last: nil), category: .networkIssues,
            affected: ["a", "b"], subscribed: ["a", "b"], last: nil, current: nil),
        Row(name: "gave up", event: .gaveUp(.disconnectedUnexpectedly, last: Timetoken(5)), category: .disconnectedUnexpectedly,
            affected: ["a", "b"], subscribed: ["a", "b"], last: Timetoken(5), current: Timetoken(5)),
        Row(name: "message count", event: .messageCountExceeded(count: 120, threshold: 100, last: Timetoken(5), current: Timetoken(6)),
            category: .requestMessageCountExceeded, affected: ["a", "b"], subscribed: ["a", "b"], last: Timetoken(5),
            current: Timetoken(6), message: "120 events in one response (threshold 100)"),
        Row(name: "network down", event: .networkDown, category: .networkDown, affected: [], subscribed: ["a", "b"]),
        Row(name: "network up", event: .networkUp, category: .networkUp, affected: [], subscribed: ["a", "b"]),
        Row(name: "heartbeat", event: .heartbeatSucceeded, category: .acknowledgment, operation: .heartbeat, affected: ["a", "b"],
            subscribed: []),
    ]

    @Test(arguments: rows)
    func status(_ row: Row) {
        let status = Status(SubscribeReport(row.event, channels: ["a", "b"], groups: [], retryEpisode: row.retryEpisode))
        #expect(status.category == row.category)
        #expect(status.operation == row.operation)
        #expect(status.affectedChannels == row.affected)
        #expect(status.subscribedChannels == row.subscribed)
        #expect(status.lastTimetoken == row.last)
        #expect(status.currentTimetoken == row.current)
        #expect(status.serverMessage == row.message)
        #expect(status.willAutomaticallyRetry == row.willRetry)
    }

    @Test func failuresCarryTheCausesCodeAndDenials() {
        let status = Status(SubscribeReport(.failure(.accessDenied, cause: Self.cause, last: nil), channels: ["a"], groups: ["g"]))
        #expect(status.statusCode == 502)
        #expect(status.deniedChannels == ["x"])
        #expect(status.affectedGroups == ["g"])
    }

    @Test func statusesFromRequestsPassThrough() {
        let failed = Status(category: .timeout, operation: .heartbeat, statusCode: 504)
        #expect(Status(SubscribeReport(.heartbeatFailed(failed), channels: ["a"], groups: [])).statusCode == 504)
        let undecryptable = Status(category: .decryptionError, operation: .subscribe, serverMessage: "bad key")
        #expect(Status(SubscribeReport(.decryptionFailed(undecryptable), channels: ["a"], groups: [])).serverMessage == "bad key")
    }
}
