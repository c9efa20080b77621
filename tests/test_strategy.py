"""Which distribution strategy a run gets (train/strategy.py): detect_kind from the config and the
environment, and the TPU the client dials (tpu_target) from the slice Ray reserved. No TPU, no training."""

from __future__ import annotations

import json

import pytest

from tests.helpers import train_cfg
from tpu_ray.errors import UserError

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier


@pytest.mark.parametrize("strategy, env, expected", [
    ("gpu", {}, "gpu"),
    ("auto", {"TPU_NAME": "my-slice"}, "tpu"),
    ("auto", {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}})},
     "multiworker"),
    ("auto", {}, "cpu"),
])
def test_detect_kind(monkeypatch, strategy, env, expected):
    from tpu_ray.train.strategy import detect_kind

    for key in ("TPU_NAME", "TF_CONFIG"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert detect_kind(train_cfg(strategy=strategy).train) == expected


def test_detect_kind_names_a_broken_tf_config(monkeypatch):
    from tpu_ray.train.strategy import detect_kind

    monkeypatch.delenv("TPU_NAME", raising=False)
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(UserError, match="^TF_CONFIG: not valid JSON"):
        detect_kind(train_cfg().train)


@pytest.mark.parametrize("pod_type, expected", [
    ("v4-16", {"TPU_NAME": "slice-b", "TPU_LOAD_LIBRARY": "0", "TPU_ACCELERATOR_TYPE": "v4-16"}),
    ("v4-8", {"PJRT_DEVICE": "TPU", "NEXT_PLUGGABLE_DEVICE_USE_C_API": "true", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/lib/libtpu.so",
              "TPU_ACCELERATOR_TYPE": "v4-8"}),
])
def test_tpu_client_env_comes_from_the_reserved_slice(monkeypatch, pod_type, expected):
    """The client's TPU_NAME is the reserved slice's name, whatever train.tpu_name says (it
    used to prefer train.tpu_name, so TensorFlow could dial a slice Ray had not reserved); the
    host count, and so single- or multi-host, comes from the pod type, not from who was alive."""
    from tpu_ray.cluster.tpu_slice import SLICE_ENV, TpuSlice
    from tpu_ray.train.strategy import tpu_target

    reserved = TpuSlice("slice-b", pod_type, ("node-0",) if pod_type == "v4-8" else ("node-0", "node-1"))
    env = reserved.client_env()
    assert TpuSlice.from_json(env.pop(SLICE_ENV)) == reserved
    assert env == expected
    # The TF client placed on it dials the reservation, not train.tpu_name (a constraint on the
    # reservation: it cannot name another slice there).
    monkeypatch.setenv(SLICE_ENV, reserved.to_json())
    monkeypatch.setenv("TPU_NAME", "slice-a")
    dialed = tpu_target(train_cfg(tpu_name="slice-a").train)
    assert dialed == ("slice-b" if pod_type == "v4-16" else "local", True)
    monkeypatch.delenv(SLICE_ENV)  # not placed by Ray (train.placement=local): the named TPU
    assert tpu_target(train_cfg(tpu_name="slice-a").train) == ("slice-a", False)
