/// `LIKE` patterns and `CONTAINS` substring search, both linear in the text and the pattern.
///
/// A pattern with only `*` wildcards is a prefix, a suffix and middle segments. The text matches
/// iff it starts with the prefix, ends with the suffix, and the middle segments occur in order,
/// without overlapping, in between. Taking the leftmost occurrence of each middle segment is
/// always safe (it leaves the most room for the rest), so one left-to-right pass with a
/// Knuth–Morris–Pratt search per segment decides the match: no backtracking, O(text + pattern).
struct WildcardPattern {
    /// Literal text before the first `*` (all of it when there is no `*`), lowercased.
    let prefix: [Character]
    /// Literal text after the last `*`, lowercased; empty when there is no `*`.
    let suffix: [Character]
    /// Non-empty literal runs between stars, lowercased.
    let middle: [SearchSegment]
    let hasWildcard: Bool

    /// Compiles `pattern`: `*` matches any run of characters, `\*` is a literal `*`, `\\` a literal
    /// backslash; any other `\` is literal. Matching ignores case.
    init(_ pattern: String, work: inout Int) {
        var segments: [[Character]] = [[]]
        var escaping = false
        for character in pattern {
            work += 1
            if escaping {
                escaping = false
                if character != "*" && character != "\\" { segments[segments.count - 1].append("\\") }
                segments[segments.count - 1].append(character)
            } else if character == "\\" {
                escaping = true
            } else if character == "*" {
                segments.append([])
            } else {
                segments[segments.count - 1].append(character)
            }
        }
        if escaping { segments[segments.count - 1].append("\\") }
        func lowered(_ characters: [Character]) -> [Character] {
            work += characters.count
            return Array(String(characters).lowercased())
        }
        hasWildcard = segments.count > 1
        prefix = lowered(segments[0])
        suffix = hasWildcard ? lowered(segments[segments.count - 1]) : []
        var middle: [SearchSegment] = []
        if segments.count > 2 {
            for segment in segments[1..<(segments.count - 1)] where !segment.isEmpty {
                middle.append(SearchSegment(lowered(segment), work: &work))
            }
        }
        self.middle = middle
    }

    /// Whether `text` matches, ignoring case.
    func matches(_ text: String, work: inout Int) -> Bool {
        work += text.utf8.count + 1
        let text = Array(text.lowercased())
        guard hasWildcard else { return text == prefix }
        let count = text.count
        guard prefix.count + suffix.count <= count else { return false }
        work += prefix.count + suffix.count
        guard text[0..<prefix.count].elementsEqual(prefix), text[(count - suffix.count)..<count].elementsEqual(suffix) else {
            return false
        }
        var position = prefix.count
        let limit = count - suffix.count
        for segment in middle {
            guard let found = segment.firstOccurrence(in: text, from: position, to: limit, work: &work) else { return false }
            position = found + segment.characters.count
        }
        return true
    }
}

/// A literal run with its Knuth–Morris–Pratt failure table.
struct SearchSegment {
    let characters: [Character]
    /// `failure[i]`: length of the longest proper border of `characters[0...i]`.
    let failure: [Int]

    init(_ characters: [Character], work: inout Int) {
        self.characters = characters
        var failure = [Int](repeating: 0, count: characters.count)
        var border = 0
        var index = 1
        while index < characters.count {
            work += 1
            if characters[index] == characters[border] {
                border += 1
                failure[index] = border
                index += 1
            } else if border > 0 {
                border = failure[border - 1]
            } else {
                failure[index] = 0
                index += 1
            }
        }
        self.failure = failure
    }

    /// The start of the first occurrence inside `text[from..<to]`, or `nil`. At most
    /// 2·(to − from) comparisons.
    func firstOccurrence(in text: [Character], from start: Int, to end: Int, work: inout Int) -> Int? {
        if characters.isEmpty { return start }
        var matched = 0
        var index = start
        while index < end {
            work += 1
            if text[index] == characters[matched] {
                matched += 1
                index += 1
                if matched == characters.count { return index - matched }
            } else if matched > 0 {
                matched = failure[matched - 1]
            } else {
                index += 1
            }
        }
        return nil
    }

    /// Whether `needle` occurs in `haystack` (case-sensitive, by `Character`), in linear time.
    static func contains(_ haystack: String, _ needle: String, work: inout Int) -> Bool {
        if needle.isEmpty { return true }
        work += haystack.utf8.count + needle.utf8.count
        let segment = SearchSegment(Array(needle), work: &work)
        let text = Array(haystack)
        return segment.firstOccurrence(in: text, from: 0, to: text.count, work: &work) != nil
    }
}
