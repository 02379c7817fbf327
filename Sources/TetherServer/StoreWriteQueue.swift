/// The store's bounded write queue: which publishes wait to be written, which the writer has
/// taken, and which it has claimed inside a transaction. Pure: the shell (``MessageStore``)
/// holds it under a lock, and resumes the waiters it returns after releasing the lock.
///
/// A write moves through three phases:
///
/// - **queued**: waiting for the writer. Can transition to: taken, withdrawn.
/// - **taken**: in the writer's next batch, the writer waiting for SQLite's write lock.
///   Can transition to: claimed, withdrawn, failed.
/// - **claimed**: being inserted; its transaction may commit. Can transition to: committed,
///   done, failed, outcome unknown.
/// - **committed**: its transaction committed (the message is delivered) and the store is
///   making the WAL durable (``committed(_:)``; the embedded store only). Can transition to:
///   done, outcome unknown.
///
/// A publisher whose deadline passes *withdraws* a queued or taken write: the writer will never
/// insert it, so "not stored" is certain. Once claimed, the transaction can no longer be
/// stopped from committing, so the publisher is told the outcome is unknown; the eventual result
/// is reported as a *late* write (``Completion/late``) so the shell can settle it — deliver it if
/// it committed, release its timetoken if not.
struct StoreWriteQueue<Waiter> {
    /// One write request.
    struct Entry {
        var id: UInt64
        var write: StoreWrite
        var waiter: Waiter
    }

    /// What a passed deadline did to a write.
    enum Expiry {
        /// It had not started: it will never be written. Resume the waiter with "not stored".
        case withdrawn(Waiter)
        /// Its transaction was running: it may or may not commit. Resume the waiter with
        /// "outcome unknown".
        case outcomeUnknown(Waiter)
        /// It was already answered.
        case alreadyDone
    }

    /// The writes a finished transaction answers.
    struct Completion {
        /// Waiters to resume with the transaction's outcome.
        var waiters: [Waiter]
        /// The write id of each of ``waiters``, in the same order.
        var ids: [UInt64] = []
        /// Writes whose publisher was already told "outcome unknown": this transaction's outcome
        /// is theirs too.
        var late: [UInt64]
    }

    /// Queued writes at most; beyond it ``enqueue(_:waiter:)`` refuses.
    let limit: Int
    private var nextID: UInt64 = 0
    private var queued: [Entry] = []
    private var taken: [UInt64: Waiter] = [:]
    private var claimed: [UInt64: Waiter] = [:]
    /// Committed writes waiting for the sync that makes them durable.
    private var syncing: [UInt64: Waiter] = [:]
    /// Claimed writes whose waiter was already answered "outcome unknown".
    private var orphaned: Set<UInt64> = []
    /// When each write not yet answered times out (queued, taken or claimed writes only).
    private var deadlines: [UInt64: ContinuousClock.Instant] = [:]

    init(limit: Int) { self.limit = limit }

    /// Writes waiting for the writer.
    var queuedCount: Int { queued.count }

    /// A fresh write id (taken before queueing, so the publisher's deadline can name it).
    mutating func makeID() -> UInt64 {
        nextID += 1
        return nextID
    }

    /// Queues write `id`. Returns `false` when the queue is full.
    mutating func enqueue(id: UInt64, _ write: StoreWrite, waiter: Waiter, deadline: ContinuousClock.Instant? = nil) -> Bool {
        guard queued.count < limit else { return false }
        queued.append(Entry(id: id, write: write, waiter: waiter))
        if let deadline { deadlines[id] = deadline }
        return true
    }

    /// Whether any write has a deadline still to pass.
    var hasDeadlines: Bool { !deadlines.isEmpty }

    /// Expires every write whose deadline is at or before `now` (see ``expire(_:)``).
    mutating func expireDue(now: ContinuousClock.Instant) -> [Expiry] {
        let due = deadlines.filter { $0.value <= now }.keys.sorted()
        return due.map { expire($0) }
    }

    /// Queues a message (``enqueue(id:_:waiter:)`` with no publish record).
    mutating func enqueue(id: UInt64, _ message: StoredMessage, waiter: Waiter) -> Bool {
        enqueue(id: id, StoreWrite(message: message, record: nil), waiter: waiter)
    }

    /// Takes every queued write as the writer's next batch.
    mutating func takeBatch() -> [(id: UInt64, write: StoreWrite)] {
        let batch = queued
        queued.removeAll(keepingCapacity: true)
        for entry in batch { taken[entry.id] = entry.waiter }
        return batch.map { ($0.id, $0.write) }
    }

    /// Called inside the writer's transaction: claims the batch's writes that were not
    /// withdrawn meanwhile. Returns the ids to insert.
    mutating func claim(_ ids: [UInt64]) -> Set<UInt64> {
        var result = Set<UInt64>()
        for id in ids {
            if let waiter = taken.removeValue(forKey: id) {
                claimed[id] = waiter
                result.insert(id)
            }
        }
        return result
    }

    /// The transaction that claimed `ids` failed, and the writer will try them again: the ones
    /// still claimed (not expired meanwhile) go back to being taken, to be claimed again.
    mutating func unclaim(_ ids: [UInt64]) {
        for id in ids {
            if let waiter = claimed.removeValue(forKey: id) { taken[id] = waiter }
        }
    }

    /// The deadline of write `id` passed.
    mutating func expire(_ id: UInt64) -> Expiry {
        deadlines.removeValue(forKey: id)
        if let index = queued.firstIndex(where: { $0.id == id }) {
            return .withdrawn(queued.remove(at: index).waiter)
        }
        if let waiter = taken.removeValue(forKey: id) { return .withdrawn(waiter) }
        if let waiter = claimed.removeValue(forKey: id) ?? syncing.removeValue(forKey: id) {
            orphaned.insert(id)
            return .outcomeUnknown(waiter)
        }
        return .alreadyDone
    }

    /// The transaction of batch `ids` committed, and is not yet durable: its claimed writes wait
    /// for the sync, their deadlines still running (a passed deadline is "outcome unknown").
    mutating func committed(_ ids: [UInt64]) {
        for id in ids {
            if let waiter = claimed.removeValue(forKey: id) { syncing[id] = waiter }
        }
    }

    /// The writes of batch `ids` are answered: their transaction failed (before or after
    /// claiming), or it committed and — after ``committed(_:)``, when the store syncs
    /// separately — the sync ended.
    mutating func finish(_ ids: [UInt64]) -> Completion {
        var completion = Completion(waiters: [], late: [])
        for id in ids {
            deadlines.removeValue(forKey: id)
            if let waiter = claimed.removeValue(forKey: id) ?? syncing.removeValue(forKey: id) ?? taken.removeValue(forKey: id) {
                completion.waiters.append(waiter)
                completion.ids.append(id)
            } else if orphaned.remove(id) != nil {
                completion.late.append(id)
            }
        }
        return completion
    }
}

/// One publish's rows, written in one transaction: the message (when it is stored) and the
/// record that remembers its request id (when it carried one).
struct StoreWrite: Sendable {
    var message: StoredMessage?
    var record: PublishRecord?
    /// A cluster's event (``SharedLog``), numbered by the log when it commits.
    var shared: SharedEvent? = nil
    /// Called by the embedded store's writer once the write's transaction has committed —
    /// before the WAL sync that makes it durable against power loss, after which the write's
    /// publisher is answered. The hub delivers the message here (docs/operations.md,
    /// "Storage and durability").
    var onCommitted: (@Sendable () -> Void)? = nil
}
