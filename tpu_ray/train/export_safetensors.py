"""The exported model in PyTorch's layout: `model.safetensors` and a model card, beside `tf_model.h5`.

Why: Transformers 5 and most of the ecosystem load PyTorch/safetensors weights only, so a model
that exists only as `tf_model.h5` dies with TensorFlow. Transformers' own TF->PT path
(`load_tf2_model_in_pytorch_model`) needs PyTorch installed; tpu-ray never imports torch, so the
weights are renamed with Transformers' name mapping (`convert_tf_weight_name_to_pt_weight_name`,
`apply_transpose`) and written as numpy arrays by `safetensors.numpy`, with the `format: pt`
metadata that `from_pretrained` checks. TF keeps tied weights once (the MLM decoder reuses the word
embeddings; the decoder bias is the head's `bias`), and PyTorch's own `save_pretrained` drops the
tied copies too, so no duplicates are written: `from_pretrained` ties them again.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tpu_ray import storage
from tpu_ray.config import CorpusConfig, RunConfig
from tpu_ray.families import FAMILIES
from tpu_ray.redact import redact
from tpu_ray.resume import global_start
from tpu_ray.train.export import config_digest
from tpu_ray.train.repeatability import guarantee

log = logging.getLogger(__name__)
SAFETENSORS_FILE = "model.safetensors"
MODEL_CARD = "README.md"


def pytorch_state_dict(model: Any) -> dict[str, np.ndarray]:
    """PyTorch parameter name -> float array, from a built transformers TF model's variables."""
    from transformers.modeling_tf_pytorch_utils import apply_transpose, convert_tf_weight_name_to_pt_weight_name

    fam = FAMILIES.get(model.config.model_type)
    reshapes = fam.pt_reshapes if fam else ()
    out: dict[str, np.ndarray] = {}
    for w in model.weights:
        array = w.numpy()
        name, transpose = convert_tf_weight_name_to_pt_weight_name(w.name, tf_weight_shape=array.shape)
        # Dense kernels are [in, out] in TF and [out, in] in PyTorch.
        array = apply_transpose(transpose, array, pt_to_tf=False)
        for part, how in reshapes:  # the family's PyTorch shapes (ConvBERT's separable convolution)
            if part in name and how == "in1k" and array.ndim == 3:  # transposed TF [1, in, k] -> [in, 1, k]
                array = array.reshape(array.shape[1], 1, array.shape[2])
            elif part in name and how == "column" and array.ndim == 1:
                array = array.reshape(-1, 1)
        array = np.ascontiguousarray(array)
        if name in out:
            if np.array_equal(out[name], array):  # the same values reached twice: written once
                continue
            raise RuntimeError(f"two TF variables map to the PyTorch name {name!r} (second: {w.name})")
        out[name] = array
    return out


def write_safetensors(model: Any, directory: str | Path) -> Path:
    """`directory/model.safetensors` in the layout PyTorch Transformers' save_pretrained writes."""
    from safetensors.numpy import save_file

    path = Path(directory) / SAFETENSORS_FILE
    save_file(pytorch_state_dict(model), str(path), metadata={"format": "pt"})
    return path


def _command(run_dir: str) -> str | None:
    path = storage.join(run_dir, "run_info.json")
    if not storage.exists(path):
        return None
    try:
        return json.loads(storage.read_text(path)).get("command")
    except json.JSONDecodeError:
        return None


@dataclass(frozen=True)
class RunRecord:
    """What an export records of the run that made it: the model card's run lines, the whole config
    (as YAML, for the card) and its digest (config.json's provenance stamp, tpu_ray/train/export.py).
    Resolved once from the config by whoever assembles the run (`run_record`), so the trainer's
    export is handed the record, never the config; the run directory and tokenizer stay paths, as
    the card reads the command and the added tokens at export time."""

    name: str
    run_dir: str
    tokenizer_dir: str
    corpus: str  # corpus_line
    tokenizer_kind: str
    sizes: dict[str, int]
    origin: str  # "continued from ..." or "preset `...`"
    seq_len: int
    batch_size: int
    learning_rate: float
    seed: int
    recipe: str
    config_yaml: str
    config_sha256: str
    start_step: int | None = 0  # the global step its step 0 stands at (resume.global_start); None: unknown


def run_record(cfg: RunConfig) -> RunRecord:
    """The export's record of run `cfg` (see RunRecord): it records the whole config, so it reads it."""
    from tpu_ray.train.recipe import recipe_text

    # A continued run's steps go on from its checkpoint's (a branch's copy is its stable run's: the same start).
    start = global_start(cfg.run_dir) if cfg.model.init_from else 0
    origin = f"continued from {cfg.model.init_from}" if cfg.model.init_from else f"preset `{cfg.model.preset}`"
    origin += f" at its global step {start}" if start else ""
    return RunRecord(cfg.name, cfg.run_dir, cfg.tokenizer_dir, corpus_line(cfg.corpus), cfg.tokenizer.kind,
                     cfg.model.sizes(), origin, cfg.shard.seq_len, cfg.train.batch_size, cfg.train.learning_rate,
                     cfg.seed, recipe_text(cfg.train, cfg.model), cfg.to_yaml().rstrip("\n"), config_digest(cfg.fingerprint()),
                     start)


def model_card(run: RunRecord, step: int, vocab_size: int, model_type: str, last_eval: dict[str, Any] | None = None,
               mask: str = "[MASK]", kind: str = "cpu") -> str:
    """README.md of the exported model: what it was trained on, how long, how well, and how; `kind`
    (cpu, gpu, tpu): what trained it, for the line on whether a rerun repeats it."""
    tokens = step * run.batch_size * run.seq_len
    ev = last_eval or {}  # the trainer's last eval record (read from memory: gs:// metrics may still be held)
    if ev.get("eval_loss") is not None:
        quality = (f"- final eval loss (masked tokens, step {ev.get('step')}): {ev['eval_loss']:.4f}; "
                   f"perplexity {math.exp(min(ev['eval_loss'], 700.0)):.2f}; "
                   f"accuracy {ev.get('eval_accuracy', float('nan')):.3f}")
    else:
        quality = "- final eval loss: not evaluated (no validation samples)"
    sizes = run.sizes
    command = _command(run.run_dir)
    made_by = f"`{command}`" if command else "(not recorded)"
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: fill-mask",
        "tags: [tpu-ray, masked-lm]",
        "---",
        f"# {run.name}: a {model_type} masked language model trained with tpu-ray",
        "",
        f"- corpus: {run.corpus}",
        f"- tokenizer: {run.tokenizer_kind}, vocabulary {vocab_size} (`tokenizer.json` here; mask token `{mask}`)",
        *([line] if (line := _vocabulary_line(run.tokenizer_dir)) else []),
        f"- model: {model_type}, hidden {sizes['hidden_size']}, {sizes['num_hidden_layers']} layers, "
        f"{sizes['num_attention_heads']} heads ({run.origin}), sequence length {run.seq_len}",
        f"- training: {step} steps of {run.batch_size} sequences x {run.seq_len} tokens "
        f"= {tokens:,} tokens seen; learning rate {run.learning_rate}, seed {run.seed}",
        f"- recipe: {run.recipe}",
        quality,
        f"- repeatability ({kind}): {guarantee(kind)}",
        f"- made by: {made_by}",
        "",
        "## Use",
        "",
        "PyTorch (Transformers 4.57 or 5), from `model.safetensors`:",
        "",
        *([f"**Caveat:** {differs}.", ""] if (differs := _pytorch_differs(model_type)) else []),
        "```python",
        "from transformers import pipeline",
        'unmasker = pipeline("fill-mask", model="PATH/TO/model")',
        f'unmasker("Some text with a {mask} token.")',
        "```",
        "",
        "TensorFlow (Transformers 4.x, without PyTorch), from `tf_model.h5`. Where PyTorch is not installed",
        "(tpu-ray's own environment), the call above fails with `NameError: name 'torch' is not defined`",
        "(Transformers 4.57 looks up its default `dtype` in torch); say the framework and no dtype:",
        '`pipeline("fill-mask", model="PATH/TO/model", framework="tf", dtype=None, '
        'model_kwargs={"use_safetensors": False})`.',
        "",
        "## The run's config",
        "",
        "```yaml",
        run.config_yaml,
        "```",
        "",
    ]

    return redact("\n".join(lines))  # the card people publish: no password of a corpus URL


def _vocabulary_line(tokenizer_dir: str) -> str | None:
    """The added tokens of an extended vocabulary (prepare/vocabulary.py), if any."""
    from tpu_ray.prepare.vocabulary import card_line

    return card_line(tokenizer_dir)


def _pytorch_differs(model_type: str) -> str:
    fam = FAMILIES.get(model_type)
    return fam.pytorch_differs if fam else ""


def write_pytorch_files(directory: str | Path, s: Any, run: RunRecord, last_eval: dict[str, Any] | None = None) -> None:
    """The export hook: model.safetensors + README.md into the export staging `directory`.

    `s` is the trainer's TrainSetup (model, tok, step_var), `run` the record of the run the card
    holds; `last_eval` its last eval record.
    """
    write_safetensors(s.model, directory)
    if differs := _pytorch_differs(s.model.config.model_type):
        log.warning("export: model.safetensors is written, but %s", differs)
    kind = s.info.kind if s.info.kind != "multiworker" else ("cpu" if s.info.device == "cpu" else "gpu")
    card = model_card(run, int(s.step_var.numpy()), s.tok.vocab_size, s.model.config.model_type, last_eval,
                      mask=s.tok.tokens.mask, kind=kind)
    (Path(directory) / MODEL_CARD).write_text(card, encoding="utf-8")


def corpus_line(corpus: CorpusConfig) -> str:
    """The corpus as the model card names it: the one source, or each source with its weight."""
    if corpus.sources is None:
        return f"`{corpus.source}`"
    parts = [f"`{name}` = `{src.source}` ({'evaluation only' if src.weight == 0 else f'weight {src.weight:g}'})"
             for name, src in corpus.sources.items()]
    return "a mixture: " + "; ".join(parts)
