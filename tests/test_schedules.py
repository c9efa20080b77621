"""Learning-rate schedules (linear, cosine, constant, wsd), decays branched from a stable
run's checkpoint, and a masking rate that changes with the step."""

from __future__ import annotations

import io
import json
import math

import pytest

from tests.helpers import tiny_config
from tpu_ray.config import RunConfig
from tpu_ray.errors import UserError


def _train(**over):
    return RunConfig().override({"train.steps": 100, "train.warmup_steps": 10, "train.learning_rate": 1e-3,
                                 **over}).train


# step -> expected rate (x 1e-3), worked out by hand from each schedule's definition
EXPECTED = {
    "linear": ({}, {0: 0.0, 5: 0.5, 10: 1.0, 55: 0.5, 99: 1 / 90, 100: 0.0}),
    "linear floor": ({"train.min_lr_ratio": 0.1}, {10: 1.0, 55: 0.55, 100: 0.1}),
    "cosine": ({"train.schedule": "cosine"}, {5: 0.5, 10: 1.0, 55: 0.5, 100: 0.0}),
    "cosine floor": ({"train.schedule": "cosine", "train.min_lr_ratio": 0.2}, {55: 0.6, 100: 0.2}),
    "constant": ({"train.schedule": "constant"}, {0: 0.0, 5: 0.5, 10: 1.0, 99: 1.0, 500: 1.0}),
    "wsd 1-sqrt 20%": ({"train.schedule": "wsd"}, {5: 0.5, 10: 1.0, 80: 1.0, 85: 1 - math.sqrt(0.25), 100: 0.0}),
    "wsd linear 40 steps": ({"train.schedule": "wsd", "train.decay_steps": 40, "train.decay_shape": "linear",
                             "train.min_lr_ratio": 0.5}, {59: 1.0, 60: 1.0, 80: 0.75, 100: 0.5}),
}


@pytest.mark.parametrize("name", list(EXPECTED))
@pytest.mark.quick
def test_each_schedule_takes_its_values_at_chosen_steps_in_python_and_in_tensorflow(name):
    from tpu_ray.train import curves
    from tpu_ray.train.schedule import learning_rate

    over, expected = EXPECTED[name]
    t = _train(**over)
    lr = learning_rate(curves.curve(t))
    for step, value in expected.items():
        assert float(curves.rate(curves.curve(t), step)) == pytest.approx(value * 1e-3, abs=1e-9), (name, step)
        assert float(lr(step)) == pytest.approx(value * 1e-3, rel=1e-5, abs=1e-10), (name, step)


@pytest.mark.quick
def test_linear_is_todays_transformers_curve_value_for_value():
    from transformers import create_optimizer

    from tpu_ray.train import curves
    from tpu_ray.train.schedule import learning_rate

    _, reference = create_optimizer(init_lr=1e-3, num_train_steps=100, num_warmup_steps=10)
    ours = learning_rate(curves.curve(_train()))
    for step in (0, 1, 9, 10, 11, 50, 98, 99, 100):
        assert float(ours(step)) == pytest.approx(float(reference(step)), rel=1e-6, abs=1e-12), step


@pytest.mark.quick
def test_the_rate_is_traced_once_for_every_step():
    """A pure function of the step tensor: one trace serves every step (the XLA rules)."""
    import tensorflow as tf

    from tpu_ray.train import curves
    from tpu_ray.train.schedule import learning_rate

    lr = learning_rate(curves.curve(_train(**{"train.schedule": "wsd"})))
    f = tf.function(lambda s: lr(s), jit_compile=True)
    values = [float(f(tf.constant(s, tf.int64))) for s in (0, 10, 85, 99)]
    assert f.experimental_get_tracing_count() == 1 and values[1] == pytest.approx(1e-3)


@pytest.mark.quick
def test_a_warm_up_as_long_as_the_run_is_warned_at_start_and_by_doctor(tmp_path, small_corpus, caplog):
    from tpu_ray.doctor.checks import WARN, run_doctor
    from tpu_ray.train import curves, schedule
    from tpu_ray.train.optimizer import make_optimizer

    cfg = tiny_config(tmp_path / "short", small_corpus, **{"train.steps": 30, "train.warmup_steps": 100})
    (line,) = curves.warnings(curves.curve(cfg.train))
    assert "never reaches train.learning_rate=0.001" in line and "train.warmup_steps" in line
    with caplog.at_level("WARNING"):
        make_optimizer(schedule.from_train(cfg.train), cfg.train.weight_decay)
    assert any("never reaches" in r.getMessage() for r in caplog.records)
    out = io.StringIO()
    run_doctor(cfg, target="cpu", out=out, xla=False)
    (row,) = [r for r in out.getvalue().splitlines() if r[6:21].strip() == "schedule"]
    assert row.startswith(WARN) and "never reaches" in row
    assert not curves.warnings(curves.curve(cfg.override({"train.warmup_steps": 3}).train))


@pytest.mark.parametrize("over, needle", [
    ({"train.schedule": "wsd", "train.decay_steps": 31}, "train.decay_steps=31 is longer than the run (train.steps=30)"),
    ({"train.mask_schedule": "linear"}, "train.mask_schedule=linear needs train.mask_prob_end"),
    ({"train.mask_prob_end": 0.1}, "train.mask_prob_end=0.1 does nothing with train.mask_schedule=constant"),
])
@pytest.mark.quick
def test_contradicting_schedule_options_are_one_line(over, needle):
    with pytest.raises(UserError) as err:
        RunConfig().override({"train.steps": 30, **over})
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.quick
def test_a_decay_longer_than_the_run_exits_2_on_the_cli(tmp_path, capsys):
    from tpu_ray.cli import main

    code = main(["train", "--output-dir", str(tmp_path / "r"), "train.steps=10", "train.schedule=wsd",
                 "train.decay_steps=20"])
    assert code == 2
    assert "train.decay_steps=20 is longer than the run" in capsys.readouterr().err


@pytest.mark.quick
def test_schedule_fields_are_pinned_on_resume_unless_extending(tmp_path, small_corpus):
    from tpu_ray.rundir import CHECKPOINTS_DIR
    from tpu_ray.saved_config import check_config, save_config

    cfg = tiny_config(tmp_path / "r", small_corpus, **{"train.schedule": "constant"})
    save_config(cfg, False, {})
    (tmp_path / "r" / CHECKPOINTS_DIR).mkdir()
    (tmp_path / "r" / CHECKPOINTS_DIR / "ckpt-10.index").write_bytes(b"x")
    with pytest.raises(UserError, match="train.schedule: saved 'constant', now 'wsd'"):
        check_config(cfg.override({"train.schedule": "wsd"}))
    assert check_config(cfg.override({"train.schedule": "wsd", "train.extend_schedule": True}))
    with pytest.raises(UserError, match="train.batch_size"):  # the hatch opens the schedule only
        check_config(cfg.override({"train.batch_size": 8, "train.extend_schedule": True}))


# ------------------------------------------------------------------------------ branched decays
@pytest.fixture(scope="module")
def shards_dir(tmp_path_factory, tiny_tokenizer_dir):
    from tests.test_train import write_shards
    from tpu_ray.prepare.tokenizer import tokenizer_info

    d = tmp_path_factory.mktemp("shards")
    write_shards(d, tokenizer_info(tiny_tokenizer_dir).vocab_size)
    return d


def _run_cfg(run_dir, shards_dir, tok, **over):
    """12 steps, a checkpoint every 4, no dropout (a branch restores no dropout stream), every step logged."""
    from tests.test_train import _cfg

    return _cfg(run_dir, shards_dir, tok, **{"train.placement": "local", "train.steps": 12, "train.warmup_steps": 2,
                                             "train.checkpoint_every": 4, "train.log_every": 1, "train.eval_every": 12,
                                             "model.dropout": 0.0, **over})


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_a_decay_branched_off_a_constant_run_ends_where_the_direct_wsd_run_ends(tmp_path, shards_dir,
                                                                              tiny_tokenizer_dir):
    from tests.test_train import _records
    from tpu_ray.pipeline import Pipeline
    from tpu_ray.train import curves

    decay = {"train.schedule": "wsd", "train.decay_steps": 4, "train.decay_shape": "1-sqrt"}
    stable = _run_cfg(tmp_path / "stable", shards_dir, tiny_tokenizer_dir, **{"train.schedule": "constant"})
    direct = _run_cfg(tmp_path / "direct", shards_dir, tiny_tokenizer_dir, **decay)
    Pipeline(stable).train()
    Pipeline(direct).train()
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "stable" / "checkpoints").iterdir()}

    branch = _run_cfg(tmp_path / "branch", shards_dir, tiny_tokenizer_dir,
                      **{**decay, "train.branch_from": str(tmp_path / "stable" / "checkpoints" / "ckpt-8")})
    summary = Pipeline(branch).train()
    assert summary["resumed_from"] == 8 and summary["steps"] == 12
    (event,) = [r for r in _records(tmp_path / "branch", "event") if r["event"] == "branch"]
    assert event["step"] == 8 and event["checkpoint"].endswith("ckpt-8")

    # Every train record carries the rate the schedule gives at its step (the direct run's whole curve).
    got = {r["step"]: r for r in _records(tmp_path / "branch", "train")}
    ref = {r["step"]: r for r in _records(tmp_path / "direct", "train")}
    c = curves.curve(direct.train)
    assert sorted(got) == [9, 10, 11, 12]
    for step, r in ref.items():
        assert r["learning_rate"] == pytest.approx(float(curves.rate(c, step - 1)), rel=1e-5, abs=1e-12), step
    # Same data, same masks, same updates: the branch continues the curve and ends where the direct run ends.
    for step in got:
        assert got[step]["learning_rate"] == pytest.approx(ref[step]["learning_rate"], rel=1e-6), step
        assert got[step]["loss"] == pytest.approx(ref[step]["loss"], rel=1e-5), step
    stable_losses = {r["step"]: r["loss"] for r in _records(tmp_path / "stable", "train")}
    assert stable_losses[12] != pytest.approx(ref[12]["loss"], rel=1e-5)  # the decay made a difference
    # The stable run is untouched.
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "stable" / "checkpoints").iterdir()} == before

    # Branching from the run itself takes its last checkpoint (ckpt-12): no step left before train.steps.
    with pytest.raises(UserError, match=r"its checkpoint is at step 12, not before train.steps=12"):
        Pipeline(_run_cfg(tmp_path / "late", shards_dir, tiny_tokenizer_dir,
                          **{**decay, "train.branch_from": str(tmp_path / "stable")})).train()


@pytest.mark.parametrize("over, needle", [
    ({"model.hidden_size": 48}, "another config (model.hidden_size: saved None, now 48)"),
    ({"train.batch_size": 8}, "another config (train.batch_size: saved 16, now 8)"),
    ({"shard.dir": "no-such-shards"}, "this run has no shards at no-such-shards"),  # unset: the stable run's
])
def test_branching_from_another_model_or_other_data_is_one_line_exit_2(over, needle, tmp_path, shards_dir,
                                                                       tiny_tokenizer_dir, capsys):
    from tpu_ray.cli import main
    from tpu_ray.saved_config import save_config

    stable = _run_cfg(tmp_path / "stable", shards_dir, tiny_tokenizer_dir, **{"train.schedule": "constant"})
    save_config(stable, False, {})
    ckpts = tmp_path / "stable" / "checkpoints"
    ckpts.mkdir()
    (ckpts / "checkpoint").write_text('model_checkpoint_path: "ckpt-4"\n')
    (ckpts / "ckpt-4.index").write_bytes(b"")
    branch = _run_cfg(tmp_path / "branch", shards_dir, tiny_tokenizer_dir,
                      **{"train.schedule": "wsd", "train.decay_steps": 4, "train.branch_from": str(tmp_path / "stable"),
                         **over})
    yaml_path = tmp_path / "branch.yaml"
    yaml_path.write_text(branch.to_yaml())
    assert main(["train", "--config", str(yaml_path)]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert needle in line and "train.branch_from=" in line, line
    assert "shard.dir=" in line or "branch with the stable run's config" in line, line
    # doctor says the same, as a FAIL row
    from tpu_ray.doctor.checks import FAIL, run_doctor

    out = io.StringIO()
    assert run_doctor(branch, target="cpu", out=out, xla=False) == 1
    (row,) = [r for r in out.getvalue().splitlines() if r[6:21].strip() == "branch"]
    assert row.startswith(FAIL) and needle in row, row


def _fake_stable(tmp_path, shards_dir, tok, step=4, **over):
    """A stable run's config.yaml and a committed checkpoint's name (no weights: refused before a restore)."""
    from tpu_ray.saved_config import save_config

    stable = _run_cfg(tmp_path / "stable", shards_dir, tok, **{"train.schedule": "constant", **over})
    save_config(stable, False, {})
    ckpts = tmp_path / "stable" / "checkpoints"
    ckpts.mkdir()
    (ckpts / "checkpoint").write_text(f'model_checkpoint_path: "ckpt-{step}"\n')
    (ckpts / f"ckpt-{step}.index").write_bytes(b"")
    return stable


@pytest.mark.parametrize("command", ["run", "train"])
def test_a_branch_that_jumps_is_one_line_exit_2_before_anything_starts(command, tmp_path, shards_dir,
                                                                       tiny_tokenizer_dir, capsys):
    """The branch's rate at the branch step is checked from the configs alone, before any
    stage (`run`: not even the tokenizer) or cluster; nothing of the branch is written."""
    import sys

    from tpu_ray.cli import main

    stable = _fake_stable(tmp_path, shards_dir, tiny_tokenizer_dir)
    branch = stable.override({"output_dir": str(tmp_path / "branch"), "train.branch_from": str(tmp_path / "stable"),
                              "train.schedule": "wsd", "train.learning_rate": 2e-3, "train.placement": "auto"})
    (tmp_path / "branch.yaml").write_text(branch.to_yaml())
    ray_before = "ray" in sys.modules and sys.modules["ray"].is_initialized()
    assert main([command, "--config", str(tmp_path / "branch.yaml"), "ray.address=local"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert (f"train.branch_from={tmp_path / 'stable'}: the learning rate jumps at the branch step 4 (the stable "
            f"run's 0.001, this run's 0.002); set train.learning_rate=0.001") in line, line
    assert not (tmp_path / "branch").exists()
    if not ray_before:
        assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
    if command == "train":  # doctor: the same line as a FAIL row; the fixed branch passes, its curve named
        from tpu_ray.doctor.checks import FAIL, PASS, run_doctor

        for cfg, verdict, needle in ((branch, FAIL, "set train.learning_rate=0.001"),
                                     (branch.override({"train.learning_rate": 1e-3}), PASS,
                                      "constant to step 4, 1-sqrt decay over 8 steps")):
            out = io.StringIO()
            run_doctor(cfg, target="cpu", out=out, xla=False)
            (row,) = [r for r in out.getvalue().splitlines() if r[6:21].strip() == "branch"]
            assert row.startswith(verdict) and needle in row, row


@pytest.mark.quick
def test_a_resume_under_another_schedule_is_refused_before_any_stage_or_cluster(tmp_path, small_corpus, capsys):
    """`--resume train.steps=400` was once refused inside training attempt 2; now from the
    run's config.yaml, before the lock, the stages and Ray: exit 2, one line, nothing written."""
    import sys

    from tpu_ray.cli import main
    from tpu_ray.train.schedule import refuse_changed_schedule
    from tpu_ray.saved_config import save_config

    cfg = tiny_config(tmp_path / "r", small_corpus, **{"train.steps": 300})
    save_config(cfg, False, {})
    ckpts = tmp_path / "r" / "checkpoints"
    ckpts.mkdir()
    (ckpts / "checkpoint").write_text('model_checkpoint_path: "ckpt-100"\n')
    (ckpts / "ckpt-100.index").write_bytes(b"")
    (tmp_path / "c.yaml").write_text(cfg.to_yaml())
    files = lambda: {p: p.stat().st_mtime_ns for p in (tmp_path / "r").rglob("*")}  # noqa: E731
    before = files()
    ray_before = "ray" in sys.modules and sys.modules["ray"].is_initialized()
    for command in ("run", "train"):
        assert main([command, "--config", str(tmp_path / "c.yaml"), "--resume", "train.steps=400",
                     "ray.address=local"]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert f"--resume: {ckpts / 'ckpt-100'} was trained with another schedule (train.steps 300 -> 400)" in line
        assert "train.extend_schedule=true" in line
    assert files() == before
    if not ray_before:
        assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
    # the same schedule, or the hatch, passes this check
    refuse_changed_schedule(cfg.run_dir, cfg.train, resume=True)
    extended = cfg.override({"train.steps": 400, "train.extend_schedule": True})
    refuse_changed_schedule(extended.run_dir, extended.train, resume=True)


@pytest.mark.quick
def test_a_resumed_branch_keeps_the_defaults_its_first_start_filled_in(tmp_path, small_corpus):
    """The stable run's latest checkpoint may have moved since: a resumed branch (its own checkpoints)
    takes the filled-in decay and warm-up from its config.yaml, not from the stable run again."""
    from tpu_ray.saved_config import save_config
    from tpu_ray.train.branch import settled

    cfg = tiny_config(tmp_path / "b", small_corpus, **{"train.schedule": "wsd", "train.warmup_steps": None,
                                                       "train.branch_from": str(tmp_path / "gone")})
    save_config(cfg.override({"train.decay_steps": 12, "train.warmup_steps": 3}), False, {})
    (tmp_path / "b" / "checkpoints").mkdir()
    (tmp_path / "b" / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-10"\n')
    got = settled(cfg).train
    assert (got.decay_steps, got.warmup_steps) == (12, 3)
    assert settled(cfg.override({"train.decay_steps": 5})).train.decay_steps == 5  # given: the user's


@pytest.mark.slow  # four tiny trainings: over the 20 s budget
def test_a_decay_branched_off_a_continued_run_ends_where_the_continued_run_decaying_there_ends(
        tmp_path, shards_dir, tiny_tokenizer_dir):
    """model.init_from's stable run (constant), branched at step 4 with its own config
    changing only the schedule (wsd, no decay_steps: the decay starts at the branch step), ends
    where the continued run that decays from step 4 directly ends, step by step."""
    import shutil

    from tests.test_train import _records
    from tpu_ray.pipeline import Pipeline
    from tpu_ray.saved_config import read_saved_config

    Pipeline(_run_cfg(tmp_path / "source", shards_dir, tiny_tokenizer_dir, **{"train.steps": 2})).train()
    cont = {"model.init_from": str(tmp_path / "source"), "train.steps": 8}
    stable = _run_cfg(tmp_path / "stable", shards_dir, tiny_tokenizer_dir, **cont, **{"train.schedule": "constant"})
    Pipeline(stable).train()
    Pipeline(_run_cfg(tmp_path / "direct", shards_dir, tiny_tokenizer_dir, **cont,
                      **{"train.schedule": "wsd", "train.decay_steps": 4})).train()
    saved = read_saved_config(str(tmp_path / "stable"))  # the stable run's config.yaml, model.init_from kept
    assert saved.model.init_from == str(tmp_path / "source") and saved.model.init_sha256
    branch = saved.override({"output_dir": str(tmp_path / "branch"), "train.schedule": "wsd",
                             "train.branch_from": str(tmp_path / "stable" / "checkpoints" / "ckpt-4")})
    shutil.rmtree(tmp_path / "source")  # the branch reads the stable run's copy of it (RUN/init)
    summary = Pipeline(branch).train()
    assert summary["resumed_from"] == 4 and summary["steps"] == 8
    assert read_saved_config(str(tmp_path / "branch")).train.decay_steps == 4  # filled in, recorded
    record = json.loads((tmp_path / "branch" / "init" / "source.json").read_text())
    assert record["sha256"] == saved.model.init_sha256 and record["via"] == str(tmp_path / "stable" / "init")
    got = {r["step"]: r for r in _records(tmp_path / "branch", "train")}
    ref = {r["step"]: r for r in _records(tmp_path / "direct", "train")}
    assert sorted(got) == [5, 6, 7, 8]
    for step in got:
        assert got[step]["learning_rate"] == pytest.approx(ref[step]["learning_rate"], rel=1e-6), step
        assert got[step]["loss"] == pytest.approx(ref[step]["loss"], rel=1e-5), step
    stable_losses = {r["step"]: r["loss"] for r in _records(tmp_path / "stable", "train")}
    assert stable_losses[8] != pytest.approx(ref[8]["loss"], rel=1e-5)  # the decay made a difference
    # without model.init_from it is another model: refused in one line naming it
    with pytest.raises(UserError, match=r"another config \(model.init_from: saved '.*source', now None\)"):
        Pipeline(branch.override({"output_dir": str(tmp_path / "b2"), "model.init_from": None,
                                  "model.init_sha256": None}))


# ----------------------------------------------------------------------------- masking schedule
@pytest.mark.quick
def test_a_linear_masking_rate_falls_with_the_step_in_one_trace():
    """train.mask_schedule=linear: 30% at step 0 to 15% at train.steps, read from the batch index in the
    masking seed; exact counts show the rate; one traced function serves every step (no recompile)."""
    import numpy as np
    import tensorflow as tf

    from tpu_ray.train import curves
    from tpu_ray.train.inputs import MaskSpec, _seed, mask_tokens, predictions_per_sequence

    spec = MaskSpec(0.3, 4, 800, (0, 1, 2, 3, 4), exact_count=True, mask_prob_end=0.15, schedule_steps=100,
                    batches_per_step=2)
    ids = tf.constant(np.random.default_rng(0).integers(5, 800, size=(4, 100)), tf.int32)
    masked = tf.function(lambda index: mask_tokens(ids, _seed(7, 1, index), spec)[1])
    t = _train(**{"train.mask_schedule": "linear", "train.mask_prob": 0.3, "train.mask_prob_end": 0.15,
                  "train.mask_count": "exact"})
    for step in (0, 40, 99, 150):
        labels = masked(tf.constant(2 * step + 1, tf.int64)).numpy()  # the second replica's batch of the step
        expected = round(float(curves.mask_rate(t, step)) * 100)
        assert (labels != -100).sum(axis=1).tolist() == [expected] * 4, step
    assert expected == 15 and masked.experimental_get_tracing_count() == 1
    # The MLM head scores as many positions as the highest rate masks.
    from tpu_ray.train.inputs import predictions_for

    assert predictions_for(t, 100) == predictions_per_sequence(100, 0.3, exact_count=True) == 30


def test_a_run_under_a_masking_schedule_trains_in_one_trace_and_evaluates_at_eval_mask_prob(
        tmp_path, shards_dir, tiny_tokenizer_dir):
    from tests.test_train import _records
    from tpu_ray.train.loop import mask_spec, train
    from tpu_ray.prepare.tokenizer import tokenizer_info

    cfg = _run_cfg(tmp_path / "m", shards_dir, tiny_tokenizer_dir,
                   **{"train.steps": 6, "train.mask_schedule": "linear", "train.mask_prob": 0.3,
                      "train.mask_prob_end": 0.15, "train.mask_count": "exact", "train.log_every": 3,
                      "train.eval_every": 6, "train.checkpoint_every": 6})
    train(cfg)
    records = _records(tmp_path / "m", "train")
    assert [r["train_traces"] for r in records] == [1, 1]
    spec = mask_spec(cfg.train, cfg.paths, tokenizer_info(tiny_tokenizer_dir))
    assert (spec.mask_prob, spec.mask_prob_end, spec.schedule_steps) == (0.3, 0.15, 6)
    # The evaluation masks at eval.mask_prob, whatever the training rate: its spec has no schedule.
    from tpu_ray.train.eval_set import eval_spec

    assert eval_spec(spec, cfg.eval.mask_prob, 64).mask_prob_end is None
    (ev,) = _records(tmp_path / "m", "eval")
    assert ev["eval_mask_prob"] == 0.15


def test_a_resumed_run_continues_the_same_curve(tmp_path, shards_dir, tiny_tokenizer_dir):
    """Cosine to a floor: the run is cut back to its step-4 checkpoint and resumed; steps 5-8 take the
    rates (and, dropout 0, the losses) of the uninterrupted run."""
    from tests.test_train import _records
    from tpu_ray.train.loop import train

    cfg = _run_cfg(tmp_path / "r", shards_dir, tiny_tokenizer_dir,
                   **{"train.steps": 8, "train.schedule": "cosine", "train.min_lr_ratio": 0.1, "train.eval_every": 8})
    train(cfg)
    first = {r["step"]: r for r in _records(tmp_path / "r", "train")}
    ckpts = tmp_path / "r" / "checkpoints"
    for p in ckpts.glob("ckpt-8.*"):
        p.unlink()
    (ckpts / "checkpoint").write_text('model_checkpoint_path: "ckpt-4"\nall_model_checkpoint_paths: "ckpt-4"\n')
    (tmp_path / "r" / "metrics.jsonl").unlink()
    assert train(cfg, resume=True)["resumed_from"] == 4
    again = {r["step"]: r for r in _records(tmp_path / "r", "train")}
    assert sorted(again) == [5, 6, 7, 8]
    for step in again:
        assert again[step]["learning_rate"] == pytest.approx(first[step]["learning_rate"], rel=1e-6), step
        assert again[step]["loss"] == pytest.approx(first[step]["loss"], rel=1e-5), step
    assert first[8]["learning_rate"] > 1e-4  # the floor: min_lr_ratio 0.1 of 1e-3, approached at step 8
    # Another curve on --resume is refused, naming it; train.extend_schedule takes it.
    with pytest.raises(UserError, match=r"another schedule \(train.schedule cosine -> wsd, train.decay_steps 0 -> 2, "
                                        r"train.decay_shape linear -> 1-sqrt\)"):
        train(cfg.override({"train.schedule": "wsd", "train.decay_steps": 2}), resume=True)
