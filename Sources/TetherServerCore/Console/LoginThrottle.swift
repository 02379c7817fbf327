/// Bounds guessing of the console's admin secret (docs/console.md, "Signing in"): per remote
/// address, after ``Configuration/maxFailures`` wrong secrets within a window of
/// ``Configuration/windowMilliseconds`` (counted from the first of them) every further attempt —
/// right or wrong — is refused until the window has passed.
///
/// Bounded: at most ``Configuration/maxAddresses`` addresses are tracked; at the bound, finished
/// windows are dropped first, then the address whose window started earliest, so an attacker
/// rotating addresses cannot grow the table (it only forgets the oldest failures sooner).
///
/// Pure: time is passed in (milliseconds).
package struct LoginThrottle: Sendable {
    package struct Configuration: Sendable, Hashable {
        /// Wrong secrets per address and window before attempts are refused.
        package var maxFailures: Int
        /// The window's length, from its first failure.
        package var windowMilliseconds: Int64
        /// Addresses tracked at most.
        package var maxAddresses: Int

        package init(maxFailures: Int = 5, windowMilliseconds: Int64 = 60_000, maxAddresses: Int = 4_096) {
            self.maxFailures = max(1, maxFailures)
            self.windowMilliseconds = max(1, windowMilliseconds)
            self.maxAddresses = max(1, maxAddresses)
        }
    }

    /// Whether an attempt may be checked.
    package enum Verdict: Sendable, Hashable {
        case allowed
        /// Refused; the window ends in `retryAfterSeconds` (rounded up, at least 1).
        case throttled(retryAfterSeconds: Int)
    }

    private struct Window: Sendable {
        var startedAt: Int64
        var failures: Int
    }

    package let configuration: Configuration
    private var windows: [String: Window] = [:]

    package init(configuration: Configuration = .init()) {
        self.configuration = configuration
    }

    /// Addresses tracked now.
    package var count: Int { windows.count }

    /// Whether `address` may try a secret now.
    package func verdict(for address: String, now: Int64) -> Verdict {
        guard let window = windows[address], window.failures >= configuration.maxFailures else { return .allowed }
        let remaining = window.startedAt + configuration.windowMilliseconds - now
        guard remaining > 0 else { return .allowed }
        return .throttled(retryAfterSeconds: Int((remaining + 999) / 1_000))
    }

    /// `address` tried a wrong secret.
    package mutating func failed(_ address: String, now: Int64) {
        if var window = windows[address], now - window.startedAt < configuration.windowMilliseconds {
            window.failures += 1
            windows[address] = window
            return
        }
        if windows[address] == nil && windows.count >= configuration.maxAddresses {
            makeRoom(now: now)
        }
        windows[address] = Window(startedAt: now, failures: 1)
    }

    /// `address` signed in: its failures are forgotten.
    package mutating func succeeded(_ address: String) {
        windows[address] = nil
    }

    /// Drops finished windows; if none had finished, the one that started earliest.
    private mutating func makeRoom(now: Int64) {
        let window = configuration.windowMilliseconds
        windows = windows.filter { now - $0.value.startedAt < window }
        if windows.count >= configuration.maxAddresses, let oldest = windows.min(by: { $0.value.startedAt < $1.value.startedAt })?.key {
            windows[oldest] = nil
        }
    }
}
