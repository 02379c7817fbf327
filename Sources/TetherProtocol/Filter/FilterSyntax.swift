// The syntax tree of a parsed filter expression (protocol reference §10).
//
// The tree is normalised so that equal meanings compare equal and the canonical text re-parses to
// the same tree: legacy bare names are stored as `meta` paths, chains of one precedence level are
// flat lists (`a + b - c` is one node, so a 2,000-term sum is not 2,000 levels deep), `&&` and
// `||` are n-ary, and number literals lose redundant leading zeros. Nesting depth is therefore
// bounded by the parser's depth limit times the number of precedence levels.

/// A boolean node: something that is true or false for a message.
indirect enum FilterCondition: Sendable, Hashable {
    /// `lhs op rhs`.
    case comparison(FilterOperand, FilterComparison, FilterOperand)
    /// `!condition`.
    case not(FilterCondition)
    /// `a && b && …` (at least two terms, none of them itself `.all`).
    case all([FilterCondition])
    /// `a || b || …` (at least two terms, none of them itself `.any`).
    case any([FilterCondition])
}

/// A value node: something compared, computed with or listed.
indirect enum FilterOperand: Sendable, Hashable {
    /// A quoted string literal (escapes decoded).
    case string(String)
    /// A number literal (possibly negative).
    case number(JSONValue.Number)
    /// A field of the message's `meta` or payload.
    case variable(FilterPath)
    /// `(a, b, c)`: at least two elements.
    case list([FilterOperand])
    /// `~operand`.
    case bitwiseNot(FilterOperand)
    /// `first op₁ x₁ op₂ x₂ …`, all operators of one precedence level, evaluated left to right.
    /// `first` is never a chain of the same level (such a chain is spliced in).
    case chain(FilterOperand, [FilterStep])
}

/// One `op operand` link of a ``FilterOperand/chain(_:_:)``.
struct FilterStep: Sendable, Hashable {
    var op: FilterArithmetic
    var operand: FilterOperand
}

/// The comparison operators.
enum FilterComparison: Sendable, Hashable {
    case equal, notEqual, less, greater, lessOrEqual, greaterOrEqual, like, contains

    /// The canonical spelling.
    var symbol: String {
        switch self {
        case .equal: "=="
        case .notEqual: "!="
        case .less: "<"
        case .greater: ">"
        case .lessOrEqual: "<="
        case .greaterOrEqual: ">="
        case .like: "LIKE"
        case .contains: "CONTAINS"
        }
    }
}

/// The binary arithmetic and bitwise operators.
enum FilterArithmetic: Sendable, Hashable {
    case multiply, divide, remainder, add, subtract, bitwiseAnd, bitwiseXor, bitwiseOr

    /// Binding strength, loosest 0 … tightest 4 (C's order): `|` < `^` < `&` < `+ -` < `* / %`.
    var level: Int {
        switch self {
        case .bitwiseOr: 0
        case .bitwiseXor: 1
        case .bitwiseAnd: 2
        case .add, .subtract: 3
        case .multiply, .divide, .remainder: 4
        }
    }

    /// The spelling.
    var symbol: String {
        switch self {
        case .multiply: "*"
        case .divide: "/"
        case .remainder: "%"
        case .add: "+"
        case .subtract: "-"
        case .bitwiseAnd: "&"
        case .bitwiseXor: "^"
        case .bitwiseOr: "|"
        }
    }

    /// The number of arithmetic precedence levels.
    static let levelCount = 5
}

/// A field reference: `meta.a.b`, `meta["key"]`, `data.x`, or a legacy bare name (a `meta` key).
struct FilterPath: Sendable, Hashable {
    /// Which part of the message the path starts from.
    enum Root: Sendable, Hashable {
        case meta, data
    }

    var root: Root
    /// The object member names to follow; never empty.
    var keys: [String]

    /// The value at this path, or `nil` when a step is missing or is not an object.
    func resolve(meta: JSONValue?, data: JSONValue?) -> JSONValue? {
        var current = root == .meta ? meta : data
        for key in keys {
            guard case .object(let members)? = current, let next = members[key] else { return nil }
            current = next
        }
        return current
    }
}

extension FilterCondition {
    /// Every field reference, in order of appearance (with repeats).
    var variables: [FilterPath] {
        var paths: [FilterPath] = []
        collectVariables(into: &paths)
        return paths
    }

    func collectVariables(into paths: inout [FilterPath]) {
        switch self {
        case .comparison(let lhs, _, let rhs):
            lhs.collectVariables(into: &paths)
            rhs.collectVariables(into: &paths)
        case .not(let inner):
            inner.collectVariables(into: &paths)
        case .all(let terms), .any(let terms):
            for term in terms { term.collectVariables(into: &paths) }
        }
    }
}

extension FilterOperand {
    func collectVariables(into paths: inout [FilterPath]) {
        switch self {
        case .string, .number: break
        case .variable(let path): paths.append(path)
        case .list(let elements):
            for element in elements { element.collectVariables(into: &paths) }
        case .bitwiseNot(let inner): inner.collectVariables(into: &paths)
        case .chain(let first, let steps):
            first.collectVariables(into: &paths)
            for step in steps { step.operand.collectVariables(into: &paths) }
        }
    }

    /// The precedence level for printing: a chain's level, or `levelCount` for atoms.
    var printLevel: Int {
        if case .chain(_, let steps) = self, let first = steps.first { return first.op.level }
        return FilterArithmetic.levelCount
    }
}
