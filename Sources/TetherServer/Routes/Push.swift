import HTTPTypes
import Hummingbird
@_spi(Benchmarks) import TetherProtocol
import TetherServerCore

extension Reply {
    /// The push family's error object, as PubNub answers it: `{"error": "…"}` (the Python SDK's
    /// recorded fixtures: 400 `{"error": "Invalid type argument"}`, `{"error": "Invalid device token"}`).
    static func pushError(_ status: HTTPResponse.Status, _ message: String) -> Response {
        var w = JSONWriter()
        w.raw("{\"error\":")
        w.string(message)
        w.raw("}")
        return json(status, w.bytes)
    }
}

/// The bounds of device registrations (docs/push.md, "Bounds").
enum PushRegistrationBounds {
    /// A device token: 1…512 bytes (APNs tokens are 64 hex digits today, FCM tokens about 160
    /// characters).
    static let tokenBytes = 1...512
    /// An APNs2 topic (bundle id): 1…255 characters of A-Z a-z 0-9 . - _.
    static let topicBytes = 1...255
    /// Channels one add or remove names at most.
    static let channelsPerRequest = 1000
    /// `count` of a list: 1…1000, default 500 (PubNub's).
    static let listCount = 1...1000
    static let defaultListCount = 500
}

/// A request of the push family: `/v1/push/sub-key/{sub}/devices/{token}[/remove]?type=…` and
/// `/v2/push/sub-key/{sub}/devices-apns2/{token}[/remove]?environment=…&topic=…`. Checked in
/// PubNub's order — keys, the device, its gateway — before access.
struct PushRequest {
    var keyset: Keyset
    var device: PushDevice

    init(_ wire: WireRequest, keysets: KeysetRegistry, validatingToken: Bool) throws(RequestError) {
        let s = wire.segments
        func refuse(_ message: String) -> RequestError { RequestError(response: Reply.pushError(.badRequest, message)) }
        guard NameRules.validateKey(s[3]), let keyset = keysets.keyset(subscribeKey: s[3]) else { throw refuse("Invalid Subscribe Key") }
        if wire.uriLength > keysets.limits(for: keyset).maxURIBytes { throw RequestError(response: Reply.uriTooLong) }
        let token = s[5]
        guard PushRegistrationBounds.tokenBytes.contains(token.utf8.count), !token.utf8.contains(where: { $0 < 0x20 || $0 == 0x7F })
        else { throw refuse("Invalid device token") }
        if let uuid = wire.query["uuid"] {
            do { try NameRules.validateUserId(uuid) } catch { throw refuse("Invalid uuid: \(error)") }
        }
        let device: PushDevice
        if s[0] == "v2" {
            let environment = wire.query["environment"] ?? "development"
            guard environment == "development" || environment == "production" else {
                throw refuse("Invalid environment argument: development or production")
            }
            guard let topic = wire.query["topic"], !topic.isEmpty else { throw refuse("Missing topic argument") }
            guard PushRegistrationBounds.topicBytes.contains(topic.utf8.count), topic.utf8.allSatisfy(Self.isTopicByte) else {
                throw refuse("Invalid topic argument: a bundle id of A-Z a-z 0-9 . - _")
            }
            device = PushDevice(subscribeKey: keyset.subscribeKey, token: token, gateway: .apns2, environment: environment, topic: topic)
        } else {
            guard let type = wire.query["type"], let gateway = PushGateway(type: type) else { throw refuse("Invalid type argument") }
            device = PushDevice(subscribeKey: keyset.subscribeKey, token: token, gateway: gateway)
        }
        // PubNub refuses an Apple token that is not hexadecimal when channels are added (its
        // recorded answer to "device_id_should_be_16_characters_long").
        if validatingToken, device.gateway.isApple, !token.utf8.allSatisfy(Self.isHexByte) {
            throw refuse("Invalid device token")
        }
        self.keyset = keyset
        self.device = device
    }

    static func isHexByte(_ b: UInt8) -> Bool { (0x30...0x39).contains(b) || (0x41...0x46).contains(b) || (0x61...0x66).contains(b) }

    static func isTopicByte(_ b: UInt8) -> Bool {
        (0x30...0x39).contains(b) || (0x41...0x5A).contains(b) || (0x61...0x7A).contains(b) || b == 0x2E || b == 0x2D || b == 0x5F
    }

    /// The channels of `add` or `remove`, each a valid, non-presence channel name. The list is
    /// split after decoding: PubNub's SDKs send the commas encoded (`add=a%2Cb`).
    static func channels(_ wire: WireRequest, _ key: String) throws(RequestError) -> [String] {
        let names = (wire.query[key] ?? "").split(separator: ",", omittingEmptySubsequences: true).map(String.init)
        guard names.count <= PushRegistrationBounds.channelsPerRequest else {
            throw RequestError(response: Reply.pushError(.badRequest,
                                                         "Too many channels: at most \(PushRegistrationBounds.channelsPerRequest) per request"))
        }
        for name in names {
            do { try NameRules.validateChannel(name) } catch {
                throw RequestError(response: Reply.pushError(.badRequest, "Invalid channel \(String(reflecting: name)): \(error)"))
            }
            if NameRules.isPresence(name) {
                throw RequestError(response: Reply.pushError(.badRequest, "Invalid channel: presence channels carry no push"))
            }
        }
        var seen = Set<String>()
        return names.filter { seen.insert($0).inserted }
    }
}

extension TetherResponder {
    /// Adds and/or removes channels of a device (`add=`, `remove=`; removals first, as PubNub
    /// documents): `[1,"Modified Channels"]`.
    @inline(never) func modifyPushChannels(_ wire: WireRequest) async throws -> Response {
        let target = try PushRequest(wire, keysets: state.keysets, validatingToken: !(wire.query["add"] ?? "").isEmpty)
        let add = try PushRequest.channels(wire, "add")
        let remove = try PushRequest.channels(wire, "remove")
        try authorize(target.keyset, wire, channels: Array(Set(add + remove)).sorted(), groups: [], permission: .read)
        let settings = state.push.settings
        switch try await state.pushRegistrations.changePushRegistrations(target.device, add: add, remove: remove,
                                                            maxChannelsPerDevice: settings.maxChannelsPerDevice,
                                                            maxDevicesPerChannel: settings.maxDevicesPerChannel) {
        case .modified:
            return Reply.json(.ok, "[1,\"Modified Channels\"]")
        case .deviceFull(let limit):
            return Reply.pushError(.badRequest, "Too many channels for this device: at most \(limit)")
        case .channelFull(let channel, let limit):
            return Reply.pushError(.badRequest, "Too many devices on channel \(String(reflecting: channel)): at most \(limit)")
        }
    }

    /// The device's channels (`start` after which, `count` at most): a JSON array.
    @inline(never) func listPushChannels(_ wire: WireRequest) async throws -> Response {
        let target = try PushRequest(wire, keysets: state.keysets, validatingToken: false)
        try authorize(target.keyset, wire, channels: [], groups: [], permission: .read)
        let count = try wire.integer("count", in: PushRegistrationBounds.listCount) ?? PushRegistrationBounds.defaultListCount
        let start = wire.query["start"].flatMap { $0.isEmpty ? nil : $0 }
        let channels = try await state.pushRegistrations.pushChannels(target.device, after: start, limit: count)
        var w = JSONWriter(capacity: 16 + channels.count * 24)
        w.raw("[")
        for (i, channel) in channels.enumerated() {
            if i > 0 { w.raw(",") }
            w.string(channel)
        }
        w.raw("]")
        return Reply.json(.ok, w.bytes)
    }

    /// Unregisters the device from every channel: `[1,"Removed Device"]`.
    @inline(never) func removePushDevice(_ wire: WireRequest) async throws -> Response {
        let target = try PushRequest(wire, keysets: state.keysets, validatingToken: false)
        try authorize(target.keyset, wire, channels: [], groups: [], permission: .read)
        try await state.pushRegistrations.removePushDevice(target.device)
        return Reply.json(.ok, "[1,\"Removed Device\"]")
    }
}
