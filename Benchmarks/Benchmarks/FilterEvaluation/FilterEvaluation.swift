// Subscribe filter expressions (protocol reference §10): the server evaluates a subscriber's
// filter against every event it would deliver, so evaluation cost multiplies by fan-out.
import Benchmark
@_spi(Benchmarks) import TetherProtocol

/// A typical publish: a small meta object and a chat-like payload.
let metaText = #"{"priority":"high","region":"eu-west-1","tags":["sports","news"],"level":7}"#
let payloadText = #"{"text":"Goal! 2-1 in the 89th minute","score":95,"user":{"id":"u-1842","name":"Ana"}}"#

/// Filters from simple to busy; each is parsed once, as the server does per subscription.
let filters: [(name: String, text: String)] = [
    ("equality", "meta.priority == 'high'"),
    ("compound", "meta.priority == 'high' && data.score > 80 || meta.region LIKE 'us-*'"),
    ("contains+arithmetic", "meta.tags CONTAINS 'sports' && (meta.level + 3) % 4 == 2 && data.user.name != 'bot'"),
]

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(
        metrics: [.wallClock, .throughput, .mallocCountTotal],
        scalingFactor: .kilo,  // evaluation takes ~100 ns: a sample is 1,000 of them
        maxDuration: .seconds(2),
        maxIterations: 10_000
    )

    // Parsed once: what every event costs once per event, shared by all subscribers.
    let meta = try! JSONValue(parsing: metaText)
    let data = try! JSONValue(parsing: payloadText)

    for filter in filters {
        let expression = try! FilterExpression(parsing: filter.text)
        Benchmark("Filter evaluate (\(filter.name))") { benchmark in
            for _ in benchmark.scaledIterations {
                blackHole(expression.matches(meta: meta, data: data))
            }
        }
    }

    for filter in filters {
        Benchmark("Filter parse (\(filter.name))", configuration: .init(scalingFactor: .one)) { benchmark in
            for _ in benchmark.scaledIterations {
                blackHole(try! FilterExpression(parsing: filter.text))
            }
        }
    }

    // The once-per-event cost a filter adds on the server: parsing meta and payload.
    Benchmark("Filter inputs: parse meta + payload JSON", configuration: .init(scalingFactor: .one)) { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(try! JSONValue(parsing: metaText))
            blackHole(try! JSONValue(parsing: payloadText))
        }
    }
}
