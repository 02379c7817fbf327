"""Channel groups (pubnub-wire §16) through the real PubNub Python SDK, threaded and asyncio:
management round trips, group subscribe, group presence, live membership changes, durability
and errors. Every SDK test runs once per flavour (the `sdk` fixture)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from pubnub.enums import PNOperationType, PNStatusCategory

from helpers import (PresenceCollector, assert_json_response, get, group_channels_raw, group_list_raw, group_path,
                     group_update_raw, heartbeat_raw, leave_raw, publish, q, server_time, subscribe_raw, unique)

pytestmark = pytest.mark.timeout(60)

REGISTRY_ERROR = {"status": 400, "message": "Reserved character in input parameters.",
                  "service": "channel-registry", "error": True}


def names(prefix: str, n: int) -> list[str]:
    """`n` fresh names that sort in the order they are listed."""
    base = unique(prefix)
    return [f"{base}-{i}" for i in range(n)]


def assert_ack(env, operation):
    assert not env.status.is_error()
    assert env.status.status_code == 200
    assert env.status.category == PNStatusCategory.PNAcknowledgmentCategory
    assert env.status.operation == operation


async def channels_of(sdk, pn, group) -> list[str]:
    env = await sdk.call(pn.list_channels_in_channel_group().channel_group(group))
    assert_ack(env, PNOperationType.PNChannelsForGroupOperation)
    return env.result.channels


async def subscribed(pn, channels=(), groups=(), presence=False) -> PresenceCollector:
    c = PresenceCollector()
    pn.add_listener(c)
    builder = pn.subscribe()
    if channels:
        builder = builder.channels(list(channels))
    if groups:
        builder = builder.channel_groups(list(groups))
    if presence:
        builder = builder.with_presence()
    builder.execute()
    await c.async_wait_connected()
    return c


# ------------------------------------------------------------------------------------ management

@pytest.mark.asyncio
async def test_add_list_remove_delete_round_trip(sdk, origin):
    pn = sdk.make(origin)
    g1, g2 = names("grp", 2)
    c0, c1, c2, c3 = names("gch", 4)
    assert group_list_raw(origin) == []

    env = await sdk.call(pn.add_channel_to_channel_group().channels([c2, c0]).channel_group(g1))
    assert_ack(env, PNOperationType.PNAddChannelsToGroupOperation)
    assert await channels_of(sdk, pn, g1) == [c0, c2]
    # Adding a member again changes nothing.
    await sdk.call(pn.add_channel_to_channel_group().channels(c0).channel_group(g1))
    assert await channels_of(sdk, pn, g1) == [c0, c2]

    await sdk.call(pn.add_channel_to_channel_group().channels([c1, c3]).channel_group(g1))
    env = await sdk.call(pn.remove_channel_from_channel_group().channels([c0, c3]).channel_group(g1))
    assert_ack(env, PNOperationType.PNRemoveChannelsFromGroupOperation)
    assert await channels_of(sdk, pn, g1) == [c1, c2]

    await sdk.call(pn.add_channel_to_channel_group().channels([c3]).channel_group(g2))
    # The Python SDK has no "list groups" call; JS and Swift use this request.
    assert group_list_raw(origin) == [g1, g2]
    assert group_channels_raw(origin, g1) == [c1, c2]

    env = await sdk.call(pn.remove_channel_group().channel_group(g1))
    assert_ack(env, PNOperationType.PNRemoveGroupOperation)
    assert await channels_of(sdk, pn, g1) == []
    assert group_list_raw(origin) == [g2]

    # A group whose last channel is removed no longer exists.
    await sdk.call(pn.remove_channel_from_channel_group().channels([c3]).channel_group(g2))
    assert await channels_of(sdk, pn, g2) == []
    assert group_list_raw(origin) == []

    # Unknown groups: empty list, and removing from / deleting them succeeds.
    unknown = unique("nogroup")
    assert await channels_of(sdk, pn, unknown) == []
    await sdk.call(pn.remove_channel_from_channel_group().channels([c0]).channel_group(unknown))
    await sdk.call(pn.remove_channel_group().channel_group(unknown))
    assert group_list_raw(origin) == []


@pytest.mark.asyncio
async def test_invalid_names_are_400_errors(sdk, origin):
    pn = sdk.make(origin)
    good = unique("grp")
    ok = unique("gch")
    cases = [
        (pn.add_channel_to_channel_group().channels([ok]).channel_group("bad*group"),
         PNOperationType.PNAddChannelsToGroupOperation),
        (pn.add_channel_to_channel_group().channels([ok, "bad*channel"]).channel_group(good),
         PNOperationType.PNAddChannelsToGroupOperation),
        (pn.add_channel_to_channel_group().channels([f"{ok}-pnpres"]).channel_group(good),
         PNOperationType.PNAddChannelsToGroupOperation),
        (pn.add_channel_to_channel_group().channels([ok]).channel_group("g" * 93),
         PNOperationType.PNAddChannelsToGroupOperation),
        (pn.remove_channel_from_channel_group().channels(["x*"]).channel_group(good),
         PNOperationType.PNRemoveChannelsFromGroupOperation),
        (pn.list_channels_in_channel_group().channel_group("bad*group"), PNOperationType.PNChannelsForGroupOperation),
        (pn.remove_channel_group().channel_group("bad\x01group"), PNOperationType.PNRemoveGroupOperation),
    ]
    for builder, operation in cases:
        err = await sdk.call_error(builder)
        assert (err.status_code, err.category, err.operation, err.body) == \
            (400, PNStatusCategory.PNBadRequestCategory, operation, REGISTRY_ERROR), err
    # A rejected request changes nothing, not even the valid part of it.
    assert group_list_raw(origin) == []
    assert await channels_of(sdk, pn, good) == []


def test_raw_group_requests(origin):
    """What the SDKs do not show: the exact bodies, list-groups, and unknown paths."""
    g = unique("grp")
    c = unique("gch")
    group_update_raw(origin, g, add=[c])
    body = assert_json_response(get(origin, group_path(g) + "?uuid=u"), 200)
    assert body == {"status": 200, "payload": {"channels": [c], "group": g}, "service": "channel-registry",
                    "error": False}
    body = assert_json_response(get(origin, group_path() + "?uuid=u"), 200)
    assert body == {"status": 200, "payload": {"namespace": "", "groups": [g]}, "service": "channel-registry",
                    "error": False}
    body = assert_json_response(get(origin, group_path(g, remove=True) + "?uuid=u"), 200)
    assert body == {"status": 200, "message": "OK", "service": "channel-registry", "error": False}
    r = get(origin, f"/v1/channel-registration/sub-key/nope/channel-group/{q(g)}?uuid=u")
    assert assert_json_response(r, 400)["message"] == "Invalid Subscribe Key"
    r = get(origin, group_path(g) + "/extra/segment?uuid=u")
    assert assert_json_response(r, 404)["service"] == "channel-registry"


# ------------------------------------------------------------------------------------- subscribe

@pytest.mark.asyncio
async def test_group_subscribe_delivers_member_channels(sdk, origin):
    g1, g2 = names("grp", 2)
    a, b, c, direct, outside = names("gch", 5)
    admin = sdk.make(origin)
    await sdk.call(admin.add_channel_to_channel_group().channels([a, b]).channel_group(g1))
    await sdk.call(admin.add_channel_to_channel_group().channels([c]).channel_group(g2))
    receiver = sdk.make(origin)
    sub = await subscribed(receiver, channels=[direct], groups=[g1, g2])
    sender = sdk.make(origin)
    sent = []
    for ch in (a, outside, b, direct, c):
        env = await sdk.call(sender.publish().channel(ch).message({"on": ch}))
        sent.append((ch, env.result.timetoken))
    got = await sub.async_wait_messages(4)
    await asyncio.sleep(0.3)
    got = sub.snapshot()
    expected_subscription = {a: g1, b: g1, c: g2, direct: None}
    assert [(m.message, m.channel, m.subscription, m.timetoken, m.publisher) for m in got] == [
        ({"on": ch}, ch, expected_subscription[ch], tt, sender.uuid) for ch, tt in sent if ch != outside]
    assert sub.count_category(PNStatusCategory.PNConnectedCategory) == 1


@pytest.mark.asyncio
async def test_channel_added_while_subscribed_is_delivered(sdk, origin):
    g = unique("grp")
    a, b = names("gch", 2)
    admin = sdk.make(origin)
    await sdk.call(admin.add_channel_to_channel_group().channels([a]).channel_group(g))
    receiver = sdk.make(origin)
    sub = await subscribed(receiver, groups=[g])
    ta = publish(origin, a, "a1")
    await sub.async_wait_messages(1)
    # The receiver is now waiting in a long-poll for [g] = {a}; b joins the group meanwhile.
    await sdk.call(admin.add_channel_to_channel_group().channels([b]).channel_group(g))
    tb = publish(origin, b, "b1")
    await sub.async_wait_messages(2)
    # Removed members stop being delivered.
    await sdk.call(admin.remove_channel_from_channel_group().channels([a]).channel_group(g))
    publish(origin, a, "a2 (not a member any more)")
    tb2 = publish(origin, b, "b2")
    await sub.async_wait_messages(3)
    await asyncio.sleep(0.3)
    assert [(m.message, m.channel, m.subscription, m.timetoken) for m in sub.snapshot()] == [
        ("a1", a, g, ta), ("b1", b, g, tb), ("b2", b, g, tb2)]
    assert sub.count_category(PNStatusCategory.PNConnectedCategory) == 1


def test_channel_added_reaches_the_waiting_long_poll(origin):
    """The same at the wire: the long-poll that is already waiting is answered with the new
    member's message; no new request is needed."""
    g = unique("grp")
    a, b = names("gch", 2)
    group_update_raw(origin, g, add=[a])
    hs = subscribe_raw(origin, ",", 0, **{"channel-group": g})
    assert hs.status == 200, hs
    cursor = hs.json()["t"]["t"]
    result = {}

    def wait():
        result["r"] = subscribe_raw(origin, ",", cursor, timeout=30, **{"channel-group": g})
    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.3)  # the long-poll is waiting on {a}
    assert t.is_alive()
    group_update_raw(origin, g, add=[b])
    t0 = time.monotonic()
    tt = publish(origin, b, {"late": "member"})
    t.join(10)
    assert not t.is_alive()
    assert time.monotonic() - t0 < 2
    body = result["r"].json()
    assert [(m["c"], m.get("b"), m["d"], int(m["p"]["t"])) for m in body["m"]] == [(b, g, {"late": "member"}, tt)]


# -------------------------------------------------------------------------------------- presence

@pytest.mark.asyncio
async def test_group_presence(sdk, origin):
    g = unique("grp")
    a, b, c = names("gch", 3)
    admin = sdk.make(origin)
    await sdk.call(admin.add_channel_to_channel_group().channels([a, b]).channel_group(g))
    listener = sdk.make(origin, uuid=unique("listener"))
    sub = await subscribed(listener, groups=[g], presence=True)
    # Subscribing to the group made the listener present on every member channel.
    env = await sdk.call(admin.here_now().channel_groups([g]))
    assert (env.result.total_channels, env.result.total_occupancy) == (2, 2)
    assert [(ch.channel_name, ch.occupancy, [o.uuid for o in ch.occupants]) for ch in env.result.channels] == [
        (a, 1, [listener.uuid]), (b, 1, [listener.uuid])]

    u1, u2 = sorted([unique("u1"), unique("u2")])
    heartbeat_raw(origin, [a], u1)                   # directly on a member channel
    heartbeat_raw(origin, None, u2, groups=[g])      # through the group: every member channel

    def others(events):
        return [(e.event, e.uuid, e.channel, e.subscription, e.occupancy) for e in events
                if e.uuid in (u1, u2)]
    await sub.async_wait_presence(lambda ev: len(others(ev)) >= 3)
    assert sorted(others(sub.presence_snapshot())) == sorted([
        ("join", u1, a, g, 2), ("join", u2, a, g, 3), ("join", u2, b, g, 2)])

    env = await sdk.call(admin.here_now().channel_groups([g]).include_state(True))
    assert (env.result.total_channels, env.result.total_occupancy) == (2, 5)
    assert [(ch.channel_name, ch.occupancy, sorted(o.uuid for o in ch.occupants)) for ch in env.result.channels] == [
        (a, 3, sorted([listener.uuid, u1, u2])), (b, 2, sorted([listener.uuid, u2]))]
    env = await sdk.call(admin.where_now().uuid(u2))
    assert env.result.channels == [a, b]

    # A channel added to the group is covered by the group's presence subscription at once.
    await sdk.call(admin.add_channel_to_channel_group().channels([c]).channel_group(g))
    heartbeat_raw(origin, [c], u1)
    await sub.async_wait_presence(lambda ev: ("join", u1, c, g) in [x[:4] for x in others(ev)])

    leave_raw(origin, None, u2, groups=[g])
    await sub.async_wait_presence(lambda ev: len([x for x in others(ev) if x[0] == "leave"]) >= 2)
    await asyncio.sleep(0.3)
    leaves = sorted(x[:4] for x in others(sub.presence_snapshot()) if x[0] == "leave")
    # u2 joined a and b; it leaves every current member channel it was on.
    assert leaves == sorted([("leave", u2, a, g), ("leave", u2, b, g)])
    assert [x[:4] for x in others(sub.presence_snapshot())].count(("join", u1, c, g)) == 1
    for event in sub.presence_snapshot():
        assert isinstance(event.timestamp, int) and isinstance(event.timetoken, int)


# ------------------------------------------------------------------------------------ durability

@pytest.mark.asyncio
@pytest.mark.parametrize("graceful", [True, False], ids=["sigterm", "sigkill"])
async def test_groups_survive_restart(sdk, server_factory, graceful):
    srv = server_factory.start(args=["--subscribe-timeout", "20"])
    g1, g2, g3 = names("grp", 3)
    a, b, c = names("gch", 3)
    pn = sdk.make(srv.origin)
    await sdk.call(pn.add_channel_to_channel_group().channels([b, a]).channel_group(g1))
    await sdk.call(pn.add_channel_to_channel_group().channels([c]).channel_group(g2))
    await sdk.call(pn.add_channel_to_channel_group().channels([a, c]).channel_group(g3))
    await sdk.call(pn.remove_channel_from_channel_group().channels([a]).channel_group(g1))
    await sdk.call(pn.add_channel_to_channel_group().channels([a]).channel_group(g1))
    await sdk.call(pn.remove_channel_group().channel_group(g3))
    before = group_list_raw(srv.origin)
    assert before == [g1, g2]

    await asyncio.to_thread(srv.restart, graceful)

    assert group_list_raw(srv.origin) == [g1, g2]
    assert await channels_of(sdk, pn, g1) == [a, b]
    assert await channels_of(sdk, pn, g2) == [c]
    assert await channels_of(sdk, pn, g3) == []
    # The restored membership drives delivery.
    receiver = sdk.make(srv.origin)
    sub = await subscribed(receiver, groups=[g1, g2])
    t0 = server_time(srv.origin)
    tts = [publish(srv.origin, ch, ch) for ch in (a, b, c)]
    assert min(tts) > t0
    await sub.async_wait_messages(3)
    assert [(m.channel, m.subscription, m.timetoken) for m in sub.snapshot()] == [
        (a, g1, tts[0]), (b, g1, tts[1]), (c, g2, tts[2])]
