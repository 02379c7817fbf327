import NIOCore
import NIOHTTP1

/// NIO's HTTP/1 decoders, built once in the process before any connection is made.
///
/// This works around a crash in the Swift runtime (seen with Swift 6.3.1 on Linux). When one
/// thread checks a protocol conformance of a generic root class whose type metadata another
/// thread is still completing, the runtime reads the class's superclass (null for a root class)
/// and dereferences it: `swift_checkMetadataState` on a null pointer, SIGSEGV. NIO builds
/// `ByteToMessageHandler<HTTPDecoder<…>>` for every HTTP/1 connection, on the connection's own
/// event loop, so the first connections of a fresh process arriving together on two event loops
/// crashed it, in about one start in 300 with four connections made right after start. Once the
/// metadata is complete the runtime takes a safe path, so building both decoders once, before
/// any event loop can, is enough: the server does it before it binds (``TetherHTTPChannel``), the
/// push client before its first request.
enum HTTPDecoderTypes {
    /// Touch it (`_ = HTTPDecoderTypes.ready`) before the first HTTP/1 connection is set up.
    static let ready: Bool = {
        _ = ByteToMessageHandler(HTTPRequestDecoder(leftOverBytesStrategy: .forwardBytes))
        _ = ByteToMessageHandler(HTTPResponseDecoder(leftOverBytesStrategy: .forwardBytes))
        return true
    }()
}
