"""The one place that talks to storage: local paths and gs:// (or any fsspec URL) alike.

Why over 400 lines: it is the single owner of every storage rule (gcsfs set-up, one-line errors,
atomic commits, the lock primitives); split, those rules would drift apart again.

Every artifact a later stage trusts is committed atomically (see DESIGN.md, "Contracts"):
locally a temp file in the same directory is fsynced and renamed over the final name; on GCS a
single object upload is already atomic (the object appears whole or not at all), so we upload
once, straight to the final name.

gs:// goes through gcsfs, configured here and nowhere else:
- `STORAGE_EMULATOR_HOST` (e.g. ``http://127.0.0.1:9023``) points gcsfs at a local emulator with
  anonymous credentials, bounded request timeouts and few retries, so tests fail fast.
- We always use the plain JSON-API ``gcsfs.core.GCSFileSystem``. Since gcsfs 2025.x,
  ``import gcsfs`` swaps ``gcsfs.GCSFileSystem`` for ``gcsfs.extended_gcsfs.ExtendedGcsFileSystem``
  unless the env var ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT`` is false (gcsfs/__init__.py). That class
  probes every bucket's type over gRPC (Storage Control API ``get_storage_layout``,
  ``ExtendedGcsFileSystem._get_bucket_type`` in gcsfs/extended_gcsfs.py) with a 60 s retry
  budget; against the HTTP-only emulator each first touch of a bucket then hangs for about a
  minute. We set that env var to "false" (if unset) before gcsfs is imported, which also covers
  other libraries' ``fsspec.filesystem("gs")`` and child processes (Ray workers) started later.
- Listing caches are off (``use_listings_cache=False``): shards are written by other processes
  (Ray actors), and a cached listing would hide them. No ``invalidate_cache()`` calls are needed.
"""

from __future__ import annotations

import builtins
import collections
import errno
import functools
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

import fsspec

from tpu_ray.errors import UserError
from tpu_ray.errors import first_line as _first_line

# Must happen before the first `import gcsfs` anywhere in the process: see the module docstring.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

_LOCAL = ("file", "local")
_GCS = ("gs", "gcs")
# Emulator only: one retry (gcsfs's default is 6 attempts with 1+2+4+8+16 s back-off, ~33 s
# before an unreachable endpoint is reported), and bounded per-request timeouts.
_EMULATOR_ATTEMPTS = 2
_EMULATOR_CONNECT_S = 5.0
_EMULATOR_READ_S = 60.0


class StorageError(UserError):
    """A storage path that cannot be used: one line naming it and the fix."""


class MissingBucketError(StorageError):
    """The store says the bucket does not exist (404), as opposed to not answering."""


# Storage calls this process made, by function (a listing, an open, an info, one ranged read, a
# write...): what the shard summary and benchmarks/shard_throughput.py report as requests. Why by
# hand: fsspec keeps no such count, and on 2 cores the counts are what compares runs, not seconds.
REQUESTS: collections.Counter[str] = collections.Counter()


def requests_made() -> int:
    """Storage calls made by this process so far (see REQUESTS)."""
    return sum(REQUESTS.values())


# Checks every write runs first (runlock.RunLock's: a gs:// run whose lock was taken over writes nothing more).
_FENCES: list[Any] = []


def add_fence(fence: Any) -> None:
    """Call `fence(path)` before every write through this module; it raises to refuse the write."""
    _FENCES.append(fence)


def remove_fence(fence: Any) -> None:
    if fence in _FENCES:
        _FENCES.remove(fence)


def _fenced(path: str) -> None:
    for fence in list(_FENCES):
        fence(path)


def _counted(fn: Any) -> Any:
    @functools.wraps(fn)
    def counted(*args: Any, **kwargs: Any) -> Any:
        REQUESTS[fn.__name__] += 1
        return fn(*args, **kwargs)

    return counted


# --------------------------------------------------------------------------------------------
# Filesystems
# --------------------------------------------------------------------------------------------
def scheme(path: str) -> str:
    """The fsspec protocol of `path` ("file" for plain local paths, "gs" for gs://...)."""
    return fsspec.utils.get_protocol(path)


def is_remote(path: str) -> bool:
    """True unless `path` is on the local filesystem (decided by URL scheme, not substrings)."""
    return scheme(path) not in _LOCAL


# What decides which store gs:// names. Ray workers inherit the environment of the raylet, which may
# predate these variables, so the driver hands them to its actors and train workers explicitly.
FORWARDED_ENV = ("STORAGE_EMULATOR_HOST",)


def forwarded_env() -> dict[str, str]:
    """The driver's values of FORWARDED_ENV, to set in a Ray worker before its first storage call."""
    return {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}


def _emulator_endpoint() -> str | None:
    host = os.environ.get("STORAGE_EMULATOR_HOST", "").strip().rstrip("/")
    if not host:
        return None
    return host if "://" in host else f"http://{host}"


_emulator_cls: type | None = None


def _emulator_fs_class() -> type:
    """gcsfs's GCSFileSystem with fewer HTTP attempts (it bakes `retries` in at class creation)."""
    global _emulator_cls
    if _emulator_cls is None:
        from gcsfs.core import GCSFileSystem
        from gcsfs.retry import retry_request

        inner = getattr(GCSFileSystem._request, "__wrapped__", None)
        if inner is None:  # a gcsfs that no longer decorates _request this way: keep its retries
            _emulator_cls = GCSFileSystem
        else:
            class _EmulatorGCSFileSystem(GCSFileSystem):
                retries = _EMULATOR_ATTEMPTS
                _request = retry_request(retries=_EMULATOR_ATTEMPTS)(inner)

            _EmulatorGCSFileSystem.__qualname__ = "_EmulatorGCSFileSystem"  # picklable by name
            _emulator_cls = _EmulatorGCSFileSystem
    return _emulator_cls


def __getattr__(name: str) -> Any:
    # Lets pickle find the emulator filesystem class by name in another process.
    if name == "_EmulatorGCSFileSystem":
        return _emulator_fs_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The oldest gcsfs (and the fsspec it pins) whose `pipe_file` takes `mode="create"`
# (`ifGenerationMatch=0`): the run lock and the generation claims need it; 2024.10.0 has no `mode`.
GCSFS_FLOOR = "2024.12.0"


def _release(version: str) -> tuple[int, ...]:
    """`2024.12.0` -> (2024, 12, 0); a suffix (`rc1`, `+local`) is ignored."""
    return tuple(int(m) for m in re.findall(r"\d+", version.split("+")[0])[:3])


def gcsfs_problem(gcsfs_version: str | None, fsspec_version: str | None) -> str | None:
    """Why the installed gcsfs/fsspec cannot run tpu-ray's gs:// locks (one line), or None."""
    for name, version in (("gcsfs", gcsfs_version), ("fsspec", fsspec_version)):
        if version is None:
            return f"{name} is not installed; gs:// paths need it: pip install 'gcsfs>={GCSFS_FLOOR}'"
        if _release(version) < _release(GCSFS_FLOOR):
            return (f"{name} {version} is installed, but gs:// locks need {name}>={GCSFS_FLOOR} "
                    f"(pipe_file(mode='create')); run: pip install -U 'gcsfs>={GCSFS_FLOOR}' 'fsspec>={GCSFS_FLOOR}'")
    return None


def _require_gcsfs() -> None:
    import importlib.metadata as md

    def version(dist: str) -> str | None:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    problem = gcsfs_problem(version("gcsfs"), version("fsspec"))
    if problem:
        raise StorageError(problem)


@functools.cache
def _fs(protocol: str, emulator: str | None, pid: int) -> fsspec.AbstractFileSystem:
    # `pid` in the key: a forked child must not reuse the parent's event-loop-bound instance.
    if protocol in _GCS:
        _require_gcsfs()  # before the first lock or claim fails with a TypeError from pipe_file
        if emulator:
            import aiohttp

            return _emulator_fs_class()(
                token="anon", project="test", endpoint_url=emulator, use_listings_cache=False,
                requests_timeout=aiohttp.ClientTimeout(
                    total=None, connect=_EMULATOR_CONNECT_S, sock_read=_EMULATOR_READ_S),
            )
        from gcsfs.core import GCSFileSystem

        return GCSFileSystem(use_listings_cache=False)
    if protocol in _LOCAL:
        return fsspec.filesystem("file", auto_mkdir=False)
    return fsspec.filesystem(protocol, use_listings_cache=False)


def filesystem(path: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The (cached) filesystem for `path` and the path as that filesystem names it."""
    protocol = scheme(path)
    fs = _fs(protocol, _emulator_endpoint() if protocol in _GCS else None, os.getpid())
    return fs, fs._strip_protocol(path)


def _unstrip(original: str, stripped: str) -> str:
    """Name `stripped` (as the filesystem returned it) with the scheme `original` was given in."""
    if not is_remote(original):
        return f"file://{stripped}" if original.startswith("file://") else stripped
    return f"{scheme(original)}://{stripped}"


def join(base: str, *parts: str) -> str:
    """Join path parts with "/" for local paths and URLs alike (no os.sep, no scheme mangling)."""
    out = base
    for part in parts:
        part = part.strip("/")
        if not part:
            continue
        out = f"{out.rstrip('/')}/{part}" if out else part
    return out


# --------------------------------------------------------------------------------------------
# Errors: one line naming the path and the fix
# --------------------------------------------------------------------------------------------
def _bucket(path: str) -> str:
    return filesystem(path)[1].split("/", 1)[0]


_known_buckets: set[tuple[str | None, str]] = set()


def _bucket_missing(path: str) -> bool:
    """True only when the store says the bucket of `path` does not exist (404)."""
    if scheme(path) not in _GCS:
        return False
    fs, _ = filesystem(path)
    bucket = _bucket(path)
    key = (getattr(fs, "_endpoint", None), bucket)
    if key in _known_buckets:
        return False
    try:
        # GET b/<bucket> directly rather than fs.info(bucket): info falls back to listing, which
        # cannot tell an empty bucket from a missing one when buckets.get is not granted.
        fs.call("GET", "b/{}", bucket, json_out=True)
    except FileNotFoundError:
        return True
    except Exception:  # 403 and friends: we cannot tell, so do not claim it is missing
        return False
    _known_buckets.add(key)
    return False


def _missing_bucket_error(path: str) -> StorageError:
    bucket = _bucket(path)
    return MissingBucketError(f"{path}: bucket {bucket!r} does not exist or is not reachable; "
                              "create it or fix the path")


@contextmanager
def _remote_errors(path: str) -> Iterator[None]:
    """Turn gcsfs/aiohttp failures on remote `path` into one-line StorageErrors.

    A missing object stays a FileNotFoundError (callers rely on it); a missing bucket does not. A
    412 stays a FileExistsError (create_if_absent and the *_if_generation calls answer it).
    Local paths raise the usual OSErrors untouched.
    """
    if not is_remote(path):
        yield
        return
    try:
        yield
    except StorageError:
        raise
    except FileNotFoundError:
        if _bucket_missing(path):
            raise _missing_bucket_error(path) from None
        # gcsfs names the request URL; name the path the caller gave instead.
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", path) from None
    except FileExistsError:
        raise  # gcsfs's HTTP 412 (a precondition that did not hold): the conditional writes' answer
    except PermissionError as exc:
        raise StorageError(f"{path}: permission denied ({_first_line(exc)}); "
                           "grant access or fix the credentials") from None
    except Exception as exc:
        if not isinstance(exc, _transport_errors()):
            raise
        text = _first_line(exc)
        if _is_access_denied(exc):
            raise StorageError(f"{path}: access denied ({text}); grant access to bucket "
                               f"{_bucket(path)!r} or fix the credentials") from None
        hint = (f"check STORAGE_EMULATOR_HOST={os.environ['STORAGE_EMULATOR_HOST']}"
                if scheme(path) in _GCS and _emulator_endpoint() else "check the path and network")
        raise StorageError(f"{path}: storage request failed ({type(exc).__name__}: {text}); "
                           f"{hint}") from exc


def _is_access_denied(exc: BaseException) -> bool:
    """True for a refused credential: HTTP 401/403 or a google-auth failure.

    Decided by the status code the error carries, never by digits in its text: a refused
    connection to port 40367 names "403" too.
    """
    try:
        from google.auth.exceptions import GoogleAuthError, TransportError

        # Refused or unusable credentials; not an unreachable metadata or token server.
        if isinstance(exc, GoogleAuthError) and not isinstance(exc, TransportError):
            return True
    except ImportError:
        pass
    code = getattr(exc, "status", None) or getattr(exc, "code", None)  # aiohttp deprecates .code
    if code in (401, 403):
        return True
    return re.search(r"\b(Forbidden|Unauthorized)\b", _first_line(exc)) is not None


@functools.lru_cache(maxsize=1)
def _transport_errors() -> tuple[type[BaseException], ...]:
    """What a store can raise for a bad path, endpoint or credentials (not programming errors)."""
    errors: list[type[BaseException]] = [OSError, ValueError]  # aiohttp connect errors are OSErrors
    try:
        import aiohttp
        from gcsfs.retry import HttpError
        from google.auth.exceptions import GoogleAuthError

        errors += [aiohttp.ClientError, GoogleAuthError, HttpError]
    except ImportError:
        pass
    return tuple(errors)


# --------------------------------------------------------------------------------------------
# Queries
# --------------------------------------------------------------------------------------------
@_counted
def exists(path: str) -> bool:
    """Whether a file or directory exists; a gs:// path in a missing bucket is an error, not False."""
    fs, p = filesystem(path)
    with _remote_errors(path):
        found = fs.exists(p)
    if not found and _bucket_missing(path):
        raise _missing_bucket_error(path)
    return found


@_counted
def isdir(path: str) -> bool:
    """Whether `path` is a directory (on object stores: a prefix with objects under it)."""
    fs, p = filesystem(path)
    with _remote_errors(path):
        return fs.isdir(p)


def makedirs(path: str) -> None:
    """Create a local directory tree; object stores have no directories, so only the bucket is
    checked there (a typo in an output bucket fails here, before any work is done)."""
    if not is_remote(path):
        _fenced(path)  # (an object store's "directory" writes nothing: no fence)
        fs, p = filesystem(path)
        try:
            fs.makedirs(p, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise StorageError(f"{path}: a file is in the way (not a directory); remove it or choose "
                               f"another --output-dir") from None
    elif _bucket_missing(path):
        raise _missing_bucket_error(path)


@_counted
def glob(pattern: str, files_only: bool = False) -> list[str]:
    """Sorted matches, named with the same scheme as the pattern (gs://bucket/x for gs://);
    `files_only` leaves out directories (one listing, no extra call per match)."""
    fs, p = filesystem(pattern)
    with _remote_errors(pattern):
        if files_only:
            matches = [m for m, info in fs.glob(p, detail=True).items() if info.get("type") != "directory"]
        else:
            matches = fs.glob(p)
    return sorted(_unstrip(pattern, m) for m in matches)


@_counted
def glob_info(pattern: str) -> dict[str, dict]:
    """Files matching `pattern` (a path, glob or `dir/**`) with their listing info (size, mtime or
    generation): one listing, so callers need no `size` request per file."""
    fs, p = filesystem(pattern)
    with _remote_errors(pattern):
        found = fs.glob(p, detail=True)
    return {_unstrip(pattern, m): info for m, info in sorted(found.items()) if info.get("type") != "directory"}


@_counted
def info(path: str) -> dict:
    """A file's listing info (size, type, mtime or generation)."""
    fs, p = filesystem(path)
    with _remote_errors(path):
        return fs.info(p)


@_counted
def find_sizes(path: str) -> dict[str, int]:
    """Size of every file under `path` (recursively), by path relative to it: one listing."""
    fs, p = filesystem(path)
    with _remote_errors(path):
        found = fs.find(p, detail=True)
    root = p.rstrip("/") + "/"
    return {k[len(root):]: int(v.get("size") or 0) for k, v in found.items() if k.startswith(root)}


@_counted
def read_ranges(path: str, starts: list[int], ends: list[int]) -> list[bytes]:
    """Bytes [start, end) of a file for each pair: concurrent ranged reads on async stores (gcsfs
    `cat_ranges`: no per-range `info`, no readahead), else one open and a seek per range."""
    fs, p = filesystem(path)
    REQUESTS["read_ranges"] += max(len(starts) - 1, 0)  # one request per range
    with _remote_errors(path):
        if getattr(fs, "async_impl", False):
            return list(fs.cat_ranges([p] * len(starts), starts, ends, on_error="raise"))
        out = []
        with fs.open(p, "rb") as f:
            for start, end in zip(starts, ends):
                f.seek(start)
                out.append(f.read(end - start))
        return out


@_counted
def read_heads_and_tails(paths: list[str], starts: list[int], ends: list[int]) -> list[bytes]:
    """Bytes [start, end) of several files, one small range each: concurrent on async stores
    (gcsfs `cat_ranges` over many paths: one GET each, no info request), else an open per file."""
    if not paths:
        return []
    fs, _ = filesystem(paths[0])
    REQUESTS["read_heads_and_tails"] += len(paths) - 1  # one request per file
    stripped = [filesystem(p)[1] for p in paths]
    with _remote_errors(paths[0]):
        if getattr(fs, "async_impl", False):
            return list(fs.cat_ranges(stripped, starts, ends, on_error="raise"))
        out = []
        for p, start, end in zip(stripped, starts, ends):
            with fs.open(p, "rb") as f:
                f.seek(start)
                out.append(f.read(end - start))
        return out


@_counted
def listdir(path: str) -> list[str]:
    """Full paths (same scheme as `path`) of the entries of a directory, sorted."""
    fs, p = filesystem(path)
    with _remote_errors(path):
        entries = fs.ls(p, detail=False)
    return sorted(_unstrip(path, e) for e in entries if e.rstrip("/") != p.rstrip("/"))


@_counted
def size(path: str) -> int:
    """Size of a file in bytes."""
    fs, p = filesystem(path)
    with _remote_errors(path):
        return int(fs.size(p))


@_counted
def remove(path: str, recursive: bool = False) -> None:
    """Delete a file (or, with recursive=True, a directory tree / every object under a prefix)."""
    _fenced(path)
    fs, p = filesystem(path)
    with _remote_errors(path):
        fs.rm(p, recursive=recursive)


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------
@_counted
def open(path: str, mode: str = "rb", **kwargs: Any) -> IO:
    """fsspec's open. Writing through this is NOT atomic on local disk: use atomic_* for artifacts.

    On gs:// a written object only appears when the file is closed, and upload errors surface at
    close, so always use it as a context manager.
    """
    if any(c in mode for c in "wax+"):
        _fenced(path)
    fs, p = filesystem(path)
    with _remote_errors(path):
        return fs.open(p, mode, **kwargs)


def open_random_access(path: str) -> IO:
    """A file for reads at scattered offsets (parquet column chunks): on object stores each read is
    one ranged GET of exactly its bytes; fsspec's default readahead cache would fetch up to a block
    (5 MiB on gcsfs) past every read, the other columns included."""
    return open(path, "rb", cache_type="none") if is_remote(path) else open(path, "rb")


@_counted
def read_bytes(path: str) -> bytes:
    """The whole content of a file."""
    fs, p = filesystem(path)
    with _remote_errors(path):
        return fs.cat_file(p)


def read_text(path: str) -> str:
    """The whole content of a UTF-8 text file."""
    return read_bytes(path).decode("utf-8")


@_counted
def download_file(path: str, local_dst: str) -> None:
    """Copy the file `path` (any scheme) to the local file `local_dst`, streaming, not in memory."""
    fs, p = filesystem(path)
    os.makedirs(os.path.dirname(local_dst) or ".", exist_ok=True)
    with _remote_errors(path):
        fs.get_file(p, local_dst)


# --------------------------------------------------------------------------------------------
# Atomic writes
# --------------------------------------------------------------------------------------------
def _temp_beside(final: str) -> tuple[int, str]:
    """A temp file in the directory of `final` (same filesystem, so os.replace is atomic).

    Named ".tmp-<name>.<random>.tmp": the ".tmp" suffix keeps globs for final names (`*.tfrecord`,
    `*.json`) from matching a leftover of a crashed writer, and the ".tmp-" prefix is what
    shards.py's cleanup sweeps. (fsspec's glob, unlike Python's, does match dot-files with "*".)
    """
    directory = os.path.dirname(final) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{os.path.basename(final)}.", suffix=".tmp", dir=directory)
    # mkstemp creates 0600 whatever the umask; the committed file must read like any other file
    # the process writes (0644 under umask 022), or other users sharing the run dir cannot read it.
    os.fchmod(fd, 0o666 & ~current_umask())
    return fd, tmp


def current_umask() -> int:
    """The process umask (Linux: read from /proc, so no window with a changed umask in threads)."""
    try:
        with builtins.open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_dir(directory: str) -> None:
    """Make a rename durable (best effort: not every filesystem lets a directory be opened)."""
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _local(path: str) -> str:
    return filesystem(path)[1]


@_counted
def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file, or the whole new one, never half."""
    _fenced(path)
    if is_remote(path):
        fs, p = filesystem(path)
        # One object upload: GCS makes an object visible only once the upload completes (simple
        # and resumable uploads alike), so there is no partial object to guard against.
        with _remote_errors(path):
            fs.pipe_file(p, data)
        return
    with _local_commit(_local(path)) as f:
        f.write(data)


@contextmanager
def _local_commit(final: str) -> Iterator[IO[bytes]]:
    """A temp file beside `final` to write: fsynced and renamed onto `final` when the block ends,
    removed if it raises (readers see the old file or the whole new one, never half)."""
    fd, tmp = _temp_beside(final)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException as exc:
        _silent_remove(tmp)
        if isinstance(exc, OSError) and exc.errno is not None and exc.filename in (None, tmp):
            # A failed write() (a full disk) names no file, a failed rename our temp name: name
            # the file being committed instead.
            raise OSError(exc.errno, exc.strerror, final) from None
        raise
    _fsync_dir(os.path.dirname(final))


def atomic_write_text(path: str, text: str) -> None:
    """atomic_write_bytes for UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


@_counted
def atomic_copy_file(local_src: str, dst: str) -> None:
    """Commit a finished local file to `dst` in one atomic step.

    Locally the source is renamed onto `dst` when both are on one filesystem (so `local_src` is
    gone afterwards), else copied to a temp file beside `dst` and renamed. On gs:// it is
    uploaded as one object (atomic, see atomic_write_bytes) and `local_src` is left in place.
    """
    _fenced(dst)
    if is_remote(dst):
        fs, p = filesystem(dst)
        with _remote_errors(dst):
            fs.put_file(local_src, p)
        return
    final = _local(dst)
    os.makedirs(os.path.dirname(final) or ".", exist_ok=True)
    with builtins.open(local_src, "rb") as f:
        os.fsync(f.fileno())
    try:
        os.replace(local_src, final)
    except OSError as exc:
        if exc.errno != errno.EXDEV:  # only "different filesystem" warrants the copy below
            raise
        with builtins.open(local_src, "rb") as src, _local_commit(final) as out:
            shutil.copyfileobj(src, out, 1 << 20)
        return
    _fsync_dir(os.path.dirname(final))


@_counted
def commit_dir(local_src: str, dst: str, last: str) -> None:
    """Replace the directory `dst` by the files of the local directory `local_src`, whole.

    Locally the files are copied into a temp directory beside `dst` and fsynced, then swapped in
    by one rename (`renameat2(RENAME_EXCHANGE)` where Linux has it, else two renames with `dst`
    absent for a moment): a reader, or a crash, sees the old directory or the new one, never a mix
    (an old `config.json` beside new weights). On gs:// there is no directory rename: `last` (the
    file that marks the directory complete) is deleted first, the other files uploaded, files of
    the old version that the new one lacks removed, and `last` uploaded at the end.
    """
    _fenced(dst)
    names = sorted(os.listdir(local_src), key=lambda n: n == last)
    if is_remote(dst):
        marker = join(dst, last)
        if exists(marker):
            remove(marker)
        old = set(find_sizes(dst)) if exists(dst) else set()
        for name in names:
            if name != last:
                atomic_copy_file(os.path.join(local_src, name), join(dst, name))
        for stale in sorted(old - set(names)):
            remove(join(dst, stale), recursive=True)
        if last in names:
            atomic_copy_file(os.path.join(local_src, last), marker)
        return
    final = _local(dst).rstrip("/")
    parent = os.path.dirname(final) or "."
    os.makedirs(parent, exist_ok=True)
    staged = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(final)}.", dir=parent)
    try:
        os.chmod(staged, 0o777 & ~current_umask())
        for name in names:
            try:
                with builtins.open(os.path.join(local_src, name), "rb") as src, \
                        builtins.open(os.path.join(staged, name), "xb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
                    out.flush()
                    os.fsync(out.fileno())
            except OSError as exc:
                if exc.errno is not None and exc.filename in (None, os.path.join(staged, name)):
                    # A full disk names no file (or our temp name): name the file being committed.
                    raise OSError(exc.errno, exc.strerror, os.path.join(final, name)) from None
                raise
        _fsync_dir(staged)
        if os.path.lexists(final) and _exchange(staged, final):
            _remove_tree(staged)  # now the old version
        else:
            if os.path.lexists(final):
                old = f"{staged}.old"
                os.rename(final, old)
                os.rename(staged, final)
                _remove_tree(old)
            else:
                os.rename(staged, final)
    except BaseException:
        _remove_tree(staged)
        raise
    _fsync_dir(parent)


def _exchange(a: str, b: str) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def _remove_tree(path: str) -> None:
    if os.path.islink(path) or os.path.isfile(path):
        _silent_remove(path)
    elif os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)


def append_text_local(path: str, text: str) -> None:
    """Append UTF-8 `text` to a local file (created if absent), never through a symbolic link: a
    link planted in place of a run file (metrics.jsonl) must not make us write someone's file.
    One write() call for the whole text where the kernel takes it all (a local file does): two
    processes appending to one file on a local disk never interleave inside a record (a buffered
    file object would split a record over 8 KiB into several writes)."""
    _fenced(path)
    local = _local(path)
    try:
        fd = os.open(local, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StorageError(f"{path}: is a symbolic link; a run file must be a plain file: remove the link "
                               f"and check who made it") from None
        raise
    try:
        data = memoryview(text.encode("utf-8"))
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)


def _silent_remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


# --------------------------------------------------------------------------------------------
# Conditional writes (the run directory's lock)
# --------------------------------------------------------------------------------------------
@_counted
def create_if_absent(path: str, data: bytes) -> bool:
    """Create `path` holding `data` only if nothing is there: True if created, False if it exists.

    gs:// sends `ifGenerationMatch=0` (GCS answers 412 when the object exists: gcsfs raises
    FileExistsError); locally O_CREAT|O_EXCL does the same.
    """
    _fenced(path)
    if is_remote(path):
        fs, p = filesystem(path)
        try:
            with _remote_errors(path):
                fs.pipe_file(p, data, mode="create")
        except FileExistsError:
            return False
        return True
    local = _local(path)
    try:
        fd = os.open(local, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return True


@_counted
def remove_if_generation(path: str, generation: str | None = None) -> bool:
    """Delete `path` only while it is still `generation` (gs://: `ifGenerationMatch`; the current
    generation when None). False when the store refused (HTTP 412: someone rewrote it since),
    True otherwise (also when it was already gone). Local paths have no generations: plain delete."""
    _fenced(path)
    fs, p = filesystem(path)
    if not is_remote(path):
        _silent_remove(p)
        return True
    with _remote_errors(path):
        try:
            gen = generation or fs.info(p).get("generation")
            bucket, key = p.split("/", 1)
            fs.call("DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=gen)
        except FileNotFoundError:
            pass
        except FileExistsError:  # gcsfs's name for HTTP 412 (precondition failed)
            return False
    return True


@_counted
def replace_if_generation(path: str, data: bytes, generation: str) -> str | None:
    """Overwrite the gs:// object `path` with `data` only while it is still `generation`
    (`ifGenerationMatch`): the new generation, or None when the store refused (HTTP 412)."""
    _fenced(path)
    from urllib.parse import quote

    fs, p = filesystem(path)
    bucket, key = p.split("/", 1)
    body = (b'--==0==\nContent-Type: application/json; charset=UTF-8\n\n' + json.dumps({"name": key}).encode()
            + b"\n--==0==\nContent-Type: application/octet-stream\n\n" + data + b"\n--==0==--")
    with _remote_errors(path):
        try:
            out = fs.call("POST", f"{fs._location}/upload/storage/v1/b/{quote(bucket)}/o", uploadType="multipart",
                          headers={"Content-Type": 'multipart/related; boundary="==0=="'}, data=body,
                          json_out=True, ifGenerationMatch=generation)
        except FileExistsError:  # HTTP 412: no longer that generation
            return None
    return str(out.get("generation")) if isinstance(out, dict) and out.get("generation") else None


@_counted
def generation(path: str) -> str | None:
    """The object generation of a gs:// path (None locally or when the store has none)."""
    if not is_remote(path):
        return None
    fs, p = filesystem(path)
    with _remote_errors(path):
        return fs.info(p).get("generation")
