import ArgumentParser
import Foundation
import Tether

/// `tether actions`: add, remove and list message actions (reactions, receipts) by hand.
struct ActionsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "actions",
        abstract: "Add, remove or list message actions (reactions, receipts) on a channel.",
        discussion: """
            The user is --user-id (the actions are that user's):

              tether actions add chat 17953281264739664 reaction smile
              tether actions list chat --limit 20
              tether actions remove chat 17953281264739664 17953281270000000
            """,
        subcommands: [Add.self, Remove.self, List.self])

    /// `tether actions add <channel> <message-timetoken> <type> <value>`.
    struct Add: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Add an action to a stored message; prints the action and its timetoken.")

        @OptionGroup var client: ClientOptions
        @Argument(help: "The channel.") var channel: String
        @Argument(help: "The message's timetoken.") var messageTimetoken: String
        @Argument(help: "The action's type (1-15 characters), e.g. reaction.") var type: String
        @Argument(help: "The action's value, e.g. smile.") var value: String

        func validate() throws {
            guard Timetoken(parsing: messageTimetoken) != nil else { throw ValidationError("the message timetoken must be up to 17 digits") }
            guard (1...15).contains(type.count) else { throw ValidationError("the type must be 1-15 characters") }
            guard !value.isEmpty else { throw ValidationError("the value is empty") }
        }

        func run() async throws {
            guard let tt = Timetoken(parsing: messageTimetoken) else { return }
            try await withClient(client) { (c: TetherClient) throws(TetherError) in
                print(line(try await c.addMessageAction(channel: channel, messageTimetoken: tt, type: type, value: value)))
            }
        }
    }

    /// `tether actions remove <channel> <message-timetoken> <action-timetoken>`.
    struct Remove: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Remove an action (only the user who added it can).")

        @OptionGroup var client: ClientOptions
        @Argument(help: "The channel.") var channel: String
        @Argument(help: "The message's timetoken.") var messageTimetoken: String
        @Argument(help: "The action's timetoken.") var actionTimetoken: String

        func validate() throws {
            guard Timetoken(parsing: messageTimetoken) != nil, Timetoken(parsing: actionTimetoken) != nil else {
                throw ValidationError("timetokens are up to 17 digits")
            }
        }

        func run() async throws {
            guard let message = Timetoken(parsing: messageTimetoken), let action = Timetoken(parsing: actionTimetoken) else { return }
            try await withClient(client) { (c: TetherClient) throws(TetherError) in
                try await c.removeMessageAction(channel: channel, messageTimetoken: message, actionTimetoken: action)
                print("removed \(action)")
            }
        }
    }

    /// `tether actions list <channel>`.
    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print a channel's newest actions, oldest first: action timetoken, message timetoken, user, type, value.")

        @OptionGroup var client: ClientOptions
        @Argument(help: "The channel.") var channel: String

        @Option(help: "How many of the newest actions (1-100). (default: 100)")
        var limit: Int = 100

        @Option(help: "Only actions older than this action timetoken (paging).")
        var start: String?

        func validate() throws {
            guard (1...100).contains(limit) else { throw ValidationError("--limit must be 1-100") }
            if let start, Timetoken(parsing: start) == nil { throw ValidationError("--start must be a timetoken (up to 17 digits)") }
        }

        func run() async throws {
            try await withClient(client) { (c: TetherClient) throws(TetherError) in
                let page = try await c.fetchMessageActions(channel: channel, start: start.flatMap { Timetoken(parsing: $0) }, limit: limit)
                for action in page.actions { print(line(action)) }
                if let next = page.nextStart { print("more: --start \(next)") }
            }
        }
    }
}

private func line(_ a: MessageAction) -> String {
    "\(a.actionTimetoken)  \(a.messageTimetoken)  \(a.userId)  \(a.type)  \(a.value)"
}
