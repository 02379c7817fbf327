public import TetherProtocol

/// What happened to one channel's stream across a reconnect: every reconnect ends with one
/// outcome per channel, so the app never has to guess whether it missed something.
public struct ChannelContinuity: Sendable, Hashable, CustomStringConvertible {
    /// The outcome.
    public enum Outcome: Sendable, Hashable {
        /// Nothing was published while the client was away.
        case continuous
        /// `count` messages published while the client was away were delivered (in order, once).
        case recovered(count: Int)
        /// Messages in `(from, through]` may have existed and can no longer be delivered (the
        /// server's retention removed them, and history could not fill them); `recovered` others
        /// were delivered.
        case gap(from: Timetoken, through: Timetoken, recovered: Int)
        /// Messages in `(resumedFrom, through]` were deliberately not delivered: the app came back
        /// from the background with ``ForegroundCatchUp/unreadCounts`` or
        /// ``ForegroundCatchUp/latestOnly``. `count` is how many were published before the client
        /// resubscribed (`message-counts`; nil when not counted), for unread badges; history has them.
        case skipped(through: Timetoken, count: Int?)
    }

    /// The channel (as events name it: a plain channel, a group member, a presence channel).
    public var channel: String
    /// The outcome.
    public var outcome: Outcome
    /// The cursor the client resumed from.
    public var resumedFrom: Timetoken

    /// Creates a value.
    public init(channel: String, outcome: Outcome, resumedFrom: Timetoken) {
        self.channel = channel
        self.outcome = outcome
        self.resumedFrom = resumedFrom
    }

    /// `channel: outcome`.
    public var description: String {
        switch outcome {
        case .continuous: return "\(channel): continuous"
        case .recovered(let count): return "\(channel): recovered \(count)"
        case .gap(let from, let through, let recovered): return "\(channel): gap (\(from), \(through)] recovered \(recovered)"
        case .skipped(let through, let count):
            return "\(channel): skipped (\(resumedFrom), \(through)]" + (count.map { " \($0) messages" } ?? "")
        }
    }
}

/// A retention gap the server reported (`X-Tether-Gap`, docs/protocol.md): messages of `channel`
/// in `(from, through]` may have existed and are no longer stored.
package struct RetentionGap: Sendable, Hashable {
    /// The channel.
    package var channel: String
    /// Exclusive lower bound (the cursor the client asked from).
    package var from: Timetoken
    /// Inclusive upper bound (the newest removed timetoken).
    package var through: Timetoken

    /// Creates a gap.
    package init(channel: String, from: Timetoken, through: Timetoken) {
        self.channel = channel
        self.from = from
        self.through = through
    }

    /// Parses `<channel>;from=<tt>;through=<tt>[, …]` (channel names percent-encoded); malformed
    /// entries are skipped.
    package static func parse(header: String) -> [RetentionGap] {
        header.split(separator: ",").compactMap { entry in
            let parts = entry.trimmingCharacters(in: " ").split(separator: ";")
            guard parts.count == 3, let channel = PercentCoding.decode(String(parts[0])) else { return nil }
            var from: Timetoken?
            var through: Timetoken?
            for part in parts.dropFirst() {
                let pair = part.split(separator: "=", maxSplits: 1)
                guard pair.count == 2 else { return nil }
                switch pair[0] {
                case "from": from = Timetoken(parsing: pair[1])
                case "through": through = Timetoken(parsing: pair[1])
                default: return nil
                }
            }
            guard let from, let through else { return nil }
            return RetentionGap(channel: channel, from: from, through: through)
        }
    }
}

/// A range of history the shell must fetch before live delivery resumes.
package struct BackfillRange: Sendable, Hashable {
    /// The channel.
    package var channel: String
    /// Fetch messages strictly after this timetoken…
    package var after: Timetoken
    /// …and at or before this one.
    package var through: Timetoken

    /// Creates a range.
    package init(channel: String, after: Timetoken, through: Timetoken) {
        self.channel = channel
        self.after = after
        self.through = through
    }
}

extension String {
    fileprivate func trimmingCharacters(in set: Character) -> Substring {
        var slice = self[...]
        while slice.first == set { slice = slice.dropFirst() }
        while slice.last == set { slice = slice.dropLast() }
        return slice
    }
}

extension Substring {
    fileprivate func trimmingCharacters(in set: Character) -> Substring {
        var slice = self
        while slice.first == set { slice = slice.dropFirst() }
        while slice.last == set { slice = slice.dropLast() }
        return slice
    }
}
