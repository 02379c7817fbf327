package import TetherProtocol

/// Tracks one catch-up after a reconnect: what was delivered per channel, which gaps the server
/// reported and which history ranges to backfill, until the client is current; then yields one
/// ``ChannelContinuity`` per channel.
///
/// Messages published during the outage are those at or below `upTo`, the server's cursor when
/// the reconnect handshake answered; the catch-up is complete when a response brings the cursor
/// to `upTo` or carries less than a full page. With a filter expression a page is short because
/// the server left out what the filter excludes, not because the catch-up ended: then only the
/// cursor, or an answer with no events (the server had nothing more), completes it.
package struct CatchUpPlanner: Sendable, Hashable {
    /// The cursor the client resumed from.
    package let resumedFrom: Timetoken
    /// The server's cursor when the client reconnected.
    package let upTo: Timetoken
    /// Events per response when the server is paging (100 on Tether and PubNub).
    package let pageSize: Int
    /// Whether the subscription has a filter expression.
    package let filtered: Bool
    private var channels: [String]
    private var recovered: [String: Int] = [:]
    private var gaps: [String: RetentionGap] = [:]

    /// Starts a catch-up for `channels` (plain channels known up front; others are added as their
    /// events arrive).
    package init(channels: [String], resumedFrom: Timetoken, upTo: Timetoken, pageSize: Int = 100, filtered: Bool = false) {
        self.channels = channels
        self.resumedFrom = resumedFrom
        self.upTo = upTo
        self.pageSize = pageSize
        self.filtered = filtered
    }

    /// This catch-up, cut short by another outage, continued by the catch-up after it: still
    /// from the cursor it resumed from, now up to `upTo` (the server's cursor at the new
    /// reconnect), with what it counted and the gaps the server reported (a gap reported once is
    /// not reported again: the next catch-up starts past it).
    package func continued(upTo newUpTo: Timetoken, channels more: [String]) -> CatchUpPlanner {
        var next = CatchUpPlanner(channels: channels, resumedFrom: resumedFrom, upTo: max(upTo, newUpTo), pageSize: pageSize,
                                  filtered: filtered)
        for channel in more where !next.channels.contains(channel) { next.channels.append(channel) }
        next.recovered = recovered
        next.gaps = gaps
        return next
    }

    /// Counts delivered events that were published during the outage.
    package mutating func recordDelivered(_ events: [ReceivedEvent]) {
        for event in events where event.timetoken <= upTo {
            if !channels.contains(event.channel) { channels.append(event.channel) }
            recovered[event.channel, default: 0] += 1
        }
    }

    /// Records the gaps the server reported.
    package mutating func recordGaps(_ reported: [RetentionGap]) {
        for gap in reported {
            if !channels.contains(gap.channel) { channels.append(gap.channel) }
            gaps[gap.channel] = gap
        }
    }

    /// Narrows a gap after history delivered messages inside it: what remains missing starts after
    /// the newest message history returned for that channel.
    package mutating func recordBackfilled(_ events: [ReceivedEvent]) {
        for event in events {
            guard let gap = gaps[event.channel], event.timetoken > gap.from, event.timetoken <= gap.through else { continue }
            if event.timetoken == gap.through {
                gaps[event.channel] = nil
            } else {
                gaps[event.channel] = RetentionGap(channel: gap.channel, from: event.timetoken, through: gap.through)
            }
        }
    }

    /// The history ranges to fetch for the reported gaps.
    package func backfillRanges(for reported: [RetentionGap]) -> [BackfillRange] {
        reported.map { BackfillRange(channel: $0.channel, after: $0.from, through: $0.through) }
    }

    /// Whether the catch-up is complete after a response with `eventCount` events and `cursor`.
    package func isComplete(afterResponseWith eventCount: Int, cursor: Timetoken) -> Bool {
        cursor >= upTo || (filtered ? eventCount == 0 : eventCount < pageSize)
    }

    /// One outcome per channel, in the order channels became known.
    package func outcomes() -> [ChannelContinuity] {
        channels.map { channel in
            let count = recovered[channel] ?? 0
            if let gap = gaps[channel] {
                return ChannelContinuity(channel: channel, outcome: .gap(from: gap.from, through: gap.through, recovered: count),
                                         resumedFrom: resumedFrom)
            }
            return ChannelContinuity(channel: channel, outcome: count == 0 ? .continuous : .recovered(count: count),
                                     resumedFrom: resumedFrom)
        }
    }
}
