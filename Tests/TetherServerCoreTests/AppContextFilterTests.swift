import Testing
import TetherProtocol
import TetherServerCore

/// The App Context filter language, sort keys, page cursors and timestamps (pure).
struct AppContextFilterTests {
    static let alice: JSONValue = [
        "id": "alice", "name": "Alice Smith", "email": nil, "status": "online", "updated": "2026-01-02T03:04:05.000006Z",
        "custom": ["role": "admin", "age": 30, "vip": true],
    ]

    func matches(_ filter: String, _ record: JSONValue = alice) throws -> Bool {
        try AppContextFilter(parsing: filter).matches(record)
    }

    @Test func relationalOperators() throws {
        #expect(try matches(#"name == "Alice Smith""#))
        #expect(try matches(#"name != "Bob""#))
        #expect(try matches("custom.age > 29 && custom.age >= 30 && custom.age < 31 && custom.age <= 30"))
        #expect(try !matches("custom.age > 30"))
        #expect(try matches(#"updated >= "2026-01-01T00:00:00Z" && updated < "2026-02-01""#))
        #expect(try matches("custom.vip == true"))
        #expect(try matches("custom.missing == null && email == null"))
        #expect(try !matches(#"custom.missing > "a""#))
        #expect(try matches("name == 'Alice Smith'"))
        #expect(try !matches(#"custom.age == "30""#))  // a string is not the number
    }

    @Test func likeIsWildcardAndCaseInsensitive() throws {
        #expect(try matches(#"name LIKE "alice*""#))
        #expect(try matches(#"name LIKE "*SMITH""#))
        #expect(try matches(#"name LIKE "*ce S*""#))
        #expect(try matches(#"name like "Alice Smith""#))
        #expect(try !matches(#"name LIKE "Alice""#))
        #expect(try matches(#"name LIKE "a*e*h""#))
        #expect(try !matches(#"name LIKE "\*lice*""#))
        #expect(try AppContextFilter(parsing: #"name LIKE "a\*b""#).matches(["name": "a*b"]))
        #expect(try !AppContextFilter(parsing: #"name LIKE "a\*b""#).matches(["name": "axb"]))
    }

    @Test func booleanStructureAndPrecedence() throws {
        #expect(try matches(#"name == "x" || status == "online""#))
        #expect(try !matches(#"name == "x" && status == "online""#))
        // && binds tighter than ||.
        #expect(try matches(#"status == "online" || name == "x" && name == "y""#))
        #expect(try !matches(#"(status == "online" || name == "x") && name == "y""#))
        #expect(try matches(#"!(name == "x")"#))
        #expect(try !matches(#"!!(name == "x")"#))
    }

    @Test(arguments: [
        "", "name", "name ==", #"name === "x""#, #"(name == "x""#, #"name == "x")"#, #"name == "x" &&"#, #"name ~ "x""#,
        #"name == "unterminated"#, "name == bare", #"== "x""#, #"a.b.c.d.e == 1"#, #"name == "x" name == "y""#,
    ])
    func syntaxErrors(_ text: String) {
        #expect(throws: AppContextFilter.SyntaxError.self) { try AppContextFilter(parsing: text) }
    }

    @Test func boundsOnLengthAndDepth() {
        let deep = String(repeating: "(", count: 100) + #"name == "x""# + String(repeating: ")", count: 100)
        #expect(throws: AppContextFilter.SyntaxError.self) { try AppContextFilter(parsing: deep) }
        let long = Array(repeating: #"name == "x""#, count: 300).joined(separator: " || ")
        #expect(throws: AppContextFilter.SyntaxError.self) { try AppContextFilter(parsing: long) }
        let nots = String(repeating: "!", count: 1000) + #"name == "x""#
        #expect(throws: AppContextFilter.SyntaxError.self) { try AppContextFilter(parsing: nots) }
    }

    @Test func likeIsNotExponential() {
        let text = String(repeating: "a", count: 2000)
        let pattern = String(repeating: "*a", count: 200) + "b"
        #expect(!AppContextFilter.evaluate(.string(text), .like, .string(pattern)))
    }

    @Test func sortKeys() {
        let allowed: Set<String> = ["id", "name", "updated", "channel.name"]
        #expect(AppContextSort.parse("name:desc,id", allowed: allowed) == [
            AppContextSort(field: ["name"], descending: true), AppContextSort(field: ["id"], descending: false),
        ])
        #expect(AppContextSort.parse("channel.name:ASC", allowed: allowed) == [AppContextSort(field: ["channel", "name"], descending: false)])
        #expect(AppContextSort.parse("shoe", allowed: allowed) == nil)
        #expect(AppContextSort.parse("name:up", allowed: allowed) == nil)
        #expect(AppContextSort.parse("name:asc:x", allowed: allowed) == nil)
        let records: [JSONValue] = [["id": "b", "name": "x"], ["id": "a", "name": nil], ["id": "c", "name": "w"]]
        let asc = records.sorted { AppContextSort.ordered($0, $1, by: [AppContextSort(field: ["name"], descending: false)], tieBreak: ["id"]) }
        #expect(asc.map { $0["id"]?.stringValue } == ["c", "b", "a"])  // nulls last
        let desc = records.sorted { AppContextSort.ordered($0, $1, by: [AppContextSort(field: ["name"], descending: true)], tieBreak: ["id"]) }
        #expect(desc.map { $0["id"]?.stringValue } == ["a", "b", "c"])
    }

    @Test func cursorsArePubNubsUnpaddedBase64Offsets() {
        #expect(AppContextCursor.encode(1) == "MQ")
        #expect(AppContextCursor.encode(10) == "MTA")
        #expect(AppContextCursor.encode(15) == "MTU")
        #expect(AppContextCursor.decode("MTA") == 10)
        #expect(AppContextCursor.decode("Mg") == 2)
        #expect(AppContextCursor.decode("!!") == nil)
        #expect(AppContextCursor.decode("") == nil)
        #expect(AppContextCursor.decode("LTE") == nil)  // "-1"
        #expect(AppContextCursor.decode(String(repeating: "M", count: 40)) == nil)
    }

    @Test func timestampsAreISO8601WithMicroseconds() {
        #expect(AppContextTimestamp.format(Timetoken(0)) == "1970-01-01T00:00:00.000000Z")
        // 2024-03-07T08:47:38.835107Z
        #expect(AppContextTimestamp.format(Timetoken(17_098_012_588_351_070)) == "2024-03-07T08:47:38.835107Z")
        #expect(AppContextTimestamp.format(Timetoken(9_517_824_000_000_000)) == "2000-02-29T00:00:00.000000Z")
    }
}
