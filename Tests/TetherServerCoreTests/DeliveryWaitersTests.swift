import Testing
import TetherServerCore

/// The waiter lifecycle as a transition table: each row is a script of events for one waiter
/// (id 1, on connection 7, deadline 100) and what the shell is told to do at each step.
@Suite struct DeliveryWaitersTests {
    typealias Waiters = DeliveryWaiters<String, Int, Int>

    enum Event: Sendable, CustomStringConvertible {
        case register
        case park(connectionIsOpen: Bool, now: Int)
        case wake(WakeReason)
        case connectionClosed
        case shutdown

        var description: String {
            switch self {
            case .register: "register"
            case .park(let open, let now): "park(open: \(open), now: \(now))"
            case .wake(let reason): "wake(\(reason))"
            case .connectionClosed: "connectionClosed"
            case .shutdown: "shutdown"
            }
        }
    }

    /// What one event made the machine say, in a comparable form.
    enum Outcome: Equatable, Sendable {
        case none
        case wait
        case resumeAtOnce(WakeReason, unregister: Bool)
        case resumed([String])
        case wakeForClose(UInt64?)
        case wakeForShutdown([UInt64])
    }

    struct Row: Sendable, CustomStringConvertible {
        var name: String
        var script: [(Event, Outcome)]
        var description: String { name }
    }

    static let rows: [Row] = [
        Row(name: "parks, then an event resumes it", script: [
            (.register, .none), (.park(connectionIsOpen: true, now: 0), .wait), (.wake(.event), .resumed(["p1"])),
        ]),
        Row(name: "an event before it parks is kept and answers the park", script: [
            (.register, .none), (.wake(.event), .resumed([])),
            (.park(connectionIsOpen: true, now: 0), .resumeAtOnce(.event, unregister: false)),
        ]),
        Row(name: "the first early wake-up wins", script: [
            (.register, .none), (.wake(.accessChanged), .resumed([])), (.wake(.timeout), .resumed([])),
            (.park(connectionIsOpen: true, now: 0), .resumeAtOnce(.accessChanged, unregister: false)),
        ]),
        Row(name: "a resumed waiter is resumed only once", script: [
            (.register, .none), (.park(connectionIsOpen: true, now: 0), .wait), (.wake(.timeout), .resumed(["p1"])),
            (.wake(.event), .resumed([])),
        ]),
        Row(name: "a closed connection before it parks answers clientGone", script: [
            (.register, .none), (.park(connectionIsOpen: false, now: 0), .resumeAtOnce(.clientGone, unregister: true)),
        ]),
        Row(name: "a connection closing while parked wakes it", script: [
            (.register, .none), (.park(connectionIsOpen: true, now: 0), .wait), (.connectionClosed, .wakeForClose(1)),
            (.wake(.clientGone), .resumed(["p1"])),
        ]),
        Row(name: "a connection closing with nothing parked wakes nobody", script: [
            (.register, .none), (.connectionClosed, .wakeForClose(nil)),
        ]),
        Row(name: "shutdown wakes the parked waiter", script: [
            (.register, .none), (.park(connectionIsOpen: true, now: 0), .wait), (.shutdown, .wakeForShutdown([1])),
            (.wake(.shutdown), .resumed(["p1"])),
        ]),
        Row(name: "after shutdown a waiter answers at once", script: [
            (.register, .none), (.shutdown, .wakeForShutdown([])),
            (.park(connectionIsOpen: true, now: 0), .resumeAtOnce(.shutdown, unregister: true)),
        ]),
        Row(name: "a deadline already passed answers timeout", script: [
            (.register, .none), (.park(connectionIsOpen: true, now: 100), .resumeAtOnce(.timeout, unregister: true)),
        ]),
        Row(name: "a deadline not yet passed parks", script: [
            (.register, .none), (.park(connectionIsOpen: true, now: 99), .wait), (.wake(.timeout), .resumed(["p1"])),
        ]),
    ]

    @Test(arguments: rows)
    func transitions(_ row: Row) {
        var waiters = Waiters()
        let id = WaiterID(1)
        for (step, (event, expected)) in row.script.enumerated() {
            let outcome: Outcome
            switch event {
            case .register:
                waiters.registered(id)
                outcome = .none
            case .park(let open, let now):
                switch waiters.park(id, "p1", connection: 7, connectionIsOpen: open, deadline: 100, now: now) {
                case .wait: outcome = .wait
                case .resume(let reason, let unregister): outcome = .resumeAtOnce(reason, unregister: unregister)
                }
            case .wake(let reason):
                outcome = .resumed(waiters.wake([id], reason: reason))
            case .connectionClosed:
                outcome = .wakeForClose(waiters.connectionClosed(7)?.rawValue)
            case .shutdown:
                outcome = .wakeForShutdown(waiters.shutdown().map(\.rawValue))
            }
            #expect(outcome == expected, "step \(step): \(event)")
        }
    }

    @Test func countsOnlyParkedWaiters() {
        var waiters = Waiters()
        waiters.registered(WaiterID(1))
        waiters.registered(WaiterID(2))
        #expect(waiters.waitingCount == 0)
        #expect(waiters.park(WaiterID(1), "a", connection: 1, connectionIsOpen: true, deadline: 10, now: 0).isWait)
        #expect(waiters.waitingCount == 1)
        #expect(waiters.parkedWaiters == [WaiterID(1)])
        #expect(waiters.wake([WaiterID(1), WaiterID(2)], reason: .accessChanged) == ["a"])
        #expect(waiters.waitingCount == 0)
        // Waiter 2 was woken before parking: it answers at once with that reason.
        guard case .resume(.accessChanged, unregister: false) =
            waiters.park(WaiterID(2), "b", connection: 2, connectionIsOpen: true, deadline: 10, now: 0) else {
            Issue.record("an early wake-up was lost")
            return
        }
        #expect(waiters.waitingCount == 0)
    }

    @Test func watchesEachConnectionOnceUntilItCloses() {
        var waiters = Waiters()
        #expect(waiters.watch(3) == .observeClose)
        #expect(waiters.watch(3) == .none)
        #expect(waiters.connectionClosed(3) == nil)
        #expect(waiters.watch(3) == .observeClose)
    }

    @Test func deadlinesComeDueInOrderAndOnlyForWaitersStillParked() {
        var waiters = Waiters()
        #expect(waiters.nextDeadline() == nil)
        for (id, deadline) in [(1, 30), (2, 10), (3, 20), (4, 10)] {
            waiters.registered(WaiterID(UInt64(id)))
            #expect(waiters.park(WaiterID(UInt64(id)), "p\(id)", connection: id, connectionIsOpen: true, deadline: deadline,
                                 now: 0).isWait)
        }
        #expect(waiters.nextDeadline() == 10)
        #expect(waiters.expired(now: 9).isEmpty)
        // Waiter 2 is answered by an event: its deadline no longer counts.
        #expect(waiters.wake([WaiterID(2)], reason: .event) == ["p2"])
        #expect(waiters.nextDeadline() == 10)
        #expect(waiters.expired(now: 20).map(\.rawValue).sorted() == [3, 4])
        #expect(waiters.nextDeadline() == 30, "the due ones are handed out once")
        #expect(waiters.expired(now: 20).isEmpty)
        #expect(waiters.wake([WaiterID(3), WaiterID(4)], reason: .timeout) == ["p3", "p4"])
        // The earliest entry left belongs to a waiter woken since: skipped.
        #expect(waiters.wake([WaiterID(1)], reason: .clientGone) == ["p1"])
        #expect(waiters.nextDeadline() == nil)
        #expect(waiters.expired(now: 1_000).isEmpty)
    }

    @Test func theDeadlineOrderStaysBoundedUnderChurn() {
        // A long-poll answered by an event leaves its deadline behind; 100,000 of them, with 10
        // waiting at any time, must not keep 100,000 entries.
        var waiters = Waiters()
        for n in 0..<100_000 {
            let id = WaiterID(UInt64(n))
            waiters.registered(id)
            #expect(waiters.park(id, "p", connection: n % 10, connectionIsOpen: true, deadline: 1_000_000 + n, now: n).isWait)
            if n >= 10 { _ = waiters.wake([WaiterID(UInt64(n - 10))], reason: .event) }
        }
        #expect(waiters.waitingCount == 10)
        #expect(waiters.deadlineEntries <= 2 * 10 + 64 + 1)
        #expect(waiters.nextDeadline() == 1_000_000 + 99_990)
    }

    @Test func aLaterRequestOnTheSameConnectionOwnsIt() {
        var waiters = Waiters()
        waiters.registered(WaiterID(1))
        #expect(waiters.park(WaiterID(1), "a", connection: 5, connectionIsOpen: true, deadline: 10, now: 0).isWait)
        #expect(waiters.wake([WaiterID(1)], reason: .event) == ["a"])
        waiters.registered(WaiterID(2))
        #expect(waiters.park(WaiterID(2), "b", connection: 5, connectionIsOpen: true, deadline: 10, now: 0).isWait)
        #expect(waiters.connectionClosed(5) == WaiterID(2))
    }
}

extension DeliveryWaiters.ParkAction {
    fileprivate var isWait: Bool {
        switch self {
        case .wait: true
        case .resume: false
        }
    }
}
