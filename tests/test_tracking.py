"""Experiment tracking (tpu_ray/tracking): one tiny run against a real MLflow tracking server on
127.0.0.1 and W&B in offline mode, read back through MLflow's client and W&B's own files; a resume
continues the same tracked run, and a server killed before a known step never stops the run."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import tiny_config

pytestmark = pytest.mark.slow
QUICK_FT = ["finetune.learning_rates=[1e-3]", "finetune.epochs=1", "finetune.max_train_examples=32",
            "finetune.batch_size=16", "ray.address=local"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` (SQLite store, proxied artifacts) on a free port of 127.0.0.1."""
    d = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    exe = str(Path(sys.executable).with_name("mlflow"))
    proc = subprocess.Popen([exe, "server", "--backend-store-uri", f"sqlite:///{d}/db.sqlite",
                             "--artifacts-destination", str(d / "artifacts"), "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"],
                            stdout=open(d / "server.log", "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)  # its own process group: the server and its workers
    uri = f"http://127.0.0.1:{port}"
    yield proc, uri, f"sqlite:///{d}/db.sqlite"
    _kill(proc)


def _wait_until_it_answers(proc, uri: str) -> None:
    """The server boots while Ray starts (the fixtures' order); a wait, not an assertion on time."""
    deadline = time.monotonic() + 180
    while True:
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=2).read()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not start (exit {proc.poll()})")
            time.sleep(0.5)


def _kill(proc) -> None:
    """The server and the workers it started (uvicorn): the whole process group."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


@pytest.fixture(scope="module")
def tracked_run(mlflow_server, tmp_path_factory, small_corpus, ray_local):
    """A 20-step run tracked in MLflow and in W&B (offline), then fine-tuned once on a built-in task."""
    from tpu_ray.cli import main
    from tpu_ray.pipeline import Pipeline

    _wait_until_it_answers(*mlflow_server[:2])
    run = tmp_path_factory.mktemp("tracked") / "run"
    cfg = tiny_config(run, small_corpus, **{"tracking.mlflow.uri": mlflow_server[1],
                                           "tracking.mlflow.tags": {"team": "nlp"},
                                           "tracking.wandb.project": "tpu-ray-test",
                                           "tracking.wandb.mode": "offline"})
    Pipeline(cfg).run()
    assert main(["finetune", str(run), "--task", "builtin:stdlib-packages", "--seeds", "1", *QUICK_FT]) == 0
    return run


def _records(run: Path, kind: str) -> list[dict]:
    from tpu_ray.metrics_stream import read_records

    return [r for r in read_records(str(run)) if r.get("kind") == kind]


def _client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def test_mlflow_holds_the_config_every_record_and_the_artifacts(tracked_run, mlflow_server):
    state = json.loads((tracked_run / "tracking.json").read_text())
    client = _client(mlflow_server[1])
    run = client.get_run(state["mlflow"]["run_id"])
    assert run.info.run_name == "t" and run.data.tags["team"] == "nlp"
    assert run.data.params["train.steps"] == "20" and run.data.params["model.preset"] == "tiny"
    train_steps = sorted(r["step"] for r in _records(tracked_run, "train"))
    eval_steps = sorted(r["step"] for r in _records(tracked_run, "eval"))
    loss = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted(m.step for m in loss) == train_steps == [5, 10, 15, 20]
    by_step = {r["step"]: r["loss"] for r in _records(tracked_run, "train")}
    assert all(m.value == pytest.approx(by_step[m.step]) for m in loss)
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "eval/perplexity")) == eval_steps
    down = _records(tracked_run, "downstream")
    assert down and all(r["status"] == "ok" for r in down)
    keys = [k for k in run.data.metrics if k.startswith("downstream/builtin_stdlib-packages/")]
    assert keys, sorted(run.data.metrics)
    assert {m.step for k in keys for m in client.get_metric_history(run.info.run_id, k)} == {20}
    assert {a.path for a in client.list_artifacts(run.info.run_id, "model")} == {"model/README.md"}
    report = {a.path for a in client.list_artifacts(run.info.run_id, "report")}
    assert {"report/report.html", "report/loss.png", "report/downstream.png"} <= report, report


def _wandb_records(path: Path):
    """The protobuf records of a W&B transaction log (`run-<id>.wandb`): a 7-byte header, then
    LevelDB-log blocks of 32 KiB whose chunks (4-byte CRC, 2-byte length, 1-byte type: full, first,
    middle, last) hold the serialized `wandb_internal_pb2.Record`s."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending += chunk
        if kind in (1, 4):  # full or last
            rec = pb.Record()
            rec.ParseFromString(pending)
            pending = b""
            yield rec


def test_wandb_offline_files_hold_the_config_and_every_record(tracked_run):
    logs = sorted(tracked_run.glob("wandb/offline-run-*/run-*.wandb"))
    assert logs, sorted(p.name for p in tracked_run.iterdir())
    history, config, artifacts = {}, {}, set()
    for log in logs:
        for rec in _wandb_records(log):
            which = rec.WhichOneof("record_type")
            if which == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
                for k, v in row.items():
                    history.setdefault(k, []).append((row.get("step"), v))
            elif which in ("config", "run"):  # the config: a run record's, then config updates
                update = rec.config.update if which == "config" else rec.run.config.update
                config.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in update})
            elif which == "artifact":
                artifacts.add(rec.artifact.type)
    assert config["train.steps"] == 20 and config["train.learning_rate"] == 1e-3  # numbers, as W&B sorts them
    assert config["tracking.wandb.project"] == "tpu-ray-test" and config["model.init_from"] is None
    assert sorted(s for s, _ in history["train/loss"]) == [5, 10, 15, 20]
    assert sorted(s for s, _ in history["eval/perplexity"]) == sorted(r["step"] for r in _records(tracked_run, "eval"))
    assert any(k.startswith("downstream/") for k in history), sorted(history)
    assert {"model-card", "report"} <= artifacts


class KillAt:
    """A metrics-stream mirror that, at the train record of `step`, waits until the trackers sent
    everything before it, then kills the MLflow server: a known point, not a moment."""

    kinds = ("train",)

    def __init__(self, step: int, server, trackers):
        self.step, self.server, self.trackers = step, server, trackers

    def write(self, record):
        if record["step"] == self.step and self.server.poll() is None:
            assert all(t.wait_idle(300) for t in self.trackers)
            _kill(self.server)

    def flush(self):
        pass

    def close(self):
        pass


def test_a_resumed_run_continues_its_tracked_run_and_a_killed_server_never_stops_it(tracked_run, mlflow_server):
    """Resumed to step 30 in the same tracked run; the server is killed at step 30's train record:
    the run finishes, says the tracker was dropped, and MLflow holds every step before it."""
    from tpu_ray.config import RunConfig
    from tpu_ray.tracking.trackers import trackers
    from tpu_ray.train.loop import train
    from tpu_ray.train.metrics import MetricsWriter

    proc, uri, store = mlflow_server
    before = json.loads((tracked_run / "tracking.json").read_text())["mlflow"]["run_id"]
    cfg = RunConfig.from_yaml(str(tracked_run / "config.yaml")).override(
        {"train.steps": 30, "train.extend_schedule": True, "tracking.wandb.project": None})
    mirrors = trackers(cfg, cfg.run_dir, "train")
    writer = MetricsWriter(cfg.run_dir, mirrors=[KillAt(30, proc, mirrors), *mirrors])
    summary = train(cfg, resume=True, metrics=writer)
    writer.close()
    assert summary["steps"] == 30 and proc.poll() is not None
    state = json.loads((tracked_run / "tracking.json").read_text())["mlflow"]
    assert state["run_id"] == before and state["status"] == "dropped"
    events = [r for r in _records(tracked_run, "event") if r.get("event") == "tracking"]
    assert [e["status"] for e in events][-1] == "dropped" and events[-1]["tracker"] == "mlflow"
    # Read back from the server's own store (the server is gone): step 25 went, step 30 never did.
    loss = _client(store).get_metric_history(before, "train/loss")
    assert sorted(m.step for m in loss) == [5, 10, 15, 20, 25]
