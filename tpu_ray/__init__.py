"""tpu-ray: pretrain Hugging Face masked LMs with TensorFlow on TPU slices, orchestrated by Ray.

    from tpu_ray import RunConfig, Pipeline, submit, load_metrics, compare

Imports are lazy so that `import tpu_ray` in a sharding worker never pulls in TensorFlow.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = [
    "JobHandle",
    "Pipeline",
    "RunConfig",
    "RunResult",
    "ShardSet",
    "UserError",
    "compare",
    "finetune",
    "load_metrics",
    "submit",
    "write_report",
]

_WHERE = {
    "RunConfig": "tpu_ray.config",
    "Pipeline": "tpu_ray.pipeline",
    "RunResult": "tpu_ray.pipeline",
    "submit": "tpu_ray.cluster.jobs",
    "JobHandle": "tpu_ray.cluster.jobs",
    "compare": "tpu_ray.comparison",
    "finetune": "tpu_ray.downstream.run",
    "load_metrics": "tpu_ray.report",
    "write_report": "tpu_ray.report",
    "UserError": "tpu_ray.errors",
    "ShardSet": "tpu_ray.prepare.shard_set",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'tpu_ray' has no attribute {name!r}")
