"""The doctor's capacity arithmetic (doctor/estimates.py): parameter count against the real model,
memory per replica, the probe's batch. Arithmetic checked directly, no training."""

from __future__ import annotations

import pytest

from tpu_ray.config import RunConfig

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier


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
