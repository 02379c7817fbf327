// The canonical text of a filter: single spaces around binary operators, upper-case keywords,
// single-quoted strings, `meta.`/`data.` spelled out, and only the parentheses the tree needs.
// Every parenthesis printed corresponds to one in the source (the tree only nests against
// precedence where the source had a group), so the canonical text is never nested deeper than
// the input and always re-parses to an equal tree. `!` applied to a comparison is printed
// without parentheses (`!meta.a == 1`), exactly as the grammar reads it.

extension FilterCondition {
    func write(to out: inout String) {
        switch self {
        case .comparison(let lhs, let op, let rhs):
            lhs.write(to: &out)
            out += " \(op.symbol) "
            rhs.write(to: &out)
        case .not(let inner):
            out += "!"
            switch inner {
            case .all, .any:
                out += "("
                inner.write(to: &out)
                out += ")"
            case .comparison, .not:
                inner.write(to: &out)
            }
        case .all(let terms):
            for (offset, term) in terms.enumerated() {
                if offset > 0 { out += " && " }
                if case .any = term {
                    out += "("
                    term.write(to: &out)
                    out += ")"
                } else {
                    term.write(to: &out)
                }
            }
        case .any(let terms):
            for (offset, term) in terms.enumerated() {
                if offset > 0 { out += " || " }
                term.write(to: &out)
            }
        }
    }
}

extension FilterOperand {
    func write(to out: inout String) {
        switch self {
        case .string(let text):
            Self.writeQuoted(text, to: &out)
        case .number(let number):
            out += number.text
        case .variable(let path):
            path.write(to: &out)
        case .list(let elements):
            out += "("
            for (offset, element) in elements.enumerated() {
                if offset > 0 { out += ", " }
                element.write(to: &out)
            }
            out += ")"
        case .bitwiseNot(let inner):
            out += "~"
            inner.write(to: &out, parenthesized: inner.printLevel < FilterArithmetic.levelCount)
        case .chain(let first, let steps):
            let level = printLevel
            first.write(to: &out, parenthesized: first.printLevel < level)
            for step in steps {
                out += " \(step.op.symbol) "
                // Chains are left-associative: a same-level chain on the right needs parentheses.
                step.operand.write(to: &out, parenthesized: step.operand.printLevel <= level)
            }
        }
    }

    func write(to out: inout String, parenthesized: Bool) {
        if parenthesized { out += "(" }
        write(to: &out)
        if parenthesized { out += ")" }
    }

    /// `'text'` with `\\`, `\'` and control characters escaped.
    static func writeQuoted(_ text: String, to out: inout String) {
        out += "'"
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\\": out += "\\\\"
            case "'": out += "\\'"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case "\u{08}": out += "\\b"
            case "\u{0C}": out += "\\f"
            default:
                if scalar.value < 0x20 || scalar.value == 0x7F {
                    let hex = String(scalar.value, radix: 16, uppercase: true)
                    out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        out += "'"
    }
}

extension FilterPath {
    func write(to out: inout String) {
        out += root == .meta ? "meta" : "data"
        for key in keys {
            if !key.isEmpty, key.unicodeScalars.allSatisfy(FilterLexer.isIdentifierContinue) {
                out += "."
                out += key
            } else {
                out += "["
                FilterOperand.writeQuoted(key, to: &out)
                out += "]"
            }
        }
    }
}
