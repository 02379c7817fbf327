"""A fresh server survives its first connections arriving together.

A fresh process builds NIO's HTTP/1 handler types on its first connections. With two event loops
building them at once, a Swift runtime race crashed the server (SIGSEGV) in about one start in
300; the server now builds the decoders before it binds (Sources/TetherServer/HTTPDecoderTypes.swift)
and prepares its first connection alone (FirstUseGate).
The crash is too rare for a CI test to catch every time: this one starts 30 fresh servers and
catches a regression in roughly one CI run in ten. `scripts/stress-first-connections` runs the
same check thousands of times."""

from __future__ import annotations

import socket
import threading

import pytest

pytestmark = pytest.mark.timeout(300)

STARTS = 30
CONNECTIONS = 4


def _open_together(port: int) -> list[bytes]:
    """Opens CONNECTIONS connections, waits until all are open, then sends on each at once
    `GET /time/0` (answered by the hot path) and a history request (passed on to Hummingbird,
    whose side of the connection is then built); returns what each connection received."""
    barrier = threading.Barrier(CONNECTIONS)
    answers: list[bytes] = [b""] * CONNECTIONS

    def run(i: int) -> None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                barrier.wait(10)
                s.sendall(b"GET /time/0 HTTP/1.1\r\nHost: conformance\r\n\r\n"
                          b"GET /v2/history/sub-key/demo/channel/first HTTP/1.1\r\nHost: conformance\r\n"
                          b"Connection: close\r\n\r\n")
                received = b""
                while chunk := s.recv(4096):
                    received += chunk
                answers[i] = received
        except (OSError, threading.BrokenBarrierError):
            pass

    threads = [threading.Thread(target=run, args=(i,)) for i in range(CONNECTIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def test_fresh_servers_answer_simultaneous_first_connections_and_exit_cleanly(server_factory):
    for start in range(STARTS):
        server = server_factory.start()
        answers = _open_together(server.port)
        code = server.stop()
        assert code == 0, f"start {start + 1}: exited {code}; log:\n{server.log_text()}"
        for answer in answers:
            assert answer.count(b"HTTP/1.1 200 ") == 2, f"start {start + 1}: answers {answers!r}"
