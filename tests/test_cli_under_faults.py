"""Faults and damaged run directories (checkpoints, diverged losses, bad input, locks, an unreachable
Ray) as the CLI meets them: real `tpu-ray` processes on real run directories, real checkpoints, real
TFRecord shards, the GCS emulator for gs://.

Each test damages or races a run directory the way a user (or a crash) would, runs the CLI, and
asserts what the user sees: one line naming the file and the fix (exit 2), or a warning and a correct
resume; never a silent restart, never the wrong file blamed. `cli` runs the command line's `main` in
this process (training placed locally, no Ray: nothing outlives the call, and no TensorFlow start-up
per command); `tpu_ray` runs it as a separate process where the process is the point (a Ray address,
two racing writers); `in_one_process` runs several commands in one fresh process, each through `main`,
where only a fresh TensorFlow is the point (CPU replicas, which TensorFlow fixes at its start).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.test_doctor import prepared_run

TRAIN = ("train.placement=local",)


def tpu_ray(*args: str, cwd: Path, timeout: float = 600, wait: bool = True):
    """Run the real command line in its own process (the console script's `main`)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2", "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = [sys.executable, "-m", "tpu_ray.cli", *args]
    if not wait:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


IN_ONE_PROCESS = """
import contextlib, io, json, sys
from tpu_ray.cli import main
done = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    done.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(done))
"""


def in_one_process(*argvs: list[str], cwd: Path, timeout: float = 600) -> list[subprocess.CompletedProcess]:
    """Commands that need a fresh process (train.cpu_replicas: TensorFlow fixes its CPU devices at its
    start) run one after another in one fresh process, each through the command line's `main` as
    `cli` runs it here: one process and one TensorFlow start for all of them, in `tpu_ray`'s shape."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2", "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.run([sys.executable, "-c", IN_ONE_PROCESS, json.dumps([list(a) for a in argvs])], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [subprocess.CompletedProcess(["tpu-ray", *argv], code, out, err)
            for argv, (code, out, err) in zip(argvs, json.loads(proc.stdout.strip().splitlines()[-1]))]


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The command line's `main` in this process, as the console script calls it: its exit code and
    what it printed, in the shape `tpu_ray` returns."""
    import contextlib
    import io

    from tpu_ray.cli import main

    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(["tpu-ray", *args], code, out.getvalue(), err.getvalue())


def error_line(proc) -> str:
    """The one error line: exit 2, the last line of stderr, no traceback."""
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines and lines[-1].startswith("tpu-ray: error: "), proc.stderr[-3000:]
    return lines[-1]


def events(run: Path, name: str) -> list[dict]:
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in records if r.get("event") == name]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, small_corpus, tiny_tokenizer_dir) -> Path:
    """A run trained by `tpu-ray train` to step 20 with checkpoints ckpt-10 and ckpt-20."""
    root = tmp_path_factory.mktemp("trained")
    cfg = prepared_run(root / "run", small_corpus, tiny_tokenizer_dir)
    (root / "cfg.yaml").write_text(cfg.to_yaml())
    proc = cli("train", "--config", str(root / "cfg.yaml"), *TRAIN, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {"ckpt-10.index", "ckpt-20.index"} <= {p.name for p in (root / "run" / "checkpoints").iterdir()}
    return root


def copy_run(trained: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A private copy of the trained run (its saved config names the copy's directory)."""
    run = tmp_path / "run"
    shutil.copytree(trained / "run", run)
    from tpu_ray.config import RunConfig

    cfg = RunConfig.from_yaml(trained / "cfg.yaml").override({"output_dir": str(run)})
    (run / "config.yaml").write_text(cfg.to_yaml())
    (tmp_path / "cfg.yaml").write_text(cfg.to_yaml())
    return run, tmp_path / "cfg.yaml"


# ------------------------------------------------------------------------------------------------
# 1. Checkpoints: never restart silently, never blame the wrong file
# ------------------------------------------------------------------------------------------------
def test_missing_index_of_latest_checkpoint_resumes_from_the_previous_one_with_a_warning(trained, tmp_path):
    run, cfg = copy_run(trained, tmp_path)
    (run / "checkpoints" / "ckpt-20.index").unlink()
    proc = cli("train", "--resume", "--config", str(cfg), *TRAIN, "train.steps=30", "train.extend_schedule=true", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ckpt-20.index is missing" in proc.stderr and f"resuming from {run}/checkpoints/ckpt-10" in proc.stderr
    resumed = events(run, "resume")
    assert resumed[-1]["step"] == 10 and resumed[-1]["checkpoint"].endswith("ckpt-10")
    assert (run / "checkpoints" / "ckpt-30.index").exists()
    assert (run / "checkpoints" / "ckpt-10.index").exists()  # the intact older checkpoint is not pruned


def test_damaged_checkpoints_refuse_a_fresh_start(trained, tmp_path):
    run, cfg = copy_run(trained, tmp_path)
    (run / "checkpoints" / "ckpt-20.index").unlink()
    (run / "checkpoints" / "checkpoint").unlink()
    line = error_line(cli("train", "--config", str(cfg), *TRAIN, cwd=tmp_path))
    assert "already has checkpoints; pass --resume" in line
    assert (run / "checkpoints" / "ckpt-10.index").exists()


def test_no_complete_checkpoint_is_one_line_naming_the_missing_file(trained, tmp_path):
    run, cfg = copy_run(trained, tmp_path)
    for index in (run / "checkpoints").glob("*.index"):
        index.unlink()
    line = error_line(cli("train", "--resume", "--config", str(cfg), *TRAIN, "train.steps=30", "train.extend_schedule=true", cwd=tmp_path))
    assert f"{run}/checkpoints/ckpt-20.index is missing" in line and "no other checkpoint is complete" in line
    assert not (run / "checkpoints" / "ckpt-30.index").exists()


def test_flipped_byte_in_a_checkpoint_names_the_checkpoint_and_the_fix(trained, tmp_path):
    run, cfg = copy_run(trained, tmp_path)
    data = next((run / "checkpoints").glob("ckpt-20.data-*"))
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    data.write_bytes(bytes(raw))
    line = error_line(cli("train", "--resume", "--config", str(cfg), *TRAIN, "train.steps=30", "train.extend_schedule=true", cwd=tmp_path))
    assert f"{run}/checkpoints/ckpt-20: checkpoint is corrupt" in line
    assert "tpu-ray shard" not in line and ".tfrecord" not in line  # not blamed on the shards
    assert f"delete {run}/checkpoints/ckpt-20.*" in line
    # The fix the line names works: the previous checkpoint takes over.
    for f in (run / "checkpoints").glob("ckpt-20.*"):
        f.unlink()
    proc = cli("train", "--resume", "--config", str(cfg), *TRAIN, "train.steps=30", "train.extend_schedule=true", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert events(run, "resume")[-1]["step"] == 10


def test_diverged_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path, small_corpus,
                                                                                tiny_tokenizer_dir):
    cfg = prepared_run(tmp_path / "run", small_corpus, tiny_tokenizer_dir, **{
        "train.learning_rate": 1e30, "train.warmup_steps": 0, "train.checkpoint_every": 1, "train.log_every": 1})
    (tmp_path / "cfg.yaml").write_text(cfg.to_yaml())
    proc = cli("train", "--config", str(tmp_path / "cfg.yaml"), *TRAIN, cwd=tmp_path)
    line = error_line(proc)
    assert "loss=nan" in proc.stderr or "loss=inf" in proc.stderr  # the log line prints it, no TypeError
    assert "training stopped; the last good checkpoint is kept" in line
    step = int(line.split("step ", 1)[1].split(":", 1)[0])
    saved = sorted(int(p.name[5:-6]) for p in (tmp_path / "run" / "checkpoints").glob("ckpt-*.index"))
    assert all(s < step for s in saved), (saved, line)  # nothing after the divergence was saved
    assert (f"ckpt-{saved[-1]}" in line) if saved else "none yet" in line
    assert events(tmp_path / "run", "nonfinite")[-1]["step"] == step


def test_diverged_loss_continues_when_configured(tmp_path, small_corpus, tiny_tokenizer_dir):
    cfg = prepared_run(tmp_path / "run", small_corpus, tiny_tokenizer_dir, **{
        "train.learning_rate": 1e30, "train.warmup_steps": 0, "train.steps": 6, "train.checkpoint_every": 2,
        "train.log_every": 1, "train.on_nan": "continue"})
    (tmp_path / "cfg.yaml").write_text(cfg.to_yaml())
    proc = cli("train", "--config", str(tmp_path / "cfg.yaml"), *TRAIN, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "continuing (train.on_nan=continue)" in proc.stderr
    assert events(tmp_path / "run", "nonfinite")


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
@pytest.mark.quick
def test_config_floats_refuse_inf_and_nan(value, tmp_path):
    line = error_line(cli("tokenizer", "--output-dir", str(tmp_path / "out"), f"train.learning_rate={value}",
                          cwd=tmp_path))
    assert "train.learning_rate=" in line
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------------
# 2. A refused input must not block its own fix (same directory, corrected command)
# ------------------------------------------------------------------------------------------------
def _refused_then_fixed(tmp_path: Path, stage: str, corpus: Path, bad: list[str], good: list[str],
                        needle: str | None) -> None:
    base = [stage, "--corpus", str(corpus), "--output-dir", str(tmp_path / "run"), "tokenizer.vocab_size=200"]
    first = tpu_ray(*base, *bad, cwd=tmp_path)
    if needle is None:  # refused some other way (its one-line form belongs to the bad-input catalogue)
        assert first.returncode != 0, first.stderr[-2000:]
    else:
        assert needle in error_line(first)
    second = tpu_ray(*base, *good, cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "belongs to a different config" not in second.stderr


def test_wrong_encoding_then_fixed(tmp_path, small_corpus):
    text = small_corpus.read_bytes()[:60_000]
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes(text + "caf\u00e9 cr\u00e8me\n".encode("latin-1") + text)  # past the preflight's sniff
    _refused_then_fixed(tmp_path, "tokenizer", corpus, ["corpus.encoding_errors=fail"],
                        ["corpus.encoding_errors=replace"], "not UTF-8")


def test_missing_jsonl_field_then_fixed(tmp_path, small_corpus):
    lines = [s for s in small_corpus.read_text().splitlines() if s.strip()][:800]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"body": s}) + "\n" for s in lines))
    _refused_then_fixed(tmp_path, "tokenizer", corpus, [], ["corpus.text_field=body"], "has no field 'text'")


def test_parquet_without_the_column_then_fixed(tmp_path, small_corpus):
    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = [s for s in small_corpus.read_text().splitlines() if s.strip()][:800]
    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"body": lines}), corpus)
    _refused_then_fixed(tmp_path, "tokenizer", corpus, [], ["corpus.text_field=body"], None)


def test_bad_seed_then_fixed(tmp_path, small_corpus):
    _refused_then_fixed(tmp_path, "tokenizer", small_corpus, ["seed=-1"], ["seed=1"], "seed=-1")


@pytest.mark.slow  # about 1-2 minutes on 2 cores: the slow set (CI runs it too)
def test_batch_not_divisible_by_replicas_then_fixed(tmp_path, small_corpus, tiny_tokenizer_dir):
    cfg = prepared_run(tmp_path / "run", small_corpus, tiny_tokenizer_dir, **{"train.steps": 4,
                                                                              "train.cpu_replicas": 2})
    (tmp_path / "cfg.yaml").write_text(cfg.to_yaml())
    args = ("train", "--config", str(tmp_path / "cfg.yaml"), *TRAIN)
    # Refused, then the fixed command: both in one fresh process with 2 CPU devices (one TensorFlow start).
    refused, proc = in_one_process([*args, "train.batch_size=15"], [*args, "train.batch_size=16"], cwd=tmp_path)
    line = error_line(refused)
    assert "train.batch_size=15 is not divisible by the 2 replicas" in line
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Once checkpoints exist they pin the config: now a different batch size is refused (before
    # TensorFlow picks its devices: this command runs in this process).
    line = error_line(cli(*args, "--resume", "train.batch_size=8", cwd=tmp_path))
    assert "belongs to a different config (train.batch_size: saved 16, now 8)" in line


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_unreachable_ray_is_one_line_in_seconds_then_fixed(tmp_path, small_corpus):
    """ray.address with nothing listening: one line (the subprocess timeout bounds the wait; Ray's
    own reconnect loop would take ten minutes), and the corrected command then shards."""
    base = ["shard", "--corpus", str(small_corpus), "--output-dir", str(tmp_path / "run"),
            "tokenizer.vocab_size=200", "shard.unit_bytes=65536", "ray.num_cpus=1"]
    line = error_line(tpu_ray(*base, "ray.address=127.0.0.1:1", cwd=tmp_path, timeout=120))
    assert "ray.address=127.0.0.1:1: no Ray cluster answers there" in line
    done = cli("tokenizer", *base[1:], cwd=tmp_path)  # no Ray, no TensorFlow: no process of its own needed
    assert done.returncode == 0, done.stderr[-3000:]
    proc = tpu_ray(*base, "ray.address=local", cwd=tmp_path)  # a cluster of its own, not another user's
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "shards" / "manifest.json").read_text())["complete"]


# ------------------------------------------------------------------------------------------------
# 3. One run directory, one writer
# ------------------------------------------------------------------------------------------------
def _holder(run: Path) -> dict:
    try:
        return json.loads((run / ".lock").read_text() or "{}")
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_two_runs_into_one_directory_second_is_refused_naming_the_holder(tmp_path, small_corpus):
    run = tmp_path / "run"
    args = ["run", "--corpus", str(small_corpus), "--output-dir", str(run), "tokenizer.vocab_size=200",
            "shard.seq_len=64", "shard.unit_bytes=65536", "model.preset=tiny", "train.steps=4", "train.batch_size=8",
            "train.log_every=2", "train.eval_every=4", "train.checkpoint_every=4", "eval.samples=8",
            "train.placement=local", "ray.address=local", "ray.num_cpus=1"]
    first = tpu_ray(*args, cwd=tmp_path, wait=False)
    try:
        deadline = time.monotonic() + 300
        while _holder(run).get("pid") != first.pid:
            assert first.poll() is None, first.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the first run never took the lock"
            time.sleep(0.2)
        # The second writer: this process (refused at the lock, before Ray or TensorFlow would start).
        line = error_line(cli(*args, cwd=tmp_path))
        assert f"{run}: in use by host {os.uname().nodename} pid {first.pid}" in line and "(tpu-ray run)" in line
        out, err = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGINT)
            first.wait(timeout=60)
    assert first.returncode == 0, err[-3000:]
    assert json.loads((run / "shards" / "manifest.json").read_text())["complete"]
    assert (run / "summary.json").exists() and (run / "model" / "config.json").exists()
    assert not list(run.rglob(".tmp-*")), "temporary files left behind"
    assert _holder(run) == {}  # released


@pytest.mark.quick
def test_lock_is_released_by_a_killed_holder(tmp_path):
    """Local lock: the kernel drops a flock with its process, so a SIGKILLed run blocks nobody."""
    from tpu_ray.runlock import RunLock

    run = tmp_path / "run"
    code = (f"from tpu_ray.runlock import RunLock; import time; RunLock({str(run)!r}, 'tpu-ray test').acquire(); "
            "print('held', flush=True); time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)},
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        from tpu_ray.errors import UserError

        with pytest.raises(UserError, match=f"in use by host .* pid {holder.pid} .*tpu-ray test"):
            RunLock(str(run), "tpu-ray second").acquire()
    finally:
        holder.kill()
        holder.wait()
    with RunLock(str(run), "tpu-ray third"):
        assert _holder(run)["command"] == "tpu-ray third"


def test_gcs_lock_create_if_absent_names_the_holder_and_takes_over_a_dead_one(gcs_emulator, tmp_path):
    from tpu_ray import storage
    from tpu_ray.errors import UserError
    from tpu_ray.runlock import RunLock

    run = f"{gcs_emulator.make_bucket()}/run"
    with RunLock(run, "tpu-ray run") as first:
        with pytest.raises(UserError, match=f"in use by host .* pid {os.getpid()} .*tpu-ray run.*delete {run}/.lock"):
            RunLock(run, "tpu-ray train").acquire()
        assert json.loads(storage.read_text(f"{run}/.lock"))["token"] == first.info["token"]
    assert not storage.exists(f"{run}/.lock")  # released
    # A holder killed without releasing: the next run takes over once its lease ran out (never by
    # host and pid; tests/test_runlock.py moves the clock for the lease).
    code = (f"from tpu_ray.runlock import RunLock; import os; RunLock({run!r}, 'tpu-ray dead').acquire(); "
            "os._exit(0)")
    subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)
    dead = json.loads(storage.read_text(f"{run}/.lock"))
    assert dead["command"] == "tpu-ray dead"
    with RunLock(run, "tpu-ray next", clock=lambda: dead["renewed"] + dead["lease_s"] + 1):
        assert json.loads(storage.read_text(f"{run}/.lock"))["command"] == "tpu-ray next"


@pytest.mark.quick
def test_pick_latest_decides_from_the_state_file_and_the_files_present():
    """The pure decision behind the checkpoint cases above, one row per kind of damage."""
    from tpu_ray.errors import UserError
    from tpu_ray.train.checkpoints import pick_latest

    def files(*steps: int, parts: int = 1) -> set[str]:
        return {f"ckpt-{s}.{x}" for s in steps for x in ["index", *(f"data-{i:05d}-of-{parts:05d}" for i in range(parts))]}

    state = 'model_checkpoint_path: "ckpt-20"\n'
    assert pick_latest("d", state, files(10, 20)) == ("ckpt-20", None)
    assert pick_latest("d", None, set()) == (None, None)
    chosen, warning = pick_latest("d", state, files(10, 20) - {"ckpt-20.index"})
    assert chosen == "ckpt-10" and "d/ckpt-20.index is missing" in warning and "resuming from d/ckpt-10" in warning
    chosen, warning = pick_latest("d", state, files(10, 20, parts=2) - {"ckpt-20.data-00001-of-00002"})
    assert chosen == "ckpt-10" and "ckpt-20.data-00001-of-00002 is missing" in warning
    chosen, warning = pick_latest("d", None, files(10, 20))  # state file lost: the newest complete one
    assert chosen == "ckpt-20" and "d/checkpoint is missing" in warning
    with pytest.raises(UserError, match="d/ckpt-20.index is missing .* no other checkpoint is complete"):
        pick_latest("d", state, files(20) - {"ckpt-20.index"})
    # Nothing ever committed, the first checkpoint cut before its index: start at 0, saying so.
    chosen, warning = pick_latest("d", None, files(10) - {"ckpt-10.index"} | {"ckpt-10.position.json"})
    assert chosen is None and "no checkpoint was ever completed (ckpt-10 was interrupted" in warning


@pytest.mark.quick
def test_every_entry_point_checks_the_corpus_before_writing_the_run_dir(tmp_path, capsys):
    """One stage layer: the `prepare` Ray job refuses a missing corpus as `tpu-ray shard` does,
    before the run directory exists (the job used to skip that check)."""
    from jobs import _entry
    config = tmp_path / "c.yaml"
    config.write_text("name: t\n")
    code = _entry.main("prepare", ["--config", str(config), "--output-dir", str(tmp_path / "run"),
                                   "--corpus", str(tmp_path / "nope.txt")])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 2 and out[-1].startswith("tpu-ray: error: ") and "nope.txt" in out[-1]
    assert not (tmp_path / "run").exists()


@pytest.mark.quick
def test_create_if_absent_creates_once(tmp_path):
    """The lock's primitive: the second create of one path reports that it exists and keeps the
    first content. (On gs:// it is `ifGenerationMatch=0`; the emulator ignores preconditions, so
    the gs:// lock test above also reads the lock back.)"""
    from tpu_ray import storage

    path = str(tmp_path / "lock")
    assert storage.create_if_absent(path, b"first") is True
    assert storage.create_if_absent(path, b"second") is False
    assert storage.read_bytes(path) == b"first"
