import Logging
import PostgresNIO

/// Push registrations in the cluster's PostgreSQL (`tether_push_device`): the same rows, order,
/// limits and answers as the embedded store's `push_device`, seen by every node.
extension SharedLog: PushRegistrationStoring {
    /// Thrown inside a registration transaction to roll it back with its outcome.
    private struct LimitReached: RecordRefusal {
        var outcome: PushModifyOutcome
    }

    private static func deviceLock(_ device: PushDevice) -> String {
        ["push-device", device.subscribeKey, device.gateway.rawValue, device.token, device.environment, device.topic]
            .joined(separator: "\u{0}")
    }

    package func changePushRegistrations(_ device: PushDevice, add: [String], remove: [String], maxChannelsPerDevice: Int,
                                         maxDevicesPerChannel: Int) async throws -> PushModifyOutcome {
        let (key, gateway, token, environment, topic) = (device.subscribeKey, device.gateway.rawValue, device.token,
                                                         device.environment, device.topic)
        do {
            return try await recordTransaction { connection in
                // The device's count and each added channel's count are checked, then written:
                // changes to the same device or channel wait for each other, on every node.
                if !add.isEmpty {
                    try await Self.lockRecords([Self.deviceLock(device)] + add.map { "push-channel\u{0}\(key)\u{0}\($0)" },
                                               connection: connection, logger: self.logger)
                }
                for channel in remove {
                    try await connection.query("""
                        DELETE FROM tether_push_device WHERE sub_key = \(key) AND gateway = \(gateway) AND token = \(token)
                        AND environment = \(environment) AND topic = \(topic) AND channel = \(channel)
                        """, logger: self.logger)
                }
                var added = 0
                for channel in add {
                    let onChannel = try await connection.query("""
                        SELECT COUNT(*), COUNT(*) FILTER (WHERE gateway = \(gateway) AND token = \(token)
                          AND environment = \(environment) AND topic = \(topic))
                        FROM tether_push_device WHERE sub_key = \(key) AND channel = \(channel)
                        """, logger: self.logger).decode((Int, Int).self).first(where: { _ in true }) ?? (0, 0)
                    if onChannel.1 > 0 { continue }
                    if onChannel.0 >= maxDevicesPerChannel {
                        throw LimitReached(outcome: .channelFull(channel, limit: maxDevicesPerChannel))
                    }
                    try await connection.query("""
                        INSERT INTO tether_push_device (sub_key, gateway, token, environment, topic, channel)
                        VALUES (\(key), \(gateway), \(token), \(environment), \(topic), \(channel))
                        """, logger: self.logger)
                    added += 1
                }
                if added > 0 {
                    let total = try await connection.query("""
                        SELECT COUNT(*) FROM tether_push_device WHERE sub_key = \(key) AND gateway = \(gateway) AND token = \(token)
                        AND environment = \(environment) AND topic = \(topic)
                        """, logger: self.logger).decode(Int.self).first(where: { _ in true }) ?? 0
                    if total > maxChannelsPerDevice { throw LimitReached(outcome: .deviceFull(limit: maxChannelsPerDevice)) }
                }
                return PushModifyOutcome.modified
            }
        } catch let refusal as LimitReached {
            return refusal.outcome
        }
    }

    package func pushChannels(_ device: PushDevice, after start: String?, limit: Int) async throws -> [String] {
        try await recordQuery { connection in
            var channels: [String] = []
            for try await channel in try await connection.query("""
                SELECT channel FROM tether_push_device WHERE sub_key = \(device.subscribeKey) AND gateway = \(device.gateway.rawValue)
                AND token = \(device.token) AND environment = \(device.environment) AND topic = \(device.topic)
                AND (\(start)::text IS NULL OR channel > \(start)) ORDER BY channel LIMIT \(limit)
                """, logger: self.logger).decode(String.self)
            {
                channels.append(channel)
            }
            return channels
        }
    }

    @discardableResult
    package func removePushDevice(_ device: PushDevice) async throws -> Int {
        try await recordQuery { connection in
            var removed = 0
            for try await _ in try await connection.query("""
                DELETE FROM tether_push_device WHERE sub_key = \(device.subscribeKey) AND gateway = \(device.gateway.rawValue)
                AND token = \(device.token) AND environment = \(device.environment) AND topic = \(device.topic) RETURNING channel
                """, logger: self.logger).decode(String.self)
            {
                removed += 1
            }
            return removed
        }
    }

    package func pushDevices(subscribeKey: String, channel: String, limit: Int) async throws -> [PushDevice] {
        try await recordQuery { connection in
            var devices: [PushDevice] = []
            for try await (gateway, token, environment, topic) in try await connection.query("""
                SELECT gateway, token, environment, topic FROM tether_push_device
                WHERE sub_key = \(subscribeKey) AND channel = \(channel) LIMIT \(limit)
                """, logger: self.logger).decode((String, String, String, String).self)
            {
                guard let gateway = PushGateway(rawValue: gateway) else { continue }
                devices.append(PushDevice(subscribeKey: subscribeKey, token: token, gateway: gateway, environment: environment,
                                          topic: topic))
            }
            return devices
        }
    }

    package func pushRegistrationCount() async throws -> Int {
        try await recordQuery { connection in
            try await connection.query("SELECT COUNT(*) FROM tether_push_device", logger: self.logger)
                .decode(Int.self).first(where: { _ in true }) ?? 0
        }
    }
}
