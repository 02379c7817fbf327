// The client's subscribe machine: the pure transitions the SDK runs for every long-poll
// response, outage and liveness probe. Each run starts from a copy of a machine that is
// receiving on ten channels (`SubscribeMachineWorkload`), so every sample measures the same
// transitions; no I/O, clock or randomness is involved.
import Benchmark
@_spi(Benchmarks) import TetherClientCore

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(
        metrics: [.wallClock, .throughput, .mallocCountTotal],
        maxDuration: .seconds(2),
        maxIterations: 10_000
    )

    for events in [0, 10, 100] {
        let workload = SubscribeMachineWorkload(events: events)
        Benchmark("Long-poll cycle (\(events) events)") { benchmark in
            for _ in benchmark.scaledIterations {
                blackHole(workload.longPollCycle())
            }
        }
    }

    let outage = SubscribeMachineWorkload(events: 10)
    Benchmark("Failure -> retry -> reconnected") { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(outage.failureRetryRecovery())
        }
    }

    let liveness = SubscribeMachineWorkload(events: 0)
    Benchmark("Heartbeat tick (probe + answer)") { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(liveness.heartbeatTick())
        }
    }
}
