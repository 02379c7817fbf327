import Testing
@_spi(Benchmarks) import TetherProtocol
@_spi(Benchmarks) import TetherServerCore

@Suite struct PresenceTrackerTests {
    let timeout = Duration.seconds(20)

    private func actions(_ events: [PresenceEvent]) -> [String] {
        events.map { "\($0.action.name):\($0.uuid ?? "-")@\($0.channel.channel)=\($0.occupancy)" }
    }

    @Test func firstHeartbeatJoinsLaterOnesOnlyExtend() {
        var tracker = PresenceTracker()
        let joined = tracker.heartbeat(subscribeKey: "k", uuid: "u1", channels: ["a", "b"], timeout: timeout, now: .zero)
        #expect(Set(actions(joined)) == ["join:u1@a=1", "join:u1@b=1"])
        let again = tracker.heartbeat(subscribeKey: "k", uuid: "u1", channels: ["a"], timeout: timeout, now: .seconds(5))
        #expect(again.isEmpty)
        #expect(tracker.channels(subscribeKey: "k", uuid: "u1") == ["a", "b"])
        #expect(tracker.occupants(subscribeKey: "k", channel: "a").map(\.uuid) == ["u1"])
    }

    /// A heartbeat says which channels it joined again right after the uuid left them
    /// explicitly (what a stale subscribe, read after its client's leave, does), and only those
    /// joins — when nothing extended them since — can be taken back. A first join, a uuid
    /// present before, or one heartbeating again after, stays.
    @Test func onlyARejoinNothingExtendedSinceIsWithdrawn() {
        var tracker = PresenceTracker()
        var rejoined: [String] = []
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "old", channels: ["a"], timeout: timeout, now: .zero, rejoined: &rejoined)
        #expect(rejoined.isEmpty, "a first join is no rejoin")
        _ = tracker.leave(subscribeKey: "k", uuid: "old", channels: ["b"], now: .zero)
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "old", channels: ["a", "b"], timeout: timeout, now: .seconds(1), rejoined: &rejoined)
        #expect(rejoined == ["b"], "present on `a` already; `b` left a second ago")
        let withdrawn = tracker.withdraw(subscribeKey: "k", uuid: "old", channels: rejoined, joinedUntil: .seconds(1) + timeout,
                                         now: .seconds(1))
        #expect(actions(withdrawn) == ["leave:old@b=0"])
        #expect(tracker.channels(subscribeKey: "k", uuid: "old") == ["a"])

        var fresh: [String] = []
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "new", channels: ["c"], timeout: timeout, now: .seconds(2))
        _ = tracker.leave(subscribeKey: "k", uuid: "new", channels: ["c"], now: .seconds(2))
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "new", channels: ["c"], timeout: timeout, now: .seconds(2), rejoined: &fresh)
        #expect(fresh == ["c"])
        // Its client heartbeats again before the withdrawal: that join stands.
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "new", channels: ["c"], timeout: timeout, now: .seconds(3))
        #expect(tracker.withdraw(subscribeKey: "k", uuid: "new", channels: fresh, joinedUntil: .seconds(2) + timeout, now: .seconds(3)).isEmpty)
        #expect(tracker.channels(subscribeKey: "k", uuid: "new") == ["c"])

        // A join long after the leave is no rejoin.
        var late: [String] = []
        _ = tracker.leave(subscribeKey: "k", uuid: "new", channels: ["c"], now: .seconds(4))
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "new", channels: ["c"], timeout: timeout,
                              now: .seconds(4) + PresenceTracker.recentLeaveWindow, rejoined: &late)
        #expect(late.isEmpty)
    }

    /// State set ahead of a join (a uuid not present) is kept, but counted with the memberships:
    /// a client setting state for fresh uuids cannot grow it without bound. A join turns it into
    /// the member's state, and the leave takes it away.
    @Test func stateAheadOfAJoinIsBoundedWithTheMemberships() {
        var tracker = PresenceTracker(maximumMemberships: 3)
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "m", channels: ["a"], timeout: timeout, now: .zero)
        for index in 0..<5 { _ = tracker.setState(subscribeKey: "k", uuid: "u\(index)", channels: ["a"], state: #"{"n":1}"#) }
        let kept = (0..<5).filter { tracker.state(subscribeKey: "k", uuid: "u\($0)", channel: "a") != nil }
        #expect(kept == [0, 1], "one member and two states ahead fill the three")
        #expect(tracker.refusedStates == 3)
        // A kept one joins: its state is the member's, and its place as state-ahead is freed...
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "u0", channels: ["a"], timeout: timeout, now: .zero)
        #expect(tracker.state(subscribeKey: "k", uuid: "u0", channel: "a") == #"{"n":1}"#)
        // ...and its leave takes the state with it.
        _ = tracker.leave(subscribeKey: "k", uuid: "u0", channels: ["a"], now: .seconds(1))
        #expect(tracker.state(subscribeKey: "k", uuid: "u0", channel: "a") == nil)
        _ = tracker.setState(subscribeKey: "k", uuid: "u4", channels: ["a"], state: #"{"n":1}"#)
        #expect(tracker.state(subscribeKey: "k", uuid: "u4", channel: "a") != nil, "room again")
    }

    @Test func membershipsAreCappedByConfigurationNotByClients() {
        var tracker = PresenceTracker(maximumMemberships: 3)
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "u1", channels: ["a", "b"], timeout: timeout, now: .zero)
        // Fresh uuids and channels beyond the cap are not recorded: no join, not present.
        let crowd = tracker.heartbeat(subscribeKey: "k", uuid: "u2", channels: ["c", "d", "e"], timeout: timeout, now: .zero)
        #expect(crowd.count == 1)
        #expect(crowd.allSatisfy { $0.action == .join && $0.uuid == "u2" && $0.occupancy == 1 })
        #expect(tracker.membershipCount == 3)
        #expect(tracker.refusedJoins == 2)
        #expect(tracker.occupiedChannels(subscribeKey: "k").count == 3)
        // Members already present keep heartbeating; room made by a leave is taken again.
        #expect(tracker.heartbeat(subscribeKey: "k", uuid: "u1", channels: ["a"], timeout: timeout, now: .seconds(1)).isEmpty)
        _ = tracker.leave(subscribeKey: "k", uuid: "u1", channels: ["b"], now: .seconds(2))
        #expect(actions(tracker.heartbeat(subscribeKey: "k", uuid: "u3", channels: ["z"], timeout: timeout, now: .seconds(3)))
                == ["join:u3@z=1"])
        #expect(tracker.membershipCount == 3)
    }

    @Test func aMassTimeoutIsHandedOutInSlices() {
        var tracker = PresenceTracker()
        for i in 0..<2_500 { _ = tracker.heartbeat(subscribeKey: "k", uuid: "u\(i)", channels: ["c\(i)"], timeout: timeout, now: .zero) }
        let slices = [tracker.tick(now: timeout, limit: 1_000), tracker.tick(now: timeout, limit: 1_000),
                      tracker.tick(now: timeout, limit: 1_000), tracker.tick(now: timeout, limit: 1_000)]
        #expect(slices.map(\.count) == [1_000, 1_000, 500, 0])
        #expect(Set(slices.joined().compactMap(\.uuid)).count == 2_500)
        #expect(tracker.membershipCount == 0)
    }

    @Test func timeoutFiresExactlyOnceAtTheDeadline() {
        var tracker = PresenceTracker()
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "u1", channels: ["a"], timeout: timeout, now: .zero)
        #expect(tracker.nextWakeUp == .seconds(20))
        #expect(tracker.tick(now: .milliseconds(19_999)).isEmpty)
        #expect(actions(tracker.tick(now: .seconds(20))) == ["timeout:u1@a=0"])
        #expect(tracker.tick(now: .seconds(40)).isEmpty)
        #expect(tracker.occupiedChannels(subscribeKey: "k").isEmpty)
        #expect(tracker.nextWakeUp == nil)
    }

    @Test func aDroppedConnectionThatReturnsWithinTheTimeoutDoesNotFlap() {
        var tracker = PresenceTracker()
        var all = tracker.heartbeat(subscribeKey: "k", uuid: "u1", channels: ["a"], timeout: timeout, now: .zero)
        // The long-poll drops at 5 s; the client comes back at 19 s.
        all += tracker.tick(now: .seconds(19))
        all += tracker.heartbeat(subscribeKey: "k", uuid: "u1", channels: ["a"], timeout: timeout, now: .seconds(19))
        all += tracker.tick(now: .seconds(38))
        #expect(actions(all) == ["join:u1@a=1"])
        // Then it stops for good: one timeout, 20 s after its last heartbeat.
        #expect(actions(tracker.tick(now: .seconds(39))) == ["timeout:u1@a=0"])
    }

    @Test func exactlyOneTimeoutAmongTenThousandPresentUUIDs() {
        var tracker = PresenceTracker()
        for i in 0..<10_000 {
            _ = tracker.heartbeat(subscribeKey: "k", uuid: "u\(i)", channels: ["c\(i % 1000)"], timeout: .seconds(300), now: .zero)
        }
        // Everyone but u42 heartbeats again at 100 s.
        for i in 0..<10_000 where i != 42 {
            _ = tracker.heartbeat(subscribeKey: "k", uuid: "u\(i)", channels: ["c\(i % 1000)"], timeout: .seconds(300), now: .seconds(100))
        }
        #expect(tracker.tick(now: .milliseconds(299_999)).isEmpty)
        let events = tracker.tick(now: .seconds(300))
        #expect(events.count == 1)
        #expect(events.first?.uuid == "u42")
        #expect(events.first?.action == .timeout)
        #expect(tracker.membershipCount == 9_999)
    }

    @Test func theEndOfALongPollExtendsPresenceButNeverRejoinsAfterALeave() {
        var tracker = PresenceTracker()
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "u1", channels: ["a"], timeout: timeout, now: .zero)
        tracker.refresh(subscribeKey: "k", uuid: "u1", channels: ["a"], timeout: timeout, now: .seconds(15))
        #expect(tracker.tick(now: .seconds(20)).isEmpty)  // extended to 35 s
        _ = tracker.leave(subscribeKey: "k", uuid: "u1", channels: ["a"], now: .seconds(21))
        tracker.refresh(subscribeKey: "k", uuid: "u1", channels: ["a"], timeout: timeout, now: .seconds(22))
        #expect(tracker.occupants(subscribeKey: "k", channel: "a").isEmpty)
        #expect(tracker.tick(now: .seconds(60)).isEmpty)
    }

    @Test func leaveIsImmediateAndCarriesState() {
        var tracker = PresenceTracker()
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "u1", channels: ["a"], timeout: timeout, states: ["a": #"{"mood":"ok"}"#], now: .zero)
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "u2", channels: ["a"], timeout: timeout, now: .zero)
        let left = tracker.leave(subscribeKey: "k", uuid: "u1", channels: ["a"], now: .seconds(1))
        #expect(actions(left) == ["leave:u1@a=1"])
        #expect(left.first?.state == #"{"mood":"ok"}"#)
        #expect(tracker.leave(subscribeKey: "k", uuid: "u1", channels: ["a"], now: .seconds(2)).isEmpty)
        // The left uuid's deadline no longer fires.
        #expect(actions(tracker.tick(now: .seconds(20))) == ["timeout:u2@a=0"])
    }

    @Test func stateChangesAreAnnouncedOnlyWhenTheStateChanges() {
        var tracker = PresenceTracker()
        let first = tracker.heartbeat(subscribeKey: "k", uuid: "u1", channels: ["a"], timeout: timeout, states: ["a": #"{"s":1}"#], now: .zero)
        #expect(actions(first) == ["join:u1@a=1", "state-change:u1@a=1"])
        #expect(tracker.setState(subscribeKey: "k", uuid: "u1", channels: ["a"], state: #"{"s":1}"#).isEmpty)
        let changed = tracker.setState(subscribeKey: "k", uuid: "u1", channels: ["a"], state: #"{"s":2}"#)
        #expect(actions(changed) == ["state-change:u1@a=1"])
        #expect(changed.first?.payload(timestamp: 7) == #"{"action":"state-change","uuid":"u1","timestamp":7,"occupancy":1,"data":{"s":2}}"#)
        #expect(tracker.state(subscribeKey: "k", uuid: "u1", channel: "a") == #"{"s":2}"#)
    }

    @Test func intervalModeAboveAnnounceMax() {
        var config = PresenceConfiguration()
        config.announceMax = 2
        config.interval = .seconds(10)
        config.maximumIntervalDelta = 3
        var tracker = PresenceTracker(defaultConfiguration: config)
        var events: [PresenceEvent] = []
        for i in 1...3 {
            events += tracker.heartbeat(subscribeKey: "k", uuid: "u\(i)", channels: ["big"], timeout: .seconds(300), now: .seconds(1))
        }
        // Two joins announced; the third crosses announce-max and goes into the first interval.
        #expect(actions(events) == ["join:u1@big=1", "join:u2@big=2"])
        _ = tracker.leave(subscribeKey: "k", uuid: "u1", channels: ["big"], now: .seconds(2))
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "u4", channels: ["big"], timeout: .seconds(300), now: .seconds(3))
        #expect(tracker.tick(now: .seconds(10)).isEmpty)
        let interval = tracker.tick(now: .seconds(11))
        #expect(interval.count == 1)
        #expect(interval.first?.action == .interval(join: ["u3", "u4"], leave: ["u1"], timeout: [], hereNowRefresh: false))
        #expect(interval.first?.occupancy == 3)
        #expect(interval.first?.payload(timestamp: 1).contains(#""join":["u3","u4"],"leave":["u1"],"here_now_refresh":false"#) == true)
        // Too many changes for one event: here_now_refresh instead of lists.
        for i in 5...8 {
            _ = tracker.heartbeat(subscribeKey: "k", uuid: "u\(i)", channels: ["big"], timeout: .seconds(300), now: .seconds(12))
        }
        let refresh = tracker.tick(now: .seconds(21))
        #expect(refresh.first?.action == .interval(join: ["u5", "u6", "u7", "u8"], leave: [], timeout: [], hereNowRefresh: true))
        #expect(refresh.first?.payload(timestamp: 1).contains("\"here_now_refresh\":true") == true)
        #expect(refresh.first?.payload(timestamp: 1).contains("\"join\"") == false)
    }

    @Test func tenThousandHeartbeatsOfOneUUIDKeepOneQueuedDeadline() {
        var tracker = PresenceTracker()
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "u1", channels: ["a"], timeout: timeout, now: .zero)
        for i in 1...10_000 {
            let now = Duration.milliseconds(i)
            if i.isMultiple(of: 2) {
                _ = tracker.heartbeat(subscribeKey: "k", uuid: "u1", channels: ["a"], timeout: timeout, now: now)
            } else {
                tracker.refresh(subscribeKey: "k", uuid: "u1", channels: ["a"], timeout: timeout, now: now)
            }
        }
        #expect(tracker.membershipCount == 1)
        #expect(tracker.pendingDeadlineCount == 1)
        // The one entry is still at the first deadline; reaching it requeues the true one (30 s).
        #expect(tracker.tick(now: .seconds(20)).isEmpty)
        #expect(tracker.pendingDeadlineCount == 1)
        #expect(tracker.nextWakeUp == .seconds(30))
        #expect(actions(tracker.tick(now: .seconds(30))) == ["timeout:u1@a=0"])
        #expect(tracker.pendingDeadlineCount == 0)
    }

    @Test func heartbeatsOfManyMembersKeepAtMostOneQueuedDeadlineEach() {
        var tracker = PresenceTracker()
        for round in 0..<20 {
            for i in 0..<500 {
                let now = Duration.seconds(round) + .milliseconds(i)
                _ = tracker.heartbeat(subscribeKey: "k", uuid: "u\(i)", channels: ["c\(i % 7)", "big"], timeout: .seconds(300), now: now)
                tracker.refresh(subscribeKey: "k", uuid: "u\(i)", channels: ["big"], timeout: .seconds(300), now: now)
            }
        }
        #expect(tracker.membershipCount == 1_000)
        #expect(tracker.pendingDeadlineCount <= tracker.membershipCount)
    }

    @Test func aLaterDeadlineTimesOutThenAndNotAtTheEarlierOne() {
        var tracker = PresenceTracker()
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "u1", channels: ["a"], timeout: .seconds(20), now: .zero)
        tracker.refresh(subscribeKey: "k", uuid: "u1", channels: ["a"], timeout: .seconds(60), now: .seconds(10))  // → 70 s
        #expect(tracker.nextWakeUp == .seconds(20))
        #expect(tracker.tick(now: .seconds(20)).isEmpty)
        #expect(tracker.nextWakeUp == .seconds(70))
        #expect(tracker.tick(now: .milliseconds(69_999)).isEmpty)
        #expect(tracker.occupants(subscribeKey: "k", channel: "a").map(\.uuid) == ["u1"])
        #expect(actions(tracker.tick(now: .seconds(70))) == ["timeout:u1@a=0"])
        #expect(tracker.tick(now: .seconds(200)).isEmpty)
        #expect(tracker.nextWakeUp == nil)
    }

    @Test func aLateTickStillTimesOutOnceAtTheTrueDeadline() {
        var tracker = PresenceTracker()
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "u1", channels: ["a"], timeout: .seconds(20), now: .zero)
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "u1", channels: ["a"], timeout: .seconds(20), now: .seconds(15))  // → 35 s
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "u2", channels: ["a"], timeout: .seconds(30), now: .zero)  // → 30 s
        // One tick long after both deadlines: both time out, in deadline order, once each.
        #expect(actions(tracker.tick(now: .seconds(100))) == ["timeout:u2@a=1", "timeout:u1@a=0"])
        #expect(tracker.tick(now: .seconds(200)).isEmpty)
        #expect(tracker.pendingDeadlineCount == 0)
    }

    @Test func aShorterTimeoutAfterALongerOneTimesOutAtTheShorterDeadline() {
        var tracker = PresenceTracker()
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "u1", channels: ["a"], timeout: .seconds(3600), now: .zero)
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "u1", channels: ["a"], timeout: .seconds(20), now: .seconds(10))
        #expect(tracker.nextWakeUp == .seconds(30))
        #expect(tracker.tick(now: .milliseconds(29_999)).isEmpty)
        #expect(actions(tracker.tick(now: .seconds(30))) == ["timeout:u1@a=0"])
        // The superseded hour-long entry comes due later and is skipped.
        #expect(tracker.tick(now: .seconds(3600)).isEmpty)
        #expect(tracker.pendingDeadlineCount == 0)
        #expect(tracker.nextWakeUp == nil)
    }

    @Test func leaveAndRejoinChurnDoesNotGrowTheDeadlineHeap() {
        var tracker = PresenceTracker()
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "stays", channels: ["a"], timeout: .seconds(300), now: .zero)
        var all: [PresenceEvent] = []
        for i in 0..<10_000 {
            let now = Duration.milliseconds(i)
            all += tracker.heartbeat(subscribeKey: "k", uuid: "churn", channels: ["a"], timeout: .seconds(300), now: now)
            all += tracker.leave(subscribeKey: "k", uuid: "churn", channels: ["a"], now: now)
        }
        #expect(all.count == 20_000)
        #expect(tracker.membershipCount == 1)
        #expect(tracker.pendingDeadlineCount < 2_000)
        // Deadlines that only ever move earlier leave stale entries behind; those are bounded too.
        for i in 0..<10_000 {
            _ = tracker.heartbeat(subscribeKey: "k", uuid: "stays", channels: ["a"], timeout: .seconds(300) - .milliseconds(2 * i),
                                  now: .milliseconds(i))
        }
        #expect(tracker.pendingDeadlineCount < 2_000)
        // The member that stayed still times out exactly once, at its last (earliest) deadline.
        let last = Duration.milliseconds(9_999) + .seconds(300) - .milliseconds(19_998)
        #expect(tracker.tick(now: last - .milliseconds(1)).isEmpty)
        #expect(actions(tracker.tick(now: last)) == ["timeout:stays@a=0"])
        #expect(tracker.tick(now: .seconds(400)).isEmpty)
        #expect(tracker.pendingDeadlineCount == 0)
    }

    @Test func timeoutsAreClampedToTheConfiguredRange() {
        let config = PresenceConfiguration()
        #expect(config.timeout(requestedSeconds: nil) == .seconds(300))
        #expect(config.timeout(requestedSeconds: 5) == .seconds(20))
        #expect(config.timeout(requestedSeconds: 60) == .seconds(60))
        #expect(config.timeout(requestedSeconds: 999_999) == .seconds(3600))
    }
}

@Suite struct ChannelGroupHubTests {
    @Test func groupWaitersWakeForMemberChannelsIncludingOnesAddedWhileWaiting() {
        let now = Timetoken(1_000_000_000)
        var hub = DeliveryHub(floor: .zero, now: now)
        let start = hub.visibleThrough
        hub.setGroup(subscribeKey: "k", group: "g", channels: ["a"])
        let spec = SubscriptionSpec(subscribeKey: "k", names: [], groups: ["g", "g-pnpres"])
        let waiter = hub.register(spec)
        hub.setGroup(subscribeKey: "k", group: "g", channels: ["a", "b"])
        let tt = hub.reserve(ChannelKey(subscribeKey: "k", channel: "b"), now: now)
        let woken = hub.commit(BufferedEvent(envelope: SubscribeEnvelope(timetoken: tt, subscribeKey: "k", channel: "b", payload: "1"),
                                             isStored: true), now: now)
        #expect(woken == [waiter])
        let presence = hub.reserve(ChannelKey(subscribeKey: "k", channel: "a-pnpres"), now: now)
        _ = hub.commit(BufferedEvent(envelope: SubscribeEnvelope(timetoken: presence, subscribeKey: "k", channel: "a-pnpres", payload: "{}"),
                                     isStored: false), now: now)
        let plan = hub.plan(spec, after: start, now: now)
        let matched = plan.bufferEvents.sorted { $0.event.timetoken < $1.event.timetoken }.map { "\($0.event.envelope.channel)|\($0.match ?? "-")" }
        #expect(matched == ["b|g", "a-pnpres|g-pnpres"])
        hub.setGroup(subscribeKey: "k", group: "g", channels: [])
        #expect(hub.channels(subscribeKey: "k", group: "g").isEmpty)
    }
}
