"""The learning-rate and masking-rate curves as pure functions of the step.

One formula serves both sides: `xp` is numpy for the host (doctor, tests, docs) or TensorFlow's
numpy API inside the train step, so what doctor prints is what the step computes. The rate at
optimizer iteration `step` (0 for the first update) is

    learning_rate x warm(step) x (floor + (1 - floor) x shape(progress))

warm rises linearly over the warm-up (transformers' `WarmUp`, power 1), `floor` is
train.min_lr_ratio, and `progress` runs 0 -> 1 over the decay: from the warm-up's end to train.steps
(linear, cosine), never (constant), over the last decay steps (wsd). `linear` with floor 0 is
`transformers.create_optimizer`'s curve, today's default, value for value.
No branch on the step's value (clip, not `if`): the step stays a tensor under XLA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tpu_ray.config import TrainConfig


KINDS = ("linear", "cosine", "constant", "wsd")


@dataclass(frozen=True)
class Curve:
    """The numbers that define one run's learning-rate curve."""

    kind: str  # linear | cosine | constant | wsd
    steps: int
    warmup: int
    peak: float
    decay_start: int  # where progress starts (the warm-up's end, or steps - decay_steps for wsd)
    decay_steps: int  # how many steps progress takes to reach 1 (0: never decays)
    shape: str  # linear | 1-sqrt | cosine
    floor: float  # min_lr_ratio


def warmup_steps(t: TrainConfig) -> int:
    return t.warmup_steps if t.warmup_steps is not None else int(t.steps * t.warmup_ratio)


def decay_steps(t: TrainConfig) -> int:
    """wsd's decay length: train.decay_steps, else train.decay_fraction x train.steps (at least 1)."""
    return t.decay_steps if t.decay_steps is not None else max(1, round(t.steps * t.decay_fraction))


def curve(t: TrainConfig) -> Curve:
    warm = warmup_steps(t)
    if t.schedule == "wsd":
        d = decay_steps(t)
        return Curve("wsd", t.steps, warm, t.learning_rate, t.steps - d, d, t.decay_shape, t.min_lr_ratio)
    if t.schedule == "constant":
        return Curve("constant", t.steps, warm, t.learning_rate, t.steps, 0, "linear", t.min_lr_ratio)
    shape = "cosine" if t.schedule == "cosine" else "linear"
    return Curve(t.schedule, t.steps, warm, t.learning_rate, warm, t.steps - warm, shape, t.min_lr_ratio)


def rate(c: Curve, step: Any, xp: Any = np) -> Any:
    """The learning rate at optimizer iteration `step` (a number, array or float32 tensor)."""
    warm = xp.clip(step / c.warmup, 0.0, 1.0) if c.warmup > 0 else 1.0
    if c.decay_steps <= 0:
        return c.peak * warm
    p = xp.clip((step - c.decay_start) / c.decay_steps, 0.0, 1.0)
    if c.shape == "cosine":
        left = 0.5 * (1.0 + xp.cos(np.pi * p))
    elif c.shape == "1-sqrt":
        left = 1.0 - xp.sqrt(p)
    else:
        left = 1.0 - p
    return c.peak * warm * (c.floor + (1.0 - c.floor) * left)


def mask_rate(t: TrainConfig, step: Any, xp: Any = np, start: float | None = None) -> Any:
    """The masking rate at `step`: `start` (a phase's mask_prob; None: train.mask_prob), or linear
    from it to train.mask_prob_end at train.steps."""
    first = t.mask_prob if start is None else start
    if t.mask_schedule == "constant" or t.mask_prob_end is None:
        return first
    return first + (t.mask_prob_end - first) * xp.clip(step / t.steps, 0.0, 1.0)


def describe(t: TrainConfig) -> str:
    """One line: the curve's shape, as doctor and the resume check name it."""
    c = curve(t)
    floor = " to 0" if c.floor == 0 else f" to {c.floor:g} x the peak"
    what = {"linear": f"linear decay{floor}", "cosine": f"cosine decay{floor}", "constant": "constant",
            "wsd": f"constant to step {c.decay_start}, {c.shape} decay over {c.decay_steps} steps{floor}"}[c.kind]
    mask = "" if t.mask_schedule == "constant" else f"; masking {t.mask_prob:g} -> {t.mask_prob_end:g}"
    return f"{c.kind}: warm-up {c.warmup}, then {what}{mask}"


def warnings(c: Curve, decay_steps: int | None = None) -> list[str]:
    """What makes the curve `c` not do what its options suggest (each one line, with the fix);
    `decay_steps`: train.decay_steps as given (it does nothing outside wsd)."""
    out: list[str] = []
    if c.warmup >= c.steps:
        out.append(f"the warm-up ({c.warmup} steps) is not shorter than the run (train.steps={c.steps}): the "
                   f"learning rate never reaches train.learning_rate={c.peak:g} (it ends at "
                   f"{float(rate(c, c.steps - 1)):.3g}); lower train.warmup_steps, or set it with "
                   f"train.warmup_ratio")
    elif c.kind == "wsd" and c.decay_start < c.warmup:
        out.append(f"the decay (train.schedule=wsd, {c.decay_steps} steps from step {c.decay_start}) starts inside "
                   f"the warm-up ({c.warmup} steps): the rate never holds its peak; shorten the decay or the "
                   f"warm-up")
    if c.kind != "wsd" and decay_steps is not None:
        out.append(f"train.decay_steps={decay_steps} is used only by train.schedule=wsd (this run: "
                   f"{c.kind}); remove it or set train.schedule=wsd")
    return out
