import ArgumentParser
import Foundation
import NIOCore
import NIOPosix
import TetherHarness

/// The process entry point: `tether serve` first makes NIO's event loops Swift concurrency's
/// global executor, then the command runs.
@main
enum TetherMain {
    static func main() async {
        if CommandLine.arguments.dropFirst().first == "serve" {
            ServeExecutor.install(ProcessInfo.processInfo.environment["TETHER_EXECUTOR"])
        }
        await TetherCommand.main()
    }
}

/// Where `tether serve` runs its tasks (docs/benchmarks.md, "Where a request's CPU goes").
///
/// By default every task of the server runs on the same NIO event loops that do its socket I/O
/// (`NIOSingletons.unsafeTryInstallSingletonPosixEventLoopGroupAsConcurrencyGlobalExecutor`,
/// which Hummingbird's singleton group and the server share), instead of on Swift's global
/// thread pool: a request no longer hops from its connection's event loop to a pool thread and
/// back, which was the largest single cost of a request (threads parking and waking).
/// `TETHER_EXECUTOR=pool` keeps Swift's own pool, to compare or to rule the takeover out.
enum ServeExecutor {
    static func install(_ setting: String?) {
        switch setting?.lowercased() {
        case "pool":
            return
        case nil, "", "event-loops":
            _ = NIOSingletons.unsafeTryInstallSingletonPosixEventLoopGroupAsConcurrencyGlobalExecutor()
        default:
            FileHandle.standardError.write(Data("TETHER_EXECUTOR must be event-loops or pool; using event-loops\n".utf8))
            _ = NIOSingletons.unsafeTryInstallSingletonPosixEventLoopGroupAsConcurrencyGlobalExecutor()
        }
    }
}

/// The `tether` command (named `TetherCommand` so it does not clash with the `Tether` SDK module): run a server, measure it, talk to it.
struct TetherCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tether",
        abstract: "Tether: a realtime messaging server that speaks PubNub's REST protocol.",
        discussion: """
            Start a server on 127.0.0.1:8090 with the built-in demo/demo keyset:

              tether serve

            Then point any PubNub SDK at origin 127.0.0.1:8090 (ssl off), or try:

              curl 'http://127.0.0.1:8090/publish/demo/demo/0/hello/0/%22hi%22?uuid=me'
            """,
        subcommands: [Serve.self, StoreCommand.self, Bench.self, ClientPublish.self, ClientHistory.self, ActionsCommand.self, ObjectsCommand.self, FilesCommand.self, ClientHereNow.self, ClientTime.self, ClientPing.self, ClientSubscribe.self, OutboxCommand.self, ChaosCommand.self],
        defaultSubcommand: nil
    )
}
