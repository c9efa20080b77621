"""The model's transformers config, its FLOPs per token, and device peaks for MFU."""

from __future__ import annotations

import logging
import time

from tpu_ray.config import RunConfig
from tpu_ray.prepare.tokenizer import TokenizerInfo

log = logging.getLogger(__name__)

# Peak dense bf16/fp16 FLOP/s of ONE replica. v2/v3: a replica is a core (2 per chip); v4 and
# later: a replica is a chip (megacore). GPUs: dense tensor-core bf16, no sparsity.
PEAK_FLOPS_PER_REPLICA = {
    "TPU v2": 45e12 / 2,
    "TPU v3": 123e12 / 2,
    "TPU v4": 275e12,
    "TPU v5e": 197e12,
    "TPU v5litepod": 197e12,
    "TPU v5p": 459e12,
    "A100": 312e12,
    "H100": 989e12,
    "H200": 989e12,
}


def hf_config(cfg: RunConfig, tok: TokenizerInfo):
    """A transformers config sized from the run config and matched to the tokenizer."""
    from transformers import AutoConfig

    sizes = cfg.model.sizes()
    if cfg.model.model_type == "roberta" and tok.pad_id != 1:
        # TF RoBERTa hard-codes padding_idx=1 for position ids: id 1 must be the pad token.
        log.warning("tokenizer pad id is %d, but TF RoBERTa treats id 1 as padding; retrain the tokenizer "
                    "with tpu-ray (pad = id 1)", tok.pad_id)
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
    """Per-replica peak: configured, from the table, or measured (CPU)."""
    if configured:
        return configured
    for name, peak in PEAK_FLOPS_PER_REPLICA.items():
        if name.lower() in device.lower():
            return peak
    if device == "cpu":
        return measure_cpu_peak()
    return None


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
