import Testing
import TetherProtocol
import TetherServerCore

/// What the console's hooks write besides the flight recorder: the waiting long-polls (for the
/// kick), the latency histogram, and the address text.
@Suite struct ConsoleRecordingTests {
    final class Connection: Sendable {}

    @Test func waitingLongPollsAreKeptByConnectionUntilAnsweredOrTaken() {
        var r = ConsoleRecording(recorder: ConnectionRecorder())
        let (a1, a2, b) = (Connection(), Connection(), Connection())
        let tt = Timetoken(17_000_000_000_000_000)
        r.longPollBegan(uuid: "ann", subscribeKey: "demo", address: "10.0.0.1", channels: ["c"], groups: [], cursor: tt, connection: a1, now: 0)
        r.longPollBegan(uuid: "ann", subscribeKey: "demo", address: "10.0.0.1", channels: ["c"], groups: [], cursor: tt, connection: a2, now: 0)
        r.longPollBegan(uuid: "bob", subscribeKey: "demo", address: "10.0.0.2", channels: ["c"], groups: [], cursor: tt, connection: b, now: 0)
        // A handshake does not wait: nothing to kick.
        r.longPollBegan(uuid: "cy", subscribeKey: "demo", address: "10.0.0.3", channels: ["c"], groups: [], cursor: .zero, connection: nil, now: 0)
        #expect(r.openLongPolls == 3)
        r.longPollEnded(uuid: "ann", connection: a1, delivered: 1, gaps: 0, cursor: tt.successor, now: 5)
        #expect(r.openLongPolls == 2)
        let taken = r.takeLongPolls(of: "ann")
        #expect(taken.count == 1 && taken.first === a2)
        #expect(r.openLongPolls == 1)
        #expect(r.takeLongPolls(of: "ann").isEmpty)
        #expect(r.recorder.client("ann")?.delivered == 1)
    }

    @Test func deliveriesAreCountedIntoLatencyBucketsByThePagesAge() {
        var r = ConsoleRecording(recorder: ConnectionRecorder())
        let sent: Int64 = 1_700_000_000_000
        let cursor = Timetoken(UInt64(sent) * 10_000)
        r.sessionDelivered(uuid: "ann", delivered: 3, gaps: 0, cursor: cursor, now: sent + 15)  // 10–20 ms bucket
        r.longPollEnded(uuid: "bob", connection: Connection(), delivered: 2, gaps: 0, cursor: cursor, now: sent)  // ≤ 1 ms
        r.longPollEnded(uuid: "bob", connection: Connection(), delivered: 0, gaps: 0, cursor: cursor, now: sent + 99_000)  // nothing delivered
        var expected = [Int](repeating: 0, count: ConsoleRecording.latencyBuckets.count)
        expected[0] = 2
        expected[4] = 3
        #expect(r.takeLatencies() == expected)
        #expect(r.takeLatencies().allSatisfy { $0 == 0 })
    }

    @Test(arguments: [((10, 0, 0, 1), "10.0.0.1"), ((255, 255, 255, 255), "255.255.255.255"), ((0, 0, 0, 0), "0.0.0.0"),
                      ((127, 0, 100, 9), "127.0.100.9"), ((192, 168, 1, 42), "192.168.1.42")])
    func ipv4AddressesAreDottedText(octets: (UInt8, UInt8, UInt8, UInt8), text: String) {
        // sin_addr.s_addr is in network byte order: the first octet is the lowest byte in memory.
        let bytes = [octets.0, octets.1, octets.2, octets.3]
        let networkOrder = bytes.withUnsafeBytes { $0.loadUnaligned(as: UInt32.self) }
        #expect(ConsoleRecording.ipv4Text(networkOrder: networkOrder) == text)
    }
}
