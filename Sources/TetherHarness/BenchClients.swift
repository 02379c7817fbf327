import Foundation
import NIOCore
import Synchronization

/// A growable set of small non-negative integers (message ids).
struct BenchBitset: Sendable {
    private(set) var words: [UInt64] = []

    /// Inserts `i`; returns whether it was new.
    @inline(__always)
    mutating func insert(_ i: Int) -> Bool {
        let word = i >> 6
        if word >= words.count {
            words.append(contentsOf: repeatElement(0, count: max(word + 1 - words.count, words.count)))
        }
        let bit: UInt64 = 1 << UInt64(i & 63)
        if words[word] & bit != 0 { return false }
        words[word] |= bit
        return true
    }

    /// Number of members.
    var count: Int { words.reduce(0) { $0 + $1.nonzeroBitCount } }

    /// Number of members `i` with `i mod modulus == r`, for each residue `r`.
    func countsByResidue(_ modulus: Int) -> [Int] {
        guard modulus > 1 else { return [count] }
        var counts = [Int](repeating: 0, count: modulus)
        for (w, word) in words.enumerated() where word != 0 {
            var bits = word
            while bits != 0 {
                counts[((w << 6) + bits.trailingZeroBitCount) % modulus] += 1
                bits &= bits - 1
            }
        }
        return counts
    }

    /// Number of members `i` of `self` with `i mod modulus == residue` that are not in `other`.
    func countMissing(from other: BenchBitset, residue: Int, modulus: Int) -> Int {
        guard modulus > 1 else { return countMissing(from: other) }
        var missing = 0
        for (w, word) in words.enumerated() {
            var bits = word & ~(w < other.words.count ? other.words[w] : 0)
            while bits != 0 {
                if ((w << 6) + bits.trailingZeroBitCount) % modulus == residue { missing += 1 }
                bits &= bits - 1
            }
        }
        return missing
    }

    /// Number of members of `self` that are not in `other`.
    func countMissing(from other: BenchBitset) -> Int {
        var missing = 0
        for (i, word) in words.enumerated() {
            let theirs = i < other.words.count ? other.words[i] : 0
            missing += (word & ~theirs).nonzeroBitCount
        }
        return missing
    }
}

/// Current time on the monotonic clock, in nanoseconds.
@inline(__always)
func benchNow() -> UInt64 { NIODeadline.now().uptimeNanoseconds }

/// The message every bench publisher sends: `{"i":<id>,"s":<send time, monotonic ns>}`,
/// percent-encoded for a GET publish path.
enum BenchMessage {
    /// Appends the encoded message to `buffer`.
    static func write(id: Int, sentAt: UInt64, into buffer: inout ByteBuffer) {
        buffer.writeStaticString("%7B%22i%22%3A")
        buffer.writeString(String(id))
        buffer.writeStaticString("%2C%22s%22%3A")
        buffer.writeString(String(sentAt))
        buffer.writeStaticString("%7D")
    }
}

/// What one subscriber saw, reported when its connection closes.
struct SubscriberReport: Sendable {
    /// Ids received.
    var received = BenchBitset()
    /// Messages received (including duplicates).
    var deliveries = 0
    /// Messages whose id was already received.
    var duplicates = 0
    /// Messages whose publish timetoken was not above the previous one.
    var outOfOrder = 0
    /// Non-200 responses.
    var errors = 0
    /// Responses (long-poll answers).
    var responses = 0
    /// Publish-to-receive latencies in nanoseconds (only when recording).
    var latencies: [UInt64] = []
}

/// Progress of one subscriber that the coordinating task can read while it runs.
final class SubscriberProgress: Sendable {
    /// Messages received so far (including duplicates).
    let deliveries = Atomic<Int>(0)
    /// Distinct ids received so far.
    let unique = Atomic<Int>(0)
    /// When the last message arrived (monotonic ns).
    let lastDelivery = Atomic<UInt64>(0)
    /// Whether the handshake completed and the first long-poll is on its way.
    let ready = Atomic<Bool>(false)
    /// Whether the connection closed.
    let closed = Atomic<Bool>(false)
    /// The final report, set when the connection closes.
    let report = Mutex<SubscriberReport?>(nil)
    /// WebSocket subscribers: the session, kept across sockets for a resume.
    let session = Mutex(BenchSessionState())

    /// Creates an empty progress record.
    init() {}
}

/// The checks every bench subscriber runs on its deliveries, whatever the wire: loss,
/// duplication and order of the bench's messages, and optionally their latency.
struct DeliveryBook {
    /// What was seen so far.
    var report = SubscriberReport()
    /// The highest publish timetoken seen.
    var lastTimetoken: UInt64 = 0
    /// Record latencies of messages with an id at or above this.
    let recordLatencyFrom: Int?

    /// Creates an empty book.
    init(recordLatencyFrom: Int?) {
        self.recordLatencyFrom = recordLatencyFrom
        if recordLatencyFrom != nil { report.latencies.reserveCapacity(1 << 14) }
    }

    /// Continues a book (a resumed session keeps checking against what it saw before).
    init(report: SubscriberReport, lastTimetoken: UInt64) {
        self.report = report
        self.lastTimetoken = lastTimetoken
        self.recordLatencyFrom = nil
    }

    /// Scans the envelopes in `raw` from offset `from` (the `m` array of a long-poll answer or a
    /// `messages` frame) and records them; `now` is when they arrived.
    mutating func scan(_ raw: UnsafeRawBufferPointer, from: Int, now: UInt64, progress: SubscriberProgress) {
        var p = from
        var count = 0
        var newIDs = 0
        while let envelope = BenchBytes.find("\"p\":{\"t\":\"", in: raw, from: p),
              let timetoken = BenchBytes.decimal(in: raw, from: envelope + 10) {
            p = timetoken.end
            guard let d = BenchBytes.find("\"d\":{\"i\":", in: raw, from: p),
                  let id = BenchBytes.decimal(in: raw, from: d + 9),
                  let s = BenchBytes.find("\"s\":", in: raw, from: id.end),
                  let sentAt = BenchBytes.decimal(in: raw, from: s + 4)
            else { continue }
            p = sentAt.end
            count += 1
            if timetoken.value <= lastTimetoken { report.outOfOrder += 1 }
            lastTimetoken = max(lastTimetoken, timetoken.value)
            if report.received.insert(Int(id.value)) { newIDs += 1 } else { report.duplicates += 1 }
            if let from = recordLatencyFrom, Int(id.value) >= from {
                report.latencies.append(now &- sentAt.value)
            }
        }
        if count > 0 {
            report.deliveries += count
            progress.lastDelivery.store(now, ordering: .relaxed)
            progress.deliveries.add(count, ordering: .relaxed)
            progress.unique.add(newIDs, ordering: .releasing)
        }
    }
}

/// A subscriber: handshake, then back-to-back long-polls on one channel, checking every message
/// for loss, duplication and order, optionally recording latencies.
final class BenchSubscriber: BenchConnectionLogic {
    private let progress: SubscriberProgress
    private let requestHead: String
    private let requestTail: String
    private var cursor: UInt64 = 0
    private var book: DeliveryBook

    /// Creates a subscriber to `channel` on the `demo` keyset.
    init(channel: String, uuid: String, target: BenchTarget, progress: SubscriberProgress, recordLatencyFrom: Int?) {
        self.progress = progress
        self.requestHead = "GET /v2/subscribe/demo/\(channel)/0?uuid=\(uuid)&tt="
        self.requestTail = "&tr=1" + target.requestTrailer
        self.book = DeliveryBook(recordLatencyFrom: recordLatencyFrom)
    }

    /// Starts sending when the connection is up.
    func connectionActive(_ context: ChannelHandlerContext) {
        poll(context)
    }

    private func poll(_ context: ChannelHandlerContext) {
        var buffer = context.channel.allocator.buffer(capacity: requestHead.utf8.count + requestTail.utf8.count + 20)
        buffer.writeString(requestHead)
        buffer.writeString(String(cursor))
        buffer.writeString(requestTail)
        context.writeAndFlush(NIOAny(buffer), promise: nil)
    }

    /// Handles one response.
    func received(_ response: BenchResponse, context: ChannelHandlerContext) {
        book.report.responses += 1
        guard response.status == 200 else {
            book.report.errors += 1
            if book.report.errors > 100 { context.close(promise: nil) } else { poll(context) }
            return
        }
        let now = benchNow()
        response.body.withUnsafeReadableBytes { raw in
            // {"t":{"t":"<cursor>","r":1},"m":[…]}
            guard let t = BenchBytes.find("{\"t\":{\"t\":\"", in: raw, from: 0),
                  let next = BenchBytes.decimal(in: raw, from: t + 11)
            else {
                book.report.errors += 1
                return
            }
            let wasHandshake = cursor == 0
            cursor = next.value
            poll(context)  // ask for more before doing the bookkeeping
            if wasHandshake { progress.ready.store(true, ordering: .releasing) }
            book.scan(raw, from: next.end, now: now, progress: progress)
        }
    }

    /// Records that the connection closed.
    func connectionClosed() {
        let report = book.report
        progress.report.withLock { $0 = report }
        progress.closed.store(true, ordering: .releasing)
    }
}

/// State shared by the publishers of one run.
final class PublishLedger: Sendable {
    /// The next message id.
    let nextID = Atomic<Int>(0)
    /// Ids the server acknowledged.
    let acked = Mutex(BenchBitset())
    /// Number of acknowledged publishes.
    let ackedCount = Atomic<Int>(0)
    /// Publishes answered with an error status.
    let errors = Atomic<Int>(0)
    /// Publish round-trip times (ns), when recorded.
    let roundTrips = Mutex<[UInt64]>([])

    /// Creates an empty ledger.
    init() {}

    /// Records the answer to publish `id`.
    func record(id: Int, status: Int, roundTrip: UInt64?) {
        if status == 200 {
            _ = acked.withLock { $0.insert(id) }
            ackedCount.add(1, ordering: .releasing)
            if let roundTrip { roundTrips.withLock { $0.append(roundTrip) } }
        } else {
            errors.add(1, ordering: .relaxed)
        }
    }
}

/// Builds GET publish requests for one channel, or round-robin over several (message `id` to
/// channel `id mod count`).
struct PublishRequest: Sendable {
    private let heads: [String]
    private let query: String
    /// With request ids: `&requestid=` and a per-run prefix, followed by the message id.
    private let requestIDPrefix: String?
    private let trailer: String

    /// Creates the request builder for `channel` on the `demo` keyset. With `requestIDs`, every
    /// publish carries a unique `requestid` of a UUID's length (36 bytes), as the SDK's do.
    init(channel: String, target: BenchTarget, store: Bool, requestIDs: Bool = false) {
        self.init(channels: [channel], target: target, store: store, requestIDs: requestIDs)
    }

    /// Creates the request builder for `channels`, round-robin by message id.
    init(channels: [String], target: BenchTarget, store: Bool, requestIDs: Bool = false) {
        heads = channels.map { "GET /publish/demo/demo/0/\($0)/0/" }
        query = "?uuid=bench-publisher" + (store ? "" : "&store=0")
        // 23 characters of a fresh UUID, a dash, and the message id padded to 12 digits.
        requestIDPrefix = requestIDs ? "&requestid=" + UUID().uuidString.prefix(23) + "-" : nil
        trailer = target.requestTrailer
    }

    /// Writes a publish of message `id` sent at `sentAt`.
    func write(id: Int, sentAt: UInt64, context: ChannelHandlerContext) {
        let head = heads[heads.count == 1 ? 0 : id % heads.count]
        var buffer = context.channel.allocator.buffer(capacity: head.utf8.count + query.utf8.count + trailer.utf8.count + 128)
        buffer.writeString(head)
        BenchMessage.write(id: id, sentAt: sentAt, into: &buffer)
        buffer.writeString(query)
        if let requestIDPrefix {
            buffer.writeString(requestIDPrefix)
            let digits = String(id)
            buffer.writeString(String(repeating: "0", count: max(0, 12 - digits.utf8.count)))
            buffer.writeString(digits)
        }
        buffer.writeString(trailer)
        context.writeAndFlush(NIOAny(buffer), promise: nil)
    }
}

/// Controls the closed-loop publishers of a fan-out run.
final class FloodControl: Sendable {
    /// Set to stop sending new publishes.
    let stop = Atomic<Bool>(false)
    /// Publishers that stopped (after their last answer, or because their connection closed).
    let finished = Atomic<Int>(0)

    /// Creates a running control.
    init() {}
}

/// A closed-loop publisher: one publish in flight, the next sent as soon as the previous is acknowledged.
final class FloodPublisher: BenchConnectionLogic {
    private let request: PublishRequest
    private let ledger: PublishLedger
    private let control: FloodControl
    private var inFlight: (id: Int, sentAt: UInt64)?
    private var done = false

    /// Creates a publisher.
    init(request: PublishRequest, ledger: PublishLedger, control: FloodControl) {
        self.request = request
        self.ledger = ledger
        self.control = control
    }

    /// Starts sending when the connection is up.
    func connectionActive(_ context: ChannelHandlerContext) {
        sendNext(context)
    }

    private func sendNext(_ context: ChannelHandlerContext) {
        guard !control.stop.load(ordering: .acquiring) else {
            finish()
            return
        }
        let id = ledger.nextID.wrappingAdd(1, ordering: .relaxed).oldValue
        let now = benchNow()
        inFlight = (id, now)
        request.write(id: id, sentAt: now, context: context)
    }

    /// Handles one response.
    func received(_ response: BenchResponse, context: ChannelHandlerContext) {
        if let inFlight {
            ledger.record(id: inFlight.id, status: response.status, roundTrip: nil)
        }
        inFlight = nil
        sendNext(context)
    }

    private func finish() {
        guard !done else { return }
        done = true
        control.finished.add(1, ordering: .releasing)
    }

    /// Records that the connection closed.
    func connectionClosed() {
        if inFlight != nil { ledger.errors.add(1, ordering: .relaxed) }
        finish()
    }
}

/// An open-loop publisher for the latency run: sends message `i` at `start + i × interval`
/// over a pool of connections on one event loop, never waiting for acknowledgements except
/// when every connection is busy.
final class PacedPublisher {
    private let request: PublishRequest
    private let ledger: PublishLedger
    private let interval: UInt64
    private let total: Int
    private var idle: [PacedConnection] = []
    private var start: UInt64 = 0
    private var sent = 0
    private var task: RepeatedTask?
    /// Largest delay of a send behind its schedule (ns).
    private(set) var maxLag: UInt64 = 0
    /// Sends more than 1 ms behind schedule.
    private(set) var lateSends = 0

    /// Creates a publisher of `total` messages at `rate` per second.
    /// Message `n` of this publisher carries id `idOffset + n * idStride`, so several
    /// publishers sharing a ledger (one per cluster node) interleave their ids, never repeat them.
    private let idOffset: Int
    private let idStride: Int

    init(request: PublishRequest, ledger: PublishLedger, rate: Int, total: Int, idOffset: Int = 0, idStride: Int = 1) {
        self.request = request
        self.ledger = ledger
        self.interval = UInt64(1_000_000_000 / max(rate, 1))
        self.total = total
        self.idOffset = idOffset
        self.idStride = max(1, idStride)
    }

    /// Whether every message was sent.
    var isFinished: Bool { sent >= total }

    /// Connections currently connected and idle.
    var idleCount: Int { idle.count }

    /// Starts the schedule; call on the publisher's loop.
    func start(on loop: any EventLoop) {
        start = benchNow()
        let bound = NIOLoopBound(self, eventLoop: loop)
        task = loop.scheduleRepeatedTask(initialDelay: .zero, delay: .microseconds(200)) { task in
            let publisher = bound.value
            publisher.pump()
            if publisher.isFinished { task.cancel() }
        }
    }

    /// Stops the schedule.
    func stop() {
        task?.cancel()
        task = nil
        idle.removeAll()
    }

    /// Sends every message that is due, as far as idle connections allow.
    func pump() {
        guard start != 0 else { return }
        let now = benchNow()
        let due = min(total, Int((now - start) / interval) + 1)
        while sent < due, let connection = idle.popLast() {
            let scheduled = start + UInt64(sent) * interval
            let lag = now > scheduled ? now - scheduled : 0
            maxLag = max(maxLag, lag)
            if lag > 1_000_000 { lateSends += 1 }
            connection.send(id: idOffset + sent * idStride, now: now)
            sent += 1
        }
    }

    fileprivate func becameIdle(_ connection: PacedConnection) {
        idle.append(connection)
    }

    fileprivate func closed(_ connection: PacedConnection) {
        idle.removeAll { $0 === connection }
    }

    /// Creates the logic of one pooled connection; call on the publisher's loop.
    func makeConnection() -> PacedConnection {
        PacedConnection(publisher: self, request: request, ledger: ledger)
    }
}

/// One connection of a ``PacedPublisher``'s pool.
final class PacedConnection: BenchConnectionLogic {
    private let publisher: PacedPublisher
    private let request: PublishRequest
    private let ledger: PublishLedger
    private var context: ChannelHandlerContext?
    private var inFlight: (id: Int, sentAt: UInt64)?

    fileprivate init(publisher: PacedPublisher, request: PublishRequest, ledger: PublishLedger) {
        self.publisher = publisher
        self.request = request
        self.ledger = ledger
    }

    /// Starts sending when the connection is up.
    func connectionActive(_ context: ChannelHandlerContext) {
        self.context = context
        publisher.becameIdle(self)
    }

    fileprivate func send(id: Int, now: UInt64) {
        guard let context else { return }
        inFlight = (id, now)
        request.write(id: id, sentAt: now, context: context)
    }

    /// Handles one response.
    func received(_ response: BenchResponse, context: ChannelHandlerContext) {
        if let inFlight {
            ledger.record(id: inFlight.id, status: response.status, roundTrip: benchNow() - inFlight.sentAt)
        }
        inFlight = nil
        publisher.becameIdle(self)
        publisher.pump()
    }

    /// Records that the connection closed.
    func connectionClosed() {
        if inFlight != nil { ledger.errors.add(1, ordering: .relaxed) }
        context = nil
        publisher.closed(self)
    }
}

/// Counters of the idle long-polls of a memory run.
final class IdleTally: Sendable {
    /// Long-polls answered (they should not be while measuring).
    let answered = Atomic<Int>(0)
    /// Connections closed.
    let closed = Atomic<Int>(0)

    /// Creates zeroed counters.
    init() {}
}

/// One idle long-poll: writes a single subscribe request (or nothing) and waits.
final class IdleLongPoll: BenchConnectionLogic {
    private let request: String?
    private let tally: IdleTally

    /// Creates an idle long-poll that sends `request` (`nil`: an idle connection).
    init(request: String?, tally: IdleTally) {
        self.request = request
        self.tally = tally
    }

    /// Starts sending when the connection is up.
    func connectionActive(_ context: ChannelHandlerContext) {
        guard let request else { return }
        context.writeAndFlush(NIOAny(context.channel.allocator.buffer(string: request)), promise: nil)
    }

    /// Handles one response.
    func received(_ response: BenchResponse, context: ChannelHandlerContext) {
        tally.answered.add(1, ordering: .relaxed)
    }

    /// Records that the connection closed.
    func connectionClosed() {
        tally.closed.add(1, ordering: .relaxed)
    }
}
