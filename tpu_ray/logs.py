"""Logging for every entry point (CLI, Ray jobs, Ray tasks, the Python API): our lines readable,
library chatter kept down. Its own module so that nothing below the command line imports the CLI.

Quiet by default: TensorFlow's C++ start-up lines (written to file descriptor 2 by absl before
Python logging exists, so no logger level can stop them), Transformers' warnings about its TF
classes and loaded weights, and Ray's token-auth notice. `verbose=True` (`tpu-ray ... --verbose`,
or TPU_RAY_VERBOSE=1, which Ray workers and jobs inherit) shows all of it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from tpu_ray.redact import RedactingFormatter

VERBOSE_ENV = "TPU_RAY_VERBOSE"

# Lines TensorFlow's native code prints while it loads and looks for devices on a machine without
# a GPU: absl's "before InitializeLog" notice, its INFO/WARNING records (oneDNN notice, "Could not
# find cuda drivers"), and the error-level "failed call to cuInit" that only means "no GPU here".
_NATIVE_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|[IW]\d{4} [\d:.]+ +\d+ \S+:\d+\] "
    r"|E\d{4} [\d:.]+ +\d+ \S+:\d+\] failed call to cuInit"
    r"|\s*$)")

# Library loggers that speak at WARNING about normal events on a CPU, quieted unless verbose.
_CHATTY_LOGGERS = {
    "ray._private.authentication.authentication_token_setup": logging.ERROR,  # "token auth is enabled"
    "transformers": logging.ERROR,  # "TF classes are deprecated", "All the layers ...", "Device set to use"
    # Libraries that log their own retries and tracebacks (gcsfs logs "_request out of retries" with a
    # traceback per attempt) before the exception we turn into one line reaches the user.
    **{name: logging.CRITICAL for name in ("gcsfs", "fsspec", "aiohttp", "asyncio", "google.auth", "urllib3")},
}


class _Formatter(RedactingFormatter, logging.Formatter):
    """Our log lines, redacted (a URL in a message or traceback keeps no password or signature)."""


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is now, not the stream it was made with: a notebook, a test
    harness or a job runner may swap stderr after the first `main()` and close the old one."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def is_verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def setup_logging(level: int = logging.INFO, verbose: bool | None = None) -> None:
    """Readable lines for terminals and `ray job logs`; library chatter kept down unless verbose."""
    if verbose:
        os.environ[VERBOSE_ENV] = "1"  # inherited by Ray workers and the job's processes
    verbose = is_verbose()
    root = logging.getLogger()
    if not any(getattr(h, "_tpu_ray", False) for h in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(_Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        handler._tpu_ray = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("tpu_ray").setLevel(logging.DEBUG if verbose and level > logging.DEBUG else level)
    quiet_libraries(verbose)


def setup_api_logging() -> None:
    """The Python API's logging: the CLI's progress lines unless the program configured logging
    itself (then our records only go through its handlers), and the same library quieting."""
    root = logging.getLogger()
    ours = logging.getLogger("tpu_ray")
    if not root.handlers or any(getattr(h, "_tpu_ray", False) for h in root.handlers):
        setup_logging(ours.level or logging.INFO)
    else:
        if ours.level == logging.NOTSET:
            ours.setLevel(logging.INFO)
        quiet_libraries(is_verbose())


def quiet_libraries(verbose: bool) -> None:
    """Environment and logger levels that keep library start-up chatter out of our output."""
    if verbose:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0")
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # read when transformers sets its logger up
    for name, lvl in _CHATTY_LOGGERS.items():
        logger = logging.getLogger(name)
        if logger.level < lvl:
            logger.setLevel(lvl)
    hooked = any(isinstance(f, _QuietTensorFlowImport) for f in sys.meta_path)
    if "tensorflow" not in sys.modules and not hooked:
        sys.meta_path.insert(0, _QuietTensorFlowImport())


def _is_noise(line: str) -> bool:
    return bool(_NATIVE_NOISE.match(line))


@contextmanager
def native_stderr_filtered() -> Iterator[None]:
    """Send file descriptor 2 to a temporary file for the block, then pass on every line that is
    not known start-up noise. A file, not a pipe: nothing blocks and nothing is lost if the block
    writes a lot; a crash inside leaves the text in the (unlinked) file, as TF's own log would."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no fd 2 to redirect: nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            try:
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", errors="replace")
            kept = "".join(line for line in text.splitlines(keepends=True) if not _is_noise(line))
            if kept:
                os.write(2, kept.encode("utf-8"))


class _QuietLoader:
    """Wraps TensorFlow's package loader: its import and first device scan run with fd 2 filtered."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def __getattr__(self, name: str):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        for finder in [f for f in sys.meta_path if isinstance(f, _QuietTensorFlowImport)]:
            sys.meta_path.remove(finder)  # TensorFlow is imported once per process
        with native_stderr_filtered():
            self._loader.exec_module(module)
            try:  # the device scan prints "failed call to cuInit" on machines without a GPU
                module.config.list_physical_devices()
            except Exception:  # noqa: BLE001 - the real error surfaces where devices are used
                pass


class _QuietTensorFlowImport(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` for whichever module imports it first and hands back its spec with a
    filtering loader: no TensorFlow import is moved or added. It stays until TensorFlow is
    executed (libraries probe with `importlib.util.find_spec("tensorflow")` long before), then
    removes itself."""

    def find_spec(self, name, path, target=None):
        if name != "tensorflow":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec
