"""What model.init_from copies and reads stays inside its directories (train/init_from.py): a planted
RUN/init record writes nothing outside the cache, a model directory's link to a file outside it is
refused, and a safetensors index may name only files of the model directory."""

from __future__ import annotations

import json

import pytest

from tpu_ray.errors import DamagedRunDir, UserError

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier


def _planted_init_record(run: str, files: dict[str, str], sha: str) -> None:
    """RUN/init/source.json as whoever can write the run's gs:// folder would edit it."""
    from tpu_ray import storage

    storage.atomic_write_text(f"{run}/config.yaml", "name: t\n")
    storage.atomic_write_text(f"{run}/init/source.json", json.dumps(
        {"source": "/models/base", "kind": "hf", "resolved": "/models/base", "sha256": sha, "files": files}))


@pytest.mark.parametrize("key, sha", [
    ("../../../../escaped.txt", "a" * 64),  # a `files` key that climbs out of the staging directory
    ("config.json", "../../../../escaped-dir"),  # the record's sha256 used as the cache folder's name
])
def test_a_planted_init_record_writes_nothing_outside_the_cache(gcs_emulator, tmp_path, monkeypatch, key, sha):
    """The next host staging RUN/init from gs:// downloaded each `files` key to `tmp / key`."""
    import hashlib

    from tpu_ray.train.init_from import _copy_source, read_record

    cache = tmp_path / "home" / "a" / "b" / "c"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    run = f"{gcs_emulator.make_bucket()}/run"
    payload = b"echo pwned\n"
    _planted_init_record(run, {key: hashlib.sha256(payload).hexdigest()}, sha)
    before = {p for p in tmp_path.rglob("*") if "tpu-ray" not in p.parts}
    with pytest.raises(DamagedRunDir, match=r"init/source\.json: .*(names '\.\./|not the record)") as err:
        _copy_source(run, read_record(run))
    assert "\n" not in str(err.value)
    assert {p for p in tmp_path.rglob("*") if "tpu-ray" not in p.parts} == before


def test_a_model_directory_link_to_a_file_outside_is_refused_not_copied(tmp_path):
    """A cloned model repository shipping `vocab.txt -> ~/.netrc` put that file into RUN/init and
    from there into RUN/model (which the card says to publish)."""
    from tests.helpers import tiny_config
    from tpu_ray.train.init_from import own_copy

    netrc = tmp_path / "netrc"
    netrc.write_text("machine host login alice password s3cr3t\n")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (model / "tf_model.h5").write_bytes(b"weights")
    (model / "tokenizer.json").write_text("{}")
    (model / "vocab.txt").symlink_to(netrc)
    (model / "special_tokens_map.json").symlink_to("tokenizer.json")  # a link inside the directory is fine
    cfg = tiny_config(tmp_path / "run", tmp_path / "corpus.txt", **{"model.init_from": str(model)})
    with pytest.raises(UserError, match=r"model: vocab\.txt is a link to .*netrc, outside the model directory") as e:
        own_copy(cfg.init_spec)
    assert "\n" not in str(e.value)
    leaked = [p for p in (tmp_path / "run").rglob("*") if p.is_file() and b"s3cr3t" in p.read_bytes()]
    assert not leaked
    (model / "vocab.txt").unlink()
    (model / "vocab.txt").write_text("[PAD]\n")
    own_copy(cfg.init_spec)
    assert (tmp_path / "run" / "init" / "special_tokens_map.json").read_text() == "{}"


def test_safetensors_index_naming_a_file_outside_the_model_dir_is_refused(tmp_path):
    from safetensors.numpy import save_file

    from tpu_ray.train.init_from import Source, _load_safetensors

    import numpy as np

    outside = tmp_path / "elsewhere.safetensors"
    save_file({"w": np.zeros(2, dtype=np.float32)}, str(outside))
    model = tmp_path / "model"
    model.mkdir()
    index = model / "model.safetensors.index.json"
    for name in (str(outside), "../elsewhere.safetensors"):
        index.write_text(json.dumps({"weight_map": {"w": name}}))
        with pytest.raises(UserError, match=r"weight_map names .*not a file of the model directory") as err:
            _load_safetensors(None, str(model / "model.safetensors"), str(index), Source("hf", str(model), str(model)))
        assert "\n" not in str(err.value)
    (model / "link.safetensors").symlink_to(outside)  # a link inside pointing out: also outside
    index.write_text(json.dumps({"weight_map": {"w": "link.safetensors"}}))
    with pytest.raises(UserError, match="not a file of the model directory"):
        _load_safetensors(None, str(model / "model.safetensors"), str(index), Source("hf", str(model), str(model)))
