"""Access Manager with the real PubNub Python SDK (threaded `PubNub` and `PubNubAsyncio`).

A server with the `secure` keyset (secret key `s3cret`: access enforced) and the `other` keyset.
Admin clients carry the secret key and sign every request; user clients present a v2 auth key
(`auth_key`) or a v3 token (`set_token`). Spec: docs/security.md, pubnub-wire §11, §12.

SDK behaviours these tests pin down (pubnub 10.8.0):
- REST calls denied with 403 report `PNAccessDeniedCategory` with the body of pubnub-wire §3.
- The threaded (native) subscribe manager reports a 403 as `PNAccessDeniedCategory` on the
  *Unsubscribe* operation, then unsubscribes everything.
- The asyncio event engine never reports `PNAccessDeniedCategory` for subscribe: a denied
  handshake retries like any failure; with reconnection off it gives up at once with a bare
  `PNConnectionErrorCategory` (no status code, no body), and a denied long-poll with
  `PNUnexpectedDisconnectCategory`. The SDK's `Subscribe` endpoint itself does report 403.
"""

from __future__ import annotations

import threading
import time

import pytest
from pubnub.endpoints.pubsub.subscribe import Subscribe
from pubnub.enums import PNOperationType, PNReconnectionPolicy, PNStatusCategory
from pubnub.exceptions import PubNubException
from pubnub.models.consumer.v3.channel import Channel
from pubnub.models.consumer.v3.group import Group

from helpers import (OTHER_KEYSET, SECURE_KEYSET, Collector, async_wait_until, forbidden_body, get, keyset_overrides,
                     make_config, q, query, sdk_error_status, signed_request, status_body, stop_asyncio_clients,
                     threaded_clients, unique, wait_until, write_keysets_config)

pytestmark = pytest.mark.timeout(60)

SUB = SECURE_KEYSET["subscribeKey"]
PUB = SECURE_KEYSET["publishKey"]
ACCESS_DENIED = PNStatusCategory.PNAccessDeniedCategory
# Every grant/audit row the SDK parses, as (read, write, manage, delete).
RW = (True, True, False, False)
R = (True, False, False, False)


@pytest.fixture(scope="module")
def am(module_server_factory, tmp_path_factory):
    """One server with the access keysets for the whole module (tests use unique names)."""
    config = write_keysets_config(str(tmp_path_factory.mktemp("am-config")))
    return module_server_factory.start(args=["--config", config, "--subscribe-timeout", "20"])


@pytest.fixture
def threaded():
    """Factory of threaded `PubNub` clients on the `secure` keyset of any origin."""
    with threaded_clients(SECURE_KEYSET) as make:
        yield make


def secure(sdk, origin, uuid=None, admin=False, **overrides):
    """A client of the `sdk` flavour on the `secure` keyset."""
    return sdk.make(origin, uuid, **keyset_overrides(SECURE_KEYSET, admin=admin, **overrides))


def perms(data) -> tuple:
    return (data.read_enabled, data.write_enabled, data.manage_enabled, data.delete_enabled)


def auth_rows(result) -> dict:
    """{channel or group: {auth key: (r, w, m, d)}} of a v2 grant/audit result."""
    rows = {}
    for name, data in list(result.channels.items()) + list(result.groups.items()):
        rows[name] = {k: perms(v) for k, v in (data.auth_keys or {}).items()}
    return rows


def history_raw(origin, channel, **params) -> list:
    """Messages of `channel` on the secure keyset, read by a signed (admin) request."""
    r = signed_request(origin, "GET", SECURE_KEYSET, f"/v2/history/sub-key/{SUB}/channel/{q(channel)}",
                       {"uuid": "auditor", **params})
    assert r.status == 200, r
    return r.json()[0]


def here_now_uuids(origin, channel) -> list:
    """The uuids present on `channel` (signed here-now): a long-poll's arrival shows up here."""
    r = signed_request(origin, "GET", SECURE_KEYSET, f"/v2/presence/sub-key/{SUB}/channel/{q(channel)}",
                       {"uuid": "auditor"})
    assert r.status == 200, r
    return r.json().get("uuids", [])


def long_poll_in_thread(origin, channel, tt, **params):
    """Starts a raw subscribe long-poll on a thread; returns (thread, result dict)."""
    out = {}

    def run():
        t0 = time.monotonic()
        p = {"tt": str(tt), **params}
        out["resp"] = get(origin, f"/v2/subscribe/{SUB}/{q(channel)}/0" + query(p), timeout=40)
        out["answered"] = time.monotonic()
        out["elapsed"] = out["answered"] - t0
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def current_tt(origin) -> int:
    r = get(origin, "/time/0")
    assert r.status == 200, r
    return r.json()[0]


# ---------------------------------------------------------------------------------- v2 grants

@pytest.mark.asyncio
async def test_v2_grant_and_audit(sdk, am):
    admin = secure(sdk, am.origin, "admin", admin=True)
    a, b, k = unique("g2a"), unique("g2b"), unique("auth")
    env = await sdk.call(admin.grant().channels([a, b]).auth_keys([k]).read(True).write(True).ttl(5))
    assert env.status.status_code == 200 and env.status.operation == PNOperationType.PNAccessManagerGrant
    r = env.result
    assert (r.level, r.subscribe_key, r.ttl) == ("user", SUB, 5)
    assert auth_rows(r) == {a: {k: RW}, b: {k: RW}}

    env = await sdk.call(admin.audit().channels([a]).auth_keys([k]))
    assert env.status.operation == PNOperationType.PNAccessManagerAudit
    r = env.result
    assert (r.level, r.subscribe_key, r.ttl) == ("user", SUB, 5)
    assert auth_rows(r) == {a: {k: RW}}

    # A channel-level grant for everyone (no auth key): no expiry.
    c = unique("g2c")
    env = await sdk.call(admin.grant().channels([c]).read(True).ttl(0))
    r = env.result
    assert (r.level, r.ttl) == ("channel", 0)
    assert {n: perms(d) for n, d in r.channels.items()} == {c: R}

    # A group grant with an auth key.
    g = unique("grp")
    env = await sdk.call(admin.grant().channel_groups([g]).auth_keys([k]).manage(True).read(True).ttl(5))
    r = env.result
    assert (r.level, r.ttl) == ("channel-group+auth", 5)
    assert auth_rows(r) == {g: {k: (True, False, True, False)}}
    env = await sdk.call(admin.audit().channel_groups([g]))
    assert auth_rows(env.result) == {g: {k: (True, False, True, False)}}

    # Revoking (every flag 0) removes the row: audit no longer lists it.
    await sdk.call(admin.grant().channels([b]).auth_keys([k]).read(False).write(False).manage(False).delete(False))
    env = await sdk.call(admin.audit().channels([a, b]).auth_keys([k]))
    assert auth_rows(env.result) == {a: {k: RW}}


@pytest.mark.asyncio
async def test_v2_auth_key_allowed_where_granted_denied_elsewhere(sdk, am):
    admin = secure(sdk, am.origin, "admin", admin=True)
    k = unique("auth")
    rw, ro, closed, closed2 = unique("rw"), unique("ro"), unique("closed"), unique("closed")
    g, g_other = unique("grp"), unique("grp")
    await sdk.call(admin.grant().channels([rw]).auth_keys([k]).read(True).write(True).ttl(5))
    await sdk.call(admin.grant().channels([ro]).auth_keys([k]).read(True).ttl(5))
    await sdk.call(admin.grant().channel_groups([g]).auth_keys([k]).manage(True).ttl(5))
    seeded = (await sdk.call(admin.publish().channel(ro).message("from-admin"))).result.timetoken

    user = secure(sdk, am.origin, unique("user"), auth_key=k)
    tt = (await sdk.call(user.publish().channel(rw).message({"n": 1}))).result.timetoken
    env = await sdk.call(user.history().channel(rw).include_timetoken(True))
    assert [(m.entry, m.timetoken) for m in env.result.messages] == [({"n": 1}, tt)]
    env = await sdk.call(user.history().channel(ro).include_timetoken(True))
    assert [(m.entry, m.timetoken) for m in env.result.messages] == [("from-admin", seeded)]
    env = await sdk.call(user.fetch_messages().channels([rw, ro]))
    assert {ch: [m.message for m in items] for ch, items in env.result.channels.items()} == \
        {rw: [{"n": 1}], ro: ["from-admin"]}
    env = await sdk.call(user.here_now().channels([rw]))
    assert env.result.total_occupancy == 0

    # Denied: only the resources without the permission are listed.
    err = await sdk.call_error(user.publish().channel(ro).message("no write"))
    assert (err.status_code, err.category, err.operation) == (403, ACCESS_DENIED, PNOperationType.PNPublishOperation)
    assert err.body == forbidden_body([ro])
    err = await sdk.call_error(user.publish().channel(closed).message("x"))
    assert (err.status_code, err.category, err.body) == (403, ACCESS_DENIED, forbidden_body([closed]))
    err = await sdk.call_error(user.history().channel(closed))
    assert (err.status_code, err.category, err.body) == (403, ACCESS_DENIED, forbidden_body([closed]))
    err = await sdk.call_error(user.fetch_messages().channels([rw, closed, ro, closed2]))
    assert (err.status_code, err.category) == (403, ACCESS_DENIED)
    assert err.body == forbidden_body([closed, closed2])
    err = await sdk.call_error(user.delete_messages().channel(rw))  # no `d`
    assert (err.status_code, err.category, err.body) == (403, ACCESS_DENIED, forbidden_body([rw]))
    err = await sdk.call_error(user.signal().channel(closed).message("s"))
    assert (err.status_code, err.category, err.body) == (403, ACCESS_DENIED, forbidden_body([closed]))

    # Channel groups: `manage` on the group.
    env = await sdk.call(user.add_channel_to_channel_group().channels([rw, ro]).channel_group(g))
    assert env.status.status_code == 200
    env = await sdk.call(user.list_channels_in_channel_group().channel_group(g))
    assert sorted(env.result.channels) == sorted([rw, ro])
    err = await sdk.call_error(user.add_channel_to_channel_group().channels([rw]).channel_group(g_other))
    assert (err.status_code, err.category) == (403, ACCESS_DENIED)
    assert err.body == forbidden_body(groups=[g_other])

    # Without an auth key nothing is granted; a wrong one is no better.
    for stranger in (secure(sdk, am.origin, unique("anon")), secure(sdk, am.origin, unique("anon"), auth_key="nope")):
        err = await sdk.call_error(stranger.publish().channel(rw).message("x"))
        assert (err.status_code, err.category, err.body) == (403, ACCESS_DENIED, forbidden_body([rw]))
    # Nothing denied was stored.
    assert [m for m in history_raw(am.origin, ro)] == ["from-admin"]
    assert history_raw(am.origin, closed) == []


@pytest.mark.asyncio
async def test_v2_keyset_level_grant_applies_to_every_channel(sdk, am):
    """A grant with an auth key and no channel is keyset level: that key reads everywhere."""
    admin = secure(sdk, am.origin, "admin", admin=True)
    k = unique("ks-auth")
    env = await sdk.call(admin.grant().auth_keys([k]).read(True).ttl(5))
    assert (env.result.level, env.result.ttl) == ("subkey", 5)
    anywhere = unique("anywhere")
    tt = (await sdk.call(admin.publish().channel(anywhere).message("hello"))).result.timetoken
    user = secure(sdk, am.origin, unique("user"), auth_key=k)
    env = await sdk.call(user.history().channel(anywhere).include_timetoken(True))
    assert [(m.entry, m.timetoken) for m in env.result.messages] == [("hello", tt)]
    err = await sdk.call_error(user.publish().channel(anywhere).message("x"))
    assert (err.status_code, err.category, err.body) == (403, ACCESS_DENIED, forbidden_body([anywhere]))


@pytest.mark.asyncio
async def test_sdk_subscribe_request_denied_lists_only_denied_channels(sdk, am):
    """The SDK's own subscribe request (what both subscribe managers send) reports the 403."""
    admin = secure(sdk, am.origin, "admin", admin=True)
    k = unique("auth")
    ok1, ok2, no1, no2 = unique("ok"), unique("ok"), unique("no"), unique("no")
    g_ok, g_no = unique("grp"), unique("grp")
    await sdk.call(admin.grant().channels([ok1, ok2]).auth_keys([k]).read(True).ttl(5))
    await sdk.call(admin.grant().channel_groups([g_ok]).auth_keys([k]).read(True).ttl(5))
    user = secure(sdk, am.origin, unique("user"), auth_key=k)

    env = await sdk.call(Subscribe(user).channels([ok1, ok2]).channel_groups([g_ok]).timetoken(0))
    assert env.status.status_code == 200 and int(env.result["t"]["t"]) > 0
    err = await sdk.call_error(Subscribe(user).channels([ok1, no1, ok2, no2]).timetoken(0))
    assert (err.status_code, err.category, err.operation) == (403, ACCESS_DENIED, PNOperationType.PNSubscribeOperation)
    # (The SDK sorts the channel names in the subscribe path; the server lists them in path order.)
    assert err.body == forbidden_body(sorted([no1, no2]))
    err = await sdk.call_error(Subscribe(user).channels([ok1]).channel_groups([g_ok, g_no]).timetoken(0))
    assert (err.status_code, err.category) == (403, ACCESS_DENIED)
    assert err.body == forbidden_body(groups=[g_no])
    # Presence channels need their own grant.
    err = await sdk.call_error(Subscribe(user).channels([ok1, ok1 + "-pnpres"]).timetoken(0))
    assert err.body == forbidden_body([ok1 + "-pnpres"])


def test_threaded_subscriber_with_auth_key(threaded, am):
    origin = am.origin
    admin = threaded(origin, "admin", admin=True)
    k = unique("auth")
    ok, g, in_group, no = unique("ok"), unique("grp"), unique("ing"), unique("no")
    admin.grant().channels([ok]).auth_keys([k]).read(True).ttl(5).sync()
    admin.grant().channel_groups([g]).auth_keys([k]).read(True).ttl(5).sync()
    admin.add_channel_to_channel_group().channels([in_group]).channel_group(g).sync()

    user = threaded(origin, unique("user"), auth_key=k)
    c = Collector()
    user.add_listener(c)
    user.subscribe().channels([ok]).channel_groups([g]).execute()
    c.wait_connected()
    t1 = admin.publish().channel(ok).message("direct").sync().result.timetoken
    t2 = admin.publish().channel(in_group).message("via group").sync().result.timetoken
    got = c.wait_messages(2)
    assert sorted((m.message, m.channel, m.subscription, m.timetoken) for m in got) == sorted([
        ("direct", ok, None, t1), ("via group", in_group, g, t2)])

    # Adding a channel without a grant: the native manager reports AccessDenied on the
    # Unsubscribe operation with exactly the denied channel, then unsubscribes everything.
    user.subscribe().channels([no]).execute()
    wait_until(lambda: c.has_category(ACCESS_DENIED), 10, what="AccessDenied status")
    wait_until(lambda: user.get_subscribed_channels() == [] and user.get_subscribed_channel_groups() == [], 5,
               what="unsubscribed after the denial")
    # The unsubscribe sends a leave for every channel, `no` included; Tether refuses a leave
    # where the client has no read grant (docs/compatibility.md), so the SDK may report the
    # same denial a second time, for the leave.
    denied_all = [s for s in c.statuses if s.category == ACCESS_DENIED]
    assert 1 <= len(denied_all) <= 2
    for denied in denied_all:
        assert (denied.status_code, denied.operation, denied.is_error()) == (
            403, PNOperationType.PNUnsubscribeOperation, True)
        assert status_body(denied) == forbidden_body([no])


@pytest.mark.asyncio
async def test_asyncio_subscriber_with_auth_key(am):
    """The event engine receives where granted; a denied subscribe is reported, with
    reconnection off, as a bare PNConnectionErrorCategory (it never says AccessDenied)."""
    from pubnub.pubnub_asyncio import PubNubAsyncio
    origin = am.origin
    admin = PubNubAsyncio(make_config(origin, "admin", **keyset_overrides(SECURE_KEYSET, admin=True)))
    k = unique("auth")
    ok, no = unique("ok"), unique("no")
    await admin.grant().channels([ok]).auth_keys([k]).read(True).ttl(5).future()
    user = PubNubAsyncio(make_config(origin, unique("user"), **keyset_overrides(SECURE_KEYSET, auth_key=k)))
    denied = PubNubAsyncio(make_config(origin, unique("user"), **keyset_overrides(
        SECURE_KEYSET, auth_key=k, reconnect_policy=PNReconnectionPolicy.NONE)))
    try:
        c = Collector()
        user.add_listener(c)
        user.subscribe().channels([ok]).execute()
        await c.async_wait_connected()
        env = await admin.publish().channel(ok).message("granted").future()
        (m,) = await c.async_wait_messages(1)
        assert (m.message, m.channel, m.timetoken) == ("granted", ok, env.result.timetoken)

        d = Collector()
        denied.add_listener(d)
        t0 = time.monotonic()
        denied.subscribe().channels([ok, no]).execute()
        await async_wait_until(lambda: d.statuses, 5, what="a status for the denied handshake")
        assert time.monotonic() - t0 < 3
        (s,) = d.statuses
        assert (s.category, s.status_code, s.error_data) == (PNStatusCategory.PNConnectionErrorCategory, None, None)
    finally:
        await stop_asyncio_clients((user, denied, admin))


# -------------------------------------------------------------------------------- v3 tokens

@pytest.mark.asyncio
async def test_grant_token_and_parse_token(sdk, am):
    admin = secure(sdk, am.origin, "admin", admin=True)
    room, prefix, g = unique("room"), unique("team").replace("-", ""), unique("grp")
    before = int(time.time())
    env = await sdk.call(admin.grant_token().ttl(60).authorized_uuid("alice").meta({"purpose": "conformance"})
                         .channels([Channel.id(room).read().write(), Channel.pattern(f"^{prefix}-.*$").read()])
                         .groups([Group.id(g).read().manage()]))
    assert env.status.status_code == 200 and env.status.operation == PNOperationType.PNAccessManagerGrantToken
    token = env.result.token
    assert isinstance(token, str) and len(token) > 50
    parsed = admin.parse_token(token)
    assert before - 5 <= parsed["timestamp"] <= time.time() + 5

    def p(read=False, write=False, manage=False, delete=False):
        return {"read": read, "write": write, "manage": manage, "delete": delete, "get": False, "update": False,
                "join": False}
    assert parsed == {
        "version": 2, "timestamp": parsed["timestamp"], "ttl": 60, "authorized_uuid": "alice",
        "resources": {"channels": {room: p(read=True, write=True)}, "groups": {g: p(read=True, manage=True)},
                      "uuids": {}},
        "patterns": {"channels": {f"^{prefix}-.*$": p(read=True)}, "groups": {}, "uuids": {}},
        "meta": {"purpose": "conformance"},
    }

    # An invalid ttl is refused with PubNub's body.
    r = signed_request(am.origin, "POST", SECURE_KEYSET, f"/v3/pam/{SUB}/grant", {"uuid": "admin"},
                       body='{"ttl":0,"permissions":{"resources":{"channels":{"x":1}}}}')
    assert (r.status, r.json()) == (400, {
        "error": {"message": "Invalid ttl", "source": "grant", "details": [
            {"message": "Range should be 1 to 43200 minute(s).", "location": "ttl", "locationType": "body"}]},
        "service": "Access Manager", "status": 400})


@pytest.mark.asyncio
async def test_token_client_allowed_where_granted_denied_elsewhere(sdk, am):
    admin = secure(sdk, am.origin, "admin", admin=True)
    room, prefix, closed = unique("room"), unique("team").replace("-", ""), unique("closed")
    env = await sdk.call(admin.grant_token().ttl(60).authorized_uuid("alice")
                         .channels([Channel.id(room).read().write(), Channel.pattern(f"^{prefix}-.*$").read()]))
    token = env.result.token
    team = f"{prefix}-blue"
    seeded = (await sdk.call(admin.publish().channel(team).message("team news"))).result.timetoken

    alice = secure(sdk, am.origin, "alice")
    alice.set_token(token)
    tt = (await sdk.call(alice.publish().channel(room).message("hi"))).result.timetoken
    env = await sdk.call(alice.history().channel(room).include_timetoken(True))
    assert [(m.entry, m.timetoken) for m in env.result.messages] == [("hi", tt)]
    env = await sdk.call(alice.history().channel(team).include_timetoken(True))  # read via the pattern
    assert [(m.entry, m.timetoken) for m in env.result.messages] == [("team news", seeded)]
    env = await sdk.call(Subscribe(alice).channels([room, team]).timetoken(0))
    assert env.status.status_code == 200

    err = await sdk.call_error(alice.publish().channel(team).message("no write"))
    assert (err.status_code, err.category, err.body) == (403, ACCESS_DENIED, forbidden_body([team]))
    err = await sdk.call_error(alice.publish().channel(f"x{prefix}-blue").message("pattern is anchored"))
    assert err.body == forbidden_body([f"x{prefix}-blue"])
    err = await sdk.call_error(alice.fetch_messages().channels([room, closed, team]))
    assert (err.status_code, err.category, err.body) == (403, ACCESS_DENIED, forbidden_body([closed]))
    err = await sdk.call_error(Subscribe(alice).channels([room, closed]).timetoken(0))
    assert (err.status_code, err.category, err.body) == (403, ACCESS_DENIED, forbidden_body([closed]))

    # The token names its uuid: another uuid presenting it is refused on every resource.
    mallory = secure(sdk, am.origin, "mallory")
    mallory.set_token(token)
    err = await sdk.call_error(mallory.publish().channel(room).message("impersonation"))
    assert (err.status_code, err.category) == (403, ACCESS_DENIED)
    assert err.body == forbidden_body([room], message="Token is for another uuid")
    assert history_raw(am.origin, room) == ["hi"]


def subscribed_with_token(threaded, origin, room):
    """An admin client and a user subscribed to `room` with a read token the admin granted;
    returns the admin, the user, the user's token and its connected `Collector`."""
    admin = threaded(origin, "admin", admin=True)
    token = admin.grant_token().ttl(60).channels([Channel.id(room).read()]).sync().result.token
    user = threaded(origin, unique("user"))
    user.set_token(token)
    c = Collector()
    user.add_listener(c)
    user.subscribe().channels([room]).execute()
    c.wait_connected()
    return admin, user, token, c


def test_threaded_subscriber_with_token(threaded, am):
    origin = am.origin
    room, no = unique("room"), unique("no")
    admin, user, _, c = subscribed_with_token(threaded, origin, room)
    tt = admin.publish().channel(room).message("for token holders").sync().result.timetoken
    (m,) = c.wait_messages(1)
    assert (m.message, m.channel, m.timetoken) == ("for token holders", room, tt)
    user.subscribe().channels([no]).execute()
    wait_until(lambda: c.has_category(ACCESS_DENIED), 10, what="AccessDenied status")
    denied, *leave_denials = [s for s in c.statuses if s.category == ACCESS_DENIED]
    assert (denied.status_code, denied.operation) == (403, PNOperationType.PNUnsubscribeOperation)
    assert status_body(denied) == forbidden_body([no])
    # The SDK then unsubscribes and sends a leave, which Tether refuses for a token bound to no
    # uuid (docs/compatibility.md); it may report that denial too.
    assert len(leave_denials) <= 1
    assert all((s.status_code, s.operation) == (403, PNOperationType.PNUnsubscribeOperation) for s in leave_denials)


# ---------------------------------------------------------------------------------- revocation

# The recorded real-service body for a revoked token (pubnub-wire §3): no resource list.
REVOKED_BODY = {"message": "Token is revoked", "error": True, "service": "Access Manager", "status": 403}


@pytest.mark.asyncio
async def test_revoke_token_denies_subsequent_calls(sdk, am):
    admin = secure(sdk, am.origin, "admin", admin=True)
    room = unique("room")
    token = (await sdk.call(admin.grant_token().ttl(60).channels([Channel.id(room).read().write()]))).result.token
    user = secure(sdk, am.origin, unique("user"))
    user.set_token(token)
    await sdk.call(user.publish().channel(room).message("before"))

    env = await sdk.call(admin.revoke_token(token))
    assert env.status.status_code == 200 and env.status.operation == PNOperationType.PNAccessManagerRevokeToken
    for builder in (user.publish().channel(room).message("after"), user.history().channel(room),
                    Subscribe(user).channels([room]).timetoken(0)):
        err = await sdk.call_error(builder)
        assert (err.status_code, err.category, err.body) == (403, ACCESS_DENIED, REVOKED_BODY)
    assert history_raw(am.origin, room) == ["before"]
    # A token from another keyset cannot be revoked here.
    other_admin = sdk.make(am.origin, "admin", **keyset_overrides(OTHER_KEYSET, admin=True))
    other_token = (await sdk.call(other_admin.grant_token().ttl(60).channels([Channel.id(room).read()]))).result.token
    err = await sdk.call_error(admin.revoke_token(other_token))
    assert (err.status_code, err.category) == (400, PNStatusCategory.PNBadRequestCategory)
    assert err.body["error"]["message"] == "Invalid token"


def test_revoke_token_answers_waiting_long_poll(threaded, am):
    """A raw long-poll parked on the server (its arrival is visible in here-now) is answered
    with 403 right after the revocation, not at the 20 s subscribe timeout."""
    origin = am.origin
    admin = threaded(origin, "admin", admin=True)
    room, uuid = unique("room"), unique("waiter")
    token = admin.grant_token().ttl(60).channels([Channel.id(room).read()]).sync().result.token
    thread, out = long_poll_in_thread(origin, room, current_tt(origin), uuid=uuid, auth=token)
    wait_until(lambda: uuid in here_now_uuids(origin, room), 5, what="the long-poll to arrive")
    assert "resp" not in out
    revoked_at = time.monotonic()
    admin.revoke_token(token).sync()
    thread.join(10)
    r = out["resp"]
    assert (r.status, r.json()) == (403, REVOKED_BODY)
    assert out["answered"] - revoked_at < 2.0


def test_revoke_token_threaded_subscriber_told_promptly(threaded, am):
    origin = am.origin
    room = unique("room")
    admin, user, token, c = subscribed_with_token(threaded, origin, room)
    admin.publish().channel(room).message("warm-up").sync()
    c.wait_messages(1)
    wait_until(lambda: user.uuid in here_now_uuids(origin, room), 5, what="the subscriber's long-poll")
    revoked_at = time.monotonic()
    admin.revoke_token(token).sync()
    wait_until(lambda: c.has_category(ACCESS_DENIED), 5, what="AccessDenied after the revocation")
    assert time.monotonic() - revoked_at < 3.0
    denied, *leave_denials = [s for s in c.statuses if s.category == ACCESS_DENIED]
    assert (denied.status_code, denied.operation) == (403, PNOperationType.PNUnsubscribeOperation)
    assert status_body(denied) == REVOKED_BODY
    # The leave that follows is refused too (a revoked token proves nothing).
    assert len(leave_denials) <= 1
    assert all((s.status_code, s.operation) == (403, PNOperationType.PNUnsubscribeOperation) for s in leave_denials)


@pytest.mark.asyncio
async def test_revoke_token_asyncio_subscriber_told_promptly(am):
    """The event engine (reconnection off) announces the revoked long-poll at once as
    PNUnexpectedDisconnectCategory on the Subscribe operation (never AccessDenied)."""
    from pubnub.pubnub_asyncio import PubNubAsyncio
    origin = am.origin
    admin = PubNubAsyncio(make_config(origin, "admin", **keyset_overrides(SECURE_KEYSET, admin=True)))
    user = PubNubAsyncio(make_config(origin, unique("user"), **keyset_overrides(
        SECURE_KEYSET, reconnect_policy=PNReconnectionPolicy.NONE)))
    room = unique("room")
    try:
        token = (await admin.grant_token().ttl(60).channels([Channel.id(room).read()]).future()).result.token
        user.set_token(token)
        c = Collector()
        user.add_listener(c)
        user.subscribe().channels([room]).execute()
        await c.async_wait_connected()
        await admin.publish().channel(room).message("warm-up").future()
        await c.async_wait_messages(1)
        await async_wait_until(lambda: user.uuid in here_now_uuids(origin, room), 5, what="the long-poll")
        revoked_at = time.monotonic()
        env = await admin.revoke_token(token).future()
        assert env.status.status_code == 200
        await async_wait_until(lambda: c.has_category(PNStatusCategory.PNUnexpectedDisconnectCategory), 5,
                               what="UnexpectedDisconnect after the revocation")
        assert time.monotonic() - revoked_at < 3.0
        (s,) = [s for s in c.statuses if s.category == PNStatusCategory.PNUnexpectedDisconnectCategory]
        assert (s.operation, s.affected_channels) == (PNOperationType.PNSubscribeOperation, [room])
        assert not c.has_category(ACCESS_DENIED)
    finally:
        await stop_asyncio_clients((user, admin), subscribed=(user,))


def test_v2_revocation_answers_waiting_long_poll(threaded, am):
    origin = am.origin
    admin = threaded(origin, "admin", admin=True)
    ch, k, uuid = unique("ch"), unique("auth"), unique("waiter")
    admin.grant().channels([ch]).auth_keys([k]).read(True).ttl(5).sync()
    thread, out = long_poll_in_thread(origin, ch, current_tt(origin), uuid=uuid, auth=k)
    wait_until(lambda: uuid in here_now_uuids(origin, ch), 5, what="the long-poll to arrive")
    revoked_at = time.monotonic()
    admin.grant().channels([ch]).auth_keys([k]).read(False).write(False).manage(False).delete(False).sync()
    thread.join(10)
    assert (out["resp"].status, out["resp"].json()) == (403, forbidden_body([ch]))
    assert out["answered"] - revoked_at < 2.0
    # A long-poll that keeps its access keeps waiting (and still gets messages).
    other_k = unique("auth")
    admin.grant().channels([ch]).auth_keys([other_k]).read(True).ttl(5).sync()
    thread, out = long_poll_in_thread(origin, ch, current_tt(origin), uuid=uuid + "2", auth=other_k)
    wait_until(lambda: uuid + "2" in here_now_uuids(origin, ch), 5, what="the second long-poll")
    admin.grant().channels([ch]).auth_keys([k]).read(True).ttl(5).sync()  # a grant change elsewhere
    tt = admin.publish().channel(ch).message("still here").sync().result.timetoken
    thread.join(10)
    r = out["resp"]
    assert r.status == 200, r
    assert [(e["d"], int(e["p"]["t"])) for e in r.json()["m"]] == [("still here", tt)]


# ----------------------------------------------------------------- signed admin requests pass

@pytest.mark.asyncio
async def test_admin_signed_requests_pass_every_endpoint_family(sdk, am):
    origin = am.origin
    admin = secure(sdk, origin, "admin", admin=True)
    compressing = secure(sdk, origin, "admin-gz", admin=True, should_compress=True)
    ch, g = unique("adm"), unique("grp")
    meta = {"who": "admin", "odd": "a b~!*'()"}
    message = {"text": "signed ~!*'() & = + / ?", "n": 1}
    t_get = (await sdk.call(admin.publish().channel(ch).message(message).meta(meta))).result.timetoken
    t_post = (await sdk.call(admin.publish().channel(ch).message({"post": True}).use_post(True))).result.timetoken
    gz = compressing.publish().channel(ch).message({"gz": "x" * 500}).use_post(True)
    t_gz = (await sdk.call(gz)).result.timetoken
    await sdk.call(admin.signal().channel(ch).message("sig"))
    await sdk.call(admin.fire().channel(ch).message("fire"))

    env = await sdk.call(admin.history().channel(ch).include_timetoken(True).include_meta(True))
    assert [(m.entry, m.timetoken) for m in env.result.messages] == [
        (message, t_get), ({"post": True}, t_post), ({"gz": "x" * 500}, t_gz)]
    assert env.result.messages[0].meta == meta
    env = await sdk.call(admin.fetch_messages().channels([ch]).include_meta(True))
    assert [int(m.timetoken) for m in env.result.channels[ch]] == [t_get, t_post, t_gz]
    env = await sdk.call(admin.message_counts().channel([ch]).channel_timetokens([t_get]))
    assert env.result.channels == {ch: 2}
    env = await sdk.call(Subscribe(admin).channels([ch]).timetoken(0))
    assert env.status.status_code == 200

    env = await sdk.call(admin.set_state().channels([ch]).state({"mood": "signed ~"}))
    assert env.result.state == {"mood": "signed ~"}
    env = await sdk.call(admin.get_state().channels([ch]).uuid("admin"))
    assert env.result.channels == {ch: {"mood": "signed ~"}}
    env = await sdk.call(admin.here_now().channels([ch]))
    assert env.status.status_code == 200
    env = await sdk.call(admin.here_now())  # global here-now needs the signature
    assert env.status.status_code == 200
    env = await sdk.call(admin.where_now().uuid("admin"))
    assert env.status.status_code == 200

    await sdk.call(admin.add_channel_to_channel_group().channels([ch, ch + "-2"]).channel_group(g))
    env = await sdk.call(admin.list_channels_in_channel_group().channel_group(g))
    assert sorted(env.result.channels) == sorted([ch, ch + "-2"])
    await sdk.call(admin.remove_channel_from_channel_group().channels([ch + "-2"]).channel_group(g))
    env = await sdk.call(admin.list_channels_in_channel_group().channel_group(g))
    assert env.result.channels == [ch]
    await sdk.call(admin.remove_channel_group().channel_group(g))

    env = await sdk.call(admin.grant().channels([ch]).auth_keys(["k"]).read(True).ttl(1))
    assert auth_rows(env.result) == {ch: {"k": R}}
    env = await sdk.call(admin.grant().channels([ch]).auth_keys(["k"]).read(False))  # v2 revoke
    assert auth_rows(env.result) == {ch: {"k": (False, False, False, False)}}
    env = await sdk.call(admin.audit().channels([ch]))
    assert auth_rows(env.result) == {}
    token = (await sdk.call(admin.grant_token().ttl(5).channels([Channel.id(ch).read()]))).result.token
    await sdk.call(admin.revoke_token(token))
    env = await sdk.call(admin.delete_messages().channel(ch))
    assert env.status.status_code == 200
    assert history_raw(origin, ch) == []

    # The same calls unsigned are refused: it was the signature that let them through.
    plain = secure(sdk, origin, "admin")
    err = await sdk.call_error(plain.publish().channel(ch).message("x"))
    assert (err.status_code, err.body) == (403, forbidden_body([ch]))
    err = await sdk.call_error(plain.here_now())
    assert (err.status_code, err.category) == (403, ACCESS_DENIED)
    # (The SDK refuses to send grant without a secret key; raw, the server wants a signature.)
    r = get(origin, f"/v2/auth/grant/sub-key/{SUB}?channel={q(ch)}&r=1&uuid=admin")
    assert (r.status, r.json()) == (403, {"status": 403, "error": True, "service": "Access Manager",
                                          "message": "Signature required: sign with the secret key"})


DOUBLE_ENCODED = {
    "subscribe filter-expr": lambda pn, ch: Subscribe(pn).channels([ch]).timetoken(0).filter_expression("meta.a == 1"),
    "subscribe state": lambda pn, ch: Subscribe(pn).channels([ch]).timetoken(0).state({ch: {"mood": "ok"}}),
    "heartbeat state": lambda pn, ch: pn.heartbeat().channels([ch]).state({"mood": "ok"}),
}


@pytest.mark.parametrize("call", list(DOUBLE_ENCODED))
def test_admin_signed_double_encoded_parameters(threaded, am, call):
    """pubnub-wire §12 quirk: Python signs some values it already percent-encoded."""
    admin = threaded(am.origin, "admin", admin=True)
    env = DOUBLE_ENCODED[call](admin, unique("dbl")).sync()
    assert env.status.status_code == 200


def test_admin_threaded_subscriber_receives(threaded, am):
    admin = threaded(am.origin, "admin", admin=True)
    ch = unique("adm")
    c = Collector()
    admin.add_listener(c)
    admin.subscribe().channels([ch, ch + ".x"]).execute()
    c.wait_connected()
    tts = [admin.publish().channel(ch).message(i).use_post(i % 2 == 1).sync().result.timetoken for i in range(3)]
    got = c.wait_messages(3)
    assert [(m.message, m.timetoken) for m in got] == list(zip(range(3), tts))


# ---------------------------------------------------------------------------- durability

def test_grants_and_revocations_survive_restart(server_factory, tmp_path, threaded):
    config = write_keysets_config(str(tmp_path))
    server = server_factory.start(args=["--config", config, "--subscribe-timeout", "20"])
    admin = threaded(server.origin, "admin", admin=True)
    k, a, b = unique("auth"), unique("a"), unique("b")
    admin.grant().channels([a, b]).auth_keys([k]).read(True).write(True).ttl(60).sync()
    admin.grant().channels([b]).auth_keys([k]).read(False).write(False).sync()  # revoked again
    # (Identical grants in the same second give byte-identical tokens: make them differ.)
    kept = admin.grant_token().ttl(60).meta({"n": 1}).channels([Channel.id(a).read().write()]).sync().result.token
    revoked = admin.grant_token().ttl(60).meta({"n": 2}).channels([Channel.id(a).read().write()]).sync().result.token
    assert kept != revoked
    admin.revoke_token(revoked).sync()

    def check(origin):
        auth_user = threaded(origin, unique("user"), auth_key=k)
        assert auth_user.publish().channel(a).message("auth").sync().status.status_code == 200
        with pytest.raises(PubNubException) as e:
            auth_user.publish().channel(b).message("auth").sync()
        assert e.value._status_code == 403
        token_user = threaded(origin, unique("user"))
        token_user.set_token(kept)
        assert token_user.publish().channel(a).message("token").sync().status.status_code == 200
        revoked_user = threaded(origin, unique("user"))
        revoked_user.set_token(revoked)
        status = sdk_error_status(revoked_user.publish().channel(a).message("revoked"))
        assert (status.status_code, status_body(status)) == (403, REVOKED_BODY)
        audit = threaded(origin, "admin", admin=True).audit().channels([a, b]).auth_keys([k]).sync().result
        assert auth_rows(audit) == {a: {k: RW}}
        assert audit.ttl == 60

    check(server.origin)
    server.restart(graceful=True)
    check(server.origin)
    server.restart(graceful=False)  # SIGKILL: grants were durable when acknowledged
    check(server.origin)
    assert history_raw(server.origin, a) == ["auth", "token"] * 3
