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

This module is the planner: it lists a source, packs small files, caches the plan, and hands each
file to its format's reader (tpu_ray/prepare/readers/, one class per format: plan a file's units,
read a unit's chunks, describe itself) without naming any format itself.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
from collections.abc import Iterator
from dataclasses import asdict
from typing import Literal

from tpu_ray import storage
from tpu_ray.config import BUILTIN_CORPUS, CorpusConfig, ShardConfig
from tpu_ray.errors import UserError
from tpu_ray.prepare.formats import is_saved_dataset
from tpu_ray.prepare.lines import split_long_lines, warn_split_lines
from tpu_ray.prepare.readers import detect, formats, reader, source_reader
from tpu_ray.prepare.readers.base import CorpusFile, PlanContext, WorkUnit, decode_text  # noqa: F401 (importers)
from tpu_ray.prepare.readers.hub import PACKAGED_BUILDERS  # noqa: F401 (importers)
from tpu_ray.prepare.streams import Chunk, Counts, require_field
from tpu_ray.prepare import tabular
from tpu_ray.redact import redact, unredact

log = logging.getLogger(__name__)

# Every reader, by format: what a unit of it is (each is a class of tpu_ray/prepare/readers/).
# tests/test_text_field_rule.py's catalogue has a row per entry (the text-field rule, records.py),
# so a new format without a row fails there.
READERS: dict[str, str] = {fmt: r.describe() for fmt, r in formats().items()}


# --------------------------------------------------------------------------------------------
# Planning: source -> files -> work units
# --------------------------------------------------------------------------------------------
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


def resolve_files(source: str, field: str = "corpus.source") -> list[tuple[str, str]]:
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
    cached = _cached_plan(run_dir, key, plan_file, [corpus.source, corpus.validation_source]) if key else None
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
    """The files of a source (None for a source its reader plans itself, e.g. hf: names)."""
    by_name = source_reader(source)
    if by_name is not None:
        return by_name.listing(source, run_dir, field)
    return list_files(source, field)


def _plan_key(corpus: CorpusConfig, shard: ShardConfig, listed: list[list[CorpusFile] | None]) -> str | None:
    if any(files is None or any(not reader(f.fmt).cacheable for f in files) for files in listed):
        return None  # datasets are planned from their Arrow metadata, cheaply, every time
    payload = json.dumps([PLAN_VERSION, corpus.model_dump(mode="json"), shard.unit_bytes, shard.unit_rows,
                          [[asdict(f) for f in files] for files in listed]], sort_keys=True)  # type: ignore[union-attr]
    return hashlib.sha256(payload.encode()).hexdigest()


PLAN_VERSION = 1


def _cached_plan(run_dir: str, key: str, plan_file: str = PLAN_FILE,
                 sources: list[str | None] = ()) -> list[WorkUnit] | None:
    path = storage.join(run_dir, plan_file)
    try:
        data = json.loads(unredact(storage.read_text(path), sources))  # stored as user:***
        if data.get("key") != key:
            return None
        return [WorkUnit.from_dict(u) for u in data["units"]]
    except (OSError, ValueError, KeyError, TypeError, UserError):
        return None  # absent, from another corpus, damaged or not a file: plan again (it is only a cache)


def _store_plan(run_dir: str, key: str, units: list[WorkUnit], plan_file: str = PLAN_FILE) -> None:
    try:
        storage.makedirs(run_dir)

        storage.atomic_write_text(storage.join(run_dir, plan_file),
                                  redact(json.dumps({"key": key, "units": [u.to_dict() for u in units]})) + "\n")
    except (OSError, UserError) as exc:  # a read-only run dir only loses the cache
        log.warning("corpus plan not cached in %s (%s)", run_dir, exc)


def _plan_source(source: str, corpus: CorpusConfig, shard: ShardConfig, run_dir: str, frac: float,
                 field: str, files: list[CorpusFile] | None) -> list[WorkUnit]:
    """A source's units: its files, packed where small, each planned by its format's reader."""
    ctx = PlanContext(corpus, shard, run_dir, frac, field)
    if files is None:  # a source its reader plans (an hf: name): units, or its files to plan here
        units, files = source_reader(source).plan(source, ctx)  # type: ignore[union-attr]
        if units:
            return units
    units = []
    for group in _packs(files, corpus, shard, _text_size_hints(files, shard)):
        if len(group) == 1:
            units += reader(group[0].fmt).plan(group[0], ctx)
        else:
            units.append(reader(group[0].fmt).plan_pack(group, ctx))
    return units


GZIP_TAIL, ZSTD_HEAD = 4, 18  # gzip's ISIZE (its last 4 bytes); a zstd frame header at most


def _text_size_hints(files: list[CorpusFile], shard: ShardConfig) -> dict[str, int]:
    """The text size each small gzip/zstd file says it holds (gzip's ISIZE trailer; zstd's
    Frame_Content_Size, when its writer recorded it), in one batch of tiny ranged reads.

    Why: a small compressed file may hold 1,000 times its size in text (repetitive text, or text
    inside zstd's window), and a pack of such files would be one unit that one actor streams while
    the others idle (measured: 8 zst files of 125 KB, 125 MB of text each, at 0.49x plain text). A
    file that gives no hint (bz2, xz, a streamed zstd frame) is judged by its stored size."""
    picks = [f for f in files if reader(f.fmt).packable and 0 < f.size < shard.unit_bytes // 2
             and detect(f.path)[1] in ("gzip", "zstd")]  # type: ignore[index]
    if not picks:
        return {}
    gz = [detect(f.path)[1] == "gzip" for f in picks]  # type: ignore[index]
    starts = [max(f.size - GZIP_TAIL, 0) if g else 0 for f, g in zip(picks, gz)]
    ends = [f.size if g else min(f.size, ZSTD_HEAD) for f, g in zip(picks, gz)]
    raw = storage.read_heads_and_tails([f.path for f in picks], starts, ends)
    hints = {}
    for f, g, data in zip(picks, gz, raw):
        size = _gzip_text_size(data, f.size) if g else _zstd_text_size(data, f.size)
        if size is not None:
            hints[f.path] = size
    return hints


def _gzip_isize(tail: bytes) -> int | None:
    """ISIZE, a gzip member's text size mod 2**32, from a file's last 4 bytes (RFC 1952 2.3.1)."""
    return int.from_bytes(tail, "little") if len(tail) == GZIP_TAIL else None


DEFLATE_MAX_RATIO = 1032  # deflate's largest expansion of stored bytes into text (258 bytes per 2 bits)
_GZIP_SLACK = 1024  # header (name, comment, extra fields) and trailer bytes a member may add


def _gzip_text_size(tail: bytes, stored: int) -> int | None:
    """The text size a gzip file's trailer gives, or UNTRUSTED where it cannot describe the file.

    ISIZE describes only the last member, modulo 2**32. A file's text is ISIZE only if it is one
    member: less text than its stored bytes (less the header and the stored blocks' 5 bytes per
    64 KiB) means several members (`cat a.gz b.gz`, the text of the others unknown); more than
    deflate can expand to means a cut or damaged file; and a file that could hold 4 GiB of text may
    have wrapped. Such a file stands alone (its own unit), never packed by a guess."""
    isize = _gzip_isize(tail)
    if isize is None:
        return None
    if (stored * DEFLATE_MAX_RATIO >= 1 << 32 or isize + _GZIP_SLACK + stored // 8192 < stored
            or isize > stored * DEFLATE_MAX_RATIO + _GZIP_SLACK):
        return UNTRUSTED
    return isize


UNTRUSTED = -1  # a text-size hint that cannot describe its file: the file stands alone


def _zstd_text_size(head: bytes, stored: int) -> int | None:
    """The first frame's Frame_Content_Size, or UNTRUSTED where it cannot be the file's text: less
    than the file's stored bytes (less headers and raw blocks' 3 bytes per 128 KiB) means several
    frames (`cat a.zst b.zst`), the others' text unknown; such a file stands alone."""
    size = _zstd_content_size(head)
    if size is not None and size + _GZIP_SLACK + stored // 8192 < stored:
        return UNTRUSTED
    return size


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
    (`text_sizes`: gzip's ISIZE, zstd's Frame_Content_Size; _text_size_hints; a gzip trailer that
    cannot describe its file, UNTRUSTED, makes it stand alone), so a pack holds about
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
        small = (reader(f.fmt).packable and 0 < size < shard.unit_bytes // 2 and text_sizes.get(f.path) != UNTRUSTED
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
    counts.skip_bad = unit.bad_records == "skip"
    before = counts.skipped
    try:
        yield from reader(unit.fmt).chunks(unit, counts)
    finally:  # records without text (null or missing field, short rows) by file kind, for the summary
        if counts.skipped > before:
            counts.by_kind[unit.fmt] = counts.by_kind.get(unit.fmt, 0) + counts.skipped - before


def read_unit_text(unit: WorkUnit, part: Literal["train", "validation", "all"]) -> list[str]:
    """The lines of one part of a unit (empty lines kept out), all chunks together."""
    out: list[str] = []
    for chunk in iter_chunks(unit):
        if part in ("train", "all"):
            out += chunk.train
        if part in ("validation", "all"):
            out += chunk.validation
    return out


def iter_train_text(units: list[WorkUnit], max_bytes: int, max_line_bytes: int | None = None,
                    seed: int = 0) -> Iterator[list[str]]:
    """Batches of training lines, up to about max_bytes: the tokenizer's sample (see sample_order).

    The first batch is read now, not when the tokenizer asks for it: a corpus with no text at all
    (only whitespace) is a one-line error here rather than a 5-token tokenizer.
    """
    counts = Counts()
    batches = _train_batches(units, max_bytes, max_line_bytes, seed, counts)
    first = next(batches, None)
    if first is None:
        require_field([counts], units[0].text_field if units else "text")  # a typo'd field, named once
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
                   seed: int = 0, counts: Counts | None = None) -> Iterator[list[str]]:
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
                for k, chunk in enumerate(iter_chunks(unit, counts)):
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
