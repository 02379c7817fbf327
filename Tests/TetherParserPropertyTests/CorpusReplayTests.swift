import Foundation
import HTTPTypes
import Logging
import Testing
import TetherProtocol
@testable import TetherServer

/// Replays `Tests/Corpus/hostile-requests.txt` (inputs that once broke something) through the
/// request parsers: each line parses or is refused without trapping, classifies to a route,
/// every bounded reader runs on every parameter, and the attacked parameter is refused. The
/// same file is replayed against a real server by `Tests/Conformance/test_hostile_routes.py`.
@Suite struct CorpusReplayTests {
    struct Entry: CustomStringConvertible {
        var expect: Int
        var keyset: String
        var param: String?
        var method: HTTPRequest.Method
        var target: String
        var line: Int
        var description: String { "line \(line): \(method) \(target)" }
    }

    static let corpusPath = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Corpus/hostile-requests.txt").path

    static func entries() throws -> [Entry] {
        let text = try String(contentsOfFile: corpusPath, encoding: .utf8)
        var entries: [Entry] = []
        for (index, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            if line.isEmpty || line.hasPrefix("#") { continue }
            var fields: [String: String] = [:]
            var rest = line[...]
            while let space = rest.firstIndex(of: " "), let equals = rest[..<space].firstIndex(of: "=") {
                fields[String(rest[..<equals])] = String(rest[rest.index(after: equals)..<space])
                rest = rest[rest.index(after: space)...]
            }
            let parts = rest.split(separator: " ", maxSplits: 1)
            guard parts.count == 2, let expect = fields["expect"].flatMap({ Int($0) }), let keyset = fields["keyset"],
                  let method = HTTPRequest.Method(String(parts[0]))
            else {
                Issue.record("malformed corpus line \(index + 1): \(line)")
                continue
            }
            entries.append(Entry(expect: expect, keyset: keyset, param: fields["param"], method: method, target: String(parts[1]),
                                 line: index + 1))
        }
        return entries
    }

    @Test func corpusIsWellFormedAndCoversTheKnownTraps() throws {
        let entries = try Self.entries()
        #expect(entries.contains { $0.target.contains("ttl=1000000000") && $0.keyset == "open" })
        #expect(entries.contains { $0.target.contains("timestamp=-9223372036854775808") && $0.keyset == "secret" })
        for entry in entries {
            #expect(["open", "secret"].contains(entry.keyset), "\(entry)")
            #expect((200...599).contains(entry.expect), "\(entry)")
        }
    }

    /// The bounded reader of each numeric parameter, by route where a name means two things.
    static func read(_ name: String, route: Route, _ wire: WireRequest) throws(ParameterError) {
        switch name {
        case "seqn": _ = try wire.integer(name, in: ParameterBounds.sequence)
        case "heartbeat": _ = try wire.integer(name, in: ParameterBounds.heartbeatSeconds)
        case "tr": _ = try wire.integer(name, in: ParameterBounds.region)
        case "count": _ = try wire.integer(name, in: ParameterBounds.historyCount)
        case "max": _ = try wire.integer(name, in: ParameterBounds.fetchMax)
        case "limit": _ = try wire.integer(name, in: ParameterBounds.hereNowLimit)
        case "offset": _ = try wire.integer(name, in: ParameterBounds.hereNowOffset)
        case "ttl" where route == .grant: _ = try wire.integer(name, in: ParameterBounds.grantTTLMinutes)
        case "ttl": _ = try wire.decimal(name, in: ParameterBounds.publishTTLHours)
        case "tt", "start", "end", "timetoken": _ = try wire.timetoken(name)
        default: break
        }
    }

    @Test func corpusReplaysThroughTheParsers() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-corpus-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let logger = Logger(label: "corpus")
        let store = try MessageStore(directory: directory, logger: logger, metrics: ServerMetrics())
        let access = try AccessManager(store: store, logger: logger)
        let secret = Keyset(name: "secret", publishKey: "hpub", subscribeKey: "hsub", secretKey: "hsecret")

        for entry in try Self.entries() {
            let pieces = entry.target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
            let rawPath = String(pieces[0])
            let rawQuery = pieces.count > 1 ? String(pieces[1]) : nil
            let wire: WireRequest
            do {
                wire = try WireRequest(rawPath: rawPath, rawQuery: rawQuery)
            } catch {
                // Refused before routing: the server answers 400.
                #expect(entry.expect == 400, "\(entry)")
                continue
            }
            guard let route = Route.classify(entry.method, wire.segments, wire) else {
                #expect(entry.expect == 404, "\(entry) classifies to no route")
                continue
            }
            var refused: Set<String> = []
            for name in wire.query.dictionary.keys {
                do { try Self.read(name, route: route, wire) } catch { refused.insert(name) }
            }
            guard let param = entry.param else { continue }
            if param == "timestamp" {
                let verdict = access.verifySignature(keyset: secret, method: entry.method.rawValue, rawPath: wire.rawPath,
                                                     rawQuery: wire.rawQuery, body: [])
                guard case .invalid = verdict else {
                    Issue.record("\(entry): signature check answered \(verdict), expected invalid")
                    continue
                }
            } else if entry.expect == 400 {
                #expect(refused.contains(param), "\(entry): \(param) was accepted by its bounded reader")
            }
        }
        try store.close()
    }
}
