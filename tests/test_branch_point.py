"""A branch named by its stable run starts from the checkpoint checked when the run was assembled.

The stable run goes on training while a branch job waits (for a slice, for its shards): the branch
must start from the checkpoint its defaults were filled for and its config.yaml records, not from
whatever the stable run has committed by the time training starts. Configs and checkpoint names
only (no weights: everything here is decided before a restore)."""

from __future__ import annotations

import pytest

from tests import test_schedules
from tests.test_schedules import _fake_stable, _run_cfg

shards_dir = test_schedules.shards_dir  # its shards fixture, shared


def _commit(run_dir, step: int) -> None:
    """The stable run commits checkpoint `step` (its name and index: what `locate` reads)."""
    ckpts = run_dir / "checkpoints"
    (ckpts / "checkpoint").write_text(f'model_checkpoint_path: "ckpt-{step}"\n')
    (ckpts / f"ckpt-{step}.index").write_bytes(b"")


def test_the_branch_keeps_its_checkpoint_while_the_stable_run_moves_on(tmp_path, shards_dir, tiny_tokenizer_dir):
    from tpu_ray.saved_config import check_config, read_saved_config, save_config
    from tpu_ray.train.branch import settled

    _fake_stable(tmp_path, shards_dir, tiny_tokenizer_dir, step=4)
    stable = tmp_path / "stable"
    branch = _run_cfg(tmp_path / "branch", shards_dir, tiny_tokenizer_dir,
                      **{"train.schedule": "wsd", "train.branch_from": str(stable)})
    first = settled(branch)  # as the pipeline assembles the run: the decay starts at the branch step, 4
    assert first.train.branch_from == str(stable / "checkpoints" / "ckpt-4")
    assert first.train.decay_steps == 8
    save_config(first, False, {})
    assert read_saved_config(str(tmp_path / "branch")).train.branch_from.endswith("ckpt-4")

    _commit(stable, 8)  # the stable run trains on before the trainer starts
    again = settled(first)  # the trainer's own settle: the pinned checkpoint, the same defaults, no refusal
    assert again.train.branch_from == first.train.branch_from and again.train.decay_steps == 8

    # Resumed (the branch has its own checkpoint now), from the config as the user wrote it: the run
    # named again means the checkpoint its first start pinned, and the directory's config still matches.
    (tmp_path / "branch" / "checkpoints").mkdir()
    _commit(tmp_path / "branch", 6)
    resumed = settled(branch)
    assert resumed.train.branch_from == first.train.branch_from and resumed.train.decay_steps == 8
    check_config(resumed)  # raises on a differing config


def test_a_branch_named_by_its_checkpoint_or_elsewhere_is_not_taken_for_the_pinned_one(tmp_path):
    from tpu_ray.train.branch import _same_branch_point

    run = str(tmp_path / "stable")
    pinned = f"{run}/checkpoints/ckpt-4"
    assert _same_branch_point(pinned, run) and _same_branch_point(pinned, run + "/")
    assert _same_branch_point(run, run) and _same_branch_point(None, None)
    assert not _same_branch_point(pinned, f"{run}/checkpoints/ckpt-8")  # another checkpoint: the user's
    assert not _same_branch_point(pinned, str(tmp_path / "other"))
    assert not _same_branch_point(pinned, None) and not _same_branch_point(None, run)


def _pinned_branch(tmp_path, shards_dir, tok):
    """A stable run at ckpt-4, a wsd branch naming the run, and that branch's first start (pinned, saved)."""
    from tpu_ray.saved_config import save_config
    from tpu_ray.train.branch import settled

    _fake_stable(tmp_path, shards_dir, tok, step=4)
    branch = _run_cfg(tmp_path / "branch", shards_dir, tok,
                      **{"train.schedule": "wsd", "train.branch_from": str(tmp_path / "stable")})
    first = settled(branch)
    save_config(first, False, {})
    return branch, first


def test_a_restart_before_training_keeps_the_pin_while_it_is_there_then_takes_the_latest(tmp_path, shards_dir,
                                                                                         tiny_tokenizer_dir):
    from tpu_ray.train.branch import settled

    branch, first = _pinned_branch(tmp_path, shards_dir, tiny_tokenizer_dir)
    stable = tmp_path / "stable"
    _commit(stable, 8)
    again = settled(branch)  # crashed before its first checkpoint, started again as the user wrote it
    assert again.train.branch_from == first.train.branch_from and again.train.decay_steps == 8
    (stable / "checkpoints" / "ckpt-4.index").unlink()  # the stable run pruned it
    latest = settled(branch)
    assert latest.train.branch_from == str(stable / "checkpoints" / "ckpt-8") and latest.train.decay_steps == 4


def test_a_trained_branch_naming_another_branch_point_is_refused_in_one_line(tmp_path, shards_dir,
                                                                           tiny_tokenizer_dir, monkeypatch):
    from tpu_ray.errors import UserError
    from tpu_ray.train.branch import settled

    branch, first = _pinned_branch(tmp_path, shards_dir, tiny_tokenizer_dir)
    _commit(tmp_path / "stable", 8)
    (tmp_path / "branch" / "checkpoints").mkdir()
    _commit(tmp_path / "branch", 6)
    other = branch.override({"train.branch_from": str(tmp_path / "stable" / "checkpoints" / "ckpt-8")})
    with pytest.raises(UserError) as refused:
        settled(other)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"train.branch_from={tmp_path / 'stable' / 'checkpoints' / 'ckpt-8'}:")
    assert f"started from {first.train.branch_from}" in line and "new --output-dir" in line
    # The run named by a relative path from its parent directory is the same branch point.
    monkeypatch.chdir(tmp_path)
    assert settled(branch.override({"train.branch_from": "stable/"})).train.branch_from == first.train.branch_from


def test_a_pinned_checkpoint_gone_before_the_trainer_starts_says_how_to_take_the_latest(tmp_path, shards_dir,
                                                                                       tiny_tokenizer_dir):
    from tpu_ray.errors import UserError
    from tpu_ray.train.branch import settled

    _, first = _pinned_branch(tmp_path, shards_dir, tiny_tokenizer_dir)
    _commit(tmp_path / "stable", 8)
    (tmp_path / "stable" / "checkpoints" / "ckpt-4.index").unlink()
    with pytest.raises(UserError, match=r"no such checkpoint .*start it again, before it has trained, to take the "
                                        r"latest"):
        settled(first)  # the trainer's settle of the config the pipeline pinned


def test_doctor_reports_the_pinned_checkpoint_not_the_stable_runs_latest(tmp_path, shards_dir, tiny_tokenizer_dir):
    import io

    from tpu_ray.doctor.checks import PASS, run_doctor

    branch, first = _pinned_branch(tmp_path, shards_dir, tiny_tokenizer_dir)
    _commit(tmp_path / "stable", 8)
    out = io.StringIO()
    run_doctor(branch, target="cpu", out=out, xla=False)
    (row,) = [r for r in out.getvalue().splitlines() if r[6:21].strip() == "branch"]
    assert row.startswith(PASS) and f"from {first.train.branch_from} at step 4" in row, row


def test_the_trainer_refuses_a_branch_config_nobody_settled(tmp_path, shards_dir, tiny_tokenizer_dir):
    """loop.train given a branch config as the user wrote it (not through the Pipeline, which settles
    it): refused in one line naming what settling fills, never trained under the unfilled schedule."""
    from tpu_ray.errors import UserError
    from tpu_ray.train.loop import train

    _fake_stable(tmp_path, shards_dir, tiny_tokenizer_dir, step=4)
    branch = _run_cfg(tmp_path / "branch", shards_dir, tiny_tokenizer_dir,
                      **{"train.schedule": "wsd", "train.branch_from": str(tmp_path / "stable")})
    with pytest.raises(UserError, match=r"not settled as a branch \(train.branch_from, train.decay_steps "
                                        r"unfilled\); train it through tpu_ray.Pipeline"):
        train(branch)
    assert not list((tmp_path / "branch").glob("checkpoints/ckpt-*"))


def test_doctor_shows_the_branchs_schedule_as_settled(tmp_path, shards_dir, tiny_tokenizer_dir):
    """Doctor's schedule row is the branch's filled schedule (the decay over the 8 steps from its branch
    step 4), the one the trainer runs, not the config's unfilled one (a decay over the last 2 steps)."""
    import io

    from tpu_ray.doctor.checks import run_doctor

    branch, first = _pinned_branch(tmp_path, shards_dir, tiny_tokenizer_dir)
    out = io.StringIO()
    run_doctor(branch, target="cpu", out=out, xla=False)
    (row,) = [r for r in out.getvalue().splitlines() if r[6:21].strip() == "schedule"]
    assert "constant to step 4, 1-sqrt decay over 8 steps" in row, row


def test_doctor_on_a_resumed_branch_whose_pinned_checkpoint_was_pruned_passes(tmp_path, shards_dir,
                                                                              tiny_tokenizer_dir):
    """A branch with checkpoints of its own resumes them and never reads the stable run's again:
    doctor says so, rather than failing on the pinned checkpoint the stable run has since pruned."""
    import io

    from tpu_ray.doctor.checks import PASS, run_doctor

    branch, first = _pinned_branch(tmp_path, shards_dir, tiny_tokenizer_dir)
    _commit(tmp_path / "stable", 8)
    (tmp_path / "stable" / "checkpoints" / "ckpt-4.index").unlink()
    (tmp_path / "branch" / "checkpoints").mkdir()
    _commit(tmp_path / "branch", 6)
    out = io.StringIO()
    run_doctor(branch, target="cpu", out=out, xla=False)
    (row,) = [r for r in out.getvalue().splitlines() if r[6:21].strip() == "branch"]
    assert row.startswith(PASS) and "resumes its own checkpoint" in row and first.train.branch_from in row, row
