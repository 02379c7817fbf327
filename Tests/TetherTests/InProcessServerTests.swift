import Foundation
import Logging
import Testing
import TetherTestingServer

/// The in-process server's port rules, which the tests that restart a server on its port rely on.
@Suite struct InProcessServerTests {
    /// The kernel's ephemeral range starts here (what outgoing connections get their local port from).
    static var ephemeralStart: Int {
        let text = (try? String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8)) ?? "32768"
        return Int(text.split(whereSeparator: \.isWhitespace).first ?? "32768") ?? 32768
    }

    @Test func aServerStartedWithoutAPortListensBelowTheEphemeralRangeAndRestartsOnIt() async throws {
        let server = try await InProcessServer.start()
        #expect(server.port >= 10_000 && server.port < Self.ephemeralStart, "port \(server.port)")
        await server.stop(removingData: false)
        let restarted = try await InProcessServer.start(port: server.port, directory: server.directory)
        #expect(restarted.port == server.port)
        await restarted.stop()
    }

    @Test func aPortInUseIsRefusedWhenAskedFor() async throws {
        let server = try await InProcessServer.start()
        await #expect(throws: InProcessServerError.self) {
            let second = try await InProcessServer.start(port: server.port, logLevel: .critical)
            await second.stop()
        }
        await server.stop()
    }
}
