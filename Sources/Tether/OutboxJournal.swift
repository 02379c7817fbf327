#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
package import TetherClientCore
import TetherProtocol

/// The durable side of the outbox: every message the outbox accepted, and what became of it, in a
/// small append-only file, so that messages accepted by `publish` survive the app being killed and
/// are sent — once — at the next launch (issue #15, item 4).
///
/// ## Why an append-only file and not SQLite
///
/// The SDK today links no database: GRDB (SQLite) is a dependency of the server only, and adding
/// it to the SDK would bring a C library, `libsqlite3-dev` on Linux, and a large API into every
/// app for a workload that needs none of SQLite's strengths. The outbox writes one record per
/// accepted message and one per settled message, never updates in place, never queries (the
/// whole live set is read once, at launch, and is bounded by the outbox's count and byte limits),
/// and has a single writer. That is exactly what a log does well: an append is one `write` and
/// one `fsync`; recovery is one sequential read. What a log must get right is done here:
///
/// - **Framing and integrity.** Each record is `length (u32 LE) | CRC-32 (u32 LE) | body`. A
///   record whose length runs past the end of the file, exceeds ``Limits/maximumRecordBytes``,
///   fails its CRC or does not decode is where the valid log ends: a write torn by a crash (or a
///   damaged tail) is cut off — the file is truncated there — and everything before it is kept.
/// - **Durability.** ``append(_:)`` returns after `fsync`: a message the shell then accepts is on
///   disk. Compaction writes a new file, `fsync`s it, renames it over the old one and `fsync`s
///   the directory, so a crash at any point leaves either the old log or the new one.
/// - **Bounded size.** When settled records (and the acceptances they cancel) make up more than
///   half of the file, and the file is at least ``Limits/compactionThreshold`` bytes, the log is
///   rewritten with the live messages only.
///
/// A settle that could not be written (a full disk) is kept in memory and written by the next
/// record that can be written, which first rewrites the file whole (``catchUp()``). Only when
/// nothing can be written again before the app ends does the next launch see the message as it
/// was: a sent one is sent again with its original request id (the server's dedup window answers
/// that repeat with the original timetoken), a failed one comes back pending. A record damaged in
/// the middle of the file (disk corruption, not a torn write) ends the log there: the records
/// after it are lost, which is reported in ``recovery``.
///
/// **One owner at a time.** Two clients on one file would each send its messages (twice in all)
/// and cut each other's records, so opening takes an exclusive `flock` on `<path>.lock`, held until
/// the journal is closed; a second opener (another client in this process or another process) is
/// refused with ``OutboxJournalError/Code/inUse`` at once, without reading or changing the file.
///
/// Not `Sendable`: one owner (the outbox shell's actor) appends and compacts.
package final class OutboxJournal {
    /// Size limits.
    package struct Limits: Sendable, Hashable {
        /// The largest record written or read (default 8 MiB, above the outbox's default byte bound).
        package var maximumRecordBytes: Int
        /// Compaction runs only on files at least this large (default 64 KiB).
        package var compactionThreshold: Int

        /// Creates limits.
        package init(maximumRecordBytes: Int = 8 << 20, compactionThreshold: Int = 64 << 10) {
            self.maximumRecordBytes = maximumRecordBytes
            self.compactionThreshold = compactionThreshold
        }
    }

    /// One entry of the log.
    package enum Record: Sendable, Hashable {
        /// The outbox accepted the message.
        case accepted(OutboxMessage)
        /// The message failed; it stays failed until resent or cancelled.
        case failed(OutboxMessage.ID, StatusCategory)
        /// A failed message was resent: it is pending again.
        case requeued(OutboxMessage.ID)
        /// The message left the outbox (sent or cancelled).
        case removed(OutboxMessage.ID)
        /// The next message id to assign (written first by compaction, so ids never repeat).
        case watermark(OutboxMessage.ID)
    }

    /// What recovery found when the journal was opened.
    package struct Recovery: Sendable, Hashable {
        /// Valid records read.
        package var records: Int
        /// Bytes after the last valid record, cut off (a torn or damaged tail); 0 normally.
        package var discardedBytes: Int
        /// Whole, intact records this version could not read (skipped; the records after them
        /// are kept); 0 normally.
        package var unreadableRecords = 0
    }

    private let path: String
    private let limits: Limits
    private var descriptor: Int32
    /// `<path>.lock`, held with an exclusive `flock` for the journal's life; -1 where the file
    /// system has no locks.
    private var lockDescriptor: Int32 = -1
    /// The live messages, with where each was left and its place in the outbox.
    private var live: [OutboxMessage.ID: Live] = [:]
    /// The place the next acceptance or resend takes.
    private var nextPosition: UInt64 = 0
    private var liveBytes = 0
    private var fileBytes = 0
    private var nextIDValue: UInt64 = 1
    /// What recovery found.
    package private(set) var recovery: Recovery
    /// Tests: while set, every write stops half-way and fails with this `errno` (a disk that
    /// fills up in the middle of a record).
    package var writeFailure: Int32?
    /// Set when a failed append could not be taken back out of the file: nothing more is appended
    /// to it, since what follows a torn record would be lost at the next launch. The next write
    /// rewrites the file whole instead (``compact()``, which clears it).
    private var broken: OutboxJournalError?
    /// Set when a change that had already happened could not be written (``Unwritten/kept``): the
    /// file no longer says what the live messages are. The next write rewrites it whole first.
    private var behind = false

    /// Opens (or creates) the journal at `path` and recovers its live messages.
    package init(path: String, limits: Limits = Limits()) throws(OutboxJournalError) {
        self.path = path
        self.limits = limits
        descriptor = -1
        recovery = Recovery(records: 0, discardedBytes: 0)
        // The lock first: a file another client owns is neither read nor cut (its last record may
        // be half-way through its write, which recovery would take for a torn tail).
        lockDescriptor = try Self.lock(path + ".lock", journal: path)
        let fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            let error = OutboxJournalError(.io, "cannot open the outbox journal at \(path)", errno: errno)
            close(lockDescriptor)
            lockDescriptor = -1
            throw error
        }
        descriptor = fd
        do {
            try recover()
        } catch {
            close(fd)
            descriptor = -1
            close(lockDescriptor)
            lockDescriptor = -1
            throw error
        }
    }

    deinit {
        if descriptor >= 0 { close(descriptor) }
        // Closing the lock file's last descriptor releases the lock.
        if lockDescriptor >= 0 { close(lockDescriptor) }
    }

    /// Opens `lockPath` and takes an exclusive, non-blocking `flock` on it. `flock` locks belong to
    /// the open file, not the process, so a second journal in this process is refused as well. A
    /// file system without locks (`ENOLCK`, `EOPNOTSUPP`) opens unlocked, as SQLite does.
    private static func lock(_ lockPath: String, journal: String) throws(OutboxJournalError) -> Int32 {
        let fd = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw OutboxJournalError(.io, "cannot open the outbox journal's lock file \(lockPath)", errno: errno) }
        while flock(fd, LOCK_EX | LOCK_NB) != 0 {
            let failure = errno
            if failure == EINTR { continue }
            if failure == ENOLCK || failure == EOPNOTSUPP { return fd }
            close(fd)
            if failure == EWOULDBLOCK {
                throw OutboxJournalError(.inUse,
                                         "the outbox journal at \(journal) is in use by another client (in this process or another); one journal serves one client at a time, or its messages would be sent twice")
            }
            throw OutboxJournalError(.io, "cannot lock the outbox journal's lock file \(lockPath)", errno: failure)
        }
        return fd
    }

    /// `fsync`, and on Apple platforms `F_FULLFSYNC`, without which a drive may keep the data in
    /// its cache past a power loss (Apple's `fsync(2)`); `fsync` where the file system has no
    /// full sync.
    static func durableSync(_ fd: Int32) -> Bool {
        #if canImport(Darwin)
        if fcntl(fd, F_FULLFSYNC) == 0 { return true }
        #endif
        return fsync(fd) == 0
    }

    // MARK: Reading

    /// A live message and its place in the outbox: the order of the records that last put it in
    /// line (its acceptance, or its latest resend), so a message resent before a relaunch is still
    /// behind the ones it was resent after.
    private struct Live {
        var entry: OutboxMachine.Restored
        var position: UInt64
    }

    /// The messages to give the outbox at launch (``OutboxMachine/restore(_:now:)``), in outbox
    /// order: acceptance order, except that a resent message comes after every message accepted
    /// or resent before its resend (as it did in the outbox that resent it).
    package var restored: [OutboxMachine.Restored] {
        live.values.sorted { $0.position < $1.position }.map(\.entry)
    }

    /// The id for the next accepted message: above every id the journal has ever recorded.
    package var nextID: OutboxMessage.ID { OutboxMessage.ID(nextIDValue) }

    /// The file's current size in bytes.
    package var sizeInBytes: Int { fileBytes }

    // MARK: Writing

    /// Appends a record and `fsync`s it; compacts afterwards when settled records dominate.
    package func append(_ record: Record) throws(OutboxJournalError) {
        let body = Self.encode(record)
        guard body.count <= limits.maximumRecordBytes else {
            throw OutboxJournalError(.recordTooLarge,
                                     "a journal record of \(body.count) bytes exceeds the limit of \(limits.maximumRecordBytes)")
        }
        try catchUp()
        do throws(OutboxJournalError) {
            try writeAll(Self.frame(body), to: descriptor)
            guard Self.durableSync(descriptor) else { throw OutboxJournalError(.io, "cannot fsync the outbox journal", errno: errno) }
        } catch {
            // Nothing of a record that failed may stay: a torn one would end the log at the next
            // launch (and every record after it with it), and a whole one whose sync failed
            // could still reach the disk and take effect although its caller was told it failed.
            if ftruncate(descriptor, off_t(fileBytes)) != 0 || !Self.durableSync(descriptor) {
                broken = OutboxJournalError(.io, "the outbox journal could not be cut back after a failed write; nothing more is appended until it is rewritten whole",
                                            errno: errno)
            }
            throw error
        }
        fileBytes += 8 + body.count
        apply(record)
        if fileBytes >= limits.compactionThreshold && fileBytes - liveBytes > liveBytes {
            // The record is durable whatever happens here: a failed compaction leaves the old
            // (valid, longer) file and is tried again after the next append.
            try? compact()
        }
    }

    /// What ``record(_:changedTo:ifUnwritten:)`` does with a change it could not write.
    package enum Unwritten: Sendable {
        /// Leaves the journal as it was: the change is refused (a cancel the app asked for).
        case dropped
        /// Keeps the change in the journal's own picture of the live messages and writes it with
        /// the next record that can be written, by rewriting the file whole (``compact()``): for a
        /// change that has already happened (a send's outcome), which the file must catch up with
        /// before the next launch reads it.
        case kept
    }

    /// Records a state change the outbox reported (``OutboxMachine/Action/changed(_:_:)``):
    /// sent or cancelled → removed; failed → failed; pending after failed (a resend) → requeued.
    /// Other changes (sending, pending while retrying) are not journalled: at the next launch the
    /// message is pending, which is what it is. Throws when the change could not be written;
    /// `ifUnwritten` says whether the journal still counts it.
    package func record(_ id: OutboxMessage.ID, changedTo state: OutboxMessageState,
                        ifUnwritten: Unwritten = .dropped) throws(OutboxJournalError) {
        guard let entry = live[id]?.entry else { return }
        let record: Record
        switch state {
        case .sent, .cancelled:
            record = .removed(id)
        case .failed(let category):
            record = .failed(id, category)
        case .pending:
            guard case .failed = entry.state else { return }
            record = .requeued(id)
        case .sending:
            return
        }
        do { try append(record) } catch {
            if case .kept = ifUnwritten {
                apply(record)
                behind = true
            }
            throw error
        }
    }

    /// Whether the file is behind the live messages (a change was kept unwritten, or a failed
    /// write could not be cut back) and is rewritten whole at the next write or ``catchUp()``.
    package var isBehind: Bool { behind || broken != nil }

    /// Rewrites the file whole when it is behind (``isBehind``); nothing otherwise. Every append
    /// does this first; the outbox shell also tries it when it closes.
    package func catchUp() throws(OutboxJournalError) {
        guard isBehind else { return }
        do { try compact() } catch {
            // The cause the appends report is the first one: a file that could not be cut back.
            if let broken { throw broken }
            throw error
        }
    }

    /// Rewrites the file with the live messages only (the watermark first, then each message's
    /// acceptance, in outbox order, and, for failed ones, its failure), atomically. The order of
    /// the acceptances is what keeps a resent message's place across the rewrite.
    package func compact() throws(OutboxJournalError) {
        var records: [Record] = [.watermark(nextID)]
        for entry in restored {
            records.append(.accepted(entry.message))
            switch entry.state {
            case .pending: break
            case .failed(let category): records.append(.failed(entry.message.id, category))
            }
        }
        var bytes: [UInt8] = []
        for record in records { bytes += Self.frame(Self.encode(record)) }
        let temporary = path + ".compact"
        // Opened for appending, and kept: once renamed, this descriptor is the journal's, so no
        // reopen can fail after the rename and leave appends going to the replaced file.
        let fd = open(temporary, O_RDWR | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw OutboxJournalError(.io, "cannot create \(temporary)", errno: errno) }
        do throws(OutboxJournalError) {
            try writeAll(bytes, to: fd)
            guard Self.durableSync(fd) else { throw OutboxJournalError(.io, "cannot fsync \(temporary)", errno: errno) }
            guard rename(temporary, path) == 0 else { throw OutboxJournalError(.io, "cannot replace the outbox journal", errno: errno) }
        } catch {
            close(fd)
            unlink(temporary)
            throw error
        }
        syncDirectory()
        if descriptor >= 0 { close(descriptor) }
        descriptor = fd
        fileBytes = bytes.count
        // The new file holds exactly the live messages: nothing is behind, nothing is torn.
        behind = false
        broken = nil
    }

    // MARK: Recovery

    private func recover() throws(OutboxJournalError) {
        let bytes = try readAll()
        var offset = 0
        var count = 0
        var unreadable = 0
        while let (record, size) = Self.decodeFrame(bytes, at: offset, limit: limits.maximumRecordBytes) {
            // An intact frame (its checksum holds) that does not decode is one record lost, not
            // the end of the log: what was written after it is kept.
            if let record {
                apply(record)
                count += 1
            } else {
                unreadable += 1
            }
            offset += size
        }
        if offset < bytes.count {
            // A torn or damaged tail: keep what precedes it, so the next append starts clean.
            guard ftruncate(descriptor, off_t(offset)) == 0, Self.durableSync(descriptor) else {
                throw OutboxJournalError(.io, "cannot cut the damaged tail of the outbox journal", errno: errno)
            }
        }
        fileBytes = offset
        recovery = Recovery(records: count, discardedBytes: bytes.count - offset, unreadableRecords: unreadable)
    }

    private func readAll() throws(OutboxJournalError) -> [UInt8] {
        var result: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 64 << 10)
        var position: off_t = 0
        while true {
            let n = chunk.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, $0.count, position) }
            if n < 0 {
                if errno == EINTR { continue }
                throw OutboxJournalError(.io, "cannot read the outbox journal", errno: errno)
            }
            if n == 0 { return result }
            result += chunk[0..<n]
            position += off_t(n)
        }
    }

    private func apply(_ record: Record) {
        switch record {
        case .accepted(let message):
            if let old = live[message.id] { liveBytes -= Self.frame(Self.encode(.accepted(old.entry.message))).count }
            live[message.id] = Live(entry: OutboxMachine.Restored(message, .pending), position: takePosition())
            liveBytes += Self.frame(Self.encode(record)).count
            nextIDValue = max(nextIDValue, message.id.rawValue &+ 1)
        case .failed(let id, let category):
            live[id]?.entry.state = .failed(category)
        case .requeued(let id):
            // A resend joins the back of the outbox (``OutboxMachine/resend(_:now:)``).
            guard live[id] != nil else { return }
            live[id]?.entry.state = .pending
            live[id]?.position = takePosition()
        case .removed(let id):
            if let old = live.removeValue(forKey: id) { liveBytes -= Self.frame(Self.encode(.accepted(old.entry.message))).count }
        case .watermark(let id):
            nextIDValue = max(nextIDValue, id.rawValue)
        }
    }

    private func takePosition() -> UInt64 {
        defer { nextPosition += 1 }
        return nextPosition
    }

    private func syncDirectory() {
        let directory = path.lastIndex(of: "/").map { $0 == path.startIndex ? "/" : String(path[..<$0]) } ?? "."
        let fd = open(directory, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return }
        _ = Self.durableSync(fd)
        close(fd)
    }

    private func writeAll(_ bytes: [UInt8], to fd: Int32) throws(OutboxJournalError) {
        var limit = bytes.count
        if writeFailure != nil { limit = bytes.count / 2 }
        var written = 0
        while written < limit {
            let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + written, limit - written) }
            if n < 0 {
                if errno == EINTR { continue }
                throw OutboxJournalError(.io, "cannot write the outbox journal", errno: errno)
            }
            written += n
        }
        if let writeFailure { throw OutboxJournalError(.io, "cannot write the outbox journal", errno: writeFailure) }
    }

    // MARK: Encoding

    private enum Tag: UInt8 {
        case accepted = 1, failed = 2, requeued = 3, removed = 4, watermark = 5
    }

    static func frame(_ body: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(8 + body.count)
        out.appendLittleEndian(UInt32(body.count))
        out.appendLittleEndian(CRC32.checksum(body))
        out += body
        return out
    }

    /// The record at `offset` and its framed size, or `nil` where the valid log ends.
    /// The frame at `offset`: its record (nil when the frame is intact but its record cannot be
    /// read) and its size; nil when there is no intact frame there (the end, or a torn tail).
    static func decodeFrame(_ bytes: [UInt8], at offset: Int, limit: Int) -> (Record?, Int)? {
        guard bytes.count - offset >= 8 else { return nil }
        let length = Int(bytes.readLittleEndianUInt32(at: offset))
        let crc = bytes.readLittleEndianUInt32(at: offset + 4)
        guard length > 0, length <= limit, bytes.count - offset - 8 >= length else { return nil }
        let body = Array(bytes[(offset + 8)..<(offset + 8 + length)])
        guard CRC32.checksum(body) == crc else { return nil }
        return (decode(body), 8 + length)
    }

    static func encode(_ record: Record) -> [UInt8] {
        var out: [UInt8] = []
        switch record {
        case .accepted(let m):
            out.append(Tag.accepted.rawValue)
            out.appendLittleEndian(m.id.rawValue)
            out.appendField(Array(m.requestID.utf8))
            out.append(m.kind.rawValue)
            out.appendField(Array(m.channel.utf8))
            out.appendField(m.payload)
            out.appendField(Array(encode(m.options).jsonText.utf8))
        case .failed(let id, let category):
            out.append(Tag.failed.rawValue)
            out.appendLittleEndian(id.rawValue)
            out.appendField(Array(category.rawValue.utf8))
        case .requeued(let id):
            out.append(Tag.requeued.rawValue)
            out.appendLittleEndian(id.rawValue)
        case .removed(let id):
            out.append(Tag.removed.rawValue)
            out.appendLittleEndian(id.rawValue)
        case .watermark(let id):
            out.append(Tag.watermark.rawValue)
            out.appendLittleEndian(id.rawValue)
        }
        return out
    }

    static func decode(_ body: [UInt8]) -> Record? {
        var reader = ByteReader(bytes: body)
        guard let tagByte = reader.byte(), let tag = Tag(rawValue: tagByte), let id = reader.uint64().map(OutboxMessage.ID.init) else {
            return nil
        }
        let record: Record
        switch tag {
        case .accepted:
            guard let requestID = reader.field().map({ String(decoding: $0, as: UTF8.self) }),
                  let kind = reader.byte().flatMap(OutboxMessage.Kind.init(rawValue:)),
                  let channel = reader.field().map({ String(decoding: $0, as: UTF8.self) }),
                  let payload = reader.field(),
                  let optionsText = reader.field(),
                  // As deep as any answer may be: `meta` is refused deeper than a kept value
                  // (``JSONText/maximumValueDepth``), and the options object adds a level.
                  let optionsJSON = try? JSONValue(parsing: optionsText, maximumDepth: JSONText.maximumAnswerDepth),
                  let options = decodeOptions(optionsJSON)
            else { return nil }
            record = .accepted(OutboxMessage(id: id, requestID: requestID, kind: kind, channel: channel, payload: payload,
                                             options: options))
        case .failed:
            guard let name = reader.field().map({ String(decoding: $0, as: UTF8.self) }),
                  let category = StatusCategory(rawValue: name) else { return nil }
            record = .failed(id, category)
        case .requeued: record = .requeued(id)
        case .removed: record = .removed(id)
        case .watermark: record = .watermark(id)
        }
        return reader.isAtEnd ? record : nil
    }

    static func encode(_ options: PublishOptions) -> JSONValue {
        var object: [String: JSONValue] = ["replicate": .bool(options.replicate), "post": .bool(options.usePOST)]
        if let meta = options.meta { object["meta"] = meta }
        if let store = options.store { object["store"] = .bool(store) }
        if let ttl = options.ttl { object["ttl"] = .number(JSONValue.Number(ttl)) }
        if let type = options.customMessageType { object["customMessageType"] = .string(type) }
        if let timeout = options.timeout {
            // Saturating: a timeout beyond ~292 million years is stored as the largest one.
            let (seconds, attoseconds) = timeout.components
            let (millis, overflow) = seconds.multipliedReportingOverflow(by: 1000)
            let (sum, sumOverflow) = millis.addingReportingOverflow(attoseconds / 1_000_000_000_000_000)
            let total = overflow || sumOverflow ? Int64.max : sum
            object["timeoutMilliseconds"] = .number(JSONValue.Number(max(total, 0)))
        }
        return .object(object)
    }

    static func decodeOptions(_ value: JSONValue) -> PublishOptions? {
        guard let object = value.objectValue, let replicate = object["replicate"]?.boolValue, let post = object["post"]?.boolValue
        else { return nil }
        var options = PublishOptions(replicate: replicate, usePOST: post)
        options.meta = object["meta"]
        options.store = object["store"]?.boolValue
        options.ttl = object["ttl"]?.intValue
        options.customMessageType = object["customMessageType"]?.stringValue
        options.timeout = object["timeoutMilliseconds"]?.intValue.map { Duration.milliseconds($0) }
        return options
    }
}

/// A journal failure: a code to switch on, a message for humans, and the `errno` when a system
/// call failed.
package struct OutboxJournalError: Error, Sendable, Hashable, CustomStringConvertible {
    /// What kind of failure; extensible.
    package struct Code: Sendable, Hashable, CustomStringConvertible {
        /// The code's name.
        package var description: String
        /// A system call failed (permissions, a full disk, an I/O error).
        package static let io = Code(description: "io")
        /// The record is larger than ``OutboxJournal/Limits/maximumRecordBytes``; nothing was written.
        package static let recordTooLarge = Code(description: "recordTooLarge")
        /// Another client holds the journal (its `<path>.lock`); nothing was read or changed.
        package static let inUse = Code(description: "inUse")
    }

    /// What kind of failure.
    package var code: Code
    /// What went wrong.
    package var message: String
    /// The system error number, when a system call failed.
    package var errno: Int32?

    /// Creates an error.
    package init(_ code: Code, _ message: String, errno: Int32? = nil) {
        self.code = code
        self.message = message
        self.errno = errno
    }

    /// The message, with the system error when there is one.
    package var description: String {
        guard let errno else { return message }
        return "\(message) (errno \(errno): \(String(cString: strerror(errno))))"
    }
}

/// CRC-32 (IEEE 802.3, the zlib/PNG polynomial), table-driven.
enum CRC32 {
    static let table: [UInt32] = (0..<256).map { n -> UInt32 in
        var c = UInt32(n)
        for _ in 0..<8 { c = c & 1 != 0 ? 0xEDB8_8320 ^ (c >> 1) : c >> 1 }
        return c
    }

    static func checksum(_ bytes: [UInt8]) -> UInt32 {
        var crc: UInt32 = 0xFFFF_FFFF
        for byte in bytes { crc = table[Int((crc ^ UInt32(byte)) & 0xFF)] ^ (crc >> 8) }
        return crc ^ 0xFFFF_FFFF
    }
}

private struct ByteReader {
    let bytes: [UInt8]
    var offset = 0

    var isAtEnd: Bool { offset == bytes.count }

    mutating func byte() -> UInt8? {
        guard offset < bytes.count else { return nil }
        defer { offset += 1 }
        return bytes[offset]
    }

    mutating func uint64() -> UInt64? {
        guard bytes.count - offset >= 8 else { return nil }
        var value: UInt64 = 0
        for i in 0..<8 { value |= UInt64(bytes[offset + i]) << (8 * UInt64(i)) }
        offset += 8
        return value
    }

    mutating func field() -> [UInt8]? {
        guard bytes.count - offset >= 4 else { return nil }
        let length = Int(bytes.readLittleEndianUInt32(at: offset))
        guard bytes.count - offset - 4 >= length else { return nil }
        defer { offset += 4 + length }
        return Array(bytes[(offset + 4)..<(offset + 4 + length)])
    }
}

extension [UInt8] {
    fileprivate mutating func appendLittleEndian(_ value: UInt32) {
        for i in 0..<4 { append(UInt8(truncatingIfNeeded: value >> (8 * UInt32(i)))) }
    }

    fileprivate mutating func appendLittleEndian(_ value: UInt64) {
        for i in 0..<8 { append(UInt8(truncatingIfNeeded: value >> (8 * UInt64(i)))) }
    }

    fileprivate mutating func appendField(_ bytes: [UInt8]) {
        appendLittleEndian(UInt32(bytes.count))
        append(contentsOf: bytes)
    }

    fileprivate func readLittleEndianUInt32(at offset: Int) -> UInt32 {
        var value: UInt32 = 0
        for i in 0..<4 { value |= UInt32(self[offset + i]) << (8 * UInt32(i)) }
        return value
    }
}
