import ArgumentParser
import Foundation
import Logging
import Tether

/// Options shared by the SDK-based commands (`publish`, `history`, `here-now`, `time`).
struct ClientOptions: ParsableArguments {
    @Option(help: "Server as host[:port]. [env: TETHER_ORIGIN] (default: 127.0.0.1:8090)")
    var origin: String?

    @Option(name: .customLong("fallback-origin"),
            help: "Another node serving the same keys, as host[:port]; repeat for more. The client fails over to them when the origin stops answering. [env: TETHER_FALLBACK_ORIGINS, comma-separated]")
    var fallbackOrigins: [String] = []

    @Flag(name: .customLong("tls"), help: "Use HTTPS (default: plain HTTP, as `tether serve` listens).")
    var tls = false

    @Option(name: .customLong("ca-file"), help: "PEM file of the certificate authorities to trust (with --tls).")
    var caFile: String?

    @Option(name: .customLong("sub-key"), help: "Subscribe key. [env: TETHER_SUB_KEY] (default: demo)")
    var subscribeKey: String?

    @Option(name: .customLong("pub-key"), help: "Publish key. [env: TETHER_PUB_KEY] (default: demo)")
    var publishKey: String?

    @Option(name: .customLong("user-id"), help: "User id sent as uuid. [env: TETHER_USER_ID] (default: tether-cli)")
    var userId: String?

    @Option(help: "Auth key or Access Manager token.")
    var auth: String?

    @Option(name: .customLong("cipher-key"), help: "Encrypt/decrypt message payloads with this key.")
    var cipherKey: String?

    @Option(help: "Cryptor for --cipher-key: legacy, aes-cbc (PubNub-compatible) or aes-gcm (Tether only). (default: aes-cbc)")
    var cryptor: String = "aes-cbc"

    @Option(help: "Request timeout in seconds. (default: 15)")
    var timeout: Double?

    /// Builds the client, turning configuration problems into clear CLI errors.
    func makeClient(configure: (inout TetherConfiguration) -> Void = { _ in }) throws -> TetherClient {
        let env = ProcessInfo.processInfo.environment
        var logger = Logger(label: "tether.cli")
        logger.logLevel = .warning
        var configuration: TetherConfiguration
        do {
            configuration = try TetherConfiguration(
                subscribeKey: subscribeKey ?? env["TETHER_SUB_KEY"] ?? "demo",
                publishKey: publishKey ?? env["TETHER_PUB_KEY"] ?? "demo",
                userId: userId ?? env["TETHER_USER_ID"] ?? "tether-cli",
                authKey: auth,
                origin: origin ?? env["TETHER_ORIGIN"] ?? "127.0.0.1:8090",
                useTLS: tls,
                logger: logger)
        } catch {
            throw ValidationError(error.description)
        }
        let fallbacks = fallbackOrigins.isEmpty
            ? (env["TETHER_FALLBACK_ORIGINS"] ?? "").split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
            : fallbackOrigins
        do { try configuration.setFallbackOrigins(fallbacks) } catch { throw ValidationError(error.description) }
        if let caFile {
            guard let data = FileManager.default.contents(atPath: caFile) else { throw ValidationError("cannot read --ca-file \(caFile)") }
            configuration.trustedCertificateAuthoritiesPEM = Array(data)
        }
        if let timeout {
            guard timeout > 0 else { throw ValidationError("--timeout must be positive") }
            configuration.nonSubscribeTimeout = .milliseconds(Int(timeout * 1000))
        }
        if let cipherKey {
            switch cryptor {
            case "legacy": configuration.cryptoModule = .legacy(cipherKey: cipherKey)
            case "aes-cbc": configuration.cryptoModule = .aesCBC(cipherKey: cipherKey)
            case "aes-gcm": configuration.cryptoModule = .aesGCM(cipherKey: cipherKey)
            default: throw ValidationError("--cryptor must be legacy, aes-cbc or aes-gcm")
            }
        }
        configure(&configuration)
        do { return try TetherClient(configuration: configuration) } catch { throw ValidationError(error.description) }
    }
}

/// Runs `body` with a client, shuts the client down, and turns SDK failures into one clear
/// line on stderr and exit code 1.
func withClient(_ options: ClientOptions, configure: (inout TetherConfiguration) -> Void = { _ in },
                _ body: (TetherClient) async throws(TetherError) -> Void) async throws {
    let client = try options.makeClient(configure: configure)
    do {
        try await body(client)
        await client.shutdown()
    } catch {
        await client.shutdown()
        FileHandle.standardError.write(Data("error: \(error.description)\n\(hint(for: error.status, origin: client.configuration.origin))".utf8))
        throw ExitCode.failure
    }
}

func hint(for status: Status, origin: String) -> String {
    switch status.category {
    case .networkIssues: return "hint: is a server running at \(origin)? (start one with `tether serve`)\n"
    case .timeout: return "hint: the server at \(origin) did not answer in time; raise --timeout or check the network\n"
    case .tlsUntrustedCertificate: return "hint: pass the server's CA with --ca-file\n"
    case .tlsConnectionFailed: return "hint: does the server speak TLS? drop --tls for a plain `tether serve`\n"
    case .malformedResponse: return "hint: something other than a Tether server answered (a proxy or captive portal?)\n"
    case .accessDenied: return "hint: pass an auth key or token with --auth\n"
    default: return ""
    }
}
