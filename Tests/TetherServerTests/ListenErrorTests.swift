import Foundation
import Logging
import NIOCore
import NIOPosix
import Testing
@testable import TetherServer

/// A server that cannot listen says where and why in words, not which system call failed.
@Suite struct ListenErrorTests {
    private static func run(host: String, port: Int) async throws -> ListenError? {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-listen-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var logger = Logger(label: "tether.test.listen")
        logger.logLevel = .critical
        let server = try TetherServer(configuration: ServerConfiguration(host: host, port: port, dataDirectory: directory), logger: logger)
        do {
            try await server.run(handleSignals: false) { url in Issue.record("listening on \(url)") }
            return nil
        } catch let error as ListenError {
            return error
        }
    }

    @Test func aPortInUseIsSaidToBeInUse() async throws {
        let holder = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .bind(host: "127.0.0.1", port: 0).get()
        let port = try #require(holder.localAddress?.port)
        let error = try await Self.run(host: "127.0.0.1", port: port)
        try await holder.close()
        #expect(error?.description == "cannot listen on 127.0.0.1:\(port): the port is already in use "
            + "(another process listens there: stop it or choose another port)")
        #expect((error?.cause as? IOError)?.errnoCode == EADDRINUSE)
    }

    @Test func anAddressThatIsNotThisMachinesIsSaidToBeSo() async throws {
        // TEST-NET-1 (RFC 5737): never a local address.
        let error = try await Self.run(host: "192.0.2.1", port: 0)
        #expect(error?.description == "cannot listen on 192.0.2.1:0: this machine has no such address (0.0.0.0 listens on every interface)")
    }

    @Test func aHostThatDoesNotResolveIsSaidToBeSo() async throws {
        // `.invalid` never resolves (RFC 2606).
        let error = try await Self.run(host: "tether-test.invalid", port: 0)
        #expect(error?.description.hasPrefix("cannot listen on tether-test.invalid:0: the host does not resolve to an address") == true)
    }

    @Test func otherFailuresPassThroughUnchanged() {
        struct Other: Error {}
        #expect(ListenError(Other(), host: "h", port: 1) == nil)
        #expect(ListenError(IOError(errnoCode: ECONNRESET, reason: "read"), host: "h", port: 1) == nil)
    }
}
