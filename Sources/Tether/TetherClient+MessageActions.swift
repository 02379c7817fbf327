public import TetherClientCore
public import TetherProtocol

extension TetherClient {
    /// Adds a message action — a reaction, a receipt — to the stored message `messageTimetoken`
    /// of `channel`, as this client's user. Subscribers of the channel receive it as a
    /// ``MessageActionEvent`` (``Subscription/messageActions``).
    ///
    /// Fails with status code 409 (category ``StatusCategory/unknown``) when this user already
    /// added the same type and value to that message, and with ``StatusCategory/badRequest``
    /// when the message is not stored.
    /// - Returns: the stored action, with its own timetoken.
    public func addMessageAction(channel: String, messageTimetoken: Timetoken, type: String, value: String,
                                 timeout: Duration? = nil) async throws(TetherError) -> MessageAction
    {
        try await perform(.addMessageAction, channels: [channel], build: { e throws(RequestBuildError) in
            try e.addMessageAction(channel: channel, messageTimetoken: messageTimetoken, type: type, value: value, timeout: timeout)
        }, decode: ResponseDecoding.addedMessageAction)
    }

    /// Removes an action this client's user added (``MessageAction/actionTimetoken``). Removing
    /// an action that is already gone succeeds.
    public func removeMessageAction(channel: String, messageTimetoken: Timetoken, actionTimetoken: Timetoken,
                                    timeout: Duration? = nil) async throws(TetherError)
    {
        try await perform(.removeMessageAction, channels: [channel], build: { e throws(RequestBuildError) in
            try e.removeMessageAction(channel: channel, messageTimetoken: messageTimetoken, actionTimetoken: actionTimetoken,
                                      timeout: timeout)
        }, decode: { _ in () })
    }

    /// One page of a channel's message actions: the newest `limit` (1–100) with an action
    /// timetoken before `start` (exclusive) and at or after `end` (inclusive), oldest first.
    /// Pass the page's ``MessageActionsPage/nextStart`` as `start` for the next older page.
    public func fetchMessageActions(channel: String, start: Timetoken? = nil, end: Timetoken? = nil, limit: Int = 100,
                                    timeout: Duration? = nil) async throws(TetherError) -> MessageActionsPage
    {
        try await perform(.fetchMessageActions, channels: [channel], build: { e throws(RequestBuildError) in
            try e.fetchMessageActions(channel: channel, start: start, end: end, limit: limit, timeout: timeout)
        }, decode: ResponseDecoding.messageActionsPage)
    }

    /// One page of a channel's messages with their actions (``HistoryMessage/actions``): fetch
    /// with ``FetchOptions/includeActions`` set, at most 25 messages.
    public func fetchMessages(channel: String, includeActions: Bool, options: FetchOptions = FetchOptions())
        async throws(TetherError) -> [HistoryMessage]
    {
        var options = options
        options.includeActions = includeActions
        return try await fetchMessages(channels: [channel], options: options).channels[channel] ?? []
    }
}
