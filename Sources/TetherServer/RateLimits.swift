import Foundation
import Synchronization
import TetherServerCore

/// Per-keyset token buckets for publishes and other non-subscribe requests, kept twice: per
/// client (its `uuid`, else its address) and per address (every uuid from one address together).
///
/// A client that floods gets 429s while everyone else — and every subscriber's deliveries —
/// proceed untouched; a client that rotates uuids still meets its address's bucket. Subscribes
/// are never rate-limited (a long-poll is one request per response). Idle buckets are swept, so
/// memory follows the number of recently active clients.
final class RateLimits: Sendable {
    enum Kind: Sendable { case publish, request }

    private struct Limiters {
        var publish: RateLimiter
        var request: RateLimiter
        var publishByAddress: RateLimiter
        var requestByAddress: RateLimiter

        init(_ limits: Limits) {
            publish = RateLimiter(ratePerSecond: limits.publishRatePerSecond, burst: limits.publishBurst)
            request = RateLimiter(ratePerSecond: limits.requestRatePerSecond, burst: limits.requestBurst)
            publishByAddress = RateLimiter(ratePerSecond: limits.publishRatePerAddress, burst: limits.publishBurstPerAddress)
            requestByAddress = RateLimiter(ratePerSecond: limits.requestRatePerAddress, burst: limits.requestBurstPerAddress)
        }
    }

    private let limiters: Mutex<[String: Limiters]>
    /// Seconds on a monotonic clock (injectable for tests).
    private let clock: @Sendable () -> Double
    /// Whether any limit applies (`rateLimiting: false` in the configuration turns every one off).
    let enabled: Bool

    init(enabled: Bool = true, clock: (@Sendable () -> Double)? = nil) {
        limiters = Mutex([:])
        self.enabled = enabled
        let start = ContinuousClock.now
        self.clock = clock ?? {
            let elapsed = ContinuousClock.now - start
            return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        }
    }

    private var now: Double { clock() }

    /// Takes one request for the client (`uuid`, else its address) and for its address; returns
    /// seconds to wait (for `Retry-After`) when either is over its limit.
    func take(_ kind: Kind, uuid: String?, address: String, subscribeKey: String, limits: Limits) -> Double? {
        guard enabled else { return nil }
        let client = uuid.map { "u:" + $0 } ?? "a:" + address
        let now = self.now
        return limiters.withLock { all in
            var entry = all[subscribeKey] ?? Limiters(limits)
            defer { all[subscribeKey] = entry }
            switch kind {
            case .publish:
                if let wait = entry.publishByAddress.take(address, now: now) { return wait }
                return entry.publish.take(client, now: now)
            case .request:
                if let wait = entry.requestByAddress.take(address, now: now) { return wait }
                return entry.request.take(client, now: now)
            }
        }
    }

    /// Forgets idle clients.
    func sweep() {
        let now = self.now
        limiters.withLock { all in
            for key in all.keys {
                all[key]?.publish.sweep(now: now)
                all[key]?.request.sweep(now: now)
                all[key]?.publishByAddress.sweep(now: now)
                all[key]?.requestByAddress.sweep(now: now)
            }
        }
    }

    /// Number of buckets held (for tests and metrics).
    var trackedBuckets: Int {
        limiters.withLock { all in
            all.values.reduce(0) { $0 + $1.publish.trackedClients + $1.request.trackedClients
                + $1.publishByAddress.trackedClients + $1.requestByAddress.trackedClients }
        }
    }
}
