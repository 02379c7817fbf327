import TetherProtocol
/// The pure half of request signing (pubnub-wire §12): which parameters are added and which
/// text is signed. The HMAC-SHA256 itself is computed by the client with the secret key.
package enum RequestSigning {
    /// Adds `timestamp` to `request` and returns the v2 string to sign:
    /// `METHOD\npub_key\npath\ncanonical_query\nbody`.
    package static func prepare(_ request: inout RequestSpec, publishKey: String, unixSeconds: Int64) -> String {
        request.query.removeAll { $0.name == "signature" || $0.name == "timestamp" }
        request.append("timestamp", String(unixSeconds))
        let canonical = canonicalQuery(request.query)
        let body = request.body.map { String(decoding: $0, as: UTF8.self) } ?? ""
        return "\(request.method.rawValue)\n\(publishKey)\n\(request.path)\n\(canonical)\n\(body)"
    }

    /// Every parameter except `signature`, sorted by name, values encoded with only
    /// `A-Z a-z 0-9 - _ .` left raw, joined with `&`.
    package static func canonicalQuery(_ items: [QueryItem]) -> String {
        items.filter { $0.name != "signature" }
            .sorted { ($0.name, $0.value) < ($1.name, $1.value) }
            .map { "\($0.name)=\(PercentCoding.encodeForSignature($0.value))" }
            .joined(separator: "&")
    }

    /// The signature value from the raw HMAC: `v2.` + URL-safe base64 without padding.
    package static func signatureValue(hmac: [UInt8]) -> String {
        "v2." + Base64.encode(hmac).replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }
}

extension String {
    func replacingOccurrences(of target: Character, with replacement: String) -> String {
        var out = ""
        for c in self { if c == target { out += replacement } else { out.append(c) } }
        return out
    }
}

