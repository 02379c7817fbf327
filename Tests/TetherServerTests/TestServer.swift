import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import TetherProtocol
import TetherServer
import TetherTesting
import TetherTestingServer

/// A real Tether server on a loopback port with its own SQLite file (TetherTestingServer's
/// ``InProcessServer``), plus the raw HTTP requests the server tests send it.
struct TestServer {
    let inProcess: InProcessServer
    /// The client requests go through (the shared one holds at most 8 connections per host).
    var client: HTTPClient = .shared
    var server: TetherServer { inProcess.server }
    var baseURL: String { inProcess.baseURL }
    var directory: String { inProcess.directory }

    /// Awaits the moment exactly `count` long-polls are parked in the hub (for at most `seconds`);
    /// `false` when they never are.
    func longPollsWaiting(_ count: Int, within seconds: Double = 10) async -> Bool {
        let hub = server.state.hub
        return await finishes(within: seconds) { await hub.waitUntilWaiting(count) }
    }

    static func start<C: Clock>(directory: String? = nil, file: ConfigurationFile = .init(subscribeTimeoutSeconds: 30),
                                clock: C = ContinuousClock(), databaseURL: String? = nil) async throws -> TestServer
        where C.Duration == Duration
    {
        TestServer(inProcess: try await InProcessServer.start(file: file, directory: directory, clock: clock, databaseURL: databaseURL))
    }

    /// Stops the server and waits until it has closed its store; the data directory stays, so a
    /// test can start a server on it again.
    func stop() async {
        await inProcess.stop(removingData: false)
    }

    func get(_ path: String, timeout: TimeAmount = .seconds(60)) async throws -> (status: Int, body: String, headers: HTTPHeaders) {
        try await send(path, method: .GET, body: nil, timeout: timeout)
    }

    func send(_ path: String, method: HTTPMethod, body: [UInt8]?, headers: [(String, String)] = [],
              timeout: TimeAmount = .seconds(60)) async throws -> (status: Int, body: String, headers: HTTPHeaders) {
        var request = HTTPClientRequest(url: baseURL + path)
        request.method = method
        for (name, value) in headers { request.headers.add(name: name, value: value) }
        if let body { request.body = .bytes(ByteBuffer(bytes: body)) }
        let response = try await client.execute(request, timeout: timeout)
        let bytes = try await response.body.collect(upTo: 16 * 1024 * 1024)
        return (Int(response.status.code), String(buffer: bytes), response.headers)
    }

    /// Publishes `message` (JSON text) on `channel` of the demo keyset; returns its timetoken.
    @discardableResult
    func publish(_ channel: String, _ message: String, query: String = "") async throws -> Timetoken {
        let (status, body, _) = try await get("/publish/demo/demo/0/\(PercentCoding.encode(channel))/0/\(PercentCoding.encode(message))?uuid=tester\(query)")
        guard status == 200, let data = body.data(using: .utf8),
              let array = try JSONSerialization.jsonObject(with: data) as? [Any], let text = array[2] as? String,
              let tt = Timetoken(parsing: text)
        else { throw TestFailure("publish failed: \(status) \(body)") }
        return tt
    }

    /// One subscribe request; returns the cursor and the envelopes.
    func subscribe(_ channels: String, tt: Timetoken, groups: String? = nil, timeout: TimeAmount = .seconds(60)) async throws
        -> (cursor: Timetoken, messages: [[String: Any]], headers: HTTPHeaders)
    {
        let groupQuery = groups.map { "&channel-group=\($0)" } ?? ""
        let (status, body, headers) = try await get("/v2/subscribe/demo/\(channels)/0?tt=\(tt.rawValue)&tr=1&uuid=tester\(groupQuery)",
                                                    timeout: timeout)
        guard status == 200, let object = try JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any],
              let t = object["t"] as? [String: Any], let cursorText = t["t"] as? String, let cursor = Timetoken(parsing: cursorText),
              let messages = object["m"] as? [[String: Any]]
        else { throw TestFailure("subscribe failed: \(status) \(body)") }
        return (cursor, messages, headers)
    }

    func handshake(_ channels: String) async throws -> Timetoken {
        try await subscribe(channels, tt: .zero).cursor
    }

    /// GET `path` and parse the JSON body as an object.
    func object(_ path: String) async throws -> [String: Any] {
        let (status, body, _) = try await get(path)
        guard let object = try JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any] else {
            throw TestFailure("not a JSON object: \(status) \(body)")
        }
        return object
    }
}

/// `path` with a query signed by `keyset`'s secret key (a server-side admin request).
func signedPath(_ path: String, _ query: [String: String] = [:], method: String = "GET", body: String = "",
                keyset: Keyset, timestamp: Int64? = nil) -> String {
    let now = timestamp ?? Int64(Date().timeIntervalSince1970)
    return path + "?" + AccessManager.signedQuery(method: method, publishKey: keyset.publishKey, path: path, query: query,
                                                   body: body, secret: keyset.secretKey!, timestamp: now)
}

struct TestFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

extension Dictionary where Key == String, Value == Any {
    var publishTimetoken: String? { (self["p"] as? [String: Any])?["t"] as? String }
}

