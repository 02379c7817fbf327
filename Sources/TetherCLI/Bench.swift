import ArgumentParser

/// `tether bench`: load tests against a server (see docs/benchmarks.md).
struct Bench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Measure fan-out throughput and publish-to-receive latency.")

    func run() async throws {
        throw ValidationError("tether bench is being written; see docs/benchmarks.md")
    }
}
