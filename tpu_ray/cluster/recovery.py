"""Automatic resume after losing the node (or TPU slice) that trains.

When the training task's node dies (a preempted spot TPU VM, a host failure), Ray reports a system
error for the task (`NodeDiedError`, `WorkerCrashedError`, ...), never the trainer's own exception.
Then, up to `train.max_failures` times: the metrics stream gets a `node_lost` event (the step of
the last committed checkpoint and the seconds of work since it), the slice or GPU node is reserved
again (waiting up to `train.resume_wait_minutes` for matching capacity: the same slice back or
another), and the task is submitted again with resume, so it continues from the last committed
checkpoint (the input position comes with it, see train/input_position.py); a `resumed_after_failure`
event records the wait and the step. A `UserError` (or any exception raised by the trainer itself)
is never retried: it would fail the same way again.

Why a loop in the driver rather than only Ray's own retries (`max_retries` on the task, which Ray
would re-run when the node dies): a lost TPU slice cannot come back under the same placement group,
because the group that holds every host is keyed by the slice's name, and a replacement slice has
another name (and another TPU_NAME for TensorFlow). So the reservation (placement groups, whose
`wait()` is Ray's way to wait for capacity) is made again per attempt, and the retried task must
switch to resume and report the failure in the metrics stream, which a blind task retry cannot.
The multi-worker path (Ray Train) is not covered here.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

from tpu_ray import storage
from tpu_ray.config import RunConfig

log = logging.getLogger(__name__)


def is_node_loss(exc: BaseException) -> bool:
    """A Ray system failure of the task (its worker or node went away), not the trainer's own error."""
    import ray.exceptions as rex

    if isinstance(exc, rex.RayTaskError):  # the trainer raised: a bug or bad input, not a lost node
        return False
    return isinstance(exc, (rex.NodeDiedError, rex.WorkerCrashedError, rex.LocalRayletDiedError,
                            rex.ObjectLostError, rex.OwnerDiedError, rex.TaskUnschedulableError))


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


def run_with_recovery(cfg: RunConfig, resume: bool, attempt: Callable[..., dict]) -> dict:
    """Call `attempt(resume, capacity_wait_s, on_reserved)` until it returns, resuming after each
    lost node.

    `attempt` reserves the capacity (waiting `capacity_wait_s` for it, its own default if None),
    calls `on_reserved({...where...})`, runs the training task and releases the capacity; it raises
    what `ray.get` raised.
    """
    from tpu_ray.train.metrics import MetricsWriter

    failures = 0
    wait_s: float | None = None
    lost_at = 0.0
    metrics: MetricsWriter | None = None

    def on_reserved(where: dict[str, Any]) -> None:
        if failures and metrics is not None:
            step, _ = last_commit(cfg.run_dir)
            metrics.event("resumed_after_failure", stage="train", failure=failures,
                          waited_s=round(time.time() - lost_at, 3), step=step or 0, **where)
            metrics.flush()

    try:
        while True:
            t0 = time.time()
            try:
                summary = attempt(resume, wait_s, on_reserved)
            except Exception as exc:
                if not is_node_loss(exc) or failures >= cfg.train.max_failures:
                    raise
                failures += 1
                lost_at = time.time()
                step, committed = last_commit(cfg.run_dir)
                metrics = metrics or MetricsWriter(cfg.run_dir, tensorboard=False)
                metrics.event("node_lost", stage="train", failure=failures, max_failures=cfg.train.max_failures,
                              error=type(exc).__name__, last_checkpoint_step=step,
                              lost_s=round(lost_at - max(committed or t0, t0), 3))
                log.warning("training node lost (%s, failure %d of %d); resuming from step %s when capacity "
                            "is back", type(exc).__name__, failures, cfg.train.max_failures, step)
                resume, wait_s = True, cfg.train.resume_wait_minutes * 60.0
                continue
            if failures:
                summary["failures"] = failures
            return summary
    finally:
        if metrics is not None:
            metrics.close()
