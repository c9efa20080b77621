"""The run in MLflow, through `mlflow.MlflowClient` (see tpu_ray/tracking/__init__.py for why the
library's client and not Ray's integration): every call names the run id, so no process-global
active run is touched, and the trainer, fine-tuning and a resumed run write to the same run."""

from __future__ import annotations

import os
from typing import Any

from tpu_ray.redact import redact
from tpu_ray.config import MlflowTracking
from tpu_ray.tracking.base import Tracker, as_text
from tpu_ray.tracking.state import read_state, update_state

BATCH = 1000  # MLflow's limit on metrics per log_batch call


class MlflowTracker(Tracker):
    name = "mlflow"

    def __init__(self, run_dir: str, settings: MlflowTracking, run_name: str, params: dict[str, Any], stage: str):
        # MLflow retries a failed request 7 times with doubling waits (minutes): the thread would hold
        # records that long before it can say so. Two quick retries, unless the user chose otherwise.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
        self.settings = settings
        self.client: Any = None
        super().__init__(run_dir, run_name, params, stage)

    def _open(self) -> str:
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri=self.settings.uri)
        known = read_state(self.run_dir).get(self.name, {})
        if known.get("run_id") and known.get("uri") == redact(self.settings.uri):
            run = self.client.get_run(known["run_id"])  # a resumed run, or fine-tuning on it: the same run
            self.run_id = run.info.run_id
            if run.info.status != "RUNNING" and self.stage == "train":
                self.client.update_run(run.info.run_id, status="RUNNING")
            self._params(run.data.params)
            return run.info.run_id
        exp = self.client.get_experiment_by_name(self.settings.experiment)
        exp_id = exp.experiment_id if exp else self.client.create_experiment(self.settings.experiment)
        tags = {"tpu_ray.run_dir": self.run_dir, **self.settings.tags}
        run = self.client.create_run(exp_id, run_name=self.settings.run_name or self.run_name, tags=tags)
        update_state(self.run_dir, self.name, uri=redact(self.settings.uri), experiment_id=exp_id)
        self.run_id = run.info.run_id
        self._params({})
        return run.info.run_id

    def _params(self, logged: dict[str, str]) -> None:
        """The config as parameters; a parameter logged already keeps its value (MLflow refuses a
        change, and a resumed run's config may only differ where nothing depends on it)."""
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in self._flat().items() if k not in logged]
        for i in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def _flat(self) -> dict[str, str]:
        return as_text(self.params)

    def _send(self, batch: list[tuple[int, dict[str, float]]]) -> None:
        from mlflow.entities import Metric

        while batch:  # records in chunks of at most BATCH metrics, each taken off once MLflow has it
            n, size = 0, 0
            while n < len(batch) and (n == 0 or size + len(batch[n][1]) <= BATCH):
                size += len(batch[n][1])
                n += 1
            metrics = [Metric(k, v, millis, step) for step, items, millis in batch[:n] for k, v in items.items()]
            for i in range(0, len(metrics), BATCH):  # one record with more than BATCH figures
                self.client.log_batch(self.run_id, metrics=metrics[i:i + BATCH])
            del batch[:n]

    def _artifacts(self, files: dict[str, str], dirs: dict[str, str]) -> None:
        for where, path in files.items():
            self.client.log_artifact(self.run_id, path, artifact_path=where)
        for where, path in dirs.items():
            self.client.log_artifacts(self.run_id, path, artifact_path=where)

    def _finish(self, ended: bool) -> None:
        if ended:  # train_end seen: the training is over (fine-tuning later may still add to it)
            self.client.set_terminated(self.run_id, "FINISHED")
        elif self.stage == "train":  # the trainer closed without train_end: the training failed
            self.client.set_terminated(self.run_id, "FAILED")
