import Foundation
import Logging
import Testing
import TetherTestingServer

/// The in-process server's port rules, which the tests that restart a server on its port rely on.
@Suite struct InProcessServerTests {
    /// The kernel's ephemeral port range (what outgoing connections get their local port from).
    static var ephemeralRange: ClosedRange<Int> {
        let bounds = (try? String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8))?
            .split(whereSeparator: \.isWhitespace).compactMap { Int($0) } ?? []
        return bounds.count == 2 ? bounds[0]...bounds[1] : 32768...60999
    }

    @Test func aServerStartedWithoutAPortListensOutsideTheEphemeralRangeAndRestartsOnIt() async throws {
        let server = try await InProcessServer.start()
        #expect(server.port >= 10_000 && !Self.ephemeralRange.contains(server.port), "port \(server.port), ephemeral \(Self.ephemeralRange)")
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
