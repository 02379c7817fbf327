"""Several `tether serve` nodes on one PostgreSQL (issue #19, point 6), with real processes:

- a message published on any node reaches subscribers on every node (raw long-poll, the PubNub
  SDK, `tether subscribe` over WebSocket) exactly once, in timetoken order;
- SIGKILL to one of three nodes in the middle of a publishing burst loses no acknowledged
  publish, and a long-poll subscriber of the killed node continues on another node from its last
  cursor and misses nothing (the global cursor);
- a subscriber moves from node to node with its cursor;
- PostgreSQL restarted under load: publishes fail with an HTTP error while it is down (never a
  hang), the nodes reconnect, nothing acknowledged is lost;
- a node started on a database whose schema is newer than it knows refuses with a clear error;
  a fresh database is migrated, also by several nodes starting at once.

Every node has its own --data-dir and the same --database-url; every test has a database of its
own (conftest.py `postgres_database`) or a PostgreSQL of its own (`private_postgres`). The
whole file skips while the binary has no `serve --database-url`."""

from __future__ import annotations

import http.client
import json
import queue
import re
import subprocess
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from helpers import (DEMO_KEYSET, TETHER_BIN, RawSubscriber, TetherServer, fetch_all, get, psql, publish,
                     publish_path, start_subscription, subscribe_raw, threaded_clients, unique, wait_until)
from test_websocket_cli import Subscriber as CliSubscriber


def _serve_help() -> str:
    try:
        r = subprocess.run([TETHER_BIN, "serve", "--help"], capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return r.stdout + r.stderr


HAS_DATABASE_URL = "--database-url" in _serve_help()

pytestmark = [
    pytest.mark.skipif(not HAS_DATABASE_URL,
                       reason=f"{TETHER_BIN} has no `serve --database-url`: this build has no PostgreSQL store "
                              "(issue #19), so there is no cluster to test"),
    pytest.mark.slow,
    pytest.mark.timeout(120),
]

# The table where Tether records the schema migrations it applied (one row per version).
MIGRATIONS_TABLE = "tether_schema_migrations"
# `store.writeTimeoutSeconds` (docs/configuration.md): a publish the store cannot take is
# answered by then. The margin covers a loaded 2-core machine running a debug build.
STORE_WRITE_TIMEOUT = 5.0
ANSWER_MARGIN = 5.0


def node_args(database_url: str) -> list[str]:
    return ["--database-url", database_url, "--rate-limits", "off", "--subscribe-timeout", "10"]


class Cluster:
    """Nodes on one database, each with its own data dir; stopped (SIGTERM, exit 0) by
    `server_factory` at teardown."""

    def __init__(self, server_factory, database_url: str):
        self.factory = server_factory
        self.database_url = database_url

    def node(self, env: dict | None = None) -> TetherServer:
        """A node not yet started; with `env`, the database URL comes from the environment."""
        if env is not None:
            return self.factory.create(args=["--rate-limits", "off", "--subscribe-timeout", "10"],
                                       env={"TETHER_DATABASE_URL": self.database_url, **env})
        return self.factory.create(args=node_args(self.database_url))

    def start(self, count: int) -> list[TetherServer]:
        return [self.node().start() for _ in range(count)]


@pytest.fixture
def cluster(postgres_database, server_factory) -> Cluster:
    # postgres_database first: set up before the nodes, dropped after they are stopped.
    return Cluster(server_factory, postgres_database)


# ---------------------------------------------------------------------------------------------
# Publishing and checking deliveries
# ---------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    """One publish: what was sent where, and how it was answered."""
    id: str
    channel: str
    node: int
    started: float          # time.monotonic() when sent
    elapsed: float
    status: int | None      # None: no HTTP answer (connection refused, reset, ...)
    timetoken: int | None   # the acknowledged timetoken (status 200)
    body: bytes = b""
    error: str | None = None

    @property
    def acked(self) -> bool:
        return self.status == 200


class Publishers:
    """Publisher threads, one per (node, channel), each over its own keep-alive connection,
    publishing `{"id": "<node>-<channel>-<k>"}` one after another until `count` or `stop()`.
    Every publish's `Outcome` is recorded; only acknowledged ones (200) count as sent."""

    def __init__(self, nodes: list[TetherServer], channels: list[str], count: int | None, pause: float = 0.01,
                 timeout: float = 30.0):
        self.nodes = nodes
        self.channels = channels
        self.count = count
        self.pause = pause
        self.timeout = timeout
        self.lock = threading.Lock()
        self.outcomes: list[Outcome] = []
        self._stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(n, c), daemon=True, name=f"publisher-{n}-{c}")
                        for n in range(len(nodes)) for c in range(len(channels))]

    def start(self) -> "Publishers":
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        self._stop.set()
        self.join()

    def join(self, timeout: float = 60.0):
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), "a publisher thread did not finish"

    def _run(self, node_index: int, channel_index: int):
        node, channel = self.nodes[node_index], self.channels[channel_index]
        host, port = node.origin.rsplit(":", 1)
        conn = None
        k = 0
        while not self._stop.is_set() and (self.count is None or k < self.count):
            message_id = f"{node_index}-{channel_index}-{k}"
            k += 1
            started = time.monotonic()
            outcome = Outcome(message_id, channel, node_index, started, 0.0, None, None)
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(host, int(port), timeout=self.timeout)
                r = get(node.origin, publish_path(channel, {"id": message_id}), conn=conn)
                outcome.status, outcome.body = r.status, r.body
                if r.status == 200:
                    outcome.timetoken = int(r.json()[2])
            except (OSError, http.client.HTTPException) as e:
                outcome.error = repr(e)
                if conn is not None:
                    conn.close()
                conn = None
            outcome.elapsed = time.monotonic() - started
            with self.lock:
                self.outcomes.append(outcome)
            time.sleep(self.pause)
        if conn is not None:
            conn.close()

    # -- queries -------------------------------------------------------------------------------

    def snapshot(self) -> list[Outcome]:
        with self.lock:
            return list(self.outcomes)

    def acked(self, channels=None) -> dict[str, int]:
        """id -> acknowledged timetoken, for publishes on `channels` (default: all)."""
        return {o.id: o.timetoken for o in self.snapshot()
                if o.acked and (channels is None or o.channel in channels)}

    def acked_count(self, node: int | None = None, since: float = 0.0) -> int:
        return sum(1 for o in self.snapshot() if o.acked and (node is None or o.node == node) and o.started >= since)

    def failed(self, node: int | None = None, since: float = 0.0) -> list[Outcome]:
        return [o for o in self.snapshot() if not o.acked and (node is None or o.node == node) and o.started >= since]


def raw_deliveries(sub: RawSubscriber) -> list[tuple[int, str]]:
    return [(int(e["p"]["t"]), e["d"]["id"]) for e in list(sub.envelopes)]


def sdk_deliveries(collector) -> list[tuple[int, str]]:
    return [(int(m.timetoken), m.message["id"]) for m in collector.snapshot()]


def cli_deliveries(sub: CliSubscriber) -> list[tuple[int, str]]:
    """`message <timetoken> <channel> <publisher> <payload>` lines `tether subscribe` printed so far."""
    while True:
        try:
            sub.lines.append(sub._queue.get_nowait())
        except queue.Empty:
            break
    out = []
    for line in list(sub.lines):
        if line.startswith("message "):
            _, tt, _, _, payload = line.split(" ", 4)
            out.append((int(tt), json.loads(payload)["id"]))
    return out


def check_deliveries(what: str, got: list[tuple[int, str]], acked: dict[str, int], maybe: set[str] = frozenset()):
    """`got` (timetoken, id) in delivery order holds every acknowledged publish exactly once, at
    its acknowledged timetoken, in timetoken order, and nothing else but publishes whose outcome
    the publisher could not know (`maybe`: the answer was lost)."""
    ids = [i for _, i in got]
    duplicates = sorted(i for i, n in Counter(ids).items() if n > 1)
    assert not duplicates, f"{what}: delivered more than once: {duplicates[:20]}"
    missing = sorted(set(acked) - set(ids))
    assert not missing, f"{what}: {len(missing)} of {len(acked)} acknowledged publishes never delivered: {missing[:20]}"
    unexpected = sorted(set(ids) - set(acked) - set(maybe))
    assert not unexpected, f"{what}: delivered but never published or refused: {unexpected[:20]}"
    wrong = [(i, t, acked[i]) for t, i in got if i in acked and acked[i] != t]
    assert not wrong, f"{what}: delivered at another timetoken than acknowledged (id, got, acked): {wrong[:20]}"
    tts = [t for t, _ in got]
    out_of_order = [(a, b) for a, b in zip(got, got[1:]) if b[0] < a[0]]
    assert tts == sorted(tts), f"{what}: not in timetoken order: {out_of_order[:10]}"


def wait_delivered(what: str, deliveries, acked: dict[str, int], timeout: float = 30.0):
    def done():
        return set(acked) <= {i for _, i in deliveries()}
    try:
        wait_until(done, timeout, interval=0.05, what=f"{what}: every acknowledged publish")
    except AssertionError as e:
        missing = sorted(set(acked) - {i for _, i in deliveries()})
        raise AssertionError(f"{e}; {len(missing)} missing: {missing[:20]}") from None


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------

def test_publish_on_any_node_reaches_subscribers_on_every_node(cluster):
    nodes = cluster.start(3)
    channel = unique("cluster")
    raw = [RawSubscriber(n.origin, f"raw-{i}", channels=[channel]).start() for i, n in enumerate(nodes)]
    cli = [CliSubscriber(channel, "--origin", n.origin, "--transport", "websocket", "--policy", "linear",
                         "--user-id", f"ws-{i}") for i, n in enumerate(nodes)]
    try:
        with threaded_clients(DEMO_KEYSET) as make:
            sdk = [start_subscription(make(n.origin, f"sdk-{i}"), [channel]) for i, n in enumerate(nodes)]
            for c in sdk:
                c.wait_connected(timeout=20)
            for s in cli:
                s.wait_for(lambda line: line.startswith("status connected"))

            # Publishers on every node at once: commits from three nodes interleave.
            publishers = Publishers(nodes, [channel], count=20, pause=0.005).start()
            publishers.join()
            assert not publishers.failed(), publishers.failed()[:5]
            acked = publishers.acked()
            assert len(acked) == 60

            subscribers = ([(f"raw long-poll on node {i}", lambda s=s: raw_deliveries(s)) for i, s in enumerate(raw)]
                           + [(f"SDK on node {i}", lambda c=c: sdk_deliveries(c)) for i, c in enumerate(sdk)]
                           + [(f"tether subscribe (WebSocket) on node {i}", lambda s=s: cli_deliveries(s))
                              for i, s in enumerate(cli)])
            for what, deliveries in subscribers:
                wait_delivered(what, deliveries, acked)
            for what, deliveries in subscribers:
                check_deliveries(what, deliveries(), acked)
    finally:
        for s in raw:
            s.stop()
        for s in cli:
            s.stop()


def test_sigkill_mid_burst_loses_no_acknowledged_publish(cluster):
    a, b, c = nodes = cluster.start(3)
    channels = [unique("burst0"), unique("burst1"), unique("burst2")]
    # Subscribers on the two nodes that survive: one per channel on the first two channels, and
    # one spanning all three.
    raw = {}
    for name, node in (("a", a), ("b", b)):
        raw[f"raw {channels[0]} on {name}"] = (RawSubscriber(node.origin, f"raw0-{name}", channels=[channels[0]]),
                                              {channels[0]})
        raw[f"raw {channels[1]} on {name}"] = (RawSubscriber(node.origin, f"raw1-{name}", channels=[channels[1]]),
                                              {channels[1]})
        raw[f"raw spanning on {name}"] = (RawSubscriber(node.origin, f"rawall-{name}", channels=channels),
                                          set(channels))
    # A long-poll subscriber on the node that is killed: it moves to A with its cursor.
    mover = RawSubscriber(c.origin, "mover", channels=channels)
    try:
        for sub, _ in raw.values():
            sub.start()
        mover.start()
        with threaded_clients(DEMO_KEYSET) as make:
            sdk = {"SDK spanning on a": (start_subscription(make(a.origin, "sdk-a"), channels), set(channels)),
                   f"SDK {channels[2]} on b": (start_subscription(make(b.origin, "sdk-b"), [channels[2]]),
                                              {channels[2]})}
            for collector, _ in sdk.values():
                collector.wait_connected(timeout=20)

            publishers = Publishers(nodes, channels, count=40, pause=0.01).start()
            wait_until(lambda: publishers.acked_count(node=2) >= 15 and publishers.acked_count() >= 90, 30,
                       what="a third of the burst acknowledged, some of it by node C")
            assert c.kill() == -9
            killed_at = time.monotonic()
            publishers.join()

            # Node C's publishers record failures; A and B keep answering every publish.
            assert not publishers.failed(node=0) and not publishers.failed(node=1), \
                (publishers.failed(node=0) + publishers.failed(node=1))[:5]
            assert publishers.failed(node=2, since=killed_at), "no publish to the killed node failed"
            assert all(o.status is None for o in publishers.failed(node=2)), publishers.failed(node=2)[:5]
            # A publish in flight when C died may or may not be committed: its answer was lost.
            # One refused at connect never reached C.
            maybe = {o.id for o in publishers.failed(node=2) if "ConnectionRefused" not in (o.error or "")}

            # The long-poll subscriber of node C continues on A from its last cursor.
            mover.drop()
            cursor = int(mover.tt)
            before_move = len(mover.envelopes)
            mover.origin = a.origin
            mover.resume()

            checks = {**{what: (lambda s=s: raw_deliveries(s), chs) for what, (s, chs) in raw.items()},
                      **{what: (lambda col=col: sdk_deliveries(col), chs) for what, (col, chs) in sdk.items()},
                      "raw spanning, moved from the killed node to a": (lambda: raw_deliveries(mover), set(channels))}
            for what, (deliveries, chs) in checks.items():
                wait_delivered(what, deliveries, publishers.acked(chs))
            for what, (deliveries, chs) in checks.items():
                check_deliveries(what, deliveries(), publishers.acked(chs), maybe)

            # The global-cursor rule, said directly: after the move, the subscriber got every
            # acknowledged publish above its cursor, and nothing at or below it.
            after_move = [(int(e["p"]["t"]), e["d"]["id"]) for e in mover.envelopes[before_move:]]
            above = {i: t for i, t in publishers.acked().items() if t > cursor}
            assert set(above) <= {i for _, i in after_move}, sorted(set(above) - {i for _, i in after_move})[:20]
            assert all(t > cursor for t, _ in after_move), [x for x in after_move if x[0] <= cursor][:10]
    finally:
        for sub, _ in raw.values():
            sub.stop()
        mover.stop()


def test_a_subscriber_moves_nodes_with_its_cursor(cluster):
    a, b = cluster.start(2)
    c = cluster.node(env={}).start()  # the database URL from TETHER_DATABASE_URL
    channel = unique("move")
    # On A: a long-poll from the handshake's cursor, answered by a publish on B.
    t0 = subscribe_raw(a.origin, channel, 0).json()["t"]["t"]
    # A handshake answers the current cursor, also on a cluster where nothing was published yet
    # (a 0 would make the next poll another handshake, which skips what was published between).
    assert int(t0) > 0, f"the handshake on a fresh cluster answered cursor {t0}"
    first = publish(b.origin, channel, {"id": "first"})
    r = subscribe_raw(a.origin, channel, t0, timeout=30)
    assert [(e["d"]["id"], int(e["p"]["t"])) for e in r.json()["m"]] == [("first", first)], r
    cursor = r.json()["t"]["t"]

    acked = {}
    for k in range(20):
        node = (b, c)[k % 2]
        acked[f"m{k}"] = publish(node.origin, channel, {"id": f"m{k}"})

    # The same cursor on node C: everything after it, nothing before.
    got, tt = [], cursor
    deadline = time.monotonic() + 30
    while len(got) < len(acked) and time.monotonic() < deadline:
        body = subscribe_raw(c.origin, channel, tt, timeout=30).json()
        got += [(int(e["p"]["t"]), e["d"]["id"]) for e in body["m"]]
        tt = body["t"]["t"]
    check_deliveries("raw long-poll moved from A to C", got, acked)

    # And the PubNub SDK, resuming from that cursor on C.
    with threaded_clients(DEMO_KEYSET) as make:
        collector = start_subscription(make(c.origin, "sdk-mover"), [channel], with_timetoken=int(cursor))
        wait_delivered("SDK moved from A to C", lambda: sdk_deliveries(collector), acked)
        check_deliveries("SDK moved from A to C", sdk_deliveries(collector), acked)


@pytest.fixture
def restart_cluster(private_postgres, server_factory) -> Cluster:
    # private_postgres first: started before the nodes, stopped after them.
    return Cluster(server_factory, private_postgres.url)


def test_postgres_restart_under_load(private_postgres, restart_cluster):
    nodes = restart_cluster.start(2)
    channels = [unique("pg-restart0"), unique("pg-restart1")]
    publishers = Publishers(nodes, channels, count=None, pause=0.02,
                            timeout=STORE_WRITE_TIMEOUT + ANSWER_MARGIN + 10).start()
    try:
        wait_until(lambda: all(publishers.acked_count(node=i) >= 10 for i in range(2)), 30,
                   what="publishes acknowledged on both nodes before the restart")
        down_at = time.monotonic()
        private_postgres.stop()
        # While PostgreSQL is down, publishes on every node are answered with an error.
        wait_until(lambda: all(len(publishers.failed(node=i, since=down_at)) >= 2 for i in range(2)),
                   STORE_WRITE_TIMEOUT + ANSWER_MARGIN + 15, interval=0.1,
                   what="failed publishes on both nodes while PostgreSQL is down")
        private_postgres.start()  # same port, same data
        up_at = time.monotonic()
        try:
            wait_until(lambda: all(publishers.acked_count(node=i, since=up_at) >= 5 for i in range(2)), 40,
                       interval=0.1, what="acknowledged publishes on both nodes after PostgreSQL came back")
        except AssertionError as e:
            since = [Counter(o.status for o in publishers.snapshot() if o.node == i and o.started >= up_at)
                     for i in range(2)]
            raise AssertionError(f"{e}; answers per node since the restart: {since}") from None
    finally:
        publishers.stop()

    outcomes = publishers.snapshot()
    # Never a dropped connection or a hang: an HTTP answer within the store write timeout.
    no_answer = [o for o in outcomes if o.status is None]
    assert not no_answer, no_answer[:5]
    slow = [o for o in outcomes if o.elapsed > STORE_WRITE_TIMEOUT + ANSWER_MARGIN]
    assert not slow, [(o.id, o.status, round(o.elapsed, 2)) for o in slow[:10]]
    # A refusal is a 5xx with PubNub's publish error array.
    failures = [o for o in outcomes if not o.acked]
    assert failures
    for o in failures:
        assert 500 <= o.status < 600, o
        body = json.loads(o.body)
        assert isinstance(body, list) and body[0] == 0 and isinstance(body[1], str) and body[1], o
    # Nothing acknowledged is lost; nothing answered 503 ("not stored") is stored.
    for node in nodes:
        for channel in channels:
            acked = publishers.acked([channel])
            stored = [(int(m["timetoken"]), m["message"]["id"]) for m in fetch_all(node.origin, channel)]
            maybe = {o.id for o in failures if o.channel == channel and o.status != 503}
            check_deliveries(f"history of {channel} on node {node.origin}", stored, acked, maybe)


def test_old_schema_is_migrated_or_refused(cluster):
    url = cluster.database_url
    # A fresh database is "version 0": the first node creates and migrates the schema.
    node = cluster.node().start()
    channel = unique("schema")
    tt = publish(node.origin, channel, {"id": "before"})
    assert node.stop() == 0
    versions = [int(v) for v in psql(url, f"SELECT version FROM {MIGRATIONS_TABLE} ORDER BY version").split()]
    assert versions and versions == sorted(set(versions)), versions
    current = versions[-1]

    # A database migrated by a newer Tether: refused, with both versions named.
    psql(url, f"UPDATE {MIGRATIONS_TABLE} SET version = 9999 WHERE version = {current}")
    with pytest.raises(AssertionError, match="before ready") as refused:
        node.start()
    assert node.proc.returncode not in (0, None), node.proc.returncode
    # What the node said on this start (the log after the start line, which shows the URL).
    said = node.log_text().rsplit("\n=== start #", 1)[-1].split("\n", 1)[-1]
    assert re.search(r"\b9999\b", said) and re.search(rf"\b{current}\b", said), (current, said, refused.value)
    assert "schema" in said.lower() or "migration" in said.lower(), said

    # Put back, the same node starts and has what it stored.
    psql(url, f"UPDATE {MIGRATIONS_TABLE} SET version = {current} WHERE version = 9999")
    node.start()
    assert [(int(m["timetoken"]), m["message"]["id"]) for m in fetch_all(node.origin, channel)] == [(tt, "before")]


def test_several_nodes_migrate_a_fresh_database_at_once(cluster):
    nodes = [cluster.node() for _ in range(3)]
    with ThreadPoolExecutor(len(nodes)) as pool:
        list(pool.map(lambda n: n.start(timeout=60), nodes))
    versions = [int(v) for v in psql(cluster.database_url,
                                     f"SELECT version FROM {MIGRATIONS_TABLE} ORDER BY version").split()]
    assert versions and len(versions) == len(set(versions)), versions
    channel = unique("migrated")
    tts = [publish(n.origin, channel, {"id": f"from-{i}"}) for i, n in enumerate(nodes)]
    for n in nodes:
        stored = [(int(m["timetoken"]), m["message"]["id"]) for m in fetch_all(n.origin, channel)]
        check_deliveries(f"history on {n.origin}", stored, {f"from-{i}": t for i, t in enumerate(tts)})


def test_presence_of_a_killed_node_times_out_once_on_the_others(cluster, tmp_path):
    """Issue #19 point 4 with real processes: heartbeats on any node count once in here-now on
    every node; after SIGKILL of the node they were sent to, the occupant times out once the
    timeout passes — one timeout event, seen by presence subscribers on both surviving nodes —
    and here-now on every surviving node is right."""
    from helpers import heartbeat_raw, occupants_raw, where_now_raw, write_config
    config = write_config(str(tmp_path), presenceMinimumTimeoutSeconds=2)
    args = node_args(cluster.database_url) + ["--config", config]
    nodes = [cluster.factory.create(args=args).start() for _ in range(3)]
    channel = unique("cluster-presence")
    # Presence subscribers on the two nodes that survive, from a cursor before the join.
    cursors = [subscribe_raw(n.origin, f"{channel}-pnpres", 0).json()["t"]["t"] for n in nodes[:2]]
    events: list[list[dict]] = [[], []]
    stop = threading.Event()

    def follow(i: int) -> None:
        cursor = cursors[i]
        while not stop.is_set():
            body = subscribe_raw(nodes[i].origin, f"{channel}-pnpres", cursor, timeout=15).json()
            events[i].extend(m["d"] for m in body["m"])
            cursor = body["t"]["t"]

    threads = [threading.Thread(target=follow, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    # The same uuid heartbeats on node C, then on node B: one join.
    heartbeat_raw(nodes[2].origin, channel, "walker", heartbeat=3)
    heartbeat_raw(nodes[1].origin, channel, "walker", heartbeat=3)
    heartbeat_raw(nodes[2].origin, channel, "sitter", heartbeat=3)
    for n in nodes:
        assert occupants_raw(n.origin, channel) == ["sitter", "walker"]
        assert where_now_raw(n.origin, "walker") == [channel]
    # `walker` keeps heartbeating on A; `sitter` only ever talked to C, which dies.
    nodes[2].kill()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and occupants_raw(nodes[0].origin, channel) != ["walker"]:
        heartbeat_raw(nodes[0].origin, channel, "walker", heartbeat=3)
        time.sleep(0.5)
    for n in nodes[:2]:
        assert occupants_raw(n.origin, channel) == ["walker"]
        assert where_now_raw(n.origin, "sitter") == []
    wait_until(lambda: all(any(e.get("action") == "timeout" for e in ev) for ev in events), 20,
               what="the timeout event on both surviving nodes")
    time.sleep(1)  # a second sweep on each node would announce a second timeout
    stop.set()
    for ev in events:
        actions = [(e.get("action"), e.get("uuid")) for e in ev]
        assert actions.count(("join", "walker")) == 1, actions
        assert actions.count(("join", "sitter")) == 1, actions
        assert actions.count(("timeout", "sitter")) == 1, actions
        assert ("timeout", "walker") not in actions, actions
