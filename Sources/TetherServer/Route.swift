import HTTPTypes
public import TetherServerCore

/// Every route of the REST wire.
///
/// The router classifies each request into exactly one route and dispatches with an exhaustive
/// `switch`, so a new endpoint needs a case here, and the access table test
/// (`AccessTableTests`) fails until that case has a row. The raw value is the endpoint label of
/// logs and metrics.
public enum Route: String, CaseIterable, Sendable {
    case options, time, publish, signal, subscribe
    case history, fetch
    case historyWithActions = "history-with-actions"
    case messageCounts = "message-counts"
    case deleteMessages = "delete"
    case hereNowGlobal = "here-now-global"
    case hereNow = "here-now"
    case whereNow = "where-now"
    case heartbeat, leave
    case getState = "get-state"
    case setState = "set-state"
    case groupList = "group-list"
    case groupChannels = "group-channels"
    case groupUpdate = "group-update"
    case groupDelete = "group-delete"
    case grant, audit
    case grantToken = "grant-token"
    case revokeToken = "revoke-token"
    case addMessageAction = "add-message-action"
    case removeMessageAction = "remove-message-action"
    case getMessageActions = "get-message-actions"
    case getUserMetadata = "get-uuid-metadata", setUserMetadata = "set-uuid-metadata", removeUserMetadata = "remove-uuid-metadata"
    case getAllUserMetadata = "get-all-uuid-metadata"
    case getChannelMetadata = "get-channel-metadata", setChannelMetadata = "set-channel-metadata"
    case removeChannelMetadata = "remove-channel-metadata", getAllChannelMetadata = "get-all-channel-metadata"
    case getMemberships = "get-memberships", manageMemberships = "manage-memberships"
    case getChannelMembers = "get-channel-members", manageChannelMembers = "manage-channel-members"
    case generateFileUploadURL = "generate-upload-url"
    case uploadFile = "upload-file"
    case publishFileMessage = "publish-file"
    case listFiles = "list-files"
    case getFile = "get-file"
    case downloadFile = "download-file"
    case deleteFile = "delete-file"
    case health, metrics
    case pushModify = "push-modify"
    case pushList = "push-list"
    case pushRemoveDevice = "push-remove-device"

    /// What a route requires on a keyset with Access Manager on (one with a secret key).
    public enum Access: Sendable, Equatable {
        /// Not tied to a keyset: answered for anybody (time, health, metrics, CORS preflight).
        case open
        /// No permission, as PubNub has it (where-now).
        case none
        /// These permissions on every channel and group the request names.
        case permission(Permissions)
        /// Read on every channel and group named, and proof that the request acts for the uuid
        /// it names: a token bound to that uuid, or for auth keys the uuid of the request
        /// itself (a Tether deviation from PubNub: nobody leaves or sets state for another).
        case actingAs(Permissions)
        /// A request signed with the keyset's secret key (server-side admin).
        case admin
        /// These permissions on the user (App Context) the request names: a v3 token's `uuids`
        /// resources, or v2 grants with `target-uuid`.
        case user(Permissions)
        /// A form or URL this server signed and handed out (file uploads and downloads, as
        /// PubNub's presigned storage URLs): no Access Manager permission.
        case signed
    }

    /// PubNub's operation-to-permission mapping for this route (docs/security.md, "Access
    /// Manager").
    public var access: Access {
        switch self {
        case .options, .time, .health, .metrics: .open
        case .whereNow: .none
        case .publish, .signal, .addMessageAction: .permission(.write)
        case .subscribe, .history, .fetch, .historyWithActions, .messageCounts, .hereNow, .heartbeat, .getState, .getMessageActions:
            .permission(.read)
        case .deleteMessages, .removeMessageAction: .permission(.delete)
        case .leave, .setState: .actingAs(.read)
        case .pushModify: .permission(.read)
        case .pushList, .pushRemoveDevice: .none
        case .groupChannels, .groupUpdate, .groupDelete: .permission(.manage)
        case .hereNowGlobal, .groupList, .grant, .audit, .grantToken, .revokeToken: .admin
        case .getUserMetadata, .getMemberships: .user(.get)
        case .setUserMetadata, .manageMemberships: .user(.update)
        case .removeUserMetadata: .user(.delete)
        case .getChannelMetadata, .getChannelMembers: .permission(.get)
        case .setChannelMetadata: .permission(.update)
        case .removeChannelMetadata: .permission(.delete)
        case .manageChannelMembers: .permission(.manage)
        case .getAllUserMetadata, .getAllChannelMetadata: .admin
        case .generateFileUploadURL, .publishFileMessage: .permission(.write)
        case .listFiles, .getFile: .permission(.read)
        case .deleteFile: .permission(.delete)
        case .uploadFile, .downloadFile: .signed
        }
    }

    /// The `service` its JSON error bodies name.
    var service: String {
        switch self {
        case .subscribe: "Subscribe"
        case .hereNowGlobal, .hereNow, .whereNow, .heartbeat, .leave, .getState, .setState: "Presence"
        case .history, .fetch, .historyWithActions, .deleteMessages, .messageCounts: "Storage"
        case .groupList, .groupChannels, .groupUpdate, .groupDelete: "channel-registry"
        case .grant, .audit, .grantToken, .revokeToken: "Access Manager"
        case .addMessageAction, .removeMessageAction, .getMessageActions: "actions"
        case .getUserMetadata, .setUserMetadata, .removeUserMetadata, .getAllUserMetadata, .getChannelMetadata, .setChannelMetadata,
             .removeChannelMetadata, .getAllChannelMetadata, .getMemberships, .manageMemberships, .getChannelMembers, .manageChannelMembers:
            "objects"
        case .options, .time, .publish, .signal, .health, .metrics: "Tether"
        case .pushModify, .pushList, .pushRemoveDevice: "push"
        case .generateFileUploadURL, .uploadFile, .publishFileMessage, .listFiles, .getFile, .downloadFile, .deleteFile: "files"
        }
    }

    /// The rate-limit bucket a request of this route takes and the path segment holding its
    /// subscribe key; `nil` for routes never limited. Subscribe is limited for handshakes only
    /// (`TetherResponder.rateLimit`).
    var rateLimit: (kind: RateLimits.Kind, subscribeKeySegment: Int)? {
        switch self {
        case .options, .time, .health, .metrics: nil
        case .publish, .signal: (.publish, 2)
        case .subscribe, .grantToken, .revokeToken, .addMessageAction, .removeMessageAction, .getMessageActions: (.request, 2)
        case .pushModify, .pushList, .pushRemoveDevice: (.request, 3)
        case .grant, .audit: (.request, 4)
        case .getUserMetadata, .setUserMetadata, .removeUserMetadata, .getAllUserMetadata, .getChannelMetadata, .setChannelMetadata,
             .removeChannelMetadata, .getAllChannelMetadata, .getMemberships, .manageMemberships, .getChannelMembers, .manageChannelMembers:
            (.request, 2)
        case .history, .fetch, .historyWithActions, .deleteMessages, .messageCounts, .hereNowGlobal, .hereNow, .whereNow,
             .heartbeat, .leave, .getState, .setState, .groupList, .groupChannels, .groupUpdate, .groupDelete:
            (.request, 3)
        case .publishFileMessage: (.publish, 4)
        case .generateFileUploadURL, .listFiles, .getFile, .deleteFile: (.request, 2)
        case .uploadFile, .downloadFile: (.request, 3)
        }
    }

    /// Classifies a request by its method and decoded path segments (and, for channel groups,
    /// whether it adds or removes channels); `nil` when no route matches (404).
    static func classify(_ method: HTTPRequest.Method, _ s: [String], _ wire: WireRequest) -> Route? {
        func at(_ i: Int) -> String? { i < s.count ? s[i] : nil }
        switch (method, s.first) {
        case (.options, _): return .options
        case (.get, "time") where s.count == 2 && s[1] == "0": return .time
        case (.get, "publish") where s.count == 7, (.post, "publish") where s.count == 6: return .publish
        case (.get, "signal") where s.count == 7, (.post, "signal") where s.count == 6: return .signal
        case (.get, "v2") where s.count >= 4 && s[1] == "subscribe": return .subscribe
        case (.get, "v2") where s.count == 6 && s[1] == "history" && s[2] == "sub-key" && s[4] == "channel": return .history
        case (.get, "v3") where s.count == 6 && s[1] == "history" && s[2] == "sub-key" && s[4] == "channel": return .fetch
        case (.get, "v3") where s.count == 6 && s[1] == "history-with-actions" && s[2] == "sub-key" && s[4] == "channel":
            return .historyWithActions
        case (.delete, "v3") where s.count == 6 && s[1] == "history" && s[2] == "sub-key" && s[4] == "channel": return .deleteMessages
        case (.get, "v3") where s.count == 6 && s[1] == "history" && s[2] == "sub-key" && s[4] == "message-counts":
            return .messageCounts
        case (.get, "v2") where s.count >= 4 && s[1] == "presence" && s[2] == "sub-key":
            switch (s.count, at(4), at(6), at(8)) {
            case (4, _, _, _): return wire.queryNames("channel-group").isEmpty ? .hereNowGlobal : .hereNow
            case (6, "channel", _, _): return .hereNow
            case (6, "uuid", _, _): return .whereNow
            case (7, "channel", "heartbeat", _): return .heartbeat
            case (7, "channel", "leave", _): return .leave
            case (8, "channel", "uuid", _): return .getState
            case (9, "channel", "uuid", "data"): return .setState
            default: return nil
            }
        case (.get, "v1") where s.count >= 5 && s[1] == "channel-registration" && s[2] == "sub-key" && s[4] == "channel-group":
            switch s.count {
            case 5: return .groupList
            case 6: return wire.queryNames("add").isEmpty && wire.queryNames("remove").isEmpty ? .groupChannels : .groupUpdate
            case 7 where s[6] == "remove": return .groupDelete
            default: return nil
            }
        case (.get, "v2") where s.count == 5 && s[1] == "auth" && s[2] == "grant" && s[3] == "sub-key": return .grant
        case (.get, "v2") where s.count == 5 && s[1] == "auth" && s[2] == "audit" && s[3] == "sub-key": return .audit
        case (.post, "v3") where s.count == 4 && s[1] == "pam" && s[3] == "grant": return .grantToken
        case (.delete, "v3") where s.count == 5 && s[1] == "pam" && s[3] == "grant": return .revokeToken
        case (_, "v1") where s.count >= 5 && s[1] == "message-actions" && s[3] == "channel":
            switch (method, s.count, at(5), at(7)) {
            case (.get, 5, _, _): return .getMessageActions
            case (.post, 7, "message", _): return .addMessageAction
            case (.delete, 9, "message", "action"): return .removeMessageAction
            default: return nil
            }
        case (_, "v2") where (4...6).contains(s.count) && s[1] == "objects" && (s[3] == "uuids" || s[3] == "channels"):
            let users = s[3] == "uuids"
            switch (method, s.count, at(5)) {
            case (.get, 4, _): return users ? .getAllUserMetadata : .getAllChannelMetadata
            case (.get, 5, _): return users ? .getUserMetadata : .getChannelMetadata
            case (.patch, 5, _): return users ? .setUserMetadata : .setChannelMetadata
            case (.delete, 5, _): return users ? .removeUserMetadata : .removeChannelMetadata
            case (.get, 6, "channels") where users: return .getMemberships
            case (.patch, 6, "channels") where users: return .manageMemberships
            case (.get, 6, "uuids") where !users: return .getChannelMembers
            case (.patch, 6, "uuids") where !users: return .manageChannelMembers
            default: return nil
            }
        case (.get, "v1") where (s.count == 6 || (s.count == 7 && s[6] == "remove")) && s[1] == "push" && s[2] == "sub-key" && s[4] == "devices",
             (.get, "v2") where (s.count == 6 || (s.count == 7 && s[6] == "remove")) && s[1] == "push" && s[2] == "sub-key" && s[4] == "devices-apns2":
            if s.count == 7 { return .pushRemoveDevice }
            return (wire.query["add"] ?? "").isEmpty && (wire.query["remove"] ?? "").isEmpty ? .pushList : .pushModify
        case (_, "v1") where s.count >= 5 && s[1] == "files":
            switch (method, s.count, s[2], s[3], at(5)) {
            case (.post, 5, "upload", _, _): return .uploadFile
            case (.get, 7, "download", _, _): return .downloadFile
            case (.get, 9, "publish-file", _, _): return .publishFileMessage
            case (.post, 6, _, "channels", "generate-upload-url"): return .generateFileUploadURL
            case (.get, 6, _, "channels", "files"): return .listFiles
            case (.get, 8, _, "channels", "files"): return .getFile
            case (.delete, 8, _, "channels", "files"): return .deleteFile
            default: return nil
            }
        case (.get, "health") where s.count == 1: return .health
        case (.get, "metrics") where s.count == 1: return .metrics
        default: return nil
        }
    }
}
