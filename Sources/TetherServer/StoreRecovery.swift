public import Foundation
import GRDB
import Logging
import TetherProtocol

extension MessageStore {
    /// SQLite's quick check at start-up: every page of the file is read once, so damage is
    /// found before the server accepts a request rather than by whichever request first reads a
    /// damaged page.
    /// - Throws: ``StoreOpenError`` with code `damaged` listing the first problems.
    func verifyIntegrity() throws {
        let problems = try pool.read { db in try String.fetchAll(db, sql: "PRAGMA quick_check(20)") }
        guard problems != ["ok"] else { return }
        throw StoreOpenError(code: .damaged, path: path,
                             reason: "SQLite's quick check failed: " + problems.prefix(5).joined(separator: "; "))
    }
}

/// The outcome of ``StoreRecovery/check(directory:thorough:)``.
public struct StoreCheckResult: Sendable {
    /// What the check found.
    public enum Outcome: Sendable, Equatable {
        /// SQLite's check passed.
        case consistent
        /// The check failed; SQLite's messages (at most 100), or the error that stopped it.
        case damaged(problems: [String])
        /// There is no store file.
        case missing
    }

    /// The SQLite file checked.
    public var path: String
    /// What the check found.
    public var outcome: Outcome
}

/// What ``StoreRecovery/recover(directory:now:)`` did.
public struct StoreRecoveryReport: Sendable {
    /// A file moved aside.
    public struct MovedFile: Sendable {
        /// Where it was.
        public var from: String
        /// Where it is now.
        public var to: String
    }

    /// What was salvaged from one table.
    public struct Table: Sendable {
        /// The table.
        public var name: String
        /// Rows copied into the fresh store.
        public var kept: Int
        /// `nil` when every row was read; otherwise what stopped the reading (rows on damaged
        /// pages, and in the worst case the whole table, are lost).
        public var problem: String?
    }

    /// The damaged files, moved aside.
    public var moved: [MovedFile]
    /// The fresh store (the original path).
    public var path: String
    /// Per table of the fresh store, what was salvaged.
    public var tables: [Table]
    /// Set when nothing could be read from the damaged file at all.
    public var unreadable: String?
}

/// `tether store check` and `tether store recover`: SQLite's integrity check, and moving a
/// damaged store aside while salvaging what can still be read (docs/operations.md).
///
/// Neither needs the server; `recover` must not run while one uses the data directory
/// (``DataDirectoryLock`` makes sure of that for `tether serve`).
public enum StoreRecovery {
    /// Runs `PRAGMA integrity_check` (or `quick_check` when not `thorough`: no index/table
    /// cross-checks, faster) on the store in `directory`, read-only.
    public static func check(directory: String, thorough: Bool = true) -> StoreCheckResult {
        let path = MessageStore.databasePath(in: directory)
        guard FileManager.default.fileExists(atPath: path) else { return StoreCheckResult(path: path, outcome: .missing) }
        do {
            try StoreOpenError.checkNotEmpty(path: path)
            let queue = try DatabaseQueue(path: path, configuration: readOnly)
            defer { try? queue.close() }
            let pragma = thorough ? "integrity_check" : "quick_check"
            let lines = try queue.read { db in try String.fetchAll(db, sql: "PRAGMA \(pragma)(100)") }
            return StoreCheckResult(path: path, outcome: lines == ["ok"] ? .consistent : .damaged(problems: lines))
        } catch {
            return StoreCheckResult(path: path, outcome: .damaged(problems: [StoreOpenError(classifying: error, path: path).reason]))
        }
    }

    /// Moves the store in `directory` (with its `-wal` and `-shm`) aside to
    /// `tether.damaged-<UTC time>.sqlite`, then builds a fresh store at the original path with
    /// every row that can still be read, table by table: each table is read in key order until
    /// damage stops it, then backwards from its end, so only rows on damaged pages are lost.
    /// Timetokens keep increasing: the fresh store's `highest_timetoken` is at least the highest
    /// stored timetoken, the salvaged row, and the damaged files' last write plus the cursor
    /// lease (``LongPollHub/cursorLease``): the lease a server takes never runs further ahead of
    /// the clock of its last write, so no cursor it handed out is above that, even when the row
    /// itself was lost and the clock is now behind.
    ///
    /// If salvaging fails outright the fresh file is not created: the server then starts on an
    /// empty store, and the damaged copy is still there.
    public static func recover(directory: String, now: Date = Date()) throws -> StoreRecoveryReport {
        let manager = FileManager.default
        let path = MessageStore.databasePath(in: directory)
        guard manager.fileExists(atPath: path) else { throw StoreError(.failed, "no store at \(path); nothing to recover") }
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.dateFormat = "yyyyMMdd'T'HHmmss'Z'"
        let stamp = formatter.string(from: now)
        let aside = (directory as NSString).appendingPathComponent("tether.damaged-\(stamp).sqlite")
        let lastWritten = lastWriteFloor(path: path)
        var moved: [StoreRecoveryReport.MovedFile] = []
        for suffix in ["", "-wal", "-shm"] where manager.fileExists(atPath: path + suffix) {
            try manager.moveItem(atPath: path + suffix, toPath: aside + suffix)
            moved.append(.init(from: path + suffix, to: aside + suffix))
        }

        // The fresh store is built beside it and renamed into place only when complete.
        let scratch = (directory as NSString).appendingPathComponent(".tether-recovering-\(stamp)")
        try? manager.removeItem(atPath: scratch)
        defer { try? manager.removeItem(atPath: scratch) }
        var logger = Logger(label: "tether.store.recover")
        logger.logLevel = .critical
        try MessageStore(directory: scratch, logger: logger, metrics: ServerMetrics()).close()
        let freshPath = MessageStore.databasePath(in: scratch)
        // Foreign keys off while copying: a message action whose message was lost is removed
        // afterwards, rather than stopping its table's salvage at the first such row.
        var copying = Configuration()
        copying.foreignKeysEnabled = false
        let fresh = try DatabaseQueue(path: freshPath, configuration: copying)

        var tables: [StoreRecoveryReport.Table] = []
        var unreadable: String?
        do {
            let damaged = try DatabaseQueue(path: aside, configuration: readOnly)
            defer { try? damaged.close() }
            let names = try fresh.read { db in
                try String.fetchAll(db, sql: """
                    SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name <> 'grdb_migrations'
                    ORDER BY name
                    """)
            }
            for name in names {
                tables.append(try salvage(table: name, from: damaged, into: fresh))
            }
        } catch {
            unreadable = StoreOpenError(classifying: error, path: aside).reason
        }
        try fresh.write { db in
            // Timetokens must keep increasing even if the record of the highest one was lost,
            // and stay above every cursor the last server on the file handed out (its lease).
            if let lastWritten {
                try db.execute(sql: """
                    INSERT INTO server_state (key, value) VALUES ('highest_timetoken', ?)
                    ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)
                    """, arguments: [lastWritten])
            }
            try db.execute(sql: """
                INSERT INTO server_state (key, value) SELECT 'highest_timetoken', max(timetoken) FROM message WHERE true HAVING count(*) > 0
                ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)
                """)
            try db.execute(sql: """
                INSERT INTO server_state (key, value) SELECT 'highest_timetoken', max(action_tt) FROM message_action WHERE true
                HAVING count(*) > 0
                ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)
                """)
            try db.execute(sql: """
                DELETE FROM message_action WHERE NOT EXISTS (
                    SELECT 1 FROM message m WHERE m.sub_key = message_action.sub_key AND m.channel = message_action.channel
                    AND m.timetoken = message_action.message_tt)
                """)
        }
        try fresh.close()
        for suffix in ["-wal", "-shm"] where manager.fileExists(atPath: freshPath + suffix) {
            try manager.moveItem(atPath: freshPath + suffix, toPath: path + suffix)
        }
        try manager.moveItem(atPath: freshPath, toPath: path)
        return StoreRecoveryReport(moved: moved, path: path, tables: tables, unreadable: unreadable)
    }

    /// The store's last write (the later modification time of the file and its WAL) plus the
    /// cursor lease, as a stored timetoken; `nil` when neither time can be read.
    static func lastWriteFloor(path: String) -> Int64? {
        var latest: Date?
        for suffix in ["", "-wal"] {
            guard let date = (try? FileManager.default.attributesOfItem(atPath: path + suffix))?[.modificationDate] as? Date
            else { continue }
            latest = max(latest ?? date, date)
        }
        guard let latest, latest.timeIntervalSince1970 > 0 else { return nil }
        let written = Timetoken(unixSeconds: latest.timeIntervalSince1970).storageValue
        let (floor, overflow) = written.addingReportingOverflow(LongPollHub.cursorLease)
        return overflow ? written : floor
    }

    /// Copies the readable rows of `table` (the columns both schemas have): forwards in key
    /// order until an error, then backwards from the end until an error or a row already copied.
    private static func salvage(table: String, from damaged: DatabaseQueue, into fresh: DatabaseQueue) throws
        -> StoreRecoveryReport.Table
    {
        let quotedTable = table.quotedDatabaseIdentifier
        let freshColumns = try fresh.read { db in try Row.fetchAll(db, sql: "PRAGMA table_info(\(quotedTable))") }
        let damagedColumns: Set<String>
        do {
            damagedColumns = Set(try damaged.read { db in
                try Row.fetchAll(db, sql: "PRAGMA table_info(\(quotedTable))").map { $0["name"] as String }
            })
        } catch {
            return .init(name: table, kept: 0, problem: "its definition could not be read: \(StoreOpenError(classifying: error, path: "").reason)")
        }
        guard !damagedColumns.isEmpty else { return .init(name: table, kept: 0, problem: nil) }  // a table newer than the file
        let columns = freshColumns.map { $0["name"] as String }.filter(damagedColumns.contains)
        let key = freshColumns.filter { ($0["pk"] as Int) > 0 }.sorted { ($0["pk"] as Int) < ($1["pk"] as Int) }
            .map { ($0["name"] as String).quotedDatabaseIdentifier }
        let order = key.isEmpty ? ["rowid"] : key
        let list = columns.map(\.quotedDatabaseIdentifier).joined(separator: ", ")
        let insert = "INSERT OR IGNORE INTO \(quotedTable) (\(list)) VALUES (\(Array(repeating: "?", count: columns.count).joined(separator: ", ")))"
        var kept = 0
        var problem: String?
        try fresh.inTransaction { db in
            let statement = try db.makeStatement(sql: insert)
            do {
                try damaged.read { old in
                    let rows = try Row.fetchCursor(old, sql: "SELECT \(list) FROM \(quotedTable) ORDER BY \(order.joined(separator: ", "))")
                    while let row = try rows.next() {
                        try statement.execute(arguments: StatementArguments(row.databaseValues))
                        kept += db.changesCount
                    }
                }
            } catch {
                problem = StoreOpenError(classifying: error, path: "").reason
                // The rows after the damage: read from the other end until it is met again.
                try? damaged.read { old in
                    let descending = order.map { "\($0) DESC" }.joined(separator: ", ")
                    let rows = try Row.fetchCursor(old, sql: "SELECT \(list) FROM \(quotedTable) ORDER BY \(descending)")
                    while let row = try rows.next() {
                        try statement.execute(arguments: StatementArguments(row.databaseValues))
                        if db.changesCount == 0 { break }
                        kept += 1
                    }
                }
            }
            return .commit
        }
        return .init(name: table, kept: kept, problem: problem)
    }

    private static var readOnly: Configuration {
        var configuration = Configuration()
        configuration.readonly = true
        return configuration
    }
}
