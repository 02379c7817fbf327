"""The real PubNub Python SDK (`PubNubAsyncio`, event-engine subscribe) against Tether."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from pubnub.enums import PNOperationType, PNStatusCategory

from helpers import (Collector, async_wait_until, fetch_all, fetch_page, message_count, publish, start_subscription,
                     unique)

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


def now_tt() -> int:
    return int(time.time() * 10_000_000)


async def subscribed(pn, channels, with_timetoken=None) -> Collector:
    c = start_subscription(pn, channels, with_timetoken)
    await c.async_wait_connected()
    return c


def assert_ack(env):
    assert not env.status.is_error(), env.status.error_data
    assert env.status.status_code == 200
    assert env.status.category == PNStatusCategory.PNAcknowledgmentCategory


# ------------------------------------------------------------------------------------------- time

async def test_time(origin, make_pubnub_asyncio):
    pn = make_pubnub_asyncio()
    before = now_tt()
    env = await pn.time().future()
    after = now_tt()
    assert_ack(env)
    tt = env.result.value_as_int
    assert len(str(tt)) == 17
    assert before - 10_000_000 <= tt <= after + 10_000_000
    pub = publish(origin, unique(), "tick")
    assert pub > tt
    assert int(await pn.time().result()) >= pub


# ---------------------------------------------------------------------------------------- publish

async def test_publish_get_and_post(origin, make_pubnub_asyncio):
    ch = unique()
    pn = make_pubnub_asyncio()
    m1 = {"via": "GET", "text": "a/b?c&d=e#f", "uni": "ü✓"}
    m2 = {"via": "POST", "filler": "y" * 4000}
    e1 = await pn.publish().channel(ch).message(m1).future()
    e2 = await pn.publish().channel(ch).message(m2).use_post(True).future()
    assert_ack(e1)
    assert_ack(e2)
    assert e1.result.timetoken < e2.result.timetoken
    items = fetch_all(origin, ch)
    assert [(int(i["timetoken"]), i["message"], i["uuid"]) for i in items] == [
        (e1.result.timetoken, m1, pn.uuid), (e2.result.timetoken, m2, pn.uuid)]


async def test_publish_post_compressed(origin, make_pubnub_asyncio):
    ch = unique()
    pn = make_pubnub_asyncio(should_compress=True)
    message = {"compressed": "asyncio", "filler": "xyz" * 3000}
    env = await pn.publish().channel(ch).message(message).use_post(True).future()
    assert_ack(env)
    assert [(int(i["timetoken"]), i["message"]) for i in fetch_all(origin, ch)] == [(env.result.timetoken, message)]


async def test_publish_options_delivered_and_stored(origin, make_pubnub_asyncio):
    ch = unique()
    receiver = make_pubnub_asyncio()
    sender = make_pubnub_asyncio()
    sub = await subscribed(receiver, [ch])
    a = await sender.publish().channel(ch).message("meta").meta({"k": "v"}).custom_message_type("cm-1").future()
    b = await sender.publish().channel(ch).message("volatile").should_store(False).future()
    c = await sender.publish().channel(ch).message("ttl").ttl(2).future()
    d = await sender.publish().channel(ch).message("norep").replicate(False).future()
    for env in (a, b, c, d):
        assert_ack(env)
    tts = [env.result.timetoken for env in (a, b, c, d)]
    assert tts == sorted(tts)
    got = await sub.async_wait_messages(4)
    assert [(m.message, m.channel, m.timetoken, m.user_metadata, m.publisher, m.custom_message_type)
            for m in got] == [
        ("meta", ch, tts[0], {"k": "v"}, sender.uuid, "cm-1"),
        ("volatile", ch, tts[1], None, sender.uuid, None),
        ("ttl", ch, tts[2], None, sender.uuid, None),
        ("norep", ch, tts[3], None, sender.uuid, None),
    ]
    page = fetch_page(origin, ch, include_meta="true", include_custom_message_type="true")
    assert page["channels"][ch] == [
        {"message": "meta", "timetoken": str(tts[0]), "meta": {"k": "v"}, "custom_message_type": "cm-1"},
        {"message": "ttl", "timetoken": str(tts[2]), "meta": "", "custom_message_type": None},
        {"message": "norep", "timetoken": str(tts[3]), "meta": "", "custom_message_type": None},
    ]


async def test_publish_errors(origin, make_pubnub_asyncio):
    bad = make_pubnub_asyncio(publish_key="wrong")
    pn = make_pubnub_asyncio()
    env = await bad.publish().channel(unique()).message("x").future()
    assert env.status.is_error()
    assert env.status.status_code == 400
    assert env.status.category == PNStatusCategory.PNBadRequestCategory

    env = await pn.publish().channel(unique()).message("z" * 40000).use_post(True).future()
    assert env.status.is_error()
    assert env.status.status_code == 413
    assert env.status.category == PNStatusCategory.PNUnknownCategory

    env = await pn.signal().channel(unique()).message("s" * 100).future()
    assert env.status.is_error()
    assert env.status.status_code == 400
    assert env.status.category == PNStatusCategory.PNBadRequestCategory


# ------------------------------------------------------------------------------------ signal, fire

async def test_signal_and_fire(origin, make_pubnub_asyncio):
    ch = unique()
    receiver = make_pubnub_asyncio()
    sender = make_pubnub_asyncio()
    sub = await subscribed(receiver, [ch])
    sig = await sender.signal().channel(ch).message("typing").future()
    assert_ack(sig)
    fire = await sender.fire().channel(ch).message({"fire": True}).future()
    assert_ack(fire)
    assert int(fire.result.timetoken) > int(sig.result.timetoken)
    marker = await sender.publish().channel(ch).message("marker").future()
    (s,) = await sub.async_wait_signals(1)
    assert (s.message, s.channel, s.timetoken, s.publisher) == ("typing", ch, int(sig.result.timetoken),
                                                                sender.uuid)
    got = await sub.async_wait_messages(1)
    await asyncio.sleep(0.2)
    assert [(m.message, m.timetoken) for m in sub.snapshot()] == [("marker", marker.result.timetoken)]
    assert [m.message for m in got] == ["marker"]
    # Neither the signal nor the fire is stored.
    assert [i["message"] for i in fetch_all(origin, ch)] == ["marker"]
    assert message_count(origin, ch) == 1


# -------------------------------------------------------------------------------------- subscribe

async def test_subscribe_one_channel(origin, make_pubnub_asyncio):
    ch = unique()
    receiver = make_pubnub_asyncio()
    sender = make_pubnub_asyncio()
    sub = await subscribed(receiver, [ch])
    tts = []
    for i in range(5):
        env = await sender.publish().channel(ch).message({"i": i}).meta({"i": i}).future()
        tts.append(env.result.timetoken)
    got = await sub.async_wait_messages(5)
    assert [(m.message, m.channel, m.subscription, m.timetoken, m.user_metadata, m.publisher) for m in got] == \
        [({"i": i}, ch, None, tts[i], {"i": i}, sender.uuid) for i in range(5)]


async def test_subscribe_several_channels_and_wildcard(origin, make_pubnub_asyncio):
    prefix = unique("aw").replace("-", "")
    chans = [unique("m1"), unique("m2")]
    receiver = make_pubnub_asyncio()
    sender = make_pubnub_asyncio()
    sub = await subscribed(receiver, chans + [f"{prefix}.*"])
    sent = {}
    for ch in chans + [f"{prefix}.x", f"{prefix}.y", unique("nope"), f"{prefix}z.q"]:
        env = await sender.publish().channel(ch).message(ch).future()
        sent[ch] = env.result.timetoken
    await sub.async_wait_messages(4)
    await asyncio.sleep(0.2)
    got = sub.snapshot()
    assert sorted((m.message, m.channel, m.subscription, m.timetoken) for m in got) == sorted([
        (chans[0], chans[0], None, sent[chans[0]]),
        (chans[1], chans[1], None, sent[chans[1]]),
        (f"{prefix}.x", f"{prefix}.x", f"{prefix}.*", sent[f"{prefix}.x"]),
        (f"{prefix}.y", f"{prefix}.y", f"{prefix}.*", sent[f"{prefix}.y"]),
    ])


async def test_subscription_change_keeps_cursor(origin, make_pubnub_asyncio):
    """Adding a channel while receiving keeps the cursor (event engine SubscriptionChanged): the
    server must accept the old `tt` for a channel the client never handshaked on."""
    a, b = unique("ca"), unique("cb")
    receiver = make_pubnub_asyncio()
    sender = make_pubnub_asyncio()
    sub = await subscribed(receiver, [a])
    ta = (await sender.publish().channel(a).message("a1").future()).result.timetoken
    await sub.async_wait_messages(1)
    receiver.subscribe().channels([b]).execute()
    await asyncio.sleep(0.3)  # let the engine restart its long-poll on [a, b]
    tb = (await sender.publish().channel(b).message("b1").future()).result.timetoken
    got = await sub.async_wait_messages(2)
    assert [(m.message, m.channel, m.timetoken) for m in got] == [("a1", a, ta), ("b1", b, tb)]
    receiver.unsubscribe().channels([a]).execute()
    await asyncio.sleep(0.3)
    await sender.publish().channel(a).message("a2").future()
    tb2 = (await sender.publish().channel(b).message("b2").future()).result.timetoken
    got = await sub.async_wait_messages(3)
    await asyncio.sleep(0.2)
    assert [(m.message, m.timetoken) for m in sub.snapshot()][2:] == [("b2", tb2)]


async def test_unsubscribe_all_reports_disconnected(origin, make_pubnub_asyncio):
    ch = unique()
    pn = make_pubnub_asyncio()
    sub = await subscribed(pn, [ch])
    pn.unsubscribe_all()
    await async_wait_until(lambda: sub.has_category(PNStatusCategory.PNDisconnectedCategory), 5,
                           what="Disconnected")
    # The event engine without presence heartbeat sends no leave, so no error status.
    assert [s for s in sub.statuses if s.is_error()] == []


# ---------------------------------------------------------------------------------------- history

@pytest.fixture
def stored_channel(origin):
    ch = unique("hist")
    tts = [publish(origin, ch, {"n": i}, meta=json.dumps({"i": i})) for i in range(5)]
    return ch, tts


async def test_history_v2(origin, stored_channel, make_pubnub_asyncio):
    ch, tts = stored_channel
    pn = make_pubnub_asyncio()
    env = await pn.history().channel(ch).include_timetoken(True).include_meta(True).future()
    assert_ack(env)
    r = env.result
    assert [(m.entry, m.timetoken, m.meta) for m in r.messages] == [({"n": i}, tts[i], {"i": i}) for i in range(5)]
    assert (r.start_timetoken, r.end_timetoken) == (tts[0], tts[4])
    r = await pn.history().channel(ch).count(3).include_timetoken(True).result()
    assert [m.timetoken for m in r.messages] == tts[2:]
    r = await pn.history().channel(ch).count(3).reverse(True).include_timetoken(True).result()
    assert [m.timetoken for m in r.messages] == tts[:3]
    r = await pn.history().channel(ch).start(tts[3]).end(tts[0]).include_timetoken(True).result()
    assert [m.timetoken for m in r.messages] == tts[0:3]


async def test_fetch_messages(origin, stored_channel, make_pubnub_asyncio):
    ch, tts = stored_channel
    other = unique("other")
    to = [publish(origin, other, f"o{i}", uuid="someone") for i in range(3)]
    pn = make_pubnub_asyncio()
    env = await pn.fetch_messages().channels(ch).include_meta(True).include_uuid(True) \
        .include_message_type(True).future()
    assert_ack(env)
    assert [(m.message, int(m.timetoken), m.meta, m.uuid, m.message_type) for m in env.result.channels[ch]] == \
        [({"n": i}, tts[i], {"i": i}, "raw-publisher", None) for i in range(5)]
    r = await pn.fetch_messages().channels([ch, other]).include_uuid(True).maximum_per_channel(2).result()
    assert [(int(m.timetoken), m.uuid) for m in r.channels[ch]] == [(t, "raw-publisher") for t in tts[3:]]
    assert [(int(m.timetoken), m.uuid) for m in r.channels[other]] == [(t, "someone") for t in to[1:]]
    r = await pn.fetch_messages().channels(ch).start(tts[4]).end(tts[2]).result()
    assert [int(m.timetoken) for m in r.channels[ch]] == tts[2:4]


async def test_message_counts_and_delete(origin, stored_channel, make_pubnub_asyncio):
    ch, tts = stored_channel
    pn = make_pubnub_asyncio()
    r = await pn.message_counts().channel([ch]).channel_timetokens([tts[1]]).result()
    assert r.channels == {ch: 3}
    env = await pn.delete_messages().channel(ch).start(tts[1]).end(tts[3]).future()
    assert not env.status.is_error() and env.status.status_code == 200
    assert env.status.operation == PNOperationType.PNHistoryDeleteOperation
    assert [int(i["timetoken"]) for i in fetch_all(origin, ch)] == [tts[0], tts[1], tts[4]]
    r = await pn.message_counts().channel([ch]).channel_timetokens([tts[0] - 1]).result()
    assert r.channels == {ch: 3}
    await pn.delete_messages().channel(ch).future()
    r = await pn.message_counts().channel([ch]).channel_timetokens([tts[0] - 1]).result()
    assert r.channels == {ch: 0}
    r = await pn.fetch_messages().channels(ch).result()
    assert r.channels == {}


# ------------------------------------------------------------------------ presence-enabled clients

async def test_presence_heartbeat_client_still_receives(origin, make_pubnub_asyncio):
    """A client with presence heartbeats and `with_presence()` subscribes to `ch` and
    `ch-pnpres` and sends heartbeats. Without presence on the server the heartbeat gets 404: the
    event engine's presence machine retries it with backoff and emits no status; the subscribe
    machine is unaffected."""
    ch = unique("pres")
    pn = make_pubnub_asyncio(enable_presence_heartbeat=True)
    pn.config.set_presence_timeout(20)
    sub = Collector()
    pn.add_listener(sub)
    pn.subscribe().channels([ch]).with_presence().execute()
    await sub.async_wait_connected()
    tt = publish(origin, ch, "with-presence")
    (m,) = await sub.async_wait_messages(1)
    assert (m.message, m.channel, m.timetoken) == ("with-presence", ch, tt)
    assert [s for s in sub.statuses if s.is_error()] == []
