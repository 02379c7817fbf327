/// Validation rules for the names that appear in paths and query strings: channels, channel
/// groups, keys and user ids.
///
/// The rules follow PubNub's documented limits (names up to 92 characters) and refuse what would
/// make the wire ambiguous: commas (list separators), `*` outside a trailing wildcard, and control
/// characters.
package enum NameRules {
    /// The longest channel, group or user id accepted, in Unicode scalars.
    package static let maximumNameLength = 92

    /// The suffix that turns a channel or group name into its presence channel.
    package static let presenceSuffix = "-pnpres"

    /// Why a name was refused.
    package enum Violation: Error, Equatable, Sendable, CustomStringConvertible {
        /// The name is empty.
        case empty
        /// The name is longer than ``NameRules/maximumNameLength``.
        case tooLong
        /// The name contains a character that is not allowed (given).
        case forbiddenCharacter(Character)
        /// A wildcard was used where it is not allowed, or in an unsupported form.
        case invalidWildcard

        /// A message for humans, used in error bodies.
        package var description: String {
            switch self {
            case .empty: return "name is empty"
            case .tooLong: return "name is longer than \(NameRules.maximumNameLength) characters"
            case .forbiddenCharacter(let c): return "name contains the forbidden character \(String(reflecting: String(c)))"
            case .invalidWildcard: return "wildcards are only allowed as a trailing '.*' on subscribe, at most two levels deep"
            }
        }
    }

    /// Validates a concrete channel name (publish, history, presence...). No wildcards.
    package static func validateChannel(_ name: String) throws(Violation) {
        try validateCommon(name)
        // Scalars, not Characters: `*` followed by a combining mark is one Character that is
        // not `*`, yet it still carries the wildcard byte.
        if name.unicodeScalars.contains("*") { throw .forbiddenCharacter("*") }
    }

    /// Validates a channel group name.
    package static func validateGroup(_ name: String) throws(Violation) {
        try validateChannel(name)
    }

    /// Validates a name in a subscribe channel list: a concrete channel or a wildcard pattern
    /// such as `sports.*` or `sports.eu.*` (PubNub allows at most two dots before the `*`).
    package static func validateSubscribeChannel(_ name: String) throws(Violation) {
        try validateCommon(name)
        let scalars = name.unicodeScalars
        guard scalars.contains("*") else { return }
        guard scalars.count > 2, scalars.suffix(2).elementsEqual([".", "*"]) else { throw .invalidWildcard }
        let prefix = scalars.dropLast(2)
        if prefix.contains("*") { throw .invalidWildcard }
        if prefix.filter({ $0 == "." }).count > 1 { throw .invalidWildcard }
    }

    /// Validates a publish or subscribe key: 1–100 characters of `[A-Za-z0-9._-]`.
    package static func validateKey(_ key: String) -> Bool {
        guard !key.isEmpty, key.utf8.count <= 100 else { return false }
        return key.utf8.allSatisfy { b in
            (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A)
                || b == 0x2D || b == 0x5F || b == 0x2E
        }
    }

    /// Validates a user id (`uuid` query parameter).
    package static func validateUserId(_ id: String) throws(Violation) {
        try validateCommon(id)
    }

    /// Whether `name` is a wildcard subscription pattern (`prefix.*`).
    package static func isWildcard(_ name: String) -> Bool { name.hasSuffix(".*") }

    /// Whether `name` is a presence channel or group name (`…-pnpres`).
    package static func isPresence(_ name: String) -> Bool { name.hasSuffix(presenceSuffix) }

    private static func validateCommon(_ name: String) throws(Violation) {
        if name.isEmpty { throw .empty }
        if name.unicodeScalars.count > maximumNameLength { throw .tooLong }
        for scalar in name.unicodeScalars {
            if scalar.value < 0x20 || scalar.value == 0x7F { throw .forbiddenCharacter(Character(scalar)) }
            if scalar == "," { throw .forbiddenCharacter(",") }
        }
    }
}
