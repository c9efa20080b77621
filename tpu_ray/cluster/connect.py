"""Connect to the Ray cluster a run uses, or start one: the pipeline's stages and fine-tuning both
begin here. A configured address with nothing listening fails in seconds with one line."""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from tpu_ray.cluster.local import connected_line, loopback_only
from tpu_ray.config import RayConfig
from tpu_ray.errors import UserError

log = logging.getLogger("tpu_ray.pipeline")  # the run's first lines, beside the pipeline's own


def check_ray_address(ray: RayConfig, timeout_s: float = 5.0) -> None:
    """Fail in seconds, not after Ray's ten-minute reconnect loop, when the configured Ray address
    (ray.address, else RAY_ADDRESS) has nothing listening: a TCP connect to its host:port."""
    address = ray.address or os.environ.get("RAY_ADDRESS")
    field = "ray.address" if ray.address else "RAY_ADDRESS"
    if address == "auto":  # any head running here; none: Ray's ConnectionError would end the run as a bug
        from ray._private.services import canonicalize_bootstrap_address

        try:
            canonicalize_bootstrap_address(ray.address)
        except ConnectionError:
            raise UserError(f"{field}=auto: no Ray cluster is running on this machine; start one (ray start "
                            f"--head), or set ray.address=local for a new cluster of this run's own") from None
        return
    if not address or address == "local":
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"{field}={address}: expected host:port (e.g. 127.0.0.1:6379) or ray://host:port")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UserError(f"{field}={address}: no Ray cluster answers there ({reason}); start one "
                        f"(ray start --head) or fix {field}") from None


def ensure_ray(section: RayConfig) -> None:
    """Connect to the cluster `ray.init()` finds (RAY_ADDRESS, a running local head) or start one;
    `section`: the run's ray section (its address and a local cluster's CPUs)."""
    import ray

    if not ray.is_initialized():
        check_ray_address(section)
        kwargs: dict[str, Any] = {"log_to_driver": True, "include_dashboard": False}
        if section.address:
            kwargs["address"] = section.address
        if section.num_cpus and section.address in (None, "local"):
            kwargs["num_cpus"] = section.num_cpus
        with loopback_only(kwargs) as kwargs:  # a cluster started here listens on 127.0.0.1 only
            ray.init(**kwargs)
        log.info(connected_line())
