// swift-tools-version: 6.1
// Micro-benchmarks for Tether's hot pure pieces, using ordo-one/benchmark.
//
// A separate package so the main build and CI never resolve or compile the benchmark
// dependencies: the root package does not know this one exists. Run from this directory:
//
//     swift package benchmark
//
// See docs/benchmarks.md, "Micro-benchmarks (Benchmarks/)".
import PackageDescription

/// One executable target per benchmark suite, in ordo-one's layout: `Benchmarks/<Name>/<Name>.swift`.
func benchmarkTarget(_ name: String, dependencies: [Target.Dependency]) -> Target {
    .executableTarget(
        name: name,
        dependencies: [.product(name: "Benchmark", package: "benchmark")] + dependencies,
        path: "Benchmarks/\(name)",
        plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
    )
}

let package = Package(
    name: "TetherBenchmarks",
    platforms: [.macOS(.v15)],
    dependencies: [
        // The repository root, named so products resolve whatever the checkout directory is called.
        .package(name: "Tether", path: ".."),
        // Only the malloc interposer trait: the default "RuntimeInterposer" trait (Swift 6.3 on
        // Linux) needs ordo-one/swift-runtime-interposer, and its retain/release counters are
        // not metrics these benchmarks use.
        .package(url: "https://github.com/ordo-one/benchmark.git", exact: "1.38.1", traits: ["MallocInterposer"]),
    ],
    targets: [
        benchmarkTarget("FilterEvaluation", dependencies: [
            .product(name: "TetherProtocol", package: "Tether"),
        ]),
        benchmarkTarget("EnvelopeEncoding", dependencies: [
            .product(name: "TetherProtocol", package: "Tether"),
        ]),
        benchmarkTarget("CursorMerge", dependencies: [
            .product(name: "TetherProtocol", package: "Tether"),
            .product(name: "TetherServerCore", package: "Tether"),
        ]),
        benchmarkTarget("RateLimiting", dependencies: [
            .product(name: "TetherServerCore", package: "Tether"),
        ]),
        benchmarkTarget("SubscribeMachineTransitions", dependencies: [
            .product(name: "TetherClientCore", package: "Tether"),
        ]),
    ]
)
