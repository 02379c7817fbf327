"""`tether bench` still runs, at a toy size: each scenario spawns its own server, drives it over
loopback and checks what it measured (every message delivered exactly once, here-now occupancy).
The figures themselves are for docs/benchmarks.md, measured on a quiet machine, not here."""

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


def test_fanout_delivers_every_message_exactly_once_in_order():
    out = bench("--scenario", "fanout", "--duration", "2", "--subscribers", "5", "--publishers", "2")
    row = next(line for line in out.splitlines() if re.match(r"^\s+5\s", line))
    # subscribers, publishes/s, deliveries/s, while publishing, msgs/response, drain, missing, dup, out-of-order, errors
    fields = row.split()
    assert fields[6:10] == ["0", "0", "0", "0"], row


def test_presence_scenario_checks_occupancy_and_reports_idle_cpu():
    out = bench("--scenario", "presence", "--uuids", "300", "--channels", "30", "--here-now-occupancy", "50",
                "--here-now-requests", "20", "--idle-seconds", "2")
    assert "occupancy 50 checked" in out
    assert "300 present on 30 channels (checked)" in out
    assert re.search(r"bytes per present uuid", out)
    assert re.search(r"target: idle CPU under 2% of a core", out)


def test_publish_dedup_scenario_reports_both_figures():
    out = bench("--scenario", "publish-dedup", "--duration", "1", "--subscribers", "2", "--publishers", "2",
                "--dedup-rounds", "1")
    assert re.search(r"without request ids: [\d,]+ publishes/s", out), out
    assert re.search(r"with request ids: +[\d,]+ publishes/s", out), out
    assert re.search(r"cost of the check: -?[\d.]+ % of publish throughput.*missing 0, duplicates 0, publish errors 0", out), out


def test_fanout_over_many_channels_delivers_each_subscriber_its_channel_exactly_once():
    # 6 subscribers on 3 channels, publishes round-robin: each subscriber must have exactly the
    # messages of its own channel (missing, duplicates and out-of-order all 0).
    out = bench("--scenario", "fanout", "--duration", "2", "--subscribers", "6", "--fanout-channels", "3", "--publishers", "2")
    assert "3 channels (round-robin)" in out, out
    row = next(line for line in out.splitlines() if re.match(r"^\s+6\s", line))
    assert row.split()[6:10] == ["0", "0", "0", "0"], row
    assert re.search(r"µs/request", out), out


def test_requests_scenario_reports_the_server_cpu_per_request_of_each_kind():
    out = bench("--scenario", "requests", "--duration", "1", "--publishers", "2", "--request-rounds", "1")
    rows = {}
    # subscribe-one and floor: an answer that does not carry exactly one message counts as an error.
    for kind in ("floor", "time", "publish-realtime", "publish-stored", "subscribe-one"):
        row = next(line for line in out.splitlines() if line.strip().startswith(kind + " "))
        fields = row.split()
        # kind, connections, runs, requests/s, µs/request, µs above the floor, the runs' µs, errors
        assert fields[1] == "2" and fields[2] == "1", row
        assert float(fields[4]) > 0, row
        assert fields[-1] == "0", row
        rows[kind] = fields
    floor = float(rows["floor"][4])
    assert rows["floor"][5] == "-", rows["floor"]
    for kind in ("time", "publish-realtime", "publish-stored", "subscribe-one"):
        # The column is the kind's median minus the floor's, as printed (one decimal each).
        assert abs(float(rows[kind][5]) - (float(rows[kind][4]) - floor)) < 0.15, rows[kind]
    assert re.search(r"floor: [\d.]+ µs — `tether bench floor-server`", out), out
    assert "goal (#16): a stored publish ≤ 15 µs of server CPU" in out
    assert "goal (#16): a subscribe cycle returning one message ≤ 15 µs" in out


def test_floor_server_answers_every_request_with_a_subscribe_answer_until_stopped():
    """`tether bench floor-server`: listens, answers any path with the subscribe-one answer's bytes
    (status, headers, one message), keeps the connection alive, and exits on SIGTERM."""
    import http.client
    import json
    import signal

    proc = subprocess.Popen([TETHER_BIN, "bench", "floor-server", "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        match = re.match(r"Tether listening on http://127\.0\.0\.1:(\d+)$", line.strip())
        assert match, line
        conn = http.client.HTTPConnection("127.0.0.1", int(match.group(1)), timeout=10)
        for path in ("/v2/subscribe/demo/ch1/0?tt=17957854125496650&tr=1&uuid=u1", "/time/0", "/anything"):
            conn.request("GET", path)
            response = conn.getresponse()
            body = response.read()
            assert response.status == 200
            assert response.getheader("Content-Type") == 'text/javascript; charset="UTF-8"'
            assert int(response.getheader("Content-Length")) == len(body) == 137
            assert re.match(r"\w{3}, \d{2} \w{3} \d{4} \d{2}:\d{2}:\d{2} GMT$", response.getheader("Date"))
            answer = json.loads(body)
            assert len(answer["m"]) == 1 and answer["m"][0]["c"] == "ch1", answer
        conn.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_requests_scenario_against_a_server_elsewhere_skips_the_floor_and_says_so(server):
    out = bench("--scenario", "requests", "--url", server.base_url, "--request-kinds", "floor,time", "--duration", "1",
                "--publishers", "2", "--request-rounds", "1")
    assert not any(line.strip().startswith("floor ") for line in out.splitlines()), out
    row = next(line for line in out.splitlines() if line.strip().startswith("time "))
    # No server CPU without a spawned server, and nothing to subtract.
    assert row.split()[4:6] == ["-", "-"], row
    assert "requests: floor not measured" in out, out


def test_recorder_scenario_reports_the_cost_per_publish_with_and_without_the_console():
    out = bench("--scenario", "recorder", "--subscribers", "3", "--recorder-clients", "50", "--recorder-iterations", "200",
                "--recorder-repetitions", "1")
    assert re.search(r"console on: +\d+ ns per publish-equivalent", out), out
    assert re.search(r"console off: +\d+ ns per publish-equivalent", out), out
    assert re.search(r"1 publish \+ 3 × start and end = 7 hook calls", out), out
    assert "50 uuids recorded" in out, out


def test_console_cost_scenario_compares_server_cpu_per_publish():
    out = bench("--scenario", "console-cost", "--duration", "1", "--subscribers", "2", "--publishers", "2", "--rounds", "2",
                "--recorder-clients", "20", "--recorder-iterations", "100", "--recorder-repetitions", "1")
    assert re.search(r"server CPU µs/publish, off: [\d.]+, [\d.]+", out), out
    assert re.search(r"server CPU µs/publish, on: +[\d.]+, [\d.]+", out), out
    assert re.search(r"on − off: mean -?[\d.]+ µs \(-?[\d.]+ %\), median -?[\d.]+ µs, 95 % CI \[-?[\d.]+, -?[\d.]+\]", out), out
    assert re.search(r"missing 0, duplicates 0, out of order 0, publish errors 0", out), out
    assert re.search(r"overhead as run: [\d.]+ subscribe cycles per publish .*→ -?[\d.]+ % of the server's CPU per publish "
                     r"\(goal < 2 %: (met|NOT met)\)", out), out
    assert re.search(r"over-estimate: recorder -?\d+ ns per publish-equivalent", out), out


def test_cluster_scenario_checks_every_delivery_across_nodes(postgres_database):
    """SQLite baseline and two nodes on one PostgreSQL, at a toy size: every delivery checked."""
    import json
    out = bench("--scenario", "cluster", "--database-url", postgres_database, "--cluster-nodes", "0,2",
                "--duration", "2", "--warmup", "1", "--rate", "100", "--cluster-subscribers", "4",
                "--cluster-publishers", "2", "--json")
    results = json.loads(out)["cluster"]
    assert [(r["store"], r["nodes"]) for r in results] == [("sqlite", 1), ("postgres", 2)]
    for r in results:
        assert (r["lost"], r["duplicates"], r["outOfOrder"], r["publishErrors"]) == (0, 0, 0, 0), r
        assert r["pacedPublished"] > 0 and r["publishesPerSecond"] > 0, r
        assert len(r["nodeCPUPercent"]) == r["nodes"], r


@pytest.mark.parametrize("args, says", [
    (["--cluster-nodes", "0,17"], "--cluster-nodes"),
    (["--cluster-nodes", "two"], "--cluster-nodes"),
    (["--cluster-nodes", "0,,1"], "--cluster-nodes"),
    (["--cluster-nodes", "1"], "--database-url"),
    (["--cluster-nodes", "1", "--database-url", "mysql://u@h/db"], "--database-url"),
    (["--cluster-nodes", "0", "--cluster-subscribers", "0"], "--cluster-subscribers"),
    (["--cluster-nodes", "0", "--cluster-subscribers", "99999999999"], "--cluster-subscribers"),
    (["--cluster-nodes", "0", "--cluster-publishers", "-1"], "--cluster-publishers"),
    (["--cluster-nodes", "0", "--rate", "0"], "--rate"),
])
def test_cluster_scenario_refuses_hostile_options(args, says):
    proc = subprocess.run([TETHER_BIN, "bench", "--scenario", "cluster", *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0, proc.stdout
    assert says in proc.stderr, proc.stderr
