"""Pick the tf.distribute strategy, precision and XLA setting for the hardware at hand.

The TPU-only lines are the three calls in `_tpu_strategy`; everything else (replica arithmetic,
per-replica batches, input sharding) is shared with MirroredStrategy, which the tests run over
8 logical CPU devices as a stand-in for a v3-8's 8 replicas.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from tpu_ray.config import TrainConfig
from tpu_ray.errors import UserError
from tpu_ray.cluster.tpu_slice import TpuSlice
from tpu_ray.train.tpu_init import classify_tpu_error
from tpu_ray.accelerators import local_tpu_chips, tpu_accelerator_type, tpu_generation  # noqa: F401 - re-exported

log = logging.getLogger(__name__)


@dataclass
class StrategyInfo:
    strategy: Any
    kind: str  # tpu | gpu | multiworker | cpu
    replicas: int
    device: str  # e.g. "TPU v4", "NVIDIA A100-SXM4-40GB", "cpu"
    mixed_precision: str
    jit_compile: bool | None  # None: not set (TPU: XLA is implicit)
    steps_per_execution: int

    @property
    def is_chief(self) -> bool:
        """The process that writes metrics, checkpoints and the export (always True but multi-worker)."""
        return bool(self.strategy.extended.should_checkpoint)

    @property
    def worker_index(self) -> int:
        """This process's task index in a multi-worker cluster (TF_CONFIG); 0 everywhere else."""
        if self.kind != "multiworker":
            return 0
        resolver = getattr(self.strategy, "cluster_resolver", None)
        return int(getattr(resolver, "task_id", 0) or 0)

    def describe(self, global_batch: int) -> str:
        from tpu_ray.tables import strategy_name

        return (f"strategy={strategy_name(type(self.strategy).__name__).split(' ')[0]} kind={self.kind} device={self.device} "
                f"replicas={self.replicas} global_batch={global_batch} "
                f"per_replica_batch={global_batch // max(self.replicas, 1)} precision={self.mixed_precision} "
                f"jit_compile={self.jit_compile} steps_per_execution={self.steps_per_execution}")


def tpu_visible(cfg: TrainConfig) -> bool:
    """Cheap TPU detection that never waits on a metadata server: a reserved slice, a named TPU or
    TPU chips on this host, found as Ray finds them (ray/_private/accelerators/tpu.py, not a public API)."""
    return bool(TpuSlice.current() or cfg.tpu_name or os.environ.get("TPU_NAME") or local_tpu_chips())


def tpu_target(cfg: TrainConfig) -> tuple[str, bool]:
    """(what TPUClusterResolver dials, whether Ray reserved it). Placed by Ray, the reserved slice
    says it (TpuSlice: its name on a multi-host slice, else "local"); train.tpu_name was a
    constraint on that reservation, never a second opinion. Not placed by Ray (train.placement=local
    on a TPU VM or beside a TPU Node), train.tpu_name or TPU_NAME name the TPU, else "local"."""
    reserved = TpuSlice.current()
    if reserved is not None:
        return reserved.tf_name, True
    return cfg.tpu_name or os.environ.get("TPU_NAME") or "local", False


def _tf_config_workers() -> int:
    try:
        cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    except json.JSONDecodeError:
        raise UserError("TF_CONFIG: not valid JSON; unset it or fix it") from None
    return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


def detect_kind(cfg: TrainConfig) -> str:
    if cfg.strategy != "auto":
        return cfg.strategy
    if tpu_visible(cfg):
        return "tpu"
    if tf.config.list_physical_devices("GPU"):
        return "gpu"
    if _tf_config_workers() > 1:
        return "multiworker"
    return "cpu"


def _tpu_strategy(cfg: TrainConfig) -> tuple[Any, str]:
    """TPU-only: resolve, connect, initialize. `local` on a single-host TPU VM (v3-8, v4-8); the slice
    name (TPU_NAME) on a multi-host pod slice, where one client process drives every host."""
    name, reserved = tpu_target(cfg)
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=name)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, OSError, tf.errors.OpError) as exc:  # OSError: URLError of a lookup
        raise classify_tpu_error(exc, name, local_tpu_chips(), reserved=reserved) from None
    strategy = tf.distribute.TPUStrategy(resolver)
    devices = tf.config.list_logical_devices("TPU")
    kind = getattr(devices[0], "device_type", "TPU") if devices else "TPU"
    return strategy, _tpu_generation() or kind


def _tpu_generation() -> str | None:
    """The device name ("TPU v4" for a v4-16): the reserved slice's pod type, else the accelerator type
    as Ray finds it (env, else VM metadata); None (logged) when unknown. TPUClusterResolver has no
    accelerator-type attribute to ask."""
    reserved = TpuSlice.current()
    generation = tpu_generation(reserved.pod_type if reserved else tpu_accelerator_type())
    return generation.device if generation else None


def select(cfg: TrainConfig) -> StrategyInfo:
    """Build the strategy, set the precision policy; call before creating any model."""
    import tf_keras

    kind = detect_kind(cfg)
    if kind == "tpu":
        if cfg.strategy == "tpu" and not tpu_visible(cfg):
            raise UserError("train.strategy=tpu: this machine has no TPU (no TPU_NAME, no /dev/accel*); "
                            "run on CPU with train.strategy=cpu (or auto), or submit to a TPU VM")
        strategy, device = _tpu_strategy(cfg)
    elif kind == "gpu":
        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            raise UserError("train.strategy=gpu: no GPU visible to TensorFlow; use train.strategy=auto or cpu")
        strategy = tf.distribute.MirroredStrategy()
        device = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
    elif kind == "multiworker":
        if _tf_config_workers() < 1:
            raise UserError("train.strategy=multiworker: TF_CONFIG describes no workers; launch through Ray "
                            "(tpu-ray train with ray workers) or set train.strategy=cpu")
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        device = "gpu" if tf.config.list_physical_devices("GPU") else "cpu"
    else:
        if cfg.cpu_replicas > 1:
            use_logical_cpus(cfg.cpu_replicas)
        cpus = tf.config.list_logical_devices("CPU")
        # Several logical CPUs (tests: a v3-8 stand-in) -> MirroredStrategy; else the default.
        strategy = tf.distribute.MirroredStrategy([d.name for d in cpus]) if len(cpus) > 1 else tf.distribute.get_strategy()
        device = "cpu"
    precision = cfg.mixed_precision
    if precision == "auto":
        precision = {"tpu": "mixed_bfloat16", "gpu": "mixed_float16"}.get(kind, "float32")
    if precision == "mixed_float16" and kind != "gpu":
        raise UserError(f"train.mixed_precision=mixed_float16 needs a GPU (this is {kind}); use auto or float32")
    tf_keras.mixed_precision.set_global_policy(precision)
    if kind == "tpu":
        if cfg.jit_compile:
            log.warning("train.jit_compile is ignored on TPU: XLA compiles everything there already")
        jit = None
    else:
        jit = cfg.jit_compile if cfg.jit_compile is not None else kind == "gpu"
    spe = cfg.steps_per_execution or (64 if kind == "tpu" else 1)
    return StrategyInfo(strategy, kind, strategy.num_replicas_in_sync, device, precision, jit, spe)


@contextmanager
def keeps_global_policy() -> Iterator[None]:
    """Restore Keras's global mixed-precision policy on the way out. `select` sets it for training;
    without this a TPU or GPU run left bfloat16/float16 behind in the caller's process (the Python
    API, a notebook, the test suite), and the next model built there came out in that precision."""
    import tf_keras

    previous = tf_keras.mixed_precision.global_policy()
    try:
        yield
    finally:
        tf_keras.mixed_precision.set_global_policy(previous)


def use_logical_cpus(n: int) -> None:
    """Split the host CPU into n logical devices (before TF initializes): n replicas on one CPU."""
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * n)
    except RuntimeError:  # TF already initialized in this process: fine if it already has n devices
        have = len(tf.config.list_logical_devices("CPU"))
        if have != n:
            raise UserError(f"train.cpu_replicas={n}: TensorFlow already started with {have} CPU devices in "
                            f"this process; run in a fresh process") from None
