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
    """A transformers config sized from the run config and matched to the tokenizer.

    With `model.init_from` the checkpoint's own config.json is the config (dropout aside); else
    the family's published defaults and the run's sizes, through the family's field names."""
    from transformers import AutoConfig

    from tpu_ray.families import family

    fam = family(cfg.model.model_type)
    check_pad_id(cfg, tok)
    dropout = {name: cfg.model.dropout for name in fam.dropout_fields}
    if cfg.model.init_from:
        from tpu_ray.train.init_from import checkpoint_hf_config

        config = checkpoint_hf_config(cfg)
        for name, value in dropout.items():
            setattr(config, name, value)
        return config
    sizes: dict[str, object] = {}
    for key, value in cfg.model.sizes().items():
        name = fam.size_fields.get(key, key)
        if name is not None:
            sizes[name] = value
    extra = {k: v for k in ("layer_norm_eps", "type_vocab_size") if (v := cfg.model.published(k)) is not None}
    extra.update(scratch_config(fam.model_type, cfg))
    if fam.model_type in ("xlm", "flaubert"):  # XLM names its special ids itself
        extra.update(pad_index=tok.pad_id, eos_index=tok.sep_id, bos_index=tok.cls_id, unk_index=tok.unk_id,
                     mask_index=tok.mask_id, causal=False)
    return AutoConfig.for_model(
        cfg.model.model_type,
        vocab_size=tok.vocab_size,
        max_position_embeddings=cfg.max_positions(),
        pad_token_id=tok.pad_id, bos_token_id=tok.cls_id, eos_token_id=tok.sep_id, mask_token_id=tok.mask_id,
        **dropout, **sizes, **extra, **fam.scratch_extra,
    )


def scratch_config(model_type: str, cfg: RunConfig) -> dict[str, object]:
    """Per-type config values a from-scratch model needs beyond sizes (why: each type's own
    sizing rules, e.g. Longformer's attention window must divide the sequence)."""
    s = cfg.model.sizes()
    h, layers = s["hidden_size"], s["num_hidden_layers"]
    if model_type == "longformer":
        return {"attention_window": [cfg.shard.seq_len] * layers}
    if model_type == "funnel":
        return {"block_sizes": [1] * layers, "d_head": h // s["num_attention_heads"], "n_head": s["num_attention_heads"]}
    if model_type == "mobilebert":
        return {"embedding_size": h, "intra_bottleneck_size": h, "true_hidden_size": h, "use_bottleneck": False,
                "num_feedforward_networks": 1}
    if model_type in ("albert", "electra", "convbert"):
        return {"embedding_size": h}
    if model_type == "rembert":
        return {"input_embedding_size": h, "output_embedding_size": h}
    return {}


def check_pad_id(cfg: RunConfig, tok: TokenizerInfo) -> None:
    """Refuse a tokenizer whose pad id is not the one the family's TF model hard-codes (RoBERTa: 1):
    its position ids would treat the token with that id as padding and real pads as text."""
    from tpu_ray.families import family

    required = family(cfg.model.model_type).required_pad_id
    if required is not None and tok.pad_id != required:
        raise UserError(f"{cfg.tokenizer_dir}: pad token {tok.tokens.pad} has id {tok.pad_id}, but TF "
                        f"{cfg.model.model_type} treats id {required} as padding; retrain the tokenizer with "
                        f"tpu-ray tokenizer (pad = id {required}) or use model.model_type=bert")


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
