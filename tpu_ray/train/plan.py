"""The run's plan: what it reads of the run (the train section, the corpus's weight stages, where
the shards lie) resolved once, before training, into the spans the loop runs.

Why a plan: a plain run, a phased run (train.phases), a mixture and a branch (train.branch_from) all
train the same way, span after span: each span has its steps, sequence length, batch, masking rate,
shard set, the mixture's weight stages in force, the learning-rate curve over it, and where in the
data it starts. Resolving that once gives one value the loop runs, doctor prints and tests check,
with no TensorFlow and no shards read: a run without phases is a plan of one span; a branch is a
plan whose first span starts at the stable run's step (`start`).

Where a span's data starts is the rule of train/phase_data.py said in plan terms: the first span at
its stream's first sample (or, resumed or branched, at the step's position, as input_position.py
seeks); a span at the length of the span before continues that order at its next sample; a span at
another length starts at the first work unit not yet read (the exact sample per pipeline and source
needs the shards' record counts: phase_data.PhaseData computes it when training starts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from tpu_ray.config import CorpusConfig, RunPaths, TrainConfig
from tpu_ray.train import curves
from tpu_ray.train.phases import Span, spans

FIRST, CONTINUE, UNREAD = "first sample", "continue", "first unread unit"


@dataclass(frozen=True)
class DataStart:
    """Where a span's stream starts: `how` is FIRST, CONTINUE (span `after`'s order, its next sample)
    or UNREAD (the first unit span `after` and those before left unread); `samples_before`: the
    samples (all pipelines together) the spans before it read."""

    how: str
    after: int | None
    samples_before: int

    def describe(self) -> str:
        if self.how == FIRST:
            return "data from its first sample"
        if self.how == CONTINUE:
            return f"data continues phase {self.after}'s order ({self.samples_before:,} samples read before)"
        return f"data from the first unit phase {self.after} and before left unread ({self.samples_before:,} samples read before)"


@dataclass(frozen=True)
class SpanPlan:
    """One span of the plan: the phase (`span`: steps, seq_len, batch, masking rate) and what it reads."""

    span: Span
    shards_dir: str
    stages: tuple[int, ...]  # the steps at which the mixture's weight stages in force start (0: the base weights)
    learning_rate: tuple[float, float]  # at the span's first and last optimizer iteration
    mask_rate: tuple[float, float]  # the masking rate there (train.mask_schedule moves it)
    data: DataStart
    # The span's masking as the input pipeline applies it (train/inputs.MaskSpec): it needs the
    # tokenizer, so it is filled in when training starts (Plan.with_masks); None before.
    mask: Any = None

    @property
    def seq_len(self) -> int:
        return self.span.seq_len

    @property
    def batch_size(self) -> int:
        return self.span.batch_size

    @property
    def mask_prob(self) -> float:
        return self.span.mask_prob

    def describe(self) -> str:
        sp = self.span
        lr = f"lr {self.learning_rate[0]:.3g} -> {self.learning_rate[1]:.3g}"
        mask = (f"mask {self.mask_rate[0]:.3g}" if self.mask_rate[0] == self.mask_rate[1]
                else f"mask {self.mask_rate[0]:.3g} -> {self.mask_rate[1]:.3g}")
        stages = f", weight stages from steps {', '.join(map(str, self.stages))}" if len(self.stages) > 1 else ""
        return (f"steps {sp.start + 1:,}-{sp.end:,} at seq_len {sp.seq_len}, batch {sp.batch_size}, {mask}, {lr}; "
                f"{self.data.describe()}; shards {self.shards_dir}{stages}")


@dataclass(frozen=True)
class Plan:
    """The spans of a run in order, from step `start` (0, or a branch's step) to `steps`."""

    spans: tuple[SpanPlan, ...]
    start: int
    steps: int
    curve: curves.Curve
    phased: bool  # train.phases set: each span's start is a phase_start event

    def with_masks(self, spec_of: Callable[[Span], Any]) -> Plan:
        """The plan with each span's MaskSpec, `spec_of(span)`."""
        return replace(self, spans=tuple(replace(sp, mask=spec_of(sp.span)) for sp in self.spans))

    def phases(self) -> list[Span]:
        """The spans' phases (steps, seq_len, batch, masking rate), as `phases.spans` makes them."""
        return [sp.span for sp in self.spans]

    def remaining(self, step: int) -> tuple[SpanPlan, ...]:
        """The spans still to run from `step` on (the one holding step `step + 1` first)."""
        return tuple(sp for sp in self.spans if sp.span.end > step) or self.spans[-1:]

    def rows(self) -> list[str]:
        """One line per span (what `tpu-ray doctor` shows under "plan")."""
        head = f"from step {self.start:,} (branch)" if self.start else "from step 0"
        lines = [f"{self.steps:,} steps {head}, {len(self.spans)} span{'s' if len(self.spans) > 1 else ''}"]
        lines += [f"[{sp.span.index}] {sp.describe()}" for sp in self.spans if sp.span.end > self.start]
        return lines


def mask_rate(t: TrainConfig, span: Span, step: int) -> float:
    """The masking rate at optimizer iteration `step` in `span` (its mask_prob, moved by a schedule)."""
    return float(curves.mask_rate(t, step, start=span.mask_prob))


def data_starts(all_spans: list[Span]) -> list[DataStart]:
    """Each span's DataStart (train/phase_data.py's rule, before the shards are read)."""
    out, read = [], 0
    for k, sp in enumerate(all_spans):
        if k == 0:
            out.append(DataStart(FIRST, None, 0))
        else:
            out.append(DataStart(CONTINUE if all_spans[k - 1].seq_len == sp.seq_len else UNREAD, k - 1, read))
        read += sp.steps * sp.batch_size
    return out


def stages_in(corpus: CorpusConfig, span: Span) -> tuple[int, ...]:
    """The start steps of the weight stages in force over [span.start, span.end) (one source: (0,))."""
    starts = corpus.stage_starts() if corpus.sources is not None else [0]
    return tuple(s for i, s in enumerate(starts)
                 if s < span.end and (i + 1 == len(starts) or starts[i + 1] > span.start))


def plan(t: TrainConfig, corpus: CorpusConfig, paths: RunPaths, start: int = 0) -> Plan:
    """The run's plan from what it reads: the train section (phases, schedule), the corpus's weight
    stages, where each length's shards lie (`paths`, whose seq_len is shard.seq_len); `start`: the
    step it starts at (a branch's checkpoint step)."""
    all_spans = spans(t, paths.seq_len)
    curve = curves.curve(t)
    out = []
    for sp, data in zip(all_spans, data_starts(all_spans)):
        first, last = max(sp.start, min(start, sp.end - 1)), max(sp.end - 1, sp.start)
        out.append(SpanPlan(sp, paths.shards_at(sp.seq_len), stages_in(corpus, sp),
                            (float(curves.rate(curve, first)), float(curves.rate(curve, last))),
                            (mask_rate(t, sp, first), mask_rate(t, sp, last)), data))
    return Plan(tuple(out), start, t.steps, curve, bool(t.phases))
