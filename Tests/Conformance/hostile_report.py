"""Prints docs/security.md's "Hostile input" table from the summary test_hostile_routes.py writes.

Usage: python hostile_report.py [summary.json]   (default: .build/hostile-report.json)
Run through `scripts/hostile-report`, which produces the summary first.
"""

from __future__ import annotations

import json
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def swift_constant(path: str, pattern: str) -> str:
    """A constant's value from a Swift source, e.g. `maxURIBytes: Int = 32 * 1024` -> "32768"."""
    text = open(os.path.join(ROOT, path)).read()
    m = re.search(pattern, text)
    assert m, f"{pattern} not found in {path}"
    expr = m.group(1).replace("_", "")
    assert re.fullmatch(r"[0-9 *+]+", expr), expr
    return f"{eval(expr):,}"  # digits and * only, checked above


def bounds_text(summary: dict) -> dict[str, str]:
    b = summary["bounds"]

    def r(name):
        k, lo, hi = b[name]["kind"], b[name]["low"], b[name]["high"]
        return f"`{name}` {lo:,}…{hi:,}"

    uri = swift_constant("Sources/TetherServer/Keyset.swift", r"maxURIBytes: Int = ([0-9_ *]+)")
    message = swift_constant("Sources/TetherServer/Keyset.swift", r"maxMessageBytes: Int = ([0-9_ *]+)")
    depth = swift_constant("Sources/TetherProtocol/JSONText.swift", r"maximumDepth = ([0-9_]+)")
    name = swift_constant("Sources/TetherProtocol/ChannelName.swift", r"maximumNameLength = ([0-9_]+)")
    numbers = ", ".join(r(n) for n in ("sequence", "heartbeatSeconds", "historyCount", "fetchMax", "hereNowLimit",
                                       "grantTTLMinutes"))
    return {
        "boundary": "the parameter's `ParameterBounds` range (table above); integers ≤ 20 characters, timetokens "
                    "≤ 17 digits",
        "huge": f"`ParameterBounds`: {numbers}, `publishTTLHours` 0…876,000 h; timetokens ≤ 17 digits "
                "(`Timetoken.maximumAccepted`); integers ≤ 20 characters, never converted past `Int`",
        "negative": "every `ParameterBounds` range starts at 0 or 1; `-` is never part of a timetoken or decimal",
        "zero": "in range where the range starts at 0 (`heartbeat`, `limit`, `offset`, `ttl`, `tt`); "
                "`count`/`max` start at 1",
        "nan": "`WireRequest.decimal`: ASCII digits and one `.` only, finite; integers: digits only",
        "inf": "as NaN",
        "non-numeric": "ASCII digits (integers: one leading `-`) only — no `+`, spaces, exponents or hex",
        "empty": "absent: the parameter's default applies (an empty path segment routes elsewhere: 404)",
        "very-long": f"integers 20 characters, decimals 32, timetokens 17; names `NameRules.maximumNameLength` = {name}; "
                     f"URI `Limits.maxURIBytes` = {uri} → 414",
        "invalid-utf8": "`PercentCoding.decode`: not UTF-8 → 400 `Could Not Parse Request` before routing",
        "raw-bytes": "HTTP parser / `PercentCoding`: 400 before routing",
        "bad-percent": "`PercentCoding.decode`: malformed escape → 400 before routing",
        "control": "`NameRules`: no U+0000–U+001F or U+007F in names and uuids; free text is JSON-escaped",
        "deep-json": f"`JSONText.maximumDepth` = {depth} (`meta`, `state`, messages); `filter-expr` has its own grammar",
        "duplicated": "a repeated key keeps its last value (`WireRequest.query`), then the same bounds",
        "body": f"`Limits.maxMessageBytes` = {message} → 413 (4× that raw before inflating); grant body 64 KiB → 413; "
                f"JSON validated by `JSONText` (depth {depth}) or Foundation's decoder (depth 512) for grants",
    }


CLASS_LABELS = {
    "boundary": "Range ends of numeric parameters (low, high, one step past each; zero-padded to 20/21 characters)",
    "huge": "Huge numbers (`99999999999999999999999999999`, `2^63`, 18 digits)",
    "negative": "Negative (`-1`, `-2^63`, `-0.5`)",
    "zero": "Zero (`0`, `-0`, `0.0`)",
    "nan": "NaN (`NaN`, `nan`)",
    "inf": "Infinity (`inf`, `-Infinity`)",
    "non-numeric": "Non-numeric (`abc`, `0x10`, `1e3`, `+1`)",
    "empty": "Empty (`p=`)",
    "very-long": "Very long (3,000 digits, 6,000 letters)",
    "invalid-utf8": "Invalid UTF-8, percent-encoded (`%C3%28`, `%ED%A0%80`)",
    "raw-bytes": "Raw non-UTF-8 bytes in the request line (`\\xff\\xfe`)",
    "bad-percent": "Bad percent-encoding (`%zz`, `%`, `%2`)",
    "control": "Control characters (`%00`, `%0D%0A`)",
    "deep-json": "Deep JSON (1,000 nested arrays; 65 nested objects)",
    "duplicated": "Duplicated parameter (baseline + hostile, both orders)",
}


def answers(entry: dict) -> str:
    statuses = " · ".join(f"{s} ×{n:,}" for s, n in sorted(entry["statuses"].items(), key=lambda kv: -kv[1]))
    shapes = ", ".join(f"{s} {n:,}" for s, n in sorted(entry["shapes"].items(), key=lambda kv: -kv[1]))
    return f"{statuses} ({shapes})"


def numeric(entry: dict) -> str:
    """`in range → 200 ×n` / `outside → 400 ×n` for the numeric parameters that reached a handler."""
    parts = []
    for key, n in sorted(entry.get("numeric", {}).items()):
        verdict, status = key.rsplit(" ", 1)
        parts.append(f"{verdict} → {status} ×{n:,}")
    return " · ".join(parts) or "—"


def main(path: str) -> int:
    summary = json.load(open(path))
    bounds = bounds_text(summary)
    print(f"{summary['requests']:,} requests over {len(summary['routes'])} routes, every parameter, both keysets "
          f"(open and secret-key, signed), in {summary['elapsed_seconds']} s; wrong answers: {summary['failures']}.\n")
    print("| Class of input | Cases | Answers (status × count; body shapes) | Numeric parameters: value → answer | "
          "Bound that applies |")
    print("|---|---:|---|---|---|")
    classes = summary["classes"]
    for name, label in CLASS_LABELS.items():
        if name in classes:
            entry = classes[name]
            print(f"| {label} | {entry['cases']:,} | {answers(entry)} | {numeric(entry)} | {bounds[name]} |")
    bodies = {k.split(":", 1)[1]: v for k, v in classes.items() if k.startswith("body:")}
    if bodies:
        total = sum(v["cases"] for v in bodies.values())
        statuses: dict = {}
        shapes: dict = {}
        for v in bodies.values():
            for s, n in v["statuses"].items():
                statuses[s] = statuses.get(s, 0) + n
            for s, n in v["shapes"].items():
                shapes[s] = shapes.get(s, 0) + n
        label = "POST bodies (" + ", ".join(sorted(bodies)) + ")"
        print(f"| {label} | {total:,} | {answers({'statuses': statuses, 'shapes': shapes})} | — | {bounds['body']} |")
    return 0 if summary["failures"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, ".build", "hostile-report.json")))
