public import TetherClientCore

extension TetherClient {
    /// Registers a device for mobile push on `channels`: from then on, a message published on
    /// one of them with a `pn_apns` (Apple) or `pn_fcm` (Google) part is sent to the device by
    /// the server's push provider, whether or not the app is connected (docs/push.md).
    ///
    /// ```swift
    /// // In application(_:didRegisterForRemoteNotificationsWithDeviceToken:)
    /// let token = deviceToken.map { String(format: "%02x", $0) }.joined()
    /// try await client.addPushChannels(["inbox.alice"], device: token, pushType: .apns2,
    ///                                  environment: .production, topic: "com.example.chat")
    /// ```
    ///
    /// - Parameters:
    ///   - channels: 1–1000 channel names.
    ///   - device: the device token: APNs tokens as lowercase hex, FCM registration tokens as given.
    ///   - pushType: the gateway the token belongs to.
    ///   - environment: for ``PushType/apns2``, which APNs environment issued the token.
    ///   - topic: for ``PushType/apns2``, the app's bundle id (required).
    /// - Throws: ``TetherError`` with ``StatusCategory/badRequest`` for an invalid token, topic
    ///   or channel, ``StatusCategory/accessDenied`` without `read` on a channel when Access
    ///   Manager is on.
    public func addPushChannels(_ channels: [String], device: String, pushType: PushType, environment: PushEnvironment = .development,
                                topic: String? = nil, timeout: Duration? = nil) async throws(TetherError) {
        let address = PushDeviceAddress(token: device, type: pushType, environment: environment, topic: topic)
        try await perform(.addPushChannels, channels: channels, build: { e throws(RequestBuildError) in
            try e.addPushChannels(channels, device: address, timeout: timeout)
        }, decode: { _ in () })
    }

    /// Unregisters a device from push on `channels`; the others stay registered. Removing a
    /// channel the device was not registered on succeeds.
    public func removePushChannels(_ channels: [String], device: String, pushType: PushType, environment: PushEnvironment = .development,
                                   topic: String? = nil, timeout: Duration? = nil) async throws(TetherError) {
        let address = PushDeviceAddress(token: device, type: pushType, environment: environment, topic: topic)
        try await perform(.removePushChannels, channels: channels, build: { e throws(RequestBuildError) in
            try e.removePushChannels(channels, device: address, timeout: timeout)
        }, decode: { _ in () })
    }

    /// The channels a device is registered on for push (at most 1,000), in name order.
    public func listPushChannels(device: String, pushType: PushType, environment: PushEnvironment = .development, topic: String? = nil,
                                 timeout: Duration? = nil) async throws(TetherError) -> [String] {
        let address = PushDeviceAddress(token: device, type: pushType, environment: environment, topic: topic)
        return try await perform(.listPushChannels, build: { e throws(RequestBuildError) in
            try e.listPushChannels(device: address, timeout: timeout)
        }, decode: ResponseDecoding.pushChannels)
    }

    /// Unregisters a device from every channel (a user signing out, a token the app replaced).
    public func removeAllPushChannels(device: String, pushType: PushType, environment: PushEnvironment = .development,
                                      topic: String? = nil, timeout: Duration? = nil) async throws(TetherError) {
        let address = PushDeviceAddress(token: device, type: pushType, environment: environment, topic: topic)
        try await perform(.removeAllPushChannels, build: { e throws(RequestBuildError) in
            try e.removeAllPushChannels(device: address, timeout: timeout)
        }, decode: { _ in () })
    }
}
