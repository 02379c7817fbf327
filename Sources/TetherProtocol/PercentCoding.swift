/// Percent-encoding as PubNub clients use it: each path segment and query value encoded on its
/// own, `+` always a literal plus (never a space).
package enum PercentCoding {
    /// Decodes `%XX` escapes. Returns `nil` for a malformed escape or bytes that are not UTF-8,
    /// so a server can answer with 400 instead of guessing.
    package static func decode(_ text: some StringProtocol) -> String? {
        decodeGeneric(text)
    }

    /// ``decode(_:)`` for the request path's pieces: not generic (so it is specialised across
    /// the module boundary), reading the UTF-8 bytes in place, and returning the text itself when
    /// it has no `%` (it is valid UTF-8 already).
    package static func decode(_ text: Substring) -> String? {
        if let decoded = text.utf8.withContiguousStorageIfAvailable({ decodeContiguous($0) }) {
            return decoded ?? String(text)
        }
        return decodeGeneric(text)
    }

    /// ``decode(_:)`` for a whole string; see the `Substring` overload.
    package static func decode(_ text: String) -> String? {
        if let decoded = text.utf8.withContiguousStorageIfAvailable({ decodeContiguous($0) }) {
            return decoded ?? text
        }
        return decodeGeneric(text)
    }

    /// Decodes contiguous UTF-8: `.none` when there is no `%` (the caller keeps its text),
    /// `.some(nil)` when malformed, `.some(decoded)` otherwise.
    private static func decodeContiguous(_ raw: UnsafeBufferPointer<UInt8>) -> String?? {
        guard let first = raw.firstIndex(of: 0x25) else { return .none }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(raw.count)
        bytes.append(contentsOf: raw[..<first])
        var i = first
        while i < raw.count {
            let byte = raw[i]
            if byte == 0x25 {
                guard i + 2 < raw.count, let high = hexValue(raw[i + 1]), let low = hexValue(raw[i + 2]) else { return .some(nil) }
                bytes.append(high << 4 | low)
                i += 3
            } else {
                bytes.append(byte)
                i += 1
            }
        }
        return .some(String(validating: bytes, as: UTF8.self))
    }

    private static func decodeGeneric(_ text: some StringProtocol) -> String? {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(text.utf8.count)
        var iterator = text.utf8.makeIterator()
        while let byte = iterator.next() {
            if byte == 0x25 {  // %
                guard let high = iterator.next().flatMap(hexValue), let low = iterator.next().flatMap(hexValue) else {
                    return nil
                }
                bytes.append(high << 4 | low)
            } else {
                bytes.append(byte)
            }
        }
        return String(validating: bytes, as: UTF8.self)
    }

    /// Encodes everything except RFC 3986 unreserved characters (`A-Z a-z 0-9 - . _ ~`), which is
    /// what the PubNub Python SDK does for path segments and query values.
    package static func encode(_ text: some StringProtocol) -> String {
        encode(text) { isSignatureRaw($0) || $0 == 0x7E }
    }

    /// Encodes the values of a signed query (pubnub-wire §12): only `A-Z a-z 0-9 - _ .` stay raw,
    /// so unlike ``encode(_:)`` a `~` is encoded too. Client and server sign with this one.
    package static func encodeForSignature(_ text: some StringProtocol) -> String {
        encode(text, keeping: isSignatureRaw)
    }

    private static func isSignatureRaw(_ byte: UInt8) -> Bool {
        (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
            || byte == 0x2D || byte == 0x2E || byte == 0x5F
    }

    /// `%XX` (uppercase hex) for every UTF-8 byte `keeping` rejects.
    private static func encode(_ text: some StringProtocol, keeping: (UInt8) -> Bool) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(text.utf8.count)
        let hex = Array("0123456789ABCDEF".utf8)
        for byte in text.utf8 {
            if keeping(byte) {
                out.append(byte)
            } else {
                out.append(0x25)
                out.append(hex[Int(byte >> 4)])
                out.append(hex[Int(byte & 0x0F)])
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case 0x30...0x39: return byte - 0x30
        case 0x41...0x46: return byte - 0x41 + 10
        case 0x61...0x66: return byte - 0x61 + 10
        default: return nil
        }
    }
}
