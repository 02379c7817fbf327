/// Base64 (RFC 4648) without Foundation: standard or URL-safe alphabet out, with or without
/// padding; standard or URL-safe in, padding optional. Used for tokens, signatures and ciphertexts.
package enum Base64 {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    /// Encodes with the standard alphabet and padding.
    package static func encode(_ input: some Collection<UInt8>, urlSafe: Bool = false, padding: Bool = true) -> String {
        let bytes = Array(input)
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count + 2) / 3 * 4)
        var i = 0
        while i < bytes.count {
            let b0 = bytes[i], b1 = i + 1 < bytes.count ? bytes[i + 1] : 0, b2 = i + 2 < bytes.count ? bytes[i + 2] : 0
            out.append(alphabet[Int(b0 >> 2)])
            out.append(alphabet[Int((b0 & 0x03) << 4 | b1 >> 4)])
            out.append(i + 1 < bytes.count ? alphabet[Int((b1 & 0x0F) << 2 | b2 >> 6)] : UInt8(ascii: "="))
            out.append(i + 2 < bytes.count ? alphabet[Int(b2 & 0x3F)] : UInt8(ascii: "="))
            i += 3
        }
        var text = String(decoding: out, as: UTF8.self)
        if urlSafe {
            text = String(text.map { $0 == "+" ? "-" : $0 == "/" ? "_" : $0 })
        }
        if !padding { while text.hasSuffix("=") { text.removeLast() } }
        return text
    }

    /// Decodes standard or URL-safe base64; `nil` for anything else.
    package static func decode(_ text: String) -> [UInt8]? {
        var values: [UInt8] = []
        for scalar in text.utf8 {
            switch scalar {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"): values.append(scalar - 65)
            case UInt8(ascii: "a")...UInt8(ascii: "z"): values.append(scalar - 71)
            case UInt8(ascii: "0")...UInt8(ascii: "9"): values.append(scalar + 4)
            case UInt8(ascii: "+"), UInt8(ascii: "-"): values.append(62)
            case UInt8(ascii: "/"), UInt8(ascii: "_"): values.append(63)
            case UInt8(ascii: "="): continue
            default: return nil
            }
        }
        if values.count % 4 == 1 { return nil }
        var out: [UInt8] = []
        var i = 0
        while i + 1 < values.count {
            out.append(values[i] << 2 | values[i + 1] >> 4)
            if i + 2 < values.count { out.append(values[i + 1] << 4 | values[i + 2] >> 2) }
            if i + 3 < values.count { out.append(values[i + 2] << 6 | values[i + 3]) }
            i += 4
        }
        return out
    }
}
