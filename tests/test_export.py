"""The exported model (RUN/model) is replaced whole or not at all, locally and on gs://, and an export
made from another config or checkpoint chain is replaced only with --force. Real directories and a
real GCS emulator, no training."""

from __future__ import annotations

import json

import pytest

from tpu_ray.errors import UserError

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier


def _export_dir(path, weights: bytes, config: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "tf_model.h5").write_bytes(weights)
    (path / "model.safetensors").write_bytes(weights)
    (path / "config.json").write_text(json.dumps(config))


def test_export_cut_mid_way_leaves_the_old_model_whole(tmp_path):
    """The old export was copied over file by file: a crash left tf_model.h5 of one model beside
    model.safetensors of another under an old config.json that said "complete"."""
    from tpu_ray import storage

    model = tmp_path / "run" / "model"
    _export_dir(model, b"old weights", {"model_type": "roberta"})
    new = tmp_path / "new"
    _export_dir(new, b"new weights", {"model_type": "roberta"})
    (new / "tokenizer.json").mkdir()  # cannot be copied: the commit fails after the weights
    with pytest.raises(IsADirectoryError):
        storage.commit_dir(str(new), str(model), last="config.json")
    assert (model / "tf_model.h5").read_bytes() == b"old weights"
    assert (model / "model.safetensors").read_bytes() == b"old weights"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["model"]  # no temp left beside it
    (new / "tokenizer.json").rmdir()
    (model / "stale.bin").write_bytes(b"from the old export")
    storage.commit_dir(str(new), str(model), last="config.json")
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "model.safetensors", "tf_model.h5"]
    assert (model / "tf_model.h5").read_bytes() == b"new weights"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["model"]


def test_export_on_gcs_is_marked_incomplete_while_it_is_replaced(gcs_emulator, tmp_path):
    from tpu_ray import storage

    model = f"{gcs_emulator.make_bucket()}/run/model"
    old = tmp_path / "old"
    _export_dir(old, b"old", {"v": 1})
    (old / "stale.bin").write_bytes(b"x")
    storage.commit_dir(str(old), model, last="config.json")
    new = tmp_path / "new"
    _export_dir(new, b"new", {"v": 2})
    storage.commit_dir(str(new), model, last="config.json")
    assert sorted(storage.find_sizes(model)) == ["config.json", "model.safetensors", "tf_model.h5"]
    assert storage.read_bytes(f"{model}/tf_model.h5") == b"new"


def test_replacing_an_export_of_another_config_or_checkpoint_needs_force(tmp_path, small_corpus, capsys):
    """A rerun with another config after deleting checkpoints/ replaced RUN/model silently."""
    from tests.helpers import tiny_config
    from tpu_ray.cli import main
    from tpu_ray.train.export import PROVENANCE_KEY, config_digest, refuse_replacing_export

    cfg = tiny_config(tmp_path / "run", small_corpus)
    model = tmp_path / "run" / "model"
    _export_dir(model, b"w", {PROVENANCE_KEY: {"config_sha256": "0" * 64, "step": 20}})
    with pytest.raises(UserError, match=r"model: an exported model made from another config is there; pass --force"):
        refuse_replacing_export(config_digest(cfg.fingerprint()), cfg.run_dir, force=False)
    refuse_replacing_export(config_digest(cfg.fingerprint()), cfg.run_dir, force=True)
    # Same config, but no checkpoint continues it (checkpoints/ deleted): another checkpoint chain.
    _export_dir(model, b"w", {PROVENANCE_KEY: {"config_sha256": config_digest(cfg.fingerprint()), "step": 20}})
    with pytest.raises(UserError, match="from another checkpoint"):
        refuse_replacing_export(config_digest(cfg.fingerprint()), cfg.run_dir, force=False)
    ckpt = tmp_path / "run" / "checkpoints"
    ckpt.mkdir()
    for name in ("ckpt-20.index", "ckpt-20.data-00000-of-00001"):
        (ckpt / name).write_bytes(b"x")
    (ckpt / "checkpoint").write_text('model_checkpoint_path: "ckpt-20"\n')
    refuse_replacing_export(config_digest(cfg.fingerprint()), cfg.run_dir, force=False)  # a resumed run continues its own export
    # The CLI refuses before training, in one line, exit 2.
    _export_dir(model, b"w", {PROVENANCE_KEY: {"config_sha256": "0" * 64, "step": 20}})
    code = main(["train", "--output-dir", str(tmp_path / "run"), "--resume", "model.preset=tiny"])
    err = capsys.readouterr()
    assert code == 2 and (model / "tf_model.h5").read_bytes() == b"w"
    assert "made from another config is there; pass --force" in err.out + err.err
