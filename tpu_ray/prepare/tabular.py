"""Typed tables: parquet files by row groups, and Hugging Face datasets (save_to_disk, hf:) by rows.

Parquet: a work unit is a range of whole row groups, packed up to `shard.unit_bytes` of the text
column (its uncompressed size in the footer) and `shard.unit_rows` rows; a unit reads only the
text column of only its own row groups, once (pyarrow's `ParquetFile.iter_batches(row_groups=...,
columns=[...])`), streamed in batches and cut into chunks like a compressed file (streams.py).

Datasets: `datasets.load_from_disk` memory-maps the Arrow files, so a unit (a row range) reads
only its rows' text; `hf:` packaged builders give the same kind of Dataset.

Why not Ray Data's `read_parquet` / `from_huggingface`: their blocks follow the cluster's
parallelism, while a shard must depend only on its unit (byte-identical output whatever the actor
count, resume by committed unit). The column type is checked once per file by records.py's rule.
"""

from __future__ import annotations

import os

import logging
from collections.abc import Iterator
from typing import Any

from tpu_ray import storage
from tpu_ray.errors import UserError, first_line
from tpu_ray.prepare.records import arrow_texts, check_arrow_type
from tpu_ray.prepare.streams import Counts

log = logging.getLogger("tpu_ray.prepare.corpus")
BATCH_ROWS = 1024  # rows per Arrow batch turned into Python strings: bounds the lists alive at once


# --------------------------------------------------------------------------------------------
# Parquet
# --------------------------------------------------------------------------------------------
_FOOTERS: dict[str, Any] = {}  # path -> FileMetaData: an actor's later units of a file skip its footer read


def _parquet_file(f: Any, path: str):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(f, metadata=_FOOTERS.get(path))
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"{path}: not a readable parquet file ({first_line(exc)}); fix or remove it") from None
    if len(_FOOTERS) > 256:
        _FOOTERS.clear()
    _FOOTERS[path] = pf.metadata
    return pf


def _text_column(pf: Any, path: str, text_field: str, lists: str) -> bool:
    """Check the text column exists and holds text; True when it is a list column to join."""
    names = pf.schema_arrow.names
    if text_field not in names:
        raise UserError(f"{path}: no column {text_field!r} (columns: {', '.join(names[:8])}); "
                        f"set corpus.text_field to the column that holds the text")
    return check_arrow_type(pf.schema_arrow.field(text_field).type, path, text_field, lists)


def parquet_groups(path: str, text_field: str, lists: str = "error") -> list[tuple[int, int]]:
    """(rows, text-column bytes) of every row group, from the footer alone (one open per file)."""
    with storage.open_random_access(path) as f:
        pf = _parquet_file(f, path)
        _text_column(pf, path, text_field, lists)
        md = pf.metadata
        leaves = [j for j in range(md.num_columns)
                  if md.schema.column(j).path.split(".")[0] == text_field]
        return [(md.row_group(i).num_rows,
                 sum(md.row_group(i).column(j).total_uncompressed_size for j in leaves))
                for i in range(md.num_row_groups)]


def pack_groups(groups: list[tuple[int, int]], unit_bytes: int, unit_rows: int,
                max_bytes: int | None) -> list[tuple[int, int]]:
    """Consecutive row groups packed into [first, last) ranges of about unit_bytes / unit_rows.

    `max_bytes`: row groups are taken while fewer than that many text bytes came before them (so
    it is honoured to the next whole row group: the only unit a parquet file can be read in).
    """
    ranges: list[tuple[int, int]] = []
    start, rows, nbytes, total = 0, 0, 0, 0
    for i, (g_rows, g_bytes) in enumerate(groups):
        if max_bytes is not None and total >= max_bytes:
            groups = groups[:i]
            break
        if i > start and (nbytes + g_bytes > unit_bytes or rows + g_rows > unit_rows):
            ranges.append((start, i))
            start, rows, nbytes = i, 0, 0
        rows += g_rows
        nbytes += g_bytes
        total += g_bytes
    if len(groups) > start:
        ranges.append((start, len(groups)))
    return ranges


def parquet_items(path: str, first: int, last: int, text_field: str, lists: str,
                  counts: Counts) -> Iterator[tuple[int, int, str]]:
    """(text position, nbytes, text) of the rows of row groups [first, last): the text column only."""
    import pyarrow as pa

    pos = 0
    with storage.open_random_access(path) as f:
        pf = _parquet_file(f, path)
        joined = _text_column(pf, path, text_field, lists)
        try:
            batches = pf.iter_batches(batch_size=BATCH_ROWS, row_groups=list(range(first, last)),
                                      columns=[text_field], use_threads=False)
            for batch in batches:
                texts, nulls = arrow_texts(batch.column(0), joined)
                counts.skipped += nulls
                counts.records += len(batch)
                for text in texts:
                    n = len(text.encode("utf-8"))
                    yield pos, n, text
                    pos += n
        except (pa.ArrowException, OSError) as exc:
            raise UserError(f"{path}: row groups {first}-{last}: not readable ({first_line(exc)}); the file is "
                            f"damaged: fix or remove it") from None


# --------------------------------------------------------------------------------------------
# Hugging Face datasets (save_to_disk directories and hf: builders)
# --------------------------------------------------------------------------------------------
_DATASETS: dict[tuple, Any] = {}


def load_saved(path: str, split: str) -> Any:
    """A `save_to_disk` directory as a memory-mapped Dataset (a DatasetDict's `split`), once per process."""
    key = ("disk", path, split)
    if key not in _DATASETS:
        import datasets

        _quiet_datasets()
        try:
            ds = datasets.load_from_disk(path)
        except Exception as exc:  # datasets raises many types; the user needs one line
            raise UserError(f"{path}: not a readable save_to_disk dataset ({first_line(exc)}); fix or "
                            f"re-save it") from None
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise UserError(f"{path}: the saved DatasetDict has no split {split!r} (splits: "
                                f"{', '.join(ds)}); set corpus.hf_split")
            ds = ds[split]
        _DATASETS[key] = ds
    return _DATASETS[key]


def _quiet_datasets() -> None:
    """`datasets`' own progress bars would interleave with ours in the log."""
    import datasets

    datasets.disable_progress_bars()


def dataset_column(ds: Any, where: str, text_field: str, lists: str) -> bool:
    """Check a Dataset's text column (exists, holds text); True when a list column is to be joined."""
    names = ds.column_names
    if text_field not in names:
        raise UserError(f"{where}: no column {text_field!r} (columns: {', '.join(names[:8])}); "
                        f"set corpus.text_field to the column that holds the text")
    return check_arrow_type(ds.data.schema.field(text_field).type, where, text_field, lists)


def dataset_ranges(ds: Any, where: str, text_field: str, lists: str, unit_bytes: int, unit_rows: int,
                   max_bytes: int | None) -> list[tuple[int, int]]:
    """Row ranges of about unit_bytes of text (by the column's average row size) and <= unit_rows rows.

    `max_bytes` is honoured exactly: the rows before the first at or past that many text bytes
    (string lengths come from the Arrow offsets, no text is read).
    """
    import pyarrow.compute as pc

    import numpy as np

    joined = dataset_column(ds, where, text_field, lists)
    n = len(ds)
    column = ds.data.column(text_field) if getattr(ds, "_indices", None) is None else None
    if max_bytes is not None:
        if joined:
            raise UserError(f"{where}: corpus.max_bytes cannot be honoured on a list column ({text_field!r}); "
                            f"leave it unset or save a string column")
        table = ds.with_format("arrow")
        total, i = 0, 0
        while i < n:
            lengths = pc.binary_length(table[i: i + 65536][text_field]).fill_null(0).to_numpy(zero_copy_only=False)
            before = total + np.concatenate([[0], np.cumsum(lengths)[:-1]])  # text bytes before each row
            over = np.nonzero(before >= max_bytes)[0]
            if len(over):
                i += int(over[0])
                break
            total += int(lengths.sum())
            i += len(lengths)
        n = i
    per_row = (column.nbytes / max(len(ds), 1)) if column is not None else 0
    step = unit_rows if not per_row else max(1, min(unit_rows, int(unit_bytes // per_row)))
    return [(s, min(s + step, n)) for s in range(0, n, step)]


def dataset_items(ds: Any, lo: int, hi: int, text_field: str, joined: bool,
                  counts: Counts) -> Iterator[tuple[int, int, str]]:
    """(text position, nbytes, text) of rows [lo, hi) of a Dataset, a batch of rows at a time."""
    if getattr(ds, "_indices", None) is None:  # the memory-mapped Arrow column itself: no formatting layer
        column = ds.data.table.column(text_field)

        def rows(a: int, b: int) -> Any:
            return column.slice(a, b - a)
    else:  # a Dataset with an indices mapping (select/shuffle before saving): datasets resolves it
        table = ds.with_format("arrow")

        def rows(a: int, b: int) -> Any:
            return table[a:b][text_field]
    pos = 0
    for s in range(lo, hi, BATCH_ROWS):
        batch = rows(s, min(s + BATCH_ROWS, hi))
        texts, nulls = arrow_texts(batch, joined)
        counts.skipped += nulls
        counts.records += len(batch)
        for text in texts:
            n = len(text.encode("utf-8"))
            yield pos, n, text
            pos += n


def load_builder(name: str, config: str | None, split: str, field: str) -> Any:
    """`datasets.load_dataset` for the packaged builders given their files (`hf:json` with
    `corpus.hf_config` as the data files), once per process. Used only for `hf:text|json|csv|parquet`
    and where a Hub dataset has no data files we read (see hub_data_files)."""
    key = ("hf", name, config, split)
    if key not in _DATASETS:
        import datasets

        _quiet_datasets()
        kwargs: dict[str, Any] = {}
        builder_config = config
        if name in {"text", "json", "parquet", "csv"} and config:
            kwargs["data_files"] = config  # packaged builders read local/gs files: hf_config is the files
            builder_config = None
            if name == "csv" and config.lower().rstrip("*").endswith(".tsv"):
                kwargs["sep"] = "\t"
        log.info("corpus: hf:%s read with datasets.load_dataset (copies it into the datasets cache)", name)
        try:
            _DATASETS[key] = datasets.load_dataset(name, builder_config, split=split, **kwargs)
        except Exception as exc:  # datasets raises many types; the user needs one line
            raise UserError(f"{field}='hf:{name}' (hf_config={config!r}, split={split!r}): cannot load dataset: "
                            f"{_root_cause(exc)}") from None
    return _DATASETS[key]


def _root_cause(exc: BaseException) -> str:
    """The first line of the innermost cause: `datasets` wraps the real error in a generic one."""
    seen = {id(exc)}
    inner = exc
    while (nxt := inner.__cause__ or inner.__context__) is not None and id(nxt) not in seen:
        seen.add(id(nxt))
        inner = nxt
    outer = first_line(exc)
    return outer if inner is exc else f"{outer}: {first_line(inner)}"


HUB_PROBE_S = 5.0  # a TCP connection to the Hub's endpoint takes well under this wherever it is reachable


def _hub_unreachable() -> str | None:
    """Why the Hub's endpoint takes no TCP connection from here (None: it does, or a proxy is set,
    through which only the client itself can tell). Why by hand: `datasets` retries an unreachable
    Hub for ~25 s and then reports a cache miss ("not cached in None"), not the network."""
    import socket
    import urllib.request
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    url = urlsplit(constants.ENDPOINT)
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    proxies = urllib.request.getproxies()
    if proxies.get(url.scheme) or proxies.get("all"):
        return None
    try:
        socket.create_connection((host, port), timeout=HUB_PROBE_S).close()
    except OSError as exc:
        return f"{host}:{port}: {exc.strerror or exc}"
    return None


def hub_data_files(name: str, config: str | None, split: str, field: str) -> list[str]:
    """The data files `datasets` resolves for a Hub (or local) dataset's split: `hf://datasets/...`
    URLs, read like any other files, so each actor reads only its own files and nothing is copied
    into a cache. Needs the Hub (metadata requests only); without network it is a one-line error."""
    import datasets
    from huggingface_hub import constants

    def refused(why: str) -> UserError:
        return UserError(f"{field}='hf:{name}' (hf_config={config!r}): cannot resolve the dataset's files: {why}; "
                         f"check the name and the network, or copy its files and point {field} at them")

    # A Hub name's data files are hf:// URLs, read from the Hub: without it there is nothing to plan or
    # read. A local dataset directory needs no Hub.
    hub = not os.path.isdir(name)
    if hub and (why := ("HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else _hub_unreachable())):
        raise refused(f"the Hugging Face Hub is not reachable ({why})")
    _quiet_datasets()
    try:
        builder = datasets.load_dataset_builder(name, config)
    except Exception as exc:
        raise refused(_root_cause(exc)) from None
    files = builder.config.data_files or {}
    if split not in files:
        raise UserError(f"{field}='hf:{name}' (hf_config={config!r}): no split {split!r} (splits: "
                        f"{', '.join(files)}); set corpus.hf_split")
    return sorted(str(f) for f in files[split])
