"""The cluster cluster.yaml describes, scaling for real: Ray's autoscaler v2 with its fake node provider.

Zero workers at the start. The pipeline is submitted as a Ray job (jobs/pretrain.py, as users do)
into a gs:// run directory (the storage emulator; the job's runtime_env carries its endpoint, as a
real cluster's service account would carry credentials; the shards in a local directory, since
TensorFlow's own gs:// client cannot use the emulator). What the test reads is the autoscaler's
own state (the GCS call behind `ray status`, polled each second, and `ray status` itself) and Ray's
state API (which node ran which task):
  - CPU workers (cpu_worker) are launched for the shard actors, and the shard actors run there only;
  - the TPU-typed node (tpu_v4_8) is launched when training asks for TPU-v4-8-head, training runs
    there, and nothing else does;
  - the head (CPU: 0) runs neither;
  - every worker is released after the idle timeout.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid

import pytest

from tests.helpers import wikitext_slice
from tests.fake_autoscaler import FAKE_HEAD_TYPE, autoscaling_head
from tests.test_jobs import REPO, RUN_DIR_FILES, SMALL, VENV_BIN
from tpu_ray import storage
from tpu_ray.cluster.jobs import EXCLUDES, JobHandle

CLUSTER_YAML = REPO / "cluster.yaml"
CPU_TYPE, TPU_TYPE, TPU_HEAD = "cpu_worker", "tpu_v4_8", "TPU-v4-8-head"
JOB_TIMEOUT_S = 900  # deadlines against hangs, not speed requirements
RELEASE_TIMEOUT_S = 180
IDLE_TIMEOUT_MIN = 0.2  # 12 s (cluster.yaml: 10 min)


INFEASIBLE_DRIVER = """
import sys, ray
from tpu_ray.cluster.placement import reserve_tpu_slice
from tpu_ray.errors import UserError
ray.init(address=sys.argv[1], log_to_driver=False)
try:
    reserve_tpu_slice("TPU-v4-16-head", timeout_s=600)
except UserError as exc:
    print(f"{exc.kind.name}: {exc}")
"""


class AutoscalerWatch:
    """Polls the autoscaler's status (what `ray status` prints) every second in a thread."""

    def __init__(self, gcs_address: str):
        self.gcs_address = gcs_address
        self.node_type: dict[str, str] = {}  # node id -> node type, for every node ever seen up
        self.first_up: dict[str, float] = {}  # node type -> wall time its first node was up
        self.launching: dict[str, float] = {}  # node type -> wall time a launch was first pending
        self.workers_now: list[str] = []  # node types of the workers up or pending at the last poll
        self.gone: dict[str, float] = {}  # node type -> wall time its last node went away
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> AutoscalerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        from ray.autoscaler.v2.sdk import get_cluster_status

        while not self._stop.is_set():
            try:
                st = get_cluster_status(self.gcs_address)
            except Exception:  # the GCS busy for a moment on 2 cores: poll again
                self._stop.wait(1.0)
                continue
            now = time.time()
            for launch in st.pending_launches:
                self.launching.setdefault(launch.ray_node_type_name, now)
            workers = []
            for node in st.active_nodes + st.idle_nodes:
                self.node_type[node.node_id] = node.ray_node_type_name
                self.first_up.setdefault(node.ray_node_type_name, now)
                if node.ray_node_type_name != FAKE_HEAD_TYPE:
                    workers.append(node.ray_node_type_name)
            workers += [n.ray_node_type_name for n in st.pending_nodes]
            workers += [launch.ray_node_type_name for launch in st.pending_launches]
            for kind in set(self.first_up) - set(workers) - {FAKE_HEAD_TYPE}:
                self.gone.setdefault(kind, now)
            for kind in set(workers) & set(self.gone):
                del self.gone[kind]  # it came back
            self.workers_now = workers
            self.polls += 1
            self._stop.wait(1.0)

    def wait_released(self, timeout_s: float) -> float:
        """Wall time once no worker is up or pending (after at least one fresh poll)."""
        deadline = time.monotonic() + timeout_s
        polls = self.polls
        while self.polls <= polls + 1 or self.workers_now:
            assert time.monotonic() < deadline, f"workers not released: {self.workers_now}"
            time.sleep(1.0)
        return time.time()


def ray_status(gcs_address: str) -> str:
    out = subprocess.run([str(VENV_BIN / "ray"), "status", "--address", gcs_address], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def section(status: str, title: str) -> list[str]:
    """The lines under `title:` in `ray status` output (up to the next title)."""
    lines = status.splitlines()
    start = lines.index(f"{title}:") + 1
    out = []
    for line in lines[start:]:
        if not line.startswith(" "):
            break
        out.append(line.strip())
    return out


def _events(run: str) -> dict[str, float]:
    """`<stage>_<event>` -> wall time (seconds), from the run's metrics (on gs://: one object per writer)."""
    from tpu_ray.report import load_metrics

    out = {}
    for rec in load_metrics(run, kind="event").to_dict("records"):
        if isinstance(rec.get("stage"), str) and isinstance(rec.get("event"), str):
            out[f"{rec['stage']}_{rec['event']}"] = rec["time"].timestamp()
    return out


@pytest.mark.slow
def test_autoscaler_brings_cpu_workers_for_shards_then_the_tpu_node_for_training_then_releases_them(
        gcs_emulator, tmp_path_factory, wikitext, monkeypatch):
    from ray.util.state import list_tasks

    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # Ray's Jobs CLI and state API let it override --address

    bucket = gcs_emulator.make_bucket()
    corpus = wikitext_slice(tmp_path_factory, 200_000, "valid-200k.txt")
    storage.atomic_write_bytes(f"{bucket}/corpus/valid.txt", corpus.read_bytes())
    run = f"{bucket}/run"
    # TensorFlow reads gs:// with its own client, which cannot be pointed at the emulator: the shards
    # go to a directory every fake node sees (on GCP they would sit in the bucket too).
    shards = tmp_path_factory.mktemp("shards") / "shards"
    overrides = {**SMALL, "shard.dir": shards, "train.steps": 10, "train.eval_every": 10, "train.checkpoint_every": 10,
                 "shard.num_actors": 2,  # two actors of one CPU: two CPU workers of cluster.yaml's type
                 "train.tpu_topology": "v4-8", "train.strategy": "cpu",  # placed as on a v4-8, trained on CPU
                 "train.tpu_wait_timeout_s": 300}
    with autoscaling_head(CLUSTER_YAML, cpu_scale=8, idle_timeout_minutes=IDLE_TIMEOUT_MIN) as (head, config):
        types = config["available_node_types"]
        assert types[FAKE_HEAD_TYPE]["resources"]["CPU"] == 0  # cluster.yaml's head takes no tasks
        assert types[TPU_TYPE]["resources"][TPU_HEAD] == 1 and types[TPU_TYPE]["labels"]["ray.io/tpu-pod-type"] == "v4-8"
        assert all(t["min_workers"] == 0 for t in types.values())  # zero workers at the start
        with AutoscalerWatch(head.gcs_address) as watch:
            sid = f"autoscale-{uuid.uuid4().hex[:8]}"
            runtime_env = {"excludes": EXCLUDES, "env_vars": storage.forwarded_env()}
            assert runtime_env["env_vars"] == {"STORAGE_EMULATOR_HOST": gcs_emulator.endpoint}
            submitted = time.time()
            proc = subprocess.run(
                [str(VENV_BIN / "ray"), "job", "submit", "--address", head.address, "--submission-id", sid,
                 "--no-wait", "--working-dir", ".", "--runtime-env-json", json.dumps(runtime_env), "--",
                 "python", "jobs/pretrain.py", "--config", "jobs/configs/quickstart.yaml", "--output-dir", run,
                 "--corpus", f"{bucket}/corpus/valid.txt", *(f"{k}={v}" for k, v in overrides.items())],
                cwd=REPO, capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stderr[-3000:]
            job = JobHandle(sid, head.address, run)
            during_training = ""
            launching: dict[str, str] = {}  # node type -> `ray status` while it was being launched
            deadline = time.monotonic() + JOB_TIMEOUT_S
            while job.status() in ("PENDING", "RUNNING"):
                assert time.monotonic() < deadline, job.logs()[-3000:]
                for kind in (CPU_TYPE, TPU_TYPE):
                    if kind in watch.launching and kind not in watch.first_up and kind not in launching:
                        launching[kind] = ray_status(head.gcs_address)
                if not during_training and TPU_TYPE in watch.first_up and "stage train: start" in job.logs():
                    during_training = ray_status(head.gcs_address)  # as a user would look at it
                time.sleep(2.0)
            log = job.logs()
            saved = tmp_path_factory.mktemp("job") / "job.log"
            saved.write_text(log)
            assert job.status() == "SUCCEEDED", f"{saved}: {log[-3000:]}"
            finished = time.time()
            released = watch.wait_released(RELEASE_TIMEOUT_S)
        final = ray_status(head.gcs_address)
        # A slice no node type offers (v4-16 here): the wait ends as soon as the autoscaler calls
        # the request infeasible, with one line naming the resource (well before the timeout).
        infeasible = subprocess.run(
            [str(VENV_BIN / "python"), "-c", INFEASIBLE_DRIVER, head.gcs_address], cwd=REPO, capture_output=True,
            text=True, timeout=240)
        tasks = list_tasks(address=head.address, limit=10_000, detail=True, raise_on_missing_output=False)

    # The run completed, in the bucket.
    for name in RUN_DIR_FILES:
        if name == "metrics.jsonl":  # gs:// runs: one metrics object per writer, under metrics/
            assert storage.glob(f"{run}/metrics/*.jsonl"), "metrics/*.jsonl"
            continue
        assert storage.exists(f"{shards}/manifest.json" if name.startswith("shards/") else f"{run}/{name}"), name
    summary = json.loads(storage.read_text(f"{run}/summary.json"))
    assert summary["steps"] == 10

    # The autoscaler launched CPU workers, then the TPU-typed node, and released them all.
    by_type: dict[str, set[str]] = {}
    for node_id, node_type in watch.node_type.items():
        by_type.setdefault(node_type, set()).add(node_id)
    (head_id,) = by_type[FAKE_HEAD_TYPE]
    cpu_nodes, tpu_nodes = by_type.get(CPU_TYPE, set()), by_type.get(TPU_TYPE, set())
    assert len(cpu_nodes) == 2, by_type
    assert len(tpu_nodes) == 1, by_type
    assert set(by_type) == {FAKE_HEAD_TYPE, CPU_TYPE, TPU_TYPE}, by_type
    assert watch.first_up[CPU_TYPE] < watch.first_up[TPU_TYPE]
    # `ray status` while training: the TPU node active; at the end: only the idle head.
    assert f"1 {TPU_TYPE}" in section(during_training, "Active"), during_training
    assert section(final, "Active") == ["(no active nodes)"] and section(final, "Idle") == [f"1 {FAKE_HEAD_TYPE}"], final
    assert section(final, "Pending") == ["(no pending nodes)"], final

    # Where things ran (Ray's state API): shard actors on CPU workers only, training on the TPU node
    # only, and the TPU node ran nothing else; the head ran neither.
    (tpu_id,) = tpu_nodes
    shard_nodes = {t.node_id for t in tasks if t.name.startswith("ShardWorker.") and t.node_id}
    train_nodes = {t.node_id for t in tasks if t.name == "_train_task" and t.node_id}
    assert shard_nodes and shard_nodes <= cpu_nodes, (shard_nodes, by_type)
    assert train_nodes == {tpu_id} and summary["node_id"] == tpu_id
    assert {t.name for t in tasks if t.node_id == tpu_id} == {"_train_task"}
    assert head_id not in shard_nodes | train_nodes

    assert infeasible.returncode == 0, infeasible.stderr[-3000:]
    assert infeasible.stdout.strip().splitlines()[-1] == (
        "NO_CAPACITY: TPU-v4-16-head: no node type of this cluster's autoscaler offers it; set train.tpu_topology "
        "to a slice the cluster has, or add a node type with TPU-v4-16-head to cluster.yaml (docs/cluster.md)")

    # The job said what it was waiting for while the autoscaler launched the TPU node: the slice was
    # not there at the first look (the autoscaler launches it only for this demand), so the first
    # line is logged then, whatever the timing; what the autoscaler did is its state's to show
    # (above: one node of the TPU type, launched after the CPU workers), not the line's wording.
    assert f"waiting for {TPU_HEAD}: " in log, log[-4000:]

    events = _events(run)
    timeline = {"cpu_workers_up": watch.first_up[CPU_TYPE], "shards_done": events["shard_stage_end"],
                "cpu_workers_released": watch.gone[CPU_TYPE], "tpu_node_up": watch.first_up[TPU_TYPE], "training_done": events["train_stage_end"],
                "job_finished": finished, "nodes_released": released}
    for kind, text in launching.items():
        print(f"ray status while {kind} was launched:\n{text}")
    print(f"ray status while training:\n{during_training}\nray status at the end:\n{final}")
    print("timeline (s from submit):", json.dumps({k: round(v - submitted, 1) for k, v in timeline.items()}))
    assert timeline["shards_done"] < timeline["tpu_node_up"] < timeline["training_done"] < timeline["nodes_released"]


def test_waiting_for_a_tpu_slice_logs_and_ends_in_one_line_naming_the_resource(ray_local, caplog):
    """No node offers TPU-v4-8-head: the wait logs what it waits for, then fails after the timeout
    with one line naming the resource and the config field, and leaves no placement group behind."""
    import logging

    from ray.util.placement_group import placement_group_table

    from tpu_ray.cluster.placement import reserve_tpu_slice
    from tpu_ray.config import RunConfig
    from tpu_ray.errors import UserError

    timeout = RunConfig.from_dict({"train": {"tpu_wait_timeout_s": 3}}).train.tpu_wait_timeout_s
    with caplog.at_level(logging.INFO, logger="tpu_ray.cluster.placement"):
        with pytest.raises(UserError) as err:
            reserve_tpu_slice(TPU_HEAD, timeout)
    from tpu_ray.errors import FailureKind

    assert err.value.kind is FailureKind.NO_CAPACITY and not err.value.kind.retryable  # the wait was the retry
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"train.tpu_wait_timeout_s=3: no free {TPU_HEAD} within 3s (")
    assert "ray status" in message
    assert any(r.getMessage().startswith(f"waiting for {TPU_HEAD}: ") for r in caplog.records), caplog.text
    assert all(pg["state"] == "REMOVED" for pg in placement_group_table().values())
