"""Training samples drawn from named sources by weight: deterministic, seekable, inside tf.data.

Why not `tf.data.Dataset.sample_from_datasets`: its draws come from a random stream whose state
is the iterator's, so after a resume the only way to know how many samples each source has given
is to replay every draw (and the per-source record streams must start at those counts). Here the
source of every sample is a pure function of (seed, stage, sample index), built so that the count
each source has given after n samples has a closed form:

- a weight stage (corpus.weight_schedule; one stage without it) is cut into blocks of M samples
  (M >= 1024, a whole number of steps of this pipeline);
- source k (of K, the largest-weight source last) gets T_k(j) = floor(j * M * p_k) of the first j
  blocks' slots, the largest-weight source the rest: every source's share is exact to one sample
  over the whole stage, with no rounding drift (a batch of 8 at weight 0.1 would otherwise round);
- a block's slots are permuted by (seed, stage, block), so the sources are mixed within each batch.

So the position of every source at any step is a few integer operations plus one block's
permutation: the O(1) resume seek holds, and `source_samples(step)` counts exactly what the
batches held. Each pipeline (host) draws the same sequence of sources from its own files, so the
mix per step does not depend on the number of hosts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from tpu_ray.train.input_position import InputPosition, PositionTracker
from tpu_ray.errors import UserError

if TYPE_CHECKING:
    from tpu_ray.config import CorpusConfig

log = logging.getLogger(__name__)

BLOCK_MIN = 1024  # samples per block at least: a block's shares are exact to one sample
_STAGE_STRIDE = 1 << 32  # block seeds: stage * stride + block


@dataclass(frozen=True)
class Mixture:
    """The training sources, the weight stages (start step, probability per source) and the seed."""

    names: tuple[str, ...]
    stages: tuple[tuple[int, tuple[float, ...]], ...]
    seed: int
    # The global step this draw starts at (a train.phases phase): its blocks' permutations are keyed
    # from there, so a phase continues the run's draw instead of repeating phase 0's sources.
    first_step: int = 0

    @property
    def digest(self) -> str:
        """Identifies the draw (sources, stages, seed, first step): a change of it is a change of data order."""
        key = [self.names, self.stages, self.seed] + ([self.first_step] if self.first_step else [])
        return hashlib.sha256(json.dumps(key).encode()).hexdigest()

    def describe(self) -> str:
        return "; ".join(f"from step {s}: " + ", ".join(f"{n} {p:.3f}" for n, p in zip(self.names, probs))
                         for s, probs in self.stages)

    def between(self, start: int, end: int) -> Mixture:
        """The mixture of the steps [start, end) (a train.phases phase, whose stream starts at its own
        step 0): the stages in force there, their steps counted from `start`. The stages stay global
        steps: a stage at step 900 takes effect at step 900 whichever phase holds it."""
        stages = []
        for i, (first, probs) in enumerate(self.stages):
            nxt = self.stages[i + 1][0] if i + 1 < len(self.stages) else None
            if nxt is not None and nxt <= start:
                continue  # over before the phase starts
            if first >= end:
                break
            stages.append((max(0, first - start), probs))
        return Mixture(self.names, tuple(stages), self.seed, self.first_step + start)


def mixture_for(corpus, train_samples: Mapping[str, int], seed: int) -> Mixture | None:
    """The mixture of a corpus config (None for one source): per stage, weight x samples^temperature
    normalised over the training sources (`train_samples`: each source's train samples)."""
    if corpus.sources is None:
        return None
    names = tuple(corpus.trained())
    stages = []
    for start in corpus.stage_starts():
        weights = corpus.stage_weights(start)
        temperature = corpus.stage_temperature(start)
        raw = [weights[n] * (float(train_samples[n]) ** temperature if temperature else 1.0) for n in names]
        total = sum(raw)
        stages.append((start, tuple(r / total for r in raw)))
    return Mixture(names, tuple(stages), seed)


def _quotas(probs: Sequence[float]) -> tuple[list[int], int]:
    """Order in which sources take floor shares (all but the largest), and the largest's index."""
    largest = int(np.argmax(probs))
    return [k for k in range(len(probs)) if k != largest], largest


def block_counts(probs: Sequence[float], block: int, j: int) -> np.ndarray:
    """Each source's slots in blocks [0, j) of a stage (closed form, see the module doc)."""
    others, largest = _quotas(probs)
    out = np.zeros(len(probs), dtype=np.int64)
    for k in others:
        out[k] = math.floor(j * block * probs[k])
    out[largest] = j * block - out.sum()
    return out


def block_size(samples_per_step: int) -> int:
    """M: a whole number of this pipeline's steps, at least BLOCK_MIN samples."""
    return samples_per_step * max(1, math.ceil(BLOCK_MIN / samples_per_step))


def block_sources(probs: Sequence[float], block: int, stage: int, j: tf.Tensor, seed: int,
                  first_step: int = 0) -> tf.Tensor:
    """The source of each of block j's M slots: its counts laid out, then permuted by (seed, stage,
    first_step + j). A block holds at least one step, so a phase starting at global step s keys its
    blocks from s on and never reuses a key of the phases before it (they end by s)."""
    others, largest = _quotas(probs)
    j = tf.cast(j, tf.int64)
    counts = []
    for k in range(len(probs)):
        if k == largest:
            counts.append(None)
            continue
        p = probs[k]
        # floor((j+1) M p) - floor(j M p) in float64: exact for the step counts any run reaches.
        hi = tf.floor(tf.cast(j + 1, tf.float64) * block * p)
        lo = tf.floor(tf.cast(j, tf.float64) * block * p)
        counts.append(tf.cast(hi - lo, tf.int64))
    counts[largest] = block - tf.add_n([c for c in counts if c is not None]) if len(probs) > 1 \
        else tf.constant(block, tf.int64)
    ids = tf.repeat(tf.range(len(probs), dtype=tf.int64), tf.stack(counts))
    key = tf.stack([tf.constant(seed, tf.int64) + 17, tf.constant(stage, tf.int64) * _STAGE_STRIDE + first_step + j])
    return tf.gather(ids, tf.argsort(tf.random.stateless_uniform([block], seed=key)))


def _stage_samples(mixture: Mixture, samples_per_step: int) -> list[tuple[int, int | None]]:
    """(first sample, samples or None for the last) of each stage, in this pipeline's samples."""
    out = []
    for i, (start, _) in enumerate(mixture.stages):
        end = mixture.stages[i + 1][0] if i + 1 < len(mixture.stages) else None
        out.append((start * samples_per_step, None if end is None else (end - start) * samples_per_step))
    return out


def counts_before(mixture: Mixture, samples_per_step: int, n: int) -> np.ndarray:
    """Samples each source has given in this pipeline's first n samples (closed form + one block)."""
    block = block_size(samples_per_step)
    total = np.zeros(len(mixture.names), dtype=np.int64)
    for stage, ((first, length), (_, probs)) in enumerate(zip(_stage_samples(mixture, samples_per_step),
                                                              mixture.stages)):
        if n <= first:
            break
        taken = n - first if length is None else min(n - first, length)
        j, r = divmod(taken, block)
        total += block_counts(probs, block, j)
        if r:
            ids = block_sources(probs, block, stage, tf.constant(j), mixture.seed, mixture.first_step).numpy()[:r]
            total += np.bincount(ids, minlength=len(probs))
    return total


def choices(mixture: Mixture, samples_per_step: int, start: int) -> tf.data.Dataset:
    """The source index of every sample of this pipeline from sample `start` on (endless)."""
    block = block_size(samples_per_step)
    parts = []
    for stage, ((first, length), (_, probs)) in enumerate(zip(_stage_samples(mixture, samples_per_step),
                                                              mixture.stages)):
        if length is not None and start >= first + length:
            continue
        skip = max(0, start - first)
        j0, r = divmod(skip, block)
        blocks = tf.data.Dataset.range(j0, tf.int64.max if length is None else math.ceil(length / block))
        ds = blocks.map(lambda j, p=probs, st=stage: block_sources(p, block, st, j, mixture.seed,
                                                                   mixture.first_step)).unbatch()
        if r:
            ds = ds.skip(r)
        if length is not None:
            ds = ds.take(length - skip)
        parts.append(ds)
    out = parts[0]
    for ds in parts[1:]:
        out = out.concatenate(ds)
    return out


def source_seed(seed: int, k: int) -> int:
    """Each source's record-stream seed: distinct, fixed by the run's seed and the source's place."""
    return int(seed) if k == 0 else (int(seed) + 1_000_003 * k) % (1 << 62)


def mixed_records(streams: Sequence[tf.data.Dataset], mixture: Mixture, samples_per_step: int,
                  start: int) -> tf.data.Dataset:
    """One record stream: sample i from the source `choices` says, each source read in its own order."""
    return tf.data.Dataset.choose_from_datasets(list(streams), choices(mixture, samples_per_step, start))


def mixture_of(corpus: CorpusConfig, seed: int, shards) -> Mixture | None:
    """The run's mixture from its corpus section and shard set (None for one source); a training
    source without a train sample is refused here, before a step is paid for."""
    if corpus.sources is None:
        return None
    missing = [n for n in corpus.trained() if n not in shards.source_names()]
    if missing:
        raise UserError(f"{shards.directory}: the shards hold no source {missing[0]!r} of corpus.sources; they were "
                        f"made from another corpus: reshard (a new shard.dir) or fix corpus.sources")
    samples = {n: shards.samples("train", n) for n in corpus.trained()}
    empty = [n for n, k in samples.items() if not k]
    if empty:
        raise UserError(f"corpus.sources.{empty[0]}: no train samples (its text made only validation samples, or "
                        f"none); give it more text, a lower validation_fraction, or weight 0 (evaluation only)")
    mixture = mixture_for(corpus, samples, seed)
    log.info("%s", shares_line(corpus, mixture))
    return mixture


def shares_line(corpus, mixture: Mixture) -> str:
    """The weights as written and the share of training samples each gives, stage by stage: weights
    are relative (normalised over the training sources), so `weight: 9` beside `0.1` is 98.9%, which
    a reader of "weight" as a share would not guess."""
    parts = []
    for start, probs in mixture.stages:
        weights = corpus.stage_weights(start)
        shares = ", ".join(f"{n} {weights[n]:g} -> {p:.1%}" for n, p in zip(mixture.names, probs))
        parts.append(f"from step {start}: {shares}" if len(mixture.stages) > 1 else shares)
    return "mixture: weights are relative; share of the training samples: " + "; ".join(parts)


class MixtureTracker(PositionTracker):
    """PositionTracker of a mixture: the position holds every source's, each a closed form of the step."""

    def __init__(self, train_files: Sequence[tuple[str, int]], global_batch: int, window: int, mixture: Mixture,
                 by_source: Mapping[str, Sequence[tuple[str, int]]]):
        super().__init__(train_files, global_batch, window)
        self.mixture = mixture
        self.by_source = {n: [p for p, _ in files] for n, files in by_source.items()}

    @property
    def sources(self) -> tuple[str, ...]:
        return self.mixture.names

    def records(self, ctx: tf.distribute.InputContext | None, step: int) -> tuple[tf.data.Dataset, list[str]]:
        """This pipeline's mixed record stream from the span's local step `step` on, and the files it
        reads: each source's own stream (a phase continues where its text read ends), drawn from by
        the closed-form choices."""
        pipelines, pipeline = (ctx.num_input_pipelines, ctx.input_pipeline_id) if ctx else (1, 0)
        per_step = self.global_batch // pipelines
        n = step * per_step
        positions = counts_before(self.mixture, per_step, n)
        streams, parts_all = [], []
        for k, name in enumerate(self.mixture.names):
            ds, parts = self.source_records(name, self.by_source[name], source_seed(self.seed, k), ctx,
                                            int(positions[k]))
            streams.append(ds)
            parts_all += parts
        self.bind(parts_all, pipelines, pipeline)
        return mixed_records(streams, self.mixture, per_step, n), self.described(parts_all)

    @property
    def seed(self) -> int:
        return self.mixture.seed

    def source_samples(self, step: int, pipelines: int | None = None) -> dict[str, int]:
        """Samples drawn from each source in the first `step` steps, over all input pipelines
        (`pipelines`: their number for a tracker not bound yet, a phase this process did not read)."""
        pipelines = self.pipelines if self._bound or pipelines is None else pipelines
        per_step = self.global_batch // pipelines
        counts = counts_before(self.mixture, per_step, step * per_step) * pipelines
        return {n: int(c) for n, c in zip(self.mixture.names, counts)}

    def at(self, step: int) -> InputPosition:
        return dataclasses.replace(super().at(step), sources=self.source_samples(step) if self._bound else None,
                                   mixture_sha256=self.mixture.digest)

    def order_changes(self, saved: InputPosition) -> list[str]:
        changed = super().order_changes(saved)
        if saved.mixture_sha256 != self.mixture.digest:
            changed.append("the mixture's sources, weights, weight schedule or temperature")
        return changed
