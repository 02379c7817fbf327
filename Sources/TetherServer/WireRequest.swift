import TetherProtocol

/// A request line split the way pubnub-wire §1.2 requires: the raw path is split on `/`
/// first and each segment percent-decoded afterwards, so an encoded `/` inside a channel
/// name or GET message survives. Query values are decoded with `+` kept literal.
struct WireRequest: Sendable {
    /// Decoded path segments (the empty segment before the leading `/` dropped).
    var segments: [String]
    /// Decoded query parameters; a repeated key keeps its last value.
    var query: [String: String]
    /// Query keys given without `=` (`ee`).
    var flags: Set<String>

    enum ParseError: Error {
        case badEncoding(String)
    }

    init(rawPath: String, rawQuery: String?) throws(ParseError) {
        var segments: [String] = []
        for raw in rawPath.split(separator: "/", omittingEmptySubsequences: false).dropFirst() {
            guard let decoded = PercentCoding.decode(raw) else { throw .badEncoding("path segment is not valid percent-encoded UTF-8") }
            segments.append(decoded)
        }
        if segments.last == "" && segments.count > 1 { segments.removeLast() }
        self.segments = segments
        var query: [String: String] = [:]
        var flags: Set<String> = []
        if let rawQuery, !rawQuery.isEmpty {
            for pair in rawQuery.split(separator: "&") {
                if let equals = pair.firstIndex(of: "=") {
                    guard let key = PercentCoding.decode(pair[..<equals]),
                          let value = PercentCoding.decode(pair[pair.index(after: equals)...])
                    else { throw .badEncoding("query parameter is not valid percent-encoded UTF-8") }
                    query[key] = value
                } else {
                    guard let key = PercentCoding.decode(pair) else { throw .badEncoding("query parameter is not valid percent-encoded UTF-8") }
                    flags.insert(key)
                }
            }
        }
        self.query = query
        self.flags = flags
    }

    /// A boolean query flag: `true`/`1` are true.
    func bool(_ name: String) -> Bool {
        guard let value = query[name] else { return false }
        return value == "1" || value.lowercased() == "true"
    }

    /// A comma-separated name list (`,` alone or empty means none).
    static func names(_ text: String?) -> [String] {
        guard let text else { return [] }
        return text.split(separator: ",", omittingEmptySubsequences: true).map(String.init)
    }
}
