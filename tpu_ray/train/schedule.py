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
from typing import TYPE_CHECKING, Any

from tpu_ray.config import TrainConfig
from tpu_ray.errors import UserError
from tpu_ray.resume import latest_checkpoint
from tpu_ray.saved_config import read_saved_config
from tpu_ray.train import curves

if TYPE_CHECKING:
    import tensorflow as tf

log = logging.getLogger(__name__)


def learning_rate(t: TrainConfig) -> Any:
    """The Keras LearningRateSchedule of `t`."""
    import tensorflow as tf
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


def variable(t: TrainConfig) -> tf.Variable:
    """The checkpointed copy of this run's schedule (float64: the learning rate stays exact)."""
    import tensorflow as tf

    return tf.Variable(curves.values(t), dtype=tf.float64, trainable=False, name="schedule")


def shape_variable(t: TrainConfig) -> tf.Variable:
    """The checkpointed shape of this run's curve (curves.shape_values, named by curves.SHAPE_NAMES),
    beside `variable`: a float64 vector too, as an accelerator holds no string variable."""
    import tensorflow as tf

    return tf.Variable(curves.shape_values(t), dtype=tf.float64, trainable=False, name="schedule_shape")


def check_resume(saved: tf.Variable, where: str, t: TrainConfig, shape: tf.Variable | None = None) -> None:
    """Refuse resuming the checkpoint at `where` under a different schedule (one line naming what
    changed). `saved` (and `shape`) are the schedule variables after the restore: read from the
    restored state, not from the file again, so a damaged or fallen-back checkpoint is reported by
    the restore itself. A checkpoint from before schedules (or their shapes) were saved leaves the
    variable at this run's values: nothing to compare."""
    changed = curves.changes([float(x) for x in saved.numpy()],
                             None if shape is None else [float(x) for x in shape.numpy()], t)
    if not changed:
        return
    if t.extend_schedule:
        log.warning("resuming under a new learning-rate schedule (train.extend_schedule): %s", ", ".join(changed))
        return
    raise UserError(changed_schedule_line(where, changed))


def adopt(checkpoint: Any, t: TrainConfig) -> None:
    """Record this run's schedule in the restored checkpoint object (what its next save holds)."""
    checkpoint.schedule.assign(curves.values(t))
    checkpoint.schedule_shape.assign(curves.shape_values(t))


def changed_schedule_line(where: str, changed: list[str]) -> str:
    """The one line --resume under another schedule is refused with (train.extend_schedule is the hatch)."""
    return (f"--resume: {where} was trained with another schedule ({', '.join(changed)}); resume with the "
            f"original values, or set train.extend_schedule=true to continue under the new schedule from the "
            f"checkpoint's step")


def refuse_changed_schedule(run_dir: str, t: TrainConfig, resume: bool) -> None:
    """--resume under another schedule, refused from `run_dir`'s config.yaml before any stage or
    cluster starts (the trainer checks the checkpoint's own record again after the restore). Why
    before: train.steps is not in the fingerprint, so otherwise only a training attempt finds it.
    No TensorFlow is loaded for it (the pipeline's driver may never need TensorFlow)."""
    found = latest_checkpoint(run_dir) if resume and not t.extend_schedule else None
    saved = read_saved_config(run_dir) if found else None
    if saved is None:
        return
    changed = curves.changes(curves.values(saved.train), curves.shape_values(saved.train), t)
    if changed:
        raise UserError(changed_schedule_line(found[0], changed))
