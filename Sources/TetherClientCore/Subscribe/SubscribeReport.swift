@_spi(Benchmarks) package import TetherProtocol

/// Something the subscribe machine tells the app, as typed facts.
///
/// The machine's transitions decide *that* the app hears something and with which timetokens;
/// the public ``Status`` is built from the report at the edge, by the shell, with
/// ``Status/init(_:)`` (STYLE.md §1: nothing user-facing is assembled inside a transition).
/// `channels` and `groups` are the subscription at the moment of the report, because the shell
/// builds the status after the machine has moved on.
package struct SubscribeReport: Sendable {
    /// What happened.
    package enum Event: Sendable {
        /// The first handshake of a loop answered (seed 000's `PNConnectedCategory`).
        case connected(last: Timetoken, current: Timetoken)
        /// A handshake after an outage, probe, network change or `reconnect()` answered.
        case reconnected(last: Timetoken?, current: Timetoken)
        /// The app changed the subscription while it runs; the lists are what was added and
        /// removed (or the whole set when it did not change). `removalOnly`: names were only
        /// removed (a partial unsubscribe, reported with operation `unsubscribe`).
        case subscriptionChanged(channels: [String], groups: [String], last: Timetoken?, current: Timetoken?, removalOnly: Bool = false)
        /// The app unsubscribed from everything; the lists are what it left.
        case unsubscribed(channels: [String], groups: [String], last: Timetoken?)
        /// The app called `disconnect()`.
        case disconnected(last: Timetoken?)
        /// A subscribe request failed: reported as `category` (which may differ from the cause's,
        /// such as `unexpectedDisconnect` for the first failure after connecting).
        case failure(StatusCategory, cause: Status, last: Timetoken?)
        /// The loop gave up because the app cancelled the automatic retry (no failure to cite).
        case gaveUp(StatusCategory, last: Timetoken?)
        /// One response carried at least `threshold` events.
        case messageCountExceeded(count: Int, threshold: Int, last: Timetoken, current: Timetoken)
        /// The network monitor reports no usable network.
        case networkDown
        /// The network monitor reports the network back.
        case networkUp
        /// A presence heartbeat answered (reported when `heartbeatReporting` is `.all`).
        case heartbeatSucceeded
        /// A presence heartbeat failed, as the request reported it.
        case heartbeatFailed(Status)
        /// A delivered message could not be decrypted, as the event carries it.
        case decryptionFailed(Status)
        /// The history a catch-up fetched to fill a gap (or on every reconnect) could not be
        /// read, as the history request reported it: what it would have recovered was not
        /// delivered (a reported gap stays in the continuity outcome).
        case backfillFailed(Status)
    }

    /// What happened.
    package var event: Event
    /// The subscribed channels when it happened.
    package var channels: [String]
    /// The subscribed groups when it happened.
    package var groups: [String]
    /// The outage whose automatic retry the status can cancel (``Status/willAutomaticallyRetry``).
    package var retryEpisode: Int?

    /// Creates a report.
    package init(_ event: Event, channels: [String], groups: [String], retryEpisode: Int? = nil) {
        self.event = event
        self.channels = channels
        self.groups = groups
        self.retryEpisode = retryEpisode
    }
}

extension Status {
    /// The public status for a subscribe report (the edge where the machine's facts become the
    /// app's ``Status``).
    package init(_ report: SubscribeReport) {
        let channels = report.channels
        let groups = report.groups
        switch report.event {
        case .connected(let last, let current):
            self.init(category: .connected, operation: .subscribe, affectedChannels: channels, affectedGroups: groups,
                      subscribedChannels: channels, subscribedGroups: groups, lastTimetoken: last, currentTimetoken: current)
        case .reconnected(let last, let current):
            self.init(category: .reconnected, operation: .subscribe, affectedChannels: channels, affectedGroups: groups,
                      subscribedChannels: channels, subscribedGroups: groups, lastTimetoken: last, currentTimetoken: current)
        case .subscriptionChanged(let affected, let affectedGroups, let last, let current, let removalOnly):
            self.init(category: .subscriptionChanged, operation: removalOnly ? .unsubscribe : .subscribe, affectedChannels: affected, affectedGroups: affectedGroups,
                      subscribedChannels: channels, subscribedGroups: groups, lastTimetoken: last, currentTimetoken: current)
        case .unsubscribed(let removed, let removedGroups, let last):
            self.init(category: .disconnected, operation: .unsubscribe, affectedChannels: removed, affectedGroups: removedGroups,
                      subscribedChannels: channels, subscribedGroups: groups, lastTimetoken: last, currentTimetoken: last)
        case .disconnected(let last):
            self.init(category: .disconnected, operation: .subscribe, affectedChannels: channels, affectedGroups: groups,
                      subscribedChannels: channels, subscribedGroups: groups, lastTimetoken: last, currentTimetoken: last)
        case .failure(let category, let cause, let last):
            // The cause's category is kept as the message when the report names another one.
            self.init(category: category, operation: .subscribe, statusCode: cause.statusCode, error: cause.error,
                      serverMessage: cause.serverMessage ?? (category == cause.category ? nil : "\(cause.category)"),
                      affectedChannels: channels, affectedGroups: groups, subscribedChannels: channels, subscribedGroups: groups,
                      lastTimetoken: last, currentTimetoken: last, deniedChannels: cause.deniedChannels, deniedGroups: cause.deniedGroups)
            willAutomaticallyRetry = report.retryEpisode != nil
        case .gaveUp(let category, let last):
            self.init(category: category, operation: .subscribe, affectedChannels: channels, affectedGroups: groups,
                      subscribedChannels: channels, subscribedGroups: groups, lastTimetoken: last, currentTimetoken: last)
        case .messageCountExceeded(let count, let threshold, let last, let current):
            self.init(category: .requestMessageCountExceeded, operation: .subscribe,
                      serverMessage: "\(count) events in one response (threshold \(threshold))", affectedChannels: channels,
                      affectedGroups: groups, subscribedChannels: channels, subscribedGroups: groups, lastTimetoken: last,
                      currentTimetoken: current)
        case .networkDown:
            self.init(category: .networkDown, operation: .subscribe, subscribedChannels: channels, subscribedGroups: groups)
        case .networkUp:
            self.init(category: .networkUp, operation: .subscribe, subscribedChannels: channels, subscribedGroups: groups)
        case .heartbeatSucceeded:
            self.init(category: .acknowledgment, operation: .heartbeat, statusCode: 200, affectedChannels: channels, affectedGroups: groups)
        case .heartbeatFailed(let status), .decryptionFailed(let status), .backfillFailed(let status):
            self = status
        }
    }

    /// The failure the machine feeds itself when a subscribe request outlives its watchdog.
    package static func subscribeDeadlinePassed(_ message: String, channels: [String], groups: [String]) -> Status {
        Status(category: .timeout, operation: .subscribe, serverMessage: message, affectedChannels: channels, affectedGroups: groups)
    }
}
