"""The trainer's optimizer: AdamW (transformers' AdamWeightDecay) under the run's learning-rate
schedule (train/schedule.py: linear, cosine, constant or wsd after a linear warm-up).

Why not `transformers.create_optimizer`'s optimizer as is: at `weight_decay_rate=0` it returns
another class (the new-style Keras `Adam`), which has no `_create_all_weights`, other slot names in
checkpoints, and another update: `train.weight_decay=0` would crash at start. Here every
valid rate gives the same class; at rate 0 AdamWeightDecay decays nothing, so its update is Adam's.
"""

from __future__ import annotations

import logging
from typing import Any

from tpu_ray.train.schedule import Schedule, learning_rate

log = logging.getLogger("tpu_ray.train.loop")  # the trainer's log lines keep the trainer's name
ADAM = {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-8}  # create_optimizer's defaults
NO_DECAY = ["LayerNorm", "layer_norm", "bias"]


def make_optimizer(sch: Schedule, weight_decay: float) -> tuple[Any, Any]:
    """(optimizer, learning-rate schedule) for the run's schedule `sch` (schedule.from_train) and train.weight_decay:
    one optimizer class for any weight decay (create_optimizer's AdamWeightDecay with its arguments), the rate
    a pure function of the step. A schedule that will not do what its options suggest (a warm-up as long as
    the run) is logged here, at every start."""
    from transformers import AdamWeightDecay

    for line in sch.warnings:
        log.warning("learning-rate schedule: %s", line)
    schedule = learning_rate(sch.curve)
    optimizer = AdamWeightDecay(learning_rate=schedule, weight_decay_rate=float(weight_decay),
                                exclude_from_weight_decay=NO_DECAY, **ADAM)
    return optimizer, schedule
