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
    wrapped by Ray or chained, becomes one line `tpu-ray: error: ...` on `stream` and exit code 2."""
    import sys

    try:
        return body() or 0
    except Exception as exc:
        user_error = find_user_error(exc)
        if user_error is None:
            raise
        print(f"tpu-ray: error: {user_error}", file=stream or sys.stderr, flush=True)
        return EXIT_USAGE
