"""The training input pipeline: a pure tf.data graph with static shapes and TF-native masking.

Shards -> per-host file subset (InputContext) -> interleave -> shuffle -> repeat ->
batch(drop_remainder) -> parse -> mask -> prefetch. No py_function and no from_generator, so the
pipeline runs in TF's C++ runtime on every host of a slice. Masking is indicator arithmetic with
stateless random ops seeded by (seed, step): no data-dependent shapes, and the masks of step N
are the same after a resume as in an uninterrupted run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any
from dataclasses import dataclass

import tensorflow as tf

from tpu_ray.train.input_position import count_records, host_parts, seekable_records

IGNORE = -100
# Masking seeds for different input pipelines are kept apart by this stride.
_PIPELINE_SEED_STRIDE = 1 << 40


@dataclass(frozen=True)
class MaskSpec:
    mask_prob: float
    mask_id: int
    vocab_size: int
    special_ids: tuple[int, ...]
    # Positions per sequence the MLM head scores (see mlm_targets); None: every position.
    predictions: int | None = None
    # Special ids that are still masking targets: <unk> (README, "<unk> is a target").
    target_ids: tuple[int, ...] = ()
    # Whole-word masking: per vocabulary id, whether the token continues the word before it
    # (tpu_ray.train.words.continuation_table); None: tokens are selected one by one.
    continues_word: tuple[bool, ...] | None = None
    # Of the selected tokens: the share replaced by the mask token, and by a random token.
    mask_fraction: float = 0.8
    random_fraction: float = 0.1
    # True: each sequence masks exactly round(mask_prob x its maskable tokens), at least one
    # (google-research/bert's create_pretraining_data); False: each token independently with
    # mask_prob (Hugging Face's data collator). Whole-word masking always draws per word.
    exact_count: bool = False
    # A masking rate that changes with the step (train.mask_schedule=linear): mask_prob at step 0 to
    # mask_prob_end at `schedule_steps`, linearly. The step comes from the batch index in the masking
    # seed (`batches_per_step` of this input pipeline's batches make one step): a tensor, no recompile.
    mask_prob_end: float | None = None
    schedule_steps: int = 0
    batches_per_step: int = 1

    def rate(self, seed: tf.Tensor) -> float | tf.Tensor:
        """The masking rate of the batch whose masking seed is `seed` (see _seed: [base, index + pipeline
        stride]); a Python float when it is constant."""
        if self.mask_prob_end is None or self.schedule_steps <= 0:
            return self.mask_prob
        step = tf.math.floordiv(tf.math.floormod(seed[1], _PIPELINE_SEED_STRIDE), self.batches_per_step)
        done = tf.minimum(tf.cast(step, tf.float32) / float(self.schedule_steps), 1.0)
        return self.mask_prob + (self.mask_prob_end - self.mask_prob) * done

    @property
    def never_masked(self) -> tuple[int, ...]:
        """Ids never selected for masking: the special tokens other than `target_ids`."""
        return tuple(i for i in self.special_ids if i not in self.target_ids)

    def random_ids(self, shape: tf.Tensor, seed: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
        """Uniform draws over the vocabulary without its special tokens, wherever their ids are.

        Draw r uniformly from [0, vocab - k) (k specials), then map r to the r-th non-special id:
        add one for every special s_j (sorted, j from 0) with s_j - j <= r. Static shapes, no loop.
        """
        specials = sorted(set(self.special_ids))
        r = tf.random.stateless_uniform(shape, seed, minval=0, maxval=self.vocab_size - len(specials), dtype=dtype)
        if not specials:
            return r
        offsets = tf.constant([s - j for j, s in enumerate(specials)], dtype)
        return r + tf.reduce_sum(tf.cast(offsets <= r[..., None], dtype), axis=-1)


def parse_batch(serialized: tf.Tensor, seq_len: int) -> dict[str, tf.Tensor]:
    """Parse a batch of Examples into int32 [batch, seq_len] tensors (fixed shapes)."""
    spec = {k: tf.io.FixedLenFeature([seq_len], tf.int64) for k in ("input_ids", "attention_mask")}
    parsed = tf.io.parse_example(serialized, spec)
    return {k: tf.cast(v, tf.int32) for k, v in parsed.items()}


def mask_tokens(input_ids: tf.Tensor, seed: tf.Tensor, spec: MaskSpec) -> tuple[tf.Tensor, tf.Tensor]:
    """BERT masking: select mask_prob of the non-special tokens; of those 80% [MASK], 10% random,
    10% unchanged. Labels hold the original id where selected and -100 elsewhere.

    `seed` is a shape-[2] int tensor; the same seed gives the same masks.
    """
    shape = tf.shape(input_ids)
    mask_prob = spec.rate(seed)  # constant, or train.mask_schedule's rate at this batch's step
    s_select, s_kind, s_random = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
    special = tf.reduce_any(input_ids[..., None] == tf.constant(spec.never_masked, input_ids.dtype), axis=-1)
    draw = tf.random.stateless_uniform(shape, s_select)
    if spec.continues_word is not None:  # one draw per word: every piece takes its word's first draw
        draw = word_draws(input_ids, draw, spec.continues_word)
        selected = tf.logical_and(draw < mask_prob, tf.logical_not(special))
    elif spec.exact_count:
        selected = exact_selection(draw, special, mask_prob)
    else:
        selected = tf.logical_and(draw < mask_prob, tf.logical_not(special))
    kind = tf.random.stateless_uniform(shape, s_kind)
    mask_end, random_end = spec.mask_fraction, spec.mask_fraction + spec.random_fraction
    to_mask = tf.logical_and(selected, kind < mask_end)
    to_random = tf.logical_and(selected, tf.logical_and(kind >= mask_end, kind < random_end))
    random_ids = spec.random_ids(shape, s_random, input_ids.dtype)
    masked = tf.where(to_mask, tf.cast(spec.mask_id, input_ids.dtype), input_ids)
    masked = tf.where(to_random, random_ids, masked)
    labels = tf.where(selected, input_ids, tf.cast(IGNORE, input_ids.dtype))
    return masked, labels


def exact_selection(draw: tf.Tensor, special: tf.Tensor, mask_prob: float | tf.Tensor) -> tf.Tensor:
    """Per row, the round(mask_prob x n) maskable positions (at least one) with the smallest draws.

    Static shapes, no data-dependent branch: each position's rank among its row's draws (special
    positions sorted last) is compared with the row's count.
    """
    maskable = tf.logical_not(special)
    n = tf.reduce_sum(tf.cast(maskable, tf.float32), axis=-1, keepdims=True)
    count = tf.minimum(tf.maximum(tf.floor(n * mask_prob + 0.5), 1.0), n)
    key = tf.where(maskable, draw, 2.0)
    rank = tf.argsort(tf.argsort(key, axis=-1, stable=True), axis=-1, stable=True)
    return tf.logical_and(tf.cast(rank, tf.float32) < count, maskable)


def word_draws(input_ids: tf.Tensor, draw: tf.Tensor, continues_word: tuple[bool, ...]) -> tf.Tensor:
    """Each token gets the draw of its word's first token, so a word is selected whole.

    Word index = running count of word starts along the row (static shapes, no loop): tokens that
    continue a word (a table lookup by id) share the index of the start before them."""
    table = tf.constant(continues_word, tf.bool)
    continues = tf.gather(table, input_ids)
    word = tf.cumsum(tf.cast(tf.logical_not(continues), tf.int32), axis=-1) - 1
    word = tf.maximum(word, 0)  # a row that starts mid-word: its first pieces form word 0
    return tf.gather(draw, word, batch_dims=1)


def predictions_per_sequence(seq_len: int, mask_prob: float, whole_word: bool = False,
                             exact_count: bool = False) -> int:
    """How many positions per sequence the MLM head scores: with an exact count per sequence, that
    count's bound; else the mean masked count plus six standard deviations (a binomial tail of
    ~1e-9), so the gather below has a static size."""
    if exact_count and not whole_word:
        return min(seq_len, max(1, math.floor(seq_len * mask_prob + 0.5)))
    mean = seq_len * mask_prob
    # Whole words: tokens are selected in groups, so the count varies more; bounded here for words of
    # up to 4 pieces on average (variance x4); the trainer raises it to what a sample of the shards'
    # words needs (whole_word_bound). A masked token beyond the bound is masked in the input but not
    # scored, and counted (mlm_unscored, the records' unscored_targets).
    spread = 2 if whole_word else 1
    return min(seq_len, math.ceil(mean + 6 * spread * math.sqrt(mean * (1 - mask_prob))) + 1)


def predictions_for(train: Any, seq_len: int, mask_prob: float | None = None) -> int:
    """predictions_per_sequence for a run's TrainConfig: the one bound the trainer, the doctor's
    memory estimate and the FLOPs count share (at the highest rate of a masking schedule).
    `mask_prob`: a phase's own rate (train.phases); None: train.mask_prob."""
    rate = train.mask_prob if mask_prob is None else mask_prob
    highest = max(rate, getattr(train, "mask_prob_end", None) or 0.0)  # a masking schedule's top
    return predictions_per_sequence(seq_len, highest, train.whole_word_mask, train.mask_count == "exact")


def mlm_targets(labels: tf.Tensor, k: int) -> tuple[tf.Tensor, tf.Tensor]:
    """The first `k` masked positions of each row and their labels ([batch, k], -100 for unused slots).

    The MLM head then projects only these positions onto the vocabulary instead of every position
    (about 85% of that matmul saved at 15% masking). `top_k` of a score that ranks masked positions
    first keeps the shape static: no boolean indexing, no data-dependent shape (XLA rule 2).
    """
    seq_len = labels.shape[-1]
    selected = tf.cast(tf.not_equal(labels, IGNORE), tf.float32)
    earlier_first = tf.cast(seq_len - tf.range(seq_len), tf.float32) / (seq_len + 1)
    _, positions = tf.math.top_k(selected * 2.0 + earlier_first, k=k, sorted=True)
    return positions, tf.gather(labels, positions, batch_dims=1)


def _with_targets(batch: dict[str, tf.Tensor], seed: tf.Tensor, spec: MaskSpec) -> dict[str, tf.Tensor]:
    batch["input_ids"], batch["labels"] = mask_tokens(batch["input_ids"], seed, spec)
    k = spec.predictions or batch["labels"].shape[-1]
    batch["mlm_positions"], batch["mlm_labels"] = mlm_targets(batch["labels"], k)
    batch["mlm_unscored"] = unscored_targets(batch["labels"], batch["mlm_labels"])
    return batch


def unscored_targets(labels: tf.Tensor, mlm_labels: tf.Tensor) -> tf.Tensor:
    """Per row, the masked positions beyond the `predictions` bound: masked in the input, never
    scored. Counted so that a bound too small for a corpus's words shows in the metrics."""
    def count(x: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(tf.cast(tf.not_equal(x, IGNORE), tf.int32), axis=-1)

    return count(labels) - count(mlm_labels)


def whole_word_bound(rows: Any, continues_word: Sequence[bool], mask_prob: float, never_masked: Sequence[int] = ()) -> int:
    """The predictions bound whole-word masking needs for these sample rows ([n, seq_len] ids).

    A row's masked count is the sum over its words of (pieces x a Bernoulli(mask_prob) draw): mean
    mask_prob x seq_len, variance mask_prob (1 - mask_prob) x sum of squared word lengths. The bound
    is the mean plus six standard deviations of the row with the largest sum of squares: one word of
    dozens of pieces (a space-free CJK line under Metaspace) raises it, up to seq_len."""
    import numpy as np

    rows = np.asarray(rows)
    seq_len = rows.shape[-1]
    if not rows.size:
        return seq_len
    table = np.asarray(continues_word, bool)
    starts = ~table[rows] | np.isin(rows, list(never_masked))
    starts[:, 0] = True
    worst = 0
    for row in starts:
        edges = np.flatnonzero(row)
        lengths = np.diff(np.append(edges, seq_len))
        worst = max(worst, int((lengths.astype(np.int64) ** 2).sum()))
    mean = seq_len * mask_prob
    return min(seq_len, math.ceil(mean + 6 * math.sqrt(mask_prob * (1 - mask_prob) * worst)) + 1)


def _seed(base: int, pipeline: int, index: tf.Tensor) -> tf.Tensor:
    return tf.stack([tf.constant(base, tf.int64), tf.cast(index, tf.int64) + pipeline * _PIPELINE_SEED_STRIDE])


def host_files(files: Sequence[str], ctx: tf.distribute.InputContext | None,
               counts: Mapping[str, int] | None = None) -> list[str]:
    """The shard files this input pipeline reads (all or part of each; see host_parts)."""
    if ctx is None or ctx.num_input_pipelines == 1:
        return sorted(files)
    if counts is None:
        counts = dict(zip(sorted(files), count_records(sorted(files))))
    return [f for f, _, _ in host_parts(files, counts, ctx)]


def train_dataset(files: Sequence[str], seq_len: int, batch_size: int, spec: MaskSpec, seed: int,
                  shuffle_buffer: int, start_batch: int = 0,
                  ctx: tf.distribute.InputContext | None = None,
                  counts: Mapping[str, int] | None = None) -> tf.data.Dataset:
    """Endless, shuffled, masked batches of `batch_size` (the per-replica batch under a strategy).

    `start_batch` starts at that batch (resume) in time that does not grow with it: the record
    order is `input_position.seekable_records` (files per epoch, then windows of `shuffle_buffer`
    records shuffled by seed), so reaching a batch skips whole files by their record `counts`
    (the manifest's; read from the files when not given) instead of re-reading every record.
    Under several input pipelines each reads an equal share of the records (host_parts). The
    trainer reads a span's records through its source (`records(ctx, step)`: input_position.py,
    mixture.py), which is this stream when the span has one source and no phase before it.
    """
    if counts is None:
        counts = dict(zip(sorted(files), count_records(sorted(files))))
    mine = host_parts(files, counts, ctx)
    ds = seekable_records([f for f, _, _ in mine], [n for _, _, n in mine], seed, shuffle_buffer,
                          start_sample=start_batch * batch_size, firsts=[a for _, a, _ in mine])
    return masked_batches(ds, seq_len, batch_size, spec, seed, start_batch, ctx)


def masked_batches(records: tf.data.Dataset, seq_len: int, batch_size: int, spec: MaskSpec, seed: int,
                   start_batch: int, ctx: tf.distribute.InputContext | None) -> tf.data.Dataset:
    """Serialized records -> batches of `batch_size`, parsed and masked by (seed, pipeline, batch index)."""
    pipeline = ctx.input_pipeline_id if ctx else 0
    ds = records.batch(batch_size, drop_remainder=True)
    ds = ds.enumerate(start=start_batch)

    def prepare(index: tf.Tensor, serialized: tf.Tensor) -> dict[str, tf.Tensor]:
        return _with_targets(parse_batch(serialized, seq_len), _seed(seed, pipeline, index), spec)

    ds = ds.map(prepare, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.prefetch(tf.data.AUTOTUNE).with_options(_options())


def _options() -> tf.data.Options:
    opts = tf.data.Options()
    opts.deterministic = True
    # We shard files ourselves per InputContext; TF's auto-sharding would shard a second time.
    opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return opts
