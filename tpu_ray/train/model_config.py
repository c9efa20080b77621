"""The transformers config of a model built from scratch, from the family registry and the run's sizes.

Why its own module: train/model.py's hf_config picks between this and a checkpoint's config
(train/init_from.py), and init_from needs this one for a tpu-ray run it continues from.
"""

from __future__ import annotations

from tpu_ray.config import ModelConfig
from tpu_ray.errors import UserError
from tpu_ray.prepare.tokenizer import TokenizerInfo
from tpu_ray.families import Family, family


def scratch_hf_config(model: ModelConfig, tok: TokenizerInfo, max_positions: int, seq_len: int, tokenizer_dir: str):
    """A transformers config for a model built from scratch: the family's published defaults and
    the model section's sizes, through the family's field names, matched to the tokenizer (in
    `tokenizer_dir`, named when refused). `max_positions`: the position embeddings the run gives the
    model; `seq_len`: the run's shard length (a type sized by it: Longformer's attention window)."""
    from transformers import AutoConfig

    fam = family(model.model_type)
    check_pad_id(fam, tok, tokenizer_dir)
    dropout = {name: model.dropout for name in fam.dropout_fields}
    sizes: dict[str, object] = {}
    for key, value in model.sizes().items():
        name = fam.size_fields.get(key, key)
        if name is not None:
            sizes[name] = value
    extra = {k: v for k in ("layer_norm_eps", "type_vocab_size") if (v := model.published(k)) is not None}
    extra.update(scratch_config(fam, model, seq_len))
    if model.initializer_range is not None:
        extra["initializer_range"] = model.initializer_range
    if fam.model_type in ("xlm", "flaubert"):  # XLM names its special ids itself
        extra.update(pad_index=tok.pad_id, eos_index=tok.sep_id, bos_index=tok.cls_id, unk_index=tok.unk_id,
                     mask_index=tok.mask_id, causal=False)
    return AutoConfig.for_model(
        model.model_type,
        vocab_size=tok.vocab_size,
        max_position_embeddings=max_positions,
        pad_token_id=tok.pad_id, bos_token_id=tok.cls_id, eos_token_id=tok.sep_id, mask_token_id=tok.mask_id,
        **dropout, **sizes, **extra, **fam.scratch_extra,
    )


def scratch_config(fam: Family, model: ModelConfig, seq_len: int) -> dict[str, object]:
    """Per-type config values a from-scratch model needs beyond sizes (why: each type's own
    sizing rules, e.g. Longformer's attention window must divide the sequence, `seq_len`)."""
    model_type = fam.model_type
    s = model.sizes()
    h, layers = s["hidden_size"], s["num_hidden_layers"]
    if model_type == "longformer":
        return {"attention_window": [seq_len] * layers}
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


def check_pad_id(fam: Family, tok: TokenizerInfo, tokenizer_dir: str) -> None:
    """Refuse a tokenizer (in `tokenizer_dir`) whose pad id is not the one the family's TF model
    hard-codes (RoBERTa: 1): its position ids would treat the token with that id as padding and real
    pads as text."""
    model_type, required = fam.model_type, fam.required_pad_id
    if required is not None and tok.pad_id != required:
        raise UserError(f"{tokenizer_dir}: pad token {tok.tokens.pad} has id {tok.pad_id}, but TF "
                        f"{model_type} treats id {required} as padding; retrain the tokenizer with "
                        f"tpu-ray tokenizer (pad = id {required}) or use model.model_type=bert")
