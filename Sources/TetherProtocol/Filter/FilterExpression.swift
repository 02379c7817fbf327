/// A parsed subscribe filter (`filter-expr`, protocol reference §10): decides, per subscriber,
/// whether a message is delivered.
///
/// ```swift
/// let filter = try FilterExpression(parsing: "meta.priority == 'high' && data.score > 80")
/// filter.matches(meta: ["priority": "high"], data: ["score": 95])  // true
/// ```
///
/// The language — operators, precedence, how missing fields and mixed types compare — is
/// described in `docs/filter-expressions.md`. In short: comparisons `== != < > <= >=`, `LIKE`
/// (`*` wildcards, case-insensitive), `CONTAINS` (substring or list membership), arithmetic and
/// bitwise `+ - * / % & ^ | ~` on numbers, `!`, `&&`, `||`, parentheses, lists `('a', 'b')`,
/// quoted strings, numbers, and fields `meta.x`, `meta.a["b"]`, `data.x`, or a bare name
/// (a `meta` key). A comparison that involves a missing field is false.
///
/// Parsing and evaluation never trap and take time linear in the expression plus the message
/// values it reads; input is limited to ``maximumLength`` characters and ``maximumDepth`` levels.
/// Two expressions are equal when they have the same canonical form (``description``).
@_spi(Benchmarks) public struct FilterExpression: Sendable, Hashable, CustomStringConvertible {
    /// The syntax tree.
    let root: FilterCondition

    /// The longest accepted expression, in characters.
    package static let maximumLength: Int = 4096

    /// The deepest accepted nesting: each enclosing parenthesis, `!` and `~` counts one level.
    package static let maximumDepth: Int = 32

    /// Parses `text`.
    /// - Throws: ``FilterExpressionError`` with the character offset of the first problem.
    @_spi(Benchmarks) public init(parsing text: String) throws(FilterExpressionError) {
        var work = 0
        self = try Self.parse(text, work: &work)
    }

    init(root: FilterCondition) { self.root = root }

    /// Whether a message with this `meta` (its publish metadata) and `data` (its payload) passes
    /// the filter. `nil` means absent; fields of an absent or non-object value are missing.
    @_spi(Benchmarks) public func matches(meta: JSONValue?, data: JSONValue?) -> Bool {
        var work = 0
        return evaluate(meta: meta, data: data, work: &work)
    }

    /// The canonical form: it re-parses to an equal expression. Bare names are spelled
    /// `meta.name`, strings are single-quoted, keywords are upper case, operators are separated by
    /// single spaces and only necessary parentheses remain. It can be longer than the input
    /// (spaces, `meta.` prefixes), so for an input near ``maximumLength`` it may exceed the limit.
    @_spi(Benchmarks) public var description: String {
        var out = ""
        root.write(to: &out)
        return out
    }

    // MARK: - Instrumented entry points (the fuzz tests check that `work` stays linear)

    /// Parses `text`, adding to `work` the steps taken: scalars read, tokens produced and parse
    /// functions entered.
    static func parse(_ text: String, work: inout Int) throws(FilterExpressionError) -> FilterExpression {
        if text.utf8.count > maximumLength {
            var count = 0
            for _ in text {
                count += 1
                work += 1
                if count > maximumLength {
                    throw FilterExpressionError(position: maximumLength, reason: "expression longer than \(maximumLength) characters")
                }
            }
        }
        let scalars = Array(text.unicodeScalars)
        work += scalars.count
        var lexer = FilterLexer(scalars: scalars)
        do {
            let tokens = try lexer.tokenize()
            work += lexer.work
            var parser = FilterParser(tokens: tokens)
            defer { work += parser.work }
            return FilterExpression(root: try parser.parse())
        } catch {
            work += lexer.work
            throw FilterExpressionError(position: characterOffset(ofScalar: error.offset, in: text), reason: error.reason)
        }
    }

    /// Evaluates, adding to `work` the steps taken.
    func evaluate(meta: JSONValue?, data: JSONValue?, work: inout Int) -> Bool {
        var evaluator = FilterEvaluator(meta: meta, data: data)
        let result = evaluator.evaluate(root)
        work += evaluator.work
        return result
    }

    /// Every field the expression reads, in order of appearance (with repeats).
    var variables: [FilterPath] { root.variables }

    /// The offset, in `Character`s, of the character containing Unicode scalar `offset`
    /// (`text.count` when `offset` is at the end).
    static func characterOffset(ofScalar offset: Int, in text: String) -> Int {
        var scalars = 0
        var characters = 0
        for character in text {
            scalars += character.unicodeScalars.count
            if scalars > offset { return characters }
            characters += 1
        }
        return characters
    }
}
