"""deploy/kubernetes/ checked against the real things rather than against this
project's picture of them:

- KubeRay: every RayCluster and RayJob is validated with jsonschema against the openAPIV3Schema of
  KubeRay's own CRDs (release v1.7.0, vendored unmodified in tests/kuberay/ with its licence and
  digests), strictly (an unknown field fails, as with `kubectl apply`'s default strict field
  validation), and against the rules of KubeRay's ValidateRayClusterSpec / ValidateRayJobSpec that
  concern these manifests, each citing its line of validation.go at that release;
- Ray: the RayCluster goes through Ray's own KubeRay autoscaling-config conversion
  (ray/autoscaler/_private/kuberay/autoscaling_config.py) and Ray's autoscaler v2 scheduler decides
  what the demand of tpu-ray's CPU actors and TPU slices launches; the labels a TPU group declares
  are compared with the labels Ray's TPU accelerator manager gives its hosts;
- Kubernetes: core objects and pod templates against the kubernetes client's models, the
  NetworkPolicies by NetworkPolicy semantics, pod requests against GKE's allocatable formula for
  the machine types docs/kubernetes.md creates.

What no test here can verify without a GKE cluster is listed in docs/kubernetes.md ("What is and is
not verified").
"""

from __future__ import annotations

import copy
import hashlib
import json
import posixpath
import re
import shutil
import subprocess
from decimal import Decimal
from functools import cache
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy" / "kubernetes"
GUIDE = REPO / "docs" / "kubernetes.md"
KUBERAY_DIR = REPO / "tests" / "kuberay"
KUBERAY_RELEASE = "v1.7.0"
KUBERAY_COMMIT = "59d663aeec13760646da3db9c1cf8cfe883e30b7"
KUBERAY_FLOOR = "v1.5.1"  # first release whose CRD has authOptions (docs/kubernetes.md, "KubeRay version")
KUBERAY_FILES = {  # vendored file -> (path in ray-project/kuberay at KUBERAY_COMMIT, sha256)
    "ray.io_rayclusters.yaml": ("ray-operator/config/crd/bases/ray.io_rayclusters.yaml",
                                "c44704442eef0c6721ad40c1d66782c8bd3fdab9d3344306a5820910a679baa1"),
    "ray.io_rayjobs.yaml": ("ray-operator/config/crd/bases/ray.io_rayjobs.yaml",
                            "01a5cf3b17c1769fda44af7e82debcd98722f0c27b9ab84d084681c6649121f5"),
    "LICENSE": ("LICENSE", "24a918b9cf6d1d0aa84f17384038bedbccdd51e815afdd9d1b49b13d4a7dd6d9"),
}
SOURCE = f"https://github.com/ray-project/kuberay/blob/{KUBERAY_COMMIT}/ray-operator"
VALIDATION_GO = f"{SOURCE}/controllers/ray/utils/validation.go"

# GKE's node label cloud.google.com/gke-tpu-accelerator per generation (Ray's pod-type family).
GKE_TPU_ACCELERATOR = {"v4": "tpu-v4-podslice", "v5litepod": "tpu-v5-lite-podslice", "v5p": "tpu-v5p-slice",
                       "v6e": "tpu-v6e-slice"}
# Compute Engine machine types docs/kubernetes.md creates node pools of: (vCPUs, memory in GiB, the
# TPU accelerator label of its nodes). n2-standard-8: cloud.google.com/compute/docs/general-purpose-machines
# (N2 table); ct6e-standard-8t: cloud.google.com/tpu/docs/v6e (VM types); ct5lp-hightpu-4t:
# cloud.google.com/tpu/docs/v5e (VM types: 112 vCPU, 192 GB). Compute Engine's "GB" of machine
# memory is GiB.
MACHINES = {"n2-standard-8": (8, 32, None), "ct6e-standard-8t": (180, 1440, "tpu-v6e-slice"),
            "ct5lp-hightpu-4t": (112, 192, "tpu-v5-lite-podslice")}
# Room left on every node for GKE's own pods (kube-system DaemonSets: networking, logging, metrics,
# the Workload Identity metadata server, on TPU nodes the device plugin): an allowance, not a
# measurement. docs/kubernetes.md's first-ten-minutes checks read the real figure off a node.
SYSTEM_PODS_CPU, SYSTEM_PODS_MEMORY = Decimal(1), Decimal(2 * 2**30)


def documents() -> dict[str, list[dict]]:
    return {p.name: [d for d in yaml.safe_load_all(p.read_text()) if d] for p in sorted(DEPLOY.glob("*.yaml"))}


def of_kind(kind: str) -> list[dict]:
    return [d for docs in documents().values() for d in docs if d["kind"] == kind]


def the_cluster() -> dict:
    (cluster,) = of_kind("RayCluster")
    return cluster


def the_job() -> dict:
    (job,) = of_kind("RayJob")
    return job


def groups(cluster: dict) -> dict[str, dict]:
    return {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}


def tpu_groups(cluster: dict) -> dict[str, dict]:
    return {n: g for n, g in groups(cluster).items() if "nodeSelector" in g["template"]["spec"]}


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
    import kubernetes.client as k8s

    try:
        return k8s.ApiClient().deserialize(json.dumps(data), model, "application/json")
    except TypeError:  # older clients deserialize a response object with .data
        return k8s.ApiClient().deserialize(type("Response", (), {"data": json.dumps(data)})(), model)


def pod_templates() -> list[tuple[str, dict]]:
    """Every pod template the manifests define: the head, each worker group, the RayJob's submitter."""
    out = []
    for cluster in of_kind("RayCluster"):
        spec = cluster["spec"]
        out.append(("head", spec["headGroupSpec"]["template"]))
        out += [(g["groupName"], g["template"]) for g in spec["workerGroupSpecs"]]
    out += [(f"{j['metadata']['name']} submitter", j["spec"]["submitterPodTemplate"])
            for j in of_kind("RayJob") if "submitterPodTemplate" in j["spec"]]
    return out


# ------------------------------------------------------------------------------------ KubeRay CRDs
def _strict(schema):
    """The schema with additionalProperties: false wherever it lists properties and does not keep
    unknown fields: the API server prunes (kubectl's default strict validation rejects) a field the
    CRD does not define, where jsonschema would let it through."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@cache
def crd_schemas() -> dict[str, dict]:
    """kind -> the openAPIV3Schema of KubeRay's CRD version ray.io/v1, from the vendored files."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    out = {}
    for name in ("ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml"):
        crd = yaml.load((KUBERAY_DIR / name).read_text(), Loader=loader)
        (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
        assert version["served"] and version["storage"], name
        out[crd["spec"]["names"]["kind"]] = version["schema"]["openAPIV3Schema"]
    return out


def schema_errors(doc: dict) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft7Validator(_strict(crd_schemas()[doc["kind"]]))
    return [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message[:200]}"
            for e in validator.iter_errors(doc)]


def cel_rules_on_path(schema: dict, value, where: str = "") -> list[str]:
    """The x-kubernetes-validations (CEL) rules of the schema nodes `value` passes through: jsonschema
    does not evaluate them, so each one met would need a check of its own here."""
    found = [f"{where or '(top)'}: {r['rule']}" for r in schema.get("x-kubernetes-validations", [])]
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                found += cel_rules_on_path(sub, item, f"{where}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            found += cel_rules_on_path(schema["items"], item, f"{where}[{i}]")
    return found


@pytest.mark.quick
def test_the_vendored_crds_are_kuberays_own_files_of_the_pinned_release():
    readme = (KUBERAY_DIR / "README.md").read_text()
    assert KUBERAY_RELEASE in readme and KUBERAY_COMMIT in readme and "Apache License 2.0" in readme
    for name, (path, digest) in KUBERAY_FILES.items():
        assert hashlib.sha256((KUBERAY_DIR / name).read_bytes()).hexdigest() == digest, f"{name} was edited"
        assert path in readme and digest in readme, name
    assert (KUBERAY_DIR / "LICENSE").read_text().lstrip().startswith("Apache License\n")
    # The release has what these manifests use; authOptions is also what sets the version floor.
    spec = crd_schemas()["RayCluster"]["properties"]["spec"]["properties"]
    assert spec["authOptions"]["properties"]["mode"]["enum"] == ["disabled", "token"]
    assert spec["autoscalerOptions"]["properties"]["version"]["enum"] == ["v1", "v2"]
    assert "labels" in spec["workerGroupSpecs"]["items"]["properties"]


@pytest.mark.quick
def test_every_raycluster_and_rayjob_validates_against_kuberays_crd_schema():
    docs = of_kind("RayCluster") + of_kind("RayJob")
    assert {d["kind"] for d in docs} == {"RayCluster", "RayJob"}
    for doc in docs:
        assert doc["apiVersion"] == "ray.io/v1", doc["kind"]
        assert not schema_errors(doc), (doc["kind"], schema_errors(doc))
        # CEL rules on the paths these documents use would be left unchecked by jsonschema.
        rules = cel_rules_on_path(crd_schemas()[doc["kind"]], doc)
        assert not rules, rules


@pytest.mark.quick
def test_the_schema_check_rejects_what_kuberay_rejects():
    """The strict schema check is not vacuous: a misspelt field, a wrong enum value, a wrong type
    and a field of the wrong object each fail it."""
    cluster, job = the_cluster(), the_job()
    broken = copy.deepcopy(cluster)
    broken["spec"]["workerGroupSpecs"][0]["minReplica"] = 0
    broken["spec"]["authOptions"]["mode"] = "tokens"
    broken["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0  # map[string]string in the CRD
    errors = "\n".join(schema_errors(broken))
    assert "minReplica" in errors and "'tokens' is not one of" in errors and "is not of type 'string'" in errors
    wrong = copy.deepcopy(job)
    wrong["spec"]["workerGroupSpecs"] = []  # a RayCluster field in a RayJob
    assert any("workerGroupSpecs" in e for e in schema_errors(wrong))
    # A field that carries a CEL rule is noticed (managedBy: immutable, and one of two values).
    managed = copy.deepcopy(job)
    managed["spec"]["managedBy"] = "ray.io/kuberay-operator"
    assert any(r.startswith(".spec.managedBy:") for r in cel_rules_on_path(crd_schemas()["RayJob"], managed))


# ------------------------------------------------------------------------- KubeRay's own rules
# k8s.io/apimachinery/pkg/util/validation, which validation.go calls.
_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def is_dns1035_label(value: str) -> bool:
    return len(value) <= 63 and bool(_DNS1035.fullmatch(value))


def is_qualified_name(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_QUALIFIED_NAME_PART.fullmatch(name))


def is_valid_label_value(value: str) -> bool:
    return value == "" or (len(value) <= 63 and bool(_QUALIFIED_NAME_PART.fullmatch(value)))


def _version(text: str) -> tuple[int, ...]:
    match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text)  # version.ParseGeneric
    assert match, f"not a version: {text!r}"
    return tuple(int(p or 0) for p in match.groups())


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def kuberay_raycluster_errors(cluster: dict) -> list[str]:
    """What KubeRay v1.7.0's ValidateRayClusterMetadata and ValidateRayClusterSpec
    (ray-operator/controllers/ray/utils/validation.go) say about this RayCluster: the rules that
    concern these manifests, each with its line. An error there is a ValidationFailed event and no
    pods (raycluster_controller.go)."""
    errors: list[str] = []
    name, spec = cluster["metadata"]["name"], cluster["spec"]
    head = spec["headGroupSpec"]
    if len(name) > 53:  # L33, MaxRayClusterNameLength (utils/constant.go L375)
        errors.append(f"{VALIDATION_GO}#L33: RayCluster name longer than 53")
    if not is_dns1035_label(name):  # L36
        errors.append(f"{VALIDATION_GO}#L36: RayCluster name is not a DNS-1035 label")
    if not head["template"]["spec"].get("containers"):  # L104
        errors.append(f"{VALIDATION_GO}#L104: headGroupSpec should have at least one container")
    autoscaling = bool(spec.get("enableInTreeAutoscaling"))
    options = spec.get("autoscalerOptions") or {}
    v2 = options.get("version") == "v2"
    head_env = _env(head["template"]["spec"]["containers"][0])
    all_groups = [("Head", head), *((g["groupName"], g) for g in spec.get("workerGroupSpecs", []))]
    for group_name, group in all_groups:
        params, resources = group.get("rayStartParams", {}), group.get("resources", {})
        labels = group.get("labels", {})
        if any(params.get(k) for k in ("num-cpus", "num-gpus", "memory", "resources")) and resources:  # L60-L68
            errors.append(f"{VALIDATION_GO}#L65: {group_name}: resources in both rayStartParams and resources")
        if "labels" in params:  # L73
            errors.append(f"{VALIDATION_GO}#L73: {group_name}: rayStartParams['labels'] is not supported")
        for key, value in labels.items():
            if not is_qualified_name(key):  # L81
                errors.append(f"{VALIDATION_GO}#L81: {group_name}: invalid label key {key!r}")
            if not isinstance(value, str) or not is_valid_label_value(value):  # L88
                errors.append(f"{VALIDATION_GO}#L88: {group_name}: invalid label value {value!r}")
        if group_name == "Head":
            continue
        if not group["template"]["spec"].get("containers"):  # L119
            errors.append(f"{VALIDATION_GO}#L119: {group_name}: workerGroupSpec should have at least one container")
        low, high = group.get("minReplicas"), group.get("maxReplicas")
        if not autoscaling and (low is None or high is None):  # L125
            errors.append(f"{VALIDATION_GO}#L125: {group_name}: minReplicas and maxReplicas required")
        if (low is not None and low < 0) or (high is not None and high < 0):  # L128, L131
            errors.append(f"{VALIDATION_GO}#L128: {group_name}: negative minReplicas or maxReplicas")
        if low is not None and high is not None and low > high:  # L135
            errors.append(f"{VALIDATION_GO}#L135: {group_name}: minReplicas greater than maxReplicas")
        idle = group.get("idleTimeoutSeconds")  # L145 -> validateWorkerGroupIdleTimeout L1006
        if idle is not None and (idle < 0 or not (v2 or head_env.get("RAY_enable_autoscaler_v2") in ("1", "true"))):
            errors.append(f"{VALIDATION_GO}#L1012: {group_name}: idleTimeoutSeconds needs autoscaler v2, >= 0")
        if group.get("priority"):  # L148 -> validateWorkerGroupPriority L1113
            if _version(spec.get("rayVersion", "0")) < (2, 56, 0) or not v2:
                errors.append(f"{VALIDATION_GO}#L1120: {group_name}: priority needs Ray >= 2.56.0 and autoscaler v2")
        if group.get("suspend"):  # L197 (feature gate RayJobDeletionPolicy, off by default), L216
            errors.append(f"{VALIDATION_GO}#L198: {group_name}: a suspended worker group")
    if "RAY_REDIS_ADDRESS" in head_env and not spec.get("gcsFaultToleranceOptions"):  # L158
        errors.append(f"{VALIDATION_GO}#L159: RAY_REDIS_ADDRESS set without gcsFaultToleranceOptions")
    if head.get("rayStartParams", {}).get("redis-username") or "REDIS_USERNAME" in head_env:  # L192
        errors.append(f"{VALIDATION_GO}#L192: redis username outside gcsFaultToleranceOptions")
    if not autoscaling and head_env.get("RAY_enable_autoscaler_v2") in ("1", "true"):  # L206
        errors.append(f"{VALIDATION_GO}#L208: RAY_enable_autoscaler_v2 set with enableInTreeAutoscaling false")
    if autoscaling and options.get("version") and "RAY_enable_autoscaler_v2" in head_env:  # L222
        errors.append(f"{VALIDATION_GO}#L222: both autoscalerOptions.version and RAY_enable_autoscaler_v2")
    if autoscaling and v2:  # L226-L235
        for group_name, group in all_groups:
            if group["template"]["spec"].get("restartPolicy", "Never") != "Never":
                errors.append(f"{VALIDATION_GO}#L227: {group_name}: restartPolicy must be Never or unset with v2")
    if options.get("idleTimeoutSeconds", 0) < 0:  # L241
        errors.append(f"{VALIDATION_GO}#L242: autoscalerOptions.idleTimeoutSeconds must be non-negative")
    if "KUBERAY_GEN_AUTOSCALER_START_CMD" in _env(options):  # L253
        errors.append(f"{VALIDATION_GO}#L253: autoscalerOptions.env must not set KUBERAY_GEN_AUTOSCALER_START_CMD")
    for gated, line in (("historyServerOptions", 260), ("networkPolicy", 316), ("tlsOptions", 323)):
        if spec.get(gated) is not None:  # feature gates off by default: RayClusterHistoryServer, ...
            errors.append(f"{VALIDATION_GO}#L{line}: spec.{gated} needs a KubeRay feature gate")
    auth = spec.get("authOptions") or {}
    if auth.get("mode") == "token":  # L284-L308
        if not spec.get("rayVersion"):
            errors.append(f"{VALIDATION_GO}#L285: authOptions.mode token without rayVersion")
        elif _version(spec["rayVersion"]) < (2, 52, 0):
            errors.append(f"{VALIDATION_GO}#L296: authOptions.mode token needs Ray >= 2.52.0")
        if auth.get("enableK8sTokenAuth") and (_version(spec["rayVersion"]) < (2, 55, 0) or auth.get("secretName")):
            errors.append(f"{VALIDATION_GO}#L300: enableK8sTokenAuth needs Ray >= 2.55.0 and no secretName")
    elif auth.get("enableK8sTokenAuth"):  # L310
        errors.append(f"{VALIDATION_GO}#L310: enableK8sTokenAuth without mode token")
    return errors


def kuberay_rayjob_errors(job: dict) -> list[str]:
    """What KubeRay v1.7.0's ValidateRayJobMetadata and ValidateRayJobSpec (validation.go) say
    about this RayJob. An error there marks the RayJob ValidationFailed (rayjob_controller.go)."""
    errors: list[str] = []
    name, spec = job["metadata"]["name"], job["spec"]
    if len(name) > 53 - 6:  # L534, MaxRayJobNameLength = MaxRayClusterNameLength - 6 (constant.go L381)
        errors.append(f"{VALIDATION_GO}#L534: RayJob name longer than 47")
    if not is_dns1035_label(name):  # L537
        errors.append(f"{VALIDATION_GO}#L537: RayJob name is not a DNS-1035 label")
    shutdown, ttl = spec.get("shutdownAfterJobFinishes", False), spec.get("ttlSecondsAfterFinished", 0)
    if spec.get("suspend") and not shutdown:  # L547
        errors.append(f"{VALIDATION_GO}#L547: suspend without shutdownAfterJobFinishes")
    if ttl < 0:  # L551
        errors.append(f"{VALIDATION_GO}#L551: TTLSecondsAfterFinished must be a non-negative integer")
    if not shutdown and ttl > 0:  # L556 -> validateDeletionConfiguration L753
        errors.append(f"{VALIDATION_GO}#L753: a RayJob with shutdownAfterJobFinishes set to false cannot have "
                      "TTLSecondsAfterFinished")
    if spec.get("deletionStrategy") is not None:  # L763: feature gate RayJobDeletionPolicy, off by default
        errors.append(f"{VALIDATION_GO}#L763: deletionStrategy needs the RayJobDeletionPolicy feature gate")
    selector = spec.get("clusterSelector") or {}
    mode = spec.get("submissionMode", "K8sJobMode")
    if spec.get("suspend") and selector:  # L561
        errors.append(f"{VALIDATION_GO}#L562: clusterSelector does not support suspend")
    if not selector and spec.get("rayClusterSpec") is None:  # L564
        errors.append(f"{VALIDATION_GO}#L565: one of rayClusterSpec or clusterSelector must be set")
    if selector:
        if not selector.get("ray.io/cluster"):  # L569, RayJobClusterSelectorKey (constant.go L85)
            errors.append(f"{VALIDATION_GO}#L569: cluster name in clusterSelector should not be empty")
        if mode == "SidecarMode":  # L572
            errors.append(f"{VALIDATION_GO}#L572: clusterSelector is not supported in SidecarMode")
        if spec.get("backoffLimit", 0) > 0:  # L575
            errors.append(f"{VALIDATION_GO}#L575: backoffLimit is incompatible with clusterSelector")
    if mode == "InteractiveMode" and spec.get("backoffLimit", 0) > 0:  # L587
        errors.append(f"{VALIDATION_GO}#L587: backoffLimit is incompatible with InteractiveMode")
    if mode == "SidecarMode" and (spec.get("submitterPodTemplate") or spec.get("submitterConfig")):  # L592, L596
        errors.append(f"{VALIDATION_GO}#L592: SidecarMode supports no submitterPodTemplate/submitterConfig")
    if spec.get("rayClusterSpec") is not None:  # L605-L611
        errors += kuberay_raycluster_errors({"metadata": {"name": "c"}, "spec": spec["rayClusterSpec"]})
    try:  # L616: RuntimeEnvYAML must unmarshal (dashboardclient.UnmarshalRuntimeEnvYAML: a map)
        env = yaml.safe_load(spec.get("runtimeEnvYAML", "")) or {}
        assert isinstance(env, dict)
    except (yaml.YAMLError, AssertionError):
        errors.append(f"{VALIDATION_GO}#L616: runtimeEnvYAML is not a YAML map")
    for key, line in (("activeDeadlineSeconds", 619), ("preRunningDeadlineSeconds", 622)):
        if spec.get(key) is not None and spec[key] <= 0:
            errors.append(f"{VALIDATION_GO}#L{line}: {key} must be positive")
    if spec.get("backoffLimit", 0) < 0:  # L625
        errors.append(f"{VALIDATION_GO}#L625: backoffLimit must be non-negative")
    return errors


@pytest.mark.quick
def test_the_raycluster_passes_kuberays_validate_raycluster_spec():
    for cluster in of_kind("RayCluster"):
        assert not kuberay_raycluster_errors(cluster), kuberay_raycluster_errors(cluster)


@pytest.mark.quick
def test_the_rayjob_passes_kuberays_validate_rayjob_spec():
    """rayjob.yaml once set ttlSecondsAfterFinished without shutdownAfterJobFinishes, which
    KubeRay rejects (validation.go L753), and which with clusterSelector would delete nothing."""
    for job in of_kind("RayJob"):
        assert not kuberay_rayjob_errors(job), kuberay_rayjob_errors(job)
        assert "ttlSecondsAfterFinished" not in job["spec"] and not job["spec"].get("shutdownAfterJobFinishes")


@pytest.mark.quick
def test_the_kuberay_rule_checks_catch_what_kuberay_rejects():
    """Each encoded rule fires on the mistake it is for (the first being a RayJob that sets
    ttlSecondsAfterFinished without shutdownAfterJobFinishes)."""
    job = copy.deepcopy(the_job())
    job["spec"]["ttlSecondsAfterFinished"] = 86400
    assert any("#L753" in e for e in kuberay_rayjob_errors(job))
    job["spec"]["shutdownAfterJobFinishes"] = True
    assert not any("#L753" in e for e in kuberay_rayjob_errors(job))
    job = copy.deepcopy(the_job())
    job["spec"]["backoffLimit"] = 2
    assert any("#L575" in e for e in kuberay_rayjob_errors(job))
    cluster = copy.deepcopy(the_cluster())
    cluster["spec"]["rayVersion"] = "2.51.0"
    cluster["spec"]["workerGroupSpecs"][0]["rayStartParams"]["labels"] = "a=b"
    cluster["spec"]["workerGroupSpecs"][0]["labels"]["ray.io/tpu pod"] = "x"
    cluster["spec"]["workerGroupSpecs"][0]["minReplicas"] = 9
    found = "\n".join(kuberay_raycluster_errors(cluster))
    assert all(f"#L{line}" in found for line in (73, 81, 135, 296)), found


# ----------------------------------------------------------------------------- Kubernetes objects
@pytest.mark.quick
def test_core_kinds_and_every_pod_template_are_valid_kubernetes_objects():
    kinds = {d["kind"] for docs in documents().values() for d in docs}
    assert {"Namespace", "ServiceAccount", "NetworkPolicy", "RayCluster", "RayJob"} <= kinds, kinds
    for docs in documents().values():
        for doc in docs:
            if doc["apiVersion"] in ("v1", "networking.k8s.io/v1"):
                model = f"V1{doc['kind']}"
                assert not check_model(doc, model, doc["kind"]), check_model(doc, model, doc["kind"])
                assert deserialize(doc, model).metadata.name == doc["metadata"]["name"]
    for name, template in pod_templates():
        assert not check_model(template, "V1PodTemplateSpec", name), check_model(template, "V1PodTemplateSpec", name)
        pod = deserialize(template, "V1PodTemplateSpec")
        assert pod.spec.containers and all(c.image and c.resources.limits for c in pod.spec.containers), name
    cluster = the_cluster()
    options = cluster["spec"]["autoscalerOptions"]
    assert not check_model(options["securityContext"], "V1SecurityContext", "autoscalerOptions.securityContext")
    assert not check_model(options["resources"], "V1ResourceRequirements", "autoscalerOptions.resources")


@pytest.mark.quick
def test_cpu_group_scales_from_zero_and_tpu_groups_ask_for_whole_slices():
    from ray._private.accelerators import tpu as ray_tpu

    from tpu_ray.accelerators import tpu_hosts

    cluster = the_cluster()
    spec = cluster["spec"]
    assert spec["enableInTreeAutoscaling"] is True and spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    assert spec["autoscalerOptions"]["version"] == "v2"  # label selectors: v1's scheduler ignores them
    cpu = [g for n, g in groups(cluster).items() if n not in tpu_groups(cluster)]
    assert cpu and all(g["minReplicas"] == 0 == g["replicas"] and g["maxReplicas"] >= 1 for g in cpu)
    pod_types = set()
    for name, group in tpu_groups(cluster).items():
        selector = group["template"]["spec"]["nodeSelector"]
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


# ---------------------------------------------------------------------- service accounts, tokens
def _service_accounts() -> dict[str, dict]:
    return {a["metadata"]["name"]: a for a in of_kind("ServiceAccount")}


def _mounts_token(template: dict) -> bool:
    """Kubernetes mounts the service account token unless the pod or its account says false."""
    spec = template["spec"]
    account = _service_accounts()[spec["serviceAccountName"]]
    pod = spec.get("automountServiceAccountToken")
    return pod if pod is not None else account.get("automountServiceAccountToken", True)


@pytest.mark.quick
def test_only_the_head_holds_a_kubernetes_token_for_kuberays_autoscaler():
    """KubeRay runs the autoscaler sidecar in the head pod under the head's service
    account and binds its autoscaler Role (patch pods, patch rayclusters) to that account
    (BuildRoleBinding, common/rbac.go L64, subject GetHeadGroupServiceAccountName, utils/util.go
    L578); Ray's KubeRay node provider opens the token file unconditionally. So the head's account
    mounts a token and no other pod runs as that account; workers and the submitter mount none."""
    from ray.autoscaler._private.kuberay import node_provider

    cluster = the_cluster()
    accounts = _service_accounts()
    namespace = cluster["metadata"]["namespace"]
    assert all(a["metadata"]["namespace"] == namespace for a in accounts.values())
    head = cluster["spec"]["headGroupSpec"]["template"]
    head_account = head["spec"]["serviceAccountName"]
    # KubeRay does not create an account the head names; it must be in serviceaccount.yaml
    # (raycluster_controller.go reconcileAutoscalerServiceAccount: AutoscalerServiceAccountNotFound).
    assert head_account in accounts, head_account
    assert _mounts_token(head), "the autoscaler sidecar reads " + node_provider.IN_CLUSTER_TOKEN_PATH
    others = [(name, t) for name, t in pod_templates() if name != "head"]
    assert others
    for name, template in others:
        assert template["spec"]["serviceAccountName"] != head_account, f"{name} would hold the autoscaler's Role"
        assert template["spec"]["serviceAccountName"] in accounts, name
        assert not _mounts_token(template), f"{name} mounts a Kubernetes token"


@pytest.mark.quick
def test_workload_identity_roles_on_buckets_for_both_accounts_and_no_keys():
    cluster = the_cluster()
    namespace = cluster["metadata"]["namespace"]
    for name, template in pod_templates():
        spec = template["spec"]
        for container in spec["containers"]:
            assert not [e for e in container.get("env", []) if e["name"] == "GOOGLE_APPLICATION_CREDENTIALS"], name
        assert not [v for v in spec.get("volumes", []) if "secret" in v], name  # no key file mounted
    guide = GUIDE.read_text()
    # The roles are granted on buckets, to each account's Workload Identity principal; none project-wide.
    assert "gcloud storage buckets add-iam-policy-binding" in guide and "roles/storage.objectUser" in guide
    for account in {t["spec"]["serviceAccountName"] for _, t in pod_templates()}:
        assert f"ns/{namespace}/sa/{account}" in guide, account
    assert "gcloud projects add-iam-policy-binding" not in guide


@pytest.mark.quick
def test_token_auth_with_a_ray_version_kuberay_accepts():
    cluster = the_cluster()
    assert cluster["spec"]["authOptions"]["mode"] == "token"
    image = (DEPLOY / "Dockerfile").read_text()
    ray_image = re.search(r"^ARG RAY_IMAGE=rayproject/ray:(\d+\.\d+\.\d+)-", image, re.M).group(1)
    assert cluster["spec"]["rayVersion"] == ray_image  # the Ray the images run
    assert _version(ray_image) >= (2, 52, 0)  # validation.go L295: token auth needs Ray >= 2.52.0


# ------------------------------------------------------------------------------ security context
def _containers() -> list[tuple[str, dict, bool]]:
    """(where, securityContext, is a TPU container) for every container the manifests define,
    KubeRay's autoscaler sidecar included (autoscalerOptions.securityContext)."""
    cluster = the_cluster()
    out = [("autoscaler sidecar", cluster["spec"]["autoscalerOptions"].get("securityContext"), False)]
    tpu = set(tpu_groups(cluster))
    for name, template in pod_templates():
        out += [(f"{name}/{c['name']}", c.get("securityContext"), name in tpu)
                for c in template["spec"]["containers"]]
    return out


@pytest.mark.quick
def test_every_container_has_a_restricted_security_context():
    for where, context, is_tpu in _containers():
        assert context, f"{where}: no securityContext"
        assert context.get("allowPrivilegeEscalation") is False and context.get("privileged") is not True, where
        assert context.get("seccompProfile") == {"type": "RuntimeDefault"}, where
        assert context.get("capabilities", {}).get("drop"), where
        assert not context.get("capabilities", {}).get("add"), where
        if is_tpu:  # root, as KubeRay's TPU samples run (the device files are root's): said in the manifest
            assert context.get("runAsUser") == 0 and "NET_RAW" in context["capabilities"]["drop"], where
        else:
            assert context.get("runAsNonRoot") is True and context.get("runAsUser", 0) != 0, where
            assert context["capabilities"]["drop"] == ["ALL"], where
    # The non-root uid and gid are the `ray` user and `users` group the Dockerfile copies the repo as.
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "COPY --chown=ray:users " in dockerfile
    nonroot = {(c.get("runAsUser"), c.get("runAsGroup")) for _, c, tpu in _containers() if not tpu}
    assert nonroot == {(1000, 100)}, nonroot


# ------------------------------------------------------------------------------- network policy
def _selects(selector: dict, labels: dict) -> bool:
    assert set(selector) <= {"matchLabels"}, f"the evaluator reads matchLabels only: {selector}"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def ingress_allowed(policies: list[dict], namespace: str, target: dict, source: tuple[str, dict] | None,
                    port: int) -> bool:
    """NetworkPolicy semantics for TCP ingress to a pod (namespace, labels `target`) from a pod
    `source` = (namespace, labels), or from outside every pod (None): not isolated -> allowed;
    isolated -> allowed if one rule of one selecting policy admits the source and the port."""
    selecting = [p for p in policies if p["metadata"]["namespace"] == namespace
                 and _selects(p["spec"]["podSelector"], target)
                 and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports and not any(p.get("protocol", "TCP") == "TCP" and p.get("port") == port for p in ports):
                continue
            peers = rule.get("from")
            if not peers:
                return True
            for peer in peers:
                assert set(peer) == {"podSelector"}, f"the evaluator reads podSelector peers only: {peer}"
                if source is not None and source[0] == namespace and _selects(peer["podSelector"], source[1]):
                    return True
    return False


def _kuberay_pod_labels(cluster: dict, group: str) -> dict:
    """The labels KubeRay puts on a Ray pod (labelPod, common/pod.go L1167, plus the group's labels)."""
    name = cluster["metadata"]["name"]
    spec = cluster["spec"]["headGroupSpec"] if group == "headgroup" else groups(cluster)[group]
    return {**spec.get("labels", {}), "ray.io/is-ray-node": "yes", "ray.io/cluster": name,
            "ray.io/node-type": "head" if group == "headgroup" else "worker", "ray.io/group": group,
            "app.kubernetes.io/name": "kuberay", "app.kubernetes.io/created-by": "kuberay-operator"}


@pytest.mark.quick
def test_network_policies_close_the_ray_ports_to_other_pods():
    """Before, 6379 (GCS), 10001 (Ray Client) and every other Ray port were open to every pod of the
    GKE cluster. Now only the cluster's own pods reach them; 8265 (token-protected Jobs API and
    dashboard) stays reachable for the submitter and the KubeRay operator."""
    policies = of_kind("NetworkPolicy")
    cluster = the_cluster()
    namespace = cluster["metadata"]["namespace"]
    head = _kuberay_pod_labels(cluster, "headgroup")
    workers = [_kuberay_pod_labels(cluster, g) for g in groups(cluster)]
    stranger = ("default", {"app": "something-else"})
    neighbour = (namespace, {"app": "something-else"})  # another pod in the same namespace
    template = the_job()["spec"].get("submitterPodTemplate", {})
    submitter = (namespace, {**template.get("metadata", {}).get("labels", {}),
                             "ray.io/originated-from-crd": "RayJob"})
    for source in (stranger, neighbour, None):
        for port in (6379, 10001, 52365, 8076):
            assert not ingress_allowed(policies, namespace, head, source, port), (source, port)
        for labels in workers:
            assert not ingress_allowed(policies, namespace, labels, source, 10002), (source, labels["ray.io/group"])
    for source in (stranger, submitter, None):
        assert ingress_allowed(policies, namespace, head, source, 8265), source
    for labels in workers:  # inside the Ray cluster every port stays open, both ways
        assert ingress_allowed(policies, namespace, head, (namespace, labels), 6379)
        assert ingress_allowed(policies, namespace, labels, (namespace, head), 12345)
    # Without Dataplane V2 (or Calico) GKE accepts NetworkPolicies and enforces none.
    create = re.search(r"gcloud container clusters create .*?(?=\n\S|\n\n)", GUIDE.read_text(), re.S).group(0)
    assert "--enable-dataplane-v2" in create


# ---------------------------------------------------------------------- the autoscaler's view
def ray_autoscaling_config(cluster: dict) -> dict:
    """What Ray's KubeRay autoscaler makes of the RayCluster (its own code; it validates the result)."""
    from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr

    return _derive_autoscaling_config_from_ray_cr(copy.deepcopy(cluster))


def _quantity(text) -> Decimal:
    from ray.autoscaler._private.kuberay.utils import parse_quantity

    return parse_quantity(str(text))


@pytest.mark.quick
def test_rays_kuberay_autoscaler_sees_each_group_with_the_resources_and_labels_of_its_pods():
    cluster = the_cluster()
    types = ray_autoscaling_config(cluster)["available_node_types"]
    assert set(types) == {"headgroup", *groups(cluster)}
    assert types["headgroup"]["resources"]["CPU"] == 0 and types["headgroup"]["max_workers"] == 0
    for name, group in groups(cluster).items():
        offered = types[name]
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert offered["resources"]["CPU"] == int(_quantity(limits["cpu"])), name
        assert offered["resources"]["memory"] == int(_quantity(limits["memory"])), name
        assert offered["labels"] == group["labels"], name
        assert offered["max_workers"] == group["maxReplicas"] * group.get("numOfHosts", 1), name
        if name in tpu_groups(cluster):
            chips = int(limits["google.com/tpu"])
            (head_resource,) = [r for r in offered["resources"] if r.startswith("TPU-")]
            assert offered["resources"]["TPU"] == chips and offered["resources"][head_resource] == 1, name
        else:
            assert not any(r == "TPU" or r.startswith("TPU-") for r in offered["resources"]), name


def _kuberay_host(monkeypatch, pod_type: str, topology: str, slice_name: str, worker: int) -> tuple[dict, dict]:
    """(resources, labels) Ray 2.60 gives a GKE TPU pod, computed by Ray's own TPU accelerator
    manager from the environment GKE (TPU_ACCELERATOR_TYPE, TPU_TOPOLOGY) and KubeRay's TPU webhook
    (TPU_NAME, TPU_WORKER_ID) set in the pod. The labels are Ray's defaults for the node
    (resource_and_label_spec.py _get_default_labels): ray.io/accelerator-type and the TPU labels."""
    from ray._private.accelerators import tpu as ray_tpu

    for key, value in {"TPU_ACCELERATOR_TYPE": pod_type, "TPU_TOPOLOGY": topology, "TPU_NAME": slice_name,
                       "TPU_WORKER_ID": str(worker)}.items():
        monkeypatch.setenv(key, value)
    manager = ray_tpu.TPUAcceleratorManager
    resources = {"TPU": ray_tpu.get_num_tpu_visible_chips_per_host(pod_type),
                 **manager.get_current_node_additional_resources()}
    labels = {"ray.io/accelerator-type": manager.get_current_node_accelerator_type(),
              **manager.get_current_node_accelerator_labels()}
    return resources, labels


@pytest.mark.quick
def test_group_labels_are_what_ray_gives_every_host_and_what_the_code_selects_on(monkeypatch):
    """The autoscaler knows a group only by its declared labels; CPU actors select
    ray.io/accelerator-type !in (TPU-...) (tpu_ray/cluster/cpu_nodes.py), and a group without the key
    matches `!in`. Every TPU group declares the value Ray itself gives each of its hosts, and only
    labels equal on every host (KubeRay passes a group's labels to every pod's `ray start --labels`,
    where they override Ray's own)."""
    from ray._private.accelerators import tpu as ray_tpu
    from ray._private.label_utils import parse_node_labels_string

    from tpu_ray.cluster.cpu_nodes import ACCELERATOR_LABEL, tpu_accelerator_labels

    cluster = the_cluster()
    for name, group in groups(cluster).items():
        labels = group["labels"]
        # KubeRay's updateRayStartParamsLabels (pod.go L1630): sorted key=value, comma-joined.
        flag = ",".join(f"{k}={labels[k]}" for k in sorted(labels))
        assert parse_node_labels_string(flag) == labels, name  # what `ray start --labels` makes of it
        if name not in tpu_groups(cluster):
            assert labels.get(ACCELERATOR_LABEL, "") not in tpu_accelerator_labels(), name
            assert not any(k.startswith("ray.io/tpu") for k in labels), name
            continue
        assert labels.get(ACCELERATOR_LABEL) in tpu_accelerator_labels(), f"{name}: no {ACCELERATOR_LABEL}"
        selector = group["template"]["spec"]["nodeSelector"]
        topology = selector["cloud.google.com/gke-tpu-topology"]
        (family,) = [f for f, v in GKE_TPU_ACCELERATOR.items()
                     if v == selector["cloud.google.com/gke-tpu-accelerator"]]
        pod_type = ray_tpu.infer_tpu_pod_type_from_topology(topology, family)
        for worker in range(group["numOfHosts"]):
            slice_name = f"{cluster['metadata']['name']}-{name}-0"
            _, detected = _kuberay_host(monkeypatch, pod_type, topology, slice_name, worker)
            declared = {k: v for k, v in labels.items() if k.startswith("ray.io/")}
            assert declared == {k: detected.get(k) for k in declared}, (name, worker, declared, detected)
        assert not {"ray.io/tpu-worker-id", "ray.io/tpu-slice-name"} & set(labels), name  # per host, per slice


def _selector_constraints(label_selector: dict[str, str]) -> list:
    """A Ray label selector ({"key": "!in(a,b)"}, as actors and placement groups take it) as the
    (key, operator, values) constraints of the autoscaler's ResourceRequest; Ray validates it first."""
    from ray._private.label_utils import validate_label_selector
    from ray.core.generated.common_pb2 import LabelSelectorOperator

    assert validate_label_selector(label_selector) is None, validate_label_selector(label_selector)
    out = []
    for key, value in label_selector.items():
        negated = value.startswith("!")
        value = value[1:] if negated else value
        listed = re.fullmatch(r"in\((.*)\)", value)
        values = listed.group(1).split(",") if listed else [value]
        op = LabelSelectorOperator.LABEL_OPERATOR_NOT_IN if negated else LabelSelectorOperator.LABEL_OPERATOR_IN
        out.append((key, op, [v.strip() for v in values]))
    return out


def autoscaler_launches(cluster: dict, resources: dict, count: int, label_selector: dict | None = None):
    """What Ray's autoscaler v2 (ResourceDemandScheduler, as it runs for KubeRay) launches for `count`
    pending requests of `resources` on an empty cluster: ({node type: count}, infeasible requests)."""
    from ray.autoscaler.v2.instance_manager.config import AutoscalingConfig
    from ray.autoscaler.v2.scheduler import ResourceDemandScheduler, SchedulingRequest
    from ray.autoscaler.v2.utils import ResourceRequestUtil
    from ray.core.generated.autoscaler_pb2 import ResourceRequestByCount

    config = ray_autoscaling_config(cluster)
    selectors = [_selector_constraints(label_selector)] if label_selector else None
    request = ResourceRequestUtil.make(resources, label_selectors=selectors)
    reply = ResourceDemandScheduler().schedule(SchedulingRequest(
        disable_launch_config_check=True, node_type_configs=AutoscalingConfig(config).get_node_type_configs(),
        max_num_nodes=config["max_workers"],
        resource_requests=[ResourceRequestByCount(request=request, count=count)]))
    launched: dict[str, int] = {}
    for launch in reply.to_launch:
        launched[launch.instance_type] = launched.get(launch.instance_type, 0) + launch.count
    return launched, len(reply.infeasible_resource_requests)


@pytest.mark.quick
def test_cpu_actor_demand_never_scales_up_a_tpu_group():
    """Ray's own autoscaler v2, given this RayCluster as Ray's KubeRay code reads it: more CPU actors
    (with tpu-ray's off-TPU label selector) than the cpu group can hold fill the cpu group and wait;
    they never launch a TPU slice. With the TPU groups' ray.io/accelerator-type removed (as an
    earlier manifest had them) the same demand launches one."""
    from tpu_ray.cluster.cpu_nodes import ACCELERATOR_LABEL, off_tpu_options

    cluster = the_cluster()
    selector = off_tpu_options([{"Alive": True, "Labels": {}}])["label_selector"]
    (cpu,) = [n for n in groups(cluster) if n not in tpu_groups(cluster)]
    capacity = groups(cluster)[cpu]["maxReplicas"] * int(_quantity(groups(cluster)[cpu]["rayStartParams"].get(
        "num-cpus", groups(cluster)[cpu]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"])))
    launched, waiting = autoscaler_launches(cluster, {"CPU": 1}, capacity + 10, selector)
    assert launched == {cpu: groups(cluster)[cpu]["maxReplicas"]} and waiting == 10, (launched, waiting)
    unlabelled = copy.deepcopy(cluster)
    for group in tpu_groups(unlabelled).values():
        del group["labels"][ACCELERATOR_LABEL]
    launched, _ = autoscaler_launches(unlabelled, {"CPU": 1}, capacity + 10, selector)
    assert set(launched) & set(tpu_groups(cluster)), launched  # the check would catch the old manifest
    # And a slice reservation (its head resource) launches exactly its group.
    for name in tpu_groups(cluster):
        (head_resource,) = [r for r in ray_autoscaling_config(cluster)["available_node_types"][name]["resources"]
                            if r.startswith("TPU-")]
        assert autoscaler_launches(cluster, {head_resource: 1}, 1) == ({name: 1}, 0), name


# ------------------------------------------------------------------------- node allocatable
def gke_allocatable(vcpus: int, memory_gib: int) -> tuple[Decimal, Decimal]:
    """(CPU, memory bytes) a GKE Standard node of that machine offers pods: GKE's reservation
    (cloud.google.com/kubernetes-engine/docs/concepts/plan-node-sizes#memory_and_cpu_reservations).
    CPU: 6% of the first core, 1% of the next, 0.5% of the next 2, 0.25% of the rest. Memory: 255 MiB
    below 1 GiB; else 25% of the first 4 GiB, 20% of the next 4, 10% of the next 8, 6% of the next
    112, 2% above 128 GiB; plus 100 MiB kept for the kubelet's eviction threshold."""
    def tiered(total: Decimal, tiers: list[tuple[Decimal, Decimal]]) -> Decimal:
        reserved, left = Decimal(0), total
        for size, share in tiers:
            take = min(left, size)
            reserved, left = reserved + take * share, left - take
        return reserved

    big = Decimal(10**9)
    cpu = Decimal(vcpus) - tiered(Decimal(vcpus), [(Decimal(1), Decimal("0.06")), (Decimal(1), Decimal("0.01")),
                                                   (Decimal(2), Decimal("0.005")), (big, Decimal("0.0025"))])
    gib = Decimal(memory_gib)
    reserved = Decimal("255") / 1024 if gib < 1 else tiered(gib, [
        (Decimal(4), Decimal("0.25")), (Decimal(4), Decimal("0.20")), (Decimal(8), Decimal("0.10")),
        (Decimal(112), Decimal("0.06")), (big, Decimal("0.02"))])
    return cpu, (gib - reserved) * 2**30 - 100 * 2**20


def _requests(template_or_containers) -> tuple[Decimal, Decimal]:
    containers = template_or_containers
    if isinstance(containers, dict):
        containers = containers["spec"]["containers"]
    cpu = sum((_quantity(c["resources"]["requests"]["cpu"]) for c in containers), Decimal(0))
    memory = sum((_quantity(c["resources"]["requests"]["memory"]) for c in containers), Decimal(0))
    return cpu, memory


def _pools() -> dict[str, dict]:
    """The node pools docs/kubernetes.md creates: name -> machine type, max nodes, TPU topology."""
    guide = re.sub(r"\\\n\s*", " ", GUIDE.read_text())
    out = {}
    for kind, name, args in re.findall(r"gcloud container (clusters|node-pools) create (\S+)([^\n]*)", guide):
        flags = dict(re.findall(r"--([\w-]+)=(\S+)", args))
        out["default" if kind == "clusters" else name] = {
            "machine": flags["machine-type"], "max": int(flags["max-nodes"]), "topology": flags.get("tpu-topology")}
    return out


def _pod_sets(cluster: dict) -> dict[str, list[tuple[str, Decimal, Decimal]]]:
    """pool name -> every pod (name, CPU, memory requests) that may run there at once: on the default
    pool the head (with KubeRay's autoscaler sidecar, its resources from autoscalerOptions or
    KubeRay's default 500m / 512Mi, BuildAutoscalerContainer, pod.go L989), the RayJob's submitter
    and every cpu pod; on a TPU pool its group's pods."""
    pools = _pools()
    sidecar = cluster["spec"]["autoscalerOptions"].get("resources", {"requests": {"cpu": "500m", "memory": "512Mi"}})
    head = _requests(cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"] + [{"resources": sidecar}])
    default = [("head", *head)]
    for job in of_kind("RayJob"):  # without a template, KubeRay's default submitter (common/job.go L230)
        template = job["spec"].get("submitterPodTemplate", {"spec": {"containers": [
            {"resources": {"requests": {"cpu": "500m", "memory": "200Mi"}}}]}})
        default.append((f"{job['metadata']['name']} submitter", *_requests(template)))
    out = {"default": default}
    for name, group in groups(cluster).items():
        pods = [(f"{name}-{i}", *_requests(group["template"]))
                for i in range(group["maxReplicas"] * group.get("numOfHosts", 1))]
        selector = group["template"]["spec"].get("nodeSelector")
        if not selector:
            out["default"] += pods
            continue
        (pool,) = [p for p, spec in pools.items() if spec["topology"] == selector["cloud.google.com/gke-tpu-topology"]
                   and MACHINES[spec["machine"]][2] == selector["cloud.google.com/gke-tpu-accelerator"]]
        out.setdefault(pool, []).extend(pods)
    return out


@pytest.mark.quick
def test_every_pod_fits_the_allocatable_of_its_node_pool_and_the_pools_hold_them_all():
    """Before, 8 CPUs and 32 GiB were requested on n2-standard-8 nodes (7.91 CPUs and ~28.3 GiB
    allocatable): the cpu pods could never be scheduled. Each pod must fit a node's allocatable less
    an allowance for GKE's own pods, and the pool's --max-nodes must hold them all (first fit)."""
    pools = _pools()
    assert set(pools) >= {"default"}
    for pool, pods in _pod_sets(the_cluster()).items():
        vcpus, memory_gib, _ = MACHINES[pools[pool]["machine"]]
        cpu, memory = gke_allocatable(vcpus, memory_gib)
        room = (cpu - SYSTEM_PODS_CPU, memory - SYSTEM_PODS_MEMORY)
        nodes: list[list[Decimal]] = []
        for name, pod_cpu, pod_memory in sorted(pods, key=lambda p: (-p[1], -p[2])):
            assert pod_cpu <= room[0] and pod_memory <= room[1], (
                f"{name} asks {pod_cpu} CPU / {pod_memory / 2**30:.1f} GiB; a {pools[pool]['machine']} node offers "
                f"{room[0]} / {room[1] / 2**30:.1f} after GKE's reservation and its own pods")
            node = next((n for n in nodes if n[0] >= pod_cpu and n[1] >= pod_memory), None)
            if node is None:
                nodes.append(node := [room[0], room[1]])
            node[0] -= pod_cpu
            node[1] -= pod_memory
        assert len(nodes) <= pools[pool]["max"], (
            f"pool {pool}: {len(nodes)} nodes needed, --max-nodes={pools[pool]['max']}")


@pytest.mark.quick
def test_the_allocatable_formula_gives_gkes_published_figures():
    """GKE's formula worked by hand: n2-standard-8 (8 - 0.09 CPU; 32 - 3.56 GiB - 100 MiB), a 4 GiB
    machine (25% of 4 GiB reserved), ct5lp-hightpu-4t (112 - 0.08 - 0.25% of 108 CPU)."""
    cpu, memory = gke_allocatable(8, 32)
    assert cpu == Decimal("7.910") and round(memory / 2**30, 2) == Decimal("28.34")
    assert gke_allocatable(1, 4)[1] == 3 * 2**30 - 100 * 2**20
    assert gke_allocatable(112, 192)[0] == Decimal("111.650")


# ------------------------------------------------------------------------ the RayJob, the image
@pytest.mark.quick
def test_the_rayjob_runs_the_command_the_readme_documents_on_the_cluster():
    job, cluster = the_job(), the_cluster()
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    assert job["metadata"]["namespace"] == cluster["metadata"]["namespace"]
    readme = (REPO / "README.md").read_text()
    documented = re.findall(r"`(python jobs/pretrain\.py --config [^\s`]+)`", readme)
    assert job["spec"]["entrypoint"] in documented, (job["spec"]["entrypoint"], documented)
    config = job["spec"]["entrypoint"].split("--config ", 1)[1].split()[0]
    assert (REPO / config).exists(), config
    assert yaml.safe_load(job["spec"]["runtimeEnvYAML"])["working_dir"] == "/home/ray/tpu-ray"
    assert "COPY --chown=ray:users . /home/ray/tpu-ray" in (DEPLOY / "Dockerfile").read_text()
    # The submitter uploads working_dir from its own filesystem: the head's image, which holds it.
    (submitter,) = job["spec"]["submitterPodTemplate"]["spec"]["containers"]
    head_image = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
    assert submitter["image"] == head_image
    assert job["spec"]["submitterPodTemplate"]["spec"]["restartPolicy"] in ("Never", "OnFailure")  # a Job's pod


@pytest.mark.quick
def test_the_guide_edits_every_image_placeholder():
    guide = GUIDE.read_text()
    sed = re.search(r"^sed -i .*YOUR_PROJECT_ID.*$", guide, re.M)
    assert sed, "docs/kubernetes.md: the sed that puts the project into the manifests"
    for path in sorted(DEPLOY.glob("*.yaml")):
        if "YOUR_PROJECT_ID" in path.read_text():
            assert str(path.relative_to(REPO)) in sed.group(0), path.name


def _docker_pattern(pattern: str) -> re.Pattern:
    """A .dockerignore pattern as Docker's patternmatcher reads it: relative to the context root,
    `*` and `?` within one path element, `**` across any number of them."""
    pattern = posixpath.normpath(pattern.strip().lstrip("/"))
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def docker_excludes(path: str) -> bool:
    """Whether `docker build` leaves `path` (relative to the repository root) out of the context:
    the last matching pattern wins, and a path goes with an excluded parent directory."""
    ignore = REPO / ".dockerignore"
    assert ignore.is_file(), "no .dockerignore: `COPY .` puts .git, .venv and runs/ into the image"
    lines = [s.strip() for s in ignore.read_text().splitlines()]
    excluded = False
    parts = path.split("/")
    for line in lines:
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        regex = _docker_pattern(line[1:] if negated else line)
        if any(regex.fullmatch("/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            excluded = not negated
    return excluded


@pytest.mark.quick
def test_the_image_gets_the_repository_without_git_venvs_or_runs():
    """Before, `COPY .` baked .venv, runs/ and .git into the image (and into every RayJob's
    working_dir upload). The context now leaves out .git and everything .gitignore names, and keeps
    what the image installs and runs."""
    for path in (".git/HEAD", ".venv/bin/python", "runs/quickstart/plan.json", ".venv-interop/x",
                 "tpu_ray/__pycache__/cli.cpython-310.pyc", "tpu_ray.egg-info/PKG-INFO"):
        assert docker_excludes(path), path
    for line in (REPO / ".gitignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        anchored = "/" in line.rstrip("/")  # gitignore: a slash before the end ties it to the root
        name = line.strip("/").replace("*", "x")
        samples = [name, f"{name}/inner.txt"] + ([] if anchored else [f"sub/{name}", f"a/b/{name}/inner.txt"])
        for sample in samples:
            assert docker_excludes(sample), f".gitignore's {line!r} ({sample}) would be copied into the image"
    for needed in ("pyproject.toml", "README.md", "tpu_ray/__init__.py", "tpu_ray/cli.py", "jobs/pretrain.py",
                   "jobs/_entry.py", "jobs/configs/roberta-base-v6e-8.yaml", "deploy/tpu-finish-install.sh"):
        assert (REPO / needed).exists() and not docker_excludes(needed), needed
    if shutil.which("git") and (REPO / ".git").exists():  # every tracked file goes into the image
        tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
        dropped = [p for p in tracked.stdout.splitlines() if docker_excludes(p)]
        assert not dropped, dropped


# ------------------------------------------------------------------------------------ the guide
@pytest.mark.quick
def test_the_guides_say_which_path_to_choose_and_start_from_gke_with_the_ray_add_on():
    guide = GUIDE.read_text()
    create = re.search(r"gcloud container clusters create .*?(?=\n\S|\n\n)", guide, re.S)
    assert create and "--addons=RayOperator" in create.group(0), "docs/kubernetes.md: cluster create with the add-on"
    for step in ("kubectl apply -f deploy/kubernetes/serviceaccount.yaml",
                 "kubectl apply -f deploy/kubernetes/networkpolicy.yaml",
                 "kubectl apply -f deploy/kubernetes/raycluster.yaml",
                 "kubectl apply -f deploy/kubernetes/rayjob.yaml",
                 "SUCCEEDED"):
        assert step in guide, step
    # The accounts exist before the RayCluster names them (KubeRay does not create the head's).
    first = guide.index("kubectl apply -f deploy/kubernetes/raycluster.yaml")
    assert guide.index("kubectl apply -f deploy/kubernetes/serviceaccount.yaml") < first
    for page in ("docs/kubernetes.md", "docs/cluster.md"):
        assert "## Which path: cluster launcher or KubeRay" in (REPO / page).read_text(), page


@pytest.mark.quick
def test_the_guide_states_the_kuberay_floor_what_is_verified_and_the_first_checks():
    guide = GUIDE.read_text()
    assert f"KubeRay {KUBERAY_FLOOR}" in guide and f"KubeRay {KUBERAY_RELEASE}" in guide
    assert "## What is and is not verified" in guide
    checks = guide.split("## First ten minutes on a real cluster", 1)
    assert len(checks) == 2, "docs/kubernetes.md: the first-ten-minutes checks"
    for command in ("kubectl get crd rayclusters.ray.io", "kubectl -n tpu-ray get raycluster tpu-ray",
                    "kubectl describe node", "kubectl -n tpu-ray get events", "kubectl auth can-i"):
        assert command in checks[1], command


# ------------------------------------------------------------- the slice reservation, end to end
@pytest.mark.slow  # a Ray cluster of 1 + 4 nodes: ~30 s on 2 cores
@pytest.mark.own_process  # that cluster in a process of its own (tests/own_process.py)
def test_the_slice_reservation_works_from_kuberay_labels_and_environment(monkeypatch):
    """The tpu-v5e-16 group's 4 pods as Ray labels them on GKE: tpu-ray reserves the whole slice by
    its head resource and drives it by the TPU_NAME KubeRay's webhook gave it (no TPU VM metadata)."""
    import ray
    from ray.cluster_utils import Cluster

    from tpu_ray.cluster.placement import reserve_tpu_slice

    group = groups(the_cluster())["tpu-v5e-16"]
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
        # Each pod starts Ray with its group's labels too (`ray start --labels`): they equal Ray's own.
        nodes = [cluster.add_node(num_cpus=0, resources=r, labels={**group["labels"], **labels})
                 for r, labels in hosts]
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
