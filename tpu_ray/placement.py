"""Where the training process runs on a Ray cluster, chosen by resources.

- local: in this process (a laptop, a CPU head, or a Ray job already running on the right host).
- tpu: a Ray task that takes the slice's head resource (`TPU-v4-16-head`, present on worker 0 of
  a slice only), so TensorFlow's single client runs on that host and nothing else lands on it.
- gpu: a Ray task that asks for `num_gpus`.
- workers > 1: MultiWorkerMirroredStrategy across Ray actors (see multiworker.py).
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from tpu_ray.config import RunConfig
from tpu_ray.errors import UserError

log = logging.getLogger(__name__)
_HEAD = re.compile(r"^TPU-(v[0-9][a-z]*-[0-9]+)-head$")


def tpu_head_resources(resources: dict[str, float]) -> list[str]:
    return sorted(k for k in resources if _HEAD.match(k))


def placement_for(cfg: RunConfig, cluster_resources: dict[str, float]) -> tuple[str, dict[str, Any]]:
    """(kind, Ray options) for the training task; options are empty for local."""
    t = cfg.train
    kind = t.placement
    heads = tpu_head_resources(cluster_resources)
    if kind == "auto":
        if t.tpu_topology or (heads and t.strategy in ("auto", "tpu")):
            kind = "tpu"
        elif t.num_gpus:
            kind = "gpu"
        else:
            kind = "local"
    if kind == "tpu":
        if t.tpu_topology:
            head = f"TPU-{t.tpu_topology}-head"
        elif len(heads) == 1:
            head = heads[0]
        else:
            raise UserError(f"train.placement=tpu: cluster has TPU head resources {heads or 'none'}; "
                            f"set train.tpu_topology (e.g. v4-8) to pick a slice, or run on CPU with "
                            f"train.placement=local")
        if head not in cluster_resources:
            raise UserError(f"train.tpu_topology={t.tpu_topology}: no node offers {head} in this Ray cluster "
                            f"(has {heads or 'no TPU slices'}); start the TPU nodes or use train.placement=local")
        env = {"TPU_NAME": t.tpu_name} if t.tpu_name else {}
        # num_cpus=0: the host's CPUs stay free for tf.data; the head resource reserves the slice client.
        return "tpu", {"resources": {head: 1}, "num_cpus": 0, "runtime_env": {"env_vars": env}}
    if kind == "gpu":
        n = t.num_gpus or 1
        if cluster_resources.get("GPU", 0) < n:
            raise UserError(f"train.num_gpus={n}: the Ray cluster has {cluster_resources.get('GPU', 0):g} GPUs; "
                            f"add GPU nodes or run on CPU with train.placement=local")
        return "gpu", {"num_gpus": n}
    return "local", {}


def _train_task(cfg_dict: dict, resume: bool) -> dict:
    """Body of the remote training task (runs on the chosen node)."""
    import ray

    from tpu_ray.cli import setup_logging
    from tpu_ray.train import train

    setup_logging()
    summary = train(RunConfig.from_dict(cfg_dict), resume=resume)
    summary["node_id"] = ray.get_runtime_context().get_node_id()
    summary["hostname"] = os.uname().nodename
    return summary


def run_training(cfg: RunConfig, resume: bool = False) -> dict:
    """Train where the config and the cluster say; returns the training summary."""
    if cfg.train.workers > 1:
        from tpu_ray.multiworker import train_multiworker

        return train_multiworker(cfg, resume=resume)
    if cfg.train.placement == "local" or (cfg.train.placement == "auto" and not _ray_up()):
        return _local(cfg, resume)
    import ray

    kind, options = placement_for(cfg, ray.cluster_resources())
    if kind == "local":
        return _local(cfg, resume)
    log.info("training placed on Ray: %s %s", kind, options)
    task = ray.remote(max_retries=0)(_train_task).options(**options)
    try:
        return ray.get(task.remote(cfg.model_dump(mode="json"), resume))
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, UserError):
            raise exc.cause from None
        raise


def _ray_up() -> bool:
    import ray

    return ray.is_initialized()


def _local(cfg: RunConfig, resume: bool) -> dict:
    from tpu_ray.train import train

    return train(cfg, resume=resume)
