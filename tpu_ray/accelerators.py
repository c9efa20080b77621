"""What the code knows about accelerators, in one table: names, peak FLOP/s, HBM, replicas per host.

Used by the trainer (MFU), the strategy (which TPU generation this is) and `doctor` (targets,
memory, capacity plan), so that a new generation is one line here. Also the one TensorFlow version
for TPUs: the TPU VM runtime image and the `tensorflow-tpu` wheel must be the same TensorFlow
(on a pod slice the hosts' TF servers and the client talk one protocol), so both are derived from
`TPU_TENSORFLOW`; tests/test_tpu_versions.py checks that cluster.yaml, docs/cluster.md, the `tpu`
extra and the job configs agree with it.
"""

from __future__ import annotations

import glob
import logging
import os
import urllib.request
from dataclasses import dataclass

log = logging.getLogger(__name__)

# Why 2.19.1 (decided 2026-11, from these sources):
# - PyPI's tensorflow-tpu goes 2.16.1 .. 2.20.0. 2.19.1 (August 2025) is the newest whose wheel pins
#   its libtpu exactly (`Requires-Dist: libtpu ==0.0.10`, read with `pip install --dry-run --report`).
#   2.20.0 asks for `libtpu~=0.0.14`, which pip resolves to the newest JAX-line libtpu (0.0.52 today),
#   not the one TensorFlow was built against; Kaggle stopped preinstalling tensorflow-tpu when a newer
#   libtpu hid the TPUs from TensorFlow (Kaggle/docker-python#1499).
# - Google's newest TensorFlow-on-TPU example (keras-io examples/keras_rs/distributed_embedding_tf.py,
#   v5p and v6e) installs tensorflow-tpu==2.19.1 and sets PJRT_DEVICE=TPU,
#   NEXT_PLUGGABLE_DEVICE_USE_C_API=true and TF_PLUGGABLE_DEVICE_LIBRARY_PATH=libtpu.get_library_path()
#   before importing TensorFlow (cluster/tpu_slice.PJRT_ENV, cluster/tpu_env.settle_pjrt_library).
# - Google's "TPU software versions" page: v5e, v5p and v6e run TensorFlow >= 2.15 with PJRT on the
#   runtime `tpu-vm-tf-x.y.z[-pod]-pjrt` (`-pod` on a multi-host slice); a field report
#   (Prz00124/tpu-vm-examples-2025) saw v6e fail under 2.16.1 and 2.18.0 images.
# The wheel is what TensorFlow is imported from: deploy/install-tpu.sh installs it with its libtpu
# and tf-keras without tf-keras's `tensorflow` requirement (docs/accelerators.md, "One TensorFlow").
# To move: change these lines and run tests/test_tpu_versions.py and tests/tpu_set/run.sh.
TPU_TENSORFLOW = "2.19.1"
TPU_LIBTPU = "0.0.10"  # what tensorflow-tpu==TPU_TENSORFLOW pins (Requires-Dist), from PyPI
TPU_TF_KERAS = "2.19.*"  # tf-keras is released per TensorFlow minor version


def tpu_runtime_version(multi_host: bool) -> str:
    """The TPU VM image: `-pod` on a multi-host slice (one TF client drives every host)."""
    return f"tpu-vm-tf-{TPU_TENSORFLOW}-{'pod-' if multi_host else ''}pjrt"


@dataclass(frozen=True)
class TpuGeneration:
    family: str  # accelerator-type prefix: "v4" in "v4-16"
    device: str  # the device name logs and MFU use: "TPU v4"
    peak_flops: float  # dense bf16 FLOP/s of ONE replica
    hbm_gib: float  # HBM of one replica
    cores_per_replica: int  # v2/v3: a replica is a TensorCore; v4/v5p: a chip (megacore)
    cores_per_chip: int
    node_capable: bool  # exists as a TPU Node (not only TPU VM)
    max_chips_per_host: int  # 4; v5e/v6e: 8 (slices of up to 8 chips are one host)


# Per-chip peaks from Google's TPU system architecture pages; per replica = per chip / replicas per chip.
TPU_GENERATIONS: dict[str, TpuGeneration] = {g.family: g for g in (
    TpuGeneration("v2", "TPU v2", 45e12 / 2, 8, 1, 2, True, 4),
    TpuGeneration("v3", "TPU v3", 123e12 / 2, 16, 1, 2, True, 4),
    TpuGeneration("v4", "TPU v4", 275e12, 32, 2, 2, False, 4),
    TpuGeneration("v5e", "TPU v5e", 197e12, 16, 1, 1, False, 8),
    TpuGeneration("v5litepod", "TPU v5e", 197e12, 16, 1, 1, False, 8),
    TpuGeneration("v5p", "TPU v5p", 459e12, 95, 2, 2, False, 4),
    TpuGeneration("v6e", "TPU v6e", 918e12, 32, 1, 1, False, 8),
)}

# GPUs: dense tensor-core bf16, no sparsity. (device-name fragment, peak per GPU)
GPU_PEAKS: dict[str, float] = {"A100": 312e12, "H100": 989e12, "H200": 989e12}
# doctor targets: name -> (HBM GiB, device-name fragment of GPU_PEAKS)
GPU_TARGETS: dict[str, tuple[float, str]] = {"a100": (40, "A100"), "a100-80gb": (80, "A100"), "h100": (80, "H100")}

# Device name -> peak FLOP/s of one replica (what MFU divides by); substring match on the device.
PEAK_FLOPS_PER_REPLICA: dict[str, float] = {
    **{"TPU " + g.family: g.peak_flops for g in TPU_GENERATIONS.values()}, **GPU_PEAKS}


def tpu_generation(accelerator_type: str | None) -> TpuGeneration | None:
    """The generation of an accelerator type such as "v4-16" or "v5litepod-8" (None if unknown)."""
    if not accelerator_type:
        return None
    return TPU_GENERATIONS.get(str(accelerator_type).strip().lower().split("-")[0])


def tpu_chips(accelerator_type: str) -> float:
    """Chips of a slice: "v4-16" counts TensorCores (8 chips), "v5litepod-8" chips (8)."""
    gen = tpu_generation(accelerator_type)
    if gen is None:
        raise ValueError(f"{accelerator_type}: not a TPU accelerator type")
    return int(accelerator_type.rsplit("-", 1)[1]) / gen.cores_per_chip


def tpu_hosts(accelerator_type: str) -> int:
    """Hosts (TPU VMs) of a slice: one up to the generation's chips per host, else 4 chips each
    (as Ray's TPU accelerator manager counts them)."""
    gen, chips = tpu_generation(accelerator_type), tpu_chips(accelerator_type)
    return 1 if chips <= gen.max_chips_per_host else int(-(-chips // 4))


def peak_flops_for(device: str) -> float | None:
    """Peak FLOP/s of one replica of `device` ("TPU v4", "NVIDIA A100-SXM4-40GB"), None if unknown."""
    for name, peak in PEAK_FLOPS_PER_REPLICA.items():
        if name.lower() in device.lower():
            return peak
    return None


# The VM metadata attribute Ray's TPU accelerator manager reads (ray/_private/accelerators/tpu.py).
GCE_ACCELERATOR_TYPE_URL = "http://metadata.google.internal/computeMetadata/v1/instance/attributes/accelerator-type"


def tpu_accelerator_type(metadata_url: str = GCE_ACCELERATOR_TYPE_URL, timeout_s: float = 2.0) -> str | None:
    """This TPU VM's accelerator type ("v4-16"), found as Ray finds it: `TPU_ACCELERATOR_TYPE`
    (GKE sets it; the Ray placement sets it from the node label ray.io/tpu-pod-type), else the GCE
    metadata server's `accelerator-type` attribute. None (and a log line saying so) if neither."""
    env = os.environ.get("TPU_ACCELERATOR_TYPE", "").strip()
    if env:
        return env
    request = urllib.request.Request(metadata_url, headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            text = response.read().decode().strip()
            if response.status == 200 and tpu_generation(text):
                return text
    except (OSError, ValueError) as exc:
        log.debug("GCE metadata %s: %s", metadata_url, exc)
    log.warning("TPU accelerator type unknown (no TPU_ACCELERATOR_TYPE, no GCE metadata %s): MFU will not be "
                "reported; set TPU_ACCELERATOR_TYPE=v4-8 (for example) or train.peak_flops", metadata_url)
    return None


def local_tpu_chips(dev: str = "/dev", iommu_groups: str = "/sys/kernel/iommu_groups") -> int:
    """TPU chips of this host: `/dev/accel<N>` character devices (up to v4; NVIDIA 570+ drivers make
    a `/dev/accel` directory, which is not one), else VFIO groups (v5e and later) whose device is
    Google's (PCI vendor 0x1ae0): other devices bound to vfio-pci appear in /dev/vfio too."""
    accel = [p for p in glob.glob(os.path.join(dev, "accel*")) if not os.path.isdir(p)]
    if accel:
        return len(accel)
    try:
        groups = [g for g in os.listdir(os.path.join(dev, "vfio")) if g.isdigit()]
    except OSError:
        return 0
    return sum(1 for g in groups if _google_device_in(os.path.join(iommu_groups, g, "devices")))


def _google_device_in(devices_dir: str) -> bool:
    for vendor in glob.glob(os.path.join(devices_dir, "*", "vendor")):
        try:
            with open(vendor) as f:
                if f.read().strip().lower() == "0x1ae0":
                    return True
        except OSError:
            continue
    return False
