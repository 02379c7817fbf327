"""Subscribe filter expressions through the real PubNub Python SDK (`config.filter_expression`,
sent as `filter-expr`; messages published with `meta`).

Spec: docs/filter-expressions.md, pubnub-wire §10 and §3 (481).

SDK behaviours these tests pin down (pubnub 10.8.0): the SDK has no
`PNMalformedFilterExpressionCategory` mapping (the enum exists, value 12, but is never produced):
a 481 is reported with `PNUnknownCategory` and `status_code` 481 by REST-style calls and by the
threaded subscribe manager and `PubNubAsyncio`'s `AsyncioSubscriptionManager` (operation
Subscribe, followed by Disconnected when reconnection is off). `PubNubAsyncio`'s default event
engine never sends `filter-expr` at all: its subscribers silently receive everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from pubnub.endpoints.pubsub.subscribe import Subscribe
from pubnub.enums import PNOperationType, PNReconnectionPolicy, PNStatusCategory

from helpers import (DEMO_KEYSET, SECURE_KEYSET, Collector, async_wait_until, get, make_config, query, status_body,
                     stop_asyncio_clients, threaded_clients, unique, wait_until, write_keysets_config)

pytestmark = pytest.mark.timeout(60)

MISSING = object()  # a message published without meta

# (expression, [(payload, meta, delivered?)]); the last message of every case matches, so once
# it has arrived everything before it has been filtered (delivery is in publish order).
CASES = [
    pytest.param('meta.priority == "high"', [
        ("a", {"priority": "high"}, True),
        ("b", {"priority": "low"}, False),
        ("c", {"priority": "HIGH"}, False),
        ("d", MISSING, False),
        ("e", {"other": "high"}, False),
        ("f", {"priority": ["high"]}, False),
        ("g", {"priority": "high", "x": 1}, True),
    ], id="meta-equality"),
    pytest.param("meta.score > 80", [
        ("95", {"score": 95}, True),
        ("80", {"score": 80}, False),
        ("80.5", {"score": 80.5}, True),
        ("'90'", {"score": "90"}, True),
        ("'abc'", {"score": "abc"}, False),
        ("missing", {"points": 99}, False),
        ("null", {"score": None}, False),
        ("1e3", {"score": 1e3}, True),
    ], id="numeric-comparison"),
    pytest.param("meta.region LIKE 'us-*'", [
        ("us-east", {"region": "us-east"}, True),
        ("US-West", {"region": "US-West"}, True),
        ("eu-west", {"region": "eu-west"}, False),
        ("us", {"region": "us"}, False),
        ("xus-east", {"region": "xus-east"}, False),
        ("array", {"region": ["eu-1", "us-2"]}, True),
        ("no meta", MISSING, False),
        ("us-", {"region": "us-"}, True),
    ], id="like"),
    pytest.param("meta.tags CONTAINS 'news'", [
        ("member", {"tags": ["news", "sport"]}, True),
        ("not a member", {"tags": ["newsletter"]}, False),
        ("substring", {"tags": "breaking news today"}, True),
        ("case", {"tags": "NEWS"}, False),
        ("missing", {}, False),
        ("last member", {"tags": ["a", "news"]}, True),
    ], id="contains"),
    pytest.param("meta.a == 1 && (meta.b == 'x' || meta.c > 5)", [
        ("a1 bx", {"a": 1, "b": "x"}, True),
        ("a1 c6", {"a": 1, "c": 6}, True),
        ("a1 c5", {"a": 1, "c": 5}, False),
        ("a2 bx", {"a": 2, "b": "x"}, False),
        ("no a", {"b": "x", "c": 9}, False),
        ("a'1' bx", {"a": "1", "b": "x"}, True),
    ], id="and-or"),
    pytest.param("data.user.role == 'admin' && data.score >= 10", [
        ({"user": {"role": "admin"}, "score": 10}, {}, True),
        ({"user": {"role": "admin"}, "score": 9}, {}, False),
        ({"user": {"role": "guest"}, "score": 99}, MISSING, False),
        ("plain string", {"user": {"role": "admin"}, "score": 50}, False),
        ({"user": "admin", "score": 50}, {}, False),
        ({"user": {"role": "admin"}, "score": "12"}, MISSING, True),
    ], id="data-paths"),
    pytest.param("!(meta.uuid == 'me')", [
        ("mine", {"uuid": "me"}, False),
        ("theirs", {"uuid": "you"}, True),
        ("no meta", MISSING, True),
        ("mine again", {"uuid": "me"}, False),
        ("no uuid", {"x": 1}, True),
    ], id="negation-missing-counts-as-different"),
    pytest.param("meta.id % 10 == 0 || (3,5,9) contains meta.n", [
        ("10", {"id": 10}, True),
        ("15", {"id": 15}, False),
        ("'30'", {"id": "30"}, True),
        ("n5", {"n": 5}, True),
        ("n4", {"n": 4}, False),
        ("n'9'", {"n": "9"}, True),
    ], id="arithmetic-and-list"),
    pytest.param("region == 'eu' && meta.n > (meta.a + meta.b)", [
        ("yes", {"region": "eu", "n": 4, "a": 1, "b": 2}, True),
        ("equal", {"region": "eu", "n": 3, "a": 1, "b": 2}, False),
        ("wrong region", {"region": "us", "n": 9, "a": 1, "b": 2}, False),
        ("yes again", {"region": "eu", "n": 10, "a": 4, "b": 5}, True),
    ], id="legacy-bare-name-and-computed"),
]


@pytest.fixture(scope="module")
def fserver(module_server_factory, tmp_path_factory):
    """The demo keyset and the access-enforcing `secure` keyset."""
    config = write_keysets_config(str(tmp_path_factory.mktemp("filter-config")), [DEMO_KEYSET, SECURE_KEYSET])
    return module_server_factory.start(args=["--config", config, "--subscribe-timeout", "20"])


@pytest.fixture
def threaded():
    with threaded_clients(DEMO_KEYSET) as make:
        yield make


def publish_all(publisher, ch, messages) -> list[int]:
    tts = []
    for payload, meta, _ in messages:
        builder = publisher.publish().channel(ch).message(payload)
        if meta is not MISSING:
            builder = builder.meta(meta)
        tts.append(builder.sync().result.timetoken)
    return tts


def expected(messages, tts) -> list:
    return [(payload, tt) for (payload, _, match), tt in zip(messages, tts) if match]


def subscribed(pn, channels) -> Collector:
    """Subscribes and waits for the first answer: Connected, or fails at once on an error status."""
    c = Collector()
    pn.add_listener(c)
    pn.subscribe().channels(channels).execute()
    wait_until(lambda: c.statuses, 10, what="the first subscribe status")
    first = c.statuses[0]
    assert first.category == PNStatusCategory.PNConnectedCategory, (
        first.category, first.status_code, status_body(first) if first.error_data else None)
    return c


def received_until(c: Collector, last_tt: int, timeout: float = 10.0) -> list:
    wait_until(lambda: any(m.timetoken == last_tt for m in c.snapshot()), timeout,
               what=f"the last matching message (got {[(m.message, m.timetoken) for m in c.snapshot()]})")
    return [(m.message, m.timetoken) for m in c.snapshot()]


# ----------------------------------------------------------------------------- matching messages

@pytest.mark.parametrize("expression,messages", CASES)
def test_filtered_subscription_receives_exactly_the_matching_messages(threaded, fserver, expression, messages):
    assert messages[-1][2], "the last message of a case must match"
    ch = unique("flt")
    sub = threaded(fserver.origin, filter_expression=expression)
    c = subscribed(sub, [ch])
    tts = publish_all(threaded(fserver.origin), ch, messages)
    assert received_until(c, tts[-1]) == expected(messages, tts)
    assert all(m.channel == ch for m in c.snapshot())


def test_each_subscriber_gets_its_own_subset(threaded, fserver):
    """Three subscribers on one channel, two filtered differently and one not."""
    ch = unique("flt")
    high = subscribed(threaded(fserver.origin, filter_expression="meta.level >= 3"), [ch])
    low = subscribed(threaded(fserver.origin, filter_expression="meta.level < 3"), [ch])
    everyone = subscribed(threaded(fserver.origin), [ch])
    publisher = threaded(fserver.origin)
    tts = [publisher.publish().channel(ch).message(f"level {n}").meta({"level": n}).sync().result.timetoken
           for n in (1, 4, 2, 3, 5, 0)]
    tts.append(publisher.publish().channel(ch).message("no meta").sync().result.timetoken)
    everything = received_until(everyone, tts[-1])
    assert everything == [(f"level {n}", tt) for n, tt in zip((1, 4, 2, 3, 5, 0), tts)] + [("no meta", tts[-1])]
    assert received_until(high, tts[4]) == [("level 4", tts[1]), ("level 3", tts[3]), ("level 5", tts[4])]
    assert received_until(low, tts[5]) == [("level 1", tts[0]), ("level 2", tts[2]), ("level 0", tts[5])]
    time.sleep(0.2)  # the meta-less message must not reach the filtered subscribers late
    assert len(high.snapshot()) == 3 and len(low.snapshot()) == 3


def test_filter_applies_to_wildcard_and_several_channels(threaded, fserver):
    prefix = unique("wc").replace("-", "")
    plain = unique("plain")
    c = subscribed(threaded(fserver.origin, filter_expression="meta.keep == 'yes'"), [f"{prefix}.*", plain])
    publisher = threaded(fserver.origin)
    sent = []
    for ch in (f"{prefix}.a", plain, f"{prefix}.b"):
        for keep in ("no", "yes"):
            sent.append((ch, keep, publisher.publish().channel(ch).message(f"{ch}/{keep}").meta({"keep": keep})
                         .sync().result.timetoken))
    received_until(c, sent[-1][2])
    time.sleep(0.1)
    assert sorted((m.channel, m.message, m.timetoken) for m in c.snapshot()) == sorted(
        (ch, f"{ch}/{keep}", tt) for ch, keep, tt in sent if keep == "yes")


async def asyncio_filtered_run(origin, manager=None):
    """Subscribes a `PubNubAsyncio` client (with `manager` as subscription manager) filtered on
    `meta.kind == 'alert' && data.level > 2`, publishes four messages; returns (received, sent)."""
    from pubnub.pubnub_asyncio import PubNubAsyncio
    ch = unique("flt")
    sub = PubNubAsyncio(make_config(origin, unique("user"), filter_expression="meta.kind == 'alert' && data.level > 2"),
                        subscription_manager=manager)
    pub = PubNubAsyncio(make_config(origin, unique("user")))
    try:
        c = Collector()
        sub.add_listener(c)
        sub.subscribe().channels([ch]).execute()
        await c.async_wait_connected()
        sent = []
        for kind, level in (("alert", 3), ("info", 9), ("alert", 1), ("alert", 7)):
            env = await pub.publish().channel(ch).message({"level": level}).meta({"kind": kind}).future()
            sent.append(({"level": level}, env.result.timetoken))
        await async_wait_until(lambda: any(m.timetoken == sent[-1][1] for m in c.snapshot()), 10,
                               what="the last matching message")
        await asyncio.sleep(0.1)
        return [(m.message, m.timetoken) for m in c.snapshot()], sent
    finally:
        await stop_asyncio_clients((sub, pub), subscribed=(sub,))


@pytest.mark.asyncio
async def test_asyncio_filtered_subscription(fserver):
    """`PubNubAsyncio` with its non-event-engine `AsyncioSubscriptionManager` sends `filter-expr`."""
    from pubnub.pubnub_asyncio import AsyncioSubscriptionManager
    received, sent = await asyncio_filtered_run(fserver.origin, AsyncioSubscriptionManager)
    assert received == [sent[0], sent[3]]


@pytest.mark.asyncio
async def test_asyncio_event_engine_never_sends_the_filter(fserver):
    """SDK behaviour (pubnub 10.8.0): the event engine (`PubNubAsyncio`'s default) builds its
    handshake and receive requests without `filter-expr`, so `config.filter_expression` is
    silently ignored and every message arrives."""
    received, sent = await asyncio_filtered_run(fserver.origin)
    assert received == sent


SIGNED_FILTER = "meta.tag == 'keep me' && (data.n % 2 == 0 || meta.x LIKE '*&*')"
SIGNED_MESSAGES = [({"n": 1}, {"tag": "keep me"}, False), ({"n": 2}, {"tag": "keep me"}, True),
                   ({"n": 3}, {"tag": "keep me", "x": "a&b"}, True), ({"n": 4}, {"tag": "drop"}, False),
                   ({"n": 6}, {"tag": "keep me"}, True)]


def test_token_holder_filtered_subscription(threaded, fserver):
    """On an access-enforcing keyset a token holder's filtered subscribe is checked like any
    subscribe and filtered like any other."""
    from pubnub.models.consumer.v3.channel import Channel
    ch = unique("sflt")
    admin = threaded(fserver.origin, "admin", keyset=SECURE_KEYSET, admin=True)
    token = admin.grant_token().ttl(5).channels([Channel.id(ch).read()]).sync().result.token
    holder = threaded(fserver.origin, keyset=SECURE_KEYSET, filter_expression=SIGNED_FILTER)
    holder.set_token(token)
    c = subscribed(holder, [ch])
    tts = publish_all(admin, ch, SIGNED_MESSAGES)
    assert received_until(c, tts[-1]) == expected(SIGNED_MESSAGES, tts)
    # Without read access the filter changes nothing: 403 first.
    r = get(fserver.origin, f"/v2/subscribe/sub-s/{unique()}/0" + query(
        {"tt": 0, "uuid": "x", "auth": token, "filter-expr": SIGNED_FILTER}))
    assert r.status == 403, r


def test_signed_admin_filtered_subscription(threaded, fserver):
    """The Python SDK signs `filter-expr` double-encoded (pubnub-wire §12 quirk); an admin
    subscriber with a filter must still be let through."""
    ch = unique("sflt")
    admin = threaded(fserver.origin, "admin", keyset=SECURE_KEYSET, admin=True, filter_expression=SIGNED_FILTER)
    c = subscribed(admin, [ch])
    tts = publish_all(threaded(fserver.origin, "admin", keyset=SECURE_KEYSET, admin=True), ch, SIGNED_MESSAGES)
    assert received_until(c, tts[-1]) == expected(SIGNED_MESSAGES, tts)


# --------------------------------------------------------------------------- malformed: 481

MALFORMED = ["meta.a ==", "(meta.a == 1", "meta.a === 1", "meta.a", "meta.a == 'abc", "meta.a == 1 ||",
             "meta.a == 1 == 2", "!", "(" * 40 + "meta.a == 1" + ")" * 40, "meta.x == " + "1" * 5000]


def assert_481_body(body):
    assert isinstance(body, dict), body
    assert (body.get("status"), body.get("error"), body.get("service")) == (481, True, "Subscribe"), body
    assert isinstance(body.get("message"), str) and body["message"], body


@pytest.mark.parametrize("expression", MALFORMED, ids=range(len(MALFORMED)))
def test_malformed_expression_raw_481(fserver, expression):
    for tt in ("0", str(int(time.time() * 10_000_000))):
        r = get(fserver.origin, f"/v2/subscribe/demo/{unique()}/0" + query(
            {"tt": tt, "uuid": "raw", "filter-expr": expression}))
        assert r.status == 481, r
        assert_481_body(r.json())


def test_malformed_expression_threaded_subscriber(threaded, fserver):
    pn = threaded(fserver.origin, filter_expression="meta.a == (1", reconnect_policy=PNReconnectionPolicy.NONE)
    c = Collector()
    pn.add_listener(c)
    pn.subscribe().channels([unique()]).execute()
    wait_until(lambda: len(c.statuses) >= 2, 10, what="the 481 and Disconnected statuses")
    first, second = c.statuses[:2]
    assert (first.category, first.status_code, first.operation, first.is_error()) == (
        PNStatusCategory.PNUnknownCategory, 481, PNOperationType.PNSubscribeOperation, True)
    assert_481_body(status_body(first))
    assert second.category == PNStatusCategory.PNDisconnectedCategory
    assert not c.has_category(PNStatusCategory.PNConnectedCategory)


@pytest.mark.asyncio
async def test_malformed_expression_sdk_subscribe_request(sdk, fserver):
    pn = sdk.make(fserver.origin, unique("user"), filter_expression="meta.a LIKE")
    err = await sdk.call_error(Subscribe(pn).channels([unique()]).timetoken(0)
                               .filter_expression(pn.config.filter_expression))
    assert (err.status_code, err.category, err.operation) == (
        481, PNStatusCategory.PNUnknownCategory, PNOperationType.PNSubscribeOperation)
    assert_481_body(err.body)


@pytest.mark.asyncio
async def test_malformed_expression_asyncio_subscriber(fserver):
    """`AsyncioSubscriptionManager` announces the 481 like the threaded manager (with
    reconnection off it then stops without a Disconnected status)."""
    from pubnub.pubnub_asyncio import AsyncioSubscriptionManager, PubNubAsyncio
    pn = PubNubAsyncio(make_config(fserver.origin, unique("user"), filter_expression="meta.a == 'x' &&",
                                   reconnect_policy=PNReconnectionPolicy.NONE),
                       subscription_manager=AsyncioSubscriptionManager)
    try:
        c = Collector()
        pn.add_listener(c)
        pn.subscribe().channels([unique()]).execute()
        await async_wait_until(lambda: c.statuses, 5, what="the 481 status")
        first = c.statuses[0]
        assert (first.category, first.status_code, first.operation) == (
            PNStatusCategory.PNUnknownCategory, 481, PNOperationType.PNSubscribeOperation)
        assert_481_body(status_body(first))
        assert not c.has_category(PNStatusCategory.PNConnectedCategory)
    finally:
        with contextlib.suppress(Exception):
            pn.unsubscribe_all()
        await asyncio.sleep(0)
        await pn.stop()
