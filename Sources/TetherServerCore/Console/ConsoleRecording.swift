package import TetherProtocol

/// What the console's hooks write under its one lock (docs/console.md): the flight recorder,
/// the open long-poll connections by uuid (for the kick action) and the delivery-latency
/// histogram since the last sample. One call per hook; the shell (`AdminConsole`) reads the clock,
/// takes the lock and calls one of these.
///
/// Connections are kept as plain objects (the server's NIO channels; `tether bench --scenario
/// recorder` drives this very code with stand-ins). Not generic on purpose: called from another
/// module, a generic type would be used unspecialized, paying metadata lookups on every hook.
package struct ConsoleRecording: Sendable {
    /// A connection: the server's `any Channel`.
    package typealias Connection = any AnyObject & Sendable

    /// Upper bounds (ms) of the delivery-latency histogram's buckets; the last is open-ended.
    package static let latencyBuckets: [Int64] = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000, .max]

    /// A long-poll waiting on a connection, and whose it is.
    private struct OpenLongPoll: Sendable {
        var uuid: String
        var connection: Connection
    }

    package var recorder: ConnectionRecorder
    /// Long-polls waiting now, by connection, for the kick action (bounded by open connections).
    /// Keyed by connection so a cycle costs one integer-keyed insert and removal; the kick,
    /// a rare operator action, scans them.
    private var longPolls: [ObjectIdentifier: OpenLongPoll] = [:]
    /// Envelopes delivered per latency bucket since the last sample.
    package var latencies: [Int]
    private let bucketBounds: [Int64]

    package init(recorder: ConnectionRecorder) {
        self.recorder = recorder
        bucketBounds = Self.latencyBuckets
        latencies = [Int](repeating: 0, count: bucketBounds.count)
    }

    /// A subscribe request arrived; `connection` is its connection when it will wait (a
    /// continuation), `nil` for a handshake.
    package mutating func longPollBegan(uuid: String, subscribeKey: String, address: String, channels: [String], groups: [String],
                                        cursor: Timetoken, connection: Connection?, now: Int64) {
        recorder.longPollBegan(uuid: uuid, subscribeKey: subscribeKey, address: address, channels: channels, groups: groups,
                               cursor: cursor, now: now)
        if let connection { longPolls[ObjectIdentifier(connection)] = OpenLongPoll(uuid: uuid, connection: connection) }
    }

    /// A long-poll was answered with `delivered` envelopes up to `cursor` (or abandoned: `cursor` nil).
    package mutating func longPollEnded(uuid: String?, connection: Connection, delivered: Int, gaps: Int, cursor: Timetoken?,
                                        now: Int64) {
        if let cursor { countLatency(delivered: delivered, cursor: cursor, now: now) }
        guard let uuid else { return }
        recorder.longPollEnded(uuid: uuid, delivered: delivered, gaps: gaps, cursor: cursor, now: now)
        longPolls[ObjectIdentifier(connection)] = nil
    }

    /// Long-polls waiting now.
    package var openLongPolls: Int { longPolls.count }

    /// Forgets `uuid`'s waiting long-polls and returns their connections (the kick action closes them).
    package mutating func takeLongPolls(of uuid: String) -> [Connection] {
        let taken = longPolls.filter { $0.value.uuid == uuid }
        for key in taken.keys { longPolls[key] = nil }
        return taken.values.map(\.connection)
    }

    /// An IPv4 address (`sin_addr.s_addr`, network byte order) as dotted text, without the
    /// `sprintf` that `inet_ntop` uses: the console formats a long-poll's address on every cycle.
    package static func ipv4Text(networkOrder address: UInt32) -> String {
        let host = UInt32(bigEndian: address)
        return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 15) { buffer in
            var count = 0
            for shift in [24, 16, 8, 0] as [UInt32] {
                if count > 0 {
                    buffer[count] = UInt8(ascii: ".")
                    count += 1
                }
                let octet = Int((host >> shift) & 0xff)
                if octet >= 100 {
                    buffer[count] = UInt8(48 + octet / 100)
                    count += 1
                }
                if octet >= 10 {
                    buffer[count] = UInt8(48 + octet / 10 % 10)
                    count += 1
                }
                buffer[count] = UInt8(48 + octet % 10)
                count += 1
            }
            return String(decoding: UnsafeBufferPointer(rebasing: buffer[..<count]), as: UTF8.self)
        }
    }

    /// A WebSocket session delivered a page.
    package mutating func sessionDelivered(uuid: String, delivered: Int, gaps: Int, cursor: Timetoken, now: Int64) {
        countLatency(delivered: delivered, cursor: cursor, now: now)
        recorder.sessionDelivered(uuid: uuid, delivered: delivered, gaps: gaps, cursor: cursor, now: now)
    }

    /// The histogram since the last call, emptied.
    package mutating func takeLatencies() -> [Int] {
        defer { latencies = [Int](repeating: 0, count: latencies.count) }
        return latencies
    }

    /// Counts a page into the latency histogram: its age (now minus its cursor, the newest
    /// envelope's timetoken), once per envelope.
    private mutating func countLatency(delivered: Int, cursor: Timetoken, now: Int64) {
        guard delivered > 0 else { return }
        let age = max(0, now - Int64(cursor.rawValue / 10_000))
        var index = 0
        while index < bucketBounds.count - 1 && age > bucketBounds[index] { index += 1 }
        latencies[index] += delivered
    }
}
