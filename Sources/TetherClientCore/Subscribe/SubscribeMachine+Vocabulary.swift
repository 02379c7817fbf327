@_spi(Benchmarks) package import TetherProtocol

// The vocabulary the subscribe machine shares with its shell (`SubscribeEngine` in Tether):
// settings, request and timer identities, the cursor, and the actions the shell performs.
extension SubscribeMachine {
    /// Settings the machine reads (the shell builds them from `TetherConfiguration`).
    package struct Configuration: Sendable, Hashable {
        /// The retry policy.
        package var retry: RetryConfiguration
        /// Continue with the current cursor when the channel list changes (PubNub's
        /// `keepTimeTokenOnListChange`, default true); false takes a fresh cursor.
        package var keepTimetokenOnListChange: Bool
        /// After the loop gave up following an unexpected disconnect, probe the Time API and
        /// restore the subscription when it answers (default true); false forgets the channels.
        package var restoreSubscription: Bool
        /// Resume from the last cursor after a reconnect or restore (default true); false starts
        /// from "now" and messages published meanwhile are only in history.
        package var catchUpOnSubscriptionRestore: Bool
        /// A response with at least this many events raises `requestMessageCountExceeded` once per
        /// burst; 0 disables it.
        package var requestMessageCountThreshold: Int
        /// Time API probing period while unexpectedly disconnected (default 10 s).
        package var timeProbeInterval: Duration
        /// Liveness probing while receiving (nil: off). Default 25 s interval, 10 s timeout.
        package var liveness: Liveness?
        /// Whether presence heartbeats (rather than Time requests) are the liveness probe, and
        /// which of their results are reported as statuses.
        package var presenceHeartbeat: PresenceHeartbeat?
        /// A long-poll still running after this long is declared dead (default 320 s: the server
        /// answers within 280 s).
        package var longPollWatchdog: Duration
        /// When to backfill from history.
        package var backfill: BackfillPolicy
        /// Events per catch-up page (100).
        package var catchUpPageSize: Int
        /// Whether the subscription has a filter expression: the server then leaves out what it
        /// excludes, so a catch-up page short of ``catchUpPageSize`` does not mean the end.
        package var filtered: Bool
        /// Background and foreground behaviour.
        package var lifecycle: LifecycleOptions

        /// Creates a configuration with the documented defaults.
        package init(retry: RetryConfiguration = .default, keepTimetokenOnListChange: Bool = true, restoreSubscription: Bool = true,
                    catchUpOnSubscriptionRestore: Bool = true, requestMessageCountThreshold: Int = 100,
                    timeProbeInterval: Duration = .seconds(10), liveness: Liveness? = Liveness(),
                    presenceHeartbeat: PresenceHeartbeat? = nil, longPollWatchdog: Duration = .seconds(320),
                    backfill: BackfillPolicy = .onGap, catchUpPageSize: Int = 100, filtered: Bool = false,
                    lifecycle: LifecycleOptions = LifecycleOptions()) {
            self.retry = retry
            self.keepTimetokenOnListChange = keepTimetokenOnListChange
            self.restoreSubscription = restoreSubscription
            self.catchUpOnSubscriptionRestore = catchUpOnSubscriptionRestore
            self.requestMessageCountThreshold = requestMessageCountThreshold
            self.timeProbeInterval = timeProbeInterval
            self.liveness = liveness
            self.presenceHeartbeat = presenceHeartbeat
            self.longPollWatchdog = longPollWatchdog
            self.backfill = backfill
            self.catchUpPageSize = catchUpPageSize
            self.filtered = filtered
            self.lifecycle = lifecycle
        }
    }

    /// Liveness probing while receiving: dead-link detection within `interval + timeout`.
    package struct Liveness: Sendable, Hashable {
        /// Time between probes (default 25 s).
        package var interval: Duration
        /// How long a probe may take (default 10 s).
        package var timeout: Duration
        /// Creates the settings.
        package init(interval: Duration = .seconds(25), timeout: Duration = .seconds(10)) {
            self.interval = interval
            self.timeout = timeout
        }
    }

    /// Presence heartbeats as the liveness probe.
    package struct PresenceHeartbeat: Sendable, Hashable {
        /// Which heartbeat results become statuses (public as ``HeartbeatReporting``).
        package typealias Reporting = HeartbeatReporting
        /// Seconds between heartbeats.
        package var interval: Duration
        /// Which results are reported.
        package var reporting: Reporting
        /// Creates the settings.
        package init(interval: Duration, reporting: Reporting = .failures) {
            self.interval = interval
            self.reporting = reporting
        }
    }

    /// When the engine fetches history itself (public as ``TetherClientCore/BackfillPolicy``).
    package typealias BackfillPolicy = TetherClientCore.BackfillPolicy

    /// Identifies one request the machine asked for; results for another ID are stale.
    package struct RequestID: Sendable, Hashable, CustomStringConvertible {
        /// The number.
        package let rawValue: Int
        /// `#n`.
        package var description: String { "#\(rawValue)" }
    }

    /// Timers the shell runs for the machine; scheduling one that exists replaces it.
    package enum TimerID: Sendable, Hashable, CaseIterable {
        /// The next retry of a failed subscribe.
        case retry
        /// The next Time API probe while unexpectedly disconnected.
        case timeProbe
        /// The next liveness probe while receiving.
        case liveness
        /// The deadline of the running long-poll.
        case longPollWatchdog
    }

    /// A subscribe position: the timetoken and region to send as `tt` / `tr`.
    package struct Cursor: Sendable, Hashable {
        /// `tt`.
        package var timetoken: Timetoken
        /// `tr`.
        package var region: Int
        /// Creates a cursor.
        package init(timetoken: Timetoken, region: Int) {
            self.timetoken = timetoken
            self.region = region
        }
    }

    /// What the shell must do.
    package enum Action: Sendable {
        /// Start a subscribe request (cancelling any running one): a handshake when `cursor` is nil.
        case startSubscribe(RequestID, channels: [String], groups: [String], cursor: Cursor?)
        /// Cancel the running subscribe request.
        case cancelSubscribe
        /// Start (or restart) a timer.
        case schedule(TimerID, after: Duration)
        /// Cancel a timer.
        case cancelTimer(TimerID)
        /// Tell the app something (the shell builds the public ``Status`` with
        /// ``Status/init(_:)``); a report with a `retryEpisode` can cancel that automatic retry.
        case report(SubscribeReport)
        /// Publish a connection-state change.
        case connectionChanged(ConnectionChange)
        /// Deliver events to listeners, in order (already de-duplicated).
        case deliver([ReceivedEvent])
        /// Tell the server the user left these channels and groups (presence).
        case leave(channels: [String], groups: [String])
        /// Send one Time API request (restore probe).
        case probeTime
        /// Send one liveness probe: a presence heartbeat on the subscription or, when `presence`
        /// is false, a Time request; report the result within `timeout`.
        case probeLiveness(presence: Bool, channels: [String], groups: [String], timeout: Duration)
        /// Fetch history for these ranges and report it with ``SubscribeMachine/backfillCompleted(_:events:now:)``.
        case backfill(RequestID, [BackfillRange])
        /// Publish continuity outcomes.
        case continuity([ChannelContinuity])
        /// The app went to the background: let go of the connection as `policy` says (`disconnect`:
        /// end the session with `bye`, or send a presence `leave` on long-poll; `suspend`: ask the
        /// server to keep the session for its keep-alive and close the socket without `bye`).
        case releaseConnection(BackgroundPolicy, channels: [String], groups: [String])
        /// The app came to the foreground: test the link within `timeout` before trusting it
        /// (a WebSocket `ping` on an open session, otherwise a Time request; with `counting`,
        /// a `message-counts` request for those channels since their timetokens, whose answer is
        /// the probe). Report with ``SubscribeMachine/foregroundProbeSucceeded(_:counts:now:)`` or
        /// ``SubscribeMachine/foregroundProbeFailed(_:status:now:randomness:)``.
        case probeForeground(RequestID, counting: [String: Timetoken], timeout: Duration)
    }

    /// Hands out request IDs in order; one sequence per machine, shared by its children.
    package struct RequestIDs: Sendable, Hashable {
        private var last = 0

        /// Creates a sequence starting at 1.
        package init() {}

        /// The next ID.
        package mutating func next() -> RequestID {
            last += 1
            return RequestID(rawValue: last)
        }
    }
}
