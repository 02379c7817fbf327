"""Mobile push device registrations and delivery, driven by the real PubNub Python SDK.

Spec: docs/push.md, docs/compatibility.md ("Mobile push"). The v1 form
(`/v1/push/sub-key/{sub}/devices/{token}` with `add` / `remove` / list and `type=apns|gcm|fcm|mpns`,
`…/remove` for the whole device) and the APNs2 form (`/v2/push/sub-key/{sub}/devices-apns2/{token}`
with `environment` and `topic`), PubNub's answers (`[1, "Modified Channels"]`, the channel list,
`[1, "Removed Device"]`) and its 400 bodies (`{"error": "Invalid type argument"}`,
`{"error": "Invalid device token"}`); registrations survive a restart; then end to end: a device
registered with the SDK, a publish with `pn_apns` / `pn_fcm`, and the webhook provider's signed
POST received by a local HTTP server.
"""

from __future__ import annotations

import hashlib
import hmac
import http.server
import json
import subprocess
import threading

import pytest
from pubnub.enums import PNPushEnvironment, PNPushType
from pubnub.exceptions import PubNubException

from helpers import (SUB_KEY, TETHER_BIN, get, publish, q, query, subscribe_raw, unique, wait_until)

pytestmark = pytest.mark.timeout(60)

APNS_TOKEN = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
TOPIC = "com.example.tether"


def add(pn, token, push_type, channels, topic=None, environment=None):
    b = pn.add_channels_to_push().device_id(token).push_type(push_type).channels(channels)
    if topic:
        b = b.topic(topic)
    if environment:
        b = b.environment(environment)
    return b.sync()


def listed(pn, token, push_type, topic=None, environment=None):
    b = pn.list_push_channels().device_id(token).push_type(push_type)
    if topic:
        b = b.topic(topic)
    if environment:
        b = b.environment(environment)
    return sorted(b.sync().result.channels)


def raw(origin, path, **params):
    return get(origin, path + query({"uuid": "raw-user", **params}))


# ------------------------------------------------------------------------------- registrations

def test_v1_add_list_remove_with_the_sdk(pubnub):
    a, b, c = unique("push"), unique("push"), unique("push")
    added = add(pubnub, APNS_TOKEN, PNPushType.APNS, [a, b, c])
    assert not added.status.is_error() and added.status.status_code == 200
    assert listed(pubnub, APNS_TOKEN, PNPushType.APNS) == sorted([a, b, c])
    # Gateways are separate: the same token on FCM has nothing; gcm and fcm are one gateway.
    assert listed(pubnub, APNS_TOKEN, PNPushType.FCM) == []
    add(pubnub, "fcm-token-1", PNPushType.GCM, [a])
    assert listed(pubnub, "fcm-token-1", PNPushType.FCM) == [a]

    removed = pubnub.remove_channels_from_push().device_id(APNS_TOKEN).push_type(PNPushType.APNS).channels([b]).sync()
    assert not removed.status.is_error()
    assert listed(pubnub, APNS_TOKEN, PNPushType.APNS) == sorted([a, c])

    gone = pubnub.remove_device_from_push().device_id(APNS_TOKEN).push_type(PNPushType.APNS).sync()
    assert not gone.status.is_error() and gone.status.status_code == 200
    assert listed(pubnub, APNS_TOKEN, PNPushType.APNS) == []


def test_apns2_environments_and_topics_are_separate_registrations(pubnub):
    dev, prod = unique("dev"), unique("prod")
    add(pubnub, APNS_TOKEN, PNPushType.APNS2, [dev], topic=TOPIC, environment=PNPushEnvironment.DEVELOPMENT)
    add(pubnub, APNS_TOKEN, PNPushType.APNS2, [prod], topic=TOPIC, environment=PNPushEnvironment.PRODUCTION)
    assert listed(pubnub, APNS_TOKEN, PNPushType.APNS2, TOPIC, PNPushEnvironment.DEVELOPMENT) == [dev]
    assert listed(pubnub, APNS_TOKEN, PNPushType.APNS2, TOPIC, PNPushEnvironment.PRODUCTION) == [prod]
    assert listed(pubnub, APNS_TOKEN, PNPushType.APNS2, "com.example.other", PNPushEnvironment.PRODUCTION) == []
    # The v1 APNs gateway is another registration again.
    assert listed(pubnub, APNS_TOKEN, PNPushType.APNS) == []
    pubnub.remove_device_from_push().device_id(APNS_TOKEN).push_type(PNPushType.APNS2).topic(TOPIC) \
        .environment(PNPushEnvironment.PRODUCTION).sync()
    assert listed(pubnub, APNS_TOKEN, PNPushType.APNS2, TOPIC, PNPushEnvironment.PRODUCTION) == []
    assert listed(pubnub, APNS_TOKEN, PNPushType.APNS2, TOPIC, PNPushEnvironment.DEVELOPMENT) == [dev]


def test_wire_answers_are_pubnubs(origin):
    ch = unique("push")
    path = f"/v1/push/sub-key/{SUB_KEY}/devices/{APNS_TOKEN}"
    r = raw(origin, path, add=ch, type="apns")
    assert (r.status, r.json()) == (200, [1, "Modified Channels"])
    assert r.content_type.startswith("text/javascript")
    assert raw(origin, path, type="apns").json() == [ch]
    # remove and add in one call: removals first, as PubNub documents.
    other = unique("push")
    assert raw(origin, path, type="apns", add=other, remove=ch).json() == [1, "Modified Channels"]
    assert raw(origin, path, type="apns").json() == [other]
    r = raw(origin, path + "/remove", type="apns")
    assert (r.status, r.json()) == (200, [1, "Removed Device"])
    # Removing a device that has nothing is still a success (PubNub's recorded answer).
    assert raw(origin, f"/v1/push/sub-key/{SUB_KEY}/devices/nonexistent_device_123/remove", type="apns").json() \
        == [1, "Removed Device"]


def test_list_pages_with_start_and_count(origin):
    names = sorted(unique(f"p{i}") for i in range(5))
    path = f"/v1/push/sub-key/{SUB_KEY}/devices/fcm-pager"
    raw(origin, path, type="fcm", add=",".join(names))
    assert raw(origin, path, type="fcm", count=2).json() == names[:2]
    assert raw(origin, path, type="fcm", count=2, start=names[1]).json() == names[2:4]
    r = raw(origin, path, type="fcm", count=0)
    assert r.status == 400 and "count" in r.json()["error"]


# ------------------------------------------------------------------------------------ bad input

def test_missing_type_is_pubnubs_400(pubnub, origin):
    # The SDK sends no `type` for an unknown push type; PubNub answers 400 with this body.
    with pytest.raises(PubNubException) as raised:
        pubnub.add_channels_to_push().device_id(APNS_TOKEN).push_type("INVALID_PUSH_TYPE").channels(["a"]).sync()
    assert raised.value.get_status_code() == 400
    assert "Invalid type argument" in raised.value.get_error_message()
    for path in (f"/v1/push/sub-key/{SUB_KEY}/devices/{APNS_TOKEN}", f"/v1/push/sub-key/{SUB_KEY}/devices/{APNS_TOKEN}/remove"):
        r = raw(origin, path)
        assert (r.status, r.json()) == (400, {"error": "Invalid type argument"})
    assert raw(origin, f"/v1/push/sub-key/{SUB_KEY}/devices/{APNS_TOKEN}", type="webos").status == 400


def test_invalid_apns_token_is_pubnubs_400(pubnub):
    with pytest.raises(PubNubException) as raised:
        add(pubnub, "device_id_should_be_16_characters_long", PNPushType.APNS, ["a", "b"])
    assert raised.value.get_status_code() == 400
    assert raised.value.get_error_message() == "Invalid device token"


def test_bad_environment_and_missing_topic(pubnub, origin):
    with pytest.raises(PubNubException) as raised:
        add(pubnub, APNS_TOKEN, PNPushType.APNS2, ["a"], topic=TOPIC, environment="staging")
    assert raised.value.get_status_code() == 400
    assert "environment" in raised.value.get_error_message()
    path = f"/v2/push/sub-key/{SUB_KEY}/devices-apns2/{APNS_TOKEN}"
    r = raw(origin, path, add="a", environment="production")
    assert (r.status, r.json()) == (400, {"error": "Missing topic argument"})
    r = raw(origin, path, add="a", environment="production", topic="not a bundle id")
    assert r.status == 400 and "topic" in r.json()["error"]
    # The SDK refuses a missing topic before sending anything.
    with pytest.raises(PubNubException):
        add(pubnub, APNS_TOKEN, PNPushType.APNS2, ["a"])


def test_bad_channels_and_keys(origin):
    path = f"/v1/push/sub-key/{SUB_KEY}/devices/{APNS_TOKEN}"
    r = raw(origin, path, type="apns", add="ok,bad*name")
    assert r.status == 400 and "Invalid channel" in r.json()["error"]
    r = raw(origin, path, type="apns", add="room-pnpres")
    assert r.status == 400
    r = raw(origin, f"/v1/push/sub-key/nope/devices/{APNS_TOKEN}", type="apns")
    assert (r.status, r.json()) == (400, {"error": "Invalid Subscribe Key"})
    r = raw(origin, path, type="apns", add=",".join(f"c{i}" for i in range(1001)))
    assert r.status in (400, 414)


def test_registrations_survive_a_restart(server_factory):
    server = server_factory.start()
    ch = unique("durable")
    path = f"/v1/push/sub-key/{SUB_KEY}/devices/{APNS_TOKEN}"
    assert raw(server.origin, path, type="apns", add=ch).status == 200
    data_dir = server.data_dir
    server.stop()
    again = server_factory.start(data_dir=data_dir)
    assert raw(again.origin, path, type="apns").json() == [ch]


# ------------------------------------------------------------------------------ end to end

class Webhook:
    """A local HTTP server recording the webhook provider's POSTs; answers 410 for `gone_tokens`."""

    def __init__(self):
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self.gone_tokens: set[str] = set()
        self.flaky_tokens: set[str] = set()  # answered 503 once, then 200
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                document = json.loads(body)
                with outer.lock:
                    outer.requests.append({"headers": {k.lower(): v for k, v in self.headers.items()}, "body": body,
                                           "json": document})
                token = document["device"]["token"]
                status = 410 if token in outer.gone_tokens else 200
                with outer.lock:
                    if token in outer.flaky_tokens:
                        outer.flaky_tokens.discard(token)
                        status = 503
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/push"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def received(self):
        with self.lock:
            return list(self.requests)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def webhook():
    hook = Webhook()
    yield hook
    hook.close()


SECRET = "webhook-secret"


def test_end_to_end_register_publish_and_webhook_receives(server_factory, make_pubnub, webhook):
    server = server_factory.start(args=["--push-webhook-url", webhook.url, "--push-webhook-secret", SECRET])
    pn = make_pubnub("pusher", origin=server.origin)
    ch = unique("e2e")
    fcm_token = "fcm-device-token-1"
    add(pn, APNS_TOKEN, PNPushType.APNS2, [ch], topic=TOPIC, environment=PNPushEnvironment.PRODUCTION)
    add(pn, fcm_token, PNPushType.FCM, [ch])
    add(pn, "fcm-excluded", PNPushType.FCM, [ch])

    message = {
        "text": "hello",
        "pn_apns": {"aps": {"alert": {"title": "Hi", "body": "hello"}, "badge": 1},
                    "pn_push": [{"push_type": "alert", "targets": [{"environment": "production", "topic": TOPIC}],
                                 "version": "v2"}]},
        "pn_fcm": {"notification": {"title": "Hi", "body": "hello"}, "data": {"room": ch, "count": 3},
                   "pn_exceptions": ["fcm-excluded"]},
    }
    envelope = pn.publish().channel(ch).message(message).sync()
    tt = int(envelope.result.timetoken)

    wait_until(lambda: len(webhook.received()) >= 2, what="two webhook deliveries")
    got = webhook.received()
    assert len(got) == 2, got
    by_type = {r["json"]["device"]["type"]: r for r in got}
    apns, fcm = by_type["apns2"], by_type["gcm"]
    for r in got:
        expected = "sha256=" + hmac.new(SECRET.encode(), r["body"], hashlib.sha256).hexdigest()
        assert r["headers"]["x-tether-signature"] == expected
        assert r["headers"]["content-type"] == "application/json"
        assert r["json"]["channel"] == ch and r["json"]["timetoken"] == str(tt) and r["json"]["subscribeKey"] == SUB_KEY
    assert apns["json"]["device"] == {"token": APNS_TOKEN, "type": "apns2", "environment": "production", "topic": TOPIC,
                                      "pushType": "alert"}
    # pn_* keys are Tether's instructions, never sent on.
    assert apns["json"]["payload"] == {"aps": {"alert": {"title": "Hi", "body": "hello"}, "badge": 1}}
    assert fcm["json"]["device"]["token"] == fcm_token
    assert fcm["json"]["payload"] == {"notification": {"title": "Hi", "body": "hello"}, "data": {"room": ch, "count": 3}}

    assert push_metric(server.origin, "webhook", "sent") == 2


def push_metric(origin: str, provider: str, outcome: str) -> float:
    """`tether_push_total{provider,outcome}` from /metrics (labels in either order), 0 when absent."""
    for line in get(origin, "/metrics").body.decode().splitlines():
        if line.startswith("tether_push_total{") and f'provider="{provider}"' in line and f'outcome="{outcome}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0


def masked(token):
    """A token as a pn_debug report shows it (docs/push.md): its first 6 and last 4 characters."""
    return token[:6] + "\u2026" + token[-4:] if len(token) > 12 else "*" * len(token)


def test_gone_device_is_unregistered_and_pn_debug_reports(server_factory, make_pubnub, webhook):
    server = server_factory.start(args=["--push-webhook-url", webhook.url, "--push-webhook-secret", SECRET])
    pn = make_pubnub("pusher", origin=server.origin)
    ch = unique("gone")
    webhook.gone_tokens.add("fcm-gone-device-0001")
    webhook.flaky_tokens.add("fcm-alive-device-0002")
    add(pn, "fcm-gone-device-0001", PNPushType.FCM, [ch])
    add(pn, "fcm-alive-device-0002", PNPushType.FCM, [ch])
    cursor = subscribe_raw(server.origin, f"{ch}-pndebug", 0).json()["t"]["t"]

    publish(server.origin, ch, {"pn_debug": True, "pn_gcm": {"data": {"k": "v"}}})
    wait_until(lambda: len(webhook.received()) >= 3, what="three webhook requests (one retried)")
    wait_until(lambda: listed(pn, "fcm-gone-device-0001", PNPushType.FCM) == [], what="the gone device unregistered")
    assert listed(pn, "fcm-alive-device-0002", PNPushType.FCM) == [ch]

    r = subscribe_raw(server.origin, f"{ch}-pndebug", cursor)
    reports = [m["d"] for m in r.json()["m"]]
    assert len(reports) == 1
    results = {x["token"]: x["result"] for x in reports[0]["results"]}
    assert results[masked("fcm-alive-device-0002")] == "sent" and results[masked("fcm-gone-device-0001")].startswith("unregistered")
    assert reports[0]["devices"] == 2 and reports[0]["omitted"] == 0
    assert b"fcm-alive-device-0002" not in r.body, "no whole token in the report"
    assert push_metric(server.origin, "webhook", "unregistered") == 1
    assert push_metric(server.origin, "webhook", "retried") == 1
    assert push_metric(server.origin, "webhook", "sent") == 1


def test_push_settings_are_validated(tmp_path):
    config = tmp_path / "push.json"
    config.write_text(json.dumps({"push": {"webhook": {"url": "not a url", "secret": "x"}}}))
    done = subprocess.run([TETHER_BIN, "serve", "--port", "0", "--data-dir", str(tmp_path / "a"), "--config", str(config)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "push.webhook.url" in done.stderr + done.stdout
    done = subprocess.run([TETHER_BIN, "serve", "--port", "0", "--data-dir", str(tmp_path / "b"), "--push-webhook-url",
                           "http://127.0.0.1:9/x"], capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "--push-webhook-secret" in done.stderr + done.stdout
    done = subprocess.run([TETHER_BIN, "serve", "--port", "0", "--data-dir", str(tmp_path / "c"), "--apns-key",
                           str(tmp_path / "missing.p8"), "--apns-key-id", "K", "--apns-team-id", "T"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "missing.p8" in done.stderr + done.stdout


def test_pn_debug_without_a_provider_reports_skipped_devices(pubnub, origin):
    ch = unique("nodebug")
    add(pubnub, "fcm-no-provider", PNPushType.FCM, [ch])
    assert raw(origin, f"/v1/push/sub-key/{SUB_KEY}/devices/mpns-device", type="mpns", add=ch).status == 200
    cursor = subscribe_raw(origin, f"{ch}-pndebug", 0).json()["t"]["t"]
    publish(origin, ch, {"pn_debug": True, "pn_fcm": {"data": {"k": "v"}}})
    reports = [m["d"] for m in subscribe_raw(origin, f"{ch}-pndebug", cursor).json()["m"]]
    assert len(reports) == 1 and reports[0]["devices"] == 2
    results = {x["token"]: x["result"] for x in reports[0]["results"]}
    assert results == {masked("fcm-no-provider"): "skipped: no provider for Google devices",
                       masked("mpns-device"): "skipped: MPNS is not sent"}
    # A message without pn_debug and no provider configured is never queued.
    assert push_metric(origin, "queue", "dropped") == 0
