"""Where each phase's data starts (train.phases, issue 44): a phase continues where the text read so
far ends, instead of reading its own stream from its first sample again.

Why: every phase used to start at sample 0 of its stream with the same seed and file order. Two
phases at one length (a batch-size warm-up) replayed phase 1's samples in the same order and never
reached the rest of the epoch; a phase at another length read the corpus from its first unit again,
text the first phase had read, while text nobody read remained.

The rule, per input pipeline and per source (a mixture's sources each have their stream):
- at the length of the phase before, the phase continues that phase's stream: the next sample of
  the same order;
- at another length, it starts at the first work unit (shard file) not yet read: its stream's first
  epoch is the epoch the phase before ended in, without the units read in that epoch (at any
  length: every length is cut from the same units), then whole epochs as always. Only when every
  unit has been read does it start the next epoch (the corpus wraps).

All of it is arithmetic over the plan (the phases' steps and batches, the mixture's closed-form
draws) and the manifests' record counts, plus one window's permutation per phase boundary: a
resume inside any phase seeks in bounded time, as without phases (input_position.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from tpu_ray.train.input_position import StreamStart, file_order, window_order


@dataclass(frozen=True)
class Parts:
    """One pipeline's share of one source's train records at one length (inputs.host_parts), with
    each file's unit and bytes per record (the manifest's file size over its records)."""

    files: tuple[str, ...]
    counts: tuple[int, ...]
    firsts: tuple[int, ...]
    units: tuple[int, ...]
    record_bytes: tuple[float, ...]

    def read_mask(self, start: StreamStart) -> list[bool]:
        """The files the first epoch of a stream starting at `start` leaves out."""
        return [u in start.read_units for u in self.units]


class Stream:
    """The arithmetic of one stream (input_position.seekable_records) over `parts`."""

    def __init__(self, parts: Parts, seed: int, window: int):
        self.parts, self.seed, self.window = parts, int(seed), max(1, int(window))
        self.counts = np.asarray(parts.counts, dtype=np.int64)
        self.n = int(self.counts.sum())

    def first_epoch_size(self, start: StreamStart) -> int:
        return int(self.counts[~np.asarray(self.parts.read_mask(start), dtype=bool)].sum())

    def locate(self, start: StreamStart, sample: int) -> tuple[int, int, bool]:
        """(epoch, sample in that epoch, whether the epoch is the stream's first) of stream sample `sample`."""
        n0 = self.first_epoch_size(start)
        if sample < n0:
            return start.epoch, sample, True
        e, q = divmod(sample - n0, self.n)
        return start.epoch + 1 + e, q, False

    def records_read(self, start: StreamStart, sample: int) -> np.ndarray:
        """Records of each file read by the first `sample` samples of the epoch that sample `sample`
        is in (the whole windows before it and the part of its window already given)."""
        epoch, q, first = self.locate(start, sample)
        order = file_order(len(self.counts), self.seed, epoch).numpy()
        sizes = self.counts[order].copy()
        if first:
            sizes[np.asarray(self.parts.read_mask(start), dtype=bool)[order]] = 0
        ends = np.cumsum(sizes)
        begins = ends - sizes
        w, r = divmod(q, self.window)
        whole = w * self.window
        read = np.clip(ends, 0, whole) - np.clip(begins, 0, whole)
        if r:
            size = min(self.window, int(ends[-1]) - whole)
            picked = whole + window_order(self.seed, epoch, w, size).numpy()[:r]
            read += np.bincount(np.searchsorted(ends, picked, side="right"), minlength=len(sizes))
        out = np.zeros(len(sizes), dtype=np.int64)
        out[order] = read
        return out

    def units_read(self, start: StreamStart, sample: int) -> tuple[int, frozenset[int]]:
        """The epoch stream sample `sample` is in, and the units read in that epoch before it."""
        epoch, _, first = self.locate(start, sample)
        counts = self.records_read(start, sample)
        units = {u for u, c in zip(self.parts.units, counts) if c}
        return epoch, frozenset(units | (start.read_units if first else set()))

    def bytes_between(self, start: StreamStart, a: int, b: int) -> tuple[float, bool]:
        """Bytes of the distinct records stream samples [a, b) hold, and whether they reach past
        the epoch sample `a` is in (then every unit has been read)."""
        if b <= a:
            return 0.0, False
        ea, _, _ = self.locate(start, a)
        eb, qb, _ = self.locate(start, b)
        if eb != ea and not (eb == ea + 1 and qb == 0):
            return float(np.dot(self.counts, self.parts.record_bytes)), True
        end = self.records_read(start, b) if eb == ea else self._epoch_total(start, a)
        got = end - self.records_read(start, a)
        return float(np.dot(got, self.parts.record_bytes)), eb != ea

    def _epoch_total(self, start: StreamStart, sample: int) -> np.ndarray:
        _, _, first = self.locate(start, sample)
        out = self.counts.copy()
        if first:
            out[np.asarray(self.parts.read_mask(start), dtype=bool)] = 0
        return out


def chain(lengths: Sequence[int], consumed: Sequence[int], streams: Mapping[int, Stream]) -> list[StreamStart]:
    """Each phase's stream start for one pipeline and source: `lengths[k]` the phase's length,
    `consumed[k]` the samples it takes from this stream, `streams[L]` the stream at length L."""
    out: list[StreamStart] = []
    for k, length in enumerate(lengths):
        if k == 0:
            start = StreamStart()
        elif lengths[k - 1] == length:  # the same order: its next sample
            prev = out[-1]
            start = StreamStart(prev.epoch, prev.read_units, prev.offset + consumed[k - 1])
        else:  # the first unit not yet read at any length, in the epoch the phase before ended in
            prev = out[-1]
            epoch, units = streams[lengths[k - 1]].units_read(prev, prev.offset + consumed[k - 1])
            start = StreamStart(epoch, units)
            if streams[length].first_epoch_size(start) == 0:  # everything read: the corpus wraps
                start = StreamStart(epoch + 1)
        out.append(start)
    return out


class PhaseData:
    """The plan's data: each phase's stream start per pipeline and source, and the share of the
    training text the phases before each one read (`text_read`)."""

    def __init__(self, spans: Sequence, window: int,
                 files: Mapping[int, Mapping[str, Sequence[tuple[str, int, int, float]]]],
                 source_seeds: Mapping[str, int], consumed: Callable[[Any, int], dict[str, int]]):
        """`files[L][source]`: (path, records, unit, bytes) of the train shards at length L;
        `consumed(span, pipelines)`: samples each source gives per pipeline over the whole span."""
        self.spans, self.window = list(spans), int(window)
        self.files, self.source_seeds, self.consumed = files, dict(source_seeds), consumed
        self.lengths = [sp.seq_len for sp in self.spans]
        self._starts = lru_cache(maxsize=None)(self._compute_starts)

    def parts(self, length: int, source: str, pipeline: int, pipelines: int) -> Parts:
        from tpu_ray.train.inputs import host_parts

        entries = {path: (n, unit, nbytes) for path, n, unit, nbytes in self.files[length][source]}
        ctx = None if pipelines == 1 else _context(pipeline, pipelines)
        shares = host_parts(list(entries), {p: v[0] for p, v in entries.items()}, ctx)
        return Parts(tuple(f for f, _, _ in shares), tuple(n for _, _, n in shares), tuple(a for _, a, _ in shares),
                     tuple(entries[f][1] for f, _, _ in shares),
                     tuple(entries[f][2] / max(entries[f][0], 1) for f, _, _ in shares))

    def _streams(self, source: str, pipeline: int, pipelines: int) -> dict[int, Stream]:
        return {length: Stream(self.parts(length, source, pipeline, pipelines), self.source_seeds[source], self.window)
                for length in set(self.lengths)}

    def _compute_starts(self, source: str, pipeline: int, pipelines: int) -> tuple[StreamStart, ...]:
        consumed = [self.consumed(sp, pipelines)[source] for sp in self.spans]
        return tuple(chain(self.lengths, consumed, self._streams(source, pipeline, pipelines)))

    def start(self, phase: int, source: str, pipeline: int = 0, pipelines: int = 1) -> StreamStart:
        """Where phase `phase`'s stream of `source` starts on input pipeline `pipeline` of `pipelines`."""
        return self._starts(source, pipeline, pipelines)[phase]

    def text_read(self, pipelines: int = 1) -> list[float]:
        """For each phase, the share (by the train shards' bytes) of the training text the phases
        before it read: 0 for the first; 1 once every unit has been read. Each length's shards hold
        the same text, so a phase's share is the bytes it read over its length's train bytes."""
        shares, total, wrapped = [0.0], 0.0, False
        for k, span in enumerate(self.spans[:-1]):
            length = span.seq_len
            read_bytes = 0.0
            consumed = self.consumed(span, pipelines)
            for source in self.files[length]:
                for p in range(pipelines):
                    stream = self._streams(source, p, pipelines)[length]
                    start = self.start(k, source, p, pipelines)
                    got, past = stream.bytes_between(start, start.offset, start.offset + consumed[source])
                    read_bytes += got
                    wrapped = wrapped or past or start.epoch > 0
            all_bytes = sum(nbytes for files in self.files[length].values() for _, _, _, nbytes in files)
            total += read_bytes / all_bytes if all_bytes else 0.0
            shares.append(1.0 if wrapped else min(1.0, total))
        return shares


    def read_files(self, phase: int, source: str, start: StreamStart) -> set[str]:
        """The files of `source` at phase `phase`'s length that its stream's first epoch leaves out."""
        return {path for path, _, unit, _ in self.files[self.lengths[phase]][source] if unit in start.read_units}


def _context(pipeline: int, pipelines: int):
    """The input context of pipeline `pipeline` of `pipelines` (what inputs.host_parts reads)."""
    import tensorflow as tf

    return tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=pipeline,
                                      num_replicas_in_sync=pipelines)


def shard_files(shards, source: str | None) -> list[tuple[str, int, int, float]]:
    """(path, records, unit, bytes) of a shard set's train files (of one source), as PhaseData takes them."""
    from tpu_ray import storage

    return [(storage.join(shards.directory, e.path), e.samples, e.unit if e.unit is not None else -1 - i,
             float(e.bytes or e.samples)) for i, e in enumerate(shards.split_entries("train", source))]
