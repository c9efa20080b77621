"""The pipeline as a Ray job: `submit(cfg)` from Python, and a handle to follow it.

A Ray job returns nothing to the submitter, so everything travels as files: the config goes out as
a YAML file inside the shipped working directory (the job runs `python jobs/pretrain.py --config
<that file>`, exactly what a person would type after `ray job submit`), and results come back
through the run directory (`metrics.jsonl`, `summary.json`), whose path the handle knows. The run
directory must therefore be reachable from both sides: a local path when the head runs on this
machine, a `gs://` URI for a remote cluster.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tpu_ray import rundir, storage
from tpu_ray.config import RunConfig
from tpu_ray.errors import UserError, first_line
from tpu_ray.metrics_stream import load_metrics

if TYPE_CHECKING:
    import pandas as pd
    from ray.job_submission import JobSubmissionClient

log = logging.getLogger(__name__)

STAGES = ("pretrain", "prepare", "train")
# Never ship these with the job: virtualenvs and run outputs are huge, VCS data is useless there.
EXCLUDES = [".git", ".venv", "venv", "runs", "__pycache__", "*.egg-info", ".pytest_cache", ".ruff_cache"]
# Where submit() puts the job's config inside the working dir, only for the time of the upload.
STAGING_DIR = ".tpu-ray-submit"
RUN_DIR_KEY = "tpu_ray_run_dir"
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def _use_local_token() -> None:
    """Send this machine's Ray token if there is one. Ray 2.60 turns token auth on for every
    `ray start --head` once ~/.ray/auth_token exists (the first local `ray.init()` writes it), but
    its Jobs SDK sends the token only when RAY_AUTH_MODE=token. `ray.init()` itself, connecting to a
    cluster, switches the mode on when a token is available: do the same (an unset mode only)."""
    if os.environ.get("RAY_AUTH_MODE") is not None:
        return
    try:
        from ray._private.authentication import authentication_token_setup as auth
    except ImportError:  # another Ray version: the user sets RAY_AUTH_MODE themselves
        return
    quiet = logging.getLogger(auth.__name__)
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # its "enabled for this Ray cluster" warning is meant for heads
    try:
        auth.maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    finally:
        quiet.setLevel(level)


@contextmanager
def _jobs_api(address: str | None, what: str) -> Iterator[None]:
    """Ray's client errors (no server, no token, unknown job) as one-line UserErrors."""
    from ray.exceptions import AuthenticationError

    where = address or "the address in RAY_API_SERVER_ADDRESS / RAY_ADDRESS or a local head"
    try:
        yield
    except AuthenticationError:
        raise UserError(f"the Ray cluster at {where} requires its auth token: make it available "
                        f"(~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN) and set "
                        f"RAY_AUTH_MODE=token") from None
    except ConnectionError as exc:
        raise UserError(f"cannot reach the Ray Jobs API at {where} ({first_line(exc)}); start a head "
                        f"with `ray start --head` or pass the dashboard address, e.g. "
                        f"http://127.0.0.1:8265") from None
    except (RuntimeError, ValueError) as exc:
        raise UserError(f"{what}: {first_line(exc)}") from None


def _client(address: str | None) -> JobSubmissionClient:
    from ray.job_submission import JobSubmissionClient

    _use_local_token()
    with _jobs_api(address, "Ray Jobs API"), _address_wins_over_env(address):
        return JobSubmissionClient(address)


@contextmanager
def _address_wins_over_env(address: str | None) -> Iterator[None]:
    """Ray's Jobs client lets RAY_API_SERVER_ADDRESS or RAY_ADDRESS override the address it is given
    (ray.dashboard.utils.get_address_for_submission_client): `tpu-ray submit --address URL` with
    RAY_ADDRESS=local exported went looking for a local cluster instead. An address the user names
    wins: the two variables are hidden while the client resolves it (in its constructor only)."""
    hidden = {k: os.environ.pop(k) for k in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
              if address and k in os.environ}
    try:
        yield
    finally:
        os.environ.update(hidden)


def _resolve_run_dir(cfg: RunConfig, submission_id: str) -> str:
    """An absolute run dir: the job runs in a temporary copy of the working dir, so a relative
    path would land there (and vanish); unset means runs/<name>/<submission id> here."""
    if storage.is_remote(cfg.run_dir):
        return cfg.run_dir
    if cfg.output_dir is None:
        return os.path.abspath(os.path.join("runs", cfg.name, submission_id))
    return os.path.abspath(cfg.output_dir)


class JobHandle:
    """A submitted job: status, logs, wait, and the metrics its run directory holds so far."""

    def __init__(self, submission_id: str, address: str | None = None, run_dir: str | None = None):
        self.submission_id = submission_id
        self.address = address
        self._run_dir = run_dir
        self._client_obj: JobSubmissionClient | None = None

    def __repr__(self) -> str:
        return f"JobHandle({self.submission_id!r}, address={self.address!r}, run_dir={self._run_dir!r})"

    @property
    def _client(self) -> JobSubmissionClient:
        if self._client_obj is None:
            self._client_obj = _client(self.address)
        return self._client_obj

    def _info(self):
        with _jobs_api(self.address, f"job {self.submission_id!r}"):  # an unknown id is a 404
            return self._client.get_job_info(self.submission_id)

    @property
    def run_dir(self) -> str:
        """Where the job writes; recorded in the job's metadata, so a bare id is enough."""
        if self._run_dir is None:
            self._run_dir = (self._info().metadata or {}).get(RUN_DIR_KEY)
            if not self._run_dir:
                raise UserError(f"job {self.submission_id!r} was not submitted by tpu-ray "
                                f"(no {RUN_DIR_KEY} in its metadata)")
        return self._run_dir

    def status(self) -> str:
        """PENDING, RUNNING, STOPPED, SUCCEEDED or FAILED."""
        return str(self._info().status.value)

    def logs(self) -> str:
        """The job's whole log so far (the entrypoint's stdout and stderr)."""
        with _jobs_api(self.address, f"job {self.submission_id!r}"):
            return self._client.get_job_logs(self.submission_id)

    def wait(self, timeout: float | None = None, poll_s: float = 2.0, follow: bool = False) -> str:
        """Block until the job ends and return its terminal status; `follow` streams the log to
        stdout meanwhile. Raises TimeoutError after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if follow:
            self._follow(timeout)
        while True:
            status = self.status()
            if status in TERMINAL:
                return status
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {self.submission_id} still {status} after {timeout}s")
            time.sleep(poll_s)

    def _follow(self, timeout: float | None) -> None:
        """Echo the log as the job writes it, through the Jobs API's log stream (a websocket that
        ends with the job), rather than re-reading the whole log, which grows for days on a TPU.

        The stream runs on an event loop in a daemon thread (a notebook's own thread already runs
        a loop), and this thread only waits for it, so Ctrl-C and the timeout end the wait at once.
        A stream that cannot connect or drops is not an error: wait() then polls the job's status.
        """
        import asyncio
        import concurrent.futures
        import threading

        loop = asyncio.new_event_loop()

        async def tail() -> None:
            try:
                async for chunk in self._client.tail_job_logs(self.submission_id):
                    sys.stdout.write(chunk)
                    sys.stdout.flush()
            finally:  # also when cancelled: the stream's HTTP session has been closed by now
                loop.stop()

        def run_loop() -> None:
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        future = asyncio.run_coroutine_threadsafe(tail(), loop)
        threading.Thread(target=run_loop, name="tpu-ray-log-tail", daemon=True).start()
        try:
            future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"job {self.submission_id} still {self.status()} after {timeout}s") from None
        except concurrent.futures.CancelledError:
            pass
        except Exception as exc:  # any stream failure: fall back to polling
            log.warning("job %s: log stream ended early (%s); waiting for the job without it",
                        self.submission_id, first_line(exc))
        finally:
            future.cancel()  # a no-op once the stream has ended

    def stop(self) -> bool:
        """Ask Ray to stop the job; False if it had already ended."""
        with _jobs_api(self.address, f"job {self.submission_id!r}"):
            return self._client.stop_job(self.submission_id)

    def metrics(self, kind: str | None = None) -> pd.DataFrame:
        """`load_metrics(run_dir)`: what the job has logged so far, one row per record (none yet
        while the job is pending: an empty frame, not an error)."""
        return load_metrics(self.run_dir, kind=kind, missing_ok=True)


def submit(cfg: RunConfig, address: str | None = None, working_dir: str = ".", stage: str = "pretrain",
           resume: bool = False, submission_id: str | None = None,
           runtime_env: dict[str, Any] | None = None) -> JobHandle:
    """Submit `python jobs/<stage>.py --config <cfg>` as a Ray job and return its handle.

    `working_dir` is this repository (it holds jobs/); it is uploaded without .venv, .git and runs/.
    `runtime_env` entries are merged over ours (e.g. {"env_vars": {...}}).
    """
    if stage not in STAGES:
        raise UserError(f"stage {stage!r}: expected one of {', '.join(STAGES)}")
    entry = os.path.join(working_dir, "jobs", f"{stage}.py")
    if not os.path.isfile(entry):
        raise UserError(f"working_dir {working_dir!r} has no jobs/{stage}.py; pass the tpu-ray repository "
                        f"directory as working_dir")
    # A local path names this machine's disk, which a local cluster's job writes: refuse a file in
    # the way here, before the job is queued, not in the job's log.
    rundir.refuse_misplaced_files(cfg.output_dir, cfg.shard.dir, None)  # tokenizer.path: the cluster's
    submission_id = submission_id or f"tpu-ray-{cfg.name}-{uuid.uuid4().hex[:8]}"
    run_dir = _resolve_run_dir(cfg, submission_id)
    cfg = cfg.override({"output_dir": run_dir})
    client = _client(address)

    rel_config = f"{STAGING_DIR}/{submission_id}.yaml"
    staged = os.path.join(working_dir, rel_config)
    storage.makedirs(os.path.dirname(staged))
    storage.atomic_write_text(staged, cfg.to_yaml())
    entrypoint = f"python jobs/{stage}.py --config {shlex.quote(rel_config)}"
    entrypoint += " --resume" if resume else ""
    env = {"working_dir": working_dir, "excludes": list(EXCLUDES)} | (runtime_env or {})
    try:
        with _jobs_api(address, f"Ray refused job {submission_id}"):
            client.submit_job(entrypoint=entrypoint, submission_id=submission_id, runtime_env=env,
                              metadata={RUN_DIR_KEY: run_dir, "tpu_ray_stage": stage})
    finally:  # the upload is done (or failed) once submit_job returns: leave the working dir clean
        storage.remove(staged)
        try:
            os.rmdir(os.path.dirname(staged))
        except OSError:
            pass  # another submission is staging its config there
    handle = JobHandle(submission_id, address, run_dir)
    handle._client_obj = client
    return handle
