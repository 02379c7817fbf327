public import TetherClientCore

/// App Context (PubNub's objects v2): user and channel metadata, memberships and members
/// (docs/sdk-guide.md, "App Context"). Every call fails with a ``TetherError`` whose status has
/// the HTTP code: 404 for an unknown user or channel, 412 for a stale `ifMatchesETag`, 400
/// (``StatusCategory/badRequest``) for an invalid filter, sort or field, 403
/// (``StatusCategory/accessDenied``) without the `uuids` / `channels` grant.
extension TetherClient {
    // MARK: - Users

    /// Sets a user's metadata: its non-nil fields replace the stored ones (others are kept).
    /// With `ifMatchesETag`, only when the stored version is that one (412 otherwise).
    /// Subscribers of the channel named by the user id receive an ``AppContextEvent``.
    public func setUserMetadata(_ user: UserMetadata, ifMatchesETag: String? = nil, timeout: Duration? = nil)
        async throws(TetherError) -> UserMetadata
    {
        try await perform(.setUserMetadata, build: { e throws(RequestBuildError) in
            try e.setUserMetadata(user, ifMatchesETag: ifMatchesETag, timeout: timeout)
        }, decode: ResponseDecoding.user)
    }

    /// A user's metadata (this client's user by default), with custom, status and type.
    public func fetchUserMetadata(userId: String? = nil, timeout: Duration? = nil) async throws(TetherError) -> UserMetadata {
        let id = userId ?? configuration.userId
        return try await perform(.fetchUserMetadata, build: { e throws(RequestBuildError) in
            try e.fetchAppContextObject(user: true, id: id, timeout: timeout)
        }, decode: ResponseDecoding.user)
    }

    /// Removes a user's metadata and memberships (this client's user by default).
    public func removeUserMetadata(userId: String? = nil, timeout: Duration? = nil) async throws(TetherError) {
        let id = userId ?? configuration.userId
        try await perform(.removeUserMetadata, build: { e throws(RequestBuildError) in
            try e.removeAppContextObject(user: true, id: id, timeout: timeout)
        }, decode: { _ in () })
    }

    /// One page of users: `filter` in PubNub's App Context filter language (`name LIKE "a*"`,
    /// `custom.role == "admin" && updated >= "2026-01-01"`), `sort` as `"name:asc"`,
    /// `"updated:desc"`…, `limit` 1–100, `page` a cursor of a previous page.
    public func fetchAllUserMetadata(filter: String? = nil, sort: [String] = [], limit: Int = 100, page: PageCursor? = nil,
                                     timeout: Duration? = nil) async throws(TetherError) -> AppContextPage<UserMetadata>
    {
        try await perform(.fetchAllUserMetadata, build: { e throws(RequestBuildError) in
            try e.fetchAllAppContextObjects(user: true, filter: filter, sort: sort, limit: limit, page: page, timeout: timeout)
        }, decode: { body throws(DecodingFailure) in try ResponseDecoding.page(body, ResponseDecoding.userMetadata) })
    }

    // MARK: - Channels

    /// Sets a channel's metadata (non-nil fields replace the stored ones). Subscribers of the
    /// channel receive an ``AppContextEvent``.
    public func setChannelMetadata(_ channel: ChannelMetadata, ifMatchesETag: String? = nil, timeout: Duration? = nil)
        async throws(TetherError) -> ChannelMetadata
    {
        try await perform(.setChannelMetadata, channels: [channel.id], build: { e throws(RequestBuildError) in
            try e.setChannelMetadata(channel, ifMatchesETag: ifMatchesETag, timeout: timeout)
        }, decode: ResponseDecoding.channel)
    }

    /// A channel's metadata, with custom, status and type.
    public func fetchChannelMetadata(channel: String, timeout: Duration? = nil) async throws(TetherError) -> ChannelMetadata {
        try await perform(.fetchChannelMetadata, channels: [channel], build: { e throws(RequestBuildError) in
            try e.fetchAppContextObject(user: false, id: channel, timeout: timeout)
        }, decode: ResponseDecoding.channel)
    }

    /// Removes a channel's metadata and its members.
    public func removeChannelMetadata(channel: String, timeout: Duration? = nil) async throws(TetherError) {
        try await perform(.removeChannelMetadata, channels: [channel], build: { e throws(RequestBuildError) in
            try e.removeAppContextObject(user: false, id: channel, timeout: timeout)
        }, decode: { _ in () })
    }

    /// One page of channels (`filter`, `sort`, `limit`, `page` as for users).
    public func fetchAllChannelMetadata(filter: String? = nil, sort: [String] = [], limit: Int = 100, page: PageCursor? = nil,
                                        timeout: Duration? = nil) async throws(TetherError) -> AppContextPage<ChannelMetadata>
    {
        try await perform(.fetchAllChannelMetadata, build: { e throws(RequestBuildError) in
            try e.fetchAllAppContextObjects(user: false, filter: filter, sort: sort, limit: limit, page: page, timeout: timeout)
        }, decode: { body throws(DecodingFailure) in try ResponseDecoding.page(body, ResponseDecoding.channelMetadata) })
    }

    // MARK: - Memberships

    /// One page of a user's memberships (this client's user by default), each with the channel's
    /// metadata. `filter` and `sort` may name `channel.name`, `custom.x`, `updated`…
    public func fetchMemberships(userId: String? = nil, filter: String? = nil, sort: [String] = [], limit: Int = 100,
                                 page: PageCursor? = nil, timeout: Duration? = nil) async throws(TetherError) -> AppContextPage<Membership>
    {
        let id = userId ?? configuration.userId
        return try await perform(.fetchMemberships, build: { e throws(RequestBuildError) in
            try e.appContextMemberships(ofUser: true, id: id, filter: filter, sort: sort, limit: limit, page: page, timeout: timeout)
        }, decode: { body throws(DecodingFailure) in try ResponseDecoding.page(body) { ResponseDecoding.membership($0, userId: id) } })
    }

    /// Adds or updates a user's memberships (``MembershipUpdate/id`` is the channel); returns
    /// the first page of the user's memberships after the change.
    @discardableResult
    public func setMemberships(_ channels: [MembershipUpdate], userId: String? = nil, timeout: Duration? = nil)
        async throws(TetherError) -> AppContextPage<Membership>
    {
        try await manageMemberships(userId: userId, set: channels, remove: [], timeout: timeout)
    }

    /// Removes a user's memberships of `channels`; returns the first page of what remains.
    @discardableResult
    public func removeMemberships(channels: [String], userId: String? = nil, timeout: Duration? = nil)
        async throws(TetherError) -> AppContextPage<Membership>
    {
        try await manageMemberships(userId: userId, set: [], remove: channels, timeout: timeout)
    }

    private func manageMemberships(userId: String?, set: [MembershipUpdate], remove: [String], timeout: Duration?)
        async throws(TetherError) -> AppContextPage<Membership>
    {
        let id = userId ?? configuration.userId
        return try await perform(.setMemberships, channels: set.map(\.id) + remove, build: { e throws(RequestBuildError) in
            try e.appContextMemberships(ofUser: true, id: id, set: set, delete: remove, timeout: timeout)
        }, decode: { body throws(DecodingFailure) in try ResponseDecoding.page(body) { ResponseDecoding.membership($0, userId: id) } })
    }

    // MARK: - Members

    /// One page of a channel's members, each with the user's metadata.
    public func fetchChannelMembers(channel: String, filter: String? = nil, sort: [String] = [], limit: Int = 100,
                                    page: PageCursor? = nil, timeout: Duration? = nil) async throws(TetherError)
        -> AppContextPage<Membership>
    {
        try await perform(.fetchChannelMembers, channels: [channel], build: { e throws(RequestBuildError) in
            try e.appContextMemberships(ofUser: false, id: channel, filter: filter, sort: sort, limit: limit, page: page, timeout: timeout)
        }, decode: { body throws(DecodingFailure) in
            try ResponseDecoding.page(body) { ResponseDecoding.membership($0, channelId: channel) }
        })
    }

    /// Adds or updates a channel's members (``MembershipUpdate/id`` is the user id).
    @discardableResult
    public func setChannelMembers(_ users: [MembershipUpdate], channel: String, timeout: Duration? = nil)
        async throws(TetherError) -> AppContextPage<Membership>
    {
        try await manageMembers(channel: channel, set: users, remove: [], timeout: timeout)
    }

    /// Removes `userIds` from a channel's members.
    @discardableResult
    public func removeChannelMembers(userIds: [String], channel: String, timeout: Duration? = nil)
        async throws(TetherError) -> AppContextPage<Membership>
    {
        try await manageMembers(channel: channel, set: [], remove: userIds, timeout: timeout)
    }

    private func manageMembers(channel: String, set: [MembershipUpdate], remove: [String], timeout: Duration?)
        async throws(TetherError) -> AppContextPage<Membership>
    {
        try await perform(.setChannelMembers, channels: [channel], build: { e throws(RequestBuildError) in
            try e.appContextMemberships(ofUser: false, id: channel, set: set, delete: remove, timeout: timeout)
        }, decode: { body throws(DecodingFailure) in
            try ResponseDecoding.page(body) { ResponseDecoding.membership($0, channelId: channel) }
        })
    }
}
