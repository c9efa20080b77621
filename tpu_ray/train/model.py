"""The model's transformers config, its FLOPs per token, and device peaks for MFU.

The model section builds the model: `hf_config` reads a ModelSpec (the section and the few figures
it needs from the rest of the run, computed once by whoever assembles the run), never the whole
run config, so what shapes the model is visible at its one door.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from tpu_ray import accelerators
from tpu_ray.config import ModelConfig, ModelSpec, TrainConfig
from tpu_ray.prepare.tokenizer import TokenizerInfo
from tpu_ray.families import family
from tpu_ray.train.init_from import check_tokenizer, checkpoint_hf_config
from tpu_ray.train.model_config import check_pad_id, scratch_hf_config

if TYPE_CHECKING:
    from tpu_ray.train.phases import Span

log = logging.getLogger(__name__)


def hf_config(spec: ModelSpec, tok: TokenizerInfo):
    """A transformers config sized from the model section and matched to the tokenizer.

    With `model.init_from` the checkpoint's own config.json is the config (dropout aside); else
    the family's published defaults and the section's sizes (train/model_config.py)."""
    m = spec.model
    fam = family(m.model_type)
    if not m.init_from:
        return scratch_hf_config(m, tok, spec.max_positions, spec.seq_len, spec.tokenizer_dir)
    if spec.init is None:
        raise ValueError("ModelSpec.init: model.init_from is set, but no InitSpec says where it resolves")
    check_pad_id(fam, tok, spec.tokenizer_dir)
    config = checkpoint_hf_config(spec.init)
    if tok.vocab_size > config.vocab_size:  # an extended vocabulary: exactly its recorded growth
        check_tokenizer(spec.init, tok, spec.tokenizer_dir, directory=spec.tokenizer_dir)
        config.vocab_size = tok.vocab_size
    for name in fam.dropout_fields:
        setattr(config, name, m.dropout)
    return config


def train_flops_per_token(model: ModelConfig, train: TrainConfig, seq_len: int, vocab_size: int,
                          model_config: Any = None, span: Span | None = None) -> float:
    """Model FLOPs per trained token (forward + backward = 3x forward, 2 FLOPs per MAC).

    Counts what executes, per family where it differs: every layer's projections and attention at
    the length it runs at (funnel pools the sequence to half after each block, then runs its decoder
    at full length), and the MLM head, which the trainer runs only on the `predictions_per_sequence`
    gathered positions of each sequence, except for families whose head is the whole model's (xlm,
    flaubert: every position projected, tpu_ray.families `head=None`). `model_config`: the built
    model's transformers config (a checkpoint's funnel blocks); None: the from-scratch shape.
    `span`: a phase's length and masking rate (train/phases.py); None: the run's own (`seq_len`,
    shard.seq_len, and train.mask_prob).
    """
    from tpu_ray.train.inputs import predictions_for

    s = model.sizes()
    seq = seq_len if span is None else span.seq_len
    h, layers, inter = s["hidden_size"], s["num_hidden_layers"], s["intermediate_size"]
    model_type = model.model_type
    scored = predictions_for(train, seq, None if span is None else span.mask_prob)
    transform = h * h  # the head's dense layer before the vocabulary projection (BERT, RoBERTa, ...)
    if family(model_type).head is None:  # the whole model is called: every position is projected
        scored = seq
    if model_type in ("xlm", "flaubert"):  # FFN of 4 x hidden; the head is the projection alone
        inter, transform = 4 * h, 0
    if model_type == "funnel":  # lm_head is the tied projection alone
        transform = 0
    macs = sum(_layer_macs(q, kv, h, inter) for q, kv in layer_lengths(model_type, seq, layers, model_config))
    head_macs = (transform + h * vocab_size) * scored
    return 3 * 2 * (macs + head_macs) / seq


def layer_lengths(model_type: str, seq: int, layers: int, model_config: Any = None) -> list[tuple[int, int]]:
    """(query length, key/value length) of every layer the model runs on one sequence.

    Funnel: block b runs at ceil(seq / 2^b); the first layer of a later block pools its queries only
    (keys and values at the previous length, pool_q_only); then `num_decoder_layers` at full length.
    Every other family: `layers` layers at full length."""
    if model_type != "funnel":
        return [(seq, seq)] * layers
    blocks = list(getattr(model_config, "block_sizes", None) or [1] * layers)
    repeats = list(getattr(model_config, "block_repeats", None) or [1] * len(blocks))
    decoder = int(getattr(model_config, "num_decoder_layers", 2))
    out, length = [], seq
    for b, (size, repeat) in enumerate(zip(blocks, repeats)):
        for i in range(size * repeat):
            if b and i == 0:
                pooled = -(-length // 2)
                out.append((pooled, length))
                length = pooled
            else:
                out.append((length, length))
    return out + [(seq, seq)] * decoder


def _layer_macs(q: int, kv: int, h: int, inter: int) -> int:
    """One transformer layer: q and output projections on q positions, k and v on kv, the MLP on q,
    scores and weighted values q x kv."""
    return 2 * q * h * h + 2 * kv * h * h + 2 * q * h * inter + 2 * q * kv * h


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
