"""A shard set is its owner's: one writer per shard directory, and a run borrowing another run's
shards (shard.dir) only reads them, never cleans, discards, rewrites or finishes them. Real
shards made on the local Ray cluster (default tier)."""

from __future__ import annotations

import json

import pytest

from tpu_ray.errors import UserError


class _Stop(Exception):
    pass


def test_a_run_sharding_into_its_default_dir_locks_it_against_another_run(tmp_path, small_corpus,
                                                                          tiny_tokenizer_dir, ray_local,
                                                                          monkeypatch):
    """Run A shards into RUN_A/shards; run B reusing them (shard.dir=RUN_A/shards) used to hold only
    its own locks, so its clean-up or discard ran beside A's writers."""
    from tests.helpers import tiny_config
    from tpu_ray.pipeline import Pipeline
    from tpu_ray.prepare import shards as shards_mod

    cfg_a = tiny_config(tmp_path / "a", small_corpus, **{"tokenizer.path": tiny_tokenizer_dir})
    cfg_b = tiny_config(tmp_path / "b", small_corpus, **{"tokenizer.path": tiny_tokenizer_dir,
                                                          "shard.dir": cfg_a.shards_dir})
    refused = []

    def while_a_shards(job, *args, **kwargs):
        if job.paths.run_dir == cfg_a.run_dir:  # A is in its shard stage: B must not get in
            with pytest.raises(UserError, match=rf"{cfg_a.shards_dir}: in use by .*tpu-ray shard") as err:
                Pipeline(cfg_b).shard()
            refused.append(str(err.value))
        raise _Stop

    monkeypatch.setattr(shards_mod, "make_shards", while_a_shards)
    with pytest.raises(_Stop):
        Pipeline(cfg_a).shard()
    assert len(refused) == 1 and "\n" not in refused[0]


def test_another_runs_shards_are_never_cleaned_or_discarded(tmp_path, small_corpus, tiny_tokenizer_dir,
                                                            ray_local):
    from tests.helpers import tiny_config
    from tpu_ray.prepare.shard_set import ShardSet
    from tpu_ray.prepare.shards import make_shards
    from tpu_ray.pipeline import shard_job

    cfg_a = tiny_config(tmp_path / "a", small_corpus, **{"tokenizer.path": tiny_tokenizer_dir})
    make_shards(shard_job(cfg_a))
    shards = tmp_path / "a" / "shards"
    manifest = ShardSet.load(str(shards))
    files = sorted(p for p in shards.rglob("*.tfrecord"))
    # A run that reads A's finished shards with A's settings reuses them and writes nothing there
    # (A's in-flight temp file stays, the manifest still names A).
    (shards / "train" / ".tmp-train-00009-1.tfrecord.abc.tmp").write_bytes(b"A writes this")
    before = (shards / "manifest.json").read_bytes()
    cfg_b = tiny_config(tmp_path / "b", small_corpus, **{"tokenizer.path": tiny_tokenizer_dir,
                                                          "shard.dir": str(shards)})
    summary = make_shards(shard_job(cfg_b))
    assert (shards / "train" / ".tmp-train-00009-1.tfrecord.abc.tmp").exists()
    assert summary.skipped_units == summary.units and (shards / "manifest.json").read_bytes() == before
    assert "owner" not in json.loads(before)  # RUN_A/shards is RUN_A's: the same bytes wherever RUN_A is
    # Another seq_len over A's unfinished shards: refused naming A, nothing deleted.
    manifest.complete = False
    manifest.write()
    cfg_c = cfg_b.override({"shard.seq_len": 32})
    with pytest.raises(UserError, match=rf"belong to run {cfg_a.run_dir} and were made from another") as err:
        make_shards(shard_job(cfg_c))
    assert "\n" not in str(err.value)
    assert sorted(p for p in shards.rglob("*.tfrecord")) == files and (shards / "manifest.json").exists()
    # With A's settings but unfinished: also A's to finish, not B's.
    with pytest.raises(UserError, match=rf"belong to run {cfg_a.run_dir} and are unfinished"):
        make_shards(shard_job(cfg_b))
    assert sorted(p for p in shards.rglob("*.tfrecord")) == files


def test_a_run_borrowing_a_shard_set_with_a_missing_file_rewrites_nothing_of_it(tmp_path, small_corpus,
                                                                                 tiny_tokenizer_dir, ray_local):
    """With shard.dir=A/shards and one of A's shard files gone, the unit was put back on the
    to-do list, written into A's directory, and A's manifest rewritten as this run's, incomplete."""
    from tests.helpers import tiny_config
    from tpu_ray.prepare.shards import make_shards
    from tpu_ray.pipeline import shard_job

    cfg_a = tiny_config(tmp_path / "a", small_corpus, **{"tokenizer.path": tiny_tokenizer_dir})
    make_shards(shard_job(cfg_a))
    shards = tmp_path / "a" / "shards"
    gone = sorted(shards.rglob("*.tfrecord"))[0]
    gone.unlink()
    before = {p: p.read_bytes() for p in shards.rglob("*") if p.is_file()}
    cfg_b = tiny_config(tmp_path / "b", small_corpus, **{"tokenizer.path": tiny_tokenizer_dir,
                                                          "shard.dir": str(shards)})
    with pytest.raises(UserError, match=rf"belong to run {cfg_a.run_dir} and 1 of their units lost or changed a "
                                        rf"file \(e\.g\. .*{gone.name}\).*tpu-ray shard --output-dir") as err:
        make_shards(shard_job(cfg_b))
    assert "\n" not in str(err.value)
    assert {p: p.read_bytes() for p in shards.rglob("*") if p.is_file()} == before
