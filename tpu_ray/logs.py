"""Logging for every entry point (CLI, Ray jobs, Ray tasks, the Python API): our lines readable,
library chatter kept down. Its own module so that nothing below the command line imports the CLI."""

from __future__ import annotations

import logging
import os
import sys


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is now, not the stream it was made with: a notebook, a test
    harness or a job runner may swap stderr after the first `main()` and close the old one."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


# Libraries that log their own retries and tracebacks (gcsfs logs "_request out of retries" with a
# traceback per attempt) before the exception that we turn into one line reaches the user.
QUIET_LOGGERS = ("gcsfs", "fsspec", "aiohttp", "asyncio", "google.auth", "urllib3")


def setup_logging(level: int = logging.INFO, verbose: bool = False) -> None:
    """Readable lines for terminals and `ray job logs`; TensorFlow's C++ chatter and libraries'
    own error logs kept down (their exceptions still reach us), unless `verbose`."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    root = logging.getLogger()
    if not any(getattr(h, "_tpu_ray", False) for h in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        handler._tpu_ray = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    logging.getLogger("tpu_ray").setLevel(logging.DEBUG if verbose else level)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.CRITICAL)
