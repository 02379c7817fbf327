import Foundation

extension ConfigurationFile {
    /// Mobile push (docs/push.md): bounds, retries and the providers that send. Every key
    /// optional; without a provider, registrations are kept and nothing is sent.
    public struct Push: Sendable, Codable, Equatable {
        /// Published messages waiting for the push worker at most (default 10,000); beyond it a
        /// message's push is dropped and counted (`tether_push_total{outcome="dropped"}`).
        public var queueCapacity: Int?
        /// Channels one device may be registered on (default 1,000).
        public var maxChannelsPerDevice: Int?
        /// Devices one channel may have (default 100,000).
        public var maxDevicesPerChannel: Int?
        /// Attempts per notification, the first included (default 5): 429 and 5xx answers are
        /// retried with exponential backoff and jitter.
        public var maxAttempts: Int?
        /// The first retry's delay in milliseconds (default 500); each next one doubles, at most
        /// 30 s, with jitter.
        public var retryBaseDelayMilliseconds: Int?
        /// The longest wait before a retry in milliseconds (default 30,000), a gateway's
        /// `Retry-After` included: one worker sends every push, so a longer wait would hold every
        /// other device's notification behind it.
        public var retryMaxDelayMilliseconds: Int?
        /// Notifications sent at once (default 16).
        public var concurrency: Int?
        /// Apple Push Notification service.
        public var apns: APNs?
        /// Firebase Cloud Messaging (HTTP v1).
        public var fcm: FCM?
        /// A webhook for self-hosters: every notification with no native provider is POSTed here.
        public var webhook: Webhook?

        /// Creates push settings.
        public init(apns: APNs? = nil, fcm: FCM? = nil, webhook: Webhook? = nil) {
            self.apns = apns
            self.fcm = fcm
            self.webhook = webhook
        }

        /// APNs with token (JWT) authentication.
        public struct APNs: Sendable, Codable, Equatable {
            /// The `.p8` signing key from the Apple developer account.
            public var keyPath: String
            /// The key's id (the JWT's `kid`).
            public var keyId: String
            /// The team id (the JWT's `iss`).
            public var teamId: String
            /// The topic (bundle id) for devices registered with the v1 form (`type=apns`),
            /// which carries none.
            public var topic: String?
            /// Replaces both Apple hosts (`https://api.push.apple.com` for production,
            /// `https://api.sandbox.push.apple.com` for development), for a proxy or a test server.
            public var baseURL: String?
            /// A PEM file of extra certificate authorities to trust (a private gateway, tests).
            public var caCertificatePath: String?
            /// Seconds Apple keeps trying an offline device (`apns-expiration`, default 86,400).
            public var expirationSeconds: Int?

            /// Creates APNs settings.
            public init(keyPath: String, keyId: String, teamId: String, topic: String? = nil, baseURL: String? = nil,
                        caCertificatePath: String? = nil) {
                self.keyPath = keyPath
                self.keyId = keyId
                self.teamId = teamId
                self.topic = topic
                self.baseURL = baseURL
                self.caCertificatePath = caCertificatePath
            }
        }

        /// FCM HTTP v1 with a service account.
        public struct FCM: Sendable, Codable, Equatable {
            /// The service-account JSON downloaded from the Firebase console.
            public var serviceAccountPath: String
            /// Replaces `https://fcm.googleapis.com` (a proxy or a test server).
            public var baseURL: String?
            /// Replaces the service account's `token_uri`.
            public var tokenURL: String?
            /// A PEM file of extra certificate authorities to trust (a private gateway, tests).
            public var caCertificatePath: String?

            /// Creates FCM settings.
            public init(serviceAccountPath: String, baseURL: String? = nil, tokenURL: String? = nil, caCertificatePath: String? = nil) {
                self.serviceAccountPath = serviceAccountPath
                self.baseURL = baseURL
                self.tokenURL = tokenURL
                self.caCertificatePath = caCertificatePath
            }
        }

        /// The webhook provider.
        public struct Webhook: Sendable, Codable, Equatable {
            /// Where notifications are POSTed.
            public var url: String
            /// The HMAC-SHA256 key of the `X-Tether-Signature` header.
            public var secret: String
            /// A PEM file of extra certificate authorities to trust.
            public var caCertificatePath: String?

            /// Creates webhook settings.
            public init(url: String, secret: String, caCertificatePath: String? = nil) {
                self.url = url
                self.secret = secret
                self.caCertificatePath = caCertificatePath
            }
        }

        /// Checks every bound, naming the key at fault.
        public func validate() throws {
            let bounds: [(String, Int?, ClosedRange<Int>)] = [
                ("push.queueCapacity", queueCapacity, 1...1_000_000), ("push.maxChannelsPerDevice", maxChannelsPerDevice, 1...100_000),
                ("push.maxDevicesPerChannel", maxDevicesPerChannel, 1...10_000_000), ("push.maxAttempts", maxAttempts, 1...20),
                ("push.retryBaseDelayMilliseconds", retryBaseDelayMilliseconds, 1...60_000), ("push.concurrency", concurrency, 1...1_000),
                ("push.retryMaxDelayMilliseconds", retryMaxDelayMilliseconds, 1...600_000),
                ("push.apns.expirationSeconds", apns?.expirationSeconds, 0...31_536_000),
            ]
            for (name, value, range) in bounds {
                if let value, !range.contains(value) {
                    throw ServerConfigurationError("\(name) must be between \(range.lowerBound) and \(range.upperBound)")
                }
            }
            for (name, url) in [("push.apns.baseURL", apns?.baseURL), ("push.fcm.baseURL", fcm?.baseURL), ("push.fcm.tokenURL", fcm?.tokenURL),
                                ("push.webhook.url", webhook?.url)] {
                if let url, URL(string: url)?.host == nil || !(url.hasPrefix("https://") || url.hasPrefix("http://")) {
                    throw ServerConfigurationError("\(name) must be an http or https URL")
                }
            }
            if let webhook, webhook.secret.isEmpty { throw ServerConfigurationError("push.webhook.secret must not be empty") }
        }
    }
}

/// The push settings a server runs with (``ConfigurationFile/Push`` with its defaults).
package struct PushSettings: Sendable {
    package var queueCapacity = 10_000
    package var maxChannelsPerDevice = 1_000
    package var maxDevicesPerChannel = 100_000
    package var maxAttempts = 5
    package var backoff = PushBackoff()
    package var concurrency = 16

    package init() {}

    package init(_ file: ConfigurationFile.Push?) {
        guard let file else { return }
        queueCapacity = file.queueCapacity ?? queueCapacity
        maxChannelsPerDevice = file.maxChannelsPerDevice ?? maxChannelsPerDevice
        maxDevicesPerChannel = file.maxDevicesPerChannel ?? maxDevicesPerChannel
        maxAttempts = file.maxAttempts ?? maxAttempts
        if let base = file.retryBaseDelayMilliseconds { backoff.base = .milliseconds(base) }
        if let cap = file.retryMaxDelayMilliseconds { backoff.cap = .milliseconds(cap) }
        concurrency = file.concurrency ?? concurrency
    }
}

/// Exponential backoff with "equal jitter": attempt `n`'s delay is `d = min(cap, base · 2^(n-1))`,
/// then a uniform draw in `[d/2, d]`; a `Retry-After` from the gateway wins when longer, up to
/// `cap` (the next attempt may then come before the gateway asked, and be answered 429 again,
/// within `maxAttempts`).
package struct PushBackoff: Sendable, Equatable {
    package var base: Duration = .milliseconds(500)
    package var cap: Duration = .seconds(30)

    package init(base: Duration = .milliseconds(500), cap: Duration = .seconds(30)) {
        self.base = base
        self.cap = cap
    }

    /// The delay after failed attempt `attempt` (1-based); `jitter` is a draw in `0..<1`.
    package func delay(afterAttempt attempt: Int, jitter: Double, retryAfter: Duration? = nil) -> Duration {
        let exponent = min(max(attempt - 1, 0), 30)
        let raw = base * (1 << exponent)
        let full = raw < cap ? raw : cap
        let jittered = full / 2 + full / 2 * min(max(jitter, 0), 1)
        if let retryAfter, retryAfter > jittered { return min(retryAfter, cap) }
        return jittered
    }
}
