/// A number during evaluation: exact 64-bit integer arithmetic while it stays exact, `Double`
/// otherwise. Nothing here can trap: overflow falls back to `Double`, division and remainder by
/// zero and non-finite results produce no value.
enum FilterNumeric: Sendable, Equatable {
    case integer(Int64)
    case real(Double)

    init(_ number: JSONValue.Number) {
        if let integer = number.exactInteger {
            self = .integer(integer)
        } else {
            self = .real(number.doubleValue)
        }
    }

    var double: Double {
        switch self {
        case .integer(let value): Double(value)
        case .real(let value): value
        }
    }

    var isZero: Bool {
        switch self {
        case .integer(let value): value == 0
        case .real(let value): value == 0
        }
    }

    /// The value as an `Int64` when it is a whole number in range (for the bitwise operators).
    var integral: Int64? {
        switch self {
        case .integer(let value): return value
        case .real(let value):
            guard value.isFinite, value.rounded(.towardZero) == value,
                value >= -9_223_372_036_854_775_808.0, value < 9_223_372_036_854_775_808.0
            else { return nil }
            return Int64(value)
        }
    }

    /// The decimal form used where a computed number meets a string (`CONTAINS`, `LIKE`).
    var stringForm: String {
        switch self {
        case .integer(let value): String(value)
        case .real(let value): String(value)
        }
    }

    /// -1, 0 or 1; exact even between integers beyond 2^53 and doubles. `nil` when unordered (NaN).
    static func compare(_ lhs: FilterNumeric, _ rhs: FilterNumeric) -> Int? {
        switch (lhs, rhs) {
        case (.integer(let a), .integer(let b)): return a < b ? -1 : (a == b ? 0 : 1)
        case (.real(let a), .real(let b)):
            if a.isNaN || b.isNaN { return nil }
            return a < b ? -1 : (a == b ? 0 : 1)
        case (.integer(let a), .real(let b)): return compare(integer: a, real: b)
        case (.real(let a), .integer(let b)): return compare(integer: b, real: a).map { -$0 }
        }
    }

    private static func compare(integer a: Int64, real b: Double) -> Int? {
        if b.isNaN { return nil }
        if b >= 9_223_372_036_854_775_808.0 { return -1 }
        if b < -9_223_372_036_854_775_808.0 { return 1 }
        let whole = b.rounded(.towardZero)
        let truncated = Int64(whole)  // in range: checked above
        if a != truncated { return a < truncated ? -1 : 1 }
        let fraction = b - whole
        return fraction > 0 ? -1 : (fraction < 0 ? 1 : 0)
    }

    /// `lhs op rhs`, or `nil` when the result is undefined (division by zero, a non-integer
    /// operand of a bitwise operator, a non-finite result).
    static func apply(_ op: FilterArithmetic, _ lhs: FilterNumeric, _ rhs: FilterNumeric) -> FilterNumeric? {
        switch op {
        case .add: return exact(lhs, rhs, Int64.addingReportingOverflow) ?? finite(lhs.double + rhs.double)
        case .subtract: return exact(lhs, rhs, Int64.subtractingReportingOverflow) ?? finite(lhs.double - rhs.double)
        case .multiply: return exact(lhs, rhs, Int64.multipliedReportingOverflow) ?? finite(lhs.double * rhs.double)
        case .divide:
            if rhs.isZero { return nil }
            if case .integer(let a) = lhs, case .integer(let b) = rhs {
                let (quotient, overflow) = a.dividedReportingOverflow(by: b)
                if !overflow, a.remainderReportingOverflow(dividingBy: b).partialValue == 0 { return .integer(quotient) }
            }
            return finite(lhs.double / rhs.double)
        case .remainder:
            if rhs.isZero { return nil }
            if case .integer(let a) = lhs, case .integer(let b) = rhs {
                let (remainder, overflow) = a.remainderReportingOverflow(dividingBy: b)
                return .integer(overflow ? 0 : remainder)  // only Int64.min % -1 overflows; the answer is 0
            }
            return finite(lhs.double.truncatingRemainder(dividingBy: rhs.double))
        case .bitwiseAnd: return bitwise(lhs, rhs) { $0 & $1 }
        case .bitwiseXor: return bitwise(lhs, rhs) { $0 ^ $1 }
        case .bitwiseOr: return bitwise(lhs, rhs) { $0 | $1 }
        }
    }

    /// The exact integer result, or `nil` when an operand is not an integer or the result overflows.
    private static func exact(
        _ lhs: FilterNumeric, _ rhs: FilterNumeric,
        _ operation: (Int64) -> (Int64) -> (partialValue: Int64, overflow: Bool)
    ) -> FilterNumeric? {
        guard case .integer(let a) = lhs, case .integer(let b) = rhs else { return nil }
        let (result, overflow) = operation(a)(b)
        return overflow ? nil : .integer(result)
    }

    private static func bitwise(_ lhs: FilterNumeric, _ rhs: FilterNumeric, _ operation: (Int64, Int64) -> Int64) -> FilterNumeric? {
        guard let a = lhs.integral, let b = rhs.integral else { return nil }
        return .integer(operation(a, b))
    }

    private static func finite(_ value: Double) -> FilterNumeric? {
        value.isFinite ? .real(value) : nil
    }
}

/// An operand's value during evaluation.
enum FilterValue {
    /// A missing field, JSON `null`, or an undefined arithmetic result: every comparison with it
    /// is false.
    case none
    /// A number and, for literals and JSON numbers, its text as written.
    case number(FilterNumeric, text: String?)
    case string(String)
    case bool(Bool)
    /// A list literal.
    case list([FilterValue])
    /// A JSON array from the message (elements converted on access, so nothing is copied).
    case array([JSONValue])
    /// A JSON object from the message: not comparable to anything.
    case object

    init(_ json: JSONValue?) {
        switch json {
        case nil, .null?: self = .none
        case .bool(let value)?: self = .bool(value)
        case .number(let number)?: self = .number(FilterNumeric(number), text: number.text)
        case .string(let value)?: self = .string(value)
        case .array(let items)?: self = .array(items)
        case .object?: self = .object
        }
    }

    /// The number of elements of a list or array; `nil` for anything else.
    var elementCount: Int? {
        switch self {
        case .list(let elements): elements.count
        case .array(let items): items.count
        case .none, .number, .string, .bool, .object: nil
        }
    }

    /// Element `index` of a list or array (`index < elementCount`).
    func element(_ index: Int) -> FilterValue {
        switch self {
        case .list(let elements): elements[index]
        case .array(let items): FilterValue(items[index])
        case .none, .number, .string, .bool, .object: .none
        }
    }

    /// The text a scalar is matched as by `LIKE` and `CONTAINS`: a string itself, a number as
    /// written (computed numbers in decimal), a boolean as `true`/`false`; `nil` otherwise.
    var stringForm: String? {
        switch self {
        case .string(let value): value
        case .number(let number, let text): text ?? number.stringForm
        case .bool(let value): value ? "true" : "false"
        case .none, .list, .array, .object: nil
        }
    }
}
