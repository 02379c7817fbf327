package import TetherProtocol

/// The push service a device token belongs to (PubNub's push gateways).
public enum PushType: String, Sendable, Hashable, CaseIterable {
    /// Apple Push Notification service over HTTP/2: the registration carries the app's bundle id
    /// (`topic`) and its ``PushEnvironment`` (PubNub's `apns2`, the form to use for Apple).
    case apns2
    /// Firebase Cloud Messaging (Android, and web or Apple devices through Firebase).
    case fcm
    /// Apple, registered without topic or environment (PubNub's legacy `apns`); the server sends
    /// with its configured topic to the production environment.
    case apns
}

/// Which APNs environment a device token was issued for: apps built for development (Xcode)
/// get sandbox tokens, App Store and TestFlight builds production ones.
public enum PushEnvironment: String, Sendable, Hashable, CaseIterable {
    /// `api.sandbox.push.apple.com`.
    case development
    /// `api.push.apple.com`.
    case production
}

/// One device registration's address: the token on its gateway (and for APNs2 its environment
/// and topic), with the wire paths of pubnub-wire's push family.
package struct PushDeviceAddress: Sendable, Hashable {
    package var token: String
    package var type: PushType
    package var environment: PushEnvironment
    package var topic: String?

    package init(token: String, type: PushType, environment: PushEnvironment, topic: String?) {
        self.token = token
        self.type = type
        self.environment = environment
        self.topic = topic
    }

    /// `/v1/push/sub-key/{sub}/devices/{token}` or `/v2/push/sub-key/{sub}/devices-apns2/{token}`,
    /// plus the query that names the gateway.
    func path(subscribeKey: String) throws(RequestBuildError) -> (path: String, query: [QueryItem]) {
        guard !token.isEmpty, token.utf8.count <= 512 else { throw .invalidArgument("the device token must be 1-512 bytes") }
        let sub = PercentCoding.encode(subscribeKey), device = PercentCoding.encode(token)
        switch type {
        case .apns2:
            guard let topic, !topic.isEmpty else { throw .invalidArgument("an APNs2 registration needs the app's bundle id (topic)") }
            return ("/v2/push/sub-key/\(sub)/devices-apns2/\(device)",
                    [QueryItem("environment", environment.rawValue), QueryItem("topic", topic)])
        case .fcm:
            return ("/v1/push/sub-key/\(sub)/devices/\(device)", [QueryItem("type", "fcm")])
        case .apns:
            return ("/v1/push/sub-key/\(sub)/devices/\(device)", [QueryItem("type", "apns")])
        }
    }
}

extension Endpoints {
    private func push(_ operation: TetherOperation, _ device: PushDeviceAddress, suffix: String = "", extra: [QueryItem] = [],
                      timeout: Duration?) throws(RequestBuildError) -> RequestSpec {
        let (path, query) = try device.path(subscribeKey: context.subscribeKey)
        var spec = RequestSpec(operation: operation, path: path + suffix, query: extra + query, timeout: timeout)
        spec.append("uuid", context.userId)
        spec.append("pnsdk", context.sdkName)
        spec.carriesAuth = true
        if let key = context.authKey, !key.isEmpty { spec.append("auth", key) }
        return spec
    }

    private static func checked(_ channels: [String]) throws(RequestBuildError) -> String {
        guard !channels.isEmpty else { throw .invalidArgument("at least one channel is required") }
        guard channels.count <= 1000 else { throw .invalidArgument("at most 1000 channels per request") }
        for channel in channels { try Self.check(channel: channel) }
        return channels.joined(separator: ",")
    }

    /// Registers the device for push on `channels` (`add=`).
    package func addPushChannels(_ channels: [String], device: PushDeviceAddress, timeout: Duration? = nil) throws(RequestBuildError)
        -> RequestSpec
    {
        try push(.addPushChannels, device, extra: [QueryItem("add", try Self.checked(channels))], timeout: timeout)
    }

    /// Unregisters the device from `channels` (`remove=`).
    package func removePushChannels(_ channels: [String], device: PushDeviceAddress, timeout: Duration? = nil)
        throws(RequestBuildError) -> RequestSpec
    {
        try push(.removePushChannels, device, extra: [QueryItem("remove", try Self.checked(channels))], timeout: timeout)
    }

    /// Lists the device's channels.
    package func listPushChannels(device: PushDeviceAddress, timeout: Duration? = nil) throws(RequestBuildError) -> RequestSpec {
        try push(.listPushChannels, device, extra: [QueryItem("count", "1000")], timeout: timeout)
    }

    /// Unregisters the device from every channel (`…/remove`).
    package func removeAllPushChannels(device: PushDeviceAddress, timeout: Duration? = nil) throws(RequestBuildError) -> RequestSpec {
        try push(.removeAllPushChannels, device, suffix: "/remove", timeout: timeout)
    }
}

extension ResponseDecoding {
    /// Push channel listing → a JSON array of channel names.
    package static func pushChannels(_ body: JSONValue) throws(DecodingFailure) -> [String] {
        guard let channels = body.arrayValue else { throw DecodingFailure("push channels: expected an array") }
        return channels.compactMap(\.stringValue)
    }
}

/// The device a suspended WebSocket session's deliveries are pushed to
/// (``BackgroundPolicy/suspend(keepAlive:keepPresence:)``; `TetherClient.setBackgroundPushDevice`).
package struct BackgroundPushDevice: Sendable, Hashable {
    package var token: String
    package var pushType: PushType
    package var environment: PushEnvironment
    package var topic: String?

    package init(token: String, pushType: PushType, environment: PushEnvironment, topic: String?) {
        self.token = token
        self.pushType = pushType
        self.environment = environment
        self.topic = topic
    }
}
