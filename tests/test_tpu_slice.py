"""The slice Ray reserves is the slice TensorFlow drives, on a real Ray cluster
whose nodes carry the resources and labels Ray 2.60 gives TPU VM hosts. Reservation only: no training."""

from __future__ import annotations

import time

import pytest



def _tpu_host(cluster, pod_type: str, slice_name: str, worker: int):
    """A Ray node shaped like a TPU VM host as Ray 2.60 detects it (no CPUs: only reserved, never run on)."""
    resources = {"TPU": 4, slice_name: 1, **({f"TPU-{pod_type}-head": 1} if worker == 0 else {})}
    return cluster.add_node(num_cpus=0, resources=resources, labels={
        "ray.io/tpu-slice-name": slice_name, "ray.io/tpu-worker-id": str(worker), "ray.io/tpu-pod-type": pod_type})


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
@pytest.mark.own_process  # a multi-node cluster of its own (tests/own_process.py)
def test_worker_1_joining_after_worker_0_is_reserved_and_tpu_name_picks_the_slice():
    """Two v4-16 slices' worker 0 are up; train.tpu_name=slice-b must reserve slice-b (not whichever
    head Ray picks). Worker 1 of slice-b joins only after worker 0's head resource is placed: the
    reservation still ends with both hosts (the pod type says 2) and the multi-host environment
    naming slice-b. Slice-c never gets its worker 1: the refusal names the missing worker id."""
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.placement_group import placement_group_table

    from tpu_ray.cluster.placement import reserve_tpu_slice
    from tpu_ray.errors import FailureKind, UserError

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster()
    try:
        cluster.add_node(num_cpus=1)
        slice_c = _tpu_host(cluster, "v4-16", "slice-c", 0)  # first: a bare pick could land here
        slice_b0 = _tpu_host(cluster, "v4-16", "slice-b", 0)
        ray.init(address=cluster.address, log_to_driver=False)
        outcome: dict = {}

        import threading

        def reserve() -> None:
            try:
                outcome["reservation"] = reserve_tpu_slice("TPU-v4-16-head", 300, tpu_name="slice-b")
            except BaseException as exc:  # reported by the assertions below
                outcome["error"] = exc

        thread = threading.Thread(target=reserve, daemon=True)  # never holds the worker open
        thread.start()

        def head_placed_on() -> set[str]:
            return {node for pg in placement_group_table().values() if pg["state"] == "CREATED"
                    for b, node in pg["bundles_to_node_id"].items() if "TPU-v4-16-head" in pg["bundles"][b]}

        deadline = time.monotonic() + 300
        while not head_placed_on() and thread.is_alive():
            assert time.monotonic() < deadline, placement_group_table()
            time.sleep(0.2)
        assert head_placed_on() == {slice_b0.node_id}, (head_placed_on(), outcome)
        assert "reservation" not in outcome  # still waiting for the host that is not there yet
        slice_b1 = _tpu_host(cluster, "v4-16", "slice-b", 1)
        thread.join(timeout=300)
        assert "error" not in outcome, outcome
        reservation = outcome["reservation"]
        reserved = reservation.slice
        assert reserved.name == "slice-b" and reserved.pod_type == "v4-16"
        assert reserved.hosts == (slice_b0.node_id, slice_b1.node_id)  # worker 0 first, both reserved
        env = reserved.client_env()
        assert (env["TPU_NAME"], env["TPU_LOAD_LIBRARY"]) == ("slice-b", "0")
        reservation.release()

        with pytest.raises(UserError) as refused:
            reserve_tpu_slice("TPU-v4-16-head", 5, tpu_name="slice-c")
        assert refused.value.kind is FailureKind.NO_CAPACITY
        line = str(refused.value)
        assert "TPU slice slice-c (v4-16, 2 hosts): worker id(s) 1 not in the Ray cluster" in line, line
        assert "\n" not in line
        assert slice_c.node_id  # its head was reserved and given back: nothing is left held
        assert all(pg["state"] == "REMOVED" for pg in placement_group_table().values())
    finally:
        ray.shutdown()
        cluster.shutdown()
