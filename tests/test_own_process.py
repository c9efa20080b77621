"""tests/own_process.py: a marked test runs in a fresh process and its outcome is its own."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SUITE = '''
import os
from pathlib import Path

import pytest

PIDS = Path(os.environ["PIDS"])


def _note(name):
    with PIDS.open("a") as f:
        f.write(f"{name} {os.getpid()}\\n")


@pytest.fixture(scope="module")
def here_module():
    _note("module-fixture-up")
    yield
    _note("module-fixture-down")


def test_here(here_module):
    _note("parent")


@pytest.mark.own_process
def test_passes_in_a_child():
    _note("child")


@pytest.mark.own_process
def test_fails_in_a_child():
    assert 1 == 2, "the child's own message"


@pytest.mark.own_process
@pytest.mark.skip(reason="the child's skip reason")
def test_skipped_in_a_child():
    pass


@pytest.mark.own_process
class TestShared:
    @pytest.fixture(scope="class")
    def built(self):
        _note("class-fixture")
        return 1

    def test_a(self, built):
        _note("a")

    def test_b(self, built):
        _note("b")
'''

AFTER = '''
def test_after_a_file_that_ends_in_a_child():
    pass
'''


@pytest.mark.quick
def test_marked_tests_run_in_a_fresh_process_and_report_their_own_outcome(tmp_path):
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.own_process"]\n')
    (tmp_path / "test_suite.py").write_text(SUITE)  # its last tests run in a child...
    (tmp_path / "test_z_after.py").write_text(AFTER)  # ...then a test of another file runs here
    pids = tmp_path / "pids.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TPU_RAY_OWN_PROCESS"))}
    env.update(PYTHONPATH=str(REPO), PIDS=str(pids))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-rs",
                           "test_suite.py", "test_z_after.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out  # the child's failure fails the run
    assert "1 failed, 5 passed, 1 skipped" in out, out
    assert "the child's own message" in out and "the child's skip reason" in out, out
    seen = [line.split() for line in pids.read_text().splitlines()]
    assert [name for name, _ in seen if name.startswith("module-")] == ["module-fixture-up", "module-fixture-down"]
    by_name = {name: int(pid) for name, pid in seen}
    parent = by_name["parent"]
    assert len({by_name["child"], by_name["a"], parent}) == 3  # each group in its own process
    assert by_name["a"] == by_name["b"] == by_name["class-fixture"]  # a class shares one child
    assert [name for name, _ in seen].count("class-fixture") == 1
