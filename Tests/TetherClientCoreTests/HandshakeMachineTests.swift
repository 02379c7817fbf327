import Testing
import TetherClientCore
@_spi(Benchmarks) import TetherProtocol

@Suite("HandshakeMachine: what an answer announces and where the loop continues")
struct HandshakeMachineTests {
    typealias Cursor = SubscribeMachine.Cursor

    struct Row: Sendable, CustomStringConvertible {
        var purpose: HandshakeMachine.Purpose
        var resume: UInt64?
        var last: UInt64?
        /// The server's answer (region 7).
        var server: UInt64
        var announcement: HandshakeMachine.Announcement
        var continuation: HandshakeMachine.Continuation
        /// Where the receive loop starts (region: the server's).
        var start: UInt64
        var description: String { "\(purpose) resume \(resume.map(String.init) ?? "-") server \(server)" }
    }

    static let rows: [Row] = [
        Row(purpose: .connect, resume: nil, last: nil, server: 100, announcement: .connected(last: .zero), continuation: .live, start: 100),
        Row(purpose: .connect, resume: 50, last: nil, server: 100, announcement: .connected(last: .zero),
            continuation: .catchUp(from: Timetoken(50), upTo: Timetoken(100)), start: 50),
        Row(purpose: .restore, resume: 40, last: 40, server: 100, announcement: .reconnected(last: Timetoken(40)),
            continuation: .catchUp(from: Timetoken(40), upTo: Timetoken(100)), start: 40),
        Row(purpose: .restore, resume: 100, last: 100, server: 100, announcement: .reconnected(last: Timetoken(100)),
            continuation: .continuous(from: Timetoken(100)), start: 100),
        Row(purpose: .restore, resume: 150, last: 150, server: 100, announcement: .reconnected(last: Timetoken(150)),
            continuation: .continuous(from: Timetoken(150)), start: 150),
        // catchUpOnSubscriptionRestore off: the parent passes no resume point.
        Row(purpose: .restore, resume: nil, last: 40, server: 100, announcement: .reconnected(last: Timetoken(40)), continuation: .live,
            start: 100),
        Row(purpose: .listChange, resume: nil, last: 40, server: 100, announcement: .nothing, continuation: .live, start: 100),
    ]

    @Test(arguments: rows)
    func answer(_ row: Row) {
        var ids = SubscribeMachine.RequestIDs()
        let id = ids.next()
        var handshake = HandshakeMachine(request: id, purpose: row.purpose, resume: row.resume.map { Timetoken($0) },
                                         last: row.last.map { Cursor(timetoken: Timetoken($0), region: 3) })
        #expect(handshake.request == id)
        let established = handshake.succeeded(id, response: SubscribeResponse(timetoken: Timetoken(row.server), region: 7, events: []))
        #expect(established?.announcement == row.announcement)
        #expect(established?.continuation == row.continuation)
        #expect(established?.cursor == Cursor(timetoken: Timetoken(row.start), region: 7))
        #expect(handshake.request == nil)
    }

    @Test(arguments: [HandshakeMachine.Purpose.connect, .restore, .listChange])
    func staleAndFinishedAnswersAreIgnored(_ purpose: HandshakeMachine.Purpose) {
        var ids = SubscribeMachine.RequestIDs()
        let id = ids.next()
        let other = ids.next()
        var handshake = HandshakeMachine(request: id, purpose: purpose, resume: nil, last: Cursor(timetoken: Timetoken(9), region: 2))
        let response = SubscribeResponse(timetoken: Timetoken(10), region: 1, events: [])
        let staleAnswer = handshake.succeeded(other, response: response)
        #expect(staleAnswer == nil)
        let staleFailure = handshake.failed(other)
        #expect(!staleFailure)
        #expect(handshake.connectedBefore == (purpose != .connect))
        #expect(handshake.cursor == Cursor(timetoken: Timetoken(9), region: 2))
        let failure = handshake.failed(id)
        #expect(failure)
        #expect(handshake.request == nil)
        let lateAnswer = handshake.succeeded(id, response: response)
        #expect(lateAnswer == nil)                                    // failed is final
        let lateFailure = handshake.failed(id)
        #expect(!lateFailure)
    }

    @Test func cursorBeforeTheAnswerIsTheResumePointInTheLastRegion() {
        let handshake = HandshakeMachine(request: SubscribeMachine.RequestIDs().nextID(), purpose: .restore, resume: Timetoken(5),
                                         last: Cursor(timetoken: Timetoken(4), region: 3))
        #expect(handshake.cursor == Cursor(timetoken: Timetoken(5), region: 3))
    }
}

extension SubscribeMachine.RequestIDs {
    /// The first ID of a fresh sequence.
    func nextID() -> SubscribeMachine.RequestID {
        var copy = self
        return copy.next()
    }
}
