/// SplitMix64 (Steele, Lea & Flood 2014): a tiny, fast, well-distributed 64-bit generator whose
/// whole state is one integer, so anything drawn from it is reproduced from its seed (the SDK's
/// fallback order, the fuzz tests' cases).
package struct SplitMix64: RandomNumberGenerator, Sendable {
    package var state: UInt64

    package init(seed: UInt64) { state = seed }

    package mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// A uniformly chosen integer in `range` (modulo bias is irrelevant here and keeps the stream
    /// independent of the standard library's sampling algorithm).
    package mutating func int(_ range: ClosedRange<Int>) -> Int {
        let width = UInt64(range.upperBound - range.lowerBound) &+ 1
        return range.lowerBound + Int(width == 0 ? next() : next() % width)
    }

    /// `true` with probability `percent`/100.
    package mutating func chance(_ percent: Int) -> Bool { int(0...99) < percent }

    /// One of `items`, uniformly.
    package mutating func pick<T>(_ items: [T]) -> T { items[int(0...(items.count - 1))] }
}
