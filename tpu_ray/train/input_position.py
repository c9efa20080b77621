"""A training record stream that starts at any sample in bounded time, and its stored position.

Why not `shuffle(buffer) ... skip(n)` (what resume did before): the contents of tf.data's shuffle
buffer depend on every record read before, so the only way to reach sample n was to read all n
again (tens of millions of records, ~100 GB from GCS, at the end of a long run). Checkpointing the
tf.data iterator instead saves the whole buffer with every checkpoint and is not supported for
every strategy's distributed iterators. So the stream is defined so that its position is a few
integers:

- epoch e: this pipeline's files in a permutation drawn from (seed, e), read one after another;
- that epoch's records are cut into windows of `window` records (the shuffle buffer's size),
  counted from the start of the epoch, and each window is permuted by (seed, e, window index);
- samples are numbered across epochs; batch b holds samples [b * batch, (b + 1) * batch).

To start at sample p: e = p // N (N records per epoch), q = p % N, w = q // window. Whole files
before window w are skipped by their record counts from the manifest (never opened), the file
holding its first record is read from that record, window w is read and permuted, and its first
q % window records are dropped. That is at most one window plus part of one shard file, whatever
p is. The order is the same whether a run resumed or not, so with the masks seeded by the batch
index (inputs.py) a resumed run sees exactly the batches of an uninterrupted one.

What this gives up against the old pipeline: the old one interleaved 16 files, so one batch mixed
records of 16 shards; here a window holds consecutive records of one or two shards (a shard is one
work unit, a contiguous stretch of the corpus). Every epoch is still a full permutation of the
records at file and window level.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf

from tpu_ray.errors import UserError

_EPOCH_STRIDE = 1 << 24  # window seeds: epoch * stride + window (a window index never reaches 2**24)


@dataclass(frozen=True)
class InputPosition:
    """Where one input pipeline's stream is after `step` steps (stored beside each checkpoint)."""

    step: int
    samples: int  # samples this pipeline has consumed since step 0
    samples_per_epoch: int
    epoch: int
    sample_in_epoch: int
    window: int
    offset: int  # samples of `window` already consumed
    shards_sha256: str  # the files and counts the position refers to
    # What else decides the order; None in positions stored before they were recorded.
    pipelines: int | None = None  # input pipelines sharing the global batch (hosts, or workers)
    shuffle_window: int | None = None  # train.shuffle_buffer: the window each permutation covers
    # A mixture (corpus.sources): samples drawn from each source so far, and what decided the draw.
    sources: dict[str, int] | None = None
    mixture_sha256: str | None = None
    # How pipelines share the records: "records" (equal ranges, inputs.host_parts); None: positions
    # stored before, when several pipelines took whole files round-robin.
    split: str | None = None
    # train.phases: the phase this position is in (its own shards and stream); absent without phases.
    phase: int | None = None
    # train.phases: where the phase's stream started (train/phase_data.py: epoch, units read before,
    # offset); `samples` etc. count from there. None: stored before phases continued the text read.
    stream: dict[str, int] | None = None

    def to_json(self) -> str:
        fields = asdict(self)
        for name in ("phase", "stream"):
            if fields[name] is None:  # positions of runs without phases keep their bytes
                del fields[name]
        return json.dumps(fields, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> InputPosition:
        return cls(**json.loads(text))


class TextRead:
    """Text of one epoch that phases have read, in a coordinate every sequence length shares: per
    piece (a work unit, or one part of a streamed unit: the same tokens at every length), the token
    intervals `[lo, hi)` read. Row `i` of a piece's shard at length L holds its tokens
    `[i (L - 2), (i + 1) (L - 2))` (prepare/shards.py cut_rows), so what a phase at one length read
    is, at another, the rows overlapping these intervals. Why tokens and not units: a unit touched
    by one shuffle window, or a streamed unit whose parts share its id, is mostly unread."""

    def __init__(self, pieces: Mapping[tuple[int, int], Sequence[tuple[int, int]]] | None = None):
        self.pieces = {k: _merged(v) for k, v in (pieces or {}).items() if v}

    def __bool__(self) -> bool:
        return bool(self.pieces)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TextRead) and self.pieces == other.pieces

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.pieces.items())))

    def __repr__(self) -> str:
        return f"TextRead({self.units()} units, {self.tokens()} tokens)"

    def union(self, other: TextRead) -> TextRead:
        keys = set(self.pieces) | set(other.pieces)
        return TextRead({k: [*self.pieces.get(k, ()), *other.pieces.get(k, ())] for k in keys})

    def tokens(self) -> int:
        return sum(hi - lo for spans in self.pieces.values() for lo, hi in spans)

    def units(self) -> int:
        return len({unit for unit, _ in self.pieces})

    def rows(self, piece: tuple[int, int], row_len: int, n_rows: int) -> list[tuple[int, int]]:
        """The row ranges `[a, b)` of a piece's shard (rows of `row_len` tokens, `n_rows` of them)
        that hold any read token."""
        out = []
        for lo, hi in self.pieces.get(piece, ()):
            a, b = lo // row_len, min(n_rows, (hi - 1) // row_len + 1)
            if a < b:
                out.append((a, b))
        return _merged(out)

    @classmethod
    def of_rows(cls, piece: tuple[int, int], row_len: int, rows: np.ndarray) -> TextRead:
        """The text of these rows (indices into the piece's shard at a length of `row_len` tokens a row)."""
        return cls({piece: _runs(np.asarray(rows, dtype=np.int64), row_len)})


def _runs(rows: np.ndarray, scale: int = 1) -> list[tuple[int, int]]:
    """Sorted distinct indices as runs `[a, b)`, times `scale`."""
    rows = np.unique(rows)
    if not rows.size:
        return []
    cut = np.flatnonzero(np.diff(rows) != 1) + 1
    starts, ends = rows[np.r_[0, cut]], rows[np.r_[cut - 1, rows.size - 1]] + 1
    return [(int(a) * scale, int(b) * scale) for a, b in zip(starts, ends)]


def _merged(spans: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out: list[list[int]] = []
    for lo, hi in sorted((int(a), int(b)) for a, b in spans if b > a):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((a, b) for a, b in out)


def kept_rows(first: int, count: int, excluded: Sequence[tuple[int, int]]) -> np.ndarray:
    """Which rows of a share `[first, first + count)` a first epoch reads: those outside `excluded`."""
    keep = np.ones(int(count), dtype=bool)
    for a, b in excluded:
        lo, hi = max(int(a) - first, 0), min(int(b) - first, int(count))
        if lo < hi:
            keep[lo:hi] = False
    return keep


@dataclass(frozen=True)
class StreamStart:
    """Where a phase's stream starts: epoch `epoch` of its order without the rows holding text of
    `read` (read by earlier phases in that epoch), from sample `offset` of what remains. The default
    is the stream of a run without phases (train/phase_data.py computes the others)."""

    epoch: int = 0
    read: TextRead = field(default_factory=TextRead)
    offset: int = 0

    def describe(self) -> dict[str, int]:
        """What a checkpoint's input position records of it (the text read as counts)."""
        out = {"epoch": self.epoch, "read_units": self.read.units(), "offset": self.offset}
        if self.read:
            out["read_tokens"] = self.read.tokens()
        return out


def shards_digest(files: Sequence[str], counts: Sequence[int]) -> str:
    """Identifies the shard set by file names (not directories: a moved copy is the same) and counts."""
    names = [f.rstrip("/").rsplit("/", 1)[-1] for f in files]
    return hashlib.sha256(json.dumps(sorted(zip(names, map(int, counts)))).encode()).hexdigest()


def position_at(step: int, samples: int, counts: Sequence[int], window: int, digest: str,
                pipelines: int | None = None, split: str | None = "records") -> InputPosition:
    n = int(sum(counts))
    q = samples % n
    return InputPosition(step=step, samples=samples, samples_per_epoch=n, epoch=samples // n, sample_in_epoch=q,
                         window=q // window, offset=q % window, shards_sha256=digest, pipelines=pipelines,
                         shuffle_window=window, split=split)


def count_records(files: Sequence[str]) -> list[int]:
    """Records per file, by reading them (only for callers that have no manifest counts)."""
    return [int(tf.data.TFRecordDataset(f).reduce(tf.constant(0, tf.int64), lambda n, _: n + 1)) for f in files]


def file_order(n_files: int | tf.Tensor, seed: int, epoch: int | tf.Tensor) -> tf.Tensor:
    """The files' order in `epoch`: indices into the (sorted) file list (the stream's and the phases' arithmetic)."""
    return tf.argsort(tf.random.stateless_uniform([n_files], seed=tf.stack([tf.constant(seed, tf.int64),
                                                                             tf.cast(epoch, tf.int64)])))


def window_order(seed: int, epoch: int | tf.Tensor, window_index: int | tf.Tensor, size: int | tf.Tensor) -> tf.Tensor:
    """The permutation of one window of `size` records: output j is the window's record `order[j]`."""
    key = tf.stack([tf.constant(seed + 1, tf.int64),
                    tf.cast(epoch, tf.int64) * _EPOCH_STRIDE + tf.cast(window_index, tf.int64)])
    return tf.argsort(tf.random.stateless_uniform(tf.reshape(tf.cast(size, tf.int32), [1]), seed=key))


def seekable_records(files: Sequence[str], counts: Sequence[int], seed: int, window: int,
                     start_sample: int = 0, firsts: Sequence[int] | None = None, first_epoch: int = 0,
                     excluded: Sequence[Sequence[tuple[int, int]]] | None = None) -> tf.data.Dataset:
    """Serialized records of the endless stream described above, from sample `start_sample` on.

    `firsts`: each file is read from this record on (`counts` records): a pipeline's share may
    start inside a file (inputs.host_parts); None: from the first. `first_epoch`, `excluded`
    (train.phases, train/phase_data.py): the stream's first epoch is epoch `first_epoch` of the
    order without each file's rows in `excluded` (row ranges `[a, b)` of the file holding text an
    earlier phase read), its windows counted over the rows it keeps; the epochs after it are whole.
    Left out: epoch 0 whole, as before phases."""
    if len(files) != len(counts) or not files or (firsts is not None and len(firsts) != len(files)) \
            or (excluded is not None and len(excluded) != len(files)):
        raise ValueError("seekable_records needs one count per file and at least one file")
    n = int(sum(counts))
    window = max(1, int(window))
    firsts = [int(a) for a in (firsts or [0] * len(files))]
    excluded = [list(x) for x in (excluded or [()] * len(files))]
    kept = [int(kept_rows(a, c, x).sum()) for a, c, x in zip(firsts, counts, excluded)]
    n0 = sum(kept)  # the first epoch's records
    if n0 <= 0:
        raise ValueError("seekable_records: every row is excluded; start at the next epoch instead")
    start_sample = int(start_sample)
    if start_sample < n0:
        e0, q = int(first_epoch), start_sample
    else:
        e0, q = divmod(start_sample - n0, n)
        e0 += int(first_epoch) + 1
    w0, skip_first = divmod(q, window)
    files_t = tf.constant(list(files), tf.string)
    counts_t = tf.constant([int(c) for c in counts], tf.int64)
    firsts_t = tf.constant(firsts, tf.int64)
    kept_t = tf.constant(kept, tf.int64)
    seed = int(seed)
    # The excluded rows as sorted key runs (file index << 32 | row): one search per record of the first epoch.
    runs = sorted((i << 32 | int(a), i << 32 | int(b)) for i, x in enumerate(excluded) for a, b in x if b > a)
    run_starts = tf.constant([a for a, _ in runs], tf.int64)
    run_ends = tf.constant([b for _, b in runs], tf.int64)

    def file_records(epoch: tf.Tensor, index: tf.Tensor, name: tf.Tensor, k: tf.Tensor, a: tf.Tensor,
                     count: tf.Tensor, size: tf.Tensor) -> tf.data.Dataset:
        if not runs:
            return tf.data.TFRecordDataset(name).skip(a + k).take(size - k)

        def keep(row: tf.Tensor, _: tf.Tensor) -> tf.Tensor:
            key = tf.bitwise.left_shift(index, 32) + a + row
            at = tf.searchsorted(run_starts, tf.reshape(key, [1]), side="right")[0] - 1
            inside = tf.logical_and(at >= 0, key < tf.gather(run_ends, tf.maximum(at, 0)))
            return tf.logical_or(epoch != first_epoch, tf.logical_not(inside))

        rows = tf.data.TFRecordDataset(name).skip(a).take(count).enumerate().filter(keep)
        return rows.map(lambda _, r: r).skip(k).take(size - k)

    def epoch_records(epoch: tf.Tensor) -> tf.data.Dataset:
        order = file_order(len(files), seed, epoch)
        names, counts_o, starts = tf.gather(files_t, order), tf.gather(counts_t, order), tf.gather(firsts_t, order)
        sizes = tf.where(epoch == first_epoch, tf.gather(kept_t, order), counts_o)
        ends = tf.cumsum(sizes)
        begins = ends - sizes
        first = tf.where(epoch == e0, tf.constant(w0 * window, tf.int64), tf.constant(0, tf.int64))
        keep = tf.logical_and(ends > first, sizes > 0)  # files wholly before the first window read are never opened
        skips = tf.maximum(first - begins, 0)
        parts = tf.data.Dataset.from_tensor_slices(tuple(tf.boolean_mask(x, keep) for x in (
            tf.cast(order, tf.int64), names, skips, starts, counts_o, sizes)))
        records = parts.flat_map(lambda i, name, k, a, c, size: file_records(epoch, i, name, k, a, c, size))
        first_window = first // window

        def permute(i: tf.Tensor, batch: tf.Tensor) -> tf.Tensor:
            return tf.gather(batch, window_order(seed, epoch, first_window + i, tf.shape(batch)[0]))

        return records.batch(window).enumerate().map(permute).unbatch()

    stream = tf.data.Dataset.range(e0, tf.int64.max).flat_map(epoch_records)
    return stream.skip(skip_first) if skip_first else stream


class PositionTracker:
    """The input position of this process's first pipeline at any step, for checkpoints and events.

    `bind(ctx)` is called from the dataset function (it learns the pipeline's files and how many
    pipelines share the global batch); `at(step)` is then pure arithmetic.
    """

    sources: tuple[str, ...] = ("corpus",)  # the streams a span reads (a mixture: one per source)

    def __init__(self, train_files: Sequence[tuple[str, int]], global_batch: int, window: int, seed: int = 0):
        self.counts = {p: int(n) for p, n in train_files}
        self.global_batch = global_batch
        self.window = window
        self._seed = int(seed)
        self.digest = shards_digest(list(self.counts), list(self.counts.values()))
        self.mine: list[tuple[str, int, int]] = [(f, 0, self.counts[f]) for f in sorted(self.counts)]
        self.pipelines = 1
        self.pipeline = 0
        self._bound = False
        # train.phases (train/phase_data.py): the plan's data and this tracker's phase; None: one stream from sample 0.
        self.phase_data: Any = None
        self.phase = 0

    def bind(self, mine: Sequence[str | tuple[str, int, int]], pipelines: int, pipeline: int = 0) -> None:
        """`mine`: the pipeline's parts `(file, first record, records)` (inputs.host_parts), or whole files."""
        if not self._bound:  # the first pipeline of this process is the one recorded
            self.mine = [(m, 0, self.counts[m]) if isinstance(m, str) else tuple(m) for m in mine]
            self.pipelines, self.pipeline, self._bound = pipelines, pipeline, True

    @property
    def seed(self) -> int:
        """The record order's seed (the run's)."""
        return self._seed

    @property
    def bound(self) -> bool:
        """Whether this process has built the span's input (`bind`): its pipelines are known."""
        return self._bound

    def stream_start(self, source: str, pipeline: int, pipelines: int) -> tuple[StreamStart, dict[str, list]]:
        """Where this stream of `source` starts on that pipeline (a phase continues the text read so
        far, train/phase_data.py), and per file the row ranges its first epoch leaves out."""
        if self.phase_data is None:
            return StreamStart(), {}
        start = self.phase_data.start(self.phase, source, pipeline, pipelines)
        return start, self.phase_data.excluded(self.phase, source, start)

    def records(self, ctx: tf.distribute.InputContext | None, step: int) -> tuple[tf.data.Dataset, list[str]]:
        """The data protocol every span's source implements: this input pipeline's serialized records
        from the span's local step `step` on, and the files (or file ranges) it reads. One stream
        over the train files here; a mixture draws from one stream per source (mixture.py)."""
        pipelines, pipeline = (ctx.num_input_pipelines, ctx.input_pipeline_id) if ctx else (1, 0)
        per_step = self.global_batch // pipelines
        ds, parts = self.source_records("corpus", list(self.counts), self.seed, ctx, step * per_step)
        self.bind(parts, pipelines, pipeline)
        return ds, self.described(parts)

    def source_records(self, source: str, files: Sequence[str], seed: int, ctx: tf.distribute.InputContext | None,
                       samples: int) -> tuple[tf.data.Dataset, list[tuple[str, int, int]]]:
        """One source's stream on this pipeline after `samples` of its samples (counted from where
        the span's stream starts), and the pipeline's parts of its files."""
        parts = host_parts(files, self.counts, ctx)  # an equal share of the records per pipeline
        pipelines, pipeline = (ctx.num_input_pipelines, ctx.input_pipeline_id) if ctx else (1, 0)
        start, excluded = self.stream_start(source, pipeline, pipelines)
        ds = seekable_records([f for f, _, _ in parts], [c for _, _, c in parts], seed, self.window,
                              start_sample=start.offset + int(samples), firsts=[a for _, a, _ in parts],
                              first_epoch=start.epoch,
                              excluded=[excluded.get(f, []) for f, _, _ in parts] if excluded else None)
        return ds, parts

    def described(self, parts: Sequence[tuple[str, int, int]]) -> list[str]:
        """The files a pipeline reads, `file[a:b]` for part of one."""
        return [f if c == self.counts[f] else f"{f}[{a}:{a + c}]" for f, a, c in parts]

    def at(self, step: int) -> InputPosition:
        return position_at(step, step * self.global_batch // self.pipelines, [n for _, _, n in self.mine],
                           self.window, self.digest, self.pipelines)

    def check_resume(self, stored: str | None, step: int, where: str, accept_new_order: bool = False) -> InputPosition:
        """The position to resume at: the stored one, which must describe these shards, `step`, and
        the same order (input pipelines, shuffle window), unless `accept_new_order` says a changed
        order is meant (train.accept_new_data_order): then the position in the new order."""
        import logging

        if stored is None:  # a checkpoint from before positions were stored: the step says it all
            return self.at(step)
        saved = InputPosition.from_json(stored)
        if saved.shards_sha256 != self.digest:
            raise UserError(f"{where}: the checkpoint's input position refers to other shards than the "
                            f"{len(self.counts)} train files the shard set now lists; resume with the shards it "
                            f"was trained on, or start a new run")
        if saved.step != step:
            raise UserError(f"{where}: stored input position is for step {saved.step}, the checkpoint is at step "
                            f"{step}; the checkpoint directory was changed by hand, restore it or start a new run")
        changed = self.order_changes(saved)
        if changed and not accept_new_order:
            raise UserError(f"--resume: {where} was trained in another data order ({', '.join(changed)}); "
                            f"resuming would repeat or skip samples of this epoch; resume with the same hosts "
                            f"and train.shuffle_buffer, or set train.accept_new_data_order=true to continue "
                            f"at step {step} in the new order")
        if changed:
            logging.getLogger(__name__).warning("resuming in a new data order (train.accept_new_data_order): %s; "
                                                "some samples of this epoch repeat or are skipped", ", ".join(changed))
            return self.at(step)
        # (A multi-worker process may not have built its pipelines yet, so `at(step)` is not compared
        # here; the batch size, which decides the sample, is part of the run's fingerprint.)
        return saved

    def order_changes(self, saved: InputPosition) -> list[str]:
        """What differs in the order's definition between `saved` and this run (empty: the same)."""
        changed = []
        if saved.pipelines is not None and self._bound and saved.pipelines != self.pipelines:
            changed.append(f"input pipelines (hosts) {saved.pipelines} -> {self.pipelines}")
        if saved.split is None and (saved.pipelines or 1) > 1 and self.pipelines > 1:
            changed.append("hosts' shares: whole files round-robin -> equal record ranges")
        if saved.shuffle_window is not None and saved.shuffle_window != self.window:
            changed.append(f"train.shuffle_buffer {saved.shuffle_window} -> {self.window}")
        return changed


def host_parts(files: Sequence[str], counts: Mapping[str, int],
               ctx: tf.distribute.InputContext | None) -> list[tuple[str, int, int]]:
    """This input pipeline's share of the train records: `(file, first record, records)` parts.

    Every pipeline feeds the same number of samples per step, so every pipeline must hold the same
    number of records per epoch, or the samples of a small share are seen more often (5 files
    round-robin on 4 pipelines: the two files of pipeline 0 were seen half as often as the others).
    So pipeline p reads records [p N / P, (p + 1) N / P) of the sorted files' records laid end to
    end: shares differ by at most one record, whatever the files' number and sizes. A share may
    start or end inside a file (that file's first records are skipped by reading them, at most one
    file per pipeline and epoch)."""
    files = sorted(files)
    if ctx is None or ctx.num_input_pipelines == 1:
        return [(f, 0, int(counts[f])) for f in files]
    p, n_pipes = ctx.input_pipeline_id, ctx.num_input_pipelines
    total = sum(int(counts[f]) for f in files)
    lo, hi = p * total // n_pipes, (p + 1) * total // n_pipes
    if hi <= lo:
        raise UserError(f"only {total} train samples for {n_pipes} reading hosts; make more shards "
                        f"(a larger corpus)")
    parts, begin = [], 0
    for f in files:
        end = begin + int(counts[f])
        a, b = max(lo, begin), min(hi, end)
        if a < b:
            parts.append((f, a - begin, b - a))
        begin = end
    return parts
