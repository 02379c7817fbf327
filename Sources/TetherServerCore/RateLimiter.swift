/// Per-client token buckets for the request rate limits. Pure: `now` is passed in (seconds).
public struct RateLimiter: Sendable {
    private struct Bucket: Sendable {
        var tokens: Double
        var updated: Double
    }

    /// Requests per second refilled.
    public let ratePerSecond: Double
    /// Bucket size (the burst a client may send at once).
    public let burst: Double
    private var buckets: [String: Bucket] = [:]

    /// Creates a limiter; a rate of 0 disables it.
    public init(ratePerSecond: Double, burst: Double) {
        self.ratePerSecond = ratePerSecond
        self.burst = max(1, burst)
    }

    /// Takes one request from `client`'s bucket. Returns `nil` when allowed, or the seconds to
    /// wait before the next request would be allowed (for `Retry-After`).
    public mutating func take(_ client: String, now: Double) -> Double? {
        guard ratePerSecond > 0 else { return nil }
        var bucket = buckets[client] ?? Bucket(tokens: burst, updated: now)
        bucket.tokens = min(burst, bucket.tokens + max(0, now - bucket.updated) * ratePerSecond)
        bucket.updated = now
        if bucket.tokens >= 1 {
            bucket.tokens -= 1
            buckets[client] = bucket
            return nil
        }
        buckets[client] = bucket
        return (1 - bucket.tokens) / ratePerSecond
    }

    /// Forgets clients whose buckets are full again (idle), bounding memory.
    public mutating func sweep(now: Double) {
        buckets = buckets.filter { min(burst, $0.value.tokens + (now - $0.value.updated) * ratePerSecond) < burst }
    }

    /// Number of tracked clients.
    public var trackedClients: Int { buckets.count }
}
