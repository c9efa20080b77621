"""TPU start-up on a CPU host: each way TPU initialization fails gets its own one-line error and fix,
and the accelerator type (hence MFU) is found the way Ray finds it, or the log says it is not."""

from __future__ import annotations

import http.server
import json
import logging
import os
import subprocess
import sys
import threading

import pytest

from tests.helpers import REPO
from tpu_ray.errors import UserError

# The real path, in a fresh process (connecting to a TPU cluster changes TensorFlow's global context):
# strategy.select() with train.strategy=tpu on this CPU host, once as "local", once with a slice name
# (no GCE metadata server here: the resolver's lookup fails like a name that does not resolve).
REAL = r'''
import json, os, tempfile
import tensorflow as tf
from tpu_ray.config import TrainConfig
from tpu_ray.errors import UserError
from tpu_ray.train.strategy import _tpu_strategy
from tpu_ray.train.tpu_init import classify_tpu_error
out = {}
for key, name in (("local", None), ("named", "no-such-slice")):
    try:
        _tpu_strategy(TrainConfig(strategy="tpu", tpu_name=name))
    except UserError as exc:
        out[key] = str(exc)
# The exception a host WITH chips raises when libtpu did not load, with and without libtpu's lock file.
try:
    r = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="local")
    tf.config.experimental_connect_to_cluster(r)
    tf.tpu.experimental.initialize_tpu_system(r)
except tf.errors.OpError as exc:
    out["exc_type"] = type(exc).__name__
    with tempfile.NamedTemporaryFile() as lock:
        out["locked"] = str(classify_tpu_error(exc, "local", chips=4, lockfile=lock.name))
    out["no_libtpu"] = str(classify_tpu_error(exc, "local", chips=4, lockfile="/nonexistent/libtpu_lockfile"))
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def real() -> dict[str, str]:
    out = subprocess.run([sys.executable, "-c", REAL], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TPU_NAME": ""})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_no_tpu_at_all(real):
    assert real["local"].startswith("train.strategy=tpu: no TPU reachable as 'local' (TPUs not found")
    assert "train.strategy=cpu" in real["local"] and "\n" not in real["local"]


def test_a_slice_name_that_does_not_resolve(real):
    assert real["named"].startswith("train.tpu_name / TPU_NAME='no-such-slice': this slice name does not resolve")
    assert "gcloud compute tpus tpu-vm list" in real["named"]


def test_tpu_held_by_another_process(real):
    assert real["exc_type"] == "NotFoundError"
    assert "held by another process" in real["locked"] and "lsof" in real["locked"]


def test_chips_present_but_libtpu_missing(real):
    assert "has 4 TPU chip(s) but TensorFlow found none" in real["no_libtpu"]
    assert "tensorflow-tpu==" in real["no_libtpu"]


@pytest.mark.parametrize("exc, expected", [
    # libtpu's own lock message (as JAX and PyTorch/XLA show it on a TPU VM)
    (RuntimeError("ABORTED: The TPU is already in use by process with pid 4321. Not attempting to load "
                  "libtpu.so in this process."), "held by another process"),
    # TensorFlow's client and a TPU host's server of another TensorFlow: an op one side lacks
    ("NotFound", "TensorFlow client and TPU runtime differ"),
    # TensorFlow's Cloud TPU client (tensorflow/python/tpu/client/client.py) for an unknown node name
    (ValueError("Could not lookup TPU metadata from name 'slice-x'. Please doublecheck the tpu argument in the "
                "TPUClusterResolver constructor. Exception: <HttpError 404 \"Resource not found\">"),
     "this slice name does not resolve"),
])
@pytest.mark.quick
def test_tpu_errors_are_told_apart(exc, expected):
    import tensorflow as tf

    from tpu_ray.train.tpu_init import classify_tpu_error

    if exc == "NotFound":
        exc = tf.errors.NotFoundError(None, None, "Op type not registered 'XlaShardingV2' in binary running on "
                                      "t1v-n-5f2-w-0. Make sure the Op and Kernel are registered in the binary")
    error = classify_tpu_error(exc, "slice-x", chips=0, lockfile="/nonexistent")
    assert isinstance(error, UserError) and expected in str(error) and "\n" not in str(error)
    if "differ" in expected:
        from tpu_ray.accelerators import tpu_runtime_version

        assert tpu_runtime_version(multi_host=True) in str(error)


class _Metadata(http.server.BaseHTTPRequestHandler):
    """A GCE metadata server stand-in: answers accelerator-type only to requests with its header."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        ok = self.headers.get("Metadata-Flavor") == "Google" and self.path.endswith("/accelerator-type")
        body = b"v5litepod-16" if ok else b""
        self.send_response(200 if ok else 403)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.quick
def test_accelerator_type_is_found_as_ray_finds_it(monkeypatch, caplog):
    from tpu_ray.accelerators import peak_flops_for, tpu_accelerator_type, tpu_generation

    server = http.server.HTTPServer(("127.0.0.1", 0), _Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/computeMetadata/v1/instance/attributes/accelerator-type"
    try:
        monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v4-16")  # GKE, or our placement from ray.io/tpu-pod-type
        assert tpu_accelerator_type(url) == "v4-16"
        monkeypatch.delenv("TPU_ACCELERATOR_TYPE")
        assert tpu_accelerator_type(url) == "v5litepod-16"  # the TPU VM's metadata
        assert tpu_generation("v5litepod-16").device == "TPU v5e" and peak_flops_for("TPU v5e") == 197e12
        with caplog.at_level(logging.WARNING):
            assert tpu_accelerator_type(url.replace("accelerator-type", "nothing")) is None
    finally:
        server.shutdown()
    assert "TPU accelerator type unknown" in caplog.text and "MFU will not be reported" in caplog.text


@pytest.mark.quick
def test_the_strategy_names_the_tpu_generation_from_the_accelerator_type(monkeypatch):
    from tpu_ray.train.model import peak_flops
    from tpu_ray.train.strategy import _tpu_generation

    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v4-8")
    device = _tpu_generation()
    assert device == "TPU v4" and peak_flops(device, None) == 275e12


@pytest.mark.quick
def test_a_slice_name_that_stops_resolving_is_lost_capacity_only_when_ray_reserved_it():
    from tpu_ray.errors import FailureKind
    from tpu_ray.train.tpu_init import classify_tpu_error

    gone = ValueError("Could not lookup TPU metadata from name 'slice-b'")
    assert classify_tpu_error(gone, "slice-b", 0, reserved=True).kind is FailureKind.LOST_CAPACITY
    assert classify_tpu_error(gone, "slice-b", 0, reserved=False).kind is FailureKind.BAD_INPUT
