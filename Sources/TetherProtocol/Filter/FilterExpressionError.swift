/// Why a text is not a valid ``FilterExpression``. The server answers such a subscribe with
/// HTTP 481 (protocol reference §10).
@_spi(Benchmarks) public struct FilterExpressionError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The 0-based offset, in characters (`String.count` units), of the problem in the input;
    /// equal to the input's length when the problem is that the input ended too soon.
    package var position: Int
    /// What is wrong, for humans (for example "expected a value after '=='", "unterminated string").
    package var reason: String

    /// A message for humans.
    @_spi(Benchmarks) public var description: String { "invalid filter expression at character \(position): \(reason)" }
}
