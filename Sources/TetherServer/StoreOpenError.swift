import Foundation
import GRDB

/// Why the server cannot start on its store, with the file and what the operator should do.
///
/// Its ``description`` is the whole message `tether serve` prints before exiting non-zero:
///
/// ```text
/// the store /var/lib/tether/tether.sqlite is damaged: database disk image is malformed (SQLite error 11).
/// Nothing was changed. See what is wrong with `tether store check --data-dir /var/lib/tether`; …
/// ```
public struct StoreOpenError: Error, CustomStringConvertible {
    /// What kind of failure; extensible (new codes may be added).
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private enum Wrapped: Hashable, Sendable {
            case notADatabase, damaged, empty, unreadable, cannotOpen
        }

        private let wrapped: Wrapped

        /// The file is not an SQLite database at all (overwritten, or another file put there).
        public static let notADatabase = Code(wrapped: .notADatabase)
        /// SQLite found the file damaged (malformed pages, failed quick check, truncation).
        public static let damaged = Code(wrapped: .damaged)
        /// The file exists but is empty: truncated to nothing, or its creation was interrupted.
        public static let empty = Code(wrapped: .empty)
        /// Reading the file failed with an I/O error (the disk, or a file cut short).
        public static let unreadable = Code(wrapped: .unreadable)
        /// The file or its directory could not be opened (path, permissions, space).
        public static let cannotOpen = Code(wrapped: .cannotOpen)

        /// Whether `tether store check` / `tether store recover` are the way out.
        public var isDamage: Bool {
            switch wrapped {
            case .notADatabase, .damaged, .empty, .unreadable: return true
            case .cannotOpen: return false
            }
        }

        public var description: String {
            switch wrapped {
            case .notADatabase: return "not-a-database"
            case .damaged: return "damaged"
            case .empty: return "empty"
            case .unreadable: return "unreadable"
            case .cannotOpen: return "cannot-open"
            }
        }
    }

    /// What kind of failure.
    public var code: Code
    /// The SQLite file.
    public var path: String
    /// What was found, in SQLite's words where it said something.
    public var reason: String
    /// The underlying error, if any.
    public var cause: (any Error)?

    /// Creates an error.
    public init(code: Code, path: String, reason: String, cause: (any Error)? = nil) {
        self.code = code
        self.path = path
        self.reason = reason
        self.cause = cause
    }

    /// Maps an error from opening or first reading the store at `path`.
    public init(classifying error: any Error, path: String) {
        if let error = error as? StoreOpenError {
            self = error
            return
        }
        guard let database = error as? DatabaseError else {
            self.init(code: .cannotOpen, path: path, reason: "\(error)", cause: error)
            return
        }
        let reason = "\(database.message ?? "SQLite error") (SQLite error \(database.extendedResultCode.rawValue))"
        switch database.resultCode {
        case .SQLITE_NOTADB: self.init(code: .notADatabase, path: path, reason: reason, cause: error)
        case .SQLITE_CORRUPT: self.init(code: .damaged, path: path, reason: reason, cause: error)
        case .SQLITE_IOERR: self.init(code: .unreadable, path: path, reason: reason, cause: error)
        default: self.init(code: .cannotOpen, path: path, reason: reason, cause: error)
        }
    }

    /// The directory holding the file, as `--data-dir` takes it.
    public var dataDirectory: String { (path as NSString).deletingLastPathComponent }

    public var description: String {
        let what: String
        switch code {
        case .notADatabase: what = "is not an SQLite database"
        case .empty: what = "is empty"
        case .cannotOpen: what = "cannot be opened"
        default: what = "is damaged"
        }
        var text = "the store \(path) \(what): \(reason)."
        if code.isDamage {
            let dir = Self.shellQuoted(dataDirectory)
            text += """

                The server did not start and changed nothing. See what is wrong with \
                `tether store check --data-dir \(dir)`; then, with no server running on it, \
                `tether store recover --data-dir \(dir)` moves the damaged file aside (kept for \
                inspection) and copies every row it can still read into a fresh store. Or restore \
                a backup to that path.
                """
        } else {
            text += "\nCheck that the data directory exists and is writable by this user, and that the disk has space."
        }
        return text
    }

    /// An existing zero-length database file: SQLite would take it for a new, empty store and
    /// the server would start as if nothing had ever been stored.
    static func checkNotEmpty(path: String) throws {
        let manager = FileManager.default
        guard let size = (try? manager.attributesOfItem(atPath: path))?[.size] as? Int, size == 0 else { return }
        let walSize = (try? manager.attributesOfItem(atPath: path + "-wal"))?[.size] as? Int ?? 0
        guard walSize == 0 else { return }
        throw StoreOpenError(code: .empty, path: path,
                             reason: "0 bytes, so everything it held is gone (truncated, or its creation was interrupted)")
    }

    static func shellQuoted(_ text: String) -> String {
        let safe = CharacterSet.alphanumerics.union(CharacterSet(charactersIn: "/._-+:@%"))
        if !text.isEmpty, text.unicodeScalars.allSatisfy(safe.contains) { return text }
        return "'" + text.replacingOccurrences(of: "'", with: "'\\''") + "'"
    }
}
