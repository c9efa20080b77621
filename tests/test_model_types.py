"""Every TensorFlow masked-LM type tpu-ray trains (tpu_ray.families): the per-type matrix.

Columns, each its own test so the matrix reads off `pytest -v`: from scratch with one trace of the
step; steps_per_execution 4 == 1 (dropout 0); bfloat16 finite; continued from its own export
(the checkpoint's weights really loaded: from tf_model.h5 alone, and from model.safetensors alone
with an extended vocabulary); continued from a PyTorch-written model.safetensors; the export loads
in PyTorch Transformers 5 to the same logits. Two representative types run in the default suite;
the rest of the matrix is marked slow.

What it costs: nearly all of it is TensorFlow tracing the train and eval steps, once per training
run, so each type trains four times in all (from scratch, 4 steps per execution, bfloat16, an
extended vocabulary) and each run traces as little as shows its behaviour; loading tf_model.h5 is
checked on the trainer's own model without a training step.
One from-scratch run (hidden 32, two layers: the export maps each layer index, a swap of two
would show; vocab ~300, seq_len 32) is the checkpoint every other column reads, made once per type (`scratch_runs`; each type is its own
xdist group, tests/timing.py, so once per run); a run whose evaluation nothing here asserts trains
on shards without a validation split (`train_split_only`: no eval step traced).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import REPO
from tests.test_train import checkpoint_weights
from tpu_ray.families import EXCLUDED, FAMILIES, family, training_order

SEQ = 32
DEFAULT = ("roberta", "bert")  # the two families every other type follows; the rest: -m slow
TYPES = [t if t in DEFAULT else pytest.param(t, marks=pytest.mark.slow) for t in sorted(FAMILIES)]
XDIST_SPLIT_BY = "model_type"  # tests/timing.py: each type's column of tests is a unit for a worker
VENVS = Path(os.environ.get("TPU_RAY_INTEROP_VENVS", REPO / ".venv-interop"))
TORCH_SIDE = REPO / "tests" / "interop" / "torch_side.py"


class TorchSide:
    """tests/interop/torch_side.py --serve in the Transformers 5 venv, started once per worker: each
    question is a line in and a line out, so torch and transformers are imported once, not per call."""

    def __init__(self, python: Path):
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        self.proc = subprocess.Popen([str(python), str(TORCH_SIDE), "--serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd="/")

    def ask(self, fn: str, *args: str):
        assert self.proc.poll() is None, f"the PyTorch side exited ({self.proc.returncode})"
        self.proc.stdin.write(json.dumps({"fn": fn, "args": [str(a) for a in args]}) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:  # a library's own print to stdout is not an answer
            if line.startswith(('{"ok"', '{"error"')):
                answer = json.loads(line)
                assert "error" not in answer, answer.get("error", "")[-3000:]
                return answer["ok"]
        raise AssertionError(f"the PyTorch side exited ({self.proc.wait(timeout=30)}) without answering {fn}")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="session")
def torch_side():
    """The PyTorch Transformers 5 side (None where the interop venv is not built)."""
    python = VENVS / "t5" / "bin" / "python"
    if not python.exists():
        yield None
        return
    side = TorchSide(python)
    yield side
    side.close()


def require_torch_side(side: TorchSide | None) -> TorchSide:
    """The side, or a skip naming how to build it (a failure under TPU_RAY_REQUIRE_EXTRAS=1)."""
    if side is None:
        why = f"PyTorch interop venv {VENVS / 't5'} absent: build it with tests/interop/setup_venvs.sh"
        if os.environ.get("TPU_RAY_REQUIRE_EXTRAS"):
            pytest.fail(why)
        pytest.skip(why)
    return side


@pytest.mark.quick
def test_the_registry_covers_every_tf_masked_lm_type_of_transformers():
    from transformers.models.auto.modeling_tf_auto import TF_MODEL_FOR_MASKED_LM_MAPPING_NAMES

    assert set(FAMILIES) | set(EXCLUDED) == set(TF_MODEL_FOR_MASKED_LM_MAPPING_NAMES)
    assert not set(FAMILIES) & set(EXCLUDED)


def _write_shards(d: Path, tok, n=(40, 24), seed=0) -> None:
    from tpu_ray.prepare.tfrecord import serialize_examples, write_records

    rng = np.random.default_rng(seed)
    d.mkdir(parents=True, exist_ok=True)
    specials = set(tok.special_ids)
    ordinary = np.array([i for i in range(tok.vocab_size) if i not in specials])
    for split, count in (("train", n[0]), ("validation", n[1])):
        rows = ordinary[rng.integers(0, len(ordinary), size=(count, SEQ))]
        rows[:, 0], rows[:, -1] = tok.cls_id, tok.sep_id
        with open(d / f"{split}-00000-{count}.tfrecord", "wb") as f:
            write_records(f, serialize_examples(rows.astype(np.int64)))


@pytest.fixture(scope="module")
def lines(small_corpus) -> list[str]:
    return [s for s in small_corpus.read_text().splitlines() if s.strip()][:1500]


def family_setup(tmp: Path, model_type: str, lines: list[str]) -> tuple[str, Path]:
    """A tokenizer trained for the family (its own special tokens) and random-id shards."""
    from tpu_ray.config import TokenizerConfig
    from tpu_ray.prepare.tokenizer import save_tokenizer, train_tokenizer

    fam = family(model_type)
    tok = train_tokenizer([lines], TokenizerConfig(kind="bpe", vocab_size=300), fam.tokens, training_order(fam))
    tok_dir = str(tmp / "tokenizer")
    info = save_tokenizer(tok, tok_dir, SEQ, fam.tokens)
    assert info.special_tokens == fam.tokens.as_tuple()
    _write_shards(tmp / "shards", info)
    return tok_dir, tmp / "shards"


def type_config(run: Path, model_type: str, tok_dir: str, shards: Path, **over):
    from tpu_ray.config import RunConfig

    base = {
        "name": "m", "output_dir": str(run), "tokenizer": {"path": tok_dir},
        "shard": {"seq_len": SEQ, "dir": str(shards)},
        "model": {"model_type": model_type, "hidden_size": 32, "num_hidden_layers": 2,
                  "num_attention_heads": 2, "intermediate_size": 64, "dropout": 0.0},
        "train": {"steps": 4, "batch_size": 8, "learning_rate": 1e-3, "warmup_steps": 1, "log_every": 1,
                  "eval_every": 4, "checkpoint_every": 4, "shuffle_buffer": 64,
                  "placement": "local"},
        "eval": {"samples": 8},
    }
    return RunConfig.from_dict(base).override(over) if over else RunConfig.from_dict(base)


@pytest.fixture(scope="module")
def scratch_runs(tmp_path_factory, lines, torch_side):
    """model_type -> (tokenizer dir, shards, run dir, summary) of a 4-step run at spe 1, made once.
    It asks for `torch_side` only to start it: PyTorch's imports in that process overlap the first
    training here instead of stalling the first interop test (measured 55 s for that test before)."""
    cache: dict[str, tuple[str, Path, Path, dict]] = {}

    def get(model_type: str):
        if model_type not in cache:
            from tpu_ray.train.loop import train

            root = tmp_path_factory.mktemp(model_type.replace("-", "_"))
            tok_dir, shards = family_setup(root, model_type, lines)
            run = root / "spe1"
            cache[model_type] = (tok_dir, shards, run, train(type_config(run, model_type, tok_dir, shards)))
        return cache[model_type]

    return get


@pytest.mark.parametrize("model_type", TYPES)
def test_from_scratch_traces_the_step_once(scratch_runs, model_type):
    *_, summary = scratch_runs(model_type)
    assert summary["steps"] == 4 and summary["train_traces"] == 1
    assert np.isfinite(summary["final_loss"]) and np.isfinite(summary["eval_loss"])


def train_split_only(shards: Path, out: Path) -> Path:
    """A copy of `shards` without its validation split: a run on it evaluates nothing (no eval step
    traced), for a run whose evaluation nothing here asserts. Each type's evaluation is asserted by
    its from-scratch and bfloat16 runs; a continued run's evaluation of its checkpoint at step 0 by
    tests/test_init_from.py."""
    import shutil

    out.mkdir(parents=True)
    for f in shards.glob("train-*.tfrecord"):
        shutil.copy(f, out / f.name)
    return out


@pytest.mark.parametrize("model_type", TYPES)
def test_four_steps_per_execution_equal_one(scratch_runs, tmp_path, model_type):
    from tpu_ray.train.loop import train

    tok_dir, shards, run1, _ = scratch_runs(model_type)
    summary = train(type_config(tmp_path / "spe4", model_type, tok_dir, train_split_only(shards, tmp_path / "shards"),
                                **{"train.steps_per_execution": 4}))
    assert summary["train_traces"] == 1 and summary["eval_loss"] is None  # the same batches, no evaluation
    # Funnel's pooling sums reassociate differently inside the 4-step loop: measured 1.9e-5.
    bound = 5e-5 if model_type == "funnel" else 1e-5
    assert weight_difference(checkpoint_weights(run1), checkpoint_weights(tmp_path / "spe4")) < bound


@pytest.mark.parametrize("model_type", TYPES)
def test_bfloat16_training_stays_finite(scratch_runs, tmp_path, model_type):
    from tpu_ray.train.loop import train

    tok_dir, shards, *_ = scratch_runs(model_type)
    if family(model_type).float32_only:  # longformer: refused in one line, never a TypeError mid-trace
        _assert_mixed_precision_refused(tmp_path, model_type, tok_dir, shards)
        return
    summary = train(type_config(tmp_path / "bf16", model_type, tok_dir, shards,
                                **{"train.mixed_precision": "mixed_bfloat16"}))
    assert np.isfinite(summary["final_loss"]) and np.isfinite(summary["eval_loss"])


def _assert_mixed_precision_refused(tmp_path: Path, model_type: str, tok_dir: str, shards: Path) -> None:
    """Named in the config: refused when the config is read. Reached through auto (bfloat16 on a
    TPU): refused when the trainer knows its precision, before building the model."""
    from tpu_ray.errors import UserError
    from tpu_ray.train.loop import refuse_precision

    with pytest.raises(UserError, match="cannot train in mixed_bfloat16: .*set train.mixed_precision=float32"):
        type_config(tmp_path / "bf16", model_type, tok_dir, shards, **{"train.mixed_precision": "mixed_bfloat16"})
    cfg = type_config(tmp_path / "auto", model_type, tok_dir, shards)
    with pytest.raises(UserError, match="set train.mixed_precision=float32"):
        refuse_precision(cfg.model.model_type, "mixed_bfloat16")  # what auto resolves to on a TPU
    refuse_precision(cfg.model.model_type, "float32")  # CPU's auto: trains


def export_with_only(run1: Path, weights: str, source: Path) -> Path:
    """A copy of the run's export holding `weights` (tf_model.h5 or model.safetensors) and not the other."""
    import shutil

    shutil.copytree(run1 / "model", source)
    (source / ("model.safetensors" if weights == "tf_model.h5" else "tf_model.h5")).unlink()
    return source


@pytest.mark.parametrize("model_type", TYPES)
def test_continued_from_its_h5_export_starts_from_its_weights(scratch_runs, tmp_path, model_type):
    """init_from RUN/model with tf_model.h5 alone: the config is the checkpoint's, and the model the
    trainer builds for it (tpu_ray.train.loop.build, in the run's own copy of the source, as a fresh
    start's restore_or_start loads it) holds the checkpoint's weights, saved as a training checkpoint
    is: loaded, not re-initialised. No training step: a step at lr ~0 only blurred the equality, and a
    continued run's training step of every type is test_an_extended_vocabulary_grows_the_model's
    (from the PyTorch-layout model.safetensors alone); a continued roberta run from a TensorFlow
    save_pretrained directory end to end: tests/test_init_from.py."""
    from tpu_ray.pipeline import Pipeline
    from tpu_ray.prepare.tokenizer import tokenizer_info
    from tpu_ray.train.init_from import load_weights
    from tpu_ray.train.loop import build, checkpoint_store
    from tpu_ray.train.strategy import select

    tok_dir, shards, run1, _ = scratch_runs(model_type)
    source = export_with_only(run1, "tf_model.h5", tmp_path / "source")
    cfg = type_config(tmp_path / "cont", model_type, tok_dir, shards, **{
        "model.init_from": str(source), "tokenizer.path": None})
    p = Pipeline(cfg)
    assert p.cfg.model.model_type == model_type and p.cfg.model.hidden_size == 32
    p.tokenizer()  # the run's own copy of the checkpoint (RUN/init) and its tokenizer
    cfg = p.cfg
    s = build(cfg.train, cfg.paths, cfg.seed, cfg.model_spec, select(cfg.train), tokenizer_info(cfg.tokenizer_dir))
    assert load_weights(s.model, cfg.init_spec).endswith("tf_model.h5")
    with checkpoint_store(s) as ckpts:
        assert ckpts.save(0, final=True)
    # The optimizer starts fresh, so its slots differ by design: the model weights are compared.
    assert weight_difference(checkpoint_weights(run1), checkpoint_weights(tmp_path / "cont")) < 1e-5


def pytorch_written(side: TorchSide | None, model_dir: Path, out: Path, model_type: str) -> tuple[Path, str]:
    """A model of `model_dir`'s config as PyTorch Transformers' save_pretrained writes it
    (model.safetensors only): made and saved by PyTorch itself in the interop venv
    (tests/interop/save_fresh.py) when it is built; else emulated from the export, less the tied
    weights PyTorch's save drops (families.pt_tied, measured with torch's save_pretrained in
    transformers 4.57 and 5.24). Returns the directory and "torch" or "emulated"."""
    import shutil

    if side is not None:
        side.ask("save_fresh", model_dir, out)
        assert not (out / "tf_model.h5").exists()
        return out, "torch"
    if os.environ.get("TPU_RAY_REQUIRE_EXTRAS"):
        pytest.fail(f"PyTorch interop venv {VENVS / 't5'} absent: build it with tests/interop/setup_venvs.sh")
    from safetensors.numpy import load_file, save_file

    shutil.copytree(model_dir, out, ignore=shutil.ignore_patterns("tf_model.h5", "model.safetensors"))
    dropped = {name for name, _ in family(model_type).pt_tied}
    state = {k: v for k, v in load_file(str(model_dir / "model.safetensors")).items() if k not in dropped}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out, "emulated"


@pytest.mark.parametrize("model_type", TYPES)
def test_continued_from_a_pytorch_written_safetensors_loads_every_weight(scratch_runs, torch_side, tmp_path,
                                                                         model_type):
    """Most checkpoints ship as PyTorch's save_pretrained writes them, which drops tied weights
    (ALBERT's decoder bias, MobileBERT's decoder) that TF keeps as variables of their own: init_from
    loads every weight the file holds, and each dropped one from the weight PyTorch ties it to."""
    from safetensors.numpy import load_file
    from transformers import TFAutoModelForMaskedLM

    from tpu_ray.train.export_safetensors import pytorch_state_dict
    from tpu_ray.train.init_from import checkpoint_hf_config, load_weights

    tok_dir, shards, run1, _ = scratch_runs(model_type)
    src, how = pytorch_written(torch_side, run1 / "model", tmp_path / "pt", model_type)
    cfg = type_config(tmp_path / "cont", model_type, tok_dir, shards, **{"model.init_from": str(src)})
    model = TFAutoModelForMaskedLM.from_config(checkpoint_hf_config(cfg.init_spec))
    model(model.dummy_inputs)
    assert load_weights(model, cfg.init_spec).endswith("model.safetensors")
    written, got = load_file(str(src / "model.safetensors")), pytorch_state_dict(model)
    tied = dict(family(model_type).pt_tied)
    print(f"{model_type} ({how}): {len(written)} tensors written, filled from their tie: {sorted(tied)}")
    # TF-only layers the MLM never uses (MPNet's pooler): TF's own loader leaves them as built
    ignored = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_missing", None) or []]
    unwritten = {n for n in set(got) - set(written) if not any(p.search(n) for p in ignored)}
    assert unwritten == set(tied)  # exactly the weights PyTorch's save drops
    for name, array in written.items():
        if name in got:
            assert np.array_equal(got[name], array), name
    for dropped, kept in tied.items():
        assert np.array_equal(got[dropped], written[kept]), dropped


def weight_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    """Largest absolute difference of the model weights (not the optimizer's slots; zero-size
    variables, which some configs create, skipped)."""
    a, b = ({k: v for k, v in d.items() if "OPTIMIZER_SLOT" not in k and v.size} for d in (a, b))
    assert a.keys() == b.keys() and a
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k]))) for k in a)


@pytest.mark.parametrize("model_type", TYPES)
def test_export_loads_in_pytorch_transformers_5_with_equal_logits(scratch_runs, torch_side, tmp_path, model_type):
    side = require_torch_side(torch_side)
    from transformers import AutoTokenizer

    *_, run1, _ = scratch_runs(model_type)
    model_dir = run1 / "model"
    mask = AutoTokenizer.from_pretrained(str(model_dir)).mask_token
    out = _torch_logits(side, model_dir, [f"The {mask} of the river was built in the year.", "A short one."], tmp_path)
    print(f"{model_type}: {out['model_class']} max|dlogits|={out['max_abs_diff']:.2e} {out['loading_info']}")
    assert out["transformers"].startswith("5.")
    assert not any(out["loading_info"].get(k) for k in ("missing_keys", "mismatched_keys")), out["loading_info"]
    if family(model_type).pytorch_differs:  # funnel: known, stated in the export's log and model card
        assert out["max_abs_diff"] > 1e-4, "PyTorch now agrees: drop the family's pytorch_differs caveat"
        assert "Caveat" in (model_dir / "README.md").read_text()
        return
    assert out["max_abs_diff"] < 1e-4


def _torch_logits(side: TorchSide, model_dir: Path, texts: list[str], tmp: Path) -> dict:
    """TF logits of `texts` on the export, then the PyTorch Transformers 5 side's report on them."""
    from transformers import AutoTokenizer, TFAutoModelForMaskedLM

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    batch = tok(texts, padding=True, return_tensors="np")
    model = TFAutoModelForMaskedLM.from_pretrained(str(model_dir), use_safetensors=False)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], training=False).logits
    np.savez(tmp / "ref.npz", input_ids=batch["input_ids"].astype(np.int64),
             attention_mask=batch["attention_mask"].astype(np.int64), logits=logits.numpy())
    return {**side.ask("logits", model_dir, tmp / "ref.npz", texts[0]), "input_ids": batch["input_ids"]}


@pytest.mark.parametrize("model_type", TYPES)
def test_an_extended_vocabulary_grows_the_model(scratch_runs, torch_side, lines, tmp_path, model_type):
    """tokenizer.extend_tokens on a checkpoint of every family, continued from its export's
    PyTorch-layout model.safetensors alone (tpu-ray's numpy converter, no torch; the column
    "continued from its export" of that file: the checkpoint's config and weights are where the run
    starts). After one step at lr 1e-9 the old ids' rows (embedding, output bias, an untied decoder)
    are the checkpoint's, each new row the mean of the rows of its pieces under the checkpoint's
    tokenizer; every other weight is the checkpoint's; the export loads in PyTorch Transformers 5 to
    TF's logits on text of new tokens."""
    from tpu_ray.pipeline import Pipeline
    from tpu_ray.prepare.vocabulary import read_record

    tok_dir, shards, run1, _ = scratch_runs(model_type)
    source = export_with_only(run1, "model.safetensors", tmp_path / "source")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n")
    cfg = type_config(tmp_path / "cont", model_type, tok_dir, train_split_only(shards, tmp_path / "shards"), **{
        "model.init_from": str(source), "tokenizer.path": None, "tokenizer.extend_tokens": 24,
        "corpus.source": str(corpus), "train.steps": 1, "train.warmup_steps": 0, "train.learning_rate": 1e-9,
        "train.checkpoint_every": 1, "train.eval_every": 1})
    p = Pipeline(cfg)
    assert p.cfg.model.model_type == model_type and p.cfg.model.hidden_size == 32
    p.tokenizer()
    p.train()
    record = read_record(p.cfg.tokenizer_dir)
    base, new = record["base_vocab_size"], record["tokens"]
    assert len(new) == 24 and [t["id"] for t in new] == list(range(base, base + 24))
    before, after = checkpoint_weights(run1), checkpoint_weights(tmp_path / "cont")
    before = {k: v for k, v in before.items() if "OPTIMIZER_SLOT" not in k and v.size}
    after = {k: v for k, v in after.items() if "OPTIMIZER_SLOT" not in k and v.size}
    assert before.keys() == after.keys()
    grown = 0
    for name, old in before.items():
        got = after[name]
        if old.shape == got.shape:
            assert np.max(np.abs(got - old)) < 1e-5, name
            continue
        axis = next(i for i, (a, b) in enumerate(zip(old.shape, got.shape)) if a != b)
        assert (old.shape[axis], got.shape[axis]) == (base, base + 24), name
        assert np.max(np.abs(np.take(got, range(base), axis=axis) - old)) < 1e-5, name  # old ids: their rows
        for t in new:
            want = np.take(old, t["pieces"], axis=axis).mean(axis=axis)
            assert np.max(np.abs(np.take(got, t["id"], axis=axis) - want)) < 1e-5, (name, t["token"])
        grown += 1
    assert grown >= 1  # at least the word embeddings (and the bias, the decoder where untied)
    if torch_side is None:
        if os.environ.get("TPU_RAY_REQUIRE_EXTRAS"):
            pytest.fail(f"PyTorch interop venv {VENVS / 't5'} absent: build it with tests/interop/setup_venvs.sh")
        return
    words = [t["text"] for t in new if t["text"].isalpha()][:6]
    from transformers import AutoTokenizer

    mask = AutoTokenizer.from_pretrained(str(tmp_path / "cont" / "model")).mask_token
    texts = [f"The {mask} " + " ".join(words) + " .", " ".join(reversed(words))]
    out = _torch_logits(torch_side, tmp_path / "cont" / "model", texts, tmp_path)
    assert (out["input_ids"] >= base).any()  # the text really uses new tokens
    assert not any(out["loading_info"].get(k) for k in ("missing_keys", "mismatched_keys")), out["loading_info"]
    if family(model_type).pytorch_differs:  # funnel: known, stated in the model card
        return
    print(f"{model_type}: {len(new)} tokens, {grown} weights grown, max|dlogits|={out['max_abs_diff']:.2e}")
    assert out["max_abs_diff"] < 1e-4, out["max_abs_diff"]


def test_a_published_deberta_with_relative_attention_traces_through_the_trainers_logits():
    """Every published DeBERTa v1 checkpoint sets relative_attention (c2p|p2c), whose TF code
    branches in Python on tf.rank: the trainer's logits (train/loop.mlm_logits) must let autograph
    convert it (Family.autograph), or the first trace raises OperatorNotAllowedInGraphError.
    A from-scratch DeBERTa (relative_attention off) never reaches that code."""
    import tensorflow as tf
    from transformers import DebertaConfig, TFDebertaForMaskedLM

    from tpu_ray.train.loop import mlm_logits

    config = DebertaConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=32, max_position_embeddings=16, relative_attention=True,
                           pos_att_type=["c2p", "p2c"], type_vocab_size=0)
    model = TFDebertaForMaskedLM(config)
    ids = tf.constant([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])
    batch = {"input_ids": ids, "attention_mask": tf.ones_like(ids), "mlm_positions": tf.constant([[1, 3], [0, 5]])}
    logits = tf.function(lambda b: mlm_logits(model, b, training=True))(batch)
    assert logits.shape == (2, 2, 40) and bool(tf.reduce_all(tf.math.is_finite(logits)))
