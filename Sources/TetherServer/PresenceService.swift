public import Logging
import Synchronization
import TetherProtocol
public import TetherServerCore

/// The presence shell: a mutex around ``PresenceTracker``, group resolution, event publishing
/// through the ``LongPollHub`` (so presence events follow the same cursor rule as messages) and
/// the timeout loop on an injected ``ServerClock``.
public final class PresenceService: Sendable {
    private let tracker: Mutex<PresenceTracker>
    private let hub: LongPollHub
    private let clock: ServerClock
    private let logger: Logger

    /// Creates the service.
    public init(hub: LongPollHub, clock: ServerClock, logger: Logger, configurationBySubscribeKey: [String: PresenceConfiguration],
                maximumMemberships: Int = PresenceTracker.defaultMaximumMemberships) {
        self.tracker = Mutex(PresenceTracker(configurationBySubscribeKey: configurationBySubscribeKey,
                                             maximumMemberships: maximumMemberships))
        self.hub = hub
        self.clock = clock
        self.logger = logger
    }

    /// The presence configuration of a keyset.
    public func configuration(for subscribeKey: String) -> PresenceConfiguration {
        tracker.withLock { $0.configuration(for: subscribeKey) }
    }

    /// Resolves channels and groups into the concrete channels presence applies to: presence
    /// names (`-pnpres`) and wildcards are ignored; groups expand to their channels.
    public func concreteChannels(subscribeKey: String, channels: [String], groups: [String]) -> [String] {
        var result = Set(channels.filter { !NameRules.isPresence($0) && !NameRules.isWildcard($0) })
        for group in groups where !NameRules.isPresence(group) {
            result.formUnion(hub.channels(subscribeKey: subscribeKey, group: group))
        }
        return result.sorted()
    }

    /// A heartbeat (or subscribe) of `uuid`.
    public func heartbeat(subscribeKey: String, uuid: String, channels: [String], groups: [String], timeoutSeconds: Int?,
                          states: [String: String] = [:]) {
        let concrete = concreteChannels(subscribeKey: subscribeKey, channels: channels, groups: groups)
        guard !concrete.isEmpty else { return }
        let now = clock.now()
        transition { tracker in
            let timeout = tracker.configuration(for: subscribeKey).timeout(requestedSeconds: timeoutSeconds)
            return tracker.heartbeat(subscribeKey: subscribeKey, uuid: uuid, channels: concrete, timeout: timeout, states: states, now: now)
        }
    }

    /// Extends `uuid`'s presence where it still is (the end of a long-poll); never joins.
    public func refresh(subscribeKey: String, uuid: String, channels: [String], groups: [String], timeoutSeconds: Int?) {
        let concrete = concreteChannels(subscribeKey: subscribeKey, channels: channels, groups: groups)
        guard !concrete.isEmpty else { return }
        let now = clock.now()
        tracker.withLock { tracker in
            let timeout = tracker.configuration(for: subscribeKey).timeout(requestedSeconds: timeoutSeconds)
            tracker.refresh(subscribeKey: subscribeKey, uuid: uuid, channels: concrete, timeout: timeout, now: now)
        }
    }

    /// An explicit leave.
    public func leave(subscribeKey: String, uuid: String, channels: [String], groups: [String]) {
        let concrete = concreteChannels(subscribeKey: subscribeKey, channels: channels, groups: groups)
        let now = clock.now()
        transition { $0.leave(subscribeKey: subscribeKey, uuid: uuid, channels: concrete, now: now) }
    }

    /// Sets state; returns the channels it applied to.
    @discardableResult
    public func setState(subscribeKey: String, uuid: String, channels: [String], groups: [String], state: String) -> [String] {
        let concrete = concreteChannels(subscribeKey: subscribeKey, channels: channels, groups: groups)
        transition { $0.setState(subscribeKey: subscribeKey, uuid: uuid, channels: concrete, state: state) }
        return concrete
    }

    /// Reads the tracker.
    public func read<T>(_ body: (borrowing PresenceTracker) -> T) -> T {
        tracker.withLock { body($0) }
    }

    /// Runs the timeout and interval loop until cancelled. Sleeps until the next deadline, at
    /// most one second at a time, so a timeout fires at its deadline and an idle server wakes
    /// once a second.
    public func run() async {
        while !Task.isCancelled {
            let now = clock.now()
            let next = tracker.withLock { $0.nextWakeUp }
            var wait = Duration.seconds(1)
            if let next { wait = max(.zero, min(wait, next - now)) }
            do {
                try await clock.sleep(wait)
            } catch {
                return
            }
            let tickTime = clock.now()
            transition { $0.tick(now: tickTime) }
        }
    }

    /// Applies a tracker transition and publishes its events while still holding the tracker
    /// lock, so the events of one channel get timetokens in the order they happened.
    private func transition(_ body: (inout PresenceTracker) -> [PresenceEvent]) {
        tracker.withLock { tracker in
            let events = body(&tracker)
            for event in events {
                let channel = event.channel.channel + NameRules.presenceSuffix
                hub.publishEphemeral { tt in
                    SubscribeEnvelope(timetoken: tt, subscribeKey: event.channel.subscribeKey, channel: channel,
                                      payload: event.payload(timestamp: tt.unixSeconds))
                }
                logger.trace("presence event", metadata: ["channel": "\(event.channel)", "action": "\(event.action.name)",
                                                          "uuid": "\(event.uuid ?? "-")", "occupancy": "\(event.occupancy)"])
            }
        }
    }
}
