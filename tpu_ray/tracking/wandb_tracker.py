"""The run in Weights & Biases, through `wandb.init` / `Run.log` (see tpu_ray/tracking/__init__.py
for why the library and not Ray's integration). Every figure is logged against a `step` metric of
its own (define_metric): W&B's internal step must only grow, while a resumed run repeats steps and
fine-tuning scores an earlier checkpoint's step after training went past it."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from tpu_ray import storage
from tpu_ray.config import WandbTracking
from tpu_ray.tracking.base import Tracker
from tpu_ray.tracking.state import read_state, update_state


class WandbTracker(Tracker):
    name = "wandb"

    def __init__(self, run_dir: str, settings: WandbTracking, run_name: str, params: dict[str, Any], stage: str):
        self.settings = settings
        self.run: Any = None
        self._owns = False
        super().__init__(run_dir, run_name, params, stage)

    def _directory(self) -> str:
        """W&B's files beside the run (RUN/wandb); a gs:// run's in a local temporary directory."""
        if storage.is_remote(self.run_dir):
            return tempfile.mkdtemp(prefix="tpu-ray-wandb-")
        local = storage.filesystem(self.run_dir)[1]
        os.makedirs(local, exist_ok=True)
        return local

    def _open(self) -> str:
        import wandb

        known = read_state(self.run_dir).get(self.name, {})
        run_id = known.get("run_id") if known.get("project") == self.settings.project else None
        previous = wandb.run  # a run of this process (the trainer's, when it runs in the driver)
        self.run = wandb.init(
            project=self.settings.project, entity=self.settings.entity, name=self.settings.run_name or self.run_name,
            tags=self.settings.tags or None, config=self.params, id=run_id,
            resume="allow", dir=self._directory(), mode=self.settings.mode, job_type=self.stage,
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )
        # wandb.init hands back a live run of this process for the same id: it is not ours to finish
        self._owns = self.run is not previous
        self.run.define_metric("step")
        for prefix in ("train", "eval", "downstream"):
            self.run.define_metric(f"{prefix}/*", step_metric="step")
        update_state(self.run_dir, self.name, project=self.settings.project)
        return self.run.id

    def _send(self, batch: list[tuple[int, dict[str, float]]]) -> None:
        for step, items, _ in batch:
            self.run.log({**items, "step": step})

    def _artifacts(self, files: dict[str, str], dirs: dict[str, str]) -> None:
        import wandb

        for where, path in files.items():
            art = wandb.Artifact(f"{self.run.id}-{where}", type="model-card")
            art.add_file(path)
            self.run.log_artifact(art)
        for where, path in dirs.items():
            art = wandb.Artifact(f"{self.run.id}-{where}", type="report")
            art.add_dir(path)
            self.run.log_artifact(art)

    def _finish(self, ended: bool) -> None:
        if self._owns:  # a training closed without train_end failed: W&B shows it so
            self.run.finish(exit_code=1 if self.stage == "train" and not ended else 0)
