"""Sequence-length phases (`train.phases`, issue 32): most steps at a short length, the rest at the
full one (BERT's 90% at 128 then 10% at 512), each phase with its own static shapes.

Why spans and views: everything that depends on the shapes (the input pipeline, the masking bound,
the FLOPs per token, the doctor's plan) already reads `cfg.shard.seq_len`, `cfg.train.batch_size`
and `cfg.train.mask_prob`. A phase's *view* is the run's config with those three set to the phase's
values (an unvalidated copy: the view is never saved nor loaded), so those functions serve each
phase unchanged. A run without phases has one span, whose view is the config itself.

Where a phase's samples live: the shard stage cuts the same tokens at every phase's length in one
reading of the corpus; the longest length (`shard.seq_len`) is the shard set as always, every other
length `L` is a shard set of its own in `<shards>/seq-L/` (train split only: evaluation runs at
`shard.seq_len` throughout, so its figures compare across phases).
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_ray.config import RunConfig


@dataclass(frozen=True)
class Span:
    """One phase: steps [start, end) at `seq_len`, `batch_size` (global) and `mask_prob`."""

    index: int
    start: int
    end: int
    seq_len: int
    batch_size: int
    mask_prob: float

    @property
    def steps(self) -> int:
        return self.end - self.start


def spans(cfg: RunConfig) -> list[Span]:
    """The run's phases in order; one span over the whole run when `train.phases` is unset."""
    t = cfg.train
    if not t.phases:
        return [Span(0, 0, t.steps, cfg.shard.seq_len, t.batch_size, t.mask_prob)]
    out, start = [], 0
    for i, p in enumerate(t.phases):
        out.append(Span(i, start, start + p.steps, p.seq_len, p.batch_size or t.batch_size,
                        p.mask_prob if p.mask_prob is not None else t.mask_prob))
        start += p.steps
    return out


def span_at(all_spans: list[Span], step: int) -> Span:
    """The phase that runs step `step + 1` (the one after `step` steps); the last one at the run's end."""
    for s in all_spans:
        if step < s.end:
            return s
    return all_spans[-1]


def view(cfg: RunConfig, span: Span) -> RunConfig:
    """`cfg` as phase `span` sees it: its seq_len, batch size and masking rate (unvalidated copy)."""
    t = cfg.train
    if not t.phases:
        return cfg
    train = t.model_copy(update={"batch_size": span.batch_size, "mask_prob": span.mask_prob})
    return cfg.model_copy(update={"shard": cfg.shard.model_copy(update={"seq_len": span.seq_len}), "train": train})


def subdir(seq_len: int) -> str:
    """The folder (inside the shard directory) of the shards cut at a phase's shorter length."""
    return f"seq-{seq_len}"


def extra_lengths(cfg: RunConfig) -> tuple[int, ...]:
    """The phase lengths other than `shard.seq_len`: each a shard set of its own, `subdir(L)`."""
    return tuple(sorted({p.seq_len for p in cfg.train.phases or []} - {cfg.shard.seq_len}))


def shards_dir(cfg: RunConfig, seq_len: int) -> str:
    """Where the shards a phase at `seq_len` trains on are."""
    from tpu_ray import storage

    return cfg.shards_dir if seq_len == cfg.shard.seq_len else storage.join(cfg.shards_dir, subdir(seq_len))


def describe(cfg: RunConfig) -> str:
    """One line for people: `900 steps at 128 -> 100 steps at 512 (batch 64)`."""
    parts = []
    for s in spans(cfg):
        extra = "" if s.batch_size == cfg.train.batch_size else f" batch {s.batch_size}"
        extra += "" if s.mask_prob == cfg.train.mask_prob else f" mask {s.mask_prob:g}"
        parts.append(f"{s.steps:,} steps at {s.seq_len}{extra}")
    return " -> ".join(parts)
