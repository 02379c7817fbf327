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
    package mutating func number(_ value: some BinaryInteger) {
        if let magnitude = UInt64(exactly: value) {
            decimal(magnitude)
        } else if let signed = Int64(exactly: value) {
            bytes.append(UInt8(ascii: "-"))
            decimal(signed.magnitude)
        } else {
            bytes.append(contentsOf: String(value).utf8)
        }
    }

    /// Appends a timetoken as a JSON string (`"17953281264739664"`).
    package mutating func timetokenString(_ value: Timetoken) {
        bytes.append(UInt8(ascii: "\""))
        decimal(value.rawValue)
        bytes.append(UInt8(ascii: "\""))
    }

    /// Appends `value`'s decimal digits in place. (A timetoken has 17 digits: as a `String`
    /// first, each was a heap allocation, one or two per message of every subscribe answer.)
    private mutating func decimal(_ value: UInt64) {
        var count = 1
        var rest = value / 10
        while rest > 0 {
            count += 1
            rest /= 10
        }
        let start = bytes.count
        bytes.append(contentsOf: repeatElement(UInt8(ascii: "0"), count: count))
        bytes.withUnsafeMutableBufferPointer { buffer in
            var index = start + count
            var remaining = value
            repeat {
                index -= 1
                buffer[index] = UInt8(ascii: "0") &+ UInt8(truncatingIfNeeded: remaining % 10)
                remaining /= 10
            } while remaining > 0
        }
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
