/// Appends JSON tokens to a byte buffer. Used to build responses without an intermediate tree.
package struct JSONWriter: Sendable {
    /// The bytes written so far.
    package private(set) var bytes: [UInt8] = []

    /// Creates an empty writer, optionally reserving capacity.
    package init(capacity: Int = 256) { bytes.reserveCapacity(capacity) }

    /// Appends raw bytes that are already valid JSON (or punctuation).
    package mutating func raw(_ text: StaticString) {
        bytes.append(contentsOf: UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
    }

    /// Appends raw bytes that are already valid JSON.
    package mutating func raw(_ other: some Sequence<UInt8>) { bytes.append(contentsOf: other) }

    /// Appends a JSON string literal with the required escapes.
    package mutating func string(_ value: String) {
        bytes.append(UInt8(ascii: "\""))
        for byte in value.utf8 {
            switch byte {
            case UInt8(ascii: "\""): raw("\\\"")
            case UInt8(ascii: "\\"): raw("\\\\")
            case 0x0A: raw("\\n")
            case 0x0D: raw("\\r")
            case 0x09: raw("\\t")
            case 0x00..<0x20:
                let hex = Array("0123456789abcdef".utf8)
                raw("\\u00")
                bytes.append(hex[Int(byte >> 4)])
                bytes.append(hex[Int(byte & 0x0F)])
            default: bytes.append(byte)
            }
        }
        bytes.append(UInt8(ascii: "\""))
    }

    /// Appends an integer.
    package mutating func number(_ value: some BinaryInteger) { bytes.append(contentsOf: String(value).utf8) }

    /// Appends a timetoken as a JSON string (`"17953281264739664"`).
    package mutating func timetokenString(_ value: Timetoken) {
        bytes.append(UInt8(ascii: "\""))
        bytes.append(contentsOf: String(value.rawValue).utf8)
        bytes.append(UInt8(ascii: "\""))
    }

    /// Appends `true` or `false`.
    package mutating func bool(_ value: Bool) { value ? raw("true") : raw("false") }

    /// Appends a list of strings as a JSON array.
    package mutating func stringArray(_ values: some Sequence<String>) {
        raw("[")
        var first = true
        for value in values {
            if !first { raw(",") }
            first = false
            string(value)
        }
        raw("]")
    }
}
