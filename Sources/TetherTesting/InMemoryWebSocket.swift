import Synchronization
package import Tether
package import TetherClientCore

/// A WebSocket connector with no socket: every connection attempt the client makes waits until
/// the test accepts it (getting the server's end, a ``Peer``), refuses the upgrade with a plain
/// HTTP answer, or fails it as the network would. With ``ManualClock`` it drives the SDK's
/// WebSocket session step by step, the way ``InMemoryTransport`` drives the long-poll.
package final class InMemoryWebSocket: WebSocketConnector {
    /// One connection attempt (the HTTP upgrade), waiting for the test's decision.
    package final class Attempt: Sendable {
        /// The URL the client connects to (`ws://origin/v2/ws`).
        package let url: String
        /// The sub-protocol the client offers.
        package let subprotocol: String
        private enum Decision {
            case pending(CheckedContinuation<Result<Peer, WebSocketConnectFailure>, Never>?)
            case decided(Result<Peer, WebSocketConnectFailure>)
            case delivered
        }

        private let decision = Mutex<Decision>(.pending(nil))

        init(url: String, subprotocol: String) {
            self.url = url
            self.subprotocol = subprotocol
        }

        /// Registers the client's continuation; resumes it at once if the attempt was decided.
        func attach(_ continuation: CheckedContinuation<Result<Peer, WebSocketConnectFailure>, Never>) {
            let ready = decision.withLock { state -> Result<Peer, WebSocketConnectFailure>? in
                switch state {
                case .pending:
                    state = .pending(continuation)
                    return nil
                case .decided(let result):
                    state = .delivered
                    return result
                case .delivered:
                    return .failure(.transport(.cancelled))
                }
            }
            if let ready { continuation.resume(returning: ready) }
        }

        private func decide(_ result: Result<Peer, WebSocketConnectFailure>) {
            let waiting = decision.withLock { state -> CheckedContinuation<Result<Peer, WebSocketConnectFailure>, Never>? in
                switch state {
                case .pending(let continuation?):
                    state = .delivered
                    return continuation
                case .pending(nil):
                    state = .decided(result)
                    return nil
                case .decided, .delivered:
                    return nil
                }
            }
            waiting?.resume(returning: result)
        }

        /// Completes the upgrade; the returned peer is the server's end.
        @discardableResult
        package func accept() -> Peer {
            let peer = Peer()
            decide(.success(peer))
            return peer
        }

        /// Answers the upgrade with a plain HTTP response (`503` + `Retry-After`, a proxy's `200`…).
        package func refuse(status: Int, headers: [String: String] = [:]) {
            decide(.failure(.notUpgraded(statusCode: status, headers: headers)))
        }

        /// Fails the connection (refused, reset, timed out…).
        package func fail(_ failure: TransportFailure) {
            decide(.failure(.transport(failure)))
        }
    }

    /// The server's end of an accepted socket (and the client's ``WebSocketLink``).
    package final class Peer: WebSocketLink {
        private let fromClient = Mailbox<String>()
        private let toClientSink: AsyncStream<WebSocketInbound>.Continuation
        package let inbound: AsyncStream<WebSocketInbound>
        private let state = Mutex<(closedByClient: UInt16?, closed: Bool)>((nil, false))
        /// ``holdSends()``: the client's sends wait here, as on a socket whose peer stopped reading.
        private let gate = Mutex<(held: Bool, waiting: [CheckedContinuation<Void, Never>])>((false, []))

        init() {
            (inbound, toClientSink) = AsyncStream.makeStream(of: WebSocketInbound.self)
        }

        // The client's side.

        package func send(_ text: String) async throws(TransportFailure) {
            guard !state.withLock({ $0.closed }) else { throw .connectionClosed("the socket is closed") }
            if gate.withLock({ $0.held }) {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let go = gate.withLock { gate -> Bool in
                        guard gate.held else { return true }
                        gate.waiting.append(continuation)
                        return false
                    }
                    if go { continuation.resume() }
                }
                // A socket closed while the send waited fails it, as a closed channel fails its writes.
                guard !state.withLock({ $0.closed }) else { throw .connectionClosed("the socket closed before the frame was written") }
            }
            fromClient.put(text)
        }

        package func close(code: UInt16, sendingFirst text: String?) async {
            let first = state.withLock { state -> Bool in
                defer { state.closed = true }
                if !state.closed { state.closedByClient = code }
                return !state.closed
            }
            guard first else { return }
            // Written at once, as a real socket's queued frame is (held sends are not waited for).
            if let text { fromClient.put(text) }
            releaseSends()
            fromClient.finish()
            toClientSink.yield(.closed(code: code, reason: "closed by the client"))
            toClientSink.finish()
        }

        // The test's (server's) side.

        /// The next text frame the client sent; nil once the socket is closed.
        package func receive() async -> String? {
            await fromClient.take()
        }

        /// Sends a text frame to the client.
        package func send(server text: String) {
            toClientSink.yield(.text(text))
        }

        /// Makes the client's sends wait until ``releaseSends()`` or the socket closes (a peer
        /// that stopped reading; a frame written at once otherwise).
        package func holdSends() {
            gate.withLock { $0.held = true }
        }

        /// Lets the held sends go (their tasks then race: hold one send at a time where order
        /// matters) and stops holding.
        package func releaseSends() {
            let waiting = gate.withLock { gate -> [CheckedContinuation<Void, Never>] in
                gate.held = false
                defer { gate.waiting = [] }
                return gate.waiting
            }
            for continuation in waiting { continuation.resume() }
        }

        /// Closes the socket from the server's side (`code` nil: the TCP connection just ends).
        package func close(server code: UInt16?, reason: String = "") {
            state.withLock { $0.closed = true }
            releaseSends()
            toClientSink.yield(.closed(code: code, reason: reason))
            toClientSink.finish()
            fromClient.finish()
        }

        /// The close code the client sent, if it closed the socket.
        package var closedByClient: UInt16? { state.withLock { $0.closedByClient } }
    }

    private let attempts = Mailbox<Attempt>()

    /// Creates a connector with no attempt yet.
    package init() {}

    /// The next connection attempt, waiting for the client to make one.
    package func nextAttempt() async -> Attempt? {
        await attempts.take()
    }

    package func connect(url: String, subprotocol: String, timeout: Duration) async throws(WebSocketConnectFailure) -> any WebSocketLink {
        let attempt = Attempt(url: url, subprotocol: subprotocol)
        let result = await withTaskCancellationHandler {
            await withCheckedContinuation { (decision: CheckedContinuation<Result<Peer, WebSocketConnectFailure>, Never>) in
                attempt.attach(decision)
                attempts.put(attempt)
            }
        } onCancel: {
            attempt.fail(.cancelled)
        }
        return try result.get()
    }

    package func shutdown() async {
        attempts.finish()
    }
}

/// A queue with one waiting reader at a time: `take` returns the oldest item, waiting for one;
/// nil once finished and empty, or when the waiting task is cancelled (so a test that waits for
/// something that never comes fails at its time limit instead of hanging the run).
private final class Mailbox<Item: Sendable>: Sendable {
    private struct State {
        var items: [Item] = []
        var waiter: (id: Int, continuation: CheckedContinuation<Item?, Never>)?
        var nextID = 0
        var finished = false
    }

    private let state = Mutex(State())

    func put(_ item: Item) {
        let waiter = state.withLock { state -> CheckedContinuation<Item?, Never>? in
            guard !state.finished else { return nil }
            if let waiter = state.waiter {
                state.waiter = nil
                return waiter.continuation
            }
            state.items.append(item)
            return nil
        }
        waiter?.resume(returning: item)
    }

    func finish() {
        let waiter = state.withLock { state -> CheckedContinuation<Item?, Never>? in
            state.finished = true
            defer { state.waiter = nil }
            return state.waiter?.continuation
        }
        waiter?.resume(returning: nil)
    }

    func take() async -> Item? {
        let id = state.withLock { state -> Int in
            state.nextID += 1
            return state.nextID
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Item?, Never>) in
                let ready = state.withLock { state -> Item?? in
                    if !state.items.isEmpty { return .some(state.items.removeFirst()) }
                    if state.finished || Task.isCancelled { return .some(nil) }
                    state.waiter = (id, continuation)
                    return .none
                }
                if let ready { continuation.resume(returning: ready) }
            }
        } onCancel: {
            let waiter = state.withLock { state -> CheckedContinuation<Item?, Never>? in
                guard let waiter = state.waiter, waiter.id == id else { return nil }
                state.waiter = nil
                return waiter.continuation
            }
            waiter?.resume(returning: nil)
        }
    }
}
