"""Malformed and hostile requests (raw sockets and http.client, no SDK).

One server serves the whole module: it is filled with known messages first, every case of the
corpus is sent to it (each checks the exact status, the JSON error body and that the server
still answers), and the last tests check that it still serves and that the store is intact.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable

import pytest

from helpers import (CONTENT_TYPE, assert_json_response, fetch_all, get, message_count, publish, q, raw_exchange,
                     request, server_time, subscribe_raw, unique)

pytestmark = pytest.mark.timeout(60)

SUBSCRIBE_TIMEOUT = 2.0
BASELINE_CHANNELS = ["base-a", "base-b", "base.c"]
BASELINE_PER_CHANNEL = 40


@pytest.fixture(scope="module")
def hostile_server(module_server_factory):
    return module_server_factory.start(args=["--subscribe-timeout", str(SUBSCRIBE_TIMEOUT)])


@pytest.fixture(scope="module")
def baseline(hostile_server):
    """Messages stored before the corpus: {channel: [(tt, message)]}."""
    origin = hostile_server.origin
    stored = {}
    for ch in BASELINE_CHANNELS:
        stored[ch] = [(publish(origin, ch, {"base": ch, "i": i}, meta=json.dumps({"i": i})), {"base": ch, "i": i})
                      for i in range(BASELINE_PER_CHANNEL)]
    return stored


@pytest.fixture
def origin(hostile_server, baseline):
    assert hostile_server.running, "the server died earlier in the corpus"
    return hostile_server.origin


def alive(origin: str):
    r = get(origin, "/time/0", timeout=5)
    assert r.status == 200 and isinstance(r.json()[0], int), r


def is_publish_error(body, text: str):
    assert isinstance(body, list) and len(body) == 3, body
    assert body[0] == 0 and body[1] == text, body
    assert isinstance(body[2], str) and body[2].isdigit() and len(body[2]) == 17, body


def is_error_object(body, status: int, contains: str | None = None):
    assert isinstance(body, dict), body
    assert body.get("status") == status, body
    assert body.get("error") in (True, 1), body
    text = body.get("message") or body.get("error_message") or ""
    assert isinstance(text, str) and text, body
    if contains:
        assert contains.lower() in text.lower(), body


# -------------------------------------------------------------------------------------------------
# The corpus: http.client requests with exact expectations
# -------------------------------------------------------------------------------------------------

P = "/publish/demo/demo/0"


@dataclass
class Case:
    id: str
    method: str
    target: str
    status: int
    check: Callable | None = None
    body: bytes | None = None
    headers: dict = field(default_factory=dict)


TOO_DEEP = "Invalid JSON: nested deeper than 48 levels"


def pub_err(text):
    return lambda b: is_publish_error(b, text)


def obj_err(status, contains=None):
    return lambda b: is_error_object(b, status, contains)


BIG_TT = "999999999999999999999"


def pm(text: str) -> str:
    """GET publish target on channel `ch` carrying `text` (percent-encoded) as the message."""
    return f"{P}/ch/0/" + q(text)

CASES = [
    # Bad percent-encoding, path and query.
    Case("pct-zz-message", "GET", f"{P}/ch/0/%ZZ", 400, obj_err(400)),
    Case("pct-truncated-message", "GET", f"{P}/ch/0/%2", 400, obj_err(400)),
    Case("pct-invalid-utf8-message", "GET", f"{P}/ch/0/%22%C3%28%22", 400, obj_err(400)),
    Case("pct-invalid-utf8-channel", "GET", f"{P}/%C3%28/0/1", 400, obj_err(400)),
    Case("pct-overlong-utf8-channel", "GET", f"{P}/%C0%AF/0/1", 400, obj_err(400)),
    Case("pct-zz-query", "GET", f"{P}/ch/0/1?meta=%ZZ", 400, obj_err(400)),
    Case("pct-invalid-utf8-query", "GET", f"{P}/ch/0/1?uuid=%C3%28", 400, obj_err(400)),
    Case("pct-zz-subscribe-channel", "GET", "/v2/subscribe/demo/%ZZ/0?tt=0", 400, obj_err(400)),
    Case("pct-zz-history-query", "GET", "/v2/history/sub-key/demo/channel/ch?count=%ZZ", 400, obj_err(400)),
    Case("pct-zz-time-query", "GET", "/time/0?uuid=%ZZ", 400, obj_err(400)),
    # Invalid JSON messages.
    Case("json-truncated", "GET", pm('{"a": [1, 2'), 400, pub_err("Invalid JSON")),
    Case("json-bad-object", "GET", pm('{bad'), 400, pub_err("Invalid JSON")),
    Case("json-nan", "GET", f"{P}/ch/0/NaN", 400, pub_err("Invalid JSON")),
    Case("json-infinity", "GET", pm('[Infinity]'), 400, pub_err("Invalid JSON")),
    Case("json-trailing-comma", "GET", pm('[1,]'), 400, pub_err("Invalid JSON")),
    Case("json-single-quotes", "GET", pm(chr(39) + 'x' + chr(39)), 400, pub_err("Invalid JSON")),
    Case("json-leading-zero", "GET", f"{P}/ch/0/01", 400, pub_err("Invalid JSON")),
    Case("json-two-values", "GET", pm('1 2'), 400, pub_err("Invalid JSON")),
    # A trailing "/" is dropped, so an empty GET message is a path with too few segments.
    Case("json-empty-message-trailing-slash", "GET", f"{P}/ch/0/", 404, obj_err(404, "Not found")),
    Case("json-bare-word", "GET", f"{P}/ch/0/hello", 400, pub_err("Invalid JSON")),
    Case("json-unterminated-string", "GET", pm('"abc'), 400, pub_err("Invalid JSON")),
    Case("json-raw-control-char-in-string", "GET", pm(chr(34) + chr(1) + chr(34)), 400,
         pub_err("Invalid JSON")),
    # Messages nest at most 48 deep: the envelopes around them in answers add up to 16 levels.
    Case("json-deep-nesting", "GET", pm('[' * 5000 + ']' * 5000), 400, pub_err(TOO_DEEP)),
    Case("json-deep-nesting-post-16000", "POST", f"{P}/ch/0", 400, pub_err(TOO_DEEP),
         body=b"[" * 16000 + b"]" * 16000),
    Case("json-nesting-65", "POST", f"{P}/ch/0", 400, pub_err(TOO_DEEP), body=b"[" * 65 + b"]" * 65),
    Case("json-nesting-49", "POST", f"{P}/ch/0", 400, pub_err(TOO_DEEP), body=b"[" * 49 + b"]" * 49),
    Case("json-post-truncated", "POST", f"{P}/ch/0", 400, pub_err("Invalid JSON"), body=b'{"a": ',
         headers={"Content-Type": "application/json"}),
    Case("json-post-empty", "POST", f"{P}/ch/0", 400, pub_err("Invalid JSON"), body=b""),
    Case("json-post-invalid-utf8", "POST", f"{P}/ch/0", 400, pub_err("Invalid JSON"), body=b'"\xc3\x28"'),
    # meta must be a JSON object.
    Case("meta-array", "GET", f"{P}/ch/0/1?meta=" + q("[1]"), 400, pub_err("Invalid meta: must be a JSON object")),
    Case("meta-string", "GET", f"{P}/ch/0/1?meta=" + q('"s"'), 400, pub_err("Invalid meta: must be a JSON object")),
    Case("meta-number", "GET", f"{P}/ch/0/1?meta=5", 400, pub_err("Invalid meta: must be a JSON object")),
    Case("meta-null", "GET", f"{P}/ch/0/1?meta=null", 400, pub_err("Invalid meta: must be a JSON object")),
    Case("meta-broken", "GET", f"{P}/ch/0/1?meta=" + q("{bad"), 400, pub_err("Invalid meta: must be a JSON object")),
    # Other publish parameters.
    Case("ttl-negative", "GET", f"{P}/ch/0/1?ttl=-1", 400, pub_err("Invalid ttl: expected a number from 0 to 876000")),
    Case("ttl-text", "GET", f"{P}/ch/0/1?ttl=abc", 400, pub_err("Invalid ttl: expected a number from 0 to 876000")),
    Case("ttl-nan", "GET", f"{P}/ch/0/1?ttl=nan", 400, pub_err("Invalid ttl: expected a number from 0 to 876000")),
    Case("store-2", "GET", f"{P}/ch/0/1?store=2", 400, pub_err("Invalid store: expected 0 or 1")),
    Case("seqn-text", "GET", f"{P}/ch/0/1?seqn=x", 400, pub_err("Invalid seqn: expected an integer from 0 to 4294967295")),
    # Once a trap: an expiry past Int64.max (ttl in hours × 36,000,000,000 overflowed UInt64).
    Case("ttl-huge", "GET", f"{P}/ch/0/1?ttl=1000000000", 400, pub_err("Invalid ttl: expected a number from 0 to 876000")),
    Case("custom-message-type-short", "GET", f"{P}/ch/0/1?custom_message_type=ab", 400,
         pub_err("Invalid custom_message_type: 3-50 characters of A-Z a-z 0-9 _ -")),
    Case("custom-message-type-bad-char", "GET", f"{P}/ch/0/1?custom_message_type=a%20bc", 400,
         pub_err("Invalid custom_message_type: 3-50 characters of A-Z a-z 0-9 _ -")),
    Case("publish-presence-channel", "GET", f"{P}/ch-pnpres/0/1", 400,
         pub_err("Invalid Channel: presence channels are written by the server")),
    # Sizes.
    Case("post-message-too-large", "POST", f"{P}/ch/0", 413, pub_err("Message Too Large"),
         body=json.dumps("x" * 33000).encode()),
    Case("post-body-far-too-large", "POST", f"{P}/ch/0", 413, pub_err("Message Too Large"),
         body=json.dumps("x" * 400_000).encode()),
    Case("post-message-plus-channel-too-large", "POST", f"/publish/demo/demo/0/{'c' * 90}/0", 413,
         pub_err("Message Too Large"), body=json.dumps("x" * (32768 - 90 - 1)).encode()),
    Case("get-uri-too-long", "GET", f"{P}/ch/0/{'1' * 33000}", 414, obj_err(414, "Request URI Too Long")),
    Case("get-uri-too-long-query", "GET", f"/time/0?x={'a' * 40000}", 414, obj_err(414, "Request URI Too Long")),
    Case("signal-too-large", "GET", f"/signal/demo/demo/0/ch/0/{q(json.dumps('s' * 70))}", 400,
         pub_err("Signal size too large")),
    # Timetokens.
    Case("tt-negative", "GET", "/v2/subscribe/demo/ch/0?tt=-1", 400, obj_err(400, "tt")),
    Case("tt-text", "GET", "/v2/subscribe/demo/ch/0?tt=abc", 400, obj_err(400, "tt")),
    Case("tt-21-digits", "GET", f"/v2/subscribe/demo/ch/0?tt={BIG_TT}", 400, obj_err(400, "tt")),
    Case("tt-18-digits", "GET", "/v2/subscribe/demo/ch/0?tt=179533480000000000", 400, obj_err(400, "tt")),
    Case("tt-plus-sign", "GET", "/v2/subscribe/demo/ch/0?tt=%2B1", 400, obj_err(400, "tt")),
    Case("tt-space", "GET", "/v2/subscribe/demo/ch/0?tt=%201", 400, obj_err(400, "tt")),
    Case("tt-float", "GET", "/v2/subscribe/demo/ch/0?tt=1.5", 400, obj_err(400, "tt")),
    Case("tr-text", "GET", "/v2/subscribe/demo/ch/0?tt=1&tr=x", 400, obj_err(400, "tr")),
    Case("history-start-text", "GET", "/v2/history/sub-key/demo/channel/ch?start=abc", 400, obj_err(400, "start")),
    Case("history-end-huge", "GET", f"/v2/history/sub-key/demo/channel/ch?end={BIG_TT}", 400, obj_err(400, "end")),
    Case("history-count-negative", "GET", "/v2/history/sub-key/demo/channel/ch?count=-5", 400, obj_err(400)),
    Case("fetch-start-negative", "GET", "/v3/history/sub-key/demo/channel/ch?start=-1", 400, obj_err(400)),
    Case("fetch-max-text", "GET", "/v3/history/sub-key/demo/channel/ch?max=lots", 400, obj_err(400)),
    Case("delete-end-text", "DELETE", "/v3/history/sub-key/demo/channel/ch?end=x", 400, obj_err(400)),
    Case("counts-no-timetoken", "GET", "/v3/history/sub-key/demo/message-counts/ch", 400,
         obj_err(400, "Invalid Arguments")),
    Case("counts-bad-timetoken", "GET", "/v3/history/sub-key/demo/message-counts/ch?timetoken=x", 400,
         obj_err(400, "Invalid timetoken: expected a timetoken of up to 17 digits")),
    Case("counts-mismatched-lists", "GET", "/v3/history/sub-key/demo/message-counts/a,b?channelsTimetoken=1", 400,
         obj_err(400, "Invalid Arguments")),
    # Keys.
    Case("publish-unknown-pub-key", "GET", "/publish/nope/demo/0/ch/0/1", 400, pub_err("Invalid Key")),
    Case("publish-unknown-sub-key", "GET", "/publish/demo/nope/0/ch/0/1", 400, pub_err("Invalid Key")),
    Case("publish-key-bad-chars", "GET", "/publish/de%20mo/demo/0/ch/0/1", 400, pub_err("Invalid Key")),
    Case("signal-unknown-key", "GET", "/signal/nope/demo/0/ch/0/1", 400, pub_err("Invalid Key")),
    Case("subscribe-unknown-key", "GET", "/v2/subscribe/nope/ch/0?tt=0", 400, obj_err(400, "Invalid Subscribe Key")),
    Case("history-unknown-key", "GET", "/v2/history/sub-key/nope/channel/ch", 400, obj_err(400, "Invalid Subscribe Key")),
    Case("fetch-unknown-key", "GET", "/v3/history/sub-key/nope/channel/ch", 400, obj_err(400, "Invalid Subscribe Key")),
    Case("delete-unknown-key", "DELETE", "/v3/history/sub-key/nope/channel/ch", 400,
         obj_err(400, "Invalid Subscribe Key")),
    Case("counts-unknown-key", "GET", "/v3/history/sub-key/nope/message-counts/ch?timetoken=1", 400,
         obj_err(400, "Invalid Subscribe Key")),
    Case("key-too-long", "GET", f"/v2/subscribe/{'k' * 101}/ch/0", 400, obj_err(400, "Invalid Subscribe Key")),
    # Channel names.
    Case("publish-empty-channel", "GET", f"{P}//0/1", 400, pub_err("Invalid Channel: name is empty")),
    Case("publish-comma-channel", "GET", f"{P}/a,b/0/1", 400, pub_err("Invalid Channel: name contains the forbidden character \",\"")),
    Case("publish-encoded-comma-channel", "GET", f"{P}/a%2Cb/0/1", 400,
         pub_err("Invalid Channel: name contains the forbidden character \",\"")),
    Case("publish-star-channel", "GET", f"{P}/a.*/0/1", 400,
         pub_err("Invalid Channel: name contains the forbidden character \"*\"")),
    Case("publish-control-char-channel", "GET", f"{P}/a%01b/0/1", 400, None),
    Case("publish-newline-channel", "GET", f"{P}/a%0Ab/0/1", 400, None),
    Case("publish-93-char-channel", "GET", f"{P}/{'c' * 93}/0/1", 400,
         pub_err("Invalid Channel: name is longer than 92 characters")),
    Case("subscribe-empty-channel-list", "GET", "/v2/subscribe/demo/,/0?tt=0", 400, obj_err(400)),
    Case("subscribe-empty-segment", "GET", "/v2/subscribe/demo//0?tt=0", 400, obj_err(400)),
    Case("subscribe-star-not-wildcard", "GET", "/v2/subscribe/demo/a*/0?tt=0", 400, obj_err(400)),
    Case("subscribe-bare-star", "GET", "/v2/subscribe/demo/*/0?tt=0", 400, obj_err(400)),
    Case("subscribe-wildcard-too-deep", "GET", "/v2/subscribe/demo/a.b.c.*/0?tt=0", 400, obj_err(400)),
    Case("subscribe-control-char", "GET", "/v2/subscribe/demo/a%00b/0?tt=0", 400, obj_err(400)),
    Case("subscribe-too-many-channels", "GET",
         "/v2/subscribe/demo/" + ",".join(f"c{i}" for i in range(201)) + "/0?tt=0", 414, obj_err(414)),
    Case("history-star-channel", "GET", "/v2/history/sub-key/demo/channel/a*", 400, obj_err(400)),
    Case("history-two-channels", "GET", "/v2/history/sub-key/demo/channel/a,b", 400, obj_err(400)),
    Case("fetch-empty-channel", "GET", "/v3/history/sub-key/demo/channel/,", 400, obj_err(400)),
    Case("delete-two-channels", "DELETE", "/v3/history/sub-key/demo/channel/a,b", 400, obj_err(400)),
    Case("uuid-too-long", "GET", f"/v2/subscribe/demo/ch/0?tt=0&uuid={'u' * 93}", 400, obj_err(400, "uuid")),
    Case("uuid-empty-publish", "GET", f"{P}/ch/0/1?uuid=", 400, None),
    # Wrong methods and unknown paths: 404 JSON objects.
    Case("put-time", "PUT", "/time/0", 404, obj_err(404), body=b""),
    Case("post-time", "POST", "/time/0", 404, obj_err(404), body=b"{}"),
    Case("delete-publish", "DELETE", f"{P}/ch/0/1", 404, obj_err(404)),
    Case("post-subscribe", "POST", "/v2/subscribe/demo/ch/0", 404, obj_err(404), body=b""),
    Case("get-delete-path-with-extra", "GET", "/v3/history/sub-key/demo/channel/ch/extra", 404, obj_err(404)),
    Case("patch-history", "PATCH", "/v2/history/sub-key/demo/channel/ch", 404, obj_err(404), body=b""),
    Case("root", "GET", "/", 404, obj_err(404)),
    Case("unknown", "GET", "/nope", 404, obj_err(404, "Not found")),
    Case("time-1", "GET", "/time/1", 404, obj_err(404)),
    Case("time-extra", "GET", "/time/0/extra", 404, obj_err(404)),
    Case("dot-dot", "GET", "/../../etc/passwd", 404, None),
    Case("encoded-dot-dot", "GET", "/%2E%2E/%2E%2E/etc/passwd", 404, obj_err(404)),
    Case("publish-missing-message", "GET", f"{P}/ch", 404, obj_err(404)),
    # Compressed bodies.
    Case("gzip-garbage", "POST", f"{P}/ch/0", 400, pub_err("Invalid compressed body"),
         body=b"this is not gzip at all", headers={"Content-Encoding": "gzip"}),
    Case("gzip-truncated", "POST", f"{P}/ch/0", 400, pub_err("Invalid compressed body"),
         body=gzip.compress(json.dumps({"a": os.urandom(3000).hex()}).encode())[:2000],
         headers={"Content-Encoding": "gzip"}),
    Case("gzip-missing-trailer", "POST", f"{P}/ch/0", 400, pub_err("Invalid compressed body"),
         body=gzip.compress(json.dumps({"a": os.urandom(3000).hex()}).encode())[:-8],
         headers={"Content-Encoding": "gzip"}),
    Case("deflate-garbage", "POST", f"{P}/ch/0", 400, pub_err("Invalid compressed body"),
         body=b"\xff\xfe\xfd garbage", headers={"Content-Encoding": "deflate"}),
    Case("gzip-of-invalid-json", "POST", f"{P}/ch/0", 400, pub_err("Invalid JSON"),
         body=gzip.compress(b"{nope"), headers={"Content-Encoding": "gzip"}),
    Case("gzip-bomb-100MB", "POST", f"{P}/ch/0", 413, pub_err("Message Too Large"),
         body=None, headers={"Content-Encoding": "gzip"}),  # body filled in below
    Case("zlib-bomb-100MB", "POST", f"{P}/ch/0", 413, pub_err("Message Too Large"),
         body=None, headers={"Content-Encoding": "gzip"}),
    Case("gzip-just-over-limit", "POST", f"{P}/ch/0", 413, pub_err("Message Too Large"),
         body=gzip.compress(json.dumps("z" * 33000).encode()), headers={"Content-Encoding": "gzip"}),
]


def _bomb(kind: str) -> bytes:
    zeros = b"0" * (1 << 20)  # "000..." is even valid JSON-ish prefix; content does not matter
    if kind == "gzip":
        c = zlib.compressobj(9, zlib.DEFLATED, 31)
    else:
        c = zlib.compressobj(9, zlib.DEFLATED, 15)
    out = [c.compress(zeros) for _ in range(100)]
    out.append(c.flush())
    return b"".join(out)


for _case in CASES:
    if _case.id == "gzip-bomb-100MB":
        _case.body = _bomb("gzip")
    elif _case.id == "zlib-bomb-100MB":
        _case.body = _bomb("zlib")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_corpus(origin, case: Case):
    headers = dict(case.headers)
    r = request(origin, case.method, case.target, body=case.body, headers=headers, timeout=10)
    body = assert_json_response(r, case.status)
    if case.check:
        case.check(body)
    assert r.elapsed < 5, f"took {r.elapsed:.1f}s"
    alive(origin)


# Features the server does not have yet answer with a JSON error (presence: 404, channel groups
# and filter expressions on subscribe: 400, access manager: 404). Once a feature lands the
# request succeeds instead; either way the answer is JSON and nothing breaks.
NOT_YET = [
    ("presence-heartbeat", "/v2/presence/sub-key/demo/channel/ch/heartbeat?heartbeat=300&uuid=u1", 404),
    ("presence-leave", "/v2/presence/sub-key/demo/channel/ch/leave?uuid=u1", 404),
    ("here-now", "/v2/presence/sub-key/demo/channel/ch?uuid=u1", 404),
    ("where-now", "/v2/presence/sub-key/demo/uuid/u1?uuid=u1", 404),
    ("subscribe-channel-groups", "/v2/subscribe/demo/,/0?tt=0&channel-group=g1&uuid=u1", 400),
    ("subscribe-filter-expr", "/v2/subscribe/demo/ch/0?tt=0&filter-expr=a%3D%3D1&uuid=u1", 400),
    ("channel-group-list", "/v1/channel-registration/sub-key/demo/channel-group/g1?uuid=u1", 404),
    ("pam-grant-token", "/v3/pam/demo/grant?uuid=u1", 404),
    ("message-actions", "/v1/message-actions/demo/channel/ch?uuid=u1", 404),
]


@pytest.mark.parametrize("target,not_yet_status", [(t, s) for _, t, s in NOT_YET], ids=[n for n, _, _ in NOT_YET])
def test_features_not_implemented_yet_answer_json(origin, target, not_yet_status):
    r = get(origin, target)
    if r.status == not_yet_status:
        body = assert_json_response(r, not_yet_status)
        is_error_object(body, not_yet_status)
    else:
        # Implemented since: whatever it answers must be a JSON success or a JSON client error.
        assert r.status in (200, 400, 403), r
        assert_json_response(r, r.status)
    alive(origin)


def test_every_endpoint_answers_javascript_json(origin):
    ch = unique("ct")
    tt = publish(origin, ch, "x")
    checks = [
        ("GET", "/time/0", None, 200),
        ("GET", f"{P}/{ch}/0/1?uuid=u", None, 200),
        ("POST", f"{P}/{ch}/0?uuid=u", b"2", 200),
        ("GET", f"/signal/demo/demo/0/{ch}/0/3", None, 200),
        ("GET", f"/v2/subscribe/demo/{ch}/0?tt=0", None, 200),
        ("GET", f"/v2/subscribe/demo/{ch}/0?tt={tt - 1}", None, 200),
        ("GET", f"/v2/history/sub-key/demo/channel/{ch}", None, 200),
        ("GET", f"/v3/history/sub-key/demo/channel/{ch}", None, 200),
        ("GET", f"/v3/history-with-actions/sub-key/demo/channel/{ch}", None, 200),
        ("GET", f"/v3/history/sub-key/demo/message-counts/{ch}?timetoken=1", None, 200),
        ("DELETE", f"/v3/history/sub-key/demo/channel/{unique('nothing')}", None, 200),
        ("GET", "/health", None, 200),
        ("GET", "/nope", None, 404),
        ("GET", "/publish/nope/demo/0/c/0/1", None, 400),
        ("POST", f"{P}/{ch}/0", json.dumps("x" * 40000).encode(), 413),
        ("GET", "/time/0?" + "a" * 40000, None, 414),
    ]
    for method, target, body, status in checks:
        r = request(origin, method, target, body=body)
        assert_json_response(r, status)
        assert r.headers.get("cache-control") == "no-cache", (target, r.headers)
        assert r.headers.get("access-control-allow-origin") == "*", (target, r.headers)
    health = get(origin, "/health").json()
    assert health["status"] == "ok" and health["store"] == "writable"
    assert isinstance(health["uptime_seconds"], int) and isinstance(health["waiting_long_polls"], int)
    assert int(health["timetoken"]) >= tt
    # /metrics is Prometheus text, not JSON.
    r = get(origin, "/metrics")
    assert r.status == 200 and r.content_type.startswith("text/plain"), r
    assert b"# TYPE" in r.body


def test_bombs_are_small_on_the_wire():
    for c in CASES:
        if "bomb" in c.id:
            assert len(c.body) < 132 * 1024, (c.id, len(c.body))


def test_empty_names_inside_a_list_are_ignored(origin):
    """Observed (lenient) behaviour: `a,,b` is read as [a, b] rather than refused."""
    a, b = unique("la"), unique("lb")
    tt0 = server_time(origin)
    ta = publish(origin, a, "in-a")
    tb = publish(origin, b, "in-b")
    r = get(origin, f"/v2/subscribe/demo/{a},,{b}/0?tt={tt0}")
    body = assert_json_response(r, 200)
    assert sorted((m["c"], int(m["p"]["t"])) for m in body["m"]) == sorted([(a, ta), (b, tb)])


@pytest.mark.parametrize("target", ["/v2/subscribe/demo/a%2Cb/0?tt=0", "/v3/history/sub-key/demo/channel/a%2Cb",
                                    "/v3/history/sub-key/demo/message-counts/a%2Cb?timetoken=1"])
def test_encoded_comma_inside_a_listed_name_is_refused(origin, target):
    r = get(origin, target)
    body = assert_json_response(r, 400)
    assert body.get("error") in (True, 1)


# -------------------------------------------------------------------------------------------------
# Timetokens that must answer promptly
# -------------------------------------------------------------------------------------------------

def test_future_tt_answers_within_subscribe_timeout(origin):
    t0 = time.monotonic()
    r = subscribe_raw(origin, unique("future"), "99999999999999999", timeout=SUBSCRIBE_TIMEOUT + 10)
    elapsed = time.monotonic() - t0
    body = assert_json_response(r, 200)
    assert body["m"] == []
    assert elapsed < SUBSCRIBE_TIMEOUT + 3, elapsed
    # The cursor handed back is the server's, not the absurd one.
    cursor = int(body["t"]["t"])
    assert cursor < 99999999999999999
    assert abs(cursor - server_time(origin)) < 600 * 10_000_000
    assert body["t"]["r"] == 1


def test_future_tt_still_delivers_new_messages(origin):
    ch = unique("future2")
    result = {}

    def waiter():
        result["r"] = subscribe_raw(origin, ch, "99999999999999999", timeout=SUBSCRIBE_TIMEOUT + 10)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.3)
    tt = publish(origin, ch, "now")
    t.join(SUBSCRIBE_TIMEOUT + 10)
    body = result["r"].json()
    assert [(int(m["p"]["t"]), m["d"]) for m in body["m"]] in ([(tt, "now")], [])


def test_tt_absent_and_empty_are_handshakes(origin):
    ch = unique("hs")
    publish(origin, ch, "old")
    for suffix in ("", "?tt=", "?tt=0", "?tt=00000"):
        t0 = time.monotonic()
        r = get(origin, f"/v2/subscribe/demo/{ch}/0{suffix}")
        body = assert_json_response(r, 200)
        assert body["m"] == [], suffix
        assert time.monotonic() - t0 < 3.0


# -------------------------------------------------------------------------------------------------
# Raw-socket abuse
# -------------------------------------------------------------------------------------------------

def test_garbage_bytes_instead_of_http(origin):
    for garbage in (b"\x00\xff\xfe\xfd" * 64 + b"\r\n\r\n",
                    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)),  # a TLS hello
                    b"HELLO WORLD\r\n\r\n",
                    b"GET\r\n\r\n",
                    b"GET /time/0 HTTP/9.9\r\n\r\n",
                    b"GET /time/0 HTTP/1.1\r\nHost: x\r\nBad Header Without Colon\r\n\r\n",
                    b"GET /ti\x00me/0 HTTP/1.1\r\nHost: x\r\n\r\n"):
        responses, rest, closed = raw_exchange(origin, garbage, timeout=3)
        # Either an HTTP error or a closed connection; never a hang, never a success.
        assert closed or responses, (garbage[:20], rest[:100])
        for r in responses:
            assert 400 <= r.status < 600, (garbage[:20], r)
        alive(origin)


def test_protocol_level_errors_close_the_connection(origin):
    """Requests the HTTP parser itself refuses get 400 and `Connection: close`."""
    for payload in (b"\x00\xff\xfe\xfd garbage\r\n\r\n",
                    b"GET /time/0 HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 300_000 + b"\r\n\r\n",
                    b"POST /publish/demo/demo/0/c/0 HTTP/1.1\r\nContent-Length: 4\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n1\r\n1\r\n0\r\n\r\n"):
        responses, rest, closed = raw_exchange(origin, payload, timeout=3, expect=2)
        assert [r.status for r in responses] == [400], (payload[:30], responses, rest)
        assert responses[0].headers.get("connection") == "close"
        assert closed


@pytest.mark.parametrize("payload", [
    b"\x00\xff\xfe\xfd garbage\r\n\r\n",
    b"GET /time/0 HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 300_000 + b"\r\n\r\n",
    b"POST /publish/demo/demo/0/c/0 HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n1",
], ids=["garbage", "huge-header", "negative-content-length"])
def test_protocol_level_errors_have_json_bodies(origin, payload):
    responses, rest, closed = raw_exchange(origin, payload, timeout=3)
    assert len(responses) == 1, rest
    body = assert_json_response(responses[0], responses[0].status)
    assert body.get("error") in (True, 1)


def test_http10_request(origin):
    responses, rest, closed = raw_exchange(origin, b"GET /time/0 HTTP/1.0\r\n\r\n", timeout=3)
    assert len(responses) == 1, rest
    r = responses[0]
    assert r.status == 200 and r.headers["content-type"] == CONTENT_TYPE
    assert isinstance(json.loads(r.body)[0], int)
    # With keep-alive asked for, a second request on the same connection is served.
    responses, rest, closed = raw_exchange(
        origin, b"GET /time/0 HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /nope HTTP/1.0\r\n\r\n", timeout=3,
        expect=2)
    assert [r.status for r in responses] == [200, 404], rest


@pytest.mark.parametrize("path", ["/time/0", "/v2/presence/sub-key/demo/channel/ch", "/nope"])
def test_http10_connection_closes_after_response(origin, path):
    # Not persistent without keep-alive (RFC 9112 9.3): answered, then closed — on the hot path
    # (time) and Hummingbird's (here-now, an unknown route) alike.
    responses, rest, closed = raw_exchange(origin, f"GET {path} HTTP/1.0\r\n\r\n".encode(), timeout=2, expect=2)
    assert len(responses) == 1, rest
    assert closed, "connection still open 2 s after the HTTP/1.0 response"


@pytest.mark.parametrize("connection", ["Close", "close, te"])
def test_connection_close_in_any_spelling_closes(origin, connection):
    request = f"GET /time/0 HTTP/1.1\r\nHost: x\r\nTE: trailers\r\nConnection: {connection}\r\n\r\n".encode()
    responses, rest, closed = raw_exchange(origin, request, timeout=2, expect=2)
    assert [r.status for r in responses] == [200], rest
    assert closed, "connection still open 2 s after answering a request that asked for close"


def test_pipelined_requests(origin):
    ch = unique("pipe")
    reqs = b"".join([
        b"GET /time/0 HTTP/1.1\r\nHost: x\r\n\r\n",
        f"GET {P}/{ch}/0/1 HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        f"POST {P}/{ch}/0 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n2".encode(),
        b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n",
        f"GET /v3/history/sub-key/demo/channel/{ch} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode(),
    ])
    responses, rest, closed = raw_exchange(origin, reqs, timeout=5, expect=5)
    assert [r.status for r in responses] == [200, 200, 200, 404, 200], (responses, rest)
    t1 = int(json.loads(responses[1].body)[2])
    t2 = int(json.loads(responses[2].body)[2])
    assert t1 < t2
    hist = json.loads(responses[4].body)["channels"][ch]
    assert [(h["message"], int(h["timetoken"])) for h in hist] == [(1, t1), (2, t2)]


def _heads(data: bytes) -> list[list[str]]:
    """The header lines of each response in `data` (each body skipped by its Content-Length)."""
    heads = []
    while data:
        end = data.index(b"\r\n\r\n")
        lines = data[:end].decode("latin-1").split("\r\n")
        heads.append(lines)
        lengths = [line.split(":", 1)[1].strip() for line in lines[1:] if line.lower().startswith("content-length:")]
        data = data[end + 4 + (int(lengths[0]) if lengths else 0):]
    return heads


@pytest.mark.parametrize("first", [
    b"GET /time/0 HTTP/1.1\r\nHost: x\r\n\r\n",
    # A request Tether's own head reader leaves to NIO's parser: it and everything after it on the
    # connection are read by NIO's decoder, and hot answers go out through NIO's encoder.
    b"GET /time/0 HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
], ids=["read-by-tether", "handed-over-to-nio"])
def test_every_answer_has_one_length_and_one_date(origin, first):
    """Hot answers get their Content-Length and Date as they are written, on either side of the
    hand-over: each answer, errors and Hummingbird's included, has exactly one of each."""
    ch = unique("framing")
    reqs = first + b"".join([
        f"GET {P}/{ch}/0/1?store=0 HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        f"GET {P}/{ch}/0/not-json HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        f"GET /v2/subscribe/demo/{ch}/0?tt=0 HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        f"GET /v2/history/sub-key/demo/channel/{ch} HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        b"GET /time/0 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    ])
    host, port = origin.rsplit(":", 1)
    data = b""
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(reqs)
        while chunk := conn.recv(65536):  # the last request closes the connection
            data += chunk
    heads = _heads(data)
    assert [int(lines[0].split(" ")[1]) for lines in heads] == [200, 200, 400, 200, 200, 200], heads
    for lines in heads:
        names = [line.split(":", 1)[0].lower() for line in lines[1:]]
        assert names.count("content-length") == 1 and names.count("date") == 1, lines
        date = next(line.split(":", 1)[1].strip() for line in lines[1:] if line.lower().startswith("date:"))
        assert re.fullmatch(r"[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT", date), lines


PARSE_FAILURE = {"status": 400, "error": True, "service": "Balancer", "message": "Could Not Parse Request"}


@pytest.mark.parametrize("first", [
    ["/time/0"],
    ["/v2/presence/sub-key/demo/channel/pipe-garbage"],
    ["/time/0", "/v2/presence/sub-key/demo/channel/pipe-garbage", "/time/0"],
], ids=["hot", "passed-on", "hot-passed-on-hot"])
def test_requests_before_unparseable_bytes_are_answered_first(origin, first):
    """Pipelined requests ahead of bytes the parser refuses keep their answers, in order; the
    JSON 400 comes last and the connection closes."""
    payload = b"".join(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for path in first)
    payload += b"\x00\xff\xfe garbage\r\n\r\n"
    responses, rest, closed = raw_exchange(origin, payload, timeout=5, expect=len(first) + 1)
    assert [r.status for r in responses] == [200] * len(first) + [400], (responses, rest)
    assert json.loads(responses[-1].body) == PARSE_FAILURE
    assert {k.lower(): v for k, v in responses[-1].headers.items()}.get("connection") == "close"
    alive(origin)


def test_truncated_post_body_then_close(origin):
    ch = unique("trunc")
    head = f"POST {P}/{ch}/0 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    responses, rest, closed = raw_exchange(origin, (head + '{"partial": ').encode(), timeout=3, half_close=True)
    # Nothing may be published from a partial body.
    for r in responses:
        assert r.status >= 400, r
    alive(origin)
    assert message_count(origin, ch) == 0
    assert fetch_all(origin, ch) == []


def test_truncated_post_body_left_open_does_not_block_others(origin):
    """A client that announces a body and never sends it holds only its own connection."""
    import socket

    host, port = origin.rsplit(":", 1)
    socks = []
    try:
        for _ in range(20):
            s = socket.create_connection((host, int(port)), timeout=5)
            s.sendall(f"POST {P}/slow/0 HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n12".encode())
            socks.append(s)
        t0 = time.monotonic()
        alive(origin)
        tt = publish(origin, unique("meanwhile"), "ok")
        assert tt > 0 and time.monotonic() - t0 < 5
    finally:
        for s in socks:
            s.close()
    alive(origin)
    assert message_count(origin, "slow") == 0


@pytest.mark.parametrize("shape", ["one-100KB-header", "2000-headers", "100KB-request-line-header-mix"])
def test_huge_headers(origin, shape):
    if shape == "one-100KB-header":
        headers = "X-Big: " + "a" * 100_000 + "\r\n"
    elif shape == "2000-headers":
        headers = "".join(f"X-H{i}: {i}\r\n" for i in range(2000))
    else:
        headers = "Cookie: " + "; ".join(f"c{i}={'v' * 50}" for i in range(2000)) + "\r\n"
    req = f"GET /time/0 HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode()
    responses, rest, closed = raw_exchange(origin, req, timeout=5)
    # Whatever the server decides (serve it, or refuse with 4xx, or close), it must not hang or
    # crash; a response, if any, is either the time or an error.
    for r in responses:
        assert r.status == 200 or 400 <= r.status < 500, r
    assert responses or closed
    alive(origin)
    print(f"{shape}: responses={[(r.status, r.body[:80]) for r in responses]} closed={closed}")


def test_absurd_content_length(origin):
    for cl in ("99999999999999999999", "-1", "abc", "1, 2"):
        req = f"POST {P}/cl/0 HTTP/1.1\r\nHost: x\r\nContent-Length: {cl}\r\n\r\n1".encode()
        responses, rest, closed = raw_exchange(origin, req, timeout=3)
        assert responses or closed, cl
        for r in responses:
            assert 400 <= r.status < 500, (cl, r)
        alive(origin)
    assert message_count(origin, "cl") == 0


def test_chunked_bodies(origin):
    ch = unique("chunk")
    good = (f"POST {P}/{ch}/0 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            "4\r\n{\"a\"\r\n3\r\n: 1\r\n1\r\n}\r\n0\r\n\r\n").encode()
    responses, rest, _ = raw_exchange(origin, good, timeout=3)
    assert [r.status for r in responses] == [200], (responses, rest)
    tt = int(json.loads(responses[0].body)[2])
    bad = (f"POST {P}/{ch}/0 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
           "zz\r\nhello\r\n0\r\n\r\n").encode()
    responses, rest, closed = raw_exchange(origin, bad, timeout=3)
    assert closed or all(400 <= r.status < 500 for r in responses)
    alive(origin)
    assert [(h["message"], int(h["timetoken"])) for h in fetch_all(origin, ch)] == [({"a": 1}, tt)]


def test_content_length_and_chunked_together(origin):
    """A request-smuggling shape: both framings. It must not publish two messages."""
    ch = unique("smuggle")
    req = (f"POST {P}/{ch}/0 HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
           f"1\r\n1\r\n0\r\n\r\nGET {P}/{ch}/0/2 HTTP/1.1\r\nHost: x\r\n\r\n").encode()
    responses, rest, closed = raw_exchange(origin, req, timeout=3, expect=2)
    alive(origin)
    print("CL+TE:", [(r.status, r.body[:60]) for r in responses], closed)
    assert message_count(origin, ch) <= 1


def test_many_connections_opened_and_dropped(origin):
    import socket

    host, port = origin.rsplit(":", 1)
    for i in range(200):
        s = socket.create_connection((host, int(port)), timeout=5)
        if i % 3 == 0:
            s.sendall(b"GET /time/0 HTTP/1.1\r\n")
        s.close()
    alive(origin)


def test_subscribe_client_disconnects_mid_long_poll(origin):
    """Dropping a waiting long-poll must free it (no leak of waiting long-polls)."""
    ch = unique("drop")
    tt = server_time(origin)
    for _ in range(20):
        raw_exchange(origin, f"GET /v2/subscribe/demo/{ch}/0?tt={tt} HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
                     timeout=0.05)

    def waiting():
        return get(origin, "/health").json()["waiting_long_polls"] == 0
    deadline = time.monotonic() + 5
    while not waiting():
        assert time.monotonic() < deadline, get(origin, "/health").json()
        time.sleep(0.05)


# -------------------------------------------------------------------------------------------------
# After the corpus (these run last in this module)
# -------------------------------------------------------------------------------------------------

def test_zz_server_still_serves_round_trip(origin):
    ch = unique("after")
    tt0 = server_time(origin)
    result = {}

    def waiter():
        result["r"] = subscribe_raw(origin, ch, tt0, timeout=SUBSCRIBE_TIMEOUT + 10)

    t = threading.Thread(target=waiter)
    t.start()
    tt = publish(origin, ch, {"after": "corpus"}, meta=json.dumps({"ok": True}))
    t.join(SUBSCRIBE_TIMEOUT + 10)
    body = result["r"].json()
    assert [(int(m["p"]["t"]), m["d"], m["u"], m["c"]) for m in body["m"]] == [
        (tt, {"after": "corpus"}, {"ok": True}, ch)]
    h = get(origin, f"/v2/history/sub-key/demo/channel/{ch}?include_token=true&include_meta=true").json()
    assert h == [[{"message": {"after": "corpus"}, "timetoken": tt, "meta": {"ok": True}}], tt, tt]


def test_zz_store_intact(origin, baseline):
    for ch, expected in baseline.items():
        items = fetch_all(origin, ch)
        assert [(int(i["timetoken"]), i["message"], i["meta"]) for i in items] == \
            [(tt, m, {"i": m["i"]}) for tt, m in expected]
        assert message_count(origin, ch) == BASELINE_PER_CHANNEL
    # Nothing from the corpus leaked into the channels it aimed at.
    assert fetch_all(origin, "ch") == []
    assert message_count(origin, "ch") == 0
    health = get(origin, "/health").json()
    assert health["status"] == "ok" and health["store"] == "writable"
