import Foundation
import Synchronization
import TetherServerCore

/// Per-keyset, per-client token buckets for publishes and other non-subscribe requests.
///
/// Each client has its own bucket, so a client that floods gets 429s while everyone else —
/// and every subscriber's deliveries — proceed untouched. Subscribes are never rate-limited
/// (a long-poll is one request per response).
final class RateLimits: Sendable {
    enum Kind: Sendable { case publish, request }

    private struct Limiters {
        var publish: RateLimiter
        var request: RateLimiter
    }

    private let limiters: Mutex<[String: Limiters]>
    private let start = ContinuousClock.now

    init() { limiters = Mutex([:]) }

    /// Takes one request for `client`; returns seconds to wait (for `Retry-After`) when over the limit.
    func take(_ kind: Kind, client: String, subscribeKey: String, limits: Limits) -> Double? {
        let rate = kind == .publish ? limits.publishRatePerSecond : limits.requestRatePerSecond
        guard rate > 0 else { return nil }
        let elapsed = ContinuousClock.now - start
        let now = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        return limiters.withLock { all in
            var entry = all[subscribeKey] ?? Limiters(
                publish: RateLimiter(ratePerSecond: limits.publishRatePerSecond, burst: limits.publishBurst),
                request: RateLimiter(ratePerSecond: limits.requestRatePerSecond, burst: limits.requestBurst))
            let wait = kind == .publish ? entry.publish.take(client, now: now) : entry.request.take(client, now: now)
            all[subscribeKey] = entry
            return wait
        }
    }

    /// Forgets idle clients.
    func sweep() {
        let elapsed = ContinuousClock.now - start
        let now = Double(elapsed.components.seconds)
        limiters.withLock { all in
            for key in all.keys {
                all[key]?.publish.sweep(now: now)
                all[key]?.request.sweep(now: now)
            }
        }
    }
}
