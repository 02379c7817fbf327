import Foundation
import Testing
@_spi(Benchmarks) @testable import TetherProtocol

/// Property-based fuzzing of the filter parser and evaluator (deterministic, seeded).
///
/// Each iteration derives its own SplitMix64 seed from the run seed, builds a valid expression
/// and either uses it as is or mutates it, then parses and evaluates it against random messages,
/// checking that:
/// - nothing traps (a crash fails the whole test run);
/// - every rejection points inside the input (`0...input.count`);
/// - every generated (valid by construction) expression parses, and every accepted expression's
///   canonical form re-parses to an equal expression with an equal hash;
/// - the instrumented work stays linear (constants justified below).
///
/// Environment: `TETHER_FUZZ_ITERATIONS` (default 20,000, a few seconds in debug) and
/// `TETHER_FUZZ_SEED` (default below; failures print the seed and iteration to reproduce).
/// See docs/filter-expressions.md for a longer run.
@Suite struct FilterFuzzTests {
    static let defaultSeed: UInt64 = 0x7E7_4E5F_1A7E_2026
    static let defaultIterations = 20_000

    /// Parse work per Unicode scalar. Reading the input costs 1 step per scalar, the lexer at most
    /// 2 more per scalar (escapes count twice) and 1 per token; the parser spends 1 step per token,
    /// 1 per operand or operator pushed and 1 per reduction — each operator is pushed and reduced
    /// once, so at most 3 per token. Every token but the final `end` is at least one scalar:
    /// 1 + 2 + 1 + 4 = 8 per scalar, plus 1 per character for the length pre-check of an
    /// over-long input. 12 leaves headroom.
    static let parseWorkPerScalar = 12

    /// Evaluation work per unit of size, where size = expression scalars + bytes of the JSON values
    /// its fields resolve to (with repeats: each reference reads its value again). A node costs a
    /// few steps and comes from at least one scalar; texts cost at most 3 steps per character to
    /// lower-case and match or search (KMP compares each character at most twice) and a `LIKE`
    /// pattern 3 per character to compile. The largest amplification is a computed number's
    /// decimal form: `1/7` (3 scalars, plus a `,` in a list) prints as 19 characters, and a list
    /// of them matched by `LIKE` costs about 19 × 3 + 8 steps per 4 scalars, about 17 per scalar.
    /// 32 leaves headroom.
    static let evaluationWorkPerUnit = 32

    @Test func parserAndEvaluatorSurviveRandomInput() {
        let environment = ProcessInfo.processInfo.environment
        let iterations = environment["TETHER_FUZZ_ITERATIONS"].flatMap { Int($0) } ?? Self.defaultIterations
        let seed = environment["TETHER_FUZZ_SEED"].flatMap { UInt64($0) } ?? Self.defaultSeed
        var stats = Statistics()
        var failures = 0
        let started = ContinuousClock.now
        // Messages come from a pool built once from the run seed (building them per iteration
        // would dominate the run time).
        var poolGenerator = FilterFuzzGenerator(random: SplitMix64(seed: seed))
        let pool = (0..<64).map { _ in poolGenerator.message() }

        for iteration in 0..<iterations where failures < 10 {
            var generator = FilterFuzzGenerator(random: SplitMix64(seed: seed &+ UInt64(iteration) &* 0xD1B5_4A32_D192_ED03))
            let valid = generator.expression()
            let mutated = generator.random.chance(60)
            let input = mutated ? generator.mutate(valid) : valid
            let messages = (0..<2).map { _ in (generator.random.pick(pool), generator.random.pick(pool)) }
            if let problem = check(input, mustParse: !mutated, messages: messages, stats: &stats) {
                failures += 1
                Issue.record("TETHER_FUZZ_SEED=\(seed) iteration \(iteration): \(problem)\ninput: \(input.debugDescription.prefix(2_000))")
            }
        }

        let elapsed = ContinuousClock.now - started
        print(
            "filter fuzz: \(iterations) iterations, seed \(seed), \(elapsed); accepted \(stats.accepted), rejected \(stats.rejected),"
                + " evaluations \(stats.evaluations), worst parse work/scalar \(stats.worstParseRatio),"
                + " worst evaluation work/unit \(stats.worstEvaluationRatio)"
        )
        #expect(stats.accepted > iterations / 3)
        #expect(stats.rejected > iterations / 10)
    }

    struct Statistics {
        var accepted = 0
        var rejected = 0
        var evaluations = 0
        var worstParseRatio = 0.0
        var worstEvaluationRatio = 0.0
    }

    /// Checks one input; returns a description of the first property it violates.
    func check(_ input: String, mustParse: Bool, messages: [(JSONValue?, JSONValue?)], stats: inout Statistics) -> String? {
        let scalars = input.unicodeScalars.count
        var parseWork = 0
        let filter: FilterExpression
        do {
            filter = try FilterExpression.parse(input, work: &parseWork)
        } catch {
            stats.rejected += 1
            if mustParse { return "a generated expression was rejected: \(error)" }
            if !(0...input.count).contains(error.position) { return "error position \(error.position) outside 0...\(input.count)" }
            return linear(parseWork, scalars, Self.parseWorkPerScalar, "parse", &stats.worstParseRatio)
        }
        stats.accepted += 1
        if let problem = linear(parseWork, scalars, Self.parseWorkPerScalar, "parse", &stats.worstParseRatio) { return problem }

        let canonical = filter.description
        if canonical.count <= FilterExpression.maximumLength {
            guard let again = try? FilterExpression(parsing: canonical) else { return "canonical form does not parse: \(canonical)" }
            if again != filter || again.hashValue != filter.hashValue { return "canonical form parses differently: \(canonical)" }
            if again.description != canonical { return "canonical form is not stable: \(canonical)" }
        }

        for (meta, data) in messages {
            var work = 0
            let result = filter.evaluate(meta: meta, data: data, work: &work)
            stats.evaluations += 1
            if result != filter.matches(meta: meta, data: data) { return "evaluation is not deterministic" }
            let read = filter.variables.reduce(0) { total, path in total + (path.resolve(meta: meta, data: data)?.jsonBytes.count ?? 0) }
            if let problem = linear(work, scalars + read, Self.evaluationWorkPerUnit, "evaluation", &stats.worstEvaluationRatio) {
                return problem
            }
        }
        return nil
    }

    func linear(_ work: Int, _ size: Int, _ constant: Int, _ phase: String, _ worst: inout Double) -> String? {
        let ratio = Double(work) / Double(size + 1)
        worst = max(worst, ratio)
        return work <= constant * (size + 1) ? nil : "\(phase) work \(work) exceeds \(constant)·(\(size) + 1)"
    }

    /// Hand-picked hostile inputs, checked with the same properties.
    static let hostile: [String] = {
        var inputs: [String] = []
        inputs.append(String(repeating: "(", count: 5_000))
        inputs.append(String(repeating: "!", count: 4_000) + "a == 1")
        inputs.append(String(repeating: "~", count: 4_000))
        inputs.append("a == (" + Array(repeating: "1", count: 2_000).joined(separator: ",") + ")")
        inputs.append("a == " + Array(repeating: "1", count: 2_000).joined(separator: "+"))
        inputs.append(Array(repeating: "a == 1", count: 580).joined(separator: " && "))
        inputs.append("'" + String(repeating: "\\", count: 4_000))
        inputs.append("meta." + String(repeating: "a.", count: 2_000))
        inputs.append("a LIKE '" + String(repeating: "*a", count: 2_000) + "'")
        inputs.append("'" + String(repeating: "a", count: 4_000) + "' LIKE '" + String(repeating: "*", count: 50) + "b'")
        inputs.append(String(repeating: "\u{301}", count: 10_000))
        inputs.append("a == '" + String(repeating: "e\u{301}", count: 3_000) + "'")
        inputs.append("(" + Array(repeating: "1/7", count: 1_000).joined(separator: ",") + ") LIKE '*1*2*'")
        inputs.append("(" + Array(repeating: "1/3e9", count: 600).joined(separator: ",") + ") CONTAINS '3'")
        inputs.append("tags LIKE '" + String(repeating: "a*", count: 500) + "'")
        inputs.append("tags == tags && a == a && a LIKE a && a CONTAINS a")
        return inputs
    }()

    @Test(arguments: hostile)
    func hostileInputs(_ input: String) {
        var stats = Statistics()
        let message: JSONValue = ["a": .string(String(repeating: "a", count: 3_000)), "tags": .array(Array(repeating: "a", count: 1_000))]
        let problem = check(input, mustParse: false, messages: [(message, message), (nil, nil)], stats: &stats)
        #expect(problem == nil, "\(problem ?? "")")
    }
}
