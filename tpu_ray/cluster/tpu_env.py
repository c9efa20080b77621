"""The TF client's libtpu on a TPU host, settled before TensorFlow is imported.

The client's environment itself (TPU_NAME, TPU_LOAD_LIBRARY, the PJRT variables,
TPU_ACCELERATOR_TYPE) is the reserved slice's: `TpuSlice.client_env` (cluster/tpu_slice.py), set
through the task's `runtime_env` (never a login shell: Ray workers do not read ~/.bashrc).
"""

from __future__ import annotations

import importlib.util
import logging
import os

from tpu_ray.accelerators import tpu_runtime_version
from tpu_ray.cluster.tpu_slice import PJRT_ENV, TPU_ENV_KEYS  # noqa: F401 - TPU_ENV_KEYS re-exported
from tpu_ray.errors import RefusingEnvironment

log = logging.getLogger(__name__)


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
        raise RefusingEnvironment(f"TF_PLUGGABLE_DEVICE_LIBRARY_PATH={path}: no libtpu.so there and no libtpu package; "
                        f"boot the TPU VM with {tpu_runtime_version(False)} or install tpu-ray[tpu]")
    log.info("no libtpu on this host and train.strategy=%s: PJRT variables dropped", strategy)
    for key in PJRT_ENV:
        os.environ.pop(key, None)
