import ArgumentParser
import TetherHarness

/// The `tether` command (named `TetherCommand` so it does not clash with the `Tether` SDK module): run a server, measure it, talk to it.
@main
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
