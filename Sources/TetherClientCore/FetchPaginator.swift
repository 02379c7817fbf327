import TetherProtocol

/// Plans history pagination (seed 000's catch-up recipe), purely: given the options of the first
/// request and each page received, says what to fetch next.
///
/// Pages go backwards in time: each follow-up request keeps `end` and sets `start` to the oldest
/// timetoken of the previous page, for the channels whose page was full; it stops when no channel
/// returned a full page.
package struct FetchPaginator: Sendable {
    /// The channels still being paged.
    package private(set) var channels: [String]
    /// The options of the next request.
    package private(set) var options: FetchOptions
    /// Whether there is nothing more to fetch.
    package private(set) var isFinished = false

    /// Starts paging `channels` with `options`.
    package init(channels: [String], options: FetchOptions) {
        self.channels = channels
        self.options = options
    }

    /// The page size the server applies to the current request.
    package var pageSize: Int {
        let ceiling = channels.count == 1 && !options.includeActions ? 100 : 25
        return min(options.maximumPerChannel ?? ceiling, ceiling)
    }

    /// The oldest timetoken already delivered per channel.
    private var oldestSeen: [String: Timetoken] = [:]

    /// Records a received page, plans the next request and returns the page without messages
    /// already returned by an earlier page.
    @discardableResult
    package mutating func received(_ page: HistoryPage) -> HistoryPage {
        var fresh: [String: [HistoryMessage]] = [:]
        for (channel, messages) in page.channels {
            let bound = oldestSeen[channel]
            let kept = messages.filter { bound == nil || $0.timetoken < bound! }
            if !kept.isEmpty { fresh[channel] = kept }
            if let first = messages.first?.timetoken { oldestSeen[channel] = oldestSeen[channel].map { Swift.min($0, first) } ?? first }
        }
        defer { plan(page) }
        return HistoryPage(channels: fresh)
    }

    private mutating func plan(_ page: HistoryPage) {
        let size = pageSize
        var oldest: Timetoken?
        var remaining: [String] = []
        for channel in channels {
            let messages = page.channels[channel] ?? []
            guard messages.count >= size, let first = messages.first?.timetoken else { continue }
            remaining.append(channel)
            oldest = oldest.map { Swift.max($0, first) } ?? first
        }
        guard let oldest, !remaining.isEmpty else {
            isFinished = true
            return
        }
        // Several channels share one `start`: use the newest of their oldest timetokens so no
        // channel skips anything; messages already seen are filtered by timetoken by the caller.
        channels = remaining
        options.start = oldest
    }
}
