#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import NIOCore

/// The server could not listen where it was told to, in words an operator can act on: the port
/// is taken, needs privileges, or the address is not this machine's or does not resolve.
/// (NIO's own errors name the failing system call, not what to do about it.)
package struct ListenError: Error, CustomStringConvertible {
    /// The host the server was told to listen on.
    package let host: String
    /// The port it was told to listen on.
    package let port: Int
    /// Why it could not, and what to do.
    package let reason: String
    /// The error the bind failed with.
    package let cause: any Error

    package var description: String {
        let shown = host.contains(":") ? "[\(host)]" : host
        return "cannot listen on \(shown):\(port): \(reason)"
    }

    /// The bind failure `error` explained, or `nil` when `error` is not a failure to listen.
    package init?(_ error: any Error, host: String, port: Int) {
        if let error = error as? IOError {
            switch error.errnoCode {
            case EADDRINUSE:
                reason = "the port is already in use (another process listens there: stop it or choose another port)"
            case EACCES:
                reason = "permission denied (ports below 1024 need privileges: choose a port from 1024 up)"
            case EADDRNOTAVAIL:
                reason = "this machine has no such address (0.0.0.0 listens on every interface)"
            default:
                return nil
            }
        } else if error is SocketAddressError || error is SocketAddressError.UnknownHost {
            reason = "the host does not resolve to an address (\(error))"
        } else {
            return nil
        }
        self.host = host
        self.port = port
        cause = error
    }
}
