import Testing
import TetherClientCore
import TetherProtocol

/// Drives an ``OutboxMachine`` with explicit time, recording what it asks the shell to do.
struct OutboxHarness {
    struct Send: Hashable {
        var id: UInt64
        var attempt: Int
        var requestID: String
    }

    var machine: OutboxMachine
    var now: Duration = .zero
    var timers: [OutboxMachine.TimerID: Duration] = [:]
    var sends: [Send] = []
    var changes: [(OutboxMessage.ID, OutboxMessageState)] = []

    /// No jitter, PubNub's exponential curve (2, 4, 8, 16, 32, 64 s; 6 retries).
    static let noJitter = RetryConfiguration(jitter: .zero ... .zero)

    init(_ configuration: OutboxMachine.Configuration = .init(retry: noJitter), link: OutboxMachine.Link = .online) {
        machine = OutboxMachine(configuration: configuration, link: link)
    }

    static func message(_ n: UInt64, channel: String = "a", bytes: Int = 10) -> OutboxMessage {
        OutboxMessage(id: .init(n), requestID: "req-\(n)", channel: channel, payload: Array(repeating: UInt8(ascii: "x"), count: bytes))
    }

    mutating func record(_ actions: [OutboxMachine.Action]) {
        for action in actions {
            switch action {
            case .send(let message, let attempt):
                sends.append(Send(id: message.id.rawValue, attempt: attempt, requestID: message.requestID))
            case .schedule(let timer, let after): timers[timer] = now + after
            case .cancelTimer(let timer): timers[timer] = nil
            case .changed(let id, let state): changes.append((id, state))
            }
        }
    }

    mutating func record(_ outcome: OutboxMachine.Outcome) -> OutboxError? {
        switch outcome {
        case .accepted(let actions):
            record(actions)
            return nil
        case .refused(let error):
            return error
        }
    }

    @discardableResult
    mutating func publish(_ n: UInt64, channel: String = "a", bytes: Int = 10) -> OutboxError? {
        record(machine.enqueue(Self.message(n, channel: channel, bytes: bytes), now: now))
    }

    mutating func succeed(_ n: UInt64, timetoken: UInt64 = 1) {
        record(machine.sendSucceeded(.init(n), timetoken: Timetoken(timetoken), now: now))
    }

    mutating func fail(_ n: UInt64, _ category: StatusCategory, statusCode: Int? = nil, retryAfter: Duration? = nil,
                       randomness: Double = 0) {
        record(machine.sendFailed(.init(n), OutboxSendFailure(category: category, statusCode: statusCode, retryAfter: retryAfter),
                                  now: now, randomness: randomness))
    }

    mutating func link(_ link: OutboxMachine.Link) { record(machine.linkChanged(link, now: now)) }

    /// Moves time to the earliest timer and fires it; returns when it fired.
    @discardableResult
    mutating func fireNextTimer() -> Duration? {
        guard let (timer, at) = timers.min(by: { $0.value < $1.value }) else { return nil }
        timers[timer] = nil
        now = max(now, at)
        record(machine.timerFired(timer, now: now))
        return at
    }

    func state(_ n: UInt64) -> OutboxMessageState? { machine.entry(.init(n))?.state }
    var lastChange: OutboxMessageState? { changes.last?.1 }
    var sentIDs: [UInt64] { sends.map(\.id) }
}

@Suite("OutboxMachine: transition table (every phase × every event)")
struct OutboxMachineTableTests {
    enum Start: String, CaseIterable, Sendable {
        case pendingOffline, sending, backingOff, waitingRetryAfter, failed
    }

    enum Event: String, CaseIterable, Sendable {
        case succeed, failNetwork, fail403, timer, resend, cancel, goOffline, reconnect
    }

    enum Expect: Sendable, Hashable, CustomStringConvertible {
        /// Still held, in this state.
        case held(OutboxMessageState)
        /// Left the outbox; the last change reported.
        case gone(OutboxMessageState)
        /// The command was refused with this code; the state is unchanged.
        case refused(String, OutboxMessageState)

        var description: String {
            switch self {
            case .held(let s): "held \(s)"
            case .gone(let s): "gone \(s)"
            case .refused(let c, let s): "refused \(c) \(s)"
            }
        }
    }

    static func harness(in start: Start) -> OutboxHarness {
        var h = OutboxHarness(link: start == .pendingOffline ? .offline : .online)
        h.publish(1)
        switch start {
        case .pendingOffline: #expect(h.state(1) == .pending)
        case .sending: #expect(h.state(1) == .sending(attempt: 1))
        case .backingOff:
            h.fail(1, .networkIssues)
            #expect(h.timers[.retry(.init(1))] == .seconds(2))
        case .waitingRetryAfter:
            h.fail(1, .unknown, statusCode: 429, retryAfter: .seconds(5))
            #expect(h.timers[.retry(.init(1))] == .seconds(5))
        case .failed:
            h.fail(1, .accessDenied, statusCode: 403)
            #expect(h.state(1) == .failed(.accessDenied))
        }
        return h
    }

    /// The expected outcome of each (start, event) pair: every cell of the table.
    static let table: [Start: [Event: Expect]] = [
        .pendingOffline: [
            .succeed: .held(.pending), .failNetwork: .held(.pending), .fail403: .held(.pending), .timer: .held(.pending),
            .resend: .refused("notFailed", .pending), .cancel: .gone(.cancelled), .goOffline: .held(.pending),
            .reconnect: .held(.sending(attempt: 1)),
        ],
        .sending: [
            .succeed: .gone(.sent(Timetoken(1))), .failNetwork: .held(.pending), .fail403: .held(.failed(.accessDenied)),
            .timer: .held(.sending(attempt: 1)), .resend: .refused("notFailed", .sending(attempt: 1)),
            .cancel: .refused("inFlight", .sending(attempt: 1)), .goOffline: .held(.sending(attempt: 1)),
            .reconnect: .held(.sending(attempt: 1)),
        ],
        .backingOff: [
            .succeed: .held(.pending), .failNetwork: .held(.pending), .fail403: .held(.pending), .timer: .held(.sending(attempt: 2)),
            .resend: .refused("notFailed", .pending), .cancel: .gone(.cancelled), .goOffline: .held(.pending),
            .reconnect: .held(.sending(attempt: 2)),
        ],
        .waitingRetryAfter: [
            .succeed: .held(.pending), .failNetwork: .held(.pending), .fail403: .held(.pending), .timer: .held(.sending(attempt: 2)),
            .resend: .refused("notFailed", .pending), .cancel: .gone(.cancelled), .goOffline: .held(.pending),
            .reconnect: .held(.pending),
        ],
        .failed: [
            .succeed: .held(.failed(.accessDenied)), .failNetwork: .held(.failed(.accessDenied)), .fail403: .held(.failed(.accessDenied)),
            .timer: .held(.failed(.accessDenied)), .resend: .held(.sending(attempt: 1)), .cancel: .gone(.cancelled),
            .goOffline: .held(.failed(.accessDenied)), .reconnect: .held(.failed(.accessDenied)),
        ],
    ]

    static let cells: [(Start, Event)] = Start.allCases.flatMap { s in Event.allCases.map { (s, $0) } }

    @Test("every cell", arguments: cells)
    func cell(_ start: Start, _ event: Event) throws {
        var h = Self.harness(in: start)
        let expected = try #require(Self.table[start]?[event])
        let id = OutboxMessage.ID(1)
        var refusal: OutboxError?
        switch event {
        case .succeed: h.succeed(1)
        case .failNetwork: h.fail(1, .networkIssues)
        case .fail403: h.fail(1, .accessDenied, statusCode: 403)
        case .timer: h.record(h.machine.timerFired(.retry(id), now: h.now))
        case .resend: refusal = h.record(h.machine.resend(id, now: h.now))
        case .cancel: refusal = h.record(h.machine.cancel(id, now: h.now))
        case .goOffline: h.link(.offline)
        case .reconnect:
            h.link(.offline)
            h.link(.online)
        }
        switch expected {
        case .held(let state):
            #expect(refusal == nil)
            #expect(h.state(1) == state)
        case .gone(let last):
            #expect(refusal == nil)
            #expect(h.state(1) == nil)
            #expect(h.lastChange == last)
            #expect(h.machine.count == 0 && h.machine.byteCount == 0)
            #expect(h.timers.isEmpty, "no timer outlives its message")
        case .refused(let code, let state):
            #expect(refusal?.code.description == code)
            #expect(h.state(1) == state)
        }
    }

    @Test("every table row covers every event")
    func tableIsComplete() {
        for start in Start.allCases { #expect(Set(Self.table[start]?.keys.map { $0 } ?? []) == Set(Event.allCases)) }
    }
}

@Suite("OutboxMachine: failure dispositions")
struct OutboxDispositionTests {
    static let cases: [(StatusCategory, Int?, OutboxMachine.FailureDisposition)] = [
        (.networkIssues, nil, .retry), (.timeout, nil, .retry), (.tlsConnectionFailed, nil, .retry), (.cancelled, nil, .retry),
        (.unknown, 500, .retry), (.unknown, 502, .retry), (.unknown, 503, .retry), (.unknown, 429, .retry), (.unknown, nil, .retry),
        (.unknown, 404, .fail), (.unknown, 401, .fail), (.accessDenied, 403, .fail), (.badRequest, 400, .fail),
        (.badRequest, 413, .fail), (.badRequest, 414, .fail), (.malformedResponse, 200, .fail), (.tlsUntrustedCertificate, nil, .fail),
        (.connected, nil, .fail), (.acknowledgment, 200, .fail),
    ]

    @Test("category and status code decide", arguments: cases)
    func disposition(_ category: StatusCategory, _ code: Int?, _ expected: OutboxMachine.FailureDisposition) {
        #expect(OutboxMachine.disposition(of: OutboxSendFailure(category: category, statusCode: code)) == expected)
    }

    @Test("every category has an answer")
    func everyCategory() {
        for category in StatusCategory.allCases {
            _ = OutboxMachine.disposition(of: OutboxSendFailure(category: category))
        }
    }
}

@Suite("OutboxMachine: ordering")
struct OutboxOrderingTests {
    @Test("a later message to the same channel waits until the earlier one is sent")
    func perChannelOrder() {
        var h = OutboxHarness()
        h.publish(1); h.publish(2); h.publish(3)
        #expect(h.sentIDs == [1])
        #expect(h.state(2) == .pending && h.state(3) == .pending)
        h.succeed(1, timetoken: 10)
        #expect(h.sentIDs == [1, 2])
        h.succeed(2, timetoken: 11)
        h.succeed(3, timetoken: 12)
        #expect(h.sentIDs == [1, 2, 3])
        #expect(h.machine.count == 0)
    }

    @Test("a retrying head blocks its channel, not the others")
    func retryBlocksOnlyItsChannel() {
        var h = OutboxHarness()
        h.publish(1, channel: "a"); h.publish(2, channel: "a"); h.publish(3, channel: "b")
        #expect(h.sentIDs == [1, 3])
        h.fail(1, .timeout)
        #expect(h.sentIDs == [1, 3], "message 2 never overtakes message 1")
        h.succeed(3)
        h.publish(4, channel: "b")
        #expect(h.sentIDs == [1, 3, 4])
        h.fireNextTimer()
        #expect(h.sentIDs == [1, 3, 4, 1])
        h.succeed(1)
        #expect(h.sentIDs == [1, 3, 4, 1, 2])
    }

    @Test("a failed head settles its place; a resend joins the back of the channel's queue")
    func failedHeadAndResend() {
        var h = OutboxHarness()
        h.publish(1); h.publish(2); h.publish(3)
        h.fail(1, .badRequest, statusCode: 413)
        #expect(h.state(1) == .failed(.badRequest))
        #expect(h.sentIDs == [1, 2])
        #expect(h.record(h.machine.resend(.init(1), now: h.now)) == nil)
        #expect(h.state(1) == .pending)
        h.succeed(2)
        #expect(h.sentIDs == [1, 2, 3])
        h.succeed(3)
        #expect(h.sentIDs == [1, 2, 3, 1])
        #expect(h.sends.last == .init(id: 1, attempt: 1, requestID: "req-1"), "a resend keeps the request id")
        #expect(h.machine.entries.map(\.message.id.rawValue) == [1])
    }

    @Test("at most maximumConcurrentSends channels send at once, oldest head first")
    func concurrencyBound() {
        var h = OutboxHarness(.init(maximumConcurrentSends: 2, retry: OutboxHarness.noJitter), link: .offline)
        h.publish(1, channel: "c"); h.publish(2, channel: "a"); h.publish(3, channel: "b"); h.publish(4, channel: "a")
        #expect(h.sends.isEmpty, "nothing is sent while offline")
        h.link(.online)
        #expect(h.sentIDs == [1, 2])
        h.succeed(2)
        #expect(h.sentIDs == [1, 2, 3], "the oldest ready head (b's) goes before a's next")
        h.succeed(1)
        #expect(h.sentIDs == [1, 2, 3, 4])
    }

    @Test("cancelling a queued message lets the next one of its channel go")
    func cancelQueued() {
        var h = OutboxHarness(link: .offline)
        h.publish(1); h.publish(2)
        #expect(h.record(h.machine.cancel(.init(1), now: h.now)) == nil)
        h.link(.online)
        #expect(h.sentIDs == [2])
    }

    @Test("listing is in outbox order with visible states")
    func listing() {
        var h = OutboxHarness()
        h.publish(1, channel: "a"); h.publish(2, channel: "a"); h.publish(3, channel: "b")
        h.fail(3, .accessDenied, statusCode: 403)
        #expect(h.machine.entries.map(\.state) == [.sending(attempt: 1), .pending, .failed(.accessDenied)])
        #expect(h.machine.entries.map(\.message.id.rawValue) == [1, 2, 3])
    }

    @Test("state changes are reported in order: pending, sending, pending, sending, sent")
    func events() {
        var h = OutboxHarness()
        h.publish(1)
        h.fail(1, .networkIssues)
        h.fireNextTimer()
        h.succeed(1, timetoken: 42)
        #expect(h.changes.map(\.1) == [.pending, .sending(attempt: 1), .pending, .sending(attempt: 2), .sent(Timetoken(42))])
    }

    @Test("stale reports change nothing")
    func staleReports() {
        var h = OutboxHarness()
        h.publish(1)
        h.succeed(1)
        let before = h.changes.count
        h.succeed(1)
        h.fail(1, .timeout)
        h.record(h.machine.timerFired(.retry(.init(1)), now: h.now))
        h.succeed(99)
        #expect(h.changes.count == before)
    }
}

@Suite("OutboxMachine: retry timing")
struct OutboxRetryTimingTests {
    @Test("exponential back-off 2, 4, 8, 16, 32, 64 s, then failed with the last category; one request id throughout")
    func exponential() {
        var h = OutboxHarness()
        h.publish(1)
        var fired: [Duration] = []
        for _ in 0..<6 {
            h.fail(1, .timeout)
            let before = h.now
            guard let at = h.fireNextTimer() else { break }
            fired.append(at - before)
        }
        #expect(fired == [2, 4, 8, 16, 32, 64].map { Duration.seconds($0) })
        h.fail(1, .unknown, statusCode: 503)
        #expect(h.state(1) == .failed(.unknown))
        #expect(h.timers.isEmpty)
        #expect(h.sends.map(\.attempt) == Array(1...7))
        #expect(Set(h.sends.map(\.requestID)) == ["req-1"])
    }

    @Test("jitter comes from the randomness passed in")
    func jitter() {
        var h = OutboxHarness(.init(retry: RetryConfiguration(jitter: .zero ... .seconds(1))))
        h.publish(1)
        h.fail(1, .timeout, randomness: 0.25)
        #expect(h.timers[.retry(.init(1))] == .milliseconds(2250))
    }

    @Test("Retry-After is followed as given (1 s floor, up to 1 s jitter) and uses up no retries",
          arguments: [(Duration.seconds(5), 0.0, Duration.seconds(5)), (.seconds(5), 0.5, .milliseconds(5500)),
                      (.zero, 0.0, .seconds(1)), (.seconds(120), 1.0, .seconds(121))])
    func retryAfter(_ retryAfter: Duration, _ randomness: Double, _ expected: Duration) {
        var h = OutboxHarness(.init(retry: RetryConfiguration(policy: .linear(delay: .seconds(2), maximumRetries: 1),
                                                              jitter: .zero ... .zero)))
        h.publish(1)
        h.now = .seconds(100)
        h.fail(1, .unknown, statusCode: 429, retryAfter: retryAfter, randomness: randomness)
        #expect(h.timers[.retry(.init(1))] == .seconds(100) + expected)
        h.fireNextTimer()
        h.fail(1, .unknown, statusCode: 429, retryAfter: retryAfter, randomness: randomness)
        h.fireNextTimer()
        // The policy's single retry is still there after two Retry-After waits.
        h.fail(1, .timeout)
        #expect(h.state(1) == .pending)
        h.fireNextTimer()
        h.fail(1, .timeout)
        #expect(h.state(1) == .failed(.timeout))
    }

    @Test("a give-up deadline counts from the message's first failure")
    func giveUpAfter() {
        var h = OutboxHarness(.init(retry: RetryConfiguration(policy: .interval(.seconds(5), giveUpAfter: .seconds(12)),
                                                              minimumInterval: .zero, jitter: .zero ... .zero)))
        h.publish(1)
        h.now = .seconds(50)
        h.fail(1, .networkIssues)
        #expect(h.timers[.retry(.init(1))] == .seconds(55))
        h.fireNextTimer()
        h.fail(1, .networkIssues)
        #expect(h.timers[.retry(.init(1))] == .seconds(60))
        h.fireNextTimer()
        h.fail(1, .networkIssues)  // elapsed 10 s + 5 s > 12 s
        #expect(h.state(1) == .failed(.networkIssues))
    }

    @Test("no retry policy: a retryable failure fails at once")
    func disabled() {
        var h = OutboxHarness(.init(retry: .disabled))
        h.publish(1)
        h.fail(1, .timeout)
        #expect(h.state(1) == .failed(.timeout))
    }

    @Test("a non-retryable failure fails at once, whatever the policy", arguments: [
        (StatusCategory.accessDenied, 403), (.badRequest, 400), (.badRequest, 413), (.malformedResponse, 200), (.unknown, 404),
    ])
    func permanent(_ category: StatusCategory, _ code: Int) {
        var h = OutboxHarness()
        h.publish(1)
        h.fail(1, category, statusCode: code)
        #expect(h.state(1) == .failed(category))
        #expect(h.timers.isEmpty)
        #expect(h.sends.count == 1)
    }
}

@Suite("OutboxMachine: link")
struct OutboxLinkTests {
    @Test("publishing offline waits; reconnecting sends")
    func offlinePublish() {
        var h = OutboxHarness(link: .offline)
        h.publish(1)
        h.now = .seconds(30)
        #expect(h.sends.isEmpty)
        h.link(.online)
        #expect(h.sends == [.init(id: 1, attempt: 1, requestID: "req-1")])
    }

    @Test("a failure while offline waits for the link and uses up no retries")
    func failureWhileOffline() {
        var h = OutboxHarness(.init(retry: RetryConfiguration(policy: .linear(delay: .seconds(2), maximumRetries: 1),
                                                              jitter: .zero ... .zero)))
        h.publish(1)
        h.link(.offline)
        h.fail(1, .networkIssues)
        #expect(h.state(1) == .pending)
        #expect(h.timers.isEmpty)
        h.link(.online)
        #expect(h.sends.map(\.attempt) == [1, 2])
        h.fail(1, .networkIssues)
        #expect(h.state(1) == .pending, "the single policy retry is still available")
    }

    @Test("reconnecting ends a back-off wait at once and restarts the policy's count")
    func reconnectEndsBackoff() {
        var h = OutboxHarness()
        h.publish(1)
        h.fail(1, .timeout)
        h.fireNextTimer()
        h.fail(1, .timeout)
        #expect(h.timers[.retry(.init(1))] == h.now + .seconds(4))
        h.link(.offline)
        h.link(.online)
        #expect(h.timers.isEmpty)
        #expect(h.sends.map(\.attempt) == [1, 2, 3])
        h.fail(1, .timeout)
        #expect(h.timers[.retry(.init(1))] == h.now + .seconds(2))
    }

    @Test("a retry timer firing while offline leaves the message pending until the link returns")
    func timerWhileOffline() {
        var h = OutboxHarness()
        h.publish(1)
        h.fail(1, .unknown, statusCode: 503, retryAfter: .seconds(3))
        h.link(.offline)
        h.fireNextTimer()
        #expect(h.state(1) == .pending)
        #expect(h.sends.count == 1)
        h.link(.online)
        #expect(h.sends.count == 2)
    }
}

@Suite("OutboxMachine: bounds")
struct OutboxBoundsTests {
    @Test("count bound: the new message is refused, the accepted ones stay")
    func countBound() {
        var h = OutboxHarness(.init(maximumMessages: 2, retry: OutboxHarness.noJitter))
        h.publish(1); h.publish(2)
        #expect(h.publish(3)?.code == .full)
        #expect(h.machine.entries.map(\.message.id.rawValue) == [1, 2])
        h.succeed(1)
        #expect(h.publish(3) == nil)
    }

    @Test("byte bound counts payload, channel and meta")
    func byteBound() {
        var h = OutboxHarness(.init(maximumBytes: 100, retry: OutboxHarness.noJitter))
        #expect(h.publish(1, channel: "a", bytes: 59) == nil)  // 60 bytes
        #expect(h.machine.byteCount == 60)
        #expect(h.publish(2, channel: "a", bytes: 40)?.code == .full)  // 60 + 41 > 100
        #expect(h.publish(3, channel: "a", bytes: 39) == nil)  // exactly 100
        #expect(h.publish(4, channel: "b", bytes: 101)?.code == .tooLarge)
        var withMeta = OutboxHarness.message(5, bytes: 1)
        withMeta.options.meta = ["k": "v"]
        #expect(withMeta.byteCount == 1 + 1 + #"{"k":"v"}"#.utf8.count)
    }

    @Test("failed messages hold their space until cancelled")
    func failedHoldSpace() {
        var h = OutboxHarness(.init(maximumMessages: 1, retry: OutboxHarness.noJitter))
        h.publish(1)
        h.fail(1, .accessDenied, statusCode: 403)
        #expect(h.publish(2)?.code == .full)
        #expect(h.record(h.machine.cancel(.init(1), now: h.now)) == nil)
        #expect(h.publish(2) == nil)
    }

    @Test("a duplicate id is refused")
    func duplicate() {
        var h = OutboxHarness()
        h.publish(1)
        #expect(h.publish(1)?.code == .duplicateMessage)
        #expect(h.machine.count == 1)
    }

    @Test("admission answers what enqueue would")
    func admission() {
        var h = OutboxHarness(.init(maximumMessages: 1, maximumBytes: 50, retry: OutboxHarness.noJitter))
        #expect(h.machine.admission(byteCount: 51)?.code == .tooLarge)
        #expect(h.machine.admission(byteCount: 50) == nil)
        h.publish(1)
        #expect(h.machine.admission(byteCount: 1)?.code == .full)
    }

    @Test("unknown ids are refused by resend and cancel")
    func unknownIDs() {
        var h = OutboxHarness()
        #expect(h.record(h.machine.resend(.init(7), now: h.now))?.code == .unknownMessage)
        #expect(h.record(h.machine.cancel(.init(7), now: h.now))?.code == .unknownMessage)
    }
}

@Suite("OutboxMachine: restore from the journal")
struct OutboxRestoreTests {
    @Test("pending messages are sent in the order restored per channel; failed ones stay failed; bounds do not drop them")
    func restore() {
        var h = OutboxHarness(.init(maximumMessages: 2, retry: OutboxHarness.noJitter))
        // The journal's order: 3 was resent after 1 was accepted, so it is behind 1.
        let restored: [OutboxMachine.Restored] = [
            .init(OutboxHarness.message(1), .pending), .init(OutboxHarness.message(2, channel: "b"), .failed(.accessDenied)),
            .init(OutboxHarness.message(3), .pending),
        ]
        h.record(h.machine.restore(restored, now: h.now))
        #expect(h.machine.count == 3, "accepted once, never dropped")
        #expect(h.sentIDs == [1])
        #expect(h.state(2) == .failed(.accessDenied))
        #expect(h.changes.map(\.1) == [.sending(attempt: 1)], "no pending events for restored messages")
        #expect(h.publish(4)?.code == .full)
        h.succeed(1)
        #expect(h.sentIDs == [1, 3])
    }

    @Test("the order restored wins over ids: a message resent before a relaunch stays behind later ones")
    func restoreKeepsTheJournalsOrder() {
        var h = OutboxHarness(.init(retry: OutboxHarness.noJitter))
        let restored: [OutboxMachine.Restored] = [
            .init(OutboxHarness.message(2), .pending), .init(OutboxHarness.message(3), .pending), .init(OutboxHarness.message(1), .pending),
        ]
        h.record(h.machine.restore(restored, now: h.now))
        #expect(h.sentIDs == [2])
        h.succeed(2)
        h.succeed(3)
        #expect(h.sentIDs == [2, 3, 1])
        #expect(h.machine.entries.map(\.message.id.rawValue) == [1])
    }
}

@Suite("OutboxMachine: a message whose own sends keep failing")
struct OutboxMachineStubbornFailureTests {
    /// Another channel's success confirming the link ends a back-off at once, but the message
    /// keeps its count: one whose sends keep failing runs out of retries and fails, instead of
    /// starting over every time the link is confirmed, with its `publish` never returning.
    @Test func aBackOffEndedByAConfirmedLinkKeepsItsCount() {
        var h = OutboxHarness(.init(retry: RetryConfiguration(policy: .linear(delay: .seconds(2), maximumRetries: 1), jitter: .zero ... .zero)))
        h.publish(1)
        h.fail(1, .timeout)
        #expect(h.timers[.retry(.init(1))] != nil, "backing off")
        h.record(h.machine.linkConfirmed(now: h.now))
        #expect(h.timers[.retry(.init(1))] == nil, "the wait ended at once")
        #expect(h.sends.map(\.attempt) == [1, 2])
        h.fail(1, .timeout)
        #expect(h.state(1) == .failed(.timeout), "its one retry was used")
    }
}

