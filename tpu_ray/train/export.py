"""Using an exported model: `transformers.pipeline("fill-mask")` on `<run_dir>/model`."""

from __future__ import annotations

from typing import Any, Callable

from tpu_ray import rundir, storage
from tpu_ray.config import MASK
from tpu_ray.errors import UserError, first_line
from tpu_ray.redact import redact_obj


PROVENANCE_KEY = rundir.PROVENANCE_KEY  # in the export's config.json: what it was made from


def config_digest(fingerprint: dict[str, Any]) -> str:
    """sha256 of what shapes the model (RunConfig.fingerprint(), given): equal for a resumed run."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(redact_obj(fingerprint), sort_keys=True).encode()).hexdigest()


def stamp_provenance(model_dir: str, config_sha256: str, step: int, start: int | None = 0) -> None:
    """Record in the local export's config.json the config (its `config_digest`) and step it was made from:
    `step` the run's own, `global_step` that plus `start`, the global step the run started at (a continued
    run's, resume.global_start; None: unknown, and no global step is recorded)."""
    import json
    import os

    path = os.path.join(model_dir, "config.json")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    data[PROVENANCE_KEY] = {"config_sha256": config_sha256, "step": step,
                            **({"global_step": start + step} if start is not None else {})}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")


def refuse_replacing_export(config_sha256: str, run_dir: str, force: bool) -> None:
    """Refuse, before training, to replace `run_dir`'s model made from another config (another
    `config_digest`) or another checkpoint chain (no checkpoint left to continue) unless `force` (--force)."""
    import json

    model = rundir.path(run_dir, rundir.MODEL_DIR)
    try:
        data = json.loads(storage.read_text(storage.join(model, "config.json")))
    except (FileNotFoundError, NotADirectoryError, ValueError, UnicodeDecodeError):
        return  # no complete export (or one nobody can load): nothing to protect
    if force:
        return
    made = data.get(PROVENANCE_KEY) if isinstance(data, dict) else None
    made = made if isinstance(made, dict) else {}
    if made.get("config_sha256") not in (None, config_sha256):
        why = "from another config"
    elif not rundir.checkpoint_files(run_dir):  # any there: the trainer resumes them or refuses
        why = "from another checkpoint (no checkpoint here continues it)"
    else:
        return
    raise UserError(f"{model}: an exported model made {why} is there; pass --force to replace it, or use "
                    f"another --output-dir")


def fill_mask(model_dir: str, text: str, top_k: int = 5) -> list[dict]:
    """Top-k predictions for the mask token in `text` (written as [MASK], or the model's own mask
    token such as RoBERTa's <mask>: the CLI's examples work whatever the model's family)."""
    check_fill_mask_text(text)  # before loading TensorFlow: a refusal costs no model load
    return load_unmasker(model_dir)(text, top_k)


def load_unmasker(model_dir: str) -> Callable[[str, int], list[dict]]:
    """The exported model loaded once, as `predict(text, top_k)` (fill_mask per sentence; probes
    over many sentences load it once)."""
    from transformers import pipeline

    if not storage.exists(storage.join(model_dir, "config.json")):
        raise UserError(f"{model_dir}: no exported model (config.json missing); train first or fix the path")
    from tpu_ray.prepare.tokenizer import check_json_files

    check_json_files(model_dir, "export it again (tpu-ray train --resume with the run's config)")
    # dtype=None: transformers 4.57's pipeline() evaluates `hasattr(torch, dtype)` for its default
    # dtype="auto" and raises NameError when PyTorch is not installed (our TF-only installs).
    # use_safetensors=False: TF Transformers prefers model.safetensors (the PyTorch-layout copy) and
    # fails to read it with safetensors >= 0.6 (transformers issue #40028, TF is deprecated there).
    try:
        unmasker = pipeline("fill-mask", model=model_dir, framework="tf", dtype=None,
                            model_kwargs={"use_safetensors": False})
    except Exception as exc:  # transformers/h5py raise OSError, ValueError, JSON errors...: one line
        raise UserError(f"{model_dir}: cannot load the exported model ({first_line(exc)}); export it again "
                        f"(tpu-ray train --resume with the run's config)") from None
    mask = unmasker.tokenizer.mask_token

    def predict(text: str, top_k: int = 5) -> list[dict]:
        check_fill_mask_text(text, own=mask)
        if mask != MASK and MASK in text and mask not in text:  # [MASK] is the placeholder for any model's mask
            text = text.replace(MASK, mask)
        if mask not in text:
            spelled = MASK if mask == MASK else f"{MASK} (or the model's own {mask})"
            raise UserError(f"fill-mask text {text!r}: contains no mask token; put {spelled} where a word is missing")
        _one_mask(text, mask)
        if top_k < 1:
            raise UserError(f"--top-k {top_k}: must be >= 1 (how many predictions to print)")
        # More than the vocabulary means "all of it": TensorFlow's top_k would refuse k > vocabulary.
        return unmasker(text, top_k=min(top_k, len(unmasker.tokenizer)))

    return predict


def check_fill_mask_text(text: str, mask: str = MASK, own: str | None = None) -> None:
    """Refuse a fill-mask sentence that cannot be answered (empty, or more than one mask); with
    `own`, the model's own mask token once it is known, also one with no mask at all ([MASK] stands
    for any model's mask token)."""
    if not text.strip():
        raise UserError(f"fill-mask text {text!r}: is empty; give a sentence with one {mask}")
    _one_mask(text, mask)
    if own is None:
        return
    if own != mask:
        _one_mask(text, own)
        if mask in text and own in text:  # [MASK] stands for `own`: the two together are two masks
            raise UserError(f"fill-mask text {text!r}: contains {mask} and {own}, two mask tokens for this model; "
                            f"give exactly one (predict one missing word at a time)")
    if mask not in text and own not in text:
        spelled = mask if own == mask else f"{mask} (or the model's own {own})"
        raise UserError(f"fill-mask text {text!r}: contains no mask token; put {spelled} where a word is missing")


def _one_mask(text: str, mask: str) -> None:
    if text.count(mask) > 1:
        raise UserError(f"fill-mask text {text!r}: contains {text.count(mask)} {mask} tokens; "
                        f"give exactly one (predict one missing word at a time)")
