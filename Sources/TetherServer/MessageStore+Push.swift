import GRDB

/// The push gateway a device registration names (PubNub's `type`, or the APNs2 path).
package enum PushGateway: String, Sendable, Hashable, CaseIterable {
    /// Apple, registered with the v1 form (`type=apns`); delivered with HTTP/2 token auth
    /// like APNs2, with the provider's default topic and the production environment.
    case apns
    /// Apple over HTTP/2, registered with the v2 form (`/devices-apns2/`, `environment`, `topic`).
    case apns2
    /// Google (`type=gcm`, and `type=fcm`, stored as the same gateway).
    case gcm
    /// Microsoft (`type=mpns`): registrations are kept and listed; nothing is sent (the service
    /// is retired).
    case mpns

    /// The gateway of a v1 `type` value (`fcm` is Google's, stored as `gcm`).
    init?(type: String) {
        switch type {
        case "apns": self = .apns
        case "gcm", "fcm": self = .gcm
        case "mpns": self = .mpns
        default: return nil
        }
    }

    /// Whether the gateway is Apple's.
    var isApple: Bool { self == .apns || self == .apns2 }
}

/// One device registration's identity: the token on a gateway, and for APNs2 its environment
/// and topic (empty for the other gateways).
package struct PushDevice: Sendable, Hashable {
    package var subscribeKey: String
    package var token: String
    package var gateway: PushGateway
    /// `development` or `production` for APNs2; empty otherwise.
    package var environment: String
    /// The app's bundle id for APNs2; empty otherwise.
    package var topic: String

    package init(subscribeKey: String, token: String, gateway: PushGateway, environment: String = "", topic: String = "") {
        self.subscribeKey = subscribeKey
        self.token = token
        self.gateway = gateway
        self.environment = environment
        self.topic = topic
    }

    init?(row: Row) {
        guard let gateway = PushGateway(rawValue: row["gateway"]) else { return nil }
        self.init(subscribeKey: row["sub_key"], token: row["token"], gateway: gateway, environment: row["environment"], topic: row["topic"])
    }

    var keyArguments: [any DatabaseValueConvertible] { [subscribeKey, gateway.rawValue, token, environment, topic] }
}

/// What a registration change came to.
package enum PushModifyOutcome: Sendable, Equatable {
    case modified
    /// The device would hold more than `limit` channels; nothing was changed.
    case deviceFull(limit: Int)
    /// The channel would hold more than `limit` devices; nothing was changed.
    case channelFull(String, limit: Int)
}

/// The `push_device` table: one row per (device, channel), kept until the device or the
/// channel is unregistered — by the app, or by the dispatcher when a gateway says the token is
/// no longer valid. Registrations are durable like grants (written in their own transaction).
extension MessageStore {
    static func registerPushMigration(in migrator: inout DatabaseMigrator) {
        migrator.registerMigration("v9-push-devices") { db in
            try db.execute(sql: """
                CREATE TABLE push_device (
                    sub_key TEXT NOT NULL,
                    gateway TEXT NOT NULL,
                    token TEXT NOT NULL,
                    environment TEXT NOT NULL,
                    topic TEXT NOT NULL,
                    channel TEXT NOT NULL,
                    PRIMARY KEY (sub_key, gateway, token, environment, topic, channel)
                ) WITHOUT ROWID;
                CREATE INDEX push_device_channel ON push_device(sub_key, channel);
                """)
        }
    }

    private static let deviceWhere = "sub_key = ? AND gateway = ? AND token = ? AND environment = ? AND topic = ?"

    /// Removes `remove`, then adds `add` (PubNub's order), in one transaction, unless the device
    /// would then hold more than `maxChannelsPerDevice` channels or a channel more than
    /// `maxDevicesPerChannel` devices.
    package func modifyPushRegistrations(_ device: PushDevice, add: [String], remove: [String], maxChannelsPerDevice: Int,
                                         maxDevicesPerChannel: Int) async throws -> PushModifyOutcome {
        try await pool.write { db in
            for channel in remove {
                try db.execute(sql: "DELETE FROM push_device WHERE \(Self.deviceWhere) AND channel = ?",
                               arguments: StatementArguments(device.keyArguments + [channel]))
            }
            var added = 0
            for channel in add {
                let exists = try Bool.fetchOne(db, sql: "SELECT 1 FROM push_device WHERE \(Self.deviceWhere) AND channel = ?",
                                               arguments: StatementArguments(device.keyArguments + [channel])) == true
                if exists { continue }
                let onChannel = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM push_device WHERE sub_key = ? AND channel = ?",
                                                 arguments: [device.subscribeKey, channel]) ?? 0
                if onChannel >= maxDevicesPerChannel {
                    throw PushLimitReached.outcome(.channelFull(channel, limit: maxDevicesPerChannel))
                }
                try db.execute(sql: """
                    INSERT INTO push_device (sub_key, gateway, token, environment, topic, channel) VALUES (?, ?, ?, ?, ?, ?)
                    """, arguments: StatementArguments(device.keyArguments + [channel]))
                added += 1
            }
            if added > 0 {
                let total = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM push_device WHERE \(Self.deviceWhere)",
                                             arguments: StatementArguments(device.keyArguments)) ?? 0
                if total > maxChannelsPerDevice { throw PushLimitReached.outcome(.deviceFull(limit: maxChannelsPerDevice)) }
            }
            return .modified
        }
    }

    /// The device's channels after `start` (exclusive), in name order, at most `limit`.
    package func pushChannels(_ device: PushDevice, after start: String?, limit: Int) async throws -> [String] {
        try await pool.read { db in
            var sql = "SELECT channel FROM push_device WHERE \(Self.deviceWhere)"
            var arguments = device.keyArguments
            if let start {
                sql += " AND channel > ?"
                arguments.append(start)
            }
            sql += " ORDER BY channel LIMIT ?"
            arguments.append(limit)
            return try String.fetchAll(db, sql: sql, arguments: StatementArguments(arguments))
        }
    }

    /// Unregisters the device from every channel; returns how many registrations it had.
    @discardableResult
    package func removePushDevice(_ device: PushDevice) async throws -> Int {
        try await pool.write { db in
            try db.execute(sql: "DELETE FROM push_device WHERE \(Self.deviceWhere)", arguments: StatementArguments(device.keyArguments))
            return db.changesCount
        }
    }

    /// The devices registered on a channel, at most `limit` (the per-channel bound).
    package func pushDevices(subscribeKey: String, channel: String, limit: Int) async throws -> [PushDevice] {
        try await pool.read { db in
            try Row.fetchAll(db, sql: """
                SELECT sub_key, gateway, token, environment, topic FROM push_device WHERE sub_key = ? AND channel = ? LIMIT ?
                """, arguments: [subscribeKey, channel, limit]).compactMap(PushDevice.init(row:))
        }
    }

    /// Number of registrations (for tests and tools).
    package func pushRegistrationCount() async throws -> Int {
        try await pool.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM push_device") ?? 0 }
    }
}

/// Thrown inside a registration transaction to roll it back with its outcome.
private enum PushLimitReached: Error {
    case outcome(PushModifyOutcome)
}

extension MessageStore {
    /// ``modifyPushRegistrations(_:add:remove:maxChannelsPerDevice:maxDevicesPerChannel:)``
    /// with a limit reached answered as its outcome (the transaction rolled back).
    package func changePushRegistrations(_ device: PushDevice, add: [String], remove: [String], maxChannelsPerDevice: Int,
                                         maxDevicesPerChannel: Int) async throws -> PushModifyOutcome {
        do {
            return try await modifyPushRegistrations(device, add: add, remove: remove, maxChannelsPerDevice: maxChannelsPerDevice,
                                                     maxDevicesPerChannel: maxDevicesPerChannel)
        } catch PushLimitReached.outcome(let outcome) {
            return outcome
        }
    }
}
