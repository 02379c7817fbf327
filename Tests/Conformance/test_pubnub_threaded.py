"""The real PubNub Python SDK (threaded `PubNub` client, native subscribe manager) against Tether."""

from __future__ import annotations

import json
import time

import pytest
from pubnub.enums import PNOperationType, PNStatusCategory
from pubnub.exceptions import PubNubException

from helpers import (Collector, fetch_all, fetch_page, get, message_count, publish, server_time, start_subscription,
                     unique, wait_until)

pytestmark = pytest.mark.timeout(60)


def now_tt() -> int:
    return int(time.time() * 10_000_000)


def subscribed(pn, channels, with_timetoken=None) -> Collector:
    """Subscribes `pn` to `channels` and waits until the first subscribe response arrived."""
    c = start_subscription(pn, channels, with_timetoken)
    c.wait_connected()
    return c


def assert_ack(env):
    assert not env.status.is_error()
    assert env.status.status_code == 200
    assert env.status.category == PNStatusCategory.PNAcknowledgmentCategory


# ------------------------------------------------------------------------------------------- time

def test_time(pubnub, origin):
    before = now_tt()
    env = pubnub.time().sync()
    after = now_tt()
    assert_ack(env)
    tt = env.result.value_as_int
    assert isinstance(tt, int) and len(str(tt)) == 17
    # The server's clock is this machine's clock.
    assert before - 10_000_000 <= tt <= after + 10_000_000
    assert env.status.operation == PNOperationType.PNTimeOperation
    # Time never goes backwards, and publishing moves it forward past the message.
    pub_tt = publish(origin, unique(), "tick")
    assert pub_tt > tt
    assert pubnub.time().sync().result.value_as_int >= pub_tt


def test_time_advances_while_idle(pubnub):
    first = pubnub.time().sync().result.value_as_int
    time.sleep(1.5)  # the point of the test: wall time passes with no publish
    before = now_tt()
    second = pubnub.time().sync().result.value_as_int
    assert second - first >= 10_000_000, f"/time/0 moved {(second - first) / 1e7:.3f}s in 1.5s"
    assert second >= before - 10_000_000


# ---------------------------------------------------------------------------------------- publish

def test_publish_get_is_stored_with_publisher(pubnub, origin):
    ch = unique()
    message = {"text": "hello / world?&#", "n": 1, "list": [1, 2.5, None, True], "uni": "héllo ✓"}
    t0 = server_time(origin)
    env = pubnub.publish().channel(ch).message(message).sync()
    assert_ack(env)
    tt = env.result.timetoken
    assert isinstance(tt, int) and tt > t0
    items = fetch_all(origin, ch)
    assert [(int(i["timetoken"]), i["message"], i["uuid"]) for i in items] == [(tt, message, pubnub.uuid)]


def test_publish_post_is_stored(pubnub, origin):
    ch = unique()
    message = {"body": "x" * 5000, "nested": {"a": [1, {"b": "c/d"}]}}
    env = pubnub.publish().channel(ch).message(message).use_post(True).sync()
    assert_ack(env)
    items = fetch_all(origin, ch)
    assert [(int(i["timetoken"]), i["message"]) for i in items] == [(env.result.timetoken, message)]


def test_publish_post_compressed(make_pubnub, origin):
    pn = make_pubnub(should_compress=True)
    ch = unique()
    message = {"compressed": True, "filler": "abc" * 2000}
    env = pn.publish().channel(ch).message(message).use_post(True).sync()
    assert_ack(env)
    items = fetch_all(origin, ch)
    assert [(int(i["timetoken"]), i["message"]) for i in items] == [(env.result.timetoken, message)]


def test_publish_with_meta_and_custom_message_type(pubnub, origin):
    ch = unique()
    sub = subscribed(pubnub, [ch])
    env = pubnub.publish().channel(ch).message("m").meta({"k": "v", "n": 2}).custom_message_type("chat-msg").sync()
    assert_ack(env)
    tt = env.result.timetoken
    (got,) = sub.wait_messages(1)
    assert (got.message, got.channel, got.timetoken, got.user_metadata, got.publisher, got.custom_message_type) == \
        ("m", ch, tt, {"k": "v", "n": 2}, pubnub.uuid, "chat-msg")
    page = fetch_page(origin, ch, include_meta="true", include_custom_message_type="true")
    assert page["channels"][ch] == [{"message": "m", "timetoken": str(tt), "meta": {"k": "v", "n": 2},
                                     "custom_message_type": "chat-msg"}]


def test_publish_store_false_is_delivered_but_not_stored(pubnub, origin):
    ch = unique()
    sub = subscribed(pubnub, [ch])
    unstored = pubnub.publish().channel(ch).message("volatile").should_store(False).sync()
    assert_ack(unstored)
    stored = pubnub.publish().channel(ch).message("durable").should_store(True).sync()
    assert_ack(stored)
    got = sub.wait_messages(2)
    assert [(m.message, m.timetoken) for m in got] == [("volatile", unstored.result.timetoken),
                                                        ("durable", stored.result.timetoken)]
    assert [(i["message"], int(i["timetoken"])) for i in fetch_all(origin, ch)] == [("durable", stored.result.timetoken)]
    assert message_count(origin, ch) == 1


def test_publish_ttl_and_replicate_false(pubnub, origin):
    ch = unique()
    sub = subscribed(pubnub, [ch])
    a = pubnub.publish().channel(ch).message("ttl").ttl(1).sync()
    b = pubnub.publish().channel(ch).message("norep").replicate(False).sync()
    assert_ack(a)
    assert_ack(b)
    assert a.result.timetoken < b.result.timetoken
    # norep=true is not fire: it is delivered and stored like any publish.
    got = sub.wait_messages(2)
    assert [m.message for m in got] == ["ttl", "norep"]
    assert [(i["message"], int(i["timetoken"])) for i in fetch_all(origin, ch)] == [
        ("ttl", a.result.timetoken), ("norep", b.result.timetoken)]


def test_publish_errors_are_reported(make_pubnub, origin):
    wrong_key = make_pubnub(publish_key="nope")
    with pytest.raises(PubNubException) as e:
        wrong_key.publish().channel(unique()).message("x").sync()
    assert e.value._status_code == 400
    assert "Invalid Key" in str(e.value)

    pn = make_pubnub()
    with pytest.raises(PubNubException) as e:
        pn.publish().channel(unique()).message("x" * 40000).use_post(True).sync()
    assert e.value._status_code == 413
    assert "Message Too Large" in str(e.value)


# ------------------------------------------------------------------------------------ signal, fire

def test_signal_delivered_to_signal_listener_not_stored(make_pubnub, origin):
    ch = unique()
    receiver = make_pubnub()
    sender = make_pubnub()
    sub = subscribed(receiver, [ch])
    env = sender.signal().channel(ch).message({"typing": True}).sync()
    assert_ack(env)
    tt = int(env.result.timetoken)
    (sig,) = sub.wait_signals(1)
    assert (sig.message, sig.channel, sig.timetoken, sig.publisher) == ({"typing": True}, ch, tt, sender.uuid)
    assert sub.messages == []
    assert fetch_all(origin, ch) == []
    assert message_count(origin, ch) == 0


def test_signal_over_limit_rejected(pubnub):
    with pytest.raises(PubNubException) as e:
        pubnub.signal().channel(unique()).message("x" * 100).sync()
    assert e.value._status_code == 400
    assert "Signal size too large" in str(e.value)


def test_fire_is_acknowledged_and_goes_nowhere(make_pubnub, origin):
    ch = unique()
    receiver = make_pubnub()
    sender = make_pubnub()
    sub = subscribed(receiver, [ch])
    before = server_time(origin)
    fired = sender.fire().channel(ch).message({"fire": 1}).sync()
    assert_ack(fired)
    assert int(fired.result.timetoken) > before
    marker = sender.publish().channel(ch).message("marker").sync()
    got = sub.wait_messages(1)
    time.sleep(0.2)  # give a wrongly delivered fire the chance to show up after the marker
    assert [m.message for m in sub.snapshot()] == ["marker"]
    assert [m.message for m in got] == ["marker"]
    assert [(i["message"], int(i["timetoken"])) for i in fetch_all(origin, ch)] == [("marker", marker.result.timetoken)]


# -------------------------------------------------------------------------------------- subscribe

def test_subscribe_one_channel(make_pubnub, origin):
    ch = unique()
    receiver = make_pubnub()
    sender = make_pubnub()
    sub = subscribed(receiver, [ch])
    tts = [sender.publish().channel(ch).message({"i": i}).meta({"i": i}).sync().result.timetoken for i in range(5)]
    got = sub.wait_messages(5)
    assert [(m.message, m.channel, m.subscription, m.timetoken, m.user_metadata, m.publisher) for m in got] == \
        [({"i": i}, ch, None, tts[i], {"i": i}, sender.uuid) for i in range(5)]
    # Raw publishes from another publisher carry their own uuid.
    tt = publish(origin, ch, "raw", uuid="raw-pub")
    got = sub.wait_messages(6)
    assert (got[5].message, got[5].publisher, got[5].timetoken) == ("raw", "raw-pub", tt)


def test_subscribe_several_channels(make_pubnub):
    chans = [unique("multi") for _ in range(3)]
    other = unique("other")
    receiver = make_pubnub()
    sender = make_pubnub()
    sub = subscribed(receiver, chans)
    expected = []
    for round_ in range(2):
        for ch in chans + [other]:
            tt = sender.publish().channel(ch).message(f"{ch}:{round_}").sync().result.timetoken
            if ch != other:
                expected.append((f"{ch}:{round_}", ch, tt))
    got = sub.wait_messages(6)
    time.sleep(0.2)
    got = sub.snapshot()
    assert sorted((m.message, m.channel, m.timetoken) for m in got) == sorted(expected)
    # Per channel, order is publish order.
    for ch in chans:
        assert [m.timetoken for m in got if m.channel == ch] == sorted(tt for _, c, tt in expected if c == ch)
    assert all(m.subscription is None for m in got)


def test_subscribe_wildcard(make_pubnub):
    prefix = unique("wc").replace("-", "")
    receiver = make_pubnub()
    sender = make_pubnub()
    plain = unique("plain")
    sub = subscribed(receiver, [f"{prefix}.*", plain])
    sent = []
    for ch in (f"{prefix}.one", f"{prefix}.two", f"{prefix}x.nomatch", prefix, plain):
        sent.append((ch, sender.publish().channel(ch).message({"to": ch}).meta({"m": ch}).sync().result.timetoken))
    got = sub.wait_messages(3)
    time.sleep(0.2)
    got = sub.snapshot()
    assert sorted((m.channel, m.subscription, m.timetoken, m.message["to"], m.user_metadata["m"], m.publisher)
                  for m in got) == sorted([
                      (f"{prefix}.one", f"{prefix}.*", sent[0][1], f"{prefix}.one", f"{prefix}.one", sender.uuid),
                      (f"{prefix}.two", f"{prefix}.*", sent[1][1], f"{prefix}.two", f"{prefix}.two", sender.uuid),
                      (plain, None, sent[4][1], plain, plain, sender.uuid),
                  ])


def test_subscribe_receives_own_messages_and_unsubscribe_stops_delivery(pubnub, origin):
    ch = unique()
    sub = subscribed(pubnub, [ch])
    tt = pubnub.publish().channel(ch).message("mine").sync().result.timetoken
    (got,) = sub.wait_messages(1)
    assert (got.message, got.publisher, got.timetoken) == ("mine", pubnub.uuid, tt)
    pubnub.unsubscribe().channels([ch]).execute()
    # The native manager sends a presence leave on unsubscribe and announces its outcome as a
    # status on the Unsubscribe operation. Without presence on the server that is a 404
    # (category Unknown, is_error() true), which the SDK otherwise ignores; with presence, 200.
    wait_until(lambda: any(s.operation == PNOperationType.PNUnsubscribeOperation for s in sub.statuses), 10,
               what="leave status")
    leave = [s for s in sub.statuses if s.operation == PNOperationType.PNUnsubscribeOperation][0]
    if leave.status_code == 404:
        assert leave.category == PNStatusCategory.PNUnknownCategory and leave.is_error()
    else:
        assert leave.status_code == 200 and not leave.is_error()
    publish(origin, ch, "after")
    time.sleep(0.3)
    assert [m.message for m in sub.snapshot()] == ["mine"]


def test_special_characters_and_exotic_json_round_trip(make_pubnub, origin):
    """Channel names with `/`, space, `+`, `~`, quotes and non-ASCII; a uuid with `/`, space
    and `+`; JSON values whose text must survive verbatim (lone surrogate escape, NUL escape,
    -0.0, 1e308, integers beyond 2^64)."""
    ch = "a/b c+d~é!'()x"
    receiver = make_pubnub()
    sender = make_pubnub(uuid="user/with space+plus~")
    sub = subscribed(receiver, [ch])
    messages = ["\ud800", "😀", {"k": "\u0000"}, 1e308, -0.0, 12345678901234567890, [None, True, False]]
    tts = []
    for i, m in enumerate(messages):
        tts.append(sender.publish().channel(ch).message(m).use_post(i % 2 == 1).sync().result.timetoken)
    got = sub.wait_messages(len(messages))
    assert [(m.message, m.channel, m.publisher, m.timetoken) for m in got] == \
        [(m, ch, sender.uuid, tt) for m, tt in zip(messages, tts)]
    assert str(got[4].message) == "-0.0"  # not normalised to 0
    items = fetch_all(origin, ch)
    assert [(i["message"], i["uuid"], int(i["timetoken"])) for i in items] == \
        [(m, sender.uuid, tt) for m, tt in zip(messages, tts)]
    r = receiver.history().channel(ch).include_timetoken(True).sync().result
    assert [(m.entry, m.timetoken) for m in r.messages] == list(zip(messages, tts))


# ---------------------------------------------------------------------------------------- history

@pytest.fixture
def stored_channel(origin):
    """A channel with five stored messages (with meta); returns (channel, [timetokens])."""
    ch = unique("hist")
    tts = [publish(origin, ch, {"n": i}, meta=json.dumps({"i": i})) for i in range(5)]
    assert tts == sorted(tts) and len(set(tts)) == 5
    return ch, tts


def test_history_v2(pubnub, stored_channel):
    ch, tts = stored_channel
    env = pubnub.history().channel(ch).include_timetoken(True).include_meta(True).sync()
    assert_ack(env)
    r = env.result
    assert [(m.entry, m.timetoken, m.meta) for m in r.messages] == [({"n": i}, tts[i], {"i": i}) for i in range(5)]
    assert (r.start_timetoken, r.end_timetoken) == (tts[0], tts[4])

    # Without include_*: bare messages.
    r = pubnub.history().channel(ch).sync().result
    assert [m.entry for m in r.messages] == [{"n": i} for i in range(5)]
    assert all(m.timetoken is None for m in r.messages)

    # count: the newest `count`, oldest first; reverse: the oldest `count`.
    r = pubnub.history().channel(ch).count(2).include_timetoken(True).sync().result
    assert [m.timetoken for m in r.messages] == tts[3:5]
    r = pubnub.history().channel(ch).count(2).reverse(True).include_timetoken(True).sync().result
    assert [m.timetoken for m in r.messages] == tts[0:2]

    # start is exclusive, end inclusive.
    r = pubnub.history().channel(ch).start(tts[4]).end(tts[1]).include_timetoken(True).sync().result
    assert [m.timetoken for m in r.messages] == tts[1:4]
    r = pubnub.history().channel(ch).start(tts[2]).include_timetoken(True).sync().result
    assert [m.timetoken for m in r.messages] == tts[0:2]
    r = pubnub.history().channel(ch).end(tts[3]).include_timetoken(True).sync().result
    assert [m.timetoken for m in r.messages] == tts[3:5]

    # An empty channel.
    r = pubnub.history().channel(unique("empty")).include_timetoken(True).sync().result
    assert (r.messages, r.start_timetoken, r.end_timetoken) == ([], 0, 0)


def test_fetch_messages_single_channel(pubnub, stored_channel):
    ch, tts = stored_channel
    env = pubnub.fetch_messages().channels(ch).include_meta(True).include_uuid(True) \
        .include_message_type(True).sync()
    assert_ack(env)
    items = env.result.channels[ch]
    assert [(m.message, int(m.timetoken), m.meta, m.uuid, m.message_type) for m in items] == \
        [({"n": i}, tts[i], {"i": i}, "raw-publisher", None) for i in range(5)]
    assert all(isinstance(m.timetoken, str) for m in items)

    r = pubnub.fetch_messages().channels(ch).maximum_per_channel(2).sync().result
    assert [int(m.timetoken) for m in r.channels[ch]] == tts[3:5]
    r = pubnub.fetch_messages().channels(ch).start(tts[4]).end(tts[1]).sync().result
    assert [int(m.timetoken) for m in r.channels[ch]] == tts[1:4]
    r = pubnub.fetch_messages().channels(ch).start(tts[2]).sync().result
    assert [int(m.timetoken) for m in r.channels[ch]] == tts[0:2]
    r = pubnub.fetch_messages().channels(ch).end(tts[3]).sync().result
    assert [int(m.timetoken) for m in r.channels[ch]] == tts[3:5]

    # With actions (one channel): every item carries an (empty) actions map.
    r = pubnub.fetch_messages().channels(ch).include_message_actions(True).sync().result
    assert [(int(m.timetoken), m.actions) for m in r.channels[ch]] == [(t, {}) for t in tts]


def test_fetch_messages_multi_channel(pubnub, origin):
    a, b, empty = unique("fa"), unique("fb"), unique("fe")
    ta = [publish(origin, a, f"a{i}") for i in range(4)]
    tb = [publish(origin, b, f"b{i}") for i in range(2)]
    r = pubnub.fetch_messages().channels([a, b, empty]).include_uuid(True).sync().result
    assert sorted(r.channels) == sorted([a, b])
    assert [(m.message, int(m.timetoken)) for m in r.channels[a]] == [(f"a{i}", ta[i]) for i in range(4)]
    assert [(m.message, int(m.timetoken)) for m in r.channels[b]] == [(f"b{i}", tb[i]) for i in range(2)]
    r = pubnub.fetch_messages().channels([a, b]).maximum_per_channel(1).sync().result
    assert [int(m.timetoken) for m in r.channels[a]] == ta[3:]
    assert [int(m.timetoken) for m in r.channels[b]] == tb[1:]


def test_message_counts(pubnub, origin):
    a, b = unique("ca"), unique("cb")
    ta = [publish(origin, a, i) for i in range(3)]
    tb = [publish(origin, b, i) for i in range(5)]
    publish(origin, a, "volatile", store="0")
    # One channel, one timetoken (sent as `timetoken=`): counted strictly after it.
    env = pubnub.message_counts().channel([a]).channel_timetokens([ta[0]]).sync()
    assert_ack(env)
    assert env.result.channels == {a: 2}
    # Several channels (sent as `channelsTimetoken=`), one timetoken each.
    r = pubnub.message_counts().channel([a, b]).channel_timetokens([ta[0] - 1, tb[3]]).sync().result
    assert r.channels == {a: 3, b: 1}
    r = pubnub.message_counts().channel([a, b]).channel_timetokens([tb[-1], ta[0]]).sync().result
    assert r.channels == {a: 0, b: 5}
    # The raw `timetoken=` form applies one timetoken to every listed channel.
    raw = get(origin, f"/v3/history/sub-key/demo/message-counts/{a},{b}?timetoken={ta[1]}")
    assert raw.json() == {"status": 200, "error": False, "error_message": "", "channels": {a: 1, b: 5}}


def test_delete_messages(pubnub, origin):
    ch = unique("del")
    tts = [publish(origin, ch, i) for i in range(6)]
    # PubNub's documented recipe for deleting one message: start = tt - 1 (exclusive), end = tt
    # (inclusive).
    env = pubnub.delete_messages().channel(ch).start(tts[2] - 1).end(tts[2]).sync()
    assert not env.status.is_error() and env.status.status_code == 200
    assert env.status.operation == PNOperationType.PNHistoryDeleteOperation
    assert [int(i["timetoken"]) for i in fetch_all(origin, ch)] == [tts[0], tts[1], tts[3], tts[4], tts[5]]
    # start < end: (start, end].
    pubnub.delete_messages().channel(ch).start(tts[3]).end(tts[4]).sync()
    assert [int(i["timetoken"]) for i in fetch_all(origin, ch)] == [tts[0], tts[1], tts[3], tts[5]]
    assert message_count(origin, ch) == 4
    # Only end: everything up to and including it.
    pubnub.delete_messages().channel(ch).end(tts[0]).sync()
    assert [int(i["timetoken"]) for i in fetch_all(origin, ch)] == [tts[1], tts[3], tts[5]]
    # Only start: everything after it.
    pubnub.delete_messages().channel(ch).start(tts[3]).sync()
    assert [int(i["timetoken"]) for i in fetch_all(origin, ch)] == [tts[1], tts[3]]
    # Without bounds: everything goes.
    pubnub.delete_messages().channel(ch).sync()
    assert fetch_all(origin, ch) == []
    assert message_count(origin, ch) == 0
    r = pubnub.history().channel(ch).sync().result
    assert r.messages == []


def test_delete_messages_start_newer_than_end(pubnub, origin):
    ch = unique("del")
    tts = [publish(origin, ch, i) for i in range(6)]
    # History-style bounds (start newer than end), start exclusive and end inclusive, exactly
    # as history v2 / fetch v3 read them: end <= tt < start, so tts[1] and tts[2] go.
    r = pubnub.history().channel(ch).start(tts[3]).end(tts[1]).include_timetoken(True).sync().result
    assert [m.timetoken for m in r.messages] == [tts[1], tts[2]]
    pubnub.delete_messages().channel(ch).start(tts[3]).end(tts[1]).sync()
    assert [int(i["timetoken"]) for i in fetch_all(origin, ch)] == [tts[0], tts[3], tts[4], tts[5]]


def test_delete_messages_does_not_touch_other_channels(pubnub, origin):
    a, b = unique("da"), unique("db")
    ta = publish(origin, a, "keep")
    publish(origin, b, "drop")
    pubnub.delete_messages().channel(b).sync()
    assert [(i["message"], int(i["timetoken"])) for i in fetch_all(origin, a)] == [("keep", ta)]
    assert fetch_all(origin, b) == []


# ------------------------------------------------------------------------ presence-enabled clients

def test_presence_heartbeat_client_still_receives(make_pubnub, origin):
    """With presence heartbeats and `with_presence()` the native manager subscribes to `ch` and
    `ch-pnpres` (with `heartbeat=` on the subscribe) and sends a heartbeat at once. Without
    presence on the server that heartbeat is a 404, announced as an Unknown-category status on
    the Heartbeat operation; subscribing goes on regardless."""
    ch = unique("pres")
    pn = make_pubnub(enable_presence_heartbeat=True)
    pn.config.set_presence_timeout(20)
    sub = subscribed_with_presence(pn, ch)
    tt = publish(origin, ch, "with-presence")
    (m,) = sub.wait_messages(1)
    assert (m.message, m.channel, m.timetoken) == ("with-presence", ch, tt)
    for s in sub.statuses:
        if s.operation == PNOperationType.PNHeartbeatOperation:
            assert s.status_code in (200, 404)
            assert s.is_error() == (s.status_code == 404)


def subscribed_with_presence(pn, ch) -> Collector:
    c = Collector()
    pn.add_listener(c)
    pn.subscribe().channels([ch]).with_presence().execute()
    c.wait_connected()
    return c
