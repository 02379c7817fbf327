// The client's subscribe state machine (TetherClientCore): every long-poll answer, failure and
// timer is one transition, so its cost is paid per response on every connected client.
import Benchmark
import TetherClientCore
import TetherProtocol

let channels = (0..<10).map { "chat.room-\($0)" }
let start: UInt64 = 17_326_000_000_000_000

/// The subscribe request a transition asked the shell to start, if any.
func startedRequest(_ actions: [SubscribeMachine.Action]) -> SubscribeMachine.RequestID? {
    for action in actions {
        if case .startSubscribe(let id, _, _, _) = action { return id }
    }
    return nil
}

/// A response page of `count` events spread over the subscribed channels, ending at `timetoken`.
func response(_ timetoken: UInt64, count: Int) -> SubscribeResponse {
    let events = (0..<count).map { index in
        ReceivedEvent(timetoken: Timetoken(timetoken - UInt64(count - 1 - index)), channel: channels[index % channels.count],
                      subscription: nil, payload: .string("message \(index)"), publisher: "u-\(index % 7)", meta: nil,
                      kind: .message, customMessageType: nil)
    }
    return SubscribeResponse(timetoken: Timetoken(timetoken), region: 1, events: events)
}

/// A machine subscribed to ten channels whose handshake succeeded: it is long-polling.
func receivingMachine() -> (SubscribeMachine, SubscribeMachine.RequestID) {
    var machine = SubscribeMachine()
    let handshake = startedRequest(machine.subscriptionChanged(channels: channels, groups: [], now: .zero))!
    let poll = startedRequest(machine.subscribeSucceeded(handshake, response: response(start, count: 0), now: .zero))!
    return (machine, poll)
}

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(
        metrics: [.wallClock, .throughput, .mallocCountTotal],
        maxDuration: .seconds(2),
        maxIterations: 100_000
    )

    // Steady state: a long-poll answers with events, the machine de-duplicates and delivers them
    // and starts the next poll from the new cursor. Each sample is one transition of a machine
    // that has just completed its handshake; building the machine and the response, and freeing
    // them, are outside the measurement.
    for count in [0, 10, 100] {
        let page = response(start + 1_000, count: count)
        Benchmark("Long-poll success (\(count) events)") { benchmark in
            for _ in benchmark.scaledIterations {
                var (machine, request) = receivingMachine()
                benchmark.startMeasurement()
                let actions = machine.subscribeSucceeded(request, response: page, now: .seconds(1))
                benchmark.stopMeasurement()
                blackHole(actions)
            }
        }
    }

    // Connect: subscribe to ten channels from idle and complete the handshake.
    Benchmark("Subscribe + handshake (10 channels)") { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(receivingMachine())
        }
    }

    // An outage and recovery: the poll fails, the retry timer fires, the retried handshake succeeds.
    Benchmark("Failure -> retry timer -> recovered") { benchmark in
        var (machine, request) = receivingMachine()
        let failure = Status(category: .networkIssues, operation: .subscribe)
        let recovered = response(start, count: 0)
        var now = Duration.zero
        benchmark.startMeasurement()
        for _ in benchmark.scaledIterations {
            now += .seconds(10)
            blackHole(machine.subscribeFailed(request, status: failure, now: now, randomness: 0.5))
            now += .seconds(5)
            let retry = machine.timerFired(.retry, now: now, randomness: 0.5)
            let handshake = startedRequest(retry)!
            request = startedRequest(machine.subscribeSucceeded(handshake, response: recovered, now: now))!
        }
        benchmark.stopMeasurement()
    }
}
