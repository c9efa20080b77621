"""Why a TPU did not initialize, told apart from the exception and a look at the host.

`TPUClusterResolver` + `initialize_tpu_system` fail in a few distinct ways that need different fixes;
before this module every one of them read "no TPU reachable, run on CPU". Texts matched here are
TensorFlow's own (tensorflow/python/tpu/client/client.py, the TPU ops' NotFound) and libtpu's.
"""

from __future__ import annotations

import os
import re

from tpu_ray.accelerators import TPU_TENSORFLOW, tpu_runtime_version
from tpu_ray.errors import LostCapacity, RefusingEnvironment, UserError, first_line

LIBTPU_LOCKFILE = "/tmp/libtpu_lockfile"  # libtpu takes it; one process per host may own the TPU

# A client whose TensorFlow differs from the TPU runtime's: ops the other side does not know, or a
# libtpu built for another TensorFlow.
_MISMATCH = re.compile(r"Op type not registered|undefined symbol|version mismatch|incompatible|"
                       r"not compiled with|Unsupported (TPU|PJRT) (API|plugin) version", re.I)
_LOCKED = re.compile(r"already in use|libtpu_lockfile|Device or resource busy|TPU is already", re.I)
_NAME = re.compile(r"Could not lookup TPU metadata|Name or service not known|not yet ready|"
                   r"Please provide a TPU Name|nodename nor servname|Failed to resolve|"
                   r"Temporary failure in name resolution", re.I)


def classify_tpu_error(exc: BaseException, name: str, chips: int, lockfile: str = LIBTPU_LOCKFILE,
                       reserved: bool = False) -> UserError:
    """One line per cause, naming the fix, of the kind that says whether a retry can help. `name`
    is what the resolver was given ("local" or the slice name), `chips` the TPU chips this host has
    (strategy.local_tpu_chips), `reserved` whether Ray reserved that slice for this attempt: then a
    name that does not resolve means the slice went away (preempted) after the reservation, which a
    new reservation can fix (lost capacity), not a mistyped name (bad input)."""
    text = f"{type(exc).__name__}: {exc}"
    why = first_line(exc, 160)
    if _MISMATCH.search(text):
        return UserError(f"TPU {name!r}: TensorFlow client and TPU runtime differ ({why}); boot the TPU VMs with "
                         f"{tpu_runtime_version(name != 'local')} and install tpu-ray[tpu] (tensorflow-tpu=="
                         f"{TPU_TENSORFLOW}), then deploy/tpu-finish-install.sh, so both are TensorFlow "
                         f"{TPU_TENSORFLOW}")
    if _LOCKED.search(text) or (chips and name == "local" and os.path.exists(lockfile)):
        return RefusingEnvironment(f"TPU {name!r}: the TPU is held by another process ({why}); stop it (sudo lsof -w "
                         f"/dev/accel0 shows it; then rm {lockfile}), and keep other TF/JAX processes off TPU hosts")
    if name != "local" and _NAME.search(text) and reserved:
        return LostCapacity(f"TPU slice {name!r} (reserved by Ray) no longer resolves ({why}); it was probably "
                            f"preempted or deleted: a new reservation is made (train.max_failures)")
    if name != "local" and _NAME.search(text):
        return UserError(f"train.tpu_name / TPU_NAME={name!r}: this slice name does not resolve ({why}); use the "
                         f"name `gcloud compute tpus tpu-vm list` shows, from a VM in the slice's project and zone")
    if name == "local" and chips:
        return UserError(f"TPU 'local': this host has {chips} TPU chip(s) but TensorFlow found none ({why}); "
                         f"install tpu-ray[tpu] (tensorflow-tpu=={TPU_TENSORFLOW}, with libtpu), then "
                         f"deploy/tpu-finish-install.sh, on the {tpu_runtime_version(False)} image")
    return UserError(f"train.strategy=tpu: no TPU reachable as {name!r} ({why}); run on a TPU VM, or on CPU "
                     f"with train.strategy=cpu or auto")
