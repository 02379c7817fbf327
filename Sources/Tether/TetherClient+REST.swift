import Foundation
public import TetherClientCore
public import TetherProtocol

extension TetherClient {
    // MARK: - Time

    /// The server's current timetoken (`GET /time/0`).
    public func time(timeout: Duration? = nil) async throws(TetherError) -> Timetoken {
        try await perform(.time, build: { $0.time(timeout: timeout) }, decode: ResponseDecoding.time)
    }

    // MARK: - Publish, signal, fire

    /// Publishes a message on a channel through the ``outbox`` and returns when the server has it.
    ///
    /// The message gets one request id (``PublishOptions/requestId``, or a UUID the outbox makes),
    /// sent with every attempt, so a server that deduplicates answers a repeat with the original
    /// timetoken (``PublishResult/isRepeat``). While the network is down the call waits; network
    /// failures, timeouts, 5xx and 429 (after its `Retry-After`) are retried with
    /// ``OutboxConfiguration/retry``, in order per channel. 403, 400, 413 and other answers that
    /// cannot change fail at once. With a ``TetherConfiguration/cryptoModule`` the message is
    /// encrypted (its `meta` never is).
    ///
    /// Cancelling the calling task stops the wait, not the message: once accepted, it is the
    /// outbox's until it is sent, fails or is cancelled through ``Outbox/cancel(_:)``. When the
    /// call throws a send failure, the message has left the outbox (the error is its outcome); use
    /// ``Outbox/enqueue(channel:message:options:)`` to keep failed messages for a later resend.
    ///
    /// - Throws: ``TetherError`` with the failure's status (category, HTTP code, server message),
    ///   or the outbox's refusal (``TetherError/outboxError``: ``OutboxError/Code/full``…).
    public func publish(channel: String, message: JSONValue, options: PublishOptions = PublishOptions())
        async throws(TetherError) -> PublishResult
    {
        let draft = try publishDraft(channel: channel, message: message, options: options)
        startOutboxIfNeeded()
        return try await outboxDriver.send(draft)
    }

    /// Publishes any `Encodable` value (encoded with `JSONEncoder`), as
    /// ``publish(channel:message:options:)``.
    public func publish(channel: String, encoding value: some Encodable, options: PublishOptions = PublishOptions())
        async throws(TetherError) -> PublishResult
    {
        let message: JSONValue
        do { message = try JSONValue(encoding: value) } catch {
            throw TetherError(Status(category: .badRequest, operation: .publish, error: error,
                                     serverMessage: "the message could not be encoded as JSON", affectedChannels: [channel]))
        }
        return try await publish(channel: channel, message: message, options: options)
    }

    /// Fire: a message delivered to server-side handlers only, never to subscribers, never stored.
    ///
    /// One attempt, outside the outbox: a fire is a request to the server's handlers, not a
    /// message anyone will miss, and its failure goes back to the caller (who can
    /// ``Status/retry()`` it). ``PublishOptions/requestId`` is sent when set.
    public func fire(channel: String, message: JSONValue, options: PublishOptions = PublishOptions())
        async throws(TetherError) -> PublishResult
    {
        let text = try encryptIfConfigured(message, operation: .fire, channel: channel)
        let spec: RequestSpec
        do { spec = try endpoints.publish(channel: channel, messageJSON: text, options: options, fire: true) } catch {
            throw TetherError(Status(category: .badRequest, operation: .fire, error: error, serverMessage: error.description,
                                     affectedChannels: [channel]))
        }
        let (result, headers) = try await executeWithHeaders(spec, channels: [channel], groups: [], decode: ResponseDecoding.publish)
        return PublishResult(timetoken: result.timetoken, requestId: options.requestId, isRepeat: Self.isRepeat(headers))
    }

    /// Sends a signal through the ``outbox``: a small (64-byte) message, delivered live, never
    /// stored, never encrypted. Waits, retries and fails as ``publish(channel:message:options:)``;
    /// `requestId` chooses the request id (otherwise the outbox makes one).
    public func signal(channel: String, message: JSONValue, customMessageType: String? = nil, timeout: Duration? = nil,
                       requestId: String? = nil) async throws(TetherError) -> PublishResult
    {
        let options = PublishOptions(customMessageType: customMessageType, timeout: timeout, requestId: requestId)
        let text = message.jsonText
        try validate(operation: .signal, channel: channel, requestId: requestId) { e throws(RequestBuildError) in
            _ = try e.signal(channel: channel, messageJSON: text, customMessageType: customMessageType, timeout: timeout,
                             requestID: requestId)
        }
        startOutboxIfNeeded()
        return try await outboxDriver.send(OutboxDraft(kind: .signal, channel: channel, payload: Array(text.utf8), options: options,
                                                       requestID: requestId))
    }

    /// Checks and encrypts a message for the outbox (no I/O): what would make every attempt fail
    /// is refused now, as a bad request.
    func publishDraft(channel: String, message: JSONValue, options: PublishOptions) throws(TetherError) -> OutboxDraft {
        let text = try encryptIfConfigured(message, operation: .publish, channel: channel)
        try validate(operation: .publish, channel: channel, requestId: options.requestId) { e throws(RequestBuildError) in
            _ = try e.publish(channel: channel, messageJSON: text, options: options)
        }
        return OutboxDraft(kind: .publish, channel: channel, payload: Array(text.utf8), options: options, requestID: options.requestId)
    }

    private func validate(operation: TetherOperation, channel: String, requestId: String?,
                          build: (Endpoints) throws(RequestBuildError) -> Void) throws(TetherError) {
        do throws(RequestBuildError) {
            if let requestId, let problem = PublishOptions.requestIdProblem(requestId) { throw .invalidArgument(problem) }
            try build(endpoints)
        } catch {
            throw TetherError(Status(category: .badRequest, operation: operation, error: error, serverMessage: error.description,
                                     affectedChannels: [channel]))
        }
    }

    /// Sends one attempt of an outbox message, with its request id.
    func sendOutboxMessage(_ message: OutboxMessage) async -> Result<PublishResult, TetherError> {
        let text = String(decoding: message.payload, as: UTF8.self)
        let operation: TetherOperation = message.kind == .signal ? .signal : .publish
        let spec: RequestSpec
        do throws(RequestBuildError) {
            switch message.kind {
            case .publish:
                spec = try endpoints.publish(channel: message.channel, messageJSON: text, options: message.options,
                                             requestID: message.requestID)
            case .signal:
                spec = try endpoints.signal(channel: message.channel, messageJSON: text, customMessageType: message.options.customMessageType,
                                            timeout: message.options.timeout, requestID: message.requestID)
            }
        } catch {
            return .failure(TetherError(Status(category: .badRequest, operation: operation, error: error, serverMessage: error.description,
                                               affectedChannels: [message.channel])))
        }
        do {
            // A send that fails at the connection level goes at once to the next origin (same
            // request id), inside this one attempt of the outbox.
            let (result, headers) = try await executeWithHeadersFailingOver(spec, channels: [message.channel], groups: [],
                                                                            decode: ResponseDecoding.publish)
            return .success(PublishResult(timetoken: result.timetoken, requestId: message.requestID, isRepeat: Self.isRepeat(headers)))
        } catch {
            return .failure(error)
        }
    }

    /// Whether the server answered a repeat of a request it had stored (`Tether-Duplicate: 1`).
    static func isRepeat(_ headers: [String: String]) -> Bool {
        headers.first { $0.key.lowercased() == "tether-duplicate" }?.value.trimmingCharacters(in: .whitespaces) == "1"
    }

    private func encryptIfConfigured(_ message: JSONValue, operation: TetherOperation, channel: String) throws(TetherError) -> String {
        guard let module = configuration.cryptoModule else { return message.jsonText }
        do { return try module.encrypt(message: message).jsonText } catch {
            throw TetherError(Status(category: .badRequest, operation: operation, error: error, serverMessage: error.description,
                                     affectedChannels: [channel]))
        }
    }

    // MARK: - Message counts and delete

    /// How many messages each channel has stored after `timetoken` (exclusive; capped at 10,000).
    public func messageCounts(channels: [String], since timetoken: Timetoken, timeout: Duration? = nil)
        async throws(TetherError) -> [String: Int]
    {
        try await perform(.messageCounts, channels: channels, build: { e throws(RequestBuildError) in
            try e.messageCounts(channels.map { ($0, timetoken) }, timeout: timeout)
        }, decode: ResponseDecoding.messageCounts)
    }

    /// How many messages each channel has stored after its own timetoken.
    public func messageCounts(since timetokens: [String: Timetoken], timeout: Duration? = nil) async throws(TetherError) -> [String: Int] {
        let pairs = timetokens.sorted { $0.key < $1.key }.map { (channel: $0.key, after: $0.value) }
        return try await perform(.messageCounts, channels: pairs.map(\.channel), build: { e throws(RequestBuildError) in
            try e.messageCounts(pairs, timeout: timeout)
        }, decode: ResponseDecoding.messageCounts)
    }

    /// ``messageCounts(since:timeout:)`` for the foreground probe (the engine's own call): also
    /// the cursor the counts go through, when the server says (Tether's `Tether-Counted-Through`;
    /// `nil` from a server without it). Resuming from that cursor neither misses nor repeats a
    /// message the counts cover.
    func messageCountsThrough(since timetokens: [String: Timetoken], timeout: Duration?) async throws(TetherError)
        -> (counts: [String: Int], through: Timetoken?)
    {
        let pairs = timetokens.sorted { $0.key < $1.key }.map { (channel: $0.key, after: $0.value) }
        let channels = pairs.map(\.channel)
        let spec: RequestSpec
        do { spec = try endpoints.messageCounts(pairs, timeout: timeout) } catch {
            throw TetherError(Status(category: .badRequest, operation: .messageCounts, error: error, serverMessage: error.description,
                                     affectedChannels: channels))
        }
        let (counts, headers) = try await executeWithHeaders(spec, channels: channels, groups: [], decode: ResponseDecoding.messageCounts)
        return (counts, headers["tether-counted-through"].flatMap { UInt64($0) }.map { Timetoken($0) })
    }

    /// Deletes stored messages of a channel: those older than `start` (exclusive) and at or after
    /// `end` (inclusive); both `nil` deletes everything.
    public func deleteMessages(channel: String, start: Timetoken? = nil, end: Timetoken? = nil, timeout: Duration? = nil)
        async throws(TetherError)
    {
        try await perform(.deleteMessages, channels: [channel], build: { e throws(RequestBuildError) in
            try e.deleteMessages(channel: channel, start: start, end: end, timeout: timeout)
        }, decode: { _ in () })
    }

    // MARK: - Presence

    /// Who is present on channels and/or groups; both empty asks for the whole keyset.
    public func hereNow(channels: [String] = [], groups: [String] = [], options: HereNowOptions = HereNowOptions())
        async throws(TetherError) -> HereNowResult
    {
        try await perform(.hereNow, channels: channels, groups: groups, build: { e throws(RequestBuildError) in
            try e.hereNow(channels: channels, groups: groups, options: options)
        }, decode: { body throws(DecodingFailure) in try ResponseDecoding.hereNow(body, channels: channels, groups: groups) })
    }

    /// The channels a user (this client's by default) is present on.
    public func whereNow(userId: String? = nil, timeout: Duration? = nil) async throws(TetherError) -> [String] {
        let id = userId ?? configuration.userId
        return try await perform(.whereNow, build: { e throws(RequestBuildError) in try e.whereNow(userId: id, timeout: timeout) },
                                 decode: ResponseDecoding.whereNow)
    }

    /// Sets this client's presence state on channels and groups; returns the state the server stored.
    @discardableResult
    public func setState(_ state: [String: JSONValue], channels: [String] = [], groups: [String] = [], timeout: Duration? = nil)
        async throws(TetherError) -> JSONValue
    {
        try await perform(.setState, channels: channels, groups: groups, build: { e throws(RequestBuildError) in
            try e.setState(state, channels: channels, groups: groups, timeout: timeout)
        }, decode: ResponseDecoding.setState)
    }

    /// A user's (this client's by default) presence state per channel.
    public func getState(userId: String? = nil, channels: [String] = [], groups: [String] = [], timeout: Duration? = nil)
        async throws(TetherError) -> [String: JSONValue]
    {
        let id = userId ?? configuration.userId
        return try await perform(.getState, channels: channels, groups: groups, build: { e throws(RequestBuildError) in
            try e.getState(userId: id, channels: channels, groups: groups, timeout: timeout)
        }, decode: { body throws(DecodingFailure) in try ResponseDecoding.getState(body, channels: channels, groups: groups) })
    }

    /// Announces this client on channels and groups for ``TetherConfiguration/presenceTimeout`` seconds.
    public func heartbeat(channels: [String] = [], groups: [String] = [], state: JSONValue? = nil, timeout: Duration? = nil)
        async throws(TetherError)
    {
        let presenceTimeout = configuration.presenceTimeout
        try await perform(.heartbeat, channels: channels, groups: groups, build: { e throws(RequestBuildError) in
            try e.heartbeat(channels: channels, groups: groups, presenceTimeout: presenceTimeout, state: state, timeout: timeout)
        }, decode: { _ in () })
    }

    /// Leaves channels and groups now (others see a `leave` event).
    public func leave(channels: [String] = [], groups: [String] = [], timeout: Duration? = nil) async throws(TetherError) {
        try await perform(.leave, channels: channels, groups: groups, build: { e throws(RequestBuildError) in
            try e.leave(channels: channels, groups: groups, timeout: timeout)
        }, decode: { _ in () })
    }

    // MARK: - Channel groups

    /// Adds channels to a channel group.
    public func addChannels(_ channels: [String], toGroup group: String, timeout: Duration? = nil) async throws(TetherError) {
        try await perform(.addChannelsToGroup, channels: channels, groups: [group], build: { e throws(RequestBuildError) in
            try e.addChannels(channels, toGroup: group, timeout: timeout)
        }, decode: { _ in () })
    }

    /// Removes channels from a channel group.
    public func removeChannels(_ channels: [String], fromGroup group: String, timeout: Duration? = nil) async throws(TetherError) {
        try await perform(.removeChannelsFromGroup, channels: channels, groups: [group], build: { e throws(RequestBuildError) in
            try e.removeChannels(channels, fromGroup: group, timeout: timeout)
        }, decode: { _ in () })
    }

    /// The channels of a channel group.
    public func channels(inGroup group: String, timeout: Duration? = nil) async throws(TetherError) -> [String] {
        try await perform(.listChannelsInGroup, groups: [group], build: { e throws(RequestBuildError) in
            try e.listChannels(inGroup: group, timeout: timeout)
        }, decode: ResponseDecoding.groupChannels)
    }

    /// Deletes a channel group.
    public func deleteGroup(_ group: String, timeout: Duration? = nil) async throws(TetherError) {
        try await perform(.deleteGroup, groups: [group], build: { e throws(RequestBuildError) in
            try e.deleteGroup(group, timeout: timeout)
        }, decode: { _ in () })
    }

    /// Every channel group of the keyset.
    public func channelGroups(timeout: Duration? = nil) async throws(TetherError) -> [String] {
        try await perform(.listGroups, build: { $0.listGroups(timeout: timeout) }, decode: ResponseDecoding.groups)
    }

    // MARK: - Access Manager (secret-key clients)

    /// Grants (or, with every flag off, revokes) Access Manager v2 permissions for auth keys
    /// (needs ``TetherConfiguration/secretKey``).
    public func grant(_ grant: AuthKeyGrant, timeout: Duration? = nil) async throws(TetherError) {
        let hasSecret = configuration.secretKey?.isEmpty == false
        try await perform(.grant, channels: grant.channels, groups: grant.groups, build: { e throws(RequestBuildError) in
            guard hasSecret else { throw .missingSecretKey }
            return try e.grant(grant, timeout: timeout)
        }, decode: { _ in () })
    }

    /// Grants a v3 token (needs ``TetherConfiguration/secretKey``); returns the token string.
    public func grantToken(_ grant: TokenGrant, timeout: Duration? = nil) async throws(TetherError) -> String {
        let hasSecret = configuration.secretKey?.isEmpty == false
        return try await perform(.grantToken, channels: grant.channels.keys.sorted(), groups: grant.groups.keys.sorted(),
                                 build: { e throws(RequestBuildError) in
            guard hasSecret else { throw .missingSecretKey }
            return try e.grantToken(grant, timeout: timeout)
        }, decode: ResponseDecoding.grantToken)
    }

    /// Revokes a v3 token (needs ``TetherConfiguration/secretKey``).
    public func revokeToken(_ token: String, timeout: Duration? = nil) async throws(TetherError) {
        let hasSecret = configuration.secretKey?.isEmpty == false
        try await perform(.revokeToken, build: { e throws(RequestBuildError) in
            guard hasSecret else { throw .missingSecretKey }
            return try e.revokeToken(token, timeout: timeout)
        }, decode: { _ in () })
    }
}
