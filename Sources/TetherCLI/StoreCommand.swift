import ArgumentParser
import Foundation
import TetherServer

/// `tether store`: look after the SQLite store of a data directory.
struct StoreCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "store",
        abstract: "Check the store of a data directory, or recover a damaged one.",
        discussion: """
            The store is one SQLite file, <data-dir>/tether.sqlite (with -wal and -shm beside it \
            while in use). `tether serve` runs SQLite's quick check at every start and refuses a \
            damaged file with a message naming it. Then:

              tether store check --data-dir /var/lib/tether     # what is wrong (exit 1 if damaged)
              tether store recover --data-dir /var/lib/tether   # move it aside, salvage, start fresh

            See docs/operations.md.
            """,
        subcommands: [StoreCheck.self, StoreRecover.self]
    )
}

/// The data directory option shared by the store commands (same flag and environment as serve).
struct DataDirectoryOption: ParsableArguments {
    @Option(name: .customLong("data-dir"), help: "Directory holding the store, as given to serve. [env: TETHER_DATA_DIR] (default: ./.tether-data)")
    var dataDir: String?

    var resolved: String { dataDir ?? ProcessInfo.processInfo.environment["TETHER_DATA_DIR"] ?? ".tether-data" }
}

/// `tether store check`.
struct StoreCheck: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "check",
        abstract: "Run SQLite's integrity check on the store; exit 0 when it is consistent, 1 when it is damaged or missing.",
        discussion: """
            Reads the store only, so it is safe while a server runs on it. Prints "ok" or each \
            problem SQLite reports (at most 100). --quick runs quick_check instead: it skips the \
            cross-checks between tables and their indexes and takes about as long as reading the \
            file once.
            """
    )

    @OptionGroup var directory: DataDirectoryOption

    @Flag(help: "Run PRAGMA quick_check instead of the full PRAGMA integrity_check.")
    var quick = false

    func run() throws {
        let result = StoreRecovery.check(directory: directory.resolved, thorough: !quick)
        switch result.outcome {
        case .consistent:
            print("\(result.path): ok (\(quick ? "quick_check" : "integrity_check") passed)")
        case .missing:
            print("\(result.path): no store here (nothing to check; serve creates one)")
            throw ExitCode(1)
        case .damaged(let problems):
            print("\(result.path): DAMAGED")
            for problem in problems { print("  \(problem)") }
            print("Stop any server on this directory and run `tether store recover --data-dir \(directory.resolved)` "
                  + "to move the file aside and salvage what can be read, or restore a backup.")
            throw ExitCode(1)
        }
    }
}

/// `tether store recover`.
struct StoreRecover: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "recover",
        abstract: "Move a damaged store aside and salvage what can still be read into a fresh one.",
        discussion: """
            Needs no server running on the data directory (it refuses otherwise). Checks the \
            store first and does nothing when it is consistent, unless --force. Otherwise it \
            renames tether.sqlite (and its -wal and -shm) to tether.damaged-<UTC time>.sqlite, \
            kept for inspection, and builds a fresh tether.sqlite: every table is read in key \
            order until damage stops it and then backwards from its end, so only rows on damaged \
            pages are lost. It prints, per table, how many rows were kept and whether some could \
            not be read. Presence memberships are salvaged like the rest; a uuid whose row was \
            lost simply joins again on its next heartbeat. `tether serve` then starts on the new \
            file; delete the damaged copy once you no longer need it.
            """
    )

    @OptionGroup var directory: DataDirectoryOption

    @Flag(help: "Rebuild even when the integrity check passes.")
    var force = false

    func run() throws {
        let dir = directory.resolved
        let lock = try DataDirectoryLock(directory: dir)
        defer { withExtendedLifetime(lock) {} }
        let check = StoreRecovery.check(directory: dir)
        switch check.outcome {
        case .missing:
            print("\(check.path): no store here; nothing to recover")
            return
        case .consistent where !force:
            print("\(check.path): integrity_check passed; nothing to recover (--force rebuilds anyway)")
            return
        case .consistent, .damaged:
            break
        }
        let report = try StoreRecovery.recover(directory: dir)
        print("Moved aside (kept for inspection):")
        for file in report.moved { print("  \(file.from) -> \(file.to)") }
        if let unreadable = report.unreadable {
            print("Nothing could be read from the damaged file (\(unreadable)).")
            print("Started a fresh, empty store at \(report.path): all messages, groups, grants and presence are lost.")
            return
        }
        print("Fresh store \(report.path):")
        let width = report.tables.map(\.name.count).max() ?? 0
        var incomplete = 0
        for table in report.tables {
            let name = table.name.padding(toLength: width, withPad: " ", startingAt: 0)
            if let problem = table.problem {
                incomplete += 1
                print("  \(name)  \(table.kept) rows kept; some rows LOST (reading stopped: \(problem))")
            } else {
                print("  \(name)  \(table.kept) rows kept (all)")
            }
        }
        print(incomplete == 0 ? "Every readable table was copied whole." : "\(incomplete) table(s) lost rows on damaged pages.")
    }
}
