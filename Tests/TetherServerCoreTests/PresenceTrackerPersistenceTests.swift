import Testing
import TetherProtocol
import TetherServerCore

/// The tracker's side of presence surviving a restart: which memberships it asks the shell to
/// store, and how stored ones come back.
@Suite struct PresenceTrackerPersistenceTests {
    let timeout = Duration.seconds(20)

    private func actions(_ events: [PresenceEvent]) -> [String] {
        events.map { "\($0.action.name):\($0.uuid ?? "-")@\($0.channel.channel)=\($0.occupancy)" }
    }

    private func describe(_ changes: [PresenceRecordChange]) -> Set<String> {
        Set(changes.map { change in
            switch change {
            case .save(let r): "save \(r.uuid)@\(r.channel) \(r.timeout) \(r.state ?? "-")"
            case .remove(_, let channel, let uuid): "remove \(uuid)@\(channel)"
            }
        })
    }

    @Test func onlyJoinsLeavesTimeoutsAndNewTimeoutsOrStatesNeedSaving() {
        var tracker = PresenceTracker()
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "u1", channels: ["a", "b"], timeout: timeout, now: .zero)
        #expect(describe(tracker.takeUnsavedChanges()) == ["save u1@a 20.0 seconds -", "save u1@b 20.0 seconds -"])
        #expect(!tracker.hasUnsavedChanges)

        // A heartbeat that only moves the deadline, and the end of a long-poll, store nothing.
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "u1", channels: ["a"], timeout: timeout, now: .seconds(5))
        tracker.refresh(subscribeKey: "k", uuid: "u1", channels: ["a"], timeout: timeout, now: .seconds(6))
        #expect(!tracker.hasUnsavedChanges)

        // A new timeout or state does.
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "u1", channels: ["a"], timeout: .seconds(60), now: .seconds(7))
        _ = tracker.setState(subscribeKey: "k", uuid: "u1", channels: ["b"], state: #"{"s":1}"#)
        #expect(describe(tracker.takeUnsavedChanges()) == ["save u1@a 60.0 seconds -", #"save u1@b 20.0 seconds {"s":1}"#])

        // A leave and a timeout remove; a join and leave between two saves is one removal.
        _ = tracker.leave(subscribeKey: "k", uuid: "u1", channels: ["a"], now: .seconds(8))
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "u2", channels: ["c"], timeout: timeout, now: .seconds(8))
        _ = tracker.leave(subscribeKey: "k", uuid: "u2", channels: ["c"], now: .seconds(9))
        #expect(actions(tracker.tick(now: .seconds(27))) == ["timeout:u1@b=0"])
        #expect(describe(tracker.takeUnsavedChanges()) == ["remove u1@a", "remove u1@b", "remove u2@c"])
    }

    @Test func aFailedSaveIsTakenAgainAsTheMembershipIsThen() {
        var tracker = PresenceTracker()
        _ = tracker.heartbeat(subscribeKey: "k", uuid: "u1", channels: ["a"], timeout: timeout, now: .zero)
        let failed = tracker.takeUnsavedChanges()
        _ = tracker.leave(subscribeKey: "k", uuid: "u1", channels: ["a"], now: .seconds(1))
        _ = tracker.takeUnsavedChanges()
        tracker.markUnsaved(failed)
        #expect(describe(tracker.takeUnsavedChanges()) == ["remove u1@a"])
    }

    @Test func restoredMembersStaySilentlyAndTimeOutOnceAtRestartPlusTimeout() {
        var tracker = PresenceTracker()
        tracker.restore([
            PresenceRecord(subscribeKey: "k", channel: "a", uuid: "quiet", timeout: timeout, state: nil),
            PresenceRecord(subscribeKey: "k", channel: "a", uuid: "back", timeout: timeout, state: #"{"s":1}"#),
        ], now: .seconds(100))
        #expect(!tracker.hasUnsavedChanges)
        #expect(tracker.occupants(subscribeKey: "k", channel: "a").map(\.uuid) == ["back", "quiet"])
        #expect(tracker.state(subscribeKey: "k", uuid: "back", channel: "a") == #"{"s":1}"#)
        #expect(tracker.channels(subscribeKey: "k", uuid: "quiet") == ["a"])
        #expect(tracker.nextWakeUp == .seconds(120))

        // The one that comes back heartbeats silently; the other times out at 120 s, once.
        #expect(tracker.heartbeat(subscribeKey: "k", uuid: "back", channels: ["a"], timeout: timeout, now: .seconds(110)).isEmpty)
        #expect(tracker.tick(now: .milliseconds(119_999)).isEmpty)
        #expect(actions(tracker.tick(now: .seconds(120))) == ["timeout:quiet@a=1"])
        #expect(tracker.tick(now: .milliseconds(129_999)).isEmpty)
        #expect(actions(tracker.tick(now: .seconds(130))) == ["timeout:back@a=0"])
        #expect(tracker.tick(now: .seconds(500)).isEmpty)
    }

    @Test func restoreClampsToTheCurrentTimeoutRangeAndResumesIntervalMode() {
        var config = PresenceConfiguration()
        config.announceMax = 2
        config.minimumTimeout = .seconds(30)
        var tracker = PresenceTracker(defaultConfiguration: config)
        tracker.restore((1...3).map { PresenceRecord(subscribeKey: "k", channel: "a", uuid: "u\($0)", timeout: timeout, state: nil) },
                        now: .zero)
        // The minimum went up since they were stored: they keep 30 s, and the new value is saved.
        #expect(describe(tracker.takeUnsavedChanges()).count == 3)
        #expect(tracker.occupancy(subscribeKey: "k", channel: "a") == 3)
        // Three members above announce-max: the channel is in interval mode, as before the restart.
        #expect(tracker.nextWakeUp == config.interval)
        let interval = tracker.tick(now: config.interval)
        #expect(actions(interval) == ["interval:-@a=3"])
        // At 30 s all three time out, reported in the next interval event; then it is quiet.
        let timedOut = tracker.tick(now: .seconds(30))
        #expect(actions(timedOut) == ["interval:-@a=0"])
        if case .interval(_, _, let timeouts, _)? = timedOut.first?.action {
            #expect(timeouts.sorted() == ["u1", "u2", "u3"])
        } else {
            Issue.record("expected an interval event")
        }
        #expect(tracker.tick(now: .seconds(100)).isEmpty)
    }
}
