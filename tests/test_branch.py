"""What a branch (train/branch.py) reads: its stable run's shards and tokenizer unless told otherwise,
found beside the stable run's config.yaml wherever that run now lies. Configs and directories only,
no training."""

from __future__ import annotations

import pytest

from tpu_ray.errors import UserError


@pytest.mark.quick
def test_a_branch_reads_its_stable_runs_shards_and_tokenizer_unless_told_otherwise(tmp_path, small_corpus):
    """A branch had to be given shard.dir= and tokenizer.path= by hand (`tpu-ray run` refused it,
    telling to add them) though it is refused unless they are the stable run's."""
    from tests.helpers import stable_run_and_branch
    from tpu_ray.saved_config import save_config
    from tpu_ray.train.branch import settled

    stable, branch = stable_run_and_branch(tmp_path, small_corpus)
    got = settled(branch)
    assert (got.shards_dir, got.tokenizer_dir) == (stable.shards_dir, stable.tokenizer_dir)
    # told otherwise: its own, checked as before
    with pytest.raises(UserError, match="this run has no shards at"):
        settled(branch.override({"shard.dir": str(tmp_path / "elsewhere")}))
    # a resumed branch keeps what its first start read (its config.yaml), not today's default
    save_config(got, False, {})
    (tmp_path / "branch" / "checkpoints").mkdir()
    (tmp_path / "branch" / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-6"\n')
    again = settled(branch)
    assert (again.shard.dir, again.tokenizer.path) == (stable.shards_dir, stable.tokenizer_dir)


def test_a_branch_finds_a_moved_stable_runs_data_beside_its_config(tmp_path, small_corpus):
    """The stable run's config.yaml names where it was written (output_dir), not where it is now: a
    moved or copied run is found by where its config.yaml is, never at its old path."""
    import shutil

    from tests.helpers import tiny_config
    from tpu_ray.saved_config import save_config
    from tpu_ray.train.branch import stable_data

    stable = tiny_config(tmp_path / "old", small_corpus, **{"train.schedule": "constant", "train.steps": 12})
    save_config(stable, False, {})
    (tmp_path / "old" / "shards").mkdir()
    shutil.move(tmp_path / "old", tmp_path / "new")
    (tmp_path / "old" / "shards").mkdir(parents=True)  # something else now lies at the old path
    branch = stable.override({"output_dir": str(tmp_path / "branch"), "train.branch_from": str(tmp_path / "new")})
    got = branch.override(stable_data(branch.shard.dir, branch.tokenizer.path, str(tmp_path / "new")))
    assert (got.shard.dir, got.tokenizer.path) == (str(tmp_path / "new" / "shards"), str(tmp_path / "new" / "tokenizer"))
