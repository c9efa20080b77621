"""docs/testing.md's table of where the suite's time goes, from one measured run.

    make durations      # runs the whole suite as CI does, then this script

or by hand: `python -m pytest ... --durations-json build/durations.json` (the plugin in
tests/timing.py), then `python tests/durations_table.py build/durations.json [--machine TEXT]`.
It rewrites the part of docs/testing.md between the two `durations` markers (the top 30 tests and
the totals per file) and tests/durations.json, which orders the files longest first next time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "testing.md"
KNOWN = REPO / "tests" / "durations.json"
BEGIN, END = "<!-- durations: begin (tests/durations_table.py writes this part) -->", "<!-- durations: end -->"


def tier(markers: list[str]) -> str:
    return "slow" if "slow" in markers else "quick" if "quick" in markers else "default"


def table(durations: dict[str, dict], machine: str, wall: str) -> str:
    ranked = sorted(durations.items(), key=lambda kv: -kv[1]["seconds"])
    per_file: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for nodeid, rec in ranked:
        path = nodeid.split("::", 1)[0]
        per_file[path][tier(rec["markers"])] += rec["seconds"]
        counts[path][tier(rec["markers"])] += 1
    totals = {t: sum(f[t] for f in per_file.values()) for t in ("quick", "default", "slow")}
    n = {t: sum(c[t] for c in counts.values()) for t in ("quick", "default", "slow")}
    lines = [BEGIN, "",
             f"Measured {dt.date.today().isoformat()} on {machine}; {wall}. Seconds are each test's own "
             "(setup + call + teardown) while the other worker ran beside it, so they add up to more than "
             "the wall time.", "",
             f"Tests: {n['quick']} quick, {n['default']} more in the default suite, {n['slow']} slow "
             f"({sum(n.values())} in all); test time {totals['quick']:.0f} s quick, {totals['default']:.0f} s "
             f"other default, {totals['slow']:.0f} s slow.", "",
             "The 30 slowest tests:", "",
             "| seconds | tier | test |", "| ---: | --- | --- |"]
    lines += [f"| {rec['seconds']:.1f} | {tier(rec['markers'])} | `{nodeid}` |" for nodeid, rec in ranked[:30]]
    lines += ["", "Per file (seconds of test time; tests):", "",
              "| file | quick | default | slow | total |", "| --- | ---: | ---: | ---: | ---: |"]
    for path, secs in sorted(per_file.items(), key=lambda kv: -sum(kv[1].values())):
        c = counts[path]
        cells = [f"{secs[t]:.0f} ({c[t]})" if c[t] else "" for t in ("quick", "default", "slow")]
        lines.append(f"| `{path}` | {' | '.join(cells)} | {sum(secs.values()):.0f} |")
    lines += ["", END]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("durations", nargs="+", help="the JSON files `pytest --durations-json PATH` wrote")
    ap.add_argument("--machine", default="an idle 2-core, 24 GiB machine (2 pytest-xdist workers)")
    ap.add_argument("--wall", default="wall time not given", help="e.g. 'make test took 24 min 10 s'")
    args = ap.parse_args(argv)
    durations = {k: v for path in args.durations for k, v in json.loads(Path(path).read_text()).items()}
    doc = DOC.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{DOC}: the two durations markers are missing; put them where the table goes")
    head, rest = doc.split(BEGIN, 1)
    DOC.write_text(head + table(durations, args.machine, args.wall) + rest.split(END, 1)[1])
    KNOWN.write_text(json.dumps({k: v["seconds"] for k, v in sorted(durations.items())}, indent=0) + "\n")
    print(f"wrote {DOC.relative_to(REPO)} and {KNOWN.relative_to(REPO)} ({len(durations)} tests)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
