"""The learning-rate schedule's defining values, saved in every checkpoint and checked on --resume.

`transformers.create_optimizer` builds warmup + linear decay from (steps, warmup, learning rate); a
resumed run that changes any of them silently follows another curve from the resumed step on (the
rate can jump, or decay to zero before the new end). So the checkpoint carries the three values and
--resume refuses a change, unless `train.extend_schedule=true` says it is meant: then the run
continues under the new schedule from the checkpoint's step (the way to extend a finished run).
"""

from __future__ import annotations

import logging

import tensorflow as tf

from tpu_ray.config import RunConfig
from tpu_ray.errors import UserError

log = logging.getLogger(__name__)
NAMES = ("train.steps", "warmup steps", "train.learning_rate")


def warmup_steps(cfg: RunConfig) -> int:
    t = cfg.train
    return t.warmup_steps if t.warmup_steps is not None else int(t.steps * t.warmup_ratio)


def values(cfg: RunConfig) -> list[float]:
    return [float(cfg.train.steps), float(warmup_steps(cfg)), float(cfg.train.learning_rate)]


def variable(cfg: RunConfig) -> tf.Variable:
    """The checkpointed copy of this run's schedule (float64: the learning rate stays exact)."""
    return tf.Variable(values(cfg), dtype=tf.float64, trainable=False, name="schedule")


def check_resume(saved: tf.Variable, where: str, cfg: RunConfig) -> None:
    """Refuse resuming the checkpoint at `where` under a different schedule (one line naming what
    changed). `saved` is the schedule variable after the restore: read from the restored state, not
    from the file again, so a damaged or fallen-back checkpoint is reported by the restore itself. A
    checkpoint from before schedules were saved leaves the variable at this run's values: nothing to compare."""
    changed = [f"{n} {_fmt(a)} -> {_fmt(b)}" for n, a, b in zip(NAMES, [float(x) for x in saved.numpy()], values(cfg))
               if a != b]
    if not changed:
        return
    if cfg.train.extend_schedule:
        log.warning("resuming under a new learning-rate schedule (train.extend_schedule): %s", ", ".join(changed))
        return
    raise UserError(f"--resume: {where} was trained with another schedule ({', '.join(changed)}); "
                    f"resume with the original values, or set train.extend_schedule=true to continue under the "
                    f"new schedule from the checkpoint's step")


def _fmt(x: float) -> str:
    return f"{x:g}" if x != int(x) else str(int(x))
