"""Restarts tell the truth (docs/operations.md, docs/presence.md), with the real binary:

- a damaged store (pages overwritten, file truncated or emptied, not a database at all) stops
  `tether serve` with a non-zero exit and a message naming the file and `tether store check` /
  `tether store recover`, never a stack trace;
- `tether store check` exits 1 on it and 0 on a good store; `tether store recover` moves it aside
  under a timestamped name, salvages the readable rows, and the server starts again on the result;
- presence survives SIGKILL: occupants from before come back without a join, stay present while
  they heartbeat, and otherwise get exactly one timeout event; one that left does not come back."""

from __future__ import annotations

import glob
import os
import subprocess
import time

import pytest

from helpers import (TETHER_BIN, fetch_all, get, heartbeat_raw, here_now_raw, leave_raw, publish, subscribe_raw, unique,
                     write_config)

pytestmark = pytest.mark.timeout(120)


def tether(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    return subprocess.run([TETHER_BIN, *args], capture_output=True, text=True, timeout=timeout, env=env,
                          stdin=subprocess.DEVNULL)


def store_path(data_dir: str) -> str:
    return os.path.join(data_dir, "tether.sqlite")


def filled_store(server_factory, count: int = 600):
    """A store with `count` messages on one channel, stopped cleanly (its WAL checkpointed)."""
    srv = server_factory.start()
    channel = unique("store")
    tts = [publish(srv.origin, channel, {"seq": i, "pad": "p" * 300}) for i in range(count)]
    assert srv.stop() == 0
    wal = store_path(srv.data_dir) + "-wal"
    assert not os.path.exists(wal) or os.path.getsize(wal) == 0  # checkpointed
    return srv, channel, tts


def assert_refused(data_dir: str, *fragments: str) -> str:
    """`tether serve` on `data_dir` must exit non-zero, saying what and where, and how to fix it."""
    r = tether("serve", "--port", "0", "--data-dir", data_dir, "--log-level", "warning", timeout=30)
    assert r.returncode != 0, r
    assert r.stdout == "", r.stdout  # never the ready line
    message = r.stderr
    for expected in (store_path(data_dir), "tether store check", "tether store recover", f"--data-dir {data_dir}",
                     *fragments):
        assert expected in message, message
    assert "Fatal error" not in message and "Stack dump" not in message, message
    return message


def overwrite_pages(path: str, first: int, count: int):
    with open(path, "r+b") as f:
        header = f.read(100)
        page_size = int.from_bytes(header[16:18], "big")
        page_size = 65536 if page_size == 1 else page_size
        f.seek(first * page_size)
        f.write(os.urandom(count * page_size))


def test_serve_refuses_overwritten_pages_then_check_and_recover_bring_it_back(server_factory):
    srv, channel, tts = filled_store(server_factory)
    path = store_path(srv.data_dir)
    pages = os.path.getsize(path) // 4096
    assert pages > 20
    overwrite_pages(path, pages // 2, 2)

    assert_refused(srv.data_dir, "is damaged")

    check = tether("store", "check", "--data-dir", srv.data_dir)
    assert check.returncode == 1, check
    assert "DAMAGED" in check.stdout and "tether store recover" in check.stdout, check.stdout

    recover = tether("store", "recover", "--data-dir", srv.data_dir)
    assert recover.returncode == 0, recover
    aside = glob.glob(os.path.join(srv.data_dir, "tether.damaged-*.sqlite"))
    assert len(aside) == 1, os.listdir(srv.data_dir)
    assert f"{path} -> {aside[0]}" in recover.stdout, recover.stdout
    message_line = next(line for line in recover.stdout.splitlines() if line.strip().startswith("message "))
    assert "rows kept" in message_line, recover.stdout

    assert tether("store", "check", "--data-dir", srv.data_dir).returncode == 0

    srv.start()
    got = [int(m["timetoken"]) for m in fetch_all(srv.origin, channel)]
    # What survives is a subset, in order; the overwritten pages held some, the rest was salvaged
    # from both ends of the table.
    assert set(got) <= set(tts)
    assert got == sorted(got)
    assert len(tts) * 3 // 4 <= len(got) < len(tts), (len(got), len(tts))
    assert f"{len(got)} rows kept" in message_line, (len(got), message_line)
    # Timetokens keep increasing after a recovery.
    assert publish(srv.origin, channel, "after-recovery") > max(tts)


def test_serve_refuses_a_file_that_is_not_a_database(server_factory):
    data_dir = server_factory.new_data_dir()
    with open(store_path(data_dir), "wb") as f:
        f.write(b"this is a text file, not a store\n" * 200)
    assert_refused(data_dir, "is not an SQLite database")
    assert tether("store", "check", "--data-dir", data_dir).returncode == 1

    recover = tether("store", "recover", "--data-dir", data_dir)
    assert recover.returncode == 0, recover
    assert "Nothing could be read" in recover.stdout, recover.stdout
    assert glob.glob(os.path.join(data_dir, "tether.damaged-*.sqlite"))
    srv = server_factory.start(data_dir=data_dir)
    assert publish(srv.origin, unique("fresh"), "hello") > 0


def test_serve_refuses_a_truncated_or_emptied_store(server_factory):
    srv, _, _ = filled_store(server_factory)
    path = store_path(srv.data_dir)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    assert_refused(srv.data_dir, "is damaged")
    with open(path, "r+b") as f:
        f.truncate(0)
    assert_refused(srv.data_dir, "is empty")


def test_recover_leaves_a_running_server_alone_and_a_good_store_as_it_is(server_factory):
    srv = server_factory.start()
    running = tether("store", "recover", "--data-dir", srv.data_dir)
    assert running.returncode != 0, running
    assert "another tether process" in running.stderr, running.stderr
    # Checking is read-only, so it works beside the running server.
    assert tether("store", "check", "--quick", "--data-dir", srv.data_dir).returncode == 0
    assert srv.stop() == 0
    good = tether("store", "recover", "--data-dir", srv.data_dir)
    assert good.returncode == 0 and "nothing to recover" in good.stdout, good
    assert not glob.glob(os.path.join(srv.data_dir, "tether.damaged-*"))


def test_presence_survives_sigkill_and_silent_occupants_time_out_once(server_factory, tmp_path):
    config = write_config(str(tmp_path), presenceMinimumTimeoutSeconds=2)
    srv = server_factory.start(args=["--config", config, "--subscribe-timeout", "1"])
    room = unique("room")
    heartbeat_raw(srv.origin, room, "alice", heartbeat=4)
    heartbeat_raw(srv.origin, room, "bob", heartbeat=4)
    heartbeat_raw(srv.origin, room, "carol", heartbeat=4)
    leave_raw(srv.origin, room, "carol")
    cursor = subscribe_raw(srv.origin, f"{room}-pnpres", 0).json()["t"]["t"]

    srv.restart(graceful=False)  # SIGKILL: nothing flushed at exit
    restarted = time.monotonic()
    assert here_now_raw(srv.origin, room)["uuids"] == ["alice", "bob"]

    # Bob heartbeats every second; alice never again. Read the presence channel from the cursor
    # of before the crash for 4 s past alice's deadline.
    events = []
    next_heartbeat = 0.0
    while time.monotonic() < restarted + 8:
        if time.monotonic() >= next_heartbeat:
            heartbeat_raw(srv.origin, room, "bob", heartbeat=4)
            next_heartbeat = time.monotonic() + 1
        page = subscribe_raw(srv.origin, f"{room}-pnpres", cursor, tr=1).json()
        cursor = page["t"]["t"]
        events += [(e["d"]["action"], e["d"].get("uuid"), e["d"]["occupancy"], time.monotonic() - restarted)
                   for e in page["m"]]
    assert [e[:3] for e in events] == [("timeout", "alice", 1)], events
    assert 2.5 <= events[0][3] <= 6, events  # at restart + 4 s
    assert here_now_raw(srv.origin, room)["uuids"] == ["bob"]
