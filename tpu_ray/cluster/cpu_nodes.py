"""Keep CPU work (tokenizing/sharding actors) off TPU hosts.

Only one process per TPU host may own the TPU (libtpu's lock), and a TPU VM offers Ray its ~240
vCPUs, so without a constraint Ray happily packs sharding actors there, next to (or instead of) the
training client. Ray labels every TPU host `ray.io/accelerator-type=TPU-V4` (etc.), so a label
selector that excludes those values keeps actors on CPU nodes, and the autoscaler (which sees the
same labels declared in cluster.yaml) starts CPU workers for them rather than a TPU slice.
A cluster made only of TPU hosts (one TPU VM running its own Ray) has nowhere else to go: there
the actors run on the TPU host (they never import TensorFlow), and the log says so.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)
ACCELERATOR_LABEL = "ray.io/accelerator-type"


def tpu_accelerator_labels() -> list[str]:
    """Every TPU value Ray gives ray.io/accelerator-type (TPU-V2 ... TPU-V6E), from Ray's own constants."""
    import ray.util.accelerators as accelerators

    return sorted({v for v in vars(accelerators).values() if isinstance(v, str) and v.startswith("TPU-")})


def is_tpu_node(node: dict[str, Any]) -> bool:
    labels = node.get("Labels") or {}
    return labels.get(ACCELERATOR_LABEL, "").startswith("TPU-") or "ray.io/tpu-pod-type" in labels


def off_tpu_options(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """Ray actor options that keep an actor off TPU hosts; {} for a cluster of TPU hosts only."""
    alive = [n for n in nodes if n.get("Alive")]
    if alive and all(is_tpu_node(n) for n in alive):
        log.info("every node of this Ray cluster is a TPU host: CPU actors run there (they never import TF)")
        return {}
    return {"label_selector": {ACCELERATOR_LABEL: f"!in({','.join(tpu_accelerator_labels())})"}}


def cpu_outside_tpu_hosts(nodes: list[dict[str, Any]]) -> float:
    """CPUs of the alive nodes that are not TPU hosts (what off-TPU actors can use)."""
    return sum(n.get("Resources", {}).get("CPU", 0.0) for n in nodes if n.get("Alive") and not is_tpu_node(n))
