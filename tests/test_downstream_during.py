"""eval.downstream: a run fine-tunes snapshots of its model on a task while it trains (Ray tasks beside
the training) and records a downstream score at each snapshot's step; a bad entry is refused before
anything runs."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.helpers import tiny_config
from tpu_ray.errors import UserError

TASK = "builtin:stdlib-packages"
QUICK_TRIAL = {"epochs": 1, "learning_rates": [1e-3], "max_train_examples": 32, "batch_size": 16}


def _cfg(tmp_path, corpus, downstream):
    return tiny_config(tmp_path / "run", corpus, **{
        "train.steps": 4, "train.checkpoint_every": 2, "train.eval_every": 4, "train.log_every": 2,
        "train.placement": "local", "eval.downstream": downstream})


@pytest.mark.quick
@pytest.mark.parametrize("entry, needle", [
    ({"task": "no-such-task.jsonl", "every": 2}, r"eval\.downstream\[0\]: .*no-such-task\.jsonl"),
    ({"task": TASK, "every": 2, "finetune": {"epoch": 1}}, r"eval\.downstream\[0\]: finetune\.epoch=1: unknown option"),
    ({"task": TASK, "every": 2, "finetune": {"seeds": 3}}, r"eval\.downstream\[0\]\.finetune\.seeds: give the seeds "
                                                          r"as eval\.downstream\[0\]\.seeds"),
    ({"task": TASK, "every": 2, "finetune": {"export_dir": "x"}}, r"eval\.downstream\[0\]\.finetune\.export_dir: not "
                                                                  r"taken during training"),
], ids=["missing-task", "unknown-option", "seeds-in-finetune", "export-dir"])
def test_a_bad_downstream_entry_is_refused_before_anything_runs(tmp_path, small_corpus, entry, needle):
    from tpu_ray.pipeline import Pipeline

    cfg = _cfg(tmp_path, small_corpus, [entry])
    with pytest.raises(UserError, match=needle) as err:
        Pipeline(cfg).run()
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run").exists()  # nothing written: the fixed rerun starts clean


@pytest.mark.quick
def test_the_command_line_exits_2_on_a_bad_downstream_entry(tmp_path, small_corpus, capsys):
    from tpu_ray.cli import main

    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"eval": {"downstream": [{"task": TASK, "every": 0}]}}))
    assert main(["run", "--config", str(config), "--corpus", str(small_corpus),
                 "--output-dir", str(tmp_path / "run")]) == 2
    assert "eval.downstream.0.every" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.quick
def test_a_resumed_run_keeps_the_finished_trials_of_a_snapshot_and_runs_its_failed_ones(tmp_path, small_corpus):
    """Every `every` steps and at the last one; a resumed run keeps the trials an earlier attempt
    finished for the same snapshot weights, task and settings (no second score for step 2), and runs
    again a trial recorded as failed, or recorded for other weights or settings."""
    import numpy as np
    from safetensors.numpy import save_file

    from tpu_ray import rundir
    from tpu_ray.downstream.during import DuringTraining, check_downstream
    from tpu_ray.downstream.finetune import model_fingerprint
    from tpu_ray.downstream.sweep import recorded_trials

    task = tmp_path / "task"
    task.mkdir()
    for split, n in (("train", 6), ("validation", 4)):
        rows = [{"text": f"sample {i} of {split}", "label": ["a", "b"][i % 2]} for i in range(n)]
        (task / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    entry = {"task": str(task), "every": 2, "seeds": 2, "finetune": {"learning_rates": [1e-3]}}
    cfg = _cfg(tmp_path, small_corpus, [entry]).override({"train.steps": 5})
    (planned,) = check_downstream(cfg.eval.downstream)
    run = tmp_path / "run"
    model = tmp_path / rundir.snapshot_dir("run", 2) / rundir.MODEL_DIR
    model.mkdir(parents=True)
    save_file({"w": np.arange(4, dtype=np.float32)}, str(model / "model.safetensors"))
    (model / "config.json").write_text(json.dumps({"hidden_size": 8}))
    ident = {"kind": "downstream", "step": 2, "task_hash": planned.task.digest(), "model": model_fingerprint(str(model)),
             "settings_key": planned.spec.settings_key(), "learning_rate": 1e-3,
             **{m: 0.5 for m in planned.task.metrics}}
    records = [{**ident, "seed": 0, "status": "ok"}, {**ident, "seed": 1, "status": "failed"}]
    done = recorded_trials(records, planned.task, ident["model"], ident["settings_key"])
    assert list(done) == [(1e-3, 0)]  # the failed seed runs again
    assert not recorded_trials(records, planned.task, "weights-other", ident["settings_key"])
    assert not recorded_trials(records, planned.task, ident["model"], "other-settings")
    partial = [{k: v for k, v in r.items() if k != "matthews"} for r in records]
    assert not recorded_trials(partial, planned.task, ident["model"], ident["settings_key"])  # a score missing
    records[1]["status"] = "ok"
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    during = DuringTraining(cfg.run_dir, cfg.train.steps, [planned])
    assert [step for step in range(1, 6) if during.due(step)] == [2, 4, 5]
    during._start(2)  # every trial of step 2 recorded: nothing submitted (no Ray cluster is running here)
    assert not during._pending and [step for step in range(1, 6) if during.due(step)] == [4, 5]


@pytest.mark.slow  # a run plus two fine-tunings in Ray workers that import TensorFlow: ~1-2 min on 2 cores
def test_a_run_records_a_downstream_score_at_two_snapshots(tmp_path, small_corpus, ray_local):
    from tpu_ray.downstream.tasks import load_task
    from tpu_ray.pipeline import Pipeline
    from tpu_ray.report import load_metrics

    cfg = _cfg(tmp_path, small_corpus, [{"task": TASK, "every": 2, "seeds": 1, "finetune": QUICK_TRIAL}])
    Pipeline(cfg).run()
    run = tmp_path / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    scores = [r for r in records if r["kind"] == "downstream"]
    assert sorted(r["step"] for r in scores) == [0, 2, 4], scores  # step 0: the starting model, the baseline
    task = load_task(TASK)
    for r in scores:
        assert (r["status"], r["task"], r["task_hash"], r["seed"]) == ("ok", TASK, task.digest(), 0), r
        assert r["train_examples"] == 32 and 0 <= r["accuracy"] <= 1 and 0 <= r["test_accuracy"] <= 1
        assert r["report_split"] == "test" and r["chance"] == pytest.approx(task.chance())
    for step in (0, 2, 4):  # the models they fine-tuned: the trainer's at those steps
        config = json.loads((run / "downstream" / f"step-{step:08d}" / "model" / "config.json").read_text())
        assert config["tpu_ray_export"]["step"] == step
    train_end = next(r for r in records if r["kind"] == "event" and r["event"] == "stage_end" and r["stage"] == "train")
    assert all(r["time"] <= train_end["time"] for r in scores)  # recorded within the train stage
    table = load_metrics(str(run), kind="downstream")
    assert list(table["step"]) == [0, 2, 4]
    from tpu_ray.downstream.history import best

    curve = best(load_metrics(str(run)))
    assert list(curve["step"]) == [0, 2, 4] and set(curve["split"]) == {"test"}
    assert list(curve["mean"]) == pytest.approx([r["test_accuracy"] for r in sorted(scores, key=lambda r: r["step"])])


@pytest.mark.quick
def test_the_documented_example_entry_loads_and_names_a_task_that_exists(tmp_path, small_corpus):
    """docs/options.md's example for eval.downstream (from the config's own comment) is a working entry."""
    import re

    from tests.helpers import REPO
    from tpu_ray.downstream.during import check_downstream

    row = next(line for line in (REPO / "docs" / "options.md").read_text().splitlines()
               if line.startswith("| `eval.downstream` |"))
    example = yaml.safe_load(re.search(r"(\[\{.*?\}\])", row).group(1))
    (planned,) = check_downstream(_cfg(tmp_path, small_corpus, example).eval.downstream)
    assert planned.task.name == example[0]["task"] and planned.every == example[0]["every"]
