"""The progress line and its ETA (tpu_ray/progress.py), from records as the trainer writes them,
checked against counts made by hand; `tpu-ray status RUN` reads the same from a run directory."""

from __future__ import annotations

import json
import logging

import pytest

from tpu_ray.config import RunConfig
from tpu_ray.progress import Plan, Progress, ProgressMirror, status_line

pytestmark = pytest.mark.quick


def _train(step: int, t: float, step_time: float, batch: int, seq_len: int, mfu=None) -> dict:
    return {"kind": "train", "step": step, "time": t, "step_time_s": step_time, "loss": 2.0,
            "samples_per_s": batch / step_time, "tokens_per_s": batch * seq_len / step_time, "mfu": mfu}


def test_eta_counts_the_steps_left_and_the_timed_evaluations():
    cfg = RunConfig().override({"train.steps": 100, "train.eval_every": 50, "train.batch_size": 16,
                                "shard.seq_len": 64})
    p = Progress(Plan.of(cfg.train, cfg.shard.seq_len))
    p.update(_train(10, 1000.0, 0.5, 16, 64))
    assert p.eta_s() == pytest.approx(90 * 0.5)  # no evaluation timed yet: only the steps
    assert "+ 2 evaluations not yet timed" in p.line() and "step 10/100 (10%)" in p.line()
    p.update(_train(50, 1020.0, 0.5, 16, 64))
    p.update({"kind": "eval", "step": 50, "time": 1023.0})  # 3 s after the train record of its step
    p.update(_train(60, 1030.0, 0.25, 16, 64, mfu=0.125))
    assert p.eta_s() == pytest.approx(40 * 0.25 + 1 * 3.0)  # evaluations left after 60: the one at 100
    line = p.line()
    assert "ETA 0:00:13 (with 1 evaluation)" in line and "MFU 12.5%" in line and "64.0 samples/s" in line, line


def test_eta_counts_later_phases_by_their_tokens_per_step():
    cfg = RunConfig().override({"train.phases": [{"steps": 40, "seq_len": 64, "batch_size": 16},
                                                 {"steps": 60, "seq_len": 128, "batch_size": 32}],
                                "train.eval_every": 1000})
    p = Progress(Plan.of(cfg.train, cfg.shard.seq_len))
    p.update(_train(20, 1.0, 0.5, 16, 64))  # 1024 tokens per 0.5 s
    # 20 steps of phase 1 at 0.5 s, then 60 steps of 32 x 128 tokens at 2048 tokens/s (2 s each)
    assert p.eta_s() == pytest.approx(20 * 0.5 + 60 * 2.0)
    assert "phase 1 of 2" in p.line()


def test_the_trainer_prints_plain_progress_lines_off_a_terminal(caplog):
    cfg = RunConfig().override({"train.steps": 20, "train.eval_every": 10})
    mirror = ProgressMirror(Plan.of(cfg.train, cfg.shard.seq_len), cfg.name, cfg.run_dir, terminal=False)
    with caplog.at_level(logging.INFO, logger="tpu_ray.train.loop"):
        mirror.write({"kind": "event", "event": "train_start", "step": 0})
        mirror.write(_train(5, 1.0, 0.1, 32, 128))
    assert [r.getMessage() for r in caplog.records] == [
        "progress: step 5/20 (25%) | 320.0 samples/s, 40,960 tokens/s | ETA 0:00:02 + 2 evaluations not yet timed"]


def test_status_reads_the_progress_of_a_run_directory(tmp_path, capsys):
    from tpu_ray.cli import main

    cfg = RunConfig().override({"output_dir": str(tmp_path), "train.steps": 40, "train.eval_every": 20})
    (tmp_path / "config.yaml").write_text(cfg.to_yaml())
    records = [{"kind": "event", "event": "train_start", "step": 0, "time": 1.0}, _train(10, 2.0, 1.0, 32, 128),
               _train(20, 12.0, 1.0, 32, 128), {"kind": "eval", "step": 20, "time": 14.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["status", str(tmp_path)]) == 0
    out = capsys.readouterr().out.strip()
    assert out == status_line(str(tmp_path))
    assert out.startswith("step 20/40 (50%)") and "ETA 0:00:22 (with 1 evaluation)" in out, out  # 20 x 1 s + 2 s
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "event", "event": "train_end", "steps": 40, "time": 40.0}) + "\n")
    assert main(["metrics", str(tmp_path), "--follow"]) == 0
    assert capsys.readouterr().out.strip().endswith("finished")


def test_on_a_terminal_the_line_is_drawn_with_a_bar(capsys):
    cfg = RunConfig().override({"train.steps": 20, "train.eval_every": 10})
    mirror = ProgressMirror(Plan.of(cfg.train, cfg.shard.seq_len), cfg.name, cfg.run_dir, terminal=True)
    mirror.write(_train(5, 1.0, 0.1, 32, 128))
    err = capsys.readouterr().err
    assert "━" in err and "step 5/20 (25%)" in err and "ETA 0:00:02" in err, err


def test_a_failed_or_stalled_or_damaged_run_says_so(tmp_path, capsys):
    """A stage_failed after train_start is a failed run (follow ends, rc 1), not one still running; a
    run whose last record is old says how old; a damaged figure is left out, never a crash."""
    from tpu_ray.cli import main

    cfg = RunConfig().override({"output_dir": str(tmp_path), "train.steps": 40, "train.eval_every": 20})
    (tmp_path / "config.yaml").write_text(cfg.to_yaml())
    records = [{"kind": "event", "event": "train_start", "step": 0, "time": 1.0}, _train(10, 2.0, 1.0, 32, 128),
               {"kind": "train", "step": None, "time": "late", "tokens_per_s": None}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    line = status_line(str(tmp_path))
    assert line.startswith("step 10/40 (25%)") and "last record " in line and " ago" in line, line
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "event", "event": "stage_failed", "stage": "train", "error": "OOM on host 3",
                            "time": 5.0}) + "\n")
    assert "failed: OOM on host 3" in status_line(str(tmp_path)) and "ETA" not in status_line(str(tmp_path))
    assert main(["metrics", str(tmp_path), "--follow"]) == 1


@pytest.mark.quick
def test_a_run_with_nothing_to_evaluate_is_not_told_evaluations_are_left():
    cfg = RunConfig().override({"train.steps": 100, "train.eval_every": 50, "train.batch_size": 16})
    p = Progress(Plan.of(cfg.train, cfg.shard.seq_len))
    p.update({"kind": "event", "event": "train_start", "step": 0, "evaluates": False})
    p.update(_train(10, 2.0, 1.0, 16, 128))
    assert p.fields()["evaluations_left"] == 0 and "evaluation" not in p.line()
    p.update({"kind": "event", "event": "train_start", "step": 10, "evaluates": True})  # resumed with validation
    p.update(_train(20, 3.0, 1.0, 16, 128))
    assert p.fields()["evaluations_left"] == 2 and "2 evaluations not yet timed" in p.line()


@pytest.mark.quick
def test_an_evaluation_the_trainer_timed_counts_even_off_the_log_grid():
    # log_every 30, eval_every 50: no train record at step 50, so only the eval record's own time tells
    cfg = RunConfig().override({"train.steps": 100, "train.eval_every": 50, "train.log_every": 30,
                                "train.batch_size": 16, "shard.seq_len": 64})
    p = Progress(Plan.of(cfg.train, cfg.shard.seq_len))
    p.update(_train(30, 1000.0, 0.5, 16, 64))
    p.update({"kind": "eval", "step": 50, "time": 1014.0, "eval_time_s": 4.0})
    p.update(_train(60, 1020.0, 0.5, 16, 64))
    assert p.eta_s() == pytest.approx(40 * 0.5 + 1 * 4.0)
    assert "(with 1 evaluation)" in p.line()
