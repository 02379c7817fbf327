"""`tether bench` over WebSocket still runs, at a toy size: fan-out, latency and memory with
`--transport websocket`, the fan-out with `--publish-wire websocket`, and the resume run (drop without `bye`, messages published while away,
resume with token + cursor). Each spawns its own server and checks what it measured (every message
delivered exactly once, in order; the session resumed). The figures are for docs/benchmarks.md."""

from __future__ import annotations

import re
import subprocess

import pytest

from helpers import TETHER_BIN

pytestmark = pytest.mark.timeout(180)


def bench(*args: str) -> str:
    proc = subprocess.run([TETHER_BIN, "bench", *args], capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def test_websocket_fanout_delivers_every_message_exactly_once_in_order():
    out = bench("--scenario", "fanout", "--transport", "websocket", "--duration", "2", "--subscribers", "5",
                "--publishers", "2")
    assert "Fan-out (WebSocket sessions)" in out
    row = next(line for line in out.splitlines() if re.match(r"^\s+5\s", line))
    # subscribers, publishes/s, deliveries/s, while publishing, msgs/frame, drain, missing, dup, out-of-order, errors, …
    fields = row.split()
    assert fields[6:10] == ["0", "0", "0", "0"], row
    assert int(fields[2].replace(",", "")) > 0, row
    assert re.match(r"^\d+\.\d+$", fields[-1]), row  # server µs per delivery


def test_websocket_publishers_fan_out_every_message_exactly_once_in_order():
    out = bench("--scenario", "fanout", "--transport", "websocket", "--publish-wire", "websocket", "--duration", "2",
                "--subscribers", "6", "--fanout-channels", "3", "--publishers", "2")
    assert "2 closed-loop publishers (publish frames on WebSocket sessions)" in out, out
    row = next(line for line in out.splitlines() if re.match(r"^\s+6\s", line))
    fields = row.split()
    assert int(fields[1].replace(",", "")) > 0, row  # publishes/s: the acks were counted
    assert fields[6:10] == ["0", "0", "0", "0"], row


def test_websocket_publish_wire_refuses_a_paced_rate():
    proc = subprocess.run([TETHER_BIN, "bench", "--scenario", "fanout", "--publish-wire", "websocket", "--fanout-rate", "100"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0
    assert "--publish-wire websocket publishes closed-loop" in proc.stderr + proc.stdout


def test_websocket_latency_has_no_loss():
    out = bench("--scenario", "latency", "--transport", "websocket", "--duration", "2", "--warmup", "0.5",
                "--rate", "200", "--latency-subscribers", "3")
    assert "Latency (websocket)" in out
    assert re.search(r"publish → receive: p50 \d+\.\d+ ms", out)
    assert re.search(r"missing 0, duplicates 0, out of order 0, publish errors 0", out), out


def test_websocket_memory_holds_idle_sessions():
    out = bench("--scenario", "memory", "--transport", "websocket", "--long-polls", "100")
    assert "100 idle WebSocket sessions, one channel each" in out
    assert "(100 ready)" in out, out
    assert re.search(r"KiB per idle WebSocket session", out)


def test_resume_replays_every_missed_message_once():
    out = bench("--scenario", "resume", "--resume-sessions", "2", "--resume-missed", "250", "--drop-seconds", "1")
    assert "2 sessions dropped (TCP close, no bye), 250 messages published while away" in out, out
    assert "resumed: 2 of 2" in out, out
    assert re.search(r"hello → last missed message: min \d+\.\d+ ms", out), out
    assert "INCOMPLETE" not in out
    assert "missing 0, duplicates 0, out of order 0, errors 0, publish errors 0" in out, out
