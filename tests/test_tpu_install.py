"""One TensorFlow on a TPU host (issue 48): the [tpu] extra resolves to tensorflow-tpu alone with the
libtpu its wheel pins, and doctor names the distribution that provides `tensorflow` and refuses two.
doctor also plans the generations rented today (v5e, v6e), multi-host included."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.helpers import tiny_config
from tpu_ray.accelerators import TPU_LIBTPU, TPU_TENSORFLOW
from tpu_ray.doctor.checks import FAIL, WARN, Doctor, run_doctor
from tpu_ray.doctor.targets import parse_target
from tpu_ray.tf_install import TensorflowInstall, installed

REPO = Path(__file__).resolve().parents[1]
# Distributions that write the `tensorflow/` package (PyPI's TensorFlow builds).
TENSORFLOW_DISTRIBUTIONS = {"tensorflow", "tensorflow-tpu", "tensorflow-cpu", "tensorflow-intel", "tensorflow-gpu",
                            "tensorflow-macos", "tensorflow-aarch64", "tensorflow-rocm", "tf-nightly",
                            "tf-nightly-tpu", "tf-nightly-cpu", "intel-tensorflow"}
OFFLINE = re.compile(r"NewConnectionError|Failed to establish|Network is unreachable|name resolution|"
                     r"ProxyError|Max retries exceeded|ConnectTimeout", re.I)


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def resolve(*requirements: str) -> dict[str, str]:
    """{distribution: version} pip would install for `requirements` into an empty environment."""
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--report", "-", "--ignore-installed", "--quiet",
           "--disable-pip-version-check", *requirements]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode and OFFLINE.search(done.stderr):
        if os.environ.get("TPU_RAY_REQUIRE_EXTRAS"):
            pytest.fail(f"PyPI unreachable and TPU_RAY_REQUIRE_EXTRAS is set: {done.stderr.strip()[-300:]}")
        pytest.skip(f"PyPI unreachable, the TPU install cannot be resolved here: {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    return {_name(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}


def tpu_extra() -> list[str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["tpu"]


@pytest.mark.slow  # two pip resolutions against PyPI (metadata only): ~20-40 s
def test_the_tpu_install_resolves_one_tensorflow_with_its_libtpu():
    plan = resolve(*tpu_extra())
    assert TENSORFLOW_DISTRIBUTIONS & set(plan) == {"tensorflow-tpu"}, sorted(TENSORFLOW_DISTRIBUTIONS & set(plan))
    assert plan["tensorflow-tpu"] == TPU_TENSORFLOW and plan["libtpu"] == TPU_LIBTPU, plan
    assert "tf-keras" not in plan  # it comes --no-deps from deploy/tpu-finish-install.sh
    finish = (REPO / "deploy" / "tpu-finish-install.sh").read_text()
    assert re.search(r'pip install "\$@" --no-deps "tf-keras==\$keras"', finish)
    # What the check guards against, so it can fail: tf-keras with its dependencies brings `tensorflow`.
    both = resolve(*tpu_extra(), "tf-keras==" + TPU_TENSORFLOW.rsplit(".", 1)[0] + ".*")
    assert TENSORFLOW_DISTRIBUTIONS & set(both) == {"tensorflow", "tensorflow-tpu"}, sorted(both)


@pytest.mark.quick
def test_a_tpu_host_needs_tensorflow_tpu_alone_with_its_libtpu():
    right = TensorflowInstall((f"tensorflow-tpu {TPU_TENSORFLOW}",), f"libtpu {TPU_LIBTPU}")
    assert right.problem(tpu=True) is None
    assert right.describe == f"tensorflow from tensorflow-tpu {TPU_TENSORFLOW}, libtpu {TPU_LIBTPU}"
    newer_libtpu = TensorflowInstall((f"tensorflow-tpu {TPU_TENSORFLOW}",), "libtpu 0.0.52")
    assert "found tensorflow from tensorflow-tpu" in newer_libtpu.problem(tpu=True)[0]
    cpu_wheel = TensorflowInstall((f"tensorflow {TPU_TENSORFLOW}",), None)
    assert cpu_wheel.problem(tpu=False) is None and cpu_wheel.problem(tpu=True)
    # Here (the test venv): exactly one distribution, `tensorflow`, and no libtpu.
    here = installed()
    assert [p.split()[0] for p in here.providers] == ["tensorflow"] and here.libtpu is None, here


def _fake_distribution(site: Path, name: str, version: str, package: str) -> None:
    """An installed distribution as pip leaves it: NAME-VERSION.dist-info with METADATA, top_level.txt."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "top_level.txt").write_text(package + "\n")
    (info / "RECORD").write_text(f"{package}/__init__.py,,\n")


@pytest.mark.quick
def test_doctor_names_two_tensorflows_and_fails(tmp_path, monkeypatch, small_corpus):
    """(doctor's tensorflow check alone: the whole doctor imports TensorFlow for its plan)"""
    """A site with tensorflow-tpu and libtpu beside this venv's `tensorflow`: two providers."""
    site = tmp_path / "site"
    _fake_distribution(site, "tensorflow-tpu", TPU_TENSORFLOW, "tensorflow")
    _fake_distribution(site, "libtpu", TPU_LIBTPU, "libtpu")
    monkeypatch.syspath_prepend(str(site))
    out = io.StringIO()
    cfg = tiny_config(tmp_path / "run", small_corpus)
    check = Doctor(cfg, parse_target("v6e-8", cfg), False, out).check_tensorflow()  # doctor's own check
    status, text = check.status, f"{check.evidence} fix: {check.fix}"
    assert status == FAIL, out.getvalue()
    assert re.search(rf"2 distributions write the tensorflow package \(tensorflow \S+, tensorflow-tpu "
                     rf"{re.escape(TPU_TENSORFLOW)}\)", text), text
    assert "fix: pip uninstall -y tensorflow tensorflow-tpu; pip install -e 'tpu-ray[tpu]', then deploy/tpu-finish" in text
    done = subprocess.run([sys.executable, "-m", "tpu_ray.tf_install", "--tpu"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"})
    assert done.returncode == 1 and "2 distributions write the tensorflow package" in done.stderr, done.stderr


@pytest.mark.slow  # the plan imports TensorFlow: ~20 s alone, over a minute on a busy machine
def test_doctor_plans_the_v5e_and_v6e_slices_rented_today(tmp_path, small_corpus):
    cfg = tiny_config(tmp_path / "run", small_corpus, **{"train.batch_size": 32})
    for target, hosts, hbm in [("v5litepod-16", 4, 16), ("v6e-8", 1, 32)]:
        out = io.StringIO()
        code = run_doctor(cfg, target=target, out=out, xla=False)
        text = out.getvalue()
        chips = int(target.rsplit("-", 1)[1])  # v5e and v6e: one chip is one replica
        assert code == 0, text
        assert (f"target {target} (tpu-vm, {chips} replicas on {chips} chips, {hosts} host{'s' if hosts > 1 else ''}, "
                f"{hbm} GB each") in text, text
        plan = [line for line in text.splitlines() if "capacity plan" in line]
        assert plan and "chip-hours" in plan[0], text
        # On this CPU host: planned for a TPU, the TensorFlow here is named, and is not the TPU's (WARN).
        (line,) = [line for line in text.splitlines() if line[6:21].strip() == "tensorflow"]
        assert line.startswith(WARN) and "tensorflow from tensorflow " in line, line
