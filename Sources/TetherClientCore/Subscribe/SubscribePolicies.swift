/// Which presence-heartbeat results the subscribe engine reports as statuses
/// (`TetherConfiguration.heartbeatReporting`).
public enum HeartbeatReporting: Sendable, Hashable {
    /// None.
    case none
    /// Failures only (PubNub's default).
    case failures
    /// Successes and failures.
    case all
}

/// When the subscribe engine fetches history itself to fill what the live stream missed
/// (`TetherConfiguration.backfill`).
public enum BackfillPolicy: Sendable, Hashable {
    /// Never (gaps are still reported).
    case never
    /// When the server reports a retention gap (default).
    case onGap
    /// After every reconnect, before live delivery resumes (for servers whose live buffer
    /// is smaller than their history, such as PubNub's 100 messages / 20 minutes).
    case onEveryReconnect
}
