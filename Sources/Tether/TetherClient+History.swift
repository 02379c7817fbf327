public import TetherClientCore
public import TetherProtocol

extension TetherClient {
    /// History v2 of one channel, oldest first. Undecryptable messages are kept with
    /// ``HistoryMessage/decryptionError`` set.
    public func history(channel: String, options: HistoryOptions = HistoryOptions()) async throws(TetherError) -> [HistoryMessage] {
        let messages = try await perform(.history, channels: [channel], build: { e throws(RequestBuildError) in
            try e.history(channel: channel, options: options)
        }, decode: { body throws(DecodingFailure) in try ResponseDecoding.history(body, channel: channel) })
        return messages.map { decrypted($0, operation: .history) }
    }

    /// One page of fetched messages (v3) for one or more channels.
    public func fetchMessages(channels: [String], options: FetchOptions = FetchOptions()) async throws(TetherError) -> HistoryPage {
        let page = try await perform(.fetchMessages, channels: channels, build: { e throws(RequestBuildError) in
            try e.fetch(channels: channels, options: options)
        }, decode: ResponseDecoding.fetch)
        return HistoryPage(channels: page.channels.mapValues { $0.map { decrypted($0, operation: .fetchMessages) } })
    }

    /// Every page of history for `channels`, newest page first, each page oldest-first per channel.
    ///
    /// Follows seed 000's recipe: the same `end`, `start` moved to the oldest timetoken seen,
    /// until no channel returns a full page. Messages are never repeated across pages.
    public func historyPages(channels: [String], options: FetchOptions = FetchOptions()) -> HistoryPages {
        HistoryPages(client: self, channels: channels, options: options)
    }

    /// Every stored message published after `timetoken` on `channels`, oldest first — the
    /// catch-up an app does before resubscribing from the newest timetoken it got.
    public func messages(since timetoken: Timetoken, channels: [String], options: FetchOptions = FetchOptions())
        async throws(TetherError) -> [HistoryMessage]
    {
        var options = options
        options.end = timetoken.successor
        options.start = nil
        var all: [HistoryMessage] = []
        var pages = historyPages(channels: channels, options: options).makeAsyncIterator()
        while let page = try await pages.next() { all += page.messages }
        return all.sorted { ($0.timetoken, $0.channel) < ($1.timetoken, $1.channel) }
    }

    /// Every stored message on `channel` in `(after, through]`, oldest first: a catch-up's
    /// backfill of a gap. Paged from `through` down, so nothing newer is fetched.
    func messages(after: Timetoken, through: Timetoken, channel: String) async throws(TetherError) -> [HistoryMessage] {
        var options = FetchOptions()
        options.end = after.successor
        options.start = through.successor
        var all: [HistoryMessage] = []
        var pages = historyPages(channels: [channel], options: options).makeAsyncIterator()
        while let page = try await pages.next() { all += page.messages }
        return all.filter { $0.timetoken > after && $0.timetoken <= through }.sorted { ($0.timetoken, $0.channel) < ($1.timetoken, $1.channel) }
    }

    func decrypted(_ message: HistoryMessage, operation: TetherOperation) -> HistoryMessage {
        guard let module = configuration.cryptoModule else { return message }
        var message = message
        do {
            message.payload = try module.decrypt(message: message.payload)
        } catch {
            message.decryptionError = Status(
                category: .decryptionError, operation: operation, error: error, serverMessage: error.description,
                affectedChannels: [message.channel],
                undecryptableMessage: UndecryptableMessage(channel: message.channel, timetoken: message.timetoken,
                                                           rawPayload: message.payload, publisher: message.publisher))
        }
        return message
    }
}

/// History pages as an `AsyncSequence` (see ``TetherClient/historyPages(channels:options:)``).
public struct HistoryPages: AsyncSequence, Sendable {
    /// One page.
    public typealias Element = HistoryPage
    /// Failures are ``TetherError``.
    public typealias Failure = TetherError

    let client: TetherClient
    let channels: [String]
    let options: FetchOptions

    /// Starts paging.
    public func makeAsyncIterator() -> Iterator {
        Iterator(client: client, paginator: FetchPaginator(channels: channels, options: options))
    }

    /// Fetches one page per `next()`.
    public struct Iterator: AsyncIteratorProtocol {
        let client: TetherClient
        var paginator: FetchPaginator

        /// The next page, or `nil` when everything has been fetched.
        public mutating func next() async throws(TetherError) -> HistoryPage? {
            guard !paginator.isFinished else { return nil }
            let page = try await client.fetchMessages(channels: paginator.channels, options: paginator.options)
            return paginator.received(page)
        }

    }
}
