/// Per-client token buckets for the request rate limits. Pure: `now` is passed in (seconds).
public struct RateLimiter<Client: Hashable & Sendable>: Sendable {
    private struct Bucket: Sendable {
        var tokens: Double
        var updated: Double
    }

    /// Requests per second refilled.
    public let ratePerSecond: Double
    /// Bucket size (the burst a client may send at once).
    public let burst: Double
    private var buckets: [Client: Bucket] = [:]

    /// Creates a limiter; a rate of 0 disables it.
    public init(ratePerSecond: Double, burst: Double) {
        self.ratePerSecond = ratePerSecond
        self.burst = max(1, burst)
    }

    /// Takes one request from `client`'s bucket. Returns `nil` when allowed, or the seconds to
    /// wait before the next request would be allowed (for `Retry-After`).
    public mutating func take(_ client: Client, now: Double) -> Double? {
        guard ratePerSecond > 0 else { return nil }
        let (burst, rate) = (burst, ratePerSecond)
        // Changed in place: one hash lookup, and the table is never copied.
        return Self.take(&buckets[client, default: Bucket(tokens: burst, updated: now)], burst: burst, rate: rate, now: now)
    }

    private static func take(_ bucket: inout Bucket, burst: Double, rate: Double, now: Double) -> Double? {
        bucket.tokens = min(burst, bucket.tokens + max(0, now - bucket.updated) * rate)
        bucket.updated = now
        if bucket.tokens >= 1 {
            bucket.tokens -= 1
            return nil
        }
        return (1 - bucket.tokens) / rate
    }

    /// Forgets clients whose buckets are full again (idle), bounding memory.
    public mutating func sweep(now: Double) {
        buckets = buckets.filter { min(burst, $0.value.tokens + (now - $0.value.updated) * ratePerSecond) < burst }
    }

    /// Number of tracked clients.
    public var trackedClients: Int { buckets.count }
}

/// Every keyset's rate-limit buckets: for publishes and for other non-subscribe requests, each
/// kept twice — per client (its `uuid`, else its address) and per address (every uuid from one
/// address together). Pure: the caller serialises access and passes `now` (seconds).
///
/// A request changes its buckets in place, so its cost does not grow with the number of clients
/// tracked (a copy of a keyset's buckets per request made it linear in them).
public struct RateLimitTable: Sendable {
    /// What a request counts against.
    public enum Kind: Sendable { case publish, request }

    /// The rates and bursts of one keyset; a rate of 0 disables that limit.
    public struct Rates: Sendable, Equatable {
        public var publishPerSecond: Double
        public var publishBurst: Double
        public var requestPerSecond: Double
        public var requestBurst: Double
        public var publishPerAddress: Double
        public var publishBurstPerAddress: Double
        public var requestPerAddress: Double
        public var requestBurstPerAddress: Double

        /// Creates the rates of one keyset.
        public init(publishPerSecond: Double, publishBurst: Double, requestPerSecond: Double, requestBurst: Double,
                    publishPerAddress: Double, publishBurstPerAddress: Double, requestPerAddress: Double,
                    requestBurstPerAddress: Double) {
            self.publishPerSecond = publishPerSecond
            self.publishBurst = publishBurst
            self.requestPerSecond = requestPerSecond
            self.requestBurst = requestBurst
            self.publishPerAddress = publishPerAddress
            self.publishBurstPerAddress = publishBurstPerAddress
            self.requestPerAddress = requestPerAddress
            self.requestBurstPerAddress = requestBurstPerAddress
        }
    }

    /// A client's bucket key: its uuid, or its address when it sent none (kept apart, so a uuid
    /// that reads like an address is never the same client as that address).
    public enum Client: Hashable, Sendable {
        case uuid(String)
        case address(String)
    }

    private struct Limiters: Sendable {
        var publish: RateLimiter<Client>
        var request: RateLimiter<Client>
        var publishByAddress: RateLimiter<String>
        var requestByAddress: RateLimiter<String>

        init(_ rates: Rates) {
            publish = RateLimiter(ratePerSecond: rates.publishPerSecond, burst: rates.publishBurst)
            request = RateLimiter(ratePerSecond: rates.requestPerSecond, burst: rates.requestBurst)
            publishByAddress = RateLimiter(ratePerSecond: rates.publishPerAddress, burst: rates.publishBurstPerAddress)
            requestByAddress = RateLimiter(ratePerSecond: rates.requestPerAddress, burst: rates.requestBurstPerAddress)
        }

        mutating func take(_ kind: Kind, client: Client, address: String, now: Double) -> Double? {
            switch kind {
            case .publish:
                if let wait = publishByAddress.take(address, now: now) { return wait }
                return publish.take(client, now: now)
            case .request:
                if let wait = requestByAddress.take(address, now: now) { return wait }
                return request.take(client, now: now)
            }
        }

        mutating func sweep(now: Double) {
            publish.sweep(now: now)
            request.sweep(now: now)
            publishByAddress.sweep(now: now)
            requestByAddress.sweep(now: now)
        }

        var trackedBuckets: Int {
            publish.trackedClients + request.trackedClients + publishByAddress.trackedClients + requestByAddress.trackedClients
        }
    }

    private var keysets: [String: Limiters] = [:]

    /// Creates an empty table.
    public init() {}

    /// Takes one request for the client (`uuid`, else its address) and for its address in the
    /// keyset of `subscribeKey`; returns seconds to wait (for `Retry-After`) when either is over
    /// its limit. `rates` is read only for a keyset's first request: its buckets keep the rates
    /// they were made with.
    public mutating func take(_ kind: Kind, uuid: String?, address: String, subscribeKey: String,
                              rates: @autoclosure () -> Rates, now: Double) -> Double? {
        let client = uuid.map(Client.uuid) ?? .address(address)
        // In place (the dictionary's defaulting accessor): the keyset's buckets are not copied.
        return keysets[subscribeKey, default: Limiters(rates())].take(kind, client: client, address: address, now: now)
    }

    /// Forgets idle clients (buckets full again).
    public mutating func sweep(now: Double) {
        for key in Array(keysets.keys) { keysets[key]?.sweep(now: now) }
    }

    /// Number of buckets held.
    public var trackedBuckets: Int { keysets.values.reduce(0) { $0 + $1.trackedBuckets } }
}
