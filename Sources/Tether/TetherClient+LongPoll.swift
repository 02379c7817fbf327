import TetherClientCore
import TetherProtocol

extension TetherClient {
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
        decrypt(&response)
        let gaps = headers["x-tether-gap"].map(RetentionGap.parse(header:)) ?? []
        return (response, gaps)
    }

    /// Decrypts the messages of a response in place (undecryptable ones keep their raw payload
    /// and carry their status); the same for both wires.
    func decrypt(_ response: inout SubscribeResponse) {
        Self.decrypt(&response, module: configuration.cryptoModule)
    }

    /// ``decrypt(_:)`` with the client's crypto module given.
    static func decrypt(_ response: inout SubscribeResponse, module: CryptoModule?) {
        guard let module else { return }
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
}
