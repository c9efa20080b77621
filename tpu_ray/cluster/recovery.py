"""Automatic resume after losing the node (or TPU slice) that trains.

When the training task's node dies (a preempted spot TPU VM, a host failure), Ray reports a system
error for the task (`NodeDiedError`, `WorkerCrashedError`, ...), never the trainer's own exception.
Then, up to `train.max_failures` times: the metrics stream gets a `node_lost` event (the step of
the last committed checkpoint and the seconds of work since it), the slice or GPU node is reserved
again (waiting up to `train.resume_wait_minutes` for matching capacity: the same slice back or
another), and the task is submitted again with resume, so it continues from the last committed
checkpoint (the input position comes with it, see train/input_position.py); a `resumed_after_failure`
event records the wait and the step. Whether a failure is retried is `decide`, a pure function of
the failure's kind (errors.classify), the failures so far and the config: only lost capacity is
retried; bad input, a refusing environment, a damaged run directory, a superseded attempt and an
internal error would fail the same way again.

Why a loop in the driver rather than only Ray's own retries (`max_retries` on the task, which Ray
would re-run when the node dies): a lost TPU slice cannot come back under the same placement group,
because the group that holds every host is keyed by the slice's name, and a replacement slice has
another name (and another TPU_NAME for TensorFlow). So the reservation (placement groups, whose
`wait()` is Ray's way to wait for capacity) is made again per attempt, and the retried task must
switch to resume and report the failure in the metrics stream, which a blind task retry cannot.
The multi-worker path (Ray Train's TensorflowTrainer, multiworker.py) runs under this same loop:
one `fit()` per attempt, each in a launcher task's process of its own (never this driver's), a worker
whose node died is lost capacity, and every worker resumes from the chief's last committed checkpoint
(why not Ray Train's own FailureConfig: multiworker.py).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpu_ray import storage
from tpu_ray.config import TrainConfig
from tpu_ray.errors import Failure, FailureKind, classify
from tpu_ray.metrics_stream import MetricsWriter

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Decision:
    """What to do about a failed training attempt."""

    retry: bool
    wait_s: float | None  # how long the next attempt may wait for capacity (None: no next attempt)
    why: str


def decide(failure: Failure, failures_before: int, train: TrainConfig) -> Decision:
    """The recovery policy, pure: retry (resume from the last committed checkpoint, waiting up to
    train.resume_wait_minutes for capacity) only a failure whose kind a retry can help, at most
    train.max_failures times in one run."""
    if not failure.kind.retryable:
        return Decision(False, None, f"{failure.kind.label}: a retry would fail the same way")
    if failures_before >= train.max_failures:
        return Decision(False, None, f"{failure.kind.label} again after {failures_before} recoveries "
                                     f"(train.max_failures={train.max_failures})")
    return Decision(True, train.resume_wait_minutes * 60.0,
                    f"{failure.kind.label}: failure {failures_before + 1} of {train.max_failures}, resuming")


def is_node_loss(exc: BaseException) -> bool:
    """A failure that a new reservation can fix (kept for callers: `classify(exc)` says more)."""
    return classify(exc).kind is FailureKind.LOST_CAPACITY


def last_commit(run_dir: str) -> tuple[int | None, float | None]:
    """(step, time) of the run's last committed checkpoint, from TF's state file (None if none)."""
    state = storage.join(run_dir, "checkpoints", "checkpoint")
    try:
        if not storage.exists(state):
            return None, None
        match = re.search(r'^model_checkpoint_path:\s*"[^"]*ckpt-(\d+)"', storage.read_text(state), re.M)
        fs, path = storage.filesystem(state)
        modified = fs.modified(path).timestamp()
    except Exception as exc:  # the store is unreachable now: the event says so, the resume still tries
        log.warning("could not read %s: %s", state, exc)
        return None, None
    return (int(match.group(1)) if match else None), modified


def run_with_recovery(train: TrainConfig, run_dir: str, shared_filesystem: bool, resume: bool,
                      attempt: Callable[..., dict]) -> dict:
    """Call `attempt(resume, capacity_wait_s, on_reserved)` until it returns, resuming after each
    lost node.

    `attempt` reserves the capacity (waiting `capacity_wait_s` for it, its own default if None),
    calls `on_reserved({...where...})`, runs the training task and releases the capacity; it raises
    what `ray.get` raised. The loop itself reads only the train section's recovery policy and the run
    directory (its last commit, and the metrics stream it writes `node_lost` to: a file of its own
    when `shared_filesystem`, as every writer of a shared run directory).
    """
    failures = 0
    wait_s: float | None = None
    lost_at = 0.0
    metrics: MetricsWriter | None = None

    def on_reserved(where: dict[str, Any]) -> None:
        if failures and metrics is not None:
            record_resume(metrics, run_dir, failures, lost_at, where)

    try:
        while True:
            t0 = time.time()
            try:
                summary = attempt(resume, wait_s, on_reserved)
            except Exception as exc:
                failure = classify(exc)
                decision = decide(failure, failures, train)
                if not decision.retry:
                    if failures or failure.kind.retryable:
                        log.warning("not recovering: %s", decision.why)
                    raise
                failures += 1
                lost_at = time.time()
                metrics = metrics or MetricsWriter(run_dir, shared=shared_filesystem)
                step = record_failure(metrics, run_dir, train.max_failures, failure, failures, t0)
                log.warning("training capacity lost (%s, failure %d of %d); resuming from step %s when capacity "
                            "is back", failure.error, failures, train.max_failures, step)
                resume, wait_s = True, decision.wait_s
                continue
            if failures:
                summary["failures"] = failures
            return summary
    finally:
        if metrics is not None:
            metrics.close()


def record_failure(metrics: Any, run_dir: str, max_failures: int, failure: Failure, failures: int,
                   attempt_started: float) -> int | None:
    """The `node_lost` event (TPU/GPU path and multi-worker path alike); returns the step it resumes from."""
    step, committed = last_commit(run_dir)
    now = time.time()
    metrics.event("node_lost", stage="train", failure=failures, max_failures=max_failures,
                  error=failure.error, failure_kind=failure.kind.name.lower(), last_checkpoint_step=step,
                  lost_s=round(now - max(committed or attempt_started, attempt_started), 3))
    metrics.flush()
    return step


def record_resume(metrics: Any, run_dir: str, failures: int, lost_at: float, where: dict[str, Any]) -> None:
    """The `resumed_after_failure` event: the wait for capacity and the step resumed from."""
    step, _ = last_commit(run_dir)
    metrics.event("resumed_after_failure", stage="train", failure=failures,
                  waited_s=round(time.time() - lost_at, 3), step=step or 0, **where)
    metrics.flush()
