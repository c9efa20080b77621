"""What a new user meets at a run's start: a fill-mask sentence without a mask fails
before any training, a run's first lines say which Ray cluster it uses and warn of a warm-up longer
than a shortened run, `--help` points to the options reference, and the learning benchmark's
default is the recipe jobs/configs ship."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tests.helpers import REPO
from tpu_ray.cli import EXIT_USAGE, main
from tpu_ray.errors import UserError

QUICKSTART = str(REPO / "jobs" / "configs" / "quickstart.yaml")


@pytest.mark.quick
def test_fill_mask_without_a_mask_fails_before_the_run_when_it_trains_its_tokenizer(tmp_path, capsys):
    """A from-scratch run's mask token is its family's (RoBERTa: <mask>), known before anything runs:
    the refusal comes before the tokenizer, Ray and the run directory."""
    run = tmp_path / "run"
    code = main(["run", "--config", QUICKSTART, "--output-dir", str(run), "--fill-mask", "no mask here",
                 "train.steps=30"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_USAGE
    assert len(err) == 1 and "contains no mask token" in err[0] and "<mask>" in err[0], err
    assert not run.exists()


def test_fill_mask_without_a_mask_fails_after_a_given_tokenizer_and_before_the_shards(
        tmp_path, small_corpus, tiny_tokenizer_dir, capsys):
    """A given tokenizer's mask token is known once the tokenizer stage has read it: the refusal
    comes then, before Ray, the shards and any training step."""
    run = tmp_path / "run"
    code = main(["run", "--config", QUICKSTART, "--corpus", str(small_corpus), "--output-dir", str(run),
                 "--fill-mask", "no mask here", f"tokenizer.path={tiny_tokenizer_dir}", "ray.address=local"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert "contains no mask token" in err.strip().splitlines()[-1], err
    assert not (run / "shards").exists() and not (run / "checkpoints").exists()


@pytest.mark.quick
def test_fill_mask_with_the_models_own_mask_token_is_accepted_up_front():
    from tpu_ray.train.export import check_fill_mask_text

    check_fill_mask_text("a <mask> b", own="<mask>")
    check_fill_mask_text("a [MASK] b", own="<mask>")  # [MASK] stands for any model's mask token
    with pytest.raises(Exception, match="contains 2 <mask>"):
        check_fill_mask_text("<mask> <mask>", own="<mask>")
    with pytest.raises(Exception, match="contains \\[MASK\\] and <mask>, two mask tokens"):
        check_fill_mask_text("The <mask> and [MASK] here.", own="<mask>")  # not one filled, one left as text


def test_a_runs_first_lines_name_the_ray_cluster_and_a_warm_up_longer_than_the_run(tmp_path):
    """`train.steps=30` with the quickstart's warm-up of 100: the learning rate never reaches its peak.
    Both that and the cluster the run will use are said before the first stage starts; the run is
    stopped there (nothing trains)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpu_ray.cli", "run", "--config", QUICKSTART, "--output-dir", str(tmp_path / "r"),
         "train.steps=30", "ray.address=local"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    deadline = time.monotonic() + 120
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line.rstrip())
            if "stage tokenizer: start" in line or time.monotonic() > deadline:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    first = "\n".join(lines)
    assert "stage tokenizer: start" in first, first
    assert "warm-up (100 steps) is not shorter than the run (train.steps=30)" in first, first
    assert "never reaches train.learning_rate" in first
    assert "ray: starting a new local Ray cluster for this run (ray.address=local)" in first, first


@pytest.mark.quick
def test_the_cluster_line_says_joined_or_started_and_why(monkeypatch):
    from tpu_ray.cluster.local import cluster_choice

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert "starting a new local Ray cluster" in cluster_choice("local")
    assert "joining the Ray cluster at" in cluster_choice("10.1.2.3:6379")
    assert cluster_choice("10.1.2.3:6379").endswith("(ray.address)")
    assert "through Ray Client" in cluster_choice("ray://10.1.2.3:10001")
    monkeypatch.setenv("RAY_ADDRESS", "10.1.2.3:6379")
    assert cluster_choice(None).endswith("(RAY_ADDRESS)")
    assert "starting a new local Ray cluster" in cluster_choice("local")  # local wins over RAY_ADDRESS
    monkeypatch.setenv("RAY_ADDRESS", "local")
    assert "(RAY_ADDRESS=local)" in cluster_choice(None)  # not "no RAY_ADDRESS"


@pytest.mark.quick
def test_auto_with_no_cluster_running_is_one_line(monkeypatch):
    """RAY_ADDRESS=auto (or ray.address=auto) and no head here: refused before the run, not Ray's
    ConnectionError as a bug. The machine's processes are not this test's: Ray finds none here."""
    from ray._private import services

    from tests.helpers import tiny_config
    from tpu_ray.cluster.local import cluster_choice
    from tpu_ray.pipeline import check_ray_address

    monkeypatch.setattr(services, "find_gcs_addresses", lambda: [])
    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir: None)
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    assert cluster_choice(None) == "ray: RAY_ADDRESS=auto asks for a Ray cluster running on this machine; none is"
    cfg = tiny_config(REPO / "runs" / "never-made", REPO / "README.md")
    with pytest.raises(UserError, match=r"^RAY_ADDRESS=auto: no Ray cluster is running on this machine;"):
        check_ray_address(cfg.ray)
    monkeypatch.delenv("RAY_ADDRESS")
    with pytest.raises(UserError, match=r"^ray.address=auto: no Ray cluster is running"):
        check_ray_address(cfg.override({"ray.address": "auto"}).ray)
    check_ray_address(cfg.override({"ray.address": "local"}).ray)  # local: nothing to find


@pytest.mark.quick
def test_run_help_points_to_the_options_reference(capsys):
    with pytest.raises(SystemExit) as done:
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "docs/options.md" in out
    assert "before any training" in out  # what --fill-mask checks, and when


def _argument_default(path, flag: str):
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == flag):
            return next(ast.literal_eval(k.value) for k in node.keywords if k.arg == "default")
    raise AssertionError(f"{path}: no {flag}")


@pytest.mark.quick
def test_the_learning_benchmarks_default_is_the_recipe_jobs_configs_ship():
    """A benchmark's default is what ships: `python benchmarks/learning.py` masks as jobs/configs do
    and trains with the quickstart's schedule, output bias and initialisation scale."""
    bench = REPO / "benchmarks" / "learning.py"
    count, prob = _argument_default(bench, "--mask-count"), _argument_default(bench, "--mask-prob")
    for path in sorted((REPO / "jobs" / "configs").glob("*.yaml")):
        train = yaml.safe_load(path.read_text()).get("train", {})
        if "mask_count" in train:
            assert (train["mask_count"], train["mask_prob"]) == (count, prob), path.name
    # The schedule and the output bias the benchmark measured are the quickstart's too.
    quickstart = yaml.safe_load((REPO / "jobs" / "configs" / "quickstart.yaml").read_text())
    shipped = (quickstart["train"]["schedule"], quickstart["train"]["decay_fraction"],
               quickstart["train"]["decay_shape"], quickstart["model"]["output_bias"],
               quickstart["model"]["initializer_range"])
    assert shipped == tuple(_argument_default(bench, flag) for flag in
                            ("--schedule", "--decay-fraction", "--decay-shape", "--output-bias", "--initializer-range"))
