"""Publishes repeated with the same `requestid` (docs/protocol.md, "Repeated publishes"), with the
real binary over raw HTTP:

- a repeat is answered with PubNub's body and the original timetoken, plus `Tether-Duplicate: 1`,
  and history holds one copy; a subscriber receives it once;
- the memory survives SIGKILL (the record is in the message's transaction);
- `--dedup-window 0` turns it off; an invalid id gets PubNub's publish error array with 400;
- the PubNub Python SDK, which sends no request id, publishes exactly as before."""

from __future__ import annotations

import uuid

import pytest

from helpers import fetch_all, get, publish_path, request, subscribe_raw, unique

pytestmark = pytest.mark.timeout(60)


def send(origin: str, channel: str, message, request_id: str | None, **params):
    if request_id is not None:
        params["requestid"] = request_id
    r = get(origin, publish_path(channel, message, **params))
    return r


def test_a_repeat_gets_the_original_timetoken_and_the_header(origin):
    ch = unique("dedup")
    rid = str(uuid.uuid4())
    cursor = subscribe_raw(origin, ch, 0).json()["t"]["t"]
    first = send(origin, ch, {"n": 1}, rid)
    again = send(origin, ch, {"n": 1}, rid)
    assert first.status == 200 and again.status == 200
    assert again.body == first.body  # [1,"Sent","<tt>"], unchanged
    assert "tether-duplicate" not in first.headers
    assert again.headers.get("tether-duplicate") == "1"
    marker = send(origin, ch, {"n": 2}, str(uuid.uuid4()))
    assert marker.status == 200
    assert [i["message"] for i in fetch_all(origin, ch)] == [{"n": 1}, {"n": 2}]
    page = subscribe_raw(origin, ch, cursor).json()
    assert [m["d"] for m in page["m"]] == [{"n": 1}, {"n": 2}]
    assert page["m"][0]["p"]["t"] == first.json()[2]


def test_signals_and_post_publishes_are_deduplicated(origin):
    ch = unique("dedup")
    rid = str(uuid.uuid4())
    path = f"/signal/demo/demo/0/{ch}/0/%22s%22?uuid=raw-publisher&requestid={rid}"
    a, b = get(origin, path), get(origin, path)
    assert a.status == b.status == 200 and a.body == b.body and b.headers.get("tether-duplicate") == "1"
    post = f"/publish/demo/demo/0/{ch}/0?uuid=raw-publisher&requestid={rid}-post"
    c = request(origin, "POST", post, body=b'{"p":1}', headers={"Content-Type": "application/json"})
    d = request(origin, "POST", post, body=b'{"p":1}', headers={"Content-Type": "application/json"})
    assert c.status == d.status == 200 and c.body == d.body and d.headers.get("tether-duplicate") == "1"
    assert [i["message"] for i in fetch_all(origin, ch)] == [{"p": 1}]


def test_the_memory_survives_sigkill(server_factory):
    srv = server_factory.start()
    ch = unique("dedup")
    rid = str(uuid.uuid4())
    first = send(srv.origin, ch, "kept", rid)
    assert first.status == 200
    srv.restart(graceful=False)
    again = send(srv.origin, ch, "kept", rid)
    assert again.status == 200 and again.body == first.body
    assert again.headers.get("tether-duplicate") == "1"
    assert [i["message"] for i in fetch_all(srv.origin, ch)] == ["kept"]


def test_a_zero_window_turns_it_off(server_factory):
    srv = server_factory.start(args=["--dedup-window", "0"])
    ch = unique("dedup")
    a, b = send(srv.origin, ch, 1, "same"), send(srv.origin, ch, 1, "same")
    assert a.status == b.status == 200 and a.body != b.body
    assert "tether-duplicate" not in b.headers
    assert len(fetch_all(srv.origin, ch)) == 2


@pytest.mark.parametrize("bad", ["", "x" * 65, "two words", "caf\u00e9", "tab\there"])
def test_an_invalid_request_id_gets_400(origin, bad):
    r = send(origin, unique("dedup"), 1, bad)
    assert r.status == 400, r
    body = r.json()
    assert body[0] == 0 and body[1].startswith("Invalid requestid"), body
    assert int(body[2]) > 0


def test_the_pubnub_sdk_publishes_as_before(pubnub, origin):
    ch = unique("dedup")
    first = pubnub.publish().channel(ch).message("same").sync()
    second = pubnub.publish().channel(ch).message("same").sync()
    assert not first.status.is_error() and not second.status.is_error()
    assert first.result.timetoken != second.result.timetoken
    assert [i["message"] for i in fetch_all(origin, ch)] == ["same", "same"]


@pytest.mark.parametrize("args, message", [
    (["--dedup-window=-1"], "--dedup-window must be between 0 (off) and 86400 seconds"),
    (["--dedup-window", "86401"], "--dedup-window must be between 0 (off) and 86400 seconds"),
    (["--dedup-max-entries", "0"], "--dedup-max-entries must be between 1 and 10000000"),
    (["--dedup-max-entries", "99999999999"], "--dedup-max-entries must be between 1 and 10000000"),
    (["--ws-keepalive", "0"], "--ws-keepalive must be between"),
    (["--ws-ping-interval", "3601"], "--ws-ping-interval must be between"),
    (["--ws-max-connections", "0"], "--ws-max-connections must be between"),
    (["--ws-outbound-buffer=-5"], "--ws-outbound-buffer must be between"),
    (["--ws", "maybe"], "--ws must be on or off"),
])
def test_serve_refuses_out_of_range_dedup_and_websocket_settings(args, message, tmp_path):
    """Every new `tether serve` setting is bounded: a hostile value stops the server before it
    starts, with a message naming the setting and its range."""
    import os
    import subprocess

    from helpers import TETHER_BIN
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    proc = subprocess.run([TETHER_BIN, "serve", "--port", "0", "--data-dir", str(tmp_path / "data"), *args],
                          capture_output=True, text=True, timeout=30, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir()), "nothing written before validation"
