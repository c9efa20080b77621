"""Typed failures: what went wrong, in one line, and whether trying again can help.

Every failure a person or the recovery loop must act on is a `UserError` (kept as the base name:
`raise UserError(...)` still means bad input, exit code 2) of one `FailureKind`. The kind carries
the retry decision, so recovery (cluster/recovery.py: `decide`) never reads message text:

- bad input: a config value, a corpus, a flag. The same input fails the same way: never retried.
- refusing environment: a full or read-only disk, permissions, a TPU held by another process. A
  person must act: never retried.
- lost capacity: the node or TPU slice that trained went away (preemption, host failure), or the
  reserved slice's name stopped resolving. Another reservation can succeed: retried (resume).
- no capacity: waited the configured time for a slice and none came. The wait was the retry.
- damaged run directory: a file of RUN/ is cut, corrupt or missing. Never retried.
- superseded: a newer training attempt owns the run directory (a fencing generation, see
  train/generation.py); this one stops. Never retried (the newer one goes on).
- internal: anything else, a bug: exit code 1, never retried.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from tpu_ray.redact import redact

EXIT_USAGE = 2  # the exit code of every entry point for a typed failure (all kinds but internal)
EXIT_INTERNAL = 1


class FailureKind(Enum):
    """A failure's kind and whether a retry (a new attempt from the last checkpoint) can help."""

    BAD_INPUT = ("bad input", False)
    REFUSING_ENVIRONMENT = ("refusing environment", False)
    LOST_CAPACITY = ("lost capacity", True)
    NO_CAPACITY = ("no capacity", False)
    DAMAGED_RUN_DIR = ("damaged run directory", False)
    SUPERSEDED = ("superseded", False)
    INTERNAL = ("internal", False)

    def __init__(self, label: str, retryable: bool):
        self.label = label
        self.retryable = retryable

    @property
    def exit_code(self) -> int:
        return EXIT_INTERNAL if self is FailureKind.INTERNAL else EXIT_USAGE


class UserError(Exception):
    """A one-line failure of a known kind (default: bad input); every entry point exits 2 on it."""

    kind: FailureKind = FailureKind.BAD_INPUT


class RefusingEnvironment(UserError):
    kind = FailureKind.REFUSING_ENVIRONMENT


class LostCapacity(UserError):
    kind = FailureKind.LOST_CAPACITY


class NoCapacity(UserError):
    kind = FailureKind.NO_CAPACITY


class DamagedRunDir(UserError):
    kind = FailureKind.DAMAGED_RUN_DIR


class Superseded(UserError):
    kind = FailureKind.SUPERSEDED


@dataclass(frozen=True)
class Failure:
    """What `classify` makes of any exception: its kind and its one line."""

    kind: FailureKind
    line: str
    error: str  # the exception's type name, for the metrics stream

    @property
    def retryable(self) -> bool:
        return self.kind.retryable


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message (its type name if it has none), for one-line errors."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:limit]


def find_user_error(exc: BaseException | None) -> UserError | None:
    """The UserError behind wrapped exceptions (Ray's RayTaskError.cause, `raise ... from` chains)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        # Ray's RayTaskError(UserError) is a UserError too, but its text is the remote traceback:
        # the error it wraps (.cause) is the one line to report.
        if isinstance(exc, UserError) and not isinstance(getattr(exc, "cause", None), UserError):
            return exc
        seen.add(id(exc))
        exc = getattr(exc, "cause", None) or exc.__cause__
    return None


def guarded(body, stream=None) -> int:
    """Run an entry point's body (CLI command, Ray job): the one place where a typed failure, also
    one wrapped by Ray or chained, becomes one line `tpu-ray: error: ...` on `stream` and exit code 2
    (`classify`); an internal error is re-raised for the caller to report (exit 1)."""
    import sys

    try:
        return body() or 0
    except BrokenPipeError:  # the reader went away: the caller decides (the CLI stops quietly)
        raise
    except Exception as exc:
        line, code = failure_line(exc)
        if code == EXIT_INTERNAL:
            raise  # not the user's input nor the environment: the caller reports it (exit 1)
        print(f"tpu-ray: error: {line}", file=stream or sys.stderr, flush=True)
        return EXIT_USAGE


# What to do about an OSError, by errno: the second half of `path: what; fix`.
_OS_FIXES = {
    "ENOENT": "check the path",
    "EISDIR": "pass a file, not a directory",
    "ENOTDIR": "a part of the path is a file, not a directory; pass a directory path",
    "EEXIST": "a file is in the way; remove it or choose another path",
    "EROFS": "the filesystem is read-only; choose a writable --output-dir",
    "ENOSPC": "free space on that disk (or choose another --output-dir), then rerun with --resume",
    "EDQUOT": "free space in your quota (or choose another --output-dir), then rerun with --resume",
    "EACCES": "fix its permissions or choose another path",
    "EPERM": "fix its permissions or choose another path",
    "ENAMETOOLONG": "shorten the path",
}


def describe_failure(exc: BaseException) -> str | None:
    """One line `path: what; fix` for a failure caused by the environment or an input file (an
    OSError, a decode or parse error) that escaped the stage's own checks; None for anything else.

    Why here and not in each stage: a disk can fill up or turn read-only under any write, and
    listing every call site would miss one; the CLI maps whatever reaches it.
    """
    import errno as _errno
    import json

    if isinstance(exc, OSError) and exc.errno is not None:
        name = _errno.errorcode.get(exc.errno, "")
        path = exc.filename if exc.filename is not None else "input"
        what = (exc.strerror or name or type(exc).__name__).lower()
        fix = _OS_FIXES.get(name, "check the path and the filesystem")
        if exc.filename2 is not None:
            path = f"{path} -> {exc.filename2}"
        return f"{path}: {what}; {fix}"
    if isinstance(exc, UnicodeDecodeError):
        return (f"input: byte {exc.start} is not UTF-8 ({exc.reason}); pass a UTF-8 text file "
                f"(set corpus.encoding_errors=replace for a corpus)")
    if isinstance(exc, json.JSONDecodeError):
        return f"input: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); fix or delete the file"
    try:
        import yaml
    except ImportError:  # pragma: no cover - yaml is a dependency
        return None
    if isinstance(exc, yaml.YAMLError):
        return f"input: malformed YAML ({first_line(exc)}); fix the syntax"
    text = str(exc)
    if "No space left on device" in text:  # TensorFlow's file errors carry no errno, only the text
        return f"{first_line(exc)}; free space on that disk, then rerun with --resume"
    if "Read-only file system" in text:
        return f"{first_line(exc)}; choose a writable --output-dir"
    return None


_RAY_SYSTEM_ERRORS = ("NodeDiedError", "WorkerCrashedError", "LocalRayletDiedError", "ObjectLostError", "RayActorError",
                      "OwnerDiedError", "TaskUnschedulableError", "ActorDiedError", "ActorUnavailableError")
# Ray Train's names for a worker that stopped answering (its wrapped actor error is followed below).
_RAY_TRAIN_LOST = ("WorkerHealthCheckTimeoutError",)


def _is_ray_system_error(exc: BaseException) -> bool:
    """A Ray system failure (the task's worker or node went away), not the task's own exception."""
    import sys

    if "ray" not in sys.modules:
        return False
    if type(exc).__name__ in _RAY_TRAIN_LOST:
        return True
    import ray.exceptions as rex

    if isinstance(exc, rex.RayTaskError):  # the task raised: its cause says what it was
        return False
    return isinstance(exc, tuple(getattr(rex, n) for n in _RAY_SYSTEM_ERRORS if hasattr(rex, n)))


def classify(exc: BaseException) -> Failure:
    """The kind and one line of any failure, looking through Ray's wrappers and `raise ... from`
    chains: a typed error keeps its kind; a Ray system error is lost capacity; an OSError or an
    unparsable file that escaped a stage's checks is a refusing environment; the rest is internal."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:  # Ray wraps the cause (RayTaskError.cause)
        seen.add(id(cur))
        if isinstance(cur, UserError):
            return Failure(cur.kind, str(cur), type(cur).__name__)
        if _is_ray_system_error(cur):
            return Failure(FailureKind.LOST_CAPACITY,
                           f"the training node went away ({type(cur).__name__}: {first_line(cur, 120)})",
                           type(cur).__name__)
        described = describe_failure(cur)
        if described:
            return Failure(FailureKind.REFUSING_ENVIRONMENT, described, type(cur).__name__)
        # Ray's task wrapper (.cause), Ray Train's health-check wrapper (.health_check_failure), chains.
        cur = getattr(cur, "cause", None) or getattr(cur, "health_check_failure", None) or cur.__cause__
    return Failure(FailureKind.INTERNAL,
                   f"{type(exc).__name__}: {first_line(exc)} (an internal error; rerun with --verbose for the "
                   f"traceback and report it)", type(exc).__name__)


def failure_line(exc: BaseException) -> tuple[str, int]:
    """One line and the exit code for any failure: every typed kind exits 2 (EXIT_USAGE); an
    internal error is a bug, exit 1 (its line names the type and asks for --verbose)."""
    failure = classify(exc)
    return redact(failure.line), failure.kind.exit_code
