/// The pure half of request signing (pubnub-wire §12): which parameters are added and which
/// text is signed. The HMAC-SHA256 itself is computed by the client with the secret key.
public enum RequestSigning {
    /// Adds `timestamp` to `request` and returns the v2 string to sign:
    /// `METHOD\npub_key\npath\ncanonical_query\nbody`.
    public static func prepare(_ request: inout RequestSpec, publishKey: String, unixSeconds: Int64) -> String {
        request.query.removeAll { $0.name == "signature" || $0.name == "timestamp" }
        request.append("timestamp", String(unixSeconds))
        let canonical = canonicalQuery(request.query)
        let body = request.body.map { String(decoding: $0, as: UTF8.self) } ?? ""
        return "\(request.method.rawValue)\n\(publishKey)\n\(request.path)\n\(canonical)\n\(body)"
    }

    /// Every parameter except `signature`, sorted by name, values encoded with only
    /// `A-Z a-z 0-9 - _ .` left raw, joined with `&`.
    public static func canonicalQuery(_ items: [QueryItem]) -> String {
        items.filter { $0.name != "signature" }
            .sorted { ($0.name, $0.value) < ($1.name, $1.value) }
            .map { "\($0.name)=\(encode($0.value))" }
            .joined(separator: "&")
    }

    /// The signature value from the raw HMAC: `v2.` + URL-safe base64 without padding.
    public static func signatureValue(hmac: [UInt8]) -> String {
        "v2." + Base64.encode(hmac).replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    static func encode(_ value: String) -> String {
        let hex = Array("0123456789ABCDEF".utf8)
        var out: [UInt8] = []
        for byte in value.utf8 {
            if (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
                || byte == 0x2D || byte == 0x5F || byte == 0x2E
            {
                out.append(byte)
            } else {
                out.append(0x25)
                out.append(hex[Int(byte >> 4)])
                out.append(hex[Int(byte & 0x0F)])
            }
        }
        return String(decoding: out, as: UTF8.self)
    }
}

extension String {
    func replacingOccurrences(of target: Character, with replacement: String) -> String {
        var out = ""
        for c in self { if c == target { out += replacement } else { out.append(c) } }
        return out
    }
}

/// Standard base64 (RFC 4648) without Foundation.
public enum Base64 {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    /// Encodes bytes with padding.
    public static func encode(_ bytes: some Collection<UInt8>) -> String {
        let input = Array(bytes)
        var out: [UInt8] = []
        out.reserveCapacity((input.count + 2) / 3 * 4)
        var i = 0
        while i + 3 <= input.count {
            let n = UInt32(input[i]) << 16 | UInt32(input[i + 1]) << 8 | UInt32(input[i + 2])
            out += [alphabet[Int(n >> 18 & 63)], alphabet[Int(n >> 12 & 63)], alphabet[Int(n >> 6 & 63)], alphabet[Int(n & 63)]]
            i += 3
        }
        let rest = input.count - i
        if rest == 1 {
            let n = UInt32(input[i]) << 16
            out += [alphabet[Int(n >> 18 & 63)], alphabet[Int(n >> 12 & 63)], 0x3D, 0x3D]
        } else if rest == 2 {
            let n = UInt32(input[i]) << 16 | UInt32(input[i + 1]) << 8
            out += [alphabet[Int(n >> 18 & 63)], alphabet[Int(n >> 12 & 63)], alphabet[Int(n >> 6 & 63)], 0x3D]
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Decodes standard or URL-safe base64; padding optional; whitespace ignored. `nil` if invalid.
    public static func decode(_ text: String) -> [UInt8]? {
        var values: [UInt8] = []
        for byte in text.utf8 {
            switch byte {
            case 0x41...0x5A: values.append(byte - 0x41)
            case 0x61...0x7A: values.append(byte - 0x61 + 26)
            case 0x30...0x39: values.append(byte - 0x30 + 52)
            case 0x2B, 0x2D: values.append(62)
            case 0x2F, 0x5F: values.append(63)
            case 0x3D, 0x20, 0x0A, 0x0D, 0x09: continue
            default: return nil
            }
        }
        if values.count % 4 == 1 { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(values.count * 3 / 4)
        var i = 0
        while i + 4 <= values.count {
            let n = UInt32(values[i]) << 18 | UInt32(values[i + 1]) << 12 | UInt32(values[i + 2]) << 6 | UInt32(values[i + 3])
            out += [UInt8(n >> 16 & 0xFF), UInt8(n >> 8 & 0xFF), UInt8(n & 0xFF)]
            i += 4
        }
        let rest = values.count - i
        if rest == 2 {
            let n = UInt32(values[i]) << 18 | UInt32(values[i + 1]) << 12
            out.append(UInt8(n >> 16 & 0xFF))
        } else if rest == 3 {
            let n = UInt32(values[i]) << 18 | UInt32(values[i + 1]) << 12 | UInt32(values[i + 2]) << 6
            out += [UInt8(n >> 16 & 0xFF), UInt8(n >> 8 & 0xFF)]
        }
        return out
    }
}
