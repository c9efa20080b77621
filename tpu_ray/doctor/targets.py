"""doctor's targets: an accelerator by name (`v4-8`, `v3-8-node`, `a100-8`, `cpu`) and what it offers,
taken from the one accelerator table (tpu_ray/accelerators.py)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from tpu_ray.accelerators import GPU_TARGETS, PEAK_FLOPS_PER_REPLICA, TPU_GENERATIONS
from tpu_ray.cluster.tpu_slice import expected_hosts
from tpu_ray.config import TrainConfig
from tpu_ray.doctor.estimates import GB
from tpu_ray.errors import UserError

@dataclass(frozen=True)
class Target:
    name: str
    kind: str  # tpu | gpu | cpu
    style: str  # tpu-vm | tpu-node | gpu | cpu
    replicas: int
    chips: float
    hosts: int
    hbm_bytes: float  # per replica
    peak: float | None  # FLOP/s per replica (dense bf16)

    def describe(self) -> str:
        peak = f", {self.peak / 1e12:.0f} TFLOP/s each" if self.peak else ""
        return (f"{self.name} ({self.style}, {self.replicas} replicas on {self.chips:g} chips, {self.hosts} "
                f"host{'s' if self.hosts > 1 else ''}, {self.hbm_bytes / GB:.0f} GB each{peak})")


TARGET_EXAMPLES = "v2-8, v3-8, v3-8-node, v4-8, v4-16, v4-32, v5e-8 (v5litepod-8), v5litepod-16, v5p-8, v6e-8, v6e-16, a100, a100-8, h100, cpu"
_TPU_NAME = re.compile(r"(v2|v3|v4|v5e|v5litepod|v5p|v6e)-(\d+)(?:-(node|vm))?")


def parse_target(name: str | None, train: TrainConfig) -> Target:
    """A target from its name (`v4-8`, `v3-8-node`, `a100-8`, `cpu`); default: train.tpu_topology or
    cpu (train.cpu_replicas replicas)."""
    name = (name or train.tpu_topology or "cpu").strip().lower()
    m = _TPU_NAME.fullmatch(name)
    if m:
        family, cores, style = m.group(1), int(m.group(2)), m.group(3) or "vm"
        gen = TPU_GENERATIONS[family]
        if style == "node" and not gen.node_capable:
            raise UserError(f"--target {name}: {family} exists only as TPU VM; drop '-node'")
        if cores % gen.cores_per_replica or cores < 1 or (gen.cores_per_chip == 2 and cores % 8):
            raise UserError(f"--target {name}: not a {family} slice size; e.g. {family}-8")
        chips = cores / gen.cores_per_chip
        return Target(name, "tpu", f"tpu-{style}", cores // gen.cores_per_replica, chips,
                      expected_hosts(f"{family}-{cores}") or 1, gen.hbm_gib * GB, gen.peak_flops)
    m = re.fullmatch(r"(a100|a100-80gb|h100)(?:[-x](\d+))?", name)
    if m:
        hbm, peak_key = GPU_TARGETS[m.group(1)]
        n = int(m.group(2) or 1)
        return Target(name, "gpu", "gpu", n, n, max(1, -(-n // 8)), hbm * GB, PEAK_FLOPS_PER_REPLICA[peak_key])
    if name == "cpu":
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        n = train.cpu_replicas
        return Target("cpu", "cpu", "cpu", n, 1, 1, ram / n, None)
    raise UserError(f"--target {name}: unknown accelerator; use one of {TARGET_EXAMPLES}")
