"""The masked-LM head's output bias started at the training text's log token frequencies.

A fresh model predicts every token about equally (a loss near ln V), and every recipe measured here
then spends hundreds of steps on the word-frequency plateau before it learns from context
(docs/schedules.md). With `model.output_bias=unigram` the bias starts at log p(token), p the
distribution training draws from: each source's maskable-token frequencies over its train shards,
weighted by the mixture's weights at step 0 (one source: weight 1). The counts are a sample uniform
over every train file: the same share of each file's records (its first ones), about `MAX_TOKENS`
tokens in all (a few seconds), the same on every worker; every record when there are fewer.
Why by hand: no library sets a Hugging Face TF head's bias from data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from tpu_ray.errors import UserError

MAX_TOKENS = 1 << 22  # ~4M tokens: frequencies to a few percent for any id seen ~1,000 times
SMOOTHING = 0.5  # add-half: an id never seen in the sample still gets a finite bias


@dataclass(frozen=True)
class Counted:
    """What the frequencies were computed over (the output_bias event records it)."""

    tokens: int  # maskable tokens counted
    records: int  # records read
    of_records: int  # the train records there are
    files: int  # train files read (every one)
    weights: dict[str, float] = field(default_factory=dict)  # each source's weight in the distribution

    def describe(self) -> str:
        share = "every record" if self.records == self.of_records else \
            f"the first {self.records / self.of_records:.1%} of each file's records"
        weighted = "" if len(self.weights) < 2 else \
            "; weighted by the mixture: " + ", ".join(f"{n} {w:.3f}" for n, w in self.weights.items())
        return f"{self.records:,} of {self.of_records:,} train records ({share}) of all {self.files:,} files{weighted}"


def training_sources(shards, corpus, seed: int) -> dict[str, tuple[float, list[tuple[str, int]]]]:
    """Each training source's weight at step 0 and its train files with their records: one source
    ("corpus", weight 1) without corpus.sources."""
    from tpu_ray.train.mixture import mixture_for

    if corpus.sources is None:
        return {"corpus": (1.0, shards.files("train"))}
    names = corpus.trained()
    mixture = mixture_for(corpus, {n: shards.samples("train", n) for n in names}, seed)
    return {n: (float(w), shards.files("train", n)) for n, w in zip(mixture.names, mixture.stages[0][1])}


def token_log_frequencies(sources: Mapping[str, tuple[float, Sequence[tuple[str, int]]]], seq_len: int,
                          vocab_size: int, never_counted: Sequence[int], max_tokens: int = MAX_TOKENS
                          ) -> tuple[np.ndarray, Counted]:
    """log p of each id under the training distribution (smoothed): per source `name: (weight,
    [(file, records), ...])` its maskable-token frequencies, mixed by the weights. Ids in
    `never_counted` (special tokens never masked, so never a target) get the smallest log p."""
    import tensorflow as tf

    from tpu_ray.train.inputs import parse_batch

    files = [(f, int(n)) for _, listed in sources.values() for f, n in listed]
    if not files:
        raise UserError("model.output_bias=unigram: no training shards to count tokens in")
    total = sum(n for _, n in files)
    share = min(1.0, max(1, max_tokens // seq_len) / max(total, 1))
    never = [i for i in never_counted if 0 <= i < vocab_size]
    mixed, counted, records, weight_sum = np.zeros(vocab_size), 0, 0, sum(w for w, _ in sources.values())
    for weight, listed in sources.values():
        takes = [(f, min(n, math.ceil(n * share))) for f, n in listed]
        counts = np.zeros(vocab_size, np.int64)
        if takes:
            parts = tf.data.Dataset.from_tensor_slices(([f for f, _ in takes], [k for _, k in takes]))
            rows = parts.flat_map(lambda name, k: tf.data.TFRecordDataset(name).take(tf.cast(k, tf.int64)))
            for batch in rows.batch(1024).map(lambda x: parse_batch(x, seq_len)["input_ids"]).as_numpy_iterator():
                counts += np.bincount(batch.ravel(), minlength=vocab_size)[:vocab_size]
        counts[never] = 0
        records += sum(k for _, k in takes)
        counted += int(counts.sum())
        if counts.sum() and weight_sum:
            mixed += (weight / weight_sum) * counts / counts.sum()
    maskable = vocab_size - len(never)
    log_p = np.log((mixed * counted + SMOOTHING) / (counted + SMOOTHING * maskable))
    log_p[never] = log_p.min()
    weights = {n: w / weight_sum for n, (w, _) in sources.items()} if weight_sum else {}
    return log_p.astype(np.float32), Counted(counted, records, total, len(files), weights)


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
