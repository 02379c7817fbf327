import Crypto
import Foundation
@_spi(Benchmarks) import TetherProtocol

/// The webhook provider for self-hosters (docs/push.md, "Webhook"): each notification is POSTed
/// as one JSON document,
///
/// ```json
/// {"subscribeKey":"…","channel":"…","timetoken":"17…","device":{"token":"…","type":"apns2",
///  "environment":"production","topic":"com.example.app"},"payload":{…the gateway's part…}}
/// ```
///
/// with `X-Tether-Signature: sha256=<hex HMAC-SHA256 of the body with the secret>`. A 2xx answer
/// is sent; 410 unregisters the device; 429 and 5xx are retried; anything else is a failure.
package struct WebhookPushProvider: PushProvider {
    package let name = "webhook"
    let url: String
    let secret: SymmetricKey
    let http: PushHTTPClient

    init(_ settings: ConfigurationFile.Push.Webhook) throws {
        url = settings.url
        secret = SymmetricKey(data: Array(settings.secret.utf8))
        http = try PushHTTPClient(caCertificatePath: settings.caCertificatePath)
    }

    /// The signature header's value for `body`.
    package static func signature(body: [UInt8], secret: String) -> String {
        let mac = HMAC<SHA256>.authenticationCode(for: body, using: SymmetricKey(data: Array(secret.utf8)))
        return "sha256=" + mac.map { String(format: "%02x", $0) }.joined()
    }

    static func document(_ n: PushNotification) -> [UInt8] {
        var w = JSONWriter(capacity: 256)
        w.raw("{\"subscribeKey\":")
        w.string(n.device.subscribeKey)
        w.raw(",\"channel\":")
        w.string(n.channel)
        w.raw(",\"timetoken\":")
        w.timetokenString(n.messageTimetoken)
        w.raw(",\"device\":{\"token\":")
        w.string(n.device.token)
        w.raw(",\"type\":")
        w.string(n.device.gateway.rawValue)
        if n.device.gateway.isApple {
            w.raw(",\"environment\":")
            w.string(n.environment)
            w.raw(",\"topic\":")
            w.string(n.topic)
            w.raw(",\"pushType\":")
            w.string(n.pushType)
        }
        w.raw("},\"payload\":")
        n.payload.withoutPubNubKeys.write(to: &w)
        w.raw("}")
        return w.bytes
    }

    package func send(_ notification: PushNotification) async -> PushSendResult {
        let body = Self.document(notification)
        let mac = HMAC<SHA256>.authenticationCode(for: body, using: secret)
        let signature = "sha256=" + mac.map { String(format: "%02x", $0) }.joined()
        do {
            let answer = try await http.post(url, headers: [("Content-Type", "application/json"), ("X-Tether-Signature", signature),
                                                            ("User-Agent", "tether-push")], body: body)
            if (200..<300).contains(answer.status) { return .sent }
            if answer.status == 410 { return .invalidToken("410 from webhook") }
            return classifyFailure(answer, reason: "webhook")
        } catch {
            return .retryable("webhook: \(error)", retryAfter: nil)
        }
    }

    package func shutdown() async { await http.shutdown() }
}
