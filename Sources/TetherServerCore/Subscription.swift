import TetherProtocol

/// A channel inside one keyset: the unit of buffering, storage and delivery.
public struct ChannelKey: Hashable, Sendable, CustomStringConvertible {
    /// The subscribe key of the keyset.
    public var subscribeKey: String
    /// The channel name.
    public var channel: String

    /// Creates a channel key.
    public init(subscribeKey: String, channel: String) {
        self.subscribeKey = subscribeKey
        self.channel = channel
    }

    /// `subscribeKey/channel`, for logs.
    public var description: String { "\(subscribeKey)/\(channel)" }
}

/// What one subscribe request listens to. Each request is self-describing (pubnub-wire §6.4.6):
/// the server keeps no per-connection subscribe state.
public struct SubscriptionSpec: Sendable, Hashable {
    /// The keyset's subscribe key.
    public var subscribeKey: String
    /// Concrete channels, including `{ch}-pnpres` presence channels.
    public var channels: [String]
    /// Wildcard patterns as sent (`sports.*`).
    public var wildcards: [String]
    /// Channel groups, including `{group}-pnpres` presence groups.
    public var groups: [String]

    /// Creates a subscription.
    public init(subscribeKey: String, channels: [String], wildcards: [String] = [], groups: [String] = []) {
        self.subscribeKey = subscribeKey
        self.channels = channels
        self.wildcards = wildcards
        self.groups = groups
    }

    /// Splits a subscribe channel list into concrete channels and wildcard patterns.
    public init(subscribeKey: String, names: [String], groups: [String] = []) {
        self.subscribeKey = subscribeKey
        self.channels = names.filter { !NameRules.isWildcard($0) }
        self.wildcards = names.filter { NameRules.isWildcard($0) }
        self.groups = groups
    }

    /// Whether the subscription is empty (nothing to wait for).
    public var isEmpty: Bool { channels.isEmpty && wildcards.isEmpty && groups.isEmpty }

    /// The `b` value for an event on `channel` reached through this subscription, or `nil`
    /// when the channel is subscribed directly and is not a presence channel. `nil` is also
    /// returned for channels the subscription does not match; use ``matches(_:)`` first.
    public func match(for channel: String) -> String? {
        if channels.contains(channel) {
            return NameRules.isPresence(channel) ? channel : nil
        }
        for pattern in wildcards where WildcardPattern.matches(pattern: pattern, channel: channel) {
            return pattern
        }
        return nil
    }

    /// Whether an event on `channel` is delivered to this subscription.
    public func matches(_ channel: String) -> Bool {
        channels.contains(channel) || wildcards.contains { WildcardPattern.matches(pattern: $0, channel: channel) }
    }
}

/// Wildcard subscription matching (`a.*` matches `a.b` and `a.b.c`, never presence channels).
public enum WildcardPattern {
    /// The literal prefix of a pattern: `a.*` → `a.`.
    public static func prefix(of pattern: String) -> String { String(pattern.dropLast()) }

    /// Whether `channel` is matched by `pattern`.
    public static func matches(pattern: String, channel: String) -> Bool {
        let prefix = prefix(of: pattern)
        return channel.count > prefix.count && channel.hasPrefix(prefix) && !NameRules.isPresence(channel)
    }

    /// Every wildcard prefix that could match `channel` (`a.b.c` → `a.`, `a.b.`).
    public static func candidatePrefixes(of channel: String) -> [String] {
        var result: [String] = []
        var index = channel.startIndex
        while let dot = channel[index...].firstIndex(of: ".") {
            let prefix = String(channel[...dot])
            if prefix.count < channel.count { result.append(prefix) }
            index = channel.index(after: dot)
        }
        return result
    }
}
