"""A branch named by its stable run starts from the checkpoint checked when the run was assembled.

The stable run goes on training while a branch job waits (for a slice, for its shards): the branch
must start from the checkpoint its defaults were filled for and its config.yaml records, not from
whatever the stable run has committed by the time training starts. Configs and checkpoint names
only (no weights: everything here is decided before a restore)."""

from __future__ import annotations

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
