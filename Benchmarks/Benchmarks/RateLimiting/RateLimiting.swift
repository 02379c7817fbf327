// The server's rate limits: every publish and every other non-subscribe request takes a token
// from its client's and its address's bucket (`RateLimitTable.take`) under one lock, so what a
// take costs is paid by every such request and serialises the event loops. It must not grow with
// the number of clients tracked (those active since the last sweep, every 10 s): a copy of the
// keyset's buckets per request once made it linear in them (docs/benchmarks.md, twenty-second pass).
import Benchmark
import TetherServerCore

let rates = RateLimitTable.Rates(publishPerSecond: 100, publishBurst: 500, requestPerSecond: 100, requestBurst: 500,
                                 publishPerAddress: 1_000_000, publishBurstPerAddress: 1_000_000,
                                 requestPerAddress: 1_000_000, requestBurstPerAddress: 1_000_000)

/// A table tracking `clients` uuids spread over 100 addresses, each of which has published once;
/// a class, so that every sample changes the one table in place, as the server's lock does (a
/// copy per sample would measure copying the table).
final class TrackedTable: @unchecked Sendable {
    var table = RateLimitTable()
    let uuids: [String]
    let addresses = (0..<100).map { "10.1.\($0 / 250).\($0 % 250)" }
    var index = 0
    var now = 1.0

    init(clients: Int) {
        uuids = (0..<clients).map { "user-\($0)-5f2a9d1e-7c41-4b2e" }
        for (index, uuid) in uuids.enumerated() {
            _ = table.take(.publish, uuid: uuid, address: addresses[index % addresses.count], subscribeKey: "demo", rates: rates, now: 0)
        }
    }

    /// One publish of the next client in turn (each finds its bucket: the steady state between two sweeps).
    func take() -> Double? {
        now += 0.000_01
        let wait = table.take(.publish, uuid: uuids[index], address: addresses[index % addresses.count], subscribeKey: "demo",
                              rates: rates, now: now)
        index = index + 1 == uuids.count ? 0 : index + 1
        return wait
    }
}

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(
        metrics: [.wallClock, .throughput, .mallocCountTotal],
        maxDuration: .seconds(2),
        maxIterations: 100_000
    )

    for clients in [200, 20_000] {
        let tracked = TrackedTable(clients: clients)
        Benchmark("Rate limit take (\(clients) clients tracked)") { benchmark in
            for _ in benchmark.scaledIterations {
                blackHole(tracked.take())
            }
        }
    }
}
