// The subscribe read path on the server: `DeliveryHub.plan` gathers in-memory events after a
// cursor, and `ReadPlan.merge` merges them with store reads into one page, applying the
// cursor rule (no event at or below the returned timetoken can be missing).
import Benchmark
@_spi(Benchmarks) import TetherProtocol
@_spi(Benchmarks) import TetherServerCore

let subscribeKey = "sub-c-5f2a9d1e-7c41-4b2e-9a4f-0d3c6e8b1a27"
let channels = (0..<10).map { "chat.room-\($0)" }
let start = Timetoken(17_326_000_000_000_000)

func envelope(_ timetoken: Timetoken, channel: String, index: Int) -> SubscribeEnvelope {
    SubscribeEnvelope(
        timetoken: timetoken, subscribeKey: subscribeKey, channel: channel,
        payload: #"{"text":"message \#(index)","score":\#(index % 100)}"#, publisher: "u-\(index % 7)",
        meta: index.isMultiple(of: 2) ? #"{"priority":"high"}"# : #"{"priority":"low"}"#
    )
}

/// A hub with `perChannel` committed events on each of ten channels, published round-robin.
func filledHub(perChannel: Int) -> DeliveryHub {
    var hub = DeliveryHub(floor: start, now: start)
    for index in 0..<(perChannel * channels.count) {
        let channel = channels[index % channels.count]
        let timetoken = hub.reserve(ChannelKey(subscribeKey: subscribeKey, channel: channel), now: start)
        _ = hub.commit(BufferedEvent(envelope: envelope(timetoken, channel: channel, index: index), isStored: true), now: start)
    }
    return hub
}

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(
        metrics: [.wallClock, .throughput, .mallocCountTotal],
        maxDuration: .seconds(2),
        maxIterations: 10_000
    )

    let spec = SubscriptionSpec(subscribeKey: subscribeKey, channels: channels)
    let hub = filledHub(perChannel: 20)

    Benchmark("Hub plan (10 channels x 20 events)") { benchmark in
        var hub = hub
        for _ in benchmark.scaledIterations {
            blackHole(hub.plan(spec, after: start, now: start))
        }
    }

    var planner = hub
    let bufferOnly = planner.plan(spec, after: start, now: start)
    Benchmark("Merge 200 buffered -> page of 100") { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(bufferOnly.merge(storeResults: [], limit: 100))
        }
    }

    let filter = try! FilterExpression(parsing: "meta.priority == 'high' && data.score > 20")
    Benchmark("Merge 200 buffered with filter -> page of 100") { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(bufferOnly.merge(storeResults: [], limit: 100) { filter.matches(meta: $0, data: $1) })
        }
    }

    // Half the page from the store: 100 buffered events interleaved with 100 older stored ones
    // on another channel (store envelopes are encoded at merge time, buffered ones were not).
    let smallHub = filledHub(perChannel: 10)
    var smallPlanner = smallHub
    let mixed = smallPlanner.plan(spec, after: start, now: start)
    let stored = (0..<100).map { envelope(Timetoken(start.rawValue + 1 + UInt64($0) * 2), channel: "archive", index: $0) }
    let range = StoreRange(subscribeKey: subscribeKey, selector: .channel("archive"), after: start, through: mixed.visibleThrough, match: nil)
    let results = [StoreRangeResult(range: range, envelopes: stored, reachedLimit: false)]
    Benchmark("Merge 100 buffered + 100 stored -> page of 100") { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(mixed.merge(storeResults: results, limit: 100))
        }
    }
}
