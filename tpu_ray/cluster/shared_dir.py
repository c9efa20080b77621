"""Refuse a node-local directory when several Ray nodes must all see it.

Sharding actors and a training task placed on a TPU or GPU node run on other machines than the
driver: with a local path each writes to its own disk, and the run fails later (the manifest
names shards the next stage cannot find, checkpoints land on a host that is then lost). So the
check runs before any work starts, and says how to fix it in one line. A local path is accepted on
several nodes only when the user says it is one shared mount (`ray.shared_filesystem: true`,
e.g. NFS or Filestore mounted at the same path everywhere).
"""

from __future__ import annotations

from tpu_ray import storage
from tpu_ray.errors import UserError


def alive_nodes() -> int:
    """Alive nodes of the Ray cluster this process is connected to (1 if none)."""
    import ray

    if not ray.is_initialized():
        return 1
    return sum(1 for n in ray.nodes() if n.get("Alive"))


def require_shared(path: str, field: str, what: str, shared_filesystem: bool) -> None:
    """UserError if `path` is local, the cluster has several nodes and no shared mount was declared."""
    if storage.is_remote(path) or shared_filesystem:
        return
    nodes = alive_nodes()
    if nodes > 1:
        raise UserError(f"{field}={path!r}: {what} on a {nodes}-node Ray cluster needs a directory every node "
                        f"can read; use gs://..., or set ray.shared_filesystem=true if it is a mount every "
                        f"node shares")
