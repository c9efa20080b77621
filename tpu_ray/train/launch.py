"""The training stage's entry: run the trainer where the config and the cluster say.

tpu_ray.cluster.placement decides where (this process, a GPU node, a reserved TPU slice, Ray Train
workers) and takes what to run there as an argument: `train_here`, which imports TensorFlow only
when called, so a remote task can settle the TPU runtime's environment first.
"""

from __future__ import annotations

from typing import Any

from tpu_ray.cluster.placement import run_training
from tpu_ray.cluster.tpu_env import settle_pjrt_library
from tpu_ray.config import RunConfig


def train_here(cfg: RunConfig, resume: bool) -> dict[str, Any]:
    """Train in this process (the remote task's, a Ray Train worker's or the driver's)."""
    settle_pjrt_library(cfg.train.strategy)  # the libtpu TensorFlow loads, on a TPU VM trained on directly
    from tpu_ray.train.loop import train  # TensorFlow: after the caller set the TPU environment

    return train(cfg, resume=resume)


def launch(cfg: RunConfig, resume: bool = False) -> dict[str, Any]:
    """Train where the config and the cluster say; returns the training summary."""
    return run_training(cfg, resume, train_here)
