"""Where the suite's time goes, printed at the end of every run and kept for the next one.

A pytest plugin (conftest.py loads it):
- the ten slowest tests of the run, each with its seconds (setup + call + teardown), so a new slow
  test is seen the day it lands; a test outside the slow set over the budget (20 s) is named apart;
- `--durations-json PATH` writes every test's seconds and markers (tests/durations_table.py turns it
  into docs/testing.md's table and tests/durations.json);
- the unit of work pytest-xdist hands a worker (`--dist loadgroup`, group_of): a test file, or one
  model type of the model-type matrix; the units run longest first, by tests/durations.json, so the
  long ones start at once instead of leaving one worker busy at the end while the other idles.

pytest's own `--durations` prints phases, not tests, and has no budget or file order: hence this.
Timings are printed, never asserted: a test must not depend on how fast the machine is today.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

BUDGET_S = 20.0  # a default-suite test over this on its own is marked slow or made cheaper
KNOWN = Path(__file__).with_name("durations.json")
QUICK_ENV = "TPU_RAY_QUICK_TIER"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--durations-json", default=None, metavar="PATH",
                     help="write each test's seconds and markers to PATH (tests/durations_table.py reads it)")


class _Clock:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.markers: dict[str, list[str]] = {}
        self.outcome: dict[str, str] = {}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        nodeid = without_group(report.nodeid)
        self.seconds[nodeid] += report.duration
        if report.when == "call" or report.outcome != "passed":
            self.outcome[nodeid] = report.outcome
        self.markers.setdefault(nodeid, sorted(k for k in ("slow", "quick") if k in report.keywords))

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter, exitstatus, config) -> None:
        if not self.seconds:
            return
        ranked = sorted(self.seconds.items(), key=lambda kv: -kv[1])
        write = terminalreporter.write_line
        terminalreporter.section("the ten slowest tests (setup + call + teardown)")
        for nodeid, s in ranked[:10]:
            mark = " [slow]" if "slow" in self.markers.get(nodeid, ()) else ""
            write(f"{s:8.1f} s  {nodeid}{mark}")
        over = [(n, s) for n, s in ranked if s > BUDGET_S and "slow" not in self.markers.get(n, ())]
        if over:
            write(f"over the {BUDGET_S:.0f} s budget outside the slow set (mark them slow or make them cheaper):")
            for nodeid, s in over:
                write(f"{s:8.1f} s  {nodeid}")
        write(f"{len(self.seconds)} tests, {sum(self.seconds.values()):.0f} s of test time in all")
        out = config.getoption("--durations-json")
        if out:
            Path(out).write_text(json.dumps(
                {n: {"seconds": round(s, 2), "markers": self.markers.get(n, []), "outcome": self.outcome.get(n)}
                 for n, s in ranked}, indent=1) + "\n")


HEAVY_IMPORTS = ("tensorflow", "ray", "transformers")  # imported by most of the suite's processes


def uncompiled(packages: tuple[str, ...] = HEAVY_IMPORTS) -> list[str]:
    """The packages whose `__init__` has no bytecode beside it, when Python will not write any
    (PYTHONDONTWRITEBYTECODE, set on this project's machines): each process then compiles them from
    source again. uv installs without bytecode unless told (tests/compile_bytecode.sh compiles; pip
    does by default), and that cost `import tensorflow` 12.6 s instead of 5.2 on 2 cores, in every test
    process, Ray worker and subprocess: more than half of the multi-worker node-loss test's CPU."""
    import importlib.util
    import sys

    if not sys.dont_write_bytecode:
        return []  # the first import writes the bytecode the later ones read
    missing = []
    for name in packages:
        spec = importlib.util.find_spec(name)  # a top-level name: found, not imported
        if spec and spec.origin and spec.origin.endswith(".py") and not os.path.exists(
                importlib.util.cache_from_source(spec.origin)):
            missing.append(name)
    return missing


def _check_bytecode() -> None:
    """Said once at the start; a failure under TPU_RAY_REQUIRE_EXTRAS (CI), whose install must be
    the one the Makefile makes."""
    missing = uncompiled()
    if not missing:
        return
    import sys
    import sysconfig

    # uv compiles only what one install command installs: a venv made before needs compileall.
    line = (f"tests: {', '.join(missing)} in {sys.prefix} have no bytecode and PYTHONDONTWRITEBYTECODE is set: "
            "every process compiles them again (import tensorflow 12.6 s instead of 5.2 on 2 cores); fix: "
            f"{sys.executable} -m compileall -q -j 0 {sysconfig.get_paths()['purelib']} (a venv that make setup "
            "creates has it)")
    if os.environ.get("TPU_RAY_REQUIRE_EXTRAS"):
        raise pytest.UsageError(line)
    print(line, file=sys.stderr)


def pytest_configure(config: pytest.Config) -> None:
    # group_of's marks; xdist registers the marker too, but not when it is off (-p no:xdist).
    config.addinivalue_line("markers", "xdist_group(name): the unit of work one xdist worker takes (timing.py)")
    # Under xdist the workers' reports reach the controller, which prints; workers stay quiet.
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Clock(), "tpu_ray_clock")
        _check_bytecode()
    if _selects_quick_only(config):
        os.environ[QUICK_ENV] = "1"
    # xdist sorts the groups by their number of tests unless told not to: a one-test group that runs
    # for ten minutes (the README quickstart) started last and ran alone at the end of the slow set.
    # Keep the order pytest_collection_modifyitems gives (longest first by tests/durations.json).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def _selects_quick_only(config: pytest.Config) -> bool:
    expr = (config.getoption("-m") or "").strip()
    return expr == "quick"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """`-m quick` does not even import a test file that marks nothing quick (importing every file
    costs the quick tier more than its tests)."""
    if (_selects_quick_only(config) and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_") and "mark.quick" not in collection_path.read_text()):
        return True
    return None


def without_group(nodeid: str) -> str:
    """A node id without the "@<group>" suffix pytest-xdist's loadgroup adds (its own rule: an "@"
    after the last "]"), so durations are keyed the same with and without xdist."""
    return nodeid.rsplit("@", 1)[0] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid


def group_of(item: pytest.Item) -> str:
    """The unit pytest-xdist hands one worker (`--dist loadgroup`): a test file, so its module
    fixtures are made once; a module that sets XDIST_SPLIT_BY = "<parameter>" (the model-type
    matrix) is split by that parameter's value, so its long columns spread over the workers."""
    path = item.nodeid.split("::", 1)[0]
    split = getattr(getattr(item, "module", None), "XDIST_SPLIT_BY", None)
    params = getattr(getattr(item, "callspec", None), "params", {})
    # No "]" in a group name: xdist reads the group after an "@" only when it follows the last "]".
    return f"{path}:{params[split]}" if split and split in params else path


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    """Each test in its group (group_of); the groups longest first by the last measured run
    (tests/durations.json), a group's tests in their collected order."""
    try:
        known = {k: float(v) for k, v in json.loads(KNOWN.read_text()).items()}
    except (OSError, ValueError, KeyError, TypeError):
        known = {}
    groups = [group_of(item) for item in items]
    seconds: dict[str, float] = defaultdict(float)
    first: dict[str, int] = {}
    for i, (item, group) in enumerate(zip(items, groups)):
        seconds[group] += known.get(item.nodeid, 0.0)
        first.setdefault(group, i)
        item.add_marker(pytest.mark.xdist_group(group))
    order = sorted(range(len(items)), key=lambda i: (-seconds[groups[i]], first[groups[i]], i))
    items[:] = [items[i] for i in order]


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's, on the controller: a worker's collected node ids
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """Stop the run, not silently lose the grouping: pytest-xdist 3.8's loadgroup writes each test's
    group into `Item._nodeid`, which pytest 9.2 no longer reads (hence pytest<9.2 in the test extra).
    Without it every test is its own unit: module fixtures are built on both workers and the
    longest-first order is lost (found when one file's tests ran on both workers)."""
    if node.config.getoption("dist", "no") == "loadgroup" and ids and "@" not in ids[0]:
        pytest.exit("pytest-xdist --dist loadgroup did not group the tests (node ids carry no @group): this "
                    "pytest and pytest-xdist do not work together; see tests/timing.py", returncode=3)


@pytest.fixture(autouse=True)
def _quick_tier_starts_no_ray(request):
    """In `make test-quick` (-m quick) a test that starts a Ray cluster is not quick: fail it (and
    stop that cluster, so the tests after it are not blamed)."""
    import sys

    def running() -> bool:
        ray = sys.modules.get("ray")
        return ray is not None and ray.is_initialized()

    before = running()
    yield
    if os.environ.get(QUICK_ENV) and "quick" in request.keywords and running() and not before:
        sys.modules["ray"].shutdown()
        pytest.fail(f"{request.node.nodeid} is marked quick but started a Ray cluster: "
                    "the quick tier runs no Ray; remove @pytest.mark.quick")
