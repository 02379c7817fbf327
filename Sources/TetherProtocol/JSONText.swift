/// Strict, allocation-free validation of JSON text (RFC 8259), with bounded nesting.
///
/// The server relays message payloads verbatim, so it only needs to know that a payload *is*
/// JSON and what kind of value it is — never to build a tree. Nesting is bounded so hostile
/// input (`[[[[…`) cannot exhaust the stack.
public enum JSONText {
    /// The kind of the top-level JSON value.
    package enum Kind: Sendable, Equatable {
        /// `{…}`
        case object
        /// `[…]`
        case array
        /// `"…"`
        case string
        /// A number.
        case number
        /// `true` or `false`.
        case bool
        /// `null`.
        case null
    }

    /// Why a text is not acceptable JSON.
    public struct Invalid: Error, Equatable, Sendable, CustomStringConvertible {
        /// Byte offset of the problem.
        public var offset: Int
        /// What is wrong.
        public var reason: String
        /// A message for humans.
        public var description: String { "invalid JSON at byte \(offset): \(reason)" }

        /// How the reason for nesting deeper than the limit begins (the limit follows).
        package static let tooDeep = "nesting deeper than"

        /// Whether the text was refused for nesting deeper than the limit (it may be valid JSON).
        package var isTooDeep: Bool { reason.hasPrefix(Self.tooDeep) }
    }

    /// The deepest nesting of arrays and objects accepted.
    package static let maximumDepth = 64

    /// The deepest nesting a value the server keeps and hands out again may have: a message,
    /// its meta, presence state. Every answer that carries such a value wraps it in at most 16
    /// levels of its own (a subscribe envelope 3, a WebSocket frame 3, history 4, a presence event 4,
    /// here-now with state 6), so the answer still parses within ``maximumDepth``. A value that
    /// parsed alone but not inside its envelope would stop delivery on its subscription.
    package static let maximumValueDepth = 48

    /// The deepest nesting the SDK reads in a server's answer (a REST body or a WebSocket frame):
    /// ``maximumDepth`` plus the 16 levels an envelope may add. Servers before
    /// ``maximumValueDepth`` stored values up to ``maximumDepth`` deep; an answer carrying one
    /// (a subscribe, history or here-now answer) is read, so such a message reaches its channel's
    /// subscribers instead of making every read of that answer fail. Whatever a server or SDK
    /// reads from the other side's input stays at ``maximumDepth``.
    package static let maximumAnswerDepth = maximumDepth + 16

    /// Validates `bytes` as one JSON value surrounded by optional whitespace, nested at most
    /// `maximumDepth` deep (never more than ``maximumDepth``).
    /// - Returns: the kind of the top-level value.
    package static func validate(_ bytes: some Collection<UInt8>, maximumDepth: Int = maximumDepth) throws(Invalid) -> Kind {
        var scanner = JSONScanner<JSONKindBuilder>(bytes: Array(bytes), depthLimit: maximumDepth)
        return try scanner.document()
    }

    /// Validates a string as JSON text (see ``validate(_:maximumDepth:)-(Collection<UInt8>,_)``).
    package static func validate(_ text: String, maximumDepth: Int = maximumDepth) throws(Invalid) -> Kind {
        try validate(Array(text.utf8), maximumDepth: maximumDepth)
    }
}
