import Foundation
import NIOCore
import Synchronization

/// Result of the WebSocket resume run.
struct ResumeResult: Codable, Sendable {
    /// Sessions that dropped and resumed.
    var sessions: Int
    /// Messages published (acknowledged) while the sessions were away.
    var missed: Int
    /// Publishes answered with an error while they were away.
    var publishErrors: Int
    /// Whether those publishes were stored.
    var stored: Bool
    /// Seconds from the drop to the resume.
    var dropSeconds: Double
    /// Seconds it took to publish the missed messages.
    var publishSeconds: Double
    /// Sessions whose `welcome` said `resumed: true`.
    var resumed: Int
    /// Per session: `hello` sent → `welcome` received (ms).
    var welcomeMs: [Double]
    /// Per session: `hello` sent → the last missed message received (ms); the resume time.
    var resumeMs: [Double]
    /// Whether every session got every missed message before the timeout.
    var complete: Bool
    /// `messages` frames the replay took, summed over sessions.
    var replayFrames: Int
    /// Missed messages a session did not get, summed over sessions.
    var lost: Int
    /// Messages received more than once, summed over sessions (over both sockets).
    var duplicates: Int
    /// Messages whose timetoken was not above the previous one (over both sockets).
    var outOfOrder: Int
    /// `error`/`notice` frames and client-side failures, summed over sessions.
    var errors: Int
    /// The first failure a session recorded, if any.
    var firstError: String?
    /// Server CPU from the first `hello` to the last replayed message (ms; spawned servers only).
    var serverCPUMs: Double?
}

extension BenchRunner {
    /// Resume: `sessions` WebSocket sessions subscribe to a fresh channel, drop their sockets
    /// (TCP close, no `bye`), `missed` messages are published while they are away, and after
    /// `dropSeconds` each comes back with `hello` + its resume token and cursor. Measures `hello`
    /// → last replayed message and checks that every missed message arrives once, in order.
    func resume(target: BenchTarget, serverPID: Int32?, sessions: Int, missed: Int, dropSeconds: Double, store: Bool) async throws
        -> ResumeResult
    {
        let channel = freshChannel("resume")
        benchLog("resume: opening \(sessions) WebSocket sessions on \(channel)")
        let (progress, first) = try await openSubscribers(sessions, channel: channel, target: target, recordLatencyFrom: nil,
                                                          transport: .websocket)
        let droppedAt = benchNow()
        await close(first)  // a dropped link: no close frame, no `bye`
        let framesBefore = reports(progress).reduce(0) { $0 + $1.responses }
        benchLog("resume: sockets dropped; publishing \(missed) messages")

        let ledger = PublishLedger()
        let loop = group.next()
        let request = PublishRequest(channel: channel, target: target, store: store)
        let publisher = try await loop.submit {
            NIOLoopBound(PacedPublisher(request: request, ledger: ledger, rate: 100_000, total: missed), eventLoop: loop)
        }.get()
        let pool = try await BenchConnector.connectMany(32, to: target, group: loop) { _ in publisher.value.makeConnection() }
        let publishStart = benchNow()
        try await loop.submit { publisher.value.start(on: loop) }.get()
        let deadline = ContinuousClock.now + .seconds(120)
        while ledger.ackedCount.load(ordering: .acquiring) + ledger.errors.load(ordering: .relaxed) < missed
                && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(5))
        }
        let publishSeconds = seconds(publishStart, benchNow())
        try await loop.submit { publisher.value.stop() }.get()
        await close(pool)
        let published = ledger.ackedCount.load(ordering: .acquiring)
        let away = seconds(droppedAt, benchNow())
        benchLog("resume: \(published) acknowledged in \(String(format: "%.2f", publishSeconds)) s; "
                 + "resuming \(String(format: "%.1f", max(0, dropSeconds - away))) s from now")
        if dropSeconds > away { try await Task.sleep(for: .seconds(dropSeconds - away)) }

        let meter = CPUMeter(serverPID: serverPID)
        let again = try await BenchConnector.connectManyWebSockets(sessions, to: target, group: group) { index in
            BenchWebSocketSubscriber(mode: .resume, uuid: "bench-sub-\(index)", target: target, progress: progress[index],
                                     recordLatencyFrom: nil)
        }
        let complete = try await waitForDelivery(progress, expected: published, timeout: .seconds(60))
        let cpu = meter.serverSeconds()
        let states = progress.map { $0.session.withLock { $0 } }
        let lastDeliveries = progress.map { $0.lastDelivery.load(ordering: .acquiring) }
        await closeSubscribers(again, transport: .websocket)

        let reports = reports(progress)
        let acked = ledger.acked.withLock { $0 }
        var result = ResumeResult(
            sessions: sessions, missed: published, publishErrors: ledger.errors.load(ordering: .relaxed), stored: store,
            dropSeconds: seconds(droppedAt, states.map(\.helloSentAt).min() ?? droppedAt), publishSeconds: publishSeconds,
            resumed: states.filter { $0.resumed == true }.count,
            welcomeMs: states.map { milliseconds($0.welcomeAt > $0.helloSentAt ? $0.welcomeAt - $0.helloSentAt : 0) },
            resumeMs: zip(states, lastDeliveries).map { state, last in
                milliseconds(last > state.helloSentAt ? last - state.helloSentAt : 0)
            },
            complete: complete, replayFrames: reports.reduce(0) { $0 + $1.responses } - framesBefore, lost: 0, duplicates: 0,
            outOfOrder: 0, errors: 0, firstError: states.lazy.compactMap(\.lastError).first,
            serverCPUMs: cpu.map { $0 * 1000 })
        for report in reports {
            result.lost += acked.countMissing(from: report.received)
            result.duplicates += report.duplicates
            result.outOfOrder += report.outOfOrder
            result.errors += report.errors
        }
        return result
    }
}
