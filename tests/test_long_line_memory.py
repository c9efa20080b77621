"""Hostile text (a 20 MB line) keeps memory flat. (That a Ray cluster tpu-ray starts for itself
listens on loopback only is read from the cluster that tests/test_cli.py's pipeline-from-Python
test starts in a fresh process: one Ray start, not two.)

Memory is measured, not timed: peak RSS (ru_maxrss) of real processes on a real 20 MB line with no
newline, against the same bytes with ordinary line breaks in the same test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, WIKITEXT

LINE_MB = 20


def hostile_and_normal(tmp: Path, mb: int = LINE_MB) -> tuple[Path, Path]:
    """The same `mb` MB of WikiText-2: once as one line (newlines made spaces), once as it is."""
    text = (WIKITEXT / "valid.txt").read_bytes()
    data = (text * (mb * 2**20 // len(text) + 1))[: mb * 2**20]
    data = data[: data.rfind(b"\n")]
    one, normal = tmp / "one-line.txt", tmp / "normal.txt"
    one.write_bytes(data.replace(b"\n", b" "))
    normal.write_bytes(data)
    return one, normal


TOKENIZER_CHILD = """
import json, resource, sys
from tpu_ray.config import RunConfig
from tpu_ray.pipeline import run_tokenizer
cfg = RunConfig.from_dict(json.loads(sys.argv[1]))
info = run_tokenizer(cfg)
print(json.dumps({"vocab": info.vocab_size, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def _tokenizer_peaks(*runs: tuple[Path, Path]) -> list[dict]:
    """Each (corpus, out) tokenized in a child process of its own, the children side by side: each
    peak is its own process's ru_maxrss, whatever else runs beside it."""
    procs = []
    try:
        for corpus, out in runs:
            cfg = {"output_dir": str(out), "corpus": {"source": str(corpus)}, "tokenizer": {"vocab_size": 800,
                   "train_bytes": 4 << 20}, "shard": {"unit_bytes": 2 << 20}}
            # Files, not pipes: neither child blocks on a full pipe while the other is waited for.
            logs = out.with_name(out.name + ".out"), out.with_name(out.name + ".err")
            with open(logs[0], "w") as stdout, open(logs[1], "w") as stderr:
                procs.append((logs, subprocess.Popen([sys.executable, "-c", TOKENIZER_CHILD, json.dumps(cfg)],
                                                     cwd=REPO, stdout=stdout, stderr=stderr)))
        peaks = []
        for (stdout, stderr), proc in procs:
            proc.wait(timeout=900)
            err = stderr.read_text()
            assert proc.returncode == 0, err
            peaks.append(json.loads(stdout.read_text().strip().splitlines()[-1]) | {"stderr": err})
        return peaks
    finally:
        for _, proc in procs:
            if proc.poll() is None:
                proc.kill()


def test_tokenizer_on_a_20mb_line_stays_near_normal_memory(tmp_path):
    """Was: the whole line one unit, one sequence for the trainer (50 MB: 4.4 GB RSS, 81 s). Now the
    trainer sees lines of at most corpus.max_line_bytes from units of about unit_bytes."""
    one, normal = hostile_and_normal(tmp_path)
    hostile, base = _tokenizer_peaks((one, tmp_path / "a"), (normal, tmp_path / "b"))
    print(f"tokenizer peak RSS: one {LINE_MB} MB line {hostile['rss'] / 2**20:.0f} MB, "
          f"same text with newlines {base['rss'] / 2**20:.0f} MB")
    assert hostile["vocab"] >= 400  # a real vocabulary came out of it
    assert hostile["rss"] < 1.5 * base["rss"] + (256 << 20)
    assert "were split at whitespace" in hostile["stderr"]


@pytest.mark.slow
def test_shard_actor_on_a_20mb_line_stays_near_normal_memory(tmp_path, tiny_tokenizer_dir, ray_local):
    """Was: a shard actor peaked at 7.2 GB on a 50 MB line (137 MB normally)."""
    from tests.helpers import tiny_config
    from tpu_ray.prepare.shards import make_shards
    from tpu_ray.pipeline import shard_job

    one, normal = hostile_and_normal(tmp_path)
    peaks = {}
    for name, corpus in (("one", one), ("normal", normal)):
        cfg = tiny_config(tmp_path / name, corpus, **{"tokenizer.path": tiny_tokenizer_dir,
                                                      "shard.unit_bytes": 8 << 20})
        summary = make_shards(shard_job(cfg))
        assert summary.samples > 0
        peaks[name] = summary.peak_actor_rss_bytes
    print(f"shard actor peak RSS: one {LINE_MB} MB line {peaks['one'] / 2**20:.0f} MB, "
          f"same text with newlines {peaks['normal'] / 2**20:.0f} MB")
    assert peaks["one"] < 1.5 * peaks["normal"] + (256 << 20)
