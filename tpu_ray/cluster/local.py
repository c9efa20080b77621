"""A Ray cluster that tpu-ray starts for itself on this machine listens on loopback only.

Why: `ray.init()` without an address starts GCS, raylet and the agents listening on every
interface, so anyone on the network could submit work to a laptop's or workstation's cluster.
Ray binds its servers to the node's IP address, and it takes 127.0.0.1 as that address only when
multi-node clusters are switched off (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, ray_constants.py;
`_node_ip_address="127.0.0.1"` is rewritten to the routable address by
`services.resolve_ip_for_localhost`). A cluster we connect to (an address, RAY_ADDRESS, or one a
`ray start` left running) is left as it is. The same for `ray start`: see docs/jobs.md (the head listens on loopback only).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)
SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOOPBACK = "127.0.0.1"


def starts_local_cluster(address: str | None) -> bool:
    """Whether `ray.init(address=address)` would start a new cluster rather than connect."""
    try:
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:  # a Ray that moved it: assume we connect, and change nothing
        return False
    try:
        return canonicalize_bootstrap_address(address) is None
    except Exception:  # a malformed address: ray.init reports it in its own words
        return False


@contextmanager
def loopback_only(init_kwargs: dict) -> Iterator[dict]:
    """Around `ray.init(**kwargs)`: a cluster it starts binds to loopback (its dashboard too).
    The process's setting is restored afterwards, so that a later `ray.init` that connects to a
    real multi-node cluster from the same process is not affected."""
    if not starts_local_cluster(init_kwargs.get("address")):
        yield init_kwargs
        return
    try:
        from ray._private import ray_constants
    except ImportError:  # a Ray that moved it: keep Ray's default addresses
        log.debug("ray_constants not found: the local cluster keeps Ray's default addresses")
        yield init_kwargs
        return
    saved_env, saved_flag = os.environ.get(SINGLE_MACHINE_ENV), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[SINGLE_MACHINE_ENV] = "0"  # the processes ray.init starts inherit it
    ray_constants.ENABLE_RAY_CLUSTER = False  # read at call time; `import ray` may have come earlier
    try:
        yield {**init_kwargs, "dashboard_host": init_kwargs.get("dashboard_host", LOOPBACK)}
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(SINGLE_MACHINE_ENV, None)
        else:
            os.environ[SINGLE_MACHINE_ENV] = saved_env


def cluster_choice(address: str | None) -> str:
    """One line saying which Ray cluster `ray.init(address=address)` will use, and why, for a run's
    first lines. Why: by Ray's convention a run with no address joins any head already running on
    this machine (a `ray start` someone left), which silently shares its CPUs and its object store;
    the user must see that and know `ray.address=local` (always a fresh cluster of its own)."""
    if address and address.startswith("ray://"):
        return f"ray: joining the Ray cluster at {address} through Ray Client (ray.address)"
    env = os.environ.get("RAY_ADDRESS")
    if starts_local_cluster(address):
        why = "ray.address=local" if address == "local" else "RAY_ADDRESS=local" if env == "local" else \
            "no ray.address, no RAY_ADDRESS, no head running here"
        return (f"ray: starting a new local Ray cluster for this run ({why}); it listens on {LOOPBACK} only "
                f"and stops when this process ends")
    try:
        from ray._private.services import canonicalize_bootstrap_address

        found = canonicalize_bootstrap_address(address) or address
    except ConnectionError:  # auto (here or in RAY_ADDRESS) and no head running: the run refuses next
        field = "ray.address" if address else "RAY_ADDRESS"
        return f"ray: {field}=auto asks for a Ray cluster running on this machine; none is"
    except Exception:  # the connect itself reports a bad address in its own words
        found = address
    if address == "auto":
        return f"ray: joining the Ray cluster running on this machine at {found} (ray.address=auto)"
    if address:
        return f"ray: joining the Ray cluster at {found} (ray.address)"
    if env and env not in ("auto", "local"):
        return f"ray: joining the Ray cluster at {found} (RAY_ADDRESS)"
    return (f"ray: joining the Ray cluster already running on this machine at {found} (Ray's default when "
            f"no ray.address is set); set ray.address=local for a new cluster of this run's own")


def connected_line() -> str:
    """After `ray.init`: where the driver is connected and how many CPUs the cluster offers."""
    import ray

    try:
        where = ray.get_runtime_context().gcs_address
        cpus = int(ray.cluster_resources().get("CPU", 0))
    except Exception:  # Ray Client or a Ray that moved these: the line before said where
        return "ray: connected"
    return f"ray: connected to {where} ({cpus} CPUs)"
