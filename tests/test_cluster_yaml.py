"""cluster.yaml against Ray's own launcher schema and config preparation, without contacting GCP.

`ray up` runs, in ray.autoscaler._private.commands._bootstrap_config:
prepare_config (defaults + merged setup commands) -> the provider's
fillout_available_node_types_resources -> validate_config (jsonschema with
ray/autoscaler/ray-schema.json, plus cross-field checks) -> provider.bootstrap_config (the only
step that talks to GCP). The tests run everything before that last step, then check what the
config promises: a CPU head, a TPU VM worker type shaped the way Ray's GCP provider expects, a
loopback-only dashboard and setup commands that install tpu-ray with the TensorFlow extra that
fits each node type.
"""

from __future__ import annotations

import copy
import importlib.util
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from ray._private.accelerators import tpu as ray_tpu
from ray._private.label_utils import validate_node_label_syntax
from ray.autoscaler._private.util import prepare_config, validate_config

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier

REPO = Path(__file__).resolve().parents[1]
CLUSTER_YAML = REPO / "cluster.yaml"

TPU_KEYS = ("acceleratorType", "acceleratorConfig")
# `pip install ... tpu-ray[extra]`, `-e ~/tpu-ray[extra]`, `"$HOME/tpu-ray[extra]"`, `tpu-ray`.
INSTALL_RE = re.compile(r"\bpip3?\b.*\binstall\b")
TPU_RAY_REQ_RE = re.compile(r"tpu[-_]ray(?:\[(?P<extras>[^\]]*)\])?")


# ------------------------------------------------------------------------------------ helpers


def load_config() -> dict:
    with open(CLUSTER_YAML) as f:
        return yaml.safe_load(f)


def prepare_offline(config: dict) -> dict:
    """What `ray up` does to the config before the first GCP call (minus the provider fillout)."""
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def is_tpu(node_config: dict) -> bool:
    """Ray's rule (gcp/config.py get_node_type): no machineType and an accelerator key."""
    return "machineType" not in node_config and any(k in node_config for k in TPU_KEYS)


def pod_type(node_config: dict) -> str:
    """The slice's pod type ("v4-8"), from acceleratorType or acceleratorConfig."""
    if "acceleratorType" in node_config:
        return node_config["acceleratorType"]
    acc = node_config["acceleratorConfig"]
    return ray_tpu.infer_tpu_pod_type_from_topology(acc["topology"], acc["type"])


def is_multi_host(pod: str) -> bool:
    return ray_tpu.get_total_chips_from_accelerator_type(pod) > ray_tpu.get_num_tpu_visible_chips_per_host(pod)


def tpu_node_types(config: dict) -> dict:
    return {
        name: spec for name, spec in config["available_node_types"].items() if is_tpu(spec["node_config"])
    }


def effective_commands(prepared: dict) -> dict[str, list[str]]:
    """Commands each node type runs, resolved the way Ray's updater does after prepare_config:
    initialization_commands (node type's own list, else the global one), then for the head
    head_setup_commands (setup_commands + head_setup_commands), for a worker type its own
    worker_setup_commands if it has them (they replace the global lists), else
    setup_commands + worker_setup_commands."""
    out = {}
    for name, spec in prepared["available_node_types"].items():
        init = spec.get("initialization_commands", prepared.get("initialization_commands", []))
        if name == prepared["head_node_type"]:
            setup = prepared["head_setup_commands"]
        else:
            setup = spec.get("worker_setup_commands", prepared["worker_setup_commands"])
        out[name] = list(init) + list(setup)
    return out


def install_problems(prepared: dict) -> list[str]:
    """Every node type must install tpu-ray, and only with the extra matching its hardware."""
    problems = []
    for name, commands in effective_commands(prepared).items():
        want = "tpu" if is_tpu(prepared["available_node_types"][name]["node_config"]) else "cpu"
        installs = 0
        for cmd in commands:
            if not INSTALL_RE.search(cmd):
                continue
            for m in TPU_RAY_REQ_RE.finditer(cmd):
                installs += 1
                extras = {e.strip() for e in (m.group("extras") or "").split(",") if e.strip()}
                if extras != {want}:
                    problems.append(f"{name}: installs {m.group(0)!r}, expected extra [{want}]: {cmd}")
        if not installs:
            problems.append(f"{name}: no setup command installs tpu-ray")
    return problems


@pytest.fixture(scope="module")
def config() -> dict:
    return load_config()


@pytest.fixture(scope="module")
def prepared(config) -> dict:
    return prepare_offline(config)


# ------------------------------------------------------------------ Ray's schema and preparation


def test_cluster_yaml_passes_ray_schema_and_prepare_config(prepared):
    assert prepared["provider"]["type"] == "gcp"
    assert prepared["head_node_type"] in prepared["available_node_types"]
    # prepare_config filled the per-type limits: the head is never scaled, workers are bounded.
    assert prepared["available_node_types"][prepared["head_node_type"]]["max_workers"] == 0
    worker_max = sum(
        spec["max_workers"] for name, spec in prepared["available_node_types"].items()
        if name != prepared["head_node_type"]
    )
    assert prepared["max_workers"] >= worker_max


def test_raw_yaml_also_passes_ray_schema_file(config):
    """The file itself, not only Ray's merged result, satisfies ray/autoscaler/ray-schema.json."""
    import json

    import ray.autoscaler

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(config, schema)


@pytest.mark.parametrize("mutate, what", [
    (lambda c: c.update(max_wrokers=9), "unknown top-level key"),
    (lambda c: c.update(max_workers="nine"), "max_workers of the wrong type"),
    (lambda c: c["available_node_types"]["cpu_worker"]["resources"].update(CPU=7.5), "non-integer resource"),
    (lambda c: c["available_node_types"]["cpu_worker"].pop("resources"), "node type without resources"),
    (lambda c: c["available_node_types"]["cpu_worker"].update(setup_commands=["true"]), "unknown node-type key"),
])
def test_ray_schema_rejects_broken_copies(config, mutate, what):
    broken = copy.deepcopy(config)
    mutate(broken)
    with pytest.raises(jsonschema.ValidationError):
        prepare_offline(broken)


def test_gcp_provider_classifies_node_types_and_fills_the_tpu_head_resource(config):
    """Ray's GCP provider code, run offline: its node-type rule (which also validates the TPU
    accelerator fields) and its resource fillout, which must not change what we declared."""
    pytest.importorskip("googleapiclient", reason="Ray's GCP provider needs google-api-python-client")
    from ray.autoscaler._private.gcp.config import _is_head_node_a_tpu, get_node_type
    from ray.autoscaler._private.gcp.node import GCPNodeType
    from ray.autoscaler._private.providers import _NODE_PROVIDERS

    prepared = prepare_config(copy.deepcopy(config))
    for name, spec in prepared["available_node_types"].items():
        expected = GCPNodeType.TPU if is_tpu(spec["node_config"]) else GCPNodeType.COMPUTE
        assert get_node_type(spec["node_config"]) == expected, name
    # Ray ships this check but (2.60) never calls it: the head must be a Compute VM.
    assert not _is_head_node_a_tpu(prepared)

    provider_cls = _NODE_PROVIDERS["gcp"](prepared["provider"])
    filled = provider_cls.fillout_available_node_types_resources(prepared)
    validate_config(filled)
    for name, spec in filled["available_node_types"].items():
        assert spec["resources"] == prepared["available_node_types"][name]["resources"], name


# ------------------------------------------------------------------------- what we promise


def test_provider_placeholders_are_there(config):
    provider = config["provider"]
    assert provider["type"] == "gcp"
    for key in ("project_id", "region", "availability_zone"):
        assert key in provider, key
    assert provider["availability_zone"].startswith(provider["region"] + "-")
    assert "EDIT" in CLUSTER_YAML.read_text()


def test_tpu_node_type_is_shaped_like_a_tpu_vm(config):
    tpus = tpu_node_types(config)
    assert tpus, "no TPU node type (no machineType + acceleratorType/acceleratorConfig)"
    for name, spec in tpus.items():
        node = spec["node_config"]
        assert "machineType" not in node, name
        assert sum(k in node for k in TPU_KEYS) == 1, f"{name}: exactly one of {TPU_KEYS}"
        if "acceleratorType" in node:
            assert ray_tpu.TPUAcceleratorManager.is_valid_tpu_accelerator_type(node["acceleratorType"])
        else:
            assert {"type", "topology"} <= set(node["acceleratorConfig"])
        runtime = node.get("runtimeVersion", "")
        assert runtime.startswith("tpu-vm-tf-"), f"{name}: TensorFlow TPU VM runtime expected, got {runtime!r}"
        # Multi-host slices need the "-pod" runtime (TF drives the slice by name); single host must not.
        assert ("-pod" in runtime) == is_multi_host(pod_type(node)), (name, runtime, pod_type(node))


def test_tpu_resources_and_labels_match_what_ray_detects(config):
    for name, spec in tpu_node_types(config).items():
        pod = pod_type(spec["node_config"])
        generation = pod.split("-")[0]
        resources = spec["resources"]
        # Ray: TPU = chips visible per host; worker 0 also gets TPU-<pod type>-head.
        assert resources.get("TPU") == ray_tpu.get_num_tpu_visible_chips_per_host(pod), (name, resources)
        assert resources.get(f"TPU-{pod}-head") == 1, (name, resources)
        assert not [r for r in resources if r.startswith("TPU-") and r != f"TPU-{pod}-head"], resources

        labels = spec.get("labels", {})
        validate_node_label_syntax(labels)
        assert labels.get("ray.io/tpu-pod-type") == pod, labels
        if "ray.io/accelerator-type" in labels:
            assert labels["ray.io/accelerator-type"] == f"TPU-{generation.upper()}"
        if "ray.io/tpu-topology" in labels:
            assert ray_tpu.infer_tpu_pod_type_from_topology(labels["ray.io/tpu-topology"], generation) == pod
        if "ray.io/tpu-worker-id" in labels:
            # The launcher hands node-type labels to every host of a slice: only right on one host.
            assert labels["ray.io/tpu-worker-id"] == "0" and not is_multi_host(pod), (name, labels)
        assert "ray.io/tpu-slice-name" not in labels  # per slice, only Ray can know it


def test_only_tpu_types_carry_tpu_resources_and_the_head_is_a_cpu_vm(config):
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert not is_tpu(head["node_config"])
    assert "machineType" in head["node_config"]
    for name, spec in types.items():
        if not is_tpu(spec["node_config"]):
            assert not any(r == "TPU" or r.startswith("TPU-") for r in spec["resources"]), name
            assert not any(k.startswith("ray.io/tpu") for k in spec.get("labels", {})), name
    cpu_workers = [
        spec for name, spec in types.items()
        if name != config["head_node_type"] and not is_tpu(spec["node_config"])
    ]
    assert cpu_workers, "no autoscaling CPU worker type"
    for spec in cpu_workers:
        assert spec.get("min_workers", 0) == 0 and spec["max_workers"] >= 1
        assert spec["resources"].get("CPU", 0) >= 1


def test_dashboard_listens_on_loopback_only(config):
    start = " ".join(config["head_start_ray_commands"])
    assert "--head" in start
    hosts = re.findall(r"--dashboard-host[= ](\S+)", start)
    assert hosts == ["127.0.0.1"], hosts
    assert "0.0.0.0" not in start
    for spec in config["available_node_types"].values():  # no network tag opening ports
        assert "tags" not in spec["node_config"]


def test_setup_commands_install_tpu_ray_with_the_extra_matching_the_node_type(prepared):
    assert install_problems(prepared) == []


def test_tpu_types_finish_with_one_tensorflow_after_the_extra(prepared):
    """tf-keras comes from deploy/tpu-finish-install.sh, after the [tpu] extra: the extra alone has no
    tf-keras, and tf-keras with its dependencies would install a second TensorFlow."""
    assert (REPO / "deploy" / "tpu-finish-install.sh").exists()
    for name, commands in effective_commands(prepared).items():
        finish = [i for i, c in enumerate(commands) if "deploy/tpu-finish-install.sh" in c]
        extra = [i for i, c in enumerate(commands) if INSTALL_RE.search(c) and "tpu-ray[tpu]" in c]
        if is_tpu(prepared["available_node_types"][name]["node_config"]):
            assert extra and finish and max(extra) < min(finish), (name, commands)
        else:
            assert not finish, name
        assert not any("tf-keras" in c for c in commands), (name, "tf-keras only through the finish script")


def test_setup_command_check_catches_a_swapped_extra(config):
    """The check above can fail: give the TPU type the CPU TensorFlow and the CPU types the TPU one."""
    broken = copy.deepcopy(config)
    for spec in tpu_node_types(broken).values():
        spec["worker_setup_commands"] = [c.replace("[tpu]", "[cpu]") for c in spec["worker_setup_commands"]]
    broken["worker_setup_commands"] = [c.replace("[cpu]", "[tpu]") for c in broken["worker_setup_commands"]]
    problems = install_problems(prepare_offline(broken))
    assert any("expected extra [tpu]" in p for p in problems), problems
    assert any("expected extra [cpu]" in p for p in problems), problems


def test_extras_used_exist_in_pyproject(prepared):
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    used = {
        e.strip()
        for commands in effective_commands(prepared).values()
        for cmd in commands if INSTALL_RE.search(cmd)
        for m in TPU_RAY_REQ_RE.finditer(cmd)
        for e in (m.group("extras") or "").split(",") if e.strip()
    }
    assert used == {"cpu", "tpu"}, used
    assert used <= set(extras), (used, sorted(extras))


def test_repo_is_shipped_and_installed_from_the_mount(config, prepared):
    assert config["file_mounts"].get("~/tpu-ray") == "."
    for name, commands in effective_commands(prepared).items():
        installs = [c for c in commands if INSTALL_RE.search(c) and TPU_RAY_REQ_RE.search(c)]
        assert all(re.search(r"-e\s+\"?(~|\$HOME)/tpu-ray\[", c) for c in installs), (name, installs)


def test_workers_run_as_a_service_account_of_the_configured_project(config):
    """Ray attaches its service account to the head only; workers need one to reach gs://."""
    project = config["provider"].get("project_id")
    for name, spec in config["available_node_types"].items():
        if name == config["head_node_type"]:
            continue
        accounts = spec["node_config"].get("serviceAccounts")
        assert accounts and accounts[0].get("email"), name
        if project:  # once edited, the e-mail must name the same project
            assert accounts[0]["email"].endswith(f"@{project}.iam.gserviceaccount.com"), name


def test_the_v4_8_job_config_finds_its_slice_here(config):
    job = REPO / "jobs" / "configs" / "roberta-base-v4-8.yaml"
    if not job.exists():
        pytest.skip("jobs/configs/roberta-base-v4-8.yaml not present")
    topology = (yaml.safe_load(job.read_text()).get("train") or {}).get("tpu_topology")
    provided = {r for spec in config["available_node_types"].values() for r in spec["resources"]}
    assert f"TPU-{topology}-head" in provided, (topology, sorted(provided))


def v4_16_variant(config: dict, use_accelerator_config: bool) -> dict:
    """cluster.yaml edited the way its comments (and docs/cluster.md) say, for a v4-16 slice."""
    variant = copy.deepcopy(config)
    spec = variant["available_node_types"].pop("tpu_v4_8")
    node = spec["node_config"]
    node.pop("acceleratorType", None)
    if use_accelerator_config:
        node["acceleratorConfig"] = {"type": "V4", "topology": "2x2x2"}
    else:
        node["acceleratorType"] = "v4-16"
    node["runtimeVersion"] = node["runtimeVersion"].replace("-pjrt", "-pod-pjrt")
    spec["resources"] = {"TPU": 4, "TPU-v4-16-head": 1}
    spec["labels"].pop("ray.io/tpu-worker-id")
    spec["labels"].update({"ray.io/tpu-pod-type": "v4-16", "ray.io/tpu-topology": "2x2x2"})
    spec["min_workers"] = 1
    variant["available_node_types"]["tpu_v4_16"] = spec
    return variant


@pytest.mark.parametrize("use_accelerator_config", [False, True], ids=["acceleratorType", "acceleratorConfig"])
def test_documented_v4_16_edit_passes_the_same_checks(config, use_accelerator_config):
    variant = v4_16_variant(config, use_accelerator_config)
    prepare_offline(variant)
    test_tpu_node_type_is_shaped_like_a_tpu_vm(variant)
    test_tpu_resources_and_labels_match_what_ray_detects(variant)
    test_only_tpu_types_carry_tpu_resources_and_the_head_is_a_cpu_vm(variant)
    test_setup_commands_install_tpu_ray_with_the_extra_matching_the_node_type(prepare_offline(variant))
    if importlib.util.find_spec("googleapiclient") is not None:  # Ray's GCP provider code
        test_gcp_provider_classifies_node_types_and_fills_the_tpu_head_resource(variant)


def test_every_node_starts_ray_with_token_authentication(config, prepared):
    """`default-allow-internal` lets every VM of the VPC reach the head's ports; without
    Ray's token authentication any of them could run code on the cluster with its credentials."""
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = " ".join(config[key])
        assert re.search(r"export RAY_AUTH_MODE=token;\s*ray start", start), (key, start)
        assert "RAY_AUTH_MODE=disabled" not in start
    # The token reaches every node: synced by the launcher (the head's autoscaler passes its
    # file_mounts on to the workers it creates), private to the user there.
    assert config["file_mounts"].get("~/.ray/auth_token") == "~/.ray/auth_token"
    for name, commands in effective_commands(prepared).items():
        assert any("chmod 600 ~/.ray/auth_token" in c for c in commands), name
        assert any("export RAY_AUTH_MODE=token" in c for c in commands), name  # `ray status` there


def test_workers_run_as_a_dedicated_service_account_not_rays(config):
    """Ray grants ray-autoscaler-sa-v1 compute, service-account use and storage admin: the head's
    powers. The workers only need their buckets (and TPU use)."""
    for name, spec in config["available_node_types"].items():
        if name == config["head_node_type"]:
            continue
        email = spec["node_config"]["serviceAccounts"][0]["email"]
        assert not email.startswith("ray-autoscaler-sa-v1@"), name
    text = (REPO / "docs" / "cluster.md").read_text()
    for command in ("gcloud iam service-accounts create tpu-ray-worker",
                    "gcloud storage buckets add-iam-policy-binding", "roles/storage.objectAdmin",
                    "roles/tpu.viewer", "ray get-auth-token --generate"):
        assert command in text, command
