"""Corpus -> fixed-length samples -> TFRecord shards, in parallel on Ray actors, with a manifest.

Why over 400 lines: the worker and the driver change together (a manifest entry is written by the
driver from what the worker returns); the manifest itself (schema, resume state, verification) is
prepare/shard_set.py, the actor scheduler prepare/actor_pool.py.

Each work unit (see corpus.py) becomes `train/train-<unit:05d>-<count>.tfrecord` (and a
`validation/validation-...` shard for its tail): one folder per split, the layout Hugging Face's
reference scripts write and read (their trainer globs `<folder>/*.tfrecord`). Samples are `[CLS] + seq_len-2 tokens + [SEP]` cut from the unit's lines
joined with [SEP]; the unit's remainder is dropped and counted. Because a shard depends only on
its unit, output is byte-identical with any number of actors or nodes, and a retried unit rewrites
the same bytes under the same name: exactly-once by construction.

Why the scheduler is hand-written: `ray.util.ActorPool` loses the unit of an actor that dies
(it raises and forgets it), and Ray Data's writers name files by UUID and size them by blocks.
What remains is ~50 lines around `ray.wait` that resubmits a dead actor's unit to a fresh actor.

The stage is given a `ShardJob`, what it reads of the run (the corpus and shard sections, where the
run's files are, the phases' other lengths, the model's positions), built once by the pipeline.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import resource
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tpu_ray import storage
from tpu_ray.config import CorpusConfig, RunPaths, ShardConfig
from tpu_ray.prepare.corpus import WorkUnit, iter_chunks
from tpu_ray.prepare.sources import PlannedSource, all_units, plan_sources
from tpu_ray.prepare.streams import Counts
from tpu_ray.prepare.lines import split_long_lines, warn_split_lines
from tpu_ray.errors import UserError
from tpu_ray.prepare.actor_pool import run_on_pool
from tpu_ray.prepare.bad_records import check_sources, skipped_by_kind, unit_stats
from tpu_ray.prepare.shard_set import SPLITS, ShardSet, manifest_path
from tpu_ray.prepare.text_bytes import bytes_per_token
from tpu_ray.prepare.tfrecord import examples_file
from tpu_ray.prepare.tokenizer import TokenizerInfo, declared_roles, describe, load_tokenizer_json
from tpu_ray.redact import redact_obj
from tpu_ray.cluster.cpu_nodes import cpu_outside_tpu_hosts, off_tpu_options
from tpu_ray.cluster.autoscaler import cluster_autoscales
from tpu_ray.prepare.progress import Progress

log = logging.getLogger(__name__)
MANIFEST_WRITES = 100  # intermediate manifest writes per run, at most about this many


# --------------------------------------------------------------------------------------------
# Pure functions: the same in an actor, a test, or a benchmark
# --------------------------------------------------------------------------------------------
def join_ids(token_lists: list[list[int]], sep_id: int) -> np.ndarray:
    """Token lists (empty ones skipped), each followed by [SEP], as one int64 array."""
    nonempty = [ids for ids in token_lists if ids]
    total = sum(map(len, nonempty)) + len(nonempty)
    # One numpy fill from a flat iterator: no growing Python list of every token of the unit.
    return np.fromiter(itertools.chain.from_iterable((*ids, sep_id) for ids in nonempty), dtype=np.int64,
                       count=total)


def cut_rows(flat: np.ndarray, seq_len: int, cls_id: int, sep_id: int) -> tuple[np.ndarray, int, int]:
    """Cut joined ids into `[CLS] chunk [SEP]` rows; returns (rows, tokens, dropped remainder)."""
    body = seq_len - 2
    n = len(flat) // body
    rows = np.empty((n, seq_len), dtype=np.int64)
    rows[:, 0] = cls_id
    rows[:, 1:-1] = flat[: n * body].reshape(n, body)
    rows[:, -1] = sep_id
    return rows, len(flat), len(flat) - n * body


def chunk_ids(token_lists: list[list[int]], seq_len: int, cls_id: int, sep_id: int) -> tuple[np.ndarray, int, int]:
    """Join token lists with [SEP], cut into `[CLS] chunk [SEP]` rows; returns (rows, tokens, dropped)."""
    return cut_rows(join_ids(token_lists, sep_id), seq_len, cls_id, sep_id)


def shard_name(split: str, unit_index: int, count: int, part: int | None = None) -> str:
    """`<split>-<index:05d>-<count>.tfrecord`: the sample count in the name, as HF's TPU scripts read.

    A streamed unit (a compressed file, a CSV, row groups) writes a shard per chunk:
    `<split>-<index:05d>.<part:04d>-<count>.tfrecord` (the count stays the last `-` field)."""
    index = f"{unit_index:05d}" if part is None else f"{unit_index:05d}.{part:04d}"
    return f"{split}-{index}-{count}.tfrecord"


def shard_path(split: str, unit_index: int, count: int, part: int | None = None) -> str:
    """A shard's path relative to the shards dir, as the manifest records it: `<split>/<name>`."""
    return f"{split}/{shard_name(split, unit_index, count, part)}"


def text_tokenizer(tokenizer_json: str) -> Any:
    """The tokenizer the shards encode with (see `encode_lines` for what becomes of special strings)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tokenizer_json)


def never_text_ids(info: TokenizerInfo) -> frozenset[int]:
    """The ids no corpus text may produce: [CLS] [SEP] <pad> [MASK]. A literal `<pad>`
    mid-sample would be padding to TF RoBERTa's position ids and never a masking target; [SEP] and
    [CLS] mark sample structure; [MASK] is the training signal. `<unk>` is not among them: it is
    an ordinary masking target, and WikiText writes its unknown words as `<unk>`, which
    the tokenizer's unknown token means exactly."""
    return frozenset({info.cls_id, info.sep_id, info.pad_id, info.mask_id})


def encode_lines(tok: Any, lines: list[str], special_ids: frozenset[int] = frozenset()) -> list[list[int]]:
    """Ids of each line. Text is text: a special-token string written in a line ("a <pad> b [SEP]",
    also glued to a word) is matched by the tokenizer as its special token (`add_special_tokens=False`
    only drops the template's [CLS]/[SEP]); each id of `special_ids` that stands for such text is
    spelled by its characters instead."""
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # _fast skips offsets (tokenizers>=0.20)
    out = [e.ids for e in encode(lines, add_special_tokens=False)]
    if special_ids:
        for i, ids in enumerate(out):
            if not special_ids.isdisjoint(ids):  # rare: only lines with such strings pay for offsets
                out[i] = _respell(tok, lines[i], special_ids)
    return out


def _respell(tok: Any, line: str, special_ids: frozenset[int]) -> list[int]:
    """`line`'s ids with every id of `special_ids` replaced by the ids of the characters it stands
    for (the tokenizer's unknown id for a character its vocabulary lacks, as for any such character)."""
    return _respelled(tok, line, tok.encode(line, add_special_tokens=False), special_ids)[0]


def _respelled(tok: Any, line: str, enc: Any, special_ids: frozenset[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """`_respell` from the line's encoding `enc`, with each id's character offsets into `line`."""
    ids: list[int] = []
    offsets: list[tuple[int, int]] = []
    for token_id, (start, end) in zip(enc.ids, enc.offsets):
        if token_id not in special_ids:
            ids.append(token_id)
            offsets.append((start, end))
            continue
        for j, ch in enumerate(line[start:end]):
            ch_id = tok.token_to_id(ch)
            ids.append(ch_id if ch_id is not None and ch_id not in special_ids else _unk_id(tok, special_ids))
            offsets.append((start + j, start + j + 1))
    return ids, offsets


def encode_lines_with_bytes(tok: Any, lines: list[str], special_ids: frozenset[int] = frozenset()
                            ) -> tuple[list[list[int]], list[list[int]]]:
    """`encode_lines` and, per id, the UTF-8 bytes of the line it stands for (prepare/text_bytes.py):
    what bits per byte divides by. Validation text only: the offsets cost tokenizer time."""
    ids, nbytes = [], []
    for line, enc in zip(lines, tok.encode_batch(lines, add_special_tokens=False)):
        line_ids, offsets = _respelled(tok, line, enc, special_ids)
        ids.append(line_ids)
        nbytes.append(bytes_per_token(line, offsets))
    return ids, nbytes


def _unk_id(tok: Any, special_ids: frozenset[int]) -> int:
    """The tokenizer's unknown id: BPE and WordPiece name their unknown token; a Unigram model does
    not expose it, so the two spellings the families use (`<unk>`, `[UNK]`) are tried."""
    for name in (getattr(tok.model, "unk_token", None), "<unk>", "[UNK]"):
        unk = tok.token_to_id(name) if name else None
        if unk is not None:
            return unk
    return min(special_ids)


ENCODE_BATCH_LINES = 2048  # lines per tokenizer call: bounds the Python lists alive at once
ENCODE_BATCH_CHARS = 1 << 20  # ... and characters per call, so that long lines make smaller batches


def encode_joined(tok: Any, lines: list[str], sep_id: int, special_ids: frozenset[int] = frozenset()) -> np.ndarray:
    """`join_ids(encode_lines(tok, lines))`, a batch of lines at a time.

    Why batches: a unit's tokens as Python lists cost ~10x their numpy size; batching keeps only
    one batch of lists alive, so an actor's memory depends little on the unit size.
    """
    parts = [join_ids(encode_lines(tok, batch, special_ids), sep_id) for batch in _batches(lines)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def encode_joined_with_bytes(tok: Any, lines: list[str], sep_id: int, special_ids: frozenset[int] = frozenset()
                             ) -> tuple[np.ndarray, np.ndarray]:
    """`encode_joined` and, aligned with it, each id's UTF-8 bytes of text ([SEP] stands for none)."""
    ids_parts, byte_parts = [], []
    for batch in _batches(lines):
        ids, nbytes = encode_lines_with_bytes(tok, batch, special_ids)
        ids_parts.append(join_ids(ids, sep_id))
        byte_parts.append(join_ids(nbytes, 0))
    if not ids_parts:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(ids_parts), np.concatenate(byte_parts)


def _batches(lines: list[str]):
    """Consecutive runs of at most ENCODE_BATCH_LINES lines and about ENCODE_BATCH_CHARS characters."""
    start, chars = 0, 0
    for i, line in enumerate(lines):
        if i > start and (i - start >= ENCODE_BATCH_LINES or chars + len(line) > ENCODE_BATCH_CHARS):
            yield lines[start:i]
            start, chars = i, 0
        chars += len(line)
    if start < len(lines):
        yield lines[start:]


def process_unit(unit: WorkUnit, tok: Any, info: TokenizerInfo, seq_len: int, out_dir: str,
                 max_line_bytes: int | None = None, live: dict | None = None,
                 extra_lengths: tuple[int, ...] = ()) -> dict:
    """Tokenize, chunk and write one unit's shards (atomically); returns its manifest entries
    (and `split_lines`: lines over `max_line_bytes` that were cut, for the driver's warning;
    `skipped_records`: records whose text field was null or missing, records.py's rule).

    `extra_lengths` (train.phases' shorter lengths): the same train tokens are also cut at each
    length L into `<out_dir>/seq-L/train/` (one tokenization for every length); their entries are
    under `by_length[L]` (train/phases.py)."""
    result: dict[str, Any] = {"unit": unit.index, "shards": [], "tokens": 0, "dropped_tokens": 0, "split_lines": 0,
                              "skipped_records": 0}
    if extra_lengths:
        result["by_length"] = {n: {"unit": unit.index, "shards": [], "tokens": 0, "dropped_tokens": 0}
                               for n in extra_lengths}
    counts = Counts(max_record_bytes=max_line_bytes)
    for part, chunk in enumerate(iter_chunks(unit, counts)):
        for split in SPLITS:
            lines = chunk.train if split == "train" else chunk.validation
            if max_line_bytes:
                lines, cut = split_long_lines(lines, max_line_bytes)
                result["split_lines"] += cut
            if not lines:
                continue
            text_bytes = None  # validation rows carry each token's bytes of text: bits per byte
            if split == "train":
                flat = encode_joined(tok, lines, info.sep_id, never_text_ids(info))
            else:
                flat, text_bytes = encode_joined_with_bytes(tok, lines, info.sep_id, never_text_ids(info))
            if live is not None:  # read by the driver while the unit runs (ShardWorker.live_progress)
                live.update(lines=live["lines"] + len(lines), chars=live["chars"] + sum(map(len, lines)),
                            tokens=live["tokens"] + len(flat))
            del lines
            if split == "train":
                for length in extra_lengths:
                    _write_rows(flat, length, info, split, unit, part, storage.join(out_dir, f"seq-{length}"),
                                result["by_length"][length])
            rows, tokens, dropped = cut_rows(flat, seq_len, info.cls_id, info.sep_id)
            row_bytes = None if text_bytes is None else cut_rows(text_bytes, seq_len, 0, 0)[0]
            del flat, text_bytes
            result["tokens"] += tokens
            result["dropped_tokens"] += dropped
            if len(rows) == 0:
                continue
            name = shard_path(split, unit.index, len(rows), part if unit.streamed else None)
            if not storage.is_remote(out_dir):  # object stores have no folders to make
                storage.makedirs(storage.join(out_dir, split))
            digest, nbytes = _commit_shard(rows, storage.join(out_dir, name), row_bytes)
            result["shards"].append({"split": split, "path": name, "unit": unit.index, "samples": len(rows),
                                     "tokens": int(rows.size), "bytes": nbytes, "sha256": digest})
        chunk.train, chunk.validation = [], []  # one chunk's text alive at a time
    result["skipped_records"] = counts.skipped
    result.update(unit_stats(unit.index, counts, out_dir))  # record counts; bad records listed (each accounted for)
    return result


def _write_rows(flat: np.ndarray, seq_len: int, info: TokenizerInfo, split: str, unit: WorkUnit, part: int,
               out_dir: str, into: dict) -> None:
    """Cut `flat` at `seq_len` and commit the rows as one shard under `out_dir`, recorded in `into`."""
    rows, tokens, dropped = cut_rows(flat, seq_len, info.cls_id, info.sep_id)
    into["tokens"] += tokens
    into["dropped_tokens"] += dropped
    if len(rows) == 0:
        return
    name = shard_path(split, unit.index, len(rows), part if unit.streamed else None)
    if not storage.is_remote(out_dir):
        storage.makedirs(storage.join(out_dir, split))
    digest, nbytes = _commit_shard(rows, storage.join(out_dir, name))
    into["shards"].append({"split": split, "path": name, "unit": unit.index, "samples": len(rows),
                           "tokens": int(rows.size), "bytes": nbytes, "sha256": digest})


def _commit_shard(rows: np.ndarray, final_path: str, text_bytes: np.ndarray | None = None) -> tuple[str, int]:
    """Build the shard in memory (one unit's worth), hash it, commit it to `final_path` atomically."""
    data = examples_file(rows, text_bytes)
    storage.atomic_write_bytes(final_path, data)
    return hashlib.sha256(data).hexdigest(), len(data)


def actor_env(threads: int) -> dict[str, str]:
    """Environment of a sharding actor: its tokenizer thread budget and the driver's storage endpoint."""
    env = storage.forwarded_env()
    env.update(RAYON_NUM_THREADS=str(threads), RAYON_RS_NUM_CPUS=str(threads),
               TOKENIZERS_PARALLELISM="true" if threads > 1 else "false")
    return env


def _read_bytes() -> int:
    """Bytes this process read through read() calls (`rchar` of /proc/self/io); 0 where there is none."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))
    except (OSError, StopIteration, ValueError):
        return 0


def _warm_imports(unit: dict) -> None:
    """Import a format's reader before the read counter starts: reading modules is not reading corpus."""
    from tpu_ray.prepare.readers import reader

    reader(unit["fmt"]).warm()
    if unit.get("compression") == "zstd":
        import zstandard  # noqa: F401


class ShardWorker:
    """One Ray actor: loads the tokenizer once, then processes units."""

    def __init__(self, tokenizer_json: str, info: TokenizerInfo, seq_len: int, out_dir: str, env: dict[str, str],
                 max_line_bytes: int | None = None, extra_lengths: tuple[int, ...] = ()):
        # The environment (thread budget, storage endpoint) is set here, before the tokenizer or
        # storage first run, rather than through a runtime_env: env_vars in a runtime_env need
        # freshly started workers (~1 s each on 2 cores); this way the actor starts in one of
        # Ray's prestarted workers.
        os.environ.update(env)
        self.tok = text_tokenizer(tokenizer_json)
        self.read_total = 0  # bytes read by process calls, module imports excluded
        self.requests_total = 0  # storage calls of process calls (tpu_ray.storage.REQUESTS)
        self.info = info
        self.seq_len = seq_len
        self.out_dir = out_dir
        self.max_line_bytes = max_line_bytes
        self.extra_lengths = tuple(extra_lengths)

    def process(self, unit: dict) -> dict:
        self.live = {"unit": unit["index"], "lines": 0, "chars": 0, "tokens": 0}
        _warm_imports(unit)
        before, calls = _read_bytes(), storage.requests_made()
        result = process_unit(WorkUnit.from_dict(unit), self.tok, self.info, self.seq_len, self.out_dir,
                              self.max_line_bytes, self.live, self.extra_lengths)
        self.read_total += _read_bytes() - before
        self.requests_total += storage.requests_made() - calls
        self.live = None
        # Peak resident memory of this actor so far (Linux reports KiB); not part of the manifest.
        result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        # Bytes this actor has read since it started, for the benchmark.
        result["actor"] = os.getpid()
        result["read_bytes"] = self.read_total
        result["requests"] = self.requests_total
        return result

    def live_progress(self) -> dict | None:
        """The unit in progress and its lines, characters and tokens so far (None when idle): the
        actor runs two calls at once (max_concurrency=2), so the driver asks while it works."""
        return dict(self.live) if getattr(self, "live", None) else None

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


# --------------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------------
@dataclass
class ShardSummary:
    shards: int
    samples: int
    tokens: int
    dropped_tokens: int
    seconds: float
    units: int
    skipped_units: int
    actors: int
    peak_actor_rss_bytes: int = 0  # the largest peak RSS any actor reported (0 if none ran)
    skipped_records: int = 0  # records whose text field was null or missing (records.py's rule)
    skipped_by_kind: dict[str, int] = field(default_factory=dict)  # those records by file kind (jsonl, csv, ...)
    bad_records: int = 0  # records that could not be read, skipped under corpus.bad_records=skip (bad_records.jsonl)
    skipped_by_source: dict[str, int] = field(default_factory=dict)  # skipped records by named source (mixtures)
    resumed_tokens: int = 0  # tokens of units an earlier run committed: not this run's work
    read_bytes: int = 0  # bytes the actors read (the corpus, once; /proc rchar): the benchmark's figure
    requests: int = 0  # storage calls of this run: the driver's (planning, manifest) and the actors'

    @property
    def tokens_per_s(self) -> float:
        """This run's rate: resumed units' tokens are not counted against this run's time."""
        return (self.tokens - self.resumed_tokens) / self.seconds if self.seconds else 0.0

    def line(self) -> str:
        return (f"shards={self.shards} samples={self.samples} tokens={self.tokens} "
                f"dropped_remainder_tokens={self.dropped_tokens} seconds={self.seconds:.1f} "
                f"tokens/s={self.tokens_per_s:,.0f} units={self.units} resumed_units={self.skipped_units} "
                f"resumed_tokens={self.resumed_tokens} "
                f"actors={self.actors} peak_actor_rss_mb={self.peak_actor_rss_bytes / 2**20:.0f} "
                f"skipped_records={self.skipped_records}{_by_kind(self.skipped_by_kind)} "
                f"bad_records={self.bad_records} storage_requests={self.requests}")


@dataclass(frozen=True)
class ShardJob:
    """What the sharding stage reads of a run, built once where the run is assembled (pipeline.py's
    `shard_job`): the stage cannot depend on a section it is not given (the model, training, trackers)."""

    corpus: CorpusConfig
    shard: ShardConfig
    paths: RunPaths  # the tokenizer it encodes with, the shard sets it writes, the run that owns them
    lengths: tuple[int, ...]  # train.phases' lengths other than shard.seq_len (prepare/lengths.py)
    positions_needed: int  # the model positions a shard.seq_len sample uses ...
    max_positions: int  # ... and those the model has: checked here too, for explicit shard dirs
    shared_filesystem: bool  # ray.shared_filesystem: whether other nodes' actors see the shards dir


def record_groups(job: ShardJob, planned: list[PlannedSource]) -> list[tuple[str | None, list[int], str, float]]:
    """Each source's units and record settings, for the corpus-wide record rules (bad_records.py)."""
    from tpu_ray.prepare.sources import source_corpus

    named = job.corpus.sources is not None
    return [(f"corpus.sources.{p.name}" if named else None, [u.index for u in p.units],
             source_corpus(job.corpus, p.name).text_field, source_corpus(job.corpus, p.name).max_bad_fraction)
            for p in planned]


def _by_kind(kinds: dict[str, int]) -> str:
    return f" ({', '.join(f'{k}: {n}' for k, n in kinds.items())})" if kinds else ""


def _plan_digest(units: list[WorkUnit], sources: dict[str, dict] | None = None) -> str:
    """Identifies the plan: every unit (source path, format, byte or row range), and for a mixture
    which units are whose; a moved corpus is a new plan."""
    keys: list[Any] = [u.key() for u in units]
    if sources is not None:
        keys.append(sorted((name, meta["units"], meta["evaluation_only"]) for name, meta in sources.items()))
    payload = json.dumps(keys, sort_keys=True).encode()
    return hashlib.sha256(payload).hexdigest()


def sources_meta(corpus: CorpusConfig, planned: list[PlannedSource]) -> dict[str, dict] | None:
    """A mixture's sources as the manifest records them (None for the one-source corpus, whose
    manifest stays as earlier versions wrote it)."""
    if corpus.sources is None:
        return None
    return {p.name: {"units": list(p.unit_range), "evaluation_only": p.weight == 0} for p in planned}


def shard_set(job: ShardJob, info: TokenizerInfo, planned: list[PlannedSource] | list[WorkUnit],
              results: dict[int, dict], complete: bool) -> ShardSet:
    """The shard set of the units committed so far (`results`: process_unit's, by unit index).
    `planned`: plan_sources' sources, or the one-source corpus's units (benchmarks, tests)."""
    if planned and isinstance(planned[0], WorkUnit):
        planned = [PlannedSource("corpus", 1.0, list(planned))]  # type: ignore[arg-type]
    units = all_units(planned)
    sources = sources_meta(job.corpus, planned)
    source = job.corpus.model_dump(mode="json", exclude_none=job.corpus.sources is not None)
    if job.corpus.sources is None:  # the one-source manifest's `source` as earlier versions wrote it
        source = {k: v for k, v in source.items() if k not in ("sources", "weight_temperature", "weight_schedule")}
    return ShardSet.from_results(job.paths.shards_dir, seq_len=job.shard.seq_len, tok=info,
                                 source=redact_obj(source), plan_sha256=_plan_digest(units, sources),
                                 units=len(units), results=results, complete=complete, sources=sources,
                                 owner=job.paths.run_dir if job.shard.dir else None)


def length_sets(job: ShardJob, info: TokenizerInfo, planned: list[PlannedSource] | list[WorkUnit],
                results: dict[int, dict], complete: bool) -> list[ShardSet]:
    """The shard sets of train.phases' shorter lengths (`<shards>/seq-L`, train split only), from
    the same units' results (`by_length`); [] without phases."""
    if not job.lengths:
        return []
    main = shard_set(job, info, planned, {}, complete)  # the header fields they share
    out = []
    for length in job.lengths:
        sub = {u: r["by_length"][length] for u, r in results.items()}
        out.append(ShardSet.from_results(job.paths.shards_at(length), seq_len=length, tok=info, source=main.source,
                                         plan_sha256=main.plan_sha256, units=main.units, results=sub,
                                         complete=complete, sources=main.sources, owner=main.owner))
    return out


def write_sets(job: ShardJob, info: TokenizerInfo, planned: list[PlannedSource] | list[WorkUnit],
               results: dict[int, dict], complete: bool) -> ShardSet:
    """Commit the manifests: the phases' sets first, the main one last (the one training checks
    for `complete`); returns the main set."""
    for sub in length_sets(job, info, planned, results, complete):
        sub.write()
    main = shard_set(job, info, planned, results, complete)
    main.write()
    return main


def committed_lengths(job: ShardJob, results: dict[int, dict], digest: str, tok_sha256: str,
                      owned: bool) -> dict[int, dict]:
    """`results` (the main set's committed units) narrowed to the units every phase length's set
    committed too, each with its `by_length` entries; unchanged without phases."""

    for length in job.lengths:
        sub = ShardSet.load(job.paths.shards_at(length))
        if sub is None and not owned and results:
            raise UserError(f"{job.paths.shards_at(length)}: train.phases needs shards at seq_len {length}, and "
                            f"the shards in {job.paths.shards_dir} belong to another run; shard into a shard.dir "
                            f"of this run")
        done = sub.committed_units(digest, tok_sha256, length, owned) if sub is not None else {}
        results = {u: {**r, "by_length": {**r.get("by_length", {}), length: done[u]}}
                   for u, r in results.items() if u in done}
    return results


def make_shards(job: ShardJob, actors: int | None = None, on_unit_done=None) -> ShardSummary:
    """Run the sharding stage on the Ray cluster `ray.init()` connected to; resumable.

    `on_unit_done(units_done, pool)` is called after each committed unit (progress hooks, and
    fault-injection in tests: killing an actor of `pool`).
    """
    import ray

    t0, calls_before = time.monotonic(), storage.requests_made()
    out_dir, tokenizer_dir = job.paths.shards_dir, job.paths.tokenizer_dir
    tokenizer_json = load_tokenizer_json(tokenizer_dir)
    info = describe(tokenizer_json, tokenizer_dir, declared_roles(tokenizer_dir))
    if job.positions_needed > job.max_positions:  # also checked by config; here for explicit dirs
        raise UserError(f"shard.seq_len={job.shard.seq_len}: needs {job.positions_needed} model positions, "
                        f"model.max_position_embeddings is {job.max_positions}")
    from tpu_ray.cluster.shared_dir import require_shared

    require_shared(out_dir, "shard.dir" if job.shard.dir else "output_dir", "sharding", job.shared_filesystem)
    planned = plan_sources(job.corpus, job.shard, job.paths.run_dir)
    units = all_units(planned)
    storage.makedirs(out_dir)
    previous = ShardSet.load(out_dir)
    digest = _plan_digest(units, sources_meta(job.corpus, planned))
    owned = owns(job, previous)
    results = previous.committed_units(digest, info.sha256, job.shard.seq_len, owned) if previous else {}
    results = committed_lengths(job, results, digest, info.sha256, owned)
    todo = [u for u in units if u.index not in results]
    if todo and not owned:  # checked before any actor starts: nothing is written into another run's set
        raise UserError(f"{out_dir}: these shards belong to run {previous.owner_run() if previous else '?'} and "
                        f"{len(todo)} of their {len(units)} units are not there for this run's settings; they are "
                        f"left as they are: finish them from that run or use another shard.dir")

    nodes = ray.nodes()
    placement = off_tpu_options(nodes)  # never on TPU hosts (one process per host owns the TPU)
    cluster_cpus = max(1.0, cpu_outside_tpu_hosts(nodes) if placement else ray.cluster_resources().get("CPU", 1.0))
    n_actors = actors or job.shard.num_actors or int(cluster_cpus)
    n_actors = max(1, min(n_actors, len(todo))) if todo else 0
    actor_cpus = _actor_cpus(cluster_cpus, n_actors)
    Worker = ray.remote(num_cpus=actor_cpus, max_restarts=0, max_concurrency=2, **placement)(ShardWorker)
    tok_ref = ray.put(tokenizer_json)
    env = actor_env(job.shard.tokenizer_threads)

    def new_actor():
        return Worker.remote(tok_ref, info, job.shard.seq_len, out_dir, env, job.corpus.max_line_bytes, job.lengths)

    pool = [new_actor() for _ in range(n_actors)]
    try:
        return _shard_on_pool(job, info, planned, todo, results, pool, new_actor, on_unit_done, t0, calls_before,
                              owned)
    finally:
        # Always release the actors (and their CPUs), also when a unit fails with bad input:
        # leaked actors would hold every CPU and the next run would wait for them forever.
        for actor in pool:
            ray.kill(actor)


def owns(job: ShardJob, shards: ShardSet | None) -> bool:
    """Whether this run made (and so may clean, resume or discard) the shards in its shard
    directory: its default RUN/shards always; an explicit shard.dir when there is no manifest yet
    (this run makes them) or the manifest's owner (see ShardSet.owner_run) is this run."""
    if shards is None or not job.shard.dir:
        return True
    return _same_path(shards.owner_run(), job.paths.run_dir)


def _same_path(a: str, b: str) -> bool:
    if storage.is_remote(a) or storage.is_remote(b):
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)


def _actor_cpus(cluster_cpus: float, n_actors: int) -> float:
    """One CPU per actor, or a fair share when more actors than CPUs are asked for (so all start).

    On an autoscaling cluster (or one whose head offers no CPUs) always one CPU: the autoscaler
    launches CPU workers for what is asked, and fractional asks would all fit on the first worker.
    """
    import ray

    if not ray.cluster_resources().get("CPU") or cluster_autoscales():
        return 1.0
    return min(1.0, cluster_cpus / max(n_actors, 1))


def _shard_on_pool(job: ShardJob, info: TokenizerInfo, planned: list[PlannedSource], todo: list[WorkUnit],
                   results: dict[int, dict], pool: list, new_actor, on_unit_done, t0: float,
                   calls_before: int, owned: bool = True) -> ShardSummary:
    out_dir = job.paths.shards_dir
    units = all_units(planned)
    skipped = len(results)
    n_actors = len(pool)
    # One read per unit (bytes read stay within 1.1x the corpus): bad input fails the shard pass
    # itself. Units committed before it stay out of any complete manifest (training refuses an
    # incomplete one) and are kept for the fixed rerun; see _resume_state.
    retries = job.shard.max_unit_retries
    stats = {"samples": sum(s["samples"] for r in results.values() for s in r["shards"]),
             "tokens": sum(r["tokens"] for r in results.values())}
    progress = Progress("shard", total=len(units), done=skipped, unit="units", live=lambda: _live(pool), **stats)
    resumed_tokens = stats["tokens"]

    # The manifest is rewritten whole, so writing it after every unit would cost O(units^2) bytes;
    # every `every`-th unit keeps ~MANIFEST_WRITES writes per run (a crash redoes at most that many).
    every = max(1, len(units) // MANIFEST_WRITES)

    def on_done(unit: WorkUnit, res: dict) -> None:
        results[unit.index] = res
        stats["samples"] += sum(s["samples"] for s in res["shards"])
        stats["tokens"] += res["tokens"]
        if (len(results) - skipped) % every == 0:
            write_sets(job, info, planned, results, complete=False)
        progress.advance(1, samples=stats["samples"], tokens=stats["tokens"])
        if on_unit_done:
            on_unit_done(len(results), pool)

    try:
        run_on_pool(pool, todo, "process", new_actor, on_done, progress, retries)
    except KeyboardInterrupt:
        # Ctrl-C: record every committed unit (the next run skips them) and say how to continue.
        write_sets(job, info, planned, results, complete=False)
        progress.close()
        log.warning("shard: interrupted; %d of %d units are committed and kept in %s; run the same command "
                    "to continue from them", len(results), len(units), manifest_path(out_dir))
        raise
    except UserError:
        # Bad input in a unit: keep what is committed (incomplete: nothing trains on it) for the rerun.
        if len(results) > skipped:
            write_sets(job, info, planned, results, complete=False)
        progress.close()
        raise
    warn_split_lines(sum(results[u.index].get("split_lines", 0) for u in todo), job.corpus.max_line_bytes, "shard")
    if owned:
        _cleanup_temp(out_dir, job.lengths)
        try:  # the corpus-wide record rules, per source: a text field no record has; too many bad records
            bad = check_sources(results, record_groups(job, planned), out_dir)
        except UserError:
            write_sets(job, info, planned, results, complete=False)  # every unit kept for the rerun
            progress.close()
            raise
        shards = write_sets(job, info, planned, results, complete=True)
    else:  # another run's finished shards, read as they are: nothing here is ours to clean or rewrite
        shards = ShardSet.load(out_dir) or shard_set(job, info, planned, results, complete=True)
        bad = getattr(shards, "bad_records", None) or 0
    progress.close()
    _require_a_sample(job, shards, len(units))
    _require_validation_of_evaluation_sources(shards)
    summary = ShardSummary(
        shards=len(shards.entries), samples=sum(shards.samples(s) for s in SPLITS),
        tokens=shards.corpus_tokens, dropped_tokens=shards.dropped_tokens,
        seconds=time.monotonic() - t0, units=len(units), skipped_units=skipped, actors=n_actors,
        resumed_tokens=resumed_tokens,
        peak_actor_rss_bytes=max((r.get("peak_rss_bytes", 0) for r in results.values()), default=0),
        skipped_records=shards.skipped_records, skipped_by_kind=skipped_by_kind(results), bad_records=bad,
        skipped_by_source=({p.name: sum(results[u.index].get("skipped_records", 0) for u in p.units) for p in planned}
                           if job.corpus.sources is not None else {}),
        read_bytes=_actors_total(results, "read_bytes"),
        requests=_actors_total(results, "requests") + storage.requests_made() - calls_before)
    log.info("shard summary: %s", summary.line())
    return summary


def _actors_total(results: dict[int, dict], key: str) -> int:
    """A cumulative per-actor figure of this run's actors (read_bytes, requests): each actor's last, summed."""
    per_actor: dict[int, int] = {}
    for r in results.values():
        if "actor" in r:
            per_actor[r["actor"]] = max(per_actor.get(r["actor"], 0), r.get(key, 0))
    return sum(per_actor.values())


def _live(pool: list) -> list[dict]:
    """What each busy actor has done of its current unit so far (a quick ask; a slow one is left out)."""
    import ray

    refs = [actor.live_progress.remote() for actor in pool]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=2.0)
    out = []
    for ref in ready:
        try:
            value = ray.get(ref)
        except Exception:  # a dying actor: its unit is retried, its progress is not shown
            continue
        if value:
            out.append(value)
    return out


def _require_a_sample(job: ShardJob, shards: ShardSet, units: int) -> None:
    """Nothing to train on is a failure of this stage, not a success that the next stage refuses."""
    if shards.samples("train"):
        return
    body = job.shard.seq_len - 2
    raise UserError(f"corpus.source={job.corpus.source!r}: {shards.corpus_tokens} tokens in {units} unit(s), "
                    f"fewer than one training sample of shard.seq_len-2={body} tokens per unit; give more "
                    f"text or lower shard.seq_len")


def _require_validation_of_evaluation_sources(shards: ShardSet) -> None:
    """An evaluation-only source exists to be scored: one without a validation sample is an error."""
    for name, meta in (shards.sources or {}).items():
        if meta.get("evaluation_only") and not shards.samples("validation", source=name):
            raise UserError(f"corpus.sources.{name}: evaluation only (weight 0), but its text makes no validation "
                            f"sample of shard.seq_len-2 tokens; give it more text or a weight")


def _cleanup_temp(out_dir: str, lengths: tuple[int, ...] = ()) -> None:
    """Remove temp files of actors that died mid-write (never read: they are not in the manifest).

    Safe because the stage holds the shard directory's own lock (see pipeline.py) and only runs
    for shards this run owns: every temp file here is this run's or a dead writer's, never
    another live run's in-flight file."""
    subs = [storage.join(out_dir, f"seq-{n}", "train") for n in lengths]  # train.phases' shorter cuts
    for folder in (out_dir, *(storage.join(out_dir, split) for split in SPLITS), *subs):
        for path in storage.glob(storage.join(folder, ".tmp-*")):
            storage.remove(path)


if __name__ == "__main__":  # pragma: no cover - convenience for quick manual runs
    sys.exit("use `tpu-ray shard`")
