import ArgumentParser
import Foundation
import Tether

/// `tether files`: upload, list, download and delete the files shared on a channel.
struct FilesCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "files",
        abstract: "Upload, list, download or delete files shared on a channel.",
        discussion: """
            The user is --user-id (an upload is announced as that user's file message):

              tether files upload chat ./photo.png --message '{"caption":"look"}'
              tether files list chat
              tether files download chat <file-id> photo.png --output ./photo.png
              tether files delete chat <file-id> photo.png
            """,
        subcommands: [Upload.self, List.self, Download.self, Delete.self])

    /// `tether files upload <channel> <path>`.
    struct Upload: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Upload a local file and publish its file message; prints the file id, name and timetoken.")

        @OptionGroup var client: ClientOptions
        @Argument(help: "The channel.") var channel: String
        @Argument(help: "The local file to upload.") var path: String

        @Option(help: "The file's name on the channel. (default: the path's last component)")
        var name: String?

        @Option(help: "A JSON message sent with the file.")
        var message: String?

        @Option(name: .customLong("content-type"), help: "The content type served on download. (default: from the name)")
        var contentType: String?

        func validate() throws {
            if let name, name.isEmpty || name.utf8.count > 255 { throw ValidationError("--name must be 1-255 bytes") }
            if let message, (try? JSONValue(parsing: message)) == nil { throw ValidationError("--message must be JSON") }
            guard FileManager.default.isReadableFile(atPath: path) else { throw ValidationError("cannot read \(path)") }
        }

        func run() async throws {
            let json = try message.map { try JSONValue(parsing: $0) }
            try await withClient(client) { (c: TetherClient) throws(TetherError) in
                let sent = try await c.sendFile(channel: channel, fileURL: URL(fileURLWithPath: path), name: name, message: json,
                                                contentType: contentType)
                print("\(sent.id)  \(sent.name)  \(sent.timetoken)")
            }
        }
    }

    /// `tether files list <channel>`.
    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print a channel's files, oldest first: id, size in bytes, created, name.")

        @OptionGroup var client: ClientOptions
        @Argument(help: "The channel.") var channel: String

        @Option(help: "Files per page (1-100). (default: 100)")
        var limit: Int = 100

        @Option(help: "The cursor printed after a full page (paging).")
        var next: String?

        func validate() throws {
            guard (1...100).contains(limit) else { throw ValidationError("--limit must be 1-100") }
        }

        func run() async throws {
            try await withClient(client) { (c: TetherClient) throws(TetherError) in
                let page = try await c.listFiles(channel: channel, limit: limit, next: next)
                for file in page.files { print("\(file.id)  \(file.size)  \(file.created)  \(file.name)") }
                if let next = page.next { print("more: --next \(next)") }
            }
        }
    }

    /// `tether files download <channel> <id> <name>`.
    struct Download: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Download a file to --output (or standard output).")

        @OptionGroup var client: ClientOptions
        @Argument(help: "The channel.") var channel: String
        @Argument(help: "The file's id.") var id: String
        @Argument(help: "The file's name.") var name: String

        @Option(help: "Where to write the bytes. (default: standard output)")
        var output: String?

        func run() async throws {
            var bytes: [UInt8] = []
            try await withClient(client) { (c: TetherClient) throws(TetherError) in
                bytes = try await c.downloadFile(channel: channel, fileId: id, fileName: name).data
            }
            if let output {
                try Data(bytes).write(to: URL(fileURLWithPath: output), options: .atomic)
                print("wrote \(bytes.count) bytes to \(output)")
            } else {
                FileHandle.standardOutput.write(Data(bytes))
            }
        }
    }

    /// `tether files delete <channel> <id> <name>`.
    struct Delete: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Delete a file (its bytes and list entry; the message that announced it stays).")

        @OptionGroup var client: ClientOptions
        @Argument(help: "The channel.") var channel: String
        @Argument(help: "The file's id.") var id: String
        @Argument(help: "The file's name.") var name: String

        func run() async throws {
            try await withClient(client) { (c: TetherClient) throws(TetherError) in
                try await c.deleteFile(channel: channel, fileId: id, fileName: name)
                print("deleted \(id)")
            }
        }
    }
}
