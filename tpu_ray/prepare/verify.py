"""Shards checked against their manifest, so a damaged file fails before a run pays for it.

The manifest records every shard's size, sample count and sha256. Training checks sizes always
(a truncated or rewritten file changes size; one metadata call per shard) and sha256 plus the
record framing when the data is small enough to read cheaply; `tpu-ray doctor` samples the deep
check, or runs it on every shard with --full. A corrupt record that still slips through
(shards without a manifest) surfaces in tf.data as a DataLossError that names no file:
`guard_training` turns it into a one-line UserError naming the shard.
"""

from __future__ import annotations

import functools
import hashlib
import io
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from tpu_ray import storage
from tpu_ray.errors import UserError, first_line
from tpu_ray.prepare.tfrecord import read_records

# Below this many bytes of shards, training hashes every shard before it starts.
CHEAP_HASH_BYTES = 256 << 20
# Shards hashed by a sampled check (first, middle, last).
SAMPLE = 3

F = TypeVar("F", bound=Callable[..., Any])


def manifest_shards(manifest: dict) -> list[dict]:
    """Every shard entry of a manifest, train first, each with its split."""
    out = []
    for split, info in sorted(manifest.get("splits", {}).items(), key=lambda kv: kv[0] != "train"):
        out.extend({"split": split, **entry} for entry in info.get("shards", []))
    return out


def sampled(entries: Sequence[dict], full: bool) -> list[dict]:
    """All entries, or a deterministic sample (first, middle, last)."""
    if full or len(entries) <= SAMPLE:
        return list(entries)
    picks = sorted({0, len(entries) // 2, len(entries) - 1})
    return [entries[i] for i in picks]


def deep_checked(entries: Sequence[dict], full: bool) -> set[str]:
    """Paths of the shards whose sha256 and record counts are read: all of them when they total at
    most CHEAP_HASH_BYTES (what training checks before it starts) or `full`, else a sample.
    Training and `tpu-ray doctor` both use this, so the doctor never checks less than training."""
    cheap = sum(int(e.get("bytes", 0)) for e in entries) <= CHEAP_HASH_BYTES
    return {e["path"] for e in sampled(entries, full=full or cheap)}


def count_records(data: bytes) -> int:
    """Records in TFRecord bytes; ValueError if the framing or a CRC is broken (truncation)."""
    return sum(1 for _ in read_records(io.BytesIO(data)))


SHARD_FIX = "delete it and rerun `tpu-ray shard` to rewrite it"


def check_shard(shards_dir: str, entry: dict, deep: bool, sizes: dict[str, int] | None = None) -> str | None:
    """None if the shard matches its manifest entry, else what is wrong, naming the file
    (callers add the fix, SHARD_FIX).

    Shallow: exists and has the recorded size (from `sizes`, one listing of the shard dir, when
    given). Deep: also sha256 and sample count (reads it).
    """
    path = storage.join(shards_dir, entry["path"])
    if sizes is not None:
        if entry["path"] not in sizes:
            return f"{path}: listed in manifest.json but missing"
        size = sizes[entry["path"]]
    else:
        try:
            size = storage.size(path)
        except FileNotFoundError:
            return f"{path}: listed in manifest.json but missing"
    if "bytes" in entry and size != entry["bytes"]:
        return f"{path}: {size} bytes, manifest.json says {entry['bytes']} (truncated or rewritten)"
    if not deep:
        return None
    data = storage.read_bytes(path)
    digest = hashlib.sha256(data).hexdigest()
    if entry.get("sha256") and digest != entry["sha256"]:
        return f"{path}: sha256 {digest[:12]} does not match manifest.json ({str(entry['sha256'])[:12]})"
    try:
        n = count_records(data)
    except ValueError as exc:
        return f"{path}: {exc} (corrupt TFRecord)"
    if n != entry.get("samples", n):
        return f"{path}: {n} records, manifest.json says {entry['samples']}"
    return None


def verify_for_training(shards_dir: str, manifest: dict | None) -> None:
    """Raise a UserError naming the first shard that does not match the manifest.

    Sizes always; sha256 and record counts of every shard when they total under
    CHEAP_HASH_BYTES, else of a sample (`tpu-ray doctor --full` checks them all).
    """
    if not manifest:
        return
    entries = manifest_shards(manifest)
    deep = deep_checked(entries, full=False)
    sizes = storage.find_sizes(shards_dir)  # one listing, not a `size` request per shard
    for entry in entries:
        problem = check_shard(shards_dir, entry, deep=entry["path"] in deep, sizes=sizes)
        if problem:
            raise UserError(f"{problem}; {SHARD_FIX}")


def find_corrupt(files: Sequence[str]) -> str | None:
    """The first file whose TFRecord framing is broken (read in Python, on the error path only)."""
    for path in files:
        try:
            count_records(storage.read_bytes(path))
        except (ValueError, OSError):
            return path
    return None


def guard_training(train_fn: F) -> F:
    """Decorate `train(cfg, ...)`: verify shards against the manifest first, and turn tf.data's
    DataLossError (which names no file) into a UserError naming the corrupt shard."""

    @functools.wraps(train_fn)
    def wrapper(cfg, *args: Any, **kwargs: Any) -> Any:
        import tensorflow as tf

        from tpu_ray.prepare.shards import read_manifest, shard_files

        verify_for_training(cfg.shards_dir, read_manifest(cfg.shards_dir))
        try:
            return train_fn(cfg, *args, **kwargs)
        except tf.errors.DataLossError as exc:
            files = [p for split in ("train", "validation")
                     for p, _ in shard_files(cfg.shards_dir, split, require_complete=False)]
            bad = find_corrupt(files)
            what = f"{bad}: truncated or corrupt TFRecord" if bad else f"{cfg.shards_dir}: corrupt TFRecord data"
            first = first_line(exc, 120)
            raise UserError(f"{what} ({first}); delete it and rerun `tpu-ray shard`") from None

    return wrapper  # type: ignore[return-value]


# Bytes sniffed at the start of each corpus file for NUL bytes (binary files given as text).
SNIFF_BYTES = 8192
SNIFF_FILES = 64


def preflight_corpus(cfg) -> list[str]:
    """Check the corpus before a stage writes anything into the run directory: a typo'd, empty or
    binary corpus must not leave a run directory whose saved config then refuses the corrected rerun.

    Cheap: expands paths and globs, reads sizes, and sniffs the first bytes of the first text files
    (no work-unit planning, which reads at every unit boundary). The built-in corpus and hf:
    datasets are left to their stage (reading them writes or downloads). Returns the files checked.
    """
    from tpu_ray.config import BUILTIN_CORPUS
    from tpu_ray.prepare.corpus import WorkUnit, decode_text, parquet_rows, resolve_files
    from tpu_ray.prepare.formats import detect

    checked: list[str] = []
    for field, source in (("corpus.source", cfg.corpus.source),
                          ("corpus.validation_source", cfg.corpus.validation_source)):
        if not source or source == BUILTIN_CORPUS or source.startswith("hf:"):
            continue
        files = resolve_files(source, field)
        if all(fmt != "hf_disk" and storage.size(path) == 0 for path, fmt in files):
            raise UserError(f"{field}={source!r}: the corpus is empty; point it at text")
        for path, fmt in files[:SNIFF_FILES]:
            if fmt == "parquet":  # reads the footer only: not parquet, no text column, not text
                parquet_rows(path, cfg.corpus.text_field, cfg.corpus.text_lists)
            if fmt in ("txt", "jsonl") and detect(path)[1] is None:  # compressed ones: their stage reads them
                with storage.open(path, "rb") as f:
                    head = f.read(SNIFF_BYTES)
                # The corpus reader's own one-line errors: NUL bytes, and non-UTF-8 under
                # encoding_errors=fail (whole lines only: a character cut at the sniff's end is fine).
                lines = head[: head.rfind(b"\n") + 1]
                policy = cfg.corpus.encoding_errors if lines else "replace"
                decode_text(lines or head, WorkUnit(0, path, fmt, 0, 0, len(head), encoding_errors=policy), 0)
        checked += [path for path, _ in files]
    return checked