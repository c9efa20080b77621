"""The TF client's libtpu on a TPU host, settled before TensorFlow is imported.

Which libtpu: TensorFlow loads the file TPU_LIBRARY_PATH names, else whatever `dlopen("libtpu.so")`
finds first, which on a TPU VM image is the image's `/lib/libtpu.so`, not the libtpu wheel that
tensorflow-tpu was built for and that the [tpu] extra installs (TPU_LIBTPU; Google's TensorFlow
example points TensorFlow at `libtpu.get_library_path()`). So `choose_libtpu` takes, in order: a
TPU_LIBRARY_PATH the user set; the image's when asked (TPU_RAY_LIBTPU=image, e.g. an image whose
libtpu Google patched for that TPU generation); the wheel's; the image's when no wheel is installed.
`settle_pjrt_library` sets TPU_LIBRARY_PATH (and the PJRT client's TF_PLUGGABLE_DEVICE_LIBRARY_PATH)
to it; `tpu-ray doctor` names it.

The client's environment itself (TPU_NAME, TPU_LOAD_LIBRARY, the PJRT variables,
TPU_ACCELERATOR_TYPE) is the reserved slice's: `TpuSlice.client_env` (cluster/tpu_slice.py), set
through the task's `runtime_env` (never a login shell: Ray workers do not read ~/.bashrc).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from tpu_ray.accelerators import TPU_LIBTPU, TPU_TENSORFLOW, local_tpu_chips, tpu_runtime_version
from tpu_ray.cluster.tpu_slice import (IMAGE_LIBTPU, LIBTPU_CHOICE_ENV, PJRT_ENV,  # noqa: F401 - re-exported
                                      TPU_ENV_KEYS)
from tpu_ray.errors import RefusingEnvironment, UserError

log = logging.getLogger(__name__)

LIBTPU_PATH_ENV = "TPU_LIBRARY_PATH"  # the file TensorFlow's TPU library loader opens


def pip_libtpu() -> str | None:
    """libtpu.so of the `libtpu` wheel (a dependency of tensorflow-tpu), if installed."""
    spec = importlib.util.find_spec("libtpu")
    for where in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(where, "libtpu.so")
        if os.path.exists(path):
            return path
    return None


def pip_libtpu_version() -> str | None:
    """The installed `libtpu` distribution's version (read from its metadata, never imported:
    importing libtpu sets TPU_LIBRARY_PATH itself)."""
    try:
        return importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Libtpu:
    """The libtpu TensorFlow would load in this process, and why that one."""

    path: str | None
    source: str  # "TPU_LIBRARY_PATH" (the user's), "wheel", "image", or "none"
    why: str

    def describe(self) -> str:
        return f"{self.path} ({self.why})" if self.path else f"none ({self.why})"


def choose_libtpu(environ: Mapping[str, str] | None = None, image: str = IMAGE_LIBTPU) -> Libtpu:
    """Which libtpu TensorFlow is to load here: the user's TPU_LIBRARY_PATH, else the image's when
    TPU_RAY_LIBTPU=image asks for it, else the libtpu wheel's, else the image's. A TPU_RAY_LIBTPU of
    another value is a UserError; asking for an image libtpu that is not there is refused."""
    env = os.environ if environ is None else environ
    user = env.get(LIBTPU_PATH_ENV, "").strip()
    if user:
        return Libtpu(user, LIBTPU_PATH_ENV, f"{LIBTPU_PATH_ENV} is set")
    asked = env.get(LIBTPU_CHOICE_ENV, "").strip()
    if asked not in ("", "wheel", "image"):
        raise UserError(f"{LIBTPU_CHOICE_ENV}={asked}: expected image (the TPU VM image's {image}) or wheel "
                        f"(the libtpu package's, the default)")
    built_for = f"tensorflow-tpu {TPU_TENSORFLOW} was built for libtpu {TPU_LIBTPU}"
    if asked == "image":
        if not os.path.exists(image):
            raise RefusingEnvironment(f"{LIBTPU_CHOICE_ENV}=image: no {image} on this host; unset it to load the "
                                      f"libtpu wheel's")
        return Libtpu(image, "image", f"the TPU VM image's, as {LIBTPU_CHOICE_ENV}=image asks; {built_for}")
    wheel, version = pip_libtpu(), pip_libtpu_version()
    if wheel:
        fit = "the one tensorflow-tpu was built for" if version == TPU_LIBTPU else built_for
        also = f"; not the image's {image} ({LIBTPU_CHOICE_ENV}=image loads that)" if os.path.exists(image) else ""
        return Libtpu(wheel, "wheel", f"the libtpu {version} wheel, {fit}{also}")
    if os.path.exists(image):
        return Libtpu(image, "image", f"the TPU VM image's: no libtpu wheel installed; {built_for}")
    return Libtpu(None, "none", f"no libtpu wheel and no {image}")


def tpu_context(strategy: str) -> bool:
    """Whether this process is (or may be) a TPU client: told to use a TPU, placed on a slice (the
    client's TPU variables), or on a host with TPU chips."""
    if strategy == "tpu" or any(os.environ.get(k) for k in ("TPU_ACCELERATOR_TYPE", "TPU_NAME", *PJRT_ENV)):
        return True
    return strategy == "auto" and local_tpu_chips() > 0


def settle_pjrt_library(strategy: str) -> None:
    """Before TensorFlow is imported: point TensorFlow at the libtpu `choose_libtpu` picks, through
    TPU_LIBRARY_PATH (TensorFlow's TPU library loader) and, for the PJRT client, through
    TF_PLUGGABLE_DEVICE_LIBRARY_PATH (TensorFlow loads it at import and fails on a missing file). If
    there is none, a TPU run stops here with the fix; a run placed on the slice but told to train on
    CPU (tests) drops the PJRT variables."""
    if not tpu_context(strategy):  # a GPU or CPU run never loads libtpu, not even one installed here
        return
    choice = choose_libtpu()
    if choice.path:
        os.environ[LIBTPU_PATH_ENV] = choice.path
        if "TF_PLUGGABLE_DEVICE_LIBRARY_PATH" in os.environ:
            os.environ["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] = choice.path
        log.info("libtpu: %s", choice.describe())
        return
    path = os.environ.get("TF_PLUGGABLE_DEVICE_LIBRARY_PATH")
    if not path or os.path.exists(path):
        return
    if strategy in ("tpu", "auto"):
        raise RefusingEnvironment(f"TF_PLUGGABLE_DEVICE_LIBRARY_PATH={path}: no libtpu.so there and no libtpu package; "
                        f"boot the TPU VM with {tpu_runtime_version(False)} or install tpu-ray[tpu]")
    log.info("no libtpu on this host and train.strategy=%s: PJRT variables dropped", strategy)
    for key in PJRT_ENV:
        os.environ.pop(key, None)
