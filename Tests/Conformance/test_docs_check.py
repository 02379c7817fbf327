"""scripts/check-docs can fail: a guide that shows a missing option, an unknown subcommand, a
JSON answer of the wrong shape is reported with its file and line."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import TETHER_BIN

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECK = os.path.join(ROOT, "scripts", "check-docs")


def run_check(tmp_path, text: str) -> subprocess.CompletedProcess:
    guide = tmp_path / "guide.md"
    guide.write_text(text)
    return subprocess.run([sys.executable, CHECK, "--bin", TETHER_BIN, str(guide)],
                          capture_output=True, text=True, timeout=300)


def test_a_guide_that_matches_the_code_passes(tmp_path):
    out = run_check(tmp_path, "```sh\n"
                              "tether bench --scenario fanout --subscribers 100\n"
                              "curl 'http://127.0.0.1:8090/publish/demo/demo/0/chat/0/1?uuid=bob'\n"
                              '# [1,"Sent","17953346633983450"]\n'
                              "```\n")
    assert out.returncode == 0, out.stderr
    assert "1 commands ran, 1 command lines checked" in out.stdout


def test_each_kind_of_stale_line_is_reported(tmp_path):
    out = run_check(tmp_path, "Intro.\n\n```sh\n"
                              "tether bench --no-such-option 3\n"
                              "tether no-such-command\n"
                              "curl 'http://127.0.0.1:8090/time/0'\n"
                              '# {"t": 1}\n'
                              "```\n")
    assert out.returncode == 1
    assert "guide.md:4: tether bench --no-such-option 3" in out.stderr
    assert "not options of `tether bench`: --no-such-option" in out.stderr
    assert "has no subcommand `no-such-command`" in out.stderr
    assert "the guide shows {\"t\": 1}" in out.stderr
    assert "3 failures" in out.stdout
