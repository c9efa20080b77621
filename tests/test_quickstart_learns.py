"""The quickstart, exactly as README.md writes it, trains a model that learned from context.

Issue 13: the quickstart used to end on the word-frequency plateau (fill-mask answered `the`, `,`,
`.`). This runs the README's command in a fresh process (a local Ray cluster, the built-in corpus,
the full 2,000 steps: about 6 minutes on 2 cores, hence slow) and checks the README's promise: its
example is answered correctly in the top 3, far above the answer's frequency in the training data.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = "This function returns a [MASK] of strings."
ANSWER = "list"


def _readme_command() -> str:
    """The README's quickstart command line, as a user copies it."""
    text = (REPO / "README.md").read_text()
    line = next(x for x in text.splitlines() if x.startswith('pip install -e ".[cpu]" && tpu-ray run'))
    return line.split(" && ", 1)[1]


PREDICTION = re.compile(r"^\s*[0-9.]+\s+'[^']*'\s+This function.*$", flags=re.M)


def _printed_block(doc: str) -> list[str]:
    """The quickstart's fill-mask lines as `doc` shows them (or as the CLI printed them)."""
    text = doc if "\n" in doc else (REPO / doc).read_text()
    return [line.rstrip() for line in PREDICTION.findall(text)]


def _block_rows(block: list[str]) -> list[tuple[str, float]]:
    """(word, probability) of each fill-mask line, best first."""
    rows = (re.match(r"^\s*([0-9.]+)\s+'([^']*)'", line) for line in block)
    return [(m.group(2).strip(), float(m.group(1))) for m in rows if m]


def _train_frequency(run_dir: Path, token_id: int) -> float:
    """The token's share of all tokens in the run's training shards (what a frequency model predicts)."""
    import tensorflow as tf

    from tpu_ray.config import RunConfig
    from tests.helpers import shard_files
    from tpu_ray.prepare.tfrecord import read_records

    seq_len = RunConfig.from_yaml(str(REPO / "jobs/configs/quickstart.yaml")).shard.seq_len
    spec = {"input_ids": tf.io.FixedLenFeature([seq_len], tf.int64)}
    hits = total = 0
    for path, _ in shard_files(str(run_dir / "shards"), "train"):
        with open(path, "rb") as f:
            ids = tf.io.parse_example(list(read_records(f)), spec)["input_ids"].numpy()
        hits, total = hits + int(np.sum(ids == token_id)), total + ids.size
    return hits / total


@pytest.mark.slow
def test_readme_quickstart_answers_its_example_from_context(tmp_path):
    command = _readme_command()
    assert EXAMPLE in command, "README's quickstart example changed: update EXAMPLE/ANSWER here"
    run_dir = tmp_path / "quickstart"
    command = command.replace("runs/quickstart", str(run_dir))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(command, shell=True, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The CLI prints one line per prediction, best first: "<score>  '<token>'  <sentence>".
    # Issue 45.4: the README showed another run's block. The run repeated bit for bit on one machine (a
    # 1,000-step recipe did not: docs/benchmarks.md), but
    # another CPU (CI's) rounds 2,000 steps of float maths differently: the CI run gave 'list' 0.3047 and
    # 'tuple' 0.1870 where README.md says 0.2727 and 0.1686, and reordered the tail. So: the same two
    # first answers in order, each within 0.05 of README's figure, and 3 of README's 5 words in the top 5.
    ran, shown = _block_rows(_printed_block(proc.stdout)), _block_rows(_printed_block("README.md"))
    assert [w for w, _ in ran[:2]] == [w for w, _ in shown[:2]], (ran, shown)
    assert all(abs(a - b) <= 0.05 for (_, a), (_, b) in zip(ran[:2], shown[:2])), (ran, shown)
    assert len({w for w, _ in ran[:5]} & {w for w, _ in shown[:5]}) >= 3, (ran, shown)
    printed = re.findall(r"^\s*([0-9.]+)\s+'([^']*)'\s+This function", proc.stdout, flags=re.M)
    assert ANSWER in [token.strip() for _, token in printed[:3]], proc.stdout[-2000:]

    from tpu_ray.train.export import fill_mask

    preds = {p["token_str"].strip(): p for p in fill_mask(str(run_dir / "model"), EXAMPLE, top_k=3)}
    assert ANSWER in preds
    frequency = _train_frequency(run_dir, preds[ANSWER]["token"])
    assert preds[ANSWER]["score"] > 20 * frequency, (preds[ANSWER]["score"], frequency)


@pytest.mark.quick
def test_the_docs_show_the_readmes_quickstart_block():
    """docs/benchmarks.md repeats the README's block: one run's figures in both places."""
    block = _printed_block("README.md")
    assert len(block) == 5 and _printed_block("docs/benchmarks.md") == block
