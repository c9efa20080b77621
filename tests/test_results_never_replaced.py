"""Figures that tell the truth: results are never erased or replaced by a rerun, an empty
or diverged interval is never a 0.0, and each figure is shown with its own step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import tiny_config

SEQ_LEN = 64


@pytest.fixture(scope="module")
def shards(tmp_path_factory, tiny_tokenizer_dir) -> Path:
    from tests.test_train import write_shards
    from tpu_ray.prepare.tokenizer import tokenizer_info

    d = tmp_path_factory.mktemp("shards")
    write_shards(d, tokenizer_info(tiny_tokenizer_dir).vocab_size)
    return d


def _cfg(run: Path, shards: Path, tok: str, **over):
    return tiny_config(run, run / "unused.txt", **{"tokenizer.path": tok, "shard.dir": str(shards),
                                                   "train.placement": "local", **over})


def _records(run: Path, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, shards, tiny_tokenizer_dir):
    """A run trained to its last step (4), evaluated there, through the stage layer."""
    from tpu_ray.pipeline import Pipeline

    run = tmp_path_factory.mktemp("finished") / "run"
    cfg = _cfg(run, shards, tiny_tokenizer_dir, **{"train.steps": 4, "train.log_every": 2, "train.eval_every": 4,
                                                    "train.checkpoint_every": 4})
    summary = Pipeline(cfg).train()
    assert summary["eval_loss"] is not None and summary["final_loss"] is not None
    return run, cfg, summary


def test_resuming_a_finished_run_keeps_its_results(finished):
    """--resume at the last step runs no step: summary.json and the model card keep the run's
    eval loss, perplexity and final loss (they were overwritten with None before)."""
    from tpu_ray.pipeline import Pipeline

    run, cfg, first = finished
    again = Pipeline(cfg).train(resume=True)
    saved = json.loads((run / "summary.json").read_text())
    for key in ("eval_loss", "perplexity", "final_loss", "eval_accuracy"):
        assert again[key] == pytest.approx(first[key]) and saved[key] == pytest.approx(first[key]), key
    assert saved["final_loss_step"] == 4 and saved["eval_step"] == 4
    card = (run / "model" / "README.md").read_text()
    assert "not evaluated" not in card and f"{first['eval_loss']:.4f}"[:5] in card


def test_tpu_ray_eval_refuses_overrides_that_change_the_model_or_the_set(finished, capsys):
    from tpu_ray.cli import main

    run, _, _ = finished
    for override in ("eval.samples=200", "eval.mask_prob=0.3", "model.num_hidden_layers=3", "shard.seq_len=32"):
        assert main(["eval", str(run), override]) == 2, override
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and override.split("=")[0] in err[0] and "saved" in err[0], err


def test_tpu_ray_eval_is_a_rerun_record_that_never_replaces_the_training_curve(finished, capsys):
    from tpu_ray.cli import main
    from tpu_ray.report import load_metrics, text_summary

    run, _, first = finished
    trained = _records(run, "eval")
    # The seed and batch size shape neither the restored model nor the set: accepted, and the same figure.
    assert main(["eval", str(run), "seed=7", "train.batch_size=8"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["step"] == 4 and result["eval_loss"] == pytest.approx(trained[-1]["eval_loss"], rel=1e-5)
    assert _records(run, "eval") == trained  # the training curve is as it was
    reruns = [r for r in _records(run, "eval_rerun") if r.get("source") is None]  # the pooled figure
    assert len(reruns) == 1 and reruns[0]["step"] == 4 and reruns[0]["checkpoint"].endswith("ckpt-4")
    assert reruns[0]["eval_set"] == trained[-1]["eval_set"]
    ev = load_metrics(str(run), kind="eval")
    assert list(ev["eval_loss"]) == pytest.approx([r["eval_loss"] for r in trained])
    assert len(load_metrics(str(run), kind="eval_rerun")) == len(_records(run, "eval_rerun"))
    assert f"{first['eval_loss']:.4f}" in text_summary(str(run))


def test_a_checkpoint_that_leaves_model_variables_unmatched_is_refused(finished, tmp_path):
    """Evaluation restores only what it needs, but every model variable must come from the checkpoint:
    a model with a layer the checkpoint lacks is an error, never freshly initialised weights scored."""
    from tpu_ray.errors import UserError
    from tpu_ray.train.evaluate import evaluate_run

    _, cfg, _ = finished
    with pytest.raises(UserError) as refused:
        evaluate_run(cfg.override({"model.num_hidden_layers": 3}))
    line = str(refused.value)
    assert "\n" not in line and "not in the checkpoint (e.g. " in line and "layer_._2" in line, line


def test_a_diverged_run_never_reports_zero(tmp_path, shards, tiny_tokenizer_dir):
    """train.on_nan=continue: one train record per step, the diverged ones non-finite (null, flagged),
    never the 0.0 of an empty interval; final_loss is the last finite one with its step, and the
    summary says when the run diverged."""
    from tpu_ray.report import text_summary, write_report
    from tpu_ray.train.loop import train

    run = tmp_path / "run"
    cfg = _cfg(run, shards, tiny_tokenizer_dir, **{
        "train.learning_rate": 1e30, "train.warmup_steps": 0, "train.steps": 4, "train.log_every": 1,
        "train.eval_every": 100, "train.checkpoint_every": 100, "train.on_nan": "continue"})
    summary = train(cfg)
    records = _records(run, "train")
    steps = [r["step"] for r in records]
    assert len(steps) == len(set(steps)) == 4, steps
    assert all(r["loss"] != 0.0 and r["tokens_per_s"] != 0.0 for r in records), records
    diverged = [r for r in records if r["loss"] is None]
    assert diverged and all(r["nonfinite"] for r in diverged)
    first_bad = diverged[0]["step"]
    finite = [r for r in records if r["loss"] is not None]
    assert summary["diverged_at"] == first_bad
    if finite:
        assert summary["final_loss"] == pytest.approx(finite[-1]["loss"])
        assert summary["final_loss_step"] == finite[-1]["step"]
    else:
        assert summary["final_loss"] is None
    text = text_summary(str(run))
    assert "diverged" in text and f"from step {first_bad}" in text
    write_report(str(run))
    assert f"loss not finite from step {first_bad}" in (run / "report.html").read_text()


def test_the_report_pairs_each_eval_figure_with_its_own_step(tmp_path):
    """A newer eval whose loss is not finite (stored null) must not lend its step to an older loss."""
    from tpu_ray.report import write_report
    from tpu_ray.tables import summary_rows
    from tpu_ray.report import load_metrics

    run = tmp_path / "run"
    run.mkdir()
    rows = [{"kind": "train", "step": 10, "time": 1.0, "loss": 5.5, "accuracy": 0.1},
            {"kind": "eval", "step": 10, "time": 2.0, "eval_loss": 5.25, "eval_accuracy": 0.2, "perplexity": 190.6},
            {"kind": "train", "step": 20, "time": 3.0, "loss": None, "accuracy": None, "nonfinite": True},
            {"kind": "event", "event": "nonfinite", "step": 20, "time": 3.0},
            {"kind": "eval", "step": 20, "time": 4.0, "eval_loss": None, "eval_accuracy": 0.0, "perplexity": None}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_report(str(run))
    page = (run / "report.html").read_text()
    assert "<th>eval loss (step 10)</th><td>5.2500</td>" in page
    assert "<th>final train loss (step 10)</th><td>5.5000</td>" in page
    assert "<th>eval accuracy</th><td>0.2000</td>" in page  # from the same record as the loss
    text = dict(summary_rows(load_metrics(str(run)), {}))
    assert text["eval loss / acc"] == "5.2500 / 0.200 (step 10)"
    assert text["diverged"].startswith("loss not finite from step 20")
