"""Continued pretraining (`model.init_from`) from checkpoint directories made the way the ecosystem
makes them: TensorFlow `save_pretrained` (tf_model.h5), PyTorch Transformers 5 `save_pretrained`
(model.safetensors only, written in the interop venv), a tpu-ray RUN/model and run directory, a
name in a Hugging Face cache the test lays out itself; and the hostile cases, one line each.

The proof that the weights really loaded: the continued run's first-step loss (dropout 0, before
any update) is the checkpoint's own loss on that batch, and far from a fresh model's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import REPO, tiny_config
from tests.test_train import _records
from tpu_ray.errors import UserError

VENVS = Path(os.environ.get("TPU_RAY_INTEROP_VENVS", REPO / ".venv-interop"))
SAVE_PRETRAINED = REPO / "tests" / "interop" / "save_pretrained.py"


@pytest.fixture(scope="module")
def source(tiny_roberta_run):
    """A tpu-ray run (roberta, tiny) trained 30 steps on the corpus, and its RUN/model (conftest.py's,
    shared with tests/test_vocabulary.py)."""
    return tiny_roberta_run


@pytest.fixture(scope="module")
def tf_dir(source, tmp_path_factory) -> Path:
    """The source model as TensorFlow's save_pretrained writes it: tf_model.h5, config, tokenizer."""
    from transformers import AutoTokenizer, TFAutoModelForMaskedLM

    out = tmp_path_factory.mktemp("tf") / "ckpt"
    TFAutoModelForMaskedLM.from_pretrained(str(source / "model"), use_safetensors=False).save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(source / "model")).save_pretrained(str(out))
    assert (out / "tf_model.h5").exists() and not (out / "model.safetensors").exists()
    return out


def _interop_python(venv: str = "t5") -> Path:
    python = VENVS / venv / "bin" / "python"
    if not python.exists():
        why = f"PyTorch interop venv {VENVS / venv} absent: build it with tests/interop/setup_venvs.sh"
        if os.environ.get("TPU_RAY_REQUIRE_EXTRAS"):
            pytest.fail(why)
        pytest.skip(why)
    return python


@pytest.fixture(scope="module")
def pt5_dir(source, tmp_path_factory) -> Path:
    """The source model as PyTorch Transformers 5's save_pretrained writes it: safetensors only."""
    python = _interop_python()
    out = tmp_path_factory.mktemp("pt5") / "ckpt"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([str(python), str(SAVE_PRETRAINED), str(source / "model"), str(out)],
                          capture_output=True, text=True, timeout=600, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["transformers"].startswith("5.") and "model.safetensors" in info["files"]
    assert "tf_model.h5" not in info["files"]
    return out


_MODELS: dict[str, object] = {}  # each model _first_batch_loss reads, built once in this module


def _first_batch_loss(cfg, model_dir: str | None) -> float:
    """Masked-LM loss of a model on the continued run's first training batch (same masks):
    the checkpoint's own weights (`model_dir`), or a fresh model of the run's config (None). The
    continued runs here start from one checkpoint: its model and the fresh one (keyed by their
    config and seed) are built once, not once per test."""
    import tensorflow as tf
    from transformers import TFAutoModelForMaskedLM

    from tests.helpers import shard_files
    from tpu_ray.prepare.tokenizer import tokenizer_info
    from tpu_ray.train.inputs import train_dataset
    from tpu_ray.train.loop import mask_spec, masked_sums, mlm_logits
    from tpu_ray.train.model import hf_config

    tok = tokenizer_info(cfg.tokenizer_dir)
    files = [p for p, _ in shard_files(cfg.shards_dir, "train")]
    batch = next(iter(train_dataset(files, cfg.shard.seq_len, cfg.train.batch_size, mask_spec(cfg.train, cfg.paths, tok), cfg.seed,
                                    cfg.train.shuffle_buffer)))
    config = {k: v for k, v in json.loads(hf_config(cfg.model_spec, tok).to_json_string()).items() if k != "_name_or_path"}
    key = model_dir or f"fresh, seed {cfg.seed}: {json.dumps(config, sort_keys=True)}"
    if key not in _MODELS:
        if model_dir:
            _MODELS[key] = TFAutoModelForMaskedLM.from_pretrained(model_dir, use_safetensors=False)
        else:
            tf.keras.utils.set_random_seed(cfg.seed)
            _MODELS[key] = TFAutoModelForMaskedLM.from_config(hf_config(cfg.model_spec, tok))
    model = _MODELS[key]
    loss_sum, _, count = masked_sums(batch["mlm_labels"], mlm_logits(model, batch, training=False))
    return float(loss_sum / count)


def _continue(tmp: Path, corpus: Path, init_from: str, **over):
    from tpu_ray.pipeline import Pipeline

    cfg = tiny_config(tmp / "cont", corpus, **{"model.init_from": init_from, "model.dropout": 0.0,
                                               "train.steps": 2, "train.log_every": 1, **over})
    p = Pipeline(cfg)
    p.run()
    return p.cfg


def _check_continued(cfg, source: Path) -> None:
    from tests.helpers import manifest_json
    from tpu_ray.prepare.tokenizer import tokenizer_info

    src_tok = tokenizer_info(str(source / "tokenizer"))
    tok = tokenizer_info(cfg.tokenizer_dir)
    assert tok.sha256 == src_tok.sha256  # the checkpoint's tokenizer, copied, not a new one
    assert tok.special_tokens == ("<s>", "<pad>", "</s>", "<unk>", "<mask>")  # RoBERTa's own convention
    assert manifest_json(cfg.shards_dir)["tokenizer_sha256"] == tok.sha256
    first = next(r for r in _records(Path(cfg.run_dir), "train") if r["step"] == 1)
    own = _first_batch_loss(cfg, str(source / "model"))
    fresh = _first_batch_loss(cfg, None)
    print(f"first-step loss {first['loss']:.5f}, checkpoint's own {own:.5f}, fresh model {fresh:.5f}")
    assert first["loss"] == pytest.approx(own, rel=1e-4)
    assert abs(fresh - own) > 0.3  # a fresh model's loss is far off: the weights were loaded


@pytest.mark.slow  # a continued pipeline run and two resumes: about a minute on 2 cores
def test_continue_from_a_tensorflow_save_pretrained_directory_then_resume_without_it(tf_dir, source, tmp_path,
                                                                                   small_corpus, caplog):
    """Continued from a TensorFlow save_pretrained directory: the checkpoint's tokenizer and weights.
    Also: config.yaml and the model card once said the defaults a continued config leaves in
    (another tokenizer kind and size, another preset), and doctor FAILed the valid config comparing
    the default vocabulary with the checkpoint's embedding rows; and this single-source run
    logs each evaluation once, not once for its source and once pooled.
    Then the same run resumed: the first stage copied the checkpoint into RUN/init (source and hash
    in source.json, config.yaml and summary.json); a resume reads that copy: with the source deleted
    it continues with exactly the losses of a resume with the source in place. (One continued run
    for both, which were two tests continuing the same directory.)"""
    import logging

    import yaml

    from tests.test_doctor import doctor  # doctor reads the checkpoint's config as training does
    from tpu_ray.pipeline import Pipeline
    from tpu_ray.prepare.tokenizer import tokenizer_info

    src = tmp_path / "src"  # a copy: deleted below
    shutil.copytree(tf_dir, src)
    # Also a fresh model's start: the bias and the initialisation scale are the checkpoint's.
    left_in = {"tokenizer.kind": "wordpiece", "tokenizer.vocab_size": 5000, "model.preset": "small",
               "model.output_bias": "unigram", "model.initializer_range": 0.2}
    with caplog.at_level(logging.INFO, logger="tpu_ray.train.loop"):
        cfg = _continue(tmp_path, small_corpus, str(src), **left_in, **{"train.checkpoint_every": 2})
    assert cfg.model.model_type == "roberta" and cfg.model.hidden_size == 64
    _check_continued(cfg, source)
    evals = [r.getMessage() for r in caplog.records if r.getMessage().startswith("eval")]
    assert [e.split(":")[0] for e in evals] == ["eval @ step 0", "eval @ step 2"], evals  # the start's and the end's
    assert not [r for r in _records(Path(cfg.run_dir), "event") if r["event"] == "output_bias"]
    run = Path(cfg.run_dir)
    text = (run / "config.yaml").read_text()
    assert f"init_from: {src}" in text
    vocab, saved = tokenizer_info(str(source / "tokenizer")).vocab_size, yaml.safe_load(text)
    assert saved["tokenizer"]["kind"] == "unigram" and saved["tokenizer"]["vocab_size"] == vocab, saved["tokenizer"]
    assert saved["model"]["preset"] == "tiny" and saved["model"]["hidden_size"] == 64
    assert saved["model"]["output_bias"] == "zeros" and saved["model"]["initializer_range"] is None
    card = (run / "model" / "README.md").read_text()
    assert "- recipe: peak learning rate" in card and "weights from model.init_from" in card, card[:800]
    assert f"- tokenizer: unigram, vocabulary {vocab}" in card and "hidden 64, 2 layers" in card, card[:800]
    assert f"(continued from {src} at its global step 30)" in card, card[:800]  # the source run's 30 steps
    code, checks = doctor(tiny_config(run, small_corpus, **{"model.init_from": str(src), **left_in}))
    assert checks["vocab"][0] == "PASS" and checks["positions"][0] == "PASS", checks
    assert "FAIL" not in {status for status, _ in checks.values()}, checks

    record = json.loads((run / "init" / "source.json").read_text())
    assert record["source"] == str(src) and record["sha256"] == cfg.model.init_sha256
    assert {"config.json", "tf_model.h5", "tokenizer.json"} <= set(record["files"])
    assert f"init_sha256: {record['sha256']}" in (run / "config.yaml").read_text()
    assert json.loads((run / "summary.json").read_text())["init_from"]["sha256"] == record["sha256"]
    twin = tmp_path / "twin"
    shutil.copytree(run, twin)
    more = {"model.init_from": str(src), "model.dropout": 0.0, "train.steps": 4, "train.log_every": 1,
            "train.checkpoint_every": 2, "train.extend_schedule": True}
    with_source = Pipeline(tiny_config(run, small_corpus, **more)).train(resume=True)
    shutil.rmtree(src)  # the source is gone: the twin resumes from its own copy
    without = Pipeline(tiny_config(twin, small_corpus, **more)).train(resume=True)
    assert with_source["resumed_from"] == without["resumed_from"] == 2 and without["steps"] == 4
    assert _losses(str(twin), range(3, 5)) == pytest.approx(_losses(str(run), range(3, 5)), rel=1e-6)
    # The export says where its steps stand: the source model was saved at the source run's step 30
    # (its export's provenance, which save_pretrained kept), read from the copy once the source is gone.
    for made in (run, twin):
        stamp = json.loads((made / "model" / "config.json").read_text())["tpu_ray_export"]
        assert (stamp["step"], stamp["global_step"]) == (4, 30 + 4), stamp


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_continue_from_a_pytorch_transformers_5_safetensors_directory(pt5_dir, source, tmp_path, small_corpus):
    import sys as _sys

    cfg = _continue(tmp_path, small_corpus, str(pt5_dir))
    _check_continued(cfg, source)
    assert "torch" not in _sys.modules  # converted with numpy, never torch


@pytest.mark.slow  # a third continued pipeline run and a resume: about a minute on 2 cores
def test_continue_from_a_run_directory_and_resume_the_continued_run(source, tmp_path, small_corpus):
    """A run directory is its last committed checkpoint; the continued run then resumes like any
    other (from its own checkpoint, not from init_from again)."""
    from tpu_ray.pipeline import Pipeline

    cfg = _continue(tmp_path, small_corpus, str(source), **{"train.checkpoint_every": 2})
    _check_continued(cfg, source)
    more = cfg.override({"train.steps": 4, "train.extend_schedule": True})
    summary = Pipeline(more).train(resume=True)
    assert summary["resumed_from"] == 2 and summary["steps"] == 4
    stamp = json.loads((Path(cfg.run_dir) / "model" / "config.json").read_text())["tpu_ray_export"]
    assert (stamp["step"], stamp["global_step"]) == (4, 30 + 4), stamp  # after the source run's 30 steps (ckpt-30)
    inits = [r for r in _records(Path(cfg.run_dir), "event") if r["event"] == "init_from"]
    assert len(inits) == 1  # the resume restored its own checkpoint


def test_a_name_in_the_local_hugging_face_cache(tf_dir, tmp_path, monkeypatch):
    """`init_from: org/name` reads the hub cache (laid out here as huggingface_hub lays it out), no download."""
    from tpu_ray.train.init_from import resolve

    cache = tmp_path / "hub"
    repo = cache / "models--someorg--tiny-roberta"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(tf_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    src = resolve("someorg/tiny-roberta")
    assert src.kind == "hf" and Path(src.local) == repo / "snapshots" / commit
    with pytest.raises(UserError, match="not a directory and not in the local Hugging Face cache"):
        resolve("someorg/not-cached")


# --- hostile: one line each, exit 2 on the CLI ------------------------------------------------------
def _pipeline_error(tmp: Path, corpus: Path, init_from: Path, **over) -> str:
    from tpu_ray.pipeline import Pipeline

    cfg = tiny_config(tmp / "bad", corpus, **{"model.init_from": str(init_from), **over})
    with pytest.raises(UserError) as err:
        Pipeline(cfg).tokenizer()
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_a_directory_without_weights_is_refused_on_the_cli_with_exit_2(tf_dir, tmp_path, small_corpus, capfd):
    """The CLI in this process (its exit code and everything written to the stderr file descriptor)."""
    from tpu_ray.cli import main

    bad = tmp_path / "noweights"
    shutil.copytree(tf_dir, bad)
    (bad / "tf_model.h5").unlink()
    capfd.readouterr()
    code = main(["tokenizer", "--output-dir", str(tmp_path / "r"), "--corpus", str(small_corpus),
                 f"model.init_from={bad}"])
    stderr = capfd.readouterr().err
    assert code == 2, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "no weights (tf_model.h5 or model.safetensors)" in lines[0], stderr


def test_a_tokenizer_whose_vocabulary_disagrees_with_the_embedding(tf_dir, tmp_path, small_corpus):
    bad = tmp_path / "vocab"
    shutil.copytree(tf_dir, bad)
    config = json.loads((bad / "config.json").read_text())
    config["vocab_size"] += 200
    (bad / "config.json").write_text(json.dumps(config))
    msg = _pipeline_error(tmp_path, small_corpus, bad)
    assert f"embedding has {config['vocab_size']} rows" in msg and "use the tokenizer the checkpoint" in msg


def test_a_tokenizer_path_beside_a_checkpoint_must_fit_its_embedding(tf_dir, tmp_path, small_corpus):
    from tpu_ray.config import TokenizerConfig
    from tpu_ray.prepare.tokenizer import save_tokenizer, train_tokenizer

    lines = [s for s in small_corpus.read_text().splitlines() if s.strip()]
    other = str(tmp_path / "other-tok")
    save_tokenizer(train_tokenizer([lines], TokenizerConfig(vocab_size=300)), other, 64)
    msg = _pipeline_error(tmp_path, small_corpus, tf_dir, **{"tokenizer.path": other})
    assert msg.startswith(other) and "the checkpoint's embedding has" in msg


@pytest.mark.parametrize("model_type, why", [("tapas", "table structure"), ("gpt2", "not a TensorFlow masked-LM type")])
def test_an_unsupported_type(tf_dir, tmp_path, small_corpus, model_type, why):
    bad = tmp_path / "type"
    shutil.copytree(tf_dir, bad)
    config = json.loads((bad / "config.json").read_text())
    config["model_type"] = model_type
    (bad / "config.json").write_text(json.dumps(config))
    msg = _pipeline_error(tmp_path, small_corpus, bad)
    assert f"model_type={model_type}" in msg and why in msg


def test_seq_len_over_the_position_embeddings(tf_dir, tmp_path, small_corpus):
    msg = _pipeline_error(tmp_path, small_corpus, tf_dir, **{"shard.seq_len": 513})
    assert "shard.seq_len=513" in msg and "514 position embeddings" in msg and "shard.seq_len <= 512" in msg


def test_explicit_sizes_that_disagree_with_the_checkpoint(tf_dir, tmp_path, small_corpus):
    msg = _pipeline_error(tmp_path, small_corpus, tf_dir, **{"model.hidden_size": 128})
    assert msg.startswith("model.hidden_size=128: the checkpoint") and "hidden_size=64" in msg


@pytest.mark.parametrize("weights", ["tf_model.h5", "model.safetensors"])
def test_truncated_weights(tf_dir, source, tmp_path, weights):
    """Half a weights file: one line naming it, at the load (not a traceback from h5py/safetensors)."""
    from transformers import TFAutoModelForMaskedLM

    from tpu_ray.train.init_from import checkpoint_hf_config, load_weights

    bad = tmp_path / "trunc"
    shutil.copytree(tf_dir, bad)
    if weights == "model.safetensors":
        (bad / "tf_model.h5").unlink()
        shutil.copy(source / "model" / "model.safetensors", bad / weights)
    data = (bad / weights).read_bytes()
    (bad / weights).write_bytes(data[: len(data) // 2])
    cfg = tiny_config(tmp_path / "r", tmp_path / "unused.txt", **{"model.init_from": str(bad)})
    model = TFAutoModelForMaskedLM.from_config(checkpoint_hf_config(cfg.init_spec))
    model(model.dummy_inputs)
    with pytest.raises(UserError) as err:
        load_weights(model, cfg.init_spec)
    msg = str(err.value)
    assert "\n" not in msg and weights in msg and "truncated" in msg, msg


def test_safetensors_weights_load_equal_to_tf_model_h5(tf_dir, source, tmp_path):
    """The numpy converter (PyTorch layout -> TF variables) gives exactly the TF weights."""
    from transformers import TFAutoModelForMaskedLM

    from tpu_ray.train.init_from import checkpoint_hf_config, load_weights

    st = tmp_path / "st"
    shutil.copytree(tf_dir, st)
    (st / "tf_model.h5").unlink()
    shutil.copy(source / "model" / "model.safetensors", st / "model.safetensors")
    cfg = tiny_config(tmp_path / "r", tmp_path / "unused.txt", **{"model.init_from": str(st)})
    model = TFAutoModelForMaskedLM.from_config(checkpoint_hf_config(cfg.init_spec))
    model(model.dummy_inputs)
    load_weights(model, cfg.init_spec)
    ref = TFAutoModelForMaskedLM.from_pretrained(str(tf_dir), use_safetensors=False)
    def unscoped(name: str) -> str:  # without the model instance's own scope (tf_roberta_for_masked_lm_N/)
        return name.split("/", 1)[1]

    ref_weights = {unscoped(w.name): w.numpy() for w in ref.weights}
    assert len(model.weights) == len(ref_weights)
    for w in model.weights:
        assert np.array_equal(w.numpy(), ref_weights[unscoped(w.name)]), w.name


@pytest.mark.slow  # the storage emulator's start-up on top of the source run
def test_a_gs_model_directory_is_staged_and_loads(gcs_emulator, tf_dir, tmp_path):
    """gs://bucket/model (as a team keeps checkpoints): staged once locally, the same weights."""
    from transformers import TFAutoModelForMaskedLM

    from tpu_ray import storage
    from tpu_ray.train.init_from import checkpoint_hf_config, load_weights, resolve

    root = storage.join(gcs_emulator.make_bucket(), "models", "tiny")
    for f in sorted(tf_dir.iterdir()):
        storage.atomic_copy_file(str(f), storage.join(root, f.name))
    src = resolve(root)
    assert src.kind == "hf" and Path(src.local, "tf_model.h5").read_bytes() == (tf_dir / "tf_model.h5").read_bytes()
    cfg = tiny_config(tmp_path / "r", tmp_path / "unused.txt", **{"model.init_from": root})
    model = TFAutoModelForMaskedLM.from_config(checkpoint_hf_config(cfg.init_spec))
    model(model.dummy_inputs)
    assert load_weights(model, cfg.init_spec).endswith("tf_model.h5")
    ref = TFAutoModelForMaskedLM.from_pretrained(str(tf_dir), use_safetensors=False)
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(model.weights, ref.weights))


# --- a continued run owns what it starts from (RUN/init) ----------------------------------------------
def _losses(run_dir: str, steps: range) -> list[float]:
    by_step = {r["step"]: r["loss"] for r in _records(Path(run_dir), "train")}
    return [by_step[s] for s in steps]


def test_after_the_first_stage_the_source_is_never_read_again(tf_dir, source, tmp_path, small_corpus):
    """Changed after the tokenizer stage (another model written over it), then deleted: the model
    the run builds and loads is the one it copied (its config, its weights)."""
    from transformers import TFAutoModelForMaskedLM

    from tpu_ray.pipeline import Pipeline
    from tpu_ray.train.init_from import checkpoint_hf_config, load_weights

    src = tmp_path / "src"
    shutil.copytree(tf_dir, src)
    cfg = tiny_config(tmp_path / "run", small_corpus, **{"model.init_from": str(src)})
    Pipeline(cfg).tokenizer()
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "hidden_size": 128, "intermediate_size": 256}))
    (src / "tf_model.h5").write_bytes(b"not the weights")
    p = Pipeline(cfg)  # as the next stage, a resume, a TPU host or a recovery attempt builds it
    assert p.cfg.model.hidden_size == 64 and p.cfg.model.init_sha256
    shutil.rmtree(src)
    model = TFAutoModelForMaskedLM.from_config(checkpoint_hf_config(p.cfg.init_spec))
    model(model.dummy_inputs)
    assert load_weights(model, p.cfg.init_spec) == str(tmp_path / "run" / "init" / "tf_model.h5")
    ref = TFAutoModelForMaskedLM.from_pretrained(str(tf_dir), use_safetensors=False)
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(model.weights, ref.weights))


def test_a_damaged_copy_is_refused_in_one_line(tf_dir, tmp_path, small_corpus):
    from tpu_ray.errors import DamagedRunDir
    from tpu_ray.pipeline import Pipeline

    cfg = tiny_config(tmp_path / "run", small_corpus, **{"model.init_from": str(tf_dir)})
    Pipeline(cfg).tokenizer()
    copy = tmp_path / "run" / "init" / "config.json"
    copy.write_text(copy.read_text().replace("64", "65", 1))
    with pytest.raises(DamagedRunDir) as err:
        Pipeline(cfg)
    assert "\n" not in str(err.value) and str(copy) in str(err.value) and "differs from the sha256" in str(err.value)


def test_a_pinned_hash_that_the_source_does_not_hold_is_refused(tf_dir, tmp_path, small_corpus):
    msg = _pipeline_error(tmp_path, small_corpus, tf_dir, **{"model.init_sha256": "0" * 64})
    assert msg.startswith("model.init_sha256=" + "0" * 64) and "now holds other content" in msg
    assert not (tmp_path / "bad" / "init").exists()


@pytest.mark.slow  # the storage emulator's start-up
def test_a_gs_source_reuploaded_to_the_same_url_is_fetched_again(gcs_emulator, tf_dir, tmp_path, small_corpus,
                                                                   monkeypatch):
    """Fetched through a per-user cache keyed by the objects' generations (not a fixed path in the
    shared temporary directory): the next run sees v2. The run itself holds its own copy."""
    import stat
    import tempfile

    from tpu_ray import storage
    from tpu_ray.pipeline import Pipeline
    from tpu_ray.train.init_from import resolve, source_hf_config

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = storage.join(gcs_emulator.make_bucket(), "models", "tiny")
    for f in sorted(tf_dir.iterdir()):
        storage.atomic_copy_file(str(f), storage.join(root, f.name))
    v1 = resolve(root)
    assert source_hf_config(v1).hidden_size == 64
    assert v1.local.startswith(str(tmp_path / "cache" / "tpu-ray"))  # this user's cache, never tmp/tpu-ray-init-from
    assert not Path(tempfile.gettempdir(), "tpu-ray-init-from").exists() or "tpu-ray-init-from" not in v1.local
    assert stat.S_IMODE(os.stat(tmp_path / "cache" / "tpu-ray").st_mode) == 0o700
    cfg = tiny_config(tmp_path / "run", small_corpus, **{"model.init_from": root})
    Pipeline(cfg).tokenizer()  # the run's own copy, fetched into RUN/init
    config = json.loads((tf_dir / "config.json").read_text())
    storage.atomic_write_text(storage.join(root, "config.json"), json.dumps({**config, "hidden_size": 128}))
    v2 = resolve(root)
    assert v2.local != v1.local and source_hf_config(v2).hidden_size == 128
    assert Pipeline(cfg).cfg.model.hidden_size == 64  # the run reads its copy, not the re-upload


@pytest.mark.slow  # the storage emulator's start-up
def test_a_gs_run_directory_holds_its_copy_and_every_host_reads_it(gcs_emulator, tf_dir, tmp_path, small_corpus,
                                                                   monkeypatch):
    """A TPU host (or a recovery attempt) of a gs:// run reads RUN/init from the bucket into its own
    cache, verified against source.json: the local source, which exists only on the driver, is gone."""
    from transformers import TFAutoModelForMaskedLM

    from tpu_ray import storage
    from tpu_ray.pipeline import Pipeline
    from tpu_ray.train.init_from import checkpoint_hf_config, load_weights, source_for

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "host-cache"))
    src = tmp_path / "src"
    shutil.copytree(tf_dir, src)
    run = storage.join(gcs_emulator.make_bucket(), "runs", "cont")
    cfg = tiny_config(tmp_path / "unused", small_corpus, **{"output_dir": run, "model.init_from": str(src)})
    p = Pipeline(cfg)
    p.tokenizer()
    assert storage.exists(storage.join(run, "init", "source.json"))
    shutil.rmtree(src)
    host_cfg = Pipeline(cfg).cfg  # what run_training hands every host
    got = source_for(host_cfg.init_spec)
    assert got.kind == "copy" and got.where == storage.join(run, "init")
    assert got.local.startswith(str(tmp_path / "host-cache")) and host_cfg.model.init_sha256 in got.local
    model = TFAutoModelForMaskedLM.from_config(checkpoint_hf_config(host_cfg.init_spec))
    model(model.dummy_inputs)
    assert load_weights(model, host_cfg.init_spec).endswith("tf_model.h5")
    ref = TFAutoModelForMaskedLM.from_pretrained(str(tf_dir), use_safetensors=False)
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(model.weights, ref.weights))

