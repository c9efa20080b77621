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
