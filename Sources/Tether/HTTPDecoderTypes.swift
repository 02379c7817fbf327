import NIOCore
import NIOHTTP1

/// NIO's HTTP/1 decoders, built once in the process before the client's first connection.
///
/// This works around a crash in the Swift runtime (seen with Swift 6.3.1 on Linux). When one
/// thread checks a protocol conformance of a generic root class whose type metadata another
/// thread is still completing, the runtime reads the class's superclass (null for a root class)
/// and dereferences it: `swift_checkMetadataState` on a null pointer, SIGSEGV. NIO builds
/// `ByteToMessageHandler<HTTPDecoder<…>>` for every HTTP/1 connection on the connection's own
/// event loop, so two first connections on two event loops at once (two clients, or a client
/// and a server in one process) can crash the app. Once the metadata is complete the runtime
/// takes a safe path, so building both decoders once, before any event loop can, is enough.
/// The server has the same guard (TetherServer's `HTTPDecoderTypes`).
package enum HTTPDecoderTypes {
    /// Touch it (`_ = HTTPDecoderTypes.ready`) before the first HTTP/1 connection is set up.
    package static let ready: Bool = {
        _ = ByteToMessageHandler(HTTPRequestDecoder(leftOverBytesStrategy: .forwardBytes))
        _ = ByteToMessageHandler(HTTPResponseDecoder(leftOverBytesStrategy: .forwardBytes))
        return true
    }()
}
