"""The trainer's loss, throughput, step and ETA as Ray metrics (`ray.util.metrics.Gauge`), so Ray's
dashboard and any Prometheus that scrapes the nodes' metrics export port show a run live. Ray's own
API for application metrics: it names them `ray_<name>` on the node's export endpoint."""

from __future__ import annotations

from typing import Any

GAUGES = {  # name: (description, field of Progress.fields())
    "tpu_ray_train_step": ("steps trained", "step"),
    "tpu_ray_train_total_steps": ("steps the run trains to", "total"),
    "tpu_ray_train_loss": ("training loss over the last logging interval", "loss"),
    "tpu_ray_train_samples_per_second": ("training samples per second", "samples_per_s"),
    "tpu_ray_train_tokens_per_second": ("training tokens per second", "tokens_per_s"),
    "tpu_ray_train_mfu": ("model FLOPs utilisation (where the peak is known)", "mfu"),
    "tpu_ray_train_eta_seconds": ("seconds left: steps, phases and timed evaluations", "eta_s"),
}


class RayGauges:
    """One gauge per GAUGES entry, tagged with the run's name and its directory: two runs of one name
    (the default name is "run") in other directories are two series, never one."""

    def __init__(self, run: str, run_dir: str = ""):
        from ray.util.metrics import Gauge

        self.tags = {"run": run, "run_dir": run_dir}
        self.gauges = {name: (Gauge(name, description=d, tag_keys=("run", "run_dir")), key)
                       for name, (d, key) in GAUGES.items()}

    @classmethod
    def if_connected(cls, run: str, run_dir: str = "") -> RayGauges | None:
        """Gauges when this process is a Ray driver or worker (a metric needs a node to export it)."""
        try:
            import ray
        except ImportError:
            return None
        return cls(run, run_dir) if ray.is_initialized() else None

    def set(self, fields: dict[str, Any]) -> None:
        for gauge, key in self.gauges.values():
            value = fields.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                gauge.set(float(value), tags=self.tags)
