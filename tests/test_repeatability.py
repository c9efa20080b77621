"""Repeatability: one config and seed give the same run, bit for bit, on one software stack on a CPU.

What a run promises (tpu_ray/train/repeatability.py, printed by `tpu-ray doctor` and the model card):
the same losses at every logged step, the same evaluation figures and the same exported weights, to
the last bit, whatever else the machine is doing, however many actors cut the shards, and whether it
ran straight through or stopped at a checkpoint and was resumed. The slow test below runs one variant
of one tiny run that differs from the baseline in all of those ways at once (a run each cost about a
minute of the slow set) and compares it with the baseline exactly: no tolerance, because the promise
has none.

Each run is `tpu-ray run` in a process of its own, as users run it. The tokenizer is BPE, the one
trainer whose output is exact in every process; Unigram and WordPiece are made repeatable after
training (prepare/tokenizer.py: canonical order; tests/test_tokenizer.py checks two processes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import REPO, tiny_config

# Wall-clock fields: they differ between any two runs and are not part of the promise.
CLOCK = {"time", "step_time_s", "samples_per_s", "tokens_per_s", "mfu", "input_wait_s", "eval_time_s"}
# Dropout 0 and a constant rate after the warm-up: the stopped run can end at step 10 and be continued
# to 20 under the schedule a straight 20-step run has (train.extend_schedule changes only the length).
OVER = {"tokenizer.kind": "bpe", "train.steps": 20, "train.log_every": 2, "train.eval_every": 10,
        "train.checkpoint_every": 10, "train.schedule": "constant", "model.dropout": 0.0, "shard.num_actors": 1}


def _run(run_dir: Path, corpus: Path, *flags: str, **over) -> Path:
    """`tpu-ray run` of the tiny config (with `over`) in a fresh process; the run directory."""
    cfg = tiny_config(run_dir, corpus, **{**OVER, **over})
    cfg_path = run_dir.parent / f"{run_dir.name}-{len(list(run_dir.parent.glob(run_dir.name + '-*.yaml')))}.yaml"
    cfg_path.write_text(cfg.to_yaml())
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "RAY_ADDRESS": "local"}
    proc = subprocess.run([sys.executable, "-m", "tpu_ray.cli", "run", "--config", str(cfg_path), *flags],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def _figures(run_dir: Path, kind: str) -> dict[int, dict]:
    """The run's `kind` records by step, clock fields dropped; a step logged twice (before a stop and
    after the resume) keeps its last record."""
    from tpu_ray.metrics_stream import read_records

    rows = sorted((r for r in read_records(str(run_dir)) if r.get("kind") == kind), key=lambda r: r["time"])
    return {r["step"]: {k: v for k, v in r.items() if k not in CLOCK} for r in rows}


def _weights(run_dir: Path) -> dict[str, np.ndarray]:
    """The exported model's tensors, as people load them (model.safetensors)."""
    from safetensors.numpy import load_file

    return load_file(str(run_dir / "model" / "model.safetensors"))


def _assert_same_run(run: Path, baseline: Path) -> None:
    for kind in ("train", "eval"):
        got, want = _figures(run, kind), _figures(baseline, kind)
        assert want and got == want, f"{kind} records differ:\n{json.dumps(got)}\n{json.dumps(want)}"
    got, want = _weights(run), _weights(baseline)
    assert got.keys() == want.keys()
    differ = [k for k in want if not np.array_equal(got[k], want[k])]
    assert not differ, f"exported weights differ in {differ}"


def test_doctor_and_the_model_card_say_which_promise_a_run_has(tmp_path, small_corpus):
    import io

    from tpu_ray.doctor.checks import run_doctor
    from tpu_ray.train.export_safetensors import model_card, run_record

    cfg = tiny_config(tmp_path / "run", small_corpus)
    for target, status, words in (("cpu", "PASS", "bit for bit"), ("v4-8", "WARN", "not promised")):
        out = io.StringIO()
        run_doctor(cfg, target=target, out=out, xla=False)
        line = next(x for x in out.getvalue().splitlines() if x[6:21].strip() == "repeatability")
        assert line.startswith(status) and words in line, (target, line)
    assert "- repeatability (cpu): bit for bit on one software stack" in model_card(run_record(cfg), 10, 800, "roberta")
    assert "- repeatability (tpu): not promised" in model_card(run_record(cfg), 10, 800, "roberta", kind="tpu")
    assert "enable_op_determinism()" in model_card(run_record(cfg), 10, 800, "roberta", kind="gpu")


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, small_corpus) -> Path:
    """The run every variant must repeat: alone, one shard actor, straight through."""
    return _run(tmp_path_factory.mktemp("repeat") / "baseline", small_corpus)


@pytest.mark.slow  # the baseline, then this run stopped and resumed: `tpu-ray run`s of a tiny config
def test_three_shard_actors_on_a_busy_machine_stopped_and_resumed_repeat_the_one_actor_run_made_alone(
        baseline, tmp_path, small_corpus):
    """Three promises in one run (each would need a run of its own otherwise): the shards three actors
    cut train what one actor's train, a machine busy elsewhere changes nothing, and a run stopped at a
    checkpoint (step 10) and resumed (to 20, train.extend_schedule) ends where the straight run ends.
    Two busy loops on a 2-core machine while the first process shards, trains, evaluates and
    checkpoints: the run's threads are preempted at other points, tf.data's parallel reads and
    TensorFlow's thread pools finish in another order, the actors end in another order. (Not while the
    resumed process runs: the loops take CPU from whatever else runs beside this test, the other xdist
    worker's tests in CI.)"""
    from tpu_ray.metrics_stream import read_records

    run = tmp_path / "busy-three-actors-stopped"
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        _run(run, small_corpus, **{"shard.num_actors": 3, "train.steps": 10})
    finally:
        for p in burners:
            p.kill()
            p.wait()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["shards"]["actors"] == 3, summary["shards"]
    assert max(_figures(run, "train")) == 10
    _run(run, small_corpus, "--resume", **{"shard.num_actors": 3, "train.extend_schedule": True})
    resumes = [r for r in read_records(str(run)) if r.get("kind") == "event" and r.get("event") == "resume"]
    assert resumes and resumes[-1]["step"] == 10, resumes
    _assert_same_run(run, baseline)
