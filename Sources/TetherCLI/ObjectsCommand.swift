import ArgumentParser
import Foundation
import Tether

/// `tether objects`: inspect and fix App Context data (user and channel metadata, memberships)
/// by hand.
struct ObjectsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "objects",
        abstract: "Get, set, remove or list App Context data: user and channel metadata, memberships.",
        discussion: """
            Users and channels each have metadata (name, status, type, custom fields, and email,
            externalId, profileUrl for users or description for channels); a membership ties a
            user to a channel. Setting changes only the fields given:

              tether objects user set alice --name "Alice" --custom '{"role":"admin"}'
              tether objects user get alice
              tether objects user list --filter 'name LIKE "A*"' --sort name:asc
              tether objects channel set room-1 --name "Room 1" --description "The first room"
              tether objects memberships add alice room-1 room-2
              tether objects memberships list alice
              tether objects memberships remove alice room-2
              tether objects user remove alice

            Each object prints as one line: id, then field=value pairs (custom as JSON), then
            updated=… and eTag=…. On an access-controlled keyset pass --auth with a token that
            grants the user (uuids) or the channel (channels) resources.
            """,
        subcommands: [User.self, Channel.self, Memberships.self])

    /// `tether objects user …`.
    struct User: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "user", abstract: "A user's metadata: get, set, remove, list.",
            subcommands: [Get.self, SetFields.self, Remove.self, List.self])

        struct Get: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Print a user's metadata (404 when there is none).")
            @OptionGroup var client: ClientOptions
            @Argument(help: "The user id.") var id: String

            func run() async throws {
                try await withClient(client) { (c: TetherClient) throws(TetherError) in
                    print(line(try await c.fetchUserMetadata(userId: id)))
                }
            }
        }

        struct SetFields: AsyncParsableCommand {
            static let configuration = CommandConfiguration(commandName: "set", abstract: "Set fields of a user's metadata (others are kept); prints the result.")
            @OptionGroup var client: ClientOptions
            @Argument(help: "The user id.") var id: String
            @Option(help: "Display name.") var name: String?
            @Option(help: "Email address.") var email: String?
            @Option(help: "An id in another system.") var externalId: String?
            @Option(help: "A profile picture URL.") var profileUrl: String?
            @Option(help: "Status, up to 50 characters.") var status: String?
            @Option(help: "Type, up to 50 characters.") var type: String?
            @Option(help: #"Custom fields as a JSON object of strings, numbers and booleans, e.g. '{"role":"admin"}'."#)
            var custom: String?
            @Option(help: "Only if the stored eTag is this one (412 otherwise).") var ifMatch: String?

            func validate() throws { _ = try parseCustom(custom) }

            func run() async throws {
                let user = UserMetadata(id: id, name: name, email: email, externalId: externalId, profileUrl: profileUrl,
                                        status: status, type: type, custom: try parseCustom(custom))
                try await withClient(client) { (c: TetherClient) throws(TetherError) in
                    print(line(try await c.setUserMetadata(user, ifMatchesETag: ifMatch)))
                }
            }
        }

        struct Remove: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Remove a user's metadata and memberships.")
            @OptionGroup var client: ClientOptions
            @Argument(help: "The user id.") var id: String

            func run() async throws {
                try await withClient(client) { (c: TetherClient) throws(TetherError) in
                    try await c.removeUserMetadata(userId: id)
                    print("removed \(id)")
                }
            }
        }

        struct List: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "List users, one per line; prints the next page's cursor.")
            @OptionGroup var client: ClientOptions
            @OptionGroup var list: ObjectsListOptions

            func run() async throws {
                try await withClient(client) { (c: TetherClient) throws(TetherError) in
                    let page = try await c.fetchAllUserMetadata(filter: list.filter, sort: list.sortKeys, limit: list.limit,
                                                                page: list.cursor)
                    for user in page.items { print(line(user)) }
                    printPaging(page)
                }
            }
        }
    }

    /// `tether objects channel …`.
    struct Channel: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "channel", abstract: "A channel's metadata: get, set, remove, list.",
            subcommands: [Get.self, SetFields.self, Remove.self, List.self])

        struct Get: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Print a channel's metadata (404 when there is none).")
            @OptionGroup var client: ClientOptions
            @Argument(help: "The channel.") var id: String

            func run() async throws {
                try await withClient(client) { (c: TetherClient) throws(TetherError) in
                    print(line(try await c.fetchChannelMetadata(channel: id)))
                }
            }
        }

        struct SetFields: AsyncParsableCommand {
            static let configuration = CommandConfiguration(commandName: "set", abstract: "Set fields of a channel's metadata (others are kept).")
            @OptionGroup var client: ClientOptions
            @Argument(help: "The channel.") var id: String
            @Option(help: "Display name.") var name: String?
            @Option(help: "Description.") var description: String?
            @Option(help: "Status, up to 50 characters.") var status: String?
            @Option(help: "Type, up to 50 characters.") var type: String?
            @Option(help: "Custom fields as a JSON object of strings, numbers and booleans.") var custom: String?
            @Option(help: "Only if the stored eTag is this one (412 otherwise).") var ifMatch: String?

            func validate() throws { _ = try parseCustom(custom) }

            func run() async throws {
                let channel = ChannelMetadata(id: id, name: name, description: description, status: status, type: type,
                                              custom: try parseCustom(custom))
                try await withClient(client) { (c: TetherClient) throws(TetherError) in
                    print(line(try await c.setChannelMetadata(channel, ifMatchesETag: ifMatch)))
                }
            }
        }

        struct Remove: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Remove a channel's metadata and members.")
            @OptionGroup var client: ClientOptions
            @Argument(help: "The channel.") var id: String

            func run() async throws {
                try await withClient(client) { (c: TetherClient) throws(TetherError) in
                    try await c.removeChannelMetadata(channel: id)
                    print("removed \(id)")
                }
            }
        }

        struct List: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "List channels, one per line; prints the next page's cursor.")
            @OptionGroup var client: ClientOptions
            @OptionGroup var list: ObjectsListOptions

            func run() async throws {
                try await withClient(client) { (c: TetherClient) throws(TetherError) in
                    let page = try await c.fetchAllChannelMetadata(filter: list.filter, sort: list.sortKeys, limit: list.limit,
                                                                   page: list.cursor)
                    for channel in page.items { print(line(channel)) }
                    printPaging(page)
                }
            }
        }
    }

    /// `tether objects memberships …`.
    struct Memberships: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "memberships", abstract: "A user's channel memberships: list, add, remove.",
            subcommands: [List.self, Add.self, Remove.self])

        struct List: AsyncParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "List a user's memberships: channel, then the membership's fields.")
            @OptionGroup var client: ClientOptions
            @Argument(help: "The user id.") var user: String
            @OptionGroup var list: ObjectsListOptions

            func run() async throws {
                try await withClient(client) { (c: TetherClient) throws(TetherError) in
                    let page = try await c.fetchMemberships(userId: user, filter: list.filter, sort: list.sortKeys, limit: list.limit,
                                                            page: list.cursor)
                    for m in page.items { print(line(m)) }
                    printPaging(page)
                }
            }
        }

        struct Add: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Add (or update) a user's memberships of channels.")
            @OptionGroup var client: ClientOptions
            @Argument(help: "The user id.") var user: String
            @Argument(help: "The channels.") var channels: [String]
            @Option(help: "The membership's status.") var status: String?
            @Option(help: "The membership's type.") var type: String?
            @Option(help: "The membership's custom fields (a JSON object).") var custom: String?

            func validate() throws {
                guard !channels.isEmpty, channels.count <= 100 else { throw ValidationError("name 1-100 channels") }
                _ = try parseCustom(custom)
            }

            func run() async throws {
                let custom = try parseCustom(custom)
                let updates = channels.map { MembershipUpdate($0, custom: custom, status: status, type: type) }
                try await withClient(client) { (c: TetherClient) throws(TetherError) in
                    try await c.setMemberships(updates, userId: user)
                    print("added \(user) to \(channels.joined(separator: ", "))")
                }
            }
        }

        struct Remove: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Remove a user's memberships of channels.")
            @OptionGroup var client: ClientOptions
            @Argument(help: "The user id.") var user: String
            @Argument(help: "The channels.") var channels: [String]

            func validate() throws {
                guard !channels.isEmpty, channels.count <= 100 else { throw ValidationError("name 1-100 channels") }
            }

            func run() async throws {
                try await withClient(client) { (c: TetherClient) throws(TetherError) in
                    try await c.removeMemberships(channels: channels, userId: user)
                    print("removed \(user) from \(channels.joined(separator: ", "))")
                }
            }
        }
    }
}

/// `--filter`, `--sort`, `--limit`, `--next` / `--prev` of the list commands.
struct ObjectsListOptions: ParsableArguments {
    @Option(help: #"A filter in PubNub's App Context language, e.g. 'name LIKE "A*" && custom.role == "admin"'."#)
    var filter: String?

    @Option(help: "Sort keys, e.g. name:asc or updated:desc (repeat or comma-separate for several).")
    var sort: [String] = []

    @Option(help: "How many per page (1-100).")
    var limit: Int = 100

    @Option(help: "The cursor a previous list printed as next: (the following page).")
    var next: String?

    @Option(help: "The cursor a previous list printed as prev: (the page before).")
    var prev: String?

    func validate() throws {
        guard (1...100).contains(limit) else { throw ValidationError("--limit must be 1-100") }
        if next != nil && prev != nil { throw ValidationError("give --next or --prev, not both") }
    }

    var sortKeys: [String] { sort.flatMap { $0.split(separator: ",").map(String.init) } }
    var cursor: PageCursor? { next.map(PageCursor.next) ?? prev.map(PageCursor.previous) }
}

private func parseCustom(_ text: String?) throws -> [String: JSONValue]? {
    guard let text else { return nil }
    guard case .object(let members)? = try? JSONValue(parsing: text) else {
        throw ValidationError(#"--custom must be a JSON object, e.g. '{"role":"admin"}'"#)
    }
    return members
}

private func pairs(_ fields: [(String, String?)], custom: [String: JSONValue]?, updated: String?, eTag: String?) -> String {
    var parts = fields.compactMap { name, value in value.map { "\(name)=\($0)" } }
    if let custom { parts.append("custom=" + String(decoding: JSONValue.object(custom).jsonBytes, as: UTF8.self)) }
    if let updated { parts.append("updated=\(updated)") }
    if let eTag { parts.append("eTag=\(eTag)") }
    return parts.joined(separator: "  ")
}

private func line(_ u: UserMetadata) -> String {
    u.id + "  " + pairs([("name", u.name), ("email", u.email), ("externalId", u.externalId), ("profileUrl", u.profileUrl),
                         ("status", u.status), ("type", u.type)], custom: u.custom, updated: u.updated, eTag: u.eTag)
}

private func line(_ c: ChannelMetadata) -> String {
    c.id + "  " + pairs([("name", c.name), ("description", c.description), ("status", c.status), ("type", c.type)], custom: c.custom,
                        updated: c.updated, eTag: c.eTag)
}

private func line(_ m: Membership) -> String {
    m.channel.id + "  " + pairs([("name", m.channel.name), ("status", m.status), ("type", m.type)], custom: m.custom, updated: m.updated,
                                eTag: m.eTag)
}

private func printPaging<Item>(_ page: AppContextPage<Item>) {
    if let total = page.totalCount { print("total: \(total)") }
    if !page.items.isEmpty, case .next(let cursor)? = page.next { print("next: \(cursor)") }
    if case .previous(let cursor)? = page.previous { print("prev: \(cursor)") }
}
