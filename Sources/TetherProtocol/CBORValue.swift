/// A CBOR data item (RFC 8949), enough for Access Manager v3 tokens (pubnub-wire §11.4): maps
/// with byte-string keys, text, byte strings, integers, arrays, booleans, null and floats.
package indirect enum CBORValue: Sendable, Hashable {
    /// Major type 0.
    case unsigned(UInt64)
    /// Major type 1: the value is `-1 - n`.
    case negative(UInt64)
    /// Major type 2.
    case bytes([UInt8])
    /// Major type 3.
    case text(String)
    /// Major type 4.
    case array([CBORValue])
    /// Major type 5, keys in encoding order.
    case map([(key: CBORValue, value: CBORValue)])
    /// `true` / `false`.
    case bool(Bool)
    /// `null`.
    case null
    /// Half, single or double precision float.
    case float(Double)

    /// Why bytes are not a CBOR item this decoder accepts.
    package struct DecodingError: Error, Sendable, Hashable, CustomStringConvertible {
        /// What is wrong.
        package var reason: String
        /// A message for humans.
        package var description: String { "invalid CBOR: \(reason)" }
    }

    /// Deepest nesting accepted when decoding.
    package static let maximumDepth = 16

    /// A key or text as a string (byte-string keys decode as UTF-8).
    package var string: String? {
        switch self {
        case .text(let s): return s
        case .bytes(let b): return String(validating: b, as: UTF8.self)
        default: return nil
        }
    }

    /// An integer value.
    package var int: Int64? {
        switch self {
        case .unsigned(let v): return v <= UInt64(Int64.max) ? Int64(v) : nil
        case .negative(let v): return v < UInt64(Int64.max) ? -1 - Int64(v) : nil
        default: return nil
        }
    }

    /// The value for a map key (compared as strings).
    package subscript(key: String) -> CBORValue? {
        guard case .map(let entries) = self else { return nil }
        return entries.first { $0.key.string == key }?.value
    }

    package static func == (lhs: CBORValue, rhs: CBORValue) -> Bool { lhs.encoded() == rhs.encoded() }
    package func hash(into hasher: inout Hasher) { hasher.combine(encoded()) }

    // MARK: Encoding

    /// Canonical-enough encoding: definite lengths, shortest argument, map order as given.
    package func encoded() -> [UInt8] {
        var out: [UInt8] = []
        encode(into: &out)
        return out
    }

    private func encode(into out: inout [UInt8]) {
        switch self {
        case .unsigned(let v): Self.head(0, v, &out)
        case .negative(let v): Self.head(1, v, &out)
        case .bytes(let b):
            Self.head(2, UInt64(b.count), &out)
            out += b
        case .text(let s):
            Self.head(3, UInt64(s.utf8.count), &out)
            out += s.utf8
        case .array(let items):
            Self.head(4, UInt64(items.count), &out)
            for item in items { item.encode(into: &out) }
        case .map(let entries):
            Self.head(5, UInt64(entries.count), &out)
            for (key, value) in entries {
                key.encode(into: &out)
                value.encode(into: &out)
            }
        case .bool(let b): out.append(b ? 0xF5 : 0xF4)
        case .null: out.append(0xF6)
        case .float(let d):
            out.append(0xFB)
            let bits = d.bitPattern
            for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8(truncatingIfNeeded: bits >> UInt64(shift))) }
        }
    }

    private static func head(_ major: UInt8, _ value: UInt64, _ out: inout [UInt8]) {
        let m = major << 5
        switch value {
        case 0..<24: out.append(m | UInt8(value))
        case 24..<0x100: out += [m | 24, UInt8(value)]
        case 0x100..<0x10000: out += [m | 25, UInt8(value >> 8), UInt8(truncatingIfNeeded: value)]
        case 0x10000..<0x1_0000_0000:
            out.append(m | 26)
            for shift in stride(from: 24, through: 0, by: -8) { out.append(UInt8(truncatingIfNeeded: value >> UInt64(shift))) }
        default:
            out.append(m | 27)
            for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8(truncatingIfNeeded: value >> UInt64(shift))) }
        }
    }

    // MARK: Decoding

    /// Decodes exactly one item from `bytes` (trailing bytes are an error).
    package init(decoding bytes: [UInt8]) throws(DecodingError) {
        var reader = Reader(bytes: bytes)
        self = try reader.item(depth: 0)
        guard reader.index == bytes.count else { throw DecodingError(reason: "trailing bytes") }
    }

    private struct Reader {
        let bytes: [UInt8]
        var index = 0

        mutating func byte() throws(DecodingError) -> UInt8 {
            guard index < bytes.count else { throw DecodingError(reason: "truncated") }
            defer { index += 1 }
            return bytes[index]
        }

        mutating func take(_ count: UInt64) throws(DecodingError) -> [UInt8] {
            guard count <= UInt64(bytes.count - index) else { throw DecodingError(reason: "truncated") }
            defer { index += Int(count) }
            return Array(bytes[index..<index + Int(count)])
        }

        mutating func argument(_ info: UInt8) throws(DecodingError) -> UInt64 {
            switch info {
            case 0..<24: return UInt64(info)
            case 24: return UInt64(try byte())
            case 25: return try take(2).reduce(0) { $0 << 8 | UInt64($1) }
            case 26: return try take(4).reduce(0) { $0 << 8 | UInt64($1) }
            case 27: return try take(8).reduce(0) { $0 << 8 | UInt64($1) }
            default: throw DecodingError(reason: "indefinite lengths are not supported")
            }
        }

        mutating func item(depth: Int) throws(DecodingError) -> CBORValue {
            guard depth <= CBORValue.maximumDepth else { throw DecodingError(reason: "nesting too deep") }
            let initial = try byte()
            let major = initial >> 5
            let info = initial & 0x1F
            switch major {
            case 0: return .unsigned(try argument(info))
            case 1: return .negative(try argument(info))
            case 2: return .bytes(try take(try argument(info)))
            case 3:
                guard let text = String(validating: try take(try argument(info)), as: UTF8.self) else {
                    throw DecodingError(reason: "text is not UTF-8")
                }
                return .text(text)
            case 4:
                let count = try argument(info)
                guard count <= UInt64(bytes.count - index) else { throw DecodingError(reason: "truncated") }
                var items: [CBORValue] = []
                for _ in 0..<count { items.append(try item(depth: depth + 1)) }
                return .array(items)
            case 5:
                let count = try argument(info)
                guard count <= UInt64(bytes.count - index) else { throw DecodingError(reason: "truncated") }
                var entries: [(key: CBORValue, value: CBORValue)] = []
                for _ in 0..<count {
                    let key = try item(depth: depth + 1)
                    entries.append((key, try item(depth: depth + 1)))
                }
                return .map(entries)
            case 6:
                _ = try argument(info)  // tag: ignored, the tagged item is returned
                return try item(depth: depth + 1)
            default:
                switch info {
                case 20: return .bool(false)
                case 21: return .bool(true)
                case 22, 23: return .null
                case 25:
                    let half = try take(2).reduce(0) { $0 << 8 | UInt16($1) }
                    return .float(Double(Float16(bitPattern: half)))
                case 26: return .float(Double(Float(bitPattern: try take(4).reduce(0) { $0 << 8 | UInt32($1) })))
                case 27: return .float(Double(bitPattern: try take(8).reduce(0) { $0 << 8 | UInt64($1) }))
                default: throw DecodingError(reason: "unsupported simple value")
                }
            }
        }
    }
}
