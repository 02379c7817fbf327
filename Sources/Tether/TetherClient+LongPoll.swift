import TetherClientCore
import TetherProtocol

extension TetherClient {
    /// One subscribe long-poll: a handshake when `cursor` is nil, otherwise a continuation.
    ///
    /// The building block of the subscribe engine (next issue): it returns the decoded
    /// response with messages decrypted (undecryptable ones keep their raw payload and carry a
    /// ``StatusCategory/decryptionError`` status), plus a
    /// ``StatusCategory/requestMessageCountExceeded`` status when the response carried at least
    /// ``TetherConfiguration/requestMessageCountThreshold`` events.
    package func longPoll(channels: [String], groups: [String] = [], cursor: (timetoken: Timetoken, region: Int)? = nil,
                          timeout: Duration? = nil) async throws(TetherError) -> (response: SubscribeResponse, statuses: [Status]) {
        let filter = configuration.filterExpression
        let presenceTimeout = configuration.presenceTimeout
        var response = try await perform(.subscribe, channels: channels, groups: groups, build: { e throws(RequestBuildError) in
            try e.subscribe(channels: channels, groups: groups, cursor: cursor, filterExpression: filter,
                            presenceTimeout: presenceTimeout, timeout: timeout)
        }, decode: ResponseDecoding.subscribe)
        var statuses: [Status] = []
        if let module = configuration.cryptoModule {
            for index in response.events.indices where response.events[index].kind == .message && !response.events[index].isPresence {
                let event = response.events[index]
                do {
                    response.events[index].payload = try module.decrypt(message: event.payload)
                } catch {
                    let status = Status(category: .decryptionError, operation: .subscribe, error: error, serverMessage: error.description,
                                        affectedChannels: [event.channel],
                                        undecryptableMessage: UndecryptableMessage(channel: event.channel, timetoken: event.timetoken,
                                                                                   rawPayload: event.payload, publisher: event.publisher))
                    response.events[index].decryptionError = status
                    statuses.append(status)
                }
            }
        }
        let threshold = configuration.requestMessageCountThreshold
        if threshold > 0, response.events.count >= threshold {
            statuses.append(Status(category: .requestMessageCountExceeded, operation: .subscribe,
                                   serverMessage: "\(response.events.count) events in one response (threshold \(threshold)): fetch history to catch up",
                                   affectedChannels: channels, affectedGroups: groups, subscribedChannels: channels, subscribedGroups: groups,
                                   lastTimetoken: cursor?.timetoken, currentTimetoken: response.timetoken))
        }
        return (response, statuses)
    }

    /// One subscribe request for the engine: decrypted events (undecryptable ones keep their raw
    /// payload and carry their status) and the retention gaps the server reported.
    func subscribeRequest(channels: [String], groups: [String], cursor: SubscribeMachine.Cursor?, timeout: Duration? = nil)
        async throws(TetherError) -> (response: SubscribeResponse, gaps: [RetentionGap])
    {
        let filter = configuration.filterExpression
        let presenceTimeout = configuration.presenceTimeout
        let spec: RequestSpec
        do {
            spec = try endpoints.subscribe(channels: channels, groups: groups, cursor: cursor.map { ($0.timetoken, $0.region) },
                                           filterExpression: filter, presenceTimeout: presenceTimeout, timeout: timeout)
        } catch {
            throw TetherError(Status(category: .badRequest, operation: .subscribe, error: error, serverMessage: error.description,
                                     affectedChannels: channels, affectedGroups: groups))
        }
        var (response, headers) = try await executeWithHeaders(spec, channels: channels, groups: groups, decode: ResponseDecoding.subscribe)
        if let module = configuration.cryptoModule {
            for index in response.events.indices where response.events[index].kind == .message && !response.events[index].isPresence {
                let event = response.events[index]
                do {
                    response.events[index].payload = try module.decrypt(message: event.payload)
                } catch {
                    response.events[index].decryptionError = Status(
                        category: .decryptionError, operation: .subscribe, error: error, serverMessage: error.description,
                        affectedChannels: [event.channel],
                        undecryptableMessage: UndecryptableMessage(channel: event.channel, timetoken: event.timetoken,
                                                                   rawPayload: event.payload, publisher: event.publisher))
                }
            }
        }
        let gaps = headers["x-tether-gap"].map(RetentionGap.parse(header:)) ?? []
        return (response, gaps)
    }
}
