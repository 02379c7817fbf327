import Testing
import TetherClientCore

@Suite("NetworkWatch: monitor reports into changes")
struct NetworkWatchTests {
    enum Start: String, CaseIterable, Sendable { case unknown, up, down }
    enum Report: String, CaseIterable, Sendable { case up, down, changed }

    static func watch(in start: Start) -> NetworkWatch {
        var watch = NetworkWatch()
        switch start {
        case .unknown: break
        case .up: _ = watch.up()
        case .down: _ = watch.down()
        }
        return watch
    }

    /// Expected change per report, in `Report.allCases` order.
    static let table: [Start: [NetworkWatch.Change]] = [
        .unknown: [.unchanged, .wentDown, .unchanged],
        .up: [.unchanged, .wentDown, .pathChanged],
        .down: [.cameBack, .unchanged, .cameBack],
    ]

    @Test(arguments: Start.allCases)
    func everyReport(_ start: Start) {
        for (index, report) in Report.allCases.enumerated() {
            var watch = Self.watch(in: start)
            let change: NetworkWatch.Change
            switch report {
            case .up: change = watch.up()
            case .down: change = watch.down()
            case .changed: change = watch.changed()
            }
            #expect(change == Self.table[start]?[index], "\(start) + \(report)")
            #expect(watch.isDown == (report == .down), "\(start) + \(report)")
        }
    }

    @Test func earlyAttemptsAtMostOnceASecond() {
        var watch = NetworkWatch()
        let claims = [watch.claimEarlyAttempt(now: .seconds(10)), watch.claimEarlyAttempt(now: .milliseconds(10_999)),
                      watch.claimEarlyAttempt(now: .seconds(11))]
        #expect(claims == [.allowed, .tooSoon, .allowed])
    }
}
