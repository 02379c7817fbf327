import Foundation
import Logging
import NIOCore
import Synchronization
@_spi(Benchmarks) import TetherProtocol
import TetherServerCore

/// The live debug console's server side (docs/console.md): the flight recorder of every client's
/// connections, the counters behind the overview charts, the signed-in operators and the
/// watchers of the live event stream. Exists only when an admin secret is configured; the
/// server's hooks are a `state.console?.…` call each, so with the console off they cost a nil
/// check, and with it on a lock around a ring write (no encoding until somebody reads).
final class AdminConsole: Sendable {
    /// One point of the overview's time series.
    struct Sample: Sendable {
        var at: Int64
        var publishesPerSecond: Double
        var deliveriesPerSecond: Double
        var p99Milliseconds: Int?
        var longPolls: Int
        var webSockets: Int
        var keptSessions: Int
    }

    private struct Samples: Sendable {
        var points: [Sample] = []
        var lastPublishes = 0
        var lastDeliveries = 0
        var lastAt: Int64?
    }

    /// Upper bounds (ms) of the delivery-latency histogram's buckets; the last is open-ended.
    static let latencyBuckets = ConsoleRecording.latencyBuckets
    /// Points kept in the time series (one a second).
    static let seriesLength = 120
    /// Events a watcher of the live stream may have waiting; a slower watcher is dropped.
    static let watcherQueue = 16
    /// Watchers of the live stream at most.
    static let maxWatchers = 32

    let secret: String
    let usesTLS: Bool
    let logger: Logger
    /// What the hooks write, under one lock (one acquisition per hook).
    private let recording: Mutex<ConsoleRecording>
    private let signedIn = Mutex(AdminSessions())
    private let throttle = Mutex(LoginThrottle())
    private let publishes = Atomic<Int>(0)
    private let deliveries = Atomic<Int>(0)
    private let samples = Mutex(Samples())
    private let watchers = Mutex<[UInt64: AsyncStream<String>.Continuation]>([:])
    private let nextWatcher = Atomic<UInt64>(1)
    private let sockets = Mutex<WebSocketSessions?>(nil)

    init(secret: String, usesTLS: Bool, logger: Logger, recorder: ConnectionRecorder.Configuration = .init()) {
        self.secret = secret
        self.usesTLS = usesTLS
        self.logger = logger
        self.recording = Mutex(ConsoleRecording(recorder: ConnectionRecorder(configuration: recorder)))
    }

    func attach(_ webSockets: WebSocketSessions) { sockets.withLock { $0 = webSockets } }
    var webSockets: WebSocketSessions? { sockets.withLock { $0 } }

    /// A remote address as the console shows it (IPv4 without `inet_ntop`'s `sprintf`).
    static func text(of address: SocketAddress?) -> String {
        switch address {
        // sockaddr_in: family and port (2 bytes each), then the address, in network byte order.
        case .v4(let v4):
            withUnsafeBytes(of: v4.address) {
                ConsoleRecording.ipv4Text(networkOrder: $0.loadUnaligned(fromByteOffset: 4, as: UInt32.self))
            }
        case let other?: other.ipAddress ?? "unknown"
        case nil: "unknown"
        }
    }

    /// Wall-clock milliseconds since 1970 (read directly: every hook reads it).
    static func now() -> Int64 {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        return Int64(time.tv_sec) * 1_000 + Int64(time.tv_nsec) / 1_000_000
    }

    // MARK: - Hooks (called by the server)

    func longPollBegan(uuid: String?, subscribeKey: String, address: SocketAddress?, channels: [String], groups: [String],
                       cursor: Timetoken, channel: (any Channel)?) {
        guard let uuid else { return }
        let address = Self.text(of: address)
        let now = Self.now()
        recording.withLock {
            $0.longPollBegan(uuid: uuid, subscribeKey: subscribeKey, address: address, channels: channels, groups: groups,
                             cursor: cursor, connection: channel, now: now)
        }
    }

    func longPollEnded(uuid: String?, channel: any Channel, page: SubscribePage?) {
        if let page, !page.envelopes.isEmpty { deliveries.add(page.envelopes.count, ordering: .relaxed) }
        let now = Self.now()
        recording.withLock {
            $0.longPollEnded(uuid: uuid, connection: channel, delivered: page?.envelopes.count ?? 0,
                             gaps: page?.gaps.count ?? 0, cursor: page?.cursor, now: now)
        }
    }

    func sessionOpened(uuid: String, subscribeKey: String, session: String, address: String) {
        let now = Self.now()
        recording.withLock { $0.recorder.sessionOpened(uuid: uuid, subscribeKey: subscribeKey, session: session, address: address, now: now) }
    }

    func sessionResumed(uuid: String, session: String, address: String) {
        let now = Self.now()
        recording.withLock { $0.recorder.sessionResumed(uuid: uuid, session: session, address: address, now: now) }
    }

    func sessionSubscribed(uuid: String, channels: [String], groups: [String], cursor: Timetoken) {
        let now = Self.now()
        recording.withLock { $0.recorder.sessionSubscribed(uuid: uuid, channels: channels, groups: groups, cursor: cursor, now: now) }
    }

    func sessionDelivered(uuid: String, page: SubscribePage) {
        if !page.envelopes.isEmpty { deliveries.add(page.envelopes.count, ordering: .relaxed) }
        let now = Self.now()
        recording.withLock {
            $0.sessionDelivered(uuid: uuid, delivered: page.envelopes.count, gaps: page.gaps.count, cursor: page.cursor, now: now)
        }
    }

    func socketClosed(uuid: String, reason: String) {
        let now = Self.now()
        recording.withLock { $0.recorder.socketClosed(uuid: uuid, reason: reason, now: now) }
    }

    func sessionExpired(uuid: String, session: String, reason: String) {
        let now = Self.now()
        recording.withLock { $0.recorder.sessionExpired(uuid: uuid, session: session, reason: reason, now: now) }
    }

    func pingAnswered(uuid: String, milliseconds: Int64) {
        let now = Self.now()
        recording.withLock { $0.recorder.pingAnswered(uuid: uuid, milliseconds: milliseconds, now: now) }
    }

    func accessDenied(uuid: String?, channels: [String]) {
        guard let uuid else { return }
        let now = Self.now()
        recording.withLock { $0.recorder.accessDenied(uuid: uuid, channels: channels, now: now) }
    }

    func rateLimited(uuid: String?, route: String) {
        guard let uuid else { return }
        let now = Self.now()
        recording.withLock { $0.recorder.rateLimited(uuid: uuid, route: route, now: now) }
    }

    /// A publish was accepted (one atomic increment).
    func published() { publishes.add(1, ordering: .relaxed) }

    // MARK: - Reading

    func read<T>(_ body: (borrowing ConnectionRecorder) -> T) -> T { recording.withLock { body($0.recorder) } }

    var series: [Sample] { samples.withLock { $0.points } }

    // MARK: - Operator actions

    /// Closes every connection of `uuid`: its long-polls end, its sockets close (a WebSocket
    /// session is kept, as for any drop). Returns how many connections were closed.
    func kick(uuid: String) -> Int {
        // Recorded before anything is closed, so the timeline reads kicked → dropped whichever
        // thread handles the closes.
        let now = Self.now()
        let waiting = recording.withLock { r in
            r.recorder.kicked(uuid: uuid, now: now)
            return r.takeLongPolls(of: uuid)
        }
        let channels = waiting.compactMap { $0 as? any Channel }
        for channel in channels { channel.close(promise: nil) }
        let sockets = webSockets?.kick(uuid: uuid) ?? 0
        return channels.count + sockets
    }

    // MARK: - Sign-in

    func openSession() -> (id: String, csrf: String) {
        let id = Self.randomToken()
        let csrf = Self.randomToken()
        let now = Self.now()
        signedIn.withLock { $0.open(id: id, csrfToken: csrf, now: now) }
        return (id, csrf)
    }

    func session(_ id: String) -> AdminSessions.Session? {
        let now = Self.now()
        return signedIn.withLock { $0.session(id, now: now) }
    }

    func closeSession(_ id: String) { signedIn.withLock { $0.close(id) } }

    func checkSecret(_ candidate: String) -> Bool { AdminSessions.constantTimeEquals(candidate, secret) }

    /// Checks a secret offered from `address` (sign-in form or bearer token), throttled per
    /// address (``LoginThrottle``): whether it was accepted, or — when the address is throttled
    /// and the secret was not even compared — the seconds until it may try again.
    func attempt(_ candidate: String?, from address: String) -> (accepted: Bool, retryAfter: Int?) {
        let now = Self.now()
        if case .throttled(let seconds) = throttle.withLock({ $0.verdict(for: address, now: now) }) { return (false, seconds) }
        // Compared outside the lock, in constant time.
        let accepted = candidate.map(checkSecret) ?? false
        throttle.withLock { accepted ? $0.succeeded(address) : $0.failed(address, now: now) }
        return (accepted, nil)
    }

    /// 256 random bits, hex.
    static func randomToken() -> String {
        var generator = SystemRandomNumberGenerator()
        return (0..<4).map { _ in
            let hex = String(generator.next() as UInt64, radix: 16)
            return String(repeating: "0", count: 16 - hex.count) + hex
        }.joined()
    }

    // MARK: - Live stream

    /// A new watcher's stream, or `nil` at the watcher bound.
    func watch() -> (id: UInt64, stream: AsyncStream<String>)? {
        let id = nextWatcher.add(1, ordering: .relaxed).oldValue
        let (stream, continuation) = AsyncStream.makeStream(of: String.self, bufferingPolicy: .bufferingOldest(Self.watcherQueue))
        let accepted = watchers.withLock { w -> Bool in
            guard w.count < Self.maxWatchers else { return false }
            w[id] = continuation
            return true
        }
        guard accepted else { return nil }
        continuation.onTermination = { [weak self] _ in self?.unwatch(id) }
        return (id, stream)
    }

    private func unwatch(_ id: UInt64) { _ = watchers.withLock { $0.removeValue(forKey: id) } }

    var watcherCount: Int { watchers.withLock { $0.count } }

    /// Sends one event to every watcher; a watcher whose queue is full is dropped.
    func broadcast(_ event: String) {
        let all = watchers.withLock { Array($0) }
        for (id, continuation) in all {
            if case .dropped = continuation.yield(event) {
                logger.debug("console watcher dropped: too slow", metadata: ["watcher": "\(id)"])
                continuation.finish()
                unwatch(id)
            }
        }
    }

    /// Ends every watcher's stream (graceful shutdown).
    func finishWatchers() {
        let all = watchers.withLock { w in defer { w.removeAll() }; return Array(w.values) }
        for continuation in all { continuation.finish() }
    }

    // MARK: - Sampling

    /// Takes one sample of the counters (about once a second) and lets the recorder infer
    /// dropped long-polls.
    func sample(now: Int64) -> Sample {
        let (counts, buckets) = recording.withLock { r in
            r.recorder.tick(now: now)
            return (r.recorder.connectedCounts, r.takeLatencies())
        }
        let publishes = self.publishes.load(ordering: .relaxed)
        let deliveries = self.deliveries.load(ordering: .relaxed)
        let total = buckets.reduce(0, +)
        var p99: Int?
        if total > 0 {
            var seen = 0
            for (index, count) in buckets.enumerated() {
                seen += count
                if seen * 100 >= total * 99 {
                    let bound = Self.latencyBuckets[index]
                    p99 = bound == .max ? 60_001 : Int(bound)
                    break
                }
            }
        }
        let sockets = webSockets
        let kept = sockets?.keptCount ?? 0
        let openSockets = sockets?.connectionCount ?? 0
        return samples.withLock { s in
            let elapsed = s.lastAt.map { Double(max(1, now - $0)) / 1000 } ?? 1
            let point = Sample(at: now, publishesPerSecond: Double(publishes - s.lastPublishes) / elapsed,
                               deliveriesPerSecond: Double(deliveries - s.lastDeliveries) / elapsed,
                               p99Milliseconds: p99, longPolls: counts.longPoll, webSockets: max(counts.webSocket, openSockets),
                               keptSessions: kept)
            s.lastPublishes = publishes
            s.lastDeliveries = deliveries
            s.lastAt = now
            s.points.append(point)
            if s.points.count > Self.seriesLength { s.points.removeFirst(s.points.count - Self.seriesLength) }
            return point
        }
    }

    var totals: (publishes: Int, deliveries: Int) {
        (publishes.load(ordering: .relaxed), deliveries.load(ordering: .relaxed))
    }
}
