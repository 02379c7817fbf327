public import TetherProtocol

/// The outbox's key for a message: unique within one outbox (and its journal, across launches),
/// increasing in the order messages were accepted.
public struct OutboxMessageID: Sendable, Hashable, Comparable, CustomStringConvertible {
    /// The number.
    public let rawValue: UInt64

    /// Wraps a number.
    package init(_ rawValue: UInt64) { self.rawValue = rawValue }

    /// `m<n>`.
    public var description: String { "m\(rawValue)" }

    /// Orders by number (acceptance order).
    public static func < (lhs: OutboxMessageID, rhs: OutboxMessageID) -> Bool { lhs.rawValue < rhs.rawValue }
}

/// Which call sends an outbox message.
public enum OutboxMessageKind: UInt8, Sendable, Hashable, CaseIterable {
    /// `publish` (stored and delivered).
    case publish = 1
    /// `signal` (delivered live, never stored).
    case signal = 2
}

/// One message accepted by the outbox: what to send, and the request id that makes every send of
/// it the same request to the server.
///
/// The shell builds it once, when the app publishes: it assigns the ``id`` (the outbox's and the
/// journal's key, increasing in acceptance order) and generates the ``requestID`` (a UUID). Both
/// are kept across every retry, every transport and every launch (the durable journal stores
/// them), so the server can answer a repeat with the original timetoken (issue #15, item 1;
/// SendBird's "temporary message request id", seed 003).
package struct OutboxMessage: Sendable, Hashable {
    /// The outbox's key for a message (``OutboxMessageID``).
    package typealias ID = OutboxMessageID

    /// Which call sends it (``OutboxMessageKind``).
    package typealias Kind = OutboxMessageKind

    /// The outbox's key.
    package var id: ID
    /// The request id sent as `requestid` with every attempt (never regenerated).
    package var requestID: String
    /// Publish or signal.
    package var kind: Kind
    /// The channel it goes to; messages to one channel are sent in acceptance order.
    package var channel: String
    /// The message as JSON text, exactly as it goes on the wire (already encrypted when a cryptor
    /// is configured, so a relaunch never needs the plaintext).
    package var payload: [UInt8]
    /// Publish options (`meta`, `store`, `ttl`...). A signal uses only `customMessageType` and `timeout`.
    package var options: PublishOptions

    /// Creates a message.
    package init(id: ID, requestID: String, kind: Kind = .publish, channel: String, payload: [UInt8],
                 options: PublishOptions = PublishOptions()) {
        self.id = id
        self.requestID = requestID
        self.kind = kind
        self.channel = channel
        self.payload = payload
        self.options = options
    }

    /// What the message counts against the outbox's byte bound: its payload, channel name and `meta`.
    package var byteCount: Int {
        payload.count + channel.utf8.count + (options.meta?.jsonBytes.count ?? 0)
    }
}

/// The state of a message in the outbox, as the app sees it.
///
/// `pending → sending → sent(timetoken)`, or `→ failed(category)`; a failed message goes back to
/// `pending` when the app resends it; a pending or failed one ends as `cancelled` when the app
/// cancels it. A message whose send failed with a retryable error goes back to `pending` until
/// its retry.
public enum OutboxMessageState: Sendable, Hashable, CustomStringConvertible {
    /// Accepted, waiting its turn: behind an earlier message to its channel, for a free send slot,
    /// for the connection, or for its next retry.
    case pending
    /// A request is in flight; `attempt` counts from 1.
    case sending(attempt: Int)
    /// The server stored (or, for a signal, delivered) it at this timetoken. Final.
    case sent(Timetoken)
    /// The server refused it (403, 400, 413...) or retries ran out. Kept until resent or cancelled.
    case failed(StatusCategory)
    /// The app cancelled it before it was sent. Final.
    case cancelled

    /// `pending`, `sending(2)`, `sent(<timetoken>)`, `failed(<category>)` or `cancelled`.
    public var description: String {
        switch self {
        case .pending: return "pending"
        case .sending(let attempt): return "sending(\(attempt))"
        case .sent(let timetoken): return "sent(\(timetoken))"
        case .failed(let category): return "failed(\(category))"
        case .cancelled: return "cancelled"
        }
    }

    /// Whether the message has left the outbox for good (sent or cancelled).
    public var isFinal: Bool {
        switch self {
        case .sent, .cancelled: return true
        case .pending, .sending, .failed: return false
        }
    }
}

/// Why a send failed, as the shell reports it to the outbox (from the request's ``Status``).
package struct OutboxSendFailure: Sendable, Hashable {
    /// The failure's category.
    package var category: StatusCategory
    /// The HTTP status code, when a response arrived.
    package var statusCode: Int?
    /// The server's `Retry-After` (429, 503), when it said.
    package var retryAfter: Duration?

    /// Creates a failure.
    package init(category: StatusCategory, statusCode: Int? = nil, retryAfter: Duration? = nil) {
        self.category = category
        self.statusCode = statusCode
        self.retryAfter = retryAfter
    }

    /// The failure a status reports.
    package init(_ status: Status) {
        self.init(category: status.category, statusCode: status.statusCode, retryAfter: status.retryAfter)
    }
}

/// Why the outbox refused a command, with a code to switch on and a message for humans.
public struct OutboxError: Error, Sendable, Hashable, CustomStringConvertible {
    /// What kind of refusal; extensible.
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        /// The code's name.
        public var description: String

        /// The outbox holds its maximum count or bytes of unsettled messages (pending, sending or
        /// failed): the new message is refused, nothing already accepted is dropped. Space returns
        /// as messages are sent, or when the app cancels failed ones.
        public static let full = Code(description: "full")
        /// The message alone is larger than the outbox's byte bound: it can never be accepted.
        public static let tooLarge = Code(description: "tooLarge")
        /// A message with this id is already in the outbox.
        public static let duplicateMessage = Code(description: "duplicateMessage")
        /// No message with this id is in the outbox (already sent, cancelled, or never accepted).
        public static let unknownMessage = Code(description: "unknownMessage")
        /// The outbox is shut down (the client was shut down): nothing more is accepted.
        public static let shutDown = Code(description: "shutDown")
        /// The durable journal could not be opened or written (permissions, a full disk): the
        /// message was not accepted, because it could not be kept; or a cancel was not made,
        /// because the journal could not keep it.
        public static let journal = Code(description: "journal")
        /// Only a failed message can be resent.
        public static let notFailed = Code(description: "notFailed")
        /// The message is being sent: it may already be stored, so it cannot be cancelled.
        public static let inFlight = Code(description: "inFlight")
    }

    /// What kind of refusal.
    public var code: Code
    /// What happened, for logs and the app.
    public var message: String

    /// Creates an error.
    package init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    /// The message.
    public var description: String { message }
}
