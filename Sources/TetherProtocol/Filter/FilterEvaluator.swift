/// Evaluates a filter against one message. Each node is visited at most once and every operator
/// is linear in the size of its operands (see `FilterTextSearch.swift`), so the work is bounded
/// by the expression's length plus the size of the message values it reads.
struct FilterEvaluator {
    let meta: JSONValue?
    let data: JSONValue?
    /// Steps taken: one per node and per element, plus the length of every text scanned.
    var work = 0

    init(meta: JSONValue?, data: JSONValue?) {
        self.meta = meta
        self.data = data
    }

    mutating func evaluate(_ condition: FilterCondition) -> Bool {
        work += 1
        switch condition {
        case .comparison(let lhs, let op, let rhs):
            let left = value(lhs)
            let right = value(rhs)
            return compare(left, op, right)
        case .not(let inner):
            return !evaluate(inner)
        case .all(let terms):
            for term in terms where !evaluate(term) { return false }
            return true
        case .any(let terms):
            for term in terms where evaluate(term) { return true }
            return false
        }
    }

    mutating func value(_ operand: FilterOperand) -> FilterValue {
        work += 1
        switch operand {
        case .string(let text):
            return .string(text)
        case .number(let number):
            return .number(FilterNumeric(number), text: number.text)
        case .variable(let path):
            work += path.keys.count
            return FilterValue(path.resolve(meta: meta, data: data))
        case .list(let elements):
            var values: [FilterValue] = []
            values.reserveCapacity(elements.count)
            for element in elements { values.append(value(element)) }
            return .list(values)
        case .bitwiseNot(let inner):
            guard let number = numeric(value(inner))?.integral else { return .none }
            return .number(.integer(~number), text: nil)
        case .chain(let first, let steps):
            guard var accumulator = numeric(value(first)) else { return .none }
            for step in steps {
                guard let operand = numeric(value(step.operand)),
                    let result = FilterNumeric.apply(step.op, accumulator, operand)
                else { return .none }
                accumulator = result
            }
            return .number(accumulator, text: nil)
        }
    }

    // MARK: - Comparisons

    mutating func compare(_ left: FilterValue, _ op: FilterComparison, _ right: FilterValue) -> Bool {
        switch op {
        case .equal:
            return equals(left, right)
        case .notEqual:
            // Both sides must have a value: a missing field is neither equal nor unequal.
            return isComparable(left) && isComparable(right) && !equals(left, right)
        case .less, .greater, .lessOrEqual, .greaterOrEqual:
            guard let a = numeric(left), let b = numeric(right), let order = FilterNumeric.compare(a, b) else { return false }
            switch op {
            case .less: return order < 0
            case .greater: return order > 0
            case .lessOrEqual: return order <= 0
            case .greaterOrEqual: return order >= 0
            case .equal, .notEqual, .like, .contains: return false  // handled above
            }
        case .like:
            return like(left, right)
        case .contains:
            return contains(left, right)
        }
    }

    func isComparable(_ value: FilterValue) -> Bool {
        switch value {
        case .none, .object: false
        case .number, .string, .bool, .list, .array: true
        }
    }

    /// A number, or a string written as a number (`"5"`, `"-2.5e3"`, `"007"`).
    mutating func numeric(_ value: FilterValue) -> FilterNumeric? {
        switch value {
        case .number(let number, _): return number
        case .string(let text): return parseNumber(text)
        case .none, .bool, .list, .array, .object: return nil
        }
    }

    mutating func parseNumber(_ text: String) -> FilterNumeric? {
        work += text.utf8.count + 1
        guard NumberSyntax.scan(Array(text.utf8), allowLeadingZeros: true) else { return nil }
        return FilterNumeric(JSONValue.Number(uncheckedText: text))
    }

    /// `==`. `rightNumber`, when given, is the already-parsed numeric reading of a string `right`
    /// (`.some(nil)`: not a number), so membership tests parse the needle once.
    mutating func equals(_ left: FilterValue, _ right: FilterValue, rightNumber: FilterNumeric?? = nil) -> Bool {
        work += 1
        switch (left, right) {
        case (.none, _), (_, .none), (.object, _), (_, .object):
            return false
        case (.string(let a), .string(let b)):
            work += min(a.utf8.count, b.utf8.count)
            return a == b
        case (.number(let a, _), .number(let b, _)):
            return FilterNumeric.compare(a, b) == 0
        case (.number(let a, _), .string(let text)):
            guard let b = rightNumber ?? parseNumber(text) else { return false }
            return FilterNumeric.compare(a, b) == 0
        case (.string(let text), .number(let b, _)):
            guard let a = parseNumber(text) else { return false }
            return FilterNumeric.compare(a, b) == 0
        case (.bool(let a), .bool(let b)):
            return a == b
        case (.bool(let a), .string(let text)), (.string(let text), .bool(let a)):
            return text == (a ? "true" : "false")
        case (.bool, .number), (.number, .bool):
            return false
        case (.list, _), (.array, _), (_, .list), (_, .array):
            // Two sequences are equal element by element; a sequence never equals a scalar.
            guard let count = left.elementCount, count == right.elementCount else { return false }
            for index in 0..<count where !equals(left.element(index), right.element(index)) {
                return false
            }
            return true
        }
    }

    /// `LIKE`: the right side is the pattern; a list on the left matches if any element does.
    mutating func like(_ left: FilterValue, _ right: FilterValue) -> Bool {
        guard let patternText = right.stringForm else { return false }
        let pattern = WildcardPattern(patternText, work: &work)
        if let count = left.elementCount {
            for index in 0..<count {
                work += 1
                if let text = left.element(index).stringForm, pattern.matches(text, work: &work) { return true }
            }
            return false
        }
        guard let text = left.stringForm else { return false }
        return pattern.matches(text, work: &work)
    }

    /// `CONTAINS`: membership when the left side is a list, otherwise a substring test on the
    /// two sides' text forms (so `meta.text CONTAINS 5` looks for "5").
    mutating func contains(_ left: FilterValue, _ right: FilterValue) -> Bool {
        guard let needle = right.stringForm else { return false }
        if let count = left.elementCount {
            var rightNumber: FilterNumeric?? = nil
            if case .string(let text) = right { rightNumber = .some(parseNumber(text)) }
            for index in 0..<count where equals(left.element(index), right, rightNumber: rightNumber) {
                return true
            }
            return false
        }
        guard let haystack = left.stringForm else { return false }
        return SearchSegment.contains(haystack, needle, work: &work)
    }
}
