import TetherProtocol

/// A request line split the way pubnub-wire §1.2 requires: the raw path is split on `/`
/// first and each segment percent-decoded afterwards, so an encoded `/` inside a channel
/// name or GET message survives. Query values are decoded with `+` kept literal.
struct WireRequest: Sendable {
    /// Decoded path segments (the empty segment before the leading `/` dropped).
    var segments: [String]
    /// Decoded query parameters; a repeated key reads as its last value.
    var query: QueryParameters
    /// Query keys given without `=` (`ee`), in the order sent.
    var flags: [String]
    /// Path segments as sent (still percent-encoded).
    var rawSegments: [Substring]
    /// Length of the request URI in bytes (for the keyset's URI limit).
    var uriLength = 0
    /// The path as sent (still percent-encoded), for signature checks.
    var rawPath: String
    /// The query as sent, for signature checks.
    var rawQuery: String?

    enum ParseError: Error {
        case badEncoding(String)
    }

    init(rawPath: String, rawQuery: String?) throws(ParseError) {
        var segments: [String] = []
        var rawSegments = Self.split(rawPath[...], on: UInt8(ascii: "/"), omittingEmpty: false)
        if !rawSegments.isEmpty { rawSegments.removeFirst() }
        segments.reserveCapacity(rawSegments.count)
        for raw in rawSegments {
            guard let decoded = PercentCoding.decode(raw) else { throw .badEncoding("path segment is not valid percent-encoded UTF-8") }
            segments.append(decoded)
        }
        if segments.last == "" && segments.count > 1 {
            segments.removeLast()
            rawSegments.removeLast()
        }
        self.segments = segments
        self.rawSegments = rawSegments
        var query = QueryParameters()
        var flags: [String] = []
        if let rawQuery, !rawQuery.isEmpty {
            let pairs = Self.split(rawQuery[...], on: UInt8(ascii: "&"), omittingEmpty: true)
            query.reserveCapacity(pairs.count)
            for pair in pairs {
                if let equals = pair.utf8.firstIndex(of: UInt8(ascii: "=")) {
                    let rawValue = pair[pair.utf8.index(after: equals)...]
                    guard let key = PercentCoding.decode(pair[..<equals]), let value = PercentCoding.decode(rawValue)
                    else { throw .badEncoding("query parameter is not valid percent-encoded UTF-8") }
                    query.append(key, value)
                } else {
                    guard let key = PercentCoding.decode(pair) else { throw .badEncoding("query parameter is not valid percent-encoded UTF-8") }
                    flags.append(key)
                }
            }
        }
        self.query = query
        self.flags = flags
        self.rawPath = rawPath
        self.rawQuery = rawQuery
    }

    /// A boolean query flag: `true`/`1` are true.
    func bool(_ name: String) -> Bool {
        guard let value = query[name] else { return false }
        return value == "1" || value.lowercased() == "true"
    }

    /// The name list in path segment `index`: split on raw commas first, then each name
    /// decoded (pubnub-wire §1.2), so an encoded comma stays inside a name (and is refused by
    /// name validation). `,` alone means none.
    func pathNames(_ index: Int) -> [String] {
        Self.split(rawSegments[index])
    }

    /// A comma-separated name list in a query parameter, split before decoding.
    func queryNames(_ key: String) -> [String] {
        guard let raw = rawQueryValue(key) else { return [] }
        return Self.split(raw)
    }

    /// Query parameter `key`'s value as sent (still percent-encoded); a repeated key's last.
    /// Looked up in ``rawQuery`` when asked (only name lists need it), not kept for every
    /// request.
    func rawQueryValue(_ key: String) -> Substring? {
        guard query[key] != nil, let rawQuery else { return nil }
        var found: Substring?
        for pair in Self.split(rawQuery[...], on: UInt8(ascii: "&"), omittingEmpty: true) {
            guard let equals = pair.utf8.firstIndex(of: UInt8(ascii: "=")), PercentCoding.decode(pair[..<equals]) == key else { continue }
            found = pair[pair.utf8.index(after: equals)...]
        }
        return found
    }

    /// Every value query parameter `key` has, decoded, in the order sent (a repeated key, as
    /// the JavaScript SDK sends an array: `sort=a&sort=b`).
    func queryValues(_ key: String) -> [String] {
        guard query[key] != nil, let rawQuery else { return [] }
        var values: [String] = []
        for pair in Self.split(rawQuery[...], on: UInt8(ascii: "&"), omittingEmpty: true) {
            guard let equals = pair.utf8.firstIndex(of: UInt8(ascii: "=")), PercentCoding.decode(pair[..<equals]) == key else { continue }
            let raw = pair[pair.utf8.index(after: equals)...]
            values.append(PercentCoding.decode(raw) ?? String(raw))
        }
        return values
    }

    private static func split(_ raw: Substring) -> [String] {
        split(raw, on: UInt8(ascii: ","), omittingEmpty: true).map { PercentCoding.decode($0) ?? String($0) }
    }

    /// Splits on an ASCII byte, walking UTF-8 (not `Character`s: a request's delimiters are
    /// bytes, and grapheme breaking cost a subscribe cycle several microseconds).
    static func split(_ text: Substring, on delimiter: UInt8, omittingEmpty: Bool) -> [Substring] {
        let utf8 = text.utf8
        if let parts = utf8.withContiguousStorageIfAvailable({ bytes in
            // The bytes in place, and the array sized before it fills: walking the view's
            // indices and growing the array were most of a request line's parse.
            var delimiters = 0
            for byte in bytes where byte == delimiter { delimiters += 1 }
            var parts: [Substring] = []
            parts.reserveCapacity(delimiters + 1)
            let base = utf8.startIndex
            var start = 0
            for offset in bytes.indices where bytes[offset] == delimiter {
                if !omittingEmpty || start != offset {
                    parts.append(text[utf8.index(base, offsetBy: start)..<utf8.index(base, offsetBy: offset)])
                }
                start = offset + 1
            }
            if !omittingEmpty || start != bytes.count { parts.append(text[utf8.index(base, offsetBy: start)...]) }
            return parts
        }) {
            return parts
        }
        // Only text whose bytes are not stored contiguously (a bridged string) gets here; a
        // native copy's are.
        return split(Substring(String(text)), on: delimiter, omittingEmpty: omittingEmpty)
    }
}
