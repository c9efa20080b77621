"""The exported model outlives TensorFlow: RUN/model/model.safetensors loads in PyTorch Transformers
4.57 and 5.x, with no TensorFlow installed, to the TensorFlow model's logits.

The TensorFlow side runs here (tpu-ray's env, no torch) and saves the reference logits; the PyTorch
side runs tests/interop/torch_side.py in the venvs tests/interop/setup_venvs.sh builds. Without
those venvs the PyTorch tests skip and say how to build them.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import REPO, tiny_config
from tests.test_train import write_shards

VENVS = Path(os.environ.get("TPU_RAY_INTEROP_VENVS", REPO / ".venv-interop"))
TORCH_SIDE = REPO / "tests" / "interop" / "torch_side.py"
TEXTS = ["The [MASK] of the river was built in the year.", "A [MASK] song ."]  # 2 lengths: padding too
FILL_TEXT = TEXTS[0]


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_tokenizer_dir):
    """A tiny model trained by the real trainer, exported to RUN/model, plus the TF reference."""
    from tpu_ray.prepare.tokenizer import tokenizer_info
    from tpu_ray.train.loop import train

    root = tmp_path_factory.mktemp("interop")
    shards = root / "shards"
    write_shards(shards, tokenizer_info(tiny_tokenizer_dir).vocab_size)
    cfg = tiny_config(root / "run", root / "unused.txt", **{"tokenizer.path": tiny_tokenizer_dir,
                                                            "shard.dir": str(shards)})
    summary = train(cfg)
    model_dir = Path(summary["model_dir"])
    ref = _tf_reference(model_dir, use_safetensors=False)  # tf_model.h5: TensorFlow's own weights
    np.savez(root / "reference.npz", **{k: v for k, v in ref.items() if k != "fill_mask"})
    return {"model_dir": model_dir, "reference": root / "reference.npz", "ref": ref, "summary": summary}


def _tf_reference(model_dir: Path, use_safetensors: bool) -> dict:
    from transformers import AutoTokenizer, TFAutoModelForMaskedLM, pipeline

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    batch = tok(TEXTS, padding=True, return_tensors="np")
    model = TFAutoModelForMaskedLM.from_pretrained(str(model_dir), use_safetensors=use_safetensors)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], training=False).logits
    unmasker = pipeline("fill-mask", model=model, tokenizer=tok, framework="tf", dtype=None)  # no torch here
    return {"input_ids": batch["input_ids"].astype(np.int64), "attention_mask": batch["attention_mask"].astype(np.int64),
            "logits": logits.numpy(), "fill_mask": unmasker(FILL_TEXT, top_k=5)}


def test_export_holds_pytorch_weights_tokenizer_and_model_card(exported):
    from safetensors import safe_open

    d, summary = exported["model_dir"], exported["summary"]
    for name in ("model.safetensors", "tf_model.h5", "config.json", "tokenizer.json", "README.md"):
        assert (d / name).exists(), name
    with safe_open(str(d / "model.safetensors"), framework="numpy") as f:
        assert f.metadata() == {"format": "pt"}
        keys = set(f.keys())
        query = f.get_tensor("roberta.encoder.layer.0.attention.self.query.weight")
    # PyTorch names; the decoder is tied to the word embeddings, so (as PyTorch saves it) not stored.
    assert {"roberta.embeddings.word_embeddings.weight", "lm_head.bias", "lm_head.dense.weight",
            "lm_head.layer_norm.weight"} <= keys
    assert not any(k.startswith("lm_head.decoder") for k in keys)
    assert not any(k.endswith((":0", "kernel", "gamma", "beta")) for k in keys)
    import tensorflow as tf  # the TF kernel is [in, out]; PyTorch's weight is its transpose
    from transformers import TFAutoModelForMaskedLM

    tf_model = TFAutoModelForMaskedLM.from_pretrained(str(d), use_safetensors=False)
    kernel = next(w for w in tf_model.weights if w.name.endswith("layer_._0/attention/self/query/kernel:0"))
    assert kernel.shape[0] == query.shape[1] and np.array_equal(query, tf.transpose(kernel).numpy())
    card = (d / "README.md").read_text()
    gb, seq = 16, 64
    assert f"{summary['steps']} steps" in card and f"{summary['steps'] * gb * seq:,} tokens seen" in card
    assert f"{summary['eval_loss']:.4f}" in card and f"perplexity {summary['perplexity']:.2f}" in card
    assert "pipeline_tag: fill-mask" in card


def test_tensorflow_users_still_load_the_export_beside_model_safetensors(exported):
    """TF Transformers would pick model.safetensors and fail on it (transformers #40028): tpu-ray's
    fill-mask and README's TensorFlow call read tf_model.h5, so the TF path is unchanged."""
    from tpu_ray.train.export import fill_mask

    preds = fill_mask(str(exported["model_dir"]), FILL_TEXT, top_k=5)
    assert [p["token_str"] for p in preds] == [p["token_str"] for p in exported["ref"]["fill_mask"]]


@pytest.mark.parametrize("venv,major", [("t4", "4.57"), ("t5", "5.")])
def test_pytorch_transformers_without_tensorflow_gives_the_tf_logits(exported, venv, major):
    python = VENVS / venv / "bin" / "python"
    if not python.exists():
        why = (f"PyTorch interop venv {VENVS / venv} absent: build it with tests/interop/setup_venvs.sh "
               f"(torch 2.13.0 CPU + transformers 4.57 and 5.x, a few minutes)")
        if os.environ.get("TPU_RAY_REQUIRE_EXTRAS"):  # CI: a missing venv is a failure, not a skip
            pytest.fail(why)
        pytest.skip(why)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([str(python), str(TORCH_SIDE), str(exported["model_dir"]), str(exported["reference"]),
                           FILL_TEXT], capture_output=True, text=True, timeout=600, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{venv}: transformers {out['transformers']} torch {out['torch']} max|dlogits|={out['max_abs_diff']:.2e}")
    assert out["transformers"].startswith(major)
    assert not out["tensorflow_importable"]
    assert out["model_class"] == "RobertaForMaskedLM"
    assert all(not v for v in out["loading_info"].values()), out["loading_info"]  # nothing missing or re-initialised
    assert out["tied"]
    assert out["shape"] == list(exported["ref"]["logits"].shape)
    assert out["max_abs_diff"] < 1e-4
    tf_preds = exported["ref"]["fill_mask"]
    assert [p["token_str"] for p in out["fill_mask"]] == [p["token_str"] for p in tf_preds]
    assert np.allclose([p["score"] for p in out["fill_mask"]], [p["score"] for p in tf_preds], atol=1e-4)
