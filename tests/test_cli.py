"""The command line as a user meets it: help, naming a run, the metrics table, quiet TensorFlow
commands (--verbose shows the rest), Ctrl-C and --resume. Real processes, real TensorFlow."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.test_report import make_run
from tests.test_train import _cfg, shards_dir, write_shards  # noqa: F401 - shards_dir is a fixture
from tpu_ray.cli import build_parser, main

# What a TensorFlow command on a CPU machine used to print besides our own lines.
NOISE = ("absl::InitializeLog", "Could not find cuda drivers", "cuInit", "classes are deprecated",
         "were initialized from the model checkpoint", "Device set to use", "Token authentication is enabled")


def _clis(tmp: Path, *argvs: list[str], timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """`python -m tpu_ray.cli ARGV` for each argv, in a user's environment, the processes side by side
    (output to files: neither blocks on a full pipe while the other is waited for)."""
    procs = []
    try:
        for i, argv in enumerate(argvs):
            logs = tmp / f"cli-{i}.out", tmp / f"cli-{i}.err"
            with open(logs[0], "w") as stdout, open(logs[1], "w") as stderr:
                procs.append((argv, logs, subprocess.Popen([sys.executable, "-m", "tpu_ray.cli", *argv], cwd=REPO,
                                                           stdout=stdout, stderr=stderr, env=_env())))
        done = []
        for argv, (stdout, stderr), proc in procs:
            proc.wait(timeout=timeout)
            done.append(subprocess.CompletedProcess(argv, proc.returncode, stdout.read_text(), stderr.read_text()))
        return done
    finally:
        for _, _, proc in procs:
            if proc.poll() is None:
                proc.kill()


def _env(**extra: str) -> dict:
    """The environment a user's shell has: none of the quieting a test process may have set."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CPP_MIN_LOG_LEVEL", "TRANSFORMERS_VERBOSITY", "TPU_RAY_VERBOSE")}
    return {**env, "PYTHONPATH": str(REPO), **extra}


# ---------------------------------------------------------------------------------------------- help

@pytest.mark.quick
def test_help_describes_the_tool_and_every_option_has_help(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "Pretrain a Hugging Face masked language model" in out
    assert "the command line. Bad input" not in out  # not the module docstring
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {action.dest}" for name, p in sub.choices.items() for action in p._actions
               if not isinstance(action, argparse._HelpAction) and not action.help]
    assert missing == []
    for name in ("submit", "run", "train"):
        assert "--resume" in sub.choices[name].format_help(), name
    assert "--follow" in sub.choices["logs"].format_help()
    assert "--verbose" in sub.choices["run"].format_help()


# ------------------------------------------------------------------------------------- naming a run

@pytest.mark.quick
def test_eval_takes_the_run_like_report_and_metrics(tmp_path, capsys):
    missing = tmp_path / "no-such-run"
    for argv in (["eval", str(missing)], ["eval", "--output-dir", str(missing)],
                 ["report", str(missing)], ["metrics", str(missing)]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"run directory not found: {missing}" in err and err.count("\n") == 1, argv


@pytest.mark.quick
def test_eval_reads_the_runs_saved_config(tmp_path, capsys):
    """`eval RUN` uses RUN/config.yaml; a run without checkpoints says so (not "no tokenizer")."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("name: saved\ntrain:\n  steps: 7\n")
    args = build_parser().parse_args(["eval", str(run)])
    from tpu_ray.cli import _positional_run

    assert _positional_run(args) == str(run)
    args = build_parser().parse_args(["eval", "train.steps=3", "--output-dir", str(run)])
    assert _positional_run(args) == str(run) and args.overrides == ["train.steps=3"]


# ------------------------------------------------------------------------------------- metrics table

@pytest.mark.quick
def test_metrics_default_table_is_readable(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    assert main(["metrics", str(run)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = lines[0].split()
    assert header[:3] == ["kind", "step", "time"]
    assert {"loss", "acc", "lr", "ms/step", "tokens/s", "eval_loss", "perplexity"} <= set(header)
    assert "elapsed_s" not in header and "event" not in header  # only the columns that matter
    assert "NaN" not in out and "e+09" not in out
    assert len(lines) == 21  # header + --tail 20
    assert max(len(line) for line in lines) <= 110
    # time is a wall-clock time, not seconds since 1970
    assert all(len(line.split()[2]) == 8 and line.split()[2].count(":") == 2 for line in lines[1:])

    assert main(["metrics", str(run), "--kind", "event"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["step", "time", "event", "stage", "seconds"]

    assert main(["metrics", str(run), "--all", "--tail", "0"]) == 0
    out = capsys.readouterr().out
    assert {"elapsed_s", "samples_per_s", "train_traces", "input_wait_s"} <= set(out.splitlines()[0].split())
    assert len(out.splitlines()) == 1 + 50 + 3 + 2


def test_metrics_csv_into_a_closed_pipe_ends_quietly(tmp_path):
    """`tpu-ray metrics RUN --csv | head -1`: no BrokenPipeError traceback, exit 0."""
    run = tmp_path / "run"
    run.mkdir()
    recs = [{"kind": "train", "step": i, "time": 1.7e9 + i, "loss": 1.0 / (i + 1)} for i in range(20000)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    proc = subprocess.Popen([sys.executable, "-m", "tpu_ray.cli", "metrics", str(run), "--csv"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    first = proc.stdout.readline()
    proc.stdout.close()  # what `head -1` does after its line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert first.startswith(b"kind,step,time,")
    assert "Traceback" not in err and "BrokenPipe" not in err, err


# ------------------------------------------------------------------------------ resume and Ctrl-C

@pytest.mark.quick
def test_an_existing_run_is_refused_before_anything_starts(tmp_path):
    """Checkpoints there and no --resume: exit 2 before Ray or TensorFlow are even imported."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-100"\n'
                                                    'all_model_checkpoint_paths: "ckpt-100"\n')
    code = ("import sys; from tpu_ray.cli import main; rc = main(sys.argv[1:]); "
            "print(sorted(m for m in ('tensorflow', 'ray') if m in sys.modules)); sys.exit(rc)")
    for cmd in ("run", "train"):
        proc = subprocess.run([sys.executable, "-c", code, cmd, "--config", "jobs/configs/quickstart.yaml",
                               "--output-dir", str(run)], cwd=REPO, capture_output=True, text=True, env=_env(),
                              timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert proc.stdout.strip() == "[]", cmd  # refused before importing either
        assert "already has checkpoints" in proc.stderr and "--resume" in proc.stderr
        assert "ckpt-100" in proc.stderr


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory, shards_dir, tiny_tokenizer_dir):  # noqa: F811
    """`tpu-ray train` stopped with Ctrl-C after its second checkpoint: (cfg path, run dir, result)."""
    tmp = tmp_path_factory.mktemp("ctrl-c")
    # 80 steps: after step 25 is seen there are ~55 left (seconds, not one poll) to interrupt in.
    over = {"train.steps": 80, "train.checkpoint_every": 10, "train.log_every": 5, "train.eval_every": 80,
            "train.placement": "local"}  # in this process: no Ray cluster to find or start
    cfg_path, run_dir = tmp / "cfg.yaml", tmp / "run"
    cfg_path.write_text(_cfg(run_dir, shards_dir, tiny_tokenizer_dir, **over).to_yaml())
    proc = subprocess.Popen([sys.executable, "-m", "tpu_ray.cli", "train", "--config", str(cfg_path)], cwd=REPO,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint)
    try:
        deadline = time.monotonic() + 240
        while not _train_steps(run_dir) or max(_train_steps(run_dir)) < 25:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "training never reached step 25"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return cfg_path, run_dir, proc.returncode, err


def _default_sigint() -> None:
    """In the child, SIGINT as a terminal delivers it. A suite started in the background
    (`pytest &`, nohup) inherits SIGINT ignored, as shells set it for background jobs, and Python then
    installs no KeyboardInterrupt handler: the signal would be dropped and the run finish."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _train_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    steps = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("kind") == "train":
            steps.append(rec["step"])
    return steps


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_ctrl_c_exits_130_naming_the_last_checkpoint_and_the_resume_command(interrupted_run):
    cfg_path, run_dir, rc, err = interrupted_run
    assert rc == 130, err
    assert "Traceback" not in err, err
    state = (run_dir / "checkpoints" / "checkpoint").read_text()
    latest = state.split('model_checkpoint_path: "')[1].split('"')[0].rsplit("/", 1)[-1]
    assert f"last checkpoint {run_dir / 'checkpoints' / latest}" in err, err
    assert f"tpu-ray train --config {cfg_path} --resume" in err, err


@pytest.mark.slow  # reads interrupted_run, a 30 s training, with the slow Ctrl-C test
def test_a_tensorflow_command_shows_our_lines_only(interrupted_run):
    """The interrupted `train` ran TensorFlow on a CPU: none of the library start-up lines."""
    err = interrupted_run[3]
    assert "training: strategy=default" in err and "step 5:" in err  # our own lines are there
    for line in NOISE:
        assert line not in err, line
    assert "\n\n" not in err  # no blank lines from progress bars


def _resumed(interrupted_run) -> Path:
    """The interrupted run continued to its end with `tpu-ray train --resume` (once)."""
    cfg_path, run_dir, _, _ = interrupted_run
    if not (run_dir / "model" / "config.json").exists():
        assert main(["train", "--config", str(cfg_path), "--resume"]) == 0
    return run_dir


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_resume_leaves_one_train_row_per_step(interrupted_run):
    from tpu_ray.report import load_metrics

    run_dir = _resumed(interrupted_run)
    df = load_metrics(str(run_dir), kind="train")
    steps = df["step"].tolist()
    assert steps == sorted(set(steps)) and steps[-1] == 80
    assert len(_train_steps(run_dir)) >= len(steps)  # the file keeps every record; the frame one per step


@pytest.mark.slow  # reads interrupted_run, a 30 s training, with the slow Ctrl-C test
def test_train_prints_the_summary_table_that_run_prints(interrupted_run, capsys):
    """`tpu-ray train` ends with the run's summary table, as `tpu-ray run` does (it printed JSON)."""
    from tpu_ray.report import text_summary

    cfg_path, run_dir, _, _ = interrupted_run
    capsys.readouterr()
    assert main(["train", "--config", str(cfg_path), "--resume"]) == 0
    printed = capsys.readouterr().out
    assert printed.strip() == text_summary(str(run_dir)).strip() and "loss" in printed


@pytest.mark.slow  # reads interrupted_run, a 30 s training, with the slow Ctrl-C test
def test_eval_names_the_run_like_report(interrupted_run, capsys):
    """`tpu-ray eval RUN` reads RUN/config.yaml and evaluates the last checkpoint."""
    run_dir = _resumed(interrupted_run)
    capsys.readouterr()
    assert main(["eval", str(run_dir)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["step"] == 80 and result["eval_loss"] > 0


@pytest.mark.slow  # two more TensorFlow processes: about a minute
def test_verbose_shows_the_library_lines(interrupted_run, tmp_path):
    """fill-mask on the exported model: quiet by default, the libraries' own lines with --verbose."""
    run_dir = _resumed(interrupted_run)
    quiet, loud = _clis(tmp_path, ["fill-mask", "--model", str(run_dir), "a [MASK] b", "--top-k", "2"],
                        ["fill-mask", "--model", str(run_dir / "model"), "a [MASK] b", "--verbose"])
    assert quiet.returncode == 0, quiet.stderr
    assert len(quiet.stdout.splitlines()) == 2
    for line in NOISE:
        assert line not in quiet.stderr, line
    assert loud.returncode == 0, loud.stderr
    assert "absl::InitializeLog" in loud.stderr and "Device set to use" in loud.stderr, loud.stderr


# ---------------------------------------------------------------------------------------------- docs

def _bash_blocks(path: Path) -> list[str]:
    text = path.read_text()
    return [b.split("\n", 1)[1] for b in text.split("```")[1::2] if b.startswith(("bash", "python"))]


@pytest.mark.quick
def test_documented_local_job_commands_set_up_token_auth_before_the_head_starts():
    """Ray 2.60: `ray job submit` to a token-auth head fails without RAY_AUTH_MODE=token, and a head
    started with it needs a token: every copied block that starts a local head does both first."""
    blocks = [b for doc in (REPO / "README.md", REPO / "docs" / "jobs.md", REPO / "docs" / "cluster.md")
              for b in _bash_blocks(doc) if "ray start --head" in b]
    assert len(blocks) >= 2
    for block in blocks:
        order = [block.find(s) for s in ("export RAY_AUTH_MODE=token", "ray get-auth-token --generate",
                                          "ray start --head", "ray job submit")]
        assert -1 not in order and order == sorted(order), block


@pytest.mark.quick
def test_readme_api_snippet_keeps_the_job_run_dir_out_of_the_in_process_run():
    api = next(b for b in _bash_blocks(REPO / "README.md") if "Pipeline(" in b and "submit(" in b)
    assert '"output_dir": "runs/api-run"' in api and '"output_dir": "runs/api-job"' in api


@pytest.mark.quick
def test_cluster_docs_offline_check_installs_what_it_runs():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    block = next(b for b in _bash_blocks(REPO / "docs" / "cluster.md") if "tests/test_cluster_yaml.py" in b)
    assert 'pip install -e ".[test]"' in block
    test_extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    for dist in ("pytest", "jsonschema", "google-api-python-client"):
        assert any(req.startswith(dist) for req in test_extra), dist


# ------------------------------------------------------------------------------------ the Python API

@pytest.mark.quick
def test_api_logging_shows_our_lines_and_respects_a_programs_own_logging():
    """Pipeline.run() sets this up: our INFO lines on stderr in a bare notebook; a program that set
    up logging itself gets them through its own handlers, with no second copy from us."""
    code = r"""
import logging, sys
from tpu_ray.logs import setup_api_logging
if sys.argv[1] == "own":
    logging.basicConfig(level=logging.WARNING, format="OWN %(message)s", stream=sys.stdout)
setup_api_logging()
logging.getLogger("tpu_ray").info("stage tokenizer: start")
print(len(logging.getLogger().handlers))
"""
    bare = subprocess.run([sys.executable, "-c", code, "bare"], capture_output=True, text=True, env=_env(),
                          cwd=REPO, timeout=60)
    assert "INFO tpu_ray: stage tokenizer: start" in bare.stderr, bare.stderr
    own = subprocess.run([sys.executable, "-c", code, "own"], capture_output=True, text=True, env=_env(),
                         cwd=REPO, timeout=60)
    assert "OWN stage tokenizer: start" in own.stdout and own.stdout.strip().endswith("1"), own.stdout
    assert "stage tokenizer" not in own.stderr


@pytest.mark.quick
def test_run_result_repr_is_short_and_summary_has_the_numbers():
    from tpu_ray.pipeline import RunResult

    files = [f"/runs/r/shards/train-{i:05d}-100.tfrecord" for i in range(300)]
    result = RunResult("/runs/r", {"shards": 300, "samples": 30000, "tokens": 3840000, "files": files},
                       {"steps": 300, "eval_loss": 5.1234567, "perplexity": 167.9876, "final_loss": 5.2,
                        "strategy": "_DefaultDistributionStrategy", "device": "cpu", "files_read": files},
                       seconds=93.456)
    text = repr(result)
    assert text == "RunResult(run_dir='/runs/r', steps=300, eval_loss=5.123, perplexity=168, seconds=93.5)"
    summary = result.summary()
    assert summary["strategy"] == "default (one device)" and summary["samples"] == 30000
    assert summary["model_dir"] == "/runs/r/model" and summary["perplexity"] == pytest.approx(167.9876)
    assert all(not isinstance(v, (list, dict)) for v in summary.values())


@pytest.mark.slow  # the whole pipeline in a fresh process: Ray, TensorFlow, about two minutes here
def test_pipeline_run_from_python_shows_progress_without_library_noise_on_a_loopback_only_cluster(
        tmp_path, small_corpus):
    """The pipeline from Python in a fresh process: our progress lines, no library noise. The Ray
    cluster that run started for itself (ray.address=local) is still up afterwards, and it is read
    too (GCS, raylet and the agents once listened on every interface): its node
    address and every socket its processes listen on are loopback only."""
    code = f"""
from tpu_ray import RunConfig, Pipeline
cfg = RunConfig.from_yaml("jobs/configs/quickstart.yaml").override({{
    "output_dir": {str(tmp_path / "run")!r}, "corpus.source": {str(small_corpus)!r},
    "tokenizer.vocab_size": 800, "shard.seq_len": 64, "shard.unit_bytes": 65536, "train.steps": 10,
    "train.batch_size": 16, "train.warmup_steps": 2, "train.log_every": 5, "train.eval_every": 10,
    "eval.samples": 32, "train.checkpoint_every": 10, "ray.address": "local"}})
result = Pipeline(cfg).run()
print(repr(result))
print(sorted(result.summary()))
{LOOPBACK_CHECK}"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=_env(),
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for needle in ("stage tokenizer: start", "stage shard: done", "step 5: loss=", "eval @ step 10"):
        assert needle in proc.stderr, needle
    for line in NOISE:
        assert line not in proc.stderr, line
    first = proc.stdout.splitlines()[0]
    assert first.startswith("RunResult(run_dir=") and len(first) < 160, first
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["node_ip"] == "127.0.0.1"
    assert seen["listening"], "no listening socket found"
    assert all(ip in ("127.0.0.1", "::ffff:127.0.0.1", "::1") for ip in seen["listening"]), seen


# The cluster the process started for itself (ensure_ray, ray.address=local): its node address and the
# addresses its processes (GCS, raylet, dashboard agent, workers) listen on.
LOOPBACK_CHECK = """
import json, ray
import psutil  # Ray ships it (its thirdparty_files are on sys.path once ray is imported)
node = ray._private.worker._global_node
listening = set()
for proc in psutil.Process().children(recursive=True):
    try:
        conns = proc.net_connections(kind="inet")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        continue
    listening |= {c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN}
ray.shutdown()
print(json.dumps({"node_ip": node.node_ip_address, "listening": sorted(listening)}))
"""
