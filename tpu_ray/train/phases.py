"""Sequence-length phases (`train.phases`): most steps at a short length, the rest at the
full one (BERT's 90% at 128 then 10% at 512), each phase with its own static shapes.

Why spans: everything that depends on the shapes (the input pipeline, the masking bound, the FLOPs
per token, the doctor's memory and time) takes the span it serves (its seq_len, batch and masking
rate) beside the sections it reads; train/plan.py turns the spans into the run's plan, which the loop
runs span after span. A run without phases has one span, with the run's own values. Spans are made
from the train section and shard.seq_len alone (`spans(cfg.train, cfg.shard.seq_len)`); where a plan
exists, its spans (`Plan.phases()`) are the ones to read.

Where a phase's samples live: the shard stage cuts the same tokens at every phase's length in one
reading of the corpus; the longest length (`shard.seq_len`) is the shard set as always, every other
length `L` is a shard set of its own in `<shards>/seq-L/` (train split only: evaluation runs at
`shard.seq_len` throughout, so its figures compare across phases). A mixture (corpus.sources) keeps
its per-source files there too; each phase draws by the run's weights (from the main set's sample
counts), a weight stage taking effect at its global step (Mixture.between). Every phase's stream
(each source's) continues where the text read by the phases before ends (train/phase_data.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpu_ray.config import TrainConfig
from tpu_ray.prepare.lengths import extra_lengths  # noqa: F401 (read from here too)
from tpu_ray.errors import UserError

if TYPE_CHECKING:  # TensorFlow's module: the annotation only
    from tpu_ray.train.input_position import PositionTracker


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


def spans(t: TrainConfig, seq_len: int) -> list[Span]:
    """The run's phases in order; one span over the whole run at `seq_len` (shard.seq_len) when
    `train.phases` is unset."""
    if not t.phases:
        return [Span(0, 0, t.steps, seq_len, t.batch_size, t.mask_prob)]
    return phase_spans(t)


def phase_spans(t: TrainConfig) -> list[Span]:
    """The spans of `train.phases` (set): each phase names its own length, so no other is needed."""
    out, start = [], 0
    for i, p in enumerate(t.phases or []):
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


def trained_difference(before: list[Span], now: list[Span], step: int) -> str:
    """The first difference between two runs' phases (`spans` of each) over steps [0, step) ("" if
    none), as `train.phases[i].field: saved X, now Y`: what a branch at `step` (train.branch_from) must
    keep. The phase holding the branch step may end elsewhere (the branch's own budget); the phases
    after it are the branch's own; a phase's mask_prob is schedule, the branch's own like train.mask_prob."""
    old, new = before, now
    for a in old:
        if a.start >= step:
            break
        name = f"train.phases[{a.index}]"
        if a.index >= len(new):
            return f"{name}: saved {a.steps} steps at {a.seq_len}, now none"
        b = new[a.index]
        for field in ("seq_len", "batch_size"):
            if getattr(a, field) != getattr(b, field):
                return f"{name}.{field}: saved {getattr(a, field)}, now {getattr(b, field)}"
        if a.end < step and b.end != a.end:
            return f"{name}.steps: saved {a.steps}, now {b.steps}"
        if a.end >= step > b.end:
            return f"{name}.steps: saved {a.steps}, now {b.steps}, which ends before step {step}"
    return ""


def describe(t: TrainConfig, all_spans: list[Span]) -> str:
    """One line for people: `900 steps at 128 -> 100 steps at 512 (batch 64)` (a span's batch and
    masking rate named where they are not the train section's)."""
    parts = []
    for s in all_spans:
        extra = "" if s.batch_size == t.batch_size else f" batch {s.batch_size}"
        extra += "" if s.mask_prob == t.mask_prob else f" mask {s.mask_prob:g}"
        parts.append(f"{s.steps:,} steps at {s.seq_len}{extra}")
    return " -> ".join(parts)


class PhasePositions:
    """The input position of a phases run: each phase's stream starts where the text read so far
    ends (train/phase_data.py), so the position at global step `s` is the phase's tracker at
    `s - span.start` (samples counted from the phase's stream start), stamped with the global step,
    the phase and where its stream started. At a phase's end (a checkpoint there) it is the next
    phase's start: what a resume at that step reads next."""

    def __init__(self, all_spans: list[Span], trackers: list[PositionTracker]):
        self.spans, self.trackers = all_spans, trackers

    def _hosts(self, index: int) -> tuple[int, int]:
        """(pipeline, pipelines) of phase `index`'s tracker, or of a phase before it when not read yet."""
        for tracker in [self.trackers[index], *reversed(self.trackers[:index])]:
            if tracker.bound:
                return tracker.pipeline, tracker.pipelines
        return 0, 1

    def stream(self, index: int) -> dict[str, int] | None:
        """Where phase `index`'s stream (its first source's, this process's first pipeline) starts."""
        tracker = self.trackers[index]
        if tracker.phase_data is None:
            return None
        return tracker.stream_start(tracker.sources[0], *self._hosts(index))[0].describe()

    def at(self, step: int):
        from dataclasses import replace

        span = span_at(self.spans, step)
        tracker = self.trackers[span.index]
        position = tracker.at(step - span.start)
        if not tracker.bound and span.index:  # not read yet: the phase before's hosts
            position = replace(position, pipelines=self.trackers[span.index - 1].pipelines)
        return replace(position, step=step, phase=span.index, stream=self.stream(span.index))

    def source_samples(self, step: int) -> dict[str, int]:
        """A mixture's samples drawn from each source in the first `step` steps: the phases' own
        counts summed (what the train records' `samples/<source>` and summary.json report)."""
        total: dict[str, int] = {}
        for counts in self.phase_source_samples(step):
            for name, n in counts.items():
                total[name] = total.get(name, 0) + n
        return total

    def phase_source_samples(self, step: int) -> list[dict[str, int]]:
        """Each phase's draws per source in the first `step` steps (a phase not reached: zeros)."""
        pipelines = next((t.pipelines for t in self.trackers if t.bound), 1)  # one strategy for every phase
        return [t.source_samples(min(max(step - sp.start, 0), sp.steps), pipelines)
                for sp, t in zip(self.spans, self.trackers)]

    def check_resume(self, stored: str | None, step: int, where: str, accept_new_order: bool = False):
        """The phase's own check (train/input_position.py) on the position within the phase."""
        from dataclasses import replace

        from tpu_ray.train.input_position import InputPosition

        span = span_at(self.spans, step)
        tracker = self.trackers[span.index]
        if stored is None:
            return self.at(step)
        saved = InputPosition.from_json(stored)
        if saved.phase != span.index:
            raise UserError(f"{where}: the checkpoint's input position is in phase {saved.phase}, but step {step} is in "
                            f"phase {span.index} of train.phases; resume with the phases it was trained with")
        stream = self.stream(span.index)
        if saved.stream != stream and (saved.stream is not None or span.index):  # phase 0 of old runs: the same
            if not accept_new_order:
                raise UserError(f"--resume: {where} was trained with phase {span.index}'s stream starting elsewhere "
                                f"(saved {saved.stream or 'at its first sample, as before phases continued the text read'}, "
                                f"now {stream}); resuming would repeat or skip text; resume with the version that "
                                f"trained it, or set train.accept_new_data_order=true to continue at step {step} in "
                                f"the new order")
            import logging

            logging.getLogger(__name__).warning("resuming phase %d with its stream starting elsewhere "
                                                "(train.accept_new_data_order)", span.index)
            return self.at(step)
        local = replace(saved, step=saved.step - span.start, phase=None, stream=None).to_json()
        return replace(tracker.check_resume(local, step - span.start, where, accept_new_order), step=step,
                       phase=span.index, stream=stream)
