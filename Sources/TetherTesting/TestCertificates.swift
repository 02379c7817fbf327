import Foundation

/// The PEM files in `Sources/TetherTesting/Certificates` (see its README): a test CA, a server
/// certificate it signed for `localhost`/`127.0.0.1`, and a self-signed certificate nobody trusts.
public enum TestCertificates {
    /// A certificate and its private key, as file paths.
    public struct Identity: Sendable, Hashable {
        /// The PEM certificate file.
        public var certificatePath: String
        /// The PEM private key file.
        public var privateKeyPath: String
    }

    /// The server identity signed by the test CA.
    public static var server: Identity { Identity(certificatePath: path("server.pem"), privateKeyPath: path("server-key.pem")) }

    /// A self-signed identity (untrusted by everyone, including clients that trust the test CA).
    public static var selfSigned: Identity {
        Identity(certificatePath: path("self-signed.pem"), privateKeyPath: path("self-signed-key.pem"))
    }

    /// The test CA certificate, as PEM bytes (for `TetherConfiguration.trustedCertificateAuthoritiesPEM`).
    public static var certificateAuthorityPEM: [UInt8] {
        (try? Array(Data(contentsOf: URL(fileURLWithPath: path("ca.pem"))))) ?? []
    }

    static func path(_ name: String) -> String {
        guard let url = Bundle.module.url(forResource: "Certificates/\(name)", withExtension: nil)
            ?? Bundle.module.url(forResource: name, withExtension: nil, subdirectory: "Certificates")
        else { return "/nonexistent/\(name)" }
        return url.path
    }
}
