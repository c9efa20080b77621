"""One TPU slice as the reservation made it: the single source of every slice fact.

Before this module the slice's name, host count and client environment were re-derived in several
modules (placement counted the hosts alive at reservation time, tpu_env and strategy preferred
`train.tpu_name` over the reserved slice's name, the trainer asked the environment or the VM
metadata for the pod type). Each could disagree with what Ray had actually reserved: TensorFlow
could dial another job's slice, or drive a v4-16 as a single host. Now the reservation produces
one `TpuSlice`; the TF client task receives it whole (the `TPU_RAY_SLICE` variable of its
runtime_env, next to the variables TensorFlow reads), and placement, strategy, recovery, metrics
and doctor read it; none derives a slice fact on its own.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from tpu_ray.accelerators import tpu_hosts

SLICE_ENV = "TPU_RAY_SLICE"  # the reserved slice, as JSON, in the TF client task's environment
IMAGE_LIBTPU = "/lib/libtpu.so"  # where the tpu-vm-tf-*-pjrt images put libtpu
LIBTPU_CHOICE_ENV = "TPU_RAY_LIBTPU"  # "image": the image's libtpu, not the wheel's (cluster/tpu_env.py)
# TensorFlow's PJRT TPU client (v5e, v5p and v6e have no other), as Google's keras-io TPU example
# sets it before TensorFlow is imported; settle_pjrt_library points the path at the libtpu wheel
# when the image has none.
PJRT_ENV = {"PJRT_DEVICE": "TPU", "NEXT_PLUGGABLE_DEVICE_USE_C_API": "true",
            "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": IMAGE_LIBTPU}
TPU_ENV_KEYS = ("TPU_NAME", "TPU_LOAD_LIBRARY", "TPU_ACCELERATOR_TYPE", *PJRT_ENV)


def expected_hosts(pod_type: str) -> int | None:
    """Hosts of a slice of `pod_type` ("v4-16" -> 2): known from the pod type, never from who is
    alive; None for a generation the accelerator table does not know yet."""
    try:
        return tpu_hosts(pod_type)
    except (ValueError, AttributeError, IndexError):
        return None


@dataclass(frozen=True)
class TpuSlice:
    """A reserved (or, for doctor, planned) TPU slice."""

    name: str  # Ray's ray.io/tpu-slice-name label; "" for a single host without Ray's TPU labels
    pod_type: str  # "v4-16": the label ray.io/tpu-pod-type, else the head resource's
    hosts: tuple[str, ...] = ()  # reserved Ray node ids, worker 0 first (empty: planned, not reserved)

    @property
    def expected_hosts(self) -> int:
        """From the pod type; a reservation of an unknown generation holds what it reserved."""
        return expected_hosts(self.pod_type) or max(len(self.hosts), 1)

    @property
    def multi_host(self) -> bool:
        """One client drives several hosts by the slice's name (decided by the pod type)."""
        return self.expected_hosts > 1

    @property
    def head_resource(self) -> str:
        return f"TPU-{self.pod_type}-head"

    @property
    def tf_name(self) -> str:
        """What TPUClusterResolver is given: the slice's name on a multi-host slice, else "local"."""
        return self.name if self.multi_host and self.name else "local"

    def client_env(self) -> dict[str, str]:
        """The TF client task's environment on worker 0 (set in its runtime_env, before TF loads).

        Multi-host: one client addresses the whole slice by its reserved name and must not load
        libtpu itself (the hosts own their chips). Single host: TensorFlow's PJRT TPU client, as the
        TPU VM images' pjrt runtime expects it.
        """
        env = {"TPU_NAME": self.name, "TPU_LOAD_LIBRARY": "0"} if self.multi_host else dict(PJRT_ENV)
        env["TPU_ACCELERATOR_TYPE"] = self.pod_type
        if os.environ.get(LIBTPU_CHOICE_ENV):  # the submitter's choice of libtpu reaches the client
            env[LIBTPU_CHOICE_ENV] = os.environ[LIBTPU_CHOICE_ENV]
        env[SLICE_ENV] = self.to_json()
        return env

    def event_fields(self) -> dict[str, object]:
        """What the metrics stream records about where training runs."""
        return {"slice": self.name, "pod_type": self.pod_type, "hosts": len(self.hosts),
                "node_id": self.hosts[0] if self.hosts else None}

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "hosts": list(self.hosts)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TpuSlice:
        data = json.loads(text)
        return cls(data["name"], data["pod_type"], tuple(data.get("hosts", ())))

    @classmethod
    def current(cls) -> TpuSlice | None:
        """The slice this process was placed on (the TF client task), or None outside a reservation."""
        text = os.environ.get(SLICE_ENV)
        return cls.from_json(text) if text else None
