import Testing
import TetherServerCore

/// `CompactSet` against `Set`: the same answers through every transition between no element,
/// one kept inline and many in a `Set`, including back down to one.
@Suite struct CompactSetTests {
    @Test func behavesLikeASetThroughEveryTransition() {
        var compact: CompactSet<Int> = []
        var reference: Set<Int> = []
        // A fixed pseudo-random walk of inserts and removes over a small range, so the set
        // keeps passing through zero, one and several elements.
        var seed: UInt64 = 0x9E37_79B9_7F4A_7C15
        var sizesSeen = Set<Int>()
        var emptiedFromOne = 0
        var backToOne = 0
        for step in 0..<5_000 {
            seed = seed &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            let value = Int(seed >> 61)  // 0...7 (an LCG's high bits are its random ones)
            let before = reference.count
            // Removes a little more often than inserts, so the walk keeps coming back to empty.
            if (seed >> 40) % 9 < 4 {
                #expect(compact.insert(value) == reference.insert(value).inserted, "insert \(value) at step \(step)")
            } else {
                #expect(compact.remove(value) == reference.remove(value), "remove \(value) at step \(step)")
            }
            sizesSeen.insert(reference.count)
            if before == 1, reference.isEmpty { emptiedFromOne += 1 }
            if before == 2, reference.count == 1 { backToOne += 1 }
            #expect(compact.count == reference.count)
            #expect(compact.isEmpty == reference.isEmpty)
            #expect(Set(compact) == reference, "iteration yields each element once")
            #expect(compact.underestimatedCount == reference.count)
            for probe in 0..<8 { #expect(compact.contains(probe) == reference.contains(probe)) }
        }
        // Every transition was taken, many times: none, one, many, back to one, back to none.
        #expect(sizesSeen.isSuperset(of: [0, 1, 2, 3]))
        #expect(emptiedFromOne > 20)
        #expect(backToOne > 20)
    }

    @Test func literalsAndEquality() {
        let a: CompactSet<String> = ["x", "y", "x"]
        var b: CompactSet<String> = ["y"]
        #expect(a.count == 2)
        #expect(a != b)
        b.insert("x")
        #expect(a == b)
        #expect(Array(CompactSet<String>()).isEmpty)
        b.remove("y")
        #expect(Array(b) == ["x"], "back to one element")
    }
}
