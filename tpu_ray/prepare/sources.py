"""The corpus as named sources: each planned on its own, numbered into one sequence of work units.

A mixture (`corpus.sources`) shards every source as the one-source corpus is sharded (its own
units, its own validation split, the same exactly-once and resume guarantees): the units of all
sources are numbered one after another, source by source in config order, so every shard name and
the manifest stay what they are, and the manifest records which units (and so which shards) belong
to which source. An evaluation-only source (weight 0) is planned as all validation text.

The one-source corpus is the mixture of one source named "corpus" whose units are planned exactly
as before (same plan file, same unit numbers), so its shards are byte-identical to earlier runs'.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from tpu_ray.config import CorpusConfig, ShardConfig
from tpu_ray.prepare.corpus import PLAN_FILE, WorkUnit, iter_train_text, plan_units

ONE_SOURCE = "corpus"  # the name of `corpus.source` when there are no named sources


@dataclass(frozen=True)
class PlannedSource:
    """One source's work units (numbered in the run's one sequence) and how it is drawn."""

    name: str
    weight: float  # in corpus.sources (before any schedule or temperature); 0: evaluation only
    units: list[WorkUnit]

    @property
    def unit_range(self) -> tuple[int, int]:
        """[first, last + 1) of this source's unit numbers."""
        return (self.units[0].index, self.units[-1].index + 1) if self.units else (0, 0)


def source_corpus(corpus: CorpusConfig, name: str) -> CorpusConfig:
    """A named source as the one-source CorpusConfig the planner reads (weight 0: all validation)."""
    if corpus.sources is None:
        return corpus
    src = corpus.sources[name]
    fields = src.model_dump(exclude={"weight"})
    if src.weight == 0:  # evaluation only: every byte of it is validation text
        fields.update(source=src.validation_source or src.source, validation_source=None, validation_fraction=1.0)
        return CorpusConfig.model_construct(**fields)  # 1.0 is outside what a user may set, on purpose
    return CorpusConfig(**fields)


def plan_sources(corpus: CorpusConfig, shard: ShardConfig, run_dir: str) -> list[PlannedSource]:
    """Every source's units, numbered 0..n-1 across the sources in config order (each source's plan
    stored in `run_dir`, as corpus.plan_units keeps it)."""
    if corpus.sources is None:
        return [PlannedSource(ONE_SOURCE, 1.0, plan_units(corpus, shard, run_dir))]
    out, offset = [], 0
    for name, src in corpus.sources.items():
        units = plan_units(source_corpus(corpus, name), shard, run_dir, field=f"corpus.sources.{name}",
                           plan_file=f"plan-{name}.json")
        units = [WorkUnit(**{**u.to_dict(), "index": offset + i}) for i, u in enumerate(units)]
        out.append(PlannedSource(name, src.weight, units))
        offset += len(units)
    return out


def all_units(planned: list[PlannedSource]) -> list[WorkUnit]:
    return [u for p in planned for u in p.units]


def tokenizer_text(planned: list[PlannedSource], budget: int, max_line_bytes: int,
                   seed: int) -> Iterator[list[str]]:
    """The tokenizer's sample: each training source gives its weight's share of `budget`
    (tokenizer.train_bytes; evaluation-only sources give none), read as the one-source sample is
    (iter_train_text, lines cut at corpus.max_line_bytes, drawn by the run's seed), the sources'
    batches interleaved so that no source's text comes all last."""
    if len(planned) == 1:
        return iter_train_text(planned[0].units, budget, max_line_bytes, seed)
    weights = {p.name: p.weight for p in planned if p.weight > 0}
    total = sum(weights.values())
    streams = [iter_train_text(p.units, max(1, int(budget * p.weight / total)), max_line_bytes, seed)
               for p in planned if p.weight > 0]
    return (batch for batches in itertools.zip_longest(*streams) for batch in batches if batch is not None)


__all__ = ["ONE_SOURCE", "PLAN_FILE", "PlannedSource", "all_units", "plan_sources", "source_corpus",
           "tokenizer_text"]
