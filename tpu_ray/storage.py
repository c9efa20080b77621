"""The one place that talks to storage: local paths and gs:// (or any fsspec URL) alike.

Every artifact a later stage trusts is committed atomically: locally a temp file in the same
directory is fsynced and renamed over the final name; on GCS a single-object upload is already
atomic (the object appears whole or not at all), so we upload once, to the final name.
"""

from __future__ import annotations

import functools
import os
import tempfile
from typing import IO, Any

import fsspec

from tpu_ray.errors import UserError


class StorageError(UserError):
    """A path that cannot be used: one line naming it and the fix."""


def scheme(path: str) -> str:
    return fsspec.utils.get_protocol(path)


def is_remote(path: str) -> bool:
    return scheme(path) not in ("file", "local")


@functools.lru_cache(maxsize=None)
def _fs(protocol: str, emulator: str | None) -> fsspec.AbstractFileSystem:
    if protocol in ("gs", "gcs"):
        import gcsfs

        kwargs: dict[str, Any] = {}
        if emulator:
            # Anonymous access to the local emulator, few retries: a wrong bucket fails fast.
            kwargs.update(token="anon", endpoint_url=emulator, retries=1)
        return gcsfs.GCSFileSystem(**kwargs)
    return fsspec.filesystem(protocol)


def filesystem(path: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem for `path` and the path as that filesystem names it."""
    protocol = scheme(path)
    fs = _fs(protocol, os.environ.get("STORAGE_EMULATOR_HOST") if protocol in ("gs", "gcs") else None)
    return fs, fs._strip_protocol(path)


def _unstrip(original: str, stripped: str) -> str:
    protocol = scheme(original)
    if protocol in ("file", "local"):
        return stripped
    return f"{protocol}://{stripped}"


def join(base: str, *parts: str) -> str:
    out = base.rstrip("/") if base not in ("/",) else base
    for part in parts:
        out = f"{out}/{part.strip('/')}" if out else part
    return out


def exists(path: str) -> bool:
    fs, p = filesystem(path)
    try:
        return fs.exists(p)
    except (OSError, ValueError) as exc:
        raise _error(path, exc) from None


def isdir(path: str) -> bool:
    fs, p = filesystem(path)
    return fs.isdir(p)


def makedirs(path: str) -> None:
    if not is_remote(path):
        os.makedirs(path, exist_ok=True)  # object stores have no directories


def glob(pattern: str) -> list[str]:
    """Sorted matches, named with the same scheme as the pattern."""
    fs, p = filesystem(pattern)
    if is_remote(pattern):
        fs.invalidate_cache()  # other processes (actors) write here: never trust a cached listing
    try:
        return sorted(_unstrip(pattern, m) for m in fs.glob(p))
    except (OSError, ValueError) as exc:
        raise _error(pattern, exc) from None


def listdir(path: str) -> list[str]:
    """Full paths of the entries of a directory, sorted."""
    fs, p = filesystem(path)
    if is_remote(path):
        fs.invalidate_cache()
    return sorted(_unstrip(path, e) for e in fs.ls(p, detail=False))


def size(path: str) -> int:
    fs, p = filesystem(path)
    return int(fs.size(p))


def remove(path: str, recursive: bool = False) -> None:
    fs, p = filesystem(path)
    fs.rm(p, recursive=recursive)


def open(path: str, mode: str = "rb", **kwargs: Any) -> IO:  # noqa: A001 - mirrors builtins.open
    fs, p = filesystem(path)
    try:
        return fs.open(p, mode, **kwargs)
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:
        raise _error(path, exc) from None


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def read_text(path: str) -> str:
    return read_bytes(path).decode("utf-8")


def atomic_write_bytes(path: str, data: bytes) -> None:
    if is_remote(path):
        fs, p = filesystem(path)
        fs.pipe_file(p, data)  # one object upload: atomic on GCS
        return
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_write_text(path: str, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_copy_file(local_src: str, dst: str) -> None:
    """Commit a finished local file to `dst` (the source may be moved away)."""
    if is_remote(dst):
        fs, p = filesystem(dst)
        fs.put_file(local_src, p)
        return
    directory = os.path.dirname(os.path.abspath(dst))
    os.makedirs(directory, exist_ok=True)
    try:
        with builtins_open(local_src, "rb") as f:
            os.fsync(f.fileno())
        os.replace(local_src, dst)  # same filesystem: a rename
    except OSError:  # another filesystem: copy to a temp name beside dst, then rename
        with builtins_open(local_src, "rb") as f:
            atomic_write_bytes(dst, f.read())


builtins_open = __builtins__["open"] if isinstance(__builtins__, dict) else __builtins__.open


def _error(path: str, exc: BaseException) -> StorageError:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if is_remote(path):
        bucket = filesystem(path)[1].split("/", 1)[0]
        return StorageError(f"{path}: cannot reach bucket {bucket!r} ({text[:150]}); create it or fix the path")
    return StorageError(f"{path}: {text[:200]}")
