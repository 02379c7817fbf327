"""Failover to fallback origins through the real binary and real `tether serve` processes
(docs/connection-lifecycle.md, "Failover"; issue #19 point 5):

- `tether subscribe --fallback-origin B` on node A: SIGTERM to A (graceful shutdown: the drain)
  moves the subscriber to B (`event origin A -> B`), and what is published on B arrives — over a
  WebSocket session and over long-poll;
- a REST call (`tether time`, `tether publish`) whose origin refuses connections is answered by the
  fallback within the same call;
- a malformed `--fallback-origin` is refused before any request.

The nodes have separate stores today (no shared store yet), so nothing here claims that messages
published on A reach B."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from helpers import TETHER_BIN, publish, request, unique, wait_until
from test_websocket_cli import Subscriber

pytestmark = pytest.mark.timeout(120)


def clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}


def tether(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([TETHER_BIN, *args], capture_output=True, text=True, timeout=60, env=clean_env(),
                          stdin=subprocess.DEVNULL)


def dead_origin() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("transport", ["websocket", "long-poll"])
def test_a_drained_node_sends_its_subscriber_to_the_fallback(server_factory, transport):
    a = server_factory.start()
    b = server_factory.start()
    channel = unique(f"failover-{transport}")
    sub = Subscriber(channel, "--origin", a.origin, "--fallback-origin", b.origin, "--transport", transport,
                     "--policy", "linear")
    try:
        sub.wait_for(lambda line: line.startswith("status connected"))
        publish(a.origin, channel, {"n": 0})
        sub.wait_for(lambda line: line.endswith('{"n":0}'))

        if transport == "long-poll":
            # The drain answers waiting long-polls: stop A only once the subscriber's next poll is
            # parked there (else the poll can land on A's closed port: a refused connection, an
            # ordinary outage, not what this test is about).
            wait_until(lambda: _open_long_polls(a.origin) >= 1, what="the subscriber's long-poll waiting on A")
        assert a.stop() == 0  # SIGTERM: graceful shutdown, the drain
        sub.wait_for(lambda line: line == f"event origin {a.origin} -> {b.origin}")
        # Published on B after the move: the subscriber continues there from its cursor (a
        # timetoken from A's clock, which is B's too), so this arrives however the subscribe and
        # the publish interleave.
        publish(b.origin, channel, {"n": 1})
        sub.wait_for(lambda line: line.endswith('{"n":1}'))
        assert sub.messages() == ['{"n":0}', '{"n":1}'], sub.lines
        if transport == "long-poll":
            # Answered by A with `Tether-Draining`, the next poll went to B: no outage at all.
            assert not any(line.startswith("status unexpectedDisconnect") for line in sub.lines), sub.lines
    finally:
        sub.stop()


def _open_long_polls(origin: str) -> float:
    body = request(origin, "GET", "/metrics").body.decode()
    return next((float(line.split()[1]) for line in body.splitlines() if line.startswith("tether_open_long_polls ")), 0.0)


def test_rest_calls_are_answered_by_the_fallback_in_the_same_call(server):
    dead = dead_origin()
    time = tether("time", "--origin", dead, "--fallback-origin", server.origin)
    assert time.returncode == 0, time.stdout + time.stderr
    assert time.stdout.strip().isdigit(), time.stdout

    channel = unique("failover-rest")
    sent = tether("publish", channel, '{"via":"fallback"}', "--origin", dead, "--fallback-origin", server.origin)
    assert sent.returncode == 0, sent.stdout + sent.stderr
    history = tether("history", channel, "--origin", server.origin, "--json")
    assert '"via":"fallback"' in history.stdout.replace(" ", ""), history.stdout


def test_a_malformed_fallback_origin_is_refused():
    result = tether("time", "--origin", "127.0.0.1:9", "--fallback-origin", "http://node-2")
    assert result.returncode != 0
    assert "invalid origin" in result.stderr, result.stderr
