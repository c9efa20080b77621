"""One fine-tuning trial: a pretrained checkpoint, a task, a seed and a learning rate -> its scores.

Hugging Face's TensorFlow recipes (run_glue.py, run_ner.py): TFAutoModelForSequenceClassification
or TFAutoModelForTokenClassification on the exported model (a new, seeded head), transformers'
AdamW with linear warm-up and decay (`create_optimizer`), Keras `fit`, predictions on the
validation split. Keras' loop is used as is here: the pretraining loop's reasons for its own loop
(masked-only accuracy, checkpoints that resume mid-run, TPU steps per execution) do not apply to a
minutes-long fine-tune.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field, fields
from typing import Any

from tpu_ray.downstream.tasks import Task
from tpu_ray.errors import UserError
from tpu_ray.downstream import tokens
from tpu_ray.downstream.metrics import score


@dataclass
class FinetuneSpec:
    """What a sweep does (`finetune.KEY=value` on the command line)."""

    seeds: int = 5
    learning_rates: list[float] = field(default_factory=lambda: [1e-4, 3e-4])
    epochs: int = 3
    batch_size: int = 32
    max_length: int = 64  # capped at what the model's position embeddings allow
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_train_examples: int = 0  # 0: all of train (a smaller number: a quick check)
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
        lrs = self.learning_rates
        if not isinstance(lrs, list) or not lrs or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < 1 for x in lrs):
            raise UserError(f"finetune.learning_rates={lrs!r}: give a list of numbers in (0, 1), e.g. [1e-4,3e-4]")
        if not 0 <= self.warmup_ratio < 1:
            raise UserError(f"finetune.warmup_ratio={self.warmup_ratio!r}: must be in [0, 1)")


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


def _encode(tok: Any, rows: list[dict], pair: bool, max_length: int, type_vocab: int) -> dict[str, Any]:
    enc = tok([r["text"] for r in rows], [r["text_pair"] for r in rows] if pair else None, truncation=True,
              max_length=max_length, padding="max_length", return_tensors="np")
    keep = ["input_ids", "attention_mask"] + (["token_type_ids"] if type_vocab > 1 else [])
    return {k: enc[k] for k in keep if k in enc}


def finetune_trial(model_dir: str, task: Task, seed: int, learning_rate: float, spec: FinetuneSpec,
                   save_to: str | None = None) -> dict[str, Any]:
    """Fine-tune once and score the validation split; `save_to` keeps the fine-tuned model there
    (tf_model.h5, config.json with the label names, model.safetensors in PyTorch's layout, tokenizer)."""
    import numpy as np
    import tensorflow as tf
    import tf_keras
    from transformers import (AutoTokenizer, TFAutoModelForSequenceClassification,
                              TFAutoModelForTokenClassification, create_optimizer)
    from transformers.utils import logging as hf_logging

    tf.get_logger().setLevel("ERROR")  # Keras' retracing notes: one validation batch is smaller
    hf_logging.set_verbosity_error()  # "newly initialized: classifier.*" is the point of fine-tuning
    tf_keras.utils.set_random_seed(seed)  # the new head, dropout and the shuffle order
    tok = AutoTokenizer.from_pretrained(model_dir)
    if task.kind == "regression":
        head: dict[str, Any] = {"num_labels": 1, "problem_type": "regression"}
    else:
        head = {"num_labels": len(task.label_names), "id2label": dict(enumerate(task.label_names)),
                "label2id": {n: i for i, n in enumerate(task.label_names)}}
        if task.kind == "classification":
            head["problem_type"] = "single_label_classification"
    auto = TFAutoModelForTokenClassification if task.kind == "tokens" else TFAutoModelForSequenceClassification
    model = auto.from_pretrained(model_dir, use_safetensors=False, **head)
    length = min(spec.max_length, model.config.max_position_embeddings - 2)  # RoBERTa's offset of 2
    type_vocab = model.config.type_vocab_size
    train = task.splits["train"][: spec.max_train_examples or None]
    if task.kind == "tokens":
        x, y, _ = tokens.encode_words(tok, train, length, type_vocab)
    else:
        x = _encode(tok, train, task.has_pair, length, type_vocab)
        y = np.asarray([r["label"] for r in train], dtype=np.float32 if task.kind == "regression" else np.int32)
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(train), seed=seed).batch(spec.batch_size)
    steps = math.ceil(len(train) / spec.batch_size) * spec.epochs
    optimizer, _ = create_optimizer(learning_rate, num_train_steps=steps,
                                    num_warmup_steps=int(spec.warmup_ratio * steps),
                                    weight_decay_rate=spec.weight_decay)
    model.compile(optimizer=optimizer)  # the model's own loss for its problem_type (tokens: -100 skipped)
    start = time.perf_counter()
    history = model.fit(data, epochs=spec.epochs, verbose=0)
    seconds = time.perf_counter() - start
    val = task.splits["validation"]
    if task.kind == "tokens":
        vx, _, word_ids = tokens.encode_words(tok, val, length, type_vocab)
        out = model.predict(vx, batch_size=2 * spec.batch_size, verbose=0).logits.argmax(-1)
        fill = tokens.outside_label(task.label_names)
        name = task.label_names.__getitem__
        preds = [list(map(name, tokens.word_predictions(ids, p, len(r["label"]), fill)))
                 for ids, p, r in zip(word_ids, out, val)]
        gold = [list(map(name, r["label"])) for r in val]  # seqeval reads the tag names (B-, I-, O)
    else:
        out = model.predict(_encode(tok, val, task.has_pair, length, type_vocab),
                            batch_size=2 * spec.batch_size, verbose=0).logits
        preds = out[:, 0].astype(float).tolist() if task.kind == "regression" else out.argmax(-1).tolist()
        gold = [r["label"] for r in val]
    losses = history.history["loss"]
    if not all(math.isfinite(v) for v in losses):
        raise RuntimeError(f"the training loss became {losses[-1]} (learning rate {learning_rate} too high?)")
    if save_to:
        export_finetuned(model, tok, save_to)
    return {"metrics": score(task.metrics, gold, preds), "train_examples": len(train) * spec.epochs,
            "train_steps": steps, "train_seconds": seconds, "examples_per_s": len(train) * spec.epochs / seconds,
            "final_loss": float(losses[-1]), "max_length": length}


def export_finetuned(model: Any, tok: Any, directory: str) -> None:
    """The fine-tuned model as the pretrained one is exported: TensorFlow's tf_model.h5 and config.json
    (id2label/label2id: the label names), the tokenizer, and model.safetensors in PyTorch's layout
    (the pretrained export's writer), so AutoModelFor*Classification loads it without TensorFlow."""
    from tpu_ray.train.export_safetensors import write_safetensors

    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    write_safetensors(model, directory)
