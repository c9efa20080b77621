"""One TensorFlow on a TPU host: the [tpu] extra resolves to tensorflow-tpu alone with the
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
    check = Doctor(cfg, parse_target("v6e-8", cfg.train), False, out).check_tensorflow()  # doctor's own check
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


# The libtpu wheel as pip installs it (tests/data/libtpu-wheel: its __init__.py and dist-info, taken
# from libtpu-0.0.10-py3-none-manylinux_2_27_x86_64.whl), with a stand-in for its 320 MB libtpu.so:
# what is chosen is a path, and nothing here loads it.
LIBTPU_WHEEL = REPO / "tests" / "data" / "libtpu-wheel"


@pytest.fixture
def libtpu_site(tmp_path, monkeypatch) -> Path:
    """A site directory holding the libtpu wheel's real layout, on sys.path; the libtpu variables
    of this process restored afterwards."""
    import shutil

    site = tmp_path / "site"
    shutil.copytree(LIBTPU_WHEEL, site)
    (site / "libtpu" / "libtpu.so").write_bytes(b"\x7fELF")  # the shared library's place
    monkeypatch.syspath_prepend(str(site))
    for key in ("TPU_LIBRARY_PATH", "TPU_RAY_LIBTPU", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH", "TPU_ACCELERATOR_TYPE"):
        monkeypatch.setenv(key, "")  # recorded, so that what settle_pjrt_library sets is undone
        monkeypatch.delenv(key)
    return site


def _doctor(tmp_path, small_corpus, target: str):
    cfg = tiny_config(tmp_path / "run", small_corpus)
    return Doctor(cfg, parse_target(target, cfg.train), False, io.StringIO())


@pytest.mark.quick
def test_tensorflow_loads_the_libtpu_wheels_library_not_the_images_unless_asked(libtpu_site, tmp_path):
    from tpu_ray.cluster.tpu_env import choose_libtpu, settle_pjrt_library
    from tpu_ray.errors import RefusingEnvironment, UserError

    wheel = str(libtpu_site / "libtpu" / "libtpu.so")
    image = tmp_path / "image-libtpu.so"
    image.write_bytes(b"\x7fELF")
    chosen = choose_libtpu({}, image=str(image))  # both there: the wheel's, the one TensorFlow was built for
    assert (chosen.path, chosen.source) == (wheel, "wheel")
    assert chosen.why == (f"the libtpu {TPU_LIBTPU} wheel, the one tensorflow-tpu was built for; not the image's "
                          f"{image} (TPU_RAY_LIBTPU=image loads that)")
    asked = choose_libtpu({"TPU_RAY_LIBTPU": "image"}, image=str(image))
    assert (asked.path, asked.source) == (str(image), "image")
    assert asked.why == (f"the TPU VM image's, as TPU_RAY_LIBTPU=image asks; tensorflow-tpu {TPU_TENSORFLOW} was "
                         f"built for libtpu {TPU_LIBTPU}")
    assert choose_libtpu({"TPU_LIBRARY_PATH": "/opt/mine/libtpu.so"}, image=str(image)).path == "/opt/mine/libtpu.so"
    with pytest.raises(RefusingEnvironment, match=r"^TPU_RAY_LIBTPU=image: no /nowhere/libtpu.so on this host; "
                                                  r"unset it to load the libtpu wheel's$"):
        choose_libtpu({"TPU_RAY_LIBTPU": "image"}, image="/nowhere/libtpu.so")
    with pytest.raises(UserError, match=r"^TPU_RAY_LIBTPU=newest: expected image \(the TPU VM image's .*\) or wheel"):
        choose_libtpu({"TPU_RAY_LIBTPU": "newest"}, image=str(image))
    # The TF client of a one-host slice, before TensorFlow loads: the image's path its environment
    # names (PJRT) becomes the wheel's, and TensorFlow's TPU library loader is told the same.
    os.environ["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] = "/lib/libtpu.so"
    settle_pjrt_library("tpu")
    assert os.environ["TPU_LIBRARY_PATH"] == os.environ["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] == wheel
    # Asked for on the submitting machine, the image's libtpu is asked for on the slice's client too.
    from tpu_ray.cluster.tpu_slice import TpuSlice

    os.environ["TPU_RAY_LIBTPU"] = "image"
    assert TpuSlice("slice-a", "v4-8", ("node-0",)).client_env()["TPU_RAY_LIBTPU"] == "image"


@pytest.mark.quick
def test_doctor_names_the_libtpu_tensorflow_would_load(libtpu_site, tmp_path, small_corpus):
    check = _doctor(tmp_path, small_corpus, "v6e-8").check_libtpu()
    wheel = libtpu_site / "libtpu" / "libtpu.so"
    assert check.status == "PASS"
    assert check.evidence.startswith(f"would load {wheel} (the libtpu {TPU_LIBTPU} wheel, the one tensorflow-tpu "
                                     f"was built for"), check.evidence


@pytest.mark.quick
def test_doctor_fails_a_tpu_vm_without_libtpu(tmp_path, small_corpus, monkeypatch):
    """This venv has no libtpu; a TPU VM's runtime names its accelerator type."""
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v6e-8")
    monkeypatch.delenv("TPU_LIBRARY_PATH", raising=False)
    check = _doctor(tmp_path, small_corpus, "v6e-8").check_libtpu()
    assert check.status == FAIL and check.evidence.startswith("this TPU VM has none (no libtpu wheel"), check.evidence
    assert check.fix.startswith("install with pip install -e 'tpu-ray[tpu]'")
    monkeypatch.delenv("TPU_ACCELERATOR_TYPE")  # planning the same slice from a CPU host: a warning
    assert _doctor(tmp_path, small_corpus, "v6e-8").check_libtpu().status == WARN


def _site_without_tensorflow(tmp_path: Path) -> Path:
    """This venv's site-packages less every TensorFlow distribution: links to everything else."""
    import sysconfig

    site = tmp_path / "no-tensorflow"
    site.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.lower().startswith(("tensorflow", "tf_keras", "tf-keras", "__editable__", "tpu_ray")) \
                and entry.suffix != ".pth":
            (site / entry.name).symlink_to(entry)
    return site


@pytest.mark.quick
@pytest.mark.parametrize("extra, target, line, fix", [
    (None, "a100", "no TensorFlow installed (no distribution provides the tensorflow package)",
     "pip install -e 'tpu-ray[gpu]'"),
    ("tensorflow-tpu", "a100", f"tensorflow-tpu {TPU_TENSORFLOW} is a TPU build of TensorFlow: it has no CUDA "
                               f"kernels, so a GPU run would train on the CPU",
     "pip uninstall -y tensorflow-tpu libtpu; pip install -e 'tpu-ray[gpu]'"),
], ids=["no-tensorflow", "tpu-build-for-a-gpu"])
def test_doctor_fails_a_missing_tensorflow_and_a_tpu_build_for_a_gpu(tmp_path, small_corpus, extra, target, line, fix):
    """`tpu-ray doctor` in an environment without TensorFlow (this venv's packages less TensorFlow),
    and with tensorflow-tpu's metadata alone: FAIL with the fix; the checks that load TensorFlow are
    not run."""
    site = _site_without_tensorflow(tmp_path)
    if extra:
        _fake_distribution(tmp_path / "extra", extra, TPU_TENSORFLOW, "tensorflow")
    config = tmp_path / "run.yaml"
    config.write_text(f"name: t\noutput_dir: {tmp_path / 'run'}\ncorpus: {{source: {small_corpus}}}\n"
                      "model: {preset: tiny}\nshard: {seq_len: 64}\ntrain: {batch_size: 16}\n")
    path = os.pathsep.join([str(REPO), *([str(tmp_path / "extra")] if extra else []), str(site)])
    done = subprocess.run([sys.executable, "-S", "-m", "tpu_ray.cli", "doctor", "--config", str(config),
                           "--target", target], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": path})
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    at = next(i for i, text in enumerate(lines) if text.startswith(f"{FAIL}  tensorflow"))
    assert lines[at] == f"{FAIL}  tensorflow      {line}", done.stdout
    assert lines[at + 1].strip() == f"fix: {fix}"
    assert any(text.startswith(f"{WARN}  other checks    not run") for text in lines), done.stdout
