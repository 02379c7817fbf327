import Foundation
package import TetherProtocol

/// One notification for one device: the gateway's part of a published message (`pn_apns`,
/// `pn_fcm` or `pn_gcm`, its `pn_*` keys still in it) and where it goes.
package struct PushNotification: Sendable, Equatable {
    package var device: PushDevice
    package var channel: String
    package var messageTimetoken: Timetoken
    /// The gateway's part of the message.
    package var payload: JSONValue
    /// For Apple: the environment (`development` or `production`) and topic to send with.
    package var environment: String
    package var topic: String
    /// For Apple: `apns-push-type` (`alert` unless `pn_push` says otherwise).
    package var pushType: String

    package init(device: PushDevice, channel: String, messageTimetoken: Timetoken, payload: JSONValue, environment: String = "",
                 topic: String = "", pushType: String = "alert") {
        self.device = device
        self.channel = channel
        self.messageTimetoken = messageTimetoken
        self.payload = payload
        self.environment = environment
        self.topic = topic
        self.pushType = pushType
    }
}

/// What a gateway answered.
package enum PushSendResult: Sendable, Equatable {
    case sent
    /// The token is not (or no longer) valid: the device is unregistered.
    case invalidToken(String)
    /// Worth another attempt (429, 5xx, a transport failure), after at least `retryAfter`.
    case retryable(String, retryAfter: Duration?)
    /// Refused for good (a bad payload, bad credentials).
    case failed(String)
}

/// Sends notifications to one kind of gateway (APNs, FCM, a webhook).
package protocol PushProvider: Sendable {
    /// A label for metrics and logs (`apns`, `fcm`, `webhook`).
    var name: String { get }
    /// Sends one notification; never throws (every failure is a result).
    func send(_ notification: PushNotification) async -> PushSendResult
    /// Releases connections.
    func shutdown() async
}

extension JSONValue {
    /// The object without its `pn_*` members (PubNub's control keys, never sent to a device).
    var withoutPubNubKeys: JSONValue {
        guard case .object(let members) = self else { return self }
        return .object(members.filter { !$0.key.hasPrefix("pn_") })
    }
}

/// `Retry-After` in seconds, as a duration.
func retryAfterDuration(_ header: String?) -> Duration? {
    guard let header, let seconds = Int(header.trimmingCharacters(in: .whitespaces)), seconds >= 0 else { return nil }
    return .seconds(min(seconds, 3600))
}
