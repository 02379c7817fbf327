"""Limits (413, 414, 429 + Retry-After) and TLS, through the real PubNub Python SDK.

Spec: docs/security.md (Limits, TLS), pubnub-wire §3, §13.2.

SDK behaviours these tests pin down (pubnub 10.8.0, httpx 0.28.1):
- 413, 414 and 429 are reported with `PNUnknownCategory` and the HTTP status in
  `status.status_code` (the JSON body in the exception); the SDK never exposes response headers,
  so `Retry-After` is checked on the wire.
- TLS: both handlers use httpx with `verify=True`, whose CA bundle is certifi's unless
  `SSL_CERT_FILE` (or `SSL_CERT_DIR`) is set when the httpx client is created (threaded: at the
  first request; asyncio: when `PubNubAsyncio` is constructed). `REQUESTS_CA_BUNDLE` is ignored.
- An untrusted certificate is *not* reported as `PNTLSConnectionFailedCategory` or
  `PNTLSUntrustedCertificateCategory` (10.8.0 never produces those): threaded calls report
  `PNUnexpectedDisconnectCategory` with no status code and the text
  `Connection Error: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: ...` (`.sync()`
  raises `PubNubException` with `_status_code` 0); asyncio calls report `PNUnknownCategory`
  with an `httpx.ConnectError` carrying the same OpenSSL text.
"""

from __future__ import annotations

import contextlib
import threading
import time

import httpx
import pytest
from pubnub.endpoints.pubsub.subscribe import Subscribe
from pubnub.enums import PNOperationType, PNReconnectionPolicy, PNStatusCategory
from pubnub.exceptions import PubNubException

from helpers import (CA_PEM, DEMO_KEYSET, LIMITED_KEYSET, SELF_SIGNED_KEY_PEM, SELF_SIGNED_PEM, SERVER_KEY_PEM,
                     SERVER_PEM, THROTTLED_KEYSET, Collector, TlsTetherServer, get, https_get, keyset_overrides,
                     make_config, q, request, run_with_callback, sdk_error_status, status_body, threaded_clients,
                     unique, wait_until, write_keysets_config)

pytestmark = pytest.mark.timeout(60)

UNKNOWN = PNStatusCategory.PNUnknownCategory
TOO_LARGE = [0, "Message Too Large"]
URI_TOO_LONG = {"status": 414, "error": True, "service": "Balancer", "message": "Request URI Too Long"}
TOO_MANY = {"status": 429, "error": True, "service": "Balancer", "message": "Too Many Requests"}
CERT_VERIFY_FAILED = "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
TINY_KEYSET = {"name": "tiny", "publishKey": "pub-x", "subscribeKey": "sub-x",
               "limits": {"maxURIBytes": 2048, "maxChannelsPerSubscribe": 5}}


@pytest.fixture(scope="module")
def lim(module_server_factory, tmp_path_factory):
    config = write_keysets_config(str(tmp_path_factory.mktemp("limits-config")),
                                  [LIMITED_KEYSET, THROTTLED_KEYSET, DEMO_KEYSET, TINY_KEYSET])
    return module_server_factory.start(args=["--config", config, "--subscribe-timeout", "20", "--rate-limits", "on"])


@pytest.fixture
def threaded():
    with threaded_clients(DEMO_KEYSET) as make:
        yield make


def on(keyset, sdk, origin, uuid=None, **overrides):
    return sdk.make(origin, uuid or unique("user"), **keyset_overrides(keyset, **overrides))


# ---------------------------------------------------------------------------------------- 413

@pytest.mark.asyncio
async def test_413_message_too_large_reported_by_sdk(sdk, lim):
    """`maxMessageBytes` 1024 counts the message JSON plus the channel name, GET and POST alike."""
    ch = unique("big")
    fits = "a" * (1024 - len(ch) - 2)  # the JSON text has the quotes too
    for use_post in (False, True):
        env = await sdk.call(on(LIMITED_KEYSET, sdk, lim.origin).publish().channel(ch).message(fits).use_post(use_post))
        assert env.status.status_code == 200
        err = await sdk.call_error(on(LIMITED_KEYSET, sdk, lim.origin).publish().channel(ch).message(fits + "a")
                                   .use_post(use_post))
        assert (err.status_code, err.category, err.operation) == (413, UNKNOWN, PNOperationType.PNPublishOperation)
        assert err.body[:2] == TOO_LARGE and len(err.body) == 3 and int(err.body[2]) > 0
    # Nothing too large was stored.
    r = get(lim.origin, f"/v2/history/sub-key/sub-l/channel/{q(ch)}?count=10")
    assert r.json()[0] == [fits, fits]


def test_413_threaded_sync_raises(threaded, lim):
    pn = threaded(lim.origin, keyset=LIMITED_KEYSET)
    with pytest.raises(PubNubException) as e:
        pn.publish().channel(unique()).message({"blob": "x" * 2000}).use_post(True).sync()
    assert e.value._status_code == 413
    assert "Message Too Large" in str(e.value)


# ---------------------------------------------------------------------------------------- 414

@pytest.mark.asyncio
async def test_414_too_many_channels_in_subscribe(sdk, lim):
    pn = on(DEMO_KEYSET, sdk, lim.origin)
    channels = [f"limit-{i:03d}" for i in range(201)]
    env = await sdk.call(Subscribe(pn).channels(channels[:200]).timetoken(0))  # the default maximum: 200
    assert env.status.status_code == 200
    err = await sdk.call_error(Subscribe(pn).channels(channels).timetoken(0))
    assert (err.status_code, err.category, err.body) == (414, UNKNOWN, URI_TOO_LONG)
    # Channels and groups count together.
    err = await sdk.call_error(Subscribe(pn).channels(channels[:199]).channel_groups(["g1", "g2"]).timetoken(0))
    assert (err.status_code, err.body) == (414, URI_TOO_LONG)
    # A keyset's own maximum (5).
    tiny = on(TINY_KEYSET, sdk, lim.origin)
    assert (await sdk.call(Subscribe(tiny).channels(channels[:5]).timetoken(0))).status.status_code == 200
    err = await sdk.call_error(Subscribe(tiny).channels(channels[:6]).timetoken(0))
    assert (err.status_code, err.body) == (414, URI_TOO_LONG)


def test_414_threaded_subscriber_is_told(threaded, lim):
    """The native subscribe manager announces the 414 on the Subscribe operation (Unknown
    category), then (reconnection off) Disconnected."""
    pn = threaded(lim.origin, reconnect_policy=PNReconnectionPolicy.NONE)
    c = Collector()
    pn.add_listener(c)
    pn.subscribe().channels([f"many-{i:03d}" for i in range(201)]).execute()
    wait_until(lambda: len(c.statuses) >= 2, 10, what="the 414 and Disconnected statuses")
    first, second = c.statuses[:2]
    assert (first.category, first.status_code, first.operation) == (UNKNOWN, 414, PNOperationType.PNSubscribeOperation)
    assert status_body(first) == URI_TOO_LONG
    assert second.category == PNStatusCategory.PNDisconnectedCategory


@pytest.mark.asyncio
async def test_414_huge_get_message_but_post_is_413(sdk, lim):
    pn = on(DEMO_KEYSET, sdk, lim.origin)
    ch = unique("huge")
    big = "a" * 33_000
    err = await sdk.call_error(pn.publish().channel(ch).message(big))
    assert (err.status_code, err.category, err.body) == (414, UNKNOWN, URI_TOO_LONG)
    err = await sdk.call_error(pn.publish().channel(ch).message(big).use_post(True))
    assert (err.status_code, err.category) == (413, UNKNOWN)
    assert err.body[:2] == TOO_LARGE
    # Just under the default limit (32,768 bytes of message JSON + channel name) passes by POST.
    ok = "a" * (32_768 - len(ch) - 2)
    env = await sdk.call(pn.publish().channel(ch).message(ok).use_post(True))
    assert env.status.status_code == 200


def test_414_uri_length_boundary(lim):
    """`maxURIBytes` (default 32,768) counts the request target: path and query."""
    base = "/time/0?pad="
    r = get(lim.origin, base + "a" * (32_768 - len(base)))
    assert r.status == 200, r
    r = get(lim.origin, base + "a" * (32_768 - len(base) + 1))
    assert (r.status, r.json()) == (414, URI_TOO_LONG)
    assert get(lim.origin, "/time/0").status == 200


def test_414_keyset_max_uri_bytes(lim):
    """docs/security.md: limits are per keyset or server-wide; `tiny` has maxURIBytes 2048."""
    r = get(lim.origin, "/publish/pub-x/sub-x/0/c/0/%22" + "a" * 1900 + "%22?uuid=u")
    assert r.status == 200, r
    r = get(lim.origin, "/publish/pub-x/sub-x/0/c/0/%22" + "a" * 3000 + "%22?uuid=u")
    assert (r.status, r.json()) == (414, URI_TOO_LONG)
    # Other keysets keep the default.
    r = get(lim.origin, "/publish/demo/demo/0/c/0/%22" + "a" * 3000 + "%22?uuid=u")
    assert r.status == 200, r


def test_414_server_wide_max_uri_bytes(server_factory, tmp_path):
    config = write_keysets_config(str(tmp_path), [DEMO_KEYSET], limits={"maxURIBytes": 2048})
    server = server_factory.start(args=["--config", config])
    r = get(server.origin, "/publish/demo/demo/0/c/0/%22" + "a" * 1900 + "%22?uuid=u")
    assert r.status == 200, r
    r = get(server.origin, "/publish/demo/demo/0/c/0/%22" + "a" * 2100 + "%22?uuid=u")
    assert (r.status, r.json()) == (414, URI_TOO_LONG)


# ---------------------------------------------------------------------------------------- 429

def test_429_flooding_client_limited_others_unaffected(threaded, lim):
    """`limited`: 1 publish/s per client, burst 3. One uuid floods for ~1.5 s; another uuid's
    publishes and a subscriber's deliveries carry on untouched."""
    origin = lim.origin
    ch = unique("flood")
    flooder = threaded(origin, "flooder-" + unique(""), keyset=LIMITED_KEYSET)
    bystander = threaded(origin, "bystander-" + unique(""), keyset=LIMITED_KEYSET)
    listener = threaded(origin, keyset=LIMITED_KEYSET)
    c = Collector()
    listener.add_listener(c)
    listener.subscribe().channels([ch]).execute()
    c.wait_connected()

    outcomes = []  # (time since start, timetoken or PNStatus)
    stop = threading.Event()

    def flood():
        t0 = time.monotonic()
        while not stop.is_set() and time.monotonic() - t0 < 1.5:
            done, got = run_with_callback(flooder.publish().channel(ch).message({"flood": len(outcomes)}))
            done.wait(10)
            r, s = got[0]
            outcomes.append((time.monotonic() - t0, s if s.is_error() else r.timetoken))
    t = threading.Thread(target=flood, daemon=True)
    t.start()
    wait_until(lambda: any(not isinstance(o, int) for _, o in outcomes), 5, what="the first 429")
    # Mid-flood: the flooder is limited on the wire too, with Retry-After.
    raw = get(origin, f"/publish/pub-l/sub-l/0/{q(ch)}/0/%22raw%22?uuid={q(flooder.uuid)}")
    assert (raw.status, raw.json(), raw.headers.get("retry-after")) == (429, TOO_MANY, "1")
    bystander_tts = [bystander.publish().channel(ch).message(f"bystander {i}").sync().result.timetoken
                     for i in range(3)]
    t.join(10)
    stop.set()

    accepted = [o for _, o in outcomes if isinstance(o, int)]
    rejected = [(at, o) for at, o in outcomes if not isinstance(o, int)]
    assert len(outcomes) >= 6, outcomes
    # The first three (the burst) pass; then one more per second at most.
    assert all(isinstance(o, int) for _, o in outcomes[:3])
    assert not isinstance(outcomes[3][1], int) or outcomes[3][0] > 0.9, outcomes[:4]
    assert 3 <= len(accepted) <= 3 + int(outcomes[-1][0]) + 1
    for _, s in rejected:
        assert (s.category, s.status_code, s.operation) == (UNKNOWN, 429, PNOperationType.PNPublishOperation)
        assert status_body(s) == TOO_MANY

    expected = sorted([(tt, "flooder") for tt in accepted] + [(tt, "bystander") for tt in bystander_tts])
    got = c.wait_messages(len(expected))
    time.sleep(0.2)  # a rejected publish delivered late would show up here
    assert sorted((m.timetoken, "flooder" if isinstance(m.message, dict) else "bystander")
                  for m in c.snapshot()) == expected
    assert [m.message for m in got if not isinstance(m.message, dict)] == [f"bystander {i}" for i in range(3)]

    # After Retry-After the flooder may publish again.
    def retry():
        try:
            return flooder.publish().channel(ch).message("after").sync().result.timetoken
        except PubNubException as e:
            assert e._status_code == 429
            return None
    wait_until(retry, 5, interval=0.25, what="a publish after Retry-After")


@pytest.mark.asyncio
async def test_429_request_rate_reported_by_sdk(sdk, lim):
    """`throttled`: 1 request/s per client, burst 2; long-polls that follow their cursor and
    publishes are not counted, handshakes are (FairUseTests covers the long-polls)."""
    pn = on(THROTTLED_KEYSET, sdk, lim.origin)
    ch = unique("thr")
    for _ in range(2):
        assert (await sdk.call(pn.history().channel(ch))).status.status_code == 200
    err = await sdk.call_error(pn.fetch_messages().channels([ch]))
    assert (err.status_code, err.category, err.body) == (429, UNKNOWN, TOO_MANY)
    err = await sdk.call_error(pn.here_now().channels([ch]))
    assert (err.status_code, err.body) == (429, TOO_MANY)
    # A handshake can join a uuid to 200 channels, so it counts as a request; publishes have
    # their own limit.
    err = await sdk.call_error(Subscribe(pn).channels([ch]).timetoken(0))
    assert (err.status_code, err.body) == (429, TOO_MANY)
    assert (await sdk.call(pn.publish().channel(ch).message("still ok"))).status.status_code == 200
    # Another client is unaffected.
    other = on(THROTTLED_KEYSET, sdk, lim.origin)
    assert (await sdk.call(other.history().channel(ch))).status.status_code == 200
    r = get(lim.origin, f"/v2/history/sub-key/sub-t/channel/{q(ch)}?uuid={q(pn.uuid)}")
    assert (r.status, r.json(), r.headers.get("retry-after")) == (429, TOO_MANY, "1")


def test_429_clients_without_uuid_share_their_address_bucket(lim):
    ch = unique("anon")
    statuses = [get(lim.origin, f"/v2/history/sub-key/sub-t/channel/{q(ch)}").status for _ in range(3)]
    assert statuses == [200, 200, 429]
    r = get(lim.origin, f"/v2/history/sub-key/sub-t/channel/{q(ch)}?uuid={unique('named')}")
    assert r.status == 200


# ---------------------------------------------------------------------------------------- TLS

def tls_server(factory, cert, key) -> TlsTetherServer:
    server = TlsTetherServer(factory.new_data_dir(), args=["--tls-cert", cert, "--tls-key", key],
                             log_path=factory.new_data_dir() + ".log")
    factory.servers.append(server)
    return server.start()


@pytest.fixture(scope="module")
def tls(module_server_factory) -> TlsTetherServer:
    """HTTPS with server.pem (127.0.0.1/localhost, signed by the test CA)."""
    return tls_server(module_server_factory, SERVER_PEM, SERVER_KEY_PEM)


@pytest.fixture(scope="module")
def self_signed(module_server_factory) -> TlsTetherServer:
    return tls_server(module_server_factory, SELF_SIGNED_PEM, SELF_SIGNED_KEY_PEM)


@pytest.fixture
def trust_ca(monkeypatch):
    """Makes httpx (hence the SDK) trust the test CA: set before clients are created."""
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", CA_PEM)


@pytest.fixture
def default_trust(monkeypatch):
    """httpx's default trust store (certifi), which does not know the test CA. The variables
    `requests` and curl read are set to the CA to show that httpx ignores them."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", CA_PEM)
    monkeypatch.setenv("CURL_CA_BUNDLE", CA_PEM)


def test_tls_server_speaks_https_only(tls):
    assert tls.scheme == "https"
    r = https_get(tls.origin, "/time/0")
    assert r.status == 200 and isinstance(r.json()[0], int)
    r = https_get(f"localhost:{tls.port}", "/health")
    assert r.status == 200
    # Plain HTTP gets no HTTP answer.
    with pytest.raises(Exception):
        resp = request(tls.origin, "GET", "/time/0", timeout=3)
        raise AssertionError(f"plain HTTP was answered: {resp!r}")


def test_sdk_threaded_over_tls_with_trusted_ca(trust_ca, tls, threaded):
    receiver = threaded(tls.origin, ssl=True)
    sender = threaded(tls.origin, ssl=True)
    ch = unique("tls")
    c = Collector()
    receiver.add_listener(c)
    receiver.subscribe().channels([ch]).execute()
    c.wait_connected()
    env = sender.publish().channel(ch).message({"secure": True}).sync()
    assert (env.status.status_code, env.status.tls_enabled) == (200, True)
    post = sender.publish().channel(ch).message("by post").use_post(True).sync()
    got = c.wait_messages(2)
    assert [(m.message, m.timetoken) for m in got] == [({"secure": True}, env.result.timetoken),
                                                       ("by post", post.result.timetoken)]
    h = sender.history().channel(ch).include_timetoken(True).sync()
    assert [(m.entry, m.timetoken) for m in h.result.messages] == [
        ({"secure": True}, env.result.timetoken), ("by post", post.result.timetoken)]


@pytest.mark.asyncio
async def test_sdk_asyncio_over_tls_with_trusted_ca(trust_ca, tls):
    from pubnub.pubnub_asyncio import PubNubAsyncio
    pn = PubNubAsyncio(make_config(tls.origin, unique("user"), ssl=True))
    try:
        c = Collector()
        pn.add_listener(c)
        ch = unique("tls")
        pn.subscribe().channels([ch]).execute()
        await c.async_wait_connected()
        env = await pn.publish().channel(ch).message("async tls").future()
        assert (env.status.status_code, env.status.tls_enabled) == (200, True)
        (m,) = await c.async_wait_messages(1)
        assert (m.message, m.timetoken) == ("async tls", env.result.timetoken)
    finally:
        with contextlib.suppress(Exception):
            pn.unsubscribe_all()
        await pn.stop()


def assert_threaded_cert_failure(pn, detail):
    status = sdk_error_status(pn.publish().channel(unique()).message("x"))
    assert (status.category, status.status_code, status.operation) == (
        PNStatusCategory.PNUnexpectedDisconnectCategory, None, PNOperationType.PNPublishOperation)
    info = status.error_data.information
    assert info.startswith("Connection Error: " + CERT_VERIFY_FAILED + detail), info
    with pytest.raises(PubNubException) as e:
        pn.time().sync()
    assert (e.value._status_code, e.value._pn_error) == (0, "Connection Error")
    assert CERT_VERIFY_FAILED + detail in e.value._errormsg


def test_sdk_threaded_untrusted_ca_fails_with_certificate_error(default_trust, tls, threaded):
    assert_threaded_cert_failure(threaded(tls.origin, ssl=True), "unable to get local issuer certificate")
    assert https_get(tls.origin, "/health").status == 200  # the server shrugs off failed handshakes


def test_sdk_threaded_self_signed_server_fails_even_with_ca_trusted(trust_ca, self_signed, threaded):
    assert self_signed.scheme == "https"
    assert_threaded_cert_failure(threaded(self_signed.origin, ssl=True), "self-signed certificate")
    assert https_get(self_signed.origin, "/time/0", cafile=SELF_SIGNED_PEM).status == 200


def test_sdk_threaded_subscriber_untrusted_ca(default_trust, tls, threaded):
    pn = threaded(tls.origin, ssl=True, reconnect_policy=PNReconnectionPolicy.NONE)
    c = Collector()
    pn.add_listener(c)
    pn.subscribe().channels([unique()]).execute()
    wait_until(lambda: len(c.statuses) >= 2, 10, what="statuses of the failed subscribe")
    first, second = c.statuses[:2]
    assert (first.category, first.status_code, first.operation) == (
        PNStatusCategory.PNUnexpectedDisconnectCategory, None, PNOperationType.PNSubscribeOperation)
    assert CERT_VERIFY_FAILED + "unable to get local issuer certificate" in first.error_data.information
    assert second.category == PNStatusCategory.PNDisconnectedCategory
    assert not c.has_category(PNStatusCategory.PNConnectedCategory)


@pytest.mark.asyncio
@pytest.mark.parametrize("which,trusted,detail", [
    ("tls", False, "unable to get local issuer certificate"),
    ("self_signed", True, "self-signed certificate"),
])
async def test_sdk_asyncio_certificate_failure(request, monkeypatch, which, trusted, detail):
    from pubnub.pubnub_asyncio import PubNubAsyncio
    server = request.getfixturevalue(which)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    if trusted:
        monkeypatch.setenv("SSL_CERT_FILE", CA_PEM)
    else:
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    pn = PubNubAsyncio(make_config(server.origin, unique("user"), ssl=True))
    try:
        env = await pn.publish().channel(unique()).message("x").future()
        s = env.status
        assert (s.category, s.status_code, s.is_error(), env.result) == (UNKNOWN, None, True, None)
        exc = s.error_data.exception
        assert isinstance(exc, httpx.ConnectError)
        assert str(exc).startswith(CERT_VERIFY_FAILED + detail), str(exc)
    finally:
        await pn.stop()


@pytest.mark.parametrize("value", ["maybe", "", "ON-ish", "2", "off;rm"])
def test_rate_limits_switch_refuses_anything_but_on_or_off(value, tmp_path):
    """`--rate-limits` and TETHER_RATE_LIMITS take on/off (true/false, 1/0); anything else stops
    the server before it listens, with a message naming the option."""
    import subprocess
    from helpers import TETHER_BIN
    flag = subprocess.run([TETHER_BIN, "serve", "--port", "0", "--data-dir", str(tmp_path / "a"), "--rate-limits", value],
                          capture_output=True, text=True, timeout=30)
    assert flag.returncode != 0 and "--rate-limits must be on or off" in flag.stderr, flag.stderr
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("TETHER_")}
    env["TETHER_RATE_LIMITS"] = value
    by_env = subprocess.run([TETHER_BIN, "serve", "--port", "0", "--data-dir", str(tmp_path / "b")],
                            capture_output=True, text=True, timeout=30, env=env)
    assert by_env.returncode != 0 and "TETHER_RATE_LIMITS must be on or off" in by_env.stderr, by_env.stderr
