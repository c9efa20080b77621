"""The masked-LM head's output bias started at the training text's log token frequencies (issue 49).

A fresh model predicts every token about equally (a loss near ln V), and every recipe measured here
then spends hundreds of steps on the word-frequency plateau before it learns from context
(docs/schedules.md). With `model.output_bias=unigram` the bias starts at log p(token), p counted
over the training shards' maskable tokens, so step 0 already predicts word frequencies. The counts
are a sample: up to `MAX_TOKENS` tokens read round-robin across the shard files (a few seconds),
the same on every worker. Why by hand: no library sets a Hugging Face TF head's bias from data.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tpu_ray.errors import UserError

MAX_TOKENS = 1 << 22  # ~4M tokens: frequencies to a few percent for any id seen ~1,000 times
SMOOTHING = 0.5  # add-half: an id never seen in the sample still gets a finite bias


def token_log_frequencies(files: Sequence[str], seq_len: int, vocab_size: int, never_counted: Sequence[int],
                          max_tokens: int = MAX_TOKENS) -> tuple[np.ndarray, int]:
    """log p of each id over the maskable tokens of `files` (smoothed), and how many were counted.
    Ids in `never_counted` (special tokens never masked, so never a target) get the smallest log p."""
    import tensorflow as tf

    from tpu_ray.train.inputs import parse_batch

    if not files:
        raise UserError("model.output_bias=unigram: no training shards to count tokens in")
    names = tf.data.Dataset.from_tensor_slices(list(files))
    records = names.interleave(tf.data.TFRecordDataset, cycle_length=min(len(files), 64), block_length=16,
                               deterministic=True)
    ids = records.batch(1024).map(lambda x: parse_batch(x, seq_len)["input_ids"])
    counts = np.zeros(vocab_size, np.int64)
    for batch in ids.as_numpy_iterator():
        counts += np.bincount(batch.ravel(), minlength=vocab_size)[:vocab_size]
        max_tokens -= batch.size
        if max_tokens <= 0:
            break
    never = [i for i in never_counted if 0 <= i < vocab_size]
    counts[never] = 0
    counted = int(counts.sum())
    maskable = vocab_size - len(never)
    log_p = np.log((counts + SMOOTHING) / (counted + SMOOTHING * maskable))
    log_p[never] = log_p.min()
    return log_p.astype(np.float32), counted


def frequency_loss(log_p: np.ndarray, never_counted: Sequence[int]) -> float:
    """The loss (nats) a frequency-only model has on the counted tokens: the entropy of p over the
    maskable ids (renormalised: the smoothing's mass included)."""
    keep = np.ones(len(log_p), bool)
    keep[[i for i in never_counted if 0 <= i < len(log_p)]] = False
    p = np.exp(log_p[keep].astype(np.float64))
    return float(-(p * np.log(p)).sum() / p.sum())


def set_output_bias(model, log_p: np.ndarray) -> str:
    """Assign `log_p`, centred (a softmax ignores a constant), to the head's vocabulary-sized bias;
    returns the variable's name. Refused in one line for a head without one."""
    biases = model.get_bias() or {}
    fits = [v for k, v in sorted(biases.items(), key=lambda kv: kv[0] != "bias")
            if v is not None and tuple(v.shape) == (len(log_p),)]
    if not fits:
        raise UserError(f"model.output_bias=unigram: the {model.config.model_type} masked-LM head has no output "
                        f"bias of the vocabulary's size ({len(log_p)}); use model.output_bias=zeros")
    fits[0].assign(log_p - log_p.mean())
    return fits[0].name
