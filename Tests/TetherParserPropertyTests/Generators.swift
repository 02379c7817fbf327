import PropertyBased

/// Generators for request-shaped text: alphabets weighted towards the bytes the parsers treat
/// specially (`%`, `/`, `&`, `=`, `,`, signs, dots, hex digits, multi-byte UTF-8).
enum RequestGen {
    /// One character of `alphabet`.
    static func character(of alphabet: String) -> Generator<Character, Shrink.None<Character?>> {
        Gen<Character?>.element(of: Array(alphabet)).map { $0! }
    }

    /// Strings of `length` characters drawn from `alphabet`.
    static func text(_ alphabet: String, length: ClosedRange<Int>) -> Generator<String, some SendableSequenceType> {
        character(of: alphabet).array(of: length).map { String($0) }
    }

    /// Arbitrary Unicode text: ASCII (controls included), Latin-1, BMP beyond the surrogates,
    /// and astral scalars, so every UTF-8 length occurs.
    static func unicode(length: ClosedRange<Int>) -> Generator<String, some SendableSequenceType> {
        Generator<UnicodeScalar, Shrink.None<UnicodeScalar>> { rng in
            switch rng.next() % 5 {
            case 0: UnicodeScalar(UInt8(truncatingIfNeeded: rng.next() % 128))
            case 1: UnicodeScalar(UInt8(truncatingIfNeeded: 128 + rng.next() % 128))
            case 2: UnicodeScalar(UInt32(0x100 + rng.next() % (0xD800 - 0x100)))!
            case 3: UnicodeScalar(UInt32(0xE000 + rng.next() % (0xFFFF - 0xE000)))!
            default: UnicodeScalar(UInt32(0x10000 + rng.next() % (0x10FFFF - 0x10000)))!
            }
        }
        .array(of: length)
        .map { scalars in
            var text = ""
            text.unicodeScalars.append(contentsOf: scalars)
            return text
        }
    }

    /// Raw (still encoded) URI text: escapes, broken escapes and separators in abundance.
    static let rawURIAlphabet = "%%%%/&&==,,??++--..09azAFafZzé€\u{1F600} \t\u{0}"

    /// Text that looks like a number, or nearly does.
    static let numericAlphabet = "0123456789000999-+.eEnaifxNI \u{0661}"

    /// Characters that matter to JSON, plus a few that never do.
    static let jsonAlphabet = "[[]]{{}}\"\"\"::,,,0123456789-+.eEtruefalsn \n\\/u\u{0}é"

    /// Integer-shaped texts: fixed edge cases, integers near and across `range`'s bounds,
    /// anything in `Int`, and random numeric-looking text.
    static func integerText(around range: ClosedRange<Int>) -> Generator<String, Shrink.None<String>> {
        let lo = range.lowerBound
        let hi = range.upperBound
        let edges: [String] = [
            String(lo), String(hi), String(lo &- 1), String(hi &+ 1), "0", "-0", "-1", "1", "",
            String(Int.min), String(Int.max), "9223372036854775808", "-9223372036854775809",
            "99999999999999999999", "-99999999999999999999", "00000000000000000001", "0000000000000000001",
            "+1", " 1", "1 ", "1e3", "0x10", "1.0", "NaN", "inf", "-", "--1", "\u{0661}",
        ]
        let alphabet = Array(numericAlphabet)
        return Generator<String, Shrink.None<String>> { rng in
            switch rng.next() % 4 {
            case 0:
                return edges[Int(rng.next() % UInt64(edges.count))]
            case 1:
                let base = rng.next() % 2 == 0 ? lo : hi
                let delta = Int(rng.next() % 2_001) - 1_000
                return String(base.addingReportingOverflow(delta).partialValue)
            case 2:
                return String(Int(truncatingIfNeeded: rng.next()))
            default:
                let length = Int(rng.next() % 24)
                return String((0..<length).map { _ in alphabet[Int(rng.next() % UInt64(alphabet.count))] })
            }
        }
    }

    /// Decimal-shaped texts (at most six fraction digits, so `Double` and exact decimal
    /// comparison agree at the bounds) mixed with numeric-looking junk.
    static func decimalText(around range: ClosedRange<Double>) -> Generator<String, Shrink.None<String>> {
        let edges = ["0", "0.0", ".5", "5.", ".", "..", "1.2.3", "876000", "876000.000001", "876001", "1e3", "-1", "-0",
                     "NaN", "nan", "inf", "infinity", "-inf", "1e400", String(repeating: "9", count: 32),
                     String(repeating: "9", count: 33), "0x1p3", " 1", "+1", ""]
        let alphabet = Array(numericAlphabet)
        return Generator<String, Shrink.None<String>> { rng in
            switch rng.next() % 4 {
            case 0:
                return edges[Int(rng.next() % UInt64(edges.count))]
            case 1:
                let whole = Int(rng.next() % UInt64(range.upperBound * 1.01 + 2))
                let fraction = rng.next() % 1_000_000
                let digits = String(fraction)
                let padded = String(repeating: "0", count: 6 - digits.count) + digits
                return rng.next() % 2 == 0 ? String(whole) : "\(whole).\(padded)"
            case 2:
                return rng.next() % 2 == 0 ? String(range.upperBound) : String(Int(range.upperBound) + Int(rng.next() % 3))
            default:
                let length = Int(rng.next() % 16)
                return String((0..<length).map { _ in alphabet[Int(rng.next() % UInt64(alphabet.count))] })
            }
        }
    }
}
