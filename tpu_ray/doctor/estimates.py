"""doctor's estimates: pure arithmetic on a run's shape (parameters, memory per replica, the CPU
probe's batch) and the number formats the report prints. Unit-tested directly (tests/test_estimates.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpu_ray.config import ModelConfig, TrainConfig

GB = 1 << 30
# Assumed model FLOPs utilization for the capacity plan (a well-fed BERT-style model on TPU).
ASSUMED_UTILIZATION = 0.40
# HBM use above this fraction is a warning: XLA needs headroom for temporaries and fusion.
HBM_WARN_FRACTION = 0.90
# The CPU compile probe runs at most this many FLOPs per step and this much activation memory;
# the per-replica batch is halved until it fits (XLA's op coverage does not depend on the batch).
PROBE_FLOPS = 4e11
PROBE_BYTES = 4 << 30
# Deeper models are compiled with this many of their (identical) encoder layers: the same ops at
# the same shapes, at a fraction of the XLA compile time on 2 CPU cores (base: ~20 s instead of
# ~60-130 s). Memory and the capacity plan always use the full depth.
PROBE_MAX_LAYERS = 2


@dataclass(frozen=True)
class Sizing:
    """What the estimates read of a run, built once by doctor: the model's sizes, the train section
    (its masking rates bound the scored positions), the run's sequence length (shard.seq_len) and
    the position table's length (the run's max_positions)."""

    model: ModelConfig
    train: TrainConfig
    seq_len: int
    max_positions: int


def param_count(sz: Sizing, vocab: int) -> int:
    """Parameters of the masked-LM model (decoder tied to the word embeddings)."""
    s = sz.model.sizes()
    h, layers, inter = s["hidden_size"], s["num_hidden_layers"], s["intermediate_size"]
    embeddings = vocab * h + sz.max_positions * h + 2 * h + 2 * h  # words, positions, type, LayerNorm
    layer = 4 * (h * h + h) + 2 * h + (h * inter + inter) + (inter * h + h) + 2 * h
    head = h * h + h + 2 * h + vocab  # dense, LayerNorm, output bias
    return embeddings + layers * layer + head


def memory_per_replica(sz: Sizing, vocab: int, batch: int, act_bytes: int = 2, span: Any = None) -> dict[str, float]:
    """Bytes per replica: float32 weights + gradients + AdamW's two moments, activations kept for the
    backward pass (Korthikanti et al. 2022: s*b*h*(34 + 5*a*s/h) per layer at 16 bits, no
    recomputation), and the vocabulary logits (compute dtype, float32 copy, float32 gradient) of
    the positions the MLM head scores (the trainer gathers `predictions_per_sequence` of them).
    `span`: a phase's length and masking rate (train/phases.Span); None: the run's own."""
    from tpu_ray.train.inputs import predictions_for

    s = sz.model.sizes()
    seq = sz.seq_len if span is None else span.seq_len
    h, layers, heads = s["hidden_size"], s["num_hidden_layers"], s["num_attention_heads"]
    params = param_count(sz, vocab)
    acts = layers * seq * batch * h * (34 + 5 * heads * seq / h) * act_bytes / 2
    logits = batch * predictions_for(sz.train, seq, None if span is None else span.mask_prob) * vocab * (act_bytes + 8)
    return {"weights": 4.0 * params, "gradients": 4.0 * params, "adam": 8.0 * params,
            "activations": acts, "logits": logits}


def probe_batch(sz: Sizing, vocab: int, per_replica: int) -> int:
    """The largest batch <= per_replica (halving) whose CPU step stays under the probe budget; 0: none."""
    from tpu_ray.train.model import train_flops_per_token

    fpt = train_flops_per_token(sz.model, sz.train, sz.seq_len, vocab)
    b = max(1, per_replica)
    while b >= 1:
        mem = memory_per_replica(sz, vocab, b, act_bytes=4)
        if b * sz.seq_len * fpt <= PROBE_FLOPS and mem["activations"] + mem["logits"] <= PROBE_BYTES:
            return b
        b //= 2
    return 0


def fmt_bytes(n: float) -> str:
    for unit, div in (("GB", GB), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_duration(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def fmt_count(n: float) -> str:
    for unit, div in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}"
