"""Which trackers a run's config turns on (tpu_ray/tracking/__init__.py says why these clients)."""

from __future__ import annotations

import logging
from typing import Any

from tpu_ray.config import RunConfig
from tpu_ray.saved_config import read_saved_config
from tpu_ray.tracking.base import Tracker, flat_config
from tpu_ray.tracking.mlflow_tracker import MlflowTracker
from tpu_ray.tracking.wandb_tracker import WandbTracker

log = logging.getLogger("tpu_ray.tracking")


def trackers(cfg: RunConfig, run_dir: str, stage: str = "train") -> list[Tracker]:
    """The trackers `cfg.tracking` turns on, sending `run_dir`'s records (`stage`: train or finetune).
    The whole config, as the tracked run records it (its parameters). A tracker whose library is not
    installed is warned about and left out, never fatal."""
    out: list[Tracker] = []
    t = cfg.tracking

    def params() -> dict[str, Any]:
        return flat_config(cfg.model_dump(mode="json"))
    if t.mlflow.uri:
        try:
            import mlflow  # noqa: F401 - missing: said here, not in the sending thread

            out.append(MlflowTracker(run_dir, t.mlflow, cfg.name, params(), stage))
        except ImportError:
            log.warning("tracking.mlflow.uri is set but mlflow is not installed: pip install 'tpu-ray[tracking]'")
    if t.wandb.project:
        try:
            import wandb  # noqa: F401

            out.append(WandbTracker(run_dir, t.wandb, cfg.name, params(), stage))
        except ImportError:
            log.warning("tracking.wandb.project is set but wandb is not installed: pip install 'tpu-ray[tracking]'")
    return out


def trackers_for_run_dir(run_dir: str, stage: str = "finetune") -> list[Tracker]:
    """The trackers of the run whose directory this is (its saved config.yaml), for writers that hold
    no config (fine-tuning's records); none for a directory that is not a run's."""
    try:
        cfg = read_saved_config(run_dir)
    except Exception:  # noqa: BLE001 - a damaged config is reported by the stages that need it
        return []
    if cfg is None:
        return []
    if cfg.tracking.mlflow.uri and "***" in cfg.tracking.mlflow.uri:
        log.warning("%s: the run's tracking.mlflow.uri holds a password, which its saved config keeps "
                    "redacted: these records are not sent to MLflow (give MLflow the credentials through "
                    "MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD and a URI without them)", run_dir)
        cfg = cfg.override({"tracking.mlflow.uri": None})
    return trackers(cfg, run_dir, stage)
