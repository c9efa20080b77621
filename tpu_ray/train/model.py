"""The model's transformers config, its FLOPs per token, and device peaks for MFU."""

from __future__ import annotations

import logging
import time

from tpu_ray import accelerators
from tpu_ray.config import RunConfig
from tpu_ray.errors import UserError
from tpu_ray.prepare.tokenizer import TokenizerInfo

log = logging.getLogger(__name__)


def hf_config(cfg: RunConfig, tok: TokenizerInfo):
    """A transformers config sized from the run config and matched to the tokenizer."""
    from transformers import AutoConfig

    sizes = cfg.model.sizes()
    check_pad_id(cfg, tok)
    return AutoConfig.for_model(
        cfg.model.model_type,
        vocab_size=tok.vocab_size,
        max_position_embeddings=cfg.max_positions(),
        layer_norm_eps=cfg.model.published("layer_norm_eps"),
        pad_token_id=tok.pad_id, bos_token_id=tok.cls_id, eos_token_id=tok.sep_id,
        type_vocab_size=cfg.model.published("type_vocab_size"),
        hidden_dropout_prob=cfg.model.dropout, attention_probs_dropout_prob=cfg.model.dropout,
        **sizes,
    )


# Model types whose TF position ids hard-code padding_idx=1 (transformers modeling_tf_roberta.py).
PAD_ONE_MODEL_TYPES = ("roberta",)


def check_pad_id(cfg: RunConfig, tok: TokenizerInfo) -> None:
    """Refuse a tokenizer whose pad id is not 1 for RoBERTa: its position ids would treat the token
    with id 1 as padding (every one of them gets the padding position) and real pads as text."""
    from tpu_ray.config import PAD

    if cfg.model.model_type in PAD_ONE_MODEL_TYPES and tok.pad_id != 1:
        raise UserError(f"{cfg.tokenizer_dir}: pad token {PAD} has id {tok.pad_id}, but TF {cfg.model.model_type} "
                        f"treats id 1 as padding; retrain the tokenizer with tpu-ray tokenizer (pad = id 1) or "
                        f"use model.model_type=bert")


def train_flops_per_token(cfg: RunConfig, vocab_size: int) -> float:
    """Model FLOPs per trained token (forward + backward = 3x forward, 2 FLOPs per MAC).

    Counts what executes: every layer's projections and attention, and the MLM head, which the
    trainer runs only on the `predictions_per_sequence` gathered positions of each sequence.
    """
    from tpu_ray.train.inputs import predictions_per_sequence

    s = cfg.model.sizes()
    h, layers, inter, seq = s["hidden_size"], s["num_hidden_layers"], s["intermediate_size"], cfg.shard.seq_len
    per_layer_macs = 4 * h * h + 2 * h * inter + 2 * seq * h  # q,k,v,o + MLP + scores and values
    head_macs = (h * h + h * vocab_size) * predictions_per_sequence(seq, cfg.train.mask_prob) / seq
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
