"""Grow a checkpoint's model to an extended vocabulary (prepare/vocabulary.py).

The checkpoint's weights load into a model of its own size, then every weight is copied into
the run's model: unchanged where the shapes agree; along the vocabulary axis where they differ
(word embeddings, the MLM output bias, an untied decoder), the old ids keep their rows exactly
and each new token's row is the mean of the rows of the pieces the checkpoint's tokenizer split
it into (recorded in the tokenizer's vocabulary_extension.json). Why the mean of its pieces: the
model then reads a new token roughly as it read the pieces it replaces, where a random row would
be noise the continued training must first unlearn (Hewitt 2021; the usual resize leaves it so).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from tpu_ray.errors import UserError

log = logging.getLogger(__name__)


def new_rows(old: np.ndarray, axis: int, pieces: list[list[int]]) -> np.ndarray:
    """`old` with one slice appended along `axis` per new token: the mean of its pieces' slices."""
    wide = old.astype(np.float64)
    rows = [np.take(wide, p, axis=axis).mean(axis=axis, keepdims=True) for p in pieces]
    return np.concatenate([old, *(r.astype(old.dtype) for r in rows)], axis=axis)


def grown(old: np.ndarray, shape: tuple[int, ...], rows: int, pieces: list[list[int]], name: str) -> np.ndarray:
    """`old` (a weight of the checkpoint's model) as the grown model's weight of `shape`."""
    if tuple(old.shape) == tuple(shape):
        return old
    differ = [i for i, (a, b) in enumerate(zip(old.shape, shape)) if a != b]
    if len(old.shape) != len(shape) or len(differ) != 1 or old.shape[differ[0]] != rows \
            or shape[differ[0]] != rows + len(pieces):
        raise UserError(f"{name}: shape {tuple(old.shape)} in the checkpoint, {tuple(shape)} in the grown model: "
                        f"not a growth of the vocabulary from {rows} to {rows + len(pieces)} rows")
    return new_rows(old, differ[0], pieces)


def _scopeless(name: str) -> str:
    """A weight's name without the model instance's own scope (tf_roberta_for_masked_lm_N/)."""
    return name.split("/", 1)[-1]


def load_grown(model: Any, old_config: Any, load: Callable[[Any], str], tokenizer_dir: str, init_from: str) -> str:
    """Load the checkpoint (`load`, into a model of its own config `old_config`) and grow it into
    `model`, as the run's tokenizer in `tokenizer_dir` records its extension; `init_from` names the
    checkpoint in messages."""
    import tensorflow as tf
    from transformers import TFAutoModelForMaskedLM

    from tpu_ray.prepare.vocabulary import read_record

    rows = int(old_config.vocab_size)
    record = read_record(tokenizer_dir)
    if record is None or record["vocab_size"] != int(model.config.vocab_size):
        raise UserError(f"{tokenizer_dir}: the model has {model.config.vocab_size} vocabulary rows and the "
                        f"checkpoint {rows}, but the tokenizer records no such extension; make it again with "
                        f"`tpu-ray tokenizer --force`")
    pieces = [t["pieces"] for t in sorted(record["tokens"], key=lambda t: t["id"])]
    with tf.device("/cpu:0"):
        old = TFAutoModelForMaskedLM.from_config(old_config)
        old(old.dummy_inputs, training=False)
        loaded = load(old)
    mine, theirs = model.weights, old.weights
    if len(mine) != len(theirs) or any(_scopeless(a.name) != _scopeless(b.name) for a, b in zip(mine, theirs)):
        raise UserError(f"model.init_from={init_from}: the grown model's weights do not pair with the "
                        f"checkpoint's ({len(mine)} and {len(theirs)}); the vocabulary cannot be grown")
    changed = 0
    for new, src in zip(mine, theirs):
        value = src.numpy()
        out = grown(value, tuple(new.shape), rows, pieces, _scopeless(new.name))
        changed += out is not value
        new.assign(out)
    log.info("init_from: %s grown from %d to %d tokens (%d weights along the vocabulary; new rows the mean of "
             "their pieces)", loaded, rows, rows + len(pieces), changed)
    return loaded
