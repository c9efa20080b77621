"""A tracking server nobody answers never stops a run (tpu_ray/tracking/base.py): the writer goes on,
the first failure is recorded as `retrying`, the run's end as `dropped`, with RUN/tracking.json
saying so. The real MLflow client against a port where nothing listens."""

from __future__ import annotations

import json
import socket

import pytest

from tpu_ray.config import RunConfig
from tpu_ray.metrics_stream import MetricsWriter, read_records
from tpu_ray.tracking.base import metric_items
from tpu_ray.tracking.trackers import trackers


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens there


def test_an_unreachable_mlflow_is_warned_about_and_dropped_while_the_records_go_on(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # fail at once: what is tested is what follows
    cfg = RunConfig().override({"output_dir": str(tmp_path), "tracking.mlflow.uri": f"http://127.0.0.1:{_closed_port()}"})
    writer = MetricsWriter(str(tmp_path), mirrors=trackers(cfg, str(tmp_path)))
    for step in (5, 10):
        writer.write("train", step=step, loss=1.0)
    writer.close()
    records = read_records(str(tmp_path))
    assert [r["step"] for r in records if r["kind"] == "train"] == [5, 10]  # every record kept
    statuses = [r["status"] for r in records if r.get("event") == "tracking"]
    assert statuses[0] == "retrying" and statuses[-1] == "dropped", statuses
    state = json.loads((tmp_path / "tracking.json").read_text())["mlflow"]
    assert state["status"] == "dropped" and state["error"], state
    assert any("mlflow: dropped after" in r.getMessage() for r in caplog.records)


@pytest.mark.quick
def test_records_become_metrics_under_their_kind_source_and_trial():
    assert metric_items({"kind": "train", "step": 5, "time": 1.0, "loss": 2.5, "mfu": None, "seq_len": 64,
                         "train_traces": 1, "nonfinite": True}) == {"train/loss": 2.5, "train/seq_len": 64.0}
    assert metric_items({"kind": "eval_source", "step": 5, "source": "wiki", "eval_loss": 3.0,
                         "eval_set": "abc"}) == {"eval/wiki/eval_loss": 3.0}
    trial = {"kind": "downstream", "step": 20, "task": "builtin:x", "status": "ok", "seed": 1, "learning_rate": 1e-3,
             "validation_accuracy": 0.5, "task_hash": "a" * 64, "settings_key": "s" * 12, "model": "weights-1234"}
    assert metric_items(trial) == {
        f"downstream/builtin_x/{'a' * 12}/{'s' * 12}/weights-1234/lr0.001/seed1/validation_accuracy": 0.5}
    # another model (or settings, or task version) at the same step: another series, never the same key
    assert not set(metric_items(trial)) & set(metric_items({**trial, "model": "weights-5678"}))
    assert metric_items({"kind": "downstream", "step": 20, "status": "failed", "task": "t"}) == {}
