"""The pure decisions, tested directly: where training runs (placement_for), which strategy
(detect_kind), the doctor's capacity arithmetic, the loop's execution lengths, the TPU client's
environment and the CPU actors' node selector. No cluster, no training."""

from __future__ import annotations

import json

import pytest

from tpu_ray.config import RunConfig
from tpu_ray.errors import UserError

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier


def _cfg(**train) -> RunConfig:
    return RunConfig.from_dict({"train": train})


# -- placement_for ------------------------------------------------------------------------------
TPU_CLUSTER = {"CPU": 8, "TPU": 8, "TPU-v4-8-head": 1, "TPU-v4-16-head": 1}


@pytest.mark.parametrize("train, resources, expected", [
    ({}, {"CPU": 8}, ("local", {})),
    ({}, {"CPU": 8, "TPU": 4, "TPU-v4-8-head": 1}, ("tpu", {"head_resource": "TPU-v4-8-head"})),
    ({"strategy": "cpu"}, {"CPU": 8, "TPU": 4, "TPU-v4-8-head": 1}, ("local", {})),  # TPU there, CPU asked
    ({"tpu_topology": "v4-16"}, TPU_CLUSTER, ("tpu", {"head_resource": "TPU-v4-16-head"})),
    ({"num_gpus": 2}, {"CPU": 8, "GPU": 4}, ("gpu", {"num_gpus": 2})),
    ({"placement": "gpu"}, {"CPU": 8, "GPU": 1}, ("gpu", {"num_gpus": 1})),
    ({"placement": "local", "tpu_topology": "v4-8"}, TPU_CLUSTER, ("local", {})),
])
def test_placement_for(train, resources, expected):
    from tpu_ray.cluster.placement import placement_for

    assert placement_for(_cfg(**train).train, resources) == expected


@pytest.mark.parametrize("train, resources, message", [
    ({"placement": "tpu"}, TPU_CLUSTER, r"cluster has TPU head resources \['TPU-v4-16-head', 'TPU-v4-8-head'\]"),
    ({"tpu_topology": "v5p-8"}, TPU_CLUSTER, r"train.tpu_topology=v5p-8: no node offers TPU-v5p-8-head"),
    ({"num_gpus": 4}, {"CPU": 8, "GPU": 2}, r"train.num_gpus=4: the Ray cluster has 2 GPUs"),
])
def test_placement_for_refuses_what_the_cluster_cannot_give(train, resources, message):
    from tpu_ray.cluster.placement import placement_for

    from tpu_ray.errors import FailureKind

    with pytest.raises(UserError, match=message) as err:
        placement_for(_cfg(**train).train, resources)
    assert err.value.kind is FailureKind.BAD_INPUT  # the config asks for what the cluster has not: no retry


# -- detect_kind --------------------------------------------------------------------------------
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
    assert detect_kind(_cfg(strategy=strategy).train) == expected


def test_detect_kind_names_a_broken_tf_config(monkeypatch):
    from tpu_ray.train.strategy import detect_kind

    monkeypatch.delenv("TPU_NAME", raising=False)
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(UserError, match="^TF_CONFIG: not valid JSON"):
        detect_kind(_cfg().train)


# -- capacity arithmetic (doctor/estimates.py) ---------------------------------------------------
def test_param_count_matches_the_real_model():
    from transformers import TFAutoModelForMaskedLM

    from tpu_ray.doctor.estimates import Sizing, param_count
    from tpu_ray.prepare.tokenizer import TokenizerInfo
    from tpu_ray.train.model import hf_config

    cfg = RunConfig.from_dict({"model": {"preset": "tiny"}, "shard": {"seq_len": 64}})
    model = TFAutoModelForMaskedLM.from_config(hf_config(cfg.model_spec, TokenizerInfo("0" * 64, 800, 0, 2, 1, 3, 4)))
    model(model.dummy_inputs)
    sz = Sizing(cfg.model, cfg.train, cfg.shard.seq_len, cfg.max_positions())
    assert param_count(sz, 800) == pytest.approx(model.count_params(), rel=0.01)


def test_memory_per_replica_splits_fixed_and_per_sample_parts():
    from tpu_ray.doctor.estimates import Sizing, memory_per_replica, param_count

    cfg = RunConfig.from_dict({"model": {"preset": "tiny"}, "shard": {"seq_len": 64}})
    sz = Sizing(cfg.model, cfg.train, cfg.shard.seq_len, cfg.max_positions())
    one, four = memory_per_replica(sz, 800, 1), memory_per_replica(sz, 800, 4)
    params = param_count(sz, 800)
    assert one["weights"] == four["weights"] == 4 * params and one["adam"] == 8 * params  # float32 + AdamW m, v
    assert four["activations"] == pytest.approx(4 * one["activations"])
    assert four["logits"] == pytest.approx(4 * one["logits"])
    assert memory_per_replica(sz, 800, 4, act_bytes=4)["activations"] == pytest.approx(2 * four["activations"])


def test_probe_batch_halves_until_the_cpu_budget_fits():
    from tpu_ray.doctor.estimates import PROBE_FLOPS, Sizing, probe_batch
    from tpu_ray.train.model import train_flops_per_token

    cfg = RunConfig.from_dict({"model": {"preset": "base"}, "shard": {"seq_len": 512}})
    b = probe_batch(Sizing(cfg.model, cfg.train, cfg.shard.seq_len, cfg.max_positions()), 50_000, 64)
    per_sample = 512 * train_flops_per_token(cfg.model, cfg.train, cfg.shard.seq_len, 50_000)
    assert 1 <= b < 64 and b & (b - 1) == 0  # 64 halved
    assert b * per_sample <= PROBE_FLOPS < 2 * b * per_sample


# -- the loop's execution lengths, the TPU client environment, the actors' node selector ---------------
@pytest.mark.parametrize("step, total, spe, everies, n", [
    (0, 40, 4, [10, 20], 4), (8, 40, 4, [10, 20], 2), (10, 40, 100, [10, 20], 10),
    (38, 40, 4, [None], 2), (0, 40, 1, [7], 1), (5, 40, 64, [None, 500], 35),
])
def test_next_length(step, total, spe, everies, n):
    from tpu_ray.train.hooks import next_length

    assert next_length(step, total, spe, everies) == n


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
    dialed = tpu_target(_cfg(tpu_name="slice-a").train)
    assert dialed == ("slice-b" if pod_type == "v4-16" else "local", True)
    monkeypatch.delenv(SLICE_ENV)  # not placed by Ray (train.placement=local): the named TPU
    assert tpu_target(_cfg(tpu_name="slice-a").train) == ("slice-a", False)


def test_a_slice_name_that_stops_resolving_is_lost_capacity_only_when_ray_reserved_it():
    from tpu_ray.errors import FailureKind
    from tpu_ray.train.tpu_init import classify_tpu_error

    gone = ValueError("Could not lookup TPU metadata from name 'slice-b'")
    assert classify_tpu_error(gone, "slice-b", 0, reserved=True).kind is FailureKind.LOST_CAPACITY
    assert classify_tpu_error(gone, "slice-b", 0, reserved=False).kind is FailureKind.BAD_INPUT


def test_cpu_actors_avoid_tpu_hosts_unless_there_is_nothing_else():
    from tpu_ray.cluster.cpu_nodes import off_tpu_options

    cpu = {"Alive": True, "Labels": {}, "Resources": {"CPU": 8}}
    tpu = {"Alive": True, "Labels": {"ray.io/accelerator-type": "TPU-V4"}, "Resources": {"CPU": 240, "TPU": 4}}
    selector = off_tpu_options([cpu, tpu])["label_selector"]["ray.io/accelerator-type"]
    assert selector.startswith("!in(") and "TPU-V4" in selector and "TPU-V5P" in selector
    assert off_tpu_options([tpu]) == {}
    assert "label_selector" in off_tpu_options([{"Alive": True, "Labels": {}, "Resources": {"CPU": 0}}, tpu])
