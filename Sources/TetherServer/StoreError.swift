import GRDB

/// Errors from the store: a code callers switch on, a message for humans, and the underlying
/// error when there is one.
public struct StoreError: Error, CustomStringConvertible {
    /// What kind of failure; extensible.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        /// The code's name.
        public var description: String

        /// The file or its size cap (`store.maxBytes`) is full: nothing more can be stored until
        /// space returns (retention, deletes, a larger cap or disk).
        public static let full = Code(description: "full")
        /// The write queue holds `store.writeQueueLimit` writes: try again shortly.
        public static let queueFull = Code(description: "queueFull")
        /// SQLite's write lock was held by someone else for longer than the busy timeout.
        public static let busy = Code(description: "busy")
        /// The write waited longer than `store.writeTimeoutSeconds` before it started: it was
        /// withdrawn and is certainly not stored.
        public static let timedOut = Code(description: "timedOut")
        /// The write's transaction was running when its deadline passed: it may or may not be
        /// stored (the eventual outcome is logged).
        public static let outcomeUnknown = Code(description: "outcomeUnknown")
        /// The file cannot be written (permissions, read-only file system).
        public static let readonly = Code(description: "readonly")
        /// The shared database of a cluster cannot be reached (`tether serve --database-url`).
        public static let unavailable = Code(description: "unavailable")
        /// Any other failure (I/O error, corruption).
        public static let failed = Code(description: "failed")
    }

    /// What kind of failure.
    public var code: Code
    /// What went wrong, for logs and error bodies.
    public var message: String
    /// The underlying error, if any.
    public var cause: (any Error)?

    /// Creates an error.
    public init(_ code: Code, _ message: String, cause: (any Error)? = nil) {
        self.code = code
        self.message = message
        self.cause = cause
    }

    /// The error with its cause.
    public var description: String {
        if let cause { return "\(message) (\(cause))" }
        return message
    }

    /// The error as a store failure when it is one (a ``StoreError``, or SQLite refusing a write
    /// for lack of space, permission or the lock); `nil` for anything else.
    static func storageFailure(_ error: any Error) -> StoreError? {
        if let error = error as? StoreError { return error }
        guard error is DatabaseError else { return nil }
        let classified = classify(error)
        return classified.code == .failed ? nil : classified
    }

    /// Classifies any error thrown by a store write.
    static func classify(_ error: any Error) -> StoreError {
        if let error = error as? StoreError { return error }
        guard let database = error as? DatabaseError else {
            return StoreError(.failed, "store write failed", cause: error)
        }
        switch database.resultCode {
        case .SQLITE_FULL:
            return StoreError(.full, "store is full", cause: error)
        case .SQLITE_BUSY, .SQLITE_LOCKED:
            return StoreError(.busy, "store is busy", cause: error)
        case .SQLITE_READONLY, .SQLITE_CANTOPEN, .SQLITE_PERM:
            return StoreError(.readonly, "store is read-only", cause: error)
        default:
            return StoreError(.failed, "store write failed", cause: error)
        }
    }
}

/// What the store can currently do with a write, as `/health` reports it.
public enum StoreCondition: String, Sendable {
    /// Writes succeed.
    case writable
    /// The file or its size cap is full.
    case full
    /// The file cannot be written.
    case readonly
    /// A write has been waiting for SQLite's write lock (or for the disk) for over a second.
    case stalled
    /// Writes fail for another reason (I/O error, corruption).
    case failing

    init(_ error: StoreError) {
        switch error.code {
        case .full: self = .full
        case .readonly: self = .readonly
        case .busy, .timedOut, .outcomeUnknown, .queueFull: self = .stalled
        default: self = .failing
        }
    }
}

/// How the store writes.
public struct StoreOptions: Sendable, Equatable {
    /// How far an acknowledged publish survives.
    public enum Durability: String, Sendable, Codable, Equatable {
        /// `synchronous = FULL`: every acknowledged write is fsynced; survives power loss.
        case full
        /// `synchronous = NORMAL`: survives a crash of the process, but the last commits before
        /// a power loss or kernel crash may be lost. Fewer fsyncs.
        case normal
    }

    /// Default `full`.
    public var durability: Durability
    /// Size cap of the database file in bytes (`PRAGMA max_page_count`), or `nil` for none.
    /// At the cap, stored publishes fail with 507 until retention or deletes free pages.
    public var maximumBytes: Int?
    /// How long a publish waits for its write before it is answered with an error (default 5 s).
    public var writeTimeout: Duration
    /// Writes waiting for the writer at most (default 4,096); beyond it publishes that must be
    /// stored are answered 503 with `Retry-After`.
    public var writeQueueLimit: Int

    /// Creates options.
    public init(durability: Durability = .full, maximumBytes: Int? = nil, writeTimeout: Duration = .seconds(5),
                writeQueueLimit: Int = 4096) {
        self.durability = durability
        self.maximumBytes = maximumBytes
        self.writeTimeout = writeTimeout
        self.writeQueueLimit = writeQueueLimit
    }
}
