/// The number syntax shared by JSON and filter expressions:
/// `-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?`, where JSON additionally forbids leading zeros.
enum NumberSyntax {
    /// Whether `bytes` is exactly one number.
    static func scan(_ bytes: [UInt8], allowLeadingZeros: Bool) -> Bool {
        var index = 0
        func digit(_ i: Int) -> Bool { i < bytes.count && bytes[i] >= 0x30 && bytes[i] <= 0x39 }
        if index < bytes.count, bytes[index] == UInt8(ascii: "-") { index += 1 }
        guard digit(index) else { return false }
        if !allowLeadingZeros, bytes[index] == UInt8(ascii: "0") {
            index += 1
        } else {
            while digit(index) { index += 1 }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            index += 1
            guard digit(index) else { return false }
            while digit(index) { index += 1 }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") { index += 1 }
            guard digit(index) else { return false }
            while digit(index) { index += 1 }
        }
        return index == bytes.count
    }

    /// The exact `Int64` a number literal (already known to be well-formed) denotes, or `nil` when
    /// it is not an integer or does not fit. Works on the decimal digits, so `1.0000000000000000001`
    /// is correctly not an integer even though its nearest `Double` is `1.0`. Linear in the length.
    static func exactInteger(_ utf8: some Collection<UInt8>) -> Int64? {
        var negative = false
        var digits: [UInt8] = []  // mantissa digits, integer part then fraction
        var fractionCount = 0
        var exponent = 0
        var exponentNegative = false
        var part = 0  // 0 integer, 1 fraction, 2 exponent
        for byte in utf8 {
            switch byte {
            case UInt8(ascii: "-"):
                if part == 2 { exponentNegative = true } else { negative = true }
            case UInt8(ascii: "+"):
                break
            case UInt8(ascii: "."):
                part = 1
            case UInt8(ascii: "e"), UInt8(ascii: "E"):
                part = 2
            default:
                let value = Int(byte &- 0x30)
                if part == 2 {
                    exponent = min(exponent * 10 + value, 1_000_000)  // clamped: far beyond any Int64
                } else {
                    digits.append(UInt8(value))
                    if part == 1 { fractionCount += 1 }
                }
            }
        }
        var scale = (exponentNegative ? -exponent : exponent) - fractionCount
        var first = 0
        while first < digits.count, digits[first] == 0 { first += 1 }
        var last = digits.count
        while last > first, digits[last - 1] == 0 {
            last -= 1
            scale += 1
        }
        if first == last { return 0 }
        guard scale >= 0, last - first + scale <= 19 else { return nil }
        // Accumulate as a negative number so Int64.min is reachable.
        var value: Int64 = 0
        for index in first..<(last + scale) {
            let digit = index < last ? Int64(digits[index]) : 0
            let (shifted, overflow1) = value.multipliedReportingOverflow(by: 10)
            let (next, overflow2) = shifted.subtractingReportingOverflow(digit)
            if overflow1 || overflow2 { return nil }
            value = next
        }
        if negative { return value }
        return value == .min ? nil : -value
    }
}
