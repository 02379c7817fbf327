import HTTPTypes
import Hummingbird
import NIOCore
import Synchronization
@_spi(Benchmarks) import TetherProtocol
import TetherServerCore

/// A subscribe (pubnub-wire §6): what it subscribes to and its filter, checked before access;
/// its cursor and presence options, read after.
struct SubscribeRequest {
    var keyset: Keyset
    var limits: Limits
    var channels: [String]
    var groups: [String]
    var filter: FilterExpression?

    init(_ wire: WireRequest, keysets: KeysetRegistry, filters: FilterCache) throws {
        let s = wire.segments
        let keyset = try keysets.keyset(subscribeKey: s[2], service: "Subscribe", uriLength: wire.uriLength)
        let limits = keysets.limits(for: keyset)
        try RequestValidation.optionalUserId(wire, service: "Subscribe")
        let names = wire.pathNames(3)
        let groups = wire.queryNames("channel-group")
        try RequestValidation.checkCounts(channels: names, groups: groups, limits: limits, service: "Subscribe")
        if names.isEmpty && groups.isEmpty {
            throw Refusal(response: Reply.error(.badRequest, service: "Subscribe", "No channels or channel groups given"))
        }
        for name in names {
            do { try NameRules.validateSubscribeChannel(name) } catch {
                throw Refusal(response: Reply.error(.badRequest, service: "Subscribe", "Invalid channel \(String(reflecting: name)): \(error)"))
            }
        }
        for group in groups {
            do { try NameRules.validateGroup(group) } catch {
                throw Refusal(response: Reply.error(.badRequest, service: "Subscribe",
                                                    "Invalid channel group \(String(reflecting: group)): \(error)"))
            }
        }
        if let text = wire.query["filter-expr"], !text.isEmpty {
            do {
                filter = try filters.expression(text)
            } catch {
                throw Refusal(response: Reply.json(Reply.malformedFilterExpression, ErrorBody.service(
                    status: 481, service: "Subscribe", message: "Invalid filter expression: \(error.reason) at position \(error.position)")))
            }
        }
        self.keyset = keyset
        self.limits = limits
        self.channels = names
        self.groups = groups
    }

    /// What is read after the access check.
    struct Options {
        /// `tt`: 0 (or absent) for a handshake.
        var cursor: Timetoken
        /// `heartbeat`: the presence timeout the client asks for.
        var heartbeat: Int?
        /// `state`: presence state by channel.
        var states: [String: String]
        /// `uuid`, when not empty.
        var uuid: String?

        init(_ wire: WireRequest, channels: [String], groups: [String]) throws {
            cursor = try wire.timetoken("tt") ?? .zero
            _ = try wire.integer("tr", in: ParameterBounds.region)
            heartbeat = try RequestValidation.heartbeatSeconds(wire)
            states = try RequestValidation.channelStates(wire, service: "Subscribe", channels: channels, groups: groups)
            uuid = wire.query["uuid"].flatMap { $0.isEmpty ? nil : $0 }
        }
    }
}

extension TetherResponder {
    /// Subscribe: a heartbeat for its uuid, then the handshake cursor or a long-poll on the hub.
    @inline(never) nonisolated(nonsending) func subscribe(_ wire: WireRequest, context: TetherRequestContext) async throws -> Response {
        let request = try SubscribeRequest(wire, keysets: state.keysets, filters: state.filters)
        let keyset = request.keyset
        let names = request.channels
        let groups = request.groups
        // A hot-path long-poll served again after a parked wait keeps its first run's signature
        // verdict and deadline, and its heartbeat was that run's (a uuid that left meanwhile is
        // not joined again).
        let slot = context.longPollSlot
        let resumed = slot?.resumePoint.withLock { $0 }
        let signature = slot?.signature.withLock { $0 } ?? (keyset.secretKey == nil ? AccessManager.SignatureVerdict.absent
            : state.access.verifySignature(keyset: keyset, method: "GET", rawPath: wire.rawPath, rawQuery: wire.rawQuery, body: []))
        let check = try authorize(keyset, wire, channels: names, groups: groups, permission: .read, verified: signature)
        slot?.signature.withLock { $0 = signature }
        var options = try SubscribeRequest.Options(wire, channels: names, groups: groups)
        // Setting state is acting for the uuid, as set-state is (docs/security.md): without that
        // proof the subscribe goes on and its state is ignored (see the heartbeat route).
        if let uuid = options.uuid, !options.states.isEmpty, !mayAct(as: uuid, keyset, wire, verdict: signature) { options.states = [:] }
        // A subscribe is a heartbeat for its uuid on every channel and group in it (§6.4.8).
        var heartbeatAt: Duration?
        // What this request's heartbeat joined again right after the uuid left (a stale
        // long-poll read after its client's leave), taken back if its client turns out to have
        // abandoned it (``PresenceService/withdraw(_:)``).
        var joined: PresenceService.Joined?
        if let uuid = options.uuid, resumed == nil {
            heartbeatAt = state.presence.now()
            joined = await state.presence.heartbeat(subscribeKey: keyset.subscribeKey, uuid: uuid, channels: names, groups: groups,
                                                    timeoutSeconds: options.heartbeat, states: options.states)
            // Its client already closed the connection (an SDK that cancelled this long-poll
            // and then left on another connection, whose leave this request came after): what it
            // joined is taken back, or the uuid would be present until its timeout.
            if let made = joined, !context.channel.isActive {
                await state.presence.withdraw(made)
                joined = nil
            }
        }
        // The same when the connection's close is seen a moment later (while the long-poll
        // waits): a client gone within a second of the heartbeat abandoned the request. A
        // long-poll its client drops later (a proxy's idle timeout, a dead link) leaves its
        // join to the presence timeout, as any heartbeat's.
        // (Made only for a rejoin: no closure per ordinary long-poll.)
        let presence = state.presence
        var withdrawal: (@Sendable () -> Void)?
        if let joined, let heartbeatAt {
            withdrawal = {
                guard presence.now() - heartbeatAt < .seconds(1) else { return }
                Task { await presence.withdraw(joined) }
            }
        }
        let abandoned = withdrawal
        if options.cursor == .zero {
            state.console?.longPollBegan(uuid: options.uuid, subscribeKey: keyset.subscribeKey, address: context.channel.remoteAddress,
                                         channels: names, groups: groups, cursor: .zero, channel: nil)
            state.console?.longPollEnded(uuid: options.uuid, channel: context.channel, page: nil)
            // Handshake: the current cursor, never backlog (pubnub-wire §6.4.1).
            return Reply.json(.ok, SubscribeResponseBody.encode(cursor: state.hub.currentCursor, region: 1, envelopes: []))
        }
        let spec = SubscriptionSpec(subscribeKey: keyset.subscribeKey, names: names, groups: groups)
        // A cursor from the future is treated as current rather than waited for; in a cluster,
        // one another node handed out is kept (``LongPollHub/readPoint(for:)``).
        // (A run after a parked wait reads from where the first one did.)
        let after: Timetoken
        if let resumed {
            after = resumed.after
        } else if state.hub.shared == nil {
            after = min(options.cursor, state.hub.currentCursor)
        } else {
            after = await state.hub.readPoint(for: options.cursor)
        }
        let access = state.access
        let accessRequest = AccessRequest(channels: names, groups: groups, permission: .read, uuid: wire.query["uuid"])
        let auth = wire.query["auth"]
        var recheck: (@Sendable () -> AccessManager.Check)?
        if keyset.secretKey != nil {
            recheck = { access.check(accessRequest, keyset: keyset, auth: auth, signature: signature) }
        }
        if resumed == nil {
            state.console?.longPollBegan(uuid: options.uuid, subscribeKey: keyset.subscribeKey, address: context.channel.remoteAddress,
                                         channels: names, groups: groups, cursor: options.cursor, channel: context.channel)
        }
        let deadline = resumed?.deadline ?? NIODeadline.now() + holdTime(keyset: keyset, uuid: options.uuid, heartbeat: options.heartbeat)
        let remaining = deadline - NIODeadline.now()
        slot?.resumePoint.withLock { $0 = (deadline, after) }
        if let slot {
            // If its client goes while it waits parked, the long-poll ends there: recorded as
            // a run that throws `CancellationError` is.
            let console = state.console, metrics = state.metrics, uuid = options.uuid, channel = context.channel
            slot.onGone.withLock {
                $0 = {
                    console?.longPollEnded(uuid: uuid, channel: channel, page: nil)
                    metrics.recordRequest(endpoint: "client-closed", status: 499)
                    abandoned?()
                }
            }
        }
        let page: SubscribePage
        do {
            // Parks without a task only while time is left (an expired wait reads once more
            // and answers in this run).
            page = try await state.hub.receive(
                spec, after: after, limit: request.limits.maxEnvelopesPerResponse, timeout: max(remaining, .zero),
                channel: context.channel, access: check, recheck: recheck, filter: request.filter,
                parking: remaining > .zero ? slot?.parking : nil)
        } catch is LongPollParked {
            slot?.parked.store(true, ordering: .releasing)
            throw LongPollParked()
        } catch {
            state.console?.longPollEnded(uuid: options.uuid, channel: context.channel, page: nil)
            if !context.channel.isActive { abandoned?() }
            throw error
        }
        state.console?.longPollEnded(uuid: options.uuid, channel: context.channel, page: page)
        if let uuid = options.uuid {
            // The connection was alive for the whole long-poll: its end extends the uuid's
            // presence where it still is — but never re-joins one that left meanwhile.
            // (Not when this same run heartbeated a moment ago, `refreshAfterHeartbeat`: a
            // long-poll answered at once has nothing to extend.)
            await state.presence.refresh(subscribeKey: keyset.subscribeKey, uuid: uuid, channels: names, groups: groups,
                                         timeoutSeconds: options.heartbeat, heartbeatAt: heartbeatAt)
        }
        var headers: HTTPFields = [:]
        if !page.gaps.isEmpty {
            let value = page.gaps.map { "\(PercentCoding.encode($0.channel));from=\($0.from.rawValue);through=\($0.through.rawValue)" }
                .joined(separator: ", ")
            headers[.tetherGap] = value
        }
        return Reply.json(.ok, SubscribeResponseBody.encode(cursor: page.cursor, region: 1, envelopes: page.envelopes), extraHeaders: headers)
    }
}

extension TetherResponder {
    /// How long a long-poll waits before answering empty: the configured hold (280 s), but
    /// shorter than the uuid's presence timeout when that is short (a `heartbeat` of 60, or a
    /// keyset's low default). Nothing heartbeats a uuid while its long-poll waits; answered
    /// after its timeout, the uuid would have timed out meanwhile and join again with the next
    /// request, every hold: a `timeout` and a `join` each cycle for a client sitting still (an
    /// SDK sending no explicit heartbeats). The hold is then the longer of half the timeout and
    /// the timeout less 10 s, and the poll's end extends the presence.
    func holdTime(keyset: Keyset, uuid: String?, heartbeat: Int?) -> TimeAmount {
        let hold = state.subscribeTimeout
        guard uuid != nil else { return hold }
        let timeout = state.presence.configuration(for: keyset.subscribeKey).timeout(requestedSeconds: heartbeat)
        let cap = max(timeout / 2, timeout - .seconds(10))
        let (seconds, attoseconds) = cap.components
        let capped = TimeAmount.nanoseconds(seconds * 1_000_000_000 + attoseconds / 1_000_000_000)
        return min(hold, capped)
    }
}

/// Parsed filter expressions by their text, shared by every subscriber sending the same filter.
/// Bounded: when full it starts over (a subscriber's next long-poll parses its filter again).
final class FilterCache: Sendable {
    private let entries = Mutex<[String: FilterExpression]>([:])
    /// Filters kept at most.
    static let capacity = 4096

    /// The parsed expression for `text`, parsed on first use.
    func expression(_ text: String) throws(FilterExpressionError) -> FilterExpression {
        if let cached = entries.withLock({ $0[text] }) { return cached }
        let parsed = try FilterExpression(parsing: text)
        entries.withLock { entries in
            if entries.count >= Self.capacity { entries.removeAll(keepingCapacity: true) }
            entries[text] = parsed
        }
        return parsed
    }
}
