@_spi(Benchmarks) package import TetherProtocol

/// One handshake: the child of ``SubscribeMachine`` that runs the `tt=0` subscribe request every
/// (re)connection starts with, and decides what its answer means.
///
/// The server answers a handshake at once, so `connected` and `reconnected` are announced as soon
/// as it does; the loop then continues from the saved cursor (`resume`), so the server pages
/// everything missed (docs/protocol.md, catch-up). Each attempt is a new handshake: the parent
/// replaces it on a retry, a network change or a new subscription.
package struct HandshakeMachine: Sendable, Hashable {
    /// A subscribe position.
    package typealias Cursor = SubscribeMachine.Cursor
    /// A request identity.
    package typealias RequestID = SubscribeMachine.RequestID

    /// Why the handshake runs, which decides what its answer announces.
    package enum Purpose: Sendable, Hashable {
        /// First connection of this loop: announces `connected`.
        case connect
        /// After an outage, probe, network change or `reconnect()`: announces `reconnected`.
        case restore
        /// A fresh cursor after a list change (`keepTimetokenOnListChange == false`): silent.
        case listChange
    }

    /// What an answered handshake announces.
    package enum Announcement: Sendable, Hashable {
        /// `connected`, with the last cursor the loop had (zero for a first connection).
        case connected(last: Timetoken)
        /// `reconnected`, with the last cursor the loop had.
        case reconnected(last: Timetoken?)
        /// Nothing (a list change).
        case nothing
    }

    /// How the loop continues after the handshake.
    package enum Continuation: Sendable, Hashable {
        /// From the handshake's cursor: nothing to catch up.
        case live
        /// From `from`, which is the server's present: every channel is continuous.
        case continuous(from: Timetoken)
        /// From `from`, behind the server's `upTo`: the receive loop catches up.
        case catchUp(from: Timetoken, upTo: Timetoken)
    }

    /// The handshake answered.
    package struct Established: Sendable, Hashable {
        /// Where the receive loop starts.
        package var cursor: Cursor
        /// What to tell the app.
        package var announcement: Announcement
        /// Whether and from where to catch up.
        package var continuation: Continuation
    }

    /// Can transition to: waiting → answered, failed. answered and failed are final: the next
    /// attempt is a new handshake.
    private enum State: Sendable, Hashable {
        /// The request is out.
        case waiting(RequestID)
        /// The server answered.
        case answered
        /// The request failed or outlived its deadline.
        case failed
    }

    /// Why it runs.
    package let purpose: Purpose
    /// Where to continue after the handshake (nil: from the handshake's cursor).
    package let resume: Timetoken?
    /// The last cursor the loop had (reported as `lastTimetoken`).
    package let last: Cursor?
    private var state: State

    /// A handshake whose request `request` the shell is sending.
    package init(request: RequestID, purpose: Purpose, resume: Timetoken?, last: Cursor?) {
        self.purpose = purpose
        self.resume = resume
        self.last = last
        self.state = .waiting(request)
    }

    /// The running request, if the handshake still waits for one.
    package var request: RequestID? {
        switch state {
        case .waiting(let id): return id
        case .answered, .failed: return nil
        }
    }

    /// Whether the loop had connected before this handshake (what a failure reports).
    package var connectedBefore: Bool {
        switch purpose {
        case .connect: return false
        case .restore, .listChange: return true
        }
    }

    /// The cursor the loop would continue from.
    package var cursor: Cursor? {
        resume.map { Cursor(timetoken: $0, region: last?.region ?? 0) } ?? last
    }

    /// The request answered 200; nil when `id` is not this handshake's request (stale).
    package mutating func succeeded(_ id: RequestID, response: SubscribeResponse) -> Established? {
        guard case .waiting(let current) = state, current == id else { return nil }
        state = .answered
        let server = Cursor(timetoken: response.timetoken, region: response.region)
        let start = resume.map { Cursor(timetoken: $0, region: response.region) } ?? server
        let announcement: Announcement
        switch purpose {
        case .connect: announcement = .connected(last: last?.timetoken ?? .zero)
        case .restore: announcement = .reconnected(last: last?.timetoken)
        case .listChange: announcement = .nothing
        }
        let continuation: Continuation
        if let resume, resume < server.timetoken {
            continuation = .catchUp(from: resume, upTo: server.timetoken)
        } else if let resume {
            continuation = .continuous(from: resume)
        } else {
            continuation = .live
        }
        return Established(cursor: start, announcement: announcement, continuation: continuation)
    }

    /// The request failed (or outlived its deadline); false when `id` is not this handshake's
    /// request (stale).
    package mutating func failed(_ id: RequestID) -> Bool {
        guard case .waiting(let current) = state, current == id else { return false }
        state = .failed
        return true
    }
}
