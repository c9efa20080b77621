"""In-memory corpora: a DataFrame, an Arrow table, a `datasets` Dataset, a Ray Dataset or an iterable
of strings given to `Pipeline(cfg, corpus=...)`, written once into the run directory as parquet.

Why write them: the shard stage must read its text by work unit, deterministically and resumably
(same shards whatever the actor count, committed units skipped on resume). A parquet directory in
the run directory gives exactly that, and every later stage, `--resume` included, reads it like any
other corpus. Layout, per source (`corpus` for the one-source corpus):

    RUN/corpus/<source>/*.parquet      the text column only
    RUN/corpus/<source>.given.json     what was given (kind, rows, columns, content hash): the commit mark

Writes go to a temporary directory beside them and are moved in place before the mark is written,
so a write that fails leaves nothing a later stage would read. A Ray Dataset is written by Ray
Data's own execution on the cluster (`map_batches` + `write_parquet`, each block where it lies):
the driver never holds it. The other kinds are streamed by the driver in row groups of about
`ROW_GROUP_BYTES` of text, so an iterable larger than memory is written within that bound.

The content hash is over the multiset of texts (each row's digest summed), so the same text given
as a DataFrame or as a Ray Dataset (whose block order is Ray's) has one identity; a run given other
data on a later call (a resume) is refused in one line instead of training on something else.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpu_ray import rundir, storage
from tpu_ray.config import CorpusConfig
from tpu_ray.errors import UserError, first_line
from tpu_ray.prepare.records import arrow_texts, check_arrow_type

log = logging.getLogger("tpu_ray")

GIVEN_DIR = "corpus"
ROW_GROUP_BYTES = 8 << 20  # text bytes per row group written by the driver: its memory bound
ROW_GROUP_ROWS = 1 << 16
_MOD = 1 << 128


@dataclass(frozen=True)
class Given:
    """One in-memory source: its name in the mixture ("corpus" for the one source) and the data."""

    name: str
    data: Any
    kind: str

    @property
    def field(self) -> str:
        return "corpus" if self.name == "corpus" else f"corpus.sources.{self.name}"

    @property
    def label(self) -> str:
        return f"{self.field} ({self.kind})"


def kind_of(data: Any) -> str | None:
    """The kind of an in-memory corpus, None for a path; UserError for anything else."""
    if isinstance(data, (str, Path)):
        return None
    mod = type(data).__module__
    name = type(data).__name__
    if mod.startswith("ray.data") and name in ("Dataset", "MaterializedDataset"):
        return "ray.data.Dataset"
    if mod.startswith("pandas") and name == "DataFrame":
        return "pandas.DataFrame"
    if mod.startswith("pyarrow") and name == "Table":
        return "pyarrow.Table"
    if mod.startswith("datasets") and name in ("Dataset", "IterableDataset"):
        return f"datasets.{name}"
    if isinstance(data, (bytes, dict)) or not isinstance(data, Iterable):
        raise UserError(f"corpus={type(data).__name__}: not a corpus; pass a path, a pandas.DataFrame, a "
                        f"pyarrow.Table, a datasets.Dataset, a ray.data.Dataset or an iterable of strings")
    return "iterable"


def corpus_dir(run_dir: str, name: str) -> str:
    return rundir.path(run_dir, GIVEN_DIR, name)


def mark_path(run_dir: str, name: str) -> str:
    return rundir.path(run_dir, GIVEN_DIR, f"{name}.given.json")


def point(section: CorpusConfig, run_dir: str, corpus: Any) -> tuple[dict[str, Any], list[Given]]:
    """The corpus section (as data, for the run's assembler to validate with the rest of the config:
    pipeline.py's `given_corpus`) with each given source's `source` set: a path as given, in-memory
    data to its parquet files in `run_dir` (written later, under the run's lock, by `write_given`)."""
    entries = corpus if isinstance(corpus, dict) else {None: corpus}
    data = section.model_dump()
    sources = section.sources
    if None in entries and sources is not None:
        raise UserError(f"corpus=: the config names sources ({', '.join(sources)}); pass a dict "
                        f"{{source name: data or path}}")
    given: list[Given] = []
    new_sources: dict[str, Any] = {}
    for name, value in entries.items():
        if name is not None and (not isinstance(name, str) or (sources is not None and name not in sources)):
            known = ", ".join(sources) if sources else "none in the config: each key becomes a source"
            raise UserError(f"corpus={{{name!r}: ...}}: no such source in corpus.sources ({known}); use its name")
        kind = kind_of(value)
        source_name = name or "corpus"
        where = str(value) if kind is None else storage.join(corpus_dir(run_dir, source_name), "*.parquet")
        if kind is not None:
            given.append(Given(source_name, value, kind))
        if name is None:
            data["source"] = where
        elif sources is not None:
            data["sources"][name]["source"] = where
        else:
            new_sources[name] = {"source": where, "weight": 1.0}
    if new_sources:  # the dict is the corpus: its entries replace corpus.source
        from tpu_ray.config import BUILTIN_CORPUS

        data.update(sources=new_sources, source=BUILTIN_CORPUS, validation_source=None)
    return data, given


# ------------------------------------------------------------------------------------- writing
def write_given(corpus: CorpusConfig, run_dir: str, shared_filesystem: bool, given: list[Given]) -> list[dict]:
    """Write each given source once into `run_dir` (or check that the data written there earlier is
    the same); returns what was given, as recorded. `corpus`: the pointed section (`point`), whose
    sources name each text column; `shared_filesystem`: ray.shared_filesystem."""
    from tpu_ray.cluster.shared_dir import require_shared

    require_shared(run_dir, "output_dir", "an in-memory corpus written into the run directory", shared_filesystem)
    return [_write_one(corpus, run_dir, g) for g in given]


def _write_one(corpus: CorpusConfig, run_dir: str, g: Given) -> dict:
    src = corpus.named_sources()[g.name]
    final, mark = corpus_dir(run_dir, g.name), mark_path(run_dir, g.name)
    tmp = rundir.path(run_dir, GIVEN_DIR, f".tmp-{g.name}-{uuid.uuid4().hex[:8]}")
    try:
        if g.kind == "ray.data.Dataset":
            record = _write_ray(g, tmp, src.text_field, src.text_lists)
        else:
            record = _write_stream(_arrow_batches(g, src.text_field, src.text_lists), tmp, g, src.text_field,
                                   src.text_lists)
        if record["text_rows"] == 0:
            raise UserError(f"{g.label}: no text rows (columns: {', '.join(record['columns']) or 'none'}); "
                            f"give a corpus with text in column {src.text_field!r}")
        if storage.exists(mark):
            return _same_as_before(run_dir, g, record, json.loads(storage.read_text(mark)))
        if storage.exists(final):  # a write that never committed: replaced
            storage.remove(final, recursive=True)
        _move(tmp, final)
        storage.atomic_write_text(mark, json.dumps(record, indent=1) + "\n")
        log.info("corpus: %s written to %s (%d rows, sha256 %s)", g.label, final, record["rows"],
                 record["content_sha256"][:12])
        return record
    finally:
        if storage.exists(tmp):
            storage.remove(tmp, recursive=True)


def _same_as_before(run_dir: str, g: Given, now: dict, then: dict) -> dict:
    if now["content_sha256"] == then.get("content_sha256"):
        log.info("corpus: %s is the data this run was made with (sha256 %s)", g.label, now["content_sha256"][:12])
        return then
    raise UserError(f"{g.label}: not the data {run_dir} was made with (then {then.get('kind')}, "
                    f"{then.get('text_rows')} text rows, sha256 {str(then.get('content_sha256'))[:12]}; now "
                    f"{now['kind']}, {now['text_rows']} text rows, sha256 {now['content_sha256'][:12]}); pass "
                    f"the original data, or use a new output_dir")


def _move(tmp: str, final: str) -> None:
    if storage.is_remote(final):
        fs, src = storage.filesystem(tmp)
        fs.mv(src, storage.filesystem(final)[1], recursive=True)
    else:
        os.replace(tmp, final)


def _record(g: Given, columns: list[str], rows: int, text_rows: int, digest: int, nbytes: int,
            files: int) -> dict:
    content = hashlib.sha256(f"{text_rows}:{digest:032x}".encode()).hexdigest()
    return {"kind": g.kind, "rows": rows, "text_rows": text_rows, "columns": columns, "text_bytes": nbytes,
            "files": files, "content_sha256": content}


def text_digest(column: Any, joined: bool) -> tuple[int, int, int]:
    """(text rows, sum of the rows' 128-bit digests mod 2^128, text bytes) of an Arrow text column."""
    texts, _ = arrow_texts(column, joined)
    total, nbytes = 0, 0
    for text in texts:
        raw = text.encode("utf-8", errors="surrogatepass")
        total += int.from_bytes(hashlib.blake2b(raw, digest_size=16).digest(), "big")
        nbytes += len(raw)
    return len(texts), total % _MOD, nbytes


def _check_type(arrow_type: Any, g: Given, field: str, columns: list[str], lists: str) -> bool:
    """The text column's type, checked by the corpus reader's own rule; True: lists to join."""
    try:
        return check_arrow_type(arrow_type, g.label, field, lists)
    except UserError as exc:
        raise UserError(str(exc).replace("; ", f" (columns: {', '.join(columns)}); ", 1)) from None


def _missing(g: Given, field: str, columns: list[str]) -> UserError:
    return UserError(f"{g.label}: no column {field!r} (columns: {', '.join(map(str, columns)) or 'none'}); set "
                     f"corpus.text_field to the column that holds the text")


def _arrow_batches(g: Given, field: str, lists: str) -> Iterator[tuple[Any, list[str]]]:
    """(Arrow table of the text column only, the input's columns) per batch, in bounded memory."""
    import pyarrow as pa

    data = g.data
    if g.kind in ("pandas.DataFrame", "pyarrow.Table"):
        columns = [str(c) for c in data.columns] if g.kind == "pandas.DataFrame" else list(data.column_names)
        if field not in columns:
            raise _missing(g, field, columns)
        if g.kind == "pandas.DataFrame":
            try:
                data = pa.Table.from_pandas(data[[field]], preserve_index=False)
            except (pa.ArrowException, ValueError, TypeError) as exc:
                raise UserError(f"{g.label}: column {field!r} does not hold text only ({first_line(exc)}) "
                                f"(columns: {', '.join(columns)}); give a column of strings") from None
        table = data.select([field])
        _check_type(table.schema.field(field).type, g, field, columns, lists)
        if table.num_rows == 0:
            yield table, columns
        for batch in table.to_batches(max_chunksize=ROW_GROUP_ROWS):
            yield pa.Table.from_batches([batch]), columns
    elif g.kind == "datasets.Dataset":
        columns = list(data.column_names)
        if field not in columns:
            raise _missing(g, field, columns)
        _check_type(data.data.schema.field(field).type, g, field, columns, lists)
        if len(data) == 0:
            yield data.data.table.select([field]).slice(0, 0), columns
        for table in data.select_columns([field]).with_format("arrow").iter(batch_size=ROW_GROUP_ROWS // 16):
            yield table, columns
    elif g.kind == "datasets.IterableDataset":
        first = True
        for batch in data.iter(batch_size=1024):
            columns = list(batch)
            if field not in batch:
                raise _missing(g, field, columns)
            yield _strings_table(batch[field], g, field, columns, lists, first), columns
            first = False
    else:  # an iterable of strings
        chunk: list[Any] = []
        seen, size = 0, 0
        for item in data:
            if not isinstance(item, str):
                raise UserError(f"{g.label}: item {seen} is {type(item).__name__}, not a string; give an "
                                f"iterable of strings (columns: none, the items are the text)")
            chunk.append(item)
            seen += 1
            size += len(item)
            if size >= ROW_GROUP_BYTES // 4 or len(chunk) >= ROW_GROUP_ROWS:
                yield pa.table({field: pa.array(chunk, pa.string())}), []
                chunk, size = [], 0
        if chunk or seen == 0:
            yield pa.table({field: pa.array(chunk, pa.string())}), []


def _strings_table(values: list, g: Given, field: str, columns: list[str], lists: str, check: bool):
    import pyarrow as pa

    try:
        arr = pa.array(values)
        if pa.types.is_null(arr.type):  # a batch of null texts only: typed as text, so later batches fit
            arr = pa.array(values, pa.string())
    except (pa.ArrowException, TypeError) as exc:
        raise UserError(f"{g.label}: column {field!r} does not hold text only ({first_line(exc)}) "
                        f"(columns: {', '.join(columns)}); give a column of strings") from None
    _check_type(arr.type, g, field, columns, lists)
    return pa.table({field: arr})


def _write_stream(batches: Iterator[tuple[Any, list[str]]], tmp: str, g: Given, field: str, lists: str) -> dict:
    """The driver's writer: one parquet file, a row group per ~ROW_GROUP_BYTES of text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    storage.makedirs(tmp)
    path = storage.join(tmp, "part-00000.parquet")
    rows = text_rows = nbytes = digest = 0
    columns: list[str] = []
    pending: list[Any] = []
    pending_bytes = 0
    with storage.open(path, "wb") as f:
        writer = None

        def flush() -> None:
            nonlocal writer, pending, pending_bytes
            table = pa.concat_tables(pending)
            if writer is None:
                writer = pq.ParquetWriter(f, table.schema)
            writer.write_table(table.cast(writer.schema), row_group_size=max(1, table.num_rows))
            pending, pending_bytes = [], 0

        for table, found in batches:
            columns = found
            if pending and not table.schema.equals(pending[0].schema):
                table = table.cast(pending[0].schema)
            joined = not (pa.types.is_string(table.schema.field(field).type)
                          or pa.types.is_large_string(table.schema.field(field).type)
                          or pa.types.is_null(table.schema.field(field).type))
            n, d, b = text_digest(table.column(field).combine_chunks(), joined)
            rows += table.num_rows
            text_rows, digest, nbytes = text_rows + n, (digest + d) % _MOD, nbytes + b
            pending.append(table)
            pending_bytes += b
            if pending_bytes >= ROW_GROUP_BYTES:
                flush()
        if pending:
            flush()
        if writer is not None:
            writer.close()
    return _record(g, columns, rows, text_rows, digest, nbytes, 1)


# --------------------------------------------------------------------------------------- Ray Data
def _select_text(table: Any, field: str, lists: str, label: str) -> Any:
    """map_batches: the text column only, checked on the worker that holds the block."""
    columns = list(table.column_names)
    if field not in columns:
        raise UserError(f"{label}: no column {field!r} (columns: {', '.join(columns)}); set "
                        f"corpus.text_field to the column that holds the text")
    try:
        check_arrow_type(table.schema.field(field).type, label, field, lists)
    except UserError as exc:
        raise UserError(str(exc).replace("; ", f" (columns: {', '.join(columns)}); ", 1)) from None
    return table.select([field])


def _file_digest(path: str, field: str) -> tuple[int, int, int, int, list[str]]:
    """(rows, text rows, digest, text bytes, columns) of one written parquet file (a Ray task)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = text_rows = digest = nbytes = 0
    with storage.open_random_access(path) as f:
        pf = pq.ParquetFile(f)
        t = pf.schema_arrow.field(field).type
        joined = not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t))
        for batch in pf.iter_batches(batch_size=4096, columns=[field]):
            n, d, b = text_digest(batch.column(0), joined)
            rows += batch.num_rows
            text_rows, digest, nbytes = text_rows + n, (digest + d) % _MOD, nbytes + b
    return rows, text_rows, digest, nbytes, pf.schema_arrow.names


def _user_error_in(exc: BaseException) -> UserError | None:
    """The UserError a Ray worker raised, found in what Ray Data wraps it in (RayTaskError.cause,
    the exception chain, else the remote traceback's text)."""
    import re

    todo, seen = [exc], 0
    while todo and seen < 20:
        x = todo.pop()
        seen += 1
        if isinstance(x, UserError) and "ray::" not in str(x):
            return UserError(first_line(x))
        todo += [c for c in (getattr(x, "cause", None), x.__cause__, x.__context__) if isinstance(c, BaseException)]
    found = re.search(r"tpu_ray\.errors\.UserError: (.+)", str(exc))
    return UserError(found.group(1).strip()) if found else None


def _write_ray(g: Given, tmp: str, field: str, lists: str) -> dict:
    """Ray Data writes the blocks where they lie; Ray tasks read the written files back for the
    identity (only small numbers come to the driver)."""
    import ray

    fs, stripped = storage.filesystem(tmp)
    kwargs: dict[str, Any] = {}
    if storage.is_remote(tmp):
        from pyarrow.fs import FSSpecHandler, PyFileSystem

        kwargs["filesystem"] = PyFileSystem(FSSpecHandler(fs))
    target = stripped if storage.is_remote(tmp) else tmp
    try:
        # The driver's storage endpoint (an emulator) in the workers, which may predate it.
        remote = {"runtime_env": {"env_vars": env}} if (env := storage.forwarded_env()) else {}
        g.data.map_batches(_select_text, fn_kwargs={"field": field, "lists": lists, "label": g.label},
                           batch_format="pyarrow", zero_copy_batch=True, **remote) \
            .write_parquet(target, ray_remote_args=remote, **kwargs)
    except Exception as exc:  # noqa: BLE001 - Ray Data wraps the worker's error; ours is the one to show
        found = _user_error_in(exc)
        if found:
            raise found from None
        raise
    files = sorted(p for p in storage.glob(storage.join(tmp, "*.parquet")))
    digest_task = ray.remote(num_cpus=0.5, **remote)(_file_digest)
    parts = ray.get([digest_task.remote(storage.join(tmp, p.rsplit("/", 1)[-1]), field) for p in files])
    columns = _ray_columns(g.data) or (parts[0][4] if parts else [])
    rows = sum(p[0] for p in parts)
    text_rows = sum(p[1] for p in parts)
    digest = sum(p[2] for p in parts) % _MOD
    return _record(g, columns, rows, text_rows, digest, sum(p[3] for p in parts), len(files))


def _ray_columns(ds: Any) -> list[str]:
    """The Ray Dataset's columns where Ray knows them without executing it (else [])."""
    try:
        schema = ds.schema(fetch_if_missing=False)
        return list(schema.names) if schema is not None else []
    except Exception:  # noqa: BLE001 - only recorded, never needed
        return []
