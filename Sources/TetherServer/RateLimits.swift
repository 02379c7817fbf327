import Foundation
import Synchronization
import TetherServerCore

/// Per-keyset token buckets for publishes and other non-subscribe requests, kept twice: per
/// client (its `uuid`, else its address) and per address (every uuid from one address together).
///
/// A client that floods gets 429s while everyone else — and every subscriber's deliveries —
/// proceed untouched; a client that rotates uuids still meets its address's bucket. Subscribes
/// are never rate-limited (a long-poll is one request per response). Idle buckets are swept, so
/// memory follows the number of recently active clients; a request's cost does not
/// (``RateLimitTable``).
final class RateLimits: Sendable {
    typealias Kind = RateLimitTable.Kind

    private let table: Mutex<RateLimitTable>
    /// Seconds on a monotonic clock (injectable for tests).
    private let clock: @Sendable () -> Double
    /// Whether any limit applies (`rateLimiting: false` in the configuration turns every one off).
    let enabled: Bool

    init(enabled: Bool = true, clock: (@Sendable () -> Double)? = nil) {
        table = Mutex(RateLimitTable())
        self.enabled = enabled
        let start = ContinuousClock.now
        self.clock = clock ?? {
            let elapsed = ContinuousClock.now - start
            return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        }
    }

    private var now: Double { clock() }

    /// Takes one request for the client (`uuid`, else its address) and for its address; returns
    /// seconds to wait (for `Retry-After`) when either is over its limit. `address` is read only
    /// when limits are on, `limits` only for a keyset's first request.
    func take(_ kind: Kind, uuid: String?, address: @autoclosure () -> String, subscribeKey: String,
              limits: @autoclosure () -> Limits) -> Double? {
        guard enabled else { return nil }
        let address = address()
        let now = self.now
        return table.withLock {
            $0.take(kind, uuid: uuid, address: address, subscribeKey: subscribeKey, rates: limits().rates, now: now)
        }
    }

    /// Forgets idle clients.
    func sweep() {
        let now = self.now
        table.withLock { $0.sweep(now: now) }
    }

    /// Number of buckets held (for tests and metrics).
    var trackedBuckets: Int { table.withLock { $0.trackedBuckets } }
}

extension Limits {
    /// The rate limits of these limits, for ``RateLimitTable``.
    var rates: RateLimitTable.Rates {
        RateLimitTable.Rates(publishPerSecond: publishRatePerSecond, publishBurst: publishBurst,
                             requestPerSecond: requestRatePerSecond, requestBurst: requestBurst,
                             publishPerAddress: publishRatePerAddress, publishBurstPerAddress: publishBurstPerAddress,
                             requestPerAddress: requestRatePerAddress, requestBurstPerAddress: requestBurstPerAddress)
    }
}
