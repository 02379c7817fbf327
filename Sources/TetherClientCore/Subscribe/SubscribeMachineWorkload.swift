import TetherProtocol

/// Fixed subscribe-machine scenarios for `Benchmarks/` (suite `SubscribeMachineTransitions`).
///
/// The machine is package machinery (docs/public-api.md); a separate package sees only `public`
/// declarations, so the suite drives it through this `@_spi(Benchmarks)` type, which an app never
/// sees unless it writes `@_spi(Benchmarks) import` and which `scripts/check-public-api` (reading
/// the symbol graph without SPI) does not list. Each scenario starts from a copy of a prepared
/// machine, so every run measures the same transitions; the copy's first write (its watermarks)
/// is part of the cost.
@_spi(Benchmarks) public struct SubscribeMachineWorkload: Sendable {
    private let receiving: SubscribeMachine
    private let poll: SubscribeMachine.RequestID
    private let response: SubscribeResponse

    /// A machine receiving on ten channels, and a long-poll response carrying `events` events
    /// spread over them.
    @_spi(Benchmarks) public init(events: Int) {
        let channels = (0..<10).map { "chat.room-\($0)" }
        let start = Timetoken(17_326_000_000_000_000)
        var machine = SubscribeMachine(configuration: .init(retry: RetryConfiguration(jitter: .zero ... .zero),
                                                            requestMessageCountThreshold: 0))
        var request: SubscribeMachine.RequestID?
        func note(_ actions: [SubscribeMachine.Action]) {
            for case .startSubscribe(let id, _, _, _) in actions { request = id }
        }
        note(machine.subscriptionChanged(channels: channels, groups: [], now: .zero))
        if let handshake = request {
            note(machine.subscribeSucceeded(handshake, response: SubscribeResponse(timetoken: start, region: 1, events: []), now: .zero))
        }
        receiving = machine
        poll = request ?? SubscribeMachine.RequestID(rawValue: 0)
        let last = start.rawValue + UInt64(events)
        response = SubscribeResponse(timetoken: Timetoken(last), region: 1, events: (0..<events).map { index in
            ReceivedEvent(timetoken: Timetoken(start.rawValue + 1 + UInt64(index)), channel: channels[index % channels.count],
                          subscription: nil, payload: .object(["text": .string("message \(index)"), "n": .number(JSONValue.Number(Int64(index)))]),
                          publisher: "u-\(index % 7)", meta: nil, kind: .message, customMessageType: nil)
        })
    }

    /// One long-poll cycle: the response arrives, its events are de-duplicated and delivered, and
    /// the next poll starts. Returns the number of actions.
    @_spi(Benchmarks) public func longPollCycle() -> Int {
        var machine = receiving
        return machine.subscribeSucceeded(poll, response: response, now: .seconds(1)).count
    }

    /// A failed long-poll, its retry timer, the handshake that ends the outage (`reconnected`),
    /// and the first poll after it. Returns the number of actions.
    @_spi(Benchmarks) public func failureRetryRecovery() -> Int {
        var machine = receiving
        var count = 0
        var request = poll
        func note(_ actions: [SubscribeMachine.Action]) {
            count += actions.count
            for case .startSubscribe(let id, _, _, _) in actions { request = id }
        }
        note(machine.subscribeFailed(request, status: Status(category: .timeout, operation: .subscribe), now: .seconds(1), randomness: 0))
        note(machine.timerFired(.retry, now: .seconds(3), randomness: 0))
        note(machine.subscribeSucceeded(request, response: response, now: .seconds(3)))
        return count
    }

    /// A liveness tick while receiving: the timer fires, the probe answers and is re-scheduled.
    @_spi(Benchmarks) public func heartbeatTick() -> Int {
        var machine = receiving
        return machine.timerFired(.liveness, now: .seconds(25), randomness: 0).count
            + machine.livenessProbeSucceeded(now: .seconds(26)).count
    }
}
