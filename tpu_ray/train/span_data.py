"""What each span of the plan (train/plan.py) reads: its shard set, its position tracker, and the
positions saved beside checkpoints, built once before the loop runs the spans.

Why apart from the loop: the loop runs every plan the same way, span after span; only here does a
phased plan (train.phases) differ from a one-span one. A one-span plan reads as a run always did:
the whole mixture, one stream from its first sample, positions without phase stamps (so older
checkpoints resume and a plain run's metrics and position JSON stay as they were). A phased plan's
spans each continue the text read so far (train/phase_data.py) and stamp their positions with the
phase (phases.PhasePositions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpu_ray.config import RunPaths
from tpu_ray.errors import UserError
from tpu_ray.prepare.shard_set import ShardSet
from tpu_ray.prepare.tokenizer import TokenizerInfo
from tpu_ray.train.phases import Span
from tpu_ray.train.plan import Plan


@dataclass
class SpanData:
    """The plan's inputs: `sets[seq_len]` the shard set at each length, `trackers[i]` span i's
    position tracker, `positions` what a checkpoint saves and a resume checks, `mixture` the run's
    (None: one source), `phase_data` the phases' stream starts (None: one span)."""

    sets: dict[int, ShardSet]
    trackers: list[Any]
    positions: Any
    mixture: Any
    phase_data: Any

    def source_samples(self, step: int) -> dict[str, int]:
        """A mixture's samples drawn from each source in the first `step` steps."""
        return self.positions.source_samples(step)

    def summary(self, step: int) -> dict[str, Any]:
        """summary.json's `training` (a mixture's draws per source; phased: each phase's too)."""
        if self.mixture is None:
            return {}
        out = {"source_samples": self.source_samples(step)}
        if self.phase_data is not None:
            out["phase_source_samples"] = self.positions.phase_source_samples(step)
        return {"training": out}

    def text_read(self, index: int) -> float:
        """The share of the training text the phases before span `index` read (phase_start's text_read)."""
        bound = next((t for t in self.trackers if t.bound), self.trackers[index])
        return self.phase_data.text_read(bound.pipelines)[index]


def shard_sets(plan: Plan, shards: ShardSet, paths: RunPaths, tok: TokenizerInfo) -> dict[int, ShardSet]:
    """Each span's shard set by length: `shards` (the run's own, at shard.seq_len, checked by the
    caller) and every other length's, checked here (`phase_shards`)."""
    return {sp.seq_len: shards if sp.seq_len == paths.seq_len else phase_shards(paths, tok, sp.seq_len)
            for sp in plan.spans}


def span_data(plan: Plan, sets: dict[int, ShardSet], mixture: Any, seed: int, shuffle_buffer: int) -> SpanData:
    """Every span's tracker over its shard set (`sets`, by length: `shard_sets`), and the positions
    over them (see the module's docstring). `mixture`: the run's (train/mixture.mixture_of, its weights
    from the main set's sample counts, in every span; None: one source); `seed` and `shuffle_buffer`:
    the run's, which with the shards decide the order samples are read in."""
    from tpu_ray.train.phases import PhasePositions

    all_spans = plan.phases()
    if not plan.phased:
        tracker = phase_tracker(all_spans[0], sets[all_spans[0].seq_len], mixture, seed, shuffle_buffer, whole=True)
        return SpanData(sets, [tracker], tracker, mixture, None)
    trackers = [phase_tracker(sp, sets[sp.seq_len], mixture, seed, shuffle_buffer) for sp in all_spans]
    data = phase_data(all_spans, sets, mixture, seed, shuffle_buffer)  # each phase continues the text read so far
    for index, tracker in enumerate(trackers):
        tracker.phase_data, tracker.phase = data, index
    return SpanData(sets, trackers, PhasePositions(all_spans, trackers), mixture, data)


def phase_shards(paths: RunPaths, tok: TokenizerInfo, seq_len: int) -> ShardSet:
    """The checked shard set a phase at `seq_len` trains on (the run's own at shard.seq_len)."""
    where = paths.shards_at(seq_len)
    shards = ShardSet.load(where)
    if shards is None:
        raise UserError(f"{where}: no shards at seq_len {seq_len} for train.phases; rerun `tpu-ray shard` with "
                        f"this config (it cuts every phase's length in one pass)")
    shards.require_complete()
    shards.require_made_with(tok, seq_len, paths.tokenizer_dir)
    if not shards.files("train"):
        raise UserError(f"{where}: no train shards at seq_len {seq_len}; give more text or shorter phases")
    shards.verify(splits=("train",))
    return shards


def phase_data(all_spans: list[Span], sets: dict[int, ShardSet], mixture: Any, seed: int, shuffle_buffer: int) -> Any:
    """The phases' data plan (train/phase_data.py): each length's train files per source, and
    the samples each phase takes from each source per input pipeline (the mixture's closed form)."""
    from tpu_ray.train.mixture import counts_before, source_seed
    from tpu_ray.train.phase_data import PhaseData, shard_files

    names = ("corpus",) if mixture is None else mixture.names
    files = {length: {n: shard_files(shards, None if mixture is None else n) for n in names}
             for length, shards in sets.items()}
    seeds = {"corpus": seed} if mixture is None else {n: source_seed(seed, k) for k, n in enumerate(names)}

    def consumed(span: Span, pipelines: int) -> dict[str, int]:
        per_step = span.batch_size // pipelines
        if mixture is None:
            return {"corpus": span.steps * per_step}
        counts = counts_before(mixture.between(span.start, span.end), per_step, span.steps * per_step)
        return {n: int(c) for n, c in zip(names, counts)}

    return PhaseData(all_spans, shuffle_buffer, files, seeds, consumed)


def phase_tracker(span: Span, shards: ShardSet, mixture: Any, seed: int, shuffle_buffer: int,
                  whole: bool = False) -> Any:
    """The position tracker of one span's stream: its shard set, batch, and with a mixture the
    stages in force over its steps (a weight stage at its global step). `whole`: a one-span plan,
    which draws by the whole mixture (its digest is what older checkpoints recorded)."""
    from tpu_ray.train.input_position import PositionTracker
    from tpu_ray.train.mixture import MixtureTracker

    if mixture is None:
        return PositionTracker(shards.files("train"), span.batch_size, shuffle_buffer, seed=seed)
    by_source = {n: shards.files("train", n) for n in mixture.names}
    if not whole and (empty := [n for n, files in by_source.items() if not files]):
        raise UserError(f"{shards.directory}: no train samples of corpus.sources.{empty[0]} at seq_len "
                        f"{span.seq_len} (train.phases[{span.index}]); rerun `tpu-ray shard` with this config")
    return MixtureTracker(shards.files("train"), span.batch_size, shuffle_buffer,
                          mixture if whole else mixture.between(span.start, span.end), by_source)
