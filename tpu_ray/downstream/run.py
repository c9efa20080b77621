"""`tpu_ray.finetune(...)` and `tpu-ray finetune`: check everything, sweep on Ray, record, summarise."""

from __future__ import annotations

import logging
import os
from typing import Any

from tpu_ray.downstream.finetune import FinetuneSpec, resolve_model
from tpu_ray.downstream.sweep import Summary, record, run_trials
from tpu_ray.downstream.tasks import load_task
from tpu_ray.errors import UserError

log = logging.getLogger("tpu_ray.downstream")


def finetune(run_or_model: str, task: str, seeds: int | None = None, output_dir: str | None = None,
             overrides: dict[str, Any] | None = None) -> Summary:
    """Fine-tune a run's model (RUN or RUN/model, or any model directory) on `task` over seeds x
    learning rates, record each trial as `kind: downstream` in the run's metrics.jsonl (or in
    output_dir's, for a model outside a run), and return the summary. Bad input is refused here,
    before Ray starts or any model loads."""
    values = dict(overrides or {})
    ray_values = {k: values.pop(k) for k in list(values) if k.startswith("ray.")}
    if seeds is not None:
        values["finetune.seeds"] = seeds
    spec = FinetuneSpec.from_overrides(values)
    if output_dir and os.path.isfile(output_dir):
        raise UserError(f"--output-dir {output_dir}: a file is in the way; give a directory for the records")
    model_dir, run_dir, step = resolve_model(run_or_model)
    metrics_dir = output_dir or run_dir
    if metrics_dir is None:
        raise UserError(f"{run_or_model}: a model outside a run directory; give --output-dir for its records")
    loaded = load_task(task)
    if loaded.kind == "tokens":
        _check_fast_tokenizer(model_dir)
    log.info("task %s (sha256 %s)", loaded.describe(), loaded.digest()[:12])
    _connect(ray_values)
    trials = run_trials(model_dir, loaded, spec)
    summary = Summary(task=loaded.name, task_hash=loaded.digest(), step=step, trials=trials,
                      metric=loaded.metrics[0], chance=loaded.chance())
    os.makedirs(metrics_dir, exist_ok=True)
    record(metrics_dir, summary)
    return summary


def _check_fast_tokenizer(model_dir: str) -> None:
    """A token task reads word ids from the tokenizer: refuse a slow one here, not in every trial."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(model_dir)
    except Exception as exc:  # no tokenizer files: one line, not a traceback per trial
        raise UserError(f"{model_dir}: no tokenizer loads from it ({type(exc).__name__}); a token task needs "
                        f"the model's tokenizer beside it") from None
    if not tok.is_fast:
        raise UserError(f"{model_dir}: its tokenizer ({type(tok).__name__}) is not a fast one; token classification "
                        f"needs word ids, which only fast tokenizers (tokenizer.json) give")


def _connect(ray_values: dict[str, Any]) -> None:
    from tpu_ray.config import RunConfig
    from tpu_ray.cluster.connect import ensure_ray

    unknown = sorted(set(ray_values) - {"ray.address", "ray.num_cpus"})
    if unknown:
        raise UserError(f"{unknown[0]}: unknown option; fine-tuning takes ray.address and ray.num_cpus")
    ensure_ray(RunConfig().override(ray_values) if ray_values else RunConfig())
