/// The API call a status belongs to.
public enum TetherOperation: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    /// The subscribe long-poll (handshake or continuation).
    case subscribe
    /// Unsubscribing (leave).
    case unsubscribe
    /// `GET /time/0`.
    case time
    /// Publish (GET or POST).
    case publish
    /// Fire: a publish delivered to no subscriber and not stored.
    case fire
    /// Signal.
    case signal
    /// History v2 (one channel).
    case history
    /// Fetch messages v3 (several channels).
    case fetchMessages
    /// Message counts.
    case messageCounts
    /// Delete messages from history.
    case deleteMessages
    /// Here now.
    case hereNow
    /// Where now.
    case whereNow
    /// Presence heartbeat.
    case heartbeat
    /// Presence leave.
    case leave
    /// Get presence state.
    case getState
    /// Set presence state.
    case setState
    /// Add channels to a channel group.
    case addChannelsToGroup
    /// Remove channels from a channel group.
    case removeChannelsFromGroup
    /// List the channels of a group.
    case listChannelsInGroup
    /// List every channel group.
    case listGroups
    /// Delete a channel group.
    case deleteGroup
    /// Access Manager v2 grant (auth keys).
    case grant
    /// Access Manager v3 grant token.
    case grantToken
    /// Access Manager v3 revoke token.
    case revokeToken
    /// Add a message action.
    case addMessageAction
    /// Remove a message action.
    case removeMessageAction
    /// Fetch a channel's message actions.
    case fetchMessageActions
    /// App Context: fetch, set, remove and list user metadata.
    case fetchUserMetadata, setUserMetadata, removeUserMetadata, fetchAllUserMetadata
    /// App Context: fetch, set, remove and list channel metadata.
    case fetchChannelMetadata, setChannelMetadata, removeChannelMetadata, fetchAllChannelMetadata
    /// App Context: a user's memberships and a channel's members.
    case fetchMemberships, setMemberships, fetchChannelMembers, setChannelMembers
    /// Register a device for push on channels.
    case addPushChannels
    /// Unregister a device from push on channels.
    case removePushChannels
    /// List a device's push channels.
    case listPushChannels
    /// Unregister a device from every push channel.
    case removeAllPushChannels
    /// Upload a file (generate its upload URL, upload, announce it).
    case sendFile
    /// List a channel's files.
    case listFiles
    /// Download a file.
    case downloadFile
    /// Delete a file.
    case deleteFile
    /// Publish a file message for an uploaded file.
    case publishFileMessage

    /// The case name.
    public var description: String { rawValue }

    /// Whether this is the subscribe long-poll (uses the subscribe timeout and its own connection).
    public var isSubscribe: Bool { self == .subscribe }

    /// Whether sending the call twice has the effect of sending it once, without a request id
    /// the server deduplicates. Not so for a message action's add (the second answers 409), a
    /// file message (announced twice), and a publish, signal or fire; the SDK sends the file
    /// message and the outbox's publishes and signals with a request id, which makes them so.
    package var isIdempotent: Bool {
        switch self {
        case .addMessageAction, .publishFileMessage, .publish, .signal, .fire: false
        default: true
        }
    }
}
