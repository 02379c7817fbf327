import Testing
@testable import TetherHarness

/// The pure parts of `tether bench`'s console-cost comparison: paired differences with their
/// confidence interval, and the CPU time read from /proc/<pid>/stat.
@Suite struct BenchStatisticsTests {
    @Test func pairedDifferencesHaveMeanMedianAndAStudentTInterval() throws {
        let off = [100.0, 110, 90, 105, 95]
        let on = [101.0, 112, 90, 108, 94]  // differences 1, 2, 0, 3, -1
        let d = try #require(PairedDifference(a: off, b: on))
        #expect(d.pairs == 5)
        #expect(d.mean == 1)
        #expect(d.median == 1)
        #expect(d.baseline == 100)
        // sd of (1, 2, 0, 3, -1) = sqrt(10 / 4); t(0.975, 4) = 2.776.
        let half = 2.776 * (10.0 / 4).squareRoot() / 5.0.squareRoot()
        #expect(abs(d.standardDeviation - (10.0 / 4).squareRoot()) < 1e-12)
        #expect(abs((d.low ?? .nan) - (1 - half)) < 1e-12)
        #expect(abs((d.high ?? .nan) - (1 + half)) < 1e-12)
    }

    @Test func onePairHasNoIntervalAndNoPairsNoDifference() throws {
        let d = try #require(PairedDifference(a: [3], b: [5]))
        #expect(d.mean == 2 && d.median == 2 && d.low == nil && d.high == nil && d.standardDeviation == 0)
        #expect(PairedDifference(a: [], b: [1]) == nil)
        // Unequal lengths pair the first values only.
        #expect(PairedDifference(a: [1, 2, 3], b: [2, 3])?.pairs == 2)
    }

    @Test func medianOfEvenAndOddCounts() {
        #expect(PairedDifference.median([3, 1, 2]) == 2)
        #expect(PairedDifference.median([4, 1, 3, 2]) == 2.5)
        #expect(PairedDifference.median([]) == 0)
    }

    @Test(arguments: [(1, 12.706), (4, 2.776), (9, 2.262), (30, 2.042), (35, 2.021), (1_000, 1.960)])
    func studentTQuantiles(df: Int, expected: Double) {
        #expect(PairedDifference.t975(degreesOfFreedom: df) == expected)
    }

    @Test func cpuTicksAreUtimePlusStimeCountedAfterTheCommandName() {
        // A real line's shape: pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt
        // majflt cmajflt utime stime cutime cstime ...
        let line = "4242 (tether) S 1 4242 4242 0 -1 4194560 1520 0 0 0 731 129 0 0 20 0 9 0 12345 1000000 2000 18446744073709551615\n"
        #expect(BenchMachine.cpuTicks(statLine: line) == 860)
        // The command name may hold spaces and parentheses.
        let odd = "77 (my (odd) name) R 1 77 77 0 -1 0 0 0 0 0 15 5 0 0 20 0 1 0 1 1 1"
        #expect(BenchMachine.cpuTicks(statLine: odd) == 20)
        #expect(BenchMachine.cpuTicks(statLine: "garbage") == nil)
        #expect(BenchMachine.cpuTicks(statLine: "1 (x) S 1 2 3") == nil)
    }

    @Test func serverCPUPerPublishComesFromTheCPUPerDelivery() {
        var run = FanoutResult(
            transport: "long-poll", subscribers: 10, publishers: 16, targetRate: nil, maxScheduleLagMs: nil, stored: true,
            requestIDs: false, publishSeconds: 5, published: 1_000, publishErrors: 0, publishesPerSecond: 200, deliveries: 10_000,
            deliveriesPerSecond: 2_000, deliveriesPerSecondWhilePublishing: 2_000, drainSeconds: 0, complete: true, lost: 0,
            subscribersWithLoss: 0, duplicates: 0, outOfOrder: 0, subscribeErrors: 0, subscribeResponses: 0,
            serverMicrosPerDelivery: 25, deliveriesPerSecondSeries: [])
        #expect(run.serverMicrosPerPublish == 250)
        run.serverMicrosPerDelivery = nil
        #expect(run.serverMicrosPerPublish == nil)
    }
}
