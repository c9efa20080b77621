"""deploy/kubernetes/ (issue 48): every manifest checked against the Kubernetes client's models (the
core kinds and every pod template) and against the fields KubeRay's CRDs define, the TPU groups
against the slices they ask for, and the RayJob's command against the README's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml


REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy" / "kubernetes"

# KubeRay's CRDs, apiVersion ray.io/v1, as read in github.com/ray-project/kuberay at commit
# feeaf72facab4881ba2b179248bb67315634e229 (2026-08-19): ray-operator/config/crd/bases/ray.io_rayclusters.yaml
# and ray.io_rayjobs.yaml (openAPIV3Schema properties; "required" lists in the comments).
RAYCLUSTER_SPEC = {"authOptions", "autoscalerOptions", "enableInTreeAutoscaling", "gcsFaultToleranceOptions",
                   "headGroupSpec", "headServiceAnnotations", "historyServerOptions", "managedBy", "networkPolicy",
                   "rayVersion", "suspend", "tlsOptions", "upgradeStrategy", "workerGroupSpecs"}  # required: headGroupSpec
HEAD_GROUP_SPEC = {"enableIngress", "headService", "ingressOptions", "labels", "rayStartParams", "resources",
                   "serviceType", "template"}  # required: template
WORKER_GROUP_SPEC = {"groupName", "idleTimeoutSeconds", "labels", "maxReplicas", "minReplicas", "numOfHosts",
                     "priority", "rayStartParams", "replicas", "resources", "scaleStrategy", "suspend",
                     "template"}  # required: groupName, maxReplicas, minReplicas, template
WORKER_GROUP_REQUIRED = {"groupName", "maxReplicas", "minReplicas", "template"}
AUTH_OPTIONS = {"enableK8sTokenAuth", "mode", "secretName"}  # mode: enum disabled | token
AUTOSCALER_OPTIONS = {"args", "command", "env", "envFrom", "idleTimeoutSeconds", "image", "imagePullPolicy",
                      "resources", "securityContext", "upscalingMode", "version", "volumeMounts"}
RAYJOB_SPEC = {"activeDeadlineSeconds", "backoffLimit", "clusterSelector", "deletionStrategy", "entrypoint",
               "entrypointNumCpus", "entrypointNumGpus", "entrypointResources", "jobId", "managedBy", "metadata",
               "preRunningDeadlineSeconds", "rayClusterSpec", "runtimeEnvYAML", "shutdownAfterJobFinishes",
               "submissionMode", "submitterConfig", "submitterPodTemplate", "suspend", "ttlSecondsAfterFinished"}
# GKE's node label cloud.google.com/gke-tpu-accelerator per generation (Ray's pod-type family).
GKE_TPU_ACCELERATOR = {"v4": "tpu-v4-podslice", "v5litepod": "tpu-v5-lite-podslice", "v5p": "tpu-v5p-slice",
                       "v6e": "tpu-v6e-slice"}


def documents() -> dict[str, list[dict]]:
    return {p.name: [d for d in yaml.safe_load_all(p.read_text()) if d] for p in sorted(DEPLOY.glob("*.yaml"))}


def of_kind(kind: str) -> list[dict]:
    return [d for docs in documents().values() for d in docs if d["kind"] == kind]


def check_model(data, model: str, where: str) -> list[str]:
    """Every key of `data` is a field of the kubernetes client's model `model` (recursively), and
    the client deserializes it: what `kubectl apply` would reject as an unknown field is named."""
    import kubernetes.client as k8s

    listed = re.fullmatch(r"[Ll]ist\[(.+)\]", model)  # "List[V1Container]" (older clients: "list[...]")
    if listed:
        return [p for i, item in enumerate(data) for p in check_model(item, listed.group(1), f"{where}[{i}]")]
    mapped = re.fullmatch(r"(?:Dict\[|dict\()str, (.+)[\])]", model)  # "Dict[str, str]" / "dict(str, str)"
    if mapped:
        return [p for key, item in data.items() for p in check_model(item, mapped.group(1), f"{where}.{key}")]
    cls = getattr(k8s, model, None)
    if cls is None:  # a primitive (str, int, bool, object)
        return []
    fields = {json_key: attr for attr, json_key in cls.attribute_map.items()}
    problems = [f"{where}.{key}: not a field of {model}" for key in data if key not in fields]
    for key, item in data.items():
        if key in fields and item is not None:
            problems += check_model(item, cls.openapi_types[fields[key]], f"{where}.{key}")
    return problems


def deserialize(data: dict, model: str):
    """The kubernetes client's model object, as it builds one from an API server's JSON."""
    import json

    import kubernetes.client as k8s

    try:
        return k8s.ApiClient().deserialize(json.dumps(data), model, "application/json")
    except TypeError:  # older clients deserialize a response object with .data
        return k8s.ApiClient().deserialize(type("Response", (), {"data": json.dumps(data)})(), model)


def pod_templates() -> list[tuple[str, dict]]:
    out = []
    for cluster in of_kind("RayCluster"):
        spec = cluster["spec"]
        out.append(("head", spec["headGroupSpec"]["template"]))
        out += [(g["groupName"], g["template"]) for g in spec["workerGroupSpecs"]]
    return out


@pytest.mark.quick
def test_core_kinds_and_every_pod_template_are_valid_kubernetes_objects():
    kinds = {d["kind"] for docs in documents().values() for d in docs}
    assert {"Namespace", "ServiceAccount", "RayCluster", "RayJob"} <= kinds, kinds
    for docs in documents().values():
        for doc in docs:
            if doc["apiVersion"] == "v1":
                assert not check_model(doc, f"V1{doc['kind']}", doc["kind"]), check_model(doc, f"V1{doc['kind']}", "")
                assert deserialize(doc, f"V1{doc['kind']}").metadata.name == doc["metadata"]["name"]
    for name, template in pod_templates():
        assert not check_model(template, "V1PodTemplateSpec", name), check_model(template, "V1PodTemplateSpec", name)
        pod = deserialize(template, "V1PodTemplateSpec")
        assert pod.spec.containers and all(c.image and c.resources.limits for c in pod.spec.containers), name


@pytest.mark.quick
def test_raycluster_and_rayjob_use_only_fields_kuberay_defines():
    for cluster in of_kind("RayCluster"):
        assert cluster["apiVersion"] == "ray.io/v1"
        spec = cluster["spec"]
        assert set(spec) <= RAYCLUSTER_SPEC and "headGroupSpec" in spec, set(spec) - RAYCLUSTER_SPEC
        assert set(spec["headGroupSpec"]) <= HEAD_GROUP_SPEC and "template" in spec["headGroupSpec"]
        assert set(spec.get("authOptions", {})) <= AUTH_OPTIONS
        assert set(spec.get("autoscalerOptions", {})) <= AUTOSCALER_OPTIONS
        for group in spec["workerGroupSpecs"]:
            assert set(group) <= WORKER_GROUP_SPEC, (group["groupName"], set(group) - WORKER_GROUP_SPEC)
            assert WORKER_GROUP_REQUIRED <= set(group), group["groupName"]
        params = [spec["headGroupSpec"]["rayStartParams"], *(g["rayStartParams"] for g in spec["workerGroupSpecs"])]
        assert all(isinstance(v, str) for p in params for v in p.values())  # map[string]string in the CRD
    for job in of_kind("RayJob"):
        assert job["apiVersion"] == "ray.io/v1" and set(job["spec"]) <= RAYJOB_SPEC, set(job["spec"]) - RAYJOB_SPEC


@pytest.mark.quick
def test_cpu_group_scales_from_zero_and_tpu_groups_ask_for_whole_slices():
    from ray._private.accelerators import tpu as ray_tpu

    from tpu_ray.accelerators import tpu_hosts

    (cluster,) = of_kind("RayCluster")
    spec = cluster["spec"]
    assert spec["enableInTreeAutoscaling"] is True and spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    cpu = [g for g in groups.values() if "nodeSelector" not in g["template"]["spec"]]
    assert cpu and all(g["minReplicas"] == 0 == g["replicas"] and g["maxReplicas"] >= 1 for g in cpu)
    pod_types = set()
    for name, group in groups.items():
        selector = group["template"]["spec"].get("nodeSelector")
        if not selector:
            continue
        (family,) = [f for f, label in GKE_TPU_ACCELERATOR.items()
                     if label == selector["cloud.google.com/gke-tpu-accelerator"]]
        pod_type = ray_tpu.infer_tpu_pod_type_from_topology(selector["cloud.google.com/gke-tpu-topology"], family)
        pod_types.add(pod_type)
        assert group["numOfHosts"] == tpu_hosts(pod_type), (name, pod_type)  # one replica = one whole slice
        assert group["minReplicas"] == 0 and group["replicas"] == 0, name  # scale from zero too
        (container,) = group["template"]["spec"]["containers"]
        chips = str(ray_tpu.get_num_tpu_visible_chips_per_host(pod_type))
        assert container["resources"]["limits"]["google.com/tpu"] == chips, (name, pod_type)
        assert container["resources"]["requests"]["google.com/tpu"] == chips, name
        assert container["image"].endswith(":tpu"), name  # the image with one TensorFlow (Dockerfile)
    assert {"v6e-8", "v5litepod-16"} <= pod_types  # a single-host and a multi-host slice
    assert any(tpu_hosts(p) > 1 for p in pod_types) and any(tpu_hosts(p) == 1 for p in pod_types)


@pytest.mark.quick
def test_token_auth_and_workload_identity_without_keys():
    (cluster,) = of_kind("RayCluster")
    assert cluster["spec"]["authOptions"]["mode"] == "token"
    (account,) = of_kind("ServiceAccount")
    assert account["metadata"]["namespace"] == cluster["metadata"]["namespace"]
    for name, template in pod_templates():
        spec = template["spec"]
        assert spec["serviceAccountName"] == account["metadata"]["name"], name
        for container in spec["containers"]:
            assert not [e for e in container.get("env", []) if e["name"] == "GOOGLE_APPLICATION_CREDENTIALS"], name
        assert not [v for v in spec.get("volumes", []) if "secret" in v], name  # no key file mounted
    guide = (REPO / "docs" / "kubernetes.md").read_text()
    # The roles are granted on buckets, to this account's Workload Identity principal; none project-wide.
    assert "gcloud storage buckets add-iam-policy-binding" in guide and "roles/storage.objectUser" in guide
    assert f"ns/{account['metadata']['namespace']}/sa/{account['metadata']['name']}" in guide
    assert "gcloud projects add-iam-policy-binding" not in guide


@pytest.mark.quick
def test_the_rayjob_runs_the_command_the_readme_documents_on_the_cluster():
    (job,) = of_kind("RayJob")
    (cluster,) = of_kind("RayCluster")
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    assert job["metadata"]["namespace"] == cluster["metadata"]["namespace"]
    readme = (REPO / "README.md").read_text()
    documented = re.findall(r"`(python jobs/pretrain\.py --config [^\s`]+)`", readme)
    assert job["spec"]["entrypoint"] in documented, (job["spec"]["entrypoint"], documented)
    config = job["spec"]["entrypoint"].split("--config ", 1)[1].split()[0]
    assert (REPO / config).exists(), config
    assert yaml.safe_load(job["spec"]["runtimeEnvYAML"])["working_dir"] == "/home/ray/tpu-ray"
    assert "COPY --chown=ray:users . /home/ray/tpu-ray" in (DEPLOY / "Dockerfile").read_text()


@pytest.mark.quick
def test_the_guides_say_which_path_to_choose_and_start_from_gke_with_the_ray_add_on():
    guide = (REPO / "docs" / "kubernetes.md").read_text()
    create = re.search(r"gcloud container clusters create .*?(?=\n\S|\n\n)", guide, re.S)
    assert create and "--addons=RayOperator" in create.group(0), "docs/kubernetes.md: cluster create with the add-on"
    for step in ("kubectl apply -f deploy/kubernetes/raycluster.yaml", "kubectl apply -f deploy/kubernetes/rayjob.yaml",
                 "SUCCEEDED"):
        assert step in guide, step
    for page in ("docs/kubernetes.md", "docs/cluster.md"):
        assert "## Which path: cluster launcher or KubeRay" in (REPO / page).read_text(), page


def _kuberay_host(monkeypatch, pod_type: str, topology: str, slice_name: str, worker: int) -> tuple[dict, dict]:
    """(resources, labels) Ray 2.60 gives a GKE TPU pod, computed by Ray's own TPU accelerator
    manager from the environment GKE (TPU_ACCELERATOR_TYPE, TPU_TOPOLOGY) and KubeRay's TPU webhook
    (TPU_NAME, TPU_WORKER_ID) set in the pod."""
    from ray._private.accelerators import tpu as ray_tpu

    for key, value in {"TPU_ACCELERATOR_TYPE": pod_type, "TPU_TOPOLOGY": topology, "TPU_NAME": slice_name,
                       "TPU_WORKER_ID": str(worker)}.items():
        monkeypatch.setenv(key, value)
    manager = ray_tpu.TPUAcceleratorManager
    resources = {"TPU": ray_tpu.get_num_tpu_visible_chips_per_host(pod_type),
                 **manager.get_current_node_additional_resources()}
    return resources, manager.get_current_node_accelerator_labels()


@pytest.mark.slow  # a Ray cluster of 1 + 4 nodes: ~30 s on 2 cores
@pytest.mark.own_process  # that cluster in a process of its own (tests/own_process.py)
def test_the_slice_reservation_works_from_kuberay_labels_and_environment(monkeypatch):
    """The tpu-v5e-16 group's 4 pods as Ray labels them on GKE: tpu-ray reserves the whole slice by
    its head resource and drives it by the TPU_NAME KubeRay's webhook gave it (no TPU VM metadata)."""
    import ray
    from ray.cluster_utils import Cluster

    from tpu_ray.cluster.placement import reserve_tpu_slice

    (cluster_doc,) = of_kind("RayCluster")
    (group,) = [g for g in cluster_doc["spec"]["workerGroupSpecs"] if g["groupName"] == "tpu-v5e-16"]
    topology = group["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"]
    slice_name = "tpu-ray-tpu-v5e-16-0"  # one TPU_NAME per replica (slice) of the group
    hosts = [_kuberay_host(monkeypatch, "v5litepod-16", topology, slice_name, w) for w in range(group["numOfHosts"])]
    assert hosts[0][1]["ray.io/tpu-pod-type"] == "v5litepod-16" and "TPU-v5litepod-16-head" in hosts[0][0]
    assert all("TPU-v5litepod-16-head" not in resources for resources, _ in hosts[1:])
    for key in ("TPU_ACCELERATOR_TYPE", "TPU_TOPOLOGY", "TPU_NAME", "TPU_WORKER_ID"):
        monkeypatch.delenv(key)
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster()
    try:
        cluster.add_node(num_cpus=1)
        nodes = [cluster.add_node(num_cpus=0, resources=r, labels=labels) for r, labels in hosts]
        ray.init(address=cluster.address, log_to_driver=False)
        reservation = reserve_tpu_slice("TPU-v5litepod-16-head", 120)
        reserved = reservation.slice
        assert (reserved.name, reserved.pod_type) == (slice_name, "v5litepod-16")
        assert reserved.hosts == tuple(n.node_id for n in nodes)  # all 4 hosts, worker 0 first
        env = reserved.client_env()
        assert (env["TPU_NAME"], env["TPU_LOAD_LIBRARY"]) == (slice_name, "0")
        reservation.release()
    finally:
        ray.shutdown()
        cluster.shutdown()
