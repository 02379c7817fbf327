"""The SDK's durable outbox through the real binary (docs/outbox.md, issue #15):

- `tether publish --outbox FILE` writes the message to the journal before it is sent; a process
  killed while the server is down leaves it there, `tether outbox list` shows it (pending, with
  its request id) and `tether outbox flush` sends it once, with that request id, and exits 0;
- `tether publish` prints the timetoken and the request id, takes `--request-id`, and refuses a
  request id that is not 1-64 printable ASCII characters."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest

from helpers import TETHER_BIN, fetch_all, unique

pytestmark = pytest.mark.timeout(120)


def tether(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([TETHER_BIN, *args], capture_output=True, text=True, timeout=timeout, env=clean_env(),
                          stdin=subprocess.DEVNULL)


def clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def killed_publish(journal: str, channel: str, port: int, request_id: str):
    """Runs `tether publish --outbox` against a port where nothing listens and kills it once the
    message is in the journal: accepted means on disk (fsynced) before the first attempt, and the
    attempts fail and are retried with back-off, so the process is still running then."""
    proc = subprocess.Popen([TETHER_BIN, "publish", channel, '{"n":1}', "--outbox", journal, "--origin", f"127.0.0.1:{port}",
                             "--request-id", request_id],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(), stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not (os.path.exists(journal) and os.path.getsize(journal) > 0):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the message never reached the journal"
            time.sleep(0.05)
        assert proc.poll() is None, "the publish should still be retrying"
    finally:
        proc.kill()
        proc.wait()


def test_a_publish_killed_while_the_server_is_down_is_sent_once_by_flush(server_factory, tmp_path):
    port = free_port()
    journal = str(tmp_path / "outbox.journal")
    channel = unique("outbox")
    killed_publish(journal, channel, port, "cli-request-1")

    listed = tether("outbox", "list", "--outbox", journal)
    assert listed.returncode == 0, listed.stderr
    assert f"pending publish {channel} request-id=cli-request-1" in listed.stdout, listed.stdout
    assert "1 message(s): 1 pending, 0 failed" in listed.stdout

    server = server_factory.create().start(port=port)
    flushed = tether("outbox", "flush", "--outbox", journal, "--origin", server.origin)
    assert flushed.returncode == 0, flushed.stdout + flushed.stderr
    assert "request-id=cli-request-1" in flushed.stdout
    assert "flushed 1 message(s): 1 sent, 0 failed" in flushed.stdout

    again = tether("outbox", "flush", "--outbox", journal, "--origin", server.origin)
    assert again.returncode == 0 and "flushed 0 message(s): 0 sent, 0 failed" in again.stdout
    stored = fetch_all(server.origin, channel)
    assert [m["message"] for m in stored] == [{"n": 1}], stored


def test_publish_prints_the_request_id_and_checks_a_chosen_one(server):
    channel = unique("outbox")
    made = tether("publish", channel, "hello", "--origin", server.origin)
    assert made.returncode == 0, made.stderr
    words = dict(part.split("=", 1) for part in made.stdout.split() if "=" in part)
    assert made.stdout.startswith("sent timetoken=") and len(words["timetoken"]) == 17
    assert len(words["request-id"]) == 36  # a UUID

    chosen = tether("publish", channel, "again", "--origin", server.origin, "--request-id", "order-42")
    assert chosen.returncode == 0 and "request-id=order-42" in chosen.stdout, chosen.stdout + chosen.stderr

    refused = tether("publish", channel, "x", "--origin", server.origin, "--request-id", "has space")
    assert refused.returncode != 0 and "request id" in refused.stderr, refused.stderr
    assert [m["message"] for m in fetch_all(server.origin, channel)] == ["hello", "again"]


def test_flush_reports_a_failure_keeps_the_message_and_resends_it_next_time(server_factory, tmp_path):
    port = free_port()
    journal = str(tmp_path / "outbox.journal")
    channel = unique("outbox")
    killed_publish(journal, channel, port, "cli-request-2")

    # Still nothing listens: one attempt, a failure, exit 1; the message stays, failed.
    failed = tether("outbox", "flush", "--outbox", journal, "--origin", f"127.0.0.1:{port}", "--retries", "0")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "failed id=m1" in failed.stdout and "networkIssues" in failed.stdout
    assert "flushed 1 message(s): 0 sent, 1 failed" in failed.stdout
    listed = tether("outbox", "list", "--outbox", journal).stdout
    assert f"failed(networkIssues) publish {channel} request-id=cli-request-2" in listed, listed

    server = server_factory.create().start(port=port)
    flushed = tether("outbox", "flush", "--outbox", journal, "--origin", server.origin)
    assert flushed.returncode == 0 and "flushed 1 message(s): 1 sent, 0 failed" in flushed.stdout, flushed.stdout
    assert [m["message"] for m in fetch_all(server.origin, channel)] == [{"n": 1}]

    missing = tether("outbox", "flush", "--outbox", str(tmp_path / "absent.journal"))
    assert missing.returncode != 0 and "no outbox journal" in missing.stderr


def test_a_publish_killed_after_the_server_stored_it_is_stored_once_when_the_next_process_sends_it(server, tmp_path):
    """Issue 15: the client process dies between the server storing a message and the client
    learning it (the proxy drops every response). The next process resends it from the durable
    journal with the same request id; the server answers with the original timetoken and
    history holds one copy."""
    journal = str(tmp_path / "outbox.journal")
    channel = unique("outbox")
    proxy_port = free_port()
    proxy = subprocess.Popen([TETHER_BIN, "chaos", "proxy", "--listen", f"127.0.0.1:{proxy_port}", "--upstream", server.origin,
                              "--fault", "drop 0", "--no-stdin"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=clean_env(), stdin=subprocess.DEVNULL)
    publisher = None
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", proxy_port), timeout=1).close()
                break
            except OSError:
                assert proxy.poll() is None and time.monotonic() < deadline, "the fault proxy did not start"
                time.sleep(0.05)
        publisher = subprocess.Popen([TETHER_BIN, "publish", channel, '{"n":1}', "--outbox", journal,
                                      "--origin", f"127.0.0.1:{proxy_port}", "--request-id", "cli-request-3"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(), stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not fetch_all(server.origin, channel):
            assert publisher.poll() is None, publisher.communicate()
            assert time.monotonic() < deadline, "the server never stored the message"
            time.sleep(0.05)
        assert publisher.poll() is None, "the publish never heard the answer, so it is still retrying"
    finally:
        if publisher is not None:
            publisher.kill()
            publisher.wait()
        proxy.kill()
        proxy.wait()

    listed = tether("outbox", "list", "--outbox", journal)
    assert f"pending publish {channel} request-id=cli-request-3" in listed.stdout, listed.stdout
    flushed = tether("outbox", "flush", "--outbox", journal, "--origin", server.origin)
    assert flushed.returncode == 0, flushed.stdout + flushed.stderr
    assert "flushed 1 message(s): 1 sent, 0 failed" in flushed.stdout, flushed.stdout
    assert "repeat" in flushed.stdout, flushed.stdout  # the server already had it
    stored = fetch_all(server.origin, channel)
    assert [m["message"] for m in stored] == [{"n": 1}], stored
