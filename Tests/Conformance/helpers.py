"""Shared helpers for the Tether conformance suite: server processes, raw HTTP, SDK clients.

Everything here talks only to servers started by the suite on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import http.client
import json
import os
import re
import select
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import uuid as uuidlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable

TETHER_BIN = os.environ.get("TETHER_BIN", "/work/main/.build/debug/tether")
PUB_KEY = "demo"
SUB_KEY = "demo"
CONTENT_TYPE = 'text/javascript; charset="UTF-8"'
READY_RE = re.compile(r"^Tether listening on http://(?P<host>[^\s]+):(?P<port>\d+)$")


def unique(prefix: str = "ch") -> str:
    """A channel (or uuid) name no other test uses."""
    return f"{prefix}-{uuidlib.uuid4().hex[:12]}"


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01, what: str = "condition"):
    """Polls `predicate` until it returns something truthy; returns it or raises AssertionError."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


async def async_wait_until(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01,
                           what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


# ---------------------------------------------------------------------------------------------
# Server processes
# ---------------------------------------------------------------------------------------------

class TetherServer:
    """One `tether serve` process on a data directory; can be stopped and started again."""

    def __init__(self, data_dir: str, args: Iterable[str] = (), env: dict | None = None, log_level: str = "warning",
                 log_path: str | None = None):
        self.data_dir = data_dir
        self.args = list(args)
        self.env = env
        self.log_level = log_level
        self.log_path = log_path or os.path.join(data_dir, "..", f"tether-{os.path.basename(data_dir)}.log")
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.host = "127.0.0.1"
        self.starts = 0
        self.exit_codes: list[int] = []
        self._log_file = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, port: int | None = None, timeout: float = 20.0) -> "TetherServer":
        assert self.proc is None or self.proc.poll() is not None, "server already running"
        cmd = [TETHER_BIN, "serve", "--port", str(port if port is not None else 0), "--data-dir", self.data_dir,
               "--log-level", self.log_level, *self.args]
        env = dict(os.environ)
        for k in ("TETHER_HOST", "TETHER_PORT", "TETHER_DATA_DIR", "TETHER_CONFIG", "TETHER_LOG_LEVEL",
                  "TETHER_SUBSCRIBE_TIMEOUT", "TETHER_RATE_LIMITS", "TETHER_DATABASE_URL"):
            env.pop(k, None)
        # Rate limits are on by default; tests publish in bulk from one address, so servers run
        # without them unless a test asks: `--rate-limits on` in args, or
        # env={"TETHER_RATE_LIMITS": ""} for the server's own default (test_limits_tls.py).
        if "--rate-limits" not in self.args:
            env["TETHER_RATE_LIMITS"] = "off"
        if self.env:
            env.update(self.env)
        if env.get("TETHER_RATE_LIMITS") == "":
            env.pop("TETHER_RATE_LIMITS")
        self._log_file = open(self.log_path, "ab")
        self._log_file.write(f"\n=== start #{self.starts + 1}: {' '.join(cmd)}\n".encode())
        self._log_file.flush()
        deadline = time.monotonic() + 60
        while True:
            try:
                self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log_file,
                                             stdin=subprocess.DEVNULL, env=env)
                break
            except OSError as e:
                # ETXTBSY / ENOENT: the binary is being relinked by a concurrent `swift build`.
                if e.errno not in (errno.ETXTBSY, errno.ENOENT) or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        self.starts += 1
        line = self._read_ready_line(timeout)
        m = READY_RE.match(line)
        assert m, f"unexpected ready line {line!r}"
        self.host = m.group("host")
        self.port = int(m.group("port"))
        assert self.port > 0
        return self

    def _read_ready_line(self, timeout: float) -> str:
        assert self.proc and self.proc.stdout
        fd = self.proc.stdout.fileno()
        buf = b""
        deadline = time.monotonic() + timeout
        while b"\n" not in buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"server did not print its ready line within {timeout}s; log:\n{self.log_text()}")
            ready, _, _ = select.select([fd], [], [], remaining)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    code = self.proc.wait()
                    raise AssertionError(f"server exited ({code}) before ready; log:\n{self.log_text()}")
                buf += chunk
        line, rest = buf.split(b"\n", 1)
        assert rest == b"", f"server printed more than one line on stdout: {buf!r}"
        return line.decode()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        """Sends `sig` and waits; returns the exit code (negative = killed by signal)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"server did not exit within {timeout}s of signal {sig}; log:\n{self.log_text()}")
        code = self.proc.returncode
        self.exit_codes.append(code)
        # Anything more on stdout after the ready line is a contract violation.
        extra = self.proc.stdout.read() if self.proc.stdout else b""
        if self.proc.stdout:
            self.proc.stdout.close()
        if self._log_file:
            self._log_file.close()
            self._log_file = None
        assert not extra, f"server printed more on stdout: {extra!r}"
        return code

    def kill(self) -> int:
        """SIGKILL: no chance to flush anything."""
        return self.stop(signal.SIGKILL)

    def restart(self, graceful: bool = True, same_port: bool = True, timeout: float = 20.0) -> "TetherServer":
        """Stops (SIGTERM, must exit 0; or SIGKILL) and starts again on the same data dir."""
        old_port = self.port
        if self.running:
            if graceful:
                code = self.stop()
                assert code == 0, f"graceful stop exited {code}; log:\n{self.log_text()}"
            else:
                self.kill()
        if same_port:
            # The port is normally free at once (SO_REUSEADDR); fall back to a new one.
            for _ in range(50):
                try:
                    return self.start(port=old_port, timeout=timeout)
                except AssertionError as e:
                    if "before ready" not in str(e):
                        raise
                    time.sleep(0.1)
        return self.start(timeout=timeout)

    def log_text(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")[-20000:]
        except OSError:
            return "<no log>"

    # -- addressing ------------------------------------------------------------------------

    @property
    def origin(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"http://{self.origin}"

    def __repr__(self) -> str:
        return f"<TetherServer {self.origin} data={self.data_dir}>"


# ---------------------------------------------------------------------------------------------
# Raw HTTP
# ---------------------------------------------------------------------------------------------

@dataclass
class Resp:
    status: int
    reason: str
    headers: dict
    body: bytes
    elapsed: float = 0.0

    def json(self):
        return json.loads(self.body)

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")

    def __repr__(self):
        return f"<Resp {self.status} {self.body[:300]!r}>"


def q(value: str) -> str:
    """Percent-encodes one path segment or query value the way the Python SDK does."""
    return urllib.parse.quote(value, safe="~")


def request(origin: str, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
            timeout: float = 15.0, conn: http.client.HTTPConnection | None = None) -> Resp:
    host, port = origin.rsplit(":", 1)
    own = conn is None
    if own:
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    t0 = time.monotonic()
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        return Resp(r.status, r.reason, {k.lower(): v for k, v in r.getheaders()}, data, time.monotonic() - t0)
    finally:
        if own:
            conn.close()


def get(origin: str, path: str, **kw) -> Resp:
    return request(origin, "GET", path, **kw)


def query(params: dict) -> str:
    if not params:
        return ""
    return "?" + "&".join(f"{q(str(k))}={q(str(v))}" for k, v in params.items() if v is not None)


def publish_path(channel: str, message: Any, **params) -> str:
    text = json.dumps(message)
    params.setdefault("uuid", "raw-publisher")
    return f"/publish/{PUB_KEY}/{SUB_KEY}/0/{q(channel)}/0/{q(text)}" + query(params)


def publish(origin: str, channel: str, message: Any, conn=None, **params) -> int:
    r = get(origin, publish_path(channel, message, **params), conn=conn)
    assert r.status == 200, r
    body = r.json()
    assert body[0] == 1 and body[1] == "Sent", body
    return int(body[2])


def subscribe_raw(origin: str, channels: str | list, tt: int | str | None, timeout: float = 30.0, **params) -> Resp:
    names = channels if isinstance(channels, str) else ",".join(q(c) for c in channels)
    p = {"uuid": "raw-subscriber"}
    if tt is not None:
        p["tt"] = str(tt)
    p.update(params)
    return get(origin, f"/v2/subscribe/{SUB_KEY}/{names}/0" + query(p), timeout=timeout)


def fetch_page(origin: str, channels: str | list, **params) -> dict:
    names = channels if isinstance(channels, str) else ",".join(q(c) for c in channels)
    r = get(origin, f"/v3/history/sub-key/{SUB_KEY}/channel/{names}" + query(params))
    assert r.status == 200, r
    return r.json()


def fetch_all(origin: str, channel: str, page: int = 100, conn=None) -> list[dict]:
    """Every stored message of a channel, oldest first, paging backwards with `start` (exclusive)."""
    out: list[dict] = []
    start = None
    while True:
        params = {"max": page, "include_uuid": "true", "include_meta": "true"}
        if start is not None:
            params["start"] = start
        r = get(origin, f"/v3/history/sub-key/{SUB_KEY}/channel/{q(channel)}" + query(params), conn=conn)
        assert r.status == 200, r
        items = r.json()["channels"].get(channel, [])
        if not items:
            break
        tts = [int(i["timetoken"]) for i in items]
        assert tts == sorted(tts), "a fetch page must be oldest first"
        if start is not None:
            assert max(tts) < start, "start must be exclusive"
        out[0:0] = items
        start = tts[0]
    return out


def message_count(origin: str, channel: str, after: int = 1) -> int:
    r = get(origin, f"/v3/history/sub-key/{SUB_KEY}/message-counts/{q(channel)}?timetoken={after}&uuid=counter")
    assert r.status == 200, r
    return r.json()["channels"][channel]


def server_time(origin: str) -> int:
    r = get(origin, "/time/0")
    assert r.status == 200, r
    return r.json()[0]


# ---------------------------------------------------------------------------------------------
# PubNub SDK clients
# ---------------------------------------------------------------------------------------------

def make_config(origin: str, uuid: str | None = None, **overrides):
    from pubnub.pnconfiguration import PNConfiguration

    config = PNConfiguration()
    config.publish_key = PUB_KEY
    config.subscribe_key = SUB_KEY
    config.uuid = uuid or unique("user")
    config.origin = origin
    config.ssl = False
    config.daemon = True
    config.non_subscribe_request_timeout = 15
    for k, v in overrides.items():
        setattr(config, k, v)
    return config


try:
    from pubnub.callbacks import SubscribeCallback as _SubscribeCallback
except Exception:  # pragma: no cover - the SDK is a hard requirement of the suite
    _SubscribeCallback = object


class Collector(_SubscribeCallback):
    """A listener recording every status, message and signal (thread-safe; usable from asyncio)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.statuses: list = []
        self.messages: list = []
        self.signals: list = []
        self.presence_events: list = []

    def status(self, pubnub, status):
        with self.lock:
            self.statuses.append(status)

    def message(self, pubnub, message):
        with self.lock:
            self.messages.append(message)

    def signal(self, pubnub, signal):
        with self.lock:
            self.signals.append(signal)

    def presence(self, pubnub, presence):
        with self.lock:
            self.presence_events.append(presence)

    # -- queries -------------------------------------------------------------------------

    def categories(self) -> list:
        with self.lock:
            return [s.category for s in self.statuses]

    def has_category(self, category) -> bool:
        return category in self.categories()

    def count_category(self, category) -> int:
        return self.categories().count(category)

    def messages_on(self, channel: str) -> list:
        with self.lock:
            return [m for m in self.messages if m.channel == channel]

    def message_count(self) -> int:
        with self.lock:
            return len(self.messages)

    def snapshot(self) -> list:
        with self.lock:
            return list(self.messages)

    def wait_connected(self, timeout: float = 10.0, count: int = 1):
        from pubnub.enums import PNStatusCategory
        wait_until(lambda: self.count_category(PNStatusCategory.PNConnectedCategory) >= count, timeout,
                   what=f"PNConnectedCategory x{count} (statuses so far: {self.categories()})")

    def wait_messages(self, n: int, timeout: float = 10.0, channel: str | None = None) -> list:
        def enough():
            got = self.messages_on(channel) if channel else self.snapshot()
            return got if len(got) >= n else None
        return wait_until(enough, timeout, what=f"{n} messages (have {self.message_count()})")

    def wait_signals(self, n: int, timeout: float = 10.0) -> list:
        def enough():
            with self.lock:
                return list(self.signals) if len(self.signals) >= n else None
        return wait_until(enough, timeout, what=f"{n} signals")

    async def async_wait_connected(self, timeout: float = 10.0, count: int = 1):
        from pubnub.enums import PNStatusCategory
        await async_wait_until(lambda: self.count_category(PNStatusCategory.PNConnectedCategory) >= count, timeout,
                               what=f"PNConnectedCategory x{count} (statuses so far: {self.categories()})")

    async def async_wait_messages(self, n: int, timeout: float = 10.0, channel: str | None = None) -> list:
        def enough():
            got = self.messages_on(channel) if channel else self.snapshot()
            return got if len(got) >= n else None
        return await async_wait_until(enough, timeout, what=f"{n} messages (have {self.message_count()})")

    async def async_wait_signals(self, n: int, timeout: float = 10.0) -> list:
        def enough():
            with self.lock:
                return list(self.signals) if len(self.signals) >= n else None
        return await async_wait_until(enough, timeout, what=f"{n} signals")


def start_subscription(pn, channels, with_timetoken=None) -> Collector:
    """Subscribes `pn` (threaded or asyncio) to `channels`, from `with_timetoken` when given;
    returns the `Collector` listening to it, without waiting for the first response."""
    c = Collector()
    pn.add_listener(c)
    builder = pn.subscribe().channels(channels)
    if with_timetoken is not None:
        builder = builder.with_timetoken(with_timetoken)
    builder.execute()
    return c


def assert_json_response(r: Resp, status: int):
    """The server's contract for every (non-metrics) response: status, content type, JSON body."""
    assert r.status == status, f"expected {status}, got {r!r}"
    assert r.content_type == CONTENT_TYPE, f"content type {r.content_type!r} for {r!r}"
    try:
        return r.json()
    except ValueError as e:
        raise AssertionError(f"body is not JSON: {r.body[:500]!r}") from e


# ---------------------------------------------------------------------------------------------
# Bulk publishing
# ---------------------------------------------------------------------------------------------

def publish_many(origin: str, items: list[tuple[str, Any, dict]], workers: int = 16, retries: int = 2) -> list[int]:
    """Publishes (channel, message, params) items concurrently over keep-alive connections;
    returns each item's acknowledged timetoken, in item order. `retries`: how often a request
    may be resent on a fresh connection when the server closed the old one without answering
    (0 where a resend could blur what is being measured)."""
    from concurrent.futures import ThreadPoolExecutor

    local = threading.local()
    host, port = origin.rsplit(":", 1)
    conns = []
    conns_lock = threading.Lock()

    def conn():
        c = getattr(local, "conn", None)
        if c is None:
            c = http.client.HTTPConnection(host, int(port), timeout=30)
            local.conn = c
            with conns_lock:
                conns.append(c)
        return c

    def one(item):
        channel, message, params = item
        for attempt in range(retries + 1):
            try:
                return publish(origin, channel, message, conn=conn(), **params)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # A keep-alive connection closed under us without an answer: retry on a new one.
                local.conn = None
                if attempt == retries:
                    raise
        raise AssertionError("unreachable")

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(one, items))
    finally:
        for c in conns:
            c.close()


# ---------------------------------------------------------------------------------------------
# Raw sockets
# ---------------------------------------------------------------------------------------------

def parse_responses(data: bytes) -> tuple[list[Resp], bytes]:
    """Splits a byte stream into complete HTTP/1.x responses (Content-Length or chunked bodies);
    returns them and the unparsed rest."""
    out = []
    while True:
        head_end = data.find(b"\r\n\r\n")
        if head_end < 0:
            return out, data
        head = data[:head_end].decode("latin-1")
        lines = head.split("\r\n")
        parts = lines[0].split(" ", 2)
        status = int(parts[1])
        reason = parts[2] if len(parts) > 2 else ""
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        rest = data[head_end + 4:]
        if "content-length" in headers:
            n = int(headers["content-length"])
            if len(rest) < n:
                return out, data
            body, data = rest[:n], rest[n:]
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            pos = 0
            while True:
                eol = rest.find(b"\r\n", pos)
                if eol < 0:
                    return out, data
                size = int(rest[pos:eol].split(b";")[0], 16)
                if len(rest) < eol + 2 + size + 2:
                    return out, data
                body += rest[eol + 2:eol + 2 + size]
                pos = eol + 2 + size + 2
                if size == 0:
                    break
            data = rest[pos:]
        else:
            body, data = rest, b""
        out.append(Resp(status, reason, headers, body))


def raw_exchange(origin: str, payload: bytes | list[bytes], timeout: float = 5.0, expect: int = 1,
                 half_close: bool = False, pause: float = 0.0) -> tuple[list[Resp], bytes, bool]:
    """Sends raw bytes (a list is sent piece by piece, `pause` seconds apart) and reads until
    `expect` complete responses arrived, the server closed, or `timeout` passed. Returns
    (responses, unparsed bytes, whether the server closed the connection)."""
    host, port = origin.rsplit(":", 1)
    pieces = payload if isinstance(payload, list) else [payload]
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        for i, piece in enumerate(pieces):
            if i and pause:
                time.sleep(pause)
            try:
                s.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
        if half_close:
            with contextlib_suppress():
                s.shutdown(socket.SHUT_WR)
        data = b""
        closed = False
        deadline = time.monotonic() + timeout
        while True:
            responses, _ = parse_responses(data)
            if len(responses) >= expect:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            s.settimeout(remaining)
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            data += chunk
        responses, rest = parse_responses(data)
        return responses, rest, closed


class contextlib_suppress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], OSError)


# ---------------------------------------------------------------------------------------------
# Presence and channel groups (raw HTTP)
# ---------------------------------------------------------------------------------------------

def write_config(directory: str, **keyset_fields) -> str:
    """Writes a `--config` file whose only keyset is demo/demo with `keyset_fields` (e.g.
    presenceAnnounceMax=2, presenceIntervalSeconds=2, presenceMinimumTimeoutSeconds=2);
    returns its path."""
    path = os.path.join(directory, "tether-config.json")
    keyset = {"publishKey": PUB_KEY, "subscribeKey": SUB_KEY, **keyset_fields}
    with open(path, "w") as f:
        json.dump({"keysets": [keyset]}, f)
    return path


def names_query(params: dict) -> str:
    """Like `query`, but list values become comma-joined names, each encoded and the commas
    left raw (as SDKs send `channel-group`, `add`, `remove`)."""
    if not params:
        return ""
    parts = []
    for k, v in params.items():
        if v is None:
            continue
        value = ",".join(q(str(x)) for x in v) if isinstance(v, (list, tuple)) else q(str(v))
        parts.append(f"{q(str(k))}={value}")
    return "?" + "&".join(parts)


def names_segment(channels: str | list | None) -> str:
    """A comma-joined, per-name encoded channel list for a path; `,` when there are none."""
    if channels is None or channels == []:
        return ","
    if isinstance(channels, str):
        return q(channels)
    return ",".join(q(c) for c in channels)


def here_now_raw(origin: str, channels: str | list | None = None, groups: list | None = None,
                 status: int = 200, **params) -> dict:
    """`GET /v2/presence/sub-key/{sub}[/channel/{chs}]`; global when neither is given."""
    if groups:
        params["channel-group"] = list(groups)
    if channels is None and not groups:
        path = f"/v2/presence/sub-key/{SUB_KEY}"
    else:
        path = f"/v2/presence/sub-key/{SUB_KEY}/channel/{names_segment(channels)}"
    params.setdefault("uuid", "here-now-asker")
    return assert_json_response(get(origin, path + names_query(params)), status)


def occupants_raw(origin: str, channel: str) -> list[str]:
    """The uuids here-now reports on one channel (sorted by the server)."""
    body = here_now_raw(origin, channel)
    assert body["occupancy"] == len(body["uuids"]), body
    return body["uuids"]


def where_now_raw(origin: str, uuid: str) -> list[str]:
    body = assert_json_response(get(origin, f"/v2/presence/sub-key/{SUB_KEY}/uuid/{q(uuid)}?uuid=asker"), 200)
    return body["payload"]["channels"]


def heartbeat_raw(origin: str, channels: str | list | None, uuid: str, heartbeat: int | None = None,
                  groups: list | None = None, state: dict | None = None) -> dict:
    params: dict = {}
    if heartbeat is not None:
        params["heartbeat"] = heartbeat
    if groups:
        params["channel-group"] = list(groups)
    if state is not None:
        params["state"] = json.dumps(state)
    params["uuid"] = uuid
    path = f"/v2/presence/sub-key/{SUB_KEY}/channel/{names_segment(channels)}/heartbeat" + names_query(params)
    body = assert_json_response(get(origin, path), 200)
    assert body == {"status": 200, "message": "OK", "service": "Presence"}, body
    return body


def leave_raw(origin: str, channels: str | list | None, uuid: str, groups: list | None = None) -> dict:
    params: dict = {}
    if groups:
        params["channel-group"] = list(groups)
    params["uuid"] = uuid
    path = f"/v2/presence/sub-key/{SUB_KEY}/channel/{names_segment(channels)}/leave" + names_query(params)
    body = assert_json_response(get(origin, path), 200)
    assert body == {"status": 200, "action": "leave", "message": "OK", "service": "Presence"}, body
    return body


def group_path(group: str | None = None, remove: bool = False) -> str:
    path = f"/v1/channel-registration/sub-key/{SUB_KEY}/channel-group"
    if group is not None:
        path += "/" + q(group)
    if remove:
        path += "/remove"
    return path


def group_update_raw(origin: str, group: str, add: list | None = None, remove: list | None = None) -> dict:
    params = {"uuid": "group-admin"}
    if add:
        params["add"] = list(add)
    if remove:
        params["remove"] = list(remove)
    body = assert_json_response(get(origin, group_path(group) + names_query(params)), 200)
    assert body == {"status": 200, "message": "OK", "service": "channel-registry", "error": False}, body
    return body


def group_channels_raw(origin: str, group: str) -> list[str]:
    body = assert_json_response(get(origin, group_path(group) + "?uuid=group-admin"), 200)
    assert body["payload"]["group"] == group, body
    return body["payload"]["channels"]


def group_list_raw(origin: str) -> list[str]:
    """Every channel group of the keyset (the Python SDK has no call for this)."""
    body = assert_json_response(get(origin, group_path() + "?uuid=group-admin"), 200)
    assert body["service"] == "channel-registry" and body["error"] is False, body
    assert body["payload"]["namespace"] == "", body
    return body["payload"]["groups"]


class RawSubscriber:
    """A subscriber that long-polls `/v2/subscribe` in a loop on its own thread, like an SDK
    without presence heartbeats: every request is a presence heartbeat for `uuid` with the
    presence timeout `heartbeat`. `drop()` aborts the waiting long-poll by closing its socket
    and sends no leave (a phone entering a tunnel); `resume()` carries on with the last cursor
    (or with a new handshake). `heartbeats` records the wall-clock time of every request sent
    and every response received (both are heartbeats on the server)."""

    def __init__(self, origin: str, uuid: str, channels: list | None = None, groups: list | None = None,
                 heartbeat: int | None = None):
        self.origin = origin
        self.uuid = uuid
        self.channels = list(channels or [])
        self.groups = list(groups or [])
        self.heartbeat = heartbeat
        self.tt: str | None = None
        self.envelopes: list[dict] = []
        self.heartbeats: list[float] = []
        self.errors: list[BaseException] = []
        self.requests = 0
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None

    def _path(self, tt) -> str:
        params: dict = {"tt": tt, "uuid": self.uuid}
        if self.tt is not None and str(tt) != "0":
            params["tr"] = 1
        if self.groups:
            params["channel-group"] = list(self.groups)
        if self.heartbeat is not None:
            params["heartbeat"] = self.heartbeat
        return f"/v2/subscribe/{SUB_KEY}/{names_segment(self.channels)}/0" + names_query(params)

    def _once(self, tt) -> dict | None:
        host, port = self.origin.rsplit(":", 1)
        with self._lock:
            if self._stopping:
                return None
            self._conn = http.client.HTTPConnection(host, int(port), timeout=60)
            conn = self._conn
        try:
            self.heartbeats.append(time.time())
            self.requests += 1
            r = request(self.origin, "GET", self._path(tt), conn=conn)
            self.heartbeats.append(time.time())
        finally:
            with self._lock:
                self._conn = None
            conn.close()
        assert r.status == 200, r
        body = r.json()
        self.envelopes.extend(body["m"])
        self.tt = body["t"]["t"]
        return body

    def _loop(self):
        while True:
            try:
                if self._once(self.tt) is None:
                    return
            except (OSError, http.client.HTTPException):
                with self._lock:
                    if self._stopping:
                        return
                time.sleep(0.05)
            except BaseException as e:  # recorded and re-raised by drop()
                self.errors.append(e)
                return

    def start(self, handshake: bool = True) -> "RawSubscriber":
        """Handshakes (synchronously, so the uuid is present when this returns) and starts the loop."""
        assert self._thread is None, "already running"
        self._stopping = False
        if handshake or self.tt is None:
            self._once(0)
        self._thread = threading.Thread(target=self._loop, name=f"raw-subscriber-{self.uuid}", daemon=True)
        self._thread.start()
        return self

    def resume(self, handshake: bool = False) -> "RawSubscriber":
        return self.start(handshake=handshake)

    def drop(self) -> float:
        """Closes the waiting long-poll's connection without a leave and stops the loop;
        returns the wall-clock time of the last heartbeat the server got."""
        with self._lock:
            self._stopping = True
            conn = self._conn
            if conn is not None and conn.sock is not None:
                try:
                    conn.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        if self._thread is not None:
            self._thread.join(10)
            assert not self._thread.is_alive(), "raw subscriber thread did not stop"
            self._thread = None
        assert not self.errors, self.errors
        return self.heartbeats[-1]

    stop = drop


class PresenceCollector(Collector):
    """A `Collector` that also waits for presence events (`PNPresenceEventResult`)."""

    def presence(self, pubnub, presence):
        presence.received_at = time.time()
        super().presence(pubnub, presence)

    def presence_snapshot(self, channel: str | None = None) -> list:
        with self.lock:
            return [p for p in self.presence_events if channel is None or p.channel == channel]

    def presence_tuples(self, channel: str | None = None, fields=("event", "uuid", "occupancy")) -> list[tuple]:
        return [tuple(getattr(p, f) for f in fields) for p in self.presence_snapshot(channel)]

    def wait_presence(self, predicate: Callable[[list], Any], timeout: float = 10.0, what: str = "presence events"):
        """Waits until `predicate(events so far)` is truthy; returns the events."""
        def check():
            events = self.presence_snapshot()
            return events if predicate(events) else None
        try:
            return wait_until(check, timeout, what=what)
        except AssertionError as e:
            raise AssertionError(f"{e}; got {self.presence_tuples(fields=('event', 'uuid', 'channel', 'occupancy'))}")

    async def async_wait_presence(self, predicate: Callable[[list], Any], timeout: float = 10.0,
                                  what: str = "presence events"):
        def check():
            events = self.presence_snapshot()
            return events if predicate(events) else None
        try:
            return await async_wait_until(check, timeout, what=what)
        except AssertionError as e:
            raise AssertionError(f"{e}; got {self.presence_tuples(fields=('event', 'uuid', 'channel', 'occupancy'))}")


# =============================================================================================
# Access Manager, limits, TLS and filter expressions
# (test_access_manager.py, test_limits_tls.py, test_filter.py, test_hostile_access.py)
# =============================================================================================

CERT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "Sources", "TetherTesting",
                        "Certificates")
CA_PEM = os.path.normpath(os.path.join(CERT_DIR, "ca.pem"))
SERVER_PEM = os.path.normpath(os.path.join(CERT_DIR, "server.pem"))
SERVER_KEY_PEM = os.path.normpath(os.path.join(CERT_DIR, "server-key.pem"))
SELF_SIGNED_PEM = os.path.normpath(os.path.join(CERT_DIR, "self-signed.pem"))
SELF_SIGNED_KEY_PEM = os.path.normpath(os.path.join(CERT_DIR, "self-signed-key.pem"))

# Keysets of the access-manager tests: two with a secret key (access enforced), one with tight
# per-client limits, one with a request rate limit, and the open demo keyset.
SECURE_KEYSET = {"name": "secure", "publishKey": "pub-s", "subscribeKey": "sub-s", "secretKey": "s3cret"}
OTHER_KEYSET = {"name": "other", "publishKey": "pub-o", "subscribeKey": "sub-o", "secretKey": "other-secret"}
LIMITED_KEYSET = {"name": "limited", "publishKey": "pub-l", "subscribeKey": "sub-l",
                  "limits": {"publishRatePerSecond": 1, "publishBurst": 3, "maxMessageBytes": 1024}}
THROTTLED_KEYSET = {"name": "throttled", "publishKey": "pub-t", "subscribeKey": "sub-t",
                    "limits": {"requestRatePerSecond": 1, "requestBurst": 2}}
DEMO_KEYSET = {"name": "demo", "publishKey": PUB_KEY, "subscribeKey": SUB_KEY}
ACCESS_KEYSETS = [SECURE_KEYSET, OTHER_KEYSET, LIMITED_KEYSET, THROTTLED_KEYSET, DEMO_KEYSET]


def write_keysets_config(directory: str, keysets: list | None = None, name: str = "tether-access.json", **top) -> str:
    """Writes a `--config` file with `keysets` (default: ACCESS_KEYSETS) and any top-level
    fields; returns its path."""
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        json.dump({"keysets": list(keysets if keysets is not None else ACCESS_KEYSETS), **top}, f)
    return path


def keyset_overrides(keyset: dict, admin: bool = False, **overrides) -> dict:
    """`make_config` overrides for an SDK client on `keyset` (with its secret key when `admin`)."""
    fields = {"publish_key": keyset["publishKey"], "subscribe_key": keyset["subscribeKey"]}
    if admin:
        fields["secret_key"] = keyset["secretKey"]
    fields.update(overrides)
    return fields


def stop_clients(clients) -> None:
    """Unsubscribes and stops threaded SDK clients at a fixture's teardown, ignoring failures
    (a client may already be stopped)."""
    for pn in clients:
        with contextlib.suppress(Exception):
            pn.unsubscribe_all()
        with contextlib.suppress(Exception):
            pn.stop()


async def stop_asyncio_clients(clients, subscribed=None) -> None:
    """Unsubscribes `subscribed` (default: every one of `clients`), lets the event loop send the
    leaves, then stops every asyncio client, ignoring failures (teardown)."""
    for pn in clients if subscribed is None else subscribed:
        with contextlib.suppress(Exception):
            pn.unsubscribe_all()
    await asyncio.sleep(0)
    for pn in clients:
        with contextlib.suppress(Exception):
            await pn.stop()


@contextlib.contextmanager
def threaded_clients(default_keyset: dict):
    """Factory of threaded `PubNub` clients on `default_keyset` (or `keyset=`) of any origin,
    with the keyset's secret key when `admin=True`; all are stopped on exit. A module's
    `threaded` fixture yields it."""
    from pubnub.pubnub import PubNub
    clients = []

    def make(origin, uuid=None, *, keyset=default_keyset, admin=False, **overrides):
        pn = PubNub(make_config(origin, uuid, **keyset_overrides(keyset, admin=admin, **overrides)))
        clients.append(pn)
        return pn

    try:
        yield make
    finally:
        stop_clients(clients)


def signature_encode(text: str) -> str:
    """pubnub-wire §12: percent-encoding with only `A-Z a-z 0-9 - _ .` left raw, uppercase hex."""
    return urllib.parse.quote(str(text), safe="-_.").replace("~", "%7E")


def sign(method: str, keyset: dict, path: str, params: dict, body: str = "", secret: str | None = None,
         timestamp: int | None = None, drop_timestamp: bool = False) -> str:
    """The query string (with `?`) of a request signed like a PubNub SDK (v2 form): `params`
    plus `timestamp` (now unless given) and `signature`, computed with `secret` (default: the
    keyset's). `path` is the raw (already encoded) path."""
    import base64
    import hashlib
    import hmac
    params = {k: str(v) for k, v in params.items()}
    if not drop_timestamp:
        params["timestamp"] = str(int(time.time()) if timestamp is None else timestamp)
    canonical = "&".join(f"{k}={signature_encode(params[k])}" for k in sorted(params))
    message = f"{method}\n{keyset['publishKey']}\n{path}\n{canonical}\n{body}"
    mac = hmac.new((secret if secret is not None else keyset["secretKey"]).encode(), message.encode(),
                   hashlib.sha256).digest()
    signature = "v2." + base64.urlsafe_b64encode(mac).decode().rstrip("=")
    return "?" + canonical + "&signature=" + signature


def signed_request(origin: str, method: str, keyset: dict, path: str, params: dict | None = None,
                   body: str = "", **sign_kw) -> Resp:
    """Sends a signed request (see `sign`); POST bodies are sent as JSON."""
    qs = sign(method, keyset, path, dict(params or {}), body=body, **sign_kw)
    headers = {"Content-Type": "application/json"} if body else None
    return request(origin, method, path + qs, body=body.encode() if body else None, headers=headers)


def grant_token_raw(origin: str, keyset: dict, permissions: dict, ttl: int = 60) -> str:
    """`POST /v3/pam/{sub}/grant` signed with the keyset's secret; returns the token."""
    body = json.dumps({"ttl": ttl, "permissions": permissions}, separators=(",", ":"))
    r = signed_request(origin, "POST", keyset, f"/v3/pam/{keyset['subscribeKey']}/grant", {"uuid": "admin"}, body=body)
    assert r.status == 200, r
    return r.json()["data"]["token"]


def forbidden_body(channels: list | None = None, groups: list | None = None, message: str = "Forbidden") -> dict:
    """The 403 body of pubnub-wire §3 listing the denied channels and groups."""
    payload: dict = {}
    if channels is not None:
        payload["channels"] = list(channels)
    if groups is not None:
        payload["channel-groups"] = list(groups)
    return {"message": message, "payload": payload, "error": True, "service": "Access Manager", "status": 403}


def run_with_callback(builder) -> tuple[threading.Event, list]:
    """Starts a threaded-SDK endpoint builder through its callback API; returns the event set
    when the callback has run and the list it appends `(result, status)` to."""
    done = threading.Event()
    got = []

    def callback(result, status):
        got.append((result, status))
        done.set()
    builder.pn_async(callback)
    return done, got


def sdk_error_status(builder, timeout: float = 20.0):
    """Runs a threaded-SDK endpoint builder through its callback API and returns the error
    `PNStatus` (the status `.sync()` hides by raising); fails if the call succeeded."""
    done, got = run_with_callback(builder)
    assert done.wait(timeout), f"no callback within {timeout} s"
    result, status = got[0]
    assert status.is_error(), f"expected an error, got {result!r}"
    return status


def status_body(status):
    """The parsed JSON error body an SDK status carries (None when it is not JSON)."""
    exc = status.error_data.exception if status.error_data else None
    text = getattr(exc, "_errormsg", None)
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return None


class TlsTetherServer(TetherServer):
    """A `TetherServer` started with `--tls-cert/--tls-key`: its ready line says `https://`.
    `origin` stays `host:port` (what SDK configs take); `scheme` records the ready line's."""

    scheme = "http"

    def _read_ready_line(self, timeout: float) -> str:
        line = super()._read_ready_line(timeout)
        prefix = "Tether listening on https://"
        self.scheme = "https" if line.startswith(prefix) else "http"
        return line.replace("https://", "http://", 1)

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.origin}"


def https_get(origin: str, path: str, cafile: str | None = CA_PEM, timeout: float = 10.0) -> Resp:
    """GET over TLS, trusting `cafile` (None: the default trust store)."""
    import ssl
    host, port = origin.rsplit(":", 1)
    context = ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()
    conn = http.client.HTTPSConnection(host, int(port), timeout=timeout, context=context)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return Resp(r.status, r.reason, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()

# ============================ end of the Access Manager / limits / TLS / filter block ========


class RecordingListener:
    """A PubNub SDK listener base that records status categories under a lock and ignores
    messages and presence; subclasses record their own events with `_record`. (A plain class:
    the test files mix it into `SubscribeCallback`, so this module does not import the SDK.)"""

    def __init__(self):
        self.lock = threading.Lock()
        self.statuses = []

    def _record(self, events, event):
        with self.lock:
            events.append(event)

    def status(self, pubnub, status):
        self._record(self.statuses, status.category)

    def message(self, pubnub, message):
        pass

    def presence(self, pubnub, presence):
        pass


# =============================================================================================
# PostgreSQL (issue #19): a throwaway server from scripts/postgres, a fresh database per test
# (conftest.py: `postgres_url`, `postgres_database`, `private_postgres`; test_cluster.py)
# =============================================================================================

REPO_ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
POSTGRES_SCRIPT = os.path.join(REPO_ROOT, "scripts", "postgres")


def postgres_bindir() -> str | None:
    """Where initdb/postgres/psql are, as scripts/postgres finds them: the newest
    /usr/lib/postgresql/<version>/bin (Debian), else PATH; None when PostgreSQL is not installed."""
    import glob
    import shutil

    def version(path: str) -> tuple:
        v = path.split("/")[-2]
        return tuple(int(x) if x.isdigit() else 0 for x in v.split("."))

    debian = [d for d in glob.glob("/usr/lib/postgresql/*/bin")
              if os.access(os.path.join(d, "postgres"), os.X_OK) and os.access(os.path.join(d, "initdb"), os.X_OK)]
    if debian:
        return max(debian, key=version)
    postgres, initdb = shutil.which("postgres"), shutil.which("initdb")
    return os.path.dirname(postgres) if postgres and initdb else None


def postgres_unavailable_reason() -> str | None:
    """Why this machine cannot start a PostgreSQL for the tests, or None when it can."""
    bindir = postgres_bindir()
    if bindir is None:
        return ("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/postgres, no postgres on PATH; "
                "Debian: apt-get install postgresql) and TETHER_TEST_DATABASE_URL is not set")
    if not os.access(os.path.join(bindir, "psql"), os.X_OK):
        return f"{bindir}/psql is missing (Debian: apt-get install postgresql-client)"
    return None


def database_url(url: str, database: str) -> str:
    """`url` (postgres://user@host:port/db) with another database name."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path="/" + database))


def psql(url: str, sql: str, timeout: float = 30.0) -> str:
    """Runs `sql` with psql on `url` (stops at the first error); returns the rows as unaligned
    text, `|`-separated, one line per row."""
    bindir = postgres_bindir()
    exe = os.path.join(bindir, "psql") if bindir else "psql"
    r = subprocess.run([exe, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql],
                       capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise AssertionError(f"psql on {url} failed ({r.returncode}) for {sql!r}: {r.stderr.strip()}")
    return r.stdout.strip()


def create_database(server_url: str) -> str:
    """A new, empty database `t_<random>` on the server of `server_url` (connecting to the
    database `server_url` names); returns its URL."""
    name = "t_" + uuidlib.uuid4().hex[:16]
    psql(server_url, f'CREATE DATABASE "{name}"')
    return database_url(server_url, name)


def drop_database(url: str, server_url: str) -> None:
    """Drops the database of `url`, disconnecting whoever is still on it (PostgreSQL 13+)."""
    name = urllib.parse.urlsplit(url).path.lstrip("/")
    assert name.startswith("t_"), f"refusing to drop {name!r}: not a test database"
    psql(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class PostgresServer:
    """A PostgreSQL of the test's own, run by scripts/postgres in a fresh directory under /tmp
    (as root it runs as the `postgres` user, which must reach the directory: pytest's tmp dirs
    are private to root). `restart()` stops it and starts it again on the same port and data."""

    def __init__(self):
        import tempfile
        self.directory = tempfile.mkdtemp(prefix="tether-pg-", dir="/tmp")
        self.url: str | None = None
        self.pid: int | None = None

    def _script(self, command: str, timeout: float = 120.0) -> str:
        r = subprocess.run([POSTGRES_SCRIPT, command, self.directory], capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise AssertionError(f"scripts/postgres {command} {self.directory} failed ({r.returncode}): "
                                 f"{r.stderr.strip()}")
        return r.stdout.strip()

    def start(self) -> "PostgresServer":
        line = self._script("start")
        m = re.fullmatch(r"(?P<url>postgres://\S+) pid=(?P<pid>\d+)", line)
        assert m, f"unexpected line from scripts/postgres start: {line!r}"
        url = m.group("url")
        assert self.url is None or url == self.url, f"restarted on {url}, was {self.url}"
        self.url, self.pid = url, int(m.group("pid"))
        return self

    def stop(self) -> None:
        """Fast shutdown (SIGINT to the postmaster; SIGKILL after 30 s): sessions are cut."""
        self._script("stop")
        self.pid = None

    def restart(self) -> "PostgresServer":
        self.stop()
        return self.start()

    @property
    def running(self) -> bool:
        if self.pid is None:
            return False
        try:
            os.kill(self.pid, 0)
            return True
        except ProcessLookupError:
            return False

    @property
    def port(self) -> int:
        assert self.url
        return urllib.parse.urlsplit(self.url).port

    def close(self) -> None:
        """Stops the server and removes its directory."""
        import shutil
        try:
            self._script("stop")
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)
