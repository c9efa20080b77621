"""The learning-rate schedule in the train step, and its defining values, saved in every checkpoint
and checked on --resume.

The rate is `curves.rate` of the optimizer's iteration counter, inside the traced step (a pure
function of the step: no Python state, no retrace as it changes), so a resumed run continues the
same curve from the restored counter. A resumed run that changes the curve's values would silently
follow another curve from the resumed step on (the rate can jump, or decay to zero before the new
end). So the checkpoint carries the numbers (steps, warm-up, learning rate) and the curve's shape,
and --resume refuses a change, unless `train.extend_schedule=true` says it is meant: then the run
continues under the new schedule from the checkpoint's step (the way to extend a finished run).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import tensorflow as tf

from tpu_ray.config import RunConfig, TrainConfig
from tpu_ray.errors import UserError
from tpu_ray.train import curves

log = logging.getLogger(__name__)


def learning_rate(t: TrainConfig) -> Any:
    """The Keras LearningRateSchedule of `t`."""
    import tf_keras

    c = curves.curve(t)

    class LearningRate(tf_keras.optimizers.schedules.LearningRateSchedule):
        """`curves.rate` of the iteration counter, in float32 (what the optimizer applies)."""

        def __call__(self, step: Any) -> tf.Tensor:
            import tensorflow.experimental.numpy as tnp

            return tf.cast(curves.rate(c, tf.cast(step, tf.float32), tnp), tf.float32)

        def get_config(self) -> dict[str, Any]:
            return dataclasses.asdict(c)

    return LearningRate()


def warmup_steps(cfg: RunConfig) -> int:
    return curves.warmup_steps(cfg.train)


def values(cfg: RunConfig) -> list[float]:
    return curves.values(cfg.train)


def variable(cfg: RunConfig) -> tf.Variable:
    """The checkpointed copy of this run's schedule (float64: the learning rate stays exact)."""
    return tf.Variable(values(cfg), dtype=tf.float64, trainable=False, name="schedule")


# The curve's shape, checkpointed as numbers beside `values` (a float64 vector as `variable`: no string
# variable on an accelerator): curves.SHAPE_NAMES.
def shape_values(cfg: RunConfig) -> list[float]:
    return curves.shape_values(cfg.train)


def shape_variable(cfg: RunConfig) -> tf.Variable:
    """The checkpointed shape of this run's curve (shape_values), beside `variable`."""
    return tf.Variable(shape_values(cfg), dtype=tf.float64, trainable=False, name="schedule_shape")


def check_resume(saved: tf.Variable, where: str, cfg: RunConfig, shape: tf.Variable | None = None) -> None:
    """Refuse resuming the checkpoint at `where` under a different schedule (one line naming what
    changed). `saved` (and `shape`) are the schedule variables after the restore: read from the
    restored state, not from the file again, so a damaged or fallen-back checkpoint is reported by
    the restore itself. A checkpoint from before schedules (or their shapes) were saved leaves the
    variable at this run's values: nothing to compare."""
    changed = curves.changes([float(x) for x in saved.numpy()],
                             None if shape is None else [float(x) for x in shape.numpy()], cfg.train)
    if not changed:
        return
    if cfg.train.extend_schedule:
        log.warning("resuming under a new learning-rate schedule (train.extend_schedule): %s", ", ".join(changed))
        return
    from tpu_ray.resume import changed_schedule_line

    raise UserError(changed_schedule_line(where, changed))


def adopt(checkpoint: tf.train.Checkpoint, cfg: RunConfig) -> None:
    """Record this run's schedule in the restored checkpoint object (what its next save holds)."""
    checkpoint.schedule.assign(values(cfg))
    checkpoint.schedule_shape.assign(shape_values(cfg))

