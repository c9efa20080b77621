"""One evaluation set per source, fixed by the shards alone (not the seed, the batch
size, the replicas or the hosts), named by an identity in every eval record."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.helpers import REPO
from tpu_ray.prepare.tfrecord import examples_file
from tpu_ray.train.eval_set import eval_dataset, eval_set, pick_samples
from tpu_ray.train.inputs import MaskSpec


@pytest.mark.quick
def test_the_set_spreads_over_the_whole_split_whatever_its_number_of_files():
    val = [(f"validation-{i:05d}-10", 10) for i in range(1000)]  # 1,000 units' validation shards
    picked = pick_samples(val, 640)
    assert sum(n for _, n in picked) == 640
    index = sorted(int(p.split("-")[1]) for p, _ in picked)
    assert index[0] == 0 and index[-1] >= 990  # the last quarter is scored (the old interleave stopped early)
    assert pick_samples(list(reversed(val)), 640) == picked  # order of the listing does not matter
    assert pick_samples(val, 20_000) == val  # more than exists: all of it
    short = [("validation-00000-3", 3), ("validation-00001-100", 100)]
    assert pick_samples(short, 50) == [("validation-00000-3", 3), ("validation-00001-100", 47)]


def _files(tmp_path, n_files=5, rows=12, seq=16):
    rng = np.random.default_rng(0)
    out = []
    for i in range(n_files):
        path = tmp_path / f"validation-{i:05d}-{rows}.tfrecord"
        path.write_bytes(examples_file(rng.integers(5, 100, size=(rows, seq), dtype=np.int32)))
        out.append((str(path), rows))
    return out


def _rows(ds) -> list[tuple]:
    """Every row of a dataset of batches, in order: (input_ids, labels)."""
    return [(tuple(ids), tuple(labels)) for batch in ds.as_numpy_iterator()
            for ids, labels in zip(batch["input_ids"], batch["labels"])]


@pytest.mark.quick
def test_the_samples_and_masks_do_not_depend_on_the_batch_or_the_replicas(tmp_path):
    files = _files(tmp_path)
    es = eval_set("corpus", files, 50, {}, "tok", 0.15, 16)
    spec = MaskSpec(0.15, 4, 100, (0, 1, 2, 3, 4), predictions=8)
    one = _rows(eval_dataset(es, 16, 7, 1, spec))
    assert len(one) == 56 and all(set(labels) == {-100} for _, labels in one[50:])  # padding scores nothing
    eight = _rows(eval_dataset(es, 16, 4, 8, spec))  # 8 replicas of 4: the same rows, the same masks
    assert eight[:50] == one[:50] and len(eight) == 64 and all(set(lb) == {-100} for _, lb in eight[50:])
    halves = [_rows(eval_dataset(es, 16, 3, 4, spec, ctx=tf.distribute.InputContext(2, i, 4))) for i in (0, 1)]
    merged = [row for pair in zip(*halves) for row in pair]  # two hosts score the set between them, once each
    assert merged[:50] == one[:50] and len(merged) == 60
    # The identity names what decides the figures: the samples, the tokenizer, the rate, the length.
    assert eval_set("corpus", files, 50, {}, "tok", 0.15, 16).identity == es.identity
    assert eval_set("corpus", files, 51, {}, "tok", 0.15, 16).identity != es.identity
    assert eval_set("corpus", files, 50, {}, "tok", 0.30, 16).identity != es.identity
    assert eval_set("corpus", files, 50, {}, "other", 0.15, 16).identity != es.identity
    changed = {files[0][0]: "f" * 64}  # another shard content under the same name
    assert eval_set("corpus", files, 50, changed, "tok", 0.15, 16).identity != es.identity


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_runs_differing_in_seed_and_batch_size_score_the_same_set(mixed_run):
    """Another seed and batch size, same shards: equal set identities."""
    from tpu_ray.pipeline import Pipeline
    from tpu_ray.report import load_metrics

    cfg, _ = mixed_run
    other = cfg.override({"output_dir": cfg.run_dir + "-seed7", "seed": 7, "train.batch_size": 16,
                          "train.steps": 4, "train.eval_every": 4, "shard.dir": cfg.shards_dir,
                          "tokenizer.path": cfg.tokenizer_dir})
    Pipeline(other).train()
    first, second = (load_metrics(c.run_dir, kind="eval_source") for c in (cfg, other))
    sets = [dict(zip(df["source"], df["eval_set"])) for df in (first, second)]
    assert sets[0] == sets[1] and len(sets[0]) == 3


EVAL_ON = """
import json, sys
from tpu_ray.config import RunConfig
from tpu_ray.train.evaluate import evaluate_run
cfg = RunConfig.from_yaml(sys.argv[1]).override({"train.cpu_replicas": int(sys.argv[2]), "train.strategy": "cpu"})
result = evaluate_run(cfg)
print(json.dumps({n: r["eval_loss"] for n, r in result["sources"].items()}))
"""


@pytest.mark.slow
def test_a_checkpoint_scores_the_same_on_1_and_8_devices(mixed_run, tmp_path):
    """8 logical CPUs need a fresh process (TensorFlow fixes its devices when it starts); 1 device is
    this process when it has one CPU device (a TensorFlow start-up saved, ~10-30 s of the slow set),
    else a fresh process too (an earlier test here may have started TensorFlow with several:
    tpu_ray.doctor.program.can_host)."""
    from tpu_ray.train.evaluate import evaluate_run

    cfg, _ = mixed_run
    config = tmp_path / "config.yaml"
    config.write_text(cfg.to_yaml())

    def in_a_fresh_process(replicas: int) -> dict[str, float]:
        out = subprocess.run([sys.executable, "-c", EVAL_ON, str(config), str(replicas)], cwd=REPO,
                             capture_output=True, text=True, timeout=600,
                             env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    if len(tf.config.list_logical_devices("CPU")) == 1:
        one = evaluate_run(cfg.override({"train.cpu_replicas": 1, "train.strategy": "cpu"}))
        losses = [{n: r["eval_loss"] for n, r in one["sources"].items()}]
    else:
        losses = [in_a_fresh_process(1)]
    losses.append(in_a_fresh_process(8))
    assert losses[0].keys() == losses[1].keys() == {"domain", "general", "general_test"}
    for name in losses[0]:
        assert losses[0][name] == pytest.approx(losses[1][name], rel=1e-5), (name, losses)
