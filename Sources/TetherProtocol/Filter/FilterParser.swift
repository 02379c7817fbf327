/// An operator-precedence (shunting-yard) parser with explicit operand and operator stacks.
///
/// It never recurses, so its native stack use is constant however deeply the input nests (a
/// recursive-descent parser needs about a dozen frames per parenthesis, which in a debug build
/// overflows a 512 KiB thread stack well before ``FilterExpression/maximumDepth``). Nesting — open
/// parentheses plus pending `!` and `~` — is still limited, because the tree it builds is walked
/// recursively when evaluated, printed, compared and hashed.
///
/// Binding strength, loosest first (all binary operators left-associative, comparisons not
/// chainable):
///
/// | level | operators |
/// |---|---|
/// | 1 | `\|\|` |
/// | 2 | `&&` |
/// | 3 | prefix `!` (negates the comparison after it: `!a == 1` is `!(a == 1)`) |
/// | 4 | `== != < > <= >= LIKE CONTAINS` |
/// | 5 | `\|` |
/// | 6 | `^` |
/// | 7 | `&` |
/// | 8 | `+ -` |
/// | 9 | `* / %` |
/// | 10 | prefix `~` |
///
/// Each node is tracked as a condition or a value as it is built, so a misplaced one is reported
/// at the operator or operand concerned.
struct FilterParser {
    /// A parsed node: parenthesised groups may be either kind. Runs of one operator that may
    /// still grow to the right (`a + b - …`, `a && b && …`) are kept open in a builder, so each
    /// extension appends in place instead of copying the run (which would be quadratic).
    enum Node {
        case condition(FilterCondition)
        case value(FilterOperand)
        /// An arithmetic chain of one level.
        case chain(ChainBuilder)
        /// A run of `&&` (`isAnd`) or `||` terms.
        case logical(LogicalBuilder)
    }

    final class ChainBuilder {
        let first: FilterOperand
        let level: Int
        var steps: [FilterStep]

        init(first: FilterOperand, step: FilterStep) {
            self.first = first
            level = step.op.level
            steps = [step]
        }
    }

    final class LogicalBuilder {
        let isAnd: Bool
        var terms: [FilterCondition] = []

        init(isAnd: Bool) { self.isAnd = isAnd }

        /// Adds a term, splicing in a run of the same operator (`&&` and `||` are associative).
        func append(_ term: FilterCondition) {
            switch term {
            case .all(let inner) where isAnd: terms.append(contentsOf: inner)
            case .any(let inner) where !isAnd: terms.append(contentsOf: inner)
            case .comparison, .not, .all, .any: terms.append(term)
            }
        }
    }

    /// A node on the operand stack, with the tokens around it for error messages.
    struct Operand {
        var node: Node
        /// Index of its first token.
        var first: Int
        /// Index of the token right after it.
        var next: Int
        /// Whether it is a parenthesised group (for messages only).
        var parenthesized: Bool
    }

    enum Binary {
        case or, and
        case comparison(FilterComparison)
        case arithmetic(FilterArithmetic)

        var precedence: Int {
            switch self {
            case .or: 1
            case .and: 2
            case .comparison: 4
            case .arithmetic(let op): 5 + op.level
            }
        }
    }

    enum Operator {
        case binary(Binary, token: Int)
        case not(token: Int)
        case bitwiseNot(token: Int)
        /// An open parenthesis; `base` is the operand-stack height when it was opened.
        case group(token: Int, base: Int, isList: Bool)

        /// Binding strength; groups are barriers (0) that reductions stop at.
        var precedence: Int {
            switch self {
            case .binary(let op, _): op.precedence
            case .not: 3
            case .bitwiseNot: 10
            case .group: 0
            }
        }
    }

    let tokens: [FilterToken]
    var operands: [Operand] = []
    var operators: [Operator] = []
    /// Open parentheses plus pending `!` and `~`.
    var depth = 0
    /// Steps taken: one per token, push and reduction.
    var work = 0

    /// `tokens` must end with an `.end` token.
    init(tokens: [FilterToken]) { self.tokens = tokens }

    func fail(_ reason: String, at tokenIndex: Int) -> FilterSyntaxError {
        FilterSyntaxError(offset: tokens[tokenIndex].start, reason: reason)
    }

    mutating func parse() throws(FilterSyntaxError) -> FilterCondition {
        if case .end = tokens[0].kind { throw FilterSyntaxError(offset: 0, reason: "empty expression") }
        var index = 0
        var expectingOperand = true
        while true {
            work += 1
            let token = tokens[index]
            if expectingOperand {
                switch token.kind {
                case .not:
                    try open(.not(token: index), at: index)
                case .bitwiseNot:
                    try open(.bitwiseNot(token: index), at: index)
                case .leftParen:
                    if case .rightParen = tokens[index + 1].kind { throw fail("empty parentheses", at: index + 1) }
                    try open(.group(token: index, base: operands.count, isList: false), at: index)
                case .string(let value):
                    push(.value(.string(value)), first: index, next: index + 1)
                    expectingOperand = false
                case .number(let text):
                    push(.value(.number(JSONValue.Number(uncheckedText: text))), first: index, next: index + 1)
                    expectingOperand = false
                case .variable(let path):
                    push(.value(.variable(path)), first: index, next: index + 1)
                    expectingOperand = false
                case .arithmetic(.subtract):
                    // A negative literal: `-` written directly before a number.
                    guard case .number(let text) = tokens[index + 1].kind, tokens[index + 1].start == token.end else {
                        throw fail("expected a number directly after '-'", at: index)
                    }
                    push(.value(.number(JSONValue.Number(uncheckedText: "-" + text))), first: index, next: index + 2)
                    index += 1
                    expectingOperand = false
                default:
                    throw expectedOperand(at: index)
                }
            } else {
                switch token.kind {
                case .comparison(let op):
                    try reduce(above: 4)
                    if isCondition(operands[operands.count - 1]) {
                        throw operands[operands.count - 1].parenthesized
                            ? fail("a condition cannot be compared; combine conditions with '&&' or '||'", at: index)
                            : fail("comparisons cannot be chained; combine them with '&&' or '||'", at: index)
                    }
                    operators.append(.binary(.comparison(op), token: index))
                    expectingOperand = true
                case .arithmetic(let op):
                    try reduce(above: Binary.arithmetic(op).precedence)
                    if isCondition(operands[operands.count - 1]) {
                        throw fail("a condition cannot be an operand of '\(op.symbol)'", at: index)
                    }
                    operators.append(.binary(.arithmetic(op), token: index))
                    expectingOperand = true
                case .and, .or:
                    let op: Binary = token.kind == .and ? .and : .or
                    try reduce(above: op.precedence)
                    _ = try condition(operands[operands.count - 1])
                    operators.append(.binary(op, token: index))
                    expectingOperand = true
                case .comma:
                    try reduce(above: 1)
                    guard case .group(let open, let base, _)? = operators.last else {
                        throw fail("unexpected ',' outside a list", at: index)
                    }
                    try requireListElement(operands[operands.count - 1])
                    operators[operators.count - 1] = .group(token: open, base: base, isList: true)
                    expectingOperand = true
                case .rightParen:
                    try reduce(above: 1)
                    guard case .group(let open, let base, let isList)? = operators.popLast() else {
                        throw fail("unexpected ')' without a matching '('", at: index)
                    }
                    depth -= 1
                    let node: Node
                    if isList {
                        try requireListElement(operands[operands.count - 1])
                        var elements: [FilterOperand] = []
                        for element in operands[base...] {
                            if let value = value(element) { elements.append(value) }
                        }
                        node = .value(.list(elements))
                    } else {
                        node = operands[operands.count - 1].node
                    }
                    operands.removeSubrange(base...)
                    operands.append(Operand(node: node, first: open, next: index + 1, parenthesized: true))
                case .end:
                    try reduce(above: 1)
                    if !operators.isEmpty { throw fail("missing ')'", at: index) }
                    return try condition(operands[0])
                case .string, .number, .variable, .not, .bitwiseNot, .leftParen:
                    throw unexpectedOperand(at: index)
                }
            }
            index += 1
        }
    }

    mutating func push(_ node: Node, first: Int, next: Int) {
        work += 1
        operands.append(Operand(node: node, first: first, next: next, parenthesized: false))
    }

    /// Pushes a prefix operator or an open parenthesis: one more level of nesting.
    mutating func open(_ op: Operator, at index: Int) throws(FilterSyntaxError) {
        work += 1
        depth += 1
        if depth > FilterExpression.maximumDepth {
            throw fail("nesting deeper than \(FilterExpression.maximumDepth)", at: index)
        }
        operators.append(op)
    }

    /// Applies every stacked operator binding at least as tightly as `precedence` (left
    /// associativity), stopping at an open parenthesis.
    mutating func reduce(above precedence: Int) throws(FilterSyntaxError) {
        while let top = operators.last, top.precedence >= precedence {
            work += 1
            operators.removeLast()
            switch top {
            case .not(let token):
                let operand = operands.removeLast()
                depth -= 1
                let inner = try condition(operand)
                operands.append(Operand(node: .condition(.not(inner)), first: token, next: operand.next, parenthesized: false))
            case .bitwiseNot(let token):
                let operand = operands.removeLast()
                depth -= 1
                guard let inner = value(operand) else { throw fail("'~' needs a number, not a condition", at: operand.first) }
                operands.append(Operand(node: .value(.bitwiseNot(inner)), first: token, next: operand.next, parenthesized: false))
            case .binary(let op, _):
                let right = operands.removeLast()
                let left = operands.removeLast()
                let node = try combine(left, op, right)
                operands.append(Operand(node: node, first: left.first, next: right.next, parenthesized: false))
            case .group:
                return  // unreachable: groups have precedence 0 and reductions ask for at least 1
            }
        }
    }

    func combine(_ left: Operand, _ op: Binary, _ right: Operand) throws(FilterSyntaxError) -> Node {
        switch op {
        case .or, .and:
            let isAnd = op.precedence == Binary.and.precedence
            let builder: LogicalBuilder
            if case .logical(let open) = left.node, open.isAnd == isAnd {
                builder = open
            } else {
                builder = LogicalBuilder(isAnd: isAnd)
                builder.append(try condition(left))
            }
            builder.append(try condition(right))
            return .logical(builder)
        case .comparison(let comparison):
            // The left side was checked when the operator was read.
            guard let lhs = value(left), let rhs = value(right) else {
                throw fail("a condition cannot be compared; combine conditions with '&&' or '||'", at: right.first)
            }
            return .condition(.comparison(lhs, comparison, rhs))
        case .arithmetic(let arithmetic):
            guard let rhs = value(right) else {
                throw fail("a condition cannot be an operand of '\(arithmetic.symbol)'", at: right.first)
            }
            let step = FilterStep(op: arithmetic, operand: rhs)
            // Left-associative runs of one level are one node: `a + b - c`, also `(a + b) - c`.
            if case .chain(let open) = left.node, open.level == arithmetic.level {
                open.steps.append(step)
                return .chain(open)
            }
            guard let lhs = value(left) else {
                throw fail("a condition cannot be an operand of '\(arithmetic.symbol)'", at: left.next)
            }
            if case .chain(let first, let steps) = lhs, lhs.printLevel == arithmetic.level {
                let open = ChainBuilder(first: first, step: step)
                open.steps.insert(contentsOf: steps, at: 0)
                return .chain(open)
            }
            return .chain(ChainBuilder(first: lhs, step: step))
        }
    }

    /// The operand as a value, or `nil` for a condition.
    func value(_ operand: Operand) -> FilterOperand? {
        switch operand.node {
        case .value(let value): value
        case .chain(let open): .chain(open.first, open.steps)
        case .condition, .logical: nil
        }
    }

    /// The operand as a condition; a value there is missing its comparison operator, which would
    /// have been the token right after it.
    func condition(_ operand: Operand) throws(FilterSyntaxError) -> FilterCondition {
        switch operand.node {
        case .condition(let condition):
            return condition
        case .logical(let open):
            return open.isAnd ? .all(open.terms) : .any(open.terms)
        case .value, .chain:
            if case .end = tokens[operand.next].kind { throw fail("expected a comparison operator", at: operand.next) }
            throw fail("expected a comparison operator, found \(Self.describe(tokens[operand.next].kind))", at: operand.next)
        }
    }

    /// Whether the operand is a condition.
    func isCondition(_ operand: Operand) -> Bool {
        switch operand.node {
        case .condition, .logical: true
        case .value, .chain: false
        }
    }

    func requireListElement(_ operand: Operand) throws(FilterSyntaxError) {
        if isCondition(operand) { throw fail("a list element must be a value, not a condition", at: operand.first) }
    }

    /// The error for a token that cannot start an operand.
    func expectedOperand(at index: Int) -> FilterSyntaxError {
        let kind = tokens[index].kind
        guard index > 0 else { return fail("expected a condition, found \(Self.describe(kind))", at: index) }
        let previous = tokens[index - 1].kind
        switch previous {
        case .and, .or, .not, .leftParen: return fail("expected a condition after \(Self.describe(previous))", at: index)
        default: return fail("expected a value after \(Self.describe(previous))", at: index)
        }
    }

    /// The error for an operand where an operator was expected.
    func unexpectedOperand(at index: Int) -> FilterSyntaxError {
        let found = Self.describe(tokens[index].kind)
        for op in operators.reversed() {
            switch op {
            case .group(_, _, let isList):
                return fail("expected an operator\(isList ? ", ','" : "") or ')', found \(found)", at: index)
            case .binary(.comparison, _), .binary(.and, _), .binary(.or, _), .not:
                return fail("expected '&&', '||' or the end of the expression, found \(found)", at: index)
            case .binary(.arithmetic, _), .bitwiseNot:
                continue
            }
        }
        if isCondition(operands[operands.count - 1]) {
            return fail("expected '&&', '||' or the end of the expression, found \(found)", at: index)
        }
        return fail("expected a comparison operator, found \(found)", at: index)
    }

    /// How a token is named in messages.
    static func describe(_ kind: FilterToken.Kind) -> String {
        switch kind {
        case .string: "a string"
        case .number: "a number"
        case .variable: "a field name"
        case .comparison(let op): "'\(op.symbol)'"
        case .arithmetic(let op): "'\(op.symbol)'"
        case .and: "'&&'"
        case .or: "'||'"
        case .not: "'!'"
        case .bitwiseNot: "'~'"
        case .leftParen: "'('"
        case .rightParen: "')'"
        case .comma: "','"
        case .end: "the end of the expression"
        }
    }
}
