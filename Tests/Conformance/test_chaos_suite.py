"""Issue 7: the resilience suite, time-compressed (`tether chaos suite --quick`).

Every scenario of docs/resilience.md runs against real `tether serve` processes with Tether's SDK
(`tether chaos probe`) and the PubNub Python SDK, threaded and asyncio (this interpreter), side by
side. Tether's SDK must lose, duplicate and reorder nothing and catch up in every scenario, and
be caught up within about a second wherever nothing but the network stood in the way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(1000)

from helpers import TETHER_BIN

# Scenarios where only the network stood in the way: the quick reconnection and the network
# monitor should have Tether's SDK caught up within about a second of the fault's end. (Not
# here: overload, where the server's Retry-After decides, and a restored grant, found by the
# 10 s re-check.)
PROMPT = {"tunnel", "wifi-to-cellular", "server-restart", "server-down", "captive-portal", "slow-link", "outage-backlog",
          "reconnection-storm"}
# Bound for the others in the compressed run (Retry-After, back-off, access re-checks).
EVENTUAL_SECONDS = 15.0


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    work = tmp_path_factory.mktemp("chaos")
    out = work / "results.json"
    proc = subprocess.run(
        [TETHER_BIN, "chaos", "suite", "--quick", "--python", sys.executable, "--json", str(out),
         "--markdown", str(work / "table.md"), "--work-dir", str(work / "runs")],
        capture_output=True, text=True, timeout=900)
    assert out.exists(), f"no results; exit {proc.returncode}\n{proc.stderr[-3000:]}"
    results = json.loads(out.read_text())
    return proc, results, (work / "table.md").read_text()


def rows(results, sdk):
    return {r["scenario"]: r for r in results if r["sdk"] == sdk}


def test_every_scenario_ran_for_every_sdk(suite):
    _, results, table = suite
    scenarios = {r["scenario"] for r in results}
    assert scenarios == {"tunnel", "wifi-to-cellular", "server-restart", "server-down", "captive-portal", "grant-revoked",
                         "overload", "slow-link", "outage-backlog", "reconnection-storm", "publisher-flapping"}
    for sdk in ("tether", "pubnub-threaded", "pubnub-asyncio"):
        mine = rows(results, sdk)
        assert set(mine) == scenarios, sdk
        for name, row in mine.items():
            note = row.get("note")
            if name == "wifi-to-cellular" and note and note.startswith("skipped"):
                continue  # no network namespaces on this machine (the note says why)
            if name == "publisher-flapping" and sdk == "pubnub-asyncio":
                assert note and note.startswith("skipped"), row  # the threaded SDK publishes for PubNub
                continue
            if name == "publisher-flapping":
                assert note is None, f"{sdk} {name}: {note}"
                continue
            assert note is None, f"{sdk} {name}: {note}"
            assert row["notConnected"] == 0, f"{sdk} {name}: clients never connected"
    assert "| Tunnel (blackhole 30 s) | Tether Swift SDK |" in table


def test_tether_sdk_loses_duplicates_and_reorders_nothing_and_catches_up(suite):
    proc, results, _ = suite
    for name, row in rows(results, "tether").items():
        if (row.get("note") or "").startswith("skipped") or name == "publisher-flapping":
            continue
        assert (row["lost"], row["duplicated"], row["outOfOrder"]) == (0, 0, 0), f"{name}: {row}"
        assert row["caughtUpClients"] == row["clients"], f"{name}: {row}"
        limit = 1.5 if name in PROMPT else EVENTUAL_SECONDS
        assert row["caughtUpMax"] <= limit, f"{name}: caught up after {row['caughtUpMax']} s (limit {limit} s)"
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_storm_every_client_recovers_and_the_server_stays_up(suite):
    _, results, _ = suite
    for sdk in ("tether", "pubnub-threaded", "pubnub-asyncio"):
        row = rows(results, sdk)["reconnection-storm"]
        assert row["clients"] > 1
        assert row.get("note") is None, row  # "the server was not running at the end" would be here
        assert row["caughtUpClients"] == row["clients"], f"{sdk}: {row}"


def test_statuses_are_reported_once_per_outage(suite):
    _, results, _ = suite
    tether = rows(results, "tether")
    assert tether["server-restart"]["statuses"] == ["unexpectedDisconnect", "reconnected"]
    assert tether["tunnel"]["statuses"] == []  # bytes held, nothing lost: nothing to report
    assert tether["grant-revoked"]["statuses"][0] == "accessDenied"
    assert tether["grant-revoked"]["statuses"][-1] == "reconnected"


def test_the_measurement_can_fail(suite):
    """The counters are not vacuous: the PubNub asyncio SDK replays its last page after a
    reconnect (it resumes from its previous cursor), and the suite counts those duplicates."""
    _, results, _ = suite
    duplicated = sum(r["duplicated"] for r in results if r["sdk"] == "pubnub-asyncio" and r.get("note") is None)
    assert duplicated > 0


def test_publisher_side_tether_stores_every_message_once_in_order(suite):
    """Issue 15: N publishes over a flapping link (responses dropped after the server stored
    the message, resets, blackholes) and a server restart. Tether's outbox retries with one
    request id per message and the server deduplicates: every message stored exactly once, in
    send order, nothing failed; some retries were answered as repeats."""
    proc, results, table = suite
    row = rows(results, "tether")["publisher-flapping"]
    counts = row["publishing"]
    assert counts["published"] >= 30
    assert counts["stored"] == counts["published"], counts
    assert (counts["duplicated"], counts["lostSilently"], counts["failedVisibly"], counts["outOfOrder"]) == (0, 0, 0, 0), counts
    assert "Publisher side:" in table
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_publisher_side_counts_can_fail(suite):
    """The same faults cost the PubNub Python SDK with an app-level resend: a publish whose
    answer was dropped after the server stored it is stored again by the resend. The counters
    see it (duplicates, or failures when every attempt fell in a fault)."""
    _, results, _ = suite
    counts = rows(results, "pubnub-threaded")["publisher-flapping"]["publishing"]
    assert counts["published"] >= 30
    assert counts["duplicated"] + counts["failedVisibly"] + counts["lostSilently"] > 0, counts
