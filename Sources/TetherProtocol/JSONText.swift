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
    }

    /// The deepest nesting of arrays and objects accepted.
    package static let maximumDepth = 64

    /// Validates `bytes` as one JSON value surrounded by optional whitespace.
    /// - Returns: the kind of the top-level value.
    package static func validate(_ bytes: some Collection<UInt8>) throws(Invalid) -> Kind {
        var scanner = JSONScanner<JSONKindBuilder>(bytes: Array(bytes))
        return try scanner.document()
    }

    /// Validates a string as JSON text.
    package static func validate(_ text: String) throws(Invalid) -> Kind {
        try validate(Array(text.utf8))
    }
}
