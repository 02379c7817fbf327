import Crypto
package import Foundation
import Synchronization
@_spi(Benchmarks) import TetherProtocol

/// Apple Push Notification service over HTTP/2 with token-based authentication
/// (developer.apple.com, "Sending notification requests to APNs" and "Establishing a
/// token-based connection to APNs"):
///
/// - `POST /3/device/{token}` on `api.push.apple.com` (production) or
///   `api.sandbox.push.apple.com` (development), chosen by the registration's environment;
/// - `authorization: bearer <JWT>`: header `{"alg":"ES256","kid":<key id>}`, claims
///   `{"iss":<team id>,"iat":<seconds>}`, signed with the `.p8` key. Apple refuses a token
///   older than an hour and one refreshed more than once every 20 minutes: the token is reused
///   for 50 minutes, then replaced; an `ExpiredProviderToken` answer replaces it early only when
///   it is at least 20 minutes old;
/// - `apns-topic`, `apns-push-type` (`pn_push`'s `push_type`, default `alert`),
///   `apns-priority` (10, or 5 for `background`), `apns-expiration`, `apns-id`;
/// - the body is `pn_apns` without its `pn_*` keys.
///
/// 410 `Unregistered`, 400 `BadDeviceToken` and `DeviceTokenNotForTopic` unregister the device;
/// 429 and 5xx are retried.
package final class APNsPushProvider: PushProvider {
    package let name = "apns"
    let settings: ConfigurationFile.Push.APNs
    let key: P256.Signing.PrivateKey
    let http: PushHTTPClient
    let now: @Sendable () -> Date
    private let cache = Mutex<(token: String, issuedAt: Date)?>(nil)

    /// Tokens are reused this long, under Apple's one-hour limit.
    static let tokenLifetime: TimeInterval = 50 * 60
    /// Apple's minimum interval between two tokens.
    static let minimumRefreshInterval: TimeInterval = 20 * 60

    /// Reads the key; `now` is the clock tokens are issued and renewed by (tests pass their own).
    package init(_ settings: ConfigurationFile.Push.APNs, now: @escaping @Sendable () -> Date = { Date() }) throws {
        guard let pem = FileManager.default.contents(atPath: settings.keyPath).map({ String(decoding: $0, as: UTF8.self) }) else {
            throw ServerConfigurationError("push.apns.keyPath: cannot read \(settings.keyPath)")
        }
        do { key = try P256.Signing.PrivateKey(pemRepresentation: pem) } catch {
            throw ServerConfigurationError("push.apns.keyPath: \(settings.keyPath) is not an ES256 (.p8) private key: \(error)")
        }
        self.settings = settings
        self.now = now
        http = try PushHTTPClient(caCertificatePath: settings.caCertificatePath)
    }

    /// A signed provider token issued at `date`.
    func makeToken(at date: Date) throws -> String {
        var header = JSONWriter()
        header.raw("{\"alg\":\"ES256\",\"kid\":")
        header.string(settings.keyId)
        header.raw("}")
        var claims = JSONWriter()
        claims.raw("{\"iss\":")
        claims.string(settings.teamId)
        claims.raw(",\"iat\":")
        claims.number(Int(date.timeIntervalSince1970))
        claims.raw("}")
        let input = Base64URL.encode(header.bytes) + "." + Base64URL.encode(claims.bytes)
        let signature = try key.signature(for: Array(input.utf8))
        return input + "." + Base64URL.encode(signature.rawRepresentation)
    }

    /// The cached token, replaced once it is `tokenLifetime` old (or, with `expired`, once it
    /// is at least `minimumRefreshInterval` old).
    package func token(replacingExpired expired: Bool = false) throws -> String {
        let date = now()
        return try cache.withLock { cached in
            if let cached {
                let age = date.timeIntervalSince(cached.issuedAt)
                let stale = expired ? age >= Self.minimumRefreshInterval : age >= Self.tokenLifetime
                if !stale { return cached.token }
            }
            let token = try makeToken(at: date)
            cached = (token, date)
            return token
        }
    }

    /// `apns-topic` for a push type: the bundle id, with the suffix Apple requires for VoIP,
    /// complication, File Provider and Live Activity pushes.
    static func topic(bundle: String, pushType: String) -> String {
        let suffix: String
        switch pushType {
        case "voip": suffix = ".voip"
        case "complication": suffix = ".complication"
        case "fileprovider": suffix = ".pushkit.fileprovider"
        case "liveactivity": suffix = ".push-type.liveactivity"
        case "location": suffix = ".location-query"
        case "pushtotalk": suffix = ".voip-ptt"
        default: return bundle
        }
        return bundle.hasSuffix(suffix) ? bundle : bundle + suffix
    }

    func baseURL(environment: String) -> String {
        if let base = settings.baseURL { return base.hasSuffix("/") ? String(base.dropLast()) : base }
        return environment == "production" ? "https://api.push.apple.com" : "https://api.sandbox.push.apple.com"
    }

    /// The `apns-push-type` values Apple documents; anything else (a publisher's typo, or bytes
    /// that are not a header value) is refused here, not sent and retried.
    static let pushTypes: Set<String> = ["alert", "background", "voip", "complication", "fileprovider", "mdm", "liveactivity",
                                         "location", "pushtotalk", "widgets", "controls"]

    package func send(_ notification: PushNotification) async -> PushSendResult {
        guard let bundle = notification.topic.isEmpty ? settings.topic : notification.topic else {
            return .failed("no topic: the device was registered with type=apns and push.apns.topic is not set")
        }
        guard Self.pushTypes.contains(notification.pushType) else {
            return .failed("unknown push_type \(String(reflecting: String(notification.pushType.prefix(40))))")
        }
        let topic = Self.topic(bundle: bundle, pushType: notification.pushType)
        let deviceToken = notification.device.token
        let bearer: String
        do { bearer = try token() } catch { return .failed("signing the provider token failed: \(error)") }
        let expiration = Int(now().timeIntervalSince1970) + (settings.expirationSeconds ?? 86_400)
        let headers = [
            ("authorization", "bearer \(bearer)"),
            ("apns-topic", topic),
            ("apns-push-type", notification.pushType),
            ("apns-priority", notification.pushType == "background" ? "5" : "10"),
            ("apns-expiration", String(expiration)),
            ("apns-id", UUID().uuidString.lowercased()),
            ("content-type", "application/json"),
        ]
        let url = baseURL(environment: notification.environment) + "/3/device/" + PercentCoding.encode(deviceToken)
        do {
            let answer = try await http.post(url, headers: headers, body: notification.payload.withoutPubNubKeys.jsonBytes)
            if answer.status == 200 { return .sent }
            let reason = (try? JSONValue(parsing: answer.body))?["reason"]?.stringValue ?? ""
            switch (answer.status, reason) {
            case (410, _), (400, "BadDeviceToken"):
                return .invalidToken("\(answer.status) \(reason)")
            case (400, "DeviceTokenNotForTopic"):
                // The topic is the publisher's choice (`push_type`) or the configuration's, not
                // the device's fault: the token stays registered for what it is for.
                return .failed("400 DeviceTokenNotForTopic (topic \(topic))")
            case (403, "ExpiredProviderToken"):
                _ = try? self.token(replacingExpired: true)
                return .retryable("403 ExpiredProviderToken", retryAfter: nil)
            default:
                return classifyFailure(answer, reason: reason)
            }
        } catch {
            return .retryable("apns: \(error)", retryAfter: nil)
        }
    }

    package func shutdown() async { await http.shutdown() }
}
