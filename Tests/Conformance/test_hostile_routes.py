"""Every route × every parameter × every hostile class, on an open and a secret-key keyset.

The route list is read from Sources/TetherServer/Route.swift, so a new `Route` case without a
spec here fails `test_every_route_has_hostile_cases`. For each route spec, every parameter it
takes (query parameters, path segments, POST bodies, and the signature parameters) is replaced
in an otherwise valid request by each value of each hostile class (huge, negative, zero, NaN,
inf, non-numeric, empty, very long, invalid UTF-8, bad percent-encoding, control bytes, deep
JSON, duplicated parameters). On the secret-key keyset requests are signed with its secret (so
the hostile value reaches the handler, past the signature check) whenever the value can be
signed at all. Every request must get a well-formed answer: never 5xx, never a dropped
connection; 4xx bodies are PubNub's JSON error shapes; numeric parameters are accepted exactly
within their `ParameterBounds` range (read from RequestParameters.swift) and answered 400
otherwise. Afterwards both keysets still serve a normal publish + subscribe.

The matrix writes a machine-readable summary (class -> cases, answers) to $TETHER_HOSTILE_SUMMARY
(default .build/hostile-report.json); `scripts/hostile-report` turns it into the table of
docs/security.md. Tests/Corpus/hostile-requests.txt (inputs that once broke something) is
replayed by `test_corpus_replays`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import socket
import threading
import time
import urllib.parse
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

import pytest

from helpers import CONTENT_TYPE, Resp, parse_responses, write_keysets_config

pytestmark = pytest.mark.timeout(300)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ROUTE_SWIFT = os.path.join(ROOT, "Sources", "TetherServer", "Route.swift")
BOUNDS_SWIFT = os.path.join(ROOT, "Sources", "TetherServer", "RequestParameters.swift")
CORPUS = os.path.join(ROOT, "Tests", "Corpus", "hostile-requests.txt")
SUMMARY = os.environ.get("TETHER_HOSTILE_SUMMARY", os.path.join(ROOT, ".build", "hostile-report.json"))

OPEN = {"name": "open", "publishKey": "demo", "subscribeKey": "demo"}
SECRET = {"name": "secret", "publishKey": "hpub", "subscribeKey": "hsub", "secretKey": "hsecret"}
KEYSETS = {"open": OPEN, "secret": SECRET}
WORKERS = 8


# -------------------------------------------------------------------------------------------------
# What the server declares: its routes and its parameter bounds
# -------------------------------------------------------------------------------------------------

def swift_routes() -> list[str]:
    """The case names of `public enum Route` (up to its first nested declaration)."""
    text = open(ROUTE_SWIFT).read()
    body = text[text.index("public enum Route"):]
    body = body[:body.index("public enum Access")]
    names = []
    for line in body.splitlines():
        line = line.strip()
        if line.startswith("case "):
            for item in line[5:].split(","):
                names.append(item.split("=")[0].strip())
    return names


def parameter_bounds() -> dict[str, tuple]:
    """`ParameterBounds`' ranges as (kind, low, high), evaluated from the Swift source."""
    text = open(BOUNDS_SWIFT).read()
    out = {}
    for name, kind, low, high in re.findall(
            r"static let (\w+): ClosedRange<(Int|Double)> = ([^.\s]+)\.\.\.(\S+)", text):
        def value(t):
            t = t.replace("_", "")
            return {"Int(Int32.max)": 2**31 - 1, "Int.max": 2**63 - 1}.get(t, None) if not re.fullmatch(r"-?\d+", t) else int(t)
        lo, hi = value(low), value(high)
        assert lo is not None and hi is not None, f"cannot evaluate ParameterBounds.{name}: {low}...{high}"
        out[name] = (kind, lo, hi)
    return out


BOUNDS = parameter_bounds()
TIMETOKEN_DIGITS = 17


# -------------------------------------------------------------------------------------------------
# Route specs: a valid request per route, and what each parameter is
# -------------------------------------------------------------------------------------------------

@dataclass
class Spec:
    route: str                      # Swift case name
    method: str
    path: str                       # template; {name} are path parameters
    query: dict                     # baseline query (decoded values)
    numeric: dict = field(default_factory=dict)   # param -> ParameterBounds name or "timetoken"
    body: str | None = None         # baseline POST/DELETE body
    admin: bool = False             # needs the secret key's signature (400/403 on the open keyset)
    path_params: dict = field(default_factory=dict)  # name -> baseline value (decoded)


UUID = "hostile-uuid"
PATH_BASE = {"pub": None, "sub": None, "ch": "hostile-ch", "uuid": UUID, "group": "hostile-group"}
MSG = '{"text":"hi"}'
STATE = '{"k":"v"}'
GRANT_BODY = json.dumps({"ttl": 60, "permissions": {"resources": {"channels": {"hostile-ch": 3}}, "uuid": UUID}},
                        separators=(",", ":"))

SPECS: list[Spec] = [
    Spec("options", "OPTIONS", "/v2/subscribe/{sub}/{ch}/0", {}),
    Spec("time", "GET", "/time/0", {"uuid": UUID}),
    Spec("publish", "GET", "/publish/{pub}/{sub}/0/{ch}/0/{msg}",
         {"uuid": UUID, "seqn": "1", "ttl": "1", "store": "1", "meta": '{"a":1}', "custom_message_type": "hostile-type",
          "norep": "0"},
         numeric={"seqn": "sequence", "ttl": "publishTTLHours"}),
    Spec("publish", "POST", "/publish/{pub}/{sub}/0/{ch}/0",
         {"uuid": UUID, "seqn": "2", "ttl": "0.5", "meta": '{"a":1}'},
         numeric={"seqn": "sequence", "ttl": "publishTTLHours"}, body=MSG),
    Spec("signal", "GET", "/signal/{pub}/{sub}/0/{ch}/0/{msg}", {"uuid": UUID, "seqn": "3", "meta": '{"a":1}'},
         numeric={"seqn": "sequence"}),
    Spec("signal", "POST", "/signal/{pub}/{sub}/0/{ch}/0", {"uuid": UUID}, body='"s"'),
    Spec("subscribe", "GET", "/v2/subscribe/{sub}/{ch}/0",
         {"uuid": UUID, "tt": "0", "tr": "1", "heartbeat": "60", "state": json.dumps({"hostile-ch": {"k": "v"}}),
          "filter-expr": "a == 1", "channel-group": "hostile-group"},
         numeric={"tt": "timetoken", "tr": "region", "heartbeat": "heartbeatSeconds"}),
    Spec("history", "GET", "/v2/history/sub-key/{sub}/channel/{ch}",
         {"uuid": UUID, "count": "10", "start": "99999999999999999", "end": "1", "reverse": "false",
          "include_token": "true", "include_meta": "true", "string_message_token": "true"},
         numeric={"count": "historyCount", "start": "timetoken", "end": "timetoken"}),
    Spec("fetch", "GET", "/v3/history/sub-key/{sub}/channel/{ch}",
         {"uuid": UUID, "max": "10", "start": "99999999999999999", "end": "1", "include_meta": "true",
          "include_uuid": "true", "include_message_type": "true", "include_custom_message_type": "true"},
         numeric={"max": "fetchMax", "start": "timetoken", "end": "timetoken"}),
    Spec("historyWithActions", "GET", "/v3/history-with-actions/sub-key/{sub}/channel/{ch}",
         {"uuid": UUID, "max": "10", "start": "99999999999999999", "end": "1"},
         numeric={"max": "fetchMax", "start": "timetoken", "end": "timetoken"}),
    Spec("messageCounts", "GET", "/v3/history/sub-key/{sub}/message-counts/{ch}",
         {"uuid": UUID, "timetoken": "1"}, numeric={"timetoken": "timetoken"}),
    Spec("messageCounts", "GET", "/v3/history/sub-key/{sub}/message-counts/{ch}",
         {"uuid": UUID, "channelsTimetoken": "1"}),
    Spec("deleteMessages", "DELETE", "/v3/history/sub-key/{sub}/channel/{ch}",
         {"uuid": UUID, "start": "2", "end": "1"}, numeric={"start": "timetoken", "end": "timetoken"}),
    Spec("hereNowGlobal", "GET", "/v2/presence/sub-key/{sub}",
         {"uuid": UUID, "state": "1", "disable_uuids": "0", "limit": "10", "offset": "0"},
         numeric={"limit": "hereNowLimit", "offset": "hereNowOffset"}, admin=True),
    Spec("hereNow", "GET", "/v2/presence/sub-key/{sub}/channel/{ch}",
         {"uuid": UUID, "state": "1", "disable_uuids": "0", "limit": "10", "offset": "0", "channel-group": "hostile-group"},
         numeric={"limit": "hereNowLimit", "offset": "hereNowOffset"}),
    Spec("hereNow", "GET", "/v2/presence/sub-key/{sub}",
         {"uuid": UUID, "channel-group": "hostile-group", "limit": "10", "offset": "1"},
         numeric={"limit": "hereNowLimit", "offset": "hereNowOffset"}),
    Spec("whereNow", "GET", "/v2/presence/sub-key/{sub}/uuid/{uuid}", {"uuid": UUID}),
    Spec("heartbeat", "GET", "/v2/presence/sub-key/{sub}/channel/{ch}/heartbeat",
         {"uuid": UUID, "heartbeat": "60", "state": STATE, "channel-group": "hostile-group"},
         numeric={"heartbeat": "heartbeatSeconds"}),
    Spec("leave", "GET", "/v2/presence/sub-key/{sub}/channel/{ch}/leave", {"uuid": UUID, "channel-group": "hostile-group"}),
    Spec("getState", "GET", "/v2/presence/sub-key/{sub}/channel/{ch}/uuid/{uuid}",
         {"uuid": UUID, "channel-group": "hostile-group"}),
    Spec("setState", "GET", "/v2/presence/sub-key/{sub}/channel/{ch}/uuid/{uuid}/data",
         {"uuid": UUID, "state": STATE, "channel-group": "hostile-group"}),
    Spec("groupList", "GET", "/v1/channel-registration/sub-key/{sub}/channel-group", {"uuid": UUID}, admin=True),
    Spec("groupChannels", "GET", "/v1/channel-registration/sub-key/{sub}/channel-group/{group}", {"uuid": UUID}),
    Spec("groupUpdate", "GET", "/v1/channel-registration/sub-key/{sub}/channel-group/{group}",
         {"uuid": UUID, "add": "hostile-ch,other-ch", "remove": "gone-ch"}),
    Spec("groupDelete", "GET", "/v1/channel-registration/sub-key/{sub}/channel-group/{group}/remove", {"uuid": UUID}),
    Spec("grant", "GET", "/v2/auth/grant/sub-key/{sub}",
         {"uuid": "admin", "ttl": "60", "r": "1", "w": "1", "m": "0", "d": "0", "g": "0", "u": "0", "j": "0",
          "auth": "hostile-auth", "channel": "hostile-ch", "channel-group": "hostile-group", "target-uuid": UUID},
         numeric={"ttl": "grantTTLMinutes"}, admin=True),
    Spec("audit", "GET", "/v2/auth/audit/sub-key/{sub}",
         {"uuid": "admin", "auth": "hostile-auth", "channel": "hostile-ch", "channel-group": "hostile-group"}, admin=True),
    Spec("grantToken", "POST", "/v3/pam/{sub}/grant", {"uuid": "admin"}, body=GRANT_BODY, admin=True),
    Spec("revokeToken", "DELETE", "/v3/pam/{sub}/grant/{token}", {"uuid": "admin"}, admin=True),
    Spec("getMessageActions", "GET", "/v1/message-actions/{sub}/channel/{ch}",
         {"uuid": UUID, "start": "99999999999999999", "end": "1", "limit": "10"},
         numeric={"start": "timetoken", "end": "timetoken", "limit": "actionsLimit"}),
    Spec("addMessageAction", "POST", "/v1/message-actions/{sub}/channel/{ch}/message/{mtt}", {"uuid": UUID},
         body='{"type":"reaction","value":"smile"}'),
    Spec("removeMessageAction", "DELETE", "/v1/message-actions/{sub}/channel/{ch}/message/{mtt}/action/{att}", {"uuid": UUID}),
    Spec("getUserMetadata", "GET", "/v2/objects/{sub}/uuids/{uuid}", {"uuid": UUID, "include": "custom,status,type"}),
    Spec("setUserMetadata", "PATCH", "/v2/objects/{sub}/uuids/{uuid}", {"uuid": UUID, "include": "custom"},
         body='{"name":"n","custom":{"k":"v"},"status":"s"}'),
    Spec("removeUserMetadata", "DELETE", "/v2/objects/{sub}/uuids/{uuid}", {"uuid": UUID}),
    Spec("getAllUserMetadata", "GET", "/v2/objects/{sub}/uuids",
         {"uuid": UUID, "filter": 'name LIKE "a*"', "sort": "name:desc", "limit": "10", "start": "MQ", "count": "true"},
         admin=True),
    Spec("getChannelMetadata", "GET", "/v2/objects/{sub}/channels/{ch}", {"uuid": UUID, "include": "custom"}),
    Spec("setChannelMetadata", "PATCH", "/v2/objects/{sub}/channels/{ch}", {"uuid": UUID}, body='{"name":"n","description":"d"}'),
    Spec("removeChannelMetadata", "DELETE", "/v2/objects/{sub}/channels/{ch}", {"uuid": UUID}),
    Spec("getAllChannelMetadata", "GET", "/v2/objects/{sub}/channels",
         {"uuid": UUID, "filter": 'custom.n > 1 && !(name == "x")', "sort": "updated", "limit": "5", "end": "MTA"}, admin=True),
    Spec("getMemberships", "GET", "/v2/objects/{sub}/uuids/{uuid}/channels",
         {"uuid": UUID, "include": "channel.custom,custom", "filter": 'channel.name == "x"', "limit": "10"}),
    Spec("manageMemberships", "PATCH", "/v2/objects/{sub}/uuids/{uuid}/channels", {"uuid": UUID},
         body='{"set":[{"channel":{"id":"hostile-ch"},"custom":{"r":"x"}}],"delete":[{"channel":{"id":"other"}}]}'),
    Spec("getChannelMembers", "GET", "/v2/objects/{sub}/channels/{ch}/uuids", {"uuid": UUID, "include": "uuid", "sort": "uuid.id:asc"}),
    Spec("manageChannelMembers", "PATCH", "/v2/objects/{sub}/channels/{ch}/uuids", {"uuid": UUID},
         body='{"set":[{"uuid":{"id":"hostile-uuid"}}],"delete":[]}'),
    Spec("pushModify", "GET", "/v1/push/sub-key/{sub}/devices/{device}",
         {"uuid": UUID, "type": "apns", "add": "hostile-ch,other-ch", "remove": "gone-ch"}),
    Spec("pushModify", "GET", "/v2/push/sub-key/{sub}/devices-apns2/{device}",
         {"uuid": UUID, "environment": "production", "topic": "com.example.app", "add": "hostile-ch"}),
    Spec("pushList", "GET", "/v1/push/sub-key/{sub}/devices/{device}", {"uuid": UUID, "type": "gcm", "start": "a", "count": "10"}),
    Spec("pushRemoveDevice", "GET", "/v2/push/sub-key/{sub}/devices-apns2/{device}/remove",
         {"uuid": UUID, "environment": "development", "topic": "com.example.app"}),
    Spec("generateFileUploadURL", "POST", "/v1/files/{sub}/channels/{ch}/generate-upload-url", {"uuid": UUID},
         body='{"name":"a.txt"}'),
    Spec("uploadFile", "POST", "/v1/files/upload/{sub}/{fid}", {},
         body='--b\r\nContent-Disposition: form-data; name="file"; filename="a.txt"\r\n\r\nx\r\n--b--\r\n'),
    Spec("publishFileMessage", "GET", "/v1/files/publish-file/{pub}/{sub}/0/{ch}/0/{fmsg}",
         {"uuid": UUID, "store": "1", "ttl": "1", "meta": '{"a":1}'}, numeric={"ttl": "publishTTLHours"}),
    Spec("listFiles", "GET", "/v1/files/{sub}/channels/{ch}/files", {"uuid": UUID, "limit": "10"},
         numeric={"limit": "actionsLimit"}),
    Spec("getFile", "GET", "/v1/files/{sub}/channels/{ch}/files/{fid}/{fname}", {"uuid": UUID}),
    Spec("downloadFile", "GET", "/v1/files/download/{sub}/{ch}/{fid}/{fname}", {"expires": "1", "signature": "AAAA"}),
    Spec("deleteFile", "DELETE", "/v1/files/{sub}/channels/{ch}/files/{fid}/{fname}", {"uuid": UUID}),
    Spec("health", "GET", "/health", {}),
    Spec("metrics", "GET", "/metrics", {}),
]

# Parameters every keyed route also reads: the client's auth key and, on a secret-key keyset,
# the request signature (hostile values here are sent unsigned, as they would arrive).
COMMON = {"auth": "hostile-auth"}
SIGNATURE_PARAMS = ("signature", "timestamp")

# -------------------------------------------------------------------------------------------------
# Hostile classes: raw wire text (already percent-encoded where the class needs it)
# -------------------------------------------------------------------------------------------------

def enc(text: str) -> str:
    return urllib.parse.quote(text, safe="~")


DEEP_ARRAY = "[" * 1000 + "]" * 1000
DEEP_OBJECT = '{"a":' * 65 + "1" + "}" * 65

CLASSES: dict[str, list[str]] = {
    "huge": ["99999999999999999999999999999", "9223372036854775808", "100000000000000000"],
    "negative": ["-1", "-9223372036854775808", "-0.5"],
    "zero": ["0", "-0", "0.0"],
    "nan": ["NaN", "nan"],
    "inf": ["inf", "-Infinity"],
    "non-numeric": ["abc", "0x10", "1e3", "%2B1"],
    "empty": [""],
    "very-long": ["9" * 3000, "a" * 6000],
    "invalid-utf8": ["%C3%28", "%ED%A0%80"],
    "raw-bytes": ["\\xff\\xfe"],
    "bad-percent": ["%zz", "%", "%2"],
    "control": ["%00", "%0D%0A"],
    "deep-json": [enc(DEEP_ARRAY), enc(DEEP_OBJECT)],
}
# Duplicated parameters: the baseline value and a hostile one, in both orders (a repeated key
# keeps its last value).
DUPLICATE_VALUES = ["-1", "99999999999999999999999999999", "abc", "%zz"]

BODY_CLASSES: dict[str, list[bytes]] = {
    "huge": [b'{"ttl":99999999999999999999999,"permissions":{}}', b"1e400", b"[" + b"9" * 5000 + b"]"],
    "negative": [b'{"ttl":-1,"permissions":{}}', b"-9223372036854775809"],
    "zero": [b'{"ttl":0,"permissions":{}}', b"0"],
    "nan": [b'{"ttl":NaN,"permissions":{}}', b"NaN"],
    "inf": [b'{"ttl":Infinity,"permissions":{}}', b"-Infinity"],
    "non-numeric": [b'{"ttl":"60","permissions":{}}', b"abc"],
    "empty": [b""],
    "very-long": [json.dumps("x" * 40000).encode(), b'{"ttl":60,"permissions":{"resources":{"channels":{"' + b"c" * 60000 + b'":3}}}}'],
    "invalid-utf8": [b'"\xc3\x28"', b'{"ttl":60,"permissions":{"uuid":"\xff"}}'],
    "deep-json": [DEEP_ARRAY.encode(), ('{"ttl":60,"permissions":{"meta":' + '{"a":' * 600 + "1" + "}" * 600 + "}}").encode(),
                  b'{"ttl":60,"permissions":{"meta":' + b"[" * 100000 + b"]" * 100000 + b"}}"],
    "duplicated": [b'{"ttl":60,"ttl":-1,"permissions":{}}'],
}


def wire_bytes(raw: str) -> bytes:
    """Raw wire text to bytes, with `\\xNN` standing for a raw (non-ASCII) byte."""
    return re.sub(rb"\\x([0-9a-fA-F]{2})", lambda m: bytes([int(m.group(1), 16)]), raw.encode("latin-1"))


def decoded(raw: str) -> str | None:
    """The decoded text the server sees, or None when the server refuses the encoding."""
    if "\\x" in raw:
        return None
    try:
        data = urllib.parse.unquote_to_bytes(raw)
        if re.search(r"%(?![0-9a-fA-F]{2})", raw):
            return None
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


# -------------------------------------------------------------------------------------------------
# References: what each bounded reader must accept (the documented rules)
# -------------------------------------------------------------------------------------------------

def reference_accepts(kind: str, text: str) -> bool:
    """Whether a non-empty value is within its documented bound (docs/security.md)."""
    if kind == "timetoken":
        return 1 <= len(text.encode()) <= TIMETOKEN_DIGITS and re.fullmatch(r"[0-9]+", text, re.ASCII) is not None
    swift_kind, lo, hi = BOUNDS[kind]
    if swift_kind == "Int":
        if len(text.encode()) > 20 or not re.fullmatch(r"-?[0-9]+", text, re.ASCII):
            return False
        return lo <= int(text) <= hi
    if len(text.encode()) > 32 or not re.fullmatch(r"[0-9.]+", text, re.ASCII) or text.count(".") > 1 or text == ".":
        return False
    try:
        return Decimal(lo) <= Decimal(text) <= Decimal(hi)
    except InvalidOperation:
        return False


# -------------------------------------------------------------------------------------------------
# Requests
# -------------------------------------------------------------------------------------------------

def signature_encode(text: str) -> str:
    return urllib.parse.quote(text, safe="-_.").replace("~", "%7E")


def signed_query(method: str, keyset: dict, raw_path: str, pairs: list[tuple[str, str]], body: bytes) -> str:
    """PubNub v2 signature over decoded (key, value) pairs; the query is sent in canonical form."""
    pairs = pairs + [("timestamp", str(int(time.time())))]
    canonical = "&".join(f"{k}={signature_encode(v)}" for k, v in sorted(pairs, key=lambda p: p[0]))
    message = f"{method}\n{keyset['publishKey']}\n{raw_path}\n{canonical}\n{body.decode('utf-8', 'replace')}"
    mac = hmac.new(keyset["secretKey"].encode(), message.encode(), hashlib.sha256).digest()
    return canonical + "&signature=v2." + base64.urlsafe_b64encode(mac).decode().rstrip("=")


class Connection:
    """One keep-alive connection sending raw request bytes; reconnects after a close."""

    def __init__(self, origin: str):
        host, port = origin.rsplit(":", 1)
        self.address = (host, int(port))
        self.sock: socket.socket | None = None

    def send(self, method: str, target: bytes, body: bytes | None, timeout: float = 15.0) -> Resp | None:
        for attempt in range(2):
            if self.sock is None:
                self.sock = socket.create_connection(self.address, timeout=timeout)
            head = method.encode() + b" " + target + b" HTTP/1.1\r\nHost: tether\r\n"
            if body is not None:
                head += b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n"
            try:
                self.sock.sendall(head + b"\r\n" + (body or b""))
                data = b""
                while True:
                    responses, _ = parse_responses(data)
                    if responses:
                        break
                    chunk = self.sock.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            except (ConnectionResetError, BrokenPipeError, socket.timeout):
                responses, data = [], b""
            if responses:
                r = responses[0]
                if r.headers.get("connection", "").lower() == "close":
                    self.close()
                return r
            self.close()
            if data == b"" and attempt == 0:
                # A keep-alive connection the server had already closed: one fresh retry.
                continue
            return None
        return None

    def close(self):
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None


@dataclass
class Case:
    spec: Spec
    keyset: str
    param: str           # what is attacked (query name, {path}, body, or a signature parameter)
    cls: str             # hostile class
    value: str           # raw wire text (or body repr)
    method: str
    target: bytes
    body: bytes | None
    effective: str | None = None   # decoded value the handler reads for `param` (None: refused encoding)
    signed: bool = False
    undecodable: bool = False      # some path segment or query piece is not percent-encoded UTF-8


def build_case(spec: Spec, keyset_name: str, param: str, cls: str, raw_value: str | None,
               body: bytes | None = None, duplicate_first: bool | None = None) -> Case:
    keyset = KEYSETS[keyset_name]
    path_values = {"pub": keyset["publishKey"], "sub": keyset["subscribeKey"], "ch": "hostile-ch", "uuid": UUID,
                   "group": "hostile-group", "msg": MSG, "token": "qEF2AkF0GmXYZ",
                   "mtt": "15000000000000000", "att": "15000000000000001", "device": "0123abcd",
                   "fid": "hostile-file-id", "fname": "a.txt", "fmsg": '{"message":"m","file":{"id":"x","name":"a.txt"}}'}
    raw_path_values = {k: enc(v) for k, v in path_values.items()}
    query = dict(spec.query)
    if spec.route not in ("time", "health", "metrics", "options"):
        query.update({k: v for k, v in COMMON.items() if k not in query})
    pairs_raw: list[tuple[str, str]] = [(k, enc(v)) for k, v in query.items()]
    effective = None
    if param.startswith("{"):
        raw_path_values[param[1:-1]] = raw_value
    elif param == "body":
        pass
    elif raw_value is not None:
        if duplicate_first is None:
            pairs_raw = [(k, v) for k, v in pairs_raw if k != param] + [(param, raw_value)]
        else:
            base = enc(query.get(param, "1"))
            pairs_raw = [(k, v) for k, v in pairs_raw if k != param]
            pairs_raw += [(param, base), (param, raw_value)] if duplicate_first else [(param, raw_value), (param, base)]
        effective = decoded([v for k, v in pairs_raw if k == param][-1])
    if param == "timestamp":
        pairs_raw.append(("signature", "v2.c2lnbmF0dXJl"))
    elif param == "signature":
        pairs_raw.append(("timestamp", str(int(time.time()))))
    raw_path = spec.path.format(**raw_path_values)
    undecodable = any(decoded(v) is None for _, v in pairs_raw) or any(
        decoded(v) is None for v in raw_path.split("/"))
    body_bytes = body if body is not None else (spec.body.encode() if spec.body is not None else None)
    # Sign on the secret keyset whenever every piece is decodable text (the hostile value then
    # reaches the handler), except when the signature parameters themselves are attacked.
    signable = keyset_name == "secret" and param not in SIGNATURE_PARAMS and all(decoded(v) is not None for _, v in pairs_raw)
    if signable:
        qs = signed_query(spec.method, keyset, raw_path, [(k, decoded(v)) for k, v in pairs_raw], body_bytes or b"")
    else:
        qs = "&".join(f"{k}={v}" for k, v in pairs_raw)
    target = wire_bytes(raw_path + ("?" + qs if qs else ""))
    return Case(spec, keyset_name, param, cls, raw_value if raw_value is not None else repr(body)[:60], spec.method,
                target, body_bytes, effective, signable, undecodable)


def boundary_values(kind: str | None) -> list[str]:
    """Each end of a numeric parameter's documented range and one step past it."""
    if kind is None:
        return []
    if kind == "timetoken":
        return ["0", "9" * TIMETOKEN_DIGITS, "1" + "0" * TIMETOKEN_DIGITS, "0" * TIMETOKEN_DIGITS, "0" * (TIMETOKEN_DIGITS + 1)]
    swift_kind, lo, hi = BOUNDS[kind]
    if swift_kind == "Double":
        return [str(lo), str(hi), f"{hi}.000001", f"{hi}.5", "0.000001"]
    return [str(lo), str(hi), str(lo - 1), str(hi + 1), "0" * (20 - len(str(hi))) + str(hi), "0" * (21 - len(str(hi))) + str(hi)]


def all_cases() -> list[Case]:
    cases = []
    for spec in SPECS:
        for keyset in KEYSETS:
            params = list(spec.query) + [f"{{{p}}}" for p in re.findall(r"\{(\w+)\}", spec.path)]
            if spec.route not in ("time", "health", "metrics", "options"):
                params += [p for p in COMMON if p not in spec.query]
                if keyset == "secret":
                    params += list(SIGNATURE_PARAMS)
            if not params:
                # Routes without parameters still get every class in an unknown parameter.
                params = ["x"]
            for param in params:
                for value in boundary_values(spec.numeric.get(param)):
                    cases.append(build_case(spec, keyset, param, "boundary", value))
                for cls, values in CLASSES.items():
                    for value in values:
                        cases.append(build_case(spec, keyset, param, cls, value))
                if not param.startswith("{"):
                    for value in DUPLICATE_VALUES:
                        for first in (True, False):
                            cases.append(build_case(spec, keyset, param, "duplicated", value, duplicate_first=first))
            if spec.body is not None:
                for cls, bodies in BODY_CLASSES.items():
                    for body in bodies:
                        cases.append(build_case(spec, keyset, "body", cls, None, body=body))
    return cases


# -------------------------------------------------------------------------------------------------
# Answers
# -------------------------------------------------------------------------------------------------

def _refuse_constant(name):
    raise ValueError(f"{name} is not JSON")


def strict_json(data: bytes):
    """RFC 8259 JSON: numbers kept as text (a stored 5,000-digit number is valid JSON), and the
    NaN/Infinity literals Python would otherwise accept refused."""
    return json.loads(data, parse_int=str, parse_float=str, parse_constant=_refuse_constant)


def body_shape(r: Resp, route: str) -> str:
    """Names the PubNub body shape of a response; raises AssertionError for anything else."""
    if route == "metrics" and r.status == 200:
        assert r.headers.get("content-type", "").startswith("text/plain"), r
        return "metrics-text"
    if route in ("uploadFile", "downloadFile") and r.headers.get("content-type") == "application/xml":
        # The storage endpoints answer as S3 does (what PubNub SDKs parse there).
        assert r.status >= 400 and r.body.startswith(b"<?xml") and b"<Error><Code>" in r.body, r
        return "storage-xml"
    assert r.headers.get("content-type") == CONTENT_TYPE, f"content type {r.headers.get('content-type')!r}: {r!r}"
    try:
        body = strict_json(r.body)
    except ValueError as e:
        raise AssertionError(f"body is not JSON: {r!r}") from e
    if r.status < 400:
        return "ok-json"
    if isinstance(body, list):
        assert len(body) == 3 and body[0] == "0" and isinstance(body[1], str) and body[1], body
        assert isinstance(body[2], str) and body[2].isdigit(), body
        return "publish-array"
    assert isinstance(body, dict), body
    if route.startswith("push") and set(body) == {"error"}:
        # PubNub's push family answers `{"error": "Invalid type argument"}` (its SDKs' recordings).
        assert isinstance(body["error"], str) and body["error"] and r.status == 400, body
        return "push-error-object"
    assert body.get("status") == str(r.status), f"status {body.get('status')} in the body of a {r.status}: {body}"
    if isinstance(body.get("error"), dict) and body["error"].get("source") == "actions":
        assert isinstance(body["error"].get("message"), str) and body["error"]["message"], body
        return "actions-error-object"
    if isinstance(body.get("error"), dict) and body["error"].get("source") == "objects":
        assert isinstance(body["error"].get("message"), str) and body["error"]["message"], body
        for detail in body["error"].get("details", []):
            assert isinstance(detail.get("message"), str) and isinstance(detail.get("location"), str), body
        return "objects-error-object"
    if isinstance(body.get("error"), dict) and body["error"].get("source") == "files":
        assert isinstance(body["error"].get("message"), str) and body["error"]["message"], body
        return "files-error-object"
    if isinstance(body.get("error"), dict):
        assert isinstance(body["error"].get("message"), str) and body.get("service") == "Access Manager", body
        return "pam-error-object"
    assert body.get("error") in (True, "1"), body
    if "error_message" in body:
        assert isinstance(body["error_message"], str) and body["error_message"] and body.get("channels") == {}, body
        return "history-object"
    assert isinstance(body.get("message"), str) and body["message"], body
    if "payload" in body:
        assert r.status == 403 and body.get("service") == "Access Manager", body
        return "forbidden-object"
    assert isinstance(body.get("service"), str) and body["service"], body
    return "service-object"


def numeric_expectation(case: Case) -> bool | None:
    """For a numeric parameter that reaches its handler: whether its value is within the
    documented bound (then 2xx), or not (then 400 naming it). None for everything else."""
    kind = case.spec.numeric.get(case.param)
    reaches_handler = case.keyset == "open" and not case.spec.admin or case.signed
    if not kind or not reaches_handler or not case.effective or case.undecodable:
        return None
    return reference_accepts(kind, case.effective)


def check(case: Case, r: Resp | None) -> str | None:
    """None when the answer is right, else what is wrong."""
    where = f"[{case.keyset}] {case.method} {case.target[:160]!r} ({case.spec.route} {case.param}={case.cls})"
    if r is None:
        return f"{where}: no response (connection dropped)"
    if r.status >= 500:
        return f"{where}: {r.status} {r.body[:200]!r}"
    try:
        body_shape(r, case.spec.route)
    except AssertionError as e:
        return f"{where}: malformed answer {r.status}: {e}"
    if case.undecodable:
        # Refused before routing (pubnub-wire §1.2): 400, whatever the route. OPTIONS is
        # answered before the request line is decoded.
        if r.status != 400 and case.spec.route != "options":
            return f"{where}: undecodable request answered {r.status}, expected 400: {r.body[:200]!r}"
        return None
    expected_ok = numeric_expectation(case)
    kind = case.spec.numeric.get(case.param)
    if expected_ok is not None:
        if expected_ok and not 200 <= r.status < 300:
            return f"{where}: {case.effective[:40]!r} is within {kind} but got {r.status} {r.body[:200]!r}"
        if not expected_ok:
            if r.status != 400:
                return f"{where}: {case.effective[:40]!r} is outside {kind} but got {r.status} {r.body[:200]!r}"
            if f"Invalid {case.param}".encode() not in r.body:
                return f"{where}: 400 does not name the parameter: {r.body[:200]!r}"
    return None


def run_cases(origin: str, cases: list[Case]) -> list[tuple[Case, Resp | None]]:
    local = threading.local()
    conns = []
    lock = threading.Lock()

    def one(case: Case):
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = Connection(origin)
            with lock:
                conns.append(conn)
        return case, conn.send(case.method, case.target, case.body)

    try:
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            return list(pool.map(one, cases))
    finally:
        for c in conns:
            c.close()


def alive_publish_subscribe(origin: str, keyset_name: str):
    """A normal publish is delivered to a subscriber and readable from history."""
    keyset = KEYSETS[keyset_name]
    conn = Connection(origin)
    try:
        def go(method, path, params, body=None):
            if keyset_name == "secret":
                qs = signed_query(method, keyset, path, list(params.items()), body or b"")
            else:
                qs = "&".join(f"{k}={enc(v)}" for k, v in params.items())
            r = conn.send(method, (path + "?" + qs).encode(), body)
            assert r is not None and r.status == 200, f"[{keyset_name}] {method} {path}: {r!r}"
            return json.loads(r.body)
        ch = f"alive-{keyset_name}-{int(time.time() * 1000)}"
        sub, pub = keyset["subscribeKey"], keyset["publishKey"]
        cursor = go("GET", f"/v2/subscribe/{sub}/{ch}/0", {"uuid": "alive", "tt": "0"})["t"]["t"]
        sent = go("GET", f"/publish/{pub}/{sub}/0/{ch}/0/{enc(json.dumps({'alive': True}))}", {"uuid": "alive"})
        assert sent[0] == 1, sent
        got = go("GET", f"/v2/subscribe/{sub}/{ch}/0", {"uuid": "alive", "tt": cursor})
        assert [m["d"] for m in got["m"]] == [{"alive": True}], got
        history = go("GET", f"/v3/history/sub-key/{sub}/channel/{ch}", {"uuid": "alive"})
        assert [m["message"] for m in history["channels"][ch]] == [{"alive": True}], history
    finally:
        conn.close()


# -------------------------------------------------------------------------------------------------
# Tests
# -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hostile_server(module_server_factory, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("hostile-routes"))
    config = write_keysets_config(directory, [OPEN, SECRET], rateLimiting=False)
    return module_server_factory.start(args=["--config", config, "--subscribe-timeout", "1"])


def test_every_route_has_hostile_cases():
    declared = swift_routes()
    assert len(declared) >= 25, declared
    covered = {s.route for s in SPECS}
    missing = [r for r in declared if r not in covered]
    assert not missing, f"Route cases without hostile specs in test_hostile_routes.py: {missing}"
    unknown = covered - set(declared)
    assert not unknown, f"specs for routes Route.swift does not declare: {unknown}"


def test_bounds_are_read_from_the_source():
    for name in ("publishTTLHours", "sequence", "heartbeatSeconds", "region", "historyCount", "fetchMax",
                 "hereNowLimit", "hereNowOffset", "grantTTLMinutes"):
        assert name in BOUNDS, (name, BOUNDS)
    for spec in SPECS:
        for kind in spec.numeric.values():
            assert kind == "timetoken" or kind in BOUNDS, kind


def test_hostile_matrix(hostile_server):
    origin = hostile_server.origin
    cases = all_cases()
    t0 = time.monotonic()
    results = run_cases(origin, cases)
    elapsed = time.monotonic() - t0
    failures = [f for f in (check(c, r) for c, r in results) if f]

    summary: dict = {"elapsed_seconds": round(elapsed, 1), "requests": len(results), "routes": sorted({c.spec.route for c in cases}),
                     "classes": {}}
    per_class: dict = defaultdict(lambda: {"cases": 0, "statuses": Counter(), "shapes": Counter(), "routes": set(),
                                           "parameters": set(), "examples": {}, "numeric": Counter()})
    for case, r in results:
        entry = per_class[case.cls if case.param != "body" else "body:" + case.cls]
        entry["cases"] += 1
        entry["routes"].add(case.spec.route)
        entry["parameters"].add(case.param)
        status = r.status if r else "dropped"
        verdict = numeric_expectation(case)
        if verdict is not None and r is not None:
            entry["numeric"][("in-range " if verdict else "outside ") + str(r.status)] += 1
        entry["statuses"][str(status)] += 1
        if r is not None:
            try:
                shape = body_shape(r, case.spec.route)
            except AssertionError:
                shape = "malformed"
            entry["shapes"][shape] += 1
            if str(status) not in entry["examples"] and r.status >= 400:
                entry["examples"][str(status)] = r.body[:160].decode("utf-8", "replace")
    for name, entry in per_class.items():
        summary["classes"][name] = {"cases": entry["cases"], "statuses": dict(sorted(entry["statuses"].items())),
                                    "shapes": dict(sorted(entry["shapes"].items())), "routes": len(entry["routes"]),
                                    "parameters": len(entry["parameters"]), "examples": entry["examples"],
                                    "numeric": dict(sorted(entry["numeric"].items()))}
    summary["bounds"] = {name: {"kind": k, "low": lo, "high": hi} for name, (k, lo, hi) in BOUNDS.items()}
    summary["failures"] = len(failures)
    os.makedirs(os.path.dirname(SUMMARY), exist_ok=True)
    with open(SUMMARY, "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True)

    assert hostile_server.running, f"the server died; log:\n{hostile_server.log_text()[-4000:]}"
    assert not failures, f"{len(failures)} of {len(results)} answers wrong:\n" + "\n".join(failures[:40])
    for keyset in KEYSETS:
        alive_publish_subscribe(origin, keyset)


def corpus_entries():
    entries = []
    for number, line in enumerate(open(CORPUS, encoding="utf-8").read().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = {}
        rest = line
        while re.match(r"^\w+=\S* ", rest):
            token, rest = rest.split(" ", 1)
            k, v = token.split("=", 1)
            fields[k] = v
        method, target = rest.split(" ", 1)
        entries.append(pytest.param(int(fields["expect"]), fields["keyset"], method, target,
                                    id=f"line{number}-{fields.get('param', method)}"))
    return entries


@pytest.mark.parametrize("expect,keyset,method,target", corpus_entries())
def test_corpus_replays(hostile_server, expect, keyset, method, target):
    conn = Connection(hostile_server.origin)
    try:
        r = conn.send(method, wire_bytes(target), None)
    finally:
        conn.close()
    assert r is not None, "no response"
    assert r.status == expect, r
    body_shape(r, "corpus")
    assert hostile_server.running
    alive_publish_subscribe(hostile_server.origin, keyset)


def test_tiny_configured_rate_saturates_retry_after(server_factory, tmp_path):
    """A valid but tiny configured rate (1e-300 per second) made the wait astronomically long;
    converting it to `Retry-After` trapped. It saturates at one day."""
    config = write_keysets_config(str(tmp_path), [dict(OPEN, limits={"publishRatePerSecond": 1e-300, "publishBurst": 1})])
    server = server_factory.start(args=["--config", config, "--rate-limits", "on"])
    conn = Connection(server.origin)
    try:
        statuses = []
        for i in range(3):
            r = conn.send("GET", f"/publish/demo/demo/0/rate/0/{i}?uuid=tiny".encode(), None)
            assert r is not None, f"no response; log:\n{server.log_text()[-3000:]}"
            statuses.append(r.status)
        assert statuses == [200, 429, 429], statuses
        assert r.headers.get("retry-after") == "86400", r.headers
        body_shape(r, "publish")
    finally:
        conn.close()
    assert server.running
