// Subscribe response encoding (pubnub-wire §6.3): each event is encoded once at publish, the
// `b` match is spliced in per subscription, and a response body concatenates a page of them.
import Benchmark
@_spi(Benchmarks) import TetherProtocol

let envelope = SubscribeEnvelope(
    timetoken: Timetoken(17_326_000_000_000_000),
    subscribeKey: "sub-c-5f2a9d1e-7c41-4b2e-9a4f-0d3c6e8b1a27",
    channel: "chat.room-42",
    payload: #"{"text":"Goal! 2-1 in the 89th minute","score":95,"user":{"id":"u-1842","name":"Ana"}}"#,
    publisher: "u-1842",
    meta: #"{"priority":"high","region":"eu-west-1"}"#,
    customMessageType: "chat-message",
    sequence: 1234
)

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(
        metrics: [.wallClock, .throughput, .mallocCountTotal],
        scalingFactor: .kilo,
        maxDuration: .seconds(2),
        maxIterations: 10_000
    )

    Benchmark("Envelope encode") { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(envelope.encoded())
        }
    }

    let encoded = envelope.encoded()
    Benchmark("Envelope splice match (b)") { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(SubscribeEnvelope.encodedWithMatch(encoded, match: "chat.*"))
        }
    }

    // A full page (the default 100-message cap) of pre-encoded envelopes into one body.
    let page = Array(repeating: encoded, count: 100)
    Benchmark("Response body encode (100 envelopes)", configuration: .init(scalingFactor: .one)) { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(SubscribeResponseBody.encode(cursor: Timetoken(17_326_000_000_000_100), region: 1, envelopes: page))
        }
    }
}
