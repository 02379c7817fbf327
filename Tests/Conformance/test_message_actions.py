"""Message actions and history with actions, driven by the real PubNub Python SDK (threaded).

Spec: docs/protocol.md "Message actions", docs/compatibility.md (what PubNub does and where
Tether differs). Add (`POST /v1/message-actions/{sub}/channel/{ch}/message/{tt}`), remove
(`DELETE …/action/{tt}`), get with start / end / limit and `more`, action events (message
type 3) to subscribers, duplicates refused with 409, actions removed with their message, the
access manager's write / read / delete, and `fetch_messages(include_message_actions=True)`.
"""

from __future__ import annotations

import json

import pytest
from pubnub.callbacks import SubscribeCallback
from pubnub.enums import PNStatusCategory
from pubnub.exceptions import PubNubException
from pubnub.models.consumer.message_actions import PNMessageAction

from helpers import (RecordingListener, SECURE_KEYSET, SUB_KEY, publish, q, query, request, sdk_error_status, signed_request, status_body,
                     threaded_clients, unique, wait_until, write_keysets_config)

pytestmark = pytest.mark.timeout(60)


def action(type_: str, value: str, message_tt) -> PNMessageAction:
    return PNMessageAction().create(type=type_, value=value, message_timetoken=message_tt)


def add(pn, channel, type_, value, message_tt):
    return pn.add_message_action().channel(channel).message_action(action(type_, value, message_tt)).sync()


def actions_path(channel: str, message_tt=None, action_tt=None, sub=SUB_KEY) -> str:
    path = f"/v1/message-actions/{sub}/channel/{q(channel)}"
    if message_tt is not None:
        path += f"/message/{message_tt}"
    if action_tt is not None:
        path += f"/action/{action_tt}"
    return path


def raw(origin, method, path, body=None, **params):
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    headers = {"Content-Type": "application/json"} if data is not None else None
    return request(origin, method, path + query({"uuid": "raw-user", **params}), body=data, headers=headers)


def assert_actions_error(r, status, message_part):
    assert r.status == status, r
    body = r.json()
    assert body["status"] == status and body["error"]["source"] == "actions", body
    assert message_part in body["error"]["message"], body


class ActionListener(RecordingListener, SubscribeCallback):
    def __init__(self):
        super().__init__()
        self.actions = []

    def message_action(self, pubnub, message_action):
        self._record(self.actions, message_action)


# ------------------------------------------------------------------------------------- add / get

def test_add_get_remove_with_the_sdk(make_pubnub, origin):
    pn = make_pubnub("alice")
    ch = unique()
    tt = publish(origin, ch, "hello")

    first = add(pn, ch, "reaction", "smiley_face", tt)
    assert not first.status.is_error() and first.status.status_code == 200
    assert (first.result.type, first.result.value, first.result.uuid) == ("reaction", "smiley_face", "alice")
    assert int(first.result.message_timetoken) == tt
    assert int(first.result.action_timetoken) > tt
    second = add(pn, ch, "receipt", "read", tt)
    assert int(second.result.action_timetoken) > int(first.result.action_timetoken)

    got = pn.get_message_actions().channel(ch).sync()
    assert not got.status.is_error()
    listed = [(a.type, a.value, a.uuid, a.action_timetoken, int(a.message_timetoken)) for a in got.result.actions]
    assert listed == [("reaction", "smiley_face", "alice", first.result.action_timetoken, tt),
                      ("receipt", "read", "alice", second.result.action_timetoken, tt)]

    removed = pn.remove_message_action().channel(ch).message_timetoken(tt) \
        .action_timetoken(int(first.result.action_timetoken)).sync()
    assert not removed.status.is_error() and removed.status.status_code == 200
    left = pn.get_message_actions().channel(ch).sync().result.actions
    assert [a.value for a in left] == ["read"]


def test_duplicate_is_refused_with_409(make_pubnub, origin):
    pn = make_pubnub("bob")
    ch = unique()
    tt = publish(origin, ch, "m")
    add(pn, ch, "reaction", "like", tt)
    with pytest.raises(PubNubException) as raised:
        add(pn, ch, "reaction", "like", tt)
    assert raised.value.get_status_code() == 409
    status = sdk_error_status(pn.add_message_action().channel(ch).message_action(action("reaction", "like", tt)))
    assert status_body(status) == {"status": 409, "error": {"source": "actions", "message": "Action Already Added"}}
    # The same reaction by somebody else is a different action.
    other = add(make_pubnub("carol"), ch, "reaction", "like", tt)
    assert other.result.uuid == "carol"
    assert len(pn.get_message_actions().channel(ch).sync().result.actions) == 2


def test_pagination_with_limit_start_end_and_more(make_pubnub, origin):
    pn = make_pubnub("pager")
    ch = unique()
    tt = publish(origin, ch, "m")
    tts = [int(add(pn, ch, "n", str(i), tt).result.action_timetoken) for i in range(5)]

    page = raw(origin, "GET", actions_path(ch), limit=2).json()
    assert [int(a["actionTimetoken"]) for a in page["data"]] == tts[3:]
    assert page["more"]["start"] == str(tts[3]) and page["more"]["limit"] == 2
    assert page["more"]["url"].startswith(f"/v1/message-actions/{SUB_KEY}/channel/{ch}?start={tts[3]}")
    # Following `more` walks back to the oldest; the last page has none.
    seen = [a["value"] for a in page["data"]]
    while "more" in page:
        page = request(origin, "GET", page["more"]["url"]).json()
        seen = [a["value"] for a in page["data"]] + seen
    assert seen == ["0", "1", "2", "3", "4"]

    # The SDK's start (exclusive) and end (inclusive, sent only without start) and limit.
    sdk_page = pn.get_message_actions().channel(ch).start(str(tts[3])).limit("2").sync().result.actions
    assert [a.value for a in sdk_page] == ["1", "2"]
    sdk_end = pn.get_message_actions().channel(ch).end(str(tts[2])).sync().result.actions
    assert [a.value for a in sdk_end] == ["2", "3", "4"]
    assert "more" not in raw(origin, "GET", actions_path(ch), limit=5).json()


# ------------------------------------------------------------------------------------ bad input

def test_bad_input_gets_the_actions_error_body(origin):
    ch = unique()
    tt = publish(origin, ch, "m")
    good = {"type": "reaction", "value": "smile"}
    # A message that is not stored (a Tether deviation: PubNub stores it anyway).
    assert_actions_error(raw(origin, "POST", actions_path(ch, tt + 1), good), 400, "Message not found")
    assert_actions_error(raw(origin, "POST", actions_path(ch, "12x"), good), 400, "Invalid message timetoken")
    assert_actions_error(raw(origin, "POST", actions_path(ch, "0"), good), 400, "Invalid message timetoken")
    assert_actions_error(raw(origin, "POST", actions_path(ch, tt), {"value": "x"}), 400, "Missing field: type")
    assert_actions_error(raw(origin, "POST", actions_path(ch, tt), {"type": "t"}), 400, "Missing field: value")
    assert_actions_error(raw(origin, "POST", actions_path(ch, tt), {"type": "", "value": "x"}), 400, "Missing field: type")
    assert_actions_error(raw(origin, "POST", actions_path(ch, tt), {"type": 1, "value": "x"}), 400, "type must be a string")
    assert_actions_error(raw(origin, "POST", actions_path(ch, tt), {"type": "t" * 16, "value": "x"}), 400, "type is longer")
    assert_actions_error(raw(origin, "POST", actions_path(ch, tt), {"type": "t", "value": "v" * 1025}), 400,
                         "value is longer")
    assert_actions_error(raw(origin, "POST", actions_path(ch, tt), b"not json"), 400, "Invalid JSON body")
    assert_actions_error(raw(origin, "POST", actions_path(ch, tt), b"[" + b"1," * 5000 + b"1]"), 413, "too large")
    assert_actions_error(raw(origin, "POST", actions_path(ch, tt, sub="nope"), good), 400, "Invalid Subscribe Key")
    assert_actions_error(raw(origin, "GET", actions_path(ch), start="abc"), 400, "Invalid start")
    assert_actions_error(raw(origin, "GET", actions_path(ch), limit="0"), 400, "Invalid limit")
    # Wrong methods on the family's paths.
    assert_actions_error(raw(origin, "GET", actions_path(ch, tt)), 405, "Method Not Allowed")
    assert_actions_error(raw(origin, "PUT", actions_path(ch, tt), good), 405, "Method Not Allowed")
    assert_actions_error(raw(origin, "POST", actions_path(ch)), 405, "Method Not Allowed")
    # Valid JSON 32-digit limits and a too-big limit is served as 100.
    assert raw(origin, "GET", actions_path(ch), limit="1000").status == 200
    # Nothing above was stored.
    assert raw(origin, "GET", actions_path(ch)).json() == {"status": 200, "data": []}


def test_remove_rules(make_pubnub, origin):
    alice, bob = make_pubnub("alice"), make_pubnub("bob")
    ch = unique()
    tt = publish(origin, ch, "m")
    att = int(add(alice, ch, "reaction", "wave", tt).result.action_timetoken)
    # Only the uuid that added an action removes it: PubNub's 400.
    r = raw(origin, "DELETE", actions_path(ch, tt, att), uuid="bob")
    assert_actions_error(r, 400, "Not deleting message action: wrong uuid specified")
    status = sdk_error_status(bob.remove_message_action().channel(ch).message_timetoken(tt).action_timetoken(att))
    assert status.status_code == 400
    # A remove of an action that is not there (a retry) succeeds without an event.
    assert raw(origin, "DELETE", actions_path(ch, tt, att + 1), uuid="alice").status == 200
    assert alice.remove_message_action().channel(ch).message_timetoken(tt).action_timetoken(att).sync().status.status_code == 200
    assert raw(origin, "DELETE", actions_path(ch, tt, att), uuid="alice").json() == {"status": 200, "data": {}}


# ---------------------------------------------------------------------------------- events

def test_action_events_reach_the_sdk_listener(make_pubnub, origin):
    ch = unique()
    tt = publish(origin, ch, "m")
    listener_pn = make_pubnub("watcher")
    listener = ActionListener()
    listener_pn.add_listener(listener)
    listener_pn.subscribe().channels([ch]).execute()
    wait_until(lambda: PNStatusCategory.PNConnectedCategory in listener.statuses, what="connected")

    actor = make_pubnub("actor")
    added = add(actor, ch, "reaction", "heart", tt).result
    wait_until(lambda: len(listener.actions) >= 1, what="added event")
    event = listener.actions[0]
    assert event.channel == ch
    assert (event.type, event.value, event.uuid) == ("reaction", "heart", "actor")
    assert event.message_timetoken == str(tt) and event.action_timetoken == added.action_timetoken

    actor.remove_message_action().channel(ch).message_timetoken(tt).action_timetoken(int(added.action_timetoken)).sync()
    wait_until(lambda: len(listener.actions) >= 2, what="removed event")
    removed = listener.actions[1]
    assert (removed.type, removed.value, removed.uuid) == ("reaction", "heart", "actor")
    assert removed.action_timetoken == added.action_timetoken


def test_event_envelope_is_pubnubs(origin):
    ch = unique()
    tt = publish(origin, ch, "m")
    cursor = request(origin, "GET", f"/v2/subscribe/{SUB_KEY}/{ch}/0?uuid=raw&tt=0").json()["t"]["t"]
    r = raw(origin, "POST", actions_path(ch, tt), {"type": "receipt", "value": "read"}, uuid="reader")
    att = r.json()["data"]["actionTimetoken"]
    envelope = request(origin, "GET", f"/v2/subscribe/{SUB_KEY}/{ch}/0?uuid=raw&tt={cursor}").json()["m"][0]
    assert envelope["e"] == 3 and envelope["i"] == "reader" and envelope["c"] == ch
    assert envelope["d"] == {"source": "actions", "version": "1.0", "event": "added",
                             "data": {"type": "receipt", "value": "read", "messageTimetoken": str(tt),
                                      "actionTimetoken": att}}


# ------------------------------------------------------------------------- tied to the message

def test_actions_leave_with_their_message(make_pubnub, origin):
    pn = make_pubnub("del")
    ch = unique()
    keep, drop = publish(origin, ch, "keep"), publish(origin, ch, "drop")
    add(pn, ch, "reaction", "a", keep)
    add(pn, ch, "reaction", "b", drop)
    r = request(origin, "DELETE", f"/v3/history/sub-key/{SUB_KEY}/channel/{ch}" + query({"start": drop - 1, "end": drop}))
    assert r.status == 200, r
    assert [a["value"] for a in raw(origin, "GET", actions_path(ch)).json()["data"]] == ["a"]
    # (Retention removes them the same way: MessageActionStoreTests, on the store's clock.)


# ------------------------------------------------------------------------------- access manager

@pytest.fixture
def secure_server(server_factory, tmp_path_factory):
    config = write_keysets_config(str(tmp_path_factory.mktemp("actions-am")))
    return server_factory.start(args=["--config", config])


def test_access_manager_write_read_delete(secure_server):
    origin = secure_server.origin
    sub, pub = SECURE_KEYSET["subscribeKey"], SECURE_KEYSET["publishKey"]
    ch = unique()
    r = signed_request(origin, "GET", SECURE_KEYSET, f"/publish/{pub}/{sub}/0/{ch}/0/%22m%22", {"uuid": "admin"})
    tt = int(r.json()[2])
    with threaded_clients(SECURE_KEYSET) as make:
        admin = make(origin, "admin", admin=True)
        user = make(origin, "user", auth_key="k-user")

        def grant(**flags):
            admin.grant().channels([ch]).auth_keys(["k-user"]).read(flags.get("r", False)) \
                .write(flags.get("w", False)).delete(flags.get("d", False)).ttl(5).sync()

        for call in (lambda: add(user, ch, "reaction", "x", tt), lambda: user.get_message_actions().channel(ch).sync()):
            with pytest.raises(PubNubException) as raised:
                call()
            assert raised.value.get_status_code() == 403
        grant(w=True)
        att = int(add(user, ch, "reaction", "x", tt).result.action_timetoken)
        with pytest.raises(PubNubException) as raised:
            user.get_message_actions().channel(ch).sync()
        assert raised.value.get_status_code() == 403
        grant(r=True)
        assert [a.value for a in user.get_message_actions().channel(ch).sync().result.actions] == ["x"]
        with pytest.raises(PubNubException) as raised:
            user.remove_message_action().channel(ch).message_timetoken(tt).action_timetoken(att).sync()
        assert raised.value.get_status_code() == 403
        grant(d=True)
        assert user.remove_message_action().channel(ch).message_timetoken(tt).action_timetoken(att).sync().status.status_code == 200


# ------------------------------------------------------------------------- history with actions

def test_fetch_messages_with_actions(make_pubnub, origin):
    pn = make_pubnub("fetcher")
    ch = unique()
    first = pn.publish().channel(ch).message({"text": "one"}).meta({"m": 1}).custom_message_type("chat-msg").sync()
    second = pn.publish().channel(ch).message("two").sync()
    t1, t2 = first.result.timetoken, second.result.timetoken
    a1 = add(pn, ch, "reaction", "smile", t1).result
    a2 = add(make_pubnub("other"), ch, "reaction", "smile", t1).result
    a3 = add(pn, ch, "receipt", "read", t1).result

    env = pn.fetch_messages().channels(ch).include_message_actions(True).include_meta(True) \
        .include_uuid(True).include_message_type(True).include_custom_message_type(True).sync()
    assert not env.status.is_error()
    items = env.result.channels[ch]
    assert [int(i.timetoken) for i in items] == [t1, t2]
    one, two = items
    assert one.message == {"text": "one"} and one.meta == {"m": 1} and one.uuid == "fetcher"
    assert one.actions == {
        "reaction": {"smile": [{"uuid": "fetcher", "actionTimetoken": a1.action_timetoken},
                               {"uuid": "other", "actionTimetoken": a2.action_timetoken}]},
        "receipt": {"read": [{"uuid": "fetcher", "actionTimetoken": a3.action_timetoken}]},
    }
    assert two.actions == {}

    raw_page = request(origin, "GET", f"/v3/history-with-actions/sub-key/{SUB_KEY}/channel/{ch}"
                       + query({"include_custom_message_type": "true", "include_message_type": "true"})).json()
    entry = raw_page["channels"][ch][0]
    assert entry["custom_message_type"] == "chat-msg" and entry["message_type"] is None

    # A removed action leaves history too.
    pn.remove_message_action().channel(ch).message_timetoken(t1).action_timetoken(int(a3.action_timetoken)).sync()
    again = pn.fetch_messages().channels(ch).include_message_actions(True).sync().result.channels[ch][0]
    assert list(again.actions) == ["reaction"]


def test_history_with_actions_pages_with_more(make_pubnub, origin):
    pn = make_pubnub("pages")
    ch = unique()
    tts = [publish(origin, ch, i) for i in range(30)]
    add(pn, ch, "reaction", "x", tts[0])
    page = request(origin, "GET", f"/v3/history-with-actions/sub-key/{SUB_KEY}/channel/{ch}").json()
    assert len(page["channels"][ch]) == 25 and page["more"]["start"] == str(tts[5])
    rest = request(origin, "GET", page["more"]["url"]).json()
    assert [int(m["timetoken"]) for m in rest["channels"][ch]] == tts[:5]
    assert rest["channels"][ch][0]["actions"] == {"reaction": {"x": [{"uuid": "pages",
                                                                       "actionTimetoken": rest["channels"][ch][0]["actions"]["reaction"]["x"][0]["actionTimetoken"]}]}}
    # The SDK's paging (count, start) walks the same pages.
    older = pn.fetch_messages().channels(ch).include_message_actions(True).start(tts[5]).count(25).sync().result.channels[ch]
    assert [int(m.timetoken) for m in older] == tts[:5]


# ------------------------------------------------------------------------------------------- CLI

def test_cli_actions_add_list_remove(origin):
    import os
    import subprocess

    from helpers import TETHER_BIN

    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}

    def cli(*args):
        return subprocess.run([TETHER_BIN, "actions", *args, "--origin", origin, "--user-id", "operator"],
                              capture_output=True, text=True, timeout=30, env=env)

    ch = unique()
    tt = publish(origin, ch, "m")
    added = cli("add", ch, str(tt), "reaction", "smile")
    assert added.returncode == 0, added.stderr
    action_tt, message_tt, user, type_, value = added.stdout.split()
    assert (int(message_tt), user, type_, value) == (tt, "operator", "reaction", "smile")
    listed = cli("list", ch)
    assert listed.returncode == 0 and listed.stdout.split() == [action_tt, str(tt), "operator", "reaction", "smile"]
    duplicate = cli("add", ch, str(tt), "reaction", "smile")
    assert duplicate.returncode == 1 and "Action Already Added" in duplicate.stderr
    removed = cli("remove", ch, str(tt), action_tt)
    assert removed.returncode == 0 and removed.stdout.strip() == f"removed {action_tt}"
    assert cli("list", ch).stdout == ""
    assert cli("add", ch, "12x", "reaction", "smile").returncode != 0
