"""Presence (pubnub-wire §7, §8; docs/presence.md) through the real PubNub Python SDK, threaded
and asyncio: here-now / where-now / state round trips, and join, leave, timeout, state-change
and interval events received by a presence subscription (`with_presence()`). Tests marked with
the `sdk` fixture run once per flavour.

Short presence timeouts come from a keyset configuration whose minimum timeout is 2 s. Where a
client must stay present through its own long-polls, the server answers them after 1 s
(`--subscribe-timeout 1`), so every poll is a heartbeat well within the timeout."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from pubnub.enums import PNOperationType, PNReconnectionPolicy, PNStatusCategory

from helpers import (PresenceCollector, RawSubscriber, assert_json_response, get, heartbeat_raw, here_now_raw,
                     leave_raw, occupants_raw, publish, subscribe_raw, unique, where_now_raw, write_config)

pytestmark = pytest.mark.timeout(60)

SHORT_TIMEOUTS = {"presenceMinimumTimeoutSeconds": 2, "presenceIntervalSeconds": 2}


@pytest.fixture
def start_server(server_factory, tmp_path):
    """Starts a server whose demo keyset has `keyset_fields` (short presence timeouts by default)."""
    def start(subscribe_timeout: int = 20, **keyset_fields):
        config = write_config(str(tmp_path), **{**SHORT_TIMEOUTS, **keyset_fields})
        return server_factory.start(args=["--config", config, "--subscribe-timeout", str(subscribe_timeout)])
    return start


async def listening(pn, channels, presence=True) -> PresenceCollector:
    """Subscribes `pn` (with presence) and waits for Connected."""
    c = PresenceCollector()
    pn.add_listener(c)
    builder = pn.subscribe().channels(list(channels))
    if presence:
        builder = builder.with_presence()
    builder.execute()
    await c.async_wait_connected()
    return c


def events_of(collector: PresenceCollector, uuid: str, channel: str | None = None) -> list[tuple]:
    return [(e.event, e.occupancy) for e in collector.presence_snapshot(channel) if e.uuid == uuid]


def occupants(env) -> list[tuple]:
    """(channel, occupancy, [(uuid, state)] or None) of a here-now result, in result order."""
    return [(ch.channel_name, ch.occupancy,
             None if ch.occupants is None else [(o.uuid, o.state) for o in ch.occupants])
            for ch in env.result.channels]


def seconds(timetoken: int) -> float:
    return timetoken / 10_000_000


def assert_event_times(collector: PresenceCollector):
    """Every event's `timestamp` is the Unix second of its timetoken."""
    for e in collector.presence_snapshot():
        assert isinstance(e.timestamp, int) and isinstance(e.timetoken, int)
        assert e.timestamp == e.timetoken // 10_000_000, (e.event, e.timestamp, e.timetoken)


def assert_ack(env, operation):
    assert not env.status.is_error()
    assert env.status.status_code == 200
    assert env.status.category == PNStatusCategory.PNAcknowledgmentCategory
    assert env.status.operation == operation


# ----------------------------------------------------------------------------- here-now, where-now

@pytest.mark.asyncio
async def test_here_now_and_where_now(sdk, origin):
    a, b, c, empty = (unique(p) for p in ("a", "b", "c", "empty"))
    u1, u2, u3 = unique("u1"), unique("u2"), unique("u3")  # sorted: u1 < u2 < u3
    heartbeat_raw(origin, [a, b], u1, state={a: {"role": "host", "n": 1}})
    heartbeat_raw(origin, [b], u2)
    heartbeat_raw(origin, [c], u3, heartbeat=60)
    pn = sdk.make(origin)

    env = await sdk.call(pn.here_now().channels(a))
    assert_ack(env, PNOperationType.PNHereNowOperation)
    assert (env.result.total_channels, env.result.total_occupancy) == (1, 1)
    assert occupants(env) == [(a, 1, [(u1, None)])]

    env = await sdk.call(pn.here_now().channels([b, a]))
    assert (env.result.total_channels, env.result.total_occupancy) == (2, 3)
    assert occupants(env) == [(a, 1, [(u1, None)]), (b, 2, [(u1, None), (u2, None)])]

    env = await sdk.call(pn.here_now().channels([a, b]).include_uuids(False))
    assert (env.result.total_channels, env.result.total_occupancy) == (2, 3)
    assert occupants(env) == [(a, 1, None), (b, 2, None)]
    env = await sdk.call(pn.here_now().channels(b).include_uuids(False))
    assert (env.result.total_channels, env.result.total_occupancy) == (1, 2)
    assert occupants(env) == [(b, 2, [])]

    env = await sdk.call(pn.here_now().channels(a).include_state(True))
    assert occupants(env) == [(a, 1, [(u1, {"role": "host", "n": 1})])]
    env = await sdk.call(pn.here_now().channels([a, b]).include_state(True))
    assert occupants(env) == [(a, 1, [(u1, {"role": "host", "n": 1})]), (b, 2, [(u1, None), (u2, None)])]

    env = await sdk.call(pn.here_now().channels(empty))
    assert (env.result.total_channels, env.result.total_occupancy) == (1, 0)
    assert occupants(env) == [(empty, 0, [])]

    # Global here-now: every occupied channel of the keyset (this server is fresh).
    env = await sdk.call(pn.here_now())
    assert (env.result.total_channels, env.result.total_occupancy) == (3, 4)
    assert sorted(occupants(env)) == sorted([(a, 1, [(u1, None)]), (b, 2, [(u1, None), (u2, None)]),
                                             (c, 1, [(u3, None)])])

    env = await sdk.call(pn.where_now().uuid(u1))
    assert_ack(env, PNOperationType.PNWhereNowOperation)
    assert env.result.channels == [a, b]
    assert (await sdk.call(pn.where_now().uuid(u3))).result.channels == [c]
    assert (await sdk.call(pn.where_now().uuid(unique("nobody")))).result.channels == []
    # The SDK's own uuid by default: this client never subscribed.
    assert (await sdk.call(pn.where_now())).result.channels == []

    # Paging through the occupants (the SDK always sends limit=1000 unless told otherwise).
    env = await sdk.call(pn.here_now().channels(b).limit(1).offset(1))
    assert occupants(env) == [(b, 2, [(u2, None)])]

    # Names that need percent-encoding in paths and queries.
    odd_channel, odd_uuid = unique("room/1 ü"), unique("user/with space")
    heartbeat_raw(origin, [odd_channel], odd_uuid)
    assert occupants(await sdk.call(pn.here_now().channels(odd_channel))) == [(odd_channel, 1, [(odd_uuid, None)])]
    assert (await sdk.call(pn.where_now().uuid(odd_uuid))).result.channels == [odd_channel]
    leave_raw(origin, [odd_channel], odd_uuid)

    leave_raw(origin, [a], u1)
    env = await sdk.call(pn.here_now().channels([a, b]))
    assert (env.result.total_channels, env.result.total_occupancy) == (1, 2)
    assert occupants(env) == [(b, 2, [(u1, None), (u2, None)])]
    assert (await sdk.call(pn.where_now().uuid(u1))).result.channels == [b]


def test_here_now_raw_shapes(origin):
    """The exact bodies behind the SDK results (pubnub-wire §7.3, §7.4)."""
    a, b = unique("a"), unique("b")
    u1, u2 = unique("u1"), unique("u2")
    heartbeat_raw(origin, [a, b], u1, state={b: {"k": "v"}})
    heartbeat_raw(origin, [b], u2)
    assert here_now_raw(origin, a) == {"status": 200, "message": "OK", "service": "Presence", "uuids": [u1],
                                       "occupancy": 1}
    assert here_now_raw(origin, b, state=1) == {
        "status": 200, "message": "OK", "service": "Presence",
        "uuids": [{"uuid": u1, "state": {"k": "v"}}, {"uuid": u2}], "occupancy": 2}
    assert here_now_raw(origin, b, disable_uuids=1) == {"status": 200, "message": "OK", "service": "Presence",
                                                        "occupancy": 2}
    assert here_now_raw(origin, [a, b]) == {
        "status": 200, "message": "OK", "service": "Presence",
        "payload": {"channels": {a: {"uuids": [u1], "occupancy": 1}, b: {"uuids": [u1, u2], "occupancy": 2}},
                    "total_channels": 2, "total_occupancy": 3}}
    assert here_now_raw(origin, [a, unique("none")], disable_uuids=1) == {
        "status": 200, "message": "OK", "service": "Presence",
        "payload": {"channels": {a: {"occupancy": 1}}, "total_channels": 1, "total_occupancy": 1}}
    assert where_now_raw(origin, u1) == [a, b]


# -------------------------------------------------------------------------------------- state

@pytest.mark.asyncio
async def test_set_state_get_state_and_state_change(sdk, origin):
    c1, c2 = unique("s1"), unique("s2")
    listener = sdk.make(origin, uuid=unique("listener"))
    events = await listening(listener, [c1])
    actor = sdk.make(origin, uuid=unique("actor"), enable_presence_heartbeat=not sdk.threaded)
    actor_sub = await listening(actor, [c1, c2], presence=False)
    await events.async_wait_presence(lambda ev: events_of(events, actor.uuid) == [("join", 2)])

    state = {"mood": "busy", "n": 1, "tags": ["a", "b"], "nested": {"x": None}}
    env = await sdk.call(actor.set_state().channels([c1, c2]).state(state))
    assert_ack(env, PNOperationType.PNSetStateOperation)
    assert env.result.state == state
    await events.async_wait_presence(lambda ev: len(events_of(events, actor.uuid)) >= 2)
    change = events.presence_snapshot()[-1]
    assert (change.event, change.uuid, change.channel, change.subscription, change.occupancy, change.state) == \
        ("state-change", actor.uuid, c1, None, 2, state)

    env = await sdk.call(actor.get_state().channels([c1]))
    assert_ack(env, PNOperationType.PNGetState)
    assert env.result.channels == {c1: state}
    env = await sdk.call(actor.get_state().channels([c1, c2]))
    assert env.result.channels == {c1: state, c2: state}
    # Another uuid's state, asked by anyone: the listener has none.
    env = await sdk.call(actor.get_state().channels([c1]).uuid(listener.uuid))
    assert env.result.channels == {c1: {}}
    env = await sdk.call(actor.get_state().channels([c1, c2]).uuid(listener.uuid))
    assert env.result.channels == {}

    env = await sdk.call(listener.here_now().channels(c1).include_state(True))
    assert occupants(env) == [(c1, 2, sorted([(actor.uuid, state), (listener.uuid, None)],
                                             key=lambda o: o[0]))]

    # The actor's next requests carry the state (subscribe `state=`, heartbeat `state=`): the
    # same state is no change, so no second event. Publishing makes the actor poll again.
    publish(origin, c1, "poke")
    await actor_sub.async_wait_messages(1)
    await asyncio.sleep(0.5)
    env = await sdk.call(actor.set_state().channels([c1]).state(state))
    assert env.result.state == state
    await asyncio.sleep(0.3)
    assert events_of(events, actor.uuid) == [("join", 2), ("state-change", 2)]

    away = {"mood": "away"}
    await sdk.call(actor.set_state().channels([c1]).state(away))
    await events.async_wait_presence(lambda ev: len(events_of(events, actor.uuid)) >= 3)
    assert events.presence_snapshot()[-1].state == away
    env = await sdk.call(actor.get_state().channels([c1, c2]))
    assert env.result.channels == {c1: away, c2: state}

    # A leave carries the state the uuid had.
    actor.unsubscribe().channels([c1, c2]).execute()
    await events.async_wait_presence(lambda ev: len(events_of(events, actor.uuid)) >= 4)
    leave = events.presence_snapshot()[-1]
    assert (leave.event, leave.uuid, leave.occupancy, leave.state) == ("leave", actor.uuid, 1, away)
    # State is kept only while present.
    env = await sdk.call(listener.get_state().channels([c1, c2]).uuid(actor.uuid))
    assert env.result.channels == {}
    assert_event_times(events)


def test_set_state_errors(origin):
    ch = unique("s")
    r = get(origin, f"/v2/presence/sub-key/demo/channel/{ch}/uuid/u/data?uuid=u")
    assert assert_json_response(r, 400) == {"status": 400, "error": 1, "message": "No state specified.",
                                            "service": "Presence"}
    r = get(origin, f"/v2/presence/sub-key/demo/channel/{ch}/uuid/u/data?uuid=u&state=%5B1%2C2%5D")
    body = assert_json_response(r, 400)
    assert (body["status"], body["service"]) == (400, "Presence")


# ------------------------------------------------------------------------------- join and leave

@pytest.mark.asyncio
async def test_join_heartbeats_and_leave(sdk, start_server):
    """A client with a 3 s presence timeout (`set_presence_timeout(3)`, presence heartbeats on)
    joins, stays present by heartbeating well past its timeout, and leaves on unsubscribe."""
    srv = start_server()
    ch = unique("room")
    listener = sdk.make(srv.origin, uuid=unique("listener"))
    events = await listening(listener, [ch])
    other = sdk.make(srv.origin, uuid=unique("other"), enable_presence_heartbeat=True)
    other.config.set_presence_timeout(3)
    before = int(time.time())
    other_sub = await listening(other, [ch], presence=False)
    await events.async_wait_presence(lambda ev: events_of(events, other.uuid) == [("join", 2)])
    after = int(time.time())
    (join,) = [e for e in events.presence_snapshot() if e.uuid == other.uuid]
    assert (join.event, join.channel, join.subscription, join.occupancy, join.state) == ("join", ch, None, 2, None)
    assert before - 1 <= join.timestamp <= after + 1

    env = await sdk.call(listener.here_now().channels(ch))
    assert occupants(env) == [(ch, 2, sorted([(listener.uuid, None), (other.uuid, None)]))]
    assert (await sdk.call(listener.where_now().uuid(other.uuid))).result.channels == [ch]

    # 4 s > its 3 s timeout: heartbeats keep it present, no timeout, no second join.
    await asyncio.sleep(4.0)
    assert events_of(events, other.uuid) == [("join", 2)]
    assert sorted(occupants_raw(srv.origin, ch)) == sorted([listener.uuid, other.uuid])
    assert [s for s in other_sub.statuses if s.is_error()] == []

    other.unsubscribe().channels([ch]).execute()
    await events.async_wait_presence(lambda ev: len(events_of(events, other.uuid)) >= 2)
    (_, leave) = [e for e in events.presence_snapshot() if e.uuid == other.uuid]
    assert (leave.event, leave.channel, leave.occupancy) == ("leave", ch, 1)
    assert leave.timetoken > join.timetoken
    assert occupants_raw(srv.origin, ch) == [listener.uuid]
    assert (await sdk.call(listener.where_now().uuid(other.uuid))).result.channels == []
    await asyncio.sleep(0.5)  # nothing else follows
    assert events_of(events, other.uuid) == [("join", 2), ("leave", 1)]
    assert_event_times(events)


# ------------------------------------------------------------------------------------- timeouts

@pytest.mark.asyncio
async def test_silent_client_times_out_exactly_once(sdk, start_server):
    """A client subscribed with `heartbeat=3` whose connection dies (no leave) times out on
    each of its channels exactly once, 3 s after its last request."""
    srv = start_server(subscribe_timeout=1)
    ch1, ch2 = sorted([unique("room"), unique("room")])
    listener = sdk.make(srv.origin, uuid=unique("listener"))
    events = await listening(listener, [ch1, ch2])
    raw = await asyncio.to_thread(RawSubscriber(srv.origin, unique("phone"), [ch1, ch2], heartbeat=3).start)
    try:
        for ch in (ch1, ch2):
            await events.async_wait_presence(lambda ev: events_of(events, raw.uuid, ch) == [("join", 2)])
        await asyncio.sleep(0.5)
        env = await sdk.call(listener.here_now().channels([ch1, ch2]))
        both = sorted([(listener.uuid, None), (raw.uuid, None)])
        assert occupants(env) == [(ch1, 2, both), (ch2, 2, both)]
    finally:
        last = await asyncio.to_thread(raw.drop)  # the long-poll dies; no leave is sent
    await events.async_wait_presence(lambda ev: len(events_of(events, raw.uuid)) >= 4, timeout=3 + 3)
    timeouts = [e for e in events.presence_snapshot() if e.uuid == raw.uuid and e.event == "timeout"]
    assert sorted((e.channel, e.occupancy, e.state) for e in timeouts) == [(ch1, 1, None), (ch2, 1, None)]
    for timeout in timeouts:
        # At the deadline, last heartbeat + 3 s: on the server's clock (the event's timetoken)
        # and as received by the listener.
        assert last + 3 - 0.1 <= seconds(timeout.timetoken) <= last + 3 + 1, seconds(timeout.timetoken) - last
        assert last + 3 - 0.1 <= timeout.received_at <= last + 3 + 2, timeout.received_at - last
    await asyncio.sleep(1.2)
    for ch in (ch1, ch2):
        assert events_of(events, raw.uuid, ch) == [("join", 2), ("timeout", 1)]
    assert_event_times(events)
    env = await sdk.call(listener.here_now().channels([ch1, ch2]))
    assert occupants(env) == [(ch1, 1, [(listener.uuid, None)]), (ch2, 1, [(listener.uuid, None)])]
    assert (await sdk.call(listener.where_now().uuid(raw.uuid))).result.channels == []


@pytest.mark.asyncio
async def test_reconnecting_within_timeout_is_not_announced(sdk, start_server):
    """Calm presence: a client whose long-poll drops and comes back within its presence timeout
    (continuing with its cursor, or with a new handshake) causes no leave, no timeout and no
    second join."""
    srv = start_server(subscribe_timeout=1)
    ch = unique("room")
    listener = sdk.make(srv.origin, uuid=unique("listener"))
    events = await listening(listener, [ch])
    raw = await asyncio.to_thread(RawSubscriber(srv.origin, unique("phone"), [ch], heartbeat=3).start)
    await events.async_wait_presence(lambda ev: events_of(events, raw.uuid) == [("join", 2)])
    await asyncio.sleep(0.7)
    last = await asyncio.to_thread(raw.drop)
    await asyncio.sleep(max(0.0, last + 1.6 - time.time()))     # back after 1.6 s of its 3 s
    await asyncio.to_thread(raw.resume)                        # same cursor
    await asyncio.sleep(0.7)
    last = await asyncio.to_thread(raw.drop)
    await asyncio.sleep(max(0.0, last + 2.0 - time.time()))     # back after 2.0 s of its 3 s
    await asyncio.to_thread(raw.resume, True)                  # a new handshake
    await asyncio.sleep(max(0.0, last + 3 + 1.2 - time.time()))  # past both would-be deadlines
    try:
        assert events_of(events, raw.uuid) == [("join", 2)]
        assert sorted(occupants_raw(srv.origin, ch)) == sorted([listener.uuid, raw.uuid])
        assert raw.requests >= 5
    finally:
        await asyncio.to_thread(raw.drop)
    leave_raw(srv.origin, [ch], raw.uuid)
    await events.async_wait_presence(lambda ev: len(events_of(events, raw.uuid)) >= 2)
    await asyncio.sleep(0.3)
    assert events_of(events, raw.uuid) == [("join", 2), ("leave", 1)]
    assert_event_times(events)


# --------------------------------------------------------------------------------- interval mode

@pytest.mark.asyncio
async def test_interval_mode(sdk, start_server):
    """Above announce-max (2) the channel announces one `interval` event per 2 s with the
    joins, leaves and timeouts since the last one; at or below it, individual events again."""
    srv = start_server(presenceAnnounceMax=2)
    ch = unique("crowd")
    listener = sdk.make(srv.origin, uuid="listener-" + unique("l"))
    events = await listening(listener, [ch])
    watcher = await asyncio.to_thread(RawSubscriber(srv.origin, "watcher", [f"{ch}-pnpres"]).start)
    u1, u2, u3, u4, u5 = (f"u{i}-{unique('x')}" for i in range(1, 6))

    def intervals():
        return [e for e in events.presence_snapshot() if e.event == "interval"]

    async def next_interval(n):
        await events.async_wait_presence(lambda ev: len(intervals()) >= n, timeout=5,
                                         what=f"interval event #{n}")
        return intervals()[n - 1]

    try:
        heartbeat_raw(srv.origin, [ch], u1)  # occupancy 2 = announce-max: still individual
        await events.async_wait_presence(lambda ev: events_of(events, u1) == [("join", 2)])
        heartbeat_raw(srv.origin, [ch], u2)  # occupancy 3: interval mode from now on
        heartbeat_raw(srv.origin, [ch], u3, heartbeat=3)
        first = await next_interval(1)
        # Right after a boundary: u1 leaves, u4 joins; u3 times out 3 s after its heartbeat,
        # between this boundary and the next.
        leave_raw(srv.origin, [ch], u1)
        heartbeat_raw(srv.origin, [ch], u4)
        second = await next_interval(2)
        leave_raw(srv.origin, [ch], u2)
        leave_raw(srv.origin, [ch], u4)
        third = await next_interval(3)
        # Back at occupancy 1: individual events again, and no more interval events.
        heartbeat_raw(srv.origin, [ch], u5)
        await events.async_wait_presence(lambda ev: events_of(events, u5) == [("join", 2)])
        await asyncio.sleep(2.5)
    finally:
        await asyncio.to_thread(watcher.drop)

    def shape(e):
        return (e.event, e.uuid, e.occupancy, e.join, e.leave, e.timeout)
    assert [shape(e) for e in events.presence_snapshot()] == [
        ("join", u1, 2, None, None, None),
        ("interval", None, 4, [u2, u3], None, None),
        ("interval", None, 3, [u4], [u1], [u3]),
        ("interval", None, 1, None, [u2, u4], None),
        ("join", u5, 2, None, None, None),
    ]
    # One interval (2 s) apart on the server's clock.
    assert 1.95 <= seconds(second.timetoken - first.timetoken) <= 3
    assert 1.95 <= seconds(third.timetoken - second.timetoken) <= 3
    assert_event_times(events)
    # On the wire, interval events carry `here_now_refresh: false` and no uuid.
    payloads = [e["d"] for e in watcher.envelopes]
    assert [{k: v for k, v in d.items() if k != "timestamp"} for d in payloads] == [
        {"action": "join", "uuid": u1, "occupancy": 2},
        {"action": "interval", "occupancy": 4, "join": [u2, u3], "here_now_refresh": False},
        {"action": "interval", "occupancy": 3, "join": [u4], "leave": [u1], "timeout": [u3],
         "here_now_refresh": False},
        {"action": "interval", "occupancy": 1, "leave": [u2, u4], "here_now_refresh": False},
        {"action": "join", "uuid": u5, "occupancy": 2},
    ]
    assert all(e["c"] == f"{ch}-pnpres" and e["b"] == f"{ch}-pnpres" and "i" not in e for e in watcher.envelopes)


def test_interval_here_now_refresh(start_server):
    """More than 100 changes within one interval: the lists are left out and
    `here_now_refresh: true` tells clients to ask here-now instead."""
    from concurrent.futures import ThreadPoolExecutor
    srv = start_server(presenceAnnounceMax=2)
    ch = unique("stadium")
    watcher = RawSubscriber(srv.origin, "watcher", [f"{ch}-pnpres"]).start()
    try:
        heartbeat_raw(srv.origin, [ch], "fan-a")
        heartbeat_raw(srv.origin, [ch], "fan-b")
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: heartbeat_raw(srv.origin, [ch], f"fan-{i:03d}"), range(101)))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(watcher.envelopes) < 3:
            time.sleep(0.05)
    finally:
        watcher.drop()
    events = [{k: v for k, v in e["d"].items() if k != "timestamp"} for e in watcher.envelopes]
    assert events[:3] == [
        {"action": "join", "uuid": "fan-a", "occupancy": 1},
        {"action": "join", "uuid": "fan-b", "occupancy": 2},
        {"action": "interval", "occupancy": 103, "here_now_refresh": True},
    ], events
    # A channel in interval mode announces its occupancy every interval, changes or not: on a
    # loaded machine the next interval can arrive before the watcher is dropped.
    assert all(e == {"action": "interval", "occupancy": 103, "here_now_refresh": False} for e in events[3:]), events
    assert here_now_raw(srv.origin, ch, disable_uuids=1)["occupancy"] == 103


# --------------------------------------------------------------------------------------- restart

@pytest.mark.asyncio
async def test_restart_keeps_presence_and_times_out_silent_occupants_once(sdk, start_server):
    srv = start_server()
    ch = unique("room")
    # The listener only subscribes to the presence channel, so it is never an occupant itself.
    listener = sdk.make(srv.origin, uuid=unique("listener"), reconnect_policy=PNReconnectionPolicy.LINEAR,
                        reconnection_interval=0.5, maximum_reconnection_retries=-1)
    events = await listening(listener, [f"{ch}-pnpres"], presence=False)
    u1, u2 = sorted([unique("u1"), unique("u2")])
    heartbeat_raw(srv.origin, [ch], u1, heartbeat=3)
    heartbeat_raw(srv.origin, [ch], u2, heartbeat=3)
    await events.async_wait_presence(lambda ev: len(ev) >= 2)
    assert events.presence_tuples() == [("join", u1, 1), ("join", u2, 2)]
    assert occupants_raw(srv.origin, ch) == [u1, u2]

    await asyncio.to_thread(srv.restart)

    # Both are still present (docs/presence.md, restarts): nobody vanishes silently.
    assert occupants_raw(srv.origin, ch) == [u1, u2]
    assert where_now_raw(srv.origin, u2) == [ch]
    checker = sdk.make(srv.origin)
    env = await sdk.call(checker.here_now().channels(ch))
    assert [(c.channel_name, c.occupancy) for c in env.result.channels] == [(ch, 2)]

    # u1 heartbeats again within its timeout and stays, silently (no second join); u2 never does
    # and gets exactly one timeout, 3 s after the restart.
    heartbeat_raw(srv.origin, [ch], u1, heartbeat=20)
    await events.async_wait_presence(lambda ev: len(ev) >= 3, timeout=20)
    await asyncio.sleep(0.5)
    after = events.presence_snapshot()[2:]
    # (The asyncio event engine may emit its reconnect page twice — an SDK 10.8.0 bug, see
    # test_catch_up.py — so repeated deliveries of the same event are tolerated.)
    assert len({e.timetoken for e in after}) == 1
    assert {(e.event, e.uuid, e.occupancy) for e in after} == {("timeout", u2, 1)}
    assert occupants_raw(srv.origin, ch) == [u1]
    assert where_now_raw(srv.origin, u2) == []
    assert_event_times(events)


# ---------------------------------------------------------------------------------- ghost joins

def test_long_poll_ending_after_leave_does_not_rejoin(start_server):
    """The end of a long-poll extends presence where the uuid still is, but a poll that began
    before the uuid's /leave must not re-join it when it is answered (regression: it did, and
    the uuid stayed present for another full timeout)."""
    srv = start_server(subscribe_timeout=2)
    ch = unique("room")
    watcher = RawSubscriber(srv.origin, "watcher", [f"{ch}-pnpres"]).start()
    uuid = unique("leaver")
    try:
        cursor = subscribe_raw(srv.origin, ch, 0, uuid=uuid).json()["t"]["t"]
        done = {}
        poll = threading.Thread(target=lambda: done.setdefault(
            "r", subscribe_raw(srv.origin, ch, cursor, uuid=uuid, timeout=10)))
        poll.start()
        time.sleep(0.3)
        leave_raw(srv.origin, [ch], uuid)
        assert occupants_raw(srv.origin, ch) == []
        poll.join(5)
        assert done["r"].status == 200 and done["r"].json()["m"] == []
        time.sleep(0.5)
        actions = [e["d"]["action"] for e in watcher.envelopes]
        assert (actions, occupants_raw(srv.origin, ch)) == (["join", "leave"], [])
    finally:
        watcher.drop()


@pytest.mark.asyncio
async def test_unsubscribe_leaves_for_good(sdk, start_server):
    """After an SDK unsubscribes (and sends its leave) the uuid stays gone, also once the
    long-poll it had open at that moment is answered: the threaded client abandons that
    request without closing its connection, so the server answers it after the leave."""
    srv = start_server(subscribe_timeout=2)
    ch = unique("room")
    listener = sdk.make(srv.origin, uuid=unique("listener"))
    events = await listening(listener, [f"{ch}-pnpres"], presence=False)
    other = sdk.make(srv.origin, uuid=unique("other"), enable_presence_heartbeat=not sdk.threaded)
    await listening(other, [ch], presence=False)
    await asyncio.sleep(0.3)  # its long-poll is waiting
    other.unsubscribe().channels([ch]).execute()
    await events.async_wait_presence(lambda ev: len(ev) >= 2)
    await asyncio.sleep(2.5)  # the server answers the abandoned long-poll meanwhile
    assert (events.presence_tuples(), occupants_raw(srv.origin, ch)) == \
        ([("join", other.uuid, 1), ("leave", other.uuid, 0)], [])
