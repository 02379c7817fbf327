public import CoreMetrics
import Metrics
import Synchronization

/// The server's metrics, created from an explicit factory so tests and embedded servers never
/// depend on the process-wide `MetricsSystem` bootstrap.
///
/// Exposed at `/metrics` in Prometheus text format when the server is given a registry.
///
/// A class: the server's state, the hub and every long-poll's gone-handler hold it, and a copy
/// of a struct of ten references retained and released each of them (~1 % of a subscribe cycle).
public final class ServerMetrics: Sendable {
    private let factory: any MetricsFactory
    private let deliveries: Counter
    private let openLongPolls: Meter
    private let storeWrite: Timer
    private let storeRead: Timer
    private let storeBatch: Recorder
    private let dedupHits: Counter
    private let dedupEvictions: Counter
    private let dedupEntries: Gauge
    /// Per-request and per-publish counters by their dimensions, made once: making a counter
    /// goes through the factory's registry (a lookup under its lock and a label check), which
    /// was ~1 % of a request's CPU.
    private let counters = CounterCache()

    /// Creates the metrics on `factory` (defaults to the bootstrapped system).
    public init(factory: any MetricsFactory = MetricsSystem.factory) {
        self.factory = factory
        deliveries = Counter(label: "tether_deliveries_total", factory: factory)
        openLongPolls = Meter(label: "tether_open_long_polls", factory: factory)
        storeWrite = Timer(label: "tether_store_write_seconds", factory: factory)
        storeRead = Timer(label: "tether_store_read_seconds", factory: factory)
        storeBatch = Recorder(label: "tether_store_write_batch_size", factory: factory)
        dedupHits = Counter(label: "tether_dedup_hits_total", factory: factory)
        dedupEvictions = Counter(label: "tether_dedup_evictions_total", factory: factory)
        dedupEntries = Gauge(label: "tether_dedup_entries", factory: factory)
    }

    /// Counts a publish answered as a repeat of an earlier one with the same request id.
    public func recordDedupHit() { dedupHits.increment() }

    /// The publishes remembered for deduplication, and how many the entry bound forgot before
    /// their window ended (docs/operations.md, "Bounds").
    public func recordDeduplication(entries: Int, evicted: Int) {
        dedupEntries.record(entries)
        if evicted > 0 { dedupEvictions.increment(by: evicted) }
    }

    /// How close the server is to its configured bounds (docs/operations.md, "Bounds"): bytes and
    /// channels held by the in-memory windows, presence memberships, rate-limit buckets.
    public func recordBounds(windowBytes: Int, windows: Int, presenceMemberships: Int, rateLimitBuckets: Int) {
        Gauge(label: "tether_window_bytes", factory: factory).record(windowBytes)
        Gauge(label: "tether_windows", factory: factory).record(windows)
        Gauge(label: "tether_presence_memberships", factory: factory).record(presenceMemberships)
        Gauge(label: "tether_rate_limit_buckets", factory: factory).record(rateLimitBuckets)
    }

    /// Cluster mode: `events` entries read from the shared log, and how far behind the clock
    /// the node's visible cursor is (`seconds`; about a second when idle, growing while the
    /// reader cannot read).
    public func recordSharedLogRead(events: Int, lagSeconds: Double) {
        if events > 0 { Counter(label: "tether_shared_log_entries_total", factory: factory).increment(by: events) }
        Gauge(label: "tether_shared_log_lag_seconds", factory: factory).record(max(0, lagSeconds))
    }

    /// Cluster mode: a failed shared-log `operation` (`write`, `read`).
    public func recordSharedLogError(_ operation: String) {
        counters.counter(CounterCache.Key(label: "tether_shared_log_errors_total", first: operation, second: 0)) {
            Counter(label: "tether_shared_log_errors_total", dimensions: [("operation", operation)], factory: factory)
        }.increment()
    }

    /// Counts one request to `endpoint` answered with `status`.
    public func recordRequest(endpoint: String, status: Int) {
        counters.counter(CounterCache.Key(label: "tether_requests_total", first: endpoint, second: status)) {
            Counter(label: "tether_requests_total", dimensions: [("endpoint", endpoint), ("status", String(status))], factory: factory)
        }.increment()
    }

    /// Counts an accepted publish (message, signal or fire).
    public func recordPublish(kind: String) {
        counters.counter(CounterCache.Key(label: "tether_publishes_total", first: kind, second: 0)) {
            Counter(label: "tether_publishes_total", dimensions: [("kind", kind)], factory: factory)
        }.increment()
    }

    /// Counts one push notification's outcome (`sent`, `failed`, `retried`, `unregistered`,
    /// `dropped`) per provider (`apns`, `fcm`, `webhook`, or `queue` for a full queue).
    public func recordPush(provider: String, outcome: String) {
        Counter(label: "tether_push_total", dimensions: [("provider", provider), ("outcome", outcome)], factory: factory).increment()
    }

    /// Counts envelopes delivered in subscribe responses.
    public func recordDeliveries(_ count: Int) {
        if count > 0 { deliveries.increment(by: count) }
    }

    /// Tracks the number of long-polls currently waiting.
    public func longPollStarted() { openLongPolls.increment() }
    /// Tracks the number of long-polls currently waiting.
    public func longPollEnded() { openLongPolls.decrement() }

    /// Records one group-commit transaction.
    public func recordStoreWrite(duration: Duration, batchSize: Int) {
        storeWrite.recordNanoseconds(duration.nanoseconds)
        storeBatch.record(batchSize)
    }

    /// Records one store read.
    public func recordStoreRead(duration: Duration) {
        storeRead.recordNanoseconds(duration.nanoseconds)
    }
}

/// Counters by label and dimensions, each made on first use. Bounded by what keys can exist
/// (endpoints and statuses are the server's own names and codes, never client text).
private final class CounterCache: Sendable {
    struct Key: Hashable {
        var label: String
        var first: String
        var second: Int
    }

    private let counters = Mutex<[Key: Counter]>([:])
    /// Counters kept at most; past it a counter is made through the factory every time.
    private static let capacity = 4096

    func counter(_ key: Key, make: () -> Counter) -> Counter {
        if let counter = counters.withLock({ $0[key] }) { return counter }
        let counter = make()
        counters.withLock { if $0.count < Self.capacity { $0[key] = counter } }
        return counter
    }
}

extension Duration {
    var nanoseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
}
