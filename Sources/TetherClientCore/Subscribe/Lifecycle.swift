/// What the client does with its connection while the app is in the background
/// (``LifecycleOptions/backgroundPolicy``; docs/mobile.md).
public enum BackgroundPolicy: Sendable, Hashable, CustomStringConvertible {
    /// Let go of the connection and keep the cursor (SendBird's native behaviour; PubNub
    /// scenario 1 with unsubscribe): a WebSocket session ends with `bye`, a long-poll client sends
    /// a presence `leave`, so others see the user leave. On foreground the client resumes from the
    /// cursor as ``LifecycleOptions/foregroundCatchUp`` says.
    case disconnect
    /// Stay subscribed while the operating system allows it (PubNub scenario 1 without
    /// unsubscribe). Nothing starts on its own in the background: retries, Time probes and
    /// network-up attempts wait for the foreground.
    case keep
    /// Tell the server and let go: on the WebSocket wire a `suspend` frame asks the server to
    /// keep the session — its subscription, cursor and, with `keepPresence`, its presence — for
    /// `keepAlive` (bounded by the server's `--ws-max-suspend`), then the socket closes without
    /// `bye`. On foreground the session is resumed (with `keepPresence`, no leave or join seen by
    /// others; without it the user left at once and joins again), and what arrived meanwhile is
    /// replayed from the session's cursor. On long-poll there is no session: the client stops
    /// polling — with `keepPresence` without a `leave` (presence lapses at the server's presence
    /// timeout), without it with one.
    case suspend(keepAlive: Duration, keepPresence: Bool = true)

    /// `disconnect`, `keep`, or `suspend(300s)`.
    public var description: String {
        switch self {
        case .disconnect: return "disconnect"
        case .keep: return "keep"
        case .suspend(let keepAlive, let keepPresence):
            return "suspend(\(keepAlive.components.seconds)s\(keepPresence ? "" : ", without presence"))"
        }
    }
}

/// How the client catches up when the app returns to the foreground after its connection was let
/// go (``LifecycleOptions/foregroundCatchUp``) — PubNub's three mobile scenarios (seed 000).
public enum ForegroundCatchUp: String, Sendable, Hashable, CustomStringConvertible {
    /// Scenario 1: deliver everything published while away, in order and once, then live
    /// messages (the subscription resumes from its cursor; the server replays from its store).
    case everything
    /// Scenario 2: do not replay what was published while away; before resubscribing, count it
    /// per channel (`message-counts`) and report the counts as ``ChannelContinuity/Outcome/skipped(through:count:)``
    /// outcomes, for unread badges. Pushes cover the time away.
    case unreadCounts
    /// Scenario 3: resubscribe at "now" at once, without counting; each channel's
    /// ``ChannelContinuity/Outcome/skipped(through:count:)`` outcome names the range skipped.
    case latestOnly

    /// The case name.
    public var description: String { rawValue }
}

/// The client's behaviour across app lifecycle changes: what it does on
/// ``TetherClient/enterBackground()`` and ``TetherClient/enterForeground()`` (docs/mobile.md).
public struct LifecycleOptions: Sendable, Hashable {
    /// What happens to the connection in the background (default
    /// ``BackgroundPolicy/suspend(keepAlive:keepPresence:)`` for 5 minutes). A suspend
    /// keep-alive is kept within 1 s–24 h, however it is set.
    public var backgroundPolicy: BackgroundPolicy {
        didSet { backgroundPolicy = Self.bounded(backgroundPolicy) }
    }
    /// How the client catches up on foreground (default ``ForegroundCatchUp/everything``).
    public var foregroundCatchUp: ForegroundCatchUp
    /// How long the foreground probe may take before the client treats the link as down and
    /// reconnects with a reset back-off (Diffusion's ping-on-foreground; default 3 s). Kept
    /// within 100 ms–60 s, however it is set.
    public var foregroundProbeTimeout: Duration {
        didSet { foregroundProbeTimeout = Self.bounded(probe: foregroundProbeTimeout) }
    }
    /// On Apple platforms with UIKit (AppKit: system sleep and wake), whether the client observes
    /// the application's notifications and calls ``TetherClient/enterBackground()`` /
    /// ``TetherClient/enterForeground()`` itself (default true). Elsewhere the app calls them.
    public var observesApplicationState: Bool

    /// Creates options; the probe timeout is kept within 100 ms–60 s and a suspend keep-alive
    /// within 1 s–24 h.
    public init(backgroundPolicy: BackgroundPolicy = .suspend(keepAlive: .seconds(300)), foregroundCatchUp: ForegroundCatchUp = .everything,
                foregroundProbeTimeout: Duration = .seconds(3), observesApplicationState: Bool = true) {
        self.backgroundPolicy = Self.bounded(backgroundPolicy)
        self.foregroundCatchUp = foregroundCatchUp
        self.foregroundProbeTimeout = Self.bounded(probe: foregroundProbeTimeout)
        self.observesApplicationState = observesApplicationState
    }

    private static func bounded(_ policy: BackgroundPolicy) -> BackgroundPolicy {
        guard case .suspend(let keepAlive, let keepPresence) = policy else { return policy }
        return .suspend(keepAlive: min(max(keepAlive, .seconds(1)), .seconds(86_400)), keepPresence: keepPresence)
    }

    private static func bounded(probe: Duration) -> Duration {
        min(max(probe, .milliseconds(100)), .seconds(60))
    }

    /// Scenario 1 (seed 000): catch up on everything after the background. With
    /// `unsubscribeInBackground` the client disconnects (a presence `leave`, resumed from the
    /// cursor on foreground); without it the client keeps its subscription while the system
    /// allows and resumes from the cursor if the link was lost.
    public static func catchUpEverything(unsubscribeInBackground: Bool = true) -> LifecycleOptions {
        LifecycleOptions(backgroundPolicy: unsubscribeInBackground ? .disconnect : .keep, foregroundCatchUp: .everything)
    }

    /// Scenario 2 (seed 000): disconnect in the background so the device's push registrations
    /// tell the user about new messages; on return, unread counts per channel instead of a replay.
    public static var unreadCountsWithPush: LifecycleOptions {
        LifecycleOptions(backgroundPolicy: .disconnect, foregroundCatchUp: .unreadCounts)
    }

    /// Scenario 3 (seed 000): disconnect in the background; on return show only the latest,
    /// with the skipped range reported per channel.
    public static var latestOnly: LifecycleOptions {
        LifecycleOptions(backgroundPolicy: .disconnect, foregroundCatchUp: .latestOnly)
    }
}
