"""Catch-up: a subscriber that comes back with an old timetoken receives everything published
since, exactly once and in order — from the store, from the in-memory window, and across restarts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import time

import pytest
from pubnub.enums import PNStatusCategory
from pubnub.pubnub import PubNub
from pubnub.pubnub_asyncio import PubNubAsyncio

from helpers import (Collector, async_wait_until, make_config, publish, publish_many, server_time, subscribe_raw,
                     unique, wait_until)

pytestmark = pytest.mark.timeout(90)

N = 1000


def assert_exactly_once_in_order(received, expected):
    """`received`: PNMessageResults; `expected`: [(timetoken, message)] in any order."""
    expected = sorted(expected, key=lambda e: e[0])
    got = [(m.timetoken, m.message) for m in received]
    tts = [t for t, _ in got]
    assert len(tts) == len(set(tts)), f"{len(tts) - len(set(tts))} duplicates"
    assert tts == sorted(tts), "not in timetoken order"
    key = lambda e: (e[0], json.dumps(e[1], sort_keys=True))  # noqa: E731
    missing = sorted(set(map(key, expected)) - set(map(key, got)))
    extra = sorted(set(map(key, got)) - set(map(key, expected)))
    assert not missing and not extra, f"missing {len(missing)} (first {missing[:3]}), extra {len(extra)} ({extra[:3]})"
    assert got == expected


def publish_batch(origin, ch, n, tag, **params):
    items = [(ch, {"tag": tag, "i": i}, dict(params)) for i in range(n)]
    tts = publish_many(origin, items, workers=16)
    assert len(set(tts)) == n
    return [(tt, msg) for tt, (_, msg, _) in zip(tts, items)]


# ----------------------------------------------------------------------------------- threaded SDK

def threaded_first_message(pn, ch, origin):
    """Subscribes, receives one live message, returns (collector, its timetoken)."""
    c = Collector()
    pn.add_listener(c)
    pn.subscribe().channels([ch]).execute()
    c.wait_connected()
    tt0 = publish(origin, ch, {"tag": "first"})
    (m,) = c.wait_messages(1)
    assert (m.timetoken, m.message) == (tt0, {"tag": "first"})
    return c, tt0


def test_threaded_catch_up_1000(make_pubnub, origin):
    ch = unique("catch")
    pn = make_pubnub()
    first, tt0 = threaded_first_message(pn, ch, origin)
    pn.unsubscribe().channels([ch]).execute()
    wait_until(lambda: ch not in pn.get_subscribed_channels(), 5, what="unsubscribed")

    expected = publish_batch(origin, ch, N, "away")

    c = Collector()
    pn.add_listener(c)
    t0 = time.monotonic()
    pn.subscribe().channels([ch]).with_timetoken(tt0).execute()
    c.wait_messages(N, timeout=30)
    elapsed = time.monotonic() - t0
    time.sleep(0.3)  # any duplicate would arrive right behind the last page
    assert_exactly_once_in_order(c.snapshot(), expected)
    assert elapsed < 20
    # And the subscription is live afterwards.
    tt = publish(origin, ch, {"tag": "live"})
    c.wait_messages(N + 1)
    assert (c.messages[-1].timetoken, c.messages[-1].message) == (tt, {"tag": "live"})


def test_threaded_catch_up_includes_unstored_window(make_pubnub, origin):
    """store=0 messages published while away are still in the in-memory window (100 per
    channel), so catch-up delivers them interleaved with stored ones."""
    ch = unique("window")
    pn = make_pubnub()
    _, tt0 = threaded_first_message(pn, ch, origin)
    pn.unsubscribe().channels([ch]).execute()
    expected = []
    for i in range(60):
        store = "0" if i % 2 else "1"
        expected.append((publish(origin, ch, {"i": i, "store": store}, store=store), {"i": i, "store": store}))
    c = Collector()
    pn.add_listener(c)
    pn.subscribe().channels([ch]).with_timetoken(tt0).execute()
    c.wait_messages(60)
    time.sleep(0.3)
    assert_exactly_once_in_order(c.snapshot(), expected)


def test_threaded_catch_up_after_restart(server_factory):
    srv = server_factory.start(args=["--subscribe-timeout", "20"])
    ch = unique("restart")
    pn = PubNub(make_config(srv.origin))
    try:
        _, tt0 = threaded_first_message(pn, ch, srv.origin)
        pn.unsubscribe().channels([ch]).execute()
    finally:
        pn.stop()
    expected = publish_batch(srv.origin, ch, 300, "before-restart")
    srv.restart()
    # Messages published after the restart follow the older ones.
    expected += publish_batch(srv.origin, ch, 50, "after-restart")

    pn = PubNub(make_config(srv.origin))
    try:
        c = Collector()
        pn.add_listener(c)
        pn.subscribe().channels([ch]).with_timetoken(tt0).execute()
        c.wait_messages(350, timeout=30)
        time.sleep(0.3)
        assert_exactly_once_in_order(c.snapshot(), expected)
    finally:
        pn.unsubscribe_all()
        pn.stop()


def test_threaded_live_subscriber_survives_restart(server_factory):
    """The subscriber stays subscribed while the server restarts on the same port: the native
    manager reports the failure, polls /time/0, resubscribes from its last timetoken and gets
    everything published after the restart."""
    srv = server_factory.start(args=["--subscribe-timeout", "20"])
    ch = unique("live-restart")
    pn = PubNub(make_config(srv.origin, reconnect_policy=_linear(), reconnection_interval=0.5,
                            maximum_reconnection_retries=-1))
    try:
        c, tt0 = threaded_first_message(pn, ch, srv.origin)
        before = publish_batch(srv.origin, ch, 20, "before")
        c.wait_messages(21)
        srv.restart()
        after = publish_batch(srv.origin, ch, 150, "after")
        c.wait_messages(21 + 150, timeout=30)
        time.sleep(0.3)
        assert_exactly_once_in_order(c.snapshot(), [(tt0, {"tag": "first"})] + before + after)
        cats = c.categories()
        assert PNStatusCategory.PNReconnectedCategory in cats, cats
    finally:
        pn.unsubscribe_all()
        pn.stop()


def _linear():
    from pubnub.enums import PNReconnectionPolicy
    return PNReconnectionPolicy.LINEAR


# ------------------------------------------------------------------------------------ asyncio SDK

@contextlib.asynccontextmanager
async def aclient(origin, **overrides):
    pn = PubNubAsyncio(make_config(origin, **overrides))
    try:
        yield pn
    finally:
        with contextlib.suppress(Exception):
            pn.unsubscribe_all()
        await asyncio.sleep(0)
        await pn.stop()


async def async_first_message(pn, ch, origin):
    c = Collector()
    pn.add_listener(c)
    pn.subscribe().channels([ch]).execute()
    await c.async_wait_connected()
    tt0 = publish(origin, ch, {"tag": "first"})
    (m,) = await c.async_wait_messages(1)
    assert (m.timetoken, m.message) == (tt0, {"tag": "first"})
    return c, tt0


@pytest.mark.asyncio
async def test_asyncio_catch_up_1000(origin):
    ch = unique("acatch")
    async with aclient(origin) as pn:
        first, tt0 = await async_first_message(pn, ch, origin)
        pn.unsubscribe().channels([ch]).execute()
        await async_wait_until(lambda: first.has_category(PNStatusCategory.PNDisconnectedCategory), 5,
                               what="Disconnected")
        expected = await asyncio.to_thread(publish_batch, origin, ch, N, "away")
        c = Collector()
        pn.add_listener(c)
        pn.subscribe().channels([ch]).with_timetoken(tt0).execute()
        await c.async_wait_messages(N, timeout=30)
        await asyncio.sleep(0.3)
        assert_exactly_once_in_order(c.snapshot(), expected)
        tt = publish(origin, ch, {"tag": "live"})
        await c.async_wait_messages(N + 1)
        assert (c.messages[-1].timetoken, c.messages[-1].message) == (tt, {"tag": "live"})


@pytest.mark.asyncio
async def test_asyncio_catch_up_includes_unstored_window(origin):
    ch = unique("awindow")
    async with aclient(origin) as pn:
        _, tt0 = await async_first_message(pn, ch, origin)
        pn.unsubscribe().channels([ch]).execute()
        expected = await asyncio.to_thread(publish_batch, origin, ch, 80, "volatile", store="0")
        c = Collector()
        pn.add_listener(c)
        pn.subscribe().channels([ch]).with_timetoken(tt0).execute()
        await c.async_wait_messages(80)
        await asyncio.sleep(0.3)
        assert_exactly_once_in_order(c.snapshot(), expected)


@pytest.mark.asyncio
async def test_asyncio_catch_up_after_restart(server_factory):
    srv = server_factory.start(args=["--subscribe-timeout", "20"])
    ch = unique("arestart")
    async with aclient(srv.origin) as pn:
        _, tt0 = await async_first_message(pn, ch, srv.origin)
    expected = await asyncio.to_thread(publish_batch, srv.origin, ch, 300, "before-restart")
    await asyncio.to_thread(srv.restart)
    expected += await asyncio.to_thread(publish_batch, srv.origin, ch, 30, "after-restart")
    async with aclient(srv.origin) as pn:
        c = Collector()
        pn.add_listener(c)
        pn.subscribe().channels([ch]).with_timetoken(tt0).execute()
        await c.async_wait_messages(330, timeout=30)
        await asyncio.sleep(0.3)
        assert_exactly_once_in_order(c.snapshot(), expected)


# ----------------------------------------------------------------------------------- raw cursor

def test_raw_pages_are_100_oldest_first_exactly_once(origin):
    """The wire-level rule behind the SDK tests: pages of at most 100, the cursor of a full page
    is its last timetoken, and following cursors visits every message once."""
    ch = unique("pages")
    tt0 = publish(origin, ch, "start")
    expected = publish_batch(origin, ch, 250, "paged")
    seen = []
    cursor = tt0
    sizes = []
    for _ in range(10):
        r = subscribe_raw(origin, ch, cursor, timeout=10)
        assert r.status == 200, r
        body = r.json()
        msgs = body["m"]
        sizes.append(len(msgs))
        if not msgs:
            break
        assert len(msgs) <= 100
        tts = [int(m["p"]["t"]) for m in msgs]
        assert tts == sorted(tts) and tts[0] > cursor
        assert int(body["t"]["t"]) >= tts[-1]
        assert body["t"]["r"] != 0
        if len(msgs) == 100:
            assert int(body["t"]["t"]) == tts[-1]
        seen += [(int(m["p"]["t"]), m["d"]) for m in msgs]
        cursor = int(body["t"]["t"])
        if len(seen) == 250:
            break
    assert sizes[:3] == [100, 100, 50]
    assert seen == sorted(expected, key=lambda e: e[0])


@pytest.mark.asyncio
@pytest.mark.parametrize("graceful", [True, False], ids=["sigterm", "sigkill"])
async def test_asyncio_live_subscriber_survives_restart(server_factory, graceful):
    """The event engine keeps its cursor through ReceiveReconnecting, so messages published
    after the server comes back (same port) arrive exactly once."""
    srv = server_factory.start(args=["--subscribe-timeout", "20"])
    ch = unique("alive")
    async with aclient(srv.origin, reconnect_policy=_linear(), reconnection_interval=0.5,
                       maximum_reconnection_retries=-1) as pn:
        c, tt0 = await async_first_message(pn, ch, srv.origin)
        before = await asyncio.to_thread(publish_batch, srv.origin, ch, 20, "before")
        await c.async_wait_messages(21)
        await asyncio.to_thread(srv.restart, graceful)
        after = await asyncio.to_thread(publish_batch, srv.origin, ch, 150, "after")
        expected = [(tt0, {"tag": "first"})] + before + after

        def distinct():
            return len({m.timetoken for m in c.snapshot()})
        await async_wait_until(lambda: distinct() >= 171, 30, what="171 distinct messages")
        await asyncio.sleep(0.3)
        got = c.snapshot()
        # SDK 10.8.0 bug (event_engine/effects.py, ReconnectEffect.run: `timetoken =
        # int(self.invocation.timetoken) if self.invocation.timetoken else cursor['t']`): after
        # ReceiveReconnectSuccess the engine keeps the *old* cursor, so its next request repeats
        # the reconnect request and the reconnect page is emitted twice. The server answers
        # both identical requests identically; tolerate exactly that replay and nothing else.
        first_seen, replayed = [], []
        for m in got:
            (replayed if m.timetoken in {x.timetoken for x in first_seen} else first_seen).append(m)
        assert_exactly_once_in_order(first_seen, expected)
        if replayed:
            tts = [m.timetoken for m in first_seen]
            start = tts.index(replayed[0].timetoken)
            assert [m.timetoken for m in replayed] == tts[start:start + len(replayed)], "replay is not one page"
            assert len(replayed) <= 100
            assert [m.timetoken for m in got] == tts[:start + len(replayed)] + tts[start:], "replay not contiguous"
        assert not any(s.category == PNStatusCategory.PNDisconnectedCategory for s in c.statuses), c.categories()


# ------------------------------------------------------------------- raw cursor: harder shapes

def drain(origin, channels, tt, expect: int, max_pages: int = 60):
    """Follows cursors from `tt` until `expect` envelopes arrived, then once more to see that
    nothing else follows (the server's long-poll timeout must be short). Returns
    (envelopes, page sizes)."""
    seen, sizes = [], []
    for _ in range(max_pages):
        r = subscribe_raw(origin, channels, tt, timeout=15)
        assert r.status == 200, r
        body = r.json()
        sizes.append(len(body["m"]))
        assert len(body["m"]) <= 100
        seen += body["m"]
        tt = body["t"]["t"]
        if len(seen) >= expect:
            break
    r = subscribe_raw(origin, channels, tt, timeout=15)
    assert r.json()["m"] == [], "more envelopes than expected"
    return seen, sizes


@pytest.fixture
def quick_server(server_factory):
    return server_factory.start(args=["--subscribe-timeout", "1"])


def test_raw_catch_up_merges_several_channels_in_global_order(quick_server):
    o = quick_server.origin
    chans = [unique(f"mc{i}") for i in range(3)]
    t0 = server_time(o)
    items = [(chans[i % 3], {"i": i}, {}) for i in range(450)]
    tts = publish_many(o, items)
    seen, sizes = drain(o, chans, t0, 450)
    assert sizes[:5] == [100, 100, 100, 100, 50]
    by_tt = dict(zip(tts, items))
    assert [int(m["p"]["t"]) for m in seen] == sorted(tts)
    assert all((m["c"], m["d"]) == by_tt[int(m["p"]["t"])][:2] for m in seen)
    assert all("b" not in m or m["b"] == m["c"] for m in seen)


def test_raw_catch_up_wildcard_beyond_window(quick_server):
    """More than 100 messages on channels matching `prefix.*`: the window has only the newest,
    the rest come from the store; `b` names the pattern."""
    o = quick_server.origin
    prefix = unique("wq").replace("-", "")
    t0 = server_time(o)
    tts = publish_many(o, [(f"{prefix}.{i % 2}", {"i": i}, {}) for i in range(300)])
    publish(o, f"{prefix}x.0", "not-matching")
    seen, sizes = drain(o, f"{prefix}.*", t0, 300)
    assert [int(m["p"]["t"]) for m in seen] == sorted(tts)
    assert {m["b"] for m in seen} == {f"{prefix}.*"}
    assert {m["c"] for m in seen} == {f"{prefix}.0", f"{prefix}.1"}


def test_raw_catch_up_wildcard_across_restart(quick_server):
    o = quick_server.origin
    prefix = unique("rw").replace("-", "")
    t0 = server_time(o)
    before = publish_many(o, [(f"{prefix}.{i % 3}", {"i": i}, {}) for i in range(250)])
    quick_server.restart()
    after = publish_many(o, [(f"{prefix}.{i % 3}", {"j": i}, {}) for i in range(20)])
    seen, _ = drain(o, f"{prefix}.*", t0, 270)
    assert [int(m["p"]["t"]) for m in seen] == sorted(before + after)
    assert {m["b"] for m in seen} == {f"{prefix}.*"}


def test_raw_unstored_messages_beyond_the_window_are_gone(quick_server):
    """Like PubNub: only the newest 100 events of a channel stay in memory; older store=0
    messages are not delivered on catch-up, stored ones come from the store."""
    o = quick_server.origin
    ch = unique("vol")
    t0 = server_time(o)
    tts = publish_many(o, [(ch, {"i": i}, {"store": "0"}) for i in range(150)])
    seen, _ = drain(o, ch, t0, 100)
    assert [int(m["p"]["t"]) for m in seen] == sorted(tts)[-100:]

    mixed = unique("mix")
    t0 = server_time(o)
    items = [(mixed, {"i": i}, {"store": str(i % 2)}) for i in range(300)]
    tts = publish_many(o, items)
    stored = {tt for tt, (_, _, p) in zip(tts, items) if p["store"] == "1"}
    newest_100 = set(sorted(tts)[-100:])
    expected = sorted(stored | newest_100)
    seen, _ = drain(o, mixed, t0, len(expected))
    assert [int(m["p"]["t"]) for m in seen] == expected


# ----------------------------------------------------------- live delivery under concurrent publishing

def follow(origin, channels, tt, expect: int, out: list, deadline: float):
    """A raw subscriber: follows cursors from `tt`, appending envelopes to `out`, until it has
    `expect` of them or `deadline` passes."""
    while len(out) < expect and time.monotonic() < deadline:
        r = subscribe_raw(origin, channels, tt, timeout=30)
        assert r.status == 200, r
        body = r.json()
        out.extend(body["m"])
        tt = body["t"]["t"]


def test_live_subscribers_get_concurrent_publishes_exactly_once_in_order(server_factory, make_pubnub):
    """Stored and unstored publishes from 16 connections race (stored ones wait for the fsync'd
    commit, unstored ones do not); every live subscriber — raw long-polls and the threaded SDK —
    sees each message once, in timetoken order, with no gaps."""
    import threading

    # One third of the messages are not stored, so they can only be caught up from the in-memory
    # window; on a loaded 2-core machine a follower can fall more than PubNub's 100 events behind,
    # so the window is raised for this test (the default is covered by the window tests).
    srv_config_path = os.path.join(tempfile.mkdtemp(), "window.json")
    with open(srv_config_path, "w") as f:
        json.dump({"window": {"capacity": 5000}}, f)
    srv = server_factory.start(args=["--subscribe-timeout", "5", "--config", srv_config_path])
    ch = unique("live")
    pn = make_pubnub(origin=srv.origin)
    sdk = Collector()
    pn.add_listener(sdk)
    pn.subscribe().channels([ch]).execute()
    sdk.wait_connected()

    n = 1500
    t0 = server_time(srv.origin)
    outs = [[] for _ in range(4)]
    deadline = time.monotonic() + 60
    threads = [threading.Thread(target=follow, args=(srv.origin, ch, t0, n, out, deadline)) for out in outs]
    for t in threads:
        t.start()
    items = [(ch, {"i": i}, {"store": "0" if i % 3 == 0 else "1"}) for i in range(n)]
    tts = publish_many(srv.origin, items, workers=16)
    expected = sorted(zip(tts, [m for _, m, _ in items]), key=lambda e: e[0])
    for t in threads:
        t.join(70)
    for out in outs:
        got = [(int(m["p"]["t"]), m["d"]) for m in out]
        assert len(got) == n, f"raw subscriber got {len(got)} of {n}"
        assert got == expected
    sdk.wait_messages(n, timeout=30)
    time.sleep(0.3)
    assert_exactly_once_in_order(sdk.snapshot(), expected)
