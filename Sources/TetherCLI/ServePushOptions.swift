import ArgumentParser
import TetherServer

/// `tether serve`'s push options (docs/push.md): each over its environment variable, over the
/// config file's `push` key.
struct ServePushOptions: ParsableArguments {
    @Option(name: .customLong("apns-key"), help: "APNs signing key (.p8): send pushes to Apple devices. [env: TETHER_APNS_KEY]")
    var apnsKey: String?

    @Option(name: .customLong("apns-key-id"), help: "The APNs key's id (JWT kid). [env: TETHER_APNS_KEY_ID]")
    var apnsKeyId: String?

    @Option(name: .customLong("apns-team-id"), help: "The Apple developer team id (JWT iss). [env: TETHER_APNS_TEAM_ID]")
    var apnsTeamId: String?

    @Option(name: .customLong("apns-topic"), help: "Bundle id for devices registered with type=apns (no topic of their own). [env: TETHER_APNS_TOPIC]")
    var apnsTopic: String?

    @Option(name: .customLong("apns-base-url"), help: "Replaces both Apple hosts (a proxy or a test server). [env: TETHER_APNS_BASE_URL]")
    var apnsBaseURL: String?

    @Option(name: .customLong("fcm-service-account"), help: "Firebase service-account JSON: send pushes to Android devices. [env: TETHER_FCM_SERVICE_ACCOUNT]")
    var fcmServiceAccount: String?

    @Option(name: .customLong("fcm-base-url"), help: "Replaces https://fcm.googleapis.com (a proxy or a test server). [env: TETHER_FCM_BASE_URL]")
    var fcmBaseURL: String?

    @Option(name: .customLong("push-ca"), help: "PEM certificate authorities the push providers also trust (a private gateway). [env: TETHER_PUSH_CA]")
    var pushCA: String?

    @Option(name: .customLong("push-webhook-url"), help: "POST every push with no native provider here, signed. Needs --push-webhook-secret. [env: TETHER_PUSH_WEBHOOK_URL]")
    var webhookURL: String?

    @Option(name: .customLong("push-webhook-secret"), help: "HMAC-SHA256 key of the webhook's X-Tether-Signature header. [env: TETHER_PUSH_WEBHOOK_SECRET]")
    var webhookSecret: String?

    /// Merges the options and their environment variables into `file.push`; throws on an
    /// incomplete provider.
    func apply(to file: inout ConfigurationFile, env: [String: String]) throws {
        func value(_ flag: String?, _ name: String) -> String? { flag ?? env[name].flatMap { $0.isEmpty ? nil : $0 } }
        var push = file.push ?? ConfigurationFile.Push()
        var changed = false
        let ca = value(pushCA, "TETHER_PUSH_CA")
        let key = value(apnsKey, "TETHER_APNS_KEY"), keyId = value(apnsKeyId, "TETHER_APNS_KEY_ID")
        let teamId = value(apnsTeamId, "TETHER_APNS_TEAM_ID")
        if key != nil || keyId != nil || teamId != nil {
            guard let key, let keyId, let teamId else {
                throw ValidationError("--apns-key, --apns-key-id and --apns-team-id go together")
            }
            push.apns = .init(keyPath: key, keyId: keyId, teamId: teamId, topic: value(apnsTopic, "TETHER_APNS_TOPIC"),
                              baseURL: value(apnsBaseURL, "TETHER_APNS_BASE_URL"), caCertificatePath: ca)
            changed = true
        }
        if let account = value(fcmServiceAccount, "TETHER_FCM_SERVICE_ACCOUNT") {
            push.fcm = .init(serviceAccountPath: account, baseURL: value(fcmBaseURL, "TETHER_FCM_BASE_URL"), caCertificatePath: ca)
            changed = true
        }
        let url = value(webhookURL, "TETHER_PUSH_WEBHOOK_URL"), secret = value(webhookSecret, "TETHER_PUSH_WEBHOOK_SECRET")
        if url != nil || secret != nil {
            guard let url, let secret else { throw ValidationError("--push-webhook-url and --push-webhook-secret go together") }
            push.webhook = .init(url: url, secret: secret, caCertificatePath: ca)
            changed = true
        }
        if changed {
            file.push = push
            try file.validate()
        }
    }
}
