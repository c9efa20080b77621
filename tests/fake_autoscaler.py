"""Ray's real autoscaler (v2, as `ray up` runs it) on its local fake node provider, shaped by cluster.yaml.

Why not `ray.cluster_utils.AutoscalingCluster`: in Ray 2.60 it reads a YAML the wheel does not ship
(fake_multi_node/example.yaml; provider type fake_multinode reads it too, for defaults, so the same
provider class is named here as an "external" provider module) and its start() runs `ray stop --force`, which kills every Ray process on the machine. Here the
whole autoscaling config is built from the project's cluster.yaml (node types, resources, labels,
min/max workers; CPUs divided by `cpu_scale` so a CPU worker fits this machine) and the head is
started with `RAY_FAKE_CLUSTER=1 ray start --head --autoscaling-config=...` in a session of its
own, on ports of its own. The fake provider starts each worker node's processes from the
autoscaler (inside that session), so stopping the session stops the worker nodes too, and
nothing else.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.test_jobs import REPO, VENV_BIN, RayHead, _free_ports, agent_not_listening

# The fake provider tags its head with this node type (and Ray's node id with FAKE_HEAD_NODE_ID).
FAKE_HEAD_TYPE = "ray.head.default"
FAKE_HEAD_NODE_ID = "fffffffffffffffffffffffffffffffffffffffffffffffffff00000"
FAKE_PROVIDER = "ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider"
OBJECT_STORE_BYTES = 80 * 2**20  # per fake node: 2 cores and 24 GiB are shared with other runs


def autoscaling_config(cluster_yaml: Path, gcs_address: str, cpu_scale: int = 8,
                       idle_timeout_minutes: float = 0.2) -> dict[str, Any]:
    """The launcher config of `cluster_yaml`, provider swapped for fake_multinode, CPUs / cpu_scale."""
    src = yaml.safe_load(cluster_yaml.read_text())
    types: dict[str, Any] = {}
    for name, spec in src["available_node_types"].items():
        resources = dict(spec.get("resources") or {})
        if "CPU" in resources:
            resources["CPU"] = resources["CPU"] // cpu_scale if resources["CPU"] else 0
        node = {"resources": resources, "labels": dict(spec.get("labels") or {}), "node_config": {},
                "min_workers": spec.get("min_workers", 0), "max_workers": spec.get("max_workers", 0)}
        if name != src["head_node_type"]:
            node["resources"]["object_store_memory"] = OBJECT_STORE_BYTES
        types[FAKE_HEAD_TYPE if name == src["head_node_type"] else name] = node
    return {
        "cluster_name": src["cluster_name"],
        "max_workers": src["max_workers"],
        "upscaling_speed": src.get("upscaling_speed", 1.0),
        "idle_timeout_minutes": idle_timeout_minutes,
        # Ray's fake provider class, loaded as an "external" provider: type fake_multinode would make
        # the autoscaler read fake_multi_node/example.yaml for defaults, which the wheel lacks.
        "provider": {"type": "external", "module": FAKE_PROVIDER, "gcs_address": gcs_address, "head_node_id": FAKE_HEAD_NODE_ID,
                     "launch_multiple": True, "use_node_id_as_ip": True, "disable_node_updaters": True,
                     "disable_launch_config_check": True},
        "available_node_types": types,
        "head_node_type": FAKE_HEAD_TYPE,
        "auth": {}, "docker": {}, "file_mounts": {}, "cluster_synced_files": [],
        "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": [],
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
        "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
    }


@contextmanager
def autoscaling_head(cluster_yaml: Path, cpu_scale: int = 8, idle_timeout_minutes: float = 0.2,
                     extra_env: dict[str, str] | None = None) -> Iterator[tuple[RayHead, dict]]:
    """Start the head (autoscaler v2, fake provider) and yield (head, autoscaling config)."""
    temp_dir = tempfile.mkdtemp(prefix="tpu-ray-as-", dir="/tmp")  # short: Unix sockets live below it
    gcs, dashboard, client, agent = _free_ports(4)
    gcs_address = f"127.0.0.1:{gcs}"
    config = autoscaling_config(cluster_yaml, gcs_address, cpu_scale, idle_timeout_minutes)
    config_path = Path(temp_dir) / "autoscaling.yaml"
    config_path.write_text(yaml.safe_dump(config))
    head_spec = config["available_node_types"][FAKE_HEAD_TYPE]
    # No STORAGE_EMULATOR_HOST: jobs must carry it themselves (runtime_env), as credentials on GCP.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_ADDRESS", "RAY_API_SERVER", "RAY_AUTH", "STORAGE_EMULATOR_HOST"))}
    env.update({"PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", "RAY_USAGE_STATS_ENABLED": "0",
                "RAY_AUTH_MODE": "disabled", "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1",
                # Autoscaler v2, as `ray up` starts it since Ray 2.50.
                "RAY_enable_autoscaler_v2": "1", "RAY_CLOUD_INSTANCE_ID": FAKE_HEAD_NODE_ID,
                "RAY_NODE_TYPE_NAME": FAKE_HEAD_TYPE, **(extra_env or {})})
    labels = ",".join(f"{k}={v}" for k, v in head_spec["labels"].items())
    cmd = [str(VENV_BIN / "ray"), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={gcs}",
           f"--autoscaling-config={config_path}", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
           f"--temp-dir={temp_dir}", f"--num-cpus={int(head_spec['resources'].get('CPU', 0))}",
           "--disable-usage-stats", f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}",
           f"--object-store-memory={OBJECT_STORE_BYTES}"]
    if labels:
        cmd.append(f"--labels={labels}")
    others = {k: v for k, v in head_spec["resources"].items() if k != "CPU"}
    if others:
        cmd.append(f"--resources={json.dumps(others)}")
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # the head, the autoscaler and every fake node in one session
    head = RayHead(f"http://127.0.0.1:{dashboard}", gcs_address, temp_dir, proc.pid)
    try:
        output, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, output
        not_up = agent_not_listening(agent, temp_dir)
        assert not_up is None, not_up
        yield head, config
    finally:
        head.stop()
        if not os.environ.get("TPU_RAY_KEEP_CLUSTER_LOGS"):  # set it to read the nodes' logs after a failure
            shutil.rmtree(temp_dir, ignore_errors=True)
