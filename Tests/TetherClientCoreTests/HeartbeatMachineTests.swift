import Testing
import TetherClientCore

@Suite("HeartbeatMachine: liveness probes by configuration and result")
struct HeartbeatMachineTests {
    enum Setup: String, CaseIterable, Sendable {
        case off, time, presenceNone, presenceFailures, presenceAll

        var configuration: SubscribeMachine.Configuration {
            switch self {
            case .off: return .init(liveness: nil)
            case .time: return .init(liveness: .init(interval: .seconds(25), timeout: .seconds(10)))
            case .presenceNone: return .init(presenceHeartbeat: .init(interval: .seconds(60), reporting: .none))
            case .presenceFailures: return .init(presenceHeartbeat: .init(interval: .seconds(60), reporting: .failures))
            case .presenceAll: return .init(presenceHeartbeat: .init(interval: .seconds(60), reporting: .all))
            }
        }
    }

    typealias A = HeartbeatMachine.Action

    /// Per setup: the start, then the actions for timer, success, failure (from a fresh start each).
    static let table: [Setup: (start: [A], timer: [A], success: [A], failure: [A])] = [
        .off: ([], [], [], []),
        .time: ([.schedule(after: .seconds(25))], [.probe(.time, timeout: .seconds(10))], [.schedule(after: .seconds(25))],
                [.declareDead]),
        .presenceNone: ([.schedule(after: .seconds(60))], [.probe(.presenceHeartbeat, timeout: .seconds(10))],
                        [.schedule(after: .seconds(60))], [.declareDead]),
        .presenceFailures: ([.schedule(after: .seconds(60))], [.probe(.presenceHeartbeat, timeout: .seconds(10))],
                            [.schedule(after: .seconds(60))], [.reportFailure, .declareDead]),
        .presenceAll: ([.schedule(after: .seconds(60))], [.probe(.presenceHeartbeat, timeout: .seconds(10))],
                       [.schedule(after: .seconds(60)), .reportSuccess], [.reportFailure, .declareDead]),
    ]

    @Test(arguments: Setup.allCases)
    func everyInput(_ setup: Setup) throws {
        let row = try #require(Self.table[setup])
        let (machine, start) = HeartbeatMachine.start(setup.configuration)
        #expect(start == row.start)
        #expect(machine.timerFired() == row.timer)
        var succeeding = machine
        let success = succeeding.probeSucceeded()
        #expect(success == row.success)
        var failing = machine
        let failure = failing.probeFailed()
        #expect(failure == row.failure)
        // Dead is final: nothing more is probed or reported until the parent starts a new one.
        let afterwards = failing.timerFired() + failing.probeSucceeded() + failing.probeFailed()
        #expect(afterwards == [])
    }
}
