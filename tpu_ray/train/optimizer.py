"""The trainer's optimizer: AdamW (transformers' AdamWeightDecay) with warmup + linear decay.

Why not `transformers.create_optimizer`'s optimizer as is: at `weight_decay_rate=0` it returns
another class (the new-style Keras `Adam`), which has no `_create_all_weights`, other slot names in
checkpoints, and another update; issue 23 found `train.weight_decay=0` crashing at start. Here every
valid rate gives the same class; at rate 0 AdamWeightDecay decays nothing, so its update is Adam's.
"""

from __future__ import annotations

from typing import Any

from tpu_ray.config import TrainConfig

ADAM = {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-8}  # create_optimizer's defaults
NO_DECAY = ["LayerNorm", "layer_norm", "bias"]


def make_optimizer(t: TrainConfig, warmup: int) -> tuple[Any, Any]:
    """(optimizer, learning-rate schedule) for `t`: one optimizer class for any weight decay."""
    from transformers import AdamWeightDecay, create_optimizer

    optimizer, schedule = create_optimizer(init_lr=t.learning_rate, num_train_steps=t.steps,
                                           num_warmup_steps=warmup, weight_decay_rate=t.weight_decay)
    if not isinstance(optimizer, AdamWeightDecay):
        optimizer = AdamWeightDecay(learning_rate=schedule, weight_decay_rate=float(t.weight_decay),
                                    exclude_from_weight_decay=NO_DECAY, **ADAM)
    return optimizer, schedule
