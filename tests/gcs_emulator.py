"""A real GCS emulator (`gcp-storage-emulator`) for tests that use gs:// paths.

Use it as a pytest plugin (``pytest_plugins = ["tests.gcs_emulator"]`` in conftest.py) and ask for
the ``gcs_emulator`` fixture, or import ``GcsEmulator`` / ``running_emulator`` from scripts.

    def test_roundtrip(gcs_emulator):
        root = gcs_emulator.make_bucket("data")           # "gs://data"
        storage.atomic_write_text(f"{root}/a.txt", "hi")

While the fixture is active, ``STORAGE_EMULATOR_HOST`` is set in ``os.environ`` and
``tpu_ray.storage`` (gcsfs) talks to the emulator with anonymous credentials. Child processes
inherit the variable only if they start after it is set: Ray workers do when ``ray.init`` runs
after this fixture, so list ``gcs_emulator`` BEFORE ``ray_local`` in a test's arguments (pytest
sets up same-scope fixtures in argument order), or pass the variable explicitly through
``runtime_env={"env_vars": {"STORAGE_EMULATOR_HOST": gcs_emulator.endpoint}}``.

The server runs in its own process (``python -m gcp_storage_emulator start --in-memory``), bound
to 127.0.0.1 on a free port; nothing is written to disk and it is stopped at session end.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

HOST = "127.0.0.1"
ENV = "STORAGE_EMULATOR_HOST"
PROJECT = "test"


class GcsEmulator:
    """A handle on a running emulator: its endpoint and a bucket factory."""

    def __init__(self, endpoint: str, process: subprocess.Popen | None = None):
        self.endpoint = endpoint  # e.g. "http://127.0.0.1:40123", the value of STORAGE_EMULATOR_HOST
        self.process = process

    def make_bucket(self, name: str | None = None) -> str:
        """Create a bucket (idempotent; a unique name when none is given) and return "gs://name"."""
        name = name or f"test-{uuid.uuid4().hex[:12]}"
        req = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project={PROJECT}", data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code != 409:  # 409: already exists, which is what we want
                raise
        return f"gs://{name}"

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/storage/v1/b?project={PROJECT}", timeout=2) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError):
            return False


# gcp-storage-emulator ignores `ifGenerationMatch`; GCS answers 412 when it does not hold. The
# emulator is started with its object insert and delete handlers wrapped to do the same, so the
# lock's and the generation claims' conditional writes are tested as GCS runs them.
_BOOT = r"""
import sys
from http import HTTPStatus
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

def _name(request):
    if "name" in request.query:
        return request.query["name"][0]
    data = request.data if isinstance(request.data, dict) else {}
    meta = data.get("meta") if isinstance(data.get("meta"), dict) else data
    return meta.get("name")

def _failed(request, response, storage, name):
    want = request.query.get("ifGenerationMatch")
    if not want or name is None:
        return False
    try:
        current = str(storage.get_file_obj(request.params["bucket_name"], name).get("generation"))
    except NotFound:
        current = None
    if (current is None and want[0] == "0") or current == want[0]:
        return False
    response.status = HTTPStatus.PRECONDITION_FAILED
    response.json({"error": {"code": 412, "message": "At least one of the pre-conditions you specified did not hold.",
                             "errors": [{"reason": "conditionNotMet"}]}})
    return True

def _guard(handler, name_of):
    def guarded(request, response, storage, *args, **kwargs):
        if _failed(request, response, storage, name_of(request)):
            return None
        return handler(request, response, storage, *args, **kwargs)
    return guarded

objects.insert = _guard(objects.insert, _name)
objects.delete = _guard(objects.delete, lambda request: request.params.get("object_id"))
from gcp_storage_emulator.__main__ import main
main(sys.argv[1:])
"""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _start(log_dir: str, timeout_s: float = 30.0) -> GcsEmulator:
    port = _free_port()
    log_path = os.path.join(log_dir, f"gcs-emulator-{port}.log")
    env = {k: v for k, v in os.environ.items() if k != ENV}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, "start", "--host", HOST, "--port", str(port), "--in-memory"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=log_dir, env=env)
    emu = GcsEmulator(f"http://{HOST}:{port}", proc)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if emu.ready():
            return emu
        time.sleep(0.1)
    _stop(proc)
    with open(log_path, "rb") as f:
        tail = f.read().decode(errors="replace")[-2000:]
    raise RuntimeError(
        f"gcp-storage-emulator did not come up on {emu.endpoint} (exit {proc.returncode}):\n{tail}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextmanager
def running_emulator() -> Iterator[GcsEmulator]:
    """Start an emulator, export STORAGE_EMULATOR_HOST, and undo both on exit."""
    with tempfile.TemporaryDirectory(prefix="gcs-emu-") as log_dir:
        emu = None
        for attempt in range(3):  # the free port may be taken between probing and binding
            try:
                emu = _start(log_dir)
                break
            except RuntimeError:
                if attempt == 2:
                    raise
        assert emu is not None and emu.process is not None
        previous = os.environ.get(ENV)
        os.environ[ENV] = emu.endpoint
        try:
            yield emu
        finally:
            if previous is None:
                os.environ.pop(ENV, None)
            else:
                os.environ[ENV] = previous
            _stop(emu.process)


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[GcsEmulator]:
    """A session-wide in-memory GCS emulator; STORAGE_EMULATOR_HOST points at it meanwhile."""
    with running_emulator() as emu:
        yield emu
