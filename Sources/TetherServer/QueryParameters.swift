/// A request's decoded query parameters, in the order they were sent.
///
/// A wire request carries a handful of parameters (a subscribe: `uuid`, `tt`, `tr`, `pnsdk`,
/// `heartbeat`), and each route reads a few of them once. A lookup therefore walks the pairs
/// instead of hashing: a dictionary cost every request a table, a hashed key per parameter
/// and a hashed key per read (docs/benchmarks.md, sixteenth pass). A repeated key's last value
/// is the one read, as PubNub reads it. A request with more than ``indexedAbove`` parameters
/// (SDKs never send that many; a hostile client can send thousands, up to the keyset's URI
/// limit) also gets an index of each key's last pair, so a read never walks them all.
struct QueryParameters: Sendable, Equatable, ExpressibleByDictionaryLiteral {
    private struct Pair: Sendable {
        var key: String
        var value: String
    }

    /// Above this many pairs, reads go through ``lastIndex`` instead of walking the pairs.
    static let indexedAbove = 16

    /// Every pair as sent, repeats included (reads look from the end).
    private var pairs: [Pair] = []
    /// Each key's last pair, once there are more than ``indexedAbove`` pairs; `nil` below.
    private var lastIndex: [String: Int]?

    init() {}

    init(dictionaryLiteral elements: (String, String)...) {
        pairs = elements.map { Pair(key: $0.0, value: $0.1) }
        reindex()
    }

    /// Room for `count` pairs before they are appended.
    mutating func reserveCapacity(_ count: Int) { pairs.reserveCapacity(count) }

    /// Adds a pair as it was sent; a later one with the same key is the one read.
    mutating func append(_ key: String, _ value: String) {
        pairs.append(Pair(key: key, value: value))
        if lastIndex != nil {
            lastIndex![key] = pairs.count - 1
        } else if pairs.count > Self.indexedAbove {
            reindex()
        }
    }

    /// The value of `key` (the last one sent), or `nil`. Setting replaces every value the key
    /// had; setting `nil` removes the key.
    subscript(key: String) -> String? {
        get {
            if let lastIndex { return lastIndex[key].map { pairs[$0].value } }
            var index = pairs.endIndex
            while index > pairs.startIndex {
                index -= 1
                if pairs[index].key == key { return pairs[index].value }
            }
            return nil
        }
        set {
            pairs.removeAll { $0.key == key }
            if let newValue { pairs.append(Pair(key: key, value: newValue)) }
            reindex()
        }
    }

    /// Builds ``lastIndex`` when there are more than ``indexedAbove`` pairs, or drops it.
    private mutating func reindex() {
        guard pairs.count > Self.indexedAbove else {
            lastIndex = nil
            return
        }
        var index: [String: Int] = [:]
        index.reserveCapacity(pairs.count)
        for (offset, pair) in pairs.enumerated() { index[pair.key] = offset }
        lastIndex = index
    }

    /// Whether no parameter was sent.
    var isEmpty: Bool { pairs.isEmpty }

    /// What a request reads: each key with its last value.
    var dictionary: [String: String] {
        Dictionary(pairs.map { ($0.key, $0.value) }, uniquingKeysWith: { _, last in last })
    }

    /// Equal when every key reads the same value (repeats and order aside).
    static func == (lhs: QueryParameters, rhs: QueryParameters) -> Bool { lhs.dictionary == rhs.dictionary }
}
