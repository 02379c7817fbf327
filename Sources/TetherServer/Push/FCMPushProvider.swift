import Crypto
import CryptoExtras
package import Foundation
import Synchronization
@_spi(Benchmarks) import TetherProtocol

/// Firebase Cloud Messaging, HTTP v1 API (firebase.google.com, "Send a message using FCM HTTP v1
/// API", and Google's "Using OAuth 2.0 for Server to Server Applications"):
///
/// - an access token from the service account: an RS256 JWT assertion (`iss` the client email,
///   `scope` `https://www.googleapis.com/auth/firebase.messaging`, `aud` the token URI, `iat`,
///   `exp` an hour later) POSTed as `grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer`
///   to the token URI; the token is reused until a minute before its `expires_in`;
/// - `POST /v1/projects/{project}/messages:send` with `authorization: Bearer <token>` and
///   `{"message":{"token":…,"notification":…,"data":…,"android":…,…}}` — `pn_fcm` (or `pn_gcm`)
///   without its `pn_*` keys. FCM's `data` is a map of strings: numbers and booleans are sent
///   as their text, objects and arrays as JSON text, `null` dropped.
///
/// 404 `UNREGISTERED` and 400 `INVALID_ARGUMENT` about the registration token unregister the
/// device; 401 replaces the access token and retries; 429 and 5xx are retried.
package final class FCMPushProvider: PushProvider {
    package let name = "fcm"
    let clientEmail: String
    let projectID: String
    let tokenURL: String
    let baseURL: String
    let key: _RSA.Signing.PrivateKey
    let http: PushHTTPClient
    let now: @Sendable () -> Date
    private let cache = Mutex<(token: String, expires: Date)?>(nil)

    static let scope = "https://www.googleapis.com/auth/firebase.messaging"

    /// Reads the service account; `now` is the clock access tokens expire by (tests pass their own).
    package init(_ settings: ConfigurationFile.Push.FCM, now: @escaping @Sendable () -> Date = { Date() }) throws {
        guard let data = FileManager.default.contents(atPath: settings.serviceAccountPath),
              case .object(let account)? = try? JSONValue(parsing: Array(data)),
              let email = account["client_email"]?.stringValue, let project = account["project_id"]?.stringValue,
              let pem = account["private_key"]?.stringValue
        else {
            throw ServerConfigurationError(
                "push.fcm.serviceAccountPath: \(settings.serviceAccountPath) is not a service-account JSON (client_email, project_id, private_key)")
        }
        do { key = try _RSA.Signing.PrivateKey(pemRepresentation: pem) } catch {
            throw ServerConfigurationError("push.fcm.serviceAccountPath: private_key is not an RSA key: \(error)")
        }
        clientEmail = email
        projectID = project
        tokenURL = settings.tokenURL ?? account["token_uri"]?.stringValue ?? "https://oauth2.googleapis.com/token"
        let base = settings.baseURL ?? "https://fcm.googleapis.com"
        baseURL = base.hasSuffix("/") ? String(base.dropLast()) : base
        self.now = now
        http = try PushHTTPClient(caCertificatePath: settings.caCertificatePath)
    }

    /// The signed assertion for the token endpoint, issued at `date`.
    func assertion(at date: Date) throws -> String {
        let header = #"{"alg":"RS256","typ":"JWT"}"#
        var claims = JSONWriter()
        let iat = Int(date.timeIntervalSince1970)
        claims.raw("{\"iss\":")
        claims.string(clientEmail)
        claims.raw(",\"scope\":")
        claims.string(Self.scope)
        claims.raw(",\"aud\":")
        claims.string(tokenURL)
        claims.raw(",\"iat\":")
        claims.number(iat)
        claims.raw(",\"exp\":")
        claims.number(iat + 3600)
        claims.raw("}")
        let input = Base64URL.encode(Array(header.utf8)) + "." + Base64URL.encode(claims.bytes)
        let signature = try key.signature(for: Array(input.utf8), padding: .insecurePKCS1v1_5)
        return input + "." + Base64URL.encode(signature.rawRepresentation)
    }

    /// An access token: the cached one until a minute before it expires, else a new one.
    package func accessToken(forceRefresh: Bool = false) async throws -> String {
        let date = now()
        if !forceRefresh, let cached = cache.withLock({ $0 }), cached.expires > date { return cached.token }
        let form = "grant_type=" + PercentCoding.encode("urn:ietf:params:oauth:grant-type:jwt-bearer")
            + "&assertion=" + PercentCoding.encode(try assertion(at: date))
        let answer = try await http.post(tokenURL, headers: [("Content-Type", "application/x-www-form-urlencoded")], body: Array(form.utf8))
        guard answer.status == 200, let body = try? JSONValue(parsing: answer.body), let token = body["access_token"]?.stringValue else {
            throw FCMTokenError(status: answer.status, body: String(decoding: answer.body.prefix(512), as: UTF8.self))
        }
        let lifetime = Double(body["expires_in"]?.numberValue?.exactInteger ?? 3600)
        cache.withLock { $0 = (token, date.addingTimeInterval(max(lifetime - 60, 0))) }
        return token
    }

    /// `{"message":{"token":…, …pn_fcm without pn_* keys, data as strings}}`.
    static func messageBody(_ notification: PushNotification) -> [UInt8] {
        var message: [String: JSONValue] = ["token": .string(notification.device.token)]
        if case .object(let part) = notification.payload.withoutPubNubKeys {
            for (key, value) in part { message[key] = value }
        }
        if case .object(let data)? = message["data"] {
            var strings: [String: JSONValue] = [:]
            for (key, value) in data {
                switch value {
                case .string: strings[key] = value
                case .null: continue
                case .number(let number): strings[key] = .string(number.text)
                case .bool(let flag): strings[key] = .string(flag ? "true" : "false")
                case .array, .object: strings[key] = .string(value.jsonText)
                }
            }
            message["data"] = .object(strings)
        }
        message["token"] = .string(notification.device.token)
        return JSONValue.object(["message": .object(message)]).jsonBytes
    }

    package func send(_ notification: PushNotification) async -> PushSendResult {
        let bearer: String
        do { bearer = try await accessToken() } catch let error as FCMTokenError {
            return error.status == 429 || error.status >= 500 ? .retryable("token: \(error)", retryAfter: nil) : .failed("token: \(error)")
        } catch {
            return .retryable("token: \(error)", retryAfter: nil)
        }
        let url = "\(baseURL)/v1/projects/\(PercentCoding.encode(projectID))/messages:send"
        do {
            let answer = try await http.post(url, headers: [("authorization", "Bearer \(bearer)"), ("content-type", "application/json")],
                                             body: Self.messageBody(notification))
            if answer.status == 200 { return .sent }
            let error = (try? JSONValue(parsing: answer.body))?["error"]
            let status = error?["status"]?.stringValue ?? ""
            let message = error?["message"]?.stringValue ?? ""
            let details = error?["details"]?.arrayValue ?? []
            let codes = details.compactMap { $0["errorCode"]?.stringValue }
            // Only what Google says about the token unregisters it: `UNREGISTERED`, or an
            // `INVALID_ARGUMENT` naming the token (a `BadRequest` field violation on
            // `message.token`, or the registration-token message). Not any 404 (a proxy or a wrong
            // base URL) nor any message that mentions a token: Google's validation messages repeat
            // the publisher's field names and values (`pn_fcm` is the publisher's).
            if codes.contains("UNREGISTERED") {
                return .invalidToken("\(answer.status) UNREGISTERED")
            }
            let tokenViolation = details.contains { detail in
                (detail["fieldViolations"]?.arrayValue ?? []).contains { $0["field"]?.stringValue == "message.token" }
            }
            if answer.status == 400, status == "INVALID_ARGUMENT" || codes.contains("INVALID_ARGUMENT"),
               tokenViolation || message.hasPrefix("The registration token is not a valid FCM registration token") {
                return .invalidToken("400 INVALID_ARGUMENT: \(message)")
            }
            if answer.status == 401 {
                _ = try? await accessToken(forceRefresh: true)
                return .retryable("401 \(status)", retryAfter: nil)
            }
            return classifyFailure(answer, reason: status.isEmpty ? message : status)
        } catch {
            return .retryable("fcm: \(error)", retryAfter: nil)
        }
    }

    package func shutdown() async { await http.shutdown() }
}

struct FCMTokenError: Error, CustomStringConvertible {
    var status: Int
    var body: String
    var description: String { "token endpoint answered \(status): \(body)" }
}

extension PushDispatcher {
    /// The providers a configuration names: Apple's is APNs when configured, else the webhook;
    /// Google's is FCM when configured, else the webhook.
    package static func providers(_ push: ConfigurationFile.Push?) throws -> (apple: (any PushProvider)?, google: (any PushProvider)?) {
        guard let push else { return (nil, nil) }
        let webhook: (any PushProvider)? = try push.webhook.map { try WebhookPushProvider($0) }
        let apple: (any PushProvider)? = try push.apns.map { try APNsPushProvider($0) } ?? webhook
        let google: (any PushProvider)? = try push.fcm.map { try FCMPushProvider($0) } ?? webhook
        return (apple, google)
    }
}
