"""Ray jobs against a real Ray head: `ray job submit`, a failing job, and the Python API.

The module starts its own head with `ray start --head` (dashboard on 127.0.0.1, free ports, its own
--temp-dir, 2 CPUs) from this venv, and stops exactly that head at the end: `ray stop` would stop
every Ray process on the machine. With --temp-dir, `ray start` records its address in
<temp-dir>/ray_current_cluster, not /tmp/ray/ray_current_cluster, so a plain `ray.init()` elsewhere
on the machine does not attach to it (test_head_is_private checks that).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import wikitext_slice
from tpu_ray.config import RunConfig
from tpu_ray.cluster.jobs import EXCLUDES, STAGING_DIR, JobHandle, submit
from tpu_ray.report import load_metrics

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
QUICKSTART_REL = Path("jobs/configs/quickstart.yaml")
QUICKSTART = REPO / QUICKSTART_REL
JOB_TIMEOUT_S = 600  # a deadline against hangs, not a speed requirement
# The quickstart, shrunk to well under a minute on 2 cores: the tiny model with one layer (each job
# builds, traces and exports it in a fresh TensorFlow process: the fewer layers, the less of that),
# one checkpoint per 20 steps.
SMALL = {
    "tokenizer.vocab_size": 800, "shard.seq_len": 64, "shard.unit_bytes": 65536, "model.preset": "tiny",
    "model.num_hidden_layers": 1, "train.steps": 20, "train.batch_size": 16, "train.warmup_steps": 2,
    "train.log_every": 5, "train.eval_every": 10, "eval.samples": 32, "train.checkpoint_every": 20,
    "train.shuffle_buffer": 256,
}
RUN_DIR_FILES = ("config.yaml", "run_info.json", "tokenizer/tokenizer.json", "shards/manifest.json",
                 "metrics.jsonl", "model/config.json", "model/tf_model.h5", "summary.json")


def _free_ports(n: int) -> list[int]:
    """`n` distinct free ports: every socket stays bound until all are chosen (one at a time, the
    kernel can hand out the same port twice; CI once gave the GCS and the dashboard both 45881)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class RayHead:
    address: str  # the dashboard / Jobs API, http://127.0.0.1:<port>
    gcs_address: str
    temp_dir: str
    session_id: int  # every process of this head runs in this session (and nothing else does)

    def pids(self) -> list[int]:
        out = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True, check=True).stdout
        rows = (line.split() for line in out.splitlines())
        return [int(pid) for pid, sid in rows if int(sid) == self.session_id]

    def stop(self) -> None:
        """Stop this head only: SIGTERM its session's processes, SIGKILL what is left after 15 s."""
        for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            for pid in self.pids():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and any(not _is_zombie(p) for p in self.pids()):
                time.sleep(0.5)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def agent_not_listening(port: int, temp_dir: str, timeout_s: float = 120) -> str | None:
    """None once the head's dashboard agent listens on `port`, else why not (its log's last lines).
    `ray start` returns before the agent listens, and the Jobs API gives up on a missing agent after
    10 s: on a busy machine the first submit would fail. Wait for it here."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                return None
        except OSError:
            time.sleep(0.5)
    logs = sorted(Path(temp_dir).glob("session_*/logs/dashboard_agent*.log"))
    tail = "\n".join(logs[-1].read_text(errors="replace").splitlines()[-20:]) if logs else "(no agent log)"
    return f"the Ray dashboard agent never listened on port {port}:\n{tail}"


@contextmanager
def started_head(auth_env: dict[str, str]) -> Iterator[RayHead]:
    """`ray start --head` from this venv on loopback with free ports and its own --temp-dir."""
    # Short path: Ray's Unix sockets live under it and must stay below 108 bytes.
    temp_dir = tempfile.mkdtemp(prefix="tpu-ray-jobs-", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_API_SERVER", "RAY_AUTH"))}
    # The venv first on PATH, as after `. .venv/bin/activate`: job entrypoints run `python`.
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env.update({k: v.format(temp_dir=temp_dir) for k, v in auth_env.items()})
    if "RAY_AUTH_TOKEN_PATH" in env:
        Path(env["RAY_AUTH_TOKEN_PATH"]).write_text(secrets.token_hex(32))
    head = None
    try:
        # A port chosen here can still be taken by another process (or one of Ray's own random
        # ports) before Ray binds it: then Ray refuses to start, or the head starts and its dashboard
        # agent never listens (seen in CI under load); either way the head is stopped and new ports tried.
        for attempt in range(3):
            gcs, dashboard, client, agent = _free_ports(4)
            cmd = [str(VENV_BIN / "ray"), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={gcs}",
                   "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}", f"--temp-dir={temp_dir}",
                   "--num-cpus=2", "--disable-usage-stats",
                   # Ports Ray would otherwise take at fixed defaults (10001, 52365), shared with other heads.
                   f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}"]
            # A new session: the head's daemons inherit it, which is how stop() finds them and only them.
            proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, start_new_session=True)
            head = RayHead(f"http://127.0.0.1:{dashboard}", "", temp_dir, proc.pid)
            output, _ = proc.communicate(timeout=180)
            if proc.returncode == 0:
                output = agent_not_listening(agent, temp_dir)
                if output is None:
                    break
            elif "port" not in output.lower():
                break
            head.stop()
            head = None
            assert attempt < 2, output
        assert proc.returncode == 0, output
        head.gcs_address = (Path(temp_dir) / "ray_current_cluster").read_text().strip()
        yield head
    finally:
        if head is not None:
            head.stop()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_head() -> Iterator[RayHead]:
    # Ray 2.60 turns token auth on for `ray start --head` whenever ~/.ray/auth_token exists (any local
    # ray.init() writes it), so whether it is on would depend on what ran before on this machine.
    # Pin it off here; test_submitter_uses_the_local_token covers a head that has it on.
    with started_head({"RAY_AUTH_MODE": "disabled"}) as head:
        yield head


@pytest.fixture(scope="module")
def job_corpus(tmp_path_factory, wikitext) -> Path:
    """About 200 KB of real WikiText-2, cut at a line boundary."""
    return wikitext_slice(tmp_path_factory, 200_000, "valid-200k.txt")


def _overrides(extra: dict | None = None) -> list[str]:
    return [f"{k}={v}" for k, v in (SMALL | (extra or {})).items()]


def _ray_job_submit(head: RayHead, *entrypoint: str) -> tuple[subprocess.CompletedProcess, JobHandle]:
    """`ray job submit` as a person types it (plus excludes, so .git and friends stay home)."""
    sid = f"test-{uuid.uuid4().hex[:8]}"
    cmd = [str(VENV_BIN / "ray"), "job", "submit", "--address", head.address, "--submission-id", sid,
           "--working-dir", ".", "--runtime-env-json", json.dumps({"excludes": EXCLUDES}), "--", *entrypoint]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=JOB_TIMEOUT_S,
                          env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    return proc, JobHandle(sid, head.address)


# ------------------------------------------------------------------------------------------ tests

@pytest.mark.slow  # the head it checks takes ~35 s to start; the slow set starts it anyway for the jobs
def test_head_is_private(ray_head):
    """Our head registers in its own temp dir only: a plain ray.init() elsewhere cannot find it."""
    import ray._private.utils as ray_utils

    assert ray_utils.read_ray_address(ray_head.temp_dir) == ray_head.gcs_address
    assert ray_utils.read_ray_address() != ray_head.gcs_address  # /tmp/ray/ray_current_cluster


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_ray_job_submit_pretrain_succeeds_with_a_complete_run_dir(ray_head, job_corpus, tmp_path):
    run_dir = tmp_path / "run"
    proc, job = _ray_job_submit(ray_head, "python", "jobs/pretrain.py", "--config", str(QUICKSTART_REL),
                                "--output-dir", str(run_dir), "--corpus", str(job_corpus), *_overrides())
    log = job.logs()
    assert proc.returncode == 0, log[-3000:] + proc.stderr[-3000:]
    assert job.status() == "SUCCEEDED"
    for name in RUN_DIR_FILES:
        assert (run_dir / name).is_file(), name
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 20
    # A person can follow it: stage progress, then periodic metrics and eval lines, then the verdict.
    for needle in ("stage tokenizer: start", "stage shard: done", "stage train: start", "step 5: loss=",
                   "tokens/s", "step 20: loss=", "eval @ step 20: loss=", "perplexity="):
        assert needle in log, needle
    assert log.strip().splitlines()[-1] == f"tpu-ray pretrain: SUCCEEDED run_dir={run_dir}"


@pytest.fixture(scope="module")
def failing_jobs(ray_head, tmp_path_factory) -> dict:
    """Both failing submissions, each `ray job submit` as a person types it, side by side:
    {case: (the submit process, its job, the reason its log must end with)}."""
    from concurrent.futures import ThreadPoolExecutor

    tmp = tmp_path_factory.mktemp("failing-jobs")
    missing = tmp / "no-such-corpus.txt"
    cases = {"bad_value": (["train.steps=-5"], "train.steps=-5: Input should be greater than 0"),
             "missing_corpus": (["--corpus", str(missing)], str(missing))}

    def submitted(case: str):
        args, reason = cases[case]
        return *_ray_job_submit(ray_head, "python", "jobs/pretrain.py", "--config", str(QUICKSTART_REL),
                                "--output-dir", str(tmp / case / "run"), *args), reason

    with ThreadPoolExecutor(len(cases)) as pool:
        return dict(zip(cases, pool.map(submitted, cases)))


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
@pytest.mark.parametrize("case", ["bad_value", "missing_corpus"])
def test_failing_job_ends_failed_with_the_reason_last(failing_jobs, case):
    proc, job, reason = failing_jobs[case]
    log = job.logs()
    assert proc.returncode != 0
    assert job.status() == "FAILED"
    last = log.strip().splitlines()[-1]
    assert last.startswith("tpu-ray: error: ") and reason in last, last


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_cli_submit_wait_status_logs_metrics(ray_head, job_corpus, tmp_path, capsys, monkeypatch):
    from tpu_ray.cli import main

    monkeypatch.chdir(REPO)  # --working-dir defaults to "."
    run = tmp_path / "cli-run"
    addr = ["--address", ray_head.address]
    assert main(["submit", *addr, "--config", str(QUICKSTART_REL), "--output-dir", str(run), "--wait",
                 *_overrides({"corpus.source": job_corpus})]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    sid, status = out[0], out[-1]  # the submission id, the streamed log, the final status
    assert status == "SUCCEEDED" and any("tpu_ray.train.loop: step" in line for line in out[1:-1])
    assert f"tpu-ray pretrain: SUCCEEDED run_dir={run}" in out[1:-1]  # streamed to the log's last line
    assert main(["status", sid, *addr]) == 0 and capsys.readouterr().out.strip() == "SUCCEEDED"
    assert main(["logs", sid, *addr]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"tpu-ray pretrain: SUCCEEDED run_dir={run}"
    assert main(["logs", sid, *addr, "--follow"]) == 0  # a finished job: the whole log, then it ends
    assert f"tpu-ray pretrain: SUCCEEDED run_dir={run}" in capsys.readouterr().out
    assert main(["metrics", str(run), "--kind", "eval"]) == 0
    assert "eval_loss" in capsys.readouterr().out

    # Bad input is refused before anything is submitted, and an unknown job is one line too.
    assert main(["submit", *addr, "--config", str(QUICKSTART_REL), "train.steps=0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "tpu-ray: error: override: train.steps=0: Input should be greater than 0"
    assert main(["status", "no-such-job", *addr]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tpu-ray: error: job 'no-such-job': ") and "\n" not in err


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_following_a_running_job_stops_at_the_timeout(ray_head, capsys, monkeypatch):
    """wait(follow=True) streams while the job runs and gives up at its timeout (the job goes on)."""
    from ray.job_submission import JobSubmissionClient

    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # Ray's client lets it override the address given
    client = JobSubmissionClient(ray_head.address)
    sid = client.submit_job(entrypoint="python -u -c \"import time; print('tick', flush=True); time.sleep(300)\"")
    job = JobHandle(sid, ray_head.address)
    try:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while "tick" not in job.logs():  # running, and its log has begun
            assert time.monotonic() < deadline and job.status() in ("PENDING", "RUNNING"), job.logs()
            time.sleep(0.5)
        with pytest.raises(TimeoutError, match=f"job {sid} still RUNNING after 5"):
            job.wait(timeout=5, follow=True)
        assert job.status() == "RUNNING"
        assert "tick" in capsys.readouterr().out
    finally:
        job.stop()


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_submitter_uses_the_local_token(tmp_path):
    """A head with token auth (what `ray start` does once ~/.ray/auth_token exists): tpu-ray's client
    sends the token it finds; with RAY_AUTH_MODE=disabled it gets a one-line error naming the fix."""
    with started_head({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "{temp_dir}/auth_token"}) as head:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
        env["RAY_AUTH_TOKEN_PATH"] = f"{head.temp_dir}/auth_token"
        cmd = [str(VENV_BIN / "tpu-ray"), "status", "no-such-job", "--address", head.address]
        found, refused = _side_by_side(tmp_path, cmd, env, env | {"RAY_AUTH_MODE": "disabled"}, timeout=120)
        assert found.returncode == 2
        assert "does not exist" in found.stderr and "auth" not in found.stderr.lower(), found.stderr
        assert refused.returncode == 2
        assert refused.stderr.strip().splitlines()[-1].startswith(
            f"tpu-ray: error: the Ray cluster at {head.address} requires its auth token"), refused.stderr


def _side_by_side(tmp: Path, cmd: list[str], *envs: dict[str, str],
                  timeout: float) -> list[subprocess.CompletedProcess]:
    """`cmd` once per environment, the processes side by side (output to files: neither blocks on a
    full pipe while the other is waited for)."""
    procs = []
    try:
        for i, env in enumerate(envs):
            logs = tmp / f"proc-{i}.out", tmp / f"proc-{i}.err"
            with open(logs[0], "w") as stdout, open(logs[1], "w") as stderr:
                procs.append((logs, subprocess.Popen(cmd, env=env, stdout=stdout, stderr=stderr)))
        done = []
        for (stdout, stderr), proc in procs:
            proc.wait(timeout=timeout)
            done.append(subprocess.CompletedProcess(cmd, proc.returncode, stdout.read_text(), stderr.read_text()))
        return done
    finally:
        for _, proc in procs:
            if proc.poll() is None:
                proc.kill()


def test_example_configs_load_and_target_what_their_names_say():
    configs = {p.stem: RunConfig.from_yaml(p) for p in (REPO / "jobs" / "configs").glob("*.yaml")}
    assert {"quickstart", "roberta-base-v3-8", "roberta-base-v4-8", "roberta-base-v6e-8", "roberta-base-v4-16", "gpu"} <= set(configs)
    for name, cfg in configs.items():
        if name.startswith("roberta-base-"):
            assert cfg.model.preset == "base" and cfg.train.strategy == "tpu", name
            assert cfg.train.tpu_topology == name.removeprefix("roberta-base-"), name
            assert cfg.run_dir.startswith("gs://"), name  # a TPU host must see the run directory
    assert configs["gpu"].train.strategy == "gpu" and configs["gpu"].train.num_gpus
    assert configs["quickstart"].corpus.source.startswith("builtin:")  # no download


@pytest.mark.slow  # two jobs of a tiny run: about a minute on 2 cores
def test_prepare_then_train_jobs_through_the_python_api(ray_head, job_corpus, tmp_path):
    """The TPU workflow through the Python API: shards from a CPU job, then training on them from a
    second job, whose metrics are read while it runs and after it ends. (The whole pipeline in one job,
    submit's default stage, is what `tpu-ray submit` sends in test_cli_submit_wait_status_logs_metrics;
    these Python API reads once had a whole-pipeline job of their own, about 30 s of the slow set.)"""
    cfg = RunConfig.from_yaml(QUICKSTART).override(
        # 100 steps: seconds of RUNNING after the first rows, so the mid-run read below is not a race.
        SMALL | {"train.steps": 100, "train.eval_every": 50, "corpus.source": str(job_corpus),
                 "output_dir": str(tmp_path / "run")})
    prepare = submit(cfg, address=ray_head.address, working_dir=str(REPO), stage="prepare")
    assert prepare.run_dir == str(tmp_path / "run")
    # The staged config left with the upload (this submission's own file: another test's submission
    # may be staging its config in the same directory right now).
    assert not (REPO / STAGING_DIR / f"{prepare.submission_id}.yaml").exists()
    assert prepare.wait(timeout=JOB_TIMEOUT_S) == "SUCCEEDED", prepare.logs()[-3000:]
    assert (tmp_path / "run" / "shards" / "manifest.json").is_file()
    assert not (tmp_path / "run" / "model").exists()
    job = submit(cfg, address=ray_head.address, working_dir=str(REPO), stage="train")
    try:
        # While the job runs, load_metrics returns what has been logged so far.
        deadline = time.monotonic() + JOB_TIMEOUT_S
        live = None
        while live is None and time.monotonic() < deadline:
            rows = job.metrics(kind="train")  # empty until the job has written something
            status = job.status()  # read after the rows: RUNNING here means they were read mid-run
            if status not in ("PENDING", "RUNNING"):
                break
            if len(rows):
                live = rows
            time.sleep(0.5)
        assert live is not None, f"no train rows seen while the job ran (status {job.status()})"
        assert live["step"].is_monotonic_increasing

        assert job.wait(timeout=JOB_TIMEOUT_S) == "SUCCEEDED", job.logs()[-3000:]
    finally:
        job.stop()
    assert job.status() == "SUCCEEDED"
    assert f"tpu-ray train: SUCCEEDED run_dir={tmp_path / 'run'}" in job.logs()
    assert (tmp_path / "run" / "model" / "config.json").is_file()

    df = load_metrics(job.run_dir)
    assert {"kind", "step", "time", "loss", "accuracy", "learning_rate", "step_time_s", "samples_per_s",
            "tokens_per_s", "eval_loss", "eval_accuracy", "perplexity"} <= set(df.columns)
    train = df[df["kind"] == "train"]
    assert train["step"].tolist() == list(range(5, 101, 5))  # rising, every log_every steps
    assert train["loss"].notna().all() and (train["tokens_per_s"] > 0).all()
    assert df[df["kind"] == "eval"]["step"].tolist() == [50, 100]
    assert len(job.metrics(kind="train")) == len(train)
    assert len(live) <= len(train)

    # A bare submission id is enough to follow a job: the run dir comes from the job's metadata.
    again = JobHandle(job.submission_id, ray_head.address)
    assert again.run_dir == job.run_dir and again.status() == "SUCCEEDED"
