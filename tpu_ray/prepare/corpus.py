"""Corpus sources and their deterministic work units.

A work unit is a slice of the corpus (a byte range of a file aligned to line boundaries, or a row
range of a table/dataset). Units depend only on the corpus and the config, never on how many
actors run, which is what makes the shards byte-identical with 1 actor or 8. Each unit carries its
own train/validation split point, so the validation text is the tail of every unit.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Literal

from tpu_ray import storage
from tpu_ray.config import BUILTIN_CORPUS, CorpusConfig, ShardConfig
from tpu_ray.errors import UserError, first_line
from tpu_ray.prepare.lines import split_long_lines, warn_split_lines

Format = Literal["txt", "jsonl", "parquet", "hf"]
TEXT_SUFFIXES = {".txt": "txt", ".text": "txt", ".md": "txt", ".jsonl": "jsonl", ".json": "jsonl",
                 ".parquet": "parquet"}
_ALIGN_WINDOW = 64 * 1024


@dataclass(frozen=True)
class WorkUnit:
    """A deterministic slice of the corpus: [start, split_at) is train, [split_at, end) validation."""

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

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> WorkUnit:
        return cls(**d)


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
def resolve_files(source: str, field: str = "corpus.source") -> list[tuple[str, Format]]:
    """Expand a path, glob or gs:// URI into (file, format) pairs; one-line errors otherwise."""
    if any(ch in source for ch in "*?["):
        files = storage.glob(source, files_only=True)  # a directory the pattern matches is not text
        if not files:
            what = "only directories match" if storage.glob(source) else "no files match"
            raise UserError(f"{field}={source!r}: {what} this pattern; check the path")
    elif storage.exists(source):
        if storage.isdir(source):
            files = [f for f in storage.glob(storage.join(source, "**"), files_only=True) if _fmt_of(f, strict=False)]
            if not files:
                raise UserError(f"{field}={source!r}: directory holds no .txt/.jsonl/.parquet files")
        else:
            files = [source]
    else:
        raise UserError(f"{field}={source!r}: no such file or directory; pass an existing path, a glob, "
                        f"a gs:// URI, 'hf:NAME' or '{BUILTIN_CORPUS}'")
    return [(f, _fmt_of(f)) for f in sorted(files)]


def _fmt_of(path: str, strict: bool = True) -> Format | None:
    for suffix, fmt in TEXT_SUFFIXES.items():
        if path.lower().endswith(suffix):
            return fmt  # type: ignore[return-value]
    if strict:
        return "txt"  # unknown suffix: treat as plain text (binary content is caught when read)
    return None


def plan_units(corpus: CorpusConfig, shard: ShardConfig, run_dir: str) -> list[WorkUnit]:
    """All work units for a corpus config, numbered 0..n-1 in a fixed order."""
    frac = 0.0 if corpus.validation_source else corpus.validation_fraction
    units = _plan_source(corpus.source, corpus, shard, run_dir, frac, "corpus.source")
    if corpus.validation_source:
        val = _plan_source(corpus.validation_source, corpus, shard, run_dir, 1.0, "corpus.validation_source")
        units += val
    units = [WorkUnit(**{**u.to_dict(), "index": i}) for i, u in enumerate(units)]
    if not any(u.end > u.start for u in units):
        raise UserError(f"corpus.source={corpus.source!r}: the corpus is empty; point it at text")
    return units


def _plan_source(source: str, corpus: CorpusConfig, shard: ShardConfig, run_dir: str, frac: float,
                 field: str) -> list[WorkUnit]:
    common = dict(hf_config=corpus.hf_config, hf_split=corpus.hf_split, text_field=corpus.text_field,
                  encoding_errors=corpus.encoding_errors)
    if source == BUILTIN_CORPUS:
        source = materialize_builtin(run_dir)
    elif source.startswith("builtin:"):
        raise UserError(f"{field}={source!r}: unknown built-in corpus; the built-in one is '{BUILTIN_CORPUS}'")
    if source.startswith("hf:"):
        n = len(_load_hf(source, corpus.hf_config, corpus.hf_split, field))
        return [WorkUnit(0, source, "hf", s, _row_split(s, e, frac), e, **common)
                for s, e in _ranges(n, shard.unit_rows)]
    units: list[WorkUnit] = []
    for path, fmt in resolve_files(source, field):
        if fmt == "parquet":
            n = parquet_rows(path, corpus.text_field)
            units += [WorkUnit(0, path, fmt, s, _row_split(s, e, frac), e, **common)
                      for s, e in _ranges(n, shard.unit_rows)]
            continue
        size = storage.size(path)
        limit = corpus.max_line_bytes
        if corpus.max_bytes is not None and corpus.max_bytes < size:
            size = _align(path, corpus.max_bytes, size, limit)
        bounds = sorted({0, size, *(_align(path, b, size, limit)
                                    for b in range(shard.unit_bytes, size, shard.unit_bytes))})
        for s, e in zip(bounds, bounds[1:]):
            split_at = e if frac == 0 else _align(path, s + int((e - s) * (1 - frac)), e, limit)
            if frac >= 1.0:
                split_at = s
            units.append(WorkUnit(0, path, fmt, s, split_at, e, **common))
    return units


def _ranges(n: int, step: int) -> list[tuple[int, int]]:
    return [(s, min(s + step, n)) for s in range(0, n, step)]


def _row_split(start: int, end: int, frac: float) -> int:
    return start + round((end - start) * (1 - frac))


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


def parquet_rows(path: str, text_field: str = "text") -> int:
    """Rows of a parquet file; one-line errors for a file that is not parquet or lacks the column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with storage.open(path, "rb") as f:
        try:
            pf = pq.ParquetFile(f)
        except (pa.ArrowException, OSError) as exc:
            raise UserError(f"{path}: not a readable parquet file ({first_line(exc)}); fix or remove it") from None
        names = pf.schema_arrow.names
        if text_field not in names:
            raise UserError(f"{path}: no column {text_field!r} (columns: {', '.join(names[:8])}); "
                            f"set corpus.text_field to the column that holds the text")
        return pf.metadata.num_rows


_HF_CACHE: dict[tuple, object] = {}


def _load_hf(source: str, config: str | None, split: str, field: str = "corpus.source"):
    """Load a Hugging Face dataset split once per process (from the datasets cache after the first)."""
    key = (source, config, split)
    if key not in _HF_CACHE:
        import datasets

        name = source[3:]
        kwargs = {}
        if name in {"text", "json", "parquet", "csv"} and config:
            kwargs["data_files"] = config  # packaged builders read local/gs files: hf_config is the files
            config = None
        try:
            _HF_CACHE[key] = datasets.load_dataset(name, config, split=split, **kwargs)
        except Exception as exc:  # datasets raises many types; the user needs one line
            first = first_line(exc)
            raise UserError(f"{field}={source!r} (hf_config={config!r}, split={split!r}): "
                            f"cannot load dataset: {first}") from None
    return _HF_CACHE[key]


# --------------------------------------------------------------------------------------------
# Reading a unit
# --------------------------------------------------------------------------------------------
def read_unit_text(unit: WorkUnit, part: Literal["train", "validation", "all"]) -> list[str]:
    """The lines of one part of a unit (empty lines kept out)."""
    lo, hi = {"train": (unit.start, unit.split_at), "validation": (unit.split_at, unit.end),
              "all": (unit.start, unit.end)}[part]
    if hi <= lo:
        return []
    if unit.fmt == "hf":
        ds = _load_hf(unit.source, unit.hf_config, unit.hf_split)
        return _nonempty(_field(row, unit, i) for i, row in enumerate(ds.select(range(lo, hi)), lo))
    if unit.fmt == "parquet":
        import pyarrow.parquet as pq

        with storage.open(unit.source, "rb") as f:
            table = pq.read_table(f, columns=[unit.text_field]).slice(lo, hi - lo)
        return _nonempty(str(v) for v in table.column(unit.text_field).to_pylist() if v is not None)
    with storage.open(unit.source, "rb") as f:
        f.seek(lo)
        raw = f.read(hi - lo)
    text = decode_text(raw, unit, lo)
    del raw  # one copy of a unit's text at a time (a unit may be one huge line)
    if unit.fmt == "jsonl":
        out = []
        offset = lo
        for line in text.split("\n"):
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise UserError(f"{unit.source}: byte {offset}: not a JSON line ({exc.msg}); "
                                    f"fix the record or use a .txt file") from None
                out.append(_field(record, unit, offset))
            offset += len(line.encode("utf-8")) + 1
        return _nonempty(out)
    return _nonempty(text.split("\n"))


def check_unit_bytes(unit: WorkUnit) -> None:
    """Fail on a unit's bad input (binary, non-UTF-8 under `fail`, bad JSON) without keeping its text.

    Plain text needs only the decode; other formats are parsed as for real.
    """
    if unit.fmt != "txt":
        read_unit_text(unit, "all")
        return
    with storage.open(unit.source, "rb") as f:
        f.seek(unit.start)
        raw = f.read(unit.end - unit.start)
    decode_text(raw, unit, unit.start)


def decode_text(raw: bytes, unit: WorkUnit, offset: int) -> str:
    if b"\x00" in raw:
        at = offset + raw.index(b"\x00")
        raise UserError(f"{unit.source}: byte {at}: NUL byte, this looks like a binary file, not text; "
                        f"point corpus.source at text files")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if unit.encoding_errors == "replace":
            return raw.decode("utf-8", errors="replace")
        raise UserError(f"{unit.source}: byte {offset + exc.start}: not UTF-8 ({exc.reason}); fix the file "
                        f"or set corpus.encoding_errors=replace") from None


def _field(record: object, unit: WorkUnit, where: int) -> str:
    if not isinstance(record, dict) or unit.text_field not in record:
        raise UserError(f"{unit.source}: record at {where} has no field {unit.text_field!r}; "
                        f"set corpus.text_field to the field that holds the text")
    value = record[unit.text_field]
    return "" if value is None else str(value)


def _nonempty(lines) -> list[str]:
    return [s for s in (line.strip() for line in lines) if s]


def iter_train_text(units: list[WorkUnit], max_bytes: int, max_line_bytes: int | None = None) -> Iterator[list[str]]:
    """Batches of training lines in unit order, up to about max_bytes: the tokenizer's sample.

    The first batch is read now, not when the tokenizer asks for it: a corpus with no text at all
    (only whitespace) is a one-line error here rather than a 5-token tokenizer.
    """
    batches = _train_batches(units, max_bytes, max_line_bytes)
    first = next(batches, None)
    if first is None:
        sources = sorted({u.source for u in units})
        shown = ", ".join(sources[:3]) + (f" (+{len(sources) - 3} more)" if len(sources) > 3 else "")
        raise UserError(f"{shown}: no text to train the tokenizer on (empty or only whitespace); "
                        f"point corpus.source at text")
    return itertools.chain([first], batches)


def _train_batches(units: list[WorkUnit], max_bytes: int, max_line_bytes: int | None) -> Iterator[list[str]]:
    seen = 0
    split = 0
    try:
        for unit in units:
            lines = read_unit_text(unit, "train")
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


