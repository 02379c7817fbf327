public import TetherProtocol

/// Issues unique, strictly increasing timetokens: `max(now, last + 1)`.
///
/// Pure: the caller passes the wall-clock reading, so tests can drive it with any clock and a
/// clock that steps backwards never produces a duplicate or a decrease.
public struct TimetokenSequencer: Sendable {
    /// The last timetoken issued (or the floor the sequencer was started from).
    public private(set) var last: Timetoken

    /// Creates a sequencer that will only issue timetokens above `floor`. Start it from the
    /// highest timetoken in the store so a restarted server never reissues one.
    public init(floor: Timetoken) { self.last = floor }

    /// Issues the next timetoken given the current wall-clock reading.
    public mutating func next(now: Timetoken) -> Timetoken {
        last = max(now, last.successor)
        return last
    }
}
