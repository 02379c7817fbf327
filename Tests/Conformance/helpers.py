"""Shared helpers for the Tether conformance suite: server processes, raw HTTP, SDK clients.

Everything here talks only to servers started by the suite on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
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
                  "TETHER_SUBSCRIBE_TIMEOUT"):
            env.pop(k, None)
        if self.env:
            env.update(self.env)
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
