"""One fine-tuning trial: a pretrained checkpoint, a task, a seed and a learning rate -> its scores.

Hugging Face's TensorFlow recipes (run_glue.py, run_ner.py): TFAutoModelForSequenceClassification
or TFAutoModelForTokenClassification on the exported model (a new, seeded head), transformers'
AdamW with linear warm-up and decay (`create_optimizer`), Keras `fit`, predictions on the
validation split. Keras' loop is used as is here: the pretraining loop's reasons for its own loop
(masked-only accuracy, checkpoints that resume mid-run, TPU steps per execution) do not apply to a
minutes-long fine-tune.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, fields
from typing import Any

from tpu_ray.downstream.tasks import Task
from tpu_ray.errors import UserError
from tpu_ray.downstream.metrics import score


# The default grid, by the model's width. A published base-size (or larger) checkpoint gets its papers'
# grid: RoBERTa's GLUE sweep is {1e-5, 2e-5, 3e-5} (Liu et al. 2019, table 10), BERT's {2e-5 .. 5e-5}.
# A small model (hidden < 768, as tpu-ray's quickstart) needs larger steps: on the built-in task a
# 128-wide model picked 3e-4 at the edge of [1e-4, 3e-4] and gained 11 points at 1e-3, so its grid
# reaches 1e-3. A best value at either edge of the grid is warned about (sweep.Summary).
BASE_WIDTH = 768
PAPERS_GRID = [1e-5, 2e-5, 3e-5]
SMALL_MODEL_GRID = [1e-4, 3e-4, 1e-3]


@dataclass
class FinetuneSpec:
    """What a sweep does (`finetune.KEY=value` on the command line)."""

    seeds: int = 5
    learning_rates: list[float] | None = None  # None: by the model's width (default_learning_rates)
    epochs: int = 3  # the most; each epoch is scored on validation and the best one kept
    batch_size: int = 32
    max_length: int = 128  # as run_glue.py; capped at what the model's position embeddings allow
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_train_examples: int = 0  # 0: all of train; N: a sample of N rows (fixed seed), a quick check
    cpus_per_trial: float = 1.0  # Ray resources of one trial
    gpus_per_trial: float = 0.0
    export_dir: str = ""  # each trial's fine-tuned model + tokenizer in export_dir/lr<lr>-seed<seed> ("" : none)

    @classmethod
    def from_overrides(cls, values: dict[str, Any]) -> FinetuneSpec:
        names = {f.name: f for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in values.items():
            name = key.split(".", 1)[1] if key.startswith("finetune.") else None
            if name not in names:
                raise UserError(f"{key}={value!r}: unknown option; fine-tuning takes finetune.{{{','.join(names)}}}, "
                                f"ray.address and ray.num_cpus")
            kwargs[name] = value
        lrs = kwargs.get("learning_rates")
        if lrs is not None:  # YAML reads 1e-4 (no dot) as a string
            kwargs["learning_rates"] = [_number(x) for x in (lrs if isinstance(lrs, list) else [lrs])]
        spec = cls(**kwargs)
        spec.check()
        return spec

    def check(self) -> None:
        for name in ("seeds", "epochs", "batch_size", "max_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"finetune.{name}={value!r}: must be a whole number >= 1")
        n = self.max_train_examples
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise UserError(f"finetune.max_train_examples={n!r}: a whole number >= 0 (0: all of train)")
        lrs = self.learning_rates
        if lrs is not None and (not isinstance(lrs, list) or not lrs or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < 1 for x in lrs)):
            raise UserError(f"finetune.learning_rates={lrs!r}: give a list of numbers in (0, 1), e.g. [1e-4,3e-4]")
        if lrs is not None and len(set(lrs)) != len(lrs):
            raise UserError(f"finetune.learning_rates={lrs!r}: a learning rate twice; give each once")
        for name, low, high in (("warmup_ratio", 0, 1), ("weight_decay", 0, 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value < high:
                raise UserError(f"finetune.{name}={value!r}: must be a number in [{low}, {high})")
        for name, least in (("cpus_per_trial", "> 0"), ("gpus_per_trial", ">= 0")):
            value = getattr(self, name)
            number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not number or value < 0 or (value == 0 and least == "> 0"):
                raise UserError(f"finetune.{name}={value!r}: must be a number {least}")

    def settings(self) -> dict[str, Any]:
        """What changes a trial's score besides its seed, learning rate, model and task: recorded with
        every trial, and scores group by it (a quick check is never averaged with a full sweep)."""
        return {"epochs": self.epochs, "batch_size": self.batch_size, "max_length": self.max_length,
                "warmup_ratio": float(self.warmup_ratio), "weight_decay": float(self.weight_decay),
                "max_train_examples": self.max_train_examples, "selection": SELECTION}

    def settings_key(self) -> str:
        return hashlib.sha256(json.dumps(self.settings(), sort_keys=True).encode()).hexdigest()[:12]


# How a trial's score is chosen (part of the settings key: records chosen another way never mix):
# each epoch scored on validation, the best one kept (its weights exported), every split's score at it.
SELECTION = "best-epoch-on-validation"


def default_learning_rates(model_dir: str) -> tuple[list[float], str]:
    """(grid, why) for a model with no finetune.learning_rates given: by its hidden size."""
    width = _config(model_dir).get("hidden_size") or 0
    if width >= BASE_WIDTH:
        return list(PAPERS_GRID), f"hidden size {width} >= {BASE_WIDTH}: the RoBERTa paper's GLUE grid"
    return list(SMALL_MODEL_GRID), f"hidden size {width} < {BASE_WIDTH}: a small model's grid"


def _config(model_dir: str) -> dict[str, Any]:
    """The model's config.json (local or gs://: eval.downstream's snapshots live in the run directory)."""
    from tpu_ray import storage

    data = json.loads(storage.read_text(storage.join(model_dir, "config.json")))
    return data if isinstance(data, dict) else {}


# What a trial reads besides the weights: the tokenizer's files, where the model has them.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "vocab.txt",
                   "merges.txt", "spiece.model", "sentencepiece.bpe.model", "added_tokens.json")


def model_fingerprint(model_dir: str) -> str:
    """What identifies a checkpoint in records: the sha256 of what a trial loads from it: the values of
    tf_model.h5's weights (each dataset's name, dtype, shape and bytes: HDF5's own layout and timestamps
    aside), config.json without tpu-ray's export provenance, and the tokenizer's files. Never the
    provenance alone: `save_pretrained` copies config.json into a model re-initialised or trained
    further (and leaves an old model.safetensors beside a new tf_model.h5), which would then reuse
    another model's trials. Two exports of the same weights (eval.downstream's last snapshot and
    RUN/model) share it. Local or gs://; a model with no tf_model.h5 is hashed by its weights file."""
    from tpu_ray import storage
    from tpu_ray.train.export import PROVENANCE_KEY

    digest = hashlib.sha256()
    h5 = storage.join(model_dir, "tf_model.h5")
    if storage.exists(h5):
        _hash_h5(h5, digest)
    else:
        found = [p for name in ("model.safetensors", "pytorch_model.bin")
                 if storage.exists(p := storage.join(model_dir, name))]
        if not found:
            raise UserError(f"{model_dir}: no weights file (tf_model.h5 or model.safetensors); give an exported model")
        _hash_file(found[0], digest)
    config = {k: v for k, v in _config(model_dir).items() if k != PROVENANCE_KEY}
    digest.update(json.dumps(config, sort_keys=True).encode())
    for name in TOKENIZER_FILES:
        path = storage.join(model_dir, name)
        if storage.exists(path):
            digest.update(name.encode())
            _hash_file(path, digest)
    return "weights-" + digest.hexdigest()[:16]


def _hash_h5(path: str, digest: Any) -> None:
    """Each dataset of an HDF5 weights file, by name, one at a time (never the whole model in memory twice)."""
    import h5py
    import numpy as np

    from tpu_ray import storage

    with storage.open(path, "rb") as f, h5py.File(f, "r") as h5:
        names: list[str] = []
        h5.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
        for name in sorted(names):
            data = h5[name]
            digest.update(json.dumps([name, str(data.dtype), list(data.shape)]).encode())
            digest.update(np.ascontiguousarray(data[()]).tobytes())


def _hash_file(path: str, digest: Any) -> None:
    from tpu_ray import storage

    with storage.open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)


def _number(value: Any) -> Any:
    try:
        return float(value) if isinstance(value, str) else value
    except ValueError:
        return value


def resolve_model(run_or_model: str) -> tuple[str, str | None, int | None]:
    """(model dir, run dir or None, checkpoint step or None) for a run directory or a model directory."""
    if os.path.isfile(run_or_model):
        raise UserError(f"{run_or_model}: is a file; give a run directory (RUN) or a model directory (RUN/model)")
    if os.path.isfile(os.path.join(run_or_model, "model", "config.json")):
        run_dir, model_dir = run_or_model, os.path.join(run_or_model, "model")
    elif os.path.isfile(os.path.join(run_or_model, "config.json")):
        run_dir, model_dir = None, run_or_model
    else:
        raise UserError(f"{run_or_model}: neither a run directory with model/ nor a model directory "
                        f"(no config.json); give RUN or RUN/model")
    from tpu_ray.train.export import PROVENANCE_KEY

    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        step = (json.load(f).get(PROVENANCE_KEY) or {}).get("step")
    return model_dir, run_dir, step


def finetune_trial(model_dir: str, task: Task, seed: int, learning_rate: float, spec: FinetuneSpec,
                   save_to: str | None = None) -> dict[str, Any]:
    """Fine-tune once, scoring every labelled split after each epoch; the epoch with the best
    validation score is the trial's (as Trainer's load_best_model_at_end), chosen on validation only,
    so its test score stays held out. `save_to` keeps that epoch's model there (tf_model.h5,
    config.json with the label names, model.safetensors in PyTorch's layout, tokenizer)."""
    import tensorflow as tf
    import tf_keras
    from transformers import AutoTokenizer, create_optimizer
    from transformers.utils import logging as hf_logging

    tf.get_logger().setLevel("ERROR")  # Keras' retracing notes: one validation batch is smaller
    hf_logging.set_verbosity_error()  # "newly initialized: classifier.*" is the point of fine-tuning
    tf_keras.utils.set_random_seed(seed)  # the new head, dropout and the shuffle order
    tok = AutoTokenizer.from_pretrained(model_dir)
    kind = task.kind_obj
    model = kind.model_class().from_pretrained(model_dir, use_safetensors=False, **kind.head(task.label_names))
    length = min(spec.max_length, model.config.max_position_embeddings - 2)  # RoBERTa's offset of 2
    type_vocab = model.config.type_vocab_size
    train = task.train_rows(spec.max_train_examples)
    x, y, _ = kind.encode(tok, train, task.has_pair, length, type_vocab)
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(train), seed=seed).batch(spec.batch_size)
    steps = math.ceil(len(train) / spec.batch_size) * spec.epochs
    optimizer, _ = create_optimizer(learning_rate, num_train_steps=steps,
                                    num_warmup_steps=int(spec.warmup_ratio * steps),
                                    weight_decay_rate=spec.weight_decay)
    model.compile(optimizer=optimizer)  # the model's own loss for its problem_type (tokens: -100 skipped)
    evals = {split: _eval_inputs(tok, task, split, length, type_vocab) for split in task.eval_splits}
    headline = task.metrics[0]
    seconds, losses, per_epoch, best, kept = 0.0, [], [], None, None
    for epoch in range(spec.epochs):  # one fit per epoch: the schedule runs on, over every epoch's steps
        start = time.perf_counter()
        loss = model.fit(data, epochs=epoch + 1, initial_epoch=epoch, verbose=0).history["loss"][-1]
        seconds += time.perf_counter() - start
        losses.append(float(loss))
        if not math.isfinite(loss):
            raise RuntimeError(f"the training loss became {loss} in epoch {epoch + 1} "
                               f"(learning rate {learning_rate} too high?)")
        scores = {split: _score(model, task, inputs, spec.batch_size) for split, inputs in evals.items()}
        value = scores["validation"][headline]
        per_epoch.append(value)
        if math.isfinite(value) and (best is None or value > per_epoch[best - 1]):
            best, kept = epoch + 1, scores
            if save_to:
                weights = model.get_weights()
    if best is None:  # e.g. a correlation over constant predictions: undefined, the trial failed
        raise RuntimeError(f"validation {headline} was {per_epoch[-1]} after every epoch "
                           f"(constant predictions?); nothing to keep")
    reported = kept[task.report_split][headline]
    if not math.isfinite(reported):  # one rule everywhere: a score that is not a number fails the trial
        raise RuntimeError(f"{task.report_split} {headline} was {reported} at the best epoch ({best}) "
                           f"(constant predictions?)")
    if save_to:
        model.set_weights(weights)
        export_finetuned(model, tok, save_to)
    n = len(train)
    return {"scores": kept, "best_epoch": best, "validation_by_epoch": per_epoch, "train_examples": n * spec.epochs,
            "train_steps": steps, "train_seconds": seconds, "examples_per_s": n * spec.epochs / seconds,
            "final_loss": losses[-1], "max_length": length,
            "truncated_share": truncated_share(tok, task, train, length)}


def _eval_inputs(tok: Any, task: Task, split: str, length: int, type_vocab: int) -> tuple[Any, Any, Any]:
    """(model inputs, the split's rows, what the kind reads predictions with) of one split, encoded once."""
    rows = task.splits[split]
    x, _, extra = task.kind_obj.encode(tok, rows, task.has_pair, length, type_vocab)
    return x, rows, extra


def _score(model: Any, task: Task, inputs: tuple[Any, Any, Any], batch_size: int) -> dict[str, float]:
    x, rows, extra = inputs
    logits = model.predict(x, batch_size=2 * batch_size, verbose=0).logits
    gold, preds = task.kind_obj.predictions(logits, rows, extra, task.label_names)
    return score(task.metrics, gold, preds)


def truncated_share(tok: Any, task: Task, train: list[dict], length: int) -> float:
    """The share of examples (train and every evaluation split) that `length` tokens cut short: a
    truncated example is scored on what is left of it, so this says how much the cap costs."""
    rows = train + [r for split in task.eval_splits for r in task.splits[split]]
    return sum(n > length for n in task.kind_obj.token_counts(tok, rows, task.has_pair)) / len(rows)


def export_finetuned(model: Any, tok: Any, directory: str) -> None:
    """The fine-tuned model as the pretrained one is exported: TensorFlow's tf_model.h5 and config.json
    (id2label/label2id: the label names), the tokenizer, and model.safetensors in PyTorch's layout
    (the pretrained export's writer), so AutoModelFor*Classification loads it without TensorFlow."""
    from tpu_ray.train.export_safetensors import write_safetensors

    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    write_safetensors(model, directory)
