"""The model's transformers config, its FLOPs per token, and device peaks for MFU."""

from __future__ import annotations

import logging
import time

from tpu_ray import accelerators
from tpu_ray.config import RunConfig
from tpu_ray.prepare.tokenizer import TokenizerInfo

log = logging.getLogger(__name__)


def hf_config(cfg: RunConfig, tok: TokenizerInfo):
    """A transformers config sized from the run config and matched to the tokenizer.

    With `model.init_from` the checkpoint's own config.json is the config (dropout aside); else
    the family's published defaults and the run's sizes (train/model_config.py)."""
    from tpu_ray.families import family
    from tpu_ray.train.model_config import check_pad_id, scratch_hf_config

    if not cfg.model.init_from:
        return scratch_hf_config(cfg, tok)
    from tpu_ray.train.init_from import checkpoint_hf_config

    check_pad_id(cfg, tok)
    config = checkpoint_hf_config(cfg)
    for name in family(cfg.model.model_type).dropout_fields:
        setattr(config, name, cfg.model.dropout)
    return config


def check_pad_id(cfg: RunConfig, tok: TokenizerInfo) -> None:
    """Kept for importers: train/model_config.py has it."""
    from tpu_ray.train.model_config import check_pad_id as check

    check(cfg, tok)


def train_flops_per_token(cfg: RunConfig, vocab_size: int) -> float:
    """Model FLOPs per trained token (forward + backward = 3x forward, 2 FLOPs per MAC).

    Counts what executes: every layer's projections and attention, and the MLM head, which the
    trainer runs only on the `predictions_per_sequence` gathered positions of each sequence.
    """
    from tpu_ray.train.inputs import predictions_for

    s = cfg.model.sizes()
    h, layers, inter, seq = s["hidden_size"], s["num_hidden_layers"], s["intermediate_size"], cfg.shard.seq_len
    per_layer_macs = 4 * h * h + 2 * h * inter + 2 * seq * h  # q,k,v,o + MLP + scores and values
    head_macs = (h * h + h * vocab_size) * predictions_for(cfg.train, seq) / seq
    return 3 * 2 * (layers * per_layer_macs + head_macs)


def peak_flops(device: str, configured: float | None) -> float | None:
    """Per-replica peak: configured, or the device's published figure from the table. None on a
    CPU: a measured matmul peak varied 4x between identical runs on a shared machine, so an MFU
    against it says nothing (set train.peak_flops to get one)."""
    if configured:
        return configured
    return accelerators.peak_flops_for(device)


_CPU_PEAK: float | None = None


def measure_cpu_peak() -> float:
    """float32 matmul FLOP/s of this CPU (best of a few 1024^3 matmuls), measured once."""
    global _CPU_PEAK
    if _CPU_PEAK is None:
        import tensorflow as tf

        a = tf.random.normal([1024, 1024])
        tf.linalg.matmul(a, a).numpy()
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            tf.linalg.matmul(a, a).numpy()
            best = min(best, time.perf_counter() - t)
        _CPU_PEAK = 2 * 1024**3 / best
    return _CPU_PEAK
