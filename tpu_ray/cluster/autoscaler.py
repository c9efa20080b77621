"""What Ray's autoscaler is doing, as a job on the cluster can ask it: for log lines and for errors.

A cluster started by `ray up` runs autoscaler v2 (the default since Ray 2.50), which reports its
state to the GCS: pending launches, instances being set up, and requests no node type can serve.
That is what `ray status` prints; here it is read through the same GCS call so that a job waiting
for a TPU slice can say "autoscaler launching 1 node (tpu_v4_8)" rather than just hang. Clusters
without an autoscaler v2 (a local `ray.init()`, a static `ray start` cluster) report nothing.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)
INFEASIBLE = "(infeasible)"  # how launch_summary() ends when no node type can serve the request


def cluster_autoscales() -> bool:
    """True when the connected cluster runs autoscaler v2 (so missing resources may still come)."""
    try:
        from ray.autoscaler.v2.utils import is_autoscaler_v2

        return bool(is_autoscaler_v2(fetch_from_server=True))
    except Exception as exc:  # no GCS KV (not connected) or an older Ray: behave as a static cluster
        log.debug("autoscaler state unavailable: %s", exc)
        return False


def _cluster_status_reply():
    import ray
    from ray._raylet import GcsClient
    from ray.core.generated.autoscaler_pb2 import GetClusterStatusReply

    reply = GetClusterStatusReply()
    reply.ParseFromString(GcsClient(address=ray.get_runtime_context().gcs_address).get_cluster_status(timeout_s=10))
    return reply


def launch_summary(resource: str) -> str:
    """One phrase on how the autoscaler is serving demands, e.g. "autoscaler launching 1 node (tpu_v4_8)".

    Counts launches requested and instances starting, by node type, as `ray status` lists them
    under "Pending"; says so when the autoscaler finds the request for `resource` infeasible.
    """
    try:
        state = _cluster_status_reply().autoscaling_state
    except Exception as exc:
        return f"autoscaler state unavailable ({type(exc).__name__})"
    if not state.autoscaler_state_version:
        return "no autoscaler reports to this cluster"
    infeasible = [r for g in state.infeasible_gang_resource_requests for r in g.requests] + list(
        state.infeasible_resource_requests)
    if any(resource in r.resources_bundle for r in infeasible):
        return f"the autoscaler has no node type that offers {resource} {INFEASIBLE}"
    by_type: dict[str, int] = {}
    for req in state.pending_instance_requests:
        by_type[req.ray_node_type_name] = by_type.get(req.ray_node_type_name, 0) + req.count
    for inst in state.pending_instances:
        by_type[inst.ray_node_type_name] = by_type.get(inst.ray_node_type_name, 0) + 1
    if not by_type:
        return "autoscaler not launching any node yet"
    n = sum(by_type.values())
    kinds = ", ".join(f"{k} x{v}" if v > 1 else k for k, v in sorted(by_type.items()))
    return f"autoscaler launching {n} node{'s' if n > 1 else ''} ({kinds})"
