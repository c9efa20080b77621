"""docs/analytics.md: examples/analytics.py runs (a DataFrame filtered in pandas and a Ray
Dataset deduplicated with Ray Data, both trained on, then compared) and prints what the docs show.

Losses and throughput vary from machine to machine; every other line of the output (rows kept,
what each run was given and its content hash, records per run, the differing keys) must appear in
the docs verbatim.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO, WIKITEXT

FIGURES = re.compile(r"^(pandas|ray) +[AB] +\d+ ")  # the table's rows: measured, not fixed


@pytest.mark.slow
def test_the_analytics_example_prints_what_the_docs_show(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(REPO / "examples" / "analytics.py"), str(tmp_path / "out"),
                           str(WIKITEXT)], capture_output=True, text=True, timeout=1500, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    docs = (REPO / "docs" / "analytics.md").read_text()
    lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
    assert any("NOT COMPARABLE" in ln or "same set" in ln for ln in lines)
    for line in lines:
        if not FIGURES.match(line):
            assert line in docs, f"printed but not in docs/analytics.md: {line!r}"
    assert (tmp_path / "out" / "compare" / "compare.html").exists()
