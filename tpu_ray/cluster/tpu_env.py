"""The environment the TensorFlow client needs on a TPU host, handed to the Ray training task.

Set through the task's `runtime_env` (never a login shell: Ray workers do not read ~/.bashrc), so
it is in place before TensorFlow is imported in the task:
- multi-host slice: one client addresses the whole slice by name (`TPU_NAME`) and must not load
  libtpu itself (`TPU_LOAD_LIBRARY=0`): the slice's hosts own their chips. Whatever names the slice.
- single host: TensorFlow's PJRT TPU client, as the TPU VM images' pjrt runtime expects it
  (`NEXT_PLUGGABLE_DEVICE_USE_C_API=true`, `TF_PLUGGABLE_DEVICE_LIBRARY_PATH=<libtpu.so>`).
- `TPU_ACCELERATOR_TYPE` from the Ray node label ray.io/tpu-pod-type, so MFU knows the generation.
"""

from __future__ import annotations

import importlib.util
import logging
import os

from tpu_ray.accelerators import tpu_runtime_version
from tpu_ray.errors import UserError

log = logging.getLogger(__name__)
IMAGE_LIBTPU = "/lib/libtpu.so"  # where the tpu-vm-tf-*-pjrt images put libtpu
PJRT_ENV = {"NEXT_PLUGGABLE_DEVICE_USE_C_API": "true", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": IMAGE_LIBTPU}
TPU_ENV_KEYS = ("TPU_NAME", "TPU_LOAD_LIBRARY", "TPU_ACCELERATOR_TYPE", *PJRT_ENV)


def client_env(tpu_name: str | None, multi_host: bool, slice_name: str, pod_type: str | None) -> dict[str, str]:
    """Environment variables for the TF client task on worker 0 of a reserved slice."""
    env: dict[str, str] = {}
    if multi_host:
        env.update(TPU_NAME=tpu_name or slice_name, TPU_LOAD_LIBRARY="0")
    else:
        if tpu_name:
            env["TPU_NAME"] = tpu_name
        env.update(PJRT_ENV)
    if pod_type:
        env["TPU_ACCELERATOR_TYPE"] = pod_type
    return env


def pip_libtpu() -> str | None:
    """libtpu.so of the `libtpu` wheel (a dependency of tensorflow-tpu), if installed."""
    spec = importlib.util.find_spec("libtpu")
    for where in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(where, "libtpu.so")
        if os.path.exists(path):
            return path
    return None


def settle_pjrt_library(strategy: str) -> None:
    """Before TensorFlow is imported: make TF_PLUGGABLE_DEVICE_LIBRARY_PATH name a libtpu that exists
    (TensorFlow loads it at import and fails on a missing file). The image's /lib/libtpu.so, else
    the pip wheel's; if neither, a TPU run stops here with the fix, a run placed on the slice but
    told to train on CPU (tests) drops the PJRT variables."""
    path = os.environ.get("TF_PLUGGABLE_DEVICE_LIBRARY_PATH")
    if not path or os.path.exists(path):
        return
    found = pip_libtpu()
    if found:
        os.environ["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] = found
        return
    if strategy in ("tpu", "auto"):
        raise UserError(f"TF_PLUGGABLE_DEVICE_LIBRARY_PATH={path}: no libtpu.so there and no libtpu package; "
                        f"boot the TPU VM with {tpu_runtime_version(False)} or install tpu-ray[tpu]")
    log.info("no libtpu on this host and train.strategy=%s: PJRT variables dropped", strategy)
    for key in PJRT_ENV:
        os.environ.pop(key, None)
