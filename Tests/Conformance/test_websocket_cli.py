"""The SDK's WebSocket wire through the real binary (docs/websocket-sdk.md, issue #14 point 11):

- `tether subscribe --transport websocket` receives over a session and prints the session's events
  among its status lines: after a server restart, `event reconnect started`, `event session
  expired: …` and `event reconnect succeeded`, and the messages published while it was away arrive
  once, in order, from the store;
- `--transport auto` against a server started with `--ws off` falls back to long-poll and says so;
- `tether ping` prints round-trip times over a session (and over long-poll), and exits 1 with a
  clear error when nothing listens."""

from __future__ import annotations

import os
import queue
import subprocess
import threading
import time

import pytest

from helpers import TETHER_BIN, publish, unique

pytestmark = pytest.mark.timeout(120)


def clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}


class Subscriber:
    """A `tether subscribe` process whose output lines are read as they come."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen([TETHER_BIN, "subscribe", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=clean_env(), stdin=subprocess.DEVNULL)
        self.lines: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))

    def wait_for(self, predicate, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        for line in self.lines:
            if predicate(line):
                return line
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            self.lines.append(line)
            if predicate(line):
                return line
        raise AssertionError(f"no matching line within {timeout} s; got:\n" + "\n".join(self.lines))

    def messages(self) -> list[str]:
        return [line.split(" ", 4)[4] for line in self.lines if line.startswith("message ")]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def test_subscribe_over_websocket_prints_session_events_and_catches_up_after_a_restart(server_factory):
    server = server_factory.start()
    channel = unique("ws-cli")
    sub = Subscriber(channel, "--origin", server.origin, "--transport", "websocket", "--policy", "linear")
    try:
        sub.wait_for(lambda line: line.startswith("status connected"))
        for i in range(3):
            publish(server.origin, channel, {"n": i})
        sub.wait_for(lambda line: line.endswith('{"n":2}'))

        server.stop()
        server.start(port=server.port)
        for i in range(3, 6):
            publish(server.origin, channel, {"n": i})
        sub.wait_for(lambda line: line.startswith("event session expired"))
        sub.wait_for(lambda line: line == "event reconnect succeeded")
        sub.wait_for(lambda line: line.endswith('{"n":5}'))
        assert "event reconnect started" in sub.lines
        assert sub.messages() == [f'{{"n":{i}}}' for i in range(6)], sub.lines
    finally:
        sub.stop()


def test_auto_falls_back_to_long_poll_on_a_server_without_the_endpoint(server_factory):
    server = server_factory.start(args=["--ws", "off"])
    channel = unique("ws-auto")
    sub = Subscriber(channel, "--origin", server.origin, "--transport", "auto")
    try:
        sub.wait_for(lambda line: line == "event transport long-poll")
        sub.wait_for(lambda line: line.startswith("status connected"))
        publish(server.origin, channel, {"over": "http"})
        sub.wait_for(lambda line: line.endswith('{"over":"http"}'))
    finally:
        sub.stop()


def test_ping_prints_round_trip_times(server):
    ws = subprocess.run([TETHER_BIN, "ping", "--origin", server.origin, "--count", "3", "--interval", "0"],
                        capture_output=True, text=True, timeout=60, env=clean_env(), stdin=subprocess.DEVNULL)
    assert ws.returncode == 0, ws.stdout + ws.stderr
    rtts = [line for line in ws.stdout.splitlines() if line.startswith("rtt=")]
    assert len(rtts) == 3 and all(line.endswith("transport=websocket") for line in rtts), ws.stdout
    assert "3/3 answered" in ws.stdout

    lp = subprocess.run([TETHER_BIN, "ping", "--origin", server.origin, "--count", "1", "--transport", "long-poll"],
                        capture_output=True, text=True, timeout=60, env=clean_env(), stdin=subprocess.DEVNULL)
    assert lp.returncode == 0 and "transport=long-poll" in lp.stdout, lp.stdout + lp.stderr


def test_ping_without_a_server_fails_clearly():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = subprocess.run([TETHER_BIN, "ping", "--origin", f"127.0.0.1:{port}", "--count", "1", "--timeout", "3"],
                            capture_output=True, text=True, timeout=60, env=clean_env(), stdin=subprocess.DEVNULL)
    assert result.returncode == 1
    assert "error:" in result.stderr and "is a server running" in result.stderr, result.stderr


@pytest.mark.parametrize("args", [["--count", "0"], ["--count", "-3"], ["--count", "100000"], ["--interval=-1"],
                                  ["--interval", "99999"], ["--transport", "carrier-pigeon"]])
def test_ping_refuses_out_of_range_options(args):
    result = subprocess.run([TETHER_BIN, "ping", "--origin", "127.0.0.1:9", *args], capture_output=True, text=True, timeout=30,
                            env=clean_env(), stdin=subprocess.DEVNULL)
    assert result.returncode != 0
    assert "Error:" in result.stderr or "error:" in result.stderr, result.stderr


def test_subscribe_refuses_an_unknown_transport():
    result = subprocess.run([TETHER_BIN, "subscribe", "chat", "--transport", "smoke-signals"], capture_output=True, text=True,
                            timeout=30, env=clean_env(), stdin=subprocess.DEVNULL)
    assert result.returncode != 0 and "transport" in result.stderr, result.stderr
