import Synchronization
public import Tether

/// A ``Transport`` with no socket: every request the client sends waits in memory until the test
/// answers it, fails it, or leaves it open (a long-poll held by the server).
///
/// Together with ``ManualClock`` it drives a real ``TetherClient`` — its subscribe engine's
/// retries, backoff, heartbeats, Time probes and give-ups — step by step, without wall time:
///
/// ```swift
/// let transport = InMemoryTransport()
/// let clock = ManualClock()
/// let client = TetherClient(configuration: configuration, transport: transport, clock: clock, networkMonitor: nil)
/// var statuses = client.statuses().makeAsyncIterator()
/// client.subscribe(to: ["chat"])
/// let handshake = try #require(await transport.next(path: "/v2/subscribe"))
/// handshake.respond(json: #"{"t":{"t":"100","r":1},"m":[]}"#)
/// #expect(await statuses.next()?.category == .connected)
/// let poll = try #require(await transport.next(path: "/v2/subscribe"))
/// poll.fail(.connectionClosed("reset"))            // the engine schedules its first retry…
/// await clock.advanceToSleeper(after: .seconds(2))  // …which runs now
/// ```
///
/// Requests are handed out in the order they were sent; ``next(where:)`` takes the oldest one
/// not yet taken that matches, waiting for it if needed. A request the client cancels (a task
/// cancelled, a long-poll replaced, ``shutdown()``) fails with ``TransportFailure/cancelled``
/// and is no longer handed out.
public final class InMemoryTransport: Transport {
    /// One request in flight: what the client sent, and the means to answer it.
    public final class Exchange: Sendable {
        /// The request as the client sent it.
        public let request: TransportRequest
        /// The position of this request among everything the transport received, from 0.
        public let index: Int

        private enum State {
            case waiting(CheckedContinuation<Result<TransportResponse, TransportFailure>, Never>?, abandonment: [CheckedContinuation<Void, Never>])
            case answered
            case abandoned
        }

        private let state: Mutex<State> = Mutex(.waiting(nil, abandonment: []))

        init(request: TransportRequest, index: Int) {
            self.request = request
            self.index = index
        }

        /// The path of the URL, without origin and query (`/v2/subscribe/demo/chat/0`).
        public var path: String { InMemoryTransport.path(of: request.url) }

        /// The query parameters, with their raw (still percent-encoded) values.
        public var query: [String: String] {
            guard let mark = request.url.firstIndex(of: "?") else { return [:] }
            var out: [String: String] = [:]
            for pair in request.url[request.url.index(after: mark)...].split(separator: "&") {
                let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                out[String(parts[0])] = parts.count > 1 ? String(parts[1]) : ""
            }
            return out
        }

        /// Whether the client gave up on this request (cancelled it) before it was answered.
        public var isAbandoned: Bool {
            state.withLock { if case .abandoned = $0 { return true } else { return false } }
        }

        /// Answers the request. Does nothing when it was already answered or abandoned.
        public func respond(_ response: TransportResponse) {
            resolve(.success(response), abandoning: false)
        }

        /// Answers the request with a JSON body (PubNub's content type) and a status code.
        public func respond(status: Int = 200, json: String, headers: [String: String] = [:]) {
            var fields = headers
            fields["content-type"] = fields["content-type"] ?? "text/javascript; charset=\"UTF-8\""
            respond(TransportResponse(statusCode: status, headers: fields, body: Array(json.utf8)))
        }

        /// Fails the request as the network would (a timeout, a refused or reset connection…).
        public func fail(_ failure: TransportFailure) {
            resolve(.failure(failure), abandoning: false)
        }

        /// Waits until the client gives up on this request (returns at once if it already has);
        /// returns false when the request was answered instead.
        @discardableResult
        public func abandoned() async -> Bool {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let waiting = state.withLock { state -> Bool in
                    guard case .waiting(let reply, var abandonment) = state else { return false }
                    abandonment.append(continuation)
                    state = .waiting(reply, abandonment: abandonment)
                    return true
                }
                if !waiting { continuation.resume() }
            }
            return isAbandoned
        }

        func resolve(_ result: Result<TransportResponse, TransportFailure>, abandoning: Bool) {
            let (reply, abandonment) = state.withLock { state -> (CheckedContinuation<Result<TransportResponse, TransportFailure>, Never>?, [CheckedContinuation<Void, Never>]) in
                guard case .waiting(let reply, let abandonment) = state else { return (nil, []) }
                state = abandoning ? .abandoned : .answered
                return (reply, abandonment)
            }
            reply?.resume(returning: result)
            for waiter in abandonment { waiter.resume() }
        }

        /// Whether the exchange still waits for an answer.
        var isWaiting: Bool {
            state.withLock { if case .waiting = $0 { return true } else { return false } }
        }

        /// Registers the sender's continuation before the exchange is handed to the test.
        func attach(_ continuation: CheckedContinuation<Result<TransportResponse, TransportFailure>, Never>) -> Bool {
            state.withLock { state in
                guard case .waiting(nil, let abandonment) = state else { return false }
                state = .waiting(continuation, abandonment: abandonment)
                return true
            }
        }
    }

    private struct Waiter {
        var id: Int
        var predicate: @Sendable (TransportRequest) -> Bool
        var continuation: CheckedContinuation<Exchange?, Never>
    }

    private struct State {
        var exchanges: [Exchange] = []
        var untaken: [Exchange] = []
        var waiters: [Waiter] = []
        var nextWaiter = 0
        var isShutDown = false
    }

    private let state = Mutex(State())

    /// Creates a transport with nothing in flight.
    public init() {}

    /// Every request the client has sent so far, in order (answered or not).
    public var requests: [TransportRequest] {
        state.withLock { $0.exchanges.map(\.request) }
    }

    /// The requests sent and not yet answered, failed or abandoned, in order.
    public var pending: [Exchange] {
        state.withLock { $0.exchanges.filter(\.isWaiting) }
    }

    /// Whether ``shutdown()`` was called.
    public var isShutDown: Bool { state.withLock { $0.isShutDown } }

    /// The oldest request not yet taken whose URL path starts with `prefix` (`/v2/subscribe`,
    /// `/time/0`, `/v2/presence`…), waiting until the client sends one. `nil` after ``shutdown()``
    /// or when the waiting task is cancelled.
    public func next(path prefix: String) async -> Exchange? {
        await next { request in Self.path(of: request.url).hasPrefix(prefix) }
    }

    /// The oldest request not yet taken that satisfies `predicate` (any request by default),
    /// waiting until the client sends one. `nil` after ``shutdown()`` or when the waiting task is
    /// cancelled.
    public func next(where predicate: @escaping @Sendable (TransportRequest) -> Bool = { _ in true }) async -> Exchange? {
        let id = state.withLock { state -> Int in
            state.nextWaiter += 1
            return state.nextWaiter
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Exchange?, Never>) in
                let immediate = state.withLock { state -> Exchange?? in
                    if let index = state.untaken.firstIndex(where: { $0.isWaiting && predicate($0.request) }) {
                        return .some(state.untaken.remove(at: index))
                    }
                    if state.isShutDown || Task.isCancelled { return .some(nil) }
                    state.waiters.append(Waiter(id: id, predicate: predicate, continuation: continuation))
                    return .none
                }
                if let immediate { continuation.resume(returning: immediate) }
            }
        } onCancel: {
            let waiter = state.withLock { state -> Waiter? in
                guard let index = state.waiters.firstIndex(where: { $0.id == id }) else { return nil }
                return state.waiters.remove(at: index)
            }
            waiter?.continuation.resume(returning: nil)
        }
    }

    /// Holds the request until the test answers it through ``next(where:)``.
    public func send(_ request: TransportRequest) async throws(TransportFailure) -> TransportResponse {
        let exchange = state.withLock { state -> Exchange? in
            guard !state.isShutDown else { return nil }
            let exchange = Exchange(request: request, index: state.exchanges.count)
            state.exchanges.append(exchange)
            return exchange
        }
        guard let exchange, !Task.isCancelled else { throw .cancelled }
        let result = await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Result<TransportResponse, TransportFailure>, Never>) in
                guard exchange.attach(continuation) else {
                    continuation.resume(returning: .failure(.cancelled))
                    return
                }
                publish(exchange)
            }
        } onCancel: {
            exchange.resolve(.failure(.cancelled), abandoning: true)
        }
        if exchange.isAbandoned { withdraw(exchange) }
        return try result.get()
    }

    /// Fails every request in flight with ``TransportFailure/cancelled``; later requests fail
    /// the same way, and tests waiting in ``next(where:)`` get `nil`.
    public func shutdown() async {
        let (exchanges, waiters) = state.withLock { state -> ([Exchange], [Waiter]) in
            state.isShutDown = true
            defer { state.waiters = []; state.untaken = [] }
            return (state.exchanges, state.waiters)
        }
        for exchange in exchanges { exchange.resolve(.failure(.cancelled), abandoning: true) }
        for waiter in waiters { waiter.continuation.resume(returning: nil) }
    }

    /// Hands a new exchange to the first test waiting for one like it, or queues it.
    private func publish(_ exchange: Exchange) {
        let waiter = state.withLock { state -> Waiter? in
            if let index = state.waiters.firstIndex(where: { $0.predicate(exchange.request) }) {
                return state.waiters.remove(at: index)
            }
            state.untaken.append(exchange)
            return nil
        }
        waiter?.continuation.resume(returning: exchange)
    }

    /// Drops an abandoned exchange from the queue of requests not yet taken.
    private func withdraw(_ exchange: Exchange) {
        state.withLock { state in state.untaken.removeAll { $0 === exchange } }
    }

    fileprivate static func path(of url: String) -> String {
        var rest = Substring(url)
        if let colon = rest.firstIndex(of: ":"), rest[colon...].hasPrefix("://") { rest = rest[rest.index(colon, offsetBy: 3)...] }
        guard let slash = rest.firstIndex(of: "/") else { return "/" }
        return String(rest[slash...].prefix { $0 != "?" })
    }
}
