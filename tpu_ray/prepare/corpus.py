"""Corpus sources and their deterministic work units.

A work unit is a slice of the corpus: a byte range of a plain .txt/.jsonl file aligned to line
boundaries, a whole streamed file (compressed text or JSON lines, CSV/TSV), a pack of small
.txt/.jsonl files (compressed ones streamed), a range of parquet row groups, or a row range of a
Hugging Face dataset. Units depend only on the corpus and the config, never on how many actors
run, which is what makes the shards byte-identical with 1 actor or 8.
A unit is read as chunks (one for a byte range; one per ~shard.unit_bytes of text for the others,
streams.py), and each chunk has its own train/validation split point: the validation text is the
tail of every chunk. Every record's text is split into lines like a .txt file's, so the same text
gives the same tokens in every format. What a text field may hold is records.py's rule.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields, replace
from typing import Literal

from tpu_ray import storage
from tpu_ray.config import BUILTIN_CORPUS, CorpusConfig, ShardConfig
from tpu_ray.errors import UserError
from tpu_ray.prepare.formats import Format, detect, is_saved_dataset
from tpu_ray.prepare.lines import split_long_lines, warn_split_lines
from tpu_ray.prepare.streams import (Chunk, Counts, chunked, csv_records, json_texts, lines_of, packed_text_chunks,
                                     split_items, stream_text_chunks)
from tpu_ray.prepare import tabular

log = logging.getLogger(__name__)
_ALIGN_WINDOW = 64 * 1024
_MIN_WINDOW = 4096
PACKAGED_BUILDERS = {"text", "json", "parquet", "csv"}  # hf:NAME read with load_dataset on hf_config's files

# Every reader, by format: what a unit of it is. tests/test_corpus.py's catalogue has a row per
# entry (the text-field rule of issue 25), so a new format without a row fails there.
READERS: dict[str, str] = {
    "txt": "byte range of a plain text file aligned to lines (compressed: the whole file, streamed); small "
           "files packed",
    "jsonl": "byte range of a JSON-lines file aligned to lines (compressed: the whole file, streamed); small "
             "files packed",
    "csv": "a whole CSV file with a header row, streamed (compressed or not)",
    "tsv": "a whole TSV file with a header row, streamed (compressed or not)",
    "parquet": "a range of whole row groups, the text column only",
    "hf_disk": "a row range of a datasets save_to_disk directory (Dataset or a DatasetDict split), memory-mapped",
    "hf": "a row range of a packaged datasets builder (hf:text|json|csv|parquet with hf_config as the files)",
}


@dataclass(frozen=True)
class WorkUnit:
    """A deterministic slice of the corpus.

    Byte-range units (chunk_bytes == 0): [start, split_at) is train, [split_at, end) validation.
    Streamed units (chunk_bytes > 0): start/end are bytes of the file (streams), row groups
    (parquet) or rows (datasets), read as chunks of about chunk_bytes of text, each split
    train/validation at (1 - val_fraction); each chunk is its own shard (`.<part>` in its name).
    """

    index: int
    source: str
    fmt: Format
    start: int
    split_at: int
    end: int
    hf_config: str | None = None
    hf_split: str = "train"
    text_field: str = "text"
    encoding_errors: str = "replace"
    # Added with the streamed formats; left out of the plan digest at their defaults (see key()).
    compression: str | None = None
    chunk_bytes: int = 0
    val_fraction: float = 0.0
    max_bytes: int | None = None
    text_lists: str = "error"
    # A packed unit: several small files of one format and compression, as (path, size) in listing
    # order; `source` is the first, `end` their total (stored) size. Plain ones are read whole as one
    # chunk split at (1 - val_fraction); compressed ones are streamed one after another (chunk_bytes > 0).
    members: tuple[tuple[str, int], ...] = ()
    max_rows: int | None = None  # streamed units: records (lines, rows) this unit may read at most

    @property
    def streamed(self) -> bool:
        return self.chunk_bytes > 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> WorkUnit:
        return cls(**{**d, "members": tuple(tuple(m) for m in d.get("members", ()))})

    def key(self) -> tuple:
        """What identifies the unit in the plan digest: the fields of a unit before streamed formats,
        plus any later field that is not at its default (so existing shard runs still resume)."""
        values = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _LATER_FIELDS and value == f.default:
                continue
            values.append([f.name, value] if f.name in _LATER_FIELDS else value)
        return tuple(values)


_LATER_FIELDS = {"compression", "chunk_bytes", "val_fraction", "max_bytes", "text_lists", "members", "max_rows"}


# --------------------------------------------------------------------------------------------
# The built-in corpus: CPython's own documentation, present wherever Python is.
# --------------------------------------------------------------------------------------------
# Modules whose import has side effects (opens a browser, prints, needs a display) or that are
# test suites; left out of the built-in corpus.
_SKIP_MODULES = {
    "antigravity", "this", "__hello__", "__phello__", "idlelib", "tkinter", "turtle", "turtledemo",
    "test", "lib2to3", "ensurepip", "venv", "pydoc_data", "xxsubtype", "xxlimited", "_testcapi",
}


def builtin_python_docs() -> str:
    """The CPython documentation as text: pydoc's topic pages plus stdlib module docstrings.

    Deterministic for a given Python build: topics sorted by name, modules sorted by name.
    """
    import importlib
    import inspect
    from pydoc_data.topics import topics

    parts = [topics[name].strip() for name in sorted(topics)]
    for name in sorted(getattr(sys, "stdlib_module_names", ())):
        if name.startswith("_") or name in _SKIP_MODULES:
            continue
        try:
            module = importlib.import_module(name)
        except Exception:  # not built on this platform (e.g. winreg): skip
            continue
        docs = [inspect.getdoc(module) or ""]
        for attr in sorted(getattr(module, "__all__", None) or dir(module)):
            if attr.startswith("_"):
                continue
            obj = getattr(module, attr, None)
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", "") == name:
                docs.append(inspect.getdoc(obj) or "")
        parts.extend(d.strip() for d in docs if d and d.strip())
    # One paragraph per line, like WikiText: blank lines inside docstrings become separators.
    lines: list[str] = []
    for part in parts:
        for para in part.split("\n\n"):
            para = " ".join(para.split())
            if para:
                lines.append(para)
    return "\n".join(lines) + "\n"


def materialize_builtin(run_dir: str) -> str:
    """Write the built-in corpus once into the run directory and return its path."""
    path = storage.join(run_dir, "corpus", "python-docs.txt")
    if not storage.exists(path):
        storage.makedirs(storage.join(run_dir, "corpus"))
        storage.atomic_write_text(path, builtin_python_docs())
    return path


# --------------------------------------------------------------------------------------------
# Planning: source -> files -> work units
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CorpusFile:
    """A corpus file as one listing saw it: its size and version feed the plan, no request per file."""

    path: str
    fmt: Format
    size: int
    version: str = ""


def _version(info: dict) -> str:
    """What changes when a file is rewritten: generation (GCS), mtime (local), etag/commit (Hub)."""
    for key in ("generation", "mtime", "updated", "ETag", "etag", "blob_id", "last_commit"):
        if info.get(key):
            return str(info[key])
    return ""


def list_files(source: str, field: str = "corpus.source") -> list[CorpusFile]:
    """Expand a path, glob, gs:// or hf:// URI into corpus files with sizes, from one listing;
    one-line errors otherwise. A `datasets` save_to_disk directory is one entry of format `hf_disk`
    (its .arrow and .json files are not corpus files)."""
    if any(ch in source for ch in "*?["):
        found = storage.glob_info(source)  # a directory the pattern matches is not text
        if not found:
            what = "only directories match" if storage.glob(source) else "no files match"
            raise UserError(f"{field}={source!r}: {what} this pattern; check the path")
    elif storage.exists(source):
        if storage.isdir(source):
            if is_saved_dataset(source):
                return [CorpusFile(source, "hf_disk", 0)]
            found, saved = _without_saved_datasets(storage.glob_info(storage.join(source, "**")))
            found = {f: i for f, i in found.items() if detect(f, strict=False)}
            if not found and not saved:
                raise UserError(f"{field}={source!r}: directory holds no .txt/.jsonl/.json/.csv/.tsv/.parquet files "
                                f"(compressed or not) and is not a datasets save_to_disk directory")
            if saved:
                return sorted([*(CorpusFile(d, "hf_disk", 0) for d in saved), *_files(found)], key=lambda f: f.path)
        else:
            found = {source: storage.info(source)}
    else:
        raise UserError(f"{field}={source!r}: no such file or directory; pass an existing path, a glob, "
                        f"a gs:// or hf:// URI, 'hf:NAME' or '{BUILTIN_CORPUS}'")
    return _files(found)


def _files(found: dict[str, dict]) -> list[CorpusFile]:
    return [CorpusFile(f, detect(f)[0], int(i.get("size") or 0), _version(i))  # type: ignore[index]
            for f, i in sorted(found.items())]


_SAVED_MARKERS = ("state.json", "dataset_dict.json")


def _without_saved_datasets(found: dict[str, dict]) -> tuple[dict[str, dict], list[str]]:
    """Files of a corpus directory apart from save_to_disk directories inside it, and those
    directories: their .json metadata and .arrow files are not corpus files, the datasets are."""
    roots = sorted({f.rsplit("/", 1)[0] for f in found if f.rsplit("/", 1)[-1] in _SAVED_MARKERS
                    and is_saved_dataset(f.rsplit("/", 1)[0])}, key=len)
    saved: list[str] = []
    for d in roots:
        if not any(d.startswith(r + "/") for r in saved):  # a DatasetDict's splits are inside it
            saved.append(d)
    rest = {f: i for f, i in found.items() if not any(f.startswith(d + "/") for d in saved)}
    return rest, saved


def resolve_files(source: str, field: str = "corpus.source") -> list[tuple[str, Format]]:
    """(file, format) pairs of a source (see list_files)."""
    return [(f.path, f.fmt) for f in list_files(source, field)]


PLAN_FILE = "plan.json"  # the plan of a run's corpus, reused by the tokenizer and shard stages


def plan_units(corpus: CorpusConfig, shard: ShardConfig, run_dir: str, field: str = "corpus",
               plan_file: str = PLAN_FILE) -> list[WorkUnit]:
    """All work units for a corpus config, numbered 0..n-1 in a fixed order.

    Planned once per run: the units are stored in RUN/<plan_file> under a key made of the corpus
    and unit settings and every file's size and version (one listing), and reused while that key
    holds (the tokenizer stage plans, the shard stage and resumes reuse it). `field` names the
    config section in errors (`corpus.sources.<name>` for a named source, which plans into its own file).
    """
    frac = 0.0 if corpus.validation_source else corpus.validation_fraction
    sources = [(corpus.source, frac, f"{field}.source")]
    if corpus.validation_source:
        sources.append((corpus.validation_source, 1.0, f"{field}.validation_source"))
    listed = [_listed(src, run_dir, fld) for src, _, fld in sources]
    key = _plan_key(corpus, shard, listed)
    cached = _cached_plan(run_dir, key, plan_file) if key else None
    if cached is not None:
        return cached
    units: list[WorkUnit] = []
    for (src, fr, fld), files in zip(sources, listed):
        units += _plan_source(src, corpus, shard, run_dir, fr, fld, files)
    units = [WorkUnit(**{**u.to_dict(), "index": i}) for i, u in enumerate(units)]
    if not any(u.end > u.start for u in units):
        raise UserError(f"{field}.source={corpus.source!r}: the corpus is empty; point it at text")
    if key:
        _store_plan(run_dir, key, units, plan_file)
    return units


def _listed(source: str, run_dir: str, field: str) -> list[CorpusFile] | None:
    """The files of a file-based source (None for hf: names, planned by datasets)."""
    if source == BUILTIN_CORPUS:
        source = materialize_builtin(run_dir)
    elif source.startswith("builtin:"):
        raise UserError(f"{field}={source!r}: unknown built-in corpus; the built-in one is '{BUILTIN_CORPUS}'")
    if source.startswith("hf:") and not source.startswith("hf://"):
        return None
    return list_files(source, field)


def _plan_key(corpus: CorpusConfig, shard: ShardConfig, listed: list[list[CorpusFile] | None]) -> str | None:
    if any(files is None or any(f.fmt == "hf_disk" for f in files) for files in listed):
        return None  # datasets are planned from their Arrow metadata, cheaply, every time
    payload = json.dumps([PLAN_VERSION, corpus.model_dump(mode="json"), shard.unit_bytes, shard.unit_rows,
                          [[asdict(f) for f in files] for files in listed]], sort_keys=True)  # type: ignore[union-attr]
    return hashlib.sha256(payload.encode()).hexdigest()


PLAN_VERSION = 1


def _cached_plan(run_dir: str, key: str, plan_file: str = PLAN_FILE) -> list[WorkUnit] | None:
    path = storage.join(run_dir, plan_file)
    try:
        data = json.loads(storage.read_text(path))
        if data.get("key") != key:
            return None
        return [WorkUnit.from_dict(u) for u in data["units"]]
    except (OSError, ValueError, KeyError, TypeError, UserError):
        return None  # absent, from another corpus, damaged or not a file: plan again (it is only a cache)


def _store_plan(run_dir: str, key: str, units: list[WorkUnit], plan_file: str = PLAN_FILE) -> None:
    try:
        storage.makedirs(run_dir)
        storage.atomic_write_text(storage.join(run_dir, plan_file),
                                  json.dumps({"key": key, "units": [u.to_dict() for u in units]}) + "\n")
    except (OSError, UserError) as exc:  # a read-only run dir only loses the cache
        log.warning("corpus plan not cached in %s (%s)", run_dir, exc)


def _plan_source(source: str, corpus: CorpusConfig, shard: ShardConfig, run_dir: str, frac: float,
                 field: str, files: list[CorpusFile] | None) -> list[WorkUnit]:
    common = dict(hf_config=corpus.hf_config, hf_split=corpus.hf_split, text_field=corpus.text_field,
                  encoding_errors=corpus.encoding_errors, text_lists=corpus.text_lists)
    stream = dict(chunk_bytes=shard.unit_bytes, val_fraction=frac)
    if files is None:  # an hf: name
        name = source[3:]
        if name in PACKAGED_BUILDERS:
            ds = tabular.load_builder(name, corpus.hf_config, corpus.hf_split, field)
            ranges = tabular.dataset_ranges(ds, _hf_where(source, corpus.hf_config), corpus.text_field,
                                            corpus.text_lists, shard.unit_bytes, shard.unit_rows, corpus.max_bytes)
            return [WorkUnit(0, source, "hf", s, s, e, **common, **stream) for s, e in _first_rows(ranges, corpus)]
        hub = [(f, detect(f, strict=False)) for f in tabular.hub_data_files(name, corpus.hf_config,
                                                                              corpus.hf_split, field)]
        if not hub or any(d is None for _, d in hub):  # e.g. .arrow files: only datasets reads them
            ds = tabular.load_builder(name, corpus.hf_config, corpus.hf_split, field)
            ranges = tabular.dataset_ranges(ds, _hf_where(source, corpus.hf_config), corpus.text_field,
                                            corpus.text_lists, shard.unit_bytes, shard.unit_rows, corpus.max_bytes)
            return [WorkUnit(0, source, "hf", s, s, e, **common, **stream) for s, e in _first_rows(ranges, corpus)]
        files = [CorpusFile(f, d[0], -1) for f, d in hub]  # type: ignore[index]
    units: list[WorkUnit] = []
    for group in _packs(files, corpus, shard, _text_size_hints(files, shard)):
        if len(group) == 1:
            units += _plan_file(group[0], corpus, shard, frac, common, stream)
        else:
            first = group[0]
            compression = detect(first.path)[1]  # type: ignore[index]
            streamed = dict(compression=compression, chunk_bytes=shard.unit_bytes, max_bytes=corpus.max_bytes,
                            max_rows=corpus.max_rows) if compression else {}
            units.append(WorkUnit(0, first.path, first.fmt, 0, 0, sum(f.size for f in group), **common,
                                  val_fraction=frac, members=tuple((f.path, f.size) for f in group), **streamed))
    return units


GZIP_TAIL, ZSTD_HEAD = 4, 18  # gzip's ISIZE (its last 4 bytes); a zstd frame header at most


def _text_size_hints(files: list[CorpusFile], shard: ShardConfig) -> dict[str, int]:
    """The text size each small gzip/zstd file says it holds (gzip's ISIZE trailer; zstd's
    Frame_Content_Size, when its writer recorded it), in one batch of tiny ranged reads.

    Why: a small compressed file may hold 1,000 times its size in text (repetitive text, or text
    inside zstd's window), and a pack of such files would be one unit that one actor streams while
    the others idle (measured: 8 zst files of 125 KB, 125 MB of text each, at 0.49x plain text). A
    file that gives no hint (bz2, xz, a streamed zstd frame) is judged by its stored size."""
    picks = [f for f in files if f.fmt in ("txt", "jsonl") and 0 < f.size < shard.unit_bytes // 2
             and detect(f.path)[1] in ("gzip", "zstd")]  # type: ignore[index]
    if not picks:
        return {}
    gz = [detect(f.path)[1] == "gzip" for f in picks]  # type: ignore[index]
    starts = [max(f.size - GZIP_TAIL, 0) if g else 0 for f, g in zip(picks, gz)]
    ends = [f.size if g else min(f.size, ZSTD_HEAD) for f, g in zip(picks, gz)]
    raw = storage.read_heads_and_tails([f.path for f in picks], starts, ends)
    hints = {}
    for f, g, data in zip(picks, gz, raw):
        size = _gzip_isize(data) if g else _zstd_content_size(data)
        if size is not None:
            hints[f.path] = size
    return hints


def _gzip_isize(tail: bytes) -> int | None:
    """ISIZE, a gzip member's text size mod 2**32, from a file's last 4 bytes (RFC 1952 2.3.1)."""
    return int.from_bytes(tail, "little") if len(tail) == GZIP_TAIL else None


def _zstd_content_size(head: bytes) -> int | None:
    """Frame_Content_Size of a zstd frame header (RFC 8878 3.1.1.1), or None when not recorded."""
    if len(head) < 6 or head[:4] != b"\x28\xb5\x2f\xfd":
        return None
    fhd = head[4]
    fcs_flag, single, dict_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
    width = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if width == 0 or len(head) < pos + width:
        return None
    value = int.from_bytes(head[pos:pos + width], "little")
    return value + 256 if width == 2 else value


def _packs(files: list[CorpusFile], corpus: CorpusConfig, shard: ShardConfig,
           text_sizes: dict[str, int] | None = None) -> Iterator[list[CorpusFile]]:
    """Files in listing order, consecutive small .txt/.jsonl files of one format and compression
    grouped up to shard.unit_bytes (of stored bytes, or of the text a compressed file records);
    anything else is its own group.

    Why: a corpus of a million 100 KB files (or C4's small .json.gz) would otherwise be a million
    units, shards and manifest entries. Small means under half a unit. A plain file is
    read whole (nothing aligned at planning) and must not be cut by corpus.max_bytes or max_rows.
    A compressed file is judged by the larger of its stored size and the text size it records
    (`text_sizes`: gzip's ISIZE, zstd's Frame_Content_Size; _text_size_hints), so a pack holds about
    a unit of text and the actors share the work; a file that records none (bz2, xz, a streamed
    zstd frame) counts its stored size. Memory is bounded either way: a pack of compressed files is
    streamed in chunks of ~unit_bytes of text (packed_text_chunks), one chunk alive however much
    they decompress to.
    Their caps (max_bytes, max_rows) apply per file while streaming, so they pack under caps too.
    """
    group: list[CorpusFile] = []
    total = 0
    kind: tuple = ()  # the group's (format, compression): one reader for all its files
    text_sizes = text_sizes or {}
    for f in files:
        compression = detect(f.path)[1]  # type: ignore[index]
        size = max(f.size, text_sizes.get(f.path, 0))  # a compressed file's text, where it says
        small = (f.fmt in ("txt", "jsonl") and 0 < size < shard.unit_bytes // 2
                 and (compression is not None
                      or (corpus.max_bytes is None or f.size <= corpus.max_bytes) and corpus.max_rows is None))
        if group and (not small or (f.fmt, compression) != kind or total + size > shard.unit_bytes):
            yield group
            group, total = [], 0
        if small:
            group.append(f)
            total += size
            kind = (f.fmt, compression)
        else:
            yield [f]
    if group:
        yield group


def _first_rows(ranges: list[tuple[int, int]], corpus: CorpusConfig) -> list[tuple[int, int]]:
    """Row ranges of a dataset cut to its first corpus.max_rows rows."""
    if corpus.max_rows is None:
        return ranges
    return [(s, min(e, corpus.max_rows)) for s, e in ranges if s < corpus.max_rows]


def _hf_where(source: str, config: str | None) -> str:
    """How errors name an hf: dataset: the name and its configuration (the files, for hf:json etc.)."""
    return f"{source} (hf_config={config})" if config else source


def _plan_file(file: CorpusFile, corpus: CorpusConfig, shard: ShardConfig, frac: float, common: dict,
               stream: dict) -> list[WorkUnit]:
    path, fmt = file.path, file.fmt
    if fmt == "hf_disk":
        ds = tabular.load_saved(path, corpus.hf_split)
        ranges = tabular.dataset_ranges(ds, path, corpus.text_field, corpus.text_lists, shard.unit_bytes,
                                        shard.unit_rows, corpus.max_bytes)
        return [WorkUnit(0, path, fmt, s, s, e, **common, **stream) for s, e in _first_rows(ranges, corpus)]
    if fmt == "parquet":
        groups = tabular.parquet_groups(path, corpus.text_field, corpus.text_lists)
        ranges = tabular.pack_groups(groups, shard.unit_bytes, shard.unit_rows, corpus.max_bytes)
        units, before = [], 0  # rows of the file before each unit: max_rows cuts inside a row group
        for s, e in ranges:
            if corpus.max_rows is not None and before >= corpus.max_rows:
                break
            rows = sum(r for r, _ in groups[s:e])
            cap = corpus.max_rows - before if corpus.max_rows is not None and before + rows > corpus.max_rows else None
            units.append(WorkUnit(0, path, fmt, s, s, e, **common, **stream, max_rows=cap))
            before += rows
        return units
    compression = detect(path)[1]  # type: ignore[index]
    size = file.size if file.size >= 0 else storage.size(path)
    if compression or fmt in ("csv", "tsv") or corpus.max_rows is not None:
        # Not splittable by byte range (compressed, records that may span lines, or the first
        # max_rows records wanted): one unit, streamed in chunks; max_bytes counts decompressed
        # bytes (CSV: text bytes).
        return [WorkUnit(0, path, fmt, 0, 0, size, compression=compression, max_bytes=corpus.max_bytes,
                         max_rows=corpus.max_rows, **common, **stream)] if size else []
    limit = corpus.max_line_bytes
    # Every boundary aligned in one batch of ranged reads (and the split points in a second).
    wanted = list(range(shard.unit_bytes, size, shard.unit_bytes))
    capped = corpus.max_bytes is not None and corpus.max_bytes < size
    aligned = _align_all(path, wanted + ([corpus.max_bytes] if capped else []), size, limit, shard.unit_bytes)
    if capped:
        size = aligned[corpus.max_bytes]  # type: ignore[index]
    bounds = sorted({0, size, *(min(aligned[b], size) for b in wanted if b < size)})
    pairs = list(zip(bounds, bounds[1:]))
    targets = [s + int((e - s) * (1 - frac)) for s, e in pairs]
    splits = _align_all(path, targets, size, limit, shard.unit_bytes) if 0 < frac < 1 else {}
    units = []
    for (s, e), t in zip(pairs, targets):
        if frac >= 1.0:  # validation text only (a validation source; an evaluation-only source)
            split_at = s
        else:
            split_at = e if frac == 0 else min(splits[t], e) if t < e else e
        units.append(WorkUnit(0, path, fmt, s, split_at, e, **common))
    return units


def _align_all(path: str, positions: list[int], size: int, max_line_bytes: int | None,
               unit_bytes: int) -> dict[int, int]:
    """`_align` of many positions of one file: one batch of small ranged reads (concurrent on
    object stores) instead of an open (an info request plus readahead) per boundary. A window
    without a usable newline falls back to `_align` (very long lines only)."""
    todo = sorted({p for p in positions if 0 < p < size})
    out = {p: (0 if p <= 0 else size) for p in positions if not 0 < p < size}
    if not todo:
        return out
    # Windows far smaller than a unit (lines are rarely longer; a longer one falls back below).
    span = max(_MIN_WINDOW, min(_ALIGN_WINDOW, unit_bytes // 16))
    windows = storage.read_ranges(path, [p - 1 for p in todo], [min(p - 1 + span, size) for p in todo])
    for p, window in zip(todo, windows):
        nl = window.find(b"\n")
        if nl >= 0 and (max_line_bytes is None or nl <= max_line_bytes):
            out[p] = min(p + nl, size)
        else:
            out[p] = _align(path, p, size, max_line_bytes)
    return out


def _align(path: str, pos: int, size: int, max_line_bytes: int | None = None) -> int:
    """The first line start at or after `pos` (or `size`): unit boundaries never cut a line, unless
    no line ends within `max_line_bytes` of `pos`: then right after the next whitespace (else at a
    character boundary), so that a unit stays about unit_bytes however long a line is."""
    if pos <= 0:
        return 0
    if pos >= size:
        return size
    with storage.open(path, "rb") as f:
        f.seek(pos - 1)
        offset = pos - 1
        while True:
            window = f.read(_ALIGN_WINDOW)
            if not window:
                return size
            nl = window.find(b"\n")
            if nl >= 0 and (max_line_bytes is None or offset + nl + 1 - pos <= max_line_bytes):
                return min(offset + nl + 1, size)
            offset += len(window)
            if max_line_bytes is not None and (nl >= 0 or offset - pos >= max_line_bytes):
                break
        f.seek(pos)
        window = f.read(_ALIGN_WINDOW)
    cuts = [i for i in (window.find(b" "), window.find(b"\t")) if i >= 0]
    if cuts:
        return min(pos + min(cuts) + 1, size)
    i = 0
    while i < len(window) and (window[i] & 0xC0) == 0x80:  # not inside a UTF-8 character
        i += 1
    return min(pos + i, size)


def parquet_rows(path: str, text_field: str = "text", text_lists: str = "error") -> int:
    """Rows of a parquet file from its footer; one-line errors for a file that is not parquet, lacks
    the column, or whose column is not text."""
    return sum(rows for rows, _ in tabular.parquet_groups(path, text_field, text_lists))


# --------------------------------------------------------------------------------------------
# Reading a unit
# --------------------------------------------------------------------------------------------
def iter_chunks(unit: WorkUnit, counts: Counts | None = None) -> Iterator[Chunk]:
    """The unit's chunks, front to back, one alive at a time; `counts` gathers skipped records."""
    counts = counts if counts is not None else Counts()
    yield from _chunks(unit, counts)
    counts.require_field(unit.source, unit.text_field)  # JSON lines: no record had the field at all


def _chunks(unit: WorkUnit, counts: Counts) -> Iterator[Chunk]:
    field, lists = unit.text_field, unit.text_lists
    if not unit.streamed:
        yield _packed_chunk(unit, counts) if unit.members else _byte_range_chunk(unit, counts)
        return

    def decode(raw: bytes, offset: int, source: str | None = None) -> str:
        return decode_text(raw, unit, offset, "decompressed byte" if unit.compression else "byte", source)

    if unit.members:  # small compressed files, streamed one after another (their caps apply per file)
        yield from packed_text_chunks([path for path, _ in unit.members], unit.compression, unit.fmt,
                                      unit.chunk_bytes, unit.val_fraction, unit.max_bytes, unit.max_rows, decode,
                                      field, lists, counts)
        return
    if unit.fmt in ("txt", "jsonl"):
        yield from stream_text_chunks(unit.source, unit.compression, unit.fmt, unit.chunk_bytes, unit.val_fraction,
                                      unit.max_bytes, decode, field, lists, counts, unit.max_rows)
        return
    if unit.fmt in ("csv", "tsv"):
        items = csv_records(unit.source, unit.compression, "," if unit.fmt == "csv" else "\t", field,
                            unit.encoding_errors, counts)
        limit = unit.max_bytes
    elif unit.fmt == "parquet":
        items = tabular.parquet_items(unit.source, unit.start, unit.end, field, lists, counts)
        limit = None  # applied at planning, by whole row groups
    elif unit.fmt in ("hf", "hf_disk"):
        if unit.fmt == "hf":
            ds = tabular.load_builder(unit.source[3:], unit.hf_config, unit.hf_split, "corpus.source")
        else:
            ds = tabular.load_saved(unit.source, unit.hf_split)
        where = _hf_where(unit.source, unit.hf_config) if unit.fmt == "hf" else unit.source
        joined = tabular.dataset_column(ds, where, field, lists)
        items = tabular.dataset_items(ds, unit.start, unit.end, field, joined, counts)
        limit = None  # applied at planning, by rows
    else:  # pragma: no cover - READERS and this dispatch change together
        raise AssertionError(f"no reader for {unit.fmt}")
    if unit.max_rows is not None:
        items = itertools.islice(items, unit.max_rows)
    for train, validation in chunked(items, unit.chunk_bytes, unit.val_fraction, limit):
        yield Chunk(lines_of(train), lines_of(validation))


def _byte_range_chunk(unit: WorkUnit, counts: Counts) -> Chunk:
    """A plain .txt/.jsonl byte range, read once: its train and validation parts.

    One ranged read of exactly the unit (on gs:// one GET: no info request, no readahead past
    the unit's end, which gcsfs's default file cache would add: up to 5 MiB per unit)."""
    raw = storage.read_ranges(unit.source, [unit.start], [unit.end])[0]
    cut = unit.split_at - unit.start
    parts = []
    for lo, data in ((unit.start, raw[:cut]), (unit.split_at, raw[cut:])):
        if not data:
            parts.append([])
            continue
        text = decode_text(data, unit, lo)
        if unit.fmt == "jsonl":
            parts.append(lines_of(json_texts(_json_lines(text, lo), unit.source, unit.text_field, unit.text_lists,
                                             counts)))
        else:
            parts.append(lines_of([text]))
        del text
    del raw  # one copy of a unit's text at a time (a unit may be one huge line)
    return Chunk(parts[0], parts[1])


def _packed_chunk(unit: WorkUnit, counts: Counts) -> Chunk:
    """A packed unit's files, each read whole once, as one chunk: their texts in order, the
    validation part from (1 - val_fraction) of their characters (at a line or record boundary)."""
    items: list[tuple[int, int, str]] = []
    pos = 0
    for path, _size in unit.members:
        member = replace(unit, source=path, members=())
        raw = storage.read_bytes(path)  # one GET on object stores
        text = decode_text(raw, member, 0)
        del raw
        if unit.fmt == "jsonl":
            texts = json_texts(_json_lines(text, 0), path, unit.text_field, unit.text_lists, counts)
            counts.require_field(path, unit.text_field)
        else:
            texts = text.split("\n")
        del text
        for t in texts:
            items.append((pos, len(t) + 1, t))
            pos += len(t) + 1
    train, validation = split_items(items, pos, unit.val_fraction) if items else ([], [])
    return Chunk(lines_of(train), lines_of(validation))


def _json_lines(text: str, offset: int) -> Iterator[tuple[str, str]]:
    """("byte N", line) for the lines of a JSON-lines byte range starting at byte `offset`."""
    for line in text.split("\n"):
        yield f"byte {offset}", line
        offset += len(line.encode("utf-8")) + 1


def read_unit_text(unit: WorkUnit, part: Literal["train", "validation", "all"]) -> list[str]:
    """The lines of one part of a unit (empty lines kept out), all chunks together."""
    out: list[str] = []
    for chunk in iter_chunks(unit):
        if part in ("train", "all"):
            out += chunk.train
        if part in ("validation", "all"):
            out += chunk.validation
    return out


def decode_text(raw: bytes, unit: WorkUnit, offset: int, what: str = "byte", source: str | None = None) -> str:
    """`raw` as text, or a one-line error naming `source` (default: the unit's file) and the byte."""
    source = source or unit.source
    if b"\x00" in raw:
        at = offset + raw.index(b"\x00")
        raise UserError(f"{source}: {what} {at}: NUL byte, this looks like a binary file, not text; "
                        f"point corpus.source at text files")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if unit.encoding_errors == "replace":
            return raw.decode("utf-8", errors="replace")
        raise UserError(f"{source}: {what} {offset + exc.start}: not UTF-8 ({exc.reason}); fix the file "
                        f"or set corpus.encoding_errors=replace") from None


def iter_train_text(units: list[WorkUnit], max_bytes: int, max_line_bytes: int | None = None,
                    seed: int = 0) -> Iterator[list[str]]:
    """Batches of training lines, up to about max_bytes: the tokenizer's sample (see sample_order).

    The first batch is read now, not when the tokenizer asks for it: a corpus with no text at all
    (only whitespace) is a one-line error here rather than a 5-token tokenizer.
    """
    batches = _train_batches(units, max_bytes, max_line_bytes, seed)
    first = next(batches, None)
    if first is None:
        sources = sorted({u.source for u in units})
        shown = ", ".join(sources[:3]) + (f" (+{len(sources) - 3} more)" if len(sources) > 3 else "")
        raise UserError(f"{shown}: no text to train the tokenizer on (empty or only whitespace); "
                        f"point corpus.source at text")
    return itertools.chain([first], batches)


def sample_order(units: list[WorkUnit], max_bytes: int, seed: int = 0) -> list[WorkUnit]:
    """The units in the order the tokenizer reads them.

    A corpus that fits in the sample (plain byte ranges totalling <= max_bytes) is read whole, in
    unit order. Otherwise units are drawn in an order fixed by `seed` (a hash of seed and unit
    index), so a sample of a multi-source corpus covers every file and source, not the first ones.
    """
    if all(not u.streamed for u in units) and sum(_train_bytes(u) for u in units) <= max_bytes:
        return list(units)
    return sorted(units, key=lambda u: hashlib.sha256(f"{seed}:{u.index}".encode()).digest())


def _train_bytes(unit: WorkUnit) -> int:
    """A byte-range or packed unit's train bytes (a packed unit splits when read: all of it, at most)."""
    return unit.end - unit.start if unit.members else unit.split_at - unit.start


def _train_batches(units: list[WorkUnit], max_bytes: int, max_line_bytes: int | None,
                   seed: int = 0) -> Iterator[list[str]]:
    """First pass: the first chunk of every unit in sample order (a streamed unit, a whole
    compressed file, gives one chunk rather than the whole file); then the rest of each unit."""
    seen = 0
    split = 0
    order = sample_order(units, max_bytes, seed)
    try:
        for first_pass in (True, False):
            for unit in order:
                if not first_pass and not unit.streamed:
                    continue  # read whole in the first pass
                for k, chunk in enumerate(iter_chunks(unit)):
                    if first_pass and k > 0:
                        break
                    if not first_pass and k == 0:
                        continue
                    lines = chunk.train
                    if max_line_bytes:
                        lines, n = split_long_lines(lines, max_line_bytes)
                        split += n
                    if not lines:
                        continue
                    yield lines
                    seen += sum(len(s) for s in lines)
                    if seen >= max_bytes:
                        return
    finally:
        warn_split_lines(split, max_line_bytes, "tokenizer")
