"""One TensorFlow for TPU: the TPU VM image and the tensorflow-tpu wheel are the same version, named
in one place (tpu_ray.accelerators.TPU_TENSORFLOW) and everywhere else in agreement with it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from tpu_ray.accelerators import TPU_LIBTPU, TPU_TENSORFLOW, TPU_TF_KERAS, tpu_hosts, tpu_runtime_version

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier

REPO = Path(__file__).resolve().parents[1]
RUNTIME = re.compile(r"tpu-vm-tf-(\d+\.\d+\.\d+)(-pod)?(-pjrt)?")
FILES = ["cluster.yaml", "docs/cluster.md", "README.md", *sorted(
    str(p.relative_to(REPO)) for p in (REPO / "jobs" / "configs").glob("*.yaml"))]


@pytest.mark.parametrize("name", FILES)
def test_every_tpu_runtime_named_is_the_one_tensorflow(name):
    text = (REPO / name).read_text()
    versions = {m.group(1) for m in RUNTIME.finditer(text)}
    assert versions <= {TPU_TENSORFLOW}, f"{name} names TPU runtime TensorFlow {versions}, not {TPU_TENSORFLOW}"
    wheels = set(re.findall(r"tensorflow-tpu[= ]=*\s*(\d+\.\d+(?:\.\d+|\.\*)?)", text))
    assert all(TPU_TENSORFLOW.startswith(v.rstrip("*").rstrip(".")) for v in wheels), (name, wheels)


def test_the_tpu_extra_installs_the_image_tensorflow_with_its_libtpu():
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["tpu"]
    assert f"tensorflow-tpu=={TPU_TENSORFLOW}" in extra and f"libtpu=={TPU_LIBTPU}" in extra
    # tf-keras is not in the extra (it would bring the distribution `tensorflow`, a second TensorFlow):
    # deploy/tpu-finish-install.sh installs TPU_TF_KERAS without dependencies.
    assert not [r for r in extra if r.startswith("tf-keras")]
    assert TPU_TF_KERAS.startswith(TPU_TENSORFLOW.rsplit(".", 1)[0])
    tensorboard = [r for r in extra if r.startswith("tensorboard")]
    assert tensorboard == [f"tensorboard~={TPU_TENSORFLOW.rsplit('.', 1)[0]}.0"], tensorboard  # what the wheel needs


def test_cluster_yaml_boots_the_runtime_of_its_slice_shape():
    config = yaml.safe_load((REPO / "cluster.yaml").read_text())
    tpu_types = {n: t for n, t in config["available_node_types"].items() if "acceleratorType" in t["node_config"]}
    assert tpu_types
    for name, node_type in tpu_types.items():
        accel = node_type["node_config"]["acceleratorType"]
        assert node_type["node_config"]["runtimeVersion"] == tpu_runtime_version(tpu_hosts(accel) > 1), name
    docs = (REPO / "docs" / "cluster.md").read_text()
    assert tpu_runtime_version(True) in docs and tpu_runtime_version(False) in docs


@pytest.mark.parametrize("path", sorted((REPO / "jobs" / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_tpu_job_configs_name_the_runtime_their_topology_needs(path):
    train = yaml.safe_load(path.read_text()).get("train", {})
    if not train.get("tpu_topology"):
        return
    expected = tpu_runtime_version(tpu_hosts(train["tpu_topology"]) > 1)
    assert expected in path.read_text(), f"{path.name}: {train['tpu_topology']} runs on {expected}; say so"


@pytest.mark.parametrize("accel, hosts", [("v4-8", 1), ("v4-16", 2), ("v3-8", 1), ("v3-32", 4), ("v5litepod-8", 1),
                                          ("v5litepod-16", 4), ("v5p-8", 1), ("v6e-8", 1), ("v6e-16", 4)])
def test_hosts_per_slice_as_ray_counts_them(accel, hosts):
    assert tpu_hosts(accel) == hosts
