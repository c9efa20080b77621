"""Tests that build their own Ray cluster run in a fresh Python process.

A pytest plugin (conftest.py loads it). `@pytest.mark.own_process` on a test (or a class: its
tests then share one process, so a class-scoped cluster is built once) runs it in a child pytest,
and the child's setup/call/teardown reports are reported here as the test's own.

Why: a Ray 2.60 driver can stop receiving its actors' state from Ray's control store (GCS), for
good: every later actor it starts is ALIVE in the GCS and never answers it. Seen in CI at 5aa8e51
(the mixture fixture's shard actors, 4 x 120 s) and in a fresh clone's slow set at 3157486
(test_downstream_during's). The second time the driver's Ray log shows when: the last actor
notification it ever got came as the TrainController actor of an earlier in-process Ray Train
launch (test_train's user-error test) was destroyed ("A worker is dead. subscription_failure_callback
will be invoked"); Ray Train's fit() now runs in a launcher task's process of its own, never the
driver's (tpu_ray/cluster/multiworker.py). A driver that shut one cluster down and joined another also
once died on a reference-counter check. So the tests that build multi-node clusters run in processes
that end with them, and an xdist worker's driver only ever joins the suite's one local cluster. Neither pytest-xdist (workers restart only after a crash)
nor pytest-forked (a fork of a process that holds TensorFlow and Ray threads) gives a fresh
interpreter per test.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.timing import without_group

CHILD_ENV = "TPU_RAY_OWN_PROCESS_REPORTS"  # set in the child: where it writes its reports
MARK = "own_process"
TAIL = 20_000  # characters of a child's output kept when it ends without a report

_results: dict[str, list[dict]] = {}  # node id -> the child's reports, for a group's later tests
_children = itertools.count()  # numbers each child's temp dir and report file in this process


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARK}: builds its own Ray cluster; runs in a fresh Python process "
                                       "(tests/own_process.py)")
    if os.environ.get(CHILD_ENV):
        config.pluginmanager.register(_ChildReports(Path(os.environ[CHILD_ENV])), "tpu_ray_own_process_child")


def _group(item: pytest.Item) -> str | None:
    """The node whose tests share one child: the marked class, else the test itself; None unmarked."""
    for node, _ in item.iter_markers_with_node(MARK):
        return node.nodeid if isinstance(node, pytest.Class) else item.nodeid
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    group = _group(item)
    if group is None or os.environ.get(CHILD_ENV):
        return None
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    if item.nodeid not in _results:
        members = [i for i in item.session.items if _group(i) == group]
        _results.update(_run_child(item, [without_group(i.nodeid) for i in members], [i.nodeid for i in members]))
    for rep in _results.pop(item.nodeid):
        longrepr = tuple(rep["longrepr"]) if isinstance(rep["longrepr"], list) else rep["longrepr"]
        report = pytest.TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords}, rep["outcome"],
                                   longrepr, rep["when"], duration=rep["duration"])
        item.ihook.pytest_runtest_logreport(report=report)
    # What pytest's own protocol does after a test: tear down the fixtures the next test does not
    # share (a module's, when this was its last test), else that test's setup finds them still up.
    item.session._setupstate.teardown_exact(nextitem)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def _run_child(item: pytest.Item, plain_ids: list[str], ids: list[str]) -> dict[str, list[dict]]:
    """Run the group's tests in one child pytest; each test's reports, by the parent's node id."""
    base = item.config._tmp_path_factory.getbasetemp()  # the child's temp dirs inside this run's
    n = next(_children)
    out = base / f"own-process-{n}"
    reports = base / f"own-process-{n}.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT_TEST"))}
    env[CHILD_ENV] = str(reports)
    cmd = [sys.executable, "-m", "pytest", *plain_ids, "-p", "no:xdist", "-p", "no:cacheprovider", "-q",
           "-m", "", f"--basetemp={out}", f"--rootdir={item.config.rootpath}"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=item.config.rootpath, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    got: dict[str, list[dict]] = {}
    if reports.exists():
        for line in reports.read_text().splitlines():
            rep = json.loads(line)
            got.setdefault(rep["nodeid"], []).append(rep)
    results = {}
    for parent_id, plain in zip(ids, plain_ids):
        reps = got.get(plain)
        if not reps or reps[-1]["when"] != "teardown":  # the child died or never ran it
            text = (f"the fresh process running {plain} (tests/own_process.py) ended with exit code "
                    f"{proc.returncode} without reporting it; its output's end:\n{(proc.stdout + proc.stderr)[-TAIL:]}")
            reps = [*(reps or []), {"when": "call", "outcome": "failed", "longrepr": text, "duration": 0.0}]
            reps.append({"when": "teardown", "outcome": "passed", "longrepr": None, "duration": 0.0})
        results[parent_id] = reps
    # The child's start-up (interpreter, imports, collection) is this group's time too: its first setup.
    first = results[ids[0]][0]
    first["duration"] += max(0.0, wall - sum(r["duration"] for reps in results.values() for r in reps))
    return results


class _ChildReports:
    """In the child: each phase's outcome, text and seconds, one JSON line per report."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            longrepr = list(report.longrepr)  # (file, line, reason): what -ra prints
        elif report.failed:
            sections = "\n".join(f"----- {title} -----\n{text}" for title, text in report.sections)
            longrepr = f"{report.longreprtext}\n{sections}"[-TAIL * 5:]
        else:
            longrepr = None
        with self.path.open("a") as f:
            f.write(json.dumps({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                                "longrepr": longrepr, "duration": report.duration}) + "\n")
