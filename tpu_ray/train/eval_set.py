"""The evaluation set of a source: which samples, which masks, fixed by the shards alone.

Why: a figure compares with another only when both score the same text under the same masks.
Before, the set depended on the seed (which files, which masks), the batch size (how many
samples), the number of replicas and hosts (masks drawn per batch shape) and an interleave that
left the last files of a large split unread. Here:

- the samples are a pure function of the validation split: `samples` records spread over the whole
  split (files in name order; up to one file in every `len(files) / samples`, each giving its
  share from its first records);
- each sample's mask is drawn from (mask seed, sample ordinal) one sample at a time, at the
  evaluation's own rate (`eval.mask_prob`, token by token, 80/10/10), so neither the batch shape
  nor the training recipe moves it; the mask seed is a hash of the samples;
- the set is padded to whole global batches with rows that score nothing (labels all ignored),
  so every sample is scored once on 1 device or 8.

Each validation token carries the UTF-8 bytes of text it stands for (`text_bytes`, written with the
shards): bits per byte is the text's own (`scored_bytes`).

`identity` names the set (samples, shard contents, tokenizer, rate, seq_len): two eval records
with equal identities scored the same tokens under the same masks.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import tensorflow as tf

from tpu_ray.train.inputs import IGNORE, MaskSpec, _with_targets, parse_batch, predictions_per_sequence

EVAL_MASK_FRACTION, EVAL_RANDOM_FRACTION = 0.8, 0.1  # BERT's split, whatever the training recipe


@dataclass(frozen=True)
class EvalSet:
    source: str
    picks: tuple[tuple[str, int], ...]  # (shard path, records taken from its start), in order
    identity: str
    mask_seed: int

    @property
    def samples(self) -> int:
        return sum(n for _, n in self.picks)


def pick_samples(files: Sequence[tuple[str, int]], wanted: int) -> list[tuple[str, int]]:
    """`wanted` records spread over `files` ((path, count)), or all of them when they hold fewer.

    m = min(files, wanted) files at evenly spaced places in name order; each gives an equal share
    from its first records, and the share a short file cannot give goes to the others in turn.
    """
    ordered = sorted(files, key=lambda f: f[0].rstrip("/").rsplit("/", 1)[-1])
    total = sum(n for _, n in ordered)
    if total <= wanted:
        return [(p, n) for p, n in ordered if n]
    m = min(len(ordered), wanted)
    chosen = [ordered[(i * len(ordered)) // m] for i in range(m)]
    take = [0] * m
    left = wanted
    while left:
        open_ = [i for i in range(m) if take[i] < chosen[i][1]]
        if not open_:  # the chosen files are exhausted: take from the others in order
            chosen += [f for f in ordered if f not in chosen]
            take += [0] * (len(chosen) - len(take))
            m = len(chosen)
            continue
        share = max(1, left // len(open_))
        for i in open_:
            extra = min(share, chosen[i][1] - take[i], left)
            take[i] += extra
            left -= extra
            if not left:
                break
    return [(p, t) for (p, _), t in zip(chosen, take) if t]


def eval_set(source: str, files: Sequence[tuple[str, int]], wanted: int, contents: dict[str, str],
             tokenizer_sha256: str, mask_prob: float, seq_len: int) -> EvalSet | None:
    """The evaluation set of one source's validation shards (None when there are none).

    `contents` maps a shard path to its sha256 (the manifest's; its name where there is none)."""
    picks = pick_samples(files, wanted)
    if not picks:
        return None
    samples = [[contents.get(p) or p.rstrip("/").rsplit("/", 1)[-1], n] for p, n in picks]
    mask_seed = int.from_bytes(hashlib.sha256(json.dumps(samples).encode()).digest()[:6], "big")
    payload = json.dumps({"samples": samples, "mask_seed": mask_seed, "tokenizer": tokenizer_sha256,
                          "mask_prob": mask_prob, "seq_len": seq_len,
                          "split": [EVAL_MASK_FRACTION, EVAL_RANDOM_FRACTION]}, sort_keys=True)
    return EvalSet(source, tuple(picks), hashlib.sha256(payload.encode()).hexdigest()[:16], mask_seed)


def eval_spec(train_spec: MaskSpec, mask_prob: float, seq_len: int) -> MaskSpec:
    """The evaluation's masking: the training spec's tokens and specials, token by token at `mask_prob`."""
    return MaskSpec(mask_prob, train_spec.mask_id, train_spec.vocab_size, train_spec.special_ids,
                    predictions_per_sequence(seq_len, mask_prob), target_ids=train_spec.target_ids,
                    mask_fraction=EVAL_MASK_FRACTION, random_fraction=EVAL_RANDOM_FRACTION)


def eval_dataset(es: EvalSet, seq_len: int, per_replica: int, replicas: int, spec: MaskSpec,
                 ctx: tf.distribute.InputContext | None = None) -> tf.data.Dataset:
    """The set's batches for one input pipeline: masked per sample, padded to whole global batches."""
    parts = [tf.data.TFRecordDataset(path).take(n) for path, n in es.picks]
    records = parts[0]
    for part in parts[1:]:
        records = records.concatenate(part)

    unknown = tf.io.FixedLenFeature([seq_len], tf.int64, default_value=[-1] * seq_len)

    def masked(i: tf.Tensor, serialized: tf.Tensor) -> dict[str, tf.Tensor]:
        row = parse_batch(serialized[None], seq_len)
        row["text_bytes"] = tf.cast(tf.io.parse_example(serialized[None], {"text_bytes": unknown})["text_bytes"],
                                    tf.int32)
        seed = tf.stack([tf.constant(es.mask_seed, tf.int64), i])
        return {k: v[0] for k, v in _with_targets(row, seed, spec).items()}

    ds = records.enumerate().map(masked, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    global_batch = per_replica * replicas
    padding = -es.samples % global_batch

    def unscored(row: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        return {**row, "labels": tf.fill(tf.shape(row["labels"]), tf.constant(IGNORE, row["labels"].dtype)),
                "mlm_labels": tf.fill(tf.shape(row["mlm_labels"]), tf.constant(IGNORE, row["mlm_labels"].dtype)),
                "mlm_unscored": tf.zeros_like(row["mlm_unscored"])}

    if padding:
        ds = ds.concatenate(ds.take(1).map(unscored).repeat(padding))
    if ctx is not None and ctx.num_input_pipelines > 1:
        ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
    ds = ds.batch(per_replica, drop_remainder=True).cache()
    opts = tf.data.Options()
    opts.deterministic = True
    opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.prefetch(tf.data.AUTOTUNE).with_options(opts)


def scored_bytes(batch: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
    """(UTF-8 bytes of text of the batch's scored targets, scored targets whose bytes the shards do
    not carry): bits per byte divides by the first, and is not reported when the second is not 0.

    The bytes are the text's own, counted when the validation shards were written
    (prepare/text_bytes.py), so the figure is exact for every tokenizer; shards written before
    carry none (-1), and no figure is better than a guess from the vocabulary (a WordPiece guess
    misses every space)."""
    labels = batch["mlm_labels"]
    nbytes = tf.gather(batch["text_bytes"], batch["mlm_positions"], batch_dims=1)
    scored = tf.not_equal(labels, IGNORE)
    known = tf.logical_and(scored, nbytes >= 0)
    return (tf.reduce_sum(tf.cast(tf.where(known, nbytes, 0), tf.float32)),
            tf.reduce_sum(tf.cast(tf.logical_and(scored, nbytes < 0), tf.float32)))
