"""Errors that mean "the user's input is wrong": one line, naming the culprit and the fix."""

EXIT_USAGE = 2  # the exit code of every entry point for a UserError


class UserError(Exception):
    """Bad input from the user: one-line message, CLI exit code 2."""


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message (its type name if it has none), for one-line errors."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:limit]


def find_user_error(exc: BaseException | None) -> UserError | None:
    """The UserError behind wrapped exceptions (Ray's RayTaskError.cause, `raise ... from` chains)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, UserError):
            return exc
        seen.add(id(exc))
        exc = getattr(exc, "cause", None) or exc.__cause__
    return None


def guarded(body, stream=None) -> int:
    """Run an entry point's body (CLI command, Ray job): the one place where a UserError, also one
    wrapped by Ray or chained, becomes one line `tpu-ray: error: ...` on `stream` and exit code 2; so does a refusing environment
    (full or read-only disk, a file where a directory belongs, an unparsable file: describe_failure)."""
    import sys

    try:
        return body() or 0
    except BrokenPipeError:  # the reader went away: the caller decides (the CLI stops quietly)
        raise
    except Exception as exc:
        line, code = failure_line(exc)
        if code != EXIT_USAGE:
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


def failure_line(exc: BaseException) -> tuple[str, int]:
    """One line and the exit code for any failure: bad input and a refusing environment exit 2
    (EXIT_USAGE); anything else is a bug, exit 1 (its line names the type and asks for --verbose)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:  # Ray wraps the cause (RayTaskError.cause)
        seen.add(id(cur))
        if isinstance(cur, UserError):
            return str(cur), EXIT_USAGE
        described = describe_failure(cur)
        if described:
            return described, EXIT_USAGE
        cur = getattr(cur, "cause", None) or cur.__cause__
    return (f"{type(exc).__name__}: {first_line(exc)} (an internal error; rerun with --verbose for the "
            f"traceback and report it)"), 1
