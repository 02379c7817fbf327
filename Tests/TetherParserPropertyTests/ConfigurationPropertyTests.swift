import Foundation
import NIOCore
import PropertyBased
import Testing
@testable import TetherServer

/// Every number in a configuration file is bounded: a file either fails to load (decoding or
/// `ConfigurationFile.validate()`), or every value it sets lies in its documented range — and
/// the values derived from it (long-poll timeout, `Retry-After`) never trap.
@Suite struct ConfigurationPropertyTests {
    /// Documented ranges (docs/configuration.md, `Limits.validate`), transcribed.
    static let limitRanges: [(String, ClosedRange<Double>)] = [
        ("maxMessageBytes", 64...4_194_304), ("maxSignalBytes", 1...65_536), ("maxURIBytes", 1_024...1_048_576),
        ("maxChannelsPerSubscribe", 1...10_000), ("maxEnvelopesPerResponse", 1...10_000), ("maxChannelsPerGroup", 1...100_000),
        ("publishRatePerSecond", 0...1_000_000), ("publishBurst", 1...1_000_000), ("requestRatePerSecond", 0...1_000_000),
        ("requestBurst", 1...1_000_000), ("publishRatePerAddress", 0...1_000_000), ("publishBurstPerAddress", 1...1_000_000),
        ("requestRatePerAddress", 0...1_000_000), ("requestBurstPerAddress", 1...1_000_000), ("maxGroupsPerRequest", 1...1_000),
        ("maxGroupsPerKeyset", 1...1_000_000),
    ]
    static let topRanges: [(String, ClosedRange<Double>)] = [("subscribeTimeoutSeconds", 1...300)]
    static let keysetRanges: [(String, ClosedRange<Double>)] = [
        ("historyRetentionHours", 0...876_000), ("presenceAnnounceMax", 0...100_000), ("presenceIntervalSeconds", 1...3_600),
        ("presenceMinimumTimeoutSeconds", 1...3_600),
    ]
    static let windowRanges: [(String, ClosedRange<Double>)] = [
        ("capacity", 1...100_000), ("maximumAgeSeconds", 1...86_400), ("memoryBudgetBytes", 1_048_576...1_099_511_627_776),
        ("maxChannels", 100...100_000_000),
    ]

    /// Hostile JSON numbers: range ends and one past, huge, negative, fractional, exponents.
    static let numbers = Gen<String?>.element(of: [
        "0", "-0", "1", "-1", "0.5", "1e-300", "1e308", "-1e308", "1e400", "9223372036854775807", "9223372036854775808",
        "-9223372036854775809", "18446744073709551616", "64", "63", "4194304", "4194305", "300", "300.0001", "0.999",
        "876000", "876000.5", "1099511627776", "1099511627777", "99", "100", "3600", "3601", "86400", "86401", "\"10\"", "null",
    ]).map { $0! }

    @Test func configurationFilesLoadOnlyWithinTheirDocumentedRanges() async {
        let all = Self.limitRanges.map { ("limits", $0.0) } + Self.topRanges.map { ("", $0.0) }
            + Self.keysetRanges.map { ("keyset", $0.0) } + Self.windowRanges.map { ("window", $0.0) }
        let picks = Gen<Int>.int(in: 0...(all.count - 1)).array(of: 1...4)
        let values = Self.numbers.array(of: 4)
        var loaded = 0
        await propertyCheck(count: 3_000, input: picks, values) { picks, values in
            var limits: [String] = []
            var top: [String] = []
            var keyset: [String] = ["\"publishKey\":\"p\"", "\"subscribeKey\":\"s\""]
            var window: [String] = []
            for (i, pick) in picks.enumerated() {
                let (section, key) = all[pick]
                let field = "\"\(key)\":\(values[i])"
                switch section {
                case "limits": limits.append(field)
                case "keyset": keyset.append(field)
                case "window": window.append(field)
                default: top.append(field)
                }
            }
            top.append("\"limits\":{\(limits.joined(separator: ","))}")
            top.append("\"window\":{\(window.joined(separator: ","))}")
            top.append("\"keysets\":[{\(keyset.joined(separator: ","))}]")
            let json = "{\(top.joined(separator: ","))}"
            guard let file = try? JSONDecoder().decode(ConfigurationFile.self, from: Data(json.utf8)), (try? file.validate()) != nil
            else { return }
            // Loaded: every value is inside its range.
            loaded += 1
            let limitsValue = file.limits ?? Limits()
            let limitMirror = Dictionary(uniqueKeysWithValues: Mirror(reflecting: limitsValue).children.compactMap { child in
                child.label.map { ($0, child.value) }
            })
            for (name, range) in Self.limitRanges {
                let value = (limitMirror[name] as? Int).map(Double.init) ?? (limitMirror[name] as? Double) ?? .nan
                #expect(range.contains(value), "\(name) = \(value) loaded from \(json)")
            }
            if let timeout = file.subscribeTimeoutSeconds { #expect((1...300).contains(timeout), "\(json)") }
            let keysetValue = file.keysets[0]
            #expect((0...876_000).contains(keysetValue.historyRetentionHours), "\(json)")
            if let v = keysetValue.presenceAnnounceMax { #expect((0...100_000).contains(v)) }
            if let v = keysetValue.presenceIntervalSeconds { #expect((1...3_600).contains(v)) }
            if let v = keysetValue.presenceMinimumTimeoutSeconds { #expect((1...3_600).contains(v)) }
            if let v = file.window?.capacity { #expect((1...100_000).contains(v)) }
            if let v = file.window?.maximumAgeSeconds { #expect((1...86_400).contains(v)) }
            if let v = file.window?.memoryBudgetBytes { #expect(((1 << 20)...(1 << 40)).contains(v)) }
            if let v = file.window?.maxChannels { #expect((100...100_000_000).contains(v)) }
            // The arithmetic that uses them stays in range.
            #expect(limitsValue.maxMessageBytes * 4 + 1024 > 0)
            _ = ServerConfiguration(file: file).subscribeTimeout
        }
        // Not vacuous: plenty of the random files are valid.
        #expect(loaded > 100)
    }

    @Test func subscribeTimeoutNeverTrapsEvenUnvalidated() async {
        let seconds = Gen<Double?>.element(of: [Double.nan, .infinity, -.infinity, -1, 0, 1e-300, 0.5, 280, 300, 301, 1e300,
                                               .greatestFiniteMagnitude]).map { $0! }
        await propertyCheck(count: 200, input: seconds) { seconds in
            let timeout = ServerConfiguration(file: ConfigurationFile(subscribeTimeoutSeconds: seconds)).subscribeTimeout
            #expect(timeout.nanoseconds >= 1_000_000 && timeout.nanoseconds <= 300_000_000_000)
            if seconds.isFinite, (1...300).contains(seconds) {
                #expect(timeout.nanoseconds == Int64(seconds * 1000) * 1_000_000)
            }
        }
    }

    @Test func retryAfterIsWholeSecondsWithinADay() async {
        let waits = Gen<Double>.frequency(
            (3, Gen.double(in: 0...100_000)),
            (2, Gen.double(in: -1e300...1e300)),
            (1, Gen<Double?>.element(of: [Double.nan, .infinity, -.infinity, 1e300, 86_400, 86_400.000001, 0.0001, 0]).map { $0! }))
        await propertyCheck(count: 2_000, input: waits) { wait in
            let seconds = TetherResponder.retryAfterSeconds(wait)
            #expect((1...86_400).contains(seconds))
            if wait.isFinite, wait >= 1, wait <= 86_400 { #expect(Double(seconds) == wait.rounded(.up)) }
        }
    }

    /// An empty secret (a templated variable left unset) would leave the keyset open while it
    /// looks protected: refused at load.
    @Test func anEmptySecretKeyIsRefused() throws {
        let empty = #"{"keysets":[{"publishKey":"pub-a","subscribeKey":"sub-a","secretKey":""}]}"#
        let file = try JSONDecoder().decode(ConfigurationFile.self, from: Data(empty.utf8))
        #expect(throws: ServerConfigurationError.self) { try file.validate() }
        let set = #"{"keysets":[{"publishKey":"pub-a","subscribeKey":"sub-a","secretKey":"s"}]}"#
        try JSONDecoder().decode(ConfigurationFile.self, from: Data(set.utf8)).validate()
    }
}
