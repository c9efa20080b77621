"""The learning-rate schedule in the train step, and its defining values, saved in every checkpoint
and checked on --resume.

The rate is `curves.rate` of the optimizer's iteration counter, inside the traced step (a pure
function of the step: no Python state, no retrace as it changes), so a resumed run continues the
same curve from the restored counter. A resumed run that changes the curve's values would silently
follow another curve from the resumed step on (the rate can jump, or decay to zero before the new
end). So the checkpoint carries the numbers (steps, warm-up, learning rate) and the curve's shape,
and --resume refuses a change, unless `train.extend_schedule=true` says it is meant: then the run
continues under the new schedule from the checkpoint's step (the way to extend a finished run).

`Schedule` is all of this a trainer reads of the train section, resolved once (`of`) when the
optimizer is built (`from_train`): the curve, its checkpoint record and the hatch; the rest takes it, not the section.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpu_ray.config import TrainConfig
from tpu_ray.errors import UserError
from tpu_ray.resume import latest_checkpoint
from tpu_ray.saved_config import read_saved_config
from tpu_ray.train import curves

if TYPE_CHECKING:
    import tensorflow as tf

log = logging.getLogger(__name__)


# The numbers a checkpoint records of its curve (as two float64 variables, `variables`): `values` beside
# `shape_values`, named by NAMES and SHAPE_NAMES; the coded shape fields by _CODES.
NAMES = ("train.steps", "warmup steps", "train.learning_rate")
SHAPE_NAMES = ("train.schedule", "train.decay_steps", "train.decay_fraction", "train.decay_shape",
               "train.min_lr_ratio", "train.mask_schedule", "train.mask_prob_end")
_CODES = {0: curves.KINDS, 3: ("linear", "1-sqrt"), 5: ("constant", "linear")}


def values(c: curves.Curve) -> list[float]:
    """train.steps, the warm-up's steps and the peak rate: the curve's own numbers."""
    return [float(c.steps), float(c.warmup), float(c.peak)]


def shape_values(t: TrainConfig) -> list[float]:
    """The options beyond `values` that shape the curves (the decay's only under wsd; 0 where unset): the
    options as given, not the curve (a decay_fraction and the decay_steps it comes to differ in the record)."""
    wsd = t.schedule == "wsd"
    return [float(curves.KINDS.index(t.schedule)), float(t.decay_steps or 0) if wsd else 0.0,
            float(t.decay_fraction) if wsd and t.decay_steps is None else 0.0,
            float(("linear", "1-sqrt").index(t.decay_shape)) if wsd else 0.0, float(t.min_lr_ratio),
            float(t.mask_schedule == "linear"), float(t.mask_prob_end or 0.0)]


def changes(saved: list[float], saved_shape: list[float] | None, now: list[float], now_shape: list[float]) -> list[str]:
    """`name old -> new` for each recorded number of the curve that this run (`now`: `values`,
    `now_shape`: `shape_values`) changes (what --resume refuses without train.extend_schedule); read
    from a checkpoint or from the saved config alike."""
    out = [f"{n} {_fmt(a)} -> {_fmt(b)}" for n, a, b in zip(NAMES, saved, now) if a != b]
    if saved_shape is not None:
        out += [f"{n} {_named(i, a)} -> {_named(i, b)}" for i, (n, a, b) in
                enumerate(zip(SHAPE_NAMES, saved_shape, now_shape)) if a != b]
    return out


def _named(i: int, x: float) -> str:
    codes = _CODES.get(i)
    return codes[int(x)] if codes and 0 <= int(x) < len(codes) else _fmt(x)


def _fmt(x: float) -> str:
    return f"{x:g}" if x != int(x) else str(int(x))


@dataclass(frozen=True)
class Schedule:
    """One run's learning-rate schedule as the trainer builds, checkpoints and checks it."""

    curve: curves.Curve
    shape: tuple[float, ...]  # shape_values: the options beyond the curve's numbers, as recorded
    extend: bool  # train.extend_schedule: --resume may change the curve
    warnings: tuple[str, ...]  # curves.warnings: logged at every start

    def values(self) -> list[float]:
        """What the `schedule` variable records (NAMES)."""
        return values(self.curve)


def from_train(t: TrainConfig) -> Schedule:
    """The train section's schedule, resolved once: its record, its curve and what the curve warns of."""
    shape = tuple(shape_values(t))
    c = curves.curve(t)
    return Schedule(c, shape, t.extend_schedule, tuple(curves.warnings(c, t.decay_steps)))


def learning_rate(c: curves.Curve) -> Any:
    """The Keras LearningRateSchedule of the curve `c`."""
    import tensorflow as tf
    import tf_keras

    class LearningRate(tf_keras.optimizers.schedules.LearningRateSchedule):
        """`curves.rate` of the iteration counter, in float32 (what the optimizer applies)."""

        def __call__(self, step: Any) -> tf.Tensor:
            import tensorflow.experimental.numpy as tnp

            return tf.cast(curves.rate(c, tf.cast(step, tf.float32), tnp), tf.float32)

        def get_config(self) -> dict[str, Any]:
            return dataclasses.asdict(c)

    return LearningRate()


def variables(sch: Schedule) -> dict[str, tf.Variable]:
    """The checkpoint's copy of this run's schedule, by their names in tf.train.Checkpoint: `schedule`
    (`values`) and `schedule_shape` (`shape_values`, named by SHAPE_NAMES), float64
    vectors (the learning rate stays exact; an accelerator holds no string variable)."""
    import tensorflow as tf

    return {"schedule": tf.Variable(sch.values(), dtype=tf.float64, trainable=False, name="schedule"),
            "schedule_shape": tf.Variable(list(sch.shape), dtype=tf.float64, trainable=False, name="schedule_shape")}


def _refuse_changed(saved: tf.Variable, where: str, sch: Schedule, shape: tf.Variable | None = None) -> None:
    """Refuse resuming the checkpoint at `where` under a different schedule (one line naming what
    changed). `saved` (and `shape`) are the schedule variables after the restore: read from the
    restored state, not from the file again, so a damaged or fallen-back checkpoint is reported by
    the restore itself. A checkpoint from before schedules (or their shapes) were saved leaves the
    variable at this run's values: nothing to compare."""
    changed = changes([float(x) for x in saved.numpy()], None if shape is None else [float(x) for x in shape.numpy()],
                      sch.values(), list(sch.shape))
    if not changed:
        return
    if sch.extend:
        log.warning("resuming under a new learning-rate schedule (train.extend_schedule): %s", ", ".join(changed))
        return
    raise UserError(changed_schedule_line(where, changed))


def resume(checkpoint: Any, where: str, sch: Schedule) -> None:
    """After --resume restored `checkpoint` (from `where`): refuse its schedule changed (_refuse_changed),
    then record this run's in it (what the next checkpoint holds)."""
    _refuse_changed(checkpoint.schedule, where, sch, checkpoint.schedule_shape)
    adopt(checkpoint, sch)


def adopt(checkpoint: Any, sch: Schedule) -> None:
    """Record this run's schedule in the restored checkpoint object (what its next save holds)."""
    checkpoint.schedule.assign(sch.values())
    checkpoint.schedule_shape.assign(list(sch.shape))


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
    changed = changes(values(curves.curve(saved.train)), shape_values(saved.train), values(curves.curve(t)),
                      shape_values(t))
    if changed:
        raise UserError(changed_schedule_line(found[0], changed))
