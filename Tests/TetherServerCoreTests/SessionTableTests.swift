import Testing
import TetherServerCore

/// The WebSocket session table as transition tables: each row is a script of inputs at given
/// times (seconds of the server's clock) and what the table says at each step. Defaults: keep
/// 300 s, ping 25 s, two missed pongs, hello within 10 s.
@Suite struct SessionTableTests {
    typealias Table = SessionTable<String>

    enum Step: Sendable, CustomStringConvertible {
        /// A new socket; expects accepted (its id) or refused (nil).
        case connect(at: Int, expect: UInt64?)
        /// `hello` on a connection, with the token of the new session.
        case open(UInt64, token: String, payload: String, at: Int)
        /// `hello` with a resume token; expects the payload (nil: unknown) and the connection it took it from.
        case resume(UInt64, token: String, at: Int, expect: String?, previous: UInt64?)
        case received(UInt64, at: Int)
        case disconnected(UInt64, at: Int, expect: [String])
        case end(UInt64, expect: String?)
        /// `suspend` on a connection, keeping its session this many seconds once the socket closes.
        case suspend(UInt64, keep: Int, expect: Bool)
        /// A tick; expects its actions, described.
        case tick(at: Int, expect: [String])
        case nextWakeUp(expect: Int?)
        case counts(connections: Int, sessions: Int, kept: Int)

        var description: String {
            switch self {
            case .connect(let at, _): "connect@\(at)"
            case .open(let c, let token, _, let at): "open(\(c), \(token))@\(at)"
            case .resume(let c, let token, let at, _, _): "resume(\(c), \(token))@\(at)"
            case .received(let c, let at): "received(\(c))@\(at)"
            case .disconnected(let c, let at, _): "disconnected(\(c))@\(at)"
            case .end(let c, _): "end(\(c))"
            case .suspend(let c, let keep, _): "suspend(\(c), \(keep))"
            case .tick(let at, _): "tick@\(at)"
            case .nextWakeUp: "nextWakeUp"
            case .counts: "counts"
            }
        }
    }

    struct Row: Sendable, CustomStringConvertible {
        var name: String
        var configuration = Table.Configuration()
        var steps: [Step]
        var description: String { name }
    }

    static func describe(_ actions: [Table.Action]) -> [String] {
        actions.map { action in
            switch action {
            case .ping(let c, _): "ping \(c)"
            case .close(let c, let reason): "close \(c) \(reason)"
            case .expired(_, let payload, let reason): "expired \(payload) \(reason)"
            case .refreshPresence(_, let payload): "refresh \(payload)"
            }
        }.sorted()
    }

    static let rows: [Row] = [
        Row(name: "an idle connection is pinged, and closed after two missed pongs", steps: [
            .connect(at: 0, expect: 1), .open(1, token: "t", payload: "a", at: 0),
            .nextWakeUp(expect: 25),
            .tick(at: 24, expect: []),
            .tick(at: 25, expect: ["ping 1"]),
            .tick(at: 49, expect: []),
            .tick(at: 50, expect: ["ping 1"]),
            .tick(at: 75, expect: ["close 1 pingTimeout"]),
            .tick(at: 200, expect: ["refresh a"]),
        ]),
        Row(name: "a pong (any frame) resets the missed count", steps: [
            .connect(at: 0, expect: 1), .open(1, token: "t", payload: "a", at: 0),
            .tick(at: 25, expect: ["ping 1"]),
            .tick(at: 50, expect: ["ping 1"]),
            .received(1, at: 60),
            .tick(at: 75, expect: []),
            .tick(at: 85, expect: ["ping 1"]),
        ]),
        Row(name: "a connection without hello is closed at its hello deadline", steps: [
            .connect(at: 0, expect: 1),
            .nextWakeUp(expect: 10),
            .tick(at: 9, expect: []),
            .tick(at: 10, expect: ["close 1 helloTimeout"]),
            .tick(at: 11, expect: []),
        ]),
        Row(name: "a dropped session is kept, and resumed within the window", steps: [
            .connect(at: 0, expect: 1), .open(1, token: "t", payload: "a", at: 0),
            .disconnected(1, at: 10, expect: []),
            .counts(connections: 0, sessions: 1, kept: 1),
            .tick(at: 309, expect: []),
            .connect(at: 309, expect: 2),
            .resume(2, token: "t", at: 309, expect: "a", previous: nil),
            .counts(connections: 1, sessions: 1, kept: 0),
            .tick(at: 320, expect: []),
        ]),
        Row(name: "a kept session expires when its window lapses; its token is then unknown", steps: [
            .connect(at: 0, expect: 1), .open(1, token: "t", payload: "a", at: 0),
            .disconnected(1, at: 10, expect: []),
            .nextWakeUp(expect: 310),
            .tick(at: 310, expect: ["expired a keepAliveLapsed"]),
            .counts(connections: 0, sessions: 0, kept: 0),
            .connect(at: 311, expect: 2),
            .resume(2, token: "t", at: 311, expect: nil, previous: nil),
        ]),
        Row(name: "a suspended session is kept for its own window, not the configured one", steps: [
            .connect(at: 0, expect: 1), .open(1, token: "t", payload: "a", at: 0),
            .suspend(1, keep: 1_000, expect: true),
            .disconnected(1, at: 10, expect: []),
            .nextWakeUp(expect: 1_010),
            .tick(at: 310, expect: []),
            .counts(connections: 0, sessions: 1, kept: 1),
            .tick(at: 1_010, expect: ["expired a keepAliveLapsed"]),
            .counts(connections: 0, sessions: 0, kept: 0),
        ]),
        Row(name: "a resumed session forgets its suspend window; suspend without a session is refused", steps: [
            .connect(at: 0, expect: 1), .suspend(1, keep: 60, expect: false),
            .open(1, token: "t", payload: "a", at: 0),
            .suspend(1, keep: 1_000, expect: true),
            .disconnected(1, at: 10, expect: []),
            .connect(at: 500, expect: 2),
            .resume(2, token: "t", at: 500, expect: "a", previous: nil),
            .disconnected(2, at: 600, expect: []),
            .nextWakeUp(expect: 900),
            .tick(at: 900, expect: ["expired a keepAliveLapsed"]),
        ]),
        Row(name: "a resume while the old socket is open takes the session over", steps: [
            .connect(at: 0, expect: 1), .open(1, token: "t", payload: "a", at: 0),
            .connect(at: 5, expect: 2),
            .resume(2, token: "t", at: 5, expect: "a", previous: 1),
            .disconnected(1, at: 6, expect: []),
            .counts(connections: 1, sessions: 1, kept: 0),
        ]),
        Row(name: "bye ends the session: no keep, token unknown", steps: [
            .connect(at: 0, expect: 1), .open(1, token: "t", payload: "a", at: 0),
            .end(1, expect: "a"),
            .disconnected(1, at: 1, expect: []),
            .counts(connections: 0, sessions: 0, kept: 0),
            .connect(at: 2, expect: 2),
            .resume(2, token: "t", at: 2, expect: nil, previous: nil),
        ]),
        Row(name: "over the kept bound the oldest kept session expires", configuration: .init(maxKeptSessions: 2), steps: [
            .connect(at: 0, expect: 1), .open(1, token: "t1", payload: "a", at: 0),
            .connect(at: 0, expect: 2), .open(2, token: "t2", payload: "b", at: 0),
            .connect(at: 0, expect: 3), .open(3, token: "t3", payload: "c", at: 0),
            .disconnected(2, at: 1, expect: []),
            .disconnected(1, at: 2, expect: []),
            .disconnected(3, at: 3, expect: ["expired b evicted"]),
            .counts(connections: 0, sessions: 2, kept: 2),
        ]),
        Row(name: "a session kept, resumed and kept again is evicted by its latest keep", configuration: .init(maxKeptSessions: 1), steps: [
            .connect(at: 0, expect: 1), .open(1, token: "t1", payload: "a", at: 0),
            .connect(at: 0, expect: 2), .open(2, token: "t2", payload: "b", at: 0),
            .disconnected(1, at: 1, expect: []),
            .connect(at: 2, expect: 3), .resume(3, token: "t1", at: 2, expect: "a", previous: nil),
            .disconnected(2, at: 3, expect: []),
            .disconnected(3, at: 4, expect: ["expired b evicted"]),
        ]),
        Row(name: "the connection bound refuses new sockets", configuration: .init(maxConnections: 2), steps: [
            .connect(at: 0, expect: 1), .connect(at: 0, expect: 2), .connect(at: 0, expect: nil),
            .disconnected(1, at: 1, expect: []),
            .connect(at: 1, expect: 3),
        ]),
        Row(name: "a connected session's presence is refreshed every third of the window", steps: [
            .connect(at: 0, expect: 1), .open(1, token: "t", payload: "a", at: 0),
            .received(1, at: 99), .tick(at: 99, expect: []),
            .received(1, at: 100), .tick(at: 100, expect: ["refresh a"]),
            .received(1, at: 199), .tick(at: 199, expect: []),
        ]),
    ]

    @Test(arguments: rows)
    func script(_ row: Row) {
        var table = Table(configuration: row.configuration)
        for step in row.steps {
            switch step {
            case .connect(let at, let expect):
                let result = table.connect(now: .seconds(at))
                if let expect { #expect(result == .accepted(expect), "\(step)") } else { #expect(result == .refused, "\(step)") }
            case .open(let connection, let token, let payload, let at):
                #expect(table.open(connection, token: token, payload: payload, bytes: 100, now: .seconds(at)) != nil, "\(step)")
            case .resume(let connection, let token, let at, let expect, let expectedPrevious):
                switch table.resume(connection, token: token, now: .seconds(at)) {
                case .resumed(_, let payload, let previous):
                    #expect(payload == expect, "\(step)")
                    #expect(previous == expectedPrevious, "\(step)")
                case .unknown:
                    #expect(expect == nil, "\(step)")
                }
            case .received(let connection, let at):
                table.received(connection, now: .seconds(at))
            case .disconnected(let connection, let at, let expect):
                #expect(Self.describe(table.disconnected(connection, now: .seconds(at))) == expect, "\(step)")
            case .end(let connection, let expect):
                #expect(table.end(connection) == expect, "\(step)")
            case .suspend(let connection, let keep, let expect):
                #expect(table.suspend(connection, keepAlive: .seconds(keep)) == expect, "\(step)")
            case .tick(let at, let expect):
                #expect(Self.describe(table.tick(now: .seconds(at))) == expect, "\(step)")
            case .nextWakeUp(let expect):
                #expect(table.nextWakeUp == expect.map { .seconds($0) }, "\(step)")
            case .counts(let connections, let sessions, let kept):
                #expect(table.connectionCount == connections, "\(step)")
                #expect(table.sessionCount == sessions, "\(step)")
                #expect(table.keptCount == kept, "\(step)")
            }
        }
    }

    @Test func keptBytesAreBounded() {
        var table = Table(configuration: .init(maxKeptBytes: 250))
        for id: UInt64 in 1...3 {
            _ = table.connect(now: .zero)
            _ = table.open(id, token: "t\(id)", payload: "p\(id)", bytes: 100, now: .zero)
        }
        #expect(Self.describe(table.disconnected(1, now: .seconds(1))) == [])
        #expect(Self.describe(table.disconnected(2, now: .seconds(2))) == [])
        #expect(Self.describe(table.disconnected(3, now: .seconds(3))) == ["expired p1 evicted"])
        #expect(table.keptBytes == 200)
        #expect(table.evictedCount == 1)
    }

    @Test func onlyTheConnectionCarryingASessionUpdatesIt() {
        var table = Table()
        _ = table.connect(now: .zero)
        let session = table.open(1, token: "t", payload: "a", bytes: 10, now: .zero)!
        let byOwner = table.update(session, on: 1, payload: "b", bytes: 10)
        #expect(byOwner)
        _ = table.connect(now: .zero)
        guard case .resumed(_, _, previous: 1) = table.resume(2, token: "t", now: .seconds(1)) else {
            Issue.record("connection 2 should take the session over from 1")
            return
        }
        // The connection it was taken from no longer moves it (its cursor, its names).
        let byPrevious = table.update(session, on: 1, payload: "stale", bytes: 10)
        #expect(!byPrevious)
        #expect(table.payload(of: session) == "b")
        let byNew = table.update(session, on: 2, payload: "c", bytes: 10)
        #expect(byNew)
        #expect(table.payload(of: session) == "c")
    }

    @Test func drainRefusesNewConnections() {
        var table = Table()
        _ = table.connect(now: .zero)
        #expect(table.drain() == [1])
        #expect(table.connect(now: .zero) == .refused)
    }
}

/// The outbound buffer's bounds.
@Suite struct OutboundBufferTests {
    @Test func overflowsAtTheFrameBound() {
        var buffer = OutboundBuffer<Int>(maxFrames: 2, maxBytes: 1_000)
        #expect(buffer.push(1, bytes: 10) == .queued)
        #expect(buffer.push(2, bytes: 10) == .queued)
        #expect(buffer.push(3, bytes: 10) == .overflow)
        #expect(buffer.isOverflowed)
        #expect(buffer.pop() == 1)
        // Once overflowed it stays so: the connection is being closed.
        #expect(buffer.push(4, bytes: 10) == .overflow)
    }

    @Test func overflowsAtTheByteBoundButTakesOneBigFrame() {
        var buffer = OutboundBuffer<Int>(maxFrames: 100, maxBytes: 100)
        #expect(buffer.push(1, bytes: 500) == .queued)  // alone: accepted
        #expect(buffer.pop() == 1)
        #expect(buffer.push(2, bytes: 60) == .queued)
        #expect(buffer.push(3, bytes: 60) == .overflow)
        #expect(buffer.byteCount == 60)
    }

    @Test func popsInOrderAcrossCompaction() {
        var buffer = OutboundBuffer<Int>(maxFrames: 1_000, maxBytes: 1_000_000)
        for i in 0..<300 { #expect(buffer.push(i, bytes: 1) == .queued) }
        var popped: [Int] = []
        for _ in 0..<200 { popped.append(buffer.pop()!) }
        for i in 300..<400 { #expect(buffer.push(i, bytes: 1) == .queued) }
        while let next = buffer.pop() { popped.append(next) }
        #expect(popped == Array(0..<400))
        #expect(buffer.isEmpty)
    }
}
