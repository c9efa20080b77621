"""Where each phase's data starts (train.phases): a phase continues where the text read so far
ends, instead of reading its own stream from its first sample again.

Why: every phase used to start at sample 0 of its stream with the same seed and file order. Two
phases at one length (a batch-size warm-up) replayed phase 1's samples in the same order and never
reached the rest of the epoch; a phase at another length read the corpus from its first unit again,
text the first phase had read, while text nobody read remained.

The rule, per source (a mixture's sources each have their stream):
- at the length of the phase before, the phase continues that phase's stream: the next sample of
  the same order;
- at another length, its stream's first epoch is the epoch the phase before ended in, without the
  rows holding any text read in that epoch (by any input pipeline, by any phase since the epoch
  began), then whole epochs as always. Only when no row is left does it start the next epoch (the
  corpus wraps).

What was read is kept at the granularity the text has at every length (input_position.TextRead):
token intervals of each piece, a work unit or one part of a streamed unit (a compressed .txt or
.jsonl, a CSV: one unit id over many part files). A piece's rows at any length are consecutive cuts
of the same tokens, so the text a row of one length holds is known at every other. Marking whole
units read instead re-read a streamed corpus after its first record (every part shares the unit)
and skipped the unread rest of a unit one shuffle window had touched.

All of it is arithmetic over the plan (the phases' steps and batches, the mixture's closed-form
draws) and the manifests' record counts, plus one window's permutation per phase boundary: a
resume inside any phase seeks in bounded time, as without phases (input_position.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from tpu_ray.train.input_position import StreamStart, TextRead, file_order, kept_rows, window_order

Piece = tuple[int, int]  # (work unit, part of a streamed unit; -1: the unit is one piece)
_NAME = re.compile(r"-(\d+)(?:\.(\d+))?-\d+\.tfrecord$")  # prepare/shards.py shard_name


def piece_of(path: str, unit: int | None) -> Piece:
    """A shard file's piece, from its name (`train-00003.0002-17.tfrecord`: unit 3, part 2)."""
    m = _NAME.search(path)
    if m is None:
        return (unit if unit is not None else -1, -1)
    return (int(m.group(1)) if unit is None else unit, int(m.group(2)) if m.group(2) is not None else -1)


@dataclass(frozen=True)
class Parts:
    """One pipeline's share of one source's train records at one length (inputs.host_parts), with
    each file's piece, records in the whole file and bytes per record (the manifest's file size
    over its records: the rows of one file have one length, so one size)."""

    files: tuple[str, ...]
    counts: tuple[int, ...]
    firsts: tuple[int, ...]
    pieces: tuple[Piece, ...]
    totals: tuple[int, ...]
    record_bytes: tuple[float, ...]
    row_len: int  # tokens of text per row: seq_len - 2 ([CLS] and [SEP])

    def kept(self, start: StreamStart) -> list[np.ndarray]:
        """Per file, which rows of its share a first epoch starting at `start` reads."""
        return [kept_rows(a, c, start.read.rows(piece, self.row_len, total))
                for a, c, piece, total in zip(self.firsts, self.counts, self.pieces, self.totals)]


class Stream:
    """The arithmetic of one stream (input_position.seekable_records) over `parts`."""

    def __init__(self, parts: Parts, seed: int, window: int):
        self.parts, self.seed, self.window = parts, int(seed), max(1, int(window))
        self.counts = np.asarray(parts.counts, dtype=np.int64)
        self.n = int(self.counts.sum())
        self._kept: dict[TextRead, list[np.ndarray]] = {}

    def kept(self, start: StreamStart) -> list[np.ndarray]:
        if start.read not in self._kept:
            self._kept[start.read] = self.parts.kept(start)
        return self._kept[start.read]

    def first_epoch_size(self, start: StreamStart) -> int:
        return int(sum(int(k.sum()) for k in self.kept(start)))

    def locate(self, start: StreamStart, sample: int) -> tuple[int, int, bool]:
        """(epoch, sample in that epoch, whether the epoch is the stream's first) of stream sample `sample`."""
        n0 = self.first_epoch_size(start)
        if sample < n0:
            return start.epoch, sample, True
        e, q = divmod(sample - n0, self.n)
        return start.epoch + 1 + e, q, False

    def _sizes(self, start: StreamStart, first: bool) -> np.ndarray:
        return np.asarray([int(k.sum()) for k in self.kept(start)], dtype=np.int64) if first else self.counts

    def rows_read(self, start: StreamStart, sample: int) -> tuple[int, bool, list[np.ndarray]]:
        """The epoch stream sample `sample` is in, whether it is the stream's first, and per file the
        rows (indices in the whole file) the epoch gave before that sample: the whole windows before
        it and the part of its window already given."""
        epoch, q, first = self.locate(start, sample)
        order = file_order(len(self.counts), self.seed, epoch).numpy()
        sizes = self._sizes(start, first)[order]
        ends = np.cumsum(sizes)
        begins = ends - sizes
        w, r = divmod(q, self.window)
        whole = w * self.window
        ordinals = [np.arange(int(n)) for n in np.clip(whole - begins, 0, sizes)]
        if r:
            size = min(self.window, int(ends[-1]) - whole)
            picked = whole + window_order(self.seed, epoch, w, size).numpy()[:r]
            at = np.searchsorted(ends, picked, side="right")
            for i in np.unique(at):
                ordinals[i] = np.concatenate([ordinals[i], picked[at == i] - begins[i]])
        kept = self.kept(start) if first else None
        out: list[np.ndarray] = [np.zeros(0, np.int64)] * len(order)
        for i, f in enumerate(order):
            local = np.flatnonzero(kept[f])[ordinals[i]] if kept is not None else ordinals[i]
            out[f] = self.parts.firsts[f] + np.asarray(local, dtype=np.int64)
        return epoch, first, out

    def text_read(self, start: StreamStart, sample: int) -> tuple[int, TextRead]:
        """The epoch stream sample `sample` is in, and the text read in that epoch before it (by this
        stream, and by the phases before when the epoch is the stream's first)."""
        epoch, first, rows = self.rows_read(start, sample)
        out = start.read if first else TextRead()
        for piece, got in zip(self.parts.pieces, rows):
            out = out.union(TextRead.of_rows(piece, self.parts.row_len, got))
        return epoch, out

    def records_read(self, start: StreamStart, sample: int) -> np.ndarray:
        """Records of each file the epoch of sample `sample` gave before it."""
        return np.asarray([len(r) for r in self.rows_read(start, sample)[2]], dtype=np.int64)

    def bytes_between(self, start: StreamStart, a: int, b: int) -> tuple[float, bool]:
        """Bytes of the distinct records stream samples [a, b) hold, and whether they reach past
        the epoch sample `a` is in (then every row has been read)."""
        if b <= a:
            return 0.0, False
        ea, _, first = self.locate(start, a)
        eb, qb, _ = self.locate(start, b)
        if eb != ea and not (eb == ea + 1 and qb == 0):
            return float(np.dot(self.counts, self.parts.record_bytes)), True
        end = self.records_read(start, b) if eb == ea else self._sizes(start, first)
        got = end - self.records_read(start, a)
        return float(np.dot(got, self.parts.record_bytes)), eb != ea


def chain(lengths: Sequence[int], consumed: Sequence[int], streams: Mapping[int, Sequence[Stream]]
          ) -> list[tuple[StreamStart, ...]]:
    """Each phase's stream start on each pipeline for one source: `lengths[k]` the phase's length,
    `consumed[k]` the samples it takes from each pipeline's stream, `streams[L][p]` pipeline p's
    stream at length L. At a new length the text read is the union over the pipelines."""
    pipelines = len(next(iter(streams.values())))
    out: list[tuple[StreamStart, ...]] = []
    for k, length in enumerate(lengths):
        if k == 0:
            out.append((StreamStart(),) * pipelines)
            continue
        prev = out[-1]
        if lengths[k - 1] == length:  # the same order: its next sample
            out.append(tuple(StreamStart(s.epoch, s.read, s.offset + consumed[k - 1]) for s in prev))
            continue
        # Another length: the rows holding no text read yet in the epoch the phase before ended in.
        ends = [streams[lengths[k - 1]][p].text_read(s, s.offset + consumed[k - 1]) for p, s in enumerate(prev)]
        epoch = max(e for e, _ in ends)
        read = TextRead()
        for e, got in ends:
            read = read.union(got) if e == epoch else read
        starts = []
        for p in range(pipelines):
            start = StreamStart(epoch, read)
            if streams[length][p].first_epoch_size(start) == 0:  # everything read: the corpus wraps
                start = StreamStart(epoch + 1)
            starts.append(start)
        out.append(tuple(starts))
    return out


class PhaseData:
    """The plan's data: each phase's stream start per pipeline and source, and the share of the
    training text the phases before each one read (`text_read`)."""

    def __init__(self, spans: Sequence, window: int,
                 files: Mapping[int, Mapping[str, Sequence[tuple[str, int, Piece, float]]]],
                 source_seeds: Mapping[str, int], consumed: Callable[[Any, int], dict[str, int]]):
        """`files[L][source]`: (path, records, piece, bytes) of the train shards at length L;
        `consumed(span, pipelines)`: samples each source gives per pipeline over the whole span."""
        self.spans, self.window = list(spans), int(window)
        self.files, self.source_seeds, self.consumed = files, dict(source_seeds), consumed
        self.lengths = [sp.seq_len for sp in self.spans]
        self._starts = lru_cache(maxsize=None)(self._compute_starts)
        self._streams = lru_cache(maxsize=None)(self._make_streams)

    def parts(self, length: int, source: str, pipeline: int, pipelines: int) -> Parts:
        from tpu_ray.train.inputs import host_parts

        entries = {path: (n, piece, nbytes) for path, n, piece, nbytes in self.files[length][source]}
        ctx = None if pipelines == 1 else _context(pipeline, pipelines)
        shares = host_parts(list(entries), {p: v[0] for p, v in entries.items()}, ctx)
        return Parts(tuple(f for f, _, _ in shares), tuple(n for _, _, n in shares), tuple(a for _, a, _ in shares),
                     tuple(entries[f][1] for f, _, _ in shares), tuple(entries[f][0] for f, _, _ in shares),
                     tuple(entries[f][2] / max(entries[f][0], 1) for f, _, _ in shares), length - 2)

    def _make_streams(self, source: str, pipelines: int) -> dict[int, list[Stream]]:
        return {length: [Stream(self.parts(length, source, p, pipelines), self.source_seeds[source], self.window)
                         for p in range(pipelines)] for length in set(self.lengths)}

    def _compute_starts(self, source: str, pipelines: int) -> list[tuple[StreamStart, ...]]:
        consumed = [self.consumed(sp, pipelines)[source] for sp in self.spans]
        return chain(self.lengths, consumed, self._streams(source, pipelines))

    def start(self, phase: int, source: str, pipeline: int = 0, pipelines: int = 1) -> StreamStart:
        """Where phase `phase`'s stream of `source` starts on input pipeline `pipeline` of `pipelines`."""
        return self._starts(source, pipelines)[phase][pipeline]

    def text_read(self, pipelines: int = 1) -> list[float]:
        """For each phase, the share of the training text the phases before it read: 0 for the
        first; 1 once every row has been read. A phase's share is the bytes of the distinct records
        it read over its length's train bytes (each length's shards hold the same text, and no
        phase reads text another read while unread text remains, so the shares add up)."""
        shares, total, wrapped = [0.0], 0.0, False
        for k, span in enumerate(self.spans[:-1]):
            length = span.seq_len
            read_bytes = 0.0
            consumed = self.consumed(span, pipelines)
            for source in self.files[length]:
                for p, stream in enumerate(self._streams(source, pipelines)[length]):
                    start = self.start(k, source, p, pipelines)
                    got, past = stream.bytes_between(start, start.offset, start.offset + consumed[source])
                    read_bytes += got
                    wrapped = wrapped or past or start.epoch > 0
            all_bytes = sum(nbytes for files in self.files[length].values() for _, _, _, nbytes in files)
            total += read_bytes / all_bytes if all_bytes else 0.0
            shares.append(1.0 if wrapped else min(1.0, total))
        return shares

    def excluded(self, phase: int, source: str, start: StreamStart) -> dict[str, list[tuple[int, int]]]:
        """Per file of `source` at phase `phase`'s length, the row ranges its stream's first epoch
        leaves out (rows holding text read before; none left out: no entry)."""
        if not start.read:
            return {}
        row_len = self.lengths[phase] - 2
        out = {}
        for path, n, piece, _ in self.files[self.lengths[phase]][source]:
            if rows := start.read.rows(piece, row_len, n):
                out[path] = list(rows)
        return out


def _context(pipeline: int, pipelines: int):
    """The input context of pipeline `pipeline` of `pipelines` (what inputs.host_parts reads)."""
    import tensorflow as tf

    return tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=pipeline,
                                      num_replicas_in_sync=pipelines)


def shard_files(shards, source: str | None) -> list[tuple[str, int, Piece, float]]:
    """(path, records, piece, bytes) of a shard set's train files (of one source), as PhaseData takes them."""
    from tpu_ray import storage

    return [(storage.join(shards.directory, e.path), e.samples, piece_of(e.path, e.unit), float(e.bytes or e.samples))
            for e in shards.split_entries("train", source)]
