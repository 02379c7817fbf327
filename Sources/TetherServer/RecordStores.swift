@_spi(Benchmarks) package import TetherProtocol

// Where push registrations, App Context and message actions live: the embedded SQLite store
// (``MessageStore``) on a single node, the cluster's PostgreSQL (``SharedLog``) with
// `--database-url`, so that every node reads and writes the same records. Routes and the push
// dispatcher use these protocols (``ServerState``); both stores pass the same store tests.

/// Mobile push device registrations (docs/push.md).
package protocol PushRegistrationStoring: Sendable {
    /// Removes `remove`, then adds `add` (PubNub's order), all or nothing: a device past
    /// `maxChannelsPerDevice` channels or a channel past `maxDevicesPerChannel` devices is
    /// answered with that outcome and nothing is changed.
    func changePushRegistrations(_ device: PushDevice, add: [String], remove: [String], maxChannelsPerDevice: Int,
                                 maxDevicesPerChannel: Int) async throws -> PushModifyOutcome
    /// The device's channels after `start` (exclusive), in name order (byte order), at most `limit`.
    func pushChannels(_ device: PushDevice, after start: String?, limit: Int) async throws -> [String]
    /// Unregisters the device from every channel; returns how many registrations it had.
    @discardableResult
    func removePushDevice(_ device: PushDevice) async throws -> Int
    /// The devices registered on a channel, at most `limit` (the per-channel bound).
    func pushDevices(subscribeKey: String, channel: String, limit: Int) async throws -> [PushDevice]
    /// Number of registrations (for tests and tools).
    func pushRegistrationCount() async throws -> Int
}

/// App Context: users' and channels' metadata and memberships (docs/compatibility.md, "App Context").
package protocol AppContextStoring: Sendable {
    /// One object, or `nil`.
    func appContextObject(subscribeKey: String, kind: AppContextKind, id: String) async throws -> AppContextRecord?
    /// Objects of one kind whose id is in `ids`.
    func appContextObjects(subscribeKey: String, kind: AppContextKind, ids: Set<String>) async throws -> [String: AppContextRecord]
    /// Every object of one kind in a keyset, by id (byte order), at most `limit`.
    func appContextObjects(subscribeKey: String, kind: AppContextKind, limit: Int) async throws -> [AppContextRecord]
    /// One page of a keyset's objects of one kind by id (byte order), and how many there are:
    /// a list without a filter or another order reads its page only.
    func appContextObjectsPage(subscribeKey: String, kind: AppContextKind, offset: Int, limit: Int) async throws
        -> (records: [AppContextRecord], total: Int)
    /// Applies a PATCH (present members replace, `null` clears, absent keep); with `ifMatch`,
    /// the stored eTag must be that one.
    func setAppContextObject(subscribeKey: String, kind: AppContextKind, id: String, patch: [String: JSONValue],
                             ifMatch: String?, updated: String) async throws -> AppContextSetOutcome
    /// Removes an object and its memberships; whether it existed.
    @discardableResult
    func removeAppContextObject(subscribeKey: String, kind: AppContextKind, id: String) async throws -> Bool
    /// The memberships of a user (`kind == .uuid`) or the members of a channel, at most `limit`.
    func appContextMemberships(subscribeKey: String, of kind: AppContextKind, id: String, limit: Int) async throws
        -> [AppContextMembership]
    /// Deletes, then sets memberships, all or nothing; throws ``AppContextMembershipLimitExceeded``
    /// (nothing written) when a user would pass `perUser` memberships or a channel `perChannel` members.
    func applyAppContextMemberships(subscribeKey: String, set: [AppContextMembership], delete: [(uuid: String, channel: String)],
                                    perUser: Int, perChannel: Int) async throws
        -> (set: [AppContextMembership], deleted: [(uuid: String, channel: String)])
    /// Number of stored objects and memberships (for tests and tools).
    func appContextCounts() async throws -> (objects: Int, memberships: Int)
}

extension AppContextStoring {
    /// ``applyAppContextMemberships(subscribeKey:set:delete:perUser:perChannel:)`` with PubNub's limits.
    package func applyAppContextMemberships(subscribeKey: String, set: [AppContextMembership],
                                            delete: [(uuid: String, channel: String)]) async throws
        -> (set: [AppContextMembership], deleted: [(uuid: String, channel: String)])
    {
        try await applyAppContextMemberships(subscribeKey: subscribeKey, set: set, delete: delete,
                                             perUser: MessageStore.membershipsPerUser, perChannel: MessageStore.membersPerChannel)
    }
}

/// Message actions, each tied to a stored message: refused without one, removed with it (a
/// history delete, retention).
package protocol MessageActionStoring: Sendable {
    /// Stores `action` (at its own timetoken) unless its message is missing or the same uuid
    /// already added the same type and value to it.
    func addAction(_ action: StoredAction) async throws -> ActionAddOutcome
    /// Removes an action when `uuid` (or, with `uuid` nil — an operator — anybody) added it.
    func removeAction(subscribeKey: String, channel: String, messageTimetoken: Timetoken, actionTimetoken: Timetoken,
                      uuid: String?) async throws -> ActionRemoveOutcome
    /// A channel's actions with `end <= actionTimetoken < start`: the newest `limit`, oldest
    /// first, and whether older ones remain in the range.
    func actions(subscribeKey: String, channel: String, start: Timetoken?, end: Timetoken?, limit: Int) async throws
        -> (actions: [StoredAction], more: Bool)
    /// The actions of messages `from...through` of a channel, by message, each message's oldest
    /// first, at most `limit` in all.
    func actions(subscribeKey: String, channel: String, messagesFrom from: Timetoken, through: Timetoken, limit: Int) async throws
        -> [Timetoken: [StoredAction]]
    /// Number of stored actions (for tests and tools).
    func actionCount() async throws -> Int
}

extension MessageActionStoring {
    /// The actions of a page of history, at most 5,000 (one response's bound).
    package func actions(subscribeKey: String, channel: String, messagesFrom from: Timetoken, through: Timetoken) async throws
        -> [Timetoken: [StoredAction]]
    {
        try await actions(subscribeKey: subscribeKey, channel: channel, messagesFrom: from, through: through, limit: 5000)
    }
}

extension MessageStore: PushRegistrationStoring, AppContextStoring, MessageActionStoring {}

extension ServerState {
    /// Push registrations: in the cluster's PostgreSQL with `--database-url`, else the store.
    package var pushRegistrations: any PushRegistrationStoring { records }
    /// App Context objects and memberships: in the cluster's PostgreSQL, else the store.
    package var appContext: any AppContextStoring { records }
    /// Message actions: in the cluster's PostgreSQL, else the store.
    package var messageActions: any MessageActionStoring { records }
    /// The time App Context changes are stamped with (`updated`): the hub's cursor; in a
    /// cluster, where the cursor moves only as the shared log is read, never before this node's
    /// clock, so that changes made one after another get later times, as on a single node.
    package var appContextTime: Timetoken {
        hub.shared == nil ? hub.currentCursor : max(hub.currentCursor, LongPollHub.systemNow())
    }

    private var records: any PushRegistrationStoring & AppContextStoring & MessageActionStoring {
        if let shared = hub.shared { return shared }
        return store
    }
}
