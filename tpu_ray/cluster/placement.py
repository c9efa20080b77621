"""Where the training process runs on a Ray cluster, chosen by resources.

- local: in this process (a laptop, a CPU head, or a Ray job already running on the right host).
- tpu: the whole slice is reserved with a placement group (see `reserve_tpu_slice`), and the
  training task runs in the bundle on the slice's worker 0, the host that holds the slice's head
  resource (`TPU-v4-16-head`). TensorFlow drives every host of a slice from that one client.
- gpu: a Ray task that asks for `num_gpus`.
- workers > 1: MultiWorkerMirroredStrategy across Ray Train workers (see multiworker.py).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpu_ray.cluster.multiworker import TrainFn, launch_multiworker
from tpu_ray.cluster.recovery import run_with_recovery
from tpu_ray.cluster.tpu_env import TPU_ENV_KEYS, settle_pjrt_library
from tpu_ray.cluster.tpu_slice import TpuSlice, expected_hosts
from tpu_ray.config import RunConfig, TrainConfig
from tpu_ray.errors import NoCapacity, UserError, find_user_error
from tpu_ray.cluster.autoscaler import INFEASIBLE, cluster_autoscales, launch_summary
from tpu_ray.logs import setup_logging

log = logging.getLogger(__name__)
_HEAD = re.compile(r"^TPU-(v[0-9][a-z]*-[0-9]+)-head$")
SLICE_LABEL = "ray.io/tpu-slice-name"
WORKER_LABEL = "ray.io/tpu-worker-id"
POD_TYPE_LABEL = "ray.io/tpu-pod-type"


def tpu_head_resources(resources: dict[str, float]) -> list[str]:
    return sorted(k for k in resources if _HEAD.match(k))


def placement_for(t: TrainConfig, cluster_resources: dict[str, float],
                  autoscaling: bool = False) -> tuple[str, dict[str, Any]]:
    """(kind, Ray options) for the training task; options are empty for local. Decided by the
    train section alone (placement, strategy, tpu_topology, num_gpus) and what the cluster offers.

    `autoscaling`: the cluster's autoscaler may still launch a TPU slice that is not up yet.
    """
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
        if head not in cluster_resources and not autoscaling:
            raise UserError(f"train.tpu_topology={t.tpu_topology}: no node offers {head} in this Ray cluster "
                            f"(has {heads or 'no TPU slices'}); start the TPU nodes or use train.placement=local")
        return "tpu", {"head_resource": head}
    if kind == "gpu":
        n = t.num_gpus or 1
        if cluster_resources.get("GPU", 0) < n:
            raise UserError(f"train.num_gpus={n}: the Ray cluster has {cluster_resources.get('GPU', 0):g} GPUs; "
                            f"add GPU nodes or run on CPU with train.placement=local")
        return "gpu", {"num_gpus": n}
    return "local", {}


@dataclass
class SliceReservation:
    """One whole TPU slice, held by two placement groups until `release()`; `slice` is what was reserved."""

    head_pg: Any  # the slice's head resource on worker 0: the TF client runs in its bundle
    hosts_pg: Any  # every host's TPUs, one bundle per worker id (None for an unlabeled single host)
    slice: TpuSlice

    def release(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for pg in (self.hosts_pg, self.head_pg):
            if pg is not None:
                remove_placement_group(pg)


def reserve_tpu_slice(head_resource: str, timeout_s: float = 600.0, tpu_name: str | None = None) -> SliceReservation:
    """Reserve one whole TPU slice: its worker 0 by the head resource, then every host of it.

    Why by hand rather than `ray.util.tpu.SlicePlacementGroup`: that class wants the physical
    topology ("2x2x2") and accelerator version, while a slice here is named by its pod type
    (`TPU-v4-16-head`); Ray's labels give the rest. The head resource is taken first and kept (so
    two jobs never pick the same slice); `tpu_name` (train.tpu_name) constrains it to the slice of
    that name (a label selector on ray.io/tpu-slice-name), so TensorFlow can only ever drive the
    slice Ray reserved. Then every host the pod type has (`expected_hosts`, not the hosts alive at
    this moment: worker 1 may join after worker 0) is reserved, one bundle per worker id
    (STRICT_SPREAD, label-selected, with the `<slice name>` resource Ray gives each host), waiting
    within the same timeout; a host that never comes is named in a one-line refusal.
    """
    import time

    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

    t0 = time.monotonic()
    selector = [{SLICE_LABEL: tpu_name}] if tpu_name else None
    head_pg = placement_group([{head_resource: 1}], bundle_label_selector=selector)
    wanted = f"{head_resource} on slice {tpu_name}" if tpu_name else head_resource
    waited = wait_for_placement(head_pg, head_resource, timeout_s)
    if waited is not None:
        remove_placement_group(head_pg)
        named = f"train.tpu_name={tpu_name}: " if tpu_name else ""
        if waited.endswith(INFEASIBLE):
            raise NoCapacity(f"{named}{head_resource}: no node type of this cluster's autoscaler offers it; set "
                             f"train.tpu_topology to a slice the cluster has, or add a node type with "
                             f"{head_resource} to cluster.yaml (docs/cluster.md)")
        raise NoCapacity(f"{named}train.tpu_wait_timeout_s={timeout_s:g}: no free {wanted} within {timeout_s:g}s "
                         f"({waited}); see `ray status` (TPU quota, the TPU node type, another job holding the "
                         f"slice), raise train.tpu_wait_timeout_s, or train on CPU with train.placement=local")
    head_node = placement_group_table(head_pg)["bundles_to_node_id"][0]
    nodes = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
    labels = nodes[head_node].get("Labels", {})
    slice_name = labels.get(SLICE_LABEL, "")
    pod_type = labels.get(POD_TYPE_LABEL) or _HEAD.match(head_resource).group(1)
    if not slice_name:  # a head resource without Ray's TPU labels: a single host, held by its head resource
        return SliceReservation(head_pg, None, TpuSlice("", pod_type, (head_node,)))
    expected = expected_hosts(pod_type)
    if expected is None:  # a generation tpu_ray/accelerators.py does not know: the hosts Ray labels now
        expected = sum(1 for n in nodes.values() if n.get("Labels", {}).get(SLICE_LABEL) == slice_name)
        log.warning("TPU pod type %s is not in tpu_ray/accelerators.py: reserving the %d host(s) of slice %s "
                    "that are in the Ray cluster now; add the generation to the table", pod_type, expected,
                    slice_name)
    tpus = nodes[head_node]["Resources"].get("TPU", 0)
    bundles = [{slice_name: 1, **({"TPU": tpus} if tpus else {})} for _ in range(expected)]
    hosts_pg = placement_group(bundles, strategy="STRICT_SPREAD", bundle_label_selector=[
        {SLICE_LABEL: slice_name, WORKER_LABEL: str(w)} for w in range(expected)])
    if not hosts_pg.wait(max(1.0, timeout_s - (time.monotonic() - t0))):
        remove_placement_group(hosts_pg)
        remove_placement_group(head_pg)
        raise NoCapacity(_missing_hosts_line(slice_name, pod_type, expected, timeout_s))
    placed = placement_group_table(hosts_pg)["bundles_to_node_id"]
    hosts = tuple(placed[w] for w in range(expected))  # bundle w is worker w: worker 0 first
    return SliceReservation(head_pg, hosts_pg, TpuSlice(slice_name, pod_type, hosts))


def _missing_hosts_line(slice_name: str, pod_type: str, expected: int, timeout_s: float) -> str:
    """One line naming the worker ids of the slice that are absent (or busy) in the Ray cluster."""
    import ray

    present = {int(n.get("Labels", {}).get(WORKER_LABEL, "-1")) for n in ray.nodes()
               if n.get("Alive") and n.get("Labels", {}).get(SLICE_LABEL) == slice_name}
    missing = [w for w in range(expected) if w not in present]
    if missing:
        return (f"TPU slice {slice_name} ({pod_type}, {expected} hosts): worker id(s) "
                f"{', '.join(map(str, missing))} not in the Ray cluster within train.tpu_wait_timeout_s="
                f"{timeout_s:g}; start every host of the slice (`ray status` lists the nodes), or raise "
                f"train.tpu_wait_timeout_s")
    return (f"TPU slice {slice_name} ({pod_type}): all {expected} hosts are in the Ray cluster but not all "
            f"could be reserved within train.tpu_wait_timeout_s={timeout_s:g} (another job holds their TPUs); "
            f"see `ray status`")


WAIT_LOG_EVERY_S = 30.0  # while a TPU slice is being launched (minutes on GCP): one line this often


def wait_for_placement(pg: Any, resource: str, timeout_s: float, log_every_s: float = WAIT_LOG_EVERY_S) -> str | None:
    """Wait up to `timeout_s` for `pg` (which asks for `resource`); None once it is placed.

    Not placed at once: logs what the autoscaler is doing about it right away, then every
    `log_every_s`: "waiting for TPU-v4-8-head: autoscaler launching 1 node (tpu_v4_8)". (The first
    line is certain whenever the slice was not there at the first look, whatever the timing.)
    On timeout returns the autoscaler's last state, for the caller's one-line error; returns it
    early when the autoscaler finds the request infeasible (no node type offers the resource).
    """
    import time

    t0 = time.monotonic()
    if pg.wait(0):
        return None
    next_log = 0.0
    while True:
        elapsed = time.monotonic() - t0
        if elapsed >= next_log:
            summary = launch_summary(resource)
            if summary.endswith(INFEASIBLE):
                return summary
            log.info("waiting for %s: %s (%.0fs of train.tpu_wait_timeout_s=%g)", resource, summary, elapsed,
                     timeout_s)
            next_log = elapsed + log_every_s
        if pg.wait(max(0.0, min(next_log, timeout_s) - elapsed)):
            log.info("%s: placed after %.0fs", resource, time.monotonic() - t0)
            return None
        if time.monotonic() - t0 >= timeout_s:
            return launch_summary(resource)


def _train_task(cfg_dict: dict, resume: bool, train: TrainFn) -> dict:
    """Body of the remote training task (runs on the chosen node)."""
    import ray

    cfg = RunConfig.from_dict(cfg_dict)
    seen = {k: os.environ[k] for k in TPU_ENV_KEYS if k in os.environ}  # as the task received it
    setup_logging()
    settle_pjrt_library(cfg.train.strategy)  # before TensorFlow is imported (by `train`, when called)
    summary = train(cfg, resume)
    summary["node_id"] = ray.get_runtime_context().get_node_id()
    summary["hostname"] = os.uname().nodename
    summary["tpu_env"] = seen
    return summary


def run_training(cfg: RunConfig, resume: bool, train: TrainFn) -> dict:
    """Run `train(cfg, resume)` where the config and the cluster say; returns the training summary.

    `train` is given (tpu_ray.train.launch passes the trainer's entry) rather than imported: this
    layer places work on the cluster and knows nothing of how a model trains. It must be an importable
    module-level function that imports TensorFlow only when called: the remote task receives it by
    reference and settles the TPU runtime's environment before calling it.
    """
    if cfg.train.workers > 1:
        def attempt(resume: bool, wait_s: float | None, on_reserved) -> dict:
            on_reserved({"placement": "multiworker", "workers": cfg.train.workers})
            return launch_multiworker(cfg, resume, train)  # Ray Train's fit() in a process of its own

        return run_with_recovery(cfg.train, cfg.run_dir, cfg.ray.shared_filesystem, resume, attempt)
    if cfg.train.placement == "local" or (cfg.train.placement == "auto" and not _ray_up()):
        return train(cfg, resume)
    import ray

    kind, options = placement_for(cfg.train, ray.cluster_resources(), autoscaling=cluster_autoscales())
    if kind == "local":
        return train(cfg, resume)
    from tpu_ray.cluster.shared_dir import require_shared

    require_shared(cfg.run_dir, "output_dir", f"training on a {kind.upper()} node", cfg.ray.shared_filesystem)
    cfg_dict = cfg.model_dump(mode="json")  # the whole run, as the remote task is handed it

    def attempt(resume: bool, wait_s: float | None, on_reserved) -> dict:
        def start(task_options: dict[str, Any]) -> Any:
            # max_retries=0: a lost node is handled by recovery.run_with_recovery (new reservation, resume).
            return ray.remote(max_retries=0)(_train_task).options(**task_options).remote(cfg_dict, resume, train)

        return _placed_attempt(cfg.train, kind, dict(options), wait_s, on_reserved, start)

    return run_with_recovery(cfg.train, cfg.run_dir, cfg.ray.shared_filesystem, resume, attempt)


def _placed_attempt(t: TrainConfig, kind: str, options: dict[str, Any], wait_s: float | None,
                    on_reserved, start: Callable[[dict[str, Any]], Any]) -> dict:
    """Reserve the slice (or ask for the GPUs), run the training task there once, release.
    `start(ray_options)` submits the training task (the whole run, built by `run_training`) and
    returns its ObjectRef; this attempt needs of the config only the slice's wait and name."""
    import ray

    reservation = None
    if kind == "tpu":
        head = options.pop("head_resource")
        # A recovery attempt waits as long as the recovery allows; a first attempt train.tpu_wait_timeout_s.
        reservation = reserve_tpu_slice(head, t.tpu_wait_timeout_s if wait_s is None else wait_s, t.tpu_name)
        options = _tpu_client_options(reservation.slice, reservation.head_pg)
        log.info("reserved TPU slice %s (%s): %d host(s)", reservation.slice.name or "(single host)",
                 reservation.slice.pod_type, len(reservation.slice.hosts))
        on_reserved(reservation.slice.event_fields())
    else:
        on_reserved({"placement": kind})  # the task itself waits for a GPU node (Ray queues it)
    log.info("training placed on Ray: %s %s", kind, options)
    try:
        summary = ray.get(start(options))
    except ray.exceptions.RayTaskError as exc:
        user_error = find_user_error(exc)
        if user_error is not None:
            raise user_error from None
        raise
    finally:
        if reservation is not None:
            reservation.release()
    if reservation is not None:
        summary["slice_nodes"] = list(reservation.slice.hosts)
    return summary


def _tpu_client_options(tpu_slice: TpuSlice, head_pg: Any) -> dict[str, Any]:
    """The TF client task: in bundle 0 (worker 0), with the reserved slice's environment."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {
        "num_cpus": 0,  # the host's CPUs stay free for tf.data
        "scheduling_strategy": PlacementGroupSchedulingStrategy(head_pg, placement_group_bundle_index=0),
        "runtime_env": {"env_vars": tpu_slice.client_env()},
    }


def _ray_up() -> bool:
    import ray

    return ray.is_initialized()
