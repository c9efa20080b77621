"""Using an exported model: `transformers.pipeline("fill-mask")` on `<run_dir>/model`."""

from __future__ import annotations

from tpu_ray import storage
from tpu_ray.errors import UserError


def fill_mask(model_dir: str, text: str, top_k: int = 5) -> list[dict]:
    """Top-k predictions for the mask token in `text` (written as [MASK])."""
    from transformers import pipeline

    if not storage.exists(storage.join(model_dir, "config.json")):
        raise UserError(f"{model_dir}: no exported model (config.json missing); train first or fix the path")
    # dtype=None: transformers 4.57's pipeline() evaluates `hasattr(torch, dtype)` for its default
    # dtype="auto" and raises NameError when PyTorch is not installed (our TF-only installs).
    # use_safetensors=False: TF Transformers prefers model.safetensors (the PyTorch-layout copy) and
    # fails to read it with safetensors >= 0.6 (transformers issue #40028, TF is deprecated there).
    unmasker = pipeline("fill-mask", model=model_dir, framework="tf", dtype=None,
                        model_kwargs={"use_safetensors": False})
    mask = unmasker.tokenizer.mask_token
    if mask not in text:
        raise UserError(f"fill-mask text {text!r}: contains no {mask} token; put {mask} where a word is missing")
    return unmasker(text, top_k=top_k)
